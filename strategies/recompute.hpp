// Activation recomputation as a per-stage decision: which layers of each pipeline stage are
// recomputed (StageRecompute, applied by plan_transformer_stage). `none`, `full` and
// `selective` follow Megatron-LM's settings; `stage_aware` is Merak's (Lai et al., "Merak: An
// Efficient Distributed DNN Training Framework with Automated 3D Parallelism for Giant
// Foundation Models", arXiv:2206.04959): under 1F1B an earlier stage holds the activations of
// more microbatches than a later one, so each stage recomputes only as many layers as it needs
// to fit, and later stages, holding fewer microbatches, recompute fewer.
#pragma once

#include <functional>
#include <vector>

#include "strategies/experiment.hpp"
#include "strategies/transformer.hpp"

namespace stratasim::strategies {

/// Device bytes of model state held by each rank of pipeline stage `stage`, whose plan holds
/// `parameters` parameters per rank: parameters, gradients and optimizer states as they lie on
/// the device (after ZeRO sharding and offload), with any buffers they need (ZeRO-3 gathered
/// layers). The ZeRO and offload lowering supplies the sharded figure.
using ModelStateBytes = std::function<Bytes(int stage, std::int64_t parameters)>;

/// Nothing sharded or offloaded: parameters * (parameters + gradients + optimizer states) bytes
/// of state_bytes_per_parameter and optimizer_state_bytes (strategies/optimizer.hpp: 2 + 2 + 12
/// with mixed-precision Adam).
ModelStateBytes unsharded_model_states(const ModelStateFormat& format);

/// Microbatches whose stored activations stage `stage` of `stages` holds at once: GPipe runs
/// every forward before any backward (all m); 1F1B runs p - stage forwards before the first
/// backward (at most m).
int microbatches_in_flight(ScheduleKind schedule, int stages, int stage, int microbatches);

/// Estimated peak device memory of a rank of stage `stage` with recomputation `recompute`:
///   held_back_estimate(e) + fragmentation * (model states + in_flight * stored + transient)
/// (the allocator's slack applies to everything allocated, as the simulator accounts it) where
/// `stored` is what one microbatch's forward leaves allocated (activations of the layers not
/// recomputed, checkpoints of the recomputed ones, embedding and head extras) and `transient` the
/// most one backward pass allocates above that (a recomputed group's activations, while its
/// checkpoint is still held), both read from the stage's plan. `states` defaults to
/// unsharded_model_states.
Bytes estimated_stage_peak(const Experiment& experiment, int stage, const StageRecompute& recompute,
                           const ModelStateBytes& states = {});

/// The recomputation of each pipeline stage of `experiment` (one entry per stage):
/// - none: nothing; selective: every layer's attention core, no full layer;
/// - full + uniform + N: every layer, in groups of N (one checkpoint per group);
/// - full + block + N: the first N layers of each stage (fewer if the stage has fewer), one by
///   one; the rest stored;
/// - stage_aware: per stage the fewest layers k_s (block style: the first k_s, one by one) for
///   which estimated_stage_peak fits the device's memory capacity, so the fastest plan that
///   fits; if none does, every layer of the stage (the simulation reports the out-of-memory).
/// `states` (model state per rank, see ModelStateBytes) defaults to unsharded_model_states.
std::vector<StageRecompute> recompute_plan(const Experiment& experiment,
                                           const ModelStateBytes& states = {});

}  // namespace stratasim::strategies
