// An experiment: a model, a cluster, a parallel strategy and the training settings — what
// `stratasim simulate` takes. Loading resolves the files it names, applies command-line
// overrides and checks that the pieces fit together (tp divides the heads, tp * pp * dp is the
// cluster's device count, ...), naming the file and JSON path of anything wrong.
#pragma once

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/config_reader.hpp"
#include "strategies/context_parallel.hpp"
#include "strategies/dlrm_model.hpp"
#include "strategies/embedding_cache.hpp"
#include "strategies/framework.hpp"
#include "strategies/fsdp.hpp"
#include "strategies/grad_compression.hpp"
#include "strategies/layer_table.hpp"
#include "strategies/model.hpp"
#include "strategies/optimizer.hpp"
#include "strategies/rnn_model.hpp"
#include "strategies/tp_modes.hpp"
#include "strategies/transport.hpp"

namespace stratasim::strategies {

/// Pipeline schedules (strategies/schedule.hpp says what each one runs; docs/schedules.md
/// compares them).
enum class ScheduleKind {
  gpipe,
  one_f_one_b,    // PipeDream-Flush, Megatron's default
  interleaved,    // Megatron's virtual stages (parallelism.virtual_stages chunks per device)
  pipedream_2bw,  // asynchronous 1F1B without a flush, two weight versions
  merak_scp,      // Merak's shifted critical path: recomputation off the critical path
  zb_h1,          // Zero Bubble, split backward, 1F1B memory
  zb_h2,          // Zero Bubble, split backward, longer warm-up (2p - 1 in flight)
  zb_v,           // Zero Bubble V: 2 chunks per device in a V, split backward
  chimera,        // two pipelines in opposite directions, each stage held twice
  terapipe,       // token-level slices of each sequence (parallelism.sequence_slices)
  dualpipe,       // DeepSeek's DualPipe: Chimera's two directions, F&B pairs overlapped
};
inline constexpr ScheduleKind kAllSchedules[] = {
    ScheduleKind::gpipe,         ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
    ScheduleKind::pipedream_2bw, ScheduleKind::merak_scp,   ScheduleKind::zb_h1,
    ScheduleKind::zb_h2,         ScheduleKind::zb_v,        ScheduleKind::chimera,
    ScheduleKind::terapipe,      ScheduleKind::dualpipe};
std::string_view name_of(ScheduleKind s);
/// Whether `kind` splits each backward into B (input gradients) and W (weight gradients) passes
/// (Zero Bubble's zb-h1, zb-h2, zb-v; DualPipe): what cannot follow its weight-gradient GEMMs
/// into W is refused with it.
bool splits_backward(ScheduleKind kind);
/// Whether `kind` holds every model part on two devices, one per direction (Chimera, DualPipe):
/// their gradients are summed over both.
bool holds_parts_twice(ScheduleKind kind);
/// The schedule called `name` ("1f1b", "zb-h1", ...), if any.
std::optional<ScheduleKind> schedule_from_name(std::string_view name);

/// How the layers are split over pipeline stages (and model chunks).
enum class PartitionKind {
  even,      // as evenly as possible, earlier stages taking the remainder
  balanced,  // BaPipe: dynamic programming over layer costs, memory and p2p
  explicit_  // `layers_per_stage` as given
};
struct PartitionSpec {
  PartitionKind kind = PartitionKind::even;
  std::vector<int> layers_per_stage;  // explicit: one entry per model chunk, summing to layers
};

/// Activation recomputation (Megatron-LM names; stage_aware is Merak's).
enum class RecomputeKind { none, full, selective, stage_aware };
std::string_view name_of(RecomputeKind r);
/// Which layers full recomputation covers: `uniform` checkpoints every group of
/// recompute_num_layers layers; `block` recomputes the first recompute_num_layers layers of
/// each stage and stores the rest.
enum class RecomputeMethod { uniform, block };

/// What lives off the device (DeepSpeed ZeRO-Offload / ZeRO-Infinity).
struct OffloadSpec {
  bool optimizer = false;    // fp32 states and the Adam step on the host CPU
  bool params = false;       // ZeRO-3 parameters kept on the host, fetched per layer
  bool nvme = false;         // what is offloaded lives on NVMe instead of host memory
  bool activations = false;  // activation checkpoints offloaded to host memory
  bool any() const { return optimizer || params || nvme || activations; }
};

struct ParallelismSpec {
  int tp = 1;  // tensor-parallel degree P
  /// How the tp devices split each layer: Megatron's 1D, or Colossal-AI's 2D (tp = q^2), 2.5D
  /// (tp = tp_depth q^2) or 3D (tp = q^3) meshes (strategies/tp_modes.hpp).
  TpMode tp_mode = TpMode::one_d;
  int tp_depth = 1;  // 2.5D's depth d
  int pp = 1;        // pipeline stages
  int dp = 0;        // data-parallel degree; 0 in a config means "all remaining devices"
  /// Context-parallel degree: each sequence's tokens split over cp ranks (Megatron-LM's
  /// --context-parallel-size), attention exchanging keys and values as cp_mode says
  /// (strategies/context_parallel.hpp). tp * cp * pp * dp is the device count; gradients are
  /// reduced (and ZeRO shards) over the dp * cp ranks of the same tp index and stage.
  int cp = 1;
  CpMode cp_mode = CpMode::ring;
  bool sequence_parallel = false;  // Megatron sequence parallelism (needs tp > 1 to matter)
  /// Megatron's scatter_gather_tensors_in_pipeline: without sequence parallelism, each
  /// tensor-parallel rank sends 1/tp of a pipeline activation (or its gradient) and the
  /// receivers all-gather it over their tensor-parallel group (1D tensor parallelism only).
  bool pipeline_scatter_gather = true;
  /// The interleaved schedule's point-to-point communication batched as Megatron-LM does
  /// without overlap_p2p_comm (--no-overlap-p2p-communication; Schedule::batched_p2p): off,
  /// sends overlap as with Megatron's default.
  bool pipeline_batched_p2p = false;
  /// DualPipe's overlapped forward-backward pairs (Schedule::overlap_next): on, as DeepSeek-V3
  /// runs it; off, the pairs run one pass after the other (the reference DualPipe without a
  /// module's overlapped_forward_backward).
  bool dualpipe_overlap = true;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  /// Model chunks per device with the interleaved schedule (Megatron's
  /// virtual_pipeline_model_parallel_size); 1 otherwise.
  int virtual_stages = 1;
  /// TeraPipe: slices each sequence is cut into along the tokens; 1 otherwise.
  int sequence_slices = 1;
  PartitionSpec partition;
  /// Merak's sub-pipelined tensor parallelism: each microbatch is split into this many
  /// sub-batches so that one sub-batch's TP collective overlaps the next one's compute (1: off).
  int tp_overlap = 1;
  /// Megatron-LM's --tp-comm-overlap (Transformer Engine userbuffers): with sequence
  /// parallelism, each tensor-parallel all-gather and reduce-scatter is split into tp chunks
  /// pipelined with the GEMM beside it (strategies/tp_overlap.hpp, tp_comm_overlap()).
  bool tp_comm_overlap = false;
  int micro_batch = 1;  // samples per microbatch
  /// Mixture of experts (model.moe; strategies/moe.hpp, docs/moe.md), as Megatron-Core lays
  /// it out: `ep` expert-parallel ranks each hold num_experts / ep experts, `etp` ranks split
  /// each expert's FFN (expert tensor parallelism); the ep * etp ranks are carved out of a
  /// stage's tp * cp * dp ranks (tp fastest), and the rest, expert_dp() = tp * cp * dp / (ep *
  /// etp), reduce the experts' gradients (dense parameters stay with dp x cp).
  int ep = 1;
  int etp = 1;
  /// Megatron's --moe-token-dispatcher-type: all-to-all over the ep group ("alltoall"), or an
  /// all-gather of every rank's tokens and a reduce-scatter of the outputs ("allgather").
  bool moe_allgather_dispatcher = false;
  /// Megatron's --moe-shared-expert-overlap: the shared experts run while the dispatch
  /// all-to-all is in flight (else after the routed experts).
  bool moe_shared_expert_overlap = false;
  /// Megatron's --moe-grouped-gemm: one grouped GEMM over the local experts (else one GEMM
  /// per expert, sequentially).
  bool moe_grouped_gemm = true;
  /// The forward dispatch all-to-all moves the tokens in FP8, 1 byte an element and one fp32
  /// scale per 128 (DeepEP's FP8 dispatch, as DeepSeek-V3 trained; the combine and the backward
  /// stay in bf16). Needs training.dtype fp8 / fp4 and the alltoall dispatcher.
  bool moe_fp8_dispatch = false;
  int expert_dp() const {
    return ep * etp > 0 ? tp * std::max(cp, 1) * std::max(dp, 1) / (ep * etp) : 1;
  }
  /// Gradients are all-reduced in buckets of at least this many bytes, launched as soon as
  /// the last microbatch's backward has produced them (as DDP and Megatron do).
  Bytes dp_bucket_size = Bytes(25 * 1024 * 1024);
  bool dp_overlap = true;  // overlap the bucket all-reduces with backward (else after it)
  /// parallelism.data_parallel: how data-parallel replicas synchronise. false ("allreduce"):
  /// the gradient all-reduce (or ZeRO's collectives). true ("parameter_server"): `servers`
  /// parameter servers, extra ranks after the tp * pp * dp workers on their own devices, each
  /// holding whole layers (docs/parameter-server.md; strategies/lowering/techniques.hpp
  /// ParameterServer). The cluster's devices are tp * pp * dp + servers.
  bool parameter_server = false;
  int servers = 0;  // parallelism.servers: 1 by default with a parameter server, else 0
  /// parallelism.slice_parameters (parameter servers only): 0, each gradient unit (a layer) is
  /// one push and one pull, held by one server; P > 0, units of more than P parameters are cut
  /// into slices of P (the last one smaller), each its own push and pull, spread over the
  /// servers (P3's parameter slicing, docs/parameter-server.md).
  std::int64_t slice_parameters = 0;
  /// Megatron's --overlap-param-gather (distributed optimizer / ZeRO stage 1 only): the
  /// updated parameters' all-gathers are issued at the iteration's start, bucket by bucket in
  /// layer order, and each bucket's first forward op waits for its gather, instead of after
  /// the optimizer step (ZeroSettings::overlap_param_gather).
  bool overlap_param_gather = false;
  /// Compressed data-parallel gradient synchronisation (strategies/grad_compression.hpp).
  GradCompression grad_compression;

