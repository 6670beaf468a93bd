// A measured device profile: what real kernels, copies and collectives achieved on one device
// (and, for collectives, on one node of such devices), written by `stratasim calibrate`
// (exec/calibrate.hpp times them on the real back end) and read with the device's config. Where
// the profile has a measurement, the cost model (sim/cost.hpp) and the analytical network
// (sim/network.hpp) use it instead of their modelled figure; docs/calibration.md describes the
// schema and each lookup, docs/gemm-efficiency.md the GEMM interpolation.
//
// JSON (schema version 2; version 1 files, which lack "copy_bandwidth" and "collectives", are
// read too):
//   {
//     "schema": "stratasim-device-profile", "schema_version": 2,
//     "device": "H100-SXM5-80GB",          the DeviceSpec name the figures were measured on
//     "date": "2025-06-30",                when (ISO 8601)
//     "source": "stratasim calibrate 0.3, CUDA 12.4, cuBLASLt, 1980 MHz, 100 repetitions",
//     "kernel_launch_overhead": "4.2 us",  optional: per-kernel cost of a back-to-back launch
//     "memory_bandwidth": "2.9 TB/s",      optional: achieved streaming (copy) bandwidth
//     "elementwise_bandwidth": "2.7 TB/s", optional: achieved by elementwise kernels
//     "attention": {"bf16": "520 TFLOP/s"}, optional: achieved fused-attention rate per dtype
//     "copy_bandwidth": {                  optional, each direction optional: achieved copies
//       "host_to_device": "25 GB/s", "device_to_host": "24 GB/s"   between pinned host memory
//     },                                                              and the device
//     "gemm": [                            GEMM shapes: C[m,n] = A[m,k] B[k,n], batch times
//       {"m": 4096, "n": 4096, "k": 4096, "batch": 1, "dtype": "bf16", "time": "0.18 ms"},
//       {"m": 2048, "n": 8192, "k": 1024, "dtype": "bf16", "rate": "610 TFLOP/s"}
//     ],
//     "collectives": [                     optional: collectives within one node
//       {"kind": "all_reduce", "ranks": 8, "bytes": "64 MiB", "time": "1.2 ms"}
//     ]
//   }
// A GEMM row gives the kernel's duration ("time", launch overhead excluded, as CUDA events time
// kernels issued back to back) or its achieved rate ("rate", 2 m n k batch FLOPs per second),
// not both; "batch" defaults to 1. One row per (m, n, k, batch, dtype).
// A collective row: its kind (a name of hw::kCollectiveKindNames), how many devices of one node
// took part (>= 2), its size as nccl-tests counts it (strategies::Collective::bytes) and its
// duration. One row per (kind, ranks, bytes).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/config_reader.hpp"
#include "hw_models/dtype.hpp"
#include "hw_models/units.hpp"

namespace stratasim::hw {

/// One measured GEMM: C[m, n] = A[m, k] * B[k, n], `batch` times.
struct GemmMeasurement {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::bf16;
  Time time;  // kernel duration, launch overhead excluded

  /// 2 m n k batch.
  Flops flops() const;
  /// flops() / time.
  FlopRate rate() const;
};

/// One measured collective: `kind` over `ranks` devices of one node, `bytes` as nccl-tests
/// counts them (the whole buffer), taking `time`.
struct CollectiveMeasurementRow {
  std::uint8_t kind = 0;  // index into hw::kCollectiveKindNames (strategies::CollectiveKind order)
  int ranks = 2;
  Bytes bytes;
  Time time;
};

/// Measured (bytes, time) points of one collective kind and group size, sorted by bytes.
using CollectiveCurve = std::vector<std::pair<Bytes, Time>>;

/// The time of a collective of `bytes` from a non-empty measured curve:
/// - at a measured size, its time;
/// - between two measured sizes S_a < S < S_b (times t_a, t_b): linear in ln S,
///   t_a + (t_b - t_a) (ln S - ln S_a) / (ln S_b - ln S_a);
/// - below the smallest size S_1: t_1, a floor (small collectives are latency-bound: no
///   measurement says a smaller one is faster);
/// - above the largest size S_n: at the largest row's bus bandwidth (equivalently its
///   algorithm bandwidth, the group being the same), t_n S / S_n.
/// Rounded to the nearest picosecond.
Time interpolate_collective(const CollectiveCurve& curve, Bytes bytes);

/// The figure a profile keeps of repeated timings of one thing: their lower median (the
/// middle value; of an even count the lower of the two middle ones), so that it is a measured
/// value, exact to the picosecond. `stratasim calibrate` and a fit from a trace both take it.
/// Throws std::invalid_argument when `values` is empty.
Time lower_median(std::vector<Time> values);

struct DeviceProfile {
  static constexpr std::string_view kSchema = "stratasim-device-profile";
  static constexpr int kSchemaVersion = 2;

