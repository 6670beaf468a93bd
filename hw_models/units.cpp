#include "hw_models/units.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

#include "hw_models/sane_bounds.hpp"

namespace stratasim {

namespace {

constexpr double kMaxPicoseconds = 9.2e18;  // just under 2^63

std::int64_t round_up_ps(double picoseconds) {
  if (!(picoseconds >= 0) || picoseconds > kMaxPicoseconds) {
    throw std::overflow_error("duration out of range: " + std::to_string(picoseconds) + " ps");
  }
  return static_cast<std::int64_t>(std::ceil(picoseconds));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

struct Quantity {
  double value;
  std::string_view unit;
};

// Splits "12.5 GiB/s" into 12.5 and "GiB/s"; nullopt when there is no leading number.
std::optional<Quantity> split(std::string_view text) {
  text = trim(text);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || !std::isfinite(value)) return std::nullopt;
  return Quantity{value, trim(std::string_view(end, text.data() + text.size() - end))};
}

// Multiplier of an SI (k, M, G, T, P, E) or binary (Ki, Mi, Gi, Ti, Pi) prefix at the start of
// `unit`, which is consumed; 1 when there is none.
double take_prefix(std::string_view& unit, bool allow_binary) {
  static constexpr std::string_view kPrefixes = "kMGTPE";  // powers 1..6 of 1000 (or 1024)
  if (unit.empty()) return 1;
  char c = unit.front() == 'K' ? 'k' : unit.front();
  std::size_t index = kPrefixes.find(c);
  if (index == std::string_view::npos) return 1;
  int power = static_cast<int>(index) + 1;
  if (allow_binary && unit.size() >= 3 && unit[1] == 'i') {
    unit.remove_prefix(2);
    return std::pow(1024.0, power);
  }
  unit.remove_prefix(1);
  return std::pow(1000.0, power);
}

// Bytes per unit for "B" (bytes) or "b"/"bit" (bits), with prefix: "GiB" -> 2^30.
std::optional<double> size_unit(std::string_view unit) {
  double mult = take_prefix(unit, /*allow_binary=*/true);
  if (unit == "B" || unit == "byte" || unit == "bytes") return mult;
  if (unit == "b" || unit == "bit" || unit == "bits") return mult / 8;
  return std::nullopt;
}

[[noreturn]] void fail(std::string_view what, std::string_view example, std::string_view text) {
  throw UnitError("expected " + std::string(what) + " such as \"" + std::string(example) +
                  "\", got \"" + std::string(text) + "\"");
}

std::string format_scaled(double value, const char* const* units, int count, double step) {
  int i = 0;
  double v = value;
  while (i + 1 < count && std::fabs(v) >= step) {
    v /= step;
    ++i;
  }
  char buf[64];
  // Up to 4 significant digits, trailing zeros removed.
  std::snprintf(buf, sizeof buf, "%.4g %s", v, units[i]);
  return buf;
}

}  // namespace

void Time::overflow() {
  throw std::overflow_error(
      "simulated time overflows 2^63 picoseconds (about 106 days): a duration is absurdly large");
}

Time Time::from_seconds(double seconds) {
  double ps = seconds * 1e12;
  if (!(ps >= 0) || ps > kMaxPicoseconds) {
    throw std::overflow_error("duration out of range: " + std::to_string(seconds) + " s");
  }
  return Time(std::llround(ps));
}

Time transfer_time(Bytes size, Bandwidth rate) {
  if (size.count() <= 0) return Time::zero();
  return Time::ps(round_up_ps(static_cast<double>(size.count()) / rate.bytes_per_second() * 1e12));
}

Time compute_time(Flops work, FlopRate rate) {
  if (work.count() <= 0) return Time::zero();
  return Time::ps(round_up_ps(work.count() / rate.flops_per_second() * 1e12));
}

Time parse_time(std::string_view text) {
  auto q = split(text);
  if (!q || q->value < 0) fail("a duration", "2 us", text);
  static constexpr std::array<std::pair<std::string_view, double>, 8> kUnits = {
      {{"ps", 1e-12},
       {"ns", 1e-9},
       {"us", 1e-6},
       {"\xC2\xB5s", 1e-6},
       {"ms", 1e-3},
       {"s", 1.0},
       {"min", 60.0},
       {"h", 3600.0}}};
  for (auto [name, mult] : kUnits) {
    if (q->unit == name) {
      try {
        return Time::from_seconds(q->value * mult);
      } catch (const std::overflow_error&) {
        fail("a duration under 106 days", "2 us", text);
      }
    }
  }
  fail("a duration with a unit (ps, ns, us, ms, s)", "2 us", text);
}

Bytes parse_bytes(std::string_view text) {
  auto q = split(text);
  if (!q || q->value < 0) fail("a size", "80 GiB", text);
  auto mult = size_unit(q->unit);
  if (!mult) fail("a size with a unit (B, kB, MB, GB, KiB, MiB, GiB, TiB, b, Gb)", "80 GiB", text);
  double bytes = std::ceil(q->value * *mult - 1e-6);
  if (bytes > 9.2e18) fail("a size under 8 EiB", "80 GiB", text);
  return Bytes(static_cast<std::int64_t>(std::max(0.0, bytes)));
}

Bandwidth parse_bandwidth(std::string_view text) {
  auto q = split(text);
  if (!q || q->value < 0) fail("a bandwidth", "900 GB/s", text);
  std::string_view unit = q->unit;
  std::optional<double> mult;
  if (unit.ends_with("/s")) {
    mult = size_unit(unit.substr(0, unit.size() - 2));
  } else if (unit.ends_with("bps")) {  // "200 Gbps": bits per second
    std::string_view prefix = unit.substr(0, unit.size() - 3);
    double m = take_prefix(prefix, true);
    if (prefix.empty()) mult = m / 8;
  }
  if (!mult) fail("a bandwidth with a unit (GB/s, GiB/s, Gb/s, Gbps)", "900 GB/s", text);
  const double bytes_per_second = q->value * *mult;
  if (!std::isfinite(bytes_per_second) ||
      (bytes_per_second != 0 && !(bytes_per_second >= kMinBandwidthBytesPerSecond))) {
    fail("a bandwidth of at least 1 MB/s (or 0 where none is allowed)", "900 GB/s", text);
  }
  return Bandwidth(bytes_per_second);
}

FlopRate parse_flop_rate(std::string_view text) {
  auto q = split(text);
  if (!q || q->value < 0) fail("a compute rate", "312 TFLOP/s", text);
  std::string_view unit = q->unit;
  double mult = take_prefix(unit, /*allow_binary=*/false);
  if (unit != "FLOP/s" && unit != "FLOPS" && unit != "FLOPs/s") {
    fail("a compute rate with a unit (GFLOP/s, TFLOP/s, PFLOP/s)", "312 TFLOP/s", text);
  }
  const double flops_per_second = q->value * mult;
  if (!std::isfinite(flops_per_second) ||
      (flops_per_second != 0 && !(flops_per_second >= kMinFlopsPerSecond))) {
    fail("a compute rate of at least 1 MFLOP/s (or 0 where none is allowed)", "312 TFLOP/s", text);
  }
  return FlopRate(flops_per_second);
}

Flops parse_flops(std::string_view text) {
  auto q = split(text);
  if (!q || q->value < 0) fail("an amount of work", "3.1 EFLOP", text);
  std::string_view unit = q->unit;
  double mult = take_prefix(unit, /*allow_binary=*/false);
  if (unit != "FLOP" && unit != "FLOPs") fail("an amount of work in FLOP", "3.1 EFLOP", text);
  return Flops(q->value * mult);
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string efficiency_expected() {
  return "a fraction in (0, 1], at least 1e-6";
}

std::string to_string(Time t) {
  static const char* const kUnits[] = {"ps", "ns", "us", "ms", "s"};
  if (t == Time::infinity()) return "never";
  return format_scaled(static_cast<double>(t.picoseconds()), kUnits, 5, 1000);
}

std::string to_string(Bytes b) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  return format_scaled(static_cast<double>(b.count()), kUnits, 6, 1024);
}

std::string to_string(Bandwidth b) {
  static const char* const kUnits[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"};
  return format_scaled(b.bytes_per_second(), kUnits, 6, 1000);
}

std::string to_string(FlopRate r) {
  static const char* const kUnits[] = {"FLOP/s",  "kFLOP/s", "MFLOP/s", "GFLOP/s",
                                       "TFLOP/s", "PFLOP/s", "EFLOP/s"};
  return format_scaled(r.flops_per_second(), kUnits, 7, 1000);
}

std::string to_string(Flops f) {
  static const char* const kUnits[] = {"FLOP",  "kFLOP", "MFLOP", "GFLOP",
                                       "TFLOP", "PFLOP", "EFLOP", "ZFLOP"};
  return format_scaled(f.count(), kUnits, 8, 1000);
}

}  // namespace stratasim