  /// ZeRO stage (DeepSpeed): 0 none, 1 optimizer states, 2 + gradients, 3 + parameters
  /// sharded over the data-parallel group.
  int zero = 0;
  int zero_prefetch_layers = 1;  // ZeRO-3: layers whose parameters are gathered ahead
  /// DeepSpeed's stage3_prefetch_bucket_size and stage3_max_live_parameters, in elements (0:
  /// unset): ZeRO-3 prefetches the next uses while the parameters being prefetched are under
  /// the bucket (instead of zero_prefetch_layers whole layers), and gathers no more while the
  /// gathered parameters would exceed max_live (ZeroSettings says how).
  std::int64_t zero_prefetch_bucket_size = 0;
  std::int64_t zero_max_live_parameters = 0;
  /// ZeRO++ (Wang et al., arXiv:2306.10209; DeepSpeed's keys of the same names), ZeRO-3 only
  /// (ZeroSettings says what each runs): qwZ, the parameter all-gathers move int8 blockwise-
  /// quantised weights; hpZ, a secondary copy of the parameters partitioned within groups of
  /// zero_hpz_partition_size data-parallel ranks (1: off) serves the backward's all-gathers;
  /// qgZ, gradients reduced by a hierarchical all-to-all of int4-quantised gradients instead of
  /// a reduce-scatter.
  bool zero_quantized_weights = false;
  int zero_hpz_partition_size = 1;
  bool zero_quantized_gradients = false;
  /// DeepSpeed's bucket sizes, in elements: gradients reduced per bucket (stages 1-3) and
  /// updated parameters all-gathered per bucket after the step (stages 1-2).
  std::int64_t reduce_bucket_size = 500'000'000;
  std::int64_t allgather_bucket_size = 500'000'000;

