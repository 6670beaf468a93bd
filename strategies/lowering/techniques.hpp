// The techniques of the pipeline assembly, each a TechniqueHook (strategies/lowering/hooks.hpp).
// assemble_pipeline installs, in this order, those a PipelineSpec asks for:
//
//   PipelineScatterGather  spec.pipeline_scatter_gather
//   ActivationOffload      spec.zero.offload_activations
//   FsdpRuntime            spec.fsdp (PyTorch FSDP): replaces the next four
//   Zero3ParameterFetch    spec.zero.stage == 3
//   CompressedGradients    spec.grad_compression enabled, ZeRO stage 0, dp group > 1
//   DataParallelAllReduce  otherwise with ZeRO stage 0 and a dp group > 1
//   ZeroGradientSync       spec.zero.stage >= 1
//   ExpertGradientSync     spec.moe (mixture of experts) with ZeRO stage 0 or 1
//   EmbeddingSync          tied embeddings split over two devices (Communicators)
//   LossScaleCheck         spec.loss_scaling is not none (fp16's dynamic or static scaling)
//   GradientClipping       spec.grad_clip > 0
//   HostOverhead           spec.step_overhead or spec.microbatch_overhead > 0
//   OptimizerOffload       spec.zero.offload_optimizer; otherwise DeviceOptimizerStep
//
// Every hook says below what it issues at which moment. Bytes are per rank; "e" is the size of
// the training dtype, "g" the size of the gradient buffers' dtype (PipelineSpec::grad_dtype,
// Assembly::grad_element_size: fp32 with Megatron's bf16 main grads), in which gradients are
// reduced; a shard is ceil(parameters / dp) (Assembly::shard_of). The ZeRO and offload
// semantics are those of ZeroSettings (strategies/lowering/pipeline_spec.hpp); Megatron's
// distributed optimizer is ZeroGradientSync's stage 1 (zero_settings). What the optimizer keeps
// and moves is strategies/optimizer.hpp's table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "strategies/lowering/hooks.hpp"
#include "strategies/lowering/staging.hpp"

namespace stratasim::strategies {

/// Megatron's scatter/gather of pipeline sends (PipelineSpec::pipeline_scatter_gather; Megatron-LM
/// p2p_communication with scatter_gather_tensors_in_pipeline and no sequence parallelism): each
/// tensor-parallel rank sends and receives its 1/tp of the boundary tensor
/// (Assembly::pipeline_message, in RankEmitter's sends and receives), then
/// input_received: an all-gather of the boundary bytes over the rank's tensor-parallel group
///   (tp-comm stream, the pass's phase and microbatch, "pipeline all-gather", after the
///   receive; Megatron's gather_split_1d_tensor) replaces the receive as the pass's input.
class PipelineScatterGather : public TechniqueHook {
 public:
  explicit PipelineScatterGather(Assembly& assembly);
  OpCount count_pass(const Pass&) const override { return {1, 0}; }
  void input_received(RankEmitter&, const PassState&, Bytes boundary,
                      std::vector<OpId>& input) override;

 private:
  Assembly& assembly_;
  std::uint32_t label_;
};

/// Activation checkpoints wait on the host (ZeRO-R's offloaded checkpoints).
/// before_segment: a segment with a checkpoint_fetch first issues its copy back from the host
///   (copy stream, Phase::recompute, label "checkpoint from host", device +fetch, host -fetch),
///   waiting for the pass's op before the previous one (one op to hide it behind); the
///   segment waits for the copy.
/// after_segment: a segment storing a checkpoint (checkpoint_delta > 0) is followed by its copy
///   to the host (copy stream, "checkpoint to host", host +delta, device -delta).
/// Checkpoints on their way out are staged through a pool of one (StagingPool): a segment
/// storing a checkpoint first waits for the previous one's copy (DeepSpeed's cpu_checkpointing
/// copies each partition with a blocking .cpu(); here the compute stream runs on until the
/// next checkpoint), so copies never pile up on the device behind a slow PCIe link.
class ActivationOffload : public TechniqueHook {
 public:
  explicit ActivationOffload(Assembly& assembly);
  void rank_begins(RankEmitter&) override;
  void before_segment(RankEmitter&, const PassState&, SegmentState&) override;
  void after_segment(RankEmitter&, const PassState&, const SegmentState&, OpId) override;

