// parallelism.tp_mode and parallelism.tp_depth as configs give them: what the lowering
// receives, and the errors for meshes and settings that cannot work (each at the key to change).
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

}  // namespace

TEST_CASE("tp_mode and tp_depth reach the layer setting and the pipeline spec") {
  const auto plain = load_experiment(kDefault);
  CHECK(plain.parallelism.tp_mode == TpMode::one_d);
  CHECK(plain.parallelism.tp_depth == 1);
  CHECK(pipeline_spec(plain).tp_mode == TpMode::one_d);

  // GPT-3 175B: tp 4 as a 2 x 2 mesh, pp 16, dp 16, two samples per micro-batch (one per row).
  const auto e = load_experiment(
      kDefault, {cli("parallelism.tp", 4), cli("parallelism.dp", 16),
                 cli("parallelism.tp_mode", "2d"), cli("parallelism.micro_batch", 2)});
  CHECK(e.parallelism.tp_mode == TpMode::two_d);
  CHECK(layer_setting(e).tp_mode == TpMode::two_d);
  CHECK(layer_setting(e).mesh().q == 2);
  CHECK(pipeline_spec(e).tp_mode == TpMode::two_d);

  const auto t = load_experiment(
      kDefault, {cli("parallelism.tp", 8), cli("parallelism.tp_mode", "2.5d"),
                 cli("parallelism.tp_depth", 2), cli("parallelism.micro_batch", 4)});
  CHECK(t.parallelism.tp_depth == 2);
  CHECK(layer_setting(t).mesh() == TpMesh{TpMode::two_half_d, 8, 2, 2});
  CHECK(pipeline_spec(t).tp_depth == 2);
}

TEST_CASE("bad tp_mode settings are errors naming the key") {
  SUBCASE("an unknown mode") {
    auto e = default_experiment_error({cli("parallelism.tp_mode", "4d")});
    CHECK(e.path() == "parallelism.tp_mode");
  }
  SUBCASE("2d on a tp that is no square") {
    auto e = default_experiment_error({cli("parallelism.tp_mode", "2d")});  // tp 8
    CHECK(e.path() == "parallelism.tp");
    CHECK(contains(e.message(), "tp = q^2"));
    CHECK(contains(e.message(), "got tp = 8"));
  }
  SUBCASE("3d on a tp that is no cube") {
    auto e = default_experiment_error(
        {cli("parallelism.tp", 4), cli("parallelism.dp", 16), cli("parallelism.tp_mode", "3d")});
    CHECK(e.path() == "parallelism.tp");
    CHECK(contains(e.message(), "q^3"));
  }
  SUBCASE("2.5d without its depth") {
    auto e = default_experiment_error({cli("parallelism.tp_mode", "2.5d")});
    CHECK(e.path() == "parallelism.tp_depth");
    CHECK(contains(e.message(), "tp = d * q^2"));
  }
  SUBCASE("2.5d with a depth that leaves no square") {
    auto e = default_experiment_error(
        {cli("parallelism.tp_mode", "2.5d"), cli("parallelism.tp_depth", 4)});  // 8 / 4 = 2
    CHECK(e.path() == "parallelism.tp");
  }
  SUBCASE("tp_depth with another mode") {
    auto e = default_experiment_error({cli("parallelism.tp_depth", 2)});
    CHECK(e.path() == "parallelism.tp_depth");
    CHECK(contains(e.message(), "\"2.5d\" only"));
  }
  SUBCASE("sequence parallelism with a mesh") {
    auto e = default_experiment_error(
        {cli("parallelism.tp_mode", "3d"), cli("parallelism.sequence_parallel", true)});
    CHECK(e.path() == "parallelism.tp_mode");
    CHECK(contains(e.message(), "sequence_parallel"));
  }
  SUBCASE("Merak's sub-pipelining with a mesh") {
    auto e = default_experiment_error({cli("parallelism.tp_mode", "3d"),
                                       cli("parallelism.micro_batch", 4),
                                       cli("parallelism.tp_overlap", 2)});
    CHECK(e.path() == "parallelism.tp_mode");
    CHECK(contains(e.message(), "tp_overlap"));
  }
  SUBCASE("a split-backward schedule with a mesh") {
    auto e = default_experiment_error(
        {cli("parallelism.tp_mode", "3d"), cli("parallelism.schedule", "zb-h1")});
    CHECK(e.path() == "parallelism.tp_mode");
    CHECK(contains(e.message(), "zb-h1"));
  }
  SUBCASE("a micro-batch the mesh's rows cannot share") {
    auto e = default_experiment_error({cli("parallelism.tp_mode", "3d")});  // q^2 = 4, mb 1
    CHECK(e.path() == "parallelism.micro_batch");
    CHECK(contains(e.message(), "over 4 ranks"));
  }
  SUBCASE("heads the mesh side does not divide") {
    // 96 heads, q = 5.
    auto e =
        default_experiment_error({cli("parallelism.tp", 25), cli("parallelism.tp_mode", "2d")});
    CHECK(e.path() == "parallelism.tp");
    CHECK(contains(e.message(), "heads (96)"));
  }
  SUBCASE("a hidden size q^2 does not divide") {
    // hidden 12288 over q^2 = 9.
    auto e = default_experiment_error({cli("parallelism.tp", 9), cli("parallelism.tp_mode", "2d")});
    CHECK(e.path() == "parallelism.tp");
    CHECK(contains(e.message(), "hidden (12288)"));
  }
  SUBCASE("a layer-table model") {
    auto e = experiment_error(configs_dir() / "experiments/vgg16-bapipe-v100-16.json",
                              {cli("parallelism.tp_mode", "2d")});
    CHECK(e.path() == "parallelism.tp_mode");
    CHECK(contains(e.message(), "layer-table"));
  }
}
