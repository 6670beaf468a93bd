// Several jobs on one cluster: each experiment's Program is placed on some of the cluster's
// devices, the Programs are merged into one (ranks renumbered to devices, groups and peers
// remapped) and simulated together, so that with the flow-level network their transfers share
// links; the merged Timeline is then split back into one Timeline per job, each reported on
// its own. Each job's `transport` section classes its own transfers (docs/priorities.md,
// "Several jobs").
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hw_models/cluster.hpp"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/program.hpp"
#include "strategies/transport.hpp"
#include "study/study.hpp"
#include "traces/timeline.hpp"

namespace stratasim::study {

/// Where a job runs: its rank r is cluster device devices[r].
struct Placement {
  std::vector<std::int32_t> devices;
};

/// Places jobs of `sizes` ranks on `cluster` by `spec`:
/// - "packed": job 0 on devices 0..n0-1, job 1 on the next n1, ... (whole racks per job);
/// - "interleaved": nodes dealt round-robin to the jobs that still need devices (job 0 takes
///   node 0, job 1 node 1, ...), so jobs share racks and uplinks;
/// - explicit ranges per job separated by ';', e.g. "0-63;64-127" or "0-7,16-23;8-15,24-31".
/// Throws std::invalid_argument when the jobs do not fit, overlap, or the spec is malformed.
std::vector<Placement> place_jobs(std::span<const int> sizes, std::string_view spec,
                                  const hw::ClusterSpec& cluster);

/// One Program over `world` devices holding every job's ops on its placed devices. Group names
/// are prefixed with the job's name ("job1: dp 0"). Programs must not be mirrored.
strategies::Program merge_programs(std::span<const strategies::Program* const> programs,
                                   std::span<const Placement> placements,
                                   std::span<const std::string> names, int world);

/// The part of a merged run that belongs to one job, in the job's own rank and op numbering.
traces::Timeline split_timeline(const traces::Timeline& merged,
                                const strategies::Program& merged_program,
                                const strategies::Program& job, const Placement& placement);

/// The jobs' `transport` sections as the simulator takes them (sim::SimOptions::transports):
/// job j's transfers take transports[j], classed by its own rules and its own layer count, and
/// lose what its own loss_bound allows (devices no job uses have no ops: they take job 0's).
/// Classes are levels of the one fabric (class c of every job is one level), so its links have
/// one scheduling: the jobs that set classes must agree on transport.scheduling and
/// transport.weights, and "fifo" (levels by start order) does not mix with "layer" or "rules".
/// A job without a section takes class 0 for all its transfers and loses nothing. BadInput
/// naming the job (number and name), the key and the job it disagrees with otherwise.
void set_job_transports(sim::SimOptions& options,
                        std::span<const strategies::TransportPolicy> transports,
                        std::span<const Placement> placements, std::span<const std::string> names,
                        int world);

/// Jobs simulated together on one cluster, each reported on its own.
struct JobsResult {
  std::vector<std::string> names;  // the experiments' names, "#2", "#3" added to repeats
  std::vector<Placement> placements;
  /// Per job: its experiment, Program, its part of the merged Timeline, context and report
  /// (every job's report lists the busiest links of the shared run).
  std::vector<Result> jobs;
  traces::Timeline merged;  // the run of all jobs
};

/// Places `jobs` on `cluster` by `placement` (place_jobs), checks that each job's devices are
/// the kind it asks for, that all jobs set the same memory overheads and that their transport
/// sections can share the fabric (set_job_transports), lowers every job (no mirroring),
/// merges, simulates and splits. A job with a loss_bound gets its report's loss figures
/// (add_loss_figures) from its own gradient messages. BadInput for a placement, device or
/// transport mismatch.
JobsResult simulate_jobs(const hw::ClusterSpec& cluster, std::vector<strategies::Experiment> jobs,
                         std::string_view placement, bool stop_on_oom = false);

}  // namespace stratasim::study
