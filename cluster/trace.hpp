// A job trace for the cluster simulator (cluster/simulator.hpp): which training jobs arrive on a
// shared GPU cluster, when, how much work each brings and how many GPUs it asks for.
//
// File format: JSON lines (docs/cluster.md). One JSON object per line, one job per object; blank
// lines and lines whose first non-blank character is '#' (provenance, comments) are skipped.
// Fields:
//   id               string, unique in the trace, without commas or quotes (required)
//   arrival_s        number, seconds after the trace's start, 0 <= arrival_s <= 90 days
//                    (kMaxTraceSeconds) (required)
//   experiment       string: a file, or a name from configs/experiments, resolved as `stratasim
//                    simulate` resolves it (study::resolve_experiment) and loaded to check it
//                    (required)
//   samples          number > 0: training samples the job must process (this, or
//   epochs +         epochs > 0 and dataset_samples > 0: samples = epochs x dataset_samples)
//   dataset_samples
//   gpus             integer >= 1: the GPUs the job requests (required)
//   min_gpus         integer, 1 <= min_gpus <= gpus (default gpus)
//   max_gpus         integer, gpus <= max_gpus (default gpus); the job is elastic when
//                    min_gpus < max_gpus (the schedulers built now give every job `gpus`)
//   priority         integer (default 0), kept for priority-aware schedulers
//   batch            integer >= 1: the job's base global batch (samples per step), the batch its
//                    `samples` are counted at (default: the experiment's training.global_batch;
//                    when experiments are not loaded, 0: unknown, and the job's batch is fixed)
//   min_batch        integer, 1 <= min_batch <= batch (default batch)
//   max_batch        integer, batch <= max_batch (default batch); the job's batch is elastic when
//                    min_batch < max_batch (pollux and ones choose it; cluster/efficiency.hpp)
//   noise_scale      number >= 0: the gradient noise scale phi in samples (cluster/efficiency.hpp);
//                    required when the batch is elastic, unused otherwise
// Unknown fields are errors (a misspelt "arival_s" must not pass silently).
// Errors: study::BadInput "FILE:LINE: FIELD: what was expected" (the CLI's exit code 2) for a
// line that is not a JSON object, a missing or mistyped field, a negative time, a job larger
// than the cluster (max_gpus above its GPUs), a duplicate id, and an experiment that does not
// load (unknown experiment or model: the loader's message follows).
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <vector>

namespace stratasim::cluster {

/// The latest arrival (and completion) the simulator's clock holds: int64 picoseconds span
/// about 106 days; traces are kept within 90 days.
constexpr double kMaxTraceSeconds = 90.0 * 24 * 3600;

struct Job {
  std::string id;
  double arrival_s = 0;                   // seconds after the trace's start
  std::string experiment;                 // as written in the trace
  std::filesystem::path experiment_file;  // study::resolve_experiment(experiment)
  double samples = 0;                     // training samples to process (> 0)
  int gpus = 1;                           // requested
  int min_gpus = 1;
  int max_gpus = 1;
  int priority = 0;
  int batch = 0;  // base global batch (samples per step); 0: unknown (the experiment's own)
  int min_batch = 0;
  int max_batch = 0;
  double noise_scale = 0;  // phi, samples (cluster/efficiency.hpp)
  int line = 0;            // the trace line it came from (1-based), for messages
  bool elastic() const { return min_gpus < max_gpus; }
  bool elastic_batch() const { return min_batch < max_batch; }
  /// E(batch) relative to the base batch (1 at the base batch or when the batch is fixed).
  double efficiency(int at_batch) const;
};

struct JobTrace {
  std::string source;     // the file, as messages name it
  std::vector<Job> jobs;  // in file order
};

/// Reads a JSON-lines trace (see the top of this file). `cluster_gpus`: the cluster's GPUs, so
/// that a job larger than the cluster is refused here, naming its line. `check_experiments`:
/// load every experiment (once per distinct name) to refuse unknown experiments and models;
/// tests with hand-made speeds pass false and may name anything.
JobTrace read_trace(const std::filesystem::path& file, int cluster_gpus,
                    bool check_experiments = true);
/// The same from a stream; `source` names it in errors.
JobTrace parse_trace(std::istream& in, const std::string& source, int cluster_gpus,
                     bool check_experiments = true);

}  // namespace stratasim::cluster
