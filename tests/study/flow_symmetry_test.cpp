// The flow network's replica symmetry (cluster.flow_symmetry, docs/network.md "Symmetry"):
// on small rail-optimised fat-trees, with and without oversubscription, the reduced run
// (replica 0 simulated for all, the others' flows as weighted copies in max-min sharing) gives
// the unreduced run with the same symmetric routes (every replica simulated); where symmetry
// breaks (a straggler, replicas that straddle racks, two jobs) it falls back to the full run,
// which is then today's flow result exactly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "study/errors.hpp"
#include "study/jobs.hpp"
#include "study/study.hpp"

using namespace stratasim;

namespace {

/// GPT (8 heads, hidden 512, 4 layers) with TP 2, PP 2, DP 4 on 8 nodes of 2 GPUs: rank =
/// t + 2 (d + 4 s), so stage s of every replica lies on nodes 4s .. 4s + 3, and a rail-optimised
/// fat-tree with `per_rack` nodes under each leaf.
strategies::Experiment experiment(int per_rack, double oversubscription) {
  auto e = testing::make_experiment(testing::gpt(8, 512, 4), 2, 2, 4, 32, 1, 512);
  e.cluster = testing::test_cluster(8, 2);
  e.cluster.network_model = hw::NetworkModel::flow;
  hw::TopologySpec t;
  t.kind = hw::TopologyKind::fat_tree;
  t.nodes_per_rack = per_rack;
  t.oversubscription = oversubscription;
  t.spines = 2;
  e.cluster.topology = t;
  return e;
}

study::Result run(strategies::Experiment e, hw::FlowSymmetry mode) {
  e.cluster.flow_symmetry = mode;
  return study::simulate(e, {});
}

std::string symmetry_note(const study::Result& r) {
  for (const auto& [key, value] : r.context.setup) {
    if (key == "flow symmetry") return value;
  }
  return "";
}

/// The reduced run against the unreduced run with symmetric routes: equal iteration times up
/// to the floating-point rounding of summing a link's load copy by copy or as weight x rate
/// (a picosecond here and there; 1e-9 relative is far above it and far below any effect of
/// contention, which moves times by percents).
void check_exact(const strategies::Experiment& e, const std::string& note) {
  const auto reduced = run(e, hw::FlowSymmetry::automatic);
  const auto full = run(e, hw::FlowSymmetry::symmetric_routes);
  CHECK(reduced.program.mirrored());
  CHECK_FALSE(full.program.mirrored());
  CHECK(symmetry_note(reduced).find(note) != std::string::npos);
  CHECK(symmetry_note(full).find("symmetric_routes") != std::string::npos);
  REQUIRE(full.report.iteration_time_s > 0);
  CHECK(std::abs(reduced.report.iteration_time_s / full.report.iteration_time_s - 1) < 1e-9);
  CHECK(std::abs(reduced.report.pipeline_time_s / full.report.pipeline_time_s - 1) < 1e-9);
  // The busiest links carry the same bytes (a reduced flow counts its copies).
  REQUIRE(reduced.report.links.size() == full.report.links.size());
  for (std::size_t i = 0; i < full.report.links.size(); ++i) {
    CHECK(reduced.report.links[i].bytes == full.report.links[i].bytes);
  }
}

/// The message of the `E` that `f` throws (a failed check and "" when it throws none).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& error) {
    return error.what();
  }
  FAIL_CHECK("expected an exception");
  return "";
}

}  // namespace

TEST_CASE("flow symmetry: the reduced run equals the unreduced symmetric run") {
  const std::string all = "replica 0 simulated for all 4";
  SUBCASE("non-blocking fat-tree, a rack per stage") {
    check_exact(experiment(4, 1.0), all);
  }
  SUBCASE("oversubscribed 4:1") {
    check_exact(experiment(4, 4.0), all);
  }
  SUBCASE("one rack") {
    check_exact(experiment(8, 2.0), all);
  }
  // Racks of 2 nodes: a stage's 4 nodes lie in two racks. Moving every replica up by one
  // would move node 1 (rack 0) to node 2 (rack 1) but node 3 back to node 0, so it is no
  // symmetry; moving up by two swaps the two racks, so replicas 0 and 1 stand for all.
  SUBCASE("replicas straddling racks, oversubscribed 2:1") {
    check_exact(experiment(2, 2.0), "replicas 0-1 simulated for all 4");
  }
}

