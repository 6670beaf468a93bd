// What an accelerator is: peak rates, memory, launch overhead and the efficiency figures the
// roofline cost model uses. Figures are per device.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "hw_models/config_reader.hpp"
#include "hw_models/dtype.hpp"
#include "hw_models/units.hpp"

namespace stratasim::hw {

struct DeviceEfficiency {
  double gemm = 0.8;       // fraction of peak a large, well-shaped GEMM reaches (0, 1]
  double attention = 0.5;  // fraction of peak a fused attention kernel reaches (0, 1]
  double memory = 0.85;    // fraction of memory bandwidth a streaming kernel reaches (0, 1]
  int tile_m = 128;        // GEMM output tile the libraries use; sets tile/wave quantisation
  int tile_n = 128;
};

struct DeviceSpec {
  std::string name;
  std::string kind = "gpu";
  std::string source;
  /// Dense peak rate per dtype (FLOP/s); absent when the device has no such unit.
  std::array<std::optional<FlopRate>, std::size(kAllDTypes)> peak_flops{};
  Bytes memory_capacity;       // device memory (HBM)
  Bandwidth memory_bandwidth;  // device memory bandwidth (bytes/s)
  Time kernel_launch_overhead = Time::us(4);
  int compute_units = 108;  // SMs: how many GEMM tiles run at once
  DeviceEfficiency efficiency;

  /// Peak for `t`, falling back as hardware does: tf32 -> fp32, bf16 <-> fp16, fp8 -> fp16.
  /// Throws std::invalid_argument when the device has no usable rate.
  FlopRate peak(DType t) const;
  /// Checks ranges; throws config::ValidationError with the offending key's path.
  void validate() const;
};

/// Reads a device from the object at `path` of `doc` (strict; validated).
DeviceSpec read_device(const config::Document& doc, const std::string& path);

}  // namespace stratasim::hw
