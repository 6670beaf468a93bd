// FP8 beyond the dense linear layers (strategies/precision.hpp, strategies/moe.hpp): the MoE
// experts' grouped GEMMs and the shared experts in the recipe's class (the router in bf16),
// FP8 dispatch (parallelism.moe_fp8_dispatch), delayed scaling's amax all-reduce, and the
// linear layers' inputs saved quantised. Expected values by hand from the model files:
// Mixtral 8x7B (configs/models/mixtral-8x7b.json: h 4096, 32 heads, 8 kv heads, 8 experts of
// ffn 14336 SwiGLU, top-2, 32 layers) in configs/experiments/mixtral-8x7b-h100-64-ep8.json
// (tp 1, pp 4, ep 8, dp 16, micro-batch 1, 4,096 tokens), and Llama 2 7B (h 4096, ffn 11008)
// in configs/experiments/llama2-7b-h100-8.json (tp 4, dp 2, flash attention, no sequence
// parallelism).
#include <doctest/doctest.h>

#include <string>

#include "experiment_helpers.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "strategies/moe.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

const auto kMixtral = configs_dir() / "experiments/mixtral-8x7b-h100-64-ep8.json";
const auto kLlama = configs_dir() / "experiments/llama2-7b-h100-8.json";

const Kernel* find(const std::vector<Segment>& segments, const std::string& name) {
  for (const auto& s : segments) {
    for (const auto& k : s.kernels) {
      if (k.name == name) return &k;
    }
  }
  return nullptr;
}

const Segment* segment(const std::vector<Segment>& segments, const std::string& label) {
  for (const auto& s : segments) {
    if (s.label == label) return &s;
  }
  return nullptr;
}

Experiment mixtral(std::vector<Override> more = {}) {
  more.push_back(cli("training.dtype", "fp8"));
  return load_experiment(kMixtral, more);
}

// Mixtral's rank: T = 4,096 tokens, each routed to 2 of 8 experts; with ep 8 each rank holds
// one expert and (uniform load) receives T x 2 = 8,192 tokens.
constexpr std::int64_t kT = 4096, kH = 4096, kF = 14336, kR = 8192;

}  // namespace

