// One way through: Experiment -> Program -> simulation -> Timeline -> Report. Every entry point
// (the CLI's simulate, memory, schedules, partition, run, validate and replay; the sweep and the
// search; the benches; the Python module) composes its work from these functions, so that a
// prediction means the same thing wherever it is asked for.
//
// - lower(): the experiment's layers split as its partition says (even, explicit, or BaPipe's
//   balanced split costed by study/partition.hpp), strategies::assemble_pipeline, then
//   strategies::validate — a Program that fails validation is a lowering bug (InvalidProgram).
// - Mirroring: where replicas behave alike (sim::replicas_behave_alike: the analytical network on
//   identical devices) data-parallel replicas are lowered once and mirrored, unless `exact`;
//   so are 1D tensor-parallel ranks (Options::mirror_tensor_parallel) unless a traced rank is
//   one of the mirrors. Results are the same, and the trace covers the ranks that issue ops. On
//   the flow-level network with cluster.flow_symmetry "auto", simulate() mirrors data-parallel
//   replicas too where the symmetry provably holds (flow_reduction), every replica's flows
//   entering max-min sharing as copies of replica 0's; otherwise (or when the traffic breaks
//   it) every replica runs, and the report's setup says which and why.
// - simulate(): the program on the cluster's network model (analytical, or flow-level with the
//   busiest links of the run observed from outside the network), then the report
//   (traces/report.hpp) in the experiment's context.
// - estimate_memory(): the same program's memory without timing (sim::estimate_memory).
// - estimate_host_memory(): the host memory a simulate() run needs (study/footprint.hpp),
//   checked by simulate() against Options::max_memory before the run lowers every rank.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/device.hpp"
#include "sim/flow_network.hpp"
#include "sim/memory.hpp"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "strategies/program.hpp"
#include "study/footprint.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"
#include "traces/timeline.hpp"

