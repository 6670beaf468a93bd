#include "sim/memory.hpp"

#include <algorithm>
#include <set>
#include <variant>

#include "strategies/framework.hpp"

namespace stratasim::sim {

using strategies::kMemoryCategoryCount;
using strategies::kMemoryTierCount;
using strategies::MemoryCategory;
using strategies::MemoryTier;
using strategies::OpId;

MemoryTracker::MemoryTracker(const strategies::Program& program, const hw::ClusterSpec& cluster,
                             const MemoryOverheads& overheads, traces::Timeline& timeline,
                             bool record,
                             std::function<void(const traces::MemorySample&)> on_sample,
                             const std::vector<std::int32_t>& record_ranks)
    : program_(program),
      overheads_(overheads),
      timeline_(timeline),
      record_(static_cast<std::size_t>(program.world_size()),
              record && record_ranks.empty() ? 1 : 0),
      on_sample_(std::move(on_sample)) {
  for (std::int32_t r : record_ranks) {
    if (record && r >= 0 && r < program.world_size()) record_[static_cast<std::size_t>(r)] = 1;
  }
  const std::int64_t per_node = cluster.devices_per_node;
  capacity_[static_cast<std::size_t>(MemoryTier::device)] = cluster.device.memory_capacity;
  if (!cluster.homogeneous()) {  // devices of another type hold another capacity
    device_capacity_.resize(static_cast<std::size_t>(program.world_size()));
    for (int r = 0; r < program.world_size(); ++r) {
      device_capacity_[static_cast<std::size_t>(r)] = r < cluster.world_size()
                                                          ? cluster.device_of(r).memory_capacity
                                                          : cluster.device.memory_capacity;
    }
  }
  if (cluster.host) {
    capacity_[static_cast<std::size_t>(MemoryTier::host)] =
        Bytes(cluster.host->memory_capacity.count() / per_node);
  }
  if (cluster.nvme) {
    capacity_[static_cast<std::size_t>(MemoryTier::nvme)] =
        Bytes(cluster.nvme->capacity.count() / per_node);
  }
}

MemoryTracker::TierState& MemoryTracker::state(std::int32_t rank, int tier) {
  return tiers_[static_cast<std::size_t>(rank) * kMemoryTierCount + static_cast<std::size_t>(tier)];
}

int communicators_of(const strategies::Program& program, int rank) {
  int count = 0;
  for (const auto& g : program.groups()) {
    if (g.ranks.size() > 1 && std::find(g.ranks.begin(), g.ranks.end(), rank) != g.ranks.end())
      ++count;
  }
  std::set<std::int32_t> peers;
  for (const auto& op : program.ops_of(rank)) {
    if (const auto* s = std::get_if<strategies::Send>(&op.work)) peers.insert(s->peer);
    if (const auto* r = std::get_if<strategies::Recv>(&op.work)) peers.insert(r->peer);
  }
  return count + static_cast<int>(peers.size());
}

Bytes held_back(const MemoryOverheads& overheads, const strategies::Program& program, int rank) {
  if (overheads.reserved) return *overheads.reserved;
  if (overheads.cuda_context.count() == 0 && overheads.nccl_buffers.count() == 0) return Bytes(0);
  return strategies::held_back_memory(overheads.cuda_context, overheads.nccl_buffers,
                                      communicators_of(program, rank));
}

void MemoryTracker::start() {
  const int world = program_.world_size();
  tiers_.assign(static_cast<std::size_t>(world) * kMemoryTierCount, TierState{});
  held_back_.assign(static_cast<std::size_t>(world), Bytes(0));
  for (int r = 0; r < world; ++r) {
    if (program_.issues_ops(r))
      held_back_[static_cast<std::size_t>(r)] = held_back(overheads_, program_, r);
  }
  timeline_.ranks.assign(static_cast<std::size_t>(world), traces::RankMemory{});
  for (int r = 0; r < world; ++r) {
    const OpId first = program_.first_op(r);
    auto& tiers = timeline_.ranks[static_cast<std::size_t>(r)].tiers;
    for (int t = 0; t < kMemoryTierCount; ++t) {
      tiers[static_cast<std::size_t>(t)].capacity =
          t == static_cast<int>(MemoryTier::device) && !device_capacity_.empty()
              ? device_capacity_[static_cast<std::size_t>(r)]
              : capacity_[static_cast<std::size_t>(t)];
      tiers[static_cast<std::size_t>(t)].op = first;
    }
    unsigned touched = held_back_[static_cast<std::size_t>(r)].count() > 0
                           ? 1u << static_cast<unsigned>(MemoryTier::device)
                           : 0u;
    for (const auto& m : program_.initial_memory(r)) {
      const auto tier = static_cast<int>(m.tier);
      const auto category = static_cast<std::size_t>(m.category);
      if (tier >= kMemoryTierCount || category >= static_cast<std::size_t>(kMemoryCategoryCount))
        continue;
      TierState& ts = state(r, tier);
      ts.by_category[category] += m.bytes.count();
      ts.total += m.bytes.count();
      touched |= 1u << tier;
    }
    for (int tier = 0; tier < kMemoryTierCount; ++tier) {
      if (touched & (1u << tier)) changed(r, tier, first, Time::zero());
    }
  }
}

void MemoryTracker::apply(OpId id, bool at_end, Time now) {
  const auto& o = program_.op(id);
  unsigned touched = 0;
  for (const auto& e : program_.effects_of(o)) {
    if (e.at_end != at_end) continue;
    const auto tier = static_cast<int>(e.tier);
    const auto category = static_cast<std::size_t>(e.category);
    if (tier >= kMemoryTierCount || category >= static_cast<std::size_t>(kMemoryCategoryCount))
      continue;
    TierState& ts = state(o.rank, tier);
    ts.by_category[category] += e.delta.count();
    ts.total += e.delta.count();
    touched |= 1u << tier;
  }
  for (int tier = 0; tier < kMemoryTierCount; ++tier) {
    if (touched & (1u << tier)) changed(o.rank, tier, id, now);
  }
}

void MemoryTracker::changed(std::int32_t rank, int tier, OpId op, Time now) {
  TierState& ts = state(rank, tier);
  // The device holds the allocations times the allocator's slack, plus what is reserved.
  std::int64_t overhead = 0;
  if (tier == static_cast<int>(MemoryTier::device)) {
    overhead = held_back_[static_cast<std::size_t>(rank)].count() +
               static_cast<std::int64_t>((overheads_.fragmentation - 1.0) *
                                         static_cast<double>(std::max<std::int64_t>(ts.total, 0)));
  }
  const Bytes total(ts.total + overhead);
  const traces::MemorySample sample{rank, static_cast<MemoryTier>(tier), now, total, op};
  if (record_[static_cast<std::size_t>(rank)]) timeline_.memory.push_back(sample);
  if (on_sample_) on_sample_(sample);
  auto& peak =
      timeline_.ranks[static_cast<std::size_t>(rank)].tiers[static_cast<std::size_t>(tier)];
  if (total > peak.peak) {
    peak.peak = total;
    peak.time = now;
    peak.op = op;
    for (std::size_t c = 0; c < ts.by_category.size(); ++c)
      peak.breakdown[c] = Bytes(ts.by_category[c]);
    peak.breakdown[static_cast<std::size_t>(MemoryCategory::other)] += Bytes(overhead);
  }
  if (!ts.exceeded && peak.capacity.count() > 0 && total > peak.capacity) {
    ts.exceeded = true;
    ts.first_op = op;
    ts.first_time = now;
    out_of_memory_ = true;
  }
}

void MemoryTracker::finish() {
  for (int r = 0; r < program_.world_size(); ++r) {
    // A mirrored rank holds what its representative holds.
    const std::int32_t source = program_.replica_of(r);
    if (source != r) {
      timeline_.ranks[static_cast<std::size_t>(r)] =
          timeline_.ranks[static_cast<std::size_t>(source)];
    }
    for (int t = 0; t < kMemoryTierCount; ++t) {
      const TierState& ts = state(source, t);
      if (!ts.exceeded) continue;
      const auto& peak =
          timeline_.ranks[static_cast<std::size_t>(r)].tiers[static_cast<std::size_t>(t)];
      timeline_.out_of_memory.push_back(traces::OutOfMemory{
          r, static_cast<MemoryTier>(t), peak.capacity, peak.peak, ts.first_op, ts.first_time});
    }
  }
}

traces::Timeline estimate_memory(const strategies::Program& program, const hw::ClusterSpec& cluster,
                                 const MemoryOverheads& overheads) {
  traces::Timeline timeline;
  timeline.world_size = program.world_size();
  MemoryTracker tracker(program, cluster, overheads, timeline, /*record=*/false);
  tracker.start();
  // "Time" here is the op's position in its rank's issue order, in picoseconds: an order, not
  // a duration.
  for (int r = 0; r < program.world_size(); ++r) {
    const OpId first = program.first_op(r);
    const auto ops = program.ops_of(r);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const OpId id = first + static_cast<OpId>(i);
      if (ops[i].effects_count == 0) continue;
      tracker.apply(id, false, Time::ps(static_cast<std::int64_t>(i)));
      tracker.apply(id, true, Time::ps(static_cast<std::int64_t>(i)));
    }
  }
  tracker.finish();
  return timeline;
}

}  // namespace stratasim::sim
