// FP8 and FP4 training (training.dtype "fp8" / "fp4", training.fp8; strategies/precision.hpp):
// what the lowering runs in low precision, the quantised weight copies in memory, the errors on
// devices without the rate, and Megatron-LM's fp8 arguments. Expected values by hand from the
// model's shapes (configs/models/llama2-7b.json: h 4096, 32 heads, ffn 11008 SwiGLU, 32 layers).
#include <doctest/doctest.h>

#include <string>

#include "experiment_helpers.hpp"
#include "strategies/experiment.hpp"
#include "strategies/foreign_inputs.hpp"
#include "strategies/fsdp_input.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

const auto kLlama = configs_dir() / "experiments/llama2-7b-h100-8.json";  // tp 4, dp 2
const auto kA100 = configs_dir() / "experiments/gpt3-1.7b-a100-8.json";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Linear weights per tp rank and layer: (h (h + 2 kv) + h h + h 2f + f h) / tp
// = (4096 x 12288 + 4096 x 4096 + 4096 x 22016 + 11008 x 4096) / 4 = 202,375,168 / 4.
constexpr std::int64_t kLinearPerLayer = 202'375'168 / 4;

const Kernel* find(const std::vector<Segment>& segments, const std::string& name) {
  for (const auto& s : segments) {
    for (const auto& k : s.kernels) {
      if (k.name == name) return &k;
    }
  }
  return nullptr;
}

}  // namespace

TEST_CASE("fp8: the linear layers' GEMMs in fp8, attention and the head in bf16, casts") {
  // Megatron-LM: Transformer Engine's fused modules, weights cached over the microbatches.
  const Experiment e = load_experiment(
      kLlama, {cli("training.framework", "megatron"), cli("training.dtype", "fp8")});
  REQUIRE(e.training.low_precision);
  CHECK(e.training.dtype == DType::bf16);  // everything but the linear GEMMs
  CHECK(e.training.low_precision->recipe == ScalingRecipe::delayed);
  CHECK(e.training.low_precision->format == Fp8Format::hybrid);
  const PipelineSpec spec = pipeline_spec(e);
  const StagePlan& plan = spec.stages.at(0);
  for (const char* name : {"qkv", "proj", "fc1", "fc2"}) {
    const Kernel* k = find(plan.forward, name);
    REQUIRE(k != nullptr);
    CHECK(std::get<Gemm>(k->work).dtype == DType::fp8);
    CHECK(std::get<Gemm>(k->work).scaling == hw::GemmScaling::tensor);
  }
  // Hopper: dgrad and wgrad with TE's split accumulator, costed as the block-scaled class.
  for (const char* name : {"qkv.dgrad", "qkv.wgrad", "fc2.dgrad", "fc2.wgrad"}) {
    REQUIRE(find(plan.backward, name) != nullptr);
    CHECK(std::get<Gemm>(find(plan.backward, name)->work).dtype == DType::fp8);
    CHECK(std::get<Gemm>(find(plan.backward, name)->work).scaling == hw::GemmScaling::block);
  }
  REQUIRE(find(plan.forward, "logits") != nullptr);
  CHECK(std::get<Gemm>(find(plan.forward, "logits")->work).dtype == DType::bf16);
  CHECK(std::get<Attention>(find(plan.forward, "attention")->work).dtype == DType::bf16);
  // Delayed scaling fuses the casts of qkv's, fc1's and fc2's inputs into the norm and the
  // activation; proj's input (the attention output) is a cast kernel: b s h / tp elements,
  // read in bf16 and written as fp8 and its transpose (Hopper): 2 + 1 + 1 bytes an element.
  CHECK(find(plan.forward, "qkv.input.cast") == nullptr);
  const Kernel* proj = find(plan.forward, "proj.input.cast");
  REQUIRE(proj != nullptr);
  const std::int64_t n = 4096 * 4096 / 4;
  CHECK(std::get<Elementwise>(proj->work).bytes_read == Bytes(2 * n));
  CHECK(std::get<Elementwise>(proj->work).bytes_written == Bytes(2 * n));
  CHECK(find(plan.forward, "proj.input.amax") == nullptr);  // delayed: amax inside the cast
  REQUIRE(find(plan.backward, "fc2.grad_output.cast") != nullptr);
  CHECK(find(plan.backward, "fc1.grad_output.cast") == nullptr);  // fused into swiglu's bwd
  // Weights cast once per iteration: 4 per layer, and one amax-history update.
  CHECK(plan.low_precision_parameters == 32 * kLinearPerLayer);
  CHECK(plan.weight_casts.size() == 32 * 4 + 1);
  CHECK(find(plan.forward, "qkv.weight.cast") == nullptr);
}

