// PyTorch FSDP's settings as configs give them (training.fsdp, training.framework "fsdp", an
// FSDP config file for --fsdp): the defaults PyTorch / Composer document, what reaches the
// lowering, and errors at the key to change.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "strategies/experiment.hpp"
#include "strategies/fsdp_input.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// Llama 2 7B on one DGX H100 as pure data parallelism (pp 1, as FSDP runs).
const auto kExperiment = configs_dir() / "experiments/llama2-7b-h100-8.json";

Experiment load(std::vector<Override> o) {
  o.insert(o.begin(), {cli("parallelism.tp", 1), cli("parallelism.dp", 8)});
  return load_experiment(kExperiment, o);
}

config::ConfigError error_of(std::vector<Override> o) {
  o.insert(o.begin(), {cli("parallelism.tp", 1), cli("parallelism.dp", 8)});
  return experiment_error(kExperiment, o);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("training.framework fsdp: PyTorch FSDP's runtime with its defaults") {
  const auto e = load({cli("training.framework", "fsdp")});
  REQUIRE(e.training.fsdp);
  const FsdpSpec& f = *e.training.fsdp;
  // torch.distributed.fsdp: ShardingStrategy.FULL_SHARD, BackwardPrefetch.BACKWARD_PRE,
  // forward_prefetch False, limit_all_gathers True (PyTorch >= 2.1; llm-foundry's yamls);
  // Composer's mixed_precision DEFAULT: param bf16, reduce fp32, buffers bf16.
  CHECK(f.sharding == FsdpSharding::full_shard);
  CHECK(f.backward_prefetch == FsdpBackwardPrefetch::backward_pre);
  CHECK_FALSE(f.forward_prefetch);
  CHECK(f.limit_all_gathers);
  CHECK(f.wrap == FsdpWrap::block);
  CHECK(f.precision.param == DType::bf16);
  CHECK(f.precision.reduce == DType::fp32);
  CHECK(f.precision.buffer == DType::bf16);
  CHECK(f.unit_host_time == Time::us(200));
  CHECK(e.parallelism.zero == 3);
  CHECK(pipeline_spec(e).fsdp.has_value());
  CHECK(layer_setting(e).split_layers);
  // Another ZeRO stage, or pipeline stages: the ZeRO lowering as before.
  CHECK_FALSE(load({cli("training.framework", "fsdp"), cli("parallelism.zero", 1)}).training.fsdp);
  CHECK_FALSE(load({cli("training.framework", "generic")}).training.fsdp);
}

TEST_CASE("training.fsdp: every key reaches the spec") {
  const auto e = load({cli(
      "training.fsdp", {{"sharding_strategy", "SHARD_GRAD_OP"},
                        {"wrap", "model"},
                        {"backward_prefetch", "BACKWARD_POST"},
                        {"forward_prefetch", true},
                        {"limit_all_gathers", false},
                        {"mixed_precision", {{"param_dtype", "fp32"}, {"reduce_dtype", "bf16"}}},
                        {"unit_host_time", "50 us"}})});
  REQUIRE(e.training.fsdp);
  const FsdpSpec& f = *e.training.fsdp;
  CHECK(f.sharding == FsdpSharding::shard_grad_op);
  CHECK(f.wrap == FsdpWrap::model);
  CHECK(f.backward_prefetch == FsdpBackwardPrefetch::backward_post);
  CHECK(f.forward_prefetch);
  CHECK_FALSE(f.limit_all_gathers);
  CHECK(f.precision.param == DType::fp32);
  CHECK(f.precision.reduce == DType::bf16);
  CHECK(f.precision.buffer == DType::bf16);  // unset: the training dtype
  CHECK(f.unit_host_time == Time::us(50));
  CHECK(e.training.framework == Framework::generic);  // the fields alone: generic efficiency
  // Composer's modes: PURE all bf16, FULL all fp32.
  const auto pure = load({cli("training.fsdp.mixed_precision", "PURE")});
  CHECK(pure.training.fsdp->precision.reduce == DType::bf16);
  const auto full = load({cli("training.fsdp.mixed_precision", "FULL")});
  CHECK(full.training.fsdp->precision.param == DType::fp32);
  // NO_SHARD keeps ZeRO stage 0's model states.
  CHECK(load({cli("training.fsdp.sharding_strategy", "NO_SHARD")}).parallelism.zero == 0);
}

TEST_CASE("HYBRID_SHARD: a node's data-parallel ranks form the shard group") {
  auto e = load({cli("training.fsdp.sharding_strategy", "HYBRID_SHARD"), cli("cluster.nodes", 2),
                 cli("parallelism.dp", 16)});
  CHECK(fsdp_shard_group(e) == 8);
  CHECK(zero_settings(e).shard_group == 8);
  // On one node the shard group is the whole data-parallel group.
  CHECK(fsdp_shard_group(load({cli("training.fsdp.sharding_strategy", "HYBRID_SHARD")})) == 8);
}

TEST_CASE("bad FSDP settings are errors naming the key") {
  SUBCASE("an unknown key, with the closest known one") {
    const auto e = error_of({cli("training.fsdp.limit_all_gather", true)});
    CHECK(e.path() == "training.fsdp.limit_all_gather");
    CHECK(contains(e.message(), "limit_all_gathers"));
  }
  SUBCASE("a sharding strategy PyTorch does not have") {
    const auto e = error_of({cli("training.fsdp.sharding_strategy", "FULL")});
    CHECK(e.path() == "training.fsdp.sharding_strategy");
    CHECK(contains(e.message(), "FULL_SHARD"));
  }
  SUBCASE("a mixed-precision mode Composer does not have") {
    const auto e = error_of({cli("training.fsdp.mixed_precision", "HALF")});
    CHECK(e.path() == "training.fsdp.mixed_precision");
  }
  SUBCASE("a dtype in the mixed-precision object") {
    const auto e = error_of({cli("training.fsdp.mixed_precision", {{"reduce_dtype", "int8"}})});
    CHECK(e.path() == "training.fsdp.mixed_precision.reduce_dtype");
  }
  SUBCASE("a ZeRO stage that contradicts the sharding") {
    const auto e = error_of(
        {cli("training.fsdp.sharding_strategy", "FULL_SHARD"), cli("parallelism.zero", 2)});
    CHECK(e.path() == "parallelism.zero");
    CHECK(contains(e.message(), "FULL_SHARD"));
  }
  SUBCASE("pipeline stages") {
    const auto e = error_of({cli("training.fsdp.sharding_strategy", "FULL_SHARD"),
                             cli("parallelism.pp", 2), cli("parallelism.dp", 4)});
    CHECK(e.path() == "training.fsdp");
    CHECK(contains(e.message(), "pipeline"));
  }
  SUBCASE("ZeRO offload") {
    const auto e = error_of({cli("training.framework", "fsdp"),
                             cli("parallelism.offload", nlohmann::json::array({"optimizer"}))});
    CHECK(e.path() == "parallelism.offload");
  }
}

TEST_CASE("--fsdp: llm-foundry's fsdp_config as YAML") {
  const auto in = fsdp_config_from_text(
      "# llm-foundry pretraining yaml\n"
      "fsdp_config:\n"
      "  sharding_strategy: FULL_SHARD\n"
      "  mixed_precision: PURE\n"
      "  activation_checkpointing: true\n"
      "  activation_checkpointing_reentrant: false\n"
      "  activation_cpu_offload: false\n"
      "  limit_all_gathers: true\n"
      "  verbose: false\n",
      "mpt.yaml");
  std::map<std::string, nlohmann::json> set;
  for (const auto& o : in.overrides) set[o.path] = o.value;
  CHECK(set.at("training.framework") == "fsdp");
  CHECK(set.at("training.fsdp.sharding_strategy") == "FULL_SHARD");
  CHECK(set.at("training.fsdp.mixed_precision") == "PURE");
  CHECK(set.at("training.fsdp.limit_all_gathers") == true);
  CHECK(set.at("parallelism.recompute") == "full");
  CHECK(in.notes.empty());
  // What the overrides make of the experiment.
  const auto e = load(in.overrides);
  CHECK(e.training.fsdp->precision.reduce == DType::bf16);
  CHECK(e.parallelism.recompute == RecomputeKind::full);
}

TEST_CASE("--fsdp: Accelerate's config (fsdp_-prefixed keys, numbered strategies)") {
  const auto in = fsdp_config_from_text(
      "compute_environment: LOCAL_MACHINE\n"
      "fsdp_config:\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
      "  fsdp_backward_prefetch: NO_PREFETCH\n"
      "  fsdp_forward_prefetch: true\n"
      "  fsdp_sharding_strategy: 2\n"
      "  fsdp_use_orig_params: true\n",
      "accelerate.yaml");
  std::map<std::string, nlohmann::json> set;
  for (const auto& o : in.overrides) set[o.path] = o.value;
  CHECK(set.at("training.fsdp.sharding_strategy") == "SHARD_GRAD_OP");  // Accelerate's 2
  CHECK(set.at("training.fsdp.backward_prefetch") == "NONE");
  CHECK(set.at("training.fsdp.forward_prefetch") == true);
  CHECK(set.at("training.fsdp.wrap") == "block");
}

TEST_CASE("--fsdp: bad files are errors naming the file and the key") {
  auto error = [](const std::string& text) {
    try {
      fsdp_config_from_text(text, "bad.yaml");
    } catch (const config::ConfigError& e) {
      return e;
    }
    FAIL("expected a ConfigError");
    return config::ConfigError("", "", "");
  };
  const auto typo = error("fsdp_config:\n  limit_all_gather: true\n");
  CHECK(typo.source() == "bad.yaml");
  CHECK(typo.path() == "fsdp_config.limit_all_gather");
  CHECK(contains(typo.message(), "did you mean 'limit_all_gathers'"));
  const auto value = error("{\"sharding_strategy\": \"FULL\"}");
  CHECK(value.path() == "sharding_strategy");
  CHECK(contains(value.message(), "FULL_SHARD"));
  CHECK(error("fsdp_config:\n  - a list\n").path() == "line 2");
  CHECK(error("cpu_offload: true\n").path() == "cpu_offload");
}
