// The interpreter: runs a Program for real, one thread per local rank, each handing its rank's
// ops in issue order to the rank's RankDevice, for warm-up and measured iterations. A World says
// which ranks this process drives, makes their devices and synchronises all ranks (threads in one
// process, or processes under MPI). The measured iteration of median length becomes a Timeline in
// the simulator's format (traces/timeline.hpp), so `run` and `validate` report it as `simulate`
// reports a prediction.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "exec/plan.hpp"
#include "exec/rank_device.hpp"
#include "traces/timeline.hpp"

namespace stratasim::exec {

/// All ranks of a run and how to reach them. Every method but make_device may be called from any
/// local rank's thread.
class World {
 public:
  virtual ~World() = default;
  /// The ranks this process drives (all of them in a single process).
  virtual std::vector<int> local_ranks() const = 0;
  /// Makes the device of a local rank; called on that rank's thread, before any barrier.
  virtual std::unique_ptr<RankDevice> make_device(int rank) = 0;
  /// Blocks until every rank of every process has called it. Returns false (at once, or as
  /// soon as it happens) when the world was aborted.
  virtual bool barrier() = 0;
  /// Stops the run: barriers return false and devices stop waiting on their peers.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;
  /// Called once on the main thread after every local rank finished: merges the measurements
  /// of all processes into `measured` (per measured iteration, per rank; ranks of other
  /// processes arrive empty) on the reporting process. Nothing to do in a single process.
  virtual void gather(std::vector<std::vector<RankMeasurement>>& measured) { (void)measured; }
  /// Whether this process reports (prints and writes files).
  virtual bool reports() const { return true; }
};

/// A barrier for the threads of one process that can be aborted.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int parties) : parties_(parties) {}
  /// False when aborted (before or while waiting).
  bool arrive_and_wait();
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int parties_;
  int waiting_ = 0;
  std::uint64_t generation_ = 0;
  std::atomic<bool> aborted_{false};
};

/// A World whose ranks are all threads of this process; devices come from a factory.
class LocalWorld : public World {
 public:
  using Factory = std::function<std::unique_ptr<RankDevice>(int rank)>;
  LocalWorld(int world_size, Factory factory);
  std::vector<int> local_ranks() const override;
  std::unique_ptr<RankDevice> make_device(int rank) override { return factory_(rank); }
  bool barrier() override { return barrier_.arrive_and_wait(); }
  void abort() override { barrier_.abort(); }
  bool aborted() const override { return barrier_.aborted(); }

 private:
  int world_size_;
  Factory factory_;
  ThreadBarrier barrier_;
};

struct RunOptions {
  int warmup_iterations = 1;
  int iterations = 3;  // measured; the median is reported
  /// No op of a rank finishing for this long while some wait is a hang (HangError).
  std::chrono::milliseconds watchdog{std::chrono::seconds(60)};
};

/// A real run.
struct MeasuredRun {
  /// The measured iteration of median length (the lower median for an even count): spans
  /// indexed by op id, per-rank memory peaks and samples, like the simulator's Timeline.
  traces::Timeline timeline;
  /// Every kernel of every compute op in that iteration.
  std::vector<KernelTiming> kernels;
  /// Length of each measured iteration (latest op end over all ranks), seconds.
  std::vector<double> iteration_times_s;
  int median_iteration = 0;
  /// Largest allocator reservation over the ranks (0 where not known).
  Bytes reserved_peak;
};

/// Runs `plan`'s Program on `world`. On the reporting process returns the run; elsewhere an
/// empty MeasuredRun. Throws ExecError (HangError with every stuck rank's pending ops, for a
/// hang; the first rank's error for a failure, the others then being aborted).
MeasuredRun run(const ExecPlan& plan, World& world, const RunOptions& options = {});

/// Builds the Timeline of one iteration from every rank's measurement.
traces::Timeline assemble_timeline(const strategies::Program& program,
                                   const std::vector<RankMeasurement>& ranks);

}  // namespace stratasim::exec
