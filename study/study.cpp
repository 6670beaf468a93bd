#include "study/study.hpp"

#include <algorithm>
#include <sstream>
#include <string>
#include <string_view>

#include "hw_models/topology.hpp"
#include "sim/flow_network.hpp"
#include "strategies/dlrm.hpp"
#include "strategies/iterations.hpp"
#include "strategies/rnn.hpp"
#include "study/errors.hpp"
#include "study/partition.hpp"
#include "traces/export.hpp"
#include "traces/span_statistics.hpp"

namespace stratasim::study {

namespace st = strategies;

st::Experiment configured(st::Experiment experiment, const Options& options) {
  if (options.profile) {
    experiment.cluster.device.profile = options.profile;
    for (auto& o : experiment.cluster.overrides) {
      if (o.device) o.device->profile = options.profile;
    }
  }
  if (options.network) experiment.cluster.network_model = *options.network;
  return experiment;
}

bool mirrors(const st::Experiment& experiment, bool exact) {
  // A DLRM's ranks hold different embedding shards: no two behave alike.
  // Parameter servers exchange messages with every worker: nothing is mirrored.
  return !exact && !experiment.dlrm && !experiment.parallelism.parameter_server &&
         sim::replicas_behave_alike(experiment.cluster);
}

namespace {

// One iteration of the experiment, as its model's lowering emits it.
st::Program lower_one_iteration(const st::Experiment& experiment, const st::LowerOptions& options) {
  if (experiment.dlrm) return st::lower_dlrm(experiment);
  if (experiment.rnn) return st::lower_rnn(experiment, options.mirror_data_parallel);
  st::PipelineSpec spec = st::pipeline_spec(experiment, partition_layers(experiment));
  spec.mirror_data_parallel = options.mirror_data_parallel;
  spec.mirror_tensor_parallel = options.mirror_tensor_parallel;
  spec.mirror_period = options.mirror_period;
  return st::assemble_pipeline(spec);
}

// `options.iterations` of `one` back to back (BadInput naming --iterations when the schedule
// cannot be repeated).
st::Program repeated(st::Program one, int iterations) {
  if (iterations == 1) return one;
  if (one.overlapping_iterations()) {
    throw BadInput("--iterations " + std::to_string(iterations) +
                   ": the schedule overlaps iterations by itself (PipeDream-2BW, ZB-H2) and is "
                   "reported as one steady-state iteration; use --iterations 1");
  }
  if (iterations < 1 || iterations > st::kMaxIterations) {
    throw BadInput("--iterations expects 1 to " + std::to_string(st::kMaxIterations) + ", got " +
                   std::to_string(iterations));
  }
  return st::repeat_iterations(one, iterations);
}

}  // namespace

st::Program lower(const st::Experiment& experiment, const st::LowerOptions& options) {
  st::Program program = repeated(lower_one_iteration(experiment, options), options.iterations);
  try {
    st::validate(program);
  } catch (const st::ProgramError& e) {
    throw InvalidProgram(std::string("the lowered program is invalid: ") + e.what());
  }
  return program;
}

std::vector<std::int32_t> trace_ranks(const std::string& spec, const st::RankLayout& layout,
                                      bool mirrored, int period, int servers) {
  period = std::max(period, 1);
  const int world = layout.world_size() + servers;
  const std::string mode = spec == "auto" ? (world <= kTraceAllUpTo ? "all" : "stages") : spec;
  std::vector<std::int32_t> ranks;
  if (mode == "all") {
    // With mirroring only data-parallel replicas 0 .. period - 1 run ops: "all" means theirs.
    if (mirrored && layout.dp > layout.cp * period) {
      for (int r = 0; r < world; ++r) {
        if (layout.replica(r) < period) ranks.push_back(r);
      }
    }
    return ranks;
  }
  if (mode == "stages") {
    for (int s = 0; s < layout.pp; ++s) ranks.push_back(layout.rank(0, 0, s));
    return ranks;
  }
  std::stringstream list(mode);
  std::string item;
  while (std::getline(list, item, ',')) {
    int rank = -1;
    try {
      std::size_t used = 0;
      rank = std::stoi(item, &used);
      if (used != item.size()) rank = -1;
    } catch (const std::exception&) {
    }
    if (rank < 0 || rank >= world) {
      throw BadInput("--trace-ranks expects all, stages or ranks from 0 to " +
                     std::to_string(world - 1) + " separated by commas, got \"" + item + "\"");
    }
    if (mirrored && rank < layout.world_size() && layout.replica(rank) >= period) {
      // Replica r runs what replica r mod period runs (strategies/lowering/rank_emitter.cpp).
      const int source = layout.cp_index(rank) + layout.cp * (layout.replica(rank) % period);
      throw BadInput(
          "--trace-ranks: rank " + std::to_string(rank) + " mirrors rank " +
          std::to_string(layout.rank(layout.tp_index(rank), source, layout.stage(rank))) +
          (period == 1 ? std::string(" (data-parallel replicas are simulated once)")
                       : " (data-parallel replicas 0-" + std::to_string(period - 1) +
                             " are simulated for all)") +
          "; add --exact to trace it");
    }
    ranks.push_back(rank);
  }
  return ranks;
}

namespace {

// The busiest links of a flow-level run, observed from outside the network as every statistic
// is: up to kBusiestLinksPerTier between NICs and switches, then as many inside nodes.
std::vector<traces::LinkLoad> busiest_links(const sim::FlowNetwork& network,
                                            const sim::LinkUsage& usage, Time span) {
  const auto& topology = network.topology();
  auto network_tier = [&](int vertex) {
    const auto kind = topology.kind(vertex);
    return kind == hw::VertexKind::nic || kind == hw::VertexKind::network_switch;
  };
  std::vector<traces::LinkLoad> between, inside;
  for (const auto& busy : usage.busiest(span, static_cast<std::size_t>(topology.link_count()))) {
    const auto& link = topology.link(busy.link);
    auto& list = network_tier(link.from) && network_tier(link.to) ? between : inside;
    if (list.size() >= kBusiestLinksPerTier) continue;
    list.push_back({topology.name(link.from) + " -> " + topology.name(link.to),
                    Bandwidth(network.capacity(busy.link)), busy.bytes, busy.utilisation});
  }
  between.insert(between.end(), inside.begin(), inside.end());
  return between;
}

}  // namespace

namespace {

// The latest span end of a run, seen from outside (the timeline may keep few spans).
class LastEnd : public sim::Observer {
 public:
  void on_span(const traces::Span& span) override { end = std::max(end, span.end); }
  Time end;
};

// Feeds a report's span figures while the run goes.
class StatisticsObserver : public sim::Observer {
 public:
  explicit StatisticsObserver(traces::SpanStatistics& stats) : stats_(stats) {}
  void on_span(const traces::Span& span) override { stats_.add(span); }

