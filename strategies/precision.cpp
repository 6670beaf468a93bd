#include "strategies/precision.hpp"

#include <algorithm>
#include <utility>

namespace stratasim::strategies {

std::string_view name_of(Fp8Format f) {
  return f == Fp8Format::e4m3 ? "e4m3" : "hybrid";
}

std::string_view name_of(ScalingRecipe r) {
  switch (r) {
    case ScalingRecipe::delayed:
      return "delayed";
    case ScalingRecipe::current:
      return "current";
    case ScalingRecipe::block:
      return "block";
    case ScalingRecipe::mxfp8:
      return "mxfp8";
    case ScalingRecipe::nvfp4:
      return "nvfp4";
  }
  return "?";
}

std::optional<ScalingRecipe> scaling_recipe_from_name(std::string_view name) {
  for (ScalingRecipe r : {ScalingRecipe::delayed, ScalingRecipe::current, ScalingRecipe::block,
                          ScalingRecipe::mxfp8, ScalingRecipe::nvfp4}) {
    if (name_of(r) == name) return r;
  }
  return std::nullopt;
}

std::string_view name_of(AmaxAlgo a) {
  return a == AmaxAlgo::max ? "max" : "most_recent";
}

hw::GemmScaling gemm_scaling(ScalingRecipe r) {
  switch (r) {
    case ScalingRecipe::delayed:
    case ScalingRecipe::current:
      return hw::GemmScaling::tensor;
    case ScalingRecipe::block:
      return hw::GemmScaling::block;
    case ScalingRecipe::mxfp8:
    case ScalingRecipe::nvfp4:
      return hw::GemmScaling::mx;
  }
  return hw::GemmScaling::tensor;
}

bool fused_casts(ScalingRecipe r) {
  return r == ScalingRecipe::delayed || r == ScalingRecipe::block || r == ScalingRecipe::mxfp8;
}

namespace {
// Blackwell's fifth-generation tensor cores (FP4, block-scaled MMA, FP8 operands in either
// major order): the devices that quote an FP4 rate.
bool blackwell_tensor_cores(const hw::DeviceSpec& device) {
  return device.has_native_peak(DType::fp4);
}
}  // namespace

int quantised_directions(const LowPrecisionSpec& spec, const hw::DeviceSpec& device) {
  if (gemm_scaling(spec.recipe) != hw::GemmScaling::tensor) return 2;
  return blackwell_tensor_cores(device) ? 1 : 2;
}

std::optional<std::string> low_precision_problem(const LowPrecisionSpec& spec,
                                                 const hw::DeviceSpec& device) {
  const std::string name(name_of(spec.dtype));
  if (device.is_fpga() || !device.has_native_peak(spec.dtype)) {
    return "expected a device with " + std::string(spec.dtype == DType::fp4 ? "FP4" : "FP8") +
           " tensor cores for \"" + name + "\" training: " + device.name + " has no peak_flops." +
           name + (spec.dtype == DType::fp4 ? " (only Blackwell GPUs have FP4)" : "");
  }
  if ((spec.dtype == DType::fp4) != (spec.recipe == ScalingRecipe::nvfp4)) {
    return std::string(
               "expected the nvfp4 recipe with \"fp4\" and an FP8 recipe (delayed, "
               "current, block, mxfp8) with \"fp8\", got \"") +
           name + "\" with " + std::string(name_of(spec.recipe));
  }
  if (spec.recipe == ScalingRecipe::mxfp8 && !blackwell_tensor_cores(device)) {
    return "expected a Blackwell GPU (one with peak_flops.fp4) for the mxfp8 recipe: " +
           device.name + " has no block-scaled tensor cores";
  }
  return std::nullopt;
}

std::int64_t quantised_bytes(const LowPrecisionSpec& spec, std::int64_t elements, bool weight) {
  const std::int64_t data = packed_bytes(spec.dtype, elements);
  const auto blocks = [&](std::int64_t size) { return (elements + size - 1) / size; };
  switch (spec.recipe) {
    case ScalingRecipe::delayed:
    case ScalingRecipe::current:
      return data;
    case ScalingRecipe::block:
      return data + 4 * blocks(weight ? 128 * 128 : 128);
    case ScalingRecipe::mxfp8:
      return data + blocks(32);
    case ScalingRecipe::nvfp4:
      return data + blocks(16);
  }
  return data;
}

Kernel quantise_kernel(const LowPrecisionSpec& spec, std::string name, std::int64_t elements,
                       std::int64_t e, int directions, bool weight) {
  return Kernel{Elementwise{elements, Bytes(elements * e),
                            Bytes(directions * quantised_bytes(spec, elements, weight))},
                std::move(name)};
}

Kernel amax_kernel(std::string name, std::int64_t elements, std::int64_t e) {
  return Kernel{Elementwise{elements, Bytes(elements * e), Bytes(4)}, std::move(name)};
}

bool low_precision_gemm(const LowPrecisionSpec& spec, GemmRole role) {
  switch (role) {
    case GemmRole::linear:
    case GemmRole::expert:
      return true;
    case GemmRole::attention_core:
      return spec.attention;
    case GemmRole::router:
    case GemmRole::head:
      return false;
  }
  return false;
}

bool low_precision_layer(const LowPrecisionSpec& spec, int layer, int layers) {
  return layer >= spec.bf16_first_layers && layer < layers - spec.bf16_last_layers;
}

Kernel low_precision_gemm_kernel(const LowPrecisionSpec& spec, int directions, std::string name,
                                 std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                                 bool backward) {
  hw::GemmScaling scaling = gemm_scaling(spec.recipe);
  if (backward && spec.dtype == DType::fp8 && scaling == hw::GemmScaling::tensor &&
      directions == 2) {
    scaling = hw::GemmScaling::block;
  }
  return Kernel{Gemm{m, n, k, batch, spec.dtype, scaling}, std::move(name)};
}

void append_quantise(const LowPrecisionSpec& spec, const std::string& name, std::int64_t elements,
                     std::int64_t e, int directions, bool fused, std::vector<Kernel>& k) {
  if (fused && fused_casts(spec.recipe)) return;
  if (!fused_casts(spec.recipe)) k.push_back(amax_kernel(name + ".amax", elements, e));
  k.push_back(quantise_kernel(spec, name + ".cast", elements, e, directions));
}

void append_quantise_weight(const LowPrecisionSpec& spec, const std::string& name,
                            std::int64_t elements, std::int64_t e, int directions,
                            std::vector<Kernel>& k) {
  if (!fused_casts(spec.recipe)) k.push_back(amax_kernel(name + ".amax", elements, e));
  k.push_back(quantise_kernel(spec, name + ".cast", elements, e, directions, true));
}

Bytes saved_input_bytes(const LowPrecisionSpec& spec, std::int64_t elements) {
  return Bytes(quantised_bytes(spec, elements, false));
}

std::int64_t fp8_dispatch_bytes(std::int64_t elements) {
  LowPrecisionSpec deepep;
  deepep.recipe = ScalingRecipe::block;  // 1 x 128 blocks of activations, fp32 scales
  return quantised_bytes(deepep, elements, false);
}

bool reduces_amax(const LowPrecisionSpec& spec) {
  return spec.recipe == ScalingRecipe::delayed;
}

Bytes amax_reduction_bytes(std::int64_t gemms, bool forward) {
  return Bytes((forward ? 3 : 2) * gemms * 4);
}

Bytes gathered_weight_bytes(const std::optional<LowPrecisionSpec>& spec, std::int64_t parameters,
                            std::int64_t low, std::int64_t element_size) {
  if (!spec || !spec->param_gather || low <= 0) return Bytes(parameters * element_size);
  low = std::min(low, parameters);
  return Bytes(quantised_bytes(*spec, low, true) + (parameters - low) * element_size);
}

Bytes weight_copy_bytes(const LowPrecisionSpec& spec, int directions, std::int64_t parameters) {
  return Bytes(directions * quantised_bytes(spec, parameters, true));
}

}  // namespace stratasim::strategies