  RecomputeKind recompute = RecomputeKind::none;
  RecomputeMethod recompute_method = RecomputeMethod::uniform;
  int recompute_num_layers = 1;

  OffloadSpec offload;

  /// A DLRM model's embedding tables over the GPUs (parallelism.embedding_sharding).
  EmbeddingSharding embedding_sharding = EmbeddingSharding::table;
};

/// Allocator and framework overheads on each device (strategies/framework.hpp: the figures and
/// their sources): allocations grow by `fragmentation` (>= 1, the caching allocator's slack),
/// and cuda_context + nccl_buffers x the rank's communicators are held back from the start,
/// unless `reserved` is given, which replaces that figure. All of it is reported as `other`.
struct MemorySettings {
  double fragmentation = 1.0;
  std::optional<Bytes> reserved;
  Bytes cuda_context = kDefaultCudaContext;
  Bytes nccl_buffers = kDefaultNcclBuffers;  // per communicator
};

/// The optimizers of strategies/optimizer.hpp (training.optimizer).
using OptimizerChoice = OptimizerKind;

/// Loss scaling (mixed precision with fp16): a constant scale, a scale adapted when gradients
/// overflow (Micikevicius et al., arXiv:1710.03740), or none.
enum class LossScaling { none, static_, dynamic };
std::string_view name_of(LossScaling s);

struct TrainingSpec {
  std::int64_t global_batch = 0;  // samples per iteration
  int seq_len = 0;                // tokens per sample
  DType dtype = DType::bf16;      // weights and activations (mixed precision below 4 bytes)
  OptimizerChoice optimizer = OptimizerChoice::adam;
  bool flash_attention = false;  // fused attention: no s^2 score matrix stored
  /// The framework whose defaults fill what is not given (strategies/framework.hpp).
  Framework framework = Framework::generic;
  /// Gradient buffers' dtype (accumulation over microbatches and the data-parallel
  /// reduction); unset: the framework's default.
  std::optional<DType> grad_accumulation_dtype;
  /// Megatron-LM's distributed optimizer (ZeRO stage 1: optimizer states and fp32 master
  /// weights sharded over the data-parallel group); unset: the framework's default (off).
  std::optional<bool> distributed_optimizer;
  /// What the framework's kernels reach inside a training step (hw::DeviceEfficiency's
  /// framework_compute and framework_memory_traffic, applied to every device of the cluster):
  /// the share of the devices' GEMM and attention rates (0, 1], and the multiple of the
  /// memory-bound kernels' bytes (>= 1). Unset: the framework's fitted value
  /// (framework_defaults, configs/frameworks.json).
  std::optional<double> compute_efficiency;
  std::optional<double> elementwise_traffic;
  /// training.attention_efficiency: the framework's fused attention against the calibrated
  /// kernel class it is costed as (hw::DeviceEfficiency::framework_attention), a multiple of
  /// its rate in [0.1, 10]. Unset: the framework's fitted value.
  std::optional<double> attention_efficiency;
  /// Which fused kernel runs attention when flash_attention is on (its calibrated rate).
  hw::AttentionImpl attention_kernel = hw::AttentionImpl::flash_attention_2;
  /// FP8 or FP4 training (training.dtype "fp8" / "fp4" with training.fp8; strategies/
  /// precision.hpp): the linear layers' GEMMs in low precision, `dtype` (then bf16) for the rest.
  std::optional<LowPrecisionSpec> low_precision;

