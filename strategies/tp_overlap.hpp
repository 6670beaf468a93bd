// Merak's sub-pipelined tensor parallelism (Lai et al., "Merak: An Efficient Distributed DNN
// Training Framework with Automated 3D Parallelism for Giant Foundation Models",
// arXiv:2206.04959; parallelism.tp_overlap = k). Megatron's tensor parallelism puts a collective
// on the critical path after every row-parallel GEMM: the next block's compute needs its result,
// so the compute stream idles while the tp stream works. Splitting each microbatch into k
// sub-batches along the batch dimension breaks that dependency across sub-batches: while
// sub-batch j's collective of a block runs, sub-batch j + 1 computes the same block.
//
// As a pass over stage plans: a pass (forward, backward or weight) is cut into blocks, a block
// being the compute segments up to and including the next collective (the compute after the
// last collective is a block of its own). The result issues, block by block, every sub-batch's
// copy of the block: for block i, for j in 0..k-1, compute_i(j) then collective_i(j). Copy j of
// every segment is on chain j (Segment::chain): it waits for the previous segment of its own
// sub-batch and for the op before it on its stream. With a typical tensor-parallel forward,
// compute c0, all-reduce a0, compute c1, a1, ..., and k = 2, the streams run
//   compute stream: c0(0) c0(1) c1(0) c1(1) c2(0) ...
//   tp stream:            a0(0) a0(1) a1(0) a1(1) ...
// a0(0) waits only for c0(0) and so runs while c0(1) computes; c1(0) waits for a0(0) (its
// chain) and c0(1) (its stream). Each collective is hidden behind the other sub-batch's compute
// of the same block, up to the difference in their durations; what remains exposed is the
// first compute and the last collective of each pass. The price: k times as many ops, kernels
// on 1/k of the tokens (less efficient GEMMs) and k times the collective latency.
#pragma once

#include "strategies/transformer.hpp"

