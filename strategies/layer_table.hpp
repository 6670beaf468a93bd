// Layer-table models (`"type": "layers"`): a network given as a list of layers with their
// parameters, stored activations, outputs and either their FLOPs (costed at the device's
// roofline) or measured times. They cover networks outside the transformer family (CNNs,
// LSTMs) and profiled inputs (per-layer times from a profiler), and lower to the same
// StagePlan as transformer stages, for pipeline and data parallelism (no tensor parallelism).
//
// Every figure is given for one micro-batch of `batch` samples; a plan for another micro-batch
// size scales FLOPs, times and bytes linearly (exact when the sizes are equal; an approximation
// otherwise: real kernels are less efficient on small batches, and some tensors, such as
// weight-sized workspaces, do not grow with the batch).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "hw_models/dtype.hpp"
#include "hw_models/units.hpp"
#include "strategies/program.hpp"
#include "strategies/transformer.hpp"

namespace stratasim::strategies {

/// One layer (or `repeat` identical consecutive layers) of a layer-table model. All figures are
/// per micro-batch of LayerTableModel::batch samples.
struct TableLayer {
  std::string name;
  int repeat = 1;           // consecutive identical layers
  std::int64_t params = 0;  // parameters (elements)
  Bytes activation_bytes;   // stored in forward for backward
  Bytes output_bytes;       // sent to the next stage (and its gradient back)
  /// Of activation_bytes, what the weight-gradient pass still needs once the input-gradient
  /// pass has run (Zero Bubble's M_W); the rest (M_B) could be freed after the input gradient.
  Bytes weight_grad_bytes;
  // Either FLOPs (costed by the device roofline as RooflineWork kernels)...
  std::optional<Flops> forward_flops, backward_input_flops, backward_weight_flops;
  // ...or measured times (Measured kernels). Exactly one of the two families per layer.
  std::optional<Time> forward_time, backward_input_time, backward_weight_time;
  /// Device-memory traffic of the forward pass for the roofline (FLOPs family only). The
  /// input-gradient kernel is taken to move as much; the weight-gradient kernel too when the
  /// layer has parameters (else it moves nothing).
  Bytes forward_bytes;

  bool uses_flops() const { return forward_flops || backward_input_flops || backward_weight_flops; }
  bool uses_times() const { return forward_time || backward_input_time || backward_weight_time; }
};

struct LayerTableModel {
  std::string name;
  std::string source;
  std::int64_t batch = 1;          // the micro-batch size (samples) the figures are given for
  std::vector<TableLayer> layers;  // as written (with repeat)

  /// Each repeat as its own layer (repeat = 1); names get ".0", ".1", ... when repeat > 1.
  std::vector<TableLayer> expanded() const;
  /// Layers after expansion (the indices plans and pipelines use).
  int layer_count() const;
  /// Parameters of the whole model, repeats included.
  std::int64_t parameters() const;

  /// Throws config::ValidationError with the offending key's path relative to the model
  /// ("layers[3].forward_flops"): batch >= 1; at least one layer and at most 32767 after
  /// expansion; each layer named, repeat >= 1, no negative quantity, weight_grad_bytes within
  /// activation_bytes, and exactly one complete family (three FLOPs, or three times).
  void validate() const;
};

/// Reads a layer-table model from the object at `path` of `doc` (strict: unknown keys are errors
/// with a suggestion; validated). Keys: "type": "layers", "name", "source", "batch", "layers".
/// Each layer: "name", "repeat", "params", "activation_bytes", "output_bytes",
/// "weight_grad_bytes", "forward_bytes" (sizes with units), "forward_flops",
/// "backward_input_flops", "backward_weight_flops" (FLOP with units, "3.1 GFLOP", or plain
/// numbers) or "forward_time", "backward_input_time", "backward_weight_time" ("1.2 ms").
/// In either family the backward figures default to the forward one for the input gradient,
/// and for the weight gradient to the forward one when the layer has parameters, else zero.
/// Errors name the layer by its position: "model.layers[2].forwad_flops".
LayerTableModel read_layer_table(const config::Document& doc, const std::string& path);

/// The per-rank setting a layer table is planned for.
struct LayerTableSetting {
  std::int64_t micro_batch = 1;  // samples per micro-batch
  DType dtype = DType::bf16;     // of the RooflineWork kernels
};

/// The plan of the expanded layers [layer_begin, layer_end), scaled to setting.micro_batch:
/// - forward: one compute segment per layer (label: the layer's name, layer range: its expanded
///   index) with one kernel "<name>.fwd" (RooflineWork{flops, forward_bytes, dtype} or
///   Measured{time}); activation_delta = +activation_bytes;
/// - backward: one compute segment per layer, last layer first, with the input-gradient kernel
///   "<name>.dgrad" then the weight-gradient kernel "<name>.wgrad" (so that a later pass can
///   move the ".wgrad" kernels into a weight pass); activation_delta = -activation_bytes;
///   grads_done = the layer's gradient unit. A kernel with no work at all is left out (a layer
///   without parameters has no ".wgrad"; the first layer of a CNN may have no ".dgrad"); a
///   segment without any work keeps its first kernel;
/// - weight: empty;
/// - grad_units: one per layer, "L<index>" (expanded index) with the layer's parameters, in
///   backward order (last layer first); parameters: their sum;
/// - boundary_bytes: output_bytes of the last layer.
/// Throws std::invalid_argument unless 0 <= layer_begin < layer_end <= layer_count() and
/// micro_batch >= 1.
StagePlan plan_layer_table_stage(const LayerTableModel& model, const LayerTableSetting& setting,
                                 int layer_begin, int layer_end);

/// What the weight-gradient pass of expanded layer `layer` holds after its input-gradient pass
/// (Zero Bubble's M_W): the layer's weight_grad_bytes, scaled to setting.micro_batch. A split
/// backward releases activation_bytes - weight_grad_bytes at the end of the input gradient and
/// the rest at the end of the weight gradient.
Bytes weight_grad_bytes(const LayerTableModel& model, const LayerTableSetting& setting, int layer);

/// A figure given for `batch` samples, scaled to `micro_batch` samples (rounded up to a whole
/// byte or picosecond).
Bytes scale_to_micro_batch(Bytes b, std::int64_t micro_batch, std::int64_t batch);
Time scale_to_micro_batch(Time t, std::int64_t micro_batch, std::int64_t batch);
Flops scale_to_micro_batch(Flops f, std::int64_t micro_batch, std::int64_t batch);

}  // namespace stratasim::strategies
