// RNN lowering: a recurrent network (strategies/rnn_model.hpp) trained by back-propagation
// through time or by ADMMiRNN (training.algorithm), data parallel over the GPUs, becomes a
// Program of per-timestep kernels. docs/rnn.md has the formulas.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "strategies/experiment.hpp"
#include "strategies/program.hpp"
#include "strategies/rnn_model.hpp"

namespace stratasim::strategies {

/// Reads `model.type: "rnn"` at `path`. Throws config::ConfigError.
RnnModel read_rnn_model(config::Document& doc, const std::string& path);

/// The experiment's checks and resolved values for an RNN model; fills e.model's name, source
/// and layer count for the shared code. Adds "note:" lines to `notes`. Throws
/// config::ConfigError naming the key.
void check_rnn_experiment(const config::Document& doc, Experiment& e,
                          std::vector<std::string>& notes);

/// One training iteration of the RNN experiment; `mirror_data_parallel`: replicas other than
/// rank 0 mirror it (Program::set_replica).
Program lower_rnn(const Experiment& e, bool mirror_data_parallel = false);

/// The report's setup lines for an RNN experiment.
std::vector<std::pair<std::string, std::string>> rnn_setup(const Experiment& e);

}  // namespace stratasim::strategies