namespace stratasim::strategies {

/// The plan of one microbatch run as `k` sub-batches interleaved block by block (see above).
/// `sub` is the plan of the same stage lowered for micro_batch / k, so its kernels' shapes, its
/// activations and its collectives' bytes are one sub-batch's; it must use chain 0 only.
/// - forward, backward and weight are each interleaved: k x as many segments, copy j on chain j,
///   in each block the copies in sub-batch order.
/// - activation_delta, checkpoint_delta and checkpoint_fetch are per copy (each sub-batch stores
///   and fetches its own tensors), so over the k copies they sum to the full microbatch's.
/// - grads_done only on copy k - 1 of the segment that had them: the copies of a compute
///   segment run in order on the compute stream, so the last one ends after every sub-batch's
///   contribution to those gradients.
/// - recompute flags and layer ranges are kept; labels get " [sub j]".
/// - parameters and grad_units do not depend on the batch and are `sub`'s; boundary_bytes is the
///   full microbatch's (k x sub.boundary_bytes): the stage still sends one activation per
///   microbatch, once every chain has ended.
/// k = 1 returns `sub` unchanged. Throws std::invalid_argument for k < 1 or a plan that already
/// uses chains.
StagePlan sub_pipeline(const StagePlan& sub, int k);

/// plan_transformer_stage() for sub-pipelined tensor parallelism: lowers the stage for
/// setting.micro_batch / k samples and interleaves k copies with sub_pipeline(). Throws
/// std::invalid_argument unless k >= 1 divides setting.micro_batch.
StagePlan plan_transformer_stage_sub_pipelined(const TransformerModel& model,
                                               const LayerSetting& setting, int stage, int stages,
                                               int layer_begin, int layer_end,
                                               const StageRecompute& recompute, int k);

// ---- Transformer Engine's userbuffers overlap (Megatron-LM --tp-comm-overlap;
// parallelism.tp_comm_overlap).
//
// With sequence parallelism every layer gathers its input before a column-parallel GEMM (qkv,
// fc1) and reduce-scatters the output of a row-parallel GEMM (proj, fc2), and the backward does
// the mirror image. Transformer Engine (transformer_engine/pytorch/module/base.py,
// initialize_ub; common/comm_gemm_overlap) splits each such GEMM into tp chunks along the
// tokens and pipelines it with the collective: an all-gather as a ring exchange (the GEMM of
// the rank's own shard starts at once; each of the n - 1 ring steps brings the next shard while
// the previous one's GEMM runs), a reduce-scatter as a pipeline (chunk i is reduced while chunk
// i + 1 computes). What stays exposed is what the GEMM chunks cannot cover (a gather's steps
// longer than the chunks beside them, the last reduced chunk); the rest runs beside the GEMM
// chunks, which the simulator slows for the SMs and device memory the communication takes
// (hw_models/interference.hpp).
//
// As a pass over stage plans (n = chunks, the tp size; a segment waits for the previous
// segment of its chain and the op before it on its stream):
// - an all-gather on the tp axis followed by a compute segment whose first kernel is a GEMM:
//   the GEMM becomes n GEMMs of 1/n of the tokens (m, or k for a "*.wgrad" GEMM), the gather
//   n - 1 all-gathers of 1/(n - 1) of its bytes (a ring step: each rank receives one shard,
//   S / n, as a ring all-gather of S / (n - 1) moves). Chunk 0 runs on chain n after the
//   segment before it (no step: the rank's own shard); step 1 and chunk 1 on chain 0 (after
//   that segment, which made the shard step 1 sends); step j and chunk j >= 2 on chain j. The
//   steps run back to back on the tp stream, chunk j waits for step j;
// - a reduce-scatter on the tp axis after a compute segment whose last kernel is a GEMM (and
//   that is not that one GEMM split at its front) becomes GEMM chunk j then reduce-scatter
//   chunk j (1/n of the bytes), on chain n - 1 - j, so the last of each is on chain 0 and what
//   follows on chain 0 waits for them all;
// - a lone GEMM between a tp all-gather and a tp reduce-scatter (the backward's weight-gradient
//   GEMM after its input's regather, before the data gradient's reduce-scatter, which does not
//   need it: TE's bulk overlap) is split at its front as above, and the reduce-scatter runs
//   whole on chain 0 after GEMM chunk 1, beside the chunks after it;
// - the rest of a split compute segment stays one segment on chain 0 between the chunks; where
//   nothing is left after the front chunks, an empty compute segment on chain 0 joins the
//   chains (it waits for every chunk through the compute stream's order). The segment's
//   checkpoint_fetch goes to its first piece, its activation and checkpoint deltas, grads_done
//   and weight_grad_bytes to its last compute piece.
// Simplifications: a ring step is costed as an all-gather over the tp group (its latency is the
// collective's n - 1 steps, not one; its bandwidth time, S / n over the link, is the step's),
// and a reduce-scatter chunk as a reduce-scatter of 1/n of the bytes, rather than TE's
// point-to-point transfers over copy engines or a few SMs; TE's bulk overlap of the input's
// regather with the dgrad GEMM is taken as the ring exchange of the regather with the wgrad
// GEMM after it (the GEMM next to it); the SMs the communication holds are the cluster's
// interference.communication_units (under collectives.max_channels), not TE's per-GEMM num_sm;
// GEMM chunks are costed as GEMMs of their own shape (the kernel model's tile and wave
// quantisation included), so small chunks can cost more than the overlap saves, as they do on
// GPUs. Needs 1D tensor parallelism with sequence parallelism; plans on other chains are
// rejected.

/// `plan` with its tensor-parallel all-gathers and reduce-scatters pipelined with their GEMMs in
/// `chunks` pieces (see above). chunks = 1 returns `plan` unchanged. Throws
/// std::invalid_argument for chunks < 1 or a plan that already uses chains.
StagePlan tp_comm_overlap(const StagePlan& plan, int chunks);

}  // namespace stratasim::strategies
