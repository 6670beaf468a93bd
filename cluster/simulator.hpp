// The cluster simulator: many training jobs (cluster/trace.hpp) arriving on a shared cluster of
// GPUs, placed over time by a policy (cluster/scheduler.hpp), each progressing at the speed its
// allocation gives (cluster/throughput.hpp). `stratasim cluster` (docs/cluster.md).
//
// Discrete events on one clock, int64 picoseconds (hw_models/units.hpp's Time): one event queue
// ordered by (time, sequence number). Events: arrivals, completions, the end of a restart, and
// periodic ticks where the policy asks for them. All events at one time are applied before one
// scheduling decision is taken (on any arrival, completion or tick at that time).
//
// Model:
// - A job on g GPUs at global batch M processes speed(job, g, M) samples/s, each making E(M) of
//   a base-batch sample's progress (cluster/efficiency.hpp): its remaining base-batch samples
//   fall at speed x E(M) per second; it completes when they are done: at t + ceil(remaining /
//   (speed x E(M)) x 1e12) ps. A policy that does not choose batches keeps every job at its base
//   batch (E = 1).
// - A job whose allocation changes from g > 0 to 0 is preempted (its progress is kept: a
//   checkpoint); one whose allocation changes from (g > 0, M) to (g' > 0, M') with g' != g or
//   M' != M is resized. When a preempted
//   job runs again, or a resized job goes on, it holds its GPUs for `restart_cost` first without
//   progress (checkpoint and restart, paid once, on the restart). The first start pays nothing.
//   Default 30 s: an assumption (saving and loading a checkpoint and restarting the framework;
//   Tiresias and Pollux report tens of seconds), to be set per cluster with --restart-cost.
// - Attained service counts the time a job holds GPUs, restarts included.
// Outputs (all deterministic):
// - per job: first start, completion, JCT = completion - arrival, queueing delay = first start -
//   arrival, preemptions (allocations taken back to 0), restarts, GPU-seconds held;
// - summary: mean, p50, p90, p99 JCT (nearest rank: the ceil(p/100 x n)-th smallest), mean
//   queueing delay, makespan (last completion - first arrival), mean utilisation over the
//   makespan (GPU-seconds held / (GPUs x makespan));
// - utilisation: a step function, GPUs held from each time on;
// - segments: each job's stretches on GPUs (restarting or running), for the timeline.
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "cluster/scheduler.hpp"
#include "cluster/throughput.hpp"
#include "cluster/trace.hpp"
#include "cluster/workload.hpp"
#include "hw_models/units.hpp"

namespace stratasim::cluster {

struct SimulationOptions {
  int total_gpus = 0;
  Time restart_cost = Time::from_seconds(30.0);
};

struct JobResult {
  std::string id;
  int gpus = 0;  // requested
  double samples = 0;
  double samples_per_s = 0;  // the speed at the requested GPUs
  double arrival_s = 0;
  double start_s = 0;  // first start
  double completion_s = 0;
  double jct_s = 0;
  double queueing_s = 0;
  int preemptions = 0;
  int restarts = 0;
  double gpu_seconds = 0;
};

struct UtilisationStep {
  double time_s = 0;
  int busy_gpus = 0;  // from time_s until the next step
};

struct Segment {
  int job = 0;  // index into ClusterResult::jobs
  int gpus = 0;
  double start_s = 0;
  double end_s = 0;
  bool restarting = false;
  int batch = 0;  // the global batch (0: the base batch, unknown)
};

struct ClusterSummary {
  int jobs = 0;
  double mean_jct_s = 0, p50_jct_s = 0, p90_jct_s = 0, p99_jct_s = 0;
  double mean_queueing_s = 0;
  double makespan_s = 0;
  double mean_utilisation = 0;  // 0..1
  int preemptions = 0;
};

struct ClusterResult {
  std::string scheduler;
  int total_gpus = 0;
  double restart_cost_s = 0;
  std::vector<JobResult> jobs;  // in trace order
  std::vector<UtilisationStep> utilisation;
  std::vector<Segment> segments;
  ClusterSummary summary;
};

/// Simulates `trace` under `scheduler`. Throws study::BadInput naming the trace line when a job
/// is not runnable at its requested GPUs (the reason follows), std::logic_error when the policy
/// returns an allocation the simulator must refuse (a policy bug).
ClusterResult simulate_cluster(const JobTrace& trace, Scheduler& scheduler,
                               const Throughput& speeds, const SimulationOptions& options);

/// Nearest-rank percentile of `values` (p in (0, 100]); 0 for none.
double percentile(std::vector<double> values, double p);

/// jobs.csv:
/// id,gpus,samples,samples_per_s,arrival_s,start_s,completion_s,jct_s,queueing_s,preemptions,restarts,
/// gpu_seconds — one row per job in trace order.
void write_jobs_csv(std::ostream& out, const ClusterResult& result);
/// summary.json: scheduler, gpus, restart_cost_s, the summary's fields, utilisation
/// [[time_s, busy_gpus], ...].
void write_summary_json(std::ostream& out, const ClusterResult& result);
/// timeline.json: Chrome trace event format (Perfetto opens it): one track (tid) per job under
/// process "jobs", a complete ("X") event per segment named by the job ("restart" while it
/// restarts), and a "busy GPUs" counter ("C") track; timestamps in microseconds.
void write_timeline_json(std::ostream& out, const ClusterResult& result);
/// Writes jobs.csv, summary.json and timeline.json into `dir` (created; atomically, as
/// files::StagedWrites does).
void write_outputs(const std::filesystem::path& dir, const ClusterResult& result);

/// The composition `stratasim cluster` runs: the cluster config's device count (a file or a
/// name from configs/hardware/clusters) as the GPUs, the trace read against it in its format
/// (cluster/workload.hpp; philly and helios map jobs to the catalog), the policy, and speeds from
/// one SimulatedThroughput (memoised across the mapping and the run).
struct RunOptions {
  std::string trace;
  std::string cluster;
  std::string scheduler = "fifo";
  TraceFormat trace_format = TraceFormat::jsonl;  // cluster/workload.hpp
  Time restart_cost = Time::from_seconds(30.0);
  SchedulerOptions scheduler_options;
};
ClusterResult run(const RunOptions& options);

}  // namespace stratasim::cluster
