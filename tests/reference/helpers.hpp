// Helpers of the reference tests: the cluster the pipeline tests run on, clusters built from
// the shipped configs, lowering that always validates, simulation that must complete.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "experiment_helpers.hpp"
#include "hw_models/cluster.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

namespace stratasim::testing {

/// The cluster the pipeline reference tests run on: one node of `devices` test devices whose
/// links move `bandwidth` bytes/s with no latency, so 0-byte boundaries make communication free
/// and B bytes take B / bandwidth. Interference is off: the hand-worked timelines assume that
/// overlap is free.
inline hw::ClusterSpec pipeline_test_cluster(int devices, Bandwidth bandwidth = Bandwidth(1e12)) {
  hw::ClusterSpec c;
  c.name = "free";
  c.nodes = 1;
  c.devices_per_node = devices;
  c.device.name = "test";
  c.device.peak_flops[static_cast<std::size_t>(DType::bf16)] = FlopRate(100e12);
  c.device.memory_capacity = Bytes(80LL << 30);
  c.device.memory_bandwidth = Bandwidth(2e12);
  c.intra_node = {bandwidth, Time::zero()};
  c.inter_node = {bandwidth, Time::zero()};
  c.interference.enabled = false;
  return c;
}

/// A shipped cluster file with its node count (and devices per node) changed.
inline hw::ClusterSpec shipped_cluster(const std::string& name, int nodes,
                                       int devices_per_node = 0) {
  auto c = hw::load_cluster(configs_dir() / "hardware/clusters" / (name + ".json"));
  c.nodes = nodes;
  if (devices_per_node > 0) c.devices_per_node = devices_per_node;
  return c;
}

/// Lowers `e` and checks the program is well formed.
inline strategies::Program lower_checked(const strategies::Experiment& e) {
  auto program = strategies::lower(e);
  strategies::validate(program);
  return program;
}

/// Simulates `program` on the experiment's cluster; the run must complete.
inline traces::Timeline simulate_checked(const strategies::Experiment& e,
                                         const strategies::Program& program,
                                         bool record_spans = false) {
  sim::SimOptions options;
  options.record_spans = record_spans;
  options.record_memory = false;
  auto timeline = sim::simulate(program, e.cluster, options);
  REQUIRE_MESSAGE(timeline.completed, timeline.problem);
  return timeline;
}

inline traces::Report report_of(const strategies::Experiment& e, const strategies::Program& program,
                                const traces::Timeline& timeline) {
  return traces::make_report(program, timeline, traces::report_context(e));
}

/// Bytes a rank holds before its first op, of one category on one tier.
inline std::int64_t initial_bytes(const strategies::Program& p, int rank,
                                  strategies::MemoryCategory category,
                                  strategies::MemoryTier tier = strategies::MemoryTier::device) {
  std::int64_t total = 0;
  for (const auto& m : p.initial_memory(rank)) {
    if (m.category == category && m.tier == tier) total += m.bytes.count();
  }
  return total;
}

/// Model-state bytes (parameters, gradients, optimizer states) a rank holds on one tier.
inline std::int64_t model_state_bytes(
    const strategies::Program& p, int rank,
    strategies::MemoryTier tier = strategies::MemoryTier::device) {
  using strategies::MemoryCategory;
  return initial_bytes(p, rank, MemoryCategory::parameters, tier) +
         initial_bytes(p, rank, MemoryCategory::gradients, tier) +
         initial_bytes(p, rank, MemoryCategory::optimizer_states, tier);
}

}  // namespace stratasim::testing
