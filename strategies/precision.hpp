// FP8 and FP4 training (training.dtype "fp8" / "fp4", training.fp8): which GEMMs run in the low
// precision, which quantisation (cast) and amax kernels run around them, and what the quantised
// copies of the weights hold in memory. docs/precision.md explains every rule with its sources.
//
// What runs in low precision (Transformer Engine's recipes, as Megatron-LM and NeMo use them):
// the GEMMs of the transformer layers' linear layers (qkv, proj, fc1, fc2, MLA's projections, an
// MoE layer's shared experts: forward, dgrad and wgrad) and the routed experts' grouped GEMMs
// (TE's GroupedLinear); low_precision_gemm() is the one rule. The MoE router (Megatron's
// TopKRouter, a plain linear in bf16 or fp32) stays in the high-precision dtype. The attention core
// (softmax, the two batched GEMMs or the fused kernel) stays in the high-precision dtype unless
// `attention` (TE's FP8 dot-product attention), and so do norms, embeddings, the LM head and the
// loss; `bf16_first_layers` / `bf16_last_layers` keep whole layers in it (Megatron-LM's
// --first-last-layers-bf16). Everything else (activations stored, gradients, weights, optimizer)
// keeps training.dtype's high-precision dtype (bf16).
//
// Recipes (ScalingRecipe) and the GEMM kernel class each runs (hw::GemmScaling):
// - delayed (TE DelayedScaling): one scale per tensor from an amax history
//   (amax_history_len, amax_compute_algo); the amax is taken inside the cast kernel; tensor.
// - current (TE Float8CurrentScaling, "tensorwise"): one scale per tensor from the tensor's own
//   amax: an amax pass (read 2 B/elt) before every cast; tensor.
// - block (TE Float8BlockScaling, DeepSeek-V3): 1x128 scales for activations and gradients,
//   128x128 for weights (fp32 scales); block (DeepGEMM on Hopper).
// - mxfp8 (TE MXFP8BlockScaling, Blackwell): 1x32 blocks with E8M0 scales; mx.
// - nvfp4 (TE NVFP4BlockScaling, Blackwell, training.dtype "fp4"): 1x16 blocks of E2M1 with E4M3
//   scales and one fp32 scale per tensor (an amax pass first); mx.
//
// Cast kernels (memory bound, sized by the tensor's elements n): read n x e (e = the
// high-precision dtype's bytes) and write, per direction quantised, the packed low-precision
// elements plus their scales (quantised_bytes). Directions: a GEMM on Hopper or Ada reads FP8
// operands K-major only, so each of input, weight and output gradient is quantised twice, as
// itself and transposed (TE's cast_transpose: X for fprop, X^T for wgrad, W^T for dgrad, dY^T
// for wgrad); block, MXFP8 and NVFP4 quantise both directions on every device (the scales run
// along the reduced dimension, which differs); a device with FP4 tensor cores (Blackwell) reads
// tensor-scaled FP8 in either order: one direction.
// Fused casts (delayed, block, mxfp8 only: a scale known before the pass): the norm before qkv
// and fc1 writes their FP8 input, the activation before fc2 its FP8 input, the activation's
// backward fc1's FP8 output gradient (TE's LayerNormLinear, LayerNormMLP, cast_transpose_dbias_
// dgelu): no kernel of their own. Every other cast is a kernel: proj's input (unless FP8
// attention writes it), the output gradients of qkv, proj and fc2; with current scaling and
// NVFP4 every cast is one, after its amax kernel. Weights are quantised once per iteration (TE
// caches them over the microbatches: is_first_microbatch), after the optimizer step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hw_models/device.hpp"
#include "hw_models/dtype.hpp"
#include "hw_models/kernel_model.hpp"
#include "strategies/program.hpp"

