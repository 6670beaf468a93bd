#include "strategies/recompute.hpp"

#include <algorithm>
#include <cmath>

#include "strategies/lowering.hpp"

namespace stratasim::strategies {

ModelStateBytes unsharded_model_states(const ModelStateFormat& format) {
  const StateBytes b = state_bytes_per_parameter(format);
  return [b, format](int, std::int64_t parameters) {
    return Bytes(parameters * (b.parameters + b.gradients)) +
           optimizer_state_bytes(format, parameters);
  };
}

int microbatches_in_flight(ScheduleKind schedule, int stages, int stage, int microbatches) {
  switch (schedule) {
    case ScheduleKind::gpipe:
    case ScheduleKind::terapipe:
      return microbatches;
    case ScheduleKind::zb_h2:
      return std::min(2 * (stages - stage) - 1, microbatches);
    case ScheduleKind::interleaved:  // Megatron's warm-up holds about one more stage's worth
      return std::min(stages - stage + 1, microbatches);
    default:
      return std::min(stages - stage, microbatches);
  }
}

namespace {

// What one microbatch's forward leaves allocated, and the most its backward allocates above
// that at any point, as the stage's plan says.
struct StageActivations {
  Bytes stored;
  Bytes transient;
  std::int64_t parameters = 0;
};

StageActivations stage_activations(const Experiment& e, int stage, const StageRecompute& r) {
  const int stages = e.parallelism.pp;
  const auto [begin, end] = stage_layers(e.model.layers, stages, stage);
  const StagePlan plan =
      plan_transformer_stage(e.model, layer_setting(e), stage, stages, begin, end, r);
  StageActivations a;
  a.parameters = plan.parameters;
  // Offloaded checkpoints leave the device after the forward and come back for the recompute.
  const bool offloaded = e.parallelism.offload.activations;
  for (const auto& s : plan.forward)
    a.stored += s.activation_delta + (offloaded ? Bytes() : s.checkpoint_delta);
  Bytes held;
  for (const auto& s : plan.backward) {
    held += s.activation_delta + s.checkpoint_delta + (offloaded ? s.checkpoint_fetch : Bytes());
    a.transient = std::max(a.transient, held);
  }
  return a;
}

Bytes peak_of(const Experiment& e, int stage, const StageActivations& a,
              const ModelStateBytes& states) {
  const int in_flight = microbatches_in_flight(e.parallelism.schedule, e.parallelism.pp, stage,
                                               static_cast<int>(e.microbatches()));
  const double activations =
      static_cast<double>(std::max(in_flight, 1)) * static_cast<double>(a.stored.count()) +
      static_cast<double>(a.transient.count());
  const double allocated = static_cast<double>(states(stage, a.parameters).count()) + activations;
  return held_back_estimate(e) + Bytes(std::llround(e.memory.fragmentation * allocated));
}

}  // namespace

Bytes estimated_stage_peak(const Experiment& e, int stage, const StageRecompute& r,
                           const ModelStateBytes& states) {
  const ModelStateBytes s = states ? states : unsharded_model_states(model_state_format(e));
  return peak_of(e, stage, stage_activations(e, stage, r), s);
}

std::vector<StageRecompute> recompute_plan(const Experiment& e, const ModelStateBytes& states) {
  const ParallelismSpec& p = e.parallelism;
  std::vector<StageRecompute> plan(static_cast<std::size_t>(p.pp));
  for (int stage = 0; stage < p.pp; ++stage) {
    auto& r = plan[static_cast<std::size_t>(stage)];
    const auto [begin, end] = stage_layers(e.model.layers, p.pp, stage);
    const int layers = end - begin;
    switch (p.recompute) {
      case RecomputeKind::none:
        break;
      case RecomputeKind::selective:
        r.selective = true;
        break;
      case RecomputeKind::full:
        if (p.recompute_method == RecomputeMethod::uniform) {
          r.recomputed_layers = layers;
          r.group = std::max(1, p.recompute_num_layers);
        } else {
          r.recomputed_layers = std::clamp(p.recompute_num_layers, 0, layers);
          r.group = 1;
        }
        break;
      case RecomputeKind::stage_aware: {
        const ModelStateBytes s = states ? states : unsharded_model_states(model_state_format(e));
        const Bytes capacity = e.cluster.device.memory_capacity;
        r.recomputed_layers = layers;  // when nothing fits
        for (int k = 0; k <= layers; ++k) {
          const StageRecompute candidate{false, k, 1};
          if (peak_of(e, stage, stage_activations(e, stage, candidate), s) <= capacity) {
            r.recomputed_layers = k;
            break;
          }
        }
        break;
      }
    }
  }
  return plan;
}

}  // namespace stratasim::strategies
