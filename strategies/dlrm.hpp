// DLRM lowering: a recommendation model (strategies/dlrm_model.hpp) trained with hybrid
// parallelism — embedding tables sharded over the GPUs (model parallel: table-, row- or
// column-wise), the MLPs data parallel — becomes a Program; with an `embedding_cache`
// (strategies/embedding_cache.hpp) the tables live in host memory and each GPU's cache misses
// become copies on the copy stream. docs/recommendation.md has the formulas.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "strategies/dlrm_model.hpp"
#include "strategies/experiment.hpp"
#include "strategies/program.hpp"

namespace stratasim::strategies {

/// Reads `model.type: "dlrm"` at `path`. Throws config::ConfigError.
DlrmModel read_dlrm_model(config::Document& doc, const std::string& path);

/// The experiment's checks and resolved values for a DLRM model (parallelism, batch, sharding,
/// cache); fills e.model's name, source and layer count for the shared code. Adds "note:"
/// lines to `notes`. Throws config::ConfigError naming the key.
void check_dlrm_experiment(const config::Document& doc, Experiment& e,
                           std::vector<std::string>& notes);

/// One training iteration of the DLRM experiment on every rank.
Program lower_dlrm(const Experiment& e);

/// The report's setup lines for a DLRM experiment ({"model", ...}, {"parallelism", ...},
/// {"embedding cache", hit rate, PCIe traffic, ...}).
std::vector<std::pair<std::string, std::string>> dlrm_setup(const Experiment& e);

}  // namespace stratasim::strategies