TEST_CASE("fp8 MoE: the experts' grouped GEMMs in fp8 with their casts, the router in bf16") {
  const Experiment e = mixtral();
  const PipelineSpec spec = pipeline_spec(e);
  const StagePlan& plan = spec.stages.at(0);
  for (const char* name : {"experts.fc1", "experts.fc2"}) {
    CAPTURE(name);
    REQUIRE(find(plan.forward, name) != nullptr);
    const auto& g = std::get<Gemm>(find(plan.forward, name)->work);
    CHECK(g.dtype == DType::fp8);
    CHECK(g.scaling == hw::GemmScaling::tensor);
  }
  // fc1: [8,192 tokens, 4,096] x [4,096, 2 x 14,336], one local expert.
  const auto& fc1 = std::get<Gemm>(find(plan.forward, "experts.fc1")->work);
  CHECK(fc1.m == kR);
  CHECK(fc1.n == 2 * kF);
  CHECK(fc1.k == kH);
  // Hopper's split accumulator in the backward, as the dense layers'.
  for (const char* name : {"experts.fc1.dgrad", "experts.fc1.wgrad", "experts.fc2.dgrad"}) {
    CAPTURE(name);
    REQUIRE(find(plan.backward, name) != nullptr);
    CHECK(std::get<Gemm>(find(plan.backward, name)->work).dtype == DType::fp8);
    CHECK(std::get<Gemm>(find(plan.backward, name)->work).scaling == hw::GemmScaling::block);
  }
  REQUIRE(find(plan.forward, "router") != nullptr);
  CHECK(std::get<Gemm>(find(plan.forward, "router")->work).dtype == DType::bf16);
  CHECK(std::get<Gemm>(find(plan.backward, "router.wgrad")->work).dtype == DType::bf16);
  // GroupedLinear quantises its own inputs (no norm or activation fuses them): R x h elements
  // read in bf16 (2 bytes), written as fp8 and its transpose (Hopper: 1 + 1 bytes).
  const Kernel* cast = find(plan.forward, "experts.fc1.input.cast");
  REQUIRE(cast != nullptr);
  CHECK(std::get<Elementwise>(cast->work).bytes_read == Bytes(2 * kR * kH));
  CHECK(std::get<Elementwise>(cast->work).bytes_written == Bytes(2 * kR * kH));
  CHECK(find(plan.forward, "experts.fc2.input.cast") != nullptr);
  CHECK(find(plan.backward, "experts.fc2.grad_output.cast") != nullptr);
  CHECK(find(plan.backward, "experts.fc1.grad_output.cast") != nullptr);
  // Weights cached over the microbatches (Megatron): stage 0's 8 layers x (qkv, proj, the
  // expert's fc1 and fc2) casts and one amax-history update. Per layer: qkv 4,096 x (4,096 +
  // 2 x 1,024) = 25,165,824, proj 16,777,216, fc1 4,096 x 28,672 = 117,440,512, fc2 14,336 x
  // 4,096 = 58,720,256: 218,103,808.
  CHECK(plan.weight_casts.size() == 8 * 4 + 1);
  CHECK(plan.low_precision_parameters == 8 * std::int64_t{218'103'808});
  CHECK(find(plan.forward, "experts.fc1.weight.cast") == nullptr);
  // Without the weight cache (te.Linear in another framework) every forward casts them.
  const PipelineSpec generic = pipeline_spec(mixtral({cli("training.framework", "generic")}));
  CHECK(find(generic.stages.at(0).forward, "experts.fc1.weight.cast") != nullptr);
}

TEST_CASE("fp8 MoE: the shared experts run in fp8, Qwen's shared gate stays in bf16") {
  const Experiment e =
      mixtral({cli("model.moe.shared_experts", 1), cli("model.moe.shared_expert_gate", true)});
  const PipelineSpec plan_spec = pipeline_spec(e);
  const StagePlan& plan = plan_spec.stages.at(0);
  REQUIRE(find(plan.forward, "shared.fc1") != nullptr);
  REQUIRE(find(plan.backward, "shared.fc2.wgrad") != nullptr);
  REQUIRE(find(plan.forward, "shared.gate") != nullptr);
  CHECK(std::get<Gemm>(find(plan.forward, "shared.fc1")->work).dtype == DType::fp8);
  CHECK(std::get<Gemm>(find(plan.backward, "shared.fc2.wgrad")->work).dtype == DType::fp8);
  CHECK(std::get<Gemm>(find(plan.forward, "shared.gate")->work).dtype == DType::bf16);
  CHECK(find(plan.forward, "shared.fc1.input.cast") != nullptr);
  // Per layer 2 more weights: 8 x 6 casts and the amax-history update.
  CHECK(plan.weight_casts.size() == 8 * 6 + 1);
}

TEST_CASE("fp8 MoE: the first and last layers in bf16 keep their experts in bf16") {
  const Experiment e = mixtral({cli("training.fp8", {{"bf16_first_layers", 1}})});
  const PipelineSpec plan_spec = pipeline_spec(e);
  const StagePlan& plan = plan_spec.stages.at(0);
  int fp8 = 0, bf16 = 0;
  for (const auto& s : plan.forward) {
    for (const auto& k : s.kernels) {
      if (k.name != "experts.fc1") continue;
      (std::get<Gemm>(k.work).dtype == DType::fp8 ? fp8 : bf16)++;
    }
  }
  CHECK(fp8 == 7);  // stage 0 holds layers 0..7
  CHECK(bf16 == 1);
  CHECK(plan.weight_casts.size() == 7 * 4 + 1);
}

