// `stratasim export`: an experiment's Program as a Chakra trace.
#include "cli/export_command.hpp"

#include <filesystem>
#include <iostream>

#include "study/study.hpp"
#include "traces/chakra.hpp"

namespace stratasim::cli {

namespace fs = std::filesystem;

void add_export_options(CLI::App* cmd, ExportArgs& args) {
  add_experiment_options(cmd, args.experiment);
  add_max_memory_option(cmd, args.experiment);
  cmd->add_option("--format", args.format,
                  "chakra (protobuf, <name>.<rank>.et) or chakra-json (Chakra's JSON form, "
                  "<name>.<rank>.json)");
  cmd->add_option("--out", args.out, "Folder to write the per-rank files and comm groups into")
      ->required();
  cmd->add_flag("--simulate", args.simulate,
                "Simulate the experiment and record each node's start and duration "
                "(start_time_micros, duration_micros)");
  cmd->add_option("--order", args.order,
                  "stream (each stream's order) or simulated (also chain each rank's "
                  "communication nodes in simulated start order, for simulators with one "
                  "communication queue per rank such as ASTRA-sim; needs --simulate)");
}

int export_command(const ExportArgs& args) {
  if (args.format != "chakra" && args.format != "chakra-json") {
    throw BadInput("--format " + args.format + ": expected chakra or chakra-json");
  }
  if (args.order != "stream" && args.order != "simulated") {
    throw BadInput("--order " + args.order + ": expected stream or simulated");
  }
  if (args.order == "simulated" && !args.simulate) {
    throw BadInput("--order simulated needs --simulate (the simulated start times)");
  }
  check_out_dir(args.out);
  const auto experiment = strategies::load_experiment(
      resolve_experiment(args.experiment.experiment), overrides_of(args.experiment));
  // Every rank issues its own ops: a trace has one file per rank (no data-parallel mirroring).
  study::Result r;
  if (args.simulate) {
    study::Options options;
    options.exact = true;
    options.record_memory = false;
    options.max_memory = max_memory_of(args.experiment);
    r = study::simulate(experiment, options);
    if (!r.timeline.completed) {
      std::cerr << "error: the simulation did not complete: " << r.timeline.problem << "\n";
      return kExitSimulationFailed;
    }
  } else {
    r.program = study::lower(experiment, {.mirror_data_parallel = false});
  }
  const auto& program = r.program;
  traces::ChakraExportOptions options;
  options.json_form = args.format == "chakra-json";
  if (args.simulate) options.timeline = &r.timeline;
  options.single_comm_queue = args.order == "simulated";
  options.cluster = experiment.cluster.name;  // a replay finds it (stratasim.cluster)
  const fs::path prefix = fs::path(args.out) / experiment.name;
  traces::write_chakra(prefix, program, options);
  if (!args.experiment.quiet) {
    std::cout << "wrote " << program.world_size() << " rank files "
              << prefix.string() + ".<rank>" + (options.json_form ? ".json" : ".et") << " ("
              << program.op_count() << " nodes) and " << prefix.string() + ".comm_groups.json"
              << "\n";
  }
  return 0;
}

}  // namespace stratasim::cli
