// A job's training speed on g GPUs, as the cluster simulator (cluster/simulator.hpp) and its
// schedulers ask for it.
//
// Throughput is the interface; two sources:
// - SimulatedThroughput: stratasim's own simulation of the job's experiment (study::simulate,
//   the prediction `stratasim simulate` gives) with the experiment's cluster resized to g GPUs
//   (study::resize_overrides: whole nodes of the experiment's own cluster, or part of one node)
//   and parallelism.dp set to null, so that dp is re-derived as g / (tp x pp x cp); tp, pp, the
//   micro-batch and the global batch are the experiment's (kept, not scaled: a job's samples per
//   iteration do not change with its GPUs, and its speed is report.samples_per_s). Each
//   (experiment file, g) is simulated once and memoised; the cache is thread-safe. A run that is
//   invalid at g (g not a multiple of tp x pp, the global batch not divisible by dp x micro-batch,
//   g above a node and not whole nodes), that does not fit in device memory, or whose simulation
//   does not complete is "not runnable at g" with the reason.
//   The speed is that of the experiment's own hardware; the cluster given to `stratasim cluster`
//   supplies the GPU count (a heterogeneous cluster is not modelled yet).
// - TableThroughput: a hand-made table, experiment -> {g -> samples/s}, for tests that need exact
//   speeds; a g not in the table is not runnable.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
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
  /// The speed of `job` on `gpus` GPUs. Must be deterministic and safe to call from threads.
  virtual Speed speed(const Job& job, int gpus) const = 0;
};

/// Hand-made speeds keyed by Job::experiment (as written in the trace).
class TableThroughput : public Throughput {
 public:
  /// experiment -> gpus -> samples/s
  explicit TableThroughput(std::map<std::string, std::map<int, double>> table)
      : table_(std::move(table)) {}
  Speed speed(const Job& job, int gpus) const override;

 private:
  std::map<std::string, std::map<int, double>> table_;
};

/// stratasim's own simulation of the job's experiment at g GPUs (see the top of this file).
class SimulatedThroughput : public Throughput {
 public:
  Speed speed(const Job& job, int gpus) const override;
  /// How many (experiment, g) simulations ran so far (the memoisation's misses).
  int simulations() const;

 private:
  mutable std::mutex mutex_;
  mutable std::map<std::pair<std::string, int>, Speed> cache_;
  mutable int simulations_ = 0;
};

/// The speed of `experiment_file` on `gpus` GPUs, simulated (not memoised).
Speed simulate_speed(const std::filesystem::path& experiment_file, int gpus);

}  // namespace stratasim::cluster