namespace stratasim::study {

/// How a study runs. Defaults are `stratasim simulate`'s.
struct Options {
  /// Simulate every replica instead of one mirrored for all (same results, slower).
  bool exact = false;
  /// Where mirroring applies, also mirror 1D tensor-parallel ranks (exact, as the sweep does),
  /// unless a traced rank (trace_ranks) is a tensor-parallel rank other than 0: a trace shows
  /// every rank it names as simulated, so those runs mirror data-parallel replicas only.
  bool mirror_tensor_parallel = true;
  /// Ranks whose memory samples and trace are kept: "auto" (all up to kTraceAllUpTo ranks, else
  /// "stages"), "all", "stages" (tensor- and data-parallel rank 0 of every pipeline stage) or a
  /// comma-separated list. Peaks and verdicts cover every rank whatever this says.
  std::string trace_ranks = "auto";
  /// Keep every span and memory sample (exports need them; a sweep does not).
  bool record_spans = true;
  /// Keep the spans of the traced ranks only (trace_ranks; `stratasim simulate`): the report is
  /// computed while the run goes (traces/span_statistics.hpp) and Result::timeline.spans holds
  /// the traced ranks' spans, in op order. False: every span, indexed by op id.
  bool spans_of_traced_ranks_only = false;
  bool record_memory = true;
  /// End the run at the first time a rank exceeds a memory capacity.
  bool stop_on_oom = false;
  /// A device profile (stratasim calibrate) used instead of the device's own, on every device.
  std::shared_ptr<const hw::DeviceProfile> profile;
  /// A network model instead of the cluster's.
  std::optional<hw::NetworkModel> network;
  /// simulate() refuses (HostMemoryExceeded) a run whose estimated host memory
  /// (study/footprint.hpp) exceeds this; unset: the machine's available memory
  /// (available_host_memory()); Bytes(0): no check.
  std::optional<Bytes> max_memory;
  /// Training iterations simulated back to back (`--iterations`; strategies/iterations.hpp):
  /// each forward waits for its layers' updated parameters of the previous iteration. The
  /// report then gives the mean iteration (traces::Report::iterations). 1: one iteration, the
  /// Program and report as without the option.
  int iterations = 1;
};

constexpr int kTraceAllUpTo = 256;

/// A study's result: what was simulated and what came out.
struct Result {
  strategies::Experiment experiment;  // as simulated (profile and network of Options applied)
  strategies::Program program;
  traces::Timeline timeline;
  traces::ReportContext context;
  traces::Report report;
  /// The ranks the timeline's memory samples (and an export's trace) cover; empty: all.
  std::vector<std::int32_t> traced_ranks;
  /// simulate(): the host memory the run was estimated to need before it ran.
  HostMemoryEstimate host_memory;
  /// The simulation ran to the end (or stopped on purpose at an out-of-memory).
  bool finished() const { return timeline.completed || timeline.stopped_on_oom; }
};

/// The experiment with `options.profile` and `options.network` applied.
strategies::Experiment configured(strategies::Experiment experiment, const Options& options);

/// Whether data-parallel replicas are lowered once and mirrored (see the top of this file).
bool mirrors(const strategies::Experiment& experiment, bool exact);

/// `options` as simulate() runs them: mirror_tensor_parallel off when a traced rank would be a
/// tensor-parallel mirror (a rank whose tensor-parallel index is not 0, or every rank traced).
Options effective_options(const strategies::Experiment& configured_experiment,
                          const Options& options);

/// The experiment's Program, partitioned as its partition says and validated (InvalidProgram).
strategies::Program lower(const strategies::Experiment& experiment,
                          const strategies::LowerOptions& options = {});

/// The ranks `spec` (Options::trace_ranks) names; BadInput naming --trace-ranks when it is
/// malformed or names a mirrored rank. `mirrored`: data-parallel replicas 0 .. period - 1 issue
/// ops and the others mirror them (PipelineSpec::mirror_period; 1 on the analytical network,
/// the symmetry's period on the flow network), so "all" means those replicas' ranks.
/// `servers`: parameter servers, ranks after the layout's (strategies::ParallelismSpec::servers),
/// which a list may name too.
std::vector<std::int32_t> trace_ranks(const std::string& spec, const strategies::RankLayout& layout,
                                      bool mirrored, int period = 1, int servers = 0);

/// Up to `per_tier` busiest links between NICs and switches, then up to `per_tier` inside
/// nodes, from a flow-level run: so that inter-node links show beside the usually busier
/// NVLinks.
constexpr std::size_t kBusiestLinksPerTier = 5;

/// How simulate() uses the flow network's replica symmetry (cluster.flow_symmetry): the
/// symmetry (absent: none) and the report's setup line ("" when flow_symmetry is off or the
/// network analytical).
struct FlowReduction {
  std::optional<sim::FlowSymmetry> symmetry;
  /// Replicas 0 .. period - 1 stand for all (replica r mirrors r mod period): the smallest
  /// period whose move, replica r onto replica r + period, is a symmetry of the topology.
  int period = 1;
  std::string note;
  bool reduces() const { return symmetry && symmetry->mode == sim::FlowSymmetry::Mode::reduce; }
};
/// `topology`: the cluster's, when the caller has built it (else it is built here).
FlowReduction flow_reduction(const strategies::Experiment& experiment, bool exact,
                             const hw::Topology* topology = nullptr);

/// The replica map of a rank layout for a mirror period P: the symmetry's replica j holds the
/// data-parallel replicas jP .. jP + P - 1, and its move takes every rank's data-parallel
/// replica up by P (cp ranks apart).
sim::ReplicaMap replica_map(const strategies::RankLayout& layout, int period = 1);

/// Simulates `program` on the cluster's network model; on the flow-level network `links`
/// (when given) receives the busiest links of the run, and `symmetry` (when given) is the flow
/// network's (sim::SymmetryBroken when the program's traffic breaks it). `topology`: the
/// cluster's, when the caller has built it (the network takes a copy; else it is built here).
traces::Timeline simulate_program(const strategies::Program& program,
                                  const hw::ClusterSpec& cluster, const sim::SimOptions& options,
                                  std::vector<traces::LinkLoad>* links = nullptr,
                                  const sim::FlowSymmetry* symmetry = nullptr,
                                  const hw::Topology* topology = nullptr);

/// Counts gradient messages (strategies::is_gradient_message) and what bounded loss dropped of
/// them, as the transfers start: the figures of report.json that a `transport` section with a
/// loss_bound adds (add_loss_figures).
class LossObserver : public sim::Observer {
 public:
  void on_transfer(const strategies::Op& op, const sim::TransferRequest& request) override;
  Bytes gradient;  // the gradient messages' bytes as the program gives them
  Bytes dropped;   // what bounded loss dropped of them
};

/// report.json's figures of bounded loss (docs/priorities.md): gradient_bytes_per_iteration,
/// gradient_bytes_dropped_per_iteration and gradient_dropped_fraction, over the gradient
/// messages `loss` saw, per iteration (its totals divided by the `iterations` simulated back to
/// back).
void add_loss_figures(traces::ReportContext& context, const LossObserver& loss, int iterations);

/// The allocator and framework overheads of the experiment (memory.fragmentation; memory.reserved,
/// else the CUDA context and NCCL buffers held back: strategies/framework.hpp).
sim::MemoryOverheads memory_overheads(const strategies::Experiment& experiment);

/// The host memory simulate(experiment, options) would need (study/footprint.hpp), estimated
/// from one replica's ops; also returns the Program when lowering it was the cheap way (the run
/// mirrors, or nothing is mirrored), so that simulate() does not lower it twice.
HostMemoryEstimate estimate_host_memory(const strategies::Experiment& configured_experiment,
                                        const Options& options,
                                        std::optional<strategies::Program>* program = nullptr);

/// Lowers, simulates and reports one iteration of `experiment`. First estimates its host memory
/// and throws HostMemoryExceeded (naming --max-memory, the estimate and what would make it fit)
/// when the estimate exceeds options.max_memory.
Result simulate(strategies::Experiment experiment, const Options& options = {});

/// Lowers and estimates memory (no timing): report.ranks and the verdicts are filled, times
/// are not.
Result estimate_memory(strategies::Experiment experiment, const Options& options = {});

/// Writes report.json, timeline.json and memory.csv of `result` into `dir` (traces/export.hpp),
/// covering result.traced_ranks. `cluster` is recorded for replays (empty: the context's).
void write_outputs(const std::filesystem::path& dir, const Result& result,
                   const std::string& cluster = {});

}  // namespace stratasim::study