 private:
  std::uint32_t out_label_, in_label_;
  StagingPool staged_{1};
};

/// ZeRO-3: each gradient unit's parameters gathered before each use and released after it, and
/// the parameter offload (ZeRO-Infinity) around it.
/// chunk_held: with offload_params, the parameter shard (shard * parameter bytes) on the host
///   (or NVMe).
/// rank_begins: lists the rank's uses (parameter_uses of every pass in issue order) and issues
///   the first 1 + prefetch_layers fetches. A fetch of use j waits for the release of use
///   j - prefetch_layers - 1 (with DeepSpeed's prefetch bucket or live-parameter limit, the use
///   ZeroSettings says): with offload_params a copy of the unit's shard to the device (copy
///   stream, "param fetch <unit>"), then with dp > 1 an all-gather of the unit (dp-comm stream,
///   "param all-gather <unit>", +e * parameters, the copied shard freed). Fetches have
///   Phase::forward for forward and recompute passes, Phase::backward for backward ones, the
///   microbatch of the pass using them and the unit's layer (GradUnit::layer).
///   ZeRO++ (ZeroSettings): with qwZ the all-gather is "param all-gather (int8) <unit>" of
///   dp x zeropp_quantized_bytes(shard, 8) bytes (DType::fp8), preceded by "param quantize
///   <unit>" (the shard to int8, +its bytes comm_buffers) and followed by "param dequantize
///   <unit>" (+e * parameters, the gathered int8 freed), all on the dp-comm stream; with hpZ the
///   fetches of recompute and backward passes gather "param all-gather (hpz[ int8]) <unit>"
///   over the rank's hpZ group (Communicators::hpz) from the secondary partition (held from the
///   start: DeviceModelStates::hpz_secondary), without a quantise kernel.
/// before_segment: a segment first using a unit waits for its fetch (issued now if not yet);
///   a segment last computing with it releases e * parameters.
/// after_segment: records the releases and issues the fetches they allow.
/// after_optimizer_step: the updated shard to where parameters live when not written in place:
///   host to device (optimizer offload only), device to host or NVMe (parameter offload only),
///   host to NVMe (both, with nvme; on the host stream).
class Zero3ParameterFetch : public TechniqueHook {
 public:
  explicit Zero3ParameterFetch(Assembly& assembly);
  OpCount count_pass(const Pass& pass) const override;
  void chunk_held(RankEmitter&, int chunk) override;
  void rank_begins(RankEmitter&) override;
  void before_segment(RankEmitter&, const PassState&, SegmentState&) override;
  void after_segment(RankEmitter&, const PassState&, const SegmentState&, OpId) override;
  void after_optimizer_step(RankEmitter&, std::size_t slot, OpId step) override;

 private:
  struct Units {  // per template
    std::vector<Use> forward_uses, backward_uses, recompute_uses;
    std::vector<std::uint32_t> gather_label, fetch_label, fetch_kernels;  // per unit
    // ZeRO++, per unit: hpZ's gather label; qwZ's labels and kernels.
    std::vector<std::uint32_t> secondary_label, quantize_label, dequantize_label, quantize_kernels,
        dequantize_kernels, secondary_dequantize_kernels;
    std::uint32_t params_back = 0, params_back_label = 0;
    bool params_back_needed = false;
  };
  const std::vector<Use>& uses_of(const Pass& pass) const;
  void make_params_back(Units& units, std::int64_t shard);
  void emit_fetch(RankEmitter& rank);
  OpId emit_quantized_gather(RankEmitter& rank, OpInfo info, const Units& units, std::size_t u,
                             std::int64_t parameters, bool secondary);
  void try_prefetch(RankEmitter& rank);

