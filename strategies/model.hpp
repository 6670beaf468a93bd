// Models that strategies lower into programs. The transformer family covers GPT, Llama and
// BERT: decoder or encoder, GELU or SwiGLU MLP, grouped-query attention, tied or untied
// embeddings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "hw_models/config_reader.hpp"
#include "strategies/moe_config.hpp"

namespace stratasim::strategies {

enum class Activation { gelu, swiglu };
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
  /// Mixture of experts (model.moe) and multi-head latent attention (model.mla):
  /// strategies/moe_config.hpp.
  std::optional<MoeSpec> moe;
  std::optional<MlaSpec> mla;

  int head_dim() const { return hidden / heads; }
  /// Width of the K (and of the V) projection: kv_heads * head_dim.
  int kv_hidden() const { return kv_heads * head_dim(); }

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
