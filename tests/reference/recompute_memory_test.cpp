// Activation memory of pipeline schedules and recomputation, simulated: how many microbatches
// each stage holds (Narayanan et al. SC21: 1F1B keeps at most p in flight, GPipe all m;
// Korthikanti et al.: the first 1F1B stage stores p microbatches of L/p layers), and whether
// Merak's stage-aware recomputation makes a strategy fit that does not fit without it.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"

#include <set>

#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "strategies/recompute.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

traces::Timeline simulate(const Experiment& e, const Program& program) {
  validate(program);
  sim::SimOptions options;
  options.record_memory = false;
  auto timeline = sim::simulate(program, e.cluster, options);
  REQUIRE(timeline.completed);
  return timeline;
}

// Activation bytes a rank holds when its device memory peaks (model states are constant, so
// that is when its activations peak).
double activation_peak(const traces::Timeline& timeline, int rank) {
  const auto& device = timeline.ranks[static_cast<std::size_t>(rank)]
                           .tiers[static_cast<std::size_t>(MemoryTier::device)];
  return static_cast<double>(
      device.breakdown[static_cast<std::size_t>(MemoryCategory::activations)].count());
}

}  // namespace

TEST_CASE("1F1B stage i holds p - i microbatches of activations, GPipe holds all m") {
  // 8 layers (h = 1024, a = 16, s = 1024, b = 1, v = 51200) on p = 4 stages of 2 layers, tp 1,
  // m = 8 microbatches. Per microbatch (sbh = s * b * h): a layer stores sbh(34 + 5as/h) =
  // 114 sbh bytes, the first stage also the embedding dropout mask (sbh), the last the final
  // norm's input and output and the fp32 logits (4sbh + 4sbv = 204 sbh). So stage 0 stores
  // 229 sbh, stages 1 and 2 228 sbh, stage 3 432 sbh per microbatch; 1F1B's stage i holds
  // p - i of them at its peak, GPipe m.
  const double sbh = 1024.0 * 1024;
  const double stored[] = {229 * sbh, 228 * sbh, 228 * sbh, 432 * sbh};
  const int p = 4, m = 8;
  for (auto schedule : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe}) {
    CAPTURE(name_of(schedule));
    auto e = testing::make_experiment(gpt(16, 1024, 8), 1, p, 1, m, 1, 1024);
    e.parallelism.schedule = schedule;
    auto timeline = simulate(e, lower(e));
    for (int stage = 0; stage < p; ++stage) {
      CAPTURE(stage);
      const int in_flight = schedule == ScheduleKind::gpipe ? m : p - stage;
      CHECK(activation_peak(timeline, stage) == doctest::Approx(in_flight * stored[stage]));
    }
  }

  // With every layer recomputed (one checkpoint of 2sbh per layer) a 1F1B stage holds p - i
  // microbatches of checkpoints (4 sbh, 5 sbh with the embedding mask) plus, during a backward,
  // one recomputed layer (114 sbh); the last stage peaks in forward with its head (4 + 204 sbh).
  auto e = testing::make_experiment(gpt(16, 1024, 8), 1, p, 1, m, 1, 1024);
  e.parallelism.recompute = RecomputeKind::full;
  auto timeline = simulate(e, lower(e));
  const double full[] = {4 * 5 * sbh + 114 * sbh, 3 * 4 * sbh + 114 * sbh, 2 * 4 * sbh + 114 * sbh,
                         208 * sbh};
  for (int stage = 0; stage < p; ++stage) {
    CAPTURE(stage);
    CHECK(activation_peak(timeline, stage) == doctest::Approx(full[stage]));
  }
}

TEST_CASE("stage-aware recomputation fits where none does not, recomputing less than full") {
  // 24 layers (h = 4096, a = 32, s = 2048, b = 4) on 4 A100 80 GB stages of 6 layers, tp 1,
  // 1F1B with 8 microbatches. A layer stores sbh(34 + 5as/h) = 114 sbh = 3.8 GB per microbatch,
  // so stage 0 alone would hold 4 * 6 * 3.8 = 92 GB of activations next to 23 GB of model
  // states (16 bytes per parameter): it does not fit, nor does stage 1 (3 microbatches, 69 GB +
  // 19 GB); stages 2 (46 + 19 GB) and 3 (23 + 23 + 1.8 GB of head) do.
  auto e = testing::make_experiment(gpt(32, 4096, 24), 1, 4, 1, 32, 4, 2048);
  auto none = simulate(e, lower(e));
  CHECK_FALSE(none.out_of_memory.empty());
  std::set<int> short_ranks;
  for (const auto& oom : none.out_of_memory) short_ranks.insert(oom.rank);
  CHECK(short_ranks == std::set<int>{0, 1});

  e.parallelism.recompute = RecomputeKind::stage_aware;
  const auto plan = recompute_plan(e);
  REQUIRE(plan.size() == 4);
  int recomputed = 0;
  for (std::size_t s = 0; s < plan.size(); ++s) {
    CAPTURE(s);
    if (s > 0) CHECK(plan[s].recomputed_layers <= plan[s - 1].recomputed_layers);
    recomputed += plan[s].recomputed_layers;
  }
  CHECK(plan[0].recomputed_layers > 0);
  CHECK(plan[1].recomputed_layers > 0);
  CHECK(plan[2].recomputed_layers == 0);
  CHECK(plan[3].recomputed_layers == 0);
  CHECK(recomputed < 24);
  const auto program = lower(e);
  auto stage_aware = simulate(e, program);
  CHECK(stage_aware.out_of_memory.empty());
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(stage_aware.ranks[static_cast<std::size_t>(r)].tiers[0].peak <=
          e.cluster.device.memory_capacity);
  }

  // Full recomputation fits too, but recomputes all 24 layers: more hardware FLOPs.
  auto full = e;
  full.parallelism.recompute = RecomputeKind::full;
  const auto full_program = lower(full);
  CHECK(simulate(full, full_program).out_of_memory.empty());
  traces::ReportContext context;
  context.device_peak = FlopRate(312e12);
  const auto flops = [&](const Program& prog, const Experiment& x) {
    return traces::make_report(prog, simulate(x, prog), context).hardware_flops_per_iteration;
  };
  CHECK(flops(program, e) < flops(full_program, full));
}