  Assembly& assembly_;
  bool fetching_;  // dp > 1 or parameter offload: every unit is fetched before each use
  bool hpz_;       // ZeRO++'s hpZ: a secondary partition serves recompute and backward gathers
  std::size_t ahead_;
  MemoryTier offload_tier_;
  std::vector<Units> units_;
  const std::vector<Use> no_uses_;
  // The rank's uses: offsets of each pass's first use, per use its fetch and its release.
  std::vector<std::size_t> pass_offset_;
  std::vector<OpId> fetched_, released_, fetch_deps_;
  /// Per use, the use whose release its fetch waits for (-1: none): j - prefetch_layers - 1,
  /// or as ZeroSettings::prefetch_bucket_size and max_live_parameters say.
  std::vector<std::ptrdiff_t> wait_;
  void plan_waits(const std::vector<std::int64_t>& parameters);
  std::size_t next_fetch_ = 0;
};

/// PyTorch FSDP's runtime (PipelineSpec::fsdp, strategies/fsdp.hpp), as FSDP's hooks run
/// (torch/distributed/fsdp/_runtime_utils.py). FSDP units: with wrap "block" each layer's
/// gradient units form one unit and every other gradient unit (embedding, final norm, head) the
/// root; with "model" all form the root. A unit's use in a pass spans the segments touching any
/// of its gradient units (parameter_uses, merged); the root's spans the whole pass. A rank's
/// uses, pass after pass, in order of their first segment (the root first), run:
///
///   pre-hook (before the use's first segment): a host op ("fsdp pre-forward hook" or
///     "fsdp pre-backward hook", Measured unit_host_time / 2, host stream); then the unit's
///     all-gather if it is not unsharded yet and not prefetched ("fsdp all-gather <unit>",
///     dp-comm, over the shard group, P x size(param_dtype) bytes, +that much parameter memory);
///     then the prefetch: the next use of the pass with forward_prefetch (forward) or
///     BACKWARD_PRE (backward). The first segment waits for the host op and the gather. A
///     backward use of a sharded unit also allocates its unsharded gradient (P x param bytes,
///     comm_buffers), as FSDP pre-allocates it in the pre-backward hook.
///   post-hook (after the use's last segment): a host op ("... post-... hook"); the unit is
///     freed (-P x param bytes at the end of that segment) unless it stays unsharded: after
///     forward the root and, with SHARD_GRAD_OP, every unit stay until their backward use ends;
///     NO_SHARD never frees. Backward only: with BACKWARD_POST the next use's gather; then the
///     gradients' reduction after the segment and the host op: when reduce_dtype differs from
///     param_dtype first "fsdp gradient cast <unit>" (an elementwise kernel reading
///     P x size(param_dtype) and writing P x size(reduce_dtype), +that much comm_buffers, on the
///     dp-comm stream: FSDP runs it on its post-backward stream ahead of the reduce-scatter),
///     then "fsdp reduce-scatter <unit>" (dp-comm, over the shard group, P x size(reduce_dtype);
///     the gradient and its cast freed after it); with HYBRID_SHARD
///     then "fsdp replica all-reduce <unit>" of the shard over the replicate group (dp-comm:
///     FSDP's own all-reduce stream is not a stream here); with NO_SHARD "fsdp all-reduce
///     <unit>" over the dp group instead.
///
/// limit_all_gathers: every free is queued (the op of the freeing segment); an all-gather issued
/// while kFsdpInflightAllGathers frees are queued first takes the oldest off the queue, and the
/// host op that issues it waits for that op (event.synchronize(): the CPU, and all it issues
/// after, waits for the GPU). Without it the gathers wait for nothing but the host op that
/// issues them. Gathers and reductions share the dp-comm stream in issue order (one NCCL
/// stream per process group), so with NONE a unit's backward gather queues behind the previous
/// unit's reduce-scatter. With dp = 1 (FSDP runs NO_SHARD on one rank) only the host ops run.
class FsdpRuntime : public TechniqueHook {
 public:
  explicit FsdpRuntime(Assembly& assembly);
  OpCount count_pass(const Pass& pass) const override;
  void rank_begins(RankEmitter&) override;
  void before_segment(RankEmitter&, const PassState&, SegmentState&) override;
  void after_segment(RankEmitter&, const PassState&, const SegmentState&, OpId) override;

