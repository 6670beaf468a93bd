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
#include "hw_models/cluster.hpp"
#include "hw_models/config_reader.hpp"
#include "hw_models/files.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"
#include "study/real_run.hpp"
#include "traces/context.hpp"
#include "traces/export.hpp"
#include "traces/kineto_profile.hpp"
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

namespace {

// --out for a profile: a file in an existing folder.
void check_profile_out(const std::string& given) {
  const fs::path out(given);
  std::error_code ec;
  if (fs::is_directory(out, ec)) {
    throw ExecSetupError("--out " + given + ": is a directory; give the profile's file name");
  }
  if (!out.parent_path().empty() && !fs::is_directory(out.parent_path(), ec)) {
    throw ExecSetupError("--out " + given + ": " + out.parent_path().string() +
                         " is not a directory");
  }
}

int calibrate_from_trace_command(const CalibrateArgs& args) {
  if (args.device.empty()) {
    throw ExecSetupError(
        "--from-trace needs --device DEVICE: the device the trace was recorded on, a device "
        "config file or a catalog name (stratasim list devices)");
  }
  if (args.ranks != 1 || args.repetitions || args.quick || !args.name.empty()) {
    throw ExecSetupError(
        "--ranks, --repetitions, --quick and --name are for measuring a device; --from-trace "
        "fits the profile from the trace for the --device config (its name is the profile's)");
  }
  if (!args.out.empty()) check_profile_out(args.out);
  const fs::path device_file = study::resolve_device(args.device);
  std::error_code ec;
  if (!fs::exists(device_file, ec)) {
    throw ExecSetupError("--device " + args.device +
                         ": neither a device config file nor a shipped device's name (stratasim "
                         "list devices)");
  }
  const hw::DeviceSpec device = hw::load_device(device_file);
  traces::TraceCalibrationOptions options;
  options.date = exec::utc_date_today();
  const auto fit = traces::calibrate_from_kineto(args.from_trace, device, options);
  if (!args.out.empty()) hw::write_profile(fit.profile, args.out);
  if (args.quiet) return 0;
  const auto& p = fit.profile;
  std::cout << "calibrating " << p.device << " from " << args.from_trace
            << (fit.gpu.empty() ? "" : " (recorded on " + fit.gpu + ")") << ": " << fit.kernels
            << " GPU kernels and copies\n";
  std::cout << "used:\n";
  std::cout << "  gemm: " << fit.gemm_calls << " calls of " << p.gemm.size()
            << " shapes -> one row per shape (median time)\n";
  std::cout << "  attention: " << fit.attention_calls << " calls ->";
  bool any_attention = false;
  for (DType t : kAllDTypes) {
    if (const auto& a = p.attention[static_cast<std::size_t>(t)]) {
      std::cout << (any_attention ? ", " : " ") << name_of(t) << " " << to_string(*a);
      any_attention = true;
    }
  }
  std::cout << (any_attention ? " (FLOPs / time over the calls)\n" : " not fitted\n");
  std::cout << "  elementwise: " << fit.elementwise_calls << " calls of at least "
            << to_string(options.min_memory_bytes) << " -> "
            << (p.elementwise_bandwidth ? to_string(*p.elementwise_bandwidth) : "not fitted")
            << "\n";
  std::cout << "  copies: " << fit.copies << " memcpys of at least "
            << to_string(options.min_memory_bytes) << " -> memory "
            << (p.memory_bandwidth ? to_string(*p.memory_bandwidth) : "not fitted")
            << ", host to device "
            << (p.host_to_device_bandwidth ? to_string(*p.host_to_device_bandwidth) : "not fitted")
            << ", device to host "
            << (p.device_to_host_bandwidth ? to_string(*p.device_to_host_bandwidth) : "not fitted")
            << "\n";
  std::cout << "  launch overhead: median of " << fit.launches << " launch calls -> "
            << (p.kernel_launch_overhead ? to_string(*p.kernel_launch_overhead) : "not fitted")
            << "\n";
  if (!fit.skipped.empty()) {
    std::cout << "skipped:\n";
    for (const auto& [reason, n] : fit.skipped) std::cout << "  " << reason << ": " << n << "\n";
  }
  for (const auto& note : fit.notes) std::cout << "note: " << note << "\n";
  if (args.out.empty()) {
    std::cout << "no --out: nothing written\n";
  } else {
    std::cout << "wrote " << args.out << " (" << p.gemm.size()
              << " GEMM shapes); name it in a device config's \"profile\" to use it\n";
  }
  return 0;
}

}  // namespace

int calibrate_command(const CalibrateArgs& args) {
  if (!args.from_trace.empty()) return calibrate_from_trace_command(args);
  exec::CalibrateOptions options;
  options.kind = device_kind(args.device.empty() ? "cuda" : args.device);
  options.ranks = args.ranks;
  options.repetitions = args.repetitions.value_or(0);
  options.quick = args.quick;
  options.device_name = args.name;
  if (args.out.empty()) throw ExecSetupError("calibrate needs --out PROFILE.json");
  check_profile_out(args.out);
  const fs::path out(args.out);
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
