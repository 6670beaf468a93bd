// ZeRO and offload settings as configs give them: what the lowering receives, and the errors a
// user gets for settings that cannot work (each at the key to change).
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

const auto kDefault = configs_dir() / "experiments/gpt3-175b-a100-1024.json";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("ZeRO and offload settings reach the pipeline spec; ZeRO-3 splits layers") {
  auto e = load_experiment(
      kDefault,
      {cli("parallelism.zero", 3), cli("parallelism.zero_prefetch_layers", 2),
       cli("parallelism.reduce_bucket_size", 1000), cli("parallelism.allgather_bucket_size", 2000),
       cli("parallelism.offload", nlohmann::json::array({"optimizer", "params", "nvme"}))});
  const ZeroSettings z = zero_settings(e);
  CHECK(z.stage == 3);
  CHECK(z.prefetch_layers == 2);
  CHECK(z.reduce_bucket_size == 1000);
  CHECK(z.allgather_bucket_size == 2000);
  CHECK(z.offload_optimizer);
  CHECK(z.offload_params);
  CHECK(z.nvme);
  CHECK(layer_setting(e).split_layers);

  auto plain = load_experiment(kDefault);
  const ZeroSettings none = zero_settings(plain);
  CHECK(none.stage == 0);
  CHECK_FALSE(none.offload_optimizer);
  CHECK_FALSE(none.offload_params);
  CHECK_FALSE(none.nvme);
  CHECK_FALSE(layer_setting(plain).split_layers);
  // DeepSpeed's defaults: 5e8-element buckets, one layer prefetched.
  CHECK(none.reduce_bucket_size == 500'000'000);
  CHECK(none.allgather_bucket_size == 500'000'000);
  CHECK(none.prefetch_layers == 1);
}

TEST_CASE("bad ZeRO and offload settings are errors naming the key") {
  SUBCASE("ZeRO stage above 3") {
    auto e = default_experiment_error({cli("parallelism.zero", 4)});
    CHECK(e.path() == "parallelism.zero");
    CHECK(e.source() == "command line (parallelism.zero)");
    CHECK(contains(e.message(), "expected an integer from 0 to 3"));
  }
  SUBCASE("a negative ZeRO stage") {
    auto e = default_experiment_error({cli("parallelism.zero", -1)});
    CHECK(e.path() == "parallelism.zero");
    CHECK(contains(e.message(), "from 0 to 3"));
  }
  SUBCASE("offload without host memory in the cluster") {
    auto e = default_experiment_error({cli("parallelism.zero", 2),
                                       cli("parallelism.offload", "optimizer"),
                                       cli("cluster.host", nullptr)});
    CHECK(e.path() == "parallelism.offload");
    CHECK(contains(e.message(), "offloading needs host memory"));
    CHECK(contains(e.message(), "dgx-a100-128"));
  }
  SUBCASE("NVMe offload without NVMe in the cluster") {
    auto e = default_experiment_error(
        {cli("parallelism.zero", 3),
         cli("parallelism.offload", nlohmann::json::array({"params", "nvme"})),
         cli("cluster.nvme", nullptr)});
    CHECK(e.path() == "parallelism.offload");
    CHECK(contains(e.message(), "NVMe"));
  }
  SUBCASE("parameter offload without ZeRO-3") {
    auto e = default_experiment_error(
        {cli("parallelism.zero", 2), cli("parallelism.offload", "params")});
    CHECK(e.path() == "parallelism.offload");
    CHECK(contains(e.message(), "\"params\" offload needs ZeRO stage 3"));
  }
  SUBCASE("optimizer offload without ZeRO") {
    auto e = default_experiment_error({cli("parallelism.offload", "optimizer")});
    CHECK(e.path() == "parallelism.offload");
    CHECK(contains(e.message(), "needs parallelism.zero >= 1"));
  }
  SUBCASE("NVMe alone says nothing to offload") {
    auto e =
        default_experiment_error({cli("parallelism.zero", 3), cli("parallelism.offload", "nvme")});
    CHECK(e.path() == "parallelism.offload");
    CHECK(contains(e.message(), "offload \"optimizer\" or \"params\" with it"));
  }
  SUBCASE("an unknown offload target") {
    auto e = default_experiment_error(
        {cli("parallelism.zero", 1), cli("parallelism.offload", "optimiser")});
    CHECK(e.path() == "parallelism.offload");
    CHECK(contains(e.message(), "did you mean \"optimizer\"?"));
  }
  SUBCASE("bucket sizes must be positive") {
    auto e = default_experiment_error({cli("parallelism.reduce_bucket_size", 0)});
    CHECK(e.path() == "parallelism.reduce_bucket_size");
  }
}

TEST_CASE("the pipeline assembly rejects ZeRO settings the loader would not give it") {
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  auto spec = pipeline_spec(make_experiment(model, 1, 1, 2, 2, 1, 2048));
  auto bad = spec;
  bad.zero.stage = 4;
  CHECK_THROWS_WITH_AS(assemble_pipeline(bad), doctest::Contains("ZeRO stage 4"),
                       std::invalid_argument);
  bad = spec;
  bad.zero.offload_optimizer = true;
  CHECK_THROWS_WITH_AS(assemble_pipeline(bad), doctest::Contains("optimizer offload"),
                       std::invalid_argument);
  bad = spec;
  bad.zero.stage = 2;
  bad.zero.offload_params = true;
  CHECK_THROWS_WITH_AS(assemble_pipeline(bad), doctest::Contains("parameter offload"),
                       std::invalid_argument);
  bad = spec;
  bad.zero.stage = 1;
  bad.zero.reduce_bucket_size = 0;
  CHECK_THROWS_AS(assemble_pipeline(bad), std::invalid_argument);
}
