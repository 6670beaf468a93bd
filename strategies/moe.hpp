// The mixture-of-experts block of a transformer layer as one rank runs it (Megatron-Core's
// MoELayer: router, token dispatcher, grouped GEMM experts, shared experts), the expert load
// model, and the per-rank parameter split of MoE and MLA layers. Model settings:
// strategies/moe_config.hpp; docs/moe.md has the formulas and their sources.
//
// Per rank, with T the tokens entering the layer (b s / tp with sequence parallelism, which
// Megatron requires with tp > 1), k = top_k, E experts, h hidden, e the dtype's bytes:
// - router: GEMM [T, h] x [h, E], the scores (softmax or sigmoid), top-k, with aux_loss_coeff
//   > 0 the load-balancing loss, then the permutation of the T k routed copies (memory-bound:
//   reads T h e, writes T k h e);
// - alltoall dispatcher: an all-to-all over the ep group of the T k h e permuted bytes
//   (nccl-tests' size; each rank keeps 1/ep and sends T k h e (ep - 1) / ep: dispatch_bytes),
//   scaled by the load model's imbalance (the slowest receiver sets the collective's pace);
//   allgather dispatcher: an all-gather of every rank's T h e tokens over the ep group (then
//   a local permutation) and a reduce-scatter of the outputs;
// - with etp > 1, the received tokens all-gathered over the etp group before the experts and the
//   outputs reduce-scattered after;
// - experts: a grouped GEMM over the num_experts / ep local experts with the tokens of the most
//   loaded ep rank (expert_load(): every rank waits for it in the combine all-to-all), fc1, the
//   activation, fc2; without grouped GEMM, one GEMM per expert;
// - combine: the all-to-all back, the unpermutation weighted by the routing probabilities;
// - shared experts: a dense FFN of shared_experts x shared_ffn_hidden on every token (tensor
//   parallel as the dense MLP: all-gather, GEMMs, reduce-scatter), after the routed experts or,
//   with shared_expert_overlap, beside the dispatch all-to-all (a second chain of the pass).
// Backward mirrors it: the all-to-alls again (gradients), data- and weight-gradient GEMMs.
//
// FP8 / FP4 (LayerSetting::low_precision, in a low-precision layer; strategies/precision.hpp's
// low_precision_gemm is the rule): the routed experts' grouped GEMMs (TE's GroupedLinear) and
// the shared experts' GEMMs run in the recipe's class; the router stays in the high-precision
// dtype. GroupedLinear and the shared experts' TE Linears quantise their inputs and output
// gradients themselves (no norm or activation fuses them: every cast is a kernel), weights
// once per iteration with the weight cache (StagePlan::weight_casts) or in every forward; each
// saves its FP8 input for the backward (saved_input_bytes). With MoeSetting::fp8_dispatch
// (DeepEP, DeepSeek-V3) the forward dispatch all-to-all moves the permuted tokens in FP8 with
// 1x128 fp32 scales (fp8_dispatch_bytes: a cast before, a dequantisation after); the combine
// and the backward all-to-alls stay in the high-precision dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strategies/transformer.hpp"

