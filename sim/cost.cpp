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
          // A causal kernel skips the masked half of the score matrix.
          const Flops flops(strategies::matmul_flops(kernel).count() * (w.causal ? 0.5 : 1.0));
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
          if (w.on_host) {
            throw std::invalid_argument("host optimizer steps are not modelled yet");
          }
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
          if (w.from != MemoryTier::device || w.to != MemoryTier::device) {
            throw std::invalid_argument("copies from " + std::string(name_of(w.from)) + " to " +
                                        std::string(name_of(w.to)) +
                                        " memory are not modelled yet");
          }
          return launch + transfer_time(w.bytes * 2, memory);  // read and write
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
