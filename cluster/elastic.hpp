// What the elastic policies (cluster/pollux.hpp, cluster/ones.hpp) share: the allocations they
// consider for a job and its goodput at each (cluster/efficiency.hpp: goodput = speed x E(M), in
// base-batch samples per second).
//
// Candidates (so that a policy asks for few distinct speeds: each is one memoised simulation):
// - GPU counts: the job's min_gpus, gpus and max_gpus, and every power of two between min_gpus and
//   max_gpus;
// - batches: the job's base batch M0 times and divided by powers of two, within [min_batch,
//   max_batch], and min_batch and max_batch themselves; only M0 when the batch is fixed (or
//   unknown, 0).
// A candidate whose speed is not runnable is left out; the base configuration (gpus, M0) is
// runnable (the simulator checks it before the first decision).
//
// GoodputCache memoises, per job, the best batch at each candidate GPU count (the M maximising
// goodput; ties: the smaller M) and the "ladder" (one configuration per candidate batch, its GPUs
// following from the batch at the job's base per-GPU batch: g(M) = the largest candidate count <=
// gpus x M / M0, at least min_gpus, as ONES scales a job's GPUs with its batch). Speeds are
// deterministic, so entries never go stale within a run; the cache is keyed by the Job's address
// and checked against its id and experiment (a policy reused on another trace recomputes); it is
// not thread-safe (one per policy instance).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cluster/throughput.hpp"
#include "cluster/trace.hpp"

namespace stratasim::cluster {

struct Config {
  int gpus = 0;
  int batch = 0;
  double goodput = 0;  // base-batch samples/s; 0 when not runnable
};

/// Candidate GPU counts, ascending (see the top of this file).
std::vector<int> candidate_gpus(const Job& job);
/// Candidate batches, ascending (see the top of this file).
std::vector<int> candidate_batches(const Job& job);

class GoodputCache {
 public:
  /// The best runnable batch at each candidate GPU count, ascending in GPUs (counts with no
  /// runnable batch left out).
  const std::vector<Config>& best_by_gpus(const Job& job, const Throughput& speeds);
  /// One runnable configuration per candidate batch, GPUs following from the batch (see the top
  /// of this file), ascending in batch; at least the base configuration.
  const std::vector<Config>& ladder(const Job& job, const Throughput& speeds);

 private:
  struct Entry {
    std::string id;  // the job's id and experiment
    bool has_best = false, has_ladder = false;
    std::vector<Config> best, ladder;
  };
  Entry& entry(const Job& job);
  std::map<const Job*, Entry> entries_;
};

/// goodput of `job` at (gpus, batch): speed x E(batch); 0 when not runnable.
double goodput(const Job& job, int gpus, int batch, const Throughput& speeds);

}  // namespace stratasim::cluster