namespace stratasim::strategies {

/// Per-expert shares of the routed tokens (sum 1): uniform 1/E; zipf (1/(i+1)^s) / H; the
/// histogram normalised.
std::vector<double> expert_fractions(const MoeSpec& moe);

/// The tokens of each expert-parallel rank (experts assigned in contiguous blocks of E / ep, as
/// Megatron does) when each of the ep ranks routes `tokens` tokens to top_k experts: the routed
/// copies in all are tokens * top_k * ep; an expert receives its share, at most the capacity
/// ceil(capacity_factor * tokens * ep * top_k / E) when one is set (the rest dropped).
struct ExpertLoad {
  double mean = 0;  // tokens an ep rank's experts receive, averaged over the ranks
  double max = 0;   // ... on the most loaded rank
  /// max / mean: the slowest rank's excess (1 when balanced).
  double imbalance() const { return mean > 0 ? max / mean : 1.0; }
};
ExpertLoad expert_load(const MoeSpec& moe, double tokens, int ep);

/// Bytes one rank sends to the other ep - 1 members in one dispatch (or combine) all-to-all of a
/// balanced load: tokens * hidden * top_k * element_bytes * (ep - 1) / ep.
Bytes dispatch_bytes(std::int64_t tokens, std::int64_t hidden, int top_k,
                     std::int64_t element_bytes, int ep);
/// The all-to-all's nccl-tests size of `tokens` routed copies of `hidden` elements each: in
/// FP8 with `fp8` (fp8_dispatch_bytes per token: hidden + 4 ceil(hidden / 128)), else at
/// `element_bytes` each.
std::int64_t token_bytes(std::int64_t tokens, std::int64_t hidden, std::int64_t element_bytes,
                         bool fp8);

/// A linear layer's weight on one rank: its name, elements, and the GEMMs it runs (a grouped
/// GEMM over n local experts: n).
struct LinearWeight {
  std::string name;
  std::int64_t elements = 0;
  std::int64_t gemms = 1;
};
/// The MoE block's linear weights on one rank that run in low precision in an FP8 / FP4 layer:
/// the shared experts' fc1 and fc2 (tp-sharded; none without shared experts) and the local
/// routed experts' fc1 and fc2 (etp-sharded; the router and Qwen's gate excluded).
std::vector<LinearWeight> moe_linear_weights(const TransformerModel& model,
                                             const LayerSetting& setting);

/// The forward and the backward of the MoE block of `layer` (after ln2, up to the block's
/// output, before the residual add), for one rank; `stored` is what the forward stores for the
/// backward (allocated by its experts' segment, released by the backward's last segment).
std::vector<Segment> moe_block_forward(const TransformerModel& model, const LayerSetting& setting,
                                       int layer, Bytes stored);
std::vector<Segment> moe_block_backward(const TransformerModel& model, const LayerSetting& setting,
                                        int layer, Bytes stored);
/// What the MoE block stores per microbatch and rank: the router's input and fp32 probabilities,
/// the permuted tokens, the experts' fc1 input, activation input and fc2 input (the received
/// tokens, etp-gathered), the combine's input, the shared experts' as the dense MLP's.
/// In a low-precision layer (`layer`; -1: one that is), the linear inputs (the experts' and
/// shared experts' fc1 and fc2 inputs) are saved quantised (saved_input_bytes).
Bytes moe_block_activations(const TransformerModel& model, const LayerSetting& setting,
                            int layer = -1);

/// Parameters of an MoE layer's MLP held by one rank: `dense` the router, the shared experts
/// (sharded over tp as the dense MLP) and Qwen's shared gate; `experts` its num_experts / ep
/// routed experts, each 1/etp.
struct MoeRankParameters {
  std::int64_t dense = 0, experts = 0;
};
MoeRankParameters moe_parameters_per_rank(const TransformerModel& model,
                                          const LayerSetting& setting);
/// Parameters of the attention block held by one tensor-parallel rank (1D): the QKV and output
/// projections sharded, row-parallel biases replicated; with MLA the down-projections and
/// latent norms replicated (Megatron's duplicated linear_q_down_proj and linear_kv_down_proj),
/// the up-projections and the output sharded.
std::int64_t attention_parameters_per_rank(const TransformerModel& model, int tp);

/// Model FLOPs of one token's forward and backward (3x the forward), Megatron's convention
/// (2 per multiply-add): 6 x the weight-matrix elements a token goes through (attention
/// projections, the dense MLP or the router, top_k routed experts, the shared experts and
/// their gate, the LM head; no biases, norms or embedding lookup), plus attention's
/// 6 s a (d_qk + d_v) per layer (QK^T and PV over the full s x s score matrix, causal or not;
/// d_qk = d_v = head_dim without MLA).
double training_flops_per_token(const TransformerModel& model, std::int64_t seq_len);

}  // namespace stratasim::strategies
