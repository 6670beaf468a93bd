// DeepSpeed configs, Megatron-LM arguments and Hugging Face config.json files mapped onto
// experiments (strategies/foreign_inputs.hpp): each gives the same experiment as the equivalent
// stratasim JSON, and bad input is a ConfigError naming the file or argument and the key.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "strategies/foreign_inputs.hpp"
#include "strategies/lowering.hpp"

namespace stratasim::strategies {
namespace {

using stratasim::testing::configs_dir;
namespace fs = std::filesystem;

fs::path experiment_file(const std::string& name) {
  return configs_dir() / "experiments" / (name + ".json");
}

Experiment load(const std::string& name, const std::vector<Override>& overrides = {}) {
  return load_experiment(experiment_file(name), overrides);
}

// Overrides written as a user would write them in JSON (--set key=value).
std::vector<Override> json_overrides(const nlohmann::json& sets) {
  std::vector<Override> o;
  for (const auto& [path, value] : sets.items()) o.push_back({path, value, "test (--set)"});
  return o;
}

bool contains(const std::vector<std::string>& notes, const std::string& text) {
  for (const auto& n : notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

void check_same_model(const TransformerModel& a, const TransformerModel& b) {
  CHECK(a.layers == b.layers);
  CHECK(a.hidden == b.hidden);
  CHECK(a.heads == b.heads);
  CHECK(a.kv_heads == b.kv_heads);
  CHECK(a.ffn_hidden == b.ffn_hidden);
  CHECK(a.vocab == b.vocab);
  CHECK(a.activation == b.activation);
  CHECK(a.tied_embeddings == b.tied_embeddings);
  CHECK(a.position_embedding == b.position_embedding);
  CHECK(a.max_seq_len == b.max_seq_len);
  CHECK(a.norm == b.norm);
  CHECK(a.bias == b.bias);
  CHECK(a.causal == b.causal);
  CHECK(a.hidden_dropout == b.hidden_dropout);
  CHECK(a.attention_dropout == b.attention_dropout);
}

// Every field of the experiment that lowering and simulation read, then the lowered programs
// op by op.
void check_same_experiment(const Experiment& a, const Experiment& b) {
  check_same_model(a.model, b.model);
  CHECK(a.cluster.name == b.cluster.name);
  const auto &p = a.parallelism, &q = b.parallelism;
  CHECK(p.tp == q.tp);
  CHECK(p.pp == q.pp);
  CHECK(p.dp == q.dp);
  CHECK(p.sequence_parallel == q.sequence_parallel);
  CHECK(p.schedule == q.schedule);
  CHECK(p.virtual_stages == q.virtual_stages);
  CHECK(p.micro_batch == q.micro_batch);
  CHECK(p.dp_bucket_size == q.dp_bucket_size);
  CHECK(p.dp_overlap == q.dp_overlap);
  CHECK(p.overlap_param_gather == q.overlap_param_gather);
  CHECK(p.zero == q.zero);
  CHECK(p.zero_prefetch_layers == q.zero_prefetch_layers);
  CHECK(p.reduce_bucket_size == q.reduce_bucket_size);
  CHECK(p.allgather_bucket_size == q.allgather_bucket_size);
  CHECK(p.recompute == q.recompute);
  CHECK(p.recompute_method == q.recompute_method);
  CHECK(p.recompute_num_layers == q.recompute_num_layers);
  CHECK(p.offload.optimizer == q.offload.optimizer);
  CHECK(p.offload.params == q.offload.params);
  CHECK(p.offload.nvme == q.offload.nvme);
  CHECK(p.offload.activations == q.offload.activations);
  CHECK(a.training.global_batch == b.training.global_batch);
  CHECK(a.training.seq_len == b.training.seq_len);
  CHECK(a.training.dtype == b.training.dtype);
  CHECK(a.training.flash_attention == b.training.flash_attention);
  CHECK(a.training.framework == b.training.framework);
  CHECK(a.training.optimizer == b.training.optimizer);
  CHECK(a.training.grad_accumulation_dtype == b.training.grad_accumulation_dtype);
  CHECK(a.training.distributed_optimizer == b.training.distributed_optimizer);
  CHECK(a.training.grad_clip == b.training.grad_clip);
  CHECK(a.training.loss_scaling == b.training.loss_scaling);

  const Program pa = lower(a, {.mirror_data_parallel = true});
  const Program pb = lower(b, {.mirror_data_parallel = true});
  REQUIRE(pa.op_count() == pb.op_count());
  for (OpId i = 0; i < pa.op_count(); ++i) {
    CAPTURE(i);
    REQUIRE(pa.describe(i) == pb.describe(i));
    const auto da = pa.deps_of(pa.op(i)), db = pb.deps_of(pb.op(i));
    REQUIRE(std::vector<OpId>(da.begin(), da.end()) == std::vector<OpId>(db.begin(), db.end()));
    const auto ea = pa.effects_of(pa.op(i)), eb = pb.effects_of(pb.op(i));
    REQUIRE(ea.size() == eb.size());
    for (std::size_t k = 0; k < ea.size(); ++k) REQUIRE(ea[k].delta == eb[k].delta);
  }
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json.

TransformerModel hf(const std::string& file, std::vector<std::string>* notes_out = nullptr) {
  std::ifstream in(configs_dir() / "models" / "hf" / file);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> notes;
  auto m = hf_model_from_text(text.str(), file, notes);
  if (notes_out) *notes_out = notes;
  return m;
}

TEST_CASE(
    "Hugging Face Llama-2-7B config.json is the same model as configs/models/llama2-7b.json") {
  const auto ours = stratasim::testing::load_model(configs_dir() / "models/llama2-7b.json");
  const auto theirs = hf("llama2-7b.json");
  check_same_model(ours, theirs);
  // Touvron et al. / the released checkpoint: 6,738,415,616 parameters.
  CHECK(theirs.parameters() == 6'738'415'616);

  // As the model of an experiment: the same experiment and the same program.
  auto with_hf =
      load("llama2-7b-h100-8",
           {{"model", (configs_dir() / "models/hf/llama2-7b.json").string(), "test (--model)"}});
  check_same_experiment(load("llama2-7b-h100-8"), with_hf);
  CHECK(contains(with_hf.notes, "torch_dtype \"float16\""));
}

TEST_CASE("Hugging Face GPT-2 config.json: 124,439,808 parameters") {
  std::vector<std::string> notes;
  const auto m = hf("gpt2.json", &notes);
  CHECK(m.hidden == 768);
  CHECK(m.layers == 12);
  CHECK(m.heads == 12);
  CHECK(m.ffn_hidden == 3072);  // n_inner null: 4 x n_embd
  CHECK(m.max_seq_len == 1024);
  CHECK(m.tied_embeddings);
  CHECK(m.position_embedding == PositionEmbedding::learned);
  CHECK(m.activation == Activation::gelu);
  // By hand, h = 768: a layer has QKV 3h^2 + 3h, projection h^2 + h, MLP 8h^2 + 5h and two
  // LayerNorms 4h: 12h^2 + 13h = 7,087,872; x 12 layers = 85,054,464. Word embeddings 50257 h =
  // 38,597,376, positions 1024 h = 786,432, final LayerNorm 2h = 1,536, the LM head tied.
  // Total 124,439,808 -- the figure published for GPT-2 small.
  CHECK(m.parameters() == 85'054'464 + 38'597'376 + 786'432 + 1'536);
  CHECK(m.parameters() == 124'439'808);
  CHECK(notes.empty());  // every key of the released config.json is known
}

TEST_CASE("Hugging Face Mistral-7B and GPT-NeoX-20B: published parameter counts, notes") {
  std::vector<std::string> notes;
  const auto mistral = hf("mistral-7b.json", &notes);
  CHECK(mistral.kv_heads == 8);  // grouped-query attention
  CHECK(mistral.activation == Activation::swiglu);
  CHECK(mistral.norm == Norm::rmsnorm);
  // Jiang et al., Mistral 7B (and the released checkpoint): 7,241,732,096 parameters.
  CHECK(mistral.parameters() == 7'241'732'096);
  CHECK(mistral.sliding_window == 4096);  // every layer local
  CHECK(mistral.global_attention_every == 0);

  const auto neox = hf("gpt-neox-20b.json", &notes);
  CHECK(neox.heads == 64);
  CHECK(neox.ffn_hidden == 24576);
  CHECK(!neox.tied_embeddings);
  CHECK(neox.position_embedding == PositionEmbedding::rotary);
  // Black et al., GPT-NeoX-20B (2022), Table 1: 20,554,567,680 parameters.
  CHECK(neox.parameters() == 20'554'567'680);
  CHECK(contains(notes, "use_parallel_residual"));
}

// The families people fine-tune. Each count is the sum of the released checkpoint's tensors,
// written out by hand from its config.json's shapes (h hidden, f intermediate, L layers, a
// heads, g kv heads, d head_dim, V vocab): a layer is Q, K, V h (a + 2g) d (+ the biases
// (a + 2g) d where Q, K, V carry them), the output projection a d h, the MLP 3 h f (gated) or
// 2 h f, and its norms; plus V h word embeddings, a final norm and an untied head V h.
TEST_CASE("Hugging Face Qwen2.5, Qwen3, Phi-3 and Llama 3.1: published parameter counts") {
  std::vector<std::string> notes;
  const auto qwen2 = hf("qwen2.5-7b.json", &notes);
  CHECK(!qwen2.bias);
  CHECK(qwen2.qkv_bias);             // biases on q, k and v only
  CHECK(qwen2.sliding_window == 0);  // use_sliding_window false
  // h 3584, f 18944, L 28, a 28, g 4, d 128, V 152064: a layer 3584 x 4608 + 4608 +
  // 3584^2 + 3 x 3584 x 18944 + 2 x 3584 = 233,057,792; x 28 = 6,525,618,176; embeddings and
  // head 2 x 544,997,376, final norm 3584: 7,615,616,512 (the Qwen2.5-7B checkpoint's count).
  CHECK(qwen2.parameters() == 7'615'616'512);
  CHECK(!contains(notes, "is not read"));

  const auto qwen3 = hf("qwen3-8b.json", &notes);
  CHECK(qwen3.qk_norm);
  CHECK(qwen3.head_dim() == 128);
  // h 4096, f 12288, L 36, a 32, g 8, d 128, V 151936, q/k norms 2 x 128: a layer 25,165,824 +
  // 16,777,216 + 150,994,944 + 8,192 + 256 = 192,946,432; x 36 = 6,946,071,552; + 2 x
  // 622,329,856 + 4096 = 8,190,735,360 (Qwen3-8B's checkpoint: 8.19B).
  CHECK(qwen3.parameters() == 8'190'735'360);
  CHECK(!contains(notes, "is not read"));

  const auto phi3 = hf("phi-3-mini-4k.json", &notes);
  CHECK(phi3.activation == Activation::swiglu);
  CHECK(phi3.sliding_window == 2047);
  // h 3072, f 8192, L 32, a = g = 32, V 32064: a layer 3072 x 9216 + 3072^2 + 3 x 3072 x 8192
  // + 2 x 3072 = 113,252,352; x 32 = 3,624,075,264; + 2 x 98,500,608 + 3072 = 3,821,079,552
  // (Abdin et al., Phi-3 technical report: 3.8B).
  CHECK(phi3.parameters() == 3'821'079'552);
  CHECK(!contains(notes, "is not read"));

  const auto llama31 = hf("llama3.1-8b.json", &notes);
  // Llama 3.1 8B's rope_scaling changes no shape: 8,030,261,248 as Llama 3 8B (Meta's card).
  CHECK(llama31.parameters() == 8'030'261'248);
  CHECK(!contains(notes, "is not read"));
}

TEST_CASE("Hugging Face Qwen MoE: Qwen1.5-MoE-A2.7B and Qwen3-30B-A3B, total and active") {
  std::vector<std::string> notes;
  const auto qwen3 = hf("qwen3-30b-a3b.json", &notes);
  REQUIRE(qwen3.moe.has_value());
  CHECK(qwen3.moe->num_experts == 128);
  CHECK(qwen3.moe->top_k == 8);
  CHECK(qwen3.qk_norm);
  // h 2048, L 48, a 32, g 4, d 128, V 151936, 128 experts of 768, top 8: attention 2048 x
  // (4096 + 1024) + 4096 x 2048 = 18,874,368, norms 2 x 2048 + 2 x 128 = 4352, router 128 x
  // 2048 = 262,144, an expert 3 x 2048 x 768 = 4,718,592. A layer: 623,120,640 (all experts),
  // 56,889,600 (8 of them); x 48, + 2 x 311,164,928 + 2048: 30,532,122,624 total and
  // 3,353,032,704 active (Qwen3 technical report: 30.5B total, 3.3B activated).
  CHECK(qwen3.parameters() == 30'532'122'624);
  CHECK(qwen3.active_parameters() == 3'353'032'704);
  CHECK(!contains(notes, "is not read"));

  const auto qwen15 = hf("qwen1.5-moe-a2.7b.json", &notes);
  REQUIRE(qwen15.moe.has_value());
  CHECK(qwen15.qkv_bias);
  CHECK(qwen15.moe->shared_experts == 1);
  CHECK(qwen15.moe->shared_expert_gate);
  // h 2048, L 24, a = g = 16, V 151936, 60 experts of 1408, top 4, one gated shared expert of
  // 5632: attention 2048 x 6144 + 6144 + 2048^2 = 16,783,360, norms 4096, router 122,880, an
  // expert 8,650,752, the shared expert 34,603,008 and its gate 2048. A layer 570,560,512 (all)
  // or 86,118,400 (4 experts); x 24, + 2 x 311,164,928 + 2048: 14,315,784,192 total and
  // 2,689,173,504 active (Qwen1.5-MoE-A2.7B's card: 14.3B total, 2.7B activated).
  CHECK(qwen15.parameters() == 14'315'784'192);
  CHECK(qwen15.active_parameters() == 2'689'173'504);
  CHECK(!contains(notes, "is not read"));

  // Layouts not modelled name their key.
  const std::string step = error_of([&] {
    hf_model_from_text(
        R"({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 100,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "decoder_sparse_step": 2})",
        "config.json", notes);
  });
  CHECK(step.find("at model.decoder_sparse_step") != std::string::npos);
}

TEST_CASE("Hugging Face Llama 4 Scout and Maverick: text model, total and active parameters") {
  std::vector<std::string> notes;
  const auto scout = hf("llama-4-scout-17b-16e.json", &notes);
  REQUIRE(scout.moe.has_value());
  CHECK(scout.moe->num_experts == 16);
  CHECK(scout.moe->top_k == 1);
  CHECK(scout.moe->ffn_hidden == 8192);  // intermediate_size: each routed expert
  CHECK(scout.moe->shared_experts == 1);
  CHECK(scout.moe->shared_width() == 8192);
  CHECK(scout.ffn_hidden == 16384);  // intermediate_size_mlp: the dense layers' MLP (none here)
  CHECK(scout.moe->first_dense == 0);
  CHECK(scout.moe->interval == 1);  // interleave_moe_layer_step 1: every layer
  CHECK(scout.qk_norm);
  CHECK(scout.qk_norm_l2);
  CHECK(scout.attention_chunk == 8192);
  CHECK(scout.global_attention_every == 4);  // NoPE layers 3, 7, ...: global attention
  CHECK(scout.chunk_of(0) == 8192);
  CHECK(scout.chunk_of(3) == 0);
  CHECK(scout.window_of(0) == 0);
  CHECK(!scout.tied_embeddings);
  // h 5120, L 48, a 40, g 8, d 128, V 202048, 16 experts of 8192 (top 1) plus a shared one of
  // 8192: attention 5120 x 5120 + 2 x 5120 x 1024 + 5120 x 5120 = 62,914,560, norms 2 x 5120
  // (the L2 q/k norm has no weights), router 16 x 5120 = 81,920, an expert 3 x 5120 x 8192 =
  // 125,829,120. A layer 62,914,560 + 10,240 + 81,920 + 17 x 125,829,120 = 2,202,101,760 (all
  // experts) or + 2 x 125,829,120 = 314,664,960 (one routed and the shared); x 48, + embeddings
  // and head 2 x 202048 x 5120 + final norm 5120: 107,769,861,120 total, 17,172,894,720 active.
  CHECK(scout.parameters() == 107'769'861'120);
  CHECK(scout.active_parameters() == 17'172'894'720);
  // Meta's published figures: 109B total, 17B active. The total counts the vision encoder and
  // projector, which are not modelled: the text model is within 1.2% of it.
  CHECK(static_cast<double>(scout.parameters()) == doctest::Approx(109e9).epsilon(0.012));
  CHECK(static_cast<double>(scout.active_parameters()) == doctest::Approx(17e9).epsilon(0.02));
  CHECK(contains(notes, "vision_config: the vision encoder"));
  CHECK(contains(notes, "costed as softmax_topk"));
  CHECK(!contains(notes, "is not read"));

  const auto maverick = hf("llama-4-maverick-17b-128e.json", &notes);
  REQUIRE(maverick.moe.has_value());
  CHECK(maverick.moe->num_experts == 128);
  CHECK(maverick.moe->first_dense == 1);  // interleave_moe_layer_step 2: layers 1, 3, ..., 47
  CHECK(maverick.moe->interval == 2);
  CHECK(!maverick.is_moe_layer(0));
  CHECK(maverick.is_moe_layer(47));
  CHECK(!maverick.qk_norm);  // use_qk_norm false
  // 24 MoE layers: 62,914,560 + 10,240 + router 128 x 5120 = 655,360 + 129 x 125,829,120 =
  // 16,295,536,640 (all experts) or 315,238,400 (two experts); 24 dense layers 62,914,560 +
  // 10,240 + 3 x 5120 x 16384 = 314,583,040. 24 x (16,295,536,640 + 314,583,040) +
  // 2,068,976,640 = 400,711,848,960 total; 24 x (315,238,400 + 314,583,040) + 2,068,976,640 =
  // 17,184,691,200 active (Meta: 400B total, 17B active).
  CHECK(maverick.parameters() == 400'711'848'960);
  CHECK(maverick.active_parameters() == 17'184'691'200);
  CHECK(static_cast<double>(maverick.parameters()) == doctest::Approx(400e9).epsilon(0.01));
  CHECK(!contains(notes, "is not read"));

  // The text model alone (model_type llama4_text) reads the same; layouts not modelled, and a
  // multimodal config without its text model, name their key.
  const std::string text = R"({"model_type": "llama4_text", "hidden_size": 64,
      "intermediate_size": 32, "intermediate_size_mlp": 128, "num_hidden_layers": 8,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
      "num_local_experts": 4)";
  const auto small =
      hf_model_from_text(text + R"(, "attention_chunk_size": 16})", "config.json", notes);
  CHECK(small.attention_chunk == 16);
  CHECK(small.global_attention_every == 4);
  CHECK(small.moe->interval == 1);
  const auto listed = hf_model_from_text(
      text + R"(, "moe_layers": [1, 3, 5, 7], "no_rope_layers": [1, 1, 0, 1, 1, 0, 1, 1]})",
      "config.json", notes);
  CHECK(listed.moe->first_dense == 1);
  CHECK(listed.moe->interval == 2);
  CHECK(listed.global_attention_every == 3);  // NoPE layers 2 and 5
  const auto unchunked =
      hf_model_from_text(text + R"(, "attention_chunk_size": null})", "config.json", notes);
  CHECK(unchunked.attention_chunk == 0);
  CHECK(unchunked.global_attention_every == 0);
  const auto error = [&](const std::string& tail) {
    return error_of([&] { hf_model_from_text(text + tail, "config.json", notes); });
  };
  CHECK(error(R"(, "moe_layers": [1, 2, 5]})").find("at model.moe_layers") != std::string::npos);
  CHECK(error(R"(, "no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0]})")
            .find("at model.no_rope_layers: is not a NoPE layer every 2") != std::string::npos);
  CHECK(error(R"(, "num_experts_per_tok": 0})").find("at model.num_experts_per_tok") !=
        std::string::npos);
  CHECK(error_of([&] {
          hf_model_from_text(R"({"model_type": "llama4", "vision_config": {}})", "config.json",
                             notes);
        }).find("at model.text_config") != std::string::npos);
  CHECK(error_of([&] {
          hf_model_from_text(R"({"model_type": "llama4", "text_config": {"hidden_size": 0}})",
                             "config.json", notes);
        }).find("at model.text_config.hidden_size") != std::string::npos);
}

TEST_CASE("Hugging Face Gemma 1/2/3 and Nemotron: shapes, windows, soft-caps, counts") {
  std::vector<std::string> notes;
  const auto gemma = hf("gemma-7b.json", &notes);
  CHECK(gemma.activation == Activation::geglu);
  CHECK(gemma.head_dim() == 256);  // 16 heads of 256 from a hidden size of 3072
  CHECK(gemma.query_width() == 4096);
  CHECK(gemma.tied_embeddings);
  // h 3072, f 24576, L 28, a = g = 16, d 256, V 256000, tied: a layer 3072 x 12288 + 4096 x
  // 3072 + 3 x 3072 x 24576 + 2 x 3072 = 276,830,208; x 28 = 7,751,245,824; + 786,432,000 +
  // 3072 = 8,537,680,896 (Gemma Team 2024: "8.54B" for Gemma 7B).
  CHECK(gemma.parameters() == 8'537'680'896);

  const auto gemma2 = hf("gemma-2-9b.json", &notes);
  CHECK(gemma2.post_norm);
  CHECK(gemma2.sliding_window == 4096);
  CHECK(gemma2.global_attention_every == 2);
  CHECK(gemma2.window_of(0) == 4096);  // even layers local
  CHECK(gemma2.window_of(1) == 0);     // odd layers global
  CHECK(gemma2.final_logit_softcap == 30.0);
  CHECK(gemma2.attention_logit_softcap == 50.0);
  // h 3584, f 14336, L 42, a 16, g 8, d 256, V 256000, four norms a layer: 3584 x 8192 + 4096 x
  // 3584 + 3 x 3584 x 14336 + 4 x 3584 = 198,195,200; x 42 = 8,324,198,400; + 917,504,000 +
  // 3584 = 9,241,705,984 (Gemma 2 9B's checkpoint: 9.24B).
  CHECK(gemma2.parameters() == 9'241'705'984);

  const auto gemma3 = hf("gemma-3-4b-text.json", &notes);
  CHECK(gemma3.qk_norm);
  CHECK(gemma3.post_norm);
  CHECK(gemma3.window_of(4) == 1024);
  CHECK(gemma3.window_of(5) == 0);  // every sixth layer global
  // h 2560, f 10240, L 34, a 8, g 4, d 256, V 262208: a layer 2560 x 4096 + 2048 x 2560 +
  // 3 x 2560 x 10240 + 4 x 2560 + 2 x 256 = 94,382,592; x 34 = 3,209,008,128; + 671,252,480 +
  // 2560 = 3,880,263,168 (the language model of Gemma 3 4B; its vision tower is not counted).
  CHECK(gemma3.parameters() == 3'880'263'168);

  const auto minitron = hf("minitron-8b.json", &notes);
  CHECK(minitron.activation == Activation::squared_relu);
  CHECK(minitron.norm == Norm::layernorm);
  // h 4096, f 16384, L 32, a 48, g 8, d 128, V 256000, not gated, LayerNorms (weight and bias):
  // a layer 4096 x 8192 + 6144 x 4096 + 2 x 4096 x 16384 + 4 x 4096 = 192,954,368; x 32 =
  // 6,174,539,776; + 2 x 1,048,576,000 + 8192 = 8,271,699,968.
  CHECK(minitron.parameters() == 8'271'699'968);

  // A Gemma 3 layer_types list that is not every n-th layer global is refused by name.
  const std::string odd = error_of([&] {
    hf_model_from_text(
        R"({"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 3, "num_attention_heads": 2, "vocab_size": 100,
            "sliding_window": 16,
            "layer_types": ["full_attention", "sliding_attention", "full_attention"]})",
        "config.json", notes);
  });
  CHECK(odd.find("at model.layer_types") != std::string::npos);
  // A multimodal Gemma 3 file names its text_config.
  const std::string multimodal = error_of([&] {
    hf_model_from_text(R"({"model_type": "gemma3", "text_config": {}})", "config.json", notes);
  });
  CHECK(multimodal.find("text_config") != std::string::npos);
}

TEST_CASE("Hugging Face config.json: unsupported families and bad values are errors") {
  std::vector<std::string> notes;
  auto from = [&](const std::string& text) {
    return error_of([&] { hf_model_from_text(text, "config.json", notes); });
  };
  // (BERT, once the example of an unsupported family, is read since issue 18: T5 stands in.)
  const std::string t5 = from(R"({"model_type": "t5", "d_model": 512})");
  CHECK(t5.find("config.json: at model.model_type") != std::string::npos);
  CHECK(t5.find("llama, mistral, gpt2, gpt_neox") != std::string::npos);
  CHECK(
      from(R"({"architectures": ["T5ForConditionalGeneration"]})").find("at model.architectures") !=
      std::string::npos);
  const std::string heads = from(
      R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
          "num_hidden_layers": 2, "num_attention_heads": 30, "vocab_size": 32000})");
  CHECK(heads.find("at model.num_attention_heads") != std::string::npos);
  CHECK(heads.find("must divide hidden (4096)") != std::string::npos);
  CHECK(from(R"({"model_type": "gpt2", "n_embd": "big"})").find("at model.n_embd") !=
        std::string::npos);
  CHECK(from(R"({"model_type": "llama", )").find("malformed JSON") != std::string::npos);
  // Unknown keys are notes, with a suggestion.
  notes.clear();
  hf_model_from_text(
      R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
          "n_postions": 64})",
      "config.json", notes);
  CHECK(
      contains(notes, "key 'n_postions' is not read (not modelled); did you mean 'n_positions'?"));
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed.

TEST_CASE("a DeepSpeed config gives the same experiment as the equivalent JSON") {
  const auto ds = load_deepspeed(configs_dir() / "deepspeed/zero2-offload.json");
  CHECK(ds.notes.empty());
  const auto with_ds = load("llama2-7b-h100-8", ds.overrides);
  // configs/deepspeed/zero2-offload.json written as stratasim settings: train_batch_size 64,
  // micro-batch 1 (x 32 accumulation steps x dp 2 = 64), bf16, clipping at 1.0, ZeRO 2 with the
  // optimizer on the CPU, buckets of 5e8 elements, overlapped communication.
  const auto with_json =
      load("llama2-7b-h100-8", json_overrides({
                                   {"training.global_batch", 64},
                                   {"parallelism.micro_batch", 1},
                                   {"training.dtype", "bf16"},
                                   {"parallelism.zero", 2},
                                   {"parallelism.offload", {"optimizer"}},
                                   {"parallelism.reduce_bucket_size", 500000000},
                                   {"parallelism.allgather_bucket_size", 500000000},
                                   {"parallelism.dp_overlap", true},
                                   {"training.framework", "deepspeed"},
                                   {"training.optimizer", "adamw"},
                                   {"training.grad_clip", 1.0},  // gradient_clipping
                               }));
  CHECK(with_ds.parallelism.zero == 2);
  CHECK(with_ds.training.framework == Framework::deepspeed);
  CHECK(with_ds.parallelism.offload.optimizer);
  check_same_experiment(with_json, with_ds);
}

TEST_CASE("DeepSpeed ZeRO-3 with parameter offload and \"auto\" values") {
  const auto ds = load_deepspeed(configs_dir() / "deepspeed/zero3-param-offload-bf16.json");
  const auto base = load("llama2-7b-h100-8");
  const auto e = load("llama2-7b-h100-8", ds.overrides);
  CHECK(e.parallelism.zero == 3);
  CHECK(e.parallelism.offload.params);
  CHECK(e.parallelism.offload.optimizer);
  CHECK(!e.parallelism.offload.nvme);
  // "auto" keeps the experiment's values, and says so.
  CHECK(e.training.global_batch == base.training.global_batch);
  CHECK(e.parallelism.micro_batch == base.parallelism.micro_batch);
  CHECK(e.parallelism.reduce_bucket_size == base.parallelism.reduce_bucket_size);
  CHECK(contains(ds.notes, "train_batch_size is \"auto\""));
  // DeepSpeed's live-parameter limit (1e9 elements) is ZeRO-3's, the "auto" bucket kept.
  CHECK(e.parallelism.zero_max_live_parameters == 1'000'000'000);
  CHECK(e.parallelism.zero_prefetch_bucket_size == base.parallelism.zero_prefetch_bucket_size);
  CHECK(contains(ds.notes, "stage3_prefetch_bucket_size is \"auto\""));
  // The origin names the file and the key.
  bool named = false;
  for (const auto& o : ds.overrides) {
    if (o.path == "parallelism.zero") {
      named = o.origin.find("zero3-param-offload-bf16.json (zero_optimization.stage)") !=
              std::string::npos;
    }
  }
  CHECK(named);
}

TEST_CASE("DeepSpeed batch sizes: derived as DeepSpeed derives them, contradictions are errors") {
  auto with = [](const std::string& text) {
    return load("llama2-7b-h100-8", deepspeed_from_text(text, "ds.json").overrides);
  };
  // dp = 2 (tp 4 on 8 GPUs). Micro-batch 2 x 4 steps x dp 2 = 16 samples.
  CHECK(with(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})")
            .training.global_batch == 16);
  // 32 samples / (4 steps x dp 2) = micro-batch 4.
  CHECK(with(R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})")
            .parallelism.micro_batch == 4);
  const std::string bad = error_of([&] {
    with(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
             "gradient_accumulation_steps": 16})");
  });
  CHECK(bad.find("ds.json (gradient_accumulation_steps)") != std::string::npos);
  CHECK(bad.find("1 x 16 x 2 = 32") != std::string::npos);
  // The equivalent JSON key behaves the same.
  CHECK(load("llama2-7b-h100-8", json_overrides({{"training.gradient_accumulation_steps", 32}}))
            .training.global_batch == 64);
}

TEST_CASE("DeepSpeed configs: bad values and typos are errors, unknown keys notes") {
  auto error = [](const std::string& text) {
    return error_of([&] { deepspeed_from_text(text, "ds.json"); });
  };
  CHECK(error(R"({"zero_optimization": {"stage": 4}})") ==
        "ds.json: at zero_optimization.stage: expected a ZeRO stage 0, 1, 2 or 3, got 4");
  CHECK(error(R"({"zero_optimisation": {"stage": 2}})").find("did you mean 'zero_optimization'") !=
        std::string::npos);
  CHECK(error(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})")
            .find("at zero_optimization.offload_optimizer.device: expected \"cpu\", \"nvme\"") !=
        std::string::npos);
  CHECK(error(R"({"train_batch_size": 12.5})").find("at train_batch_size") != std::string::npos);
  CHECK(error(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})")
            .find("contradicts bf16.enabled") != std::string::npos);
  CHECK(error(R"({"train_batch_size": 8,)").find("ds.json: malformed JSON at line 1") !=
        std::string::npos);
  CHECK(error("[1, 2]").find("expected a DeepSpeed config") != std::string::npos);
  // Found by fuzz/fuzz_deepspeed: a number beyond double's range.
  CHECK(error(R"({"train_batch_size": 1e400})").find("ds.json: malformed JSON") !=
        std::string::npos);
  const auto ok = deepspeed_from_text(
      R"({"flops_profiler": {"enabled": false}, "my_custom_section": 1,
          "optimizer": {"type": "Lamb"}, "activation_checkpointing": {"cpu_checkpointing": true}})",
      "ds.json");
  CHECK(contains(ok.notes, "unknown key 'my_custom_section' ignored"));
  CHECK(contains(ok.notes, "optimizer.type \"Lamb\" is not modelled"));
  // DeepSpeed's optimizer names to strategies/optimizer.hpp's; torch's SGD momentum decides.
  auto optimizer_of = [](const std::string& text) {
    for (const auto& o : deepspeed_from_text(text, "ds.json").overrides) {
      if (o.path == "training.optimizer") return o.value.get<std::string>();
    }
    return std::string("none");
  };
  CHECK(optimizer_of(R"({"optimizer": {"type": "AdamW"}})") == "adamw");
  CHECK(optimizer_of(R"({"optimizer": {"type": "SGD"}})") == "sgd");
  CHECK(optimizer_of(R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})") ==
        "sgd_momentum");
  CHECK(optimizer_of(R"({"optimizer": {"type": "Lamb"}})") == "adam");
  CHECK(optimizer_of(R"({"optimizer": {"type": "Adam"}})") == "adam");
  CHECK(contains(ok.notes, "whole layers are recomputed"));
  // cpu_checkpointing offloads the checkpoints of full recomputation.
  const auto e = load("gpt3-1.7b-a100-8", ok.overrides);
  CHECK(e.parallelism.recompute == RecomputeKind::full);
  CHECK(e.parallelism.offload.activations);
  // Parameter offload needs ZeRO-3: the experiment's check names the DeepSpeed key.
  const std::string nvme = error_of([] {
    load(
        "gpt3-1.7b-a100-8",
        deepspeed_from_text(
            R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", "ds.json")
            .overrides);
  });
  CHECK(nvme.find("ds.json (zero_optimization.offload_param.device): at parallelism.offload: "
                  "\"params\" offload needs ZeRO stage 3") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Megatron-LM.

TEST_CASE("Megatron arguments give the same experiment as the equivalent JSON") {
  const auto mg = megatron_from_args(
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
      "--micro-batch-size 2 --global-batch-size 32 --seq-length 1024 --bf16 --use-flash-attn "
      "--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
      "--use-distributed-optimizer --lr 1.5e-4 --data-path 0.5 a 0.5 b --train-iters 1000");
  CHECK(mg.notes.empty());
  const auto with_args = load("gpt3-1.7b-a100-8", mg.overrides);
  const auto with_json = load("gpt3-1.7b-a100-8", json_overrides({
                                                      {"parallelism.tp", 2},
                                                      {"parallelism.pp", 2},
                                                      {"parallelism.dp", 2},
                                                      {"parallelism.sequence_parallel", true},
                                                      {"parallelism.micro_batch", 2},
                                                      {"training.global_batch", 32},
                                                      {"training.seq_len", 1024},
                                                      {"training.dtype", "bf16"},
                                                      {"training.flash_attention", true},
                                                      {"parallelism.recompute", "full"},
                                                      {"parallelism.recompute_method", "block"},
                                                      {"parallelism.recompute_num_layers", 2},
                                                      {"training.framework", "megatron"},
                                                      {"training.distributed_optimizer", true},
                                                      // Megatron-LM's defaults (arguments.py):
                                                      // --clip-grad 1.0, dropouts 0.1
                                                      {"training.grad_clip", 1.0},
                                                      {"training.hidden_dropout", 0.1},
                                                      {"training.attention_dropout", 0.1},
                                                  }));
  CHECK(with_args.parallelism.dp == 2);
  CHECK(with_args.training.framework == Framework::megatron);
  CHECK(with_args.training.distributed_optimizer == true);
  CHECK(
      effective_zero_stage(with_args) ==
      1);  // the distributed optimizer is ZeRO-1  // 8 GPUs / (tp 2 x pp 2), as Megatron derives it
  check_same_experiment(with_json, with_args);
}

TEST_CASE("Megatron arguments set the framework, gradient buffers and optimizer") {
  const auto e =
      load("gpt3-1.7b-a100-8", megatron_from_args("--fp16 --accumulate-allreduce-grads-in-fp32 "
                                                  "--optimizer sgd --global-batch-size 32")
                                   .overrides);
  CHECK(e.training.framework == Framework::megatron);
  CHECK(e.training.grad_accumulation_dtype == DType::fp32);
  // Megatron's sgd is torch.optim.SGD with --sgd-momentum (default 0.9).
  CHECK(e.training.optimizer == OptimizerKind::sgd_momentum);
  CHECK(model_state_format(e).grad_dtype == DType::fp32);
  CHECK_FALSE(distributed_optimizer(e));
  const auto adam = load("gpt3-1.7b-a100-8", megatron_from_args("--optimizer adam").overrides);
  CHECK(adam.training.optimizer == OptimizerKind::adam);
}

TEST_CASE("Megatron's --overlap-param-gather sets parallelism.overlap_param_gather") {
  // Megatron-LM's --overlap-grad-reduce and --overlap-param-gather (with
  // --use-distributed-optimizer): both overlaps on, no note (the flag is mapped, not ignored).
  const auto mg = megatron_from_args(
      "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
      "--global-batch-size 32");
  CHECK(mg.notes.empty());
  const auto e = load("gpt3-1.7b-a100-8", mg.overrides);
  CHECK(e.parallelism.overlap_param_gather);
  CHECK(e.parallelism.dp_overlap);
  const auto plain =
      load("gpt3-1.7b-a100-8",
           megatron_from_args("--use-distributed-optimizer --global-batch-size 32").overrides);
  CHECK_FALSE(plain.parallelism.overlap_param_gather);
}

TEST_CASE("Megatron's --tp-comm-overlap sets parallelism.tp_comm_overlap") {
  // Megatron-LM asserts --sequence-parallel with --tp-comm-overlap (arguments.py); mapped, not
  // ignored: no note.
  const auto mg = megatron_from_args(
      "--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap "
      "--global-batch-size 32");
  CHECK(mg.notes.empty());
  const auto e = load("gpt3-1.7b-a100-8", mg.overrides);
  CHECK(e.parallelism.tp_comm_overlap);
  CHECK(e.parallelism.sequence_parallel);
  const auto plain =
      load("gpt3-1.7b-a100-8",
           megatron_from_args("--tensor-model-parallel-size 2 --global-batch-size 32").overrides);
  CHECK_FALSE(plain.parallelism.tp_comm_overlap);
}

TEST_CASE("Megatron pipeline communication flags") {
  // Megatron-LM scatters pipeline sends over the tp group and overlaps the interleaved
  // schedule's p2p by default; its --no-... flags turn each off.
  const auto plain =
      load("gpt3-1.7b-a100-8", megatron_from_args("--global-batch-size 32").overrides);
  CHECK(plain.parallelism.pipeline_scatter_gather);
  CHECK_FALSE(plain.parallelism.pipeline_batched_p2p);
  const auto off = load(
      "gpt3-1.7b-a100-8",
      megatron_from_args("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                         "--virtual-pipeline-model-parallel-size 2 --global-batch-size 32 "
                         "--no-scatter-gather-tensors-in-pipeline --no-overlap-p2p-communication")
          .overrides);
  CHECK_FALSE(off.parallelism.pipeline_scatter_gather);
  CHECK(off.parallelism.pipeline_batched_p2p);
  CHECK(off.parallelism.schedule == ScheduleKind::interleaved);
}

TEST_CASE("Megatron model arguments override the model; interleaving from layers per stage") {
  const auto mg = megatron_from_args(
      "--num-layers 16 --hidden-size 1024 --num-attention-heads 16 --group-query-attention "
      "--num-query-groups 4 --swiglu --untie-embeddings-and-output-weights --vocab-size 32000 "
      "--max-position-embeddings 4096 --normalization RMSNorm --disable-bias-linear "
      "--position-embedding-type rope --pipeline-model-parallel-size 2 "
      "--num-layers-per-virtual-pipeline-stage 4 --global-batch-size 64");
  const auto e = load("gpt3-1.7b-a100-8", mg.overrides);
  CHECK(e.model.layers == 16);
  CHECK(e.model.hidden == 1024);
  CHECK(e.model.kv_heads == 4);
  // Megatron's SwiGLU default: 4h x 2/3 = 2730.67, down to a multiple of 64: 2688.
  CHECK(e.model.ffn_hidden == 2688);
  CHECK(e.model.activation == Activation::swiglu);
  CHECK(e.model.norm == Norm::rmsnorm);
  CHECK(!e.model.bias);
  CHECK(!e.model.tied_embeddings);
  CHECK(e.model.position_embedding == PositionEmbedding::rotary);
  // 16 layers / (pp 2 x 4 layers per virtual stage) = 2 model chunks per device.
  CHECK(e.parallelism.schedule == ScheduleKind::interleaved);
  CHECK(e.parallelism.virtual_stages == 2);
  CHECK(contains(mg.notes, "--ffn-hidden-size not given: 2688"));
}

TEST_CASE("Megatron arguments: shell quoting, bad values and unsupported settings") {
  CHECK(split_shell_words(R"(--a 'b c' "d \"e\"" f\ g --h="i j")", "s") ==
        std::vector<std::string>{"--a", "b c", "d \"e\"", "f g", "--h=i j"});
  auto error = [](const std::string& args) { return error_of([&] { megatron_from_args(args); }); };
  CHECK(error("--tensor-model-parallel-size eight") ==
        "--megatron-args: at --tensor-model-parallel-size: expected an integer from 1 to "
        "16777216, got \"eight\"");
  CHECK(error("--num-layers=0").find("at --num-layers") != std::string::npos);
  CHECK(error("--micro-batch-size").find("expects one value") != std::string::npos);
  CHECK(error("--bf16 yes").find("takes no value") != std::string::npos);
  CHECK(error("--tensor-model-paralel-size 2").find("did you mean --tensor-model-parallel-size") !=
        std::string::npos);
  CHECK(error("--cp-comm-type a2a+p2p").find("not modelled") != std::string::npos);
  CHECK(error("--cp-comm-type ring").find("expected one of p2p, a2a, allgather") !=
        std::string::npos);
  CHECK(error("--bf16 --fp16").find("contradicts --bf16") != std::string::npos);
  CHECK(error("--recompute-granularity some").find("expected one of full, selective") !=
        std::string::npos);
  CHECK(error("--seq-length '4096").find("unterminated single quote opened at byte 13") !=
        std::string::npos);
  const auto ok =
      megatron_from_args("pretrain_gpt.py --tokenizer-kind gpt2 --context-parallel-size 1");
  CHECK(contains(ok.notes, "1 word(s) before the first --argument ignored"));
  CHECK(contains(ok.notes,
                 "unknown argument \"--tokenizer-kind\" ignored (did you mean --tokenizer-type?)"));
  // A value the experiment rejects names the argument it came from.
  const std::string tp = error_of([] {
    load("gpt3-1.7b-a100-8", megatron_from_args("--tensor-model-parallel-size 5").overrides);
  });
  CHECK(tp.find("--megatron-args (--tensor-model-parallel-size 5)") != std::string::npos);
}

TEST_CASE("Megatron-DeepSpeed MoE arguments: experts on every other layer, ep, capacity") {
  // examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_MoE128.sh's megatron_options (microsoft/
  // Megatron-DeepSpeed), its variables filled in, on 8 GPUs (the script's EP_PARALLEL_SIZE is
  // the GPU count: 8 here).
  const std::string line =
      "--override-opt_param-scheduler --adam-beta1 0.9 --adam-beta2 0.95 "
      "--tensor-model-parallel-size 1 --moe-expert-parallel-size 8 --num-experts 128 "
      "--moe-loss-coeff 0.01 --moe-train-capacity-factor 1.0 --moe-eval-capacity-factor 1.0 "
      "--moe-min-capacity 4 --init-method-std 0.014 --micro-batch-size 8 "
      "--global-batch-size 512 --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
      "--seq-length 2048 --max-position-embeddings 2048 --lr 1.2e-4 --min-lr 1.0e-6 "
      "--lr-decay-style cosine --split 98,2,0 --weight-decay 0.1 --clip-grad 1.0 "
      "--hysteresis 2 --num-workers 0 --fp16 --create-moe-param-group --deepspeed "
      "--deepspeed_config ds_config.json";
  const auto mg = megatron_from_args(line);
  const auto e = load("gpt3-1.7b-a100-8", mg.overrides);
  REQUIRE(e.model.moe.has_value());
  const auto& moe = *e.model.moe;
  CHECK(moe.num_experts == 128);
  CHECK(moe.top_k == 1);              // --topk's default
  CHECK(moe.ffn_hidden == 4 * 2048);  // the model's MLP: 4h without --ffn-hidden-size
  CHECK(moe.first_dense == 1);        // --expert-interval's default 2: layer_num % 2 == 0,
  CHECK(moe.interval == 2);           // layers 1, 3, ..., 23 (0-based)
  CHECK(!e.model.is_moe_layer(0));
  CHECK(e.model.is_moe_layer(23));
  CHECK(moe.aux_loss_coeff == 0.01);
  REQUIRE(moe.capacity_factor.has_value());
  CHECK(*moe.capacity_factor == 1.0);  // token dropping on (DeepSpeed's drop_tokens)
  CHECK(moe.shared_experts == 0);
  CHECK(e.parallelism.ep == 8);
  CHECK(e.parallelism.etp == 1);
  CHECK(!e.parallelism.moe_grouped_gemm);  // DeepSpeed's experts: one GEMM each
  CHECK(e.training.dtype == DType::fp16);
  CHECK(contains(mg.notes, "--moe-min-capacity is not modelled"));

  // Defaults: --moe-loss-coeff 0.1, --moe-train-capacity-factor 1.0; --deepspeed with
  // --num-experts alone is enough to read DeepSpeed's layout (every other layer).
  const auto plain = load(
      "gpt3-1.7b-a100-8",
      megatron_from_args("--deepspeed --num-experts 8 --topk 2 --ffn-hidden-size 9216").overrides);
  CHECK(plain.model.moe->top_k == 2);
  CHECK(plain.model.moe->interval == 2);
  CHECK(plain.model.moe->aux_loss_coeff == 0.1);
  CHECK(*plain.model.moe->capacity_factor == 1.0);
  CHECK(plain.parallelism.ep == 1);

  // PR-MoE (ds_pretrain_gpt_1.3B_PR-MoE64or128.sh): --mlp-type residual is a shared expert of
  // the experts' width behind a gate; one count per MoE layer is read when they agree; no
  // token dropping is dropless; expert tensor parallelism splits the experts over tp.
  const auto pr = megatron_from_args(
      "--tensor-model-parallel-size 2 --sequence-parallel --moe-expert-parallel-size 4 "
      "--num-experts 64 64 64 64 64 64 64 64 64 64 64 64 --mlp-type residual --num-layers 24 "
      "--expert-interval 2 --disable-moe-token-dropping --enable-expert-tensor-parallelism "
      "--ffn-hidden-size 9216");
  const auto residual = load("gpt3-1.7b-a100-8", pr.overrides);
  CHECK(residual.model.moe->num_experts == 64);
  CHECK(residual.model.moe->shared_experts == 1);
  CHECK(residual.model.moe->shared_width() == residual.model.moe->ffn_hidden);
  CHECK(residual.model.moe->shared_expert_gate);
  CHECK(!residual.model.moe->capacity_factor.has_value());
  CHECK(residual.parallelism.ep == 4);
  CHECK(residual.parallelism.etp == 2);
  CHECK(contains(pr.notes, "PR-MoE's residual MLP"));

  // --num-experts 1 (Megatron-DeepSpeed's default) is a dense model.
  const auto dense = megatron_from_args("--num-experts 1 --topk 2");
  CHECK(!load("gpt3-1.7b-a100-8", dense.overrides).model.moe.has_value());
  CHECK(contains(dense.notes, "a dense model"));

  // What is not modelled, or contradicts, names the flag.
  auto error = [](const std::string& args) { return error_of([&] { megatron_from_args(args); }); };
  CHECK(error("--num-layers 24 --num-experts 64 64 64 64 64 64 64 64 64 64 128 128 "
              "--mlp-type residual")
            .find("at --num-experts: gives MoE layers different expert counts") !=
        std::string::npos);
  CHECK(error("--num-layers 24 --num-experts 64 64 64")
            .find("expected one, or one per MoE layer (num_layers / expert_interval = 12)") !=
        std::string::npos);
  CHECK(error("--num-experts 8 --topk 2 --moe-router-topk 2")
            .find("at --moe-router-topk: is Megatron-Core's MoE argument") != std::string::npos);
  CHECK(error("--num-experts 8 --moe-expert-parallel-size 2 --expert-model-parallel-size 2")
            .find("at --expert-model-parallel-size") != std::string::npos);
  CHECK(error("--num-experts 8 --ffn-hidden-size 64 --mlp-type pyramid")
            .find("expected one of standard, residual") != std::string::npos);
  CHECK(
      error("--deepspeed --num-experts 8 --num-experts-switch 8").find("at --num-experts-switch") !=
      std::string::npos);
  CHECK(error("--num-experts 8 --topk 9").find("at --topk") != std::string::npos);
  // An expert-parallel size the experiment rejects names the argument.
  const std::string ep = error_of([] {
    load("gpt3-1.7b-a100-8",
         megatron_from_args("--num-experts 8 --moe-expert-parallel-size 16 --ffn-hidden-size 9216")
             .overrides);
  });
  CHECK(ep.find("--moe-expert-parallel-size 16") != std::string::npos);
}

TEST_CASE("Megatron arguments: context parallelism") {
  // --context-parallel-size 2 with tp 2 on the 8 A100s leaves dp 2; p2p is TE's ring, a2a
  // Ulysses; Megatron's cp runs TE's fused attention.
  const auto ring =
      load("gpt3-1.7b-a100-8", megatron_from_args("--tensor-model-parallel-size 2 "
                                                  "--context-parallel-size 2 --cp-comm-type p2p")
                                   .overrides);
  CHECK(ring.parallelism.cp == 2);
  CHECK(ring.parallelism.dp == 2);
  CHECK(ring.parallelism.cp_mode == CpMode::ring);
  CHECK(ring.training.flash_attention);
  const auto a2a =
      load("gpt3-1.7b-a100-8",
           megatron_from_args("--context-parallel-size 4 --cp-comm-type a2a").overrides);
  CHECK(a2a.parallelism.cp == 4);
  CHECK(a2a.parallelism.dp == 2);
  CHECK(a2a.parallelism.cp_mode == CpMode::ulysses);
  const auto gather =
      load("gpt3-1.7b-a100-8",
           megatron_from_args("--context-parallel-size 2 --cp-comm-type allgather").overrides);
  CHECK(gather.parallelism.cp_mode == CpMode::allgather);
}

TEST_CASE("dropout, clipping and loss scaling from Megatron arguments and Hugging Face configs") {
  // Megatron-LM: the arguments, or its defaults (arguments.py: --hidden-dropout 0.1,
  // --attention-dropout 0.1, --clip-grad 1.0); --loss-scale fixes the scale (static).
  const auto given =
      load("gpt3-1.7b-a100-8", megatron_from_args("--hidden-dropout 0 --attention-dropout 0.05 "
                                                  "--clip-grad 0.5 --fp16 --loss-scale 4096")
                                   .overrides);
  CHECK(given.model.hidden_dropout == 0.0);
  CHECK(given.model.attention_dropout == 0.05);
  CHECK(given.training.grad_clip == 0.5);
  CHECK(given.training.loss_scaling == LossScaling::static_);
  const auto defaults = load("llama2-7b-h100-8", megatron_from_args("--fp16").overrides);
  CHECK(defaults.model.hidden_dropout == 0.1);  // Megatron's default, not the model file's 0
  CHECK(defaults.model.attention_dropout == 0.1);
  CHECK(defaults.training.grad_clip == 1.0);
  CHECK(defaults.training.loss_scaling == LossScaling::dynamic);
  CHECK(error_of([] {
          megatron_from_args("--hidden-dropout 1.5");
        }).find("at --hidden-dropout: expected a number from 0 to 1") != std::string::npos);
  CHECK(error_of([] {
          megatron_from_args("--attention-dropout 1");
        }).find("at --attention-dropout: expected a dropout probability") != std::string::npos);

  // DeepSpeed: gradient_clipping, and fp16.loss_scale (0: dynamic, a value: static).
  const auto ds = load("gpt3-1.7b-a100-8", deepspeed_from_text(R"({"gradient_clipping": 0.8,
                                               "fp16": {"enabled": true, "loss_scale": 1024}})",
                                                               "ds.json")
                                               .overrides);
  CHECK(ds.training.grad_clip == 0.8);
  CHECK(ds.training.loss_scaling == LossScaling::static_);
  CHECK(error_of([] {
          deepspeed_from_text(R"({"gradient_clipping": -1})", "ds.json");
        }).find("ds.json: at gradient_clipping: expected a max gradient norm") !=
        std::string::npos);

  // Hugging Face: GPT-2's resid_pdrop and attn_pdrop (0.1 in the released config.json), Llama
  // and Mistral's attention_dropout (0.0), BERT-style names, each family's default when absent.
  const auto gpt2 = hf("gpt2.json");
  CHECK(gpt2.hidden_dropout == 0.1);
  CHECK(gpt2.attention_dropout == 0.1);
  const auto mistral = hf("mistral-7b.json");
  CHECK(mistral.hidden_dropout == 0.0);
  CHECK(mistral.attention_dropout == 0.0);
  std::vector<std::string> notes;
  const auto neox = hf_model_from_text(
      R"({"model_type": "gpt_neox", "hidden_size": 1024, "intermediate_size": 4096,
          "num_hidden_layers": 2, "num_attention_heads": 16, "vocab_size": 50432,
          "hidden_dropout_prob": 0.2, "attention_dropout": 0.3})",
      "config.json", notes);
  CHECK(neox.hidden_dropout == 0.2);
  CHECK(neox.attention_dropout == 0.3);
  const auto gpt2_zero = hf_model_from_text(
      R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000,
          "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.1})",
      "config.json", notes);
  CHECK(gpt2_zero.hidden_dropout == 0.0);
  CHECK(contains(notes, "embd_pdrop 0.1 is modelled as resid_pdrop"));
  const std::string bad = error_of([&] {
    hf_model_from_text(R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                           "vocab_size": 1000, "attn_pdrop": 2})",
                       "config.json", notes);
  });
  CHECK(bad.find("config.json: at model.attn_pdrop: expected a dropout probability") !=
        std::string::npos);
}

}  // namespace
TEST_CASE("Hugging Face transformers' ds_config_zero3.json: bucket sizes of 0 are read") {
  // tests/data/deepspeed/hf-transformers-ds_config_zero3.json (PROVENANCE.md: copied from
  // transformers' tests/deepspeed/) was refused with "reduce_bucket_size: expected an integer
  // from 1". DeepSpeed fills a reduce bucket until the next gradient would overflow it, so 0
  // reduces every gradient alone: one element here (a unit larger than the bucket is a bucket
  // of its own). stage3_prefetch_bucket_size 0 prefetches nothing: zero_prefetch_layers 0.
  const auto ds = load_deepspeed(stratasim::testing::source_dir() /
                                 "tests/data/deepspeed/hf-transformers-ds_config_zero3.json");
  const auto e = load("llama2-7b-h100-8", ds.overrides);
  CHECK(e.parallelism.zero == 3);
  CHECK(e.parallelism.reduce_bucket_size == 1);
  CHECK(e.parallelism.zero_prefetch_layers == 0);
  CHECK(e.parallelism.zero_max_live_parameters == 1'000'000'000);
  CHECK(e.parallelism.offload.params);
  CHECK(e.parallelism.offload.optimizer);
  CHECK(contains(ds.notes, "reduce_bucket_size is 0"));
  CHECK(contains(ds.notes, "stage3_prefetch_bucket_size is 0"));
  // Negative sizes stay errors at their keys.
  CHECK(error_of([] {
          deepspeed_from_text(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}})",
                              "neg.json");
        }).find("zero_optimization.reduce_bucket_size") != std::string::npos);
}

}  // namespace stratasim::strategies