  int schema_version = kSchemaVersion;
  std::string device;  // DeviceSpec::name of the device measured
  std::string date;    // ISO 8601
  std::string source;  // tool, versions, clocks, repetitions; or "illustrative example"
  std::vector<GemmMeasurement> gemm;
  /// Achieved fused-attention rate per dtype (index: DType), FLOPs counted as the cost model
  /// counts them (causal kernels: the unmasked share).
  std::array<std::optional<FlopRate>, std::size(kAllDTypes)> attention{};
  std::optional<Bandwidth> memory_bandwidth;       // achieved streaming bandwidth
  std::optional<Bandwidth> elementwise_bandwidth;  // achieved by elementwise kernels
  std::optional<Time> kernel_launch_overhead;
  /// Achieved copies between (pinned) host memory and the device, each way (schema 2).
  std::optional<Bandwidth> host_to_device_bandwidth;
  std::optional<Bandwidth> device_to_host_bandwidth;
  /// Collectives measured within one node of such devices (schema 2).
  std::vector<CollectiveMeasurementRow> collectives;

  /// The row of exactly this shape and dtype, or nullptr.
  const GemmMeasurement* find_gemm(std::int64_t m, std::int64_t n, std::int64_t k,
                                   std::int64_t batch, DType dtype) const;
  /// Up to `count` rows of `dtype`, nearest first by the Euclidean distance between
  /// (ln m, ln n, ln k, ln batch) and the row's; each with its distance. Ties keep file order.
  std::vector<std::pair<const GemmMeasurement*, double>> nearest_gemms(
      std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, DType dtype,
      std::size_t count) const;
  bool has_gemm(DType dtype) const;
  /// The measured points of collective `kind` (index into hw::kCollectiveKindNames) over
  /// `ranks` devices, sorted by bytes; empty when there are none.
  CollectiveCurve collective_curve(std::size_t kind, int ranks) const;
  /// interpolate_collective over collective_curve(kind, ranks), or nullopt without rows.
  std::optional<Time> collective_time(std::size_t kind, int ranks, Bytes bytes) const;

  /// Checks ranges and duplicate rows; throws config::ValidationError ("gemm[3].time",
  /// "collectives[2].ranks").
  void validate() const;
};

/// Reads a profile from the object at `path` of `doc` (strict; validated). A schema other
/// than "stratasim-device-profile", or a version newer than kSchemaVersion, is an error; a
/// version 1 file may not have the keys version 2 added ("copy_bandwidth", "collectives").
DeviceProfile read_profile(const config::Document& doc, const std::string& path);
/// Loads a profile file.
DeviceProfile load_profile(const std::filesystem::path& file);
/// The profile as JSON in the schema above, always version kSchemaVersion (times in exact
/// picoseconds, rates in FLOP/s, sizes in bytes), for a calibration tool to write;
/// read_profile(to_json(p)) gives p back (with schema_version kSchemaVersion).
nlohmann::json to_json(const DeviceProfile& profile);
/// Writes to_json(profile) to `file` atomically (a temporary file renamed into place).
/// Throws std::runtime_error when it cannot.
void write_profile(const DeviceProfile& profile, const std::filesystem::path& file);

}  // namespace stratasim::hw
