#include "cli/exec_commands.hpp"

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "exec/calibrate.hpp"
#include "exec/devices.hpp"
#include "exec/interpreter.hpp"
#include "hw_models/config_reader.hpp"
#include "hw_models/files.hpp"
#include "study/errors.hpp"
#include "study/real_run.hpp"
#include "traces/context.hpp"
#include "traces/export.hpp"
#include "traces/report.hpp"
#include "traces/validation.hpp"

namespace fs = std::filesystem;

namespace stratasim::cli {

namespace {

constexpr int kExitRunFailed = 3;

exec::DeviceKind device_kind(const std::string& name) {
  const auto kind = exec::device_kind_from_name(name);
  if (!kind) throw ExecSetupError("--device expects cuda or host, got \"" + name + "\"");
  return *kind;
}

exec::WorldOptions world_options(const RealRunArgs& args) {
  exec::WorldOptions o;
  o.device.verify = args.verify;
  if (!args.capacity.empty()) {
    try {
      o.capacity = parse_bytes(args.capacity);
    } catch (const std::exception& e) {
      throw ExecSetupError("--capacity expects a size such as \"2 GiB\": " + std::string(e.what()));
    }
  }
  if (args.launch == "auto") {
    o.launch = exec::Launch::automatic;
  } else if (args.launch == "single") {
    o.launch = exec::Launch::single_process;
  } else if (args.launch == "mpi") {
    o.launch = exec::Launch::mpi;
  } else {
    throw ExecSetupError("--launch expects auto, single or mpi, got \"" + args.launch + "\"");
  }
  return o;
}

exec::RunOptions run_options(const RealRunArgs& args) {
  if (args.iterations < 1) throw ExecSetupError("--iterations must be at least 1");
  if (args.warmup < 0) throw ExecSetupError("--warmup must be 0 or more");
  if (!(args.watchdog_s > 0)) throw ExecSetupError("--watchdog must be positive (seconds)");
  exec::RunOptions o;
  o.warmup_iterations = args.warmup;
  o.iterations = args.iterations;
  o.watchdog = std::chrono::milliseconds(static_cast<std::int64_t>(args.watchdog_s * 1000));
  return o;
}

study::RealRunOptions real_run_options(const RealRunArgs& args) {
  return {device_kind(args.device), world_options(args), run_options(args)};
}

void print_iterations(const exec::MeasuredRun& run, int warmup) {
  std::cout << "measured " << run.iteration_times_s.size() << " iteration(s) after " << warmup
            << " warm-up:";
  for (double t : run.iteration_times_s) std::cout << ' ' << std::setprecision(4) << t * 1e3;
  std::cout << " ms; median " << std::setprecision(4)
            << run.iteration_times_s[static_cast<std::size_t>(run.median_iteration)] * 1e3
            << " ms\n";
}

}  // namespace

int run_command(const strategies::Experiment& experiment, const RealRunArgs& args) {
  study::RealRun r;
  try {
    r = study::run(experiment, real_run_options(args));
  } catch (const study::BadInput& e) {
    throw ExecSetupError(e.what());
  } catch (const study::RunFailed& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitRunFailed;
  }
  if (!r.reports) return 0;
  if (!args.quiet) {
    traces::print_summary(std::cout, r.report, r.context);
    print_iterations(r.measured, args.warmup);
  }
  if (!args.out.empty()) {
    traces::write_outputs(args.out, r.program, r.measured.timeline, r.report, r.context);
    if (!args.quiet) {
      std::cout << "wrote " << (fs::path(args.out) / "report.json").string()
                << ", timeline.json and memory.csv (measured)\n";
    }
  }
  return 0;
}

int validate_command(strategies::Experiment experiment, const RealRunArgs& args) {
  std::shared_ptr<const hw::DeviceProfile> profile;
  if (!args.profile.empty()) {
    profile = std::make_shared<const hw::DeviceProfile>(hw::load_profile(args.profile));
  }
  study::ValidationRun v;
  try {
    v = study::validate(experiment, real_run_options(args), profile);
  } catch (const study::BadInput& e) {
    throw ExecSetupError(e.what());
  } catch (const study::RunFailed& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitRunFailed;
  }
  if (!v.real.reports) return 0;
  const auto& run = v.real.measured;
  const std::string measured_on = study::device_text(device_kind(args.device));
  if (!args.quiet) {
    std::cout << "validation of " << experiment.name << ": predicted on "
              << experiment.cluster.device.name
              << (profile || experiment.cluster.device.profile ? " with its measured profile" : "")
              << ", measured on " << measured_on << "\n";
    print_iterations(run, args.warmup);
    std::cout << "error = (predicted - measured) / measured\n\n";
    traces::print_validation(std::cout, v.validation);
  }
  if (!args.out.empty()) {
    const fs::path dir(args.out);
    traces::write_outputs(dir / "predicted", v.real.program, v.predicted, v.predicted_report,
                          v.predicted_context);
    traces::write_outputs(dir / "measured", v.real.program, run.timeline, v.real.report,
                          v.real.context);
    auto json = traces::to_json(v.validation);
    json["experiment"] = experiment.name;
    json["predicted_on"] = experiment.cluster.device.name;
    json["profile"] = profile != nullptr || experiment.cluster.device.profile != nullptr;
    json["measured_on"] = measured_on;
    json["iteration_times_s"] = run.iteration_times_s;
    files::write_atomically(dir / "validation.json", [&](std::ostream& out) {
      out << json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    });
    files::write_atomically(dir / "validation_ops.csv", [&](std::ostream& out) {
      traces::write_validation_csv(out, v.validation);
    });
    if (!args.quiet) {
      std::cout << "\nwrote " << (dir / "validation.json").string()
                << ", validation_ops.csv, predicted/ and measured/ (report.json, timeline.json, "
                   "memory.csv)\n";
    }
  }
  return 0;
}

int calibrate_command(const CalibrateArgs& args) {
  exec::CalibrateOptions options;
  options.kind = device_kind(args.device);
  options.ranks = args.ranks;
  options.repetitions = args.repetitions.value_or(0);
  options.quick = args.quick;
  options.device_name = args.name;
  if (args.out.empty()) throw ExecSetupError("calibrate needs --out PROFILE.json");
  const fs::path out(args.out);
  std::error_code ec;
  if (fs::is_directory(out, ec)) {
    throw ExecSetupError("--out " + args.out + ": is a directory; give the profile's file name");
  }
  if (!out.parent_path().empty() && !fs::is_directory(out.parent_path(), ec)) {
    throw ExecSetupError("--out " + args.out + ": " + out.parent_path().string() +
                         " is not a directory");
  }
  if (options.kind == exec::DeviceKind::cuda && exec::visible_gpus() < options.ranks) {
    throw ExecSetupError("calibrate needs " + std::to_string(options.ranks) +
                         " GPU(s); this machine has " + std::to_string(exec::visible_gpus()) +
                         " (" + exec::cuda_description() +
                         "); --device host measures the host device (CPU threads) instead");
  }
  hw::DeviceProfile profile;
  try {
    profile = exec::calibrate(options, args.quiet ? nullptr : &std::cout);
  } catch (const std::invalid_argument& e) {
    throw ExecSetupError(e.what());
  } catch (const exec::ExecError& e) {
    std::cerr << "error: calibration failed: " << e.what() << "\n";
    return kExitRunFailed;
  }
  hw::write_profile(profile, out);
  if (!args.quiet) {
    std::cout << "wrote " << out.string() << " (" << profile.gemm.size()
              << " GEMM shapes); name it in a device config's \"profile\" to use it\n";
  }
  return 0;
}

}  // namespace stratasim::cli
