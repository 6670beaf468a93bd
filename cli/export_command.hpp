// `stratasim export EXPERIMENT --format chakra|chakra-json --out DIR`: writes the Program an
// experiment lowers to as an MLCommons Chakra execution trace, for ASTRA-sim and Chakra's tools
// (docs/traces.md).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/common.hpp"

namespace stratasim::cli {

struct ExportArgs {
  SimulateArgs experiment;  // the experiment and the flags that change it
  std::string format = "chakra";
  std::string out;
  bool simulate = false;  // fill duration_micros from a simulation
  /// "stream": each stream's order (ctrl_deps); "simulated": also one communication queue per
  /// rank in simulated start order (needs --simulate), for ASTRA-sim.
  std::string order = "stream";
};

/// Adds the export's positional argument and flags to `cmd`, writing into `args`.
void add_export_options(CLI::App* cmd, ExportArgs& args);

/// Writes DIR/<experiment name>.<rank>.et (or .json) and DIR/<name>.comm_groups.json; returns
/// the exit code. Throws BadInput for a bad format or output folder.
int export_command(const ExportArgs& args);

}  // namespace stratasim::cli