TEST_CASE("fp8: te.Linear in another framework: no fused casts, weights cast every forward") {
  const Experiment e = load_experiment(kLlama, {cli("training.dtype", "fp8")});  // generic
  const PipelineSpec spec = pipeline_spec(e);
  const StagePlan& plan = spec.stages.at(0);
  for (const char* name : {"qkv.input.cast", "fc1.input.cast", "fc2.input.cast", "qkv.weight.cast",
                           "fc2.weight.cast"}) {
    CAPTURE(name);
    CHECK(find(plan.forward, name) != nullptr);
  }
  CHECK(find(plan.backward, "fc1.grad_output.cast") != nullptr);
  // fc2's weight, 11008 / 4 x 4096 elements: 2 bytes read, fp8 and its transpose written.
  const auto& w = std::get<Elementwise>(find(plan.forward, "fc2.weight.cast")->work);
  CHECK(w.bytes_read == Bytes(2 * 11008 / 4 * 4096));
  CHECK(w.bytes_written == Bytes(2 * 11008 / 4 * 4096));
  CHECK(plan.weight_casts.size() == 1);  // only the amax-history update per iteration
}

TEST_CASE("fp8: current scaling runs an amax pass before every cast, none fused") {
  const Experiment e =
      load_experiment(kLlama, {cli("training.framework", "megatron"), cli("training.dtype", "fp8"),
                               cli("training.fp8", {{"recipe", "current"}})});
  const PipelineSpec spec = pipeline_spec(e);
  const StagePlan& plan = spec.stages.at(0);
  for (const char* name : {"qkv.input", "proj.input", "fc1.input", "fc2.input"}) {
    CHECK(find(plan.forward, std::string(name) + ".amax") != nullptr);
    CHECK(find(plan.forward, std::string(name) + ".cast") != nullptr);
  }
  CHECK(find(plan.backward, "fc1.grad_output.amax") != nullptr);
  CHECK(plan.weight_casts.size() == 32 * 4 * 2);  // amax + cast per weight, no history
}

TEST_CASE("fp8: the first and last layers kept in bf16, block scaling's kernel class") {
  const Experiment e = load_experiment(
      kLlama, {cli("training.dtype", "fp8"),
               cli("training.fp8",
                   {{"recipe", "block"}, {"bf16_first_layers", 1}, {"bf16_last_layers", 2}})});
  const PipelineSpec spec = pipeline_spec(e);
  const StagePlan& plan = spec.stages.at(0);
  CHECK(plan.low_precision_parameters == 29 * kLinearPerLayer);
  int fp8 = 0, bf16 = 0;
  for (const auto& s : plan.forward) {
    for (const auto& k : s.kernels) {
      if (k.name != "qkv") continue;
      const auto& g = std::get<Gemm>(k.work);
      if (g.dtype == DType::fp8) {
        ++fp8;
        CHECK(g.scaling == hw::GemmScaling::block);
      } else {
        ++bf16;
      }
    }
  }
  CHECK(fp8 == 29);
  CHECK(bf16 == 3);
}

