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

}  // namespace stratasim::strategies
