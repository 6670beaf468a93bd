// Techniques as hooks: the RankEmitter (strategies/lowering/rank_emitter.hpp) stamps out a rank's
// passes — receive, segments, send — and calls every hook at a few moments; each technique
// (data-parallel all-reduce, ZeRO gradient sync, ZeRO-3 parameter fetch, activation offload,
// compressed gradients, the optimizer step and its offload) adds its ops, dependencies and
// memory effects there and nothing else. The driver (assemble_pipeline) installs the hooks a
// PipelineSpec asks for, in a fixed order, and calls them in that order at every moment.
//
// A hook registers its kernel lists and labels in its constructor (once per Program), keeps its
// per-rank state itself and resets it in rank_begins(). The moments, for one rank, in order:
//
//   chunk_held(c)           per chunk the device holds: initial memory
//   (Program::add_initial_memory) rank_begins()           before the first pass: per-rank state,
//   ops issued up front for each pass:
//     pass_begins(pass)     before its receive
//     input_received(pass, boundary, input)   after a receive from another device
//     for each segment:
//       before_segment      may issue ops the segment waits for; adds to seg.deps / seg.effects
//       after_segment(op)   the segment's op is issued: ops that follow it
//     pass_ends(pass, op)   after its last op (`op`), before the send of its output
//   gradients_complete(s)   per chunk held (slot s), in the order their gradients complete:
//                           gradient synchronisation
//   before_optimizer_steps  once, every chunk's synchronisation issued: checks over all the
//                           rank's gradients (loss-scale check, clipping norm); the steps wait
//                           for RankEmitter::step_gate
//   optimizer_step(s)       per chunk, same order: the one optimizer hook issues the step
//   after_optimizer_step(s, step)   ops that follow the step (parameter gathers, copies back)
//
// Passes without segments (an empty weight or recompute pass; a pass that only forwards its
// input) get no segment moments and, when they issue nothing, no pass_ends. Units: bytes and
// parameters per rank; microbatch numbers as in OpInfo (the schedule's unit / slices).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "strategies/lowering/stage_template.hpp"

namespace stratasim::strategies {

class RankEmitter;

/// The pass being emitted.
struct PassState {
  std::size_t index = 0;  // in the device's pass list (Schedule::passes[device])
  Pass pass;
  const StageTemplate* st = nullptr;
  std::size_t slot = 0;          // the chunk's index among the device's chunks
  int microbatch = 0;            // pass.microbatch / slices
  Phase phase = Phase::forward;  // of its segments (recomputed ones: Phase::recompute)
  bool grad_pass = false;        // its segments complete gradient units (backward, or W)
  bool final_grad_pass = false;  // ... and it is the chunk's last such pass
  SegmentRange range{};
  std::optional<OpId> previous, earlier;  // the pass's last two ops so far
};

/// The segment being emitted: its op will wait for `deps` and have `effects`.
struct SegmentState {
  const TemplateStep& step;
  int index;  // within the pass's range
  std::vector<OpId>& deps;
  std::vector<MemoryEffect>& effects;
};

/// Ops and memory effects a hook adds (to reserve room up front; an estimate).
struct OpCount {
  std::size_t ops = 0, effects = 0;
};

class TechniqueHook {
 public:
  virtual ~TechniqueHook() = default;

  /// Room for the ops the hook adds to one pass, and per chunk a device holds.
  virtual OpCount count_pass(const Pass&) const { return {}; }
  virtual OpCount count_chunk(int /*chunk*/) const { return {}; }

  virtual void chunk_held(RankEmitter&, int /*chunk*/) {}
  virtual void rank_begins(RankEmitter&) {}
  virtual void pass_begins(RankEmitter&, const PassState&) {}
  /// The pass's input (`boundary` bytes, the whole tensor) was received from another device:
  /// `input` holds the receive; a hook may replace it by ops that follow the receive.
  virtual void input_received(RankEmitter&, const PassState&, Bytes /*boundary*/,
                              std::vector<OpId>& /*input*/) {}
  virtual void before_segment(RankEmitter&, const PassState&, SegmentState&) {}
  virtual void after_segment(RankEmitter&, const PassState&, const SegmentState&, OpId) {}
  virtual void pass_ends(RankEmitter&, const PassState&, OpId /*last*/) {}
  virtual void gradients_complete(RankEmitter&, std::size_t /*slot*/) {}
  virtual void before_optimizer_steps(RankEmitter&) {}
  /// Issues the optimizer step of the chunk in `slot` and returns it; nullopt from every hook
  /// but the one optimizer hook.
  virtual std::optional<OpId> optimizer_step(RankEmitter&, std::size_t /*slot*/) {
    return std::nullopt;
  }
  virtual void after_optimizer_step(RankEmitter&, std::size_t /*slot*/, OpId /*step*/) {}
};

}  // namespace stratasim::strategies
