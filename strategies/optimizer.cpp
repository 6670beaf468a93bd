#include "strategies/optimizer.hpp"

#include <cmath>

namespace stratasim::strategies {

// The table is in enum order.
static_assert([] {
  for (int k = 0; k < kOptimizerKindCount; ++k) {
    if (kOptimizerTraits[k].kind != static_cast<OptimizerKind>(k)) return false;
  }
  return true;
}());

std::string_view name_of(OptimizerKind k) {
  if (static_cast<int>(k) >= kOptimizerKindCount) return "?";
  return traits_of(k).name;
}

std::optional<OptimizerKind> optimizer_from_name(std::string_view name) {
  for (const OptimizerTraits& t : kOptimizerTraits) {
    if (t.name == name) return t.kind;
  }
  return std::nullopt;
}

StateBytes state_bytes_per_parameter(const ModelStateFormat& format) {
  return {size_of(format.dtype), size_of(format.grad_dtype)};
}

namespace {

// S(n): the optimizer's own states (strategies/optimizer.hpp).
std::int64_t own_states(OptimizerKind kind, std::int64_t n) {
  if (n <= 0) return 0;
  const OptimizerTraits& t = traits_of(kind);
  std::int64_t bytes = n * t.state_tensors * t.state_element_bytes;
  if (t.quantisation_block > 0) {
    bytes += (n + t.quantisation_block - 1) / t.quantisation_block * 4 * t.state_tensors;
  }
  if (t.factored_second_moment) {
    bytes += 8 * static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  }
  return bytes;
}

}  // namespace

Bytes optimizer_state_bytes(const ModelStateFormat& format, std::int64_t parameters) {
  std::int64_t per_param = 0;
  if (format.master_weights()) per_param += 4;
  if (format.fp32_grad_copy && size_of(format.grad_dtype) < 4) per_param += 4;
  return Bytes(parameters * per_param + own_states(format.optimizer, parameters));
}

UpdateBytes optimizer_update_bytes(const OptimizerStep& step) {
  const std::int64_t n = step.params;
  const std::int64_t e = size_of(step.dtype);
  const bool master = e < 4;
  const std::int64_t grad = step.on_host || step.fp32_grads ? 4 : e;
  const std::int64_t states = own_states(step.kind, n);
  // Read: the gradient (once per pass), the fp32 master (or fp32 weights), the states.
  const std::int64_t read = n * (grad * traits_of(step.kind).gradient_reads + 4) + states;
  // Written: the master (or fp32 weights), the states, the e-byte weights in mixed precision.
  const std::int64_t written = n * (4 + (master ? e : 0)) + states;
  return {Bytes(read), Bytes(written)};
}

}  // namespace stratasim::strategies
