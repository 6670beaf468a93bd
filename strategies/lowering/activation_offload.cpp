#include <array>

#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

ActivationOffload::ActivationOffload(Assembly& assembly)
    : out_label_(assembly.program.intern_label("checkpoint to host")),
      in_label_(assembly.program.intern_label("checkpoint from host")) {}

void ActivationOffload::rank_begins(RankEmitter&) {
  staged_.reset();
}

void ActivationOffload::before_segment(RankEmitter& rank, const PassState& ps, SegmentState& seg) {
  const TemplateStep& step = seg.step;
  // A checkpoint on its way to the host is staged on the device: one at a time.
  if (step.checkpoint_delta.count() > 0) staged_.claim(seg.deps);
  if (step.checkpoint_fetch.count() <= 0) return;
  // The checkpoint comes back from the host before the group's recompute.
  const std::array<MemoryEffect, 2> in = {
      MemoryEffect{step.checkpoint_fetch, MemoryCategory::activations, MemoryTier::device, false},
      MemoryEffect{-step.checkpoint_fetch, MemoryCategory::activations, MemoryTier::host, true}};
  OpInfo copy{Stream::copy, Phase::recompute, ps.microbatch, step.layer_begin, step.layer_end, {}};
  copy.label_id = in_label_;
  // Just in time: the copy may start once the op before the previous one has ended, which
  // leaves one op to hide it behind (without a dependency the in-order copy stream would bring
  // the checkpoint straight back after sending it).
  const std::array<OpId, 1> when = {ps.earlier.value_or(0)};
  seg.deps.push_back(
      rank.program.add(Compute{step.checkpoint_in}, copy,
                       ps.earlier ? std::span<const OpId>(when) : std::span<const OpId>(), in));
}

void ActivationOffload::after_segment(RankEmitter& rank, const PassState& ps,
                                      const SegmentState& seg, OpId op) {
  const TemplateStep& step = seg.step;
  if (step.checkpoint_delta.count() <= 0) return;
  // The checkpoint leaves for the host once stored; the device frees it after the copy.
  const std::array<MemoryEffect, 2> out = {
      MemoryEffect{step.checkpoint_delta, MemoryCategory::activations, MemoryTier::host, false},
      MemoryEffect{-step.checkpoint_delta, MemoryCategory::activations, MemoryTier::device, true}};
  OpInfo copy{Stream::copy, ps.phase, ps.microbatch, step.layer_begin, step.layer_end, {}};
  copy.label_id = out_label_;
  const std::array<OpId, 1> after = {op};
  staged_.issued(rank.program.add(Compute{step.checkpoint_out}, copy, after, out));
}

}  // namespace stratasim::strategies
