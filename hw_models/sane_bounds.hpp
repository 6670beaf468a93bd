// Sane bounds on the rates and factors that configs give, one place per kind of quantity.
// Semantics: each bound lies orders of magnitude outside any real hardware, so that it cannot
// reject a real machine, and stops absurd values ("1e-30 Gb/s", an efficiency of 1e-300, a
// slowdown of 1e300) at the key that gives them instead of overflowing simulated time (2^63 ps,
// about 106 days) or stalling the simulation later. Units: bytes/s, FLOP/s, items/s; factors
// are dimensionless.
#pragma once

#include <string>

namespace stratasim {

/// A bandwidth is 0 (where a config allows "none") or at least 1 MB/s: slower than 10 Mb/s
/// Ethernet (1.25 MB/s), the slowest link a training system has had. parse_bandwidth checks it.
inline constexpr double kMinBandwidthBytesPerSecond = 1e6;
/// A compute rate is 0 or at least 1 MFLOP/s (a 1980s CPU). parse_flop_rate checks it.
inline constexpr double kMinFlopsPerSecond = 1e6;
/// An efficiency (a share of a peak rate) lies in [1e-6, 1]: no kernel, link or collective
/// reaches less than a millionth of its peak.
inline constexpr double kMinEfficiency = 1e-6;
constexpr bool is_efficiency(double v) {
  return v >= kMinEfficiency && v <= 1;
}
/// A number for messages, in at most 6 significant digits: 1e+300, not std::to_string's 301
/// digits.
std::string number_text(double v);
/// What is_efficiency accepts, for messages: "a fraction in (0, 1], at least 1e-6".
std::string efficiency_expected();
/// A per-device slowdown factor lies in [1e-6, 1e6] (2 = twice as slow).
inline constexpr double kMaxSlowdown = 1e6;
constexpr bool is_slowdown(double v) {
  return v >= 1 / kMaxSlowdown && v <= kMaxSlowdown;
}
/// A rate of items per second that is a number (host Adam parameters per second per core): at
/// least 1000 per second (a real core updates about 1e8 to 1e9).
inline constexpr double kMinItemsPerSecond = 1e3;

}  // namespace stratasim