namespace stratasim::strategies {

/// FP8 element formats: E4M3 everywhere, or HYBRID (E4M3 forward, E5M2 gradients). Both run at
/// the device's FP8 rate and take a byte; the format changes accuracy, not cost.
enum class Fp8Format { e4m3, hybrid };
std::string_view name_of(Fp8Format f);

enum class ScalingRecipe { delayed, current, block, mxfp8, nvfp4 };
/// "delayed", "current", "block", "mxfp8", "nvfp4".
std::string_view name_of(ScalingRecipe r);
std::optional<ScalingRecipe> scaling_recipe_from_name(std::string_view name);

/// How the amax history gives the scale of delayed scaling: its maximum, or the newest value.
enum class AmaxAlgo { max, most_recent };
std::string_view name_of(AmaxAlgo a);

/// training.fp8 (with training.dtype "fp8" or "fp4").
struct LowPrecisionSpec {
  DType dtype = DType::fp8;  // the GEMMs' dtype: fp8 or fp4
  Fp8Format format = Fp8Format::hybrid;
  ScalingRecipe recipe = ScalingRecipe::delayed;  // fp4: nvfp4 only
  int amax_history_len = 1024;                    // TE DelayedScaling's default
  AmaxAlgo amax_compute_algo = AmaxAlgo::max;
  bool attention = false;     // FP8 dot-product attention (TE's fp8_dpa): fused kernel in fp8
  int bf16_first_layers = 0;  // layers kept in the high-precision dtype at the model's start
  int bf16_last_layers = 0;   // ... and end
  /// Weights kept and all-gathered in FP8 (Megatron-LM's --fp8-param-gather with the
  /// distributed optimizer, FSDP2's enable_fsdp_float8_all_gather): the bf16 copy of the linear
  /// weights is not kept, the data-parallel all-gathers of them move 1 byte an element and the
  /// optimizer writes the quantised shard.
  bool param_gather = false;
  /// Sequence-parallel all-gathers of the linear layers' inputs in FP8 (Transformer Engine's
  /// userbuffers with FP8 communication).
  bool tp_comm = false;

