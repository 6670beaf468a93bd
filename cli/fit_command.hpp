// `stratasim fit`: fits calibrated kernel models (hw_models/kernel_model.hpp) for devices to the
// published kernel measurements of a calibration file (study/fit.hpp) and writes one kernel-model
// file per device; scripts/fit-profiles runs it for the shipped devices.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "study/fit.hpp"

namespace stratasim::cli {

struct FitArgs {
  std::string calibration;           // default: study::default_calibration_file()
  std::vector<std::string> devices;  // device files or catalog names
  std::string out_dir;               // writes <device file stem>.kernel-model.json here
  std::string frameworks;            // also fit the frameworks; write them to this JSON file
  std::string residuals;             // optional CSV: every case's measured and fitted time
  std::string collectives;           // fit the NCCL model's fabrics; rewrite them in this folder
  bool quiet = false;
  study::FitOptions options;  // --max-evaluations, --max-framework-evaluations
};

void add_fit_options(CLI::App* cmd, FitArgs& args);

/// Returns the exit code; throws BadInput / config::ConfigError for bad input (exit 2).
int fit_command(const FitArgs& args);

}  // namespace stratasim::cli
