// A measured device profile: what real kernels achieved on one device, written by
// `stratasim calibrate` (the CUDA back end times them) and read with the device's config. Where
// the profile has a measurement, the cost model (sim/cost.hpp) uses it instead of its modelled
// figure; docs/gemm-efficiency.md describes the schema and the lookup.
//
// JSON (schema version 1):
//   {
//     "schema": "stratasim-device-profile", "schema_version": 1,
//     "device": "H100-SXM5-80GB",          the DeviceSpec name the figures were measured on
//     "date": "2025-06-30",                when (ISO 8601)
//     "source": "stratasim calibrate 0.3, CUDA 12.4, cuBLASLt, 1980 MHz, 100 repetitions",
//     "kernel_launch_overhead": "4.2 us",  optional: per-kernel cost of a back-to-back launch
//     "memory_bandwidth": "2.9 TB/s",      optional: achieved streaming (copy) bandwidth
//     "elementwise_bandwidth": "2.7 TB/s", optional: achieved by elementwise kernels
//     "attention": {"bf16": "520 TFLOP/s"}, optional: achieved fused-attention rate per dtype
//     "gemm": [                            GEMM shapes: C[m,n] = A[m,k] B[k,n], batch times
//       {"m": 4096, "n": 4096, "k": 4096, "batch": 1, "dtype": "bf16", "time": "0.18 ms"},
//       {"m": 2048, "n": 8192, "k": 1024, "dtype": "bf16", "rate": "610 TFLOP/s"}
//     ]
//   }
// A row gives the kernel's duration ("time", launch overhead excluded, as CUDA events time
// kernels issued back to back) or its achieved rate ("rate", 2 m n k batch FLOPs per second),
// not both; "batch" defaults to 1. One row per (m, n, k, batch, dtype).
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

struct DeviceProfile {
  static constexpr std::string_view kSchema = "stratasim-device-profile";
  static constexpr int kSchemaVersion = 1;

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

  /// The row of exactly this shape and dtype, or nullptr.
  const GemmMeasurement* find_gemm(std::int64_t m, std::int64_t n, std::int64_t k,
                                   std::int64_t batch, DType dtype) const;
  /// Up to `count` rows of `dtype`, nearest first by the Euclidean distance between
  /// (ln m, ln n, ln k, ln batch) and the row's; each with its distance. Ties keep file order.
  std::vector<std::pair<const GemmMeasurement*, double>> nearest_gemms(
      std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, DType dtype,
      std::size_t count) const;
  bool has_gemm(DType dtype) const;

  /// Checks ranges and duplicate rows; throws config::ValidationError ("gemm[3].time").
  void validate() const;
};

/// Reads a profile from the object at `path` of `doc` (strict; validated). A schema other
/// than "stratasim-device-profile", or a version newer than kSchemaVersion, is an error.
DeviceProfile read_profile(const config::Document& doc, const std::string& path);
/// Loads a profile file.
DeviceProfile load_profile(const std::filesystem::path& file);
/// The profile as JSON in the schema above (times in exact picoseconds, rates in FLOP/s), for
/// a calibration tool to write; read_profile(to_json(p)) gives p back.
nlohmann::json to_json(const DeviceProfile& profile);
/// Writes to_json(profile) to `file` atomically (a temporary file renamed into place).
/// Throws std::runtime_error when it cannot.
void write_profile(const DeviceProfile& profile, const std::filesystem::path& file);

}  // namespace stratasim::hw