TEST_CASE("fp8 dispatch: 1 byte an element and an fp32 scale per 128, the combine in bf16") {
  const Experiment e = mixtral({cli("parallelism.moe_fp8_dispatch", true)});
  const PipelineSpec plan_spec = pipeline_spec(e);
  const StagePlan& plan = plan_spec.stages.at(0);
  const Segment* dispatch = segment(plan.forward, "L0 moe dispatch all-to-all");
  const Segment* combine = segment(plan.forward, "L0 moe combine all-to-all");
  REQUIRE(dispatch != nullptr);
  REQUIRE(combine != nullptr);
  // What a rank sends: tokens x hidden x top_k x (1 + 4/128) x (ep - 1)/ep
  // = 4,096 x 4,096 x 2 x 1.03125 x 7/8 = 30,277,632 bytes (the nccl-tests size is 8/7 of it).
  CHECK(dispatch->bytes.count() * 7 / 8 == 30'277'632);
  // The combine: 4,096 x 4,096 x 2 x 2 bytes (bf16) = 67,108,864.
  CHECK(combine->bytes == Bytes(67'108'864));
  // The backward all-to-alls stay in bf16.
  CHECK(segment(plan.backward, "L0 moe combine bwd all-to-all")->bytes == Bytes(67'108'864));
  CHECK(segment(plan.backward, "L0 moe dispatch bwd all-to-all")->bytes == Bytes(67'108'864));
  // A cast before (T k h elements: 2 bytes read, 1 + 4/128 written) and a dequantisation after.
  const Kernel* cast = find(plan.forward, "moe.dispatch.cast");
  REQUIRE(cast != nullptr);
  CHECK(std::get<Elementwise>(cast->work).bytes_read == Bytes(2 * kT * 2 * kH));
  CHECK(std::get<Elementwise>(cast->work).bytes_written == Bytes(kT * 2 * (kH + 4 * kH / 128)));
  CHECK(find(plan.forward, "moe.dispatch.dequantize") != nullptr);
  // Without the option, the dispatch moves bf16: 4,096 x 2 x 4,096 x 2 bytes.
  const PipelineSpec plain_spec = pipeline_spec(mixtral());
  const StagePlan& plain = plain_spec.stages.at(0);
  CHECK(segment(plain.forward, "L0 moe dispatch all-to-all")->bytes == Bytes(67'108'864));
  CHECK(find(plain.forward, "moe.dispatch.cast") == nullptr);
  CHECK(token_bytes(3, 256, 2, true) == 3 * (256 + 8));
}

TEST_CASE("fp8 dispatch needs fp8 training and the alltoall dispatcher") {
  CHECK(experiment_error(kMixtral, {cli("parallelism.moe_fp8_dispatch", true)}).path() ==
        "parallelism.moe_fp8_dispatch");
  CHECK(experiment_error(kMixtral,
                         {cli("training.dtype", "fp8"), cli("parallelism.moe_fp8_dispatch", true),
                          cli("parallelism.moe_token_dispatcher", "allgather")})
            .path() == "parallelism.moe_fp8_dispatch");
  CHECK(experiment_error(kLlama,
                         {cli("training.dtype", "fp8"), cli("parallelism.moe_fp8_dispatch", true)})
            .path() == "parallelism.moe_fp8_dispatch");
}

