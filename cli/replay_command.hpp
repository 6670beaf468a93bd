// `stratasim replay TRACE --format chakra|kineto|stratasim`: re-simulates a recorded (or
// simulated) run on other hardware, with faster compute, or at another data-parallel width
// (docs/replay.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace stratasim::cli {

struct ReplayArgs {
  std::string trace;
  std::string format;
  std::string cluster;            // file or catalog name; empty: the one the trace names
  double scale_compute = 1.0;     // compute runs this many times faster
  std::optional<int> ranks;       // re-target the data-parallel width to this many ranks
  std::string dp_groups;          // regex naming the data-parallel groups; empty: default
  std::vector<std::string> sets;  // cluster.key=value
  std::string out;
  bool quiet = false;
  bool exact = false;  // simulate every replica instead of mirroring them
};

/// Adds the replay's positional argument and flags to `cmd`, writing into `args`.
void add_replay_options(CLI::App* cmd, ReplayArgs& args);

/// Runs the replay; returns the exit code. Throws BadInput (and lets traces::TraceError and
/// config::ConfigError through) for bad input, InvalidProgram for a program that cannot run.
int replay_command(const ReplayArgs& args);

}  // namespace stratasim::cli