 private:
  struct Unit {  // an FSDP unit of a template
    std::int64_t parameters = 0;
    std::int16_t layer = -1;  // -1: the root
    bool root = false;
    std::uint32_t gather_label = 0, reduce_label = 0, replica_label = 0, cast_label = 0;
    std::uint32_t cast_kernels = 0;             // the gradient from param_dtype to reduce_dtype
    std::int64_t low_precision_parameters = 0;  // GradUnit's, summed
  };
  struct Units {  // per template
    std::vector<Unit> units;
    std::vector<Use> forward_uses, backward_uses;  // Use::unit: an FSDP unit
  };
  struct RankUse {  // one use of the rank, in issue order
    std::size_t tmpl = 0;
    int unit = 0;
    bool backward = false;
    bool gathers = false;  // not unsharded when the use begins
    bool frees = false;    // freed when it ends
    std::optional<OpId> gather;
  };
  const std::vector<Use>& uses_of(const Pass& pass) const;
  void gather_if_needed(RankEmitter& rank, std::size_t j, OpId host, const Pass& pass);
  OpId host_op(RankEmitter& rank, std::uint32_t label, std::vector<std::size_t>& gathers,
               const Pass& pass, int layer);
  void reduce(RankEmitter& rank, const RankUse& use, OpId done, OpId host, int microbatch);
  void pre_hook(RankEmitter& rank, const PassState& ps, std::size_t j, SegmentState& seg);
  void post_hook(RankEmitter& rank, const PassState& ps, std::size_t j, OpId op);

  Assembly& assembly_;
  const FsdpSpec& fsdp_;
  bool collectives_;  // dp > 1
  std::uint32_t hook_kernels_ = 0;
  std::uint32_t pre_forward_label_, post_forward_label_, pre_backward_label_, post_backward_label_;
  std::vector<Units> units_;
  // The rank's uses: offsets of each pass's first use, every use, the queued frees.
  std::vector<std::size_t> pass_offset_;
  std::vector<RankUse> uses_;
  std::deque<OpId> frees_;
  std::vector<std::size_t> pending_;  // scratch: gathers a host op issues
};

/// Compressed data-parallel gradient synchronisation (PipelineSpec::grad_compression): the dense
/// all-reduce's buckets (bucket_units by dp_bucket_size bytes), each running compressed_sync()'s
/// steps (labels "dp grad <step> bucket <i>[ chunk <c>]").
/// chunk_held: top-k's error-feedback residual of every bucket as gradients.
/// after_segment: with dp_overlap, in the chunk's last gradient pass, a bucket whose last unit
///   the segment completes issues its head (the steps up to its first collective).
/// gradients_complete: the heads not issued yet (after the chunk's last gradient pass), then
///   the remaining steps of every bucket in order.
class CompressedGradients : public TechniqueHook {
 public:
  explicit CompressedGradients(Assembly& assembly);
  OpCount count_chunk(int chunk) const override;
  void chunk_held(RankEmitter&, int chunk) override;
  void rank_begins(RankEmitter&) override;
  void after_segment(RankEmitter&, const PassState&, const SegmentState&, OpId) override;
  void gradients_complete(RankEmitter&, std::size_t slot) override;

 private:
  struct Sync {
    UnitBucket bucket;
    CompressedSync sync;
    std::vector<std::uint32_t> kernels;  // per step (compute steps)
    std::size_t head = 0;
  };
  struct Buckets {  // per template
    std::vector<Sync> syncs;
    std::vector<int> of_unit;
    Bytes residual;
  };
  OpId emit_sync(RankEmitter& rank, const Sync& b, std::size_t begin, std::size_t end, OpId dep,
                 const std::string& suffix);

  Assembly& assembly_;
  std::vector<Buckets> buckets_;
  std::vector<std::vector<OpId>> head_;  // per chunk held and bucket: its head's last op
};

/// ZeRO stage 0: the gradient buffers (g bytes per parameter, in their dtype) all-reduced over
/// the dp group in buckets of dp_bucket_size bytes (DDP / Megatron overlap_grad_reduce).
/// gradients_complete: per bucket an all-reduce (dp-comm, "dp grad all-reduce bucket <i>[ chunk
///   <c>]", with its units' layer range: UnitBucket::layer_begin) after the op completing its last
///   unit in the chunk's last gradient pass (dp_overlap), or after that pass.
class DataParallelAllReduce : public TechniqueHook {
 public:
  explicit DataParallelAllReduce(Assembly& assembly);
  void gradients_complete(RankEmitter&, std::size_t slot) override;

