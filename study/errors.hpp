// The errors of the composition layer, which every entry point maps the same way: the CLI to its
// exit codes, the Python module to exceptions carrying the same message.
//
// - config::ConfigError (hw_models/config_reader.hpp), traces::TraceError and BadInput: input
//   the user got wrong (a file, a JSON path, a flag or a keyword); CLI exit code 2. Among them
//   HostMemoryExceeded: the run's estimated host memory exceeds the limit (before it starts).
// - InvalidProgram: a lowering or replay produced a Program that fails strategies::validate —
//   a bug, not bad input; CLI exit code 3.
// A simulation that does not complete (a deadlock) is not an exception: the Timeline says so
// (completed, problem) and the entry point reports it (CLI exit code 3).
#pragma once

#include <stdexcept>

namespace stratasim::study {

/// Arguments or input files the user got wrong. The message names the flag, keyword or file.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The run would need more host memory than it may use (study/footprint.hpp): bad input in that
/// the user asked for more than the machine (or --max-memory) gives; CLI exit code 2.
struct HostMemoryExceeded : BadInput {
  using BadInput::BadInput;
};

/// A lowering bug, not bad input: the Program fails validation.
struct InvalidProgram : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace stratasim::study
