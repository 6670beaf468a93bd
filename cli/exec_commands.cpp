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
#include "sim/cost.hpp"
#include "sim/partition.hpp"
#include "sim/simulator.hpp"
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

// The Program of a real run: every rank issues its own ops (no mirroring).
strategies::Program real_program(const strategies::Experiment& experiment) {
  auto program = sim::lower_partitioned(experiment, {.mirror_data_parallel = false});
  strategies::validate(program);
  return program;
}

std::string device_text(exec::DeviceKind kind) {
  return kind == exec::DeviceKind::host ? std::string("the host device (CPU threads)")
                                        : exec::cuda_description();
}

struct Measured {
  exec::MeasuredRun run;
  bool reports = true;
};

// Runs the Program; setup failures are ExecSetupError, run failures return nullopt after
// printing the error.
std::optional<Measured> measure(const strategies::Program& program, const RealRunArgs& args) {
  const auto kind = device_kind(args.device);
  const auto options = run_options(args);
  exec::ExecPlan plan(program);
  std::unique_ptr<exec::World> world;
  try {
    world = exec::make_world(kind, plan, world_options(args));
  } catch (const exec::ExecError& e) {
    throw ExecSetupError(e.what());
  }
  try {
    Measured m;
    m.run = exec::run(plan, *world, options);
    m.reports = world->reports();
    return m;
  } catch (const exec::ExecError& e) {
    std::cerr << "error: the real run failed: " << e.what() << "\n";
    return std::nullopt;
  }
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
  const auto program = real_program(experiment);
  const auto measured = measure(program, args);
  if (!measured) return kExitRunFailed;
  if (!measured->reports) return 0;
  const auto& run = measured->run;
  auto context = traces::report_context(experiment);
  context.setup.insert(context.setup.begin(),
                       {"measured on", device_text(device_kind(args.device))});
  const auto report = traces::make_report(program, run.timeline, context);
  if (!args.quiet) {
    traces::print_summary(std::cout, report, context);
    print_iterations(run, args.warmup);
  }
  if (!args.out.empty()) {
    traces::write_outputs(args.out, program, run.timeline, report, context);
    if (!args.quiet) {
      std::cout << "wrote " << (fs::path(args.out) / "report.json").string()
                << ", timeline.json and memory.csv (measured)\n";
    }
  }
  return 0;
}

int validate_command(strategies::Experiment experiment, const RealRunArgs& args) {
  if (!args.profile.empty()) {
    experiment.cluster.device.profile =
        std::make_shared<const hw::DeviceProfile>(hw::load_profile(args.profile));
  }
  const auto program = real_program(experiment);
  // The prediction: the same Program, every rank simulated.
  sim::SimOptions sim_options;
  sim_options.overheads = sim::memory_overheads(experiment);
  const auto predicted = sim::simulate(program, experiment.cluster, sim_options);
  if (!predicted.completed) {
    std::cerr << "error: the simulation did not complete: " << predicted.problem << "\n";
    return kExitRunFailed;
  }
  const auto measured = measure(program, args);
  if (!measured) return kExitRunFailed;
  if (!measured->reports) return 0;
  const auto& run = measured->run;

  // Per-kernel durations: the cost model's prediction for each rank's device, and the events.
  std::vector<traces::KernelDuration> predicted_kernels, measured_kernels;
  std::vector<std::unique_ptr<sim::DeviceCostModel>> models;
  for (int r = 0; r < program.world_size(); ++r) {
    models.push_back(std::make_unique<sim::DeviceCostModel>(experiment.cluster, r));
  }
  for (strategies::OpId id = 0; id < program.op_count(); ++id) {
    const auto& op = program.op(id);
    const auto* c = std::get_if<strategies::Compute>(&op.work);
    if (!c) continue;
    const auto& kernels = program.kernels_of(*c);
    for (std::size_t k = 0; k < kernels.size(); ++k) {
      predicted_kernels.push_back(
          {id, static_cast<std::uint32_t>(k),
           models[static_cast<std::size_t>(op.rank)]->kernel_time(kernels[k])});
    }
  }
  for (const auto& k : run.kernels) measured_kernels.push_back({k.op, k.index, k.end - k.start});
  auto context = traces::report_context(experiment);
  auto measured_timeline = run.timeline;
  if (run.reserved_peak.count() > 0) {
    // The allocator's own high-water mark is the measured peak (fragmentation included).
    for (auto& rank : measured_timeline.ranks) {
      rank.tiers[0].peak = std::max(rank.tiers[0].peak, run.reserved_peak);
    }
  }
  const auto validation = traces::compare(program, predicted, measured_timeline, predicted_kernels,
                                          measured_kernels, context.stage_of_rank);
  if (!args.quiet) {
    std::cout << "validation of " << experiment.name << ": predicted on "
              << experiment.cluster.device.name
              << (experiment.cluster.device.profile ? " with its measured profile" : "")
              << ", measured on " << device_text(device_kind(args.device)) << "\n";
    print_iterations(run, args.warmup);
    std::cout << "error = (predicted - measured) / measured\n\n";
    traces::print_validation(std::cout, validation);
  }
  if (!args.out.empty()) {
    const fs::path dir(args.out);
    const auto predicted_report = traces::make_report(program, predicted, context);
    traces::write_outputs(dir / "predicted", program, predicted, predicted_report, context);
    context.setup.insert(context.setup.begin(),
                         {"measured on", device_text(device_kind(args.device))});
    const auto measured_report = traces::make_report(program, run.timeline, context);
    traces::write_outputs(dir / "measured", program, run.timeline, measured_report, context);
    auto json = traces::to_json(validation);
    json["experiment"] = experiment.name;
    json["predicted_on"] = experiment.cluster.device.name;
    json["profile"] = experiment.cluster.device.profile != nullptr;
    json["measured_on"] = device_text(device_kind(args.device));
    json["iteration_times_s"] = run.iteration_times_s;
    files::write_atomically(dir / "validation.json", [&](std::ostream& out) {
      out << json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    });
    files::write_atomically(dir / "validation_ops.csv", [&](std::ostream& out) {
      traces::write_validation_csv(out, validation);
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
