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

#include <cstdint>

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
// the mirror image. Transformer Engine (transformer_engine/pytorch/module/base.py, initialize_ub
// and its default per-GEMM configs; common/comm_gemm_overlap/comm_gemm_overlap.cpp) overlaps
// each with the GEMM beside it, by one of three methods:
// - ring_exchange (qkv_fprop, fc1_fprop: the gather before the GEMM; proj_dgrad, fc2_dgrad: the
//   output gradient's gather): the GEMM in tp chunks along the tokens; the chunk of the rank's
//   own shard starts at once while tp - 1 ring steps bring the others, step j a point-to-point
//   send of one shard to the ring successor and receive from the predecessor (userbuffers_send /
//   recv, with use_ce through the copy engines: num_sm 1, no SM margin for the GEMM), chunk j
//   waiting for step j (CommOverlapP2PBase::split_overlap_ag);
// - pipeline (proj_fprop, fc2_fprop: the reduce-scatter after the GEMM): the GEMM in num_splits
//   = 4 chunks, chunk j's output reduce-scattered by a userbuffers kernel on num_sm = 16 SMs
//   while chunk j + 1 computes (CommOverlapBase::split_overlap_rs);
// - bulk (qkv_dgrad, fc1_dgrad: the regather of the layer's sequence-parallel input, which the
//   wgrad GEMM needs, beside the dgrad GEMM; qkv_wgrad, fc1_wgrad: the dgrad output's
//   reduce-scatter beside the wgrad GEMM): the whole collective by a userbuffers kernel on 16
//   SMs beside the whole GEMM (CommOverlapBase::bulk_overlap). proj_wgrad and fc2_wgrad
//   ("external") reuse the ring exchange's gathered gradient: no communication of their own.
// What stays exposed is what the GEMM beside cannot cover (the last pipeline chunk's
// reduce-scatter, ring steps longer than their chunks, a bulk collective longer than its GEMM);
// the GEMMs beside SM-driven transfers lose the SMs they hold (hw_models/interference.hpp),
// those beside the copy-engine ring steps only device-memory bandwidth.
//
// As a pass over stage plans (n = chunks, the tp size; a segment waits for the previous
// segment of its chain and the op before it on its stream):
// - ring_exchange: an all-gather on the tp axis followed by a compute segment whose first
//   kernel is a GEMM (and that is not a bulk regather, below): the GEMM becomes n GEMMs of 1/n
//   of the tokens (m, or k for a "*.wgrad" GEMM) and the gather n - 1 ring steps
//   (Segment::ring_step, lowered as a Send and a Recv of one shard, gather bytes / n, sms 0:
//   point-to-point latency and bandwidth, not a collective's). Chunk 0 runs on chain n after
//   the segment before it (no step: the rank's own shard); step 1 and chunk 1 on chain 0 (after
//   that segment, which made the shard step 1 sends); step j and chunk j >= 2 on chain j. The
//   steps run back to back on their streams, chunk j waits for step j;
// - pipeline: a reduce-scatter on the tp axis after a compute segment whose last kernel is a
//   GEMM becomes, for j < kTePipelineSplits, GEMM chunk j then reduce-scatter chunk j (1/4 of
//   the bytes, kTeCommSms SMs) on chain 3 - j, so the last of each is on chain 0 and what
//   follows on chain 0 waits for them all;
// - bulk: a compute segment ending with a GEMM (the dgrad), a tp all-gather (the regather), a
//   segment of one GEMM (the wgrad) and a tp reduce-scatter: the regather whole on chain 0
//   (kTeCommSms SMs) beside the dgrad GEMM, split off on chain n + 1; the wgrad GEMM on chain 0
//   (after the regather and, through the compute stream, the dgrad); the reduce-scatter whole
//   on chain n + 1 (after the dgrad) beside it, and an empty compute segment on chain n + 1
//   after the reduce-scatter, which what follows waits for through the compute stream;
// - the rest of a split compute segment stays one segment on chain 0 between the chunks; where
//   nothing is left after the front chunks, an empty compute segment on chain 0 joins the
//   chains. The segment's checkpoint_fetch goes to its first compute piece, its activation and
//   checkpoint deltas, grads_done and weight_grad_bytes to its last (the dgrad with bulk).
// Simplifications: a pipeline chunk's reduce-scatter and a bulk collective are costed as
// collectives of their bytes over the tp group (the network's algorithm and latency, not the
// userbuffers kernel's); the copy-engine ring steps move device memory as any transfer does
// (interference.memory_traffic_per_byte); TE's SM margin (the GEMM launched on SMs - num_sm
// for its whole duration) is taken as the interference model's f_sm while the transfer runs;
// GEMM chunks are costed as GEMMs of their own shape (the kernel model's tile and wave
// quantisation included), so small chunks can cost more than the overlap saves, as they do on
// GPUs. Needs 1D tensor parallelism with sequence parallelism; plans on other chains are
// rejected. The lowering emits every tp rank (no tensor-parallel mirroring: a ring step's
// messages go to other tp ranks).

/// Transformer Engine's defaults (base.py, initialize_ub, get_default_config): the pipeline
/// method's num_splits, the SMs of the pipeline and bulk methods' userbuffers kernels
/// (num_sm), and those of the ring exchange's copy-engine transfers (use_ce: none).
inline constexpr int kTePipelineSplits = 4;
inline constexpr std::int16_t kTeCommSms = 16;
inline constexpr std::int16_t kTeRingSms = 0;

/// `plan` with its tensor-parallel all-gathers and reduce-scatters pipelined with their GEMMs in
/// `chunks` pieces (see above). chunks = 1 returns `plan` unchanged. Throws
/// std::invalid_argument for chunks < 1 or a plan that already uses chains.
StagePlan tp_comm_overlap(const StagePlan& plan, int chunks);

}  // namespace stratasim::strategies
