// DLRM lowering: a recommendation model (strategies/dlrm_model.hpp) trained with hybrid
// parallelism — embedding tables sharded over the GPUs (model parallel: table-, row- or
// column-wise), the MLPs data parallel — becomes a Program; with an `embedding_cache`
// (strategies/embedding_cache.hpp) the tables live in host memory and each GPU's cache misses
// become copies on the copy stream. docs/recommendation.md has the formulas.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "strategies/dlrm_model.hpp"
#include "strategies/experiment.hpp"
#include "strategies/program.hpp"

namespace stratasim::strategies {

/// Parameters of the model: the embedding tables, sum of rows x dim; the dense part, each MLP
/// layer's in x out weights and out biases (the bottom MLP from dense_features, the top MLP from
/// interaction_width()) and DCNv2's cross layers (full rank: D x D + D each; low rank r:
/// 2 D r + D each, D = interaction input width (1 + tables) x dim).
std::int64_t embedding_parameters(const DlrmModel& m);
std::int64_t dense_parameters(const DlrmModel& m);
/// The parts of dense_parameters: bottom MLP, DCN cross layers (0 unless dcn), top MLP.
std::int64_t bottom_mlp_parameters(const DlrmModel& m);
std::int64_t cross_parameters(const DlrmModel& m);
std::int64_t top_mlp_parameters(const DlrmModel& m);
/// The top MLP's input width: dot, dim + F (F - 1) / 2 with F = tables + 1 (DLRM's pairwise
/// dots without the diagonal, concatenated with the bottom MLP's output); cat, the bottom MLP's
/// width plus every table's dim; dcn, that same concatenation (the cross layers keep it).
std::int64_t interaction_width(const DlrmModel& m);
/// The bottom MLP's width plus every table's dim: the concatenated features (D above).
std::int64_t cross_input_width(const DlrmModel& m);

/// Table-wise placement of the model's tables on `gpus` GPUs: tables taken largest first (rows x
/// dim, then index), each to the GPU with the fewest bytes so far among those holding fewer than
/// ceil(tables / gpus) tables (then the lowest index). result[g]: GPU g's tables, ascending.
std::vector<std::vector<int>> table_wise_placement(const DlrmModel& m, int gpus);

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

/// The embedding cache over one iteration, all GPUs: the hit rate (lookups that found their row
/// cached, over all lookups of the iteration), the rows cached and the shard rows, and the PCIe
/// traffic of the misses (host -> device) and evictions (device -> host), in total and on the
/// GPU that fetches the most.
struct EmbeddingCacheFigures {
  double hit_rate = 1.0;
  std::int64_t cached_rows = 0;
  std::int64_t rows = 0;
  Bytes to_device;
  Bytes to_host;
  Bytes busiest_to_device;
};
/// The figures of a DLRM experiment with an embedding_cache; nullopt otherwise.
std::optional<EmbeddingCacheFigures> embedding_cache_figures(const Experiment& e);

}  // namespace stratasim::strategies
