// A transformer, lowered for one pipeline stage: the kernels of each layer with exact shapes
// (forward; backward with data- and weight-gradient GEMMs apart), the tensor-parallel
// collectives between them (Megatron 1D: two all-reduces per layer and pass, or all-gather /
// reduce-scatter pairs with sequence parallelism), the activations each layer stores for its
// backward (itemised as Korthikanti et al. do) and the parameters each rank holds; with
// activation recomputation (StageRecompute) the checkpoints stored instead and the recomputed
// forward work that runs before the backward it serves. With tp_mode 2d, 2.5d or 3d
// (strategies/tp_modes.hpp) the layers follow Colossal-AI's 2D (SUMMA), 2.5D (Tesseract) and 3D
// tensor parallelism instead: GEMMs on blocks of the batch and hidden dimensions, broadcasts,
// reductions, all-gathers and reduce-scatters along the mesh axes (docs/tensor-parallelism.md).
#pragma once

#include <string>
#include <vector>

#include <optional>

#include "strategies/model.hpp"
#include "strategies/precision.hpp"
#include "strategies/program.hpp"
#include "strategies/tp_modes.hpp"

namespace stratasim::strategies {

/// The per-rank setting a layer is lowered for.
struct LayerSetting {
  int tp = 1;  // tensor-parallel devices P
  /// How the tp devices split a layer: Megatron's 1D, or Colossal-AI's 2D, 2.5D (with depth
  /// `tp_depth`) or 3D mesh.
  TpMode tp_mode = TpMode::one_d;
  int tp_depth = 1;
  bool sequence_parallel = false;
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 2048;
  /// Tokens of the same sequence before these seq_len ones (TeraPipe slices): attention reads
  /// their keys and values too (seq_kv = context_len + seq_len), which they stored themselves.
  std::int64_t context_len = 0;
  DType dtype = DType::bf16;
  bool flash_attention = false;
  hw::AttentionImpl attention_kernel = hw::AttentionImpl::flash_attention_2;  // when flash
  /// FP8 / FP4 linear layers (strategies/precision.hpp: their GEMMs, cast and amax kernels;
  /// 1D tensor parallelism), each tensor quantised in quantised_directions directions.
  std::optional<LowPrecisionSpec> low_precision;
  int quantised_directions = 2;
  /// How the framework runs Transformer Engine (strategies/precision.hpp): its fused modules
  /// (LayerNormLinear, LayerNormMLP: Megatron-Core's TE layer spec), which fuse casts into the
  /// norm and the activation, or te.Linear in place of the framework's Linear (the others); and
  /// whether it tells TE the first microbatch (Megatron's is_first_microbatch), so that weights
  /// are quantised once per iteration, or not, so that every forward quantises them.
  bool te_fused_modules = true;
  bool weight_cache = true;
  /// Keep every compute op within one layer (ZeRO-3 gathers each layer's parameters before
  /// its first op); otherwise neighbouring compute segments merge across layers.
  bool split_layers = false;
  /// Mixture-of-experts layout (ParallelismSpec::ep, etp, moe_*); read only for MoE layers.
  MoeSetting moe;
  /// Ranks of the FP8 amax reduction group (Megatron's get_amax_reduction_group: the stage's
  /// tensor-, context- and data-parallel ranks): with delayed scaling (reduces_amax) and more
  /// than one, each stage's forward and backward end with the all-reduce (max) of the amaxes
  /// of its low-precision GEMMs' tensors (amax_reduction_bytes) on TpAxis::amax.
  int amax_reduction_ranks = 1;

