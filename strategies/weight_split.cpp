#include "strategies/weight_split.hpp"

#include <utility>

namespace stratasim::strategies {

bool is_weight_gradient(const Kernel& kernel) {
  return kernel.name.ends_with(".wgrad") || kernel.name == "embedding.grad" ||
         kernel.name == "embedding.position_grad";
}

Bytes weight_gradient_operand_bytes(const Kernel& kernel) {
  if (const auto* g = std::get_if<Gemm>(&kernel.work)) {
    return Bytes((g->m * g->k + g->k * g->n) * g->batch * size_of(g->dtype));
  }
  if (const auto* e = std::get_if<Elementwise>(&kernel.work)) return e->bytes_read;
  if (const auto* r = std::get_if<RooflineWork>(&kernel.work)) return r->bytes;
  return Bytes(0);
}

StagePlan split_backward(StagePlan plan) {
  if (!plan.weight.empty()) return plan;
  bool any = false;
  for (const Segment& b : plan.backward) {
    for (const Kernel& k : b.kernels) any = any || is_weight_gradient(k);
  }
  if (!any) return plan;  // nothing to split: B stays whole
  // Units completed by a segment without weight kernels (a norm after a collective) complete
  // with the W segment created last before it, or the next one when none was.
  std::vector<int> orphans;
  for (Segment& b : plan.backward) {
    if (!b.compute) continue;
    Segment w;
    w.compute = true;
    w.label = b.label + " W";
    w.layer_begin = b.layer_begin;
    w.layer_end = b.layer_end;
    w.chain = b.chain;
    std::vector<Kernel> keep;
    Bytes operands;
    for (Kernel& k : b.kernels) {
      if (is_weight_gradient(k)) {
        operands += weight_gradient_operand_bytes(k);
        w.kernels.push_back(std::move(k));
      } else {
        keep.push_back(std::move(k));
      }
    }
    if (w.kernels.empty()) {
      auto& target = plan.weight.empty() ? orphans : plan.weight.back().grads_done;
      target.insert(target.end(), b.grads_done.begin(), b.grads_done.end());
      b.grads_done.clear();
      continue;
    }
    b.kernels = std::move(keep);
    const Bytes held = b.weight_grad_bytes.count() > 0 ? b.weight_grad_bytes : operands;
    b.activation_delta += held;
    w.activation_delta = -held;
    w.grads_done = std::move(orphans);
    orphans.clear();
    w.grads_done.insert(w.grads_done.end(), b.grads_done.begin(), b.grads_done.end());
    b.grads_done.clear();
    plan.weight.push_back(std::move(w));
  }
  return plan;
}

}  // namespace stratasim::strategies
