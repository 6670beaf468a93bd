#include "sim/cost.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace stratasim::sim {

namespace {

using strategies::Attention;
using strategies::Copy;
using strategies::Elementwise;
using strategies::Gemm;
using strategies::Measured;
using strategies::MemoryTier;
using strategies::OptimizerKind;
using strategies::OptimizerStep;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

DeviceCostModel::DeviceCostModel(const hw::DeviceSpec& device) : device_(device) {}

DeviceCostModel::DeviceCostModel(const hw::ClusterSpec& cluster)
    : device_(cluster.device),
      host_(cluster.host),
      nvme_(cluster.nvme),
      devices_per_node_(std::max(1, cluster.devices_per_node)) {}

const hw::HostSpec& DeviceCostModel::host(const char* what) const {
  if (!host_) {
    throw std::invalid_argument(std::string(what) +
                                " needs the cluster's host (memory, cores, pcie): none is given");
  }
  return *host_;
}

const hw::NvmeSpec& DeviceCostModel::nvme(const char* what) const {
  if (!nvme_) {
    throw std::invalid_argument(std::string(what) +
                                " needs the cluster's NVMe (capacity, bandwidth): none is given");
  }
  return *nvme_;
}

Time DeviceCostModel::host_optimizer_time(const OptimizerStep& step) const {
  const hw::HostSpec& h = host("a host optimizer step");
  const double share = 1.0 / devices_per_node_;
  const std::int64_t size = size_of(step.dtype);
  // Adam reads the fp32 master weights, momentum, variance and gradient (16 bytes) and writes
  // the states (12) and the weights in the training dtype; SGD reads master and gradient (8)
  // and writes the master and the weights.
  const std::int64_t per_param = step.kind == OptimizerKind::adam ? 16 + 12 + size : 8 + 4 + size;
  const Time t_memory = transfer_time(Bytes(step.params * per_param), h.memory_bandwidth * share);
  const double rate = static_cast<double>(h.cores) * share * h.adam_params_per_second_per_core;
  const Time t_compute = Time::from_seconds(static_cast<double>(step.params) / rate);
  return std::max(t_memory, t_compute);
}

Time DeviceCostModel::copy_time(const Copy& c) const {
  const double share = 1.0 / devices_per_node_;
  auto pcie = [&] {
    const hw::HostSpec& h = host("a copy between device and host or NVMe");
    return h.pcie.latency + transfer_time(c.bytes, h.pcie.bandwidth);
  };
  auto storage = [&](Bytes bytes) {
    return transfer_time(bytes, nvme("a copy to or from NVMe").bandwidth * share);
  };
  const bool device_side = c.from == MemoryTier::device || c.to == MemoryTier::device;
  const bool nvme_side = c.from == MemoryTier::nvme || c.to == MemoryTier::nvme;
  if (c.from == c.to) {
    if (c.from == MemoryTier::host) {
      return transfer_time(c.bytes * 2, host("a copy within host memory").memory_bandwidth * share);
    }
    return storage(c.bytes * 2);  // NVMe to NVMe: read and write
  }
  if (device_side && nvme_side) return pcie() + storage(c.bytes);  // in series
  if (device_side) return pcie();
  return storage(c.bytes);  // host <-> NVMe
}

double DeviceCostModel::gemm_efficiency(const Gemm& gemm) const {
  const double base = device_.efficiency.gemm;
  if (gemm.m <= 0 || gemm.n <= 0 || gemm.batch <= 0) return base;
  const std::int64_t tile_m = std::max(1, device_.efficiency.tile_m);
  const std::int64_t tile_n = std::max(1, device_.efficiency.tile_n);
  const std::int64_t units = std::max(1, device_.compute_units);
  const std::int64_t tiles_m = ceil_div(gemm.m, tile_m);
  const std::int64_t tiles_n = ceil_div(gemm.n, tile_n);
  // Useful output over padded output: the edge tiles do full work for partial results.
  const double tile_q =
      (static_cast<double>(gemm.m) * static_cast<double>(gemm.n)) /
      (static_cast<double>(tiles_m * tile_m) * static_cast<double>(tiles_n * tile_n));
  // The last wave of tiles may leave compute units idle.
  const double tiles =
      static_cast<double>(tiles_m) * static_cast<double>(tiles_n) * static_cast<double>(gemm.batch);
  const double waves = std::ceil(tiles / static_cast<double>(units));
  const double wave_q = tiles / (waves * static_cast<double>(units));
  return base * tile_q * wave_q;
}

Time DeviceCostModel::kernel_time(const strategies::Kernel& kernel) const {
  const Bandwidth memory = device_.memory_bandwidth * device_.efficiency.memory;
  const Time launch = device_.kernel_launch_overhead;
  return std::visit(
      [&](const auto& w) -> Time {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, Gemm>) {
          if (w.m <= 0 || w.n <= 0 || w.k <= 0 || w.batch <= 0) return launch;
          const Flops flops = strategies::matmul_flops(kernel);
          const Time t_flop = compute_time(flops, device_.peak(w.dtype) * gemm_efficiency(w));
          const std::int64_t bytes =
              (w.m * w.k + w.k * w.n + w.m * w.n) * w.batch * size_of(w.dtype);
          const Time t_mem = transfer_time(Bytes(bytes), memory);
          return launch + std::max(t_flop, t_mem);
        } else if constexpr (std::is_same_v<W, Attention>) {
          // A causal kernel skips the masked part of the score matrix: half of it when queries
          // and keys are the same tokens; when the queries are the last seq_q of seq_kv tokens
          // (a TeraPipe slice after its prefix), each query sees the prefix and the causal half
          // of its own slice: seq_kv - seq_q / 2 keys on average.
          double causal_share = 1.0;
          if (w.causal && w.seq_kv > 0) {
            const double q = static_cast<double>(std::min(w.seq_q, w.seq_kv));
            causal_share = (static_cast<double>(w.seq_kv) - q / 2) / static_cast<double>(w.seq_kv);
          }
          const Flops flops(strategies::matmul_flops(kernel).count() * causal_share);
          const Time t_flop =
              compute_time(flops, device_.peak(w.dtype) * device_.efficiency.attention);
          // Read Q, K, V and write O; the backward pass also reads dO and writes dQ, dK, dV.
          const std::int64_t kv_heads = w.kv_heads > 0 ? w.kv_heads : w.heads;
          std::int64_t bytes = (2 * w.batch * w.heads * w.seq_q * w.head_dim +
                                2 * w.batch * kv_heads * w.seq_kv * w.head_dim) *
                               size_of(w.dtype);
          if (w.backward) bytes = bytes * 5 / 2;  // exact: bytes is even
          const Time t_mem = transfer_time(Bytes(bytes), memory);
          return launch + std::max(t_flop, t_mem);
        } else if constexpr (std::is_same_v<W, Elementwise>) {
          return launch + transfer_time(w.bytes_read + w.bytes_written, memory);
        } else if constexpr (std::is_same_v<W, OptimizerStep>) {
          if (w.on_host) return host_optimizer_time(w);
          const std::int64_t size = size_of(w.dtype);
          std::int64_t per_param = 0;
          if (w.kind == OptimizerKind::adam) {
            // Read fp32 master, m, v (12) and the gradient; write master, m, v (12) and the
            // weight copy in `dtype`.
            per_param = 12 + size + 12 + size;
          } else {
            // Read fp32 master and the gradient; write the master and the weight copy.
            per_param = 4 + size + 4 + size;
          }
          return launch + transfer_time(Bytes(w.params * per_param), memory);
        } else if constexpr (std::is_same_v<W, Copy>) {
          if (w.from != MemoryTier::device || w.to != MemoryTier::device) return copy_time(w);
          return launch + transfer_time(w.bytes * 2, memory);  // read and write
        } else if constexpr (std::is_same_v<W, strategies::RooflineWork>) {
          const Time t_flop =
              compute_time(w.flops, device_.peak(w.dtype) * device_.efficiency.gemm);
          return launch + std::max(t_flop, transfer_time(w.bytes, memory));
        } else {
          static_assert(std::is_same_v<W, Measured>);
          return w.duration;
        }
      },
      kernel.work);
}

Time DeviceCostModel::kernels_time(const std::vector<strategies::Kernel>& kernels) const {
  Time total;
  for (const auto& k : kernels) total += kernel_time(k);
  return total;
}

}  // namespace stratasim::sim
