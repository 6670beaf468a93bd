// study/footprint.hpp: the host memory of a simulation, estimated before it runs from one
// replica's ops.
//
// Hand formulas: with --exact every data-parallel replica issues its own ops, and a replica's ops
// do not depend on how many replicas there are when each replica runs the same micro-batches
// (global batch = dp × 8 here; one 8-GPU node per 8 replicas). So the run's ops are dp × (ops of
// one replica): doubling dp doubles the ops, their dependencies and memory effects, hence the
// program part of the estimate. Mirrored (no --exact), one replica issues ops whatever dp is: the
// ops stay the same. The ops counted by the estimate are those the lowered Program holds
// (Program::op_count).
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "study/errors.hpp"
#include "study/footprint.hpp"
#include "study/study.hpp"

using namespace stratasim;
using stratasim::testing::cli;

namespace {

strategies::Experiment with_dp(int dp) {
  return strategies::load_experiment(testing::configs_dir() / "experiments/gpt3-1.7b-a100-8.json",
                                     {cli("cluster.nodes", dp / 8), cli("parallelism.dp", dp),
                                      cli("training.global_batch", 8 * dp)});
}

}  // namespace

TEST_CASE("the estimate counts the ops the run's Program holds, from one replica") {
  study::Options exact;
  exact.exact = true;
  const auto estimate = study::estimate_host_memory(with_dp(8), exact);
  const auto program = study::lower(with_dp(8), {.mirror_data_parallel = false});
  CHECK(estimate.shape.ops == static_cast<std::int64_t>(program.op_count()));
  CHECK(estimate.shape.spans == estimate.shape.ops);  // one span per op
  CHECK_FALSE(estimate.shape.flow_network);
  CHECK(estimate.network == Bytes(0));
}

TEST_CASE("doubling dp with --exact doubles the ops and the program part but not when mirrored") {
  study::Options exact;
  exact.exact = true;
  const auto dp8 = study::estimate_host_memory(with_dp(8), exact);
  const auto dp16 = study::estimate_host_memory(with_dp(16), exact);
  CHECK(dp16.shape.ops == 2 * dp8.shape.ops);
  CHECK(dp16.shape.deps == 2 * dp8.shape.deps);
  CHECK(dp16.shape.effects == 2 * dp8.shape.effects);
  CHECK(dp16.program.count() == doctest::Approx(2.0 * dp8.program.count()).epsilon(0.001));
  CHECK(dp16.simulation.count() == doctest::Approx(2.0 * dp8.simulation.count()).epsilon(0.001));

  const auto mirrored_dp8 = study::estimate_host_memory(with_dp(8), {});
  const auto mirrored_dp16 = study::estimate_host_memory(with_dp(16), {});
  CHECK(mirrored_dp16.shape.mirrored);
  CHECK(mirrored_dp16.shape.ops == mirrored_dp8.shape.ops);
  CHECK(dp16.shape.ops == 16 * mirrored_dp16.shape.ops);  // 16 replicas, one simulated
}

TEST_CASE(
    "the flow network adds one routing table per destination device where routes need tables") {
  auto e = with_dp(8);
  e.cluster.network_model = hw::NetworkModel::flow;
  // One node: hw::Topology routes it by its per-destination tables (no closed form for a single
  // node, topology.hpp).
  const auto flow = study::estimate_host_memory(e, {});
  CHECK(flow.shape.flow_network);
  CHECK(flow.shape.routing_tables);
  CHECK(flow.shape.devices == 8);
  CHECK(flow.shape.vertices > flow.shape.devices);  // NICs and switches too
  CHECK(flow.network.count() >= flow.shape.devices * flow.shape.vertices * 8);  // >= 2 ints each
  CHECK_FALSE(flow.shape.mirrored);  // replicas contend on the flow network: all simulated
  // The same computation estimated with routes in closed form: only the per-op flow state,
  // ops x kFlowBytesPerOp.
  study::RunShape closed = flow.shape;
  closed.routing_tables = false;
  CHECK(study::estimate_host_memory(closed).network.count() == closed.ops * study::kFlowBytesPerOp);
  // A huge explicit graph: the tables' term stops at the topology's limit, 32 Mi ints = 128 MiB
  // (hw_models/topology.hpp), however many devices x vertices.
  study::RunShape huge = flow.shape;
  huge.devices = 100000;
  huge.vertices = 200000;
  CHECK(study::estimate_host_memory(huge).network.count() ==
        huge.ops * study::kFlowBytesPerOp + (std::int64_t{128} << 20));
}

TEST_CASE("a two-node two-level cluster routes in closed form: no routing tables estimated") {
  auto e = with_dp(8);
  e.cluster.network_model = hw::NetworkModel::flow;
  e.cluster.nodes = 2;
  e.cluster.devices_per_node = 4;
  const auto flow = study::estimate_host_memory(e, {});
  CHECK(flow.shape.flow_network);
  CHECK_FALSE(flow.shape.routing_tables);
  CHECK(flow.network.count() == flow.shape.ops * study::kFlowBytesPerOp);
}

TEST_CASE("simulate refuses a run over max_memory before it runs, and runs one under it") {
  study::Options tiny;
  tiny.max_memory = Bytes(1 << 20);  // 1 MiB: less than any run
  try {
    (void)study::simulate(with_dp(8), tiny);
    FAIL("expected HostMemoryExceeded");
  } catch (const study::HostMemoryExceeded& e) {
    const std::string message = e.what();
    CHECK(message.find("--max-memory") != std::string::npos);
    CHECK(message.find("needs about") != std::string::npos);
  }
  study::Options generous;
  generous.max_memory = Bytes(std::int64_t{64} << 30);
  const auto r = study::simulate(with_dp(8), generous);
  CHECK(r.finished());
  CHECK(r.host_memory.total() > Bytes(0));
}

TEST_CASE("the available host memory is read from the machine") {
  CHECK(study::available_host_memory() > Bytes(0));
}

TEST_CASE("stratasim simulate's lean runs: spans of the traced ranks only") {
  // gpt3-1.7b-a100-8 --exact: 8 ranks issue the same number of ops (dp 8), so tracing one rank
  // keeps 1/8 of the spans.
  study::Options lean;
  lean.exact = true;
  lean.trace_ranks = "0";
  lean.spans_of_traced_ranks_only = true;
  const auto estimate = study::estimate_host_memory(with_dp(8), lean);
  CHECK(estimate.shape.spans * 8 == estimate.shape.ops);
  lean.spans_of_traced_ranks_only = false;
  CHECK(study::estimate_host_memory(with_dp(8), lean).shape.spans == estimate.shape.ops);
}