  /// The tensor-parallel mesh (make_tp_mesh(tp_mode, tp, tp_depth)).
  TpMesh mesh() const { return make_tp_mesh(tp_mode, tp, tp_depth); }
};

/// A piece of one pass of a stage: compute kernels, or a tensor-parallel collective.
struct Segment {
  bool compute = true;
  std::vector<Kernel> kernels;  // compute segments
  CollectiveKind collective = CollectiveKind::all_reduce;
  Bytes bytes;  // collective segments: nccl-tests size
  /// Collective segments: the tensor-parallel communicator it runs on (the whole tp group, or
  /// a mesh row, column or depth line of tp_mode 2d, 2.5d and 3d); the lowering maps it to
  /// the rank's group on that axis.
  TpAxis axis = TpAxis::tp;
  std::string label;
  int layer_begin = -1;  // transformer layers touched (embedding and head: none)
  int layer_end = -1;
  /// Stored activations allocated (> 0: forward, recomputed forward) or released (< 0:
  /// backward) when it ends.
  Bytes activation_delta;
  /// The input checkpoint of a fully recomputed group, kept apart from activation_delta so that
  /// it can be offloaded: allocated (> 0) by the forward segment that stores it, released (< 0)
  /// when the group's backward ends.
  Bytes checkpoint_delta;
  /// On the first recomputed segment of a group: the checkpoint it needs on the device.
  Bytes checkpoint_fetch;
  /// Forward work repeated in a backward pass (activation recomputation): its ops get
  /// Phase::recompute.
  bool recompute = false;
  /// Gradient units (see StagePlan::grad_units) complete when this backward segment ends.
  std::vector<int> grads_done;
  /// Segments of one pass form chains: a segment waits for the previous segment of its own
  /// chain (and for the op before it on its stream); chains overlap. One chain (0) unless a
  /// microbatch is split into sub-batches (Merak's sub-pipelined tensor parallelism, chain k
  /// for sub-batch k). The pass's first segment of each chain waits for the pass's input; its
  /// output is sent once every chain has ended.
  int chain = 0;
  /// Split backward (Zero Bubble): of what this backward segment stores or releases, the bytes
  /// its weight-gradient kernels still need after the input gradients (M_W); 0 = the operands of
  /// its weight-gradient GEMMs (see split_backward()).
  Bytes weight_grad_bytes;
  /// A communication segment that is one step of a ring exchange over the 1D tensor-parallel
  /// group (Transformer Engine's userbuffers, strategies/tp_overlap.hpp) instead of a
  /// collective: every rank sends `bytes` to its successor in the group's ring and receives
  /// `bytes` from its predecessor, as point-to-point messages (the lowering's Send and Recv;
  /// `collective` is ignored).
  bool ring_step = false;
  /// Communication segments: the SMs the transfer holds beside compute (Collective::sms:
  /// kNcclSms, 0 for a copy-engine transfer, or a kernel's SM count).
  std::int16_t sms = kNcclSms;
};

/// Activation recomputation of one pipeline stage (Megatron-LM, Korthikanti et al.; Merak
/// decides it per stage, see strategies/recompute.hpp).
/// - Full: the first `recomputed_layers` layers of the stage are recomputed in groups of
///   `group` consecutive layers. Forward runs their kernels and collectives as usual but stores
///   only each group's input (checkpoint_bytes()); the backward of a group begins with the
///   forward of all its layers again (segments flagged `recompute`, Phase::recompute ops,
///   their tensor-parallel collectives included), which stores their activations as a normal
///   forward would; each layer's backward releases them, and the group's last backward
///   releases the checkpoint.
/// - Selective: every layer's attention core (QK^T, softmax, softmax dropout, attention over
///   V, which Megatron checkpoints as a whole) stores nothing in forward: its softmax output,
///   dropout mask and dropout output (Korthikanti's 5as^2b/t) are recomputed right before the
///   layer's core-attention backward and released at the end of the attention backward.
///   With flash attention the core stores no s^2 tensors to begin with (only fp32 softmax
///   statistics, which the fused backward needs): selective then recomputes nothing and stores
///   what the plan without recomputation stores, as Megatron does. Selective applies to the
///   layers that are not fully recomputed. Without attention dropout the core stores (and
///   recomputes) only its softmax output.
struct StageRecompute {
  bool selective = false;
  int recomputed_layers = 0;  // the first layers of the stage, fully recomputed
  int group = 1;              // consecutive layers sharing one checkpoint (>= 1)