TEST_CASE("delayed scaling all-reduces the amaxes over tp x cp x dp, once per pass") {
  const Experiment e = load_experiment(
      kLlama, {cli("training.framework", "megatron"), cli("training.dtype", "fp8")});
  const PipelineSpec plan_spec = pipeline_spec(e);
  const StagePlan& plan = plan_spec.stages.at(0);
  const Segment* fwd = segment(plan.forward, "fp8 amax all-reduce");
  const Segment* bwd = segment(plan.backward, "fp8 amax all-reduce bwd");
  REQUIRE(fwd != nullptr);
  REQUIRE(bwd != nullptr);
  // 32 layers x 4 GEMMs; 3 fp32 amaxes per GEMM forward (input, weight, output), 2 backward.
  CHECK(fwd->bytes == Bytes(32 * 4 * 3 * 4));
  CHECK(bwd->bytes == Bytes(32 * 4 * 2 * 4));
  CHECK(fwd->collective == CollectiveKind::all_reduce);
  CHECK(fwd->axis == TpAxis::amax);
  // In the Program, one group of the stage's 8 ranks (tp 4 x dp 2), once per microbatch and
  // pass: 64 / 2 = 32 microbatches per rank.
  const Program p = lower(e);
  int amax = 0;
  for (const Op& op : p.ops_of(0)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (c == nullptr || p.label_of(op).find("fp8 amax") == std::string::npos) continue;
    ++amax;
    CHECK(p.groups()[c->group].ranks.size() == 8);
  }
  CHECK(amax == 2 * 32);
  // Mixtral's stage 0: 8 layers x (qkv, proj, one local expert's fc1 and fc2) = 32 GEMMs.
  const PipelineSpec moe = pipeline_spec(mixtral());
  REQUIRE(segment(moe.stages.at(0).forward, "fp8 amax all-reduce") != nullptr);
  CHECK(segment(moe.stages.at(0).forward, "fp8 amax all-reduce")->bytes == Bytes(32 * 3 * 4));
  // Current scaling and the block recipes keep no amax history: nothing to reduce.
  for (const char* recipe : {"current", "block"}) {
    CAPTURE(recipe);
    const Experiment other = load_experiment(
        kLlama, {cli("training.framework", "megatron"), cli("training.dtype", "fp8"),
                 cli("training.fp8", {{"recipe", recipe}})});
    const PipelineSpec o_spec = pipeline_spec(other);
    const StagePlan& o = o_spec.stages.at(0);
    CHECK(segment(o.forward, "fp8 amax all-reduce") == nullptr);
    CHECK(segment(o.backward, "fp8 amax all-reduce bwd") == nullptr);
  }
}

TEST_CASE("fp8 saves the linear layers' inputs quantised") {
  const Experiment bf16 = load_experiment(kLlama);
  const Experiment fp8 = load_experiment(
      kLlama, {cli("training.dtype", "fp8"), cli("training.fp8", {{"bf16_first_layers", 1}})});
  const auto sum = [](const Experiment& e, int layer) {
    Bytes total;
    for (const auto& item : layer_activations(e.model, layer_setting(e), layer)) {
      total += item.bytes;
    }
    return total;
  };
  // Per layer (b s = 4,096 tokens, tp 4, no sequence parallelism): qkv's and fc1's inputs
  // (4,096 x 4,096 each) and fc2's (4,096 x 11,008 / 4) from 2 bytes to 1; proj's input
  // (4,096 x 4,096 / 4) kept in bf16 for the flash kernel plus its 1-byte FP8 copy:
  // -16,777,216 x 2 - 11,272,192 + 4,194,304 = -40,632,320 bytes.
  CHECK(sum(fp8, 5) - sum(bf16, 5) == Bytes(-40'632'320));
  CHECK(sum(fp8, 0) == sum(bf16, 0));  // layer 0 kept in bf16
  // The MoE block: the expert's fc1 input (R x h) and fc2 input (R x f) from 2 bytes to 1:
  // -(8,192 x 4,096 + 8,192 x 14,336) = -150,994,944 bytes.
  const Experiment moe_bf16 = load_experiment(kMixtral);
  const Experiment moe_fp8 = mixtral();
  CHECK(moe_block_activations(moe_fp8.model, layer_setting(moe_fp8), 3) -
            moe_block_activations(moe_bf16.model, layer_setting(moe_bf16), 3) ==
        Bytes(-(kR * kH + kR * kF)));
}
