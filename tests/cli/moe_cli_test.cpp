// Mixture of experts on the command line: the shipped MoE examples simulate, Megatron-LM's MoE
// arguments map onto the experiment, a Hugging Face Mixtral config.json reads as the shipped
// model, and bad MoE inputs exit 2 naming the key.
#include <fstream>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

using namespace stratasim::testing;
using namespace stratasim::testing::cli;

namespace {
bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("the Mixtral example simulates with its all-to-alls in the timeline") {
  const TempDir tmp("cli");
  auto out = tmp.subdir("mixtral");
  auto r = run("simulate mixtral-8x7b-h100-64-ep8 --quiet --out " + out.string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  const std::string timeline = read(out / "timeline.json");
  CHECK(has(timeline, "moe dispatch all-to-all"));
  CHECK(has(timeline, "moe combine all-to-all"));
  CHECK(has(timeline, "expert grad reduce-scatter"));
}

TEST_CASE("Megatron-LM's MoE arguments set the experts and their layout") {
  auto r =
      run("memory mixtral-8x7b-h100-64-ep8 --megatron-args \"--expert-model-parallel-size 4 "
          "--moe-router-topk 2 --num-experts 8 --moe-ffn-hidden-size 14336 "
          "--moe-token-dispatcher-type allgather --moe-grouped-gemm\"");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  // Megatron's list form of --moe-layer-freq is not parsed: the argument is named.
  check_bad_input(
      "simulate mixtral-8x7b-h100-64-ep8 --megatron-args \"--num-experts 8 "
      "--moe-ffn-hidden-size 14336 --moe-layer-freq ([0]*3+[1]*29)\"",
      {"--moe-layer-freq", "expected an integer"});
  check_bad_input("simulate mixtral-8x7b-h100-64-ep8 --megatron-args \"--moe-router-topk 2\"",
                  {"--moe-router-topk", "needs --num-experts"});
  check_bad_input(
      "simulate mixtral-8x7b-h100-64-ep8 --megatron-args "
      "\"--moe-token-dispatcher-type flex\"",
      {"--moe-token-dispatcher-type", "not modelled"});
}

TEST_CASE("Megatron-DeepSpeed's MoE arguments simulate; what is not modelled exits 2") {
  // examples_deepspeed/MoE/ds_pretrain_gpt_125M_MoE64.sh's MoE options (microsoft/
  // Megatron-DeepSpeed) with the 125M GPT's shape, on the Mixtral example's 64 H100s.
  const std::string line =
      "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
      "--moe-expert-parallel-size 8 --num-experts 64 --moe-loss-coeff 0.01 "
      "--moe-train-capacity-factor 1.0 --moe-eval-capacity-factor 1.0 --moe-min-capacity 4 "
      "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 2048 "
      "--max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 256 --fp16 "
      "--deepspeed --deepspeed_config ds_config.json";
  auto r = run("simulate mixtral-8x7b-h100-64-ep8 --megatron-args \"" + line + "\"");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "64 experts, top-1"));
  // PR-MoE's pyramid of expert counts: one count per model is modelled.
  check_bad_input(
      "simulate mixtral-8x7b-h100-64-ep8 --megatron-args \"--num-layers 12 --hidden-size 768 "
      "--num-experts 32 32 32 32 64 64 --mlp-type residual\"",
      {"--num-experts", "different expert counts"});
  check_bad_input(
      "simulate mixtral-8x7b-h100-64-ep8 --megatron-args \"--hidden-size 768 --num-experts 8 "
      "--topk 2 --moe-router-topk 2\"",
      {"--moe-router-topk", "Megatron-Core"});
}

TEST_CASE("a Hugging Face Mixtral config.json reads as configs/models/mixtral-8x7b.json") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("hf-mixtral");
  const auto hf = dir / "config.json";
  // mistralai/Mixtral-8x7B-v0.1's config.json.
  std::ofstream(hf) << R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true,
    "vocab_size": 32000})";
  auto r = run("memory mixtral-8x7b-h100-64-ep8 --model " + hf.string());
  auto ours = run("memory mixtral-8x7b-h100-64-ep8");
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  REQUIRE(ours.status == 0);
  // The same parameters and memory: the model line's counts and the verdict's peak.
  auto line_with = [](const std::string& text, const std::string& part) {
    const auto at = text.find(part);
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  CHECK(line_with(r.output, "verdict") == line_with(ours.output, "verdict"));
  CHECK(has(r.output, "46.7 B parameters (12.9 B active; 8 experts, top-2)"));
}

TEST_CASE("bad MoE inputs exit 2 naming the key") {
  check_bad_input("simulate mixtral-8x7b-h100-64-ep8 --set parallelism.ep=3",
                  {"parallelism.ep", "must divide model.moe.num_experts (8)"});
  check_bad_input(
      "simulate mixtral-8x7b-h100-64-ep8 --set parallelism.ep=8 --set "
      "parallelism.etp=4",
      {"parallelism.ep", "must divide tp * cp * dp"});
  check_bad_input("simulate mixtral-8x7b-h100-64-ep8 --set model.moe.top_k=9",
                  {"model.moe.top_k", "num_experts (8)"});
  check_bad_input("simulate mixtral-8x7b-h100-64-ep8 --set model.moe.topk=2",
                  {"model.moe.topk", "top_k"});
  check_bad_input("simulate llama2-7b-h100-8 --set parallelism.ep=2",
                  {"parallelism.ep", "has no experts"});
  check_bad_input("simulate mixtral-8x7b-h100-64-ep8 --set model.moe.num_experts=0",
                  {"model.moe.num_experts"});
}

TEST_CASE("a Zipf load is reported with the slowest rank's excess") {
  // Zipf s = 1 over Mixtral's 8 experts, one per ep rank: the first takes 1 / H_8 = 280 / 761 of
  // the tokens against a mean of 1/8: 8 x 280 / 761 = 2.94 times.
  auto r =
      run("simulate mixtral-8x7b-h100-64-ep8 --set "
          "'model.moe.imbalance={\"distribution\": \"zipf\", \"exponent\": 1}'");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "the most loaded of the 8 expert-parallel ranks takes 2.94 times"));
  // ... and it costs time: slower than the uniform load.
  auto uniform = run("simulate mixtral-8x7b-h100-64-ep8");
  auto seconds = [](const std::string& text) {
    const auto at = text.find("iteration time");
    return std::stod(text.substr(text.find_first_of("0123456789", at)));
  };
  CHECK(seconds(r.output) > seconds(uniform.output));
}

TEST_CASE("a Hugging Face DeepSeek-V3 config.json reads with MLA and its experts") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("hf-deepseek");
  const auto hf = dir / "config.json";
  // deepseek-ai/DeepSeek-V3's config.json (auto_map, quantization_config and rope_scaling left
  // out). 671.0 B parameters and 37.6 B active: the published 671B / 37B (arXiv:2412.19437).
  std::ofstream(hf) << R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
    "v_head_dim": 128, "vocab_size": 129280})";
  auto r = run("memory deepseek-v3-h800-2048 --model " + hf.string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(has(r.output, "671.0 B parameters (37.6 B active; 256 experts, top-8)"));
  CHECK(has(r.output, "multi-token-prediction module is not modelled"));
  // The same model as configs/models/deepseek-v3.json: the same memory.
  auto ours = run("memory deepseek-v3-h800-2048");
  const auto verdict = [](const std::string& text) { return text.substr(text.find("verdict")); };
  CHECK(verdict(r.output) == verdict(ours.output));
}