 private:
  traces::SpanStatistics& stats_;
};

}  // namespace

void LossObserver::on_transfer(const st::Op& op, const sim::TransferRequest& request) {
  if (!st::is_gradient_message(op)) return;
  gradient += request.bytes;
  dropped += request.dropped();
}

void add_loss_figures(traces::ReportContext& context, const LossObserver& loss, int iterations) {
  const auto gradient = static_cast<double>(loss.gradient.count()) / iterations;
  const auto dropped = static_cast<double>(loss.dropped.count()) / iterations;
  context.figures.emplace_back("gradient_bytes_per_iteration", gradient);
  context.figures.emplace_back("gradient_bytes_dropped_per_iteration", dropped);
  context.figures.emplace_back("gradient_dropped_fraction", gradient > 0 ? dropped / gradient : 0);
}

traces::Timeline simulate_program(const st::Program& program, const hw::ClusterSpec& cluster,
                                  const sim::SimOptions& options,
                                  std::vector<traces::LinkLoad>* links,
                                  const sim::FlowSymmetry* symmetry, const hw::Topology* topology) {
  if (cluster.network_model != hw::NetworkModel::flow || (links == nullptr && !symmetry)) {
    return sim::simulate(program, cluster, options);
  }
  hw::Topology graph = topology ? *topology : hw::build_topology(cluster);
  sim::FlowNetwork network = symmetry
                                 ? sim::FlowNetwork(cluster, std::move(graph), program, *symmetry)
                                 : sim::FlowNetwork(cluster, std::move(graph), program);
  sim::LinkUsage usage(network);
  network.set_observer(&usage);
  LastEnd last;
  sim::SimOptions observed = options;
  observed.observers.push_back(&last);
  auto timeline = sim::simulate(program, cluster, network, observed);
  if (links != nullptr) *links = busiest_links(network, usage, last.end);
  return timeline;
}

sim::ReplicaMap replica_map(const st::RankLayout& layout, int period) {
  sim::ReplicaMap m;
  const int world = layout.world_size();
  m.replicas = layout.dp / layout.cp / period;
  m.replica.resize(static_cast<std::size_t>(world));
  m.next.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    m.replica[static_cast<std::size_t>(r)] = layout.replica(r) / period;
    m.next[static_cast<std::size_t>(r)] = layout.rank(
        layout.tp_index(r), (layout.dp_index(r) + layout.cp * period) % layout.dp, layout.stage(r));
  }
  return m;
}

