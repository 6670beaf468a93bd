// What work costs on a device: a roofline per kernel. A GEMM takes the longer of its FLOP time
// (at a shape-aware efficiency: tile and wave quantisation over the device's compute units)
// and its memory time; memory-bound kernels take their bytes over the achievable bandwidth;
// every kernel pays the launch overhead.
#pragma once

#include <vector>

#include "hw_models/device.hpp"
#include "strategies/program.hpp"

namespace stratasim::sim {

class DeviceCostModel {
 public:
  explicit DeviceCostModel(const hw::DeviceSpec& device);

  /// Duration of one kernel, launch overhead included.
  Time kernel_time(const strategies::Kernel& kernel) const;
  /// Duration of a list of kernels run back to back.
  Time kernels_time(const std::vector<strategies::Kernel>& kernels) const;

  /// Fraction of peak a GEMM of this shape reaches: efficiency.gemm times the tile
  /// quantisation (useful / padded output tiles) times the wave quantisation (tiles / (waves *
  /// compute_units)). In (0, efficiency.gemm].
  double gemm_efficiency(const strategies::Gemm& gemm) const;

  const hw::DeviceSpec& device() const { return device_; }

 private:
  hw::DeviceSpec device_;
};

}  // namespace stratasim::sim
