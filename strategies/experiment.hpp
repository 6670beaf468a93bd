// An experiment: a model, a cluster, a parallel strategy and the training settings — what
// `stratasim simulate` takes. Loading resolves the files it names, applies command-line
// overrides and checks that the pieces fit together (tp divides the heads, tp * pp * dp is the
// cluster's device count, ...), naming the file and JSON path of anything wrong.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/config_reader.hpp"
#include "strategies/model.hpp"

namespace stratasim::strategies {

enum class ScheduleKind { gpipe, one_f_one_b };
std::string_view name_of(ScheduleKind s);

struct ParallelismSpec {
  int tp = 1;  // tensor-parallel degree (Megatron 1D)
  int pp = 1;  // pipeline stages
  int dp = 0;  // data-parallel degree; 0 in a config means "all remaining devices"
  bool sequence_parallel = false;  // Megatron sequence parallelism (needs tp > 1 to matter)
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int micro_batch = 1;  // samples per microbatch
  /// Gradients are all-reduced in buckets of at least this many bytes, launched as soon as
  /// the last microbatch's backward has produced them (as DDP and Megatron do).
  Bytes dp_bucket_size = Bytes(25 * 1024 * 1024);
  bool dp_overlap = true;  // overlap the bucket all-reduces with backward (else after it)
};

enum class OptimizerChoice { adam };

struct TrainingSpec {
  std::int64_t global_batch = 0;  // samples per iteration
  int seq_len = 0;                // tokens per sample
  DType dtype = DType::bf16;      // weights, activations and gradients (mixed precision)
  OptimizerChoice optimizer = OptimizerChoice::adam;
  bool flash_attention = false;  // fused attention: no s^2 score matrix stored
};

struct Experiment {
  std::string name;
  std::string description;
  std::filesystem::path file;  // where it was loaded from (empty if built in code)
  TransformerModel model;
  hw::ClusterSpec cluster;
  ParallelismSpec parallelism;
  TrainingSpec training;

  /// Microbatches each pipeline runs per iteration: global_batch / (dp * micro_batch).
  std::int64_t microbatches() const {
    return training.global_batch / (std::int64_t{parallelism.dp} * parallelism.micro_batch);
  }
  std::int64_t tokens_per_iteration() const { return training.global_batch * training.seq_len; }
};

/// A `--set path=value` (or a flag such as --tp) applied to the experiment document before it
/// is read; paths may reach into the model and cluster files ("cluster.inter_node.bandwidth").
struct Override {
  std::string path;
  nlohmann::json value;
  std::string origin;  // how errors name it: "command line (--tp 4)"
};

/// Loads an experiment file, inlines the model and cluster (and device) files it names,
/// applies `overrides` in order and validates. Throws config::ConfigError.
Experiment load_experiment(const std::filesystem::path& file,
                           const std::vector<Override>& overrides = {});

/// Reads an experiment from an assembled document (used by load_experiment and tests).
Experiment read_experiment(config::Document& doc, const std::vector<Override>& overrides = {});

}  // namespace stratasim::strategies
