// Models that strategies lower into programs. The transformer family covers GPT, Llama and
// BERT, and the families people fine-tune (Qwen2/2.5/3, Gemma 1/2/3, Phi-3, Mistral, Nemotron):
// decoder or encoder; a GELU, squared-ReLU (Nemotron), SwiGLU (Llama) or GeGLU (Gemma) MLP;
// grouped-query attention with a head width of its own (Gemma's 256, Qwen3's 128); biases on
// every Linear or on Q, K and V only (Qwen2); RMSNorm on each head's queries and keys (Qwen3,
// Gemma 3); norms after the attention and MLP blocks as well as before (Gemma 2 and 3);
// sliding-window attention on all layers (Mistral) or all but every n-th (Gemma 2: n = 2,
// Gemma 3: n = 6); chunked attention on all but every n-th layer (Llama 4: n = 4); tanh
// soft-capping of the logits (Gemma 2); tied or untied embeddings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "hw_models/config_reader.hpp"
#include "strategies/moe_config.hpp"

namespace stratasim::strategies {

/// The MLP's activation. swiglu and geglu gate: fc1 produces 2 x ffn_hidden (gate and up) and
/// the activation multiplies them; gelu and squared_relu (relu(x)^2, Nemotron) do not.
enum class Activation { gelu, swiglu, geglu, squared_relu };
enum class PositionEmbedding { learned, rotary };
enum class Norm { layernorm, rmsnorm };

struct TransformerModel {
  std::string name;
  std::string source;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;  // grouped-query attention when < heads
  int ffn_hidden = 0;
  int vocab = 0;
  Activation activation = Activation::gelu;
  bool tied_embeddings = false;  // the LM head reuses the word embedding matrix
  PositionEmbedding position_embedding = PositionEmbedding::learned;
  int max_seq_len = 2048;  // rows of the learned position table; longest sequence
  Norm norm = Norm::layernorm;
  bool bias = true;    // linear layers carry biases
  bool causal = true;  // decoder (causal attention) or encoder
  /// Dropout probabilities in [0, 1) (Megatron-LM's --hidden-dropout and --attention-dropout,
  /// Hugging Face's resid_pdrop / hidden_dropout and attn_pdrop / attention_dropout).
  /// `hidden_dropout` acts on the embedding output and on each block's output before its
  /// residual add; `attention_dropout` on the softmax output. The lowering stores a dropout's
  /// mask and runs its kernels only when its probability is above zero. Default 0.1 for both,
  /// Megatron-LM's defaults, with which Korthikanti et al.'s activation formulas are written;
  /// Llama and Mistral train without dropout (their shipped files say 0).
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  /// Width of one attention head when it is not hidden / heads (Hugging Face's head_dim,
  /// Megatron-LM's --kv-channels); 0: hidden / heads. The Q projection is then hidden ->
  /// heads x head_dim and the output projection heads x head_dim -> hidden.
  int explicit_head_dim = 0;
  /// Q, K and V carry biases even where `bias` is false (Qwen2/2.5's attention, Megatron-LM's
  /// --add-qkv-bias).
  bool qkv_bias = false;
  /// RMSNorm (LayerNorm with `norm` layernorm) over each head's queries and keys before the
  /// attention core: head_dim weights each (Qwen3, Gemma 3, OLMo 2; --qk-layernorm).
  bool qk_norm = false;
  /// With qk_norm: the norm is an L2 normalisation without weights (Llama 4's use_qk_norm,
  /// Llama4TextL2Norm): the same elementwise passes, no parameters.
  bool qk_norm_l2 = false;
  /// A norm after each block's output as well, before its residual add (Gemma 2 and 3's
  /// post_attention_layernorm and post_feedforward_layernorm): two more norms per layer.
  bool post_norm = false;
  /// Sliding-window attention: a query sees the latest `sliding_window` tokens (itself
  /// included); 0: none. With `global_attention_every` n > 0, every n-th layer (layers n - 1,
  /// 2n - 1, ...) attends globally and the others locally (Gemma 2: n = 2, Gemma 3: n = 6);
  /// with 0, all layers are local (Mistral).
  std::int64_t sliding_window = 0;
  int global_attention_every = 0;
  /// Chunked attention (Llama 4's attention_chunk_size): the sequence is cut into chunks of
  /// `attention_chunk` tokens and a query sees the keys of its own chunk up to itself
  /// (Attention::chunk); 0: none. Exclusive with `sliding_window`; `global_attention_every`
  /// n > 0 makes every n-th layer global in the same way (Llama 4: n = 4, its NoPE layers).
  std::int64_t attention_chunk = 0;
  /// Gemma 2's final_logit_softcapping: logits become c tanh(logits / c), an elementwise pass
  /// over the logits forward and backward; 0: none.
  double final_logit_softcap = 0;
  /// Gemma 2's attn_logit_softcapping: the same on the attention scores, fused into
  /// FlashAttention's kernel (no extra work there) and an elementwise pass over the scores in
  /// unfused attention; 0: none.
  double attention_logit_softcap = 0;
  /// Mixture of experts (model.moe) and multi-head latent attention (model.mla):
  /// strategies/moe_config.hpp.
  std::optional<MoeSpec> moe;
  std::optional<MlaSpec> mla;

  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden / heads; }
  /// Width of the K (and of the V) projection: kv_heads * head_dim.
  int kv_hidden() const { return kv_heads * head_dim(); }
  /// Width of the Q projection (and the output projection's input): heads * head_dim.
  std::int64_t query_width() const { return std::int64_t{heads} * head_dim(); }
  /// Whether the MLP is gated (fc1 produces gate and up).
  bool gated() const { return activation == Activation::swiglu || activation == Activation::geglu; }
  /// fc1's output width: 2 x ffn_hidden when gated, else ffn_hidden.
  std::int64_t up_width() const { return gated() ? 2 * std::int64_t{ffn_hidden} : ffn_hidden; }
  /// Whether Q, K and V carry biases (`bias` or `qkv_bias`).
  bool has_qkv_bias() const { return bias || qkv_bias; }
  /// Whether layer `layer` (0-based) attends globally: no sliding window and no chunking, or
  /// one of every `global_attention_every` layers (layers n - 1, 2n - 1, ...).
  bool global_attention_layer(int layer) const {
    if (sliding_window <= 0 && attention_chunk <= 0) return true;
    return global_attention_every > 0 && (layer + 1) % global_attention_every == 0;
  }
  /// The sliding window layer `layer` (0-based) attends with, or 0 for none.
  std::int64_t window_of(int layer) const {
    return global_attention_layer(layer) ? 0 : sliding_window;
  }
  /// The attention chunk layer `layer` (0-based) attends within, or 0 for none.
  std::int64_t chunk_of(int layer) const {
    return global_attention_layer(layer) ? 0 : attention_chunk;
  }
  /// Weights of one norm over the hidden dimension (LayerNorm: weight and bias).
  std::int64_t norm_parameters() const {
    return norm == Norm::layernorm ? 2 * std::int64_t{hidden} : hidden;
  }
  /// Weights of a layer's norms, all replicated over tensor parallelism: two (four with
  /// post_norm) over the hidden dimension, and with qk_norm one over head_dim each for the
  /// queries and the keys (none with qk_norm_l2).
  std::int64_t layer_norm_parameters() const {
    const std::int64_t per_head = qk_norm_l2                ? 0
                                  : norm == Norm::layernorm ? 2 * std::int64_t{head_dim()}
                                                            : head_dim();
    return (post_norm ? 4 : 2) * norm_parameters() + (qk_norm ? 2 * per_head : 0);
  }
  /// Name of the MLP's activation kernel ("gelu", "swiglu", "geglu", "relu2").
  const char* activation_kernel() const;

