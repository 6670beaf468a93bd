// The commands that run Programs for real (exec/): run, validate and calibrate. main.cpp parses
// the arguments and loads the experiment; these do the rest.
#pragma once

#include <optional>
#include <string>

#include "strategies/experiment.hpp"

namespace stratasim::cli {

/// Input the user got wrong or a machine that cannot run the request (exit code 2).
struct ExecSetupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RealRunArgs {
  std::string device = "cuda";  // cuda or host
  int warmup = 1;
  int iterations = 5;
  double watchdog_s = 60;
  bool verify = false;          // host: check every collective and transfer
  std::string capacity;         // per-rank device pool limit, e.g. "2 GiB"
  std::string launch = "auto";  // auto, single, mpi
  std::string profile;          // validate: a device profile for the prediction
  std::string out;
  bool quiet = false;
};

/// `stratasim run`: the experiment's Program on real devices; the measured report. Exit code 3
/// when the run fails (hang, CUDA or NCCL error, out of memory).
int run_command(const strategies::Experiment& experiment, const RealRunArgs& args);
/// `stratasim validate`: simulate and run, op by op.
int validate_command(strategies::Experiment experiment, const RealRunArgs& args);

struct CalibrateArgs {
  /// Measuring: cuda (the default when empty) or host. With --from-trace: the device the trace
  /// was recorded on, a device config file or catalog name (the profile's device is its name).
  std::string device;
  std::string from_trace;  // a PyTorch profiler (Kineto) trace to fit the profile from
  std::string out;
  int ranks = 1;  // > 1: also collectives over this many devices
  std::optional<int> repetitions;
  bool quick = false;
  std::string name;  // the device's name in the profile (default: the GPU's, or "host-cpu")
  bool quiet = false;
};
/// `stratasim calibrate`: measures the device and writes a profile; with --from-trace, fits it
/// from a trace's kernels (traces/kineto_profile.hpp) and writes it when --out is given.
int calibrate_command(const CalibrateArgs& args);

}  // namespace stratasim::cli
