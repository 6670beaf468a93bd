// `stratasim replay TRACE --format chakra|kineto|stratasim`: re-simulates a recorded (or
// simulated) run on other hardware, with faster compute, or at another data-parallel width
// (docs/replay.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "study/replay.hpp"

namespace stratasim::cli {

struct ReplayArgs {
  study::ReplayRequest request;  // what to replay, filled by the flags (study/replay.hpp)
  std::string out;
  bool quiet = false;     // --quiet: nothing on success, notes included
  bool no_notes = false;  // --no-notes: the report without the notes
};

/// Adds the replay's positional argument and flags to `cmd`, writing into `args`.
void add_replay_options(CLI::App* cmd, ReplayArgs& args);

/// Runs the replay; returns the exit code. Throws BadInput (and lets traces::TraceError and
/// config::ConfigError through) for bad input, InvalidProgram for a program that cannot run.
int replay_command(const ReplayArgs& args);

}  // namespace stratasim::cli