  /// training.hidden_dropout / attention_dropout: when given, they replace the model's
  /// (TransformerModel::hidden_dropout, attention_dropout) before lowering.
  std::optional<double> hidden_dropout, attention_dropout;
  /// Gradient clipping by global norm (training.grad_clip): the max norm, 0 = off (the
  /// default; Megatron-LM's --clip-grad defaults to 1.0). strategies/lowering/techniques.hpp's
  /// GradientClipping says what it runs.
  double grad_clip = 0.0;
  /// Loss scaling of fp16 training (training.loss_scaling): "dynamic" (the default with fp16)
  /// or "static" check the unscaled gradients for inf/nan before the step; "none" (the default
  /// otherwise) runs nothing. Both kinds cost the same (LossScaling in techniques.hpp).
  LossScaling loss_scaling = LossScaling::none;
  /// Host time the framework spends each iteration outside the kernels it launches: data
  /// loading, the Python training loop, the optimizer's host-side launches (training.
  /// step_overhead); and per forward or backward pass of a microbatch on each rank
  /// (training.microbatch_overhead). Both run on each rank's host stream ahead of the work.
  Time step_overhead;
  Time microbatch_overhead;
  /// PyTorch FSDP's runtime (strategies/fsdp.hpp): training.fsdp, or with training.framework
  /// "fsdp" its defaults (fsdp_defaults) unless parallelism.zero picks a stage other than 3 or
  /// the pipeline has stages (then the ZeRO lowering of parallelism.zero runs instead). Set, it
  /// decides the ZeRO stage (3 sharded, 0 with NO_SHARD) and the lowering runs FsdpRuntime.
  std::optional<FsdpSpec> fsdp;

