// Lowering: an Experiment becomes a Program. Ranks are laid out as Megatron-LM does (tensor
// parallel fastest, then data parallel, then pipeline stage), so tensor-parallel groups share a
// node; each stage's plan is built once and stamped out for every rank and microbatch
// following the pipeline schedule.
#pragma once

#include <vector>

#include "strategies/experiment.hpp"
#include "strategies/program.hpp"
#include "strategies/transformer.hpp"

namespace stratasim::strategies {

struct RankLayout {
  int tp = 1, dp = 1, pp = 1;
  int world_size() const { return tp * dp * pp; }
  /// rank = tp_index + tp * (dp_index + dp * stage)
  int rank(int tp_index, int dp_index, int stage) const {
    return tp_index + tp * (dp_index + dp * stage);
  }
  int tp_index(int rank) const { return rank % tp; }
  int dp_index(int rank) const { return (rank / tp) % dp; }
  int stage(int rank) const { return rank / (tp * dp); }
};

RankLayout layout_of(const Experiment& experiment);

/// Layers [begin, end) of stage `stage`: layers split as evenly as possible, earlier stages
/// taking one more when they do not divide (the last stage also carries the LM head).
std::pair<int, int> stage_layers(int layers, int stages, int stage);

/// The per-rank setting the experiment's layers are lowered with.
LayerSetting layer_setting(const Experiment& experiment);

/// Bytes per parameter of model state with mixed-precision Adam (ZeRO's 2 + 2 + K with K = 12:
/// weights and gradients in the training dtype, fp32 master weights, momentum and variance);
/// with fp32 training 4 + 4 + 8.
struct StateBytes {
  std::int64_t parameters, gradients, optimizer;
};
StateBytes state_bytes_per_parameter(DType dtype);

/// Everything the pipeline assembly needs: per-stage plans as data, the rank layout and the
/// schedule. Stage plans may come from the transformer lowering or be written by hand (tests,
/// layer tables).
struct PipelineSpec {
  RankLayout layout;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int microbatches = 1;
  DType dtype = DType::bf16;
  std::vector<StagePlan> stages;  // one per pipeline stage
  Bytes dp_bucket_size = Bytes(25 * 1024 * 1024);
  bool dp_overlap = true;
  /// Tied embeddings split over the first and last stage: their gradients are all-reduced
  /// between the two (Megatron's embedding group), `embedding_sync_bytes` per rank.
  bool shared_embedding = false;
  Bytes embedding_sync_bytes;
};

/// Stamps out every rank's ops: for each pass of the schedule, a receive of the input from the
/// previous stage (pp-recv stream), the stage plan's segments (compute stream and tp-comm
/// stream, each waiting for the one before), a send of the output (pp-send stream); then the
/// data-parallel gradient all-reduce buckets (dp-comm stream) and the optimizer step.
Program assemble_pipeline(const PipelineSpec& spec);

/// The PipelineSpec of an experiment (transformer stage plans, with the experiment's
/// recomputation applied to them).
PipelineSpec pipeline_spec(const Experiment& experiment);

/// Lowers one training iteration of `experiment`: assemble_pipeline(pipeline_spec(experiment)).
Program lower(const Experiment& experiment);

}  // namespace stratasim::strategies