TEST_CASE("flow symmetry: off is today's flow network, bit for bit") {
  auto e = experiment(4, 2.0);
  const auto off = run(e, hw::FlowSymmetry::off);
  CHECK(symmetry_note(off).empty());
  CHECK_FALSE(off.program.mirrored());
  // The shipped default: no key means off.
  CHECK(hw::ClusterSpec{}.flow_symmetry == hw::FlowSymmetry::off);
}

TEST_CASE("flow symmetry: a straggler falls back to every replica, as without symmetry") {
  auto e = experiment(4, 1.0);
  hw::DeviceOverride straggler;
  straggler.ranks = {5};
  straggler.slowdown = 1.5;
  e.cluster.overrides.push_back(straggler);
  const auto automatic = run(e, hw::FlowSymmetry::automatic);
  const auto off = run(e, hw::FlowSymmetry::off);
  CHECK_FALSE(automatic.program.mirrored());
  CHECK(symmetry_note(automatic).find("every replica simulated") != std::string::npos);
  CHECK(symmetry_note(automatic).find("overrides") != std::string::npos);
  CHECK(automatic.report.iteration_time_s == off.report.iteration_time_s);
  CHECK(automatic.report.pipeline_time_s == off.report.pipeline_time_s);
}

TEST_CASE("flow symmetry: racks that no move maps onto each other fall back") {
  // Racks of 3 nodes ({0,1,2}, {3,4,5}, {6,7}): stage 0's nodes 0-3 lie in two racks of
  // different sizes, and no move of the replicas maps racks onto racks.
  auto e = experiment(3, 1.0);
  const auto automatic = run(e, hw::FlowSymmetry::automatic);
  const auto off = run(e, hw::FlowSymmetry::off);
  CHECK_FALSE(automatic.program.mirrored());
  CHECK(symmetry_note(automatic).find("not a symmetry of the topology") != std::string::npos);
  CHECK(automatic.report.iteration_time_s == off.report.iteration_time_s);
}

TEST_CASE("flow symmetry: two jobs on one fabric run every replica") {
  // Two copies of a TP 2, PP 1, DP 2 job (4 GPUs, 2 nodes each) packed on 4 nodes of 2 under
  // one rack of a fat-tree.
  auto job = testing::make_experiment(testing::gpt(8, 512, 2), 2, 1, 2, 8, 1, 256);
  job.cluster = testing::test_cluster(2, 2);
  hw::ClusterSpec cluster = testing::test_cluster(4, 2);
  cluster.network_model = hw::NetworkModel::flow;
  hw::TopologySpec t;
  t.kind = hw::TopologyKind::fat_tree;
  t.nodes_per_rack = 4;
  cluster.topology = t;
  auto with = cluster;
  with.flow_symmetry = hw::FlowSymmetry::automatic;
  const auto off = study::simulate_jobs(cluster, {job, job}, "packed");
  const auto automatic = study::simulate_jobs(with, {job, job}, "packed");
  REQUIRE(off.jobs.size() == 2);
  REQUIRE(automatic.jobs.size() == 2);
  for (std::size_t j = 0; j < 2; ++j) {
    CHECK_FALSE(automatic.jobs[j].program.mirrored());
    REQUIRE(off.jobs[j].report.iteration_time_s > 0);
    CHECK(automatic.jobs[j].report.iteration_time_s == off.jobs[j].report.iteration_time_s);
    CHECK(symmetry_note(automatic.jobs[j]).find("several jobs") != std::string::npos);
    CHECK(symmetry_note(off.jobs[j]).empty());
  }
}

