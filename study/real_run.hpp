// Real runs composed like simulations: the experiment's Program (every rank issuing its own ops,
// no mirroring) run by the interpreter of exec/ on real devices, reported like a prediction; and
// the validation of a prediction against such a run, op by op (traces/validation.hpp).
//
// Errors: a request the machine cannot serve (no such device, too few GPUs, bad run options)
// is BadInput (study/errors.hpp; CLI exit code 2); a run that fails once started (a hang, a
// CUDA or NCCL error, out of memory) is RunFailed (CLI exit code 3).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "exec/devices.hpp"
#include "exec/interpreter.hpp"
#include "hw_models/device.hpp"
#include "strategies/experiment.hpp"
#include "strategies/program.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"
#include "traces/timeline.hpp"
#include "traces/validation.hpp"

namespace stratasim::study {

/// A real run that failed after it started; the message says how (exec::ExecError's).
struct RunFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RealRunOptions {
  exec::DeviceKind device = exec::DeviceKind::cuda;
  exec::WorldOptions world;
  exec::RunOptions run;
};

struct RealRun {
  strategies::Program program;
  exec::MeasuredRun measured;
  /// This process reports the run (false on MPI ranks other than 0: nothing else is filled).
  bool reports = true;
  traces::ReportContext context;  // the experiment's, with a "measured on" setup line first
  traces::Report report;
};

/// "the host device (CPU threads)", or the GPUs and library versions (exec::cuda_description).
std::string device_text(exec::DeviceKind kind);

/// The experiment's Program for a real run: every rank issues its own ops; validated.
strategies::Program real_program(const strategies::Experiment& experiment);

/// Runs the experiment's Program on real devices and reports it.
RealRun run(const strategies::Experiment& experiment, const RealRunOptions& options);

struct ValidationRun {
  RealRun real;
  traces::Timeline predicted;  // the same Program simulated, every rank
  traces::Report predicted_report;
  traces::ReportContext predicted_context;
  traces::Validation validation;  // predicted against measured, per kernel class, op, stage
};

/// Simulates and runs the same Program; `profile`, when given, replaces the device's for the
/// prediction. A prediction that does not complete is RunFailed ("the simulation did not
/// complete: ...").
ValidationRun validate(strategies::Experiment experiment, const RealRunOptions& options,
                       std::shared_ptr<const hw::DeviceProfile> profile = nullptr);

}  // namespace stratasim::study
