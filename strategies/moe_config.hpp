// Mixture-of-experts and multi-head latent attention settings of a transformer (model.moe,
// model.mla). Semantics, units and sources; the formulas are in strategies/moe.hpp and
// docs/moe.md.
//
// MoE (Shazeer et al. 2017; Mixtral, arXiv:2401.04088; DeepSeekMoE, arXiv:2401.06066;
// DeepSeek-V3, arXiv:2412.19437; Qwen-MoE): the MLP of an MoE layer is `num_experts` routed
// experts (each a gated or plain FFN of width `ffn_hidden`, the model's activation), of which a
// router (a Linear hidden -> num_experts without bias) picks `top_k` per token, plus
// `shared_experts` experts of width `shared_ffn_hidden` every token goes through.
// Layer l (0-based) is an MoE layer when l >= first_dense and (l - first_dense) % interval == 0
// (Megatron-LM's --moe-layer-freq is `interval`, DeepSeek's first_k_dense_replace
// `first_dense`); other layers keep the model's dense MLP (TransformerModel::ffn_hidden).
//
// MLA (DeepSeek-V2, arXiv:2405.04434): queries through a low-rank q_lora_rank bottleneck (0: a
// plain projection hidden -> heads * (qk_nope + qk_rope), DeepSeek-V2-Lite), keys and values
// through a kv_lora_rank latent plus one shared rope key of qk_rope_head_dim; an RMSNorm on
// each latent; output projection heads * v_head_dim -> hidden. No biases.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace stratasim::strategies {

/// How the router scores experts: softmax over all experts then top-k (Mixtral, Qwen), or
/// DeepSeek-V3's sigmoid scores with group-limited routing (the experts split into `groups`,
/// the top `topk_groups` groups by their best scores kept, top-k within them) and a
/// per-expert bias added for selection (its aux-loss-free balancing: num_experts parameters).
enum class MoeRouter : std::uint8_t { softmax_topk, sigmoid_group_topk };

/// How tokens spread over the experts, deterministically (strategies/moe.hpp expert_loads):
/// uniform; Zipf's law, expert i (0-based) receiving a share proportional to 1/(i+1)^exponent;
/// or a measured histogram of per-expert token fractions (one per expert, normalised).
enum class MoeImbalance : std::uint8_t { uniform, zipf, histogram };

struct MoeSpec {
  int num_experts = 0;
  int top_k = 0;
  int ffn_hidden = 0;  // each routed expert's intermediate size (Megatron's moe_ffn_hidden)
  int shared_experts = 0;
  int shared_ffn_hidden = 0;        // each shared expert's intermediate size (0: ffn_hidden)
  bool shared_expert_gate = false;  // Qwen-MoE's sigmoid gate on the shared expert (hidden -> 1)
  int first_dense = 0;
  int interval = 1;
  MoeRouter router = MoeRouter::softmax_topk;
  int groups = 1;       // sigmoid_group_topk: expert groups (DeepSeek-V3: 8)
  int topk_groups = 1;  // ... groups kept per token (DeepSeek-V3: 4)
  /// Load-balancing auxiliary loss coefficient (Megatron's --moe-aux-loss-coeff); > 0 runs
  /// its kernels (per-expert token counts and mean probabilities, one dot product).
  double aux_loss_coeff = 0.0;
  /// Tokens an expert takes at most: capacity_factor * tokens * top_k / num_experts (Megatron's
  /// --moe-expert-capacity-factor; excess dropped, short experts padded); unset: dropless.
  std::optional<double> capacity_factor;
  MoeImbalance imbalance = MoeImbalance::uniform;
  double zipf_exponent = 1.0;
  std::vector<double> histogram;  // imbalance histogram: one fraction per expert

  bool is_moe_layer(int layer) const {
    return layer >= first_dense && (layer - first_dense) % interval == 0;
  }
  int expert_width() const { return ffn_hidden; }
  int shared_width() const { return shared_ffn_hidden > 0 ? shared_ffn_hidden : ffn_hidden; }
  bool operator==(const MoeSpec&) const = default;
};

/// How an experiment runs its MoE layers (ParallelismSpec's ep, etp and moe_* settings), as
/// the per-rank layer setting carries it (LayerSetting::moe).
struct MoeSetting {
  int ep = 1;   // expert-parallel ranks: each holds num_experts / ep experts
  int etp = 1;  // expert-tensor-parallel ranks: each holds 1/etp of every local expert's FFN
  bool allgather_dispatcher = false;  // Megatron's allgather token dispatcher (else alltoall)
  bool shared_expert_overlap = false;
  bool grouped_gemm = true;
  /// The forward dispatch all-to-all in FP8 with 1x128 fp32 scales (DeepEP, DeepSeek-V3;
  /// parallelism.moe_fp8_dispatch): FP8 / FP4 training and the alltoall dispatcher only.
  bool fp8_dispatch = false;
  bool operator==(const MoeSetting&) const = default;
};

struct MlaSpec {
  int q_lora_rank = 0;  // 0: no query compression
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool operator==(const MlaSpec&) const = default;
};

}  // namespace stratasim::strategies