FlowReduction flow_reduction(const st::Experiment& experiment, bool exact,
                             const hw::Topology* topology) {
  const hw::ClusterSpec& cluster = experiment.cluster;
  FlowReduction out;
  if (cluster.network_model != hw::NetworkModel::flow ||
      cluster.flow_symmetry == hw::FlowSymmetry::off) {
    return out;
  }
  const bool routes = cluster.flow_symmetry == hw::FlowSymmetry::symmetric_routes;
  if (experiment.parallelism.parameter_server) {
    out.note = "every rank simulated: parameter servers message every worker";
    return out;
  }
  if (exact && !routes) {
    out.note = "every replica simulated (--exact)";
    return out;
  }
  const auto mode = routes ? sim::FlowSymmetry::Mode::routes : sim::FlowSymmetry::Mode::reduce;
  const st::RankLayout layout = st::layout_of(experiment);
  const int replicas = layout.dp / layout.cp;
  std::optional<hw::Topology> built;
  const hw::Topology& graph = topology ? *topology : built.emplace(hw::build_topology(cluster));
  // The smallest period P whose move (replica r onto replica r + P) is a symmetry: replicas
  // 0 .. P - 1 then stand for all.
  std::string why, first_why;
  for (int period = 1; 2 * period <= replicas; ++period) {
    if (replicas % period != 0) continue;
    out.symmetry = sim::flow_symmetry(cluster, graph, replica_map(layout, period), mode, why);
    if (out.symmetry) {
      out.period = period;
      break;
    }
    if (first_why.empty()) first_why = why;
    // What the cluster breaks, no period mends.
    if (why.find("symmetry of the topology") == std::string::npos) break;
  }
  if (replicas < 2) first_why = "there is one data-parallel replica";
  if (!out.symmetry) {
    out.note = "every replica simulated: " + first_why;
  } else if (routes) {
    out.note = "every replica simulated, routed as the symmetry moves replicas (symmetric_routes)";
  } else {
    out.note = (out.period == 1 ? std::string("replica 0")
                                : "replicas 0-" + std::to_string(out.period - 1)) +
               " simulated for all " + std::to_string(replicas) +
               " data-parallel replicas (exact up to rounding)";
  }
  return out;
}

sim::MemoryOverheads memory_overheads(const st::Experiment& experiment) {
  const st::MemorySettings& m = experiment.memory;
  return sim::MemoryOverheads{m.fragmentation, m.reserved, m.cuda_context, m.nccl_buffers};
}

namespace {

// How the run mirrors: where replicas behave alike on the analytical network, every replica
// but 0; on the flow network with flow_symmetry auto, where it reduces them, every replica past
// the symmetry's period. Tensor-parallel mirroring only on the analytical network (the flow
// network's reduction is over data-parallel replicas).
struct MirrorPlan {
  bool mirrored = false;
  int period = 1;
};

// `known`: the experiment's flow reduction when the caller has it (simulate() works it out
// once: it proves the topology's symmetry link by link).
MirrorPlan mirror_plan(const st::Experiment& experiment, const Options& options,
                       const FlowReduction* known = nullptr) {
  if (mirrors(experiment, options.exact)) return {true, 1};
  // DLRM's and RNN's lowerings mirror with period 1 only; parameter servers not at all.
  if (experiment.dlrm || experiment.rnn || experiment.parallelism.parameter_server) return {};
  if (experiment.cluster.network_model != hw::NetworkModel::flow ||
      experiment.cluster.flow_symmetry != hw::FlowSymmetry::automatic || options.exact) {
    return {};
  }
  std::optional<FlowReduction> computed;
  const FlowReduction& reduction =
      known ? *known : computed.emplace(flow_reduction(experiment, options.exact));
  return reduction.reduces() ? MirrorPlan{true, reduction.period} : MirrorPlan{};
}

st::LowerOptions lower_options(const st::Experiment& experiment, MirrorPlan plan,
                               const Options& options) {
  const bool analytical = mirrors(experiment, options.exact);
  return {.mirror_data_parallel = plan.mirrored,
          .mirror_tensor_parallel = plan.mirrored && analytical && options.mirror_tensor_parallel,
          .mirror_period = plan.period,
          .iterations = options.iterations};
}

// The shared first half of simulate() and estimate_memory(): the configured experiment, its
// validated Program (unless `program` brings it) and the ranks to trace.
Result prepare(st::Experiment experiment, const Options& options,
               std::optional<st::Program> program = std::nullopt, bool configure = true,
               const FlowReduction* reduction = nullptr) {
  Result r;
  r.experiment = configure ? configured(std::move(experiment), options) : std::move(experiment);
  const MirrorPlan plan = mirror_plan(r.experiment, options, reduction);
  r.traced_ranks = trace_ranks(options.trace_ranks, st::layout_of(r.experiment), plan.mirrored,
                               plan.period, r.experiment.parallelism.servers);
  r.program = program ? std::move(*program)
                      : study::lower(r.experiment, lower_options(r.experiment, plan, options));
  r.context = traces::report_context(r.experiment);
  return r;
}

}  // namespace

