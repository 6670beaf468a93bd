// Data-parallel mirroring is exact: simulating one replica and mirroring it gives the same
// report as simulating every rank, for every strategy the lowering produces.
#include <doctest/doctest.h>

#include <functional>

#include "experiment_helpers.hpp"
#include "sim/memory.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

std::string report_of(const Experiment& e, bool mirror) {
  auto program = lower(e, {.mirror_data_parallel = mirror});
  validate(program);
  auto timeline = sim::simulate(program, e.cluster);
  return traces::to_json(traces::make_report(program, timeline, traces::report_context(e)),
                         traces::report_context(e))
      .dump(1);
}

}  // namespace

TEST_CASE("a mirrored run reports exactly what simulating every replica reports") {
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  struct Case {
    const char* name;
    int tp, pp, dp, micro_batch;
    std::function<void(Experiment&)> edit;
  };
  const std::vector<Case> cases = {
      {"dp 8", 1, 1, 8, 1, {}},
      {"tp 2 pp 2 dp 4", 2, 2, 4, 1, {}},
      {"sequence parallel, gpipe", 2, 2, 2, 1,
       [](Experiment& e) {
         e.parallelism.sequence_parallel = true;
         e.parallelism.schedule = ScheduleKind::gpipe;
       }},
      {"zero 1", 1, 2, 4, 1, [](Experiment& e) { e.parallelism.zero = 1; }},
      {"zero 2", 2, 1, 4, 1, [](Experiment& e) { e.parallelism.zero = 2; }},
      {"zero 3, selective", 2, 2, 2, 1,
       [](Experiment& e) {
         e.parallelism.zero = 3;
         e.parallelism.recompute = RecomputeKind::selective;
       }},
      {"zero 1 + optimizer offload, full recompute", 1, 2, 4, 1,
       [](Experiment& e) {
         e.parallelism.zero = 1;
         e.parallelism.offload.optimizer = true;
         e.parallelism.recompute = RecomputeKind::full;
       }},
      {"out of memory", 1, 1, 4, 8, {}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto e =
        make_experiment(model, c.tp, c.pp, c.dp, 4LL * c.dp * c.micro_batch, c.micro_batch, 2048);
    e.cluster.host =
        hw::HostSpec{Bytes(1LL << 40), Bandwidth(400e9), 128, 8e7, {Bandwidth(32e9), Time::us(5)}};
    if (c.edit) c.edit(e);
    const std::string exact = report_of(e, false);
    CHECK(report_of(e, true) == exact);
  }
}

TEST_CASE("mirroring runs one replica: ops for replica 0 only, and the estimate agrees") {
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  auto e = make_experiment(model, 2, 2, 4, 16, 1, 2048);
  auto exact = lower(e);
  auto mirrored = lower(e, {.mirror_data_parallel = true});
  validate(mirrored);
  CHECK(mirrored.op_count() * 4 == exact.op_count());
  const auto layout = layout_of(e);
  for (int r = 0; r < layout.world_size(); ++r) {
    CAPTURE(r);
    const bool representative = layout.dp_index(r) == 0;
    CHECK(mirrored.issues_ops(r) == representative);
    CHECK(mirrored.multiplicity(r) == (representative ? 4 : 0));
    CHECK(mirrored.ops_of(r).size() == (representative ? exact.ops_of(r).size() : 0));
  }
  auto a = sim::estimate_memory(exact, e.cluster, {});
  auto b = sim::estimate_memory(mirrored, e.cluster, {});
  for (int r = 0; r < layout.world_size(); ++r)
    CHECK(a.ranks[static_cast<std::size_t>(r)].tiers[0].peak ==
          b.ranks[static_cast<std::size_t>(r)].tiers[0].peak);
}

TEST_CASE("a mirrored rank that issues ops of its own is an invalid program") {
  Program p(2);
  auto k = p.add_kernels({Kernel{Measured{Time::us(1)}, "w"}});
  p.begin_rank(0);
  p.add(Compute{k}, OpInfo{});
  p.begin_rank(1);
  p.set_replica(1, 0);
  p.add(Compute{k}, OpInfo{});
  p.finish();
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("mirrors rank 0"), ProgramError);
  Program q(2);
  CHECK_THROWS_AS(q.set_replica(0, 1), std::logic_error);  // representatives are lower ranks
}
