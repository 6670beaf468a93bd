// Stage partitioning priced by the cost model, and sub-pipelined tensor parallelism in the
// simulated timeline.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "study/partition.hpp"
#include "study/study.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using stratasim::testing::cli;
using stratasim::testing::configs_dir;

namespace {

traces::Report simulate(const Experiment& e) {
  const Program program = study::lower(e, {.mirror_data_parallel = true});
  validate(program);
  const auto timeline = sim::simulate(program, e.cluster);
  REQUIRE(timeline.completed);
  return traces::make_report(program, timeline, traces::report_context(e));
}

}  // namespace

TEST_CASE("balanced partition of a transformer: the head's stage takes fewer layers") {
  // GPT-3 1.7B, 24 layers, tp 2 x pp 4, vocabulary 51,200: the last stage's LM head and loss
  // cost about a layer and a half (2bsVh vs the layer's 24bsh^2(1 + s/6h) FLOPs), so BaPipe
  // gives it fewer layers than the even 6 and the others one more somewhere.
  const Experiment e =
      load_experiment(configs_dir() / "experiments/gpt3-1.7b-a100-8.json",
                      {cli("parallelism.tp", 2), cli("parallelism.pp", 4), cli("parallelism.dp", 1),
                       cli("training.global_batch", 16), cli("parallelism.partition", "balanced")});
  const PartitionProblem problem = study::partition_problem(e);
  CHECK(problem.parts == 4);
  CHECK(problem.layers.size() == 24);
  CHECK(problem.last_extra.compute > problem.first_extra.compute);
  // 1F1B: stage s holds p - s microbatches.
  CHECK(problem.in_flight == std::vector<int>{4, 3, 2, 1});
  const std::vector<int> split = study::partition_layers(e);
  REQUIRE(split.size() == 4);
  CHECK(split[3] < 6);
  int total = 0;
  for (int n : split) total += n;
  CHECK(total == 24);
  // Its predicted bottleneck beats the even split's, and so does the simulated iteration.
  const auto balanced = evaluate_partition(problem, split);
  const auto even = evaluate_partition(problem, even_partition(24, 4));
  CHECK(balanced.bottleneck < even.bottleneck);
  const Experiment even_e =
      load_experiment(configs_dir() / "experiments/gpt3-1.7b-a100-8.json",
                      {cli("parallelism.tp", 2), cli("parallelism.pp", 4), cli("parallelism.dp", 1),
                       cli("training.global_batch", 16)});
  CHECK(simulate(e).iteration_time_s < simulate(even_e).iteration_time_s);
}

TEST_CASE("balanced partition of VGG-16 follows its uneven layers") {
  const Experiment e = load_experiment(configs_dir() / "experiments/vgg16-bapipe-v100-16.json");
  const std::vector<int> split = study::partition_layers(e);
  const PartitionProblem problem = study::partition_problem(e);
  const auto balanced = evaluate_partition(problem, split);
  const auto even = evaluate_partition(problem, even_partition(16, 4));
  CHECK(balanced.bottleneck <= even.bottleneck);
  CHECK(split != even_partition(16, 4));
  CHECK(simulate(e).completed);
}

TEST_CASE("sub-pipelined tensor parallelism hides tensor-parallel all-reduces") {
  // tp 8 on a slow in-node link (20 GB/s) makes each layer's all-reduces about as long as its
  // compute; with the microbatch in 2 sub-batches, one sub-batch's all-reduce runs while the
  // other computes, so the iteration is shorter, with the same FLOPs.
  auto load = [](int overlap) {
    return load_experiment(
        configs_dir() / "experiments/gpt3-1.7b-a100-8.json",
        {cli("parallelism.tp", 8), cli("parallelism.pp", 1), cli("parallelism.dp", 1),
         cli("parallelism.micro_batch", 2), cli("training.global_batch", 4),
         cli("parallelism.tp_overlap", overlap), cli("cluster.intra_node.bandwidth", "20 GB/s")});
  };
  const auto plain = simulate(load(1));
  const auto overlapped = simulate(load(2));
  CHECK(overlapped.model_flops_per_iteration ==
        doctest::Approx(plain.model_flops_per_iteration).epsilon(1e-9));
  CHECK(overlapped.iteration_time_s < 0.9 * plain.iteration_time_s);
  CHECK(overlapped.exposed_comm_s < plain.exposed_comm_s);
}
