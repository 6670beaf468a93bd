// `stratasim accuracy [--calibration FILE] [--format table|csv|json] [--kernels]`: the
// simulator's predictions against the published measurements of the calibration set
// (study/accuracy.hpp computes them; docs/accuracy.md explains the table). Prints only.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace stratasim::cli {

struct AccuracyArgs {
  std::string calibration;  // empty: study::default_calibration_file()
  std::string format = "table";
  bool kernels = false;
  bool collectives = false;  // --collectives: the collective table
};

/// Adds the accuracy command's flags to `cmd`, writing into `args`.
void add_accuracy_options(CLI::App* cmd, AccuracyArgs& args);

/// Prints the table; returns the exit code (0: the table was printed, whatever its errors).
/// A malformed calibration file throws config::ConfigError (exit code 2).
int accuracy_command(const AccuracyArgs& args);

}  // namespace stratasim::cli