TEST_CASE("fp8: weight copies in memory, 1 byte a linear parameter per direction") {
  ModelStateFormat f;  // bf16 weights, Adam: 2 bytes of weights a parameter
  f.low_precision = LowPrecisionSpec{};
  f.quantised_directions = 2;  // Hopper: the fp8 weight and its transpose
  ZeroSettings zero;
  // 1,000 parameters of which 600 are linear weights: 2 x 1,000 + 600 x (1 + 1) bytes.
  CHECK(device_model_states(zero, f, 1000, 1, 600).parameters == Bytes(3200));
  f.quantised_directions = 1;  // Blackwell's tensor-scaled FP8: no transpose
  CHECK(device_model_states(zero, f, 1000, 1, 600).parameters == Bytes(2600));
  // FP8 parameter gathering: the bf16 copy of the linear weights goes (2 x 400 + 600 x 1).
  f.low_precision->param_gather = true;
  CHECK(device_model_states(zero, f, 1000, 1, 600).parameters == Bytes(1400));
  // The lowered experiment allocates the copies: 32 layers' linear weights x 2 bytes more.
  const Experiment bf16 = load_experiment(kLlama);
  const Experiment fp8 = load_experiment(kLlama, {cli("training.dtype", "fp8")});
  const auto states = [](const Experiment& e) {
    const PipelineSpec spec = pipeline_spec(e);
    return device_model_states(spec.zero, spec.state_format(), spec.stages[0].parameters,
                               spec.layout.dp, spec.stages[0].low_precision_parameters)
        .parameters;
  };
  CHECK(states(fp8) - states(bf16) == Bytes(2 * 32 * kLinearPerLayer));
}

TEST_CASE("fp8 and fp4: devices without the rate are errors at training.dtype") {
  // A100: no FP8 tensor cores (its peak_flops has no fp8).
  const auto a100 = experiment_error(kA100, {cli("training.dtype", "fp8")});
  CHECK(a100.path() == "training.dtype");
  CHECK(contains(a100.what(), "FP8"));
  // H100: FP8 but no FP4 (only Blackwell).
  const auto h100 = experiment_error(kLlama, {cli("training.dtype", "fp4")});
  CHECK(h100.path() == "training.dtype");
  CHECK(contains(h100.what(), "FP4"));
  // MXFP8 needs Blackwell's block-scaled tensor cores.
  const auto mx = experiment_error(
      kLlama, {cli("training.dtype", "fp8"), cli("training.fp8", {{"recipe", "mxfp8"}})});
  CHECK(mx.path() == "training.dtype");
  // training.fp8 without an fp8 dtype, and an unknown key, name their key.
  CHECK(experiment_error(kLlama, {cli("training.fp8", {{"recipe", "delayed"}})}).path() ==
        "training.fp8");
  CHECK(contains(experiment_error(kLlama, {cli("training.dtype", "fp8"),
                                           cli("training.fp8", {{"recipie", "delayed"}})})
                     .path(),
                 "training.fp8"));
  CHECK(experiment_error(kLlama,
                         {cli("training.dtype", "fp8"), cli("training.fp8", {{"tp_comm", true}})})
            .path() == "training.fp8.tp_comm");
}

TEST_CASE("fp4: NVFP4 on a GPU with FP4 tensor cores") {
  const Experiment e = load_experiment(
      kLlama, {cli("cluster.device.peak_flops.fp4", "9000 TFLOP/s"), cli("training.dtype", "fp4")});
  REQUIRE(e.training.low_precision);
  CHECK(e.training.low_precision->recipe == ScalingRecipe::nvfp4);
  const PipelineSpec spec = pipeline_spec(e);
  const StagePlan& plan = spec.stages.at(0);
  const auto& g = std::get<Gemm>(find(plan.forward, "fc1")->work);
  CHECK(g.dtype == DType::fp4);
  CHECK(g.scaling == hw::GemmScaling::mx);
  // NVFP4 needs the per-tensor amax first: fc1's input cast is not fused.
  CHECK(find(plan.forward, "fc1.input.amax") != nullptr);
}