 private:
  Assembly& assembly_;
  std::vector<UnitBuckets> buckets_;  // per template
};

/// Mixture of experts (spec.moe, with an expert-data-parallel group of more than one rank):
/// the routed experts' gradients (GradUnit::expert_parameters; the dense hooks reduce the
/// rest over dp), bucketed as the dense ones are.
/// gradients_complete: ZeRO stage 0, per bucket an all-reduce ("expert grad all-reduce bucket
///   <i>", g bytes per parameter) over Communicators::expert_dp, as DataParallelAllReduce;
///   stage 1 (Megatron's distributed optimizer), a reduce-scatter ("expert grad reduce-scatter
///   bucket <i>"), once the last microbatch has produced the bucket.
/// after_optimizer_step: stage 1, the updated experts all-gathered over the group ("expert param
///   all-gather bucket <i>", e bytes per parameter).
class ExpertGradientSync : public TechniqueHook {
 public:
  explicit ExpertGradientSync(Assembly& assembly);
  void gradients_complete(RankEmitter&, std::size_t slot) override;
  void after_optimizer_step(RankEmitter&, std::size_t slot, OpId step) override;

 private:
  Assembly& assembly_;
  std::vector<UnitBuckets> buckets_;  // per template, of the experts' parameters
};

/// ZeRO stages 1 to 3: gradients (g bytes each, in the buffers' dtype) reduce-scattered in
/// buckets of reduce_bucket_size elements ("grad reduce-scatter bucket <i>", dp-comm, with
/// dp > 1), each bucket's shard copied to the
/// host with optimizer offload ("grad to host bucket <i>", copy stream). With ZeRO++'s qgZ
/// (ZeroSettings::quantized_gradients, stage 3) qgz_sync's steps replace the reduce-scatter,
/// all on the dp-comm stream ("grad <step> bucket <i>"), the all-to-alls on the rank's node
/// and cross-node groups (Communicators::node, cross_node), their buffers comm_buffers.
/// Stages 2 and 3 (with dp > 1 or optimizer offload), every gradient pass, through the rank's
/// staging pool (strategies/lowering/staging.hpp: 2 buffers with dp_overlap, else 1):
///   rank_begins: the pool held from the start (comm_buffers, device): buffers of
///     max(reduce_bucket_size, the largest bucket of the rank's chunks) elements, g bytes each;
///   before_segment: a compute segment completing a bucket's first unit takes a buffer, waiting
///     for the oldest bucket's release when all are taken;
///   after_segment: with dp_overlap, one completing its last unit reduces it;
///   pass_ends: buckets not reduced yet are reduced after the pass.
///   A bucket's buffer is released by its last op: the reduce-scatter, or the copy to the host.
/// Stage 1: gradients_complete reduces every bucket after the op completing its last unit in
///   the last gradient pass (dp_overlap) or after that pass.
/// Stages 1 and 2: after_optimizer_step all-gathers the updated parameters in buckets of
///   allgather_bucket_size elements ("param all-gather bucket <i>", e bytes each), with optimizer
///   offload each bucket's shard first copied to the device ("params to device bucket <i>").
/// With overlap_param_gather (stage 1, Megatron's --overlap-param-gather) the gather buckets
///   are bucket_units of the gradient units by allgather_bucket_size elements, in layer order
///   (the reverse of backward's): rank_begins issues every held chunk's gathers with no
///   dependency (the previous iteration's step precedes this one), before_segment makes the
///   chunk's first forward pass's first segment touching a bucket's units (parameter_uses)
///   wait for that bucket's gather, and after_optimizer_step issues none.
class ZeroGradientSync : public TechniqueHook {
 public:
  explicit ZeroGradientSync(Assembly& assembly);
  OpCount count_pass(const Pass& pass) const override;
  OpCount count_chunk(int chunk) const override;
  void rank_begins(RankEmitter&) override;
  void pass_begins(RankEmitter&, const PassState&) override;
  void before_segment(RankEmitter&, const PassState&, SegmentState&) override;
  void after_segment(RankEmitter&, const PassState&, const SegmentState&, OpId) override;
  void pass_ends(RankEmitter&, const PassState&, OpId last) override;
  void gradients_complete(RankEmitter&, std::size_t slot) override;
  void after_optimizer_step(RankEmitter&, std::size_t slot, OpId step) override;