namespace {

// estimate_host_memory(), with the flow reduction and topology when simulate() has them.
HostMemoryEstimate estimate(const st::Experiment& experiment, const Options& given,
                            std::optional<st::Program>* program, const FlowReduction* reduction,
                            const hw::Topology* topology) {
  const Options options = effective_options(experiment, given);
  MirrorPlan plan = mirror_plan(experiment, options, reduction);
  const bool mirrored = plan.mirrored;
  plan.mirrored = true;
  // One replica's ops: the run's own Program when it mirrors, else a mirrored sample scaled up.
  st::Program sample = study::lower(experiment, lower_options(experiment, plan, options));
  const bool sample_is_the_run = mirrored || !sample.mirrored();
  std::int64_t issuing = 0;
  if (sample_is_the_run) {
    for (int rank = 0; rank < sample.world_size(); ++rank) issuing += sample.issues_ops(rank);
  } else {
    issuing = sample.world_size();
  }
  const auto traced = trace_ranks(options.trace_ranks, st::layout_of(experiment), mirrored,
                                  plan.period, experiment.parallelism.servers);
  RunShape shape =
      run_shape(sample, issuing, options.record_spans, static_cast<std::int64_t>(traced.size()),
                options.spans_of_traced_ranks_only);
  if (experiment.cluster.network_model == hw::NetworkModel::flow) {
    std::optional<hw::Topology> built;
    const hw::Topology& graph =
        topology ? *topology : built.emplace(hw::build_topology(experiment.cluster));
    shape.flow_network = true;
    shape.devices = graph.device_count();
    shape.vertices = graph.vertex_count();
    shape.routing_tables = !graph.routes_in_closed_form();
  }
  if (program != nullptr && sample_is_the_run) *program = std::move(sample);
  return study::estimate_host_memory(shape);
}

}  // namespace

HostMemoryEstimate estimate_host_memory(const st::Experiment& experiment, const Options& given,
                                        std::optional<st::Program>* program) {
  return estimate(experiment, given, program, nullptr, nullptr);
}

Options effective_options(const st::Experiment& experiment, const Options& given) {
  Options options = given;
  const bool mirrored = mirrors(experiment, options.exact);
  if (!mirrored || !options.mirror_tensor_parallel) return options;
  const st::RankLayout layout = st::layout_of(experiment);
  const auto traced = trace_ranks(options.trace_ranks, layout, mirrored);
  const bool representatives_only =
      !traced.empty() && std::all_of(traced.begin(), traced.end(),
                                     [&](std::int32_t r) { return layout.tp_index(r) == 0; });
  if (!representatives_only) options.mirror_tensor_parallel = false;
  return options;
}

