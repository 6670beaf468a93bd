// Context parallelism (parallelism.cp, cp_mode): each of cp ranks holds seq / cp tokens of every
// sequence through the whole layer (GEMMs, norms, activations: the lowering's LayerSetting gets
// seq_len / cp), and attention, the only part that mixes tokens, exchanges keys and values
// between them. docs/context-parallelism.md has the formulas and sources.
//
// - ring (Megatron-LM's --cp-comm-type p2p, Transformer Engine's AttnFuncWithCPAndKVP2P;
//   Liu et al., "Ring Attention", arXiv:2310.01889): cp steps around the cp group's ring. Step i
//   computes one block of attention (the rank's queries against the keys and values it holds)
//   while the KV block for step i + 1 is sent to the ring's next rank and received from the
//   previous one (cp - 1 exchanges of ring_kv_bytes). With a causal mask the sequence is cut in
//   2 cp chunks and rank r holds chunks r and 2cp - 1 - r (Megatron's get_batch_on_this_cp_rank),
//   which gives every rank the same work at every step (ring_attention_pairs). The backward runs
//   the ring again: step 0 sends KV, steps 1 .. cp-2 send KV and the partial dKV, step cp - 1
//   sends dKV only (cp exchanges; 2 (cp - 1) KV-sized messages in all), dKV arriving back at its
//   owner after the last step.
// - ulysses (DeepSpeed-Ulysses, Jacobs et al., arXiv:2309.14509; Megatron's a2a): all-to-alls
//   over the cp group turn sequence sharding into head sharding for attention: q, k and v each
//   in one all-to-all before attention, the output in one after it (backward: dO before, dQ,
//   dK, dV after); attention runs on the whole sequence with heads / cp (and kv_heads / cp).
// - allgather (Megatron's --cp-comm-type all_gather, TE's AttnFuncWithCPAndKVAllGather): the
//   KV of the whole sequence is all-gathered over the cp group before attention and dKV
//   reduce-scattered after its backward.
//
// Simplifications: TE computes the steps after the diagonal as the [2c x c] or [c x 2c] block
// of unmasked pairs (c = seq / 2cp); each ring step is costed as the causal local block [2c x
// 2c], which has the same attention FLOPs (attention_flops counts the unmasked half; the tests
// check the equality with ring_attention_pairs) and the same model FLOPs share as attention
// without cp. The KV receive buffers (two KV blocks forward, two KV + dKV blocks backward) are
// held as activations from the first exchange of a layer's attention to its end.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "strategies/transformer.hpp"

namespace stratasim::strategies {

enum class CpMode : std::uint8_t { ring, ulysses, allgather };
/// "ring", "ulysses", "allgather".
std::string_view name_of(CpMode m);
std::optional<CpMode> cp_mode_from_name(std::string_view name);

struct ContextParallel {
  int cp = 1;
  CpMode mode = CpMode::ring;
};

/// The (query, key) pairs rank `rank` of `cp` computes at ring step `step` (0 .. cp-1) for one
/// head of a sequence of `seq` tokens, as Transformer Engine runs the ring: at step i the rank
/// holds the KV of rank (rank - i) mod cp. `load_balanced` (TE with a causal mask): the
/// sequence is cut in 2 cp chunks of c tokens and rank r holds chunks r and 2cp - 1 - r; step
/// 0 is the causal diagonal of the two chunks (2 c^2 pairs: two half blocks and the full block
/// of chunk 2cp-1-r against chunk r), a step with KV from a lower rank both query chunks against
/// its first KV chunk, one from a higher rank the second query chunk against both KV chunks
/// (2 c^2 each). Otherwise contiguous chunks of seq / cp tokens: the diagonal half, a lower
/// rank's KV whole, a higher rank's none. Without `causal` every step is the whole block.
/// Half blocks count c^2 / 2 (attention_flops' convention).
double ring_attention_pairs(std::int64_t seq, int cp, int rank, int step, bool causal,
                            bool load_balanced);

/// Bytes of one ring step's KV message (per rank): the keys and values of the rank's tokens
/// and heads, 2 * batch * seq_kv * kv_heads * head_dim * dtype size of the local attention
/// kernel (seq_kv = seq / cp, kv_heads per tensor-parallel rank): 2 b (s / cp) kv_hidden e / tp.
Bytes ring_kv_bytes(const Attention& local);

/// Bytes of the Ulysses all-to-alls of one attention of the local kernel `local` (nccl-tests
/// size: a rank's whole buffer, of which (cp - 1) / cp leaves it): q and the output
/// b (s / cp) heads d e each, k and v b (s / cp) kv_heads d e each.
struct UlyssesBytes {
  Bytes q, k, v, out;
};
UlyssesBytes ulysses_bytes(const Attention& local);

/// `plan` with its attention run context-parallel over `cp` ranks (see above): every fused
/// Attention kernel (of the local shape, seq / cp tokens) is cut out of its compute segment and
/// replaced by cp_mode's steps on TpAxis::cp (ring: Segment::ring_step; the steps on chains
/// above those the plan uses, so that each exchange overlaps the block before it). cp = 1
/// returns `plan` unchanged. Throws std::invalid_argument when a plan's attention is not fused
/// (context parallelism needs flash attention, as Transformer Engine does).
StagePlan context_parallel(const StagePlan& plan, const ContextParallel& cp);

}  // namespace stratasim::strategies