 private:
  OpId emit_gather(RankEmitter& rank, std::int64_t elements, std::int64_t low, std::uint32_t label,
                   std::span<const OpId> deps);
  struct Bucket {
    UnitBucket units;
    std::uint32_t copy_kernels;  // the reduced shard to the host (optimizer offload)
    std::uint32_t reduce_label, copy_label;
    CompressedSync qgz;  // ZeRO++'s qgZ: the steps replacing the reduce-scatter
    std::vector<std::uint32_t> qgz_kernels, qgz_labels;  // per step
  };
  struct Gather {  // a post-step all-gather bucket
    std::int64_t elements;
    std::uint32_t label, copy, copy_label;
    int first_forward = -1;  // overlap_param_gather: the first forward segment using it
    std::int64_t low = 0;    // of `elements`, FP8 / FP4 linear weights (gathered_weight_bytes)
  };
  struct Buckets {  // per template
    std::vector<Bucket> reduce;
    std::vector<int> of_unit;
    std::vector<Gather> gather;
    std::int64_t largest = 0;  // parameters of the largest reduce bucket
  };
  bool reduces(const PassState& ps, const SegmentState& seg) const;
  OpId emit_bucket(RankEmitter& rank, const Bucket& b, OpId dep, int microbatch);
  std::size_t ops_per_bucket() const;

  Assembly& assembly_;
  bool per_microbatch_;  // stages 2 and 3: every microbatch's gradients through the staging pool
  bool qgz_ = false;     // ZeRO++'s qgZ (quantized_gradients, dp > 1)
  StagingPool pool_;     // the rank's reduce buffers (strategies/lowering/staging.hpp)
  std::vector<Buckets> buckets_;
  std::vector<std::uint8_t> allocated_, emitted_;  // this gradient pass's buckets
  // overlap_param_gather, per chunk held: its gathers, and whether a forward pass has run.
  std::vector<std::vector<OpId>> gathered_;
  std::vector<std::uint8_t> forwarded_;
};

/// Tied embeddings split over the first and last device (Megatron's embedding group).
/// gradients_complete: for the first and last part, an all-reduce of embedding_sync_bytes
///   (in the gradient buffers' dtype; "embedding grad all-reduce", dp-comm) after the chunk's
///   last gradient pass.
class EmbeddingSync : public TechniqueHook {
 public:
  explicit EmbeddingSync(Assembly& assembly);
  void gradients_complete(RankEmitter&, std::size_t slot) override;

 private:
  Assembly& assembly_;
  std::uint32_t label_;
};

/// What LossScaleCheck and GradientClipping read: the gradients the optimizer steps of a device
/// read, per device: the sum over its chunks of StageTemplate::shard (all of a chunk's
/// parameters without ZeRO, the rank's shard with it), in elements.
std::vector<std::int64_t> step_gradients_per_device(const Assembly& assembly);

/// fp16 loss scaling (PipelineSpec::loss_scaling dynamic or static), as Megatron-LM's
/// MixedPrecisionOptimizer does before every step (both kinds run the same kernels; dynamic
/// scaling only changes the scale on the host):
/// before_optimizer_steps: "unscale and check" (compute stream, Phase::optimizer,
///   torch._amp_foreach_non_finite_check_and_unscale_: one pass reading the rank's step
///   gradients G, g bytes each, writing them unscaled and a 4-byte found-inf flag) after
///   RankEmitter::gradients_synchronised(); then, on a grad-stats group of more than one rank
///   (Communicators::grad_stats), an all-reduce of the fp32 flag ("loss scale inf all-reduce",
///   dp-comm, 4 bytes). The last of them becomes the step gate: every step waits for it (the
///   host reads the flag to skip the step on overflow).
class LossScaleCheck : public TechniqueHook {
 public:
  explicit LossScaleCheck(Assembly& assembly);
  void before_optimizer_steps(RankEmitter&) override;