TEST_CASE("Megatron-LM's fp8 arguments: NVIDIA's Llama 3 8B FP8 recipe") {
  // Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh's precision arguments.
  const auto mg = megatron_from_args(
      "--bf16 --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max "
      "--fp8-param-gather --use-distributed-optimizer");
  for (const auto& note : mg.notes) CHECK_MESSAGE(!contains(note, "unknown argument"), note);
  const Experiment e = load_experiment(kLlama, mg.overrides);
  REQUIRE(e.training.low_precision);
  const LowPrecisionSpec& lp = *e.training.low_precision;
  CHECK(lp.format == Fp8Format::hybrid);
  CHECK(lp.recipe == ScalingRecipe::delayed);  // Megatron's default --fp8-recipe
  CHECK(lp.amax_history_len == 1024);
  CHECK(lp.amax_compute_algo == AmaxAlgo::max);
  CHECK(lp.param_gather);
  // Megatron's defaults: history 1, most_recent; tensorwise is current scaling; blockwise block.
  const auto cs = load_experiment(
      kLlama, megatron_from_args("--fp8-format e4m3 --fp8-recipe tensorwise "
                                 "--first-last-layers-bf16 --num-layers-at-end-in-bf16 2")
                  .overrides);
  CHECK(cs.training.low_precision->recipe == ScalingRecipe::current);
  CHECK(cs.training.low_precision->format == Fp8Format::e4m3);
  CHECK(cs.training.low_precision->amax_history_len == 1);
  CHECK(cs.training.low_precision->amax_compute_algo == AmaxAlgo::most_recent);
  CHECK(cs.training.low_precision->bf16_first_layers == 1);
  CHECK(cs.training.low_precision->bf16_last_layers == 2);
  const auto block = load_experiment(
      kLlama, megatron_from_args("--fp8-format e4m3 --fp8-recipe blockwise").overrides);
  CHECK(block.training.low_precision->recipe == ScalingRecipe::block);
  // A recipe Megatron does not have is an error naming the argument.
  try {
    megatron_from_args("--fp8-format hybrid --fp8-recipe cs");
    FAIL("expected an error");
  } catch (const config::ConfigError& err) {
    CHECK(contains(err.what(), "--fp8-recipe"));
  }
}

TEST_CASE("fp8 on Blackwell: tensor-scaled FP8 quantised in one direction, MXFP8 in two") {
  // A device with FP4 tensor cores (Blackwell) reads FP8 operands in either major order.
  const std::vector<Override> blackwell = {cli("cluster.device.peak_flops.fp4", "9000 TFLOP/s"),
                                           cli("training.framework", "megatron"),
                                           cli("training.dtype", "fp8")};
  const Experiment e = load_experiment(kLlama, blackwell);
  const PipelineSpec spec = pipeline_spec(e);
  const Kernel* proj = find(spec.stages.at(0).forward, "proj.input.cast");
  REQUIRE(proj != nullptr);
  const std::int64_t n = 4096 * 4096 / 4;  // b s h / tp, one byte each, no transpose
  CHECK(std::get<Elementwise>(proj->work).bytes_written == Bytes(n));
  // Blackwell's backward GEMMs accumulate in fp32 themselves: the tensor class.
  CHECK(std::get<Gemm>(find(spec.stages.at(0).backward, "fc1.wgrad")->work).scaling ==
        hw::GemmScaling::tensor);
  auto mx = blackwell;
  mx.push_back(cli("training.fp8", {{"recipe", "mxfp8"}}));
  const PipelineSpec mx_spec = pipeline_spec(load_experiment(kLlama, mx));
  const Kernel* mx_proj = find(mx_spec.stages.at(0).forward, "proj.input.cast");
  REQUIRE(mx_proj != nullptr);
  // Both directions, each n bytes and one E8M0 scale per 32 elements.
  CHECK(std::get<Elementwise>(mx_proj->work).bytes_written == Bytes(2 * (n + n / 32)));
}

TEST_CASE("Accelerate's mixed_precision fp8 with its fp8_config") {
  const auto acc = fsdp_config_from_text(
      "mixed_precision: fp8\n"
      "fp8_config:\n"
      "  backend: TE\n"
      "  fp8_format: E4M3\n"
      "  amax_history_length: 16\n"
      "  amax_compute_algorithm: most_recent\n"
      "fsdp_config:\n"
      "  fsdp_sharding_strategy: FULL_SHARD\n",
      "accelerate.yaml");
  std::vector<Override> overrides = acc.overrides;
  overrides.push_back(cli("parallelism.tp", 1));
  overrides.push_back(cli("parallelism.dp", 8));
  const Experiment e = load_experiment(kLlama, overrides);
  REQUIRE(e.training.low_precision);
  CHECK(e.training.low_precision->recipe == ScalingRecipe::delayed);
  CHECK(e.training.low_precision->format == Fp8Format::e4m3);
  CHECK(e.training.low_precision->amax_history_len == 16);
  CHECK(e.training.low_precision->amax_compute_algo == AmaxAlgo::most_recent);
  CHECK(e.training.framework == Framework::fsdp);
}
