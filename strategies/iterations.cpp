#include "strategies/iterations.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace stratasim::strategies {

namespace {

constexpr std::size_t kStreams = static_cast<std::size_t>(kStreamCount);
constexpr std::int64_t kNone = -1;

// Per layer and stream, the index (in the rank's iteration) of the last update covering the
// layer; `any` per stream, the last update of any layer.
struct LastUpdates {
  std::vector<std::int64_t> of_layer;  // layers x streams
  std::array<std::int64_t, kStreams> any{};
};

int layer_count(const Program& p) {
  int layers = 0;
  for (const Op& op : p.ops()) layers = std::max<int>(layers, op.layer_end);
  return layers;
}

LastUpdates last_updates(std::span<const Op> ops, int layers) {
  LastUpdates u;
  u.of_layer.assign(static_cast<std::size_t>(layers) * kStreams, kNone);
  u.any.fill(kNone);
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    if (op.phase != Phase::optimizer) continue;
    const auto s = static_cast<std::size_t>(op.stream);
    const auto index = static_cast<std::int64_t>(k);
    u.any[s] = index;
    const bool ranged = op.layer_begin >= 0;
    const int begin = ranged ? op.layer_begin : 0;
    const int end = ranged ? op.layer_end : layers;
    for (int l = begin; l < end; ++l)
      u.of_layer[static_cast<std::size_t>(l) * kStreams + s] = index;
  }
  return u;
}

// What forward op `op` waits for among the previous iteration's updates (indices in the rank's
// iteration), at most one per stream.
void update_deps(const Op& op, const LastUpdates& u, std::vector<std::int64_t>& out) {
  std::array<std::int64_t, kStreams> latest;
  latest.fill(kNone);
  if (op.layer_begin < 0) {
    latest = u.any;
  } else {
    for (int l = op.layer_begin; l < op.layer_end; ++l) {
      for (std::size_t s = 0; s < kStreams; ++s) {
        latest[s] = std::max(latest[s], u.of_layer[static_cast<std::size_t>(l) * kStreams + s]);
      }
    }
  }
  for (std::int64_t index : latest) {
    if (index != kNone) out.push_back(index);
  }
}

void copy_shared(const Program& one, Program& out) {
  for (const Group& g : one.groups()) out.add_group(g.ranks, g.name);
  for (const auto& list : one.kernel_lists()) out.add_kernels(list);
  for (const std::string& label : one.labels()) out.intern_label(label);
  out.set_overlapping_iterations(one.overlapping_iterations());
}

void emit_rank(const Program& one, int rank, int n, int layers, Program& out) {
  out.begin_rank(rank);
  if (!one.issues_ops(rank)) {
    out.set_replica(rank, one.replica_of(rank));
    return;
  }
  for (const ResidentMemory& m : one.initial_memory(rank)) out.add_initial_memory(rank, m);
  if (one.event_driven(rank)) out.set_event_driven(rank);
  const std::span<const Op> ops = one.ops_of(rank);
  const OpId first = one.first_op(rank);
  const LastUpdates updates = last_updates(ops, layers);
  std::vector<OpId> deps;
  std::vector<std::int64_t> extra;
  OpId previous_base = 0;
  for (int i = 0; i < n; ++i) {
    const auto base = static_cast<OpId>(out.op_count());
    for (const Op& op : ops) {
      deps.clear();
      for (OpId d : one.deps_of(op)) deps.push_back(base + (d - first));
      if (i > 0 && op.phase == Phase::forward) {
        extra.clear();
        update_deps(op, updates, extra);
        for (std::int64_t k : extra) deps.push_back(previous_base + static_cast<OpId>(k));
      }
      out.add(op.work, info_of(op), deps, one.effects_of(op));
    }
    previous_base = base;
  }
}

}  // namespace

Program repeat_iterations(const Program& one, int n) {
  if (n < 1 || n > kMaxIterations) {
    throw std::invalid_argument("repeat_iterations: iterations must be 1 to " +
                                std::to_string(kMaxIterations) + ", got " + std::to_string(n));
  }
  if (one.iterations() != 1) {
    throw std::invalid_argument("repeat_iterations: the Program already holds " +
                                std::to_string(one.iterations()) + " iterations");
  }
  if (n == 1) return one;
  if (one.overlapping_iterations()) {
    throw std::invalid_argument(
        "repeat_iterations: the schedule overlaps iterations by itself (PipeDream-2BW, ZB-H2) and "
        "is reported as one steady-state iteration; simulate it with one iteration");
  }
  Program out(one.world_size());
  copy_shared(one, out);
  const auto times = static_cast<std::size_t>(n);
  // Each forward op may gain one dependency per stream.
  std::size_t deps = 0, effects = 0;
  for (const Op& op : one.ops()) {
    deps += op.deps_count + (op.phase == Phase::forward ? kStreams : 0);
    effects += op.effects_count;
  }
  out.reserve(one.op_count() * times, deps * times, effects * times);
  const int layers = layer_count(one);
  for (int r = 0; r < one.world_size(); ++r) emit_rank(one, r, n, layers, out);
  out.finish();
  out.set_iterations(n);
  return out;
}

}  // namespace stratasim::strategies
