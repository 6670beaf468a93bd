// The report of one iteration: time, throughput, FLOP rates, bubble, exposed communication and
// memory per rank. Computed from a Program and its Timeline alone, so predicted and measured
// runs are reported the same way. report.json keys are fixed (see to_json).
#pragma once

#include <array>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::traces {

/// What a report needs to know beyond the Program and the Timeline.
struct ReportContext {
  std::string experiment;                  // name
  std::int64_t samples_per_iteration = 0;  // global batch
  std::int64_t tokens_per_iteration = 0;   // global batch * sequence length
  /// Dense peak of one device for the training dtype; on a cluster of mixed devices, the mean
  /// over the ranks (so MFU divides by the sum of the devices' peaks).
  FlopRate device_peak;
  Bytes device_capacity;  // device memory of one device (the cluster's base device)
  /// The training framework's kernel efficiency the simulation ran with
  /// (hw::DeviceEfficiency::framework_compute, framework_memory_traffic,
  /// framework_attention): a replay of the timeline on a cluster applies them again, so that it
  /// costs kernels as the simulation did.
  double framework_compute = 1.0;
  double framework_memory_traffic = 1.0;
  double framework_attention = 1.0;
  std::vector<int> stage_of_rank;  // pipeline stage of each rank
  /// training.iterations_to_accuracy: the iterations the run needs to reach its target accuracy
  /// (the user's figure); > 0 makes the report give the time to train. 0: not given.
  std::int64_t iterations_to_accuracy = 0;
  /// Lines describing the setup for the summary, e.g. {"model", "gpt3-175b, 174.6 B params"}.
  std::vector<std::pair<std::string, std::string>> setup;
  /// Model-specific figures of the run, known before it (name, value), for report.json's
  /// "figures" object and the sweep's columns: a DLRM's embedding cache
  /// (strategies::embedding_cache_figures: embedding_cache_hit_rate, pcie_host_to_device_bytes,
  /// pcie_device_to_host_bytes per iteration over all GPUs). Empty for other models.
  std::vector<std::pair<std::string, double>> figures;
};

struct RankReport {
  int rank = 0;
  int stage = 0;
  Bytes peak_memory;          // device tier
  Bytes capacity;             // device tier capacity of this rank's device (0: not modelled)
  MemoryBreakdown breakdown;  // at the peak
  bool fits = true;
  double peak_time_s = 0;     // when the device peak was first reached
  std::string peak_at;        // the op that reached it (label, microbatch, layers)
  Bytes host_peak;            // host-tier peak (offloaded state), 0 when none
  Bytes nvme_peak;            // NVMe-tier peak, 0 when none
  double compute_busy_s = 0;  // compute-stream time in forward/backward within the pipeline
  double exposed_comm_s = 0;  // communication with no compute running
  double exposed_copy_s = 0;  // copy-stream transfers with no compute running
};

/// Communication of one kind on one stream ("dp all_reduce", "pp send"), for the rank that
/// moves the most bytes over the wire. `bytes` sums the collectives' sizes as nccl-tests counts
/// them (the whole buffer); `wire_bytes` what the rank sends: bytes times nccl-tests' bus
/// bandwidth factor (2(n-1)/n for an all-reduce, (n-1)/n for an all-gather, ...), the sent
/// bytes for a point-to-point send. algbw = bytes / time, busbw = wire_bytes / time, time being
/// the rank's time in these ops with data moving.
struct CommTraffic {
  std::string stream;  // tp, dp, pp
  std::string kind;    // all_reduce, ..., send
  int rank = 0;
  std::int64_t calls = 0;
  Bytes bytes;
  Bytes wire_bytes;
  double time_s = 0;
  double algbw = 0;  // bytes/s
  double busbw = 0;  // bytes/s
};

/// One network link's load over the iteration (flow-level network only; filled by the caller
/// from the network's link usage): utilisation = bytes / (capacity * iteration time).
struct LinkLoad {
  std::string link;  // "gpu3 -> nic3"
  Bandwidth capacity;
  Bytes bytes;
  double utilisation = 0;
};

