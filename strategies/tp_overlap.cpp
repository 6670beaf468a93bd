#include "strategies/tp_overlap.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace stratasim::strategies {

namespace {

// One pass, k copies interleaved block by block: a block ends with a collective (or the pass).
std::vector<Segment> interleave(const std::vector<Segment>& pass, int k) {
  std::vector<Segment> out;
  out.reserve(pass.size() * static_cast<std::size_t>(k));
  std::size_t begin = 0;
  while (begin < pass.size()) {
    std::size_t end = begin;
    while (end < pass.size() && pass[end].compute) ++end;
    if (end < pass.size()) ++end;  // the collective that closes the block
    for (int j = 0; j < k; ++j) {
      for (std::size_t i = begin; i < end; ++i) {
        Segment copy = pass[i];
        copy.chain = j;
        copy.label += " [sub " + std::to_string(j) + "]";
        if (j != k - 1) copy.grads_done.clear();
        out.push_back(std::move(copy));
      }
    }
    begin = end;
  }
  return out;
}

void require_one_chain(const std::vector<Segment>& pass) {
  for (const Segment& s : pass) {
    if (s.chain != 0) {
      throw std::invalid_argument("sub_pipeline: segment '" + s.label + "' is already on chain " +
                                  std::to_string(s.chain) +
                                  "; sub-pipelining expects a plan with one chain");
    }
  }
}

}  // namespace

StagePlan sub_pipeline(const StagePlan& sub, int k) {
  if (k < 1) {
    throw std::invalid_argument("sub_pipeline: tp_overlap must be >= 1 sub-batches, got " +
                                std::to_string(k));
  }
  require_one_chain(sub.forward);
  require_one_chain(sub.backward);
  require_one_chain(sub.weight);
  if (k == 1) return sub;
  StagePlan plan;
  plan.forward = interleave(sub.forward, k);
  plan.backward = interleave(sub.backward, k);
  plan.weight = interleave(sub.weight, k);
  plan.grad_units = sub.grad_units;
  plan.parameters = sub.parameters;
  plan.boundary_bytes = sub.boundary_bytes * k;
  return plan;
}

StagePlan plan_transformer_stage_sub_pipelined(const TransformerModel& model,
                                               const LayerSetting& setting, int stage, int stages,
                                               int layer_begin, int layer_end,
                                               const StageRecompute& recompute, int k) {
  if (k < 1 || setting.micro_batch % k != 0) {
    throw std::invalid_argument(
        "tp_overlap = " + std::to_string(k) + " must be >= 1 and divide the micro batch (" +
        std::to_string(setting.micro_batch) +
        " samples): sub-pipelined tensor parallelism splits each microbatch into tp_overlap "
        "sub-batches of equal size");
  }
  LayerSetting per_sub = setting;
  per_sub.micro_batch = setting.micro_batch / k;
  return sub_pipeline(
      plan_transformer_stage(model, per_sub, stage, stages, layer_begin, layer_end, recompute), k);
}

}  // namespace stratasim::strategies
