// A job's training speed on g GPUs at a global batch M, as the cluster simulator
// (cluster/simulator.hpp) and its schedulers ask for it.
//
// Throughput is the interface; two sources:
// - SimulatedThroughput: stratasim's own simulation of the job's experiment (study::simulate,
//   the prediction `stratasim simulate` gives) with the experiment's cluster resized to g GPUs
//   (study::resize_overrides: whole nodes of the experiment's own cluster, or part of one node)
//   and parallelism.dp set to null, so that dp is re-derived as g / (tp x pp x cp); tp, pp, the
//   micro-batch and the global batch are the experiment's (kept, not scaled: a job's samples per
//   iteration do not change with its GPUs, and its speed is report.samples_per_s). At a batch M
//   other than 0 (0: the experiment's own), training.global_batch is overridden to M as well (the
//   micro-batch kept: more micro-batches per step). Each (experiment file, g, M) is simulated once
//   and memoised; the cache is thread-safe. A run that is
//   invalid at g (g not a multiple of tp x pp, the global batch not divisible by dp x micro-batch,
//   g above a node and not whole nodes), that does not fit in device memory, or whose simulation
//   does not complete is "not runnable at g" with the reason.
//   The speed is that of the experiment's own hardware; the cluster given to `stratasim cluster`
//   supplies the GPU count (a heterogeneous cluster is not modelled yet).
// - TableThroughput: a hand-made table, experiment -> {g -> samples/s} at the job's base batch,
//   and optionally experiment -> {(g, M) -> samples/s} for other batches, for tests that need
//   exact speeds; a (g, M) in neither table is not runnable.
// Speeds are raw samples per second; the progress they make depends on the batch through the
// job's statistical efficiency (cluster/efficiency.hpp), which the simulator and the goodput
// policies apply, not the Throughput.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "cluster/trace.hpp"

namespace stratasim::cluster {

struct Speed {
  bool runnable = false;
  double samples_per_s = 0;  // > 0 when runnable
  std::string why_not;       // when not runnable: what the simulation or the config said
};

class Throughput {
 public:
  virtual ~Throughput() = default;
  /// The speed of `job` on `gpus` GPUs at global batch `batch` (0 or job.batch: its base
  /// batch). Must be deterministic and safe to call from threads.
  virtual Speed speed(const Job& job, int gpus, int batch) const = 0;
  /// The speed at the job's base batch.
  Speed speed(const Job& job, int gpus) const { return speed(job, gpus, job.batch); }
};

/// Hand-made speeds keyed by Job::experiment (as written in the trace).
class TableThroughput : public Throughput {
 public:
  /// experiment -> gpus -> samples/s
  explicit TableThroughput(
      std::map<std::string, std::map<int, double>> table,
      std::map<std::string, std::map<std::pair<int, int>, double>> batched = {})
      : table_(std::move(table)), batched_(std::move(batched)) {}
  using Throughput::speed;
  /// The base table at batch 0 or job.batch (the batched table's (gpus, job.batch) when the base
  /// table has no entry), the batched table's (gpus, batch) otherwise.
  Speed speed(const Job& job, int gpus, int batch) const override;

 private:
  std::map<std::string, std::map<int, double>> table_;
  std::map<std::string, std::map<std::pair<int, int>, double>> batched_;
};

/// stratasim's own simulation of the job's experiment at g GPUs (see the top of this file).
class SimulatedThroughput : public Throughput {
 public:
  using Throughput::speed;
  Speed speed(const Job& job, int gpus, int batch) const override;
  /// How many (experiment, g) simulations ran so far (the memoisation's misses).
  int simulations() const;

 private:
  mutable std::mutex mutex_;
  mutable std::map<std::tuple<std::string, int, int>, Speed> cache_;
  mutable int simulations_ = 0;
};

/// The speed of `experiment_file` on `gpus` GPUs at global batch `batch` (0: the experiment's),
/// simulated (not memoised).
Speed simulate_speed(const std::filesystem::path& experiment_file, int gpus, int batch = 0);

}  // namespace stratasim::cluster
