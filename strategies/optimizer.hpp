// Optimizers and the model states they keep: ONE table (kOptimizerTraits) that the lowering
// (what a rank allocates, strategies/lowering), the memory estimates (recomputation and
// partition planning, the sweep's pre-filter) and the cost model (sim/cost.cpp: the optimizer
// step on the device and on the host) all read. Nothing else knows what an optimizer keeps.
//
// Model states per parameter, with e the size of the training dtype (weights as the layers use
// them), g the size of the gradient buffers (training.grad_accumulation_dtype) and S(n) the
// optimizer's own states for n parameters:
//   weights      e
//   gradients    g
//   optimizer    4 (fp32 master weights, mixed precision only: e < 4)
//              + 4 (fp32 copy of the gradients, only with `fp32_grad_copy`: Megatron-LM's
//                   Float16OptimizerWithFloat16Params when the gradient buffers are 16-bit)
//              + S(n) / n
// S(n) = n x state_tensors x state_element_bytes
//      + ceil(n / quantisation_block) x 4 x state_tensors   (one fp32 absmax per block and state)
//      + 8 ceil(sqrt(n))                                     (factored second moment, see below)
//
// So mixed-precision Adam keeps 2 + 2 + 12 = 16 bytes (ZeRO, arXiv:1910.02054 sec. 3.1), 18
// with fp32 gradient buffers (Megatron-LM's bf16 default), 20 with fp16 gradients and the fp32
// copy (Megatron-LM's fp16 default); fp32 training keeps 4 + 4 + 8 = 16 (no master copy).
// These three are Megatron-LM's table (docs/source/api-guide/dist_optimizer.md, "theoretical
// number of bytes per parameter": 20, 18, 16); tests/reference/optimizer_test.cpp checks them.
//
// The optimizers (state tensors per parameter; PyTorch's defaults where the optimizer has
// options):
//   adam, adamw     m and v in fp32 (Kingma & Ba 2015; AdamW, Loshchilov & Hutter 2019, has the
//                   same states, the weight decay is applied to the weights)
//   sgd             none (torch.optim.SGD, momentum 0)
//   sgd_momentum    the momentum buffer (torch.optim.SGD, momentum > 0)
//   rmsprop         square_avg (torch.optim.RMSprop: momentum 0, centered False)
//   adagrad         state_sum (torch.optim.Adagrad)
//   adafactor       no first moment (beta1 None, the paper's and Hugging Face's default) and a
//                   factored second moment: a row and a column accumulator per matrix,
//                   4 (rows + cols) bytes for a rows x cols matrix (Shazeer & Stern 2018).
//                   Approximation: a rank's n parameters are taken as one square matrix,
//                   8 ceil(sqrt(n)) bytes. A real model has one pair per matrix (a GPT layer with
//                   hidden h: about 16h floats for 12h^2 parameters), still under 0.01 byte per
//                   parameter for h >= 1024, so the error is negligible beside the weights.
//   lion            the momentum only (Chen et al. 2023, "Symbolic Discovery of Optimization
//                   Algorithms": Lion keeps one state)
//   adam8bit        m and v in 8 bits, block-wise quantised with one fp32 absmax per block of
//                   2048 elements and state (bitsandbytes; Dettmers et al. 2022, arXiv:2110.02861)
//
// The update (one pass over the shard, memory bound): per parameter it reads the gradient (g
// bytes; fp32 on the host: ZeRO-Offload keeps fp32 gradients there), the fp32 master weights (or
// the fp32 weights themselves) and the states, and writes the master and the states back and,
// in mixed precision, the e-byte weights the layers use. Adafactor reads the gradient twice (the
// row and column means, then the update). optimizer_update_bytes() gives these figures.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "hw_models/dtype.hpp"
#include "hw_models/units.hpp"
#include "strategies/precision.hpp"
#include "strategies/program.hpp"

namespace stratasim::strategies {

struct OptimizerTraits {
  OptimizerKind kind;
  std::string_view name;            // config name ("adam", "sgd_momentum", ...)
  int state_tensors;                // element-wise states per parameter (m, v, ...)
  int state_element_bytes;          // bytes of one state element (4: fp32, 1: 8-bit)
  std::int64_t quantisation_block;  // elements per quantisation block (0: not quantised)
  bool factored_second_moment;      // Adafactor's row and column accumulators
  int gradient_reads;               // passes over the gradient in one update
};

inline constexpr OptimizerTraits kOptimizerTraits[kOptimizerKindCount] = {
    // kind, name, states, bytes each, quantisation block, factored, gradient reads
    {OptimizerKind::adam, "adam", 2, 4, 0, false, 1},
    {OptimizerKind::sgd, "sgd", 0, 4, 0, false, 1},
    {OptimizerKind::adamw, "adamw", 2, 4, 0, false, 1},
    {OptimizerKind::sgd_momentum, "sgd_momentum", 1, 4, 0, false, 1},
    {OptimizerKind::rmsprop, "rmsprop", 1, 4, 0, false, 1},
    {OptimizerKind::adagrad, "adagrad", 1, 4, 0, false, 1},
    {OptimizerKind::adafactor, "adafactor", 0, 4, 0, true, 2},
    {OptimizerKind::lion, "lion", 1, 4, 0, false, 1},
    {OptimizerKind::adam8bit, "adam8bit", 2, 1, 2048, false, 1},
};

/// The row of `k`.
constexpr const OptimizerTraits& traits_of(OptimizerKind k) {
  return kOptimizerTraits[static_cast<std::size_t>(k)];
}
/// The optimizer called `name` (a config name of the table), if any.
std::optional<OptimizerKind> optimizer_from_name(std::string_view name);

/// How a rank stores its model states.
struct ModelStateFormat {
  DType dtype = DType::bf16;       // the weights the layers use (the training dtype)
  DType grad_dtype = DType::bf16;  // gradient buffers: microbatch accumulation and dp reduction
  OptimizerKind optimizer = OptimizerKind::adam;
  /// The optimizer keeps an fp32 copy of 16-bit gradients (Megatron-LM's
  /// Float16OptimizerWithFloat16Params and distributed optimizer with fp16/bf16 main grads).
  bool fp32_grad_copy = false;
  /// FP8 / FP4 training (strategies/precision.hpp): the linear weights' quantised copies are
  /// kept besides them (quantised_directions directions), or instead of their `dtype` copy with
  /// low_precision->param_gather (device_model_states in strategies/lowering/pipeline_spec.hpp).
  std::optional<LowPrecisionSpec> low_precision;
  int quantised_directions = 2;
  /// Mixed precision: the optimizer updates fp32 master weights (training dtype under 4 bytes).
  bool master_weights() const { return size_of(dtype) < 4; }
};

/// Bytes per parameter of the weights and of the gradient buffers.
struct StateBytes {
  std::int64_t parameters, gradients;
};
StateBytes state_bytes_per_parameter(const ModelStateFormat& format);

/// The optimizer's part of the model states of `parameters` parameters (fp32 master weights,
/// the fp32 gradient copy, the optimizer's states): see the header comment.
Bytes optimizer_state_bytes(const ModelStateFormat& format, std::int64_t parameters);

/// Bytes one update of `step.params` parameters reads and writes (see the header comment).
struct UpdateBytes {
  Bytes read, written;
  Bytes total() const { return read + written; }
};
UpdateBytes optimizer_update_bytes(const OptimizerStep& step);

}  // namespace stratasim::strategies