 private:
  std::vector<std::uint32_t> kernels_;  // per device
  std::uint32_t label_, reduce_label_;
};

/// Gradient clipping by global norm (PipelineSpec::grad_clip > 0), as Megatron-LM's
/// clip_grad_norm_fp32 and torch.nn.utils.clip_grad_norm_ do:
/// before_optimizer_steps: "grad norm" (compute stream, Phase::optimizer: multi_tensor_l2norm,
///   reading the rank's step gradients G, g bytes each, writing an fp32 partial sum of squares)
///   after the gradients are synchronised and after the step gate (the loss-scale check); an
///   all-reduce of that fp32 scalar over the grad-stats group ("grad norm all-reduce", dp-comm,
///   4 bytes; none for a group of one rank); then "clip scale" (compute stream: one elementwise
///   pass multiplying the gradients by max_norm / norm, reading and writing G g bytes, as
///   multi_tensor_scale does; Megatron skips it when the norm is below the max, torch always
///   runs it: modelled always, not fused into the step). The scale becomes the step gate.
class GradientClipping : public TechniqueHook {
 public:
  explicit GradientClipping(Assembly& assembly);
  void before_optimizer_steps(RankEmitter&) override;

 private:
  std::vector<std::uint32_t> norm_, scale_;  // per device
  std::uint32_t norm_label_, reduce_label_, scale_label_;
};

/// The framework's host time around the kernels (PipelineSpec::step_overhead,
/// microbatch_overhead), as Measured work on the rank's host stream, which runs in order:
/// rank_begins: "step overhead (host)" (Phase::other) when step_overhead > 0: data loading, the
///   Python training loop, the optimizer's host-side launches of one iteration;
/// pass_begins: for a forward or backward pass, "microbatch overhead (host)" when
///   microbatch_overhead > 0 (the framework's per-pass host work: autograd, hooks, launches);
/// before_segment: the first segment after one of these waits for it. The host runs ahead of
///   the device: the overheads add to the iteration time where the device would otherwise
///   wait on them (always for step_overhead, which precedes every op of the iteration).
class HostOverhead : public TechniqueHook {
 public:
  explicit HostOverhead(Assembly& assembly);
  OpCount count_pass(const Pass& pass) const override;
  OpCount count_chunk(int chunk) const override;
  void rank_begins(RankEmitter&) override;
  void pass_begins(RankEmitter&, const PassState&) override;
  void before_segment(RankEmitter&, const PassState&, SegmentState&) override;

 private:
  std::optional<std::uint32_t> step_, microbatch_;  // kernel lists
  std::uint32_t step_label_ = 0, microbatch_label_ = 0;
  std::optional<OpId> pending_;  // the host op the next segment waits for
};

/// Data parallelism with parameter servers (PipelineSpec::parameter_servers = S > 0;
/// docs/parameter-server.md). Workers are the layout's ranks (tp = pp = 1), servers the S ranks
/// after them. The messages are per unit: a gradient unit with parameters (a layer of a layer
/// table or a transformer, the embedding, the head), or with PipelineSpec::ps_slice_parameters
/// = P > 0 each of its slices (a unit of more than P parameters is cut into ceil(params / P)
/// slices of P, the last one smaller: P3's parameter slicing, Jayarajan et al., SysML 2019).
/// Units, in backward order (a unit's slices in order), each belong to one server: the largest
/// first, each to the server holding the fewest parameters so far (ties: the lowest server; with
/// equal slices, round-robin). Per unit u of P parameters (units of zero parameters have none):
/// - worker, gradients_complete: "ps push <unit>", a detached Send (strategies::Send::detached:
///   several pushes in flight at once, ordered by the links' scheduling) of P g bytes (g: the
///   gradient buffers' element size) to u's server on the dp-comm stream, Phase::other, u's
///   layer range (-1 for a unit that is no layer), after the op completing u's gradient unit in
///   the last gradient pass (with dp_overlap; else after the last backward op); then, once
///   every unit is pushed, in forward order (the reverse of the units' order: the order the next
///   forward needs them), "ps pull <unit>", a Recv of P e bytes (e: the parameters' element
///   size) from the server on the pp-recv stream (so that pulls do not hold up the pushes),
///   Phase::optimizer (it updates the worker's parameters: the next iteration's forward of u's
///   layers waits for it, strategies/iterations.hpp), u's layer range.
/// - optimizer_step: returns the chunk's last pull (the workers run no optimizer).
/// - server (emit_servers, after every worker): an event-driven rank (Program::event_driven: it
///   handles each push as it arrives, whatever order the network delivers them in); initial
///   memory, its units' parameters (P e), gradient sum (P g) and optimizer states
///   (optimizer_state_bytes); per unit in the workers' push order, a Recv of the push from every
///   worker in worker order on its pp-recv stream ("ps receive <unit>", each taking P g bytes of
///   comm_buffers when its data has arrived), then "ps update <unit>" on the compute stream,
///   Phase::optimizer, after the W receives: an elementwise sum of the W pushes (P W elements,
///   P W g bytes read, P g written) and the optimizer step of P parameters (as
///   DeviceOptimizerStep costs it), releasing the W buffers at its end; then per unit in the
///   workers' pull order, after its update, a detached Send of P e bytes to every worker in
///   worker order on the dp-comm stream ("ps send <unit>", Phase::optimizer). Program order puts
///   every receive before every send, so an executor running it in order cannot deadlock.
/// Every Send of the strategy is on the dp-comm stream and carries the unit's layer range.
class ParameterServer : public TechniqueHook {
 public:
  explicit ParameterServer(Assembly& assembly);
  OpCount count_chunk(int chunk) const override;
  void gradients_complete(RankEmitter&, std::size_t slot) override;
  std::optional<OpId> optimizer_step(RankEmitter&, std::size_t slot) override;
  /// Emits the server ranks; call once, after every worker rank.
  void emit_servers();