Result simulate(st::Experiment experiment, const Options& requested) {
  experiment = configured(std::move(experiment), requested);
  const Options options = effective_options(experiment, requested);
  // The topology and its symmetry, worked out once for the estimate, the lowering and the run.
  std::optional<hw::Topology> topology;
  if (experiment.cluster.network_model == hw::NetworkModel::flow) {
    topology.emplace(hw::build_topology(experiment.cluster));
  }
  const hw::Topology* graph = topology ? &*topology : nullptr;
  FlowReduction reduction = flow_reduction(experiment, options.exact, graph);
  std::optional<st::Program> program;
  const HostMemoryEstimate footprint = estimate(experiment, options, &program, &reduction, graph);
  // HostMemoryExceeded when `needed` is more than the run may use; `why` leads the message.
  auto require_fits = [&](const HostMemoryEstimate& needed, const std::string& why,
                          const std::string& more_advice) {
    const bool given = options.max_memory.has_value();
    const Bytes limit = given ? *options.max_memory : available_host_memory();
    if (limit.count() <= 0 || needed.total() <= limit) return;
    throw HostMemoryExceeded(
        why + "the simulation " + describe(needed) + ", more than " +
        (given ? "--max-memory (" + to_string(limit) + ")"
               : "this machine has available (" + to_string(limit) +
                     "; --max-memory sets another limit)") +
        ". To make it fit: " + advice(needed.shape, options.exact, options.trace_ranks) +
        more_advice);
  };
  require_fits(footprint, "", "");
  Result r = prepare(std::move(experiment), options, std::move(program), false, &reduction);
  r.host_memory = footprint;
  sim::SimOptions sim_options;
  sim_options.record_spans = options.record_spans;
  sim_options.record_memory = options.record_memory;
  sim_options.overheads = memory_overheads(r.experiment);
  sim_options.stop_on_oom = options.stop_on_oom;
  sim_options.memory_sample_ranks = r.traced_ranks;
  sim_options.transport = r.experiment.transport;
  std::vector<traces::LinkLoad> links;
  LossObserver loss;
  if (reduction.symmetry && reduction.reduces() != r.program.mirrored()) {
    reduction.symmetry.reset();  // the Program decides: mirrored or not
    reduction.note = "every replica simulated: the Program is not mirrored";
  }
  // Runs r.program; where only the traced ranks' spans are kept, the report's span figures are
  // gathered while the run goes (made again for a program lowered again below).
  std::optional<traces::SpanStatistics> stats;
  auto run = [&](const sim::FlowSymmetry* symmetry) {
    sim::SimOptions o = sim_options;
    loss = LossObserver{};
    if (r.experiment.transport.loss_bound > 0) o.observers.push_back(&loss);
    std::optional<StatisticsObserver> observer;
    if (options.spans_of_traced_ranks_only) {
      stats.emplace(r.program);
      observer.emplace(*stats);
      o.observers.push_back(&*observer);
      o.span_ranks = r.traced_ranks;
    }
    links.clear();
    r.timeline = simulate_program(r.program, r.experiment.cluster, o, &links, symmetry, graph);
  };
  try {
    run(reduction.symmetry ? &*reduction.symmetry : nullptr);
  } catch (const sim::SymmetryBroken& e) {
    // The traffic breaks the symmetry: every replica, routed as without it.
    reduction.note = std::string("every replica simulated: ") + e.what();
    if (r.program.mirrored()) {
      // The run without the reduction needs memory for every replica: estimated again (it was
      // estimated reduced), and refused as at the start when it does not fit.
      const FlowReduction none;
      const HostMemoryEstimate full = estimate(r.experiment, options, nullptr, &none, graph);
      const bool tree =
          std::string_view(e.what()).find("do not map onto each other") != std::string_view::npos;
      require_fits(full,
                   std::string("the flow network's replica symmetry broke during the run (") +
                       e.what() + "), so every replica must be simulated: ",
                   tree ? "; or keep the symmetry with NCCL's ring all-reduce (--set "
                          "cluster.collectives.algorithm.all_reduce=ring): a tree all-reduce "
                          "over the replicas breaks it"
                        : "");
      r.host_memory = full;
      r.program = study::lower(r.experiment, lower_options(r.experiment, MirrorPlan{}, options));
      r.traced_ranks = trace_ranks(options.trace_ranks, st::layout_of(r.experiment), false, 1,
                                   r.experiment.parallelism.servers);
      sim_options.memory_sample_ranks = r.traced_ranks;
    }
    run(nullptr);
  }
  if (!reduction.note.empty()) r.context.setup.emplace_back("flow symmetry", reduction.note);
  if (r.experiment.transport.loss_bound > 0) add_loss_figures(r.context, loss, options.iterations);
  r.report = stats ? traces::make_report(r.program, r.timeline, *stats, r.context)
                   : traces::make_report(r.program, r.timeline, r.context);
  r.report.links = std::move(links);
  return r;
}

Result estimate_memory(st::Experiment experiment, const Options& given) {
  experiment = configured(std::move(experiment), given);
  const Options options = effective_options(experiment, given);
  Result r = prepare(std::move(experiment), options, std::nullopt, false);
  r.timeline =
      sim::estimate_memory(r.program, r.experiment.cluster, memory_overheads(r.experiment));
  r.report = traces::make_report(r.program, r.timeline, r.context);
  return r;
}

void write_outputs(const std::filesystem::path& dir, const Result& result,
                   const std::string& cluster) {
  traces::ExportOptions options;
  options.ranks = result.traced_ranks;
  options.cluster = cluster;
  traces::write_outputs(dir, result.program, result.timeline, result.report, result.context,
                        options);
}

}  // namespace stratasim::study
