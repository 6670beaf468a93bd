// assemble_pipeline: the driver of the lowering passes (strategies/lowering/hooks.hpp).
#include <memory>
#include <stdexcept>
#include <vector>

#include "strategies/lowering.hpp"
#include "strategies/lowering/rank_emitter.hpp"
#include "strategies/lowering/techniques.hpp"

namespace stratasim::strategies {

namespace {

// The techniques `spec` asks for, in the order their hooks run (strategies/lowering/
// techniques.hpp); each registers its kernel lists and labels as it is made.
std::vector<std::unique_ptr<TechniqueHook>> techniques(Assembly& a) {
  const PipelineSpec& spec = a.spec;
  const ZeroSettings& zero = spec.zero;
  const bool servers = spec.parameter_servers > 0;
  const bool data_parallel = zero.stage == 0 && a.groups.dp_size() > 1 && !servers;
  std::vector<std::unique_ptr<TechniqueHook>> hooks;
  if (spec.pipeline_scatter_gather) hooks.push_back(std::make_unique<PipelineScatterGather>(a));
  if (zero.offload_activations) hooks.push_back(std::make_unique<ActivationOffload>(a));
  if (spec.fsdp) {
    hooks.push_back(std::make_unique<FsdpRuntime>(a));
  } else {
    if (zero.stage == 3) hooks.push_back(std::make_unique<Zero3ParameterFetch>(a));
    if (data_parallel && spec.grad_compression.enabled()) {
      hooks.push_back(std::make_unique<CompressedGradients>(a));
    } else if (data_parallel) {
      hooks.push_back(std::make_unique<DataParallelAllReduce>(a));
    } else if (servers) {
      hooks.push_back(std::make_unique<ParameterServer>(a));  // also the optimizer step
    }
    if (zero.stage >= 1) hooks.push_back(std::make_unique<ZeroGradientSync>(a));
    if (spec.moe && zero.stage <= 1) hooks.push_back(std::make_unique<ExpertGradientSync>(a));
  }
  if (a.groups.shared_embedding()) hooks.push_back(std::make_unique<EmbeddingSync>(a));
  if (spec.loss_scaling != LossScaling::none) hooks.push_back(std::make_unique<LossScaleCheck>(a));
  if (spec.grad_clip > 0.0) hooks.push_back(std::make_unique<GradientClipping>(a));
  if (spec.step_overhead > Time::zero() || spec.microbatch_overhead > Time::zero()) {
    hooks.push_back(std::make_unique<HostOverhead>(a));
  }
  if (servers) {
    // The servers apply the updates (ParameterServer).
  } else if (zero.offload_optimizer) {
    hooks.push_back(std::make_unique<OptimizerOffload>(a));
  } else {
    hooks.push_back(std::make_unique<DeviceOptimizerStep>(a));
  }
  return hooks;
}

// The parameter servers' ranks, after every worker's (PipelineSpec::parameter_servers).
void emit_servers(const std::vector<std::unique_ptr<TechniqueHook>>& hooks) {
  for (const auto& hook : hooks) {
    if (auto* ps = dynamic_cast<ParameterServer*>(hook.get())) ps->emit_servers();
  }
}

}  // namespace

Program assemble_pipeline(const PipelineSpec& spec) {
  Assembly assembly(spec);
  const auto problems =
      technique_problems(spec.zero, spec.grad_compression, spec.schedule, spec.layout.dp);
  if (!problems.empty()) {
    throw std::invalid_argument("assemble_pipeline: " + problems.front().message + " (" +
                                problems.front().path + ")");
  }
  if (spec.fsdp && (spec.layout.pp > 1 || spec.zero.stage != spec.fsdp->zero_stage() ||
                    spec.zero.offload_optimizer || spec.zero.offload_params)) {
    throw std::invalid_argument(
        "assemble_pipeline: PyTorch FSDP's runtime needs one pipeline stage, its sharding's ZeRO "
        "stage and no ZeRO offload (training.fsdp)");
  }
  const auto hooks = techniques(assembly);
  RankEmitter emitter(assembly, hooks);
  emitter.reserve();
  for (int r = 0; r < spec.layout.world_size(); ++r) emitter.emit(r);
  emit_servers(hooks);
  assembly.program.finish();
  return std::move(assembly.program);
}

Program lower(const Experiment& e, const LowerOptions& options) {
  PipelineSpec spec = pipeline_spec(e);
  spec.mirror_data_parallel = options.mirror_data_parallel;
  spec.mirror_tensor_parallel = options.mirror_tensor_parallel;
  spec.mirror_period = options.mirror_period;
  return assemble_pipeline(spec);
}

}  // namespace stratasim::strategies
