#include "sim/cost.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>

#include "strategies/kernel_bytes.hpp"
#include "strategies/optimizer.hpp"

namespace stratasim::sim {

namespace {

using strategies::Attention;
using strategies::Copy;
using strategies::Elementwise;
using strategies::Gemm;
using strategies::Measured;
using strategies::MemoryTier;
using strategies::OptimizerStep;

/// Measured GEMM shapes an unmeasured shape's efficiency is interpolated from.
constexpr std::size_t kProfileNeighbours = 4;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

Time scaled(Time t, double factor) {
  if (factor == 1.0) return t;
  return Time::ps(std::llround(static_cast<double>(t.picoseconds()) * factor));
}

}  // namespace

DeviceCostModel::DeviceCostModel(const hw::DeviceSpec& device) : device_(device) {}

DeviceCostModel::DeviceCostModel(const hw::ClusterSpec& cluster)
    : device_(cluster.device),
      host_(cluster.host),
      nvme_(cluster.nvme),
      devices_per_node_(std::max(1, cluster.devices_per_node)) {}

DeviceCostModel::DeviceCostModel(const hw::ClusterSpec& cluster, int rank)
    : device_(cluster.device_of(rank)),
      host_(cluster.host),
      nvme_(cluster.nvme),
      devices_per_node_(std::max(1, cluster.devices_per_node)),
      slowdown_(cluster.slowdown_of(rank)) {
  if (!(slowdown_ > 0)) {
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                ": expected a positive slowdown, got " + std::to_string(slowdown_));
  }
}

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
  // The bytes of strategies/optimizer.hpp's table (Adam: 16 read, 12 + e written); the host's
  // measured rate is Adam's and is taken for every optimizer (they are memory bound there).
  const Time t_memory =
      transfer_time(strategies::optimizer_update_bytes(step).total(), h.memory_bandwidth * share);
  const double rate = static_cast<double>(h.cores) * share * h.adam_params_per_second_per_core;
  const Time t_compute = Time::from_seconds(static_cast<double>(step.params) / rate);
  return std::max(t_memory, t_compute);
}

