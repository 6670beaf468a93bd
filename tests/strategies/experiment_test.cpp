#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "strategies/experiment.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

const auto kDefault = configs_dir() / "experiments/gpt3-175b-a100-1024.json";

}  // namespace

TEST_CASE("the default experiment loads: GPT-3 175B on 1,024 A100s") {
  auto e = load_experiment(kDefault);
  CHECK(e.model.layers == 96);
  CHECK(e.cluster.world_size() == 1024);
  CHECK(e.parallelism.tp * e.parallelism.pp * e.parallelism.dp == 1024);
  CHECK(e.microbatches() == 1536 / (8 * 1));
}

TEST_CASE("every shipped experiment loads") {
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(configs_dir() / "experiments")) {
    CAPTURE(f.path());
    CHECK_NOTHROW(load_experiment(f.path()));
    ++n;
  }
  CHECK(n >= 6);
}

TEST_CASE("dp is derived from the cluster when omitted") {
  auto e = load_experiment(kDefault, {cli("parallelism.tp", 4), cli("parallelism.dp", nullptr)});
  CHECK(e.parallelism.dp == 1024 / (4 * 16));
}

TEST_CASE("inconsistent strategies are errors at the key to change") {
  auto e1 = default_experiment_error({cli("parallelism.tp", 5), cli("parallelism.dp", nullptr)});
  CHECK(e1.message().find("must divide the model's attention heads") != std::string::npos);

  auto e2 = default_experiment_error(
      {cli("parallelism.pp", 128), cli("parallelism.tp", 1), cli("parallelism.dp", 8)});
  CHECK(e2.message().find("must not exceed the model's layers (96)") != std::string::npos);
  CHECK(e2.path() == "parallelism.pp");

  auto e3 = default_experiment_error({cli("parallelism.dp", 4)});
  CHECK(e3.path() == "parallelism.dp");
  CHECK(e3.message().find("tp * pp * dp = 8 * 16 * 4 = 512") != std::string::npos);

  auto e4 = default_experiment_error({cli("training.global_batch", 1001)});
  CHECK(e4.source() == "command line (training.global_batch)");
  CHECK(e4.path() == "training.global_batch");
  CHECK(e4.message().find("divisible by dp * micro_batch") != std::string::npos);
}

TEST_CASE("overrides reach into the cluster and model files") {
  auto e = load_experiment(
      kDefault, {cli("cluster.inter_node.bandwidth", "400 Gb/s"), cli("model.vocab", 50000)});
  CHECK(e.cluster.inter_node.bandwidth.bytes_per_second() == doctest::Approx(50e9));
  CHECK(e.model.vocab == 50000);
  auto err = default_experiment_error({cli("cluster.intra_node.bandwith", "1 TB/s")});
  CHECK(err.message().find("did you mean 'bandwidth'") != std::string::npos);
}
