// Shared helpers for the ZeRO and offload reference tests: clusters built from the shipped
// configs, lowering that always validates, simulation that must complete.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "hw_models/cluster.hpp"
#include "sim/simulator.hpp"
#include "strategies/helpers.hpp"
#include "strategies/lowering.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

namespace stratasim::testing {

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