Time DeviceCostModel::copy_time(const Copy& c) const {
  const double share = 1.0 / devices_per_node_;
  auto pcie = [&] {
    const hw::HostSpec& h = host("a copy between device and host or NVMe");
    // The profile's measured copy bandwidth in this direction, when it has one, replaces the
    // link's; the link's latency stays.
    Bandwidth bandwidth = h.pcie.bandwidth;
    if (const hw::DeviceProfile* profile = device_.profile.get()) {
      const auto& measured = c.to == MemoryTier::device ? profile->host_to_device_bandwidth
                                                        : profile->device_to_host_bandwidth;
      if (measured) bandwidth = *measured;
    }
    return h.pcie.latency + transfer_time(c.bytes, bandwidth);
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

namespace {

/// How a GEMM's output is cut into the device's tiles: the useful share of the padded output
/// (edge tiles do full work for partial results), the tiles and the units that run them.
struct Tiling {
  double tile_q = 1;
  std::int64_t tiles = 1;
  std::int64_t units = 1;
};

Tiling tiling(const hw::DeviceSpec& device, const Gemm& gemm) {
  const std::int64_t tile_m = std::max(1, device.efficiency.tile_m);
  const std::int64_t tile_n = std::max(1, device.efficiency.tile_n);
  const std::int64_t tiles_m = ceil_div(gemm.m, tile_m);
  const std::int64_t tiles_n = ceil_div(gemm.n, tile_n);
  Tiling t;
  t.tile_q = (static_cast<double>(gemm.m) * static_cast<double>(gemm.n)) /
             (static_cast<double>(tiles_m * tile_m) * static_cast<double>(tiles_n * tile_n));
  t.tiles = tiles_m * tiles_n * gemm.batch;
  t.units = std::max(1, device.compute_units);
  return t;
}

/// Share of the units busy over the waves that run `work` tiles: work / (waves x units).
double wave_fraction(std::int64_t work, std::int64_t units) {
  const double waves = std::ceil(static_cast<double>(work) / static_cast<double>(units));
  return static_cast<double>(work) / (waves * static_cast<double>(units));
}

}  // namespace

double DeviceCostModel::quantisation(const Gemm& gemm) const {
  if (device_.is_fpga()) return 1.0;  // a dataflow array has no output tiles or waves
  if (gemm.m <= 0 || gemm.n <= 0 || gemm.batch <= 0) return 1.0;
  const Tiling t = tiling(device_, gemm);
  // The last wave of tiles may leave compute units idle.
  return t.tile_q * wave_fraction(t.tiles, t.units);
}

double DeviceCostModel::modelled_gemm_efficiency(const Gemm& gemm) const {
  if (device_.is_fpga()) return device_.fpga->dataflow_efficiency;
  const hw::GemmModel* model =
      device_.kernel_model ? device_.kernel_model->gemm_for(gemm.dtype, gemm.scaling) : nullptr;
  if (model == nullptr) return device_.efficiency.gemm * quantisation(gemm);
  if (model->deepgemm && gemm.m > 0 && gemm.n > 0 && gemm.k > 0 && gemm.batch > 0) {
    // The share of peak DeepGEMM's time (its own latency excluded) works at.
    const double peak = device_.peak(gemm.dtype).flops_per_second();
    const double seconds =
        hw::deepgemm_seconds(*model, gemm.m, gemm.n, gemm.k, gemm.batch, device_.compute_units,
                             peak, device_.memory_bandwidth.bytes_per_second()) -
        model->latency;
    const double flops = 2.0 * static_cast<double>(gemm.m) * static_cast<double>(gemm.n) *
                         static_cast<double>(gemm.k) * static_cast<double>(gemm.batch);
    return std::clamp(flops / (peak * seconds), 1e-9, 1.0);
  }
  return model->peak_fraction * calibrated_shape_factor(gemm, *model);
}

double DeviceCostModel::calibrated_shape_factor(const Gemm& gemm,
                                                const hw::GemmModel& model) const {
  if (gemm.m <= 0 || gemm.n <= 0 || gemm.k <= 0 || gemm.batch <= 0) return 1.0;
  const Tiling t = tiling(device_, gemm);
  // Split-K: when the tiles leave compute units idle, k is split over s units (each doing k/s of
  // the main loop, paying the tile's prologue and epilogue once); s is the best for this shape.
  double best = 0;
  const std::int64_t max_split =
      t.tiles >= t.units ? 1 : std::max<std::int64_t>(1, t.units / t.tiles);
  for (std::int64_t s = 1; s <= max_split; ++s) {
    const double wave_q = 1 - model.wave_loss * (1 - wave_fraction(t.tiles * s, t.units));
    const double k_s = static_cast<double>(gemm.k) / static_cast<double>(s);
    const double k_q = k_s / (k_s + model.k_overhead);
    best = std::max(best, wave_q * k_q);
  }
  return t.tile_q * best;
}

double DeviceCostModel::gemm_efficiency(const Gemm& gemm) const {
  const hw::DeviceProfile* profile = device_.profile.get();
  if (profile == nullptr || gemm.m <= 0 || gemm.n <= 0 || gemm.k <= 0 || gemm.batch <= 0 ||
      !profile->has_gemm(gemm.dtype)) {
    return modelled_gemm_efficiency(gemm);
  }
  const double peak = device_.peak(gemm.dtype).flops_per_second();
  auto efficiency_of = [&](const hw::GemmMeasurement& row) {
    return row.rate().flops_per_second() / peak;
  };
  if (const auto* row = profile->find_gemm(gemm.m, gemm.n, gemm.k, gemm.batch, gemm.dtype)) {
    return std::min(1.0, efficiency_of(*row));
  }
  // Inverse-square-distance weighting, in log space, of the neighbours' efficiencies with
  // their own quantisation divided out; the query's quantisation is applied to the result.
  double sum_w = 0, sum = 0;
  for (const auto& [row, distance] :
       profile->nearest_gemms(gemm.m, gemm.n, gemm.k, gemm.batch, gemm.dtype, kProfileNeighbours)) {
    const Gemm shape{row->m, row->n, row->k, row->batch, row->dtype};
    const double base = efficiency_of(*row) / quantisation(shape);
    const double w = 1.0 / (distance * distance);
    sum_w += w;
    sum += w * std::log(base);
  }
  return std::clamp(std::exp(sum / sum_w) * quantisation(gemm), 1e-9, 1.0);
}

double DeviceCostModel::attention_efficiency(const Attention& a) const {
  const hw::AttentionModel* model = device_.kernel_model && !device_.is_fpga()
                                        ? device_.kernel_model->attention_for(a.impl)
                                        : nullptr;
  if (model == nullptr) return device_.efficiency.attention;
  // Keys each query attends to: all of them, (causal) on average seq_kv - seq_q / 2, or fewer
  // within a sliding window or an attention chunk (strategies::attention_keys_per_query).
  const double keys = strategies::attention_keys_per_query(a);
  // The fall-off is fitted against the sequence length of self-attention benchmarks, where a
  // causal kernel's keys per query are s / 2: undo that halving to look up the same curve (a
  // windowed kernel's band of w keys per query is costed as a causal kernel over 2w tokens, a
  // chunked one as a causal kernel over one chunk).
  const double s = a.causal ? 2 * keys : keys;
  return model->efficiency(a.impl, a.backward, a.causal, static_cast<double>(a.head_dim), s);
}

Bandwidth DeviceCostModel::streaming_bandwidth() const {
  if (device_.profile && device_.profile->memory_bandwidth) {
    return *device_.profile->memory_bandwidth;
  }
  return device_.memory_bandwidth * device_.efficiency.memory;
}

Time DeviceCostModel::launch_overhead() const {
  if (device_.profile && device_.profile->kernel_launch_overhead) {
    return *device_.profile->kernel_launch_overhead;
  }
  return device_.kernel_launch_overhead;
}

Time DeviceCostModel::gemm_work(const Gemm& w, const strategies::Kernel& kernel) const {
  if (const hw::DeviceProfile* profile = device_.profile.get()) {
    if (const auto* row = profile->find_gemm(w.m, w.n, w.k, w.batch, w.dtype)) return row->time;
  }
  // The calibrated model, where it (not a measured profile) sets the cost: its per-kernel
  // latency and what the device's die holds of its rate inside training steps.
  const hw::GemmModel* model = device_.kernel_model && !device_.is_fpga()
                                   ? device_.kernel_model->gemm_for(w.dtype, w.scaling)
                                   : nullptr;
  const bool calibrated =
      model != nullptr && !(device_.profile && device_.profile->has_gemm(w.dtype));
  const double die = calibrated ? device_.efficiency.die_gemm : 1.0;
  // Block-scaled FP8 with DeepGEMM parameters: costed as DeepGEMM runs the shape (its tiles,
  // waves, pipeline and DRAM stream; hw_models/kernel_model.hpp), unless a profile measures fp8.
  if (calibrated && model->deepgemm) {
    const double peak =
        device_.peak(w.dtype).flops_per_second() * device_.efficiency.framework_compute * die;
    return Time::from_seconds(hw::deepgemm_seconds(*model, w.m, w.n, w.k, w.batch,
                                                   device_.compute_units, peak,
                                                   device_.memory_bandwidth.bytes_per_second()));
  }
  const Flops flops = strategies::matmul_flops(kernel);
  const Time t_flop =
      compute_time(flops, device_.peak(w.dtype) *
                              (gemm_efficiency(w) * device_.efficiency.framework_compute * die));
  // A, B and C once, packed (fp4: two elements a byte).
  const Bytes bytes = strategies::gemm_memory_bytes(w);
  Bandwidth bandwidth = streaming_bandwidth();
  if (device_.is_fpga()) {
    // The weights (B) held in BRAM/URAM: the layer's traffic stays on chip.
    const Bytes weights(packed_bytes(w.dtype, w.k * w.n * w.batch));
    if (weights <= device_.fpga->on_chip.capacity) {
      bandwidth = device_.fpga->on_chip.bandwidth * device_.efficiency.memory;
    }
  }
  Time t = std::max(t_flop, transfer_time(bytes, bandwidth));
  if (calibrated) t += Time::from_seconds(model->latency);
  return t;
}

DeviceCostModel::Cost DeviceCostModel::kernel_cost(const strategies::Kernel& kernel) const {
  const Bandwidth memory = streaming_bandwidth();
  const Time launch = launch_overhead();
  return std::visit(
      [&](const auto& w) -> Cost {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, Gemm>) {
          if (w.m <= 0 || w.n <= 0 || w.k <= 0 || w.batch <= 0) return {launch, {}, {}};
          return {launch, gemm_work(w, kernel), {}};
        } else if constexpr (std::is_same_v<W, Attention>) {
          const Flops flops = strategies::attention_flops(w);
          const bool calibrated = device_.kernel_model && !device_.is_fpga() &&
                                  device_.kernel_model->attention_for(w.impl) != nullptr;
          FlopRate rate = device_.peak(w.dtype) *
                          (attention_efficiency(w) * device_.efficiency.framework_compute *
                           device_.efficiency.framework_attention *
                           (calibrated ? device_.efficiency.die_attention : 1.0));
          if (device_.profile) {
            if (const auto& measured =
                    device_.profile->attention[static_cast<std::size_t>(w.dtype)]) {
              rate = *measured;
            }
          }
          const Time t_flop = compute_time(flops, rate);
          // Read Q, K, V and write O; the backward pass also reads dO and writes dQ, dK, dV.
          const Time t_mem = transfer_time(strategies::attention_memory_bytes(w), memory);
          return {launch, std::max(t_flop, t_mem), {}};
        } else if constexpr (std::is_same_v<W, Elementwise>) {
          Bandwidth bandwidth = memory;
          if (device_.profile && device_.profile->elementwise_bandwidth) {
            bandwidth = *device_.profile->elementwise_bandwidth;
          }
          const double traffic = device_.efficiency.framework_memory_traffic;
          const Bytes bytes = w.bytes_read + w.bytes_written;
          return {
              launch,
              transfer_time(traffic == 1.0 ? bytes
                                           : Bytes(static_cast<std::int64_t>(std::llround(
                                                 static_cast<double>(bytes.count()) * traffic))),
                            bandwidth),
              {}};
        } else if constexpr (std::is_same_v<W, OptimizerStep>) {
          if (w.on_host) return {{}, {}, host_optimizer_time(w)};
          // One memory-bound pass: the bytes of strategies/optimizer.hpp's table.
          return {launch, transfer_time(strategies::optimizer_update_bytes(w).total(), memory), {}};
        } else if constexpr (std::is_same_v<W, Copy>) {
          if (w.from != MemoryTier::device || w.to != MemoryTier::device) {
            return {{}, {}, copy_time(w)};
          }
          return {launch, transfer_time(w.bytes * 2, memory), {}};  // read and write
        } else if constexpr (std::is_same_v<W, strategies::RooflineWork>) {
          const double efficiency =
              device_.is_fpga() ? device_.fpga->dataflow_efficiency : device_.efficiency.gemm;
          const Time t_flop = compute_time(w.flops, device_.peak(w.dtype) * efficiency);
          Bandwidth bandwidth = memory;
          if (device_.is_fpga() && w.bytes <= device_.fpga->on_chip.capacity) {
            bandwidth = device_.fpga->on_chip.bandwidth * device_.efficiency.memory;
          }
          return {launch, std::max(t_flop, transfer_time(w.bytes, bandwidth)), {}};
        } else {
          static_assert(std::is_same_v<W, Measured>);
          return {{}, w.duration, {}};
        }
      },
      kernel.work);
}

Time DeviceCostModel::kernel_time(const strategies::Kernel& kernel) const {
  const Cost c = kernel_cost(kernel);
  return c.overhead + scaled(c.work, slowdown_) + c.off_device;
}

hw::WorkMix DeviceCostModel::work_mix(const std::vector<strategies::Kernel>& kernels) const {
  double total = 0, compute = 0, memory = 0;
  for (const auto& k : kernels) {
    const Cost c = kernel_cost(k);
    const double work = static_cast<double>(scaled(c.work, slowdown_).picoseconds());
    total += static_cast<double>(c.overhead.picoseconds() + c.off_device.picoseconds()) + work;
    // A measured duration already holds whatever slowed it when it was measured.
    if (std::holds_alternative<strategies::Measured>(k.work)) continue;
    const bool memory_bound = std::holds_alternative<strategies::Elementwise>(k.work) ||
                              std::holds_alternative<strategies::OptimizerStep>(k.work) ||
                              std::holds_alternative<strategies::Copy>(k.work);
    (memory_bound ? memory : compute) += work;
  }
  if (!(total > 0)) return {};
  return {compute / total, memory / total};
}

Time DeviceCostModel::kernels_time(const std::vector<strategies::Kernel>& kernels) const {
  Time total;
  for (const auto& k : kernels) total += kernel_time(k);
  return total;
}

}  // namespace stratasim::sim
