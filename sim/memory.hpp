// Memory accounting: every rank's allocation per tier and category over time, from the ops'
// memory effects, with peaks (and the breakdown at each peak) and out-of-memory verdicts.
// Shared by the simulator and by the fast memory estimate (stratasim memory).
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <vector>

#include "hw_models/cluster.hpp"
#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::sim {

/// What the framework adds on each device beyond the tensors the program allocates, all of it
/// reported as the category `other` (strategies/framework.hpp gives the figures and sources).
/// Default-constructed: nothing (study::memory_overheads gives an experiment's figures).
struct MemoryOverheads {
  /// The caching allocator's slack: the device holds `fragmentation` times what is allocated
  /// (>= 1).
  double fragmentation = 1.0;
  /// Held from the start: when set, this; else cuda_context + nccl_buffers x the rank's
  /// communicators (the Program's groups of more than one member holding the rank, plus one
  /// per peer it sends to or receives from), strategies::held_back_memory.
  std::optional<Bytes> reserved;
  Bytes cuda_context;
  Bytes nccl_buffers;  // per communicator
};

/// Communicators of `rank` in `program`: its groups of more than one member and its distinct
/// point-to-point peers.
int communicators_of(const strategies::Program& program, int rank);
/// What `overheads` holds back on `rank` of `program` from the start.
Bytes held_back(const MemoryOverheads& overheads, const strategies::Program& program, int rank);

class MemoryTracker {
 public:
  /// Capacities per rank: device memory (of the rank's own device type); the node's host memory and
  /// NVMe shared evenly by its devices (0 — not modelled, never out of memory — when the cluster
  /// has none). `timeline` receives samples (when `record`), peaks and verdicts; `on_sample` sees
  /// every sample.
  MemoryTracker(const strategies::Program& program, const hw::ClusterSpec& cluster,
                const MemoryOverheads& overheads, traces::Timeline& timeline, bool record,
                std::function<void(const traces::MemorySample&)> on_sample = {},
                const std::vector<std::int32_t>& record_ranks = {});

  /// Applies every rank's initial memory (and the reserved overhead) at time zero.
  void start();
  /// Applies the effects of op `id` that happen at its start (at_end false) or end.
  void apply(strategies::OpId id, bool at_end, Time now);
  /// True once some rank exceeded a capacity.
  bool out_of_memory() const { return out_of_memory_; }
  /// Appends one OutOfMemory per (rank, tier) that exceeded its capacity.
  void finish();

 private:
  struct TierState {
    std::array<std::int64_t, strategies::kMemoryCategoryCount> by_category{};
    std::int64_t total = 0;  // allocated by the program's effects
    bool exceeded = false;
    strategies::OpId first_op = 0;
    Time first_time;
  };
  TierState& state(std::int32_t rank, int tier);
  void changed(std::int32_t rank, int tier, strategies::OpId op, Time now);

  const strategies::Program& program_;
  MemoryOverheads overheads_;
  traces::Timeline& timeline_;
  std::vector<char> record_;  // per rank: keep its samples
  std::function<void(const traces::MemorySample&)> on_sample_;
  std::array<Bytes, strategies::kMemoryTierCount> capacity_{};
  std::vector<Bytes> device_capacity_;  // per rank, where devices differ (else empty)
  std::vector<TierState> tiers_;        // rank * tiers + tier
  std::vector<Bytes> held_back_;        // per rank
  bool out_of_memory_ = false;
};

/// A fast memory estimate that runs no timing: each rank's ops are taken in issue order (the
/// order the schedule gives them), applying their effects as they start and end. Peaks of ops
/// that overlap across streams (a prefetch beside a compute op) may be slightly under the
/// simulated ones; everything else is the same accounting as the simulation's.
traces::Timeline estimate_memory(const strategies::Program& program, const hw::ClusterSpec& cluster,
                                 const MemoryOverheads& overheads);

}  // namespace stratasim::sim
