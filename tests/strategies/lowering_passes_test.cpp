// The lowering's shared pieces (strategies/lowering/): the one bucketing rule, the one list of
// technique rules that both the config reader and the pipeline assembly apply, and gradient
// units that carry their layer.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "strategies/lowering/stage_template.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

TEST_CASE("bucket_units closes a bucket once it reaches the limit, the last unit closes the last") {
  const std::vector<GradUnit> units = {{"a", 10}, {"b", 20}, {"c", 30}, {"d", 40}};
  // 2 bytes per parameter, 60 bytes: a+b = 60 bytes closes, c = 60 closes, d is the last unit.
  const UnitBuckets b = bucket_units(units, 2, 60);
  REQUIRE(b.buckets.size() == 3);
  CHECK(b.buckets[0].first_unit == 0);
  CHECK(b.buckets[0].last_unit == 1);
  CHECK(b.buckets[0].parameters == 30);
  CHECK(b.buckets[1].first_unit == 2);
  CHECK(b.buckets[1].last_unit == 2);
  CHECK(b.buckets[2].first_unit == 3);
  CHECK(b.buckets[2].parameters == 40);
  CHECK(b.of_unit == std::vector<int>{0, 0, 1, 2});
  // Elements (1 byte per parameter) with a limit above the total: one bucket.
  const UnitBuckets one = bucket_units(units, 1, 1000);
  REQUIRE(one.buckets.size() == 1);
  CHECK(one.buckets[0].parameters == 100);
  CHECK(bucket_units({}, 2, 60).buckets.empty());
}

TEST_CASE("technique_problems names the setting to change") {
  const GradCompression none;
  GradCompression fp16;
  fp16.kind = GradCompressionKind::fp16;
  auto paths = [](const std::vector<SpecProblem>& problems) {
    std::vector<std::string> out;
    for (const auto& p : problems) out.push_back(p.path);
    return out;
  };
  ZeroSettings z;
  CHECK(technique_problems(z, none, ScheduleKind::one_f_one_b).empty());
  CHECK(technique_problems(z, fp16, ScheduleKind::chimera).empty());
  z.offload_optimizer = true;
  CHECK(paths(technique_problems(z, none, ScheduleKind::one_f_one_b)) ==
        std::vector<std::string>{"parallelism.offload"});
  z = {};
  z.stage = 2;
  z.offload_params = true;
  CHECK(paths(technique_problems(z, none, ScheduleKind::one_f_one_b)) ==
        std::vector<std::string>{"parallelism.offload"});
  z = {};
  z.nvme = true;
  CHECK(paths(technique_problems(z, none, ScheduleKind::one_f_one_b)) ==
        std::vector<std::string>{"parallelism.offload"});
  z = {};
  z.stage = 1;  // ZeRO-1 with Chimera (and DualPipe) is modelled; compression with ZeRO is not
  CHECK(paths(technique_problems(z, fp16, ScheduleKind::chimera)) ==
        std::vector<std::string>{"parallelism.grad_compression"});
  z.stage = 3;
  CHECK(paths(technique_problems(z, fp16, ScheduleKind::dualpipe)) ==
        std::vector<std::string>{"parallelism.grad_compression", "parallelism.zero"});
  z = {};
  z.stage = 5;
  z.reduce_bucket_size = 0;
  z.prefetch_layers = -1;
  CHECK(paths(technique_problems(z, none, ScheduleKind::gpipe)) ==
        std::vector<std::string>{"parallelism.zero", "parallelism.zero_prefetch_layers",
                                 "parallelism.reduce_bucket_size"});
}

TEST_CASE("one rule, two callers: the config error and the assembly's refusal say the same") {
  const auto config = default_experiment_error(
      {cli("parallelism.zero", 1), cli("parallelism.grad_compression", "fp16")});
  CHECK(config.path() == "parallelism.grad_compression");
  const std::string rule = "ZeRO stage 1 reduce-scatters gradient shards";
  CHECK(config.message().find(rule) != std::string::npos);

  auto spec = pipeline_spec(make_experiment(gpt(16, 1024, 4), 1, 2, 2, 8, 1, 512));
  spec.zero.stage = 1;
  spec.grad_compression.kind = GradCompressionKind::fp16;
  CHECK_THROWS_WITH_AS(assemble_pipeline(spec), doctest::Contains(rule.c_str()),
                       std::invalid_argument);
}

TEST_CASE("the transformer lowering's gradient units carry their layer") {
  const auto spec = pipeline_spec(make_experiment(gpt(16, 1024, 4), 1, 2, 1, 4, 1, 512));
  REQUIRE(spec.stages.size() == 2);
  // Backward order: stage 0 holds layers 0-1 and the embedding; stage 1 the head and layers 2-3.
  std::vector<int> first, last;
  for (const auto& u : spec.stages[0].grad_units) first.push_back(u.layer);
  for (const auto& u : spec.stages[1].grad_units) last.push_back(u.layer);
  CHECK(first == std::vector<int>{1, 0, -1});
  CHECK(last == std::vector<int>{-1, 3, 2});
  CHECK(spec.stages[0].grad_units.back().name == "embedding");
  CHECK(spec.stages[1].grad_units.front().name == "head");
}
