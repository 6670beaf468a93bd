// Lowering: an Experiment becomes a Program. Ranks are laid out as Megatron-LM does (tensor
// parallel fastest, then data parallel, then pipeline stage), so tensor-parallel groups share a
// node; each stage's plan is built once and stamped out for every rank and microbatch
// following the pipeline schedule.
//
// The public umbrella of the lowering passes in strategies/lowering/ (docs/lowering.md):
// pipeline_spec.hpp (the PipelineSpec and the readers of an Experiment), communicators.hpp,
// stage_template.hpp, hooks.hpp, rank_emitter.hpp and techniques.hpp.
#pragma once

#include "strategies/lowering/pipeline_spec.hpp"

namespace stratasim::strategies {

/// Stamps out every rank's ops following make_schedule(spec.schedule, ...): for each pass, a
/// receive of its input from the device of the neighbouring chunk (pp-recv stream; a chunk on
/// the same device is waited for instead), the pass's segments of its part's plan (forward;
/// backward, from after its recomputation when the schedule runs recompute passes; weight), on
/// the compute and tp-comm streams, each waiting for the segment before it in its chain
/// (recomputed segments get Phase::recompute), and a send of the output (pp-send stream); then,
/// per chunk held, the gradient synchronisation over the data-parallel group (dp-comm stream;
/// with Chimera the group spans both devices holding the part) and the optimizer step, with
/// ZeRO's gathers and reduce-scatters and the offload copies (copy stream) and host steps (host
/// stream) as `spec.zero` says.
Program assemble_pipeline(const PipelineSpec& spec);

struct LowerOptions {
  /// See PipelineSpec::mirror_data_parallel.
  bool mirror_data_parallel = false;
  /// See PipelineSpec::mirror_tensor_parallel.
  bool mirror_tensor_parallel = false;
  /// See PipelineSpec::mirror_period.
  int mirror_period = 1;
  /// Training iterations back to back (strategies/iterations.hpp repeat_iterations; study::lower
  /// applies it to every model's lowering). 1: the one-iteration Program, unchanged.
  int iterations = 1;
};

/// Lowers one training iteration of `experiment`: assemble_pipeline(pipeline_spec(experiment)),
/// with the layers split evenly or as the experiment lists them. A balanced partition needs the
/// cost model: study::lower (study/study.hpp) is the entry every command uses; this one is for
/// strategies/ and its tests, and throws std::invalid_argument on a balanced partition.
Program lower(const Experiment& experiment, const LowerOptions& options = {});

}  // namespace stratasim::strategies
