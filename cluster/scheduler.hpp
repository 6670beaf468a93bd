// The scheduling policies of the cluster simulator (cluster/simulator.hpp), behind one interface.
//
// At every scheduling decision (each arrival and completion, and every tick when the policy asks
// for one) the simulator hands the policy the time, the cluster's GPUs and every job that has
// arrived and not finished — queued, preempted, restarting or running — with its current
// allocation, attained service and remaining samples. The policy returns the allocation it wants
// for each of them: a GPU count, 0 meaning queued (or preempted, if the job held GPUs), and a
// global batch (Allocation; policies that do not choose batches answer through allocate() with
// GPU counts only, and every job keeps its base batch). The simulator checks the answer (the sum
// within the cluster; each count 0 or within the job's [min_gpus, max_gpus], each batch within
// [min_batch, max_batch], runnable) and applies it: a job whose count or batch changes from a
// running allocation is preempted or resized and pays the restart cost when it runs again.
//
// Policies (all deterministic: ties are broken by arrival time, then by id):
// - fifo: non-preemptive, strict arrival order with head-of-line blocking: running jobs keep
//   their GPUs; queued jobs start in arrival order, each with its requested GPUs, and the first
//   that does not fit blocks every job behind it (no backfilling).
// - srtf: shortest remaining time first, preemptive: every decision ranks all active jobs by
//   remaining samples / speed at their requested GPUs and gives each, in that order, its
//   requested GPUs if they are still free (a job that does not fit is skipped; later, smaller
//   ones may run).
// - tiresias: two-dimensional attained service (GPUs x seconds held), discretised into K
//   priority queues (Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning",
//   NSDI 2019, section 4: 2D-LAS with discretised queues): a job is in queue k when its attained
//   service has passed k of the thresholds; lower queues first, FIFO by arrival within a queue,
//   preemptive, each job its requested GPUs when they are free (skipped otherwise). The
//   thresholds are parameters; the default is the paper's two queues (K = 2) with one threshold,
//   here 3,600 GPU-seconds (an assumption: the paper derives thresholds from its trace; its
//   starvation knob, PROMOTE, is not built). Demotion is seen at decisions, so the policy asks
//   for a periodic tick (SchedulerOptions::tick_s, default 60 s).
//
// - pollux: a goodput optimiser after Pollux (cluster/pollux.hpp).
// - ones: ONES' evolutionary search over batch sizes (cluster/ones.hpp), deterministic for
//   SchedulerOptions::seed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/throughput.hpp"
#include "cluster/trace.hpp"

namespace stratasim::cluster {

/// One active job as a policy sees it.
struct JobView {
  const Job* job = nullptr;
  int gpus = 0;                  // its current allocation (0: queued or preempted)
  double attained_gpu_s = 0;     // GPUs x seconds held so far (restarts included)
  double attained_s = 0;         // seconds held so far
  double remaining_samples = 0;  // at the job's base batch
  int batch = 0;                 // its current global batch (its base batch while queued)
  double last_change_s = -1;     // when its allocation last changed while it ran; -1: never
};

/// A policy's answer for one job: GPUs (0: queued or preempted) and the global batch (0: the
/// job's base batch).
struct Allocation {
  int gpus = 0;
  int batch = 0;
};

struct SchedulerInput {
  double now_s = 0;
  int total_gpus = 0;
  /// Active jobs in (arrival, id) order.
  std::vector<JobView> jobs;
  const Throughput* speeds = nullptr;
  double restart_cost_s = 0;  // what the simulator charges a resized or preempted job
  int free_gpus() const;
};

struct SchedulerOptions {
  /// Seed for stochastic policies (ones).
  std::uint64_t seed = 0;
  /// Tiresias' queue thresholds in GPU-seconds, ascending (K - 1 thresholds for K queues).
  std::vector<double> tiresias_thresholds_gpu_s = {3600.0};
  /// Periodic decisions (seconds) for policies whose priorities change while jobs run
  /// (tiresias); unset: the policy's default.
  std::optional<double> tick_s;
  /// pollux: the power p of the generalised mean of speedups (cluster/pollux.hpp).
  double pollux_p = -1.0;
  /// ones: population, generations per decision, and the least time between two changes of a
  /// running job's allocation (cluster/ones.hpp).
  int ones_population = 16;
  int ones_generations = 5;
  double ones_min_resize_interval_s = 300.0;
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual std::string name() const = 0;
  /// The GPUs for each of input.jobs, in the same order, every job at its base batch. The
  /// default answers decide()'s GPUs; a policy overrides this, decide(), or both.
  virtual std::vector<int> allocate(const SchedulerInput& input);
  /// GPUs and batch for each of input.jobs, in the same order: what the simulator asks. The
  /// default is allocate()'s GPUs at each job's base batch.
  virtual std::vector<Allocation> decide(const SchedulerInput& input);
  /// Seconds between periodic decisions; unset: decisions on arrivals and completions only.
  virtual std::optional<double> tick_s() const { return std::nullopt; }
};

/// "fifo", "srtf", "tiresias", "pollux" or "ones"; anything else throws study::BadInput naming
/// --scheduler.
std::unique_ptr<Scheduler> make_scheduler(const std::string& name,
                                          const SchedulerOptions& options = {});

/// The names make_scheduler knows.
std::vector<std::string> scheduler_names();

}  // namespace stratasim::cluster