  /// training.algorithm: "backprop" (the default; through time for an RNN) or "admm"
  /// (ADMMiRNN, RNN models only: strategies/rnn.hpp).
  TrainingAlgorithm algorithm = TrainingAlgorithm::backprop;
  /// training.iterations_to_accuracy: iterations the run needs to reach its target accuracy
  /// (the user's figure, e.g. from the paper's convergence curves); > 0 makes the report give
  /// the time to train, iterations x iteration time. 0: not given.
  std::int64_t iterations_to_accuracy = 0;
};

struct Experiment {
  std::string name;
  std::string description;
  std::filesystem::path file;  // where it was loaded from (empty if built in code)
  /// The transformer; for a layer-table model (`model.type: "layers"`) only its name, source
  /// and layer count are set, and `layer_table` holds the model.
  TransformerModel model;
  std::optional<LayerTableModel> layer_table;
  /// model.type "dlrm" (strategies/dlrm.hpp) or "rnn" (strategies/rnn.hpp): the model, with
  /// `model` holding only its name, source and a layer count; such experiments skip the
  /// transformer's checks and lowering.
  std::optional<DlrmModel> dlrm;
  std::optional<RnnModel> rnn;
  /// The experiment's `embedding_cache` section (DLRM only).
  std::optional<EmbeddingCacheSpec> embedding_cache;
  hw::ClusterSpec cluster;
  ParallelismSpec parallelism;
  TrainingSpec training;
  MemorySettings memory;
  /// The `transport` section: priority classes and bounded loss (strategies/transport.hpp).
  TransportPolicy transport;
  /// What the loader accepted but reports (a Hugging Face model's settings that are not
  /// modelled, ...): "note:" lines for the user (strategies/foreign_inputs.hpp).
  std::vector<std::string> notes;

  /// Microbatches each pipeline runs per iteration: global_batch / (dp * micro_batch) (the cp
  /// ranks of a replica share its microbatches).
  std::int64_t microbatches() const {
    return training.global_batch / (std::int64_t{parallelism.dp} * parallelism.micro_batch);
  }
  std::int64_t tokens_per_iteration() const { return training.global_batch * training.seq_len; }
};

/// How the experiment's ranks keep their model states: the training dtype, the gradient
/// buffers' dtype and the optimizer, the framework's defaults filling what is not set.
ModelStateFormat model_state_format(const Experiment& e);
/// Whether Megatron's distributed optimizer is on (set, or the framework's default).
bool distributed_optimizer(const Experiment& e);
/// The data-parallel ranks one FSDP shard group holds: with HYBRID_SHARD the ranks of a node
/// (devices_per_node / tp, at most dp), otherwise the whole data-parallel group (dp).
int fsdp_shard_group(const Experiment& e);
/// The ZeRO stage the lowering uses: parallelism.zero, or 1 with the distributed optimizer.
int effective_zero_stage(const Experiment& e);
/// Device memory held back on a rank of the experiment (memory.reserved, else the modelled
/// figure of strategies/framework.hpp with the rank's communicators estimated from the layout:
/// one each for tp > 1 and dp > 1, two pipeline peers with pp > 1). The simulation counts the
/// Program's communicators instead (sim/memory.hpp).
Bytes held_back_estimate(const Experiment& e);

/// A `--set path=value` (or a flag such as --tp) applied to the experiment document before it
/// is read; paths may reach into the model and cluster files ("cluster.inter_node.bandwidth").
struct Override {
  std::string path;
  nlohmann::json value;
  std::string origin;  // how errors name it: "command line (--tp 4)"
};

/// Loads an experiment file, inlines the model and cluster (and device) files it names,
/// applies `overrides` in order and validates. Throws config::ConfigError.
Experiment load_experiment(const std::filesystem::path& file,
                           const std::vector<Override>& overrides = {});

/// Reads an experiment from an assembled document (used by load_experiment and tests).
Experiment read_experiment(config::Document& doc, const std::vector<Override>& overrides = {});

}  // namespace stratasim::strategies
