// Strong quantity types shared by every stratasim library: simulated time, sizes, work and
// rates. Time and sizes are integers so that simulations are exact and identical on every
// machine; FLOP counts and rates are doubles because one iteration of a large model exceeds
// 2^63 FLOPs.
#pragma once

#include <array>
#include <bit>
#include <compare>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace stratasim {

/// A point or span of simulated time, in integer picoseconds (range about ±106 days).
class Time {
 public:
  constexpr Time() = default;
  static constexpr Time ps(std::int64_t v) { return Time(v); }
  static constexpr Time ns(std::int64_t v) { return Time(v * 1'000); }
  static constexpr Time us(std::int64_t v) { return Time(v * 1'000'000); }
  static constexpr Time ms(std::int64_t v) { return Time(v * 1'000'000'000); }
  /// Rounds to the nearest picosecond; negative and non-finite values are errors.
  static Time from_seconds(double seconds);
  static constexpr Time zero() { return Time(0); }
  /// "Never": later than any reachable time.
  static constexpr Time infinity() { return Time(std::numeric_limits<std::int64_t>::max()); }

  constexpr std::int64_t picoseconds() const { return ps_; }
  constexpr double seconds() const { return static_cast<double>(ps_) * 1e-12; }

  constexpr auto operator<=>(const Time&) const = default;
  /// Sums past the int64 range (about 106 days of picoseconds) throw std::overflow_error rather
  /// than wrap: absurd inputs (an imported trace's durations) must fail, not reorder events.
  constexpr Time operator+(Time o) const {
    std::int64_t sum = 0;
    if (__builtin_add_overflow(ps_, o.ps_, &sum)) overflow();
    return Time(sum);
  }
  constexpr Time operator-(Time o) const { return Time(ps_ - o.ps_); }
  constexpr Time& operator+=(Time o) { return *this = *this + o; }
  constexpr Time& operator-=(Time o) {
    ps_ -= o.ps_;
    return *this;
  }
  constexpr Time operator*(std::int64_t k) const { return Time(ps_ * k); }

 private:
  constexpr explicit Time(std::int64_t v) : ps_(v) {}
  [[noreturn]] static void overflow();
  std::int64_t ps_ = 0;
};

/// A size in bytes (signed so that memory deltas can be negative).
///
/// Stored as four 2-byte parts, so that a Bytes needs only 2-byte alignment: the ops of a
/// Program pack it (strategies/program.hpp, 48-byte Op), and every member call on it is then on
/// an aligned object (an 8-byte-aligned int64 there would be read misaligned, undefined
/// behaviour). std::bit_cast turns the parts into the int64 in one (unaligned) load.
class Bytes {
 public:
  constexpr Bytes() = default;
  constexpr explicit Bytes(std::int64_t v) : parts_(std::bit_cast<Parts>(v)) {}
  constexpr std::int64_t count() const { return std::bit_cast<std::int64_t>(parts_); }
  constexpr std::strong_ordering operator<=>(const Bytes& o) const { return count() <=> o.count(); }
  constexpr bool operator==(const Bytes& o) const { return count() == o.count(); }
  constexpr Bytes operator+(Bytes o) const { return Bytes(count() + o.count()); }
  constexpr Bytes operator-(Bytes o) const { return Bytes(count() - o.count()); }
  constexpr Bytes operator-() const { return Bytes(-count()); }
  constexpr Bytes& operator+=(Bytes o) { return *this = *this + o; }
  constexpr Bytes& operator-=(Bytes o) { return *this = *this - o; }
  constexpr Bytes operator*(std::int64_t k) const { return Bytes(count() * k); }

 private:
  using Parts = std::array<std::uint16_t, 4>;
  Parts parts_{};
};
static_assert(sizeof(Bytes) == 8 && alignof(Bytes) == 2);

/// An amount of floating-point work, in FLOPs (2 per multiply-add).
class Flops {
 public:
  constexpr Flops() = default;
  constexpr explicit Flops(double v) : v_(v) {}
  constexpr double count() const { return v_; }
  constexpr auto operator<=>(const Flops&) const = default;
  constexpr Flops operator+(Flops o) const { return Flops(v_ + o.v_); }
  constexpr Flops& operator+=(Flops o) {
    v_ += o.v_;
    return *this;
  }

 private:
  double v_ = 0;
};

/// A data rate, in bytes per second.
class Bandwidth {
 public:
  constexpr Bandwidth() = default;
  constexpr explicit Bandwidth(double bytes_per_second) : v_(bytes_per_second) {}
  constexpr double bytes_per_second() const { return v_; }
  constexpr auto operator<=>(const Bandwidth&) const = default;
  constexpr Bandwidth operator*(double k) const { return Bandwidth(v_ * k); }

 private:
  double v_ = 0;
};

/// A compute rate, in FLOP per second.
class FlopRate {
 public:
  constexpr FlopRate() = default;
  constexpr explicit FlopRate(double flops_per_second) : v_(flops_per_second) {}
  constexpr double flops_per_second() const { return v_; }
  constexpr auto operator<=>(const FlopRate&) const = default;
  constexpr FlopRate operator*(double k) const { return FlopRate(v_ * k); }

 private:
  double v_ = 0;
};

/// Time to move `size` at `rate`, rounded up to a whole picosecond (zero bytes take no time).
Time transfer_time(Bytes size, Bandwidth rate);
/// Time to do `work` at `rate`, rounded up to a whole picosecond.
Time compute_time(Flops work, FlopRate rate);

/// Raised by the parse_* functions; the message says what was expected.
class UnitError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Parsing of quantities written with units, as in configs: a number (decimal or exponent
// notation), optional spaces, and a unit. Decimal prefixes (k, M, G, T, P, E) are powers of
// 1000, binary ones (Ki, Mi, Gi, Ti, Pi) powers of 1024; "B" is bytes and "b" bits.

/// "2 us", "1.5 ms", "250 ns", "3 ps", "0.5 s" (also "µs").
Time parse_time(std::string_view text);
/// "80 GiB", "40 GB", "512 MiB", "1e9 B", "100 Mb" (bits, rounded up to whole bytes).
Bytes parse_bytes(std::string_view text);
/// "2.039 TB/s", "900 GB/s", "25 Gb/s", "200 Gbps", "16 GiB/s".
Bandwidth parse_bandwidth(std::string_view text);
/// "312 TFLOP/s", "19.5 TFLOPS", "1 PFLOP/s".
FlopRate parse_flop_rate(std::string_view text);
/// "3.1 EFLOP", "1e18 FLOP".
Flops parse_flops(std::string_view text);

// Printing with a readable unit: "1.234 ms", "80 GiB", "900 GB/s", "312 TFLOP/s".
std::string to_string(Time t);
std::string to_string(Bytes b);
std::string to_string(Bandwidth b);
std::string to_string(FlopRate r);
std::string to_string(Flops f);

}  // namespace stratasim
