// What work costs on a device: a roofline per kernel. A GEMM takes the longer of its FLOP time
// (at a shape-aware efficiency: tile and wave quantisation over the device's compute units)
// and its memory time; memory-bound kernels take their bytes over the achievable bandwidth;
// every kernel pays the launch overhead.
//
// Off the device (given a cluster with a host and NVMe): each node's host memory bandwidth,
// cores and NVMe bandwidth are shared evenly by the node's devices, whose processes run their
// offloaded work at the same time.
// - a host optimizer step (ZeRO-Offload's CPU Adam) takes
//   max(params * bytes per param / (host memory bandwidth / devices per node),
//       params / (cores / devices per node * adam_params_per_second_per_core)),
//   Adam moving 12 + 4 bytes read (fp32 master, momentum, variance; fp32 gradient) and 12 + e
//   written (the states and the weights in the training dtype, e bytes);
// - device <-> host copies: pcie latency + bytes / pcie bandwidth (the device's own link);
// - host <-> NVMe: bytes / (NVMe bandwidth / devices per node);
// - device <-> NVMe: both of the above in series;
// - within the host (or NVMe): bytes read and written at its share of the bandwidth.
// No launch overhead applies off the device.
#pragma once

#include <optional>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/device.hpp"
#include "strategies/program.hpp"

namespace stratasim::sim {

class DeviceCostModel {
 public:
  /// A device alone: host optimizer steps and copies off the device cannot be costed (they
  /// throw std::invalid_argument).
  explicit DeviceCostModel(const hw::DeviceSpec& device);
  /// A device of `cluster`, with the cluster's host and NVMe (when it has them).
  explicit DeviceCostModel(const hw::ClusterSpec& cluster);

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
  Time host_optimizer_time(const strategies::OptimizerStep& step) const;
  Time copy_time(const strategies::Copy& copy) const;
  const hw::HostSpec& host(const char* what) const;
  const hw::NvmeSpec& nvme(const char* what) const;

  hw::DeviceSpec device_;
  std::optional<hw::HostSpec> host_;
  std::optional<hw::NvmeSpec> nvme_;
  int devices_per_node_ = 1;
};

}  // namespace stratasim::sim
