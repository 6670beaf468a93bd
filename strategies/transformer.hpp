// A transformer, lowered for one pipeline stage: the kernels of each layer with exact shapes
// (forward; backward with data- and weight-gradient GEMMs apart), the tensor-parallel
// collectives between them (Megatron 1D: two all-reduces per layer and pass, or all-gather /
// reduce-scatter pairs with sequence parallelism), the activations each layer stores for its
// backward (itemised as Korthikanti et al. do) and the parameters each rank holds.
#pragma once

#include <string>
#include <vector>

#include "strategies/model.hpp"
#include "strategies/program.hpp"

namespace stratasim::strategies {

/// The per-rank setting a layer is lowered for.
struct LayerSetting {
  int tp = 1;
  bool sequence_parallel = false;
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 2048;
  DType dtype = DType::bf16;
  bool flash_attention = false;
  /// Keep every compute op within one layer (ZeRO-3 gathers each layer's parameters before
  /// its first op); otherwise neighbouring compute segments merge across layers.
  bool split_layers = false;
};

/// A piece of one pass of a stage: compute kernels, or a tensor-parallel collective.
struct Segment {
  bool compute = true;
  std::vector<Kernel> kernels;  // compute segments
  CollectiveKind collective = CollectiveKind::all_reduce;
  Bytes bytes;  // collective segments: nccl-tests size
  std::string label;
  int layer_begin = -1;  // transformer layers touched (embedding and head: none)
  int layer_end = -1;
  /// Stored activations allocated (> 0, forward) or released (< 0, backward) when it ends.
  Bytes activation_delta;
  /// Forward work repeated in a backward pass (activation recomputation): its ops get
  /// Phase::recompute.
  bool recompute = false;
  /// Gradient units (see StagePlan::grad_units) complete when this backward segment ends.
  std::vector<int> grads_done;
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
};

struct StagePlan {
  std::vector<Segment> forward;   // one microbatch's forward pass
  std::vector<Segment> backward;  // one microbatch's backward pass
  std::vector<GradUnit> grad_units;
  std::int64_t parameters = 0;  // per rank
  Bytes boundary_bytes;         // activation (and its gradient) sent to the next stage
};

/// Activations one layer stores for backward, per rank and microbatch. Summed they follow
/// Korthikanti et al.: sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/(ht)) with
/// tensor parallelism, sbh(34/t + 5as/(ht)) with sequence parallelism (2-byte dtype).
std::vector<ActivationItem> layer_activations(const TransformerModel& model,
                                              const LayerSetting& setting);

/// Parameters of one layer held by one tensor-parallel rank (weights and column-parallel biases
/// sharded, row-parallel biases and norms replicated, as in Megatron).
std::int64_t layer_parameters_per_rank(const TransformerModel& model, int tp);

/// The plan of stage `stage` of `stages`, covering layers [layer_begin, layer_end); the first
/// stage also runs the embedding, the last the final norm, LM head and loss.
StagePlan plan_transformer_stage(const TransformerModel& model, const LayerSetting& setting,
                                 int stage, int stages, int layer_begin, int layer_end);

}  // namespace stratasim::strategies
