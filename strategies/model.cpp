#include "strategies/model.hpp"

#include <sstream>

namespace stratasim::strategies {

std::int64_t TransformerModel::layer_parameters() const {
  const std::int64_t h = hidden, kv = kv_hidden(), f = ffn_hidden, q = query_width();
  const std::int64_t b = bias ? 1 : 0, qb = has_qkv_bias() ? 1 : 0;
  const std::int64_t qkv = h * (q + 2 * kv) + qb * (q + 2 * kv);
  const std::int64_t projection = q * h + b * h;
  const std::int64_t up = up_width();  // gated: gate and up
  const std::int64_t mlp = h * up + b * up + f * h + b * h;
  return qkv + projection + mlp + layer_norm_parameters();
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
  return layers * layer_parameters() + embedding_parameters() + head_parameters();
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
  if (global_attention_every > 0 && sliding_window == 0) {
    throw ValidationError("global_attention_every", "needs a sliding_window");
  }
  if (final_logit_softcap < 0) {
    throw ValidationError("final_softcap", "expected a positive cap, or 0 for none");
  }
  if (attention_logit_softcap < 0) {
    throw ValidationError("attention_softcap", "expected a positive cap, or 0 for none");
  }
}

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
  m.final_logit_softcap = r.number_or("final_softcap", 0.0);
  m.attention_logit_softcap = r.number_or("attention_softcap", 0.0);
  r.finish();
  doc.validated(path, [&] { m.validate(); });
  return m;
}

}  // namespace stratasim::strategies
