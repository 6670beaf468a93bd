// What work costs on a device: a roofline per kernel. Every kernel pays a fixed per-kernel
// overhead (a GPU's launch, an FPGA's control and pipeline fill) plus its work time.
//
// GPUs (docs/gemm-efficiency.md): a GEMM takes the longer of its FLOP time, at
//   efficiency = efficiency.gemm x tile quantisation x wave quantisation,
// or, when the device has a calibrated kernel model (hw_models/kernel_model.hpp), at
//   peak_fraction(dtype) x tile quantisation x max over split-K s of
//     (wave quantisation of tiles x s) x k_s / (k_s + k_overhead),
// and its memory time (A, B and C once over the achievable bandwidth); a block-scaled FP8 GEMM
// whose kernel model has DeepGEMM parameters takes hw::deepgemm_seconds instead (DeepGEMM's
// tiles, waves and pipeline, overlapped with its DRAM stream); attention runs at
// efficiency.attention of peak, or at the calibrated model's rate for the kernel's
// implementation, direction, head dimension, causality and sequence length; memory-bound
// kernels take their bytes over the achievable bandwidth (an optimizer step: the update bytes
// of strategies/optimizer.hpp).
//
// FPGAs (docs/fpga.md): layer-pipelined dataflow designs (DNNBuilder, BaPipe's FPGA model) keep
// a fraction of the DSP array busy, with no tile or wave quantisation:
// - a GEMM or RooflineWork takes max(FLOPs / (peak x fpga.dataflow_efficiency),
//   bytes / (bandwidth x efficiency.memory)), where the bandwidth is the on-chip SRAM's when the
//   kernel's working set fits on chip (a GEMM's weights, the B operand; a RooflineWork's bytes,
//   all that is known of it), else the off-chip memory's (HBM, else DDR);
// - attention runs at efficiency.attention of peak, elementwise, optimizer and copy work stream
//   from off-chip memory.
//
// A measured profile (hw_models/profile.hpp), when the device has one, replaces the modelled
// figures it measures: a GEMM of a measured shape takes its measured time; another shape of a
// measured dtype takes an efficiency interpolated in log space over the nearest measured
// shapes, corrected by the roofline model's quantisation (gemm_efficiency); dtypes without rows
// keep the roofline model. Attention rates, bandwidths and the launch overhead likewise; a
// measured host <-> device copy bandwidth (docs/calibration.md) replaces the pcie link's
// bandwidth for copies in its direction (the link's latency stays).
//
// Heterogeneous clusters: the model of one rank uses that rank's device (overrides applied)
// and multiplies its on-device work by the rank's slowdown (a straggler: throttled clocks, a
// noisy neighbour). The fixed per-kernel overhead (host-side launch) and off-device work (host
// optimizer steps, PCIe and NVMe copies) are not slowed down.
//
// Off the device (given a cluster with a host and NVMe): each node's host memory bandwidth,
// cores and NVMe bandwidth are shared evenly by the node's devices, whose processes run their
// offloaded work at the same time.
// - a host optimizer step (ZeRO-Offload's CPU Adam) takes
//   max(update bytes / (host memory bandwidth / devices per node),
//       params / (cores / devices per node * adam_params_per_second_per_core)),
//   the update bytes those of strategies/optimizer.hpp (optimizer_update_bytes; Adam moves
//   12 + 4 bytes read: fp32 master, momentum, variance, fp32 gradient, and 12 + e written: the
//   states and the weights in the training dtype, e bytes); every optimizer is taken at Adam's
//   measured rate per core;
// - device <-> host copies: pcie latency + bytes / pcie bandwidth (the device's own link; the
//   profile's measured bandwidth for that direction when it has one);
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
  /// The cluster's (base) device, with the cluster's host and NVMe (when it has them).
  explicit DeviceCostModel(const hw::ClusterSpec& cluster);
  /// Rank `rank` of `cluster`: cluster.device_of(rank), with its on-device work taking
  /// cluster.slowdown_of(rank) times longer; the cluster's host and NVMe.
  DeviceCostModel(const hw::ClusterSpec& cluster, int rank);

  /// Duration of one kernel, per-kernel overhead included.
  Time kernel_time(const strategies::Kernel& kernel) const;
  /// Duration of a list of kernels run back to back.
  Time kernels_time(const std::vector<strategies::Kernel>& kernels) const;
  /// The shares of kernels_time(kernels) that communication beside them can slow
  /// (hw_models/interference.hpp): on-device work of compute-bound kernels (GEMMs, fused
  /// attention, roofline work) and of memory-bound ones (elementwise, the optimizer step, device
  /// copies). Launch overheads, work off the device and measured kernels (whose durations were
  /// measured with whatever ran beside them) are neither.
  hw::WorkMix work_mix(const std::vector<strategies::Kernel>& kernels) const;
  /// The memory bandwidth a streaming kernel reaches: the profile's measured figure, else the
  /// device's bandwidth times efficiency.memory.
  Bandwidth streaming_bandwidth() const;

  /// Fraction of peak a GEMM of this shape reaches: from the profile when it measures the
  /// dtype (exact, or interpolated), else modelled_gemm_efficiency. In (0, 1].
  double gemm_efficiency(const strategies::Gemm& gemm) const;
  /// The model without a profile: GPUs efficiency.gemm x quantisation(gemm); FPGAs
  /// fpga.dataflow_efficiency.
  double modelled_gemm_efficiency(const strategies::Gemm& gemm) const;
  /// GPUs: tile quantisation (useful / padded output tiles) x wave quantisation (tiles /
  /// (waves x compute_units)), in (0, 1]; FPGAs: 1.
  double quantisation(const strategies::Gemm& gemm) const;
  /// The calibrated model's shape factor (hw_models/kernel_model.hpp): tile quantisation x the
  /// best over split-K factors s of the wave factor(tiles x s) x k_s / (k_s + k_overhead).
  double calibrated_shape_factor(const strategies::Gemm& gemm, const hw::GemmModel& model) const;
  /// Fraction of peak a fused attention kernel reaches: the calibrated model's for its
  /// implementation when the device has one, else efficiency.attention.
  double attention_efficiency(const strategies::Attention& attention) const;

  const hw::DeviceSpec& device() const { return device_; }
  /// The fixed per-kernel cost: the profile's measured launch overhead, else the device's.
  Time launch_overhead() const;
  /// How many times longer on-device work takes (1 unless the cluster slows this rank down).
  double slowdown() const { return slowdown_; }

 private:
  struct Cost {
    Time overhead;  // fixed per-kernel cost, never slowed down
    Time work;      // on-device work, slowed down
    Time off_device;
  };
  Cost kernel_cost(const strategies::Kernel& kernel) const;
  Time gemm_work(const strategies::Gemm& gemm, const strategies::Kernel& kernel) const;
  Time host_optimizer_time(const strategies::OptimizerStep& step) const;
  Time copy_time(const strategies::Copy& copy) const;
  const hw::HostSpec& host(const char* what) const;
  const hw::NvmeSpec& nvme(const char* what) const;

  hw::DeviceSpec device_;
  std::optional<hw::HostSpec> host_;
  std::optional<hw::NvmeSpec> nvme_;
  int devices_per_node_ = 1;
  double slowdown_ = 1.0;
};

}  // namespace stratasim::sim