/// Several iterations back to back (strategies::Program::iterations() = N > 1; `--iterations`):
/// iteration_time_s is the mean, total_time_s / N; the FLOPs per iteration, the times per
/// iteration (pipeline, optimizer, exposed communication and copies, interference) and the
/// communication tallies (calls, bytes, time) are the run's divided by N, so that rates (tokens
/// and samples per second, MFU, HFU, bandwidths) are per mean iteration; memory peaks are over
/// the whole run. With N = 1 none of this applies and report.json has no new keys.
struct Report {
  bool completed = true;
  std::string problem;
  double iteration_time_s = 0;
  int iterations = 1;
  /// N > 1: first span start to last span end of the run; iteration_end_s[i]: the latest end of
  /// iteration i's spans, from the run's first span start (a partial run: iterations without
  /// spans are left out).
  double total_time_s = 0;
  std::vector<double> iteration_end_s;
  double pipeline_time_s = 0;   // first forward start to last backward end
  double optimizer_time_s = 0;  // longest optimizer-phase time of a rank (device or host)
  double tokens_per_s = 0;
  double samples_per_s = 0;
  /// context.iterations_to_accuracy x iteration_time_s when the context gives iterations
  /// to accuracy, else 0.
  double time_to_train_s = 0;
  double model_flops_per_iteration = 0;     // forward/backward matmul FLOPs, no recomputation
  double hardware_flops_per_iteration = 0;  // all matmul FLOPs executed, recomputation included
  double model_tflops_per_device = 0;
  double mfu = 0;
  double hfu = 0;
  /// 1 - mean over ranks of compute_busy_s / pipeline_time_s: the share of the pipeline time
  /// the compute stream waits (on other stages, on communication).
  double compute_idle_fraction = 0;
  /// compute_idle_fraction when the ranks form a pipeline (pipelined(context)), else 0.
  double bubble_fraction = 0;
  double exposed_comm_s = 0;  // mean over ranks
  /// Copy-stream time (offload, an embedding cache's misses) with no compute running, mean over
  /// ranks: what the copies add to the iteration where they do not overlap compute.
  double exposed_copy_s = 0;
  /// Time lost to compute-communication interference (hw_models/interference.hpp) per stream
  /// (strategies::Stream order): the ops' extra time over what they take alone, summed per
  /// rank, mean over ranks. All zero when the timeline records none.
  std::array<double, strategies::kStreamCount> interference_s{};
  Bytes peak_memory;  // max over ranks, device tier
  bool fits = true;
  std::vector<RankReport> ranks;
  std::vector<OutOfMemory> out_of_memory;
  /// For each out_of_memory entry, the op that first exceeded the capacity, described with its
  /// label, microbatch and layers ("rank 0 op 12 (compute on compute, 'L3 attention', ...)").
  std::vector<std::string> out_of_memory_at;
  /// ... and its position in that rank's program (as `at` says "rank r op k": k).
  std::vector<std::uint32_t> out_of_memory_op_index;
  bool stopped_on_oom = false;  // the run was ended at the first out-of-memory on purpose
  /// Per (stream, collective kind or send), stream order then kind order.
  std::vector<CommTraffic> communication;
  /// The busiest links (empty with the analytical network), most utilised first within each
  /// group the caller makes (the CLI: up to 5 between switches and NICs, then up to 5 others).
  std::vector<LinkLoad> links;
};

/// The report of `timeline`, its span figures gathered from timeline.spans.
Report make_report(const strategies::Program& program, const Timeline& timeline,
                   const ReportContext& context);

class SpanStatistics;
/// The same with the span figures gathered while the run went (traces/span_statistics.hpp):
/// timeline.spans is not read (it may hold the traced ranks' spans only); the rest of the
/// timeline (memory, out-of-memory, interference, completion) is.
Report make_report(const strategies::Program& program, const Timeline& timeline,
                   const SpanStatistics& stats, const ReportContext& context);

/// Whether the ranks form a pipeline: more than one stage in context.stage_of_rank; when the
/// context gives no stages (stage_of_rank empty) it is not known, and taken as a pipeline.
bool pipelined(const ReportContext& context);

/// report.json: iteration_time_s, pipeline_time_s, optimizer_time_s, tokens_per_s,
/// samples_per_s, model_flops_per_iteration, hardware_flops_per_iteration,
/// model_tflops_per_device, mfu, hfu, bubble_fraction, compute_idle_fraction, exposed_comm_s,
/// exposed_copy_s, figures {name: value} (ReportContext::figures; {} for most models),
/// interference_s {stream: seconds, for every stream}, peak_memory_bytes,
/// fits, ranks [{rank, stage, peak_memory_bytes, memory_breakdown {parameters, gradients,
/// optimizer_states, activations, workspace, comm_buffers}, fits}], plus experiment,
/// completed, problem and out_of_memory; iterations_to_accuracy and time_to_train_s only when
/// the context gives iterations to accuracy (so reports without it keep their keys); iterations,
/// total_time_s and iteration_end_s only when the report covers several iterations.
nlohmann::json to_json(const Report& report, const ReportContext& context);

/// The memory-only summary printed by `stratasim memory`: setup, the per-stage memory table
/// and the verdict.
void print_memory_summary(std::ostream& out, const Report& report, const ReportContext& context);

/// The readable summary printed by `stratasim simulate`.
void print_summary(std::ostream& out, const Report& report, const ReportContext& context);

}  // namespace stratasim::traces