  /// The server (0 .. servers - 1) of each gradient unit of `units` (-1 for a unit without
  /// parameters), the rule above.
  static std::vector<int> assign_units(const std::vector<GradUnit>& units, int servers);
  /// `units` with every unit of more than `slice` parameters cut into slices (the rule above;
  /// slice <= 0: unchanged). A slice is named "<unit> slice k/n" and keeps its unit's layer.
  static std::vector<GradUnit> slice_units(const std::vector<GradUnit>& units, std::int64_t slice);

 private:
  struct Unit {
    std::int64_t parameters = 0;
    int server = -1;
    std::size_t grad_unit = 0;  // index of its gradient unit in the stage plan's grad_units
    std::int16_t layer_begin = -1, layer_end = -1;
    std::uint32_t push_label = 0, pull_label = 0, receive_label = 0, update_label = 0,
                  send_label = 0, update_kernels = 0;
  };
  OpInfo info(const Unit& u, Stream stream, Phase phase, std::uint32_t label) const;
  static Send detached(std::int32_t peer, Bytes bytes);
  void emit_server(int server);

  Assembly& assembly_;
  std::vector<Unit> units_;  // the template's gradient units or their slices, backward order
  std::optional<OpId> last_pull_;
};

/// The optimizer step on the device: spec.optimizer over the chunk's shard (a kernel named as
/// the optimizer, "adam", "rmsprop", ...; fp32_grads with fp32 gradient buffers or the fp32
/// gradient copy; compute stream, Phase::optimizer, "optimizer step") after the last op on the
/// dp-comm stream, or after the last gradient pass when there is none.
class DeviceOptimizerStep : public TechniqueHook {
 public:
  explicit DeviceOptimizerStep(Assembly& assembly);
  std::optional<OpId> optimizer_step(RankEmitter&, std::size_t slot) override;

 private:
  std::vector<std::uint32_t> kernels_;  // per template
  std::uint32_t label_;
};

/// ZeRO-Offload: the optimizer step on the host.
/// chunk_held: fp32 gradients of the shard (4 bytes each) on the host, the optimizer states of
///   the shard (optimizer_state_bytes) on the host (or NVMe).
/// optimizer_step: "cpu <optimizer>" ("cpu adam") on the host stream ("optimizer step (host)")
/// after the last ops of
///   the dp-comm and copy streams; with nvme the states are read before it and written after
///   it ("optimizer states from nvme", "optimizer states to nvme").
class OptimizerOffload : public TechniqueHook {
 public:
  explicit OptimizerOffload(Assembly& assembly);
  void chunk_held(RankEmitter&, int chunk) override;
  std::optional<OpId> optimizer_step(RankEmitter&, std::size_t slot) override;

 private:
  struct Kernels {  // per template
    std::uint32_t step = 0, states_in = 0, states_out = 0;
  };
  Assembly& assembly_;
  std::vector<Kernels> kernels_;
  std::uint32_t label_, states_in_label_ = 0, states_out_label_ = 0;
};

}  // namespace stratasim::strategies