  bool operator==(const StageRecompute&) const = default;
};

/// One stored tensor of a layer's forward pass.
struct ActivationItem {
  std::string name;
  Bytes bytes;  // per rank, per microbatch
};

/// Parameters whose gradients become ready together during backward (a layer, the embedding,
/// the head), in the order backward completes them.
struct GradUnit {
  std::string name;
  std::int64_t parameters = 0;  // per rank
  /// The model layer whose parameters these are (0-based over the whole model), or -1 for a unit
  /// that is not one layer (the embedding, the head, a hand-written plan's units). Set by the
  /// transformer and layer-table lowerings; ZeRO-3 gathers a layer unit for the segments that
  /// cover its layer (strategies/lowering/zero3_fetch.hpp).
  int layer = -1;
  /// Of `parameters`, the routed experts' (MoE layers): their gradients are reduced over the
  /// expert-data-parallel group and their optimizer states sharded over it, not over dp.
  std::int64_t expert_parameters = 0;
  /// Of `parameters`, the linear weights whose GEMMs run in FP8 / FP4 (their all-gathers move
  /// them quantised with LowPrecisionSpec::param_gather: gathered_weight_bytes).
  std::int64_t low_precision_parameters = 0;
};

struct StagePlan {
  std::vector<Segment> forward;   // one microbatch's forward pass
  std::vector<Segment> backward;  // one microbatch's backward pass (input gradients only when
                                  // `weight` is not empty)
  /// With split backward (Zero Bubble), the weight-gradient pass W of one microbatch: the
  /// weight-gradient kernels taken out of `backward` (see split_backward() in
  /// strategies/weight_split.hpp); its segments carry the grads_done. Empty otherwise.
  std::vector<Segment> weight;
  std::vector<GradUnit> grad_units;
  std::int64_t parameters = 0;  // per rank
  /// Of `parameters`, the linear layers' weights whose GEMMs run in FP8 / FP4
  /// (LayerSetting::low_precision; 0 without): they keep quantised copies.
  std::int64_t low_precision_parameters = 0;
  /// Kernels run once per iteration after the optimizer step: the quantisation of those
  /// weights (TE casts them once per step, not per microbatch). Empty without low precision.
  std::vector<Kernel> weight_casts;
  Bytes boundary_bytes;  // activation (and its gradient) sent to the next stage
};

/// Activations one layer stores for backward, per rank and microbatch. Summed they follow
/// Korthikanti et al. (arXiv:2205.05198, eq. 1-4), which assume dropout on: sbh(34 + 5as/h)
/// without parallelism, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34/t + 5as/(ht))
/// with sequence parallelism (2-byte dtype). Dropout masks and outputs are items only where
/// that dropout runs (TransformerModel::hidden_dropout, attention_dropout > 0): without hidden
/// dropout the two 1-byte masks (attention and MLP, sbh each, /t with sequence parallelism) go;
/// without attention dropout the softmax dropout mask (as^2b/t) and output (2as^2b/t) go, the
/// softmax output staying (the attention over V and the softmax backward read it); with flash
/// attention the fused kernel applies attention dropout and stores no mask. With
/// tp_mode 2d and 2.5d every item is the rank's block (1/q^2, 1/(d q^2) of the whole); 3d keeps
/// each Linear's gathered input and weight (docs/tensor-parallelism.md).
/// FP8 / FP4 (setting.low_precision, 1D, in layer `layer`, -1: a layer in low precision): the
/// inputs of the linear layers are saved quantised (saved_input_bytes: TE saves the FP8 input
/// its GEMM read) in place of the high-precision ones: qkv's and fc1's (the norms' outputs) and
/// fc2's; proj's input is the attention output, which the fused (flash) attention kernel also
/// keeps for its backward in the high-precision dtype unless it runs in FP8 (then it is one
/// FP8 tensor): with bf16 flash attention, the item holds both.
std::vector<ActivationItem> layer_activations(const TransformerModel& model,
                                              const LayerSetting& setting, int layer = -1);

/// What full recomputation stores per layer group and microbatch: the group's input, one
/// [s, b, h] tensor (Korthikanti's 2sbh with a 2-byte dtype), sharded over the
/// tensor-parallel ranks with sequence parallelism.
Bytes checkpoint_bytes(const TransformerModel& model, const LayerSetting& setting);

/// Parameters of one layer held by one tensor-parallel rank (weights and column-parallel biases
/// sharded, row-parallel biases and norms replicated, as in Megatron).
std::int64_t layer_parameters_per_rank(const TransformerModel& model, int tp);
/// ... under the setting's tp mode. 1D as above; 2D and 2.5D shard every weight, bias and norm
/// parameter over the q x q mesh (Colossal-AI keeps biases and norm parameters in q^2 pieces
/// and all-gathers them within the mesh before use; 2.5D replicates all of it over the
/// depth), so a rank holds 1/q^2 of the layer; 3D shards the weights over the q^3 cube
/// (W[in/q, out/q^2]) and keeps biases and norm parameters in q slices ([out/q], [h/q]),
/// replicated over the q^2 ranks of a slice, as Colossal-AI's Linear3D and LayerNorm3D do.
std::int64_t layer_parameters_per_rank(const TransformerModel& model, const LayerSetting& setting);

/// The gradient unit of layer `layer` on one rank: its parameters (MLA's attention and an MoE
/// layer's router, shared and local experts where the model has them: strategies/moe.hpp) and,
/// of them, the routed experts' (GradUnit::expert_parameters).
GradUnit layer_unit_of(const TransformerModel& model, const LayerSetting& setting, int layer);

/// The plan of stage `stage` of `stages`, covering layers [layer_begin, layer_end); the first
/// stage also runs the embedding, the last the final norm, LM head and loss. `recompute` is the
/// stage's activation recomputation (none by default); the embedding and the head are never
/// recomputed.
StagePlan plan_transformer_stage(const TransformerModel& model, const LayerSetting& setting,
                                 int stage, int stages, int layer_begin, int layer_end,
                                 const StageRecompute& recompute = {});

}  // namespace stratasim::strategies