  bool operator==(const LowPrecisionSpec&) const = default;
};

/// The GEMM kernel class of a recipe: tensor (delayed, current), block, mx (mxfp8, nvfp4).
hw::GemmScaling gemm_scaling(ScalingRecipe r);
/// Whether a recipe's scale is known before a cast runs, so that TE fuses the cast into the
/// kernel producing the tensor (delayed, block, mxfp8); current and nvfp4 need an amax pass.
bool fused_casts(ScalingRecipe r);
/// Directions each tensor is quantised in on `device`: 2 (itself and transposed) or 1 (see
/// the header comment).
int quantised_directions(const LowPrecisionSpec& spec, const hw::DeviceSpec& device);
/// What training in `spec` on `device` lacks, or nothing: FP8 needs the device's own FP8 peak
/// (not a fallback: A100, V100 and the FPGAs have none), FP4 its FP4 peak (Blackwell), fp4
/// takes the nvfp4 recipe and nvfp4 fp4; mxfp8 needs Blackwell's block-scaled tensor cores (an
/// FP4 peak stands for them).
std::optional<std::string> low_precision_problem(const LowPrecisionSpec& spec,
                                                 const hw::DeviceSpec& device);

/// Bytes one direction of a quantised tensor of `elements` elements takes: the packed elements
/// and their scales (block: one fp32 per 128 elements of activations and gradients, per 128 x
/// 128 of weights; mxfp8: one byte per 32; nvfp4: one byte per 16; tensor scaling: none).
std::int64_t quantised_bytes(const LowPrecisionSpec& spec, std::int64_t elements, bool weight);

/// The cast kernel of a tensor of `elements` elements of high-precision element size `e`:
/// reads elements x e, writes directions x quantised_bytes. Named `name`.
Kernel quantise_kernel(const LowPrecisionSpec& spec, std::string name, std::int64_t elements,
                       std::int64_t e, int directions, bool weight = false);
/// The amax pass before a cast (current scaling, NVFP4's per-tensor scale): reads elements x e,
/// writes one fp32.
Kernel amax_kernel(std::string name, std::int64_t elements, std::int64_t e);

/// The GEMMs of a transformer layer by role, for the one rule of which run in low precision.
enum class GemmRole : std::uint8_t {
  linear,          // qkv, proj, fc1, fc2, MLA's projections, the shared experts' fc1 and fc2
  expert,          // the routed experts' fc1 and fc2 (TE GroupedLinear, or one TE Linear each)
  router,          // the MoE router (and Qwen's shared-expert gate): torch linears
  attention_core,  // QK^T and PV, or the fused kernel
  head,            // the LM head (Megatron's output layer is not a TE module)
};
/// Whether a GEMM of `role` in a low-precision layer runs in spec.dtype: linear and expert
/// always, attention_core with spec.attention, router and head never.
bool low_precision_gemm(const LowPrecisionSpec& spec, GemmRole role);
/// Whether layer `layer` (0-based) of a model of `layers` runs its low-precision GEMMs in
/// spec.dtype: all but the first bf16_first_layers and the last bf16_last_layers.
bool low_precision_layer(const LowPrecisionSpec& spec, int layer, int layers);
/// The kernel of a GEMM [m, k] x [k, n] (`batch` of them: a grouped GEMM) in low precision:
/// spec.dtype in the recipe's class; the backward GEMMs (dgrad, wgrad) of tensor-scaled FP8
/// with 2 quantised directions (Hopper, Ada) as the block class (TE's split accumulator,
/// docs/precision.md).
Kernel low_precision_gemm_kernel(const LowPrecisionSpec& spec, int directions, std::string name,
                                 std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                                 bool backward);
/// Appends to `k` the quantisation of an activation or gradient of `elements` (element size
/// e) that feeds a low-precision GEMM: nothing when `fused` (the producing kernel writes it in
/// FP8) and the recipe fuses casts; else an amax pass where the recipe has no fused casts, and
/// the cast kernel `<name>.cast`.
void append_quantise(const LowPrecisionSpec& spec, const std::string& name, std::int64_t elements,
                     std::int64_t e, int directions, bool fused, std::vector<Kernel>& k);
/// ... of a weight: an amax pass where the recipe has no fused casts, and the cast.
void append_quantise_weight(const LowPrecisionSpec& spec, const std::string& name,
                            std::int64_t elements, std::int64_t e, int directions,
                            std::vector<Kernel>& k);

/// What a low-precision linear layer saves of its input of `elements` for its backward: the
/// quantised copy in one direction (TE's Linear, LayerNormLinear, LayerNormMLP and
/// GroupedLinear save the FP8 input the GEMM read, and on Hopper only its columnwise X^T for
/// wgrad), quantised_bytes of it, in place of the high-precision input.
Bytes saved_input_bytes(const LowPrecisionSpec& spec, std::int64_t elements);

/// Bytes of `elements` of tokens dispatched in FP8 (parallelism.moe_fp8_dispatch: DeepEP's and
/// DeepSeek-V3's format, E4M3 with one fp32 scale per 128 elements of a token, whatever the
/// recipe): elements + 4 ceil(elements / 128).
std::int64_t fp8_dispatch_bytes(std::int64_t elements);

/// Whether the recipe keeps amax histories that TE all-reduces (max) over the amax reduction
/// group at the end of every forward of an fp8_autocast region and of its backward: delayed
/// scaling only (current scaling takes each tensor's own amax, the block, MXFP8 and NVFP4
/// recipes scale blocks inside the cast: no history to reduce).
bool reduces_amax(const LowPrecisionSpec& spec);
/// Bytes of that all-reduce for a region of `gemms` low-precision GEMMs (a grouped GEMM of n
/// experts counts n): one fp32 amax per FP8 tensor, 3 per GEMM in the forward (TE's
/// scaling_fwd: input, weight, output) and 2 in the backward (scaling_bwd: output gradient,
/// input gradient).
Bytes amax_reduction_bytes(std::int64_t gemms, bool forward);

/// Bytes an all-gather (or the gathered copy) of `parameters` weights of which `low` are linear
/// weights takes with FP8 parameter gathering (spec.param_gather): the linear weights quantised
/// in one direction (quantised_bytes), the others at `element_size` bytes; without it all at
/// `element_size`.
Bytes gathered_weight_bytes(const std::optional<LowPrecisionSpec>& spec, std::int64_t parameters,
                            std::int64_t low, std::int64_t element_size);

/// Bytes the quantised copies of `parameters` linear weights keep besides them (TE's FP8 weight
/// and transpose cache): directions x quantised_bytes(spec, parameters, weight). The amax
/// histories (3 tensors per linear x amax_history_len x 4 bytes: 48 KiB per layer at 1024) are
/// left out.
Bytes weight_copy_bytes(const LowPrecisionSpec& spec, int directions, std::int64_t parameters);

}  // namespace stratasim::strategies
