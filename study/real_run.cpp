#include "study/real_run.hpp"

#include <algorithm>
#include <vector>

#include "sim/cost.hpp"
#include "sim/simulator.hpp"
#include "study/errors.hpp"
#include "study/study.hpp"

namespace stratasim::study {

namespace st = strategies;

std::string device_text(exec::DeviceKind kind) {
  return kind == exec::DeviceKind::host ? std::string("the host device (CPU threads)")
                                        : exec::cuda_description();
}

st::Program real_program(const st::Experiment& experiment) {
  return study::lower(experiment, {.mirror_data_parallel = false});
}

namespace {

// Runs `program`; setup failures are BadInput, run failures RunFailed.
RealRun measure(st::Program program, const RealRunOptions& options) {
  RealRun r;
  r.program = std::move(program);
  exec::ExecPlan plan(r.program);
  std::unique_ptr<exec::World> world;
  try {
    world = exec::make_world(options.device, plan, options.world);
  } catch (const exec::ExecError& e) {
    throw BadInput(e.what());
  }
  try {
    r.measured = exec::run(plan, *world, options.run);
    r.reports = world->reports();
  } catch (const exec::ExecError& e) {
    throw RunFailed(std::string("the real run failed: ") + e.what());
  }
  return r;
}

// The run's report, in the experiment's context with the device it was measured on.
void report(RealRun& r, const st::Experiment& experiment, exec::DeviceKind device) {
  r.context = traces::report_context(experiment);
  r.context.setup.insert(r.context.setup.begin(), {"measured on", device_text(device)});
  r.report = traces::make_report(r.program, r.measured.timeline, r.context);
}

}  // namespace

RealRun run(const st::Experiment& experiment, const RealRunOptions& options) {
  RealRun r = measure(real_program(experiment), options);
  if (r.reports) report(r, experiment, options.device);
  return r;
}

ValidationRun validate(st::Experiment experiment, const RealRunOptions& options,
                       std::shared_ptr<const hw::DeviceProfile> profile) {
  if (profile) experiment.cluster.device.profile = std::move(profile);
  ValidationRun v;
  st::Program program = real_program(experiment);
  // The prediction: the same Program, every rank simulated.
  sim::SimOptions sim_options;
  sim_options.overheads = memory_overheads(experiment);
  // The measured peak is the caching allocator's (no CUDA context, no NCCL buffers): the
  // prediction it is compared with leaves the modelled held-back memory out (a memory.reserved
  // the user gives is kept).
  sim_options.overheads.cuda_context = Bytes(0);
  sim_options.overheads.nccl_buffers = Bytes(0);
  v.predicted = sim::simulate(program, experiment.cluster, sim_options);
  if (!v.predicted.completed) {
    throw RunFailed("the simulation did not complete: " + v.predicted.problem);
  }
  v.real = measure(std::move(program), options);
  if (!v.real.reports) return v;
  const st::Program& p = v.real.program;
  const exec::MeasuredRun& run = v.real.measured;

  // Per-kernel durations: the cost model's prediction for each rank's device, and the events.
  std::vector<traces::KernelDuration> predicted_kernels, measured_kernels;
  std::vector<std::unique_ptr<sim::DeviceCostModel>> models;
  for (int r = 0; r < p.world_size(); ++r) {
    models.push_back(std::make_unique<sim::DeviceCostModel>(experiment.cluster, r));
  }
  for (st::OpId id = 0; id < p.op_count(); ++id) {
    const auto& op = p.op(id);
    const auto* c = std::get_if<st::Compute>(&op.work);
    if (!c) continue;
    const auto& kernels = p.kernels_of(*c);
    for (std::size_t k = 0; k < kernels.size(); ++k) {
      predicted_kernels.push_back(
          {id, static_cast<std::uint32_t>(k),
           models[static_cast<std::size_t>(op.rank)]->kernel_time(kernels[k])});
    }
  }
  for (const auto& k : run.kernels) measured_kernels.push_back({k.op, k.index, k.end - k.start});
  v.predicted_context = traces::report_context(experiment);
  auto measured_timeline = run.timeline;
  if (run.reserved_peak.count() > 0) {
    // The allocator's own high-water mark is the measured peak (fragmentation included).
    for (auto& rank : measured_timeline.ranks) {
      rank.tiers[0].peak = std::max(rank.tiers[0].peak, run.reserved_peak);
    }
  }
  v.validation = traces::compare(p, v.predicted, measured_timeline, predicted_kernels,
                                 measured_kernels, v.predicted_context.stage_of_rank);
  v.predicted_report = traces::make_report(p, v.predicted, v.predicted_context);
  report(v.real, experiment, options.device);
  return v;
}

}  // namespace stratasim::study