  // Parameter counts, in elements.
  std::int64_t layer_parameters() const;  // one transformer layer with the dense MLP
  /// Layer `layer` (0-based): an MoE layer (MoeSpec::is_moe_layer) holds the router, every
  /// routed expert and the shared experts in place of the dense MLP; with `active`, only the
  /// top_k routed experts a token goes through (and everything else).
  std::int64_t layer_parameters(int layer, bool active = false) const;
  std::int64_t attention_parameters() const;  // the attention block (MLA's when set), no norm
  std::int64_t embedding_parameters() const;  // word embeddings plus a learned position table
  std::int64_t head_parameters() const;       // final norm plus an untied LM head
  std::int64_t parameters() const;            // the whole model
  /// Parameters one token goes through (MoE: top_k of the routed experts); parameters() for a
  /// dense model. Embedding and head counted as in parameters().
  std::int64_t active_parameters() const;
  bool is_moe_layer(int layer) const { return moe && moe->is_moe_layer(layer); }

  /// Checks shapes; throws config::ValidationError with the offending key's path.
  void validate() const;
};

/// What is wrong with `p` as a dropout probability (it must lie in [0, 1)), if anything.
std::optional<std::string> dropout_problem(double p);

/// The checks of model.moe and model.mla (paths "moe.<key>", "mla.<key>"); `layers`: the
/// model's. Throw config::ValidationError.
void validate_moe(const MoeSpec& moe, int layers);
void validate_mla(const MlaSpec& mla);

/// Reads a model from the object at `path` of `doc` (strict; validated).
TransformerModel read_model(const config::Document& doc, const std::string& path);

}  // namespace stratasim::strategies
