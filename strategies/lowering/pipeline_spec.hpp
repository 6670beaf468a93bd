// The PipelineSpec: everything the pipeline assembly needs, as data, and the one place that reads
// an Experiment for lowering (layout, layer setting, ZeRO settings, schedule options, partition,
// stage plans). Also the one home of the consistency rules between techniques (ZeRO stages,
// offload, compressed gradients, schedules holding stages twice): technique_problems() lists
// what is wrong with a combination; read_experiment() (strategies/experiment.cpp) reports each
// as a ConfigError at its JSON path and assemble_pipeline() throws std::invalid_argument.
//
// Sources: rank layout as Megatron-LM (arXiv:2104.04473); ZeRO stages and offload as DeepSpeed
// (arXiv:1910.02054, arXiv:2101.06840, arXiv:2104.07857).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strategies/experiment.hpp"
#include "strategies/grad_compression.hpp"
#include "strategies/optimizer.hpp"
#include "strategies/program.hpp"
#include "strategies/schedule.hpp"
#include "strategies/transformer.hpp"

namespace stratasim::strategies {

/// With tp_mode 2d, 2.5d and 3d, a rank's tp_index is also its mesh coordinate,
/// tp_index = col + q * (row + q * depth) (strategies/tp_modes.hpp).
///
/// Context parallelism (cp > 1) as Megatron-Core orders its ranks (tp fastest, then cp, then
/// dp, then pp): `dp` here counts the data-parallel-with-context-parallel ranks of a stage
/// (experiment dp x cp), whose index is cp_index + cp * replica; the dp groups made from it are
/// Megatron's data_parallel_group(with_context_parallel=True), over which gradients are reduced
/// and ZeRO shards, and each block of cp consecutive indices is a cp group.
struct RankLayout {
  int tp = 1, dp = 1, pp = 1;
  int cp = 1;  // divides dp
  int world_size() const { return tp * dp * pp; }
  /// rank = tp_index + tp * (dp_index + dp * stage)
  int rank(int tp_index, int dp_index, int stage) const {
    return tp_index + tp * (dp_index + dp * stage);
  }
  int tp_index(int rank) const { return rank % tp; }
  int dp_index(int rank) const { return (rank / tp) % dp; }
  int stage(int rank) const { return rank / (tp * dp); }
  /// The rank's place in its cp group, and its data-parallel replica (dp_index without cp).
  int cp_index(int rank) const { return dp_index(rank) % cp; }
  int replica(int rank) const { return dp_index(rank) / cp; }
};

RankLayout layout_of(const Experiment& experiment);

/// Layers [begin, end) of stage `stage`: layers split as evenly as possible, earlier stages
/// taking one more when they do not divide (the last stage also carries the LM head).
std::pair<int, int> stage_layers(int layers, int stages, int stage);

/// The per-rank setting the experiment's layers are lowered with (with context parallelism,
/// seq_len is the rank's seq_len / cp tokens).
LayerSetting layer_setting(const Experiment& experiment);
/// The experiment's context parallelism (parallelism.cp, cp_mode).
ContextParallel context_parallel_of(const Experiment& experiment);

/// ZeRO (DeepSpeed) and offload settings of the pipeline assembly.
///
/// Model states per rank with Psi its parameters, e the dtype size, g the gradient buffers'
/// (ModelStateFormat::grad_dtype), K Psi the optimizer's part (optimizer_state_bytes,
/// strategies/optimizer.hpp: 12 Psi for mixed-precision Adam) and S = ceil(Psi / dp) the shard:
/// stage 0 holds e Psi + g Psi + K Psi; stage 1 shards the optimizer's part (K S); stage 2 the
/// gradients too (g S, plus transient reduce buckets as comm_buffers); stage 3 the parameters
/// too (e S, plus the layers gathered for use). Megatron's distributed optimizer is stage 1
/// (zero_settings): with fp32 gradient buffers 2 + 4 + 12/d bytes per parameter, Megatron's
/// 6 + 12/d.
///
/// Gradients: stage 0 all-reduces buckets of PipelineSpec::dp_bucket_size bytes once the last
/// microbatch's backward has produced them; stage 1 reduce-scatters buckets of
/// `reduce_bucket_size` elements at the same point; stages 2 and 3 reduce-scatter every
/// microbatch's buckets as its backward produces them (DeepSpeed reduces in the backward hooks
/// of every micro step, which is what lets it keep only the shard). Stages 1 and 2 all-gather
/// the updated parameters after the optimizer step in buckets of `allgather_bucket_size`
/// elements. Stage 3 all-gathers each layer's parameters (a GradUnit: a layer, the embedding,
/// the head) before its first op in every forward and backward pass, `prefetch_layers` uses
/// ahead, so that at most 1 + prefetch_layers gathered units are alive (more only where
/// recomputation needs several layers at once), and releases them after their last compute
/// op in that pass.
///
/// Offload (ZeRO-Offload / ZeRO-Infinity): `offload_optimizer` keeps the fp32 states (K S) and
/// fp32 gradients (4 S) on the host, copies each reduced gradient bucket to it (copy stream),
/// runs Adam there (host stream) and copies the updated parameters back; `offload_params`
/// (stage 3) keeps the parameter shard on the host and copies each unit's shard to the device
/// before its gather; `nvme` puts what is offloaded on NVMe instead (the optimizer states are
/// read before and written after the host step).
struct ZeroSettings {
  int stage = 0;
  int prefetch_layers = 1;
  /// DeepSpeed's stage3_prefetch_bucket_size (elements, 0: use prefetch_layers): while use c
  /// computes, the next uses are gathered as long as the parameters being prefetched (those
  /// between c and the one to gather) stay under it — PartitionedParameterCoordinator's
  /// numel_prefetching < prefetch_bucket_sz — so the gather of use j waits for the release of
  /// use c - 1, c the first use with the parameters of uses c+1 .. j-1 under the bucket.
  std::int64_t prefetch_bucket_size = 0;
  /// stage3_max_live_parameters (elements, 0: no limit): a gather waits until the parameters
  /// gathered and not released, its own included, fit (the release of use m, the first with
  /// those of uses m+1 .. j within it; one use at least).
  std::int64_t max_live_parameters = 0;
  std::int64_t reduce_bucket_size = 500'000'000;     // elements
  std::int64_t allgather_bucket_size = 500'000'000;  // elements
  bool offload_optimizer = false;
  bool offload_params = false;
  bool nvme = false;
  bool offload_activations = false;  // recomputation checkpoints wait on the host
  /// Megatron's overlap_param_gather (stage 1 only): the parameter all-gather buckets are the
  /// gradient buckets (units, allgather_bucket_size elements), issued at the iteration's
  /// start in layer order — Megatron-core dispatches each bucket's all-gather from the next
  /// iteration's forward pre-hooks (param_and_grad_buffer.py, start_param_sync) — and the
  /// first forward op touching a bucket's units waits for its gather; none after the step.
  bool overlap_param_gather = false;
  /// ZeRO++ (Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant
  /// Model Training", arXiv:2306.10209), stage 3 only; formulas in strategies/grad_compression.hpp
  /// (block_quantized_bytes, kZeroppBlock, qgz_sync).
  /// qwZ (`quantized_weights`): each parameter all-gather moves int8 weights with one fp32 scale
  /// per block of kZeroppBlock elements: every rank quantises its shard S (a memory-bound kernel
  /// reading e S bytes), the group all-gathers ranks x zeropp_quantized_bytes(S, 8) bytes, and a
  /// dequantise kernel writes the unit's e P bytes; the int8 buffers are comm_buffers.
  /// hpZ (`hpz_partition_size` n > 1, dividing dp): after its forward all-gather (still over
  /// the whole data-parallel group) every rank keeps 1/n of each unit (a secondary partition
  /// within its group of n consecutive data-parallel ranks, typically a node's), held on the
  /// device for the whole iteration: ceil(P / n) x e bytes, or zeropp_quantized_bytes(ceil(P/n),
  /// 8) with qwZ (the secondary copy is kept quantised); the gathers of recompute and backward
  /// passes run within that group of n from the secondary partition.
  /// qgZ (`quantized_gradients`): each reduce bucket is reduced by qgz_sync's steps (an int4
  /// all-to-all within the node, dequantise-reduce-requantise, an int4 all-to-all across
  /// nodes, dequantise-reduce) on the dp-comm stream (DeepSpeed's reduce stream) instead of a
  /// reduce-scatter; `node_ranks` is the node's share of the data-parallel group
  /// (gcd(dp, devices_per_node / tp)).
  bool quantized_weights = false;
  int hpz_partition_size = 1;
  bool quantized_gradients = false;
  int node_ranks = 1;
  bool zeropp() const { return quantized_weights || hpz_partition_size > 1 || quantized_gradients; }
  /// Ranks one shard spans: 0 for the whole data-parallel group; FSDP's HYBRID_SHARD, the
  /// data-parallel ranks of a node (the replicas of a shard are all-reduced across nodes).
  int shard_group = 0;
  /// The ranks each shard is split over, for a data-parallel group of dp ranks.
  int shard_degree(int dp) const { return shard_group > 0 ? shard_group : dp; }
};

/// The ZeRO and offload settings of an experiment's parallelism. Megatron's distributed
/// optimizer (distributed_optimizer(e), with parallelism.zero 0) is stage 1 with Megatron's
/// buckets: gradients reduce-scattered and parameters all-gathered in buckets of
/// max(40,000,000, 1,000,000 x dp) elements with overlap (Megatron-core's
/// DistributedDataParallel default bucket_size), one bucket without (dp_overlap false).
ZeroSettings zero_settings(const Experiment& experiment);

/// Model state a rank keeps on the device for its `parameters` (its stage's share per
/// tensor-parallel rank) under ZeRO and offload — what assemble_pipeline allocates before the
/// first op: parameters eΨ (ZeRO-3: eΨ/dp, none when offloaded), gradients gΨ (ZeRO-2/3:
/// gΨ/dp, none with optimizer offload), optimizer states KΨ (ZeRO-1+: K ceil(Ψ/dp), none when
/// offloaded).
/// With hpZ (ZeroSettings::hpz_partition_size n > 1) also the secondary partition,
/// hpz_secondary: ceil(Ψ/n) parameters, e bytes each or int8-quantised with qwZ.
/// FP8 / FP4 training (format.low_precision): of the parameters held, the share that are
/// `low_precision_parameters` (the linear weights) also keep their quantised copies
/// (weight_copy_bytes, strategies/precision.hpp) and, with param_gather, not their e-byte copy.
struct DeviceModelStates {
  Bytes parameters, gradients, optimizer, hpz_secondary;
  Bytes total() const { return parameters + gradients + optimizer + hpz_secondary; }
};
DeviceModelStates device_model_states(const ZeroSettings& zero, const ModelStateFormat& format,
                                      std::int64_t parameters, int dp,
                                      std::int64_t low_precision_parameters = 0);
/// hpZ's secondary partition of `parameters` (element_size bytes each): ceil(parameters / n)
/// of them, e bytes each, or zeropp_quantized_bytes(ceil(parameters / n), 8) with qwZ.
Bytes hpz_secondary_bytes(const ZeroSettings& zero, std::int64_t parameters,
                          std::int64_t element_size);

/// Everything the pipeline assembly needs: per-stage plans as data, the rank layout and the
/// schedule. Stage plans may come from the transformer lowering or be written by hand (tests,
/// layer tables).
struct PipelineSpec {
  RankLayout layout;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  ScheduleOptions schedule_options;
  int microbatches = 1;
  DType dtype = DType::bf16;
  /// Gradient buffers' dtype, what they are accumulated and reduced in (unset: `dtype`), and
  /// the optimizer (strategies/optimizer.hpp).
  std::optional<DType> grad_dtype;
  OptimizerKind optimizer = OptimizerKind::adam;
  bool fp32_grad_copy = false;  // ModelStateFormat::fp32_grad_copy
  /// FP8 / FP4 training (ModelStateFormat::low_precision, quantised_directions).
  std::optional<LowPrecisionSpec> low_precision;
  int quantised_directions = 2;
  ModelStateFormat state_format() const {
    return {dtype,         grad_dtype.value_or(dtype), optimizer, fp32_grad_copy,
            low_precision, quantised_directions};
  }
  /// One plan per model part (schedule_parts(): the pipeline stages, or more with interleaved and
  /// zb-v chunks); with TeraPipe one per part and slice, at part * slices + slice. Schedules
  /// with split backward split the plans themselves (split_backward()).
  std::vector<StagePlan> stages;
  Bytes dp_bucket_size = Bytes(25 * 1024 * 1024);
  bool dp_overlap = true;
  /// Parameter servers (parallelism.data_parallel "parameter_server", docs/parameter-server.md):
  /// 0, none (the gradient all-reduce); S > 0, ranks layout.world_size() .. + S - 1 are servers
  /// that hold the optimizer states and apply the updates (the ParameterServer hook), and the
  /// workers hold no optimizer states. Needs tp = pp = cp = 1, ZeRO 0, no FSDP, compression or
  /// offload, and no mirroring (every worker messages its servers).
  int parameter_servers = 0;
  /// With parameter servers: units of more than this many parameters are sliced (0: never;
  /// Parallelism::slice_parameters).
  std::int64_t ps_slice_parameters = 0;
  /// Tied embeddings split over the first and last stage: their gradients are all-reduced
  /// between the two (Megatron's embedding group), `embedding_sync_bytes` per rank: the rank's
  /// ceil(vocab / tp) rows of the word embeddings in the gradient buffers' dtype (Megatron's
  /// _allreduce_word_embedding_grads reduces main_grad, fp32 with its bf16 default).
  bool shared_embedding = false;
  /// Megatron's scatter/gather of pipeline sends (scatter_gather_tensors_in_pipeline, on when
  /// parallelism.pipeline_scatter_gather, 1D tensor parallelism with tp > 1 and no sequence
  /// parallelism): a send and its receive move ceil(boundary_bytes / tp) per rank
  /// (Assembly::pipeline_message) and the receiver all-gathers the boundary_bytes over its
  /// tensor-parallel group before using them (PipelineScatterGather).
  bool pipeline_scatter_gather = false;
  /// Emit ops for data-parallel replica 0 only and mark every other replica as its mirror
  /// (Program::set_replica). Exact whenever replicas behave alike: the stage plans are the same
  /// for every replica, so that holds on a network without contention (the analytical one).
  bool mirror_data_parallel = false;
  /// With mirror_data_parallel: replicas 0 .. mirror_period - 1 emit ops and replica r mirrors
  /// replica r mod mirror_period (1: replica 0 stands for all). The flow network's symmetry
  /// reduction uses a period where only every period-th replica lies alike on the fabric
  /// (docs/network.md "Symmetry"). Must divide the replica count.
  int mirror_period = 1;
  /// Emit ops for tensor-parallel rank 0 only and mark ranks 1..tp-1 of each group as its
  /// mirrors. With 1D tensor parallelism every rank of a group runs the same stage plan on its
  /// own shard (same kernels, same collectives on the same group, sends to the same tp index
  /// of the next stage), so this is exact on a network without contention, like
  /// mirror_data_parallel; the sweep uses it (tests/search checks equality). Ignored with the
  /// 2D, 2.5D and 3D meshes, whose row, column and depth groups differ from rank to rank.
  bool mirror_tensor_parallel = false;
  Bytes embedding_sync_bytes;
  ZeroSettings zero;
  /// PyTorch FSDP's runtime (strategies/fsdp.hpp): when set, FsdpRuntime (techniques.hpp)
  /// gathers, frees and reduces each FSDP unit as FSDP's hooks do, instead of the ZeRO-3 fetch
  /// and the ZeRO or DDP gradient synchronisation; zero.stage is its sharding's (3 or 0).
  std::optional<FsdpSpec> fsdp;
  /// The tensor-parallel mesh of the stage plans (make_tp_mesh(tp_mode, layout.tp, tp_depth)):
  /// with 2D, 2.5D and 3D every tp group of the layout is also split into the mesh's row,
  /// column and depth groups, and a plan's collective segment runs on the group of its axis.
  TpMode tp_mode = TpMode::one_d;
  int tp_depth = 1;
  /// Compressed data-parallel gradient synchronisation (ZeRO stage 0 only): each gradient
  /// bucket runs compressed_sync()'s steps instead of one all-reduce. The compression kernel
  /// and the first collective are issued as soon as the last microbatch's backward has
  /// produced the bucket (inside that backward, on the compute and dp-comm streams; after the
  /// backward without dp_overlap); the steps after the first collective (int8's local reduce,
  /// the decompression) run on the compute stream after the backward, before the optimizer
  /// step. Collective labels say "compressed"; the compressed buffers are comm_buffers from
  /// the compression until the decompression ends; top-k's error-feedback residual is held as
  /// gradients from the start.
  GradCompression grad_compression;
  /// Gradient clipping by global norm (max norm; 0 = off) and fp16 loss scaling before the
  /// optimizer step (techniques.hpp: GradientClipping, LossScaleCheck); per-iteration and
  /// per-pass host overheads (HostOverhead). From the experiment's training settings.
  double grad_clip = 0.0;
  LossScaling loss_scaling = LossScaling::none;
  /// Mixture of experts (the model has MoE layers): the expert-parallel layout. Communicators
  /// makes its ep, etp and expert-data-parallel groups (after every other group); gradient
  /// units' expert_parameters are reduced over the expert-data-parallel group
  /// (ExpertGradientSync) and their optimizer states sharded over it.
  std::optional<MoeSetting> moe;
  /// Devices holding each model part: 2 with a schedule that holds every part on two devices
  /// (Chimera, DualPipe: holds_parts_twice), else 1.
  int part_copies() const { return holds_parts_twice(schedule) ? 2 : 1; }
  /// Ranks over which a part's gradients are summed and ZeRO shards its states (the data-
  /// parallel group, Communicators::dp_size): layout.dp (dp x cp) times part_copies().
  int state_dp() const { return layout.dp * part_copies(); }
  /// Ranks of an expert-data-parallel group: tp * dp / (ep * etp), layout.dp counting dp x cp,
  /// times part_copies() (1 without MoE).
  int expert_dp() const {
    return moe ? layout.tp * layout.dp / std::max(1, moe->ep * moe->etp) * part_copies() : 1;
  }
  Time step_overhead;
  Time microbatch_overhead;
};

/// What is wrong with one combination of techniques: `path` is the experiment's JSON path of the
/// setting to change ("parallelism.zero", "parallelism.offload", ...), `message` says why (it
/// names the settings by their JSON names so that it reads well in a config error).
struct SpecProblem {
  std::string path;
  std::string message;
};

/// The consistency rules of ZeRO, offload, gradient compression and the schedule, written once:
/// ZeRO stage in 0..3; positive bucket sizes and a prefetch not negative; a schedule holding
/// every stage twice (Chimera) only with stage 0; optimizer offload with stage >= 1; parameter
/// offload with stage 3; NVMe only with optimizer or parameter offload; compressed gradients
/// only with stage 0; ZeRO++'s qwZ, hpZ and qgZ only with stage 3, hpZ's partition size
/// dividing `dp` (the data-parallel degree; 0: not checked). Empty when the combination is
/// modelled.
std::vector<SpecProblem> technique_problems(const ZeroSettings& zero,
                                            const GradCompression& compression,
                                            ScheduleKind schedule, int dp = 0);

/// The schedule options of an experiment (virtual stages, sequence slices).
ScheduleOptions schedule_options(const Experiment& experiment);

/// The device of part `part` under `kind` with `stages` devices (interleaved: part mod p; zb-v:
/// the V; otherwise the part itself).
int part_device(ScheduleKind kind, int part, int stages);

/// Layers per model part as the experiment's partition says: even (stage_layers) or the
/// explicit list (which must have one entry per part). Throws std::invalid_argument otherwise.
std::vector<int> part_layer_counts(const Experiment& experiment, int parts);

/// The PipelineSpec of an experiment (transformer stage plans, with the experiment's
/// recomputation applied to them), its layers split by part_layer_counts.
PipelineSpec pipeline_spec(const Experiment& experiment);
/// ... with the layers split as `layers_per_part` says.
PipelineSpec pipeline_spec(const Experiment& experiment, const std::vector<int>& layers_per_part);

}  // namespace stratasim::strategies