TEST_CASE("flow symmetry: traffic that breaks it during the run falls back to every replica") {
  // A tree all-reduce over the 4 replicas is no ring: moving replicas by one does not map its
  // flows onto each other, which the network finds when it plans the first data-parallel
  // all-reduce; the run starts again with every replica, routed as without symmetry.
  auto e = experiment(4, 1.0);
  e.cluster.collectives
      .algorithm[static_cast<std::size_t>(strategies::CollectiveKind::all_reduce)] =
      hw::CollectiveAlgorithm::tree;
  const auto automatic = run(e, hw::FlowSymmetry::automatic);
  const auto off = run(e, hw::FlowSymmetry::off);
  CHECK_FALSE(automatic.program.mirrored());
  CHECK(symmetry_note(automatic).find("do not map onto each other") != std::string::npos);
  REQUIRE(off.report.iteration_time_s > 0);
  CHECK(automatic.report.iteration_time_s == off.report.iteration_time_s);
}

TEST_CASE("flow symmetry: --trace-ranks names any rank of the replicas simulated for all") {
  // Racks of 2 nodes: replicas 0 and 1 are simulated for all 4 (period 2, above). Rank
  // t + 2 (d + 4 s): rank 2 is tp 0, replica 1, stage 0, which the run simulates; rank 4
  // (replica 2) mirrors it, as replica r mirrors replica r mod 2.
  auto e = experiment(2, 2.0);
  e.cluster.flow_symmetry = hw::FlowSymmetry::automatic;
  study::Options options;
  options.trace_ranks = "2";
  options.spans_of_traced_ranks_only = true;
  const auto traced = study::simulate(e, options);
  CHECK(traced.program.mirrored());
  CHECK(traced.traced_ranks == std::vector<std::int32_t>{2});
  std::size_t spans = 0;
  for (const auto& span : traced.timeline.spans) {
    CHECK(span.rank == 2);
    ++spans;
  }
  // Rank 2 issues its own ops (Program::issues_ops) and every one of them has a span.
  CHECK(traced.program.issues_ops(2));
  CHECK(spans == traced.program.ops_of(2).size());
  // The same report as without tracing it.
  const auto plain = run(e, hw::FlowSymmetry::automatic);
  CHECK(traced.report.iteration_time_s == plain.report.iteration_time_s);

  // "all": the ranks of replicas 0 and 1 (d < 2): t in {0, 1}, d in {0, 1}, s in {0, 1}.
  options.trace_ranks = "all";
  CHECK(study::simulate(e, options).traced_ranks ==
        std::vector<std::int32_t>{0, 1, 2, 3, 8, 9, 10, 11});

  options.trace_ranks = "4";
  const std::string what = message_of<study::BadInput>([&] { (void)study::simulate(e, options); });
  CHECK(what.find("--trace-ranks: rank 4 mirrors rank 0") != std::string::npos);
  CHECK(what.find("replicas 0-1 are simulated for all") != std::string::npos);
}

TEST_CASE("flow symmetry: a fallback that would not fit is refused before it runs") {
  // The tree all-reduce breaks the symmetry mid-run (above); the run without the reduction
  // needs every replica's memory, which is estimated again then. With --max-memory between the
  // reduced run's estimate and the full run's, the reduced run starts and the fallback is
  // refused (HostMemoryExceeded: exit 2 on the command line), naming the ring all-reduce.
  auto e = experiment(4, 1.0);
  e.cluster.collectives
      .algorithm[static_cast<std::size_t>(strategies::CollectiveKind::all_reduce)] =
      hw::CollectiveAlgorithm::tree;
  auto full_experiment = e;
  full_experiment.cluster.flow_symmetry = hw::FlowSymmetry::off;  // the fallback's shape
  e.cluster.flow_symmetry = hw::FlowSymmetry::automatic;
  const Bytes reduced = study::estimate_host_memory(e, {}).total();
  const Bytes full = study::estimate_host_memory(full_experiment, {}).total();
  REQUIRE(full.count() > reduced.count());
  study::Options options;
  options.max_memory = Bytes((reduced.count() + full.count()) / 2);
  const std::string what =
      message_of<study::HostMemoryExceeded>([&] { (void)study::simulate(e, options); });
  CHECK(what.find("replica symmetry broke during the run") != std::string::npos);
  CHECK(what.find("do not map onto each other") != std::string::npos);
  CHECK(what.find("--max-memory") != std::string::npos);
  CHECK(what.find("cluster.collectives.algorithm.all_reduce=ring") != std::string::npos);
  // With room for the full run it falls back and completes, as above.
  options.max_memory = full;
  CHECK(study::simulate(e, options).report.iteration_time_s > 0);
}
