#include "strategies/model.hpp"

#include <algorithm>
#include <sstream>

namespace stratasim::strategies {

namespace {

// One FFN of intermediate width f: up (gate and up with SwiGLU) and down projections.
std::int64_t ffn_parameters(const TransformerModel& m, std::int64_t f) {
  const std::int64_t h = m.hidden, b = m.bias ? 1 : 0;
  const std::int64_t up_width = m.gated() ? 2 * f : f;  // gated: gate and up
  return h * up_width + b * up_width + f * h + b * h;
}

// The MLP of an MoE layer: the router (hidden -> experts, no bias; DeepSeek-V3's selection bias
// of one per expert), `routed` routed experts, the shared experts and Qwen's shared gate.
std::int64_t moe_mlp_parameters(const TransformerModel& m, std::int64_t routed) {
  const MoeSpec& e = *m.moe;
  const std::int64_t h = m.hidden;
  const std::int64_t router =
      e.num_experts * h + (e.router == MoeRouter::sigmoid_group_topk ? e.num_experts : 0);
  return router + routed * ffn_parameters(m, e.expert_width()) +
         e.shared_experts * ffn_parameters(m, e.shared_width()) + (e.shared_expert_gate ? h : 0);
}

}  // namespace

std::int64_t TransformerModel::attention_parameters() const {
  const std::int64_t h = hidden, b = bias ? 1 : 0;
  if (mla) {
    const std::int64_t a = heads, qr = mla->q_lora_rank, kvr = mla->kv_lora_rank;
    const std::int64_t q = qr > 0 ? h * qr + qr + qr * a * mla->qk_head_dim()  // down, norm, up
                                  : h * a * mla->qk_head_dim();
    const std::int64_t kv = h * (kvr + mla->qk_rope_head_dim) + kvr  // down (+ rope key), norm
                            + kvr * a * (mla->qk_nope_head_dim + mla->v_head_dim);  // up
    return q + kv + a * mla->v_head_dim * h;                                        // output
  }
  const std::int64_t kv = kv_hidden();
  const std::int64_t q = query_width(), qb = has_qkv_bias() ? 1 : 0;
  return h * (q + 2 * kv) + qb * (q + 2 * kv) + q * h + b * h;
}

std::int64_t TransformerModel::layer_parameters() const {
  return attention_parameters() + ffn_parameters(*this, ffn_hidden) + layer_norm_parameters();
}

std::int64_t TransformerModel::layer_parameters(int layer, bool active) const {
  if (!is_moe_layer(layer)) return layer_parameters();
  return attention_parameters() +
         moe_mlp_parameters(*this, active ? moe->top_k : moe->num_experts) +
         layer_norm_parameters();
}

const char* TransformerModel::activation_kernel() const {
  switch (activation) {
    case Activation::gelu:
      return "gelu";
    case Activation::swiglu:
      return "swiglu";
    case Activation::geglu:
      return "geglu";
    case Activation::squared_relu:
      return "relu2";
  }
  return "gelu";
}

std::int64_t TransformerModel::embedding_parameters() const {
  std::int64_t words = static_cast<std::int64_t>(vocab) * hidden;
  std::int64_t positions =
      position_embedding == PositionEmbedding::learned ? std::int64_t{max_seq_len} * hidden : 0;
  return words + positions;
}

std::int64_t TransformerModel::head_parameters() const {
  return norm_parameters() + (tied_embeddings ? 0 : static_cast<std::int64_t>(vocab) * hidden);
}

std::int64_t TransformerModel::parameters() const {
  std::int64_t total = embedding_parameters() + head_parameters();
  for (int l = 0; l < layers; ++l) total += layer_parameters(l);
  return total;
}

std::int64_t TransformerModel::active_parameters() const {
  std::int64_t total = embedding_parameters() + head_parameters();
  for (int l = 0; l < layers; ++l) total += layer_parameters(l, true);
  return total;
}

void TransformerModel::validate() const {
  using config::ValidationError;
  if (layers < 1) throw ValidationError("layers", "expected at least 1 layer");
  if (hidden < 1) throw ValidationError("hidden", "expected a positive hidden size");
  if (heads < 1) throw ValidationError("heads", "expected at least 1 head");
  if (explicit_head_dim < 0) throw ValidationError("head_dim", "expected a positive head width");
  if (explicit_head_dim == 0 && hidden % heads != 0) {
    throw ValidationError("heads", "must divide hidden (" + std::to_string(hidden) + "), got " +
                                       std::to_string(heads) + "; or give head_dim");
  }
  if (kv_heads < 1 || heads % kv_heads != 0) {
    throw ValidationError("kv_heads", "must divide heads (" + std::to_string(heads) + "), got " +
                                          std::to_string(kv_heads));
  }
  if (ffn_hidden < 1) throw ValidationError("ffn_hidden", "expected a positive size");
  if (vocab < 1) throw ValidationError("vocab", "expected a positive vocabulary size");
  if (max_seq_len < 1) throw ValidationError("max_seq_len", "expected a positive length");
  if (auto problem = dropout_problem(hidden_dropout))
    throw ValidationError("hidden_dropout", *problem);
  if (auto problem = dropout_problem(attention_dropout)) {
    throw ValidationError("attention_dropout", *problem);
  }
  if (sliding_window < 0) {
    throw ValidationError("sliding_window", "expected a window of at least 1 token, or 0 for none");
  }
  if (sliding_window > 0 && !causal) {
    throw ValidationError("sliding_window", "a sliding window needs causal attention");
  }
  if (global_attention_every < 0) {
    throw ValidationError("global_attention_every", "expected 0 (every layer local) or more");
  }
  if (attention_chunk < 0) {
    throw ValidationError("attention_chunk", "expected a chunk of at least 1 token, or 0 for none");
  }
  if (attention_chunk > 0 && !causal) {
    throw ValidationError("attention_chunk", "chunked attention needs causal attention");
  }
  if (attention_chunk > 0 && sliding_window > 0) {
    throw ValidationError("attention_chunk",
                          "a layer attends within a sliding window or within chunks, not both: "
                          "give sliding_window or attention_chunk");
  }
  if (global_attention_every > 0 && sliding_window == 0 && attention_chunk == 0) {
    throw ValidationError("global_attention_every", "needs a sliding_window or attention_chunk");
  }
  if (qk_norm_l2 && !qk_norm) {
    throw ValidationError("qk_norm_l2", "describes the q/k norm: it needs qk_norm");
  }
  if (final_logit_softcap < 0) {
    throw ValidationError("final_softcap", "expected a positive cap, or 0 for none");
  }
  if (attention_logit_softcap < 0) {
    throw ValidationError("attention_softcap", "expected a positive cap, or 0 for none");
  }
  if (moe) validate_moe(*moe, layers);
  if (mla) validate_mla(*mla);
}

void validate_moe(const MoeSpec& e, int layers) {
  using config::ValidationError;
  const auto n = std::to_string(e.num_experts);
  if (e.num_experts < 1) throw ValidationError("moe.num_experts", "expected at least 1 expert");
  if (e.top_k < 1 || e.top_k > e.num_experts) {
    throw ValidationError("moe.top_k", "expected 1 to num_experts (" + n + ") experts per token");
  }
  if (e.ffn_hidden < 1) throw ValidationError("moe.ffn_hidden", "expected a positive size");
  if (e.shared_experts < 0) throw ValidationError("moe.shared_experts", "expected 0 or more");
  if (e.shared_ffn_hidden < 0) {
    throw ValidationError("moe.shared_ffn_hidden", "expected a positive size (0: ffn_hidden)");
  }
  if (e.shared_expert_gate && e.shared_experts == 0) {
    throw ValidationError("moe.shared_expert_gate", "needs shared_experts > 0");
  }
  if (e.interval < 1) throw ValidationError("moe.interval", "expected 1 or more");
  if (e.first_dense < 0 || e.first_dense >= layers) {
    throw ValidationError("moe.first_dense", "expected 0 up to layers - 1 (" +
                                                 std::to_string(layers - 1) +
                                                 ") so that at least one layer is an MoE layer");
  }
  if (e.groups < 1 || e.num_experts % e.groups != 0) {
    throw ValidationError("moe.groups", "must divide num_experts (" + n + ")");
  }
  if (e.topk_groups < 1 || e.topk_groups > e.groups) {
    throw ValidationError("moe.topk_groups",
                          "expected 1 to groups (" + std::to_string(e.groups) + ")");
  }
  if (e.top_k > e.topk_groups * (e.num_experts / e.groups)) {
    throw ValidationError("moe.top_k", "exceeds the experts of the topk_groups groups kept");
  }
  if (e.aux_loss_coeff < 0) throw ValidationError("moe.aux_loss_coeff", "expected 0 or more");
  if (e.capacity_factor && !(*e.capacity_factor > 0)) {
    throw ValidationError("moe.capacity_factor", "expected a positive factor (or none: dropless)");
  }
  if (e.imbalance == MoeImbalance::zipf && !(e.zipf_exponent >= 0)) {
    throw ValidationError("moe.imbalance.exponent", "expected 0 or more");
  }
  if (e.imbalance == MoeImbalance::histogram) {
    double sum = 0;
    for (double f : e.histogram) {
      if (!(f >= 0)) throw ValidationError("moe.imbalance.fractions", "expected fractions >= 0");
      sum += f;
    }
    if (static_cast<int>(e.histogram.size()) != e.num_experts || !(sum > 0)) {
      throw ValidationError("moe.imbalance.fractions", "expected one fraction per expert (" + n +
                                                           "), not all zero; got " +
                                                           std::to_string(e.histogram.size()));
    }
  }
}

void validate_mla(const MlaSpec& a) {
  using config::ValidationError;
  if (a.q_lora_rank < 0) throw ValidationError("mla.q_lora_rank", "expected 0 (none) or more");
  if (a.kv_lora_rank < 1) throw ValidationError("mla.kv_lora_rank", "expected a positive rank");
  if (a.qk_nope_head_dim < 1) throw ValidationError("mla.qk_nope_head_dim", "expected > 0");
  if (a.qk_rope_head_dim < 1) throw ValidationError("mla.qk_rope_head_dim", "expected > 0");
  if (a.v_head_dim < 1) throw ValidationError("mla.v_head_dim", "expected > 0");
}

namespace {

MoeSpec read_moe(config::ObjectReader r) {
  MoeSpec e;
  constexpr std::int64_t kBig = 1 << 24;
  e.num_experts = static_cast<int>(r.integer_in("num_experts", 1, 1 << 20));
  e.top_k = static_cast<int>(r.integer_in("top_k", 1, 1 << 20));
  e.ffn_hidden = static_cast<int>(r.integer_in("ffn_hidden", 1, kBig));
  e.shared_experts = static_cast<int>(r.integer_in_or("shared_experts", 0, 1 << 10, 0));
  e.shared_ffn_hidden = static_cast<int>(r.integer_in_or("shared_ffn_hidden", 0, kBig, 0));
  e.shared_expert_gate = r.boolean_or("shared_expert_gate", false);
  e.first_dense = static_cast<int>(r.integer_in_or("first_dense", 0, 100'000, 0));
  e.interval = static_cast<int>(r.integer_in_or("interval", 1, 100'000, 1));
  e.router = r.choice_or("router", {"softmax_topk", "sigmoid_group_topk"}, "softmax_topk") ==
                     "softmax_topk"
                 ? MoeRouter::softmax_topk
                 : MoeRouter::sigmoid_group_topk;
  e.groups = static_cast<int>(r.integer_in_or("groups", 1, 1 << 20, 1));
  e.topk_groups = static_cast<int>(r.integer_in_or("topk_groups", 1, 1 << 20, 1));
  e.aux_loss_coeff = r.number_or("aux_loss_coeff", 0.0);
  if (r.has("capacity_factor")) e.capacity_factor = r.number("capacity_factor");
  if (r.has("imbalance")) {
    config::ObjectReader im = r.object("imbalance", "an imbalance model");
    const std::string kind = im.choice("distribution", {"uniform", "zipf", "histogram"});
    e.imbalance = kind == "uniform" ? MoeImbalance::uniform
                  : kind == "zipf"  ? MoeImbalance::zipf
                                    : MoeImbalance::histogram;
    if (e.imbalance == MoeImbalance::zipf) e.zipf_exponent = im.number("exponent");
    if (e.imbalance == MoeImbalance::histogram) {
      const nlohmann::json* v =
          im.has("fractions") ? im.document().find(im.path_of("fractions")) : nullptr;
      if (v == nullptr || !v->is_array() ||
          !std::all_of(v->begin(), v->end(), [](const auto& x) { return x.is_number(); })) {
        im.fail("fractions", "expected a list of per-expert token fractions such as [0.2, 0.1]");
      }
      for (const auto& x : *v) e.histogram.push_back(x.get<double>());
    }
    im.finish();
  }
  r.finish();
  return e;
}

MlaSpec read_mla(config::ObjectReader r) {
  MlaSpec a;
  constexpr std::int64_t kBig = 1 << 20;
  a.q_lora_rank = static_cast<int>(r.integer_in_or("q_lora_rank", 0, kBig, 0));
  a.kv_lora_rank = static_cast<int>(r.integer_in("kv_lora_rank", 1, kBig));
  a.qk_nope_head_dim = static_cast<int>(r.integer_in("qk_nope_head_dim", 1, kBig));
  a.qk_rope_head_dim = static_cast<int>(r.integer_in("qk_rope_head_dim", 1, kBig));
  a.v_head_dim = static_cast<int>(r.integer_in("v_head_dim", 1, kBig));
  r.finish();
  return a;
}

}  // namespace

std::optional<std::string> dropout_problem(double p) {
  if (p >= 0.0 && p < 1.0) return std::nullopt;
  std::ostringstream text;
  text << "expected a dropout probability from 0 (no dropout) up to but excluding 1, got " << p;
  return text.str();
}

TransformerModel read_model(const config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a model");
  TransformerModel m;
  r.choice("type", {"transformer"});
  m.name = r.string("name");
  m.source = r.string_or("source", "");
  constexpr std::int64_t kBig = 1 << 24;
  m.layers = static_cast<int>(r.integer_in("layers", 1, 100'000));
  m.hidden = static_cast<int>(r.integer_in("hidden", 1, kBig));
  m.heads = static_cast<int>(r.integer_in("heads", 1, kBig));
  m.kv_heads = static_cast<int>(r.integer_in_or("kv_heads", 1, kBig, m.heads));
  m.ffn_hidden = static_cast<int>(r.integer_in("ffn_hidden", 1, kBig));
  m.vocab = static_cast<int>(r.integer_in("vocab", 1, 1 << 30));
  const std::string activation =
      r.choice_or("activation", {"gelu", "swiglu", "geglu", "squared_relu"}, "gelu");
  m.activation = activation == "swiglu"         ? Activation::swiglu
                 : activation == "geglu"        ? Activation::geglu
                 : activation == "squared_relu" ? Activation::squared_relu
                                                : Activation::gelu;
  m.tied_embeddings = r.boolean_or("tied_embeddings", false);
  m.position_embedding =
      r.choice_or("position_embedding", {"learned", "rotary"}, "learned") == "learned"
          ? PositionEmbedding::learned
          : PositionEmbedding::rotary;
  m.max_seq_len = static_cast<int>(r.integer_in_or("max_seq_len", 1, kBig, m.max_seq_len));
  m.norm = r.choice_or("norm", {"layernorm", "rmsnorm"}, "layernorm") == "layernorm"
               ? Norm::layernorm
               : Norm::rmsnorm;
  m.bias = r.boolean_or("bias", true);
  m.causal = r.boolean_or("causal", true);
  m.hidden_dropout = r.number_or("hidden_dropout", m.hidden_dropout);
  m.attention_dropout = r.number_or("attention_dropout", m.attention_dropout);
  m.explicit_head_dim = static_cast<int>(r.integer_in_or("head_dim", 1, kBig, 0));
  m.qkv_bias = r.boolean_or("qkv_bias", false);
  m.qk_norm = r.boolean_or("qk_norm", false);
  m.post_norm = r.boolean_or("post_norm", false);
  m.sliding_window = r.integer_in_or("sliding_window", 0, std::int64_t{1} << 40, 0);
  m.global_attention_every =
      static_cast<int>(r.integer_in_or("global_attention_every", 0, 100'000, 0));
  m.attention_chunk = r.integer_in_or("attention_chunk", 0, std::int64_t{1} << 40, 0);
  m.qk_norm_l2 = r.boolean_or("qk_norm_l2", false);
  m.final_logit_softcap = r.number_or("final_softcap", 0.0);
  m.attention_logit_softcap = r.number_or("attention_softcap", 0.0);
  if (r.has("moe")) m.moe = read_moe(r.object("moe", "a mixture-of-experts block"));
  if (r.has("mla")) m.mla = read_mla(r.object("mla", "a multi-head latent attention block"));
  r.finish();
  doc.validated(path, [&] { m.validate(); });
  return m;
}

}  // namespace stratasim::strategies
