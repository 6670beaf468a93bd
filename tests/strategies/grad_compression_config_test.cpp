// parallelism.grad_compression as configs give it (a name or an object), what the lowering
// receives, and the errors for settings that cannot work (each at the key to change).
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const auto kDefault = configs_dir() / "experiments/gpt3-175b-a100-1024.json";

GradCompression read(const nlohmann::json& value) {
  return load_experiment(kDefault, {cli("parallelism.grad_compression", value)})
      .parallelism.grad_compression;
}

}  // namespace

TEST_CASE("grad_compression: names and objects reach the pipeline spec") {
  CHECK(load_experiment(kDefault).parallelism.grad_compression == GradCompression{});
  CHECK_FALSE(GradCompression{}.enabled());
  CHECK(read("none").kind == GradCompressionKind::none);
  CHECK(read(nullptr).kind == GradCompressionKind::none);
  CHECK(read("fp16").kind == GradCompressionKind::fp16);
  CHECK(read("int8").kind == GradCompressionKind::int8);
  const GradCompression topk = read("topk");
  CHECK(topk.kind == GradCompressionKind::topk);
  CHECK(topk.density == 0.01);  // the default density
  CHECK(read({{"kind", "topk"}, {"density", 0.05}}) ==
        GradCompression{GradCompressionKind::topk, 0.05, 1.0});
  CHECK(read({{"kind", "s2-reducer"}, {"density", 0.02}, {"sketch_ratio", 3}}) ==
        GradCompression{GradCompressionKind::s2_reducer, 0.02, 3.0});
  CHECK(read({{"kind", "int8"}}).kind == GradCompressionKind::int8);
  const auto e = load_experiment(kDefault, {cli("parallelism.grad_compression", "fp16")});
  CHECK(pipeline_spec(e).grad_compression.kind == GradCompressionKind::fp16);
}

TEST_CASE("bad grad_compression settings are errors naming the key") {
  SUBCASE("an unknown name, with a hint") {
    auto e = default_experiment_error({cli("parallelism.grad_compression", "topK")});
    CHECK(e.path() == "parallelism.grad_compression");
    CHECK(contains(e.message(), "did you mean \"topk\""));
  }
  SUBCASE("neither a name nor an object") {
    auto e = default_experiment_error({cli("parallelism.grad_compression", 42)});
    CHECK(e.path() == "parallelism.grad_compression");
    CHECK(contains(e.message(), "expected \"none\""));
  }
  SUBCASE("an object without kind") {
    auto e = default_experiment_error(
        {cli("parallelism.grad_compression", nlohmann::json{{"density", 0.1}})});
    CHECK(e.path() == "parallelism.grad_compression.kind");
  }
  SUBCASE("a density for a dense scheme") {
    auto e = default_experiment_error(
        {cli("parallelism.grad_compression", nlohmann::json{{"kind", "fp16"}, {"density", 0.1}})});
    CHECK(e.path() == "parallelism.grad_compression.density");
    CHECK(contains(e.message(), "\"topk\" and \"s2-reducer\" only"));
  }
  SUBCASE("a sketch ratio for top-k") {
    auto e = default_experiment_error({cli("parallelism.grad_compression",
                                           nlohmann::json{{"kind", "topk"}, {"sketch_ratio", 2}})});
    CHECK(e.path() == "parallelism.grad_compression.sketch_ratio");
  }
  SUBCASE("densities outside (0, 1]") {
    for (double density : {0.0, -0.5, 1.5}) {
      CAPTURE(density);
      auto e = default_experiment_error({cli(
          "parallelism.grad_compression", nlohmann::json{{"kind", "topk"}, {"density", density}})});
      CHECK(e.path() == "parallelism.grad_compression.density");
      CHECK(contains(e.message(), "(0, 1]"));
    }
  }
  SUBCASE("a sketch ratio that is not positive") {
    auto e = default_experiment_error(
        {cli("parallelism.grad_compression",
             nlohmann::json{{"kind", "s2-reducer"}, {"sketch_ratio", 0}})});
    CHECK(e.path() == "parallelism.grad_compression.sketch_ratio");
  }
  SUBCASE("a misspelt key") {
    auto e = default_experiment_error(
        {cli("parallelism.grad_compression", nlohmann::json{{"kind", "topk"}, {"densty", 0.1}})});
    CHECK(e.path() == "parallelism.grad_compression.densty");
    CHECK(contains(e.message(), "did you mean 'density'"));
  }
  SUBCASE("with ZeRO sharding") {
    auto e = default_experiment_error(
        {cli("parallelism.grad_compression", "topk"), cli("parallelism.zero", 2)});
    CHECK(e.path() == "parallelism.grad_compression");
    CHECK(contains(e.message(), "ZeRO stage 2"));
  }
}
