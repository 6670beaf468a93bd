// training.framework, training.optimizer, training.grad_accumulation_dtype,
// training.distributed_optimizer and the memory held back, as configs give them: what the
// lowering receives (strategies/framework.hpp's defaults, each overridable) and the errors a
// user gets, each at the key to change.
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

Experiment with(std::vector<Override> overrides) {
  overrides.insert(overrides.begin(), cli("training.framework", "generic"));
  return load_experiment(kDefault, overrides);
}

}  // namespace

TEST_CASE("framework defaults: gradient buffers, fp32 copy, distributed optimizer, ZeRO") {
  // generic: everything in the training dtype (ZeRO's 2 + 2 + 12).
  auto generic = with({});
  CHECK(generic.training.framework == Framework::generic);
  CHECK(model_state_format(generic).grad_dtype == DType::bf16);
  CHECK_FALSE(model_state_format(generic).fp32_grad_copy);
  CHECK_FALSE(distributed_optimizer(generic));
  CHECK(model_state_format(generic).optimizer == OptimizerKind::adam);

  // megatron with bf16: fp32 main grads (arguments.py forces accumulate_allreduce_grads_in_fp32).
  auto megatron = with({cli("training.framework", "megatron")});
  CHECK(model_state_format(megatron).grad_dtype == DType::fp32);
  CHECK_FALSE(distributed_optimizer(megatron));
  CHECK(effective_zero_stage(megatron) == 0);
  // ... with fp16: fp16 grads, and the optimizer's fp32 copy of them.
  auto megatron16 = with({cli("training.framework", "megatron"), cli("training.dtype", "fp16")});
  CHECK(model_state_format(megatron16).grad_dtype == DType::fp16);
  CHECK(model_state_format(megatron16).fp32_grad_copy);
  // ... a field given alone wins over the framework's default.
  auto bf16_grads = with(
      {cli("training.framework", "megatron"), cli("training.grad_accumulation_dtype", "bf16")});
  CHECK(model_state_format(bf16_grads).grad_dtype == DType::bf16);
  auto distributed =
      with({cli("training.framework", "megatron"), cli("training.distributed_optimizer", true)});
  CHECK(distributed_optimizer(distributed));
  CHECK(effective_zero_stage(distributed) == 1);
  CHECK(zero_settings(distributed).stage == 1);
  // Megatron's buckets: max(40M, 1M x dp) elements (dp = 8 here: 40M).
  CHECK(zero_settings(distributed).reduce_bucket_size == 40'000'000);

  // deepspeed: bf16 without ZeRO is BF16_Optimizer (fp32 accumulation); ZeRO keeps bf16.
  auto ds0 = with({cli("training.framework", "deepspeed")});
  CHECK(model_state_format(ds0).grad_dtype == DType::fp32);
  auto ds1 = with({cli("training.framework", "deepspeed"), cli("parallelism.zero", 1)});
  CHECK(model_state_format(ds1).grad_dtype == DType::bf16);

  // fsdp: FULL_SHARD unless parallelism.zero says otherwise; gradients reduced in bf16.
  auto fsdp = with({cli("training.framework", "fsdp")});
  CHECK(fsdp.parallelism.zero == 3);
  CHECK(model_state_format(fsdp).grad_dtype == DType::bf16);
  auto fsdp_ddp = with({cli("training.framework", "fsdp"), cli("parallelism.zero", 0)});
  CHECK(fsdp_ddp.parallelism.zero == 0);
}

TEST_CASE("training.optimizer takes every optimizer of the table") {
  for (const OptimizerTraits& t : kOptimizerTraits) {
    CAPTURE(t.name);
    auto e = with({cli("training.optimizer", std::string(t.name))});
    CHECK(e.training.optimizer == t.kind);
    CHECK(pipeline_spec(e).optimizer == t.kind);
    CHECK(name_of(t.kind) == t.name);
    CHECK(optimizer_from_name(t.name) == t.kind);
  }
  CHECK_FALSE(optimizer_from_name("adamax"));
}

TEST_CASE("memory held back: modelled by default, memory.reserved overrides it") {
  auto e = with({});
  CHECK_FALSE(e.memory.reserved);
  CHECK(e.memory.cuda_context == Bytes(512LL << 20));
  CHECK(e.memory.nccl_buffers == Bytes(64LL << 20));
  // The shipped experiment: tp 8, pp 16, dp 8: communicators tp, dp and two pipeline peers,
  // 512 MiB + 4 x 64 MiB = 768 MiB.
  CHECK(held_back_estimate(e) == Bytes(768LL << 20));
  auto reserved = with({cli("memory.reserved", "1 GiB")});
  CHECK(held_back_estimate(reserved) == Bytes(1LL << 30));
  auto context = with({cli("memory.cuda_context", "1 GiB"), cli("memory.nccl_buffers", "0 B")});
  CHECK(held_back_estimate(context) == Bytes(1LL << 30));
}

TEST_CASE("bad framework settings are errors naming the key") {
  SUBCASE("an unknown framework, with a suggestion") {
    auto e = default_experiment_error({cli("training.framework", "megatorn")});
    CHECK(e.path() == "training.framework");
    CHECK(contains(e.message(), "megatron"));
  }
  SUBCASE("an unknown optimizer") {
    auto e = default_experiment_error({cli("training.optimizer", "adamax")});
    CHECK(e.path() == "training.optimizer");
    CHECK(contains(e.message(), "rmsprop"));
  }
  SUBCASE("gradient buffers neither fp32 nor the training dtype") {
    auto e = default_experiment_error(
        {cli("training.dtype", "fp16"), cli("training.grad_accumulation_dtype", "bf16")});
    CHECK(e.path() == "training.grad_accumulation_dtype");
    CHECK(contains(e.message(), "expected \"fp32\" or the training dtype (\"fp16\")"));
  }
  SUBCASE("the distributed optimizer with ZeRO-2") {
    auto e = default_experiment_error(
        {cli("training.distributed_optimizer", true), cli("parallelism.zero", 2)});
    CHECK(e.path() == "training.distributed_optimizer");
    CHECK(contains(e.message(), "ZeRO stage 1"));
  }
  SUBCASE("a negative CUDA context") {
    auto e = default_experiment_error({cli("memory.cuda_context", "-1 GiB")});
    CHECK(e.path() == "memory.cuda_context");
  }
}
