#include "study/study.hpp"

#include <algorithm>
#include <sstream>

#include "hw_models/topology.hpp"
#include "sim/flow_network.hpp"
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
  return !exact && sim::replicas_behave_alike(experiment.cluster);
}

st::Program lower(const st::Experiment& experiment, const st::LowerOptions& options) {
  st::PipelineSpec spec = st::pipeline_spec(experiment, partition_layers(experiment));
  spec.mirror_data_parallel = options.mirror_data_parallel;
  spec.mirror_tensor_parallel = options.mirror_tensor_parallel;
  st::Program program = st::assemble_pipeline(spec);
  try {
    st::validate(program);
  } catch (const st::ProgramError& e) {
    throw InvalidProgram(std::string("the lowered program is invalid: ") + e.what());
  }
  return program;
}

std::vector<std::int32_t> trace_ranks(const std::string& spec, const st::RankLayout& layout,
                                      bool mirrored) {
  const int world = layout.world_size();
  const std::string mode = spec == "auto" ? (world <= kTraceAllUpTo ? "all" : "stages") : spec;
  std::vector<std::int32_t> ranks;
  if (mode == "all") {
    // With mirroring only data-parallel replica 0 runs ops: "all" means its ranks.
    if (mirrored && layout.dp > layout.cp) {
      for (int r = 0; r < world; ++r) {
        if (layout.replica(r) == 0) ranks.push_back(r);
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
    if (mirrored && layout.replica(rank) != 0) {
      throw BadInput("--trace-ranks: rank " + std::to_string(rank) + " mirrors rank " +
                     std::to_string(layout.rank(layout.tp_index(rank), layout.cp_index(rank),
                                                layout.stage(rank))) +
                     " (data-parallel replicas are simulated once); add --exact to trace it");
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

traces::Timeline simulate_program(const st::Program& program, const hw::ClusterSpec& cluster,
                                  const sim::SimOptions& options,
                                  std::vector<traces::LinkLoad>* links) {
  if (cluster.network_model != hw::NetworkModel::flow || links == nullptr) {
    return sim::simulate(program, cluster, options);
  }
  sim::FlowNetwork network(cluster, hw::build_topology(cluster), program);
  sim::LinkUsage usage(network);
  network.set_observer(&usage);
  LastEnd last;
  sim::SimOptions observed = options;
  observed.observers.push_back(&last);
  auto timeline = sim::simulate(program, cluster, network, observed);
  *links = busiest_links(network, usage, last.end);
  return timeline;
}

sim::MemoryOverheads memory_overheads(const st::Experiment& experiment) {
  const st::MemorySettings& m = experiment.memory;
  return sim::MemoryOverheads{m.fragmentation, m.reserved, m.cuda_context, m.nccl_buffers};
}

namespace {

st::LowerOptions lower_options(bool mirrored, const Options& options) {
  return {.mirror_data_parallel = mirrored,
          .mirror_tensor_parallel = mirrored && options.mirror_tensor_parallel};
}

// The shared first half of simulate() and estimate_memory(): the configured experiment, its
// validated Program (unless `program` brings it) and the ranks to trace.
Result prepare(st::Experiment experiment, const Options& options,
               std::optional<st::Program> program = std::nullopt, bool configure = true) {
  Result r;
  r.experiment = configure ? configured(std::move(experiment), options) : std::move(experiment);
  const bool mirrored = mirrors(r.experiment, options.exact);
  r.traced_ranks = trace_ranks(options.trace_ranks, st::layout_of(r.experiment), mirrored);
  r.program =
      program ? std::move(*program) : study::lower(r.experiment, lower_options(mirrored, options));
  r.context = traces::report_context(r.experiment);
  return r;
}

}  // namespace

HostMemoryEstimate estimate_host_memory(const st::Experiment& experiment, const Options& given,
                                        std::optional<st::Program>* program) {
  const Options options = effective_options(experiment, given);
  const bool mirrored = mirrors(experiment, options.exact);
  // One replica's ops: the run's own Program when it mirrors, else a mirrored sample scaled up.
  st::Program sample = study::lower(experiment, lower_options(true, options));
  const bool sample_is_the_run = mirrored || !sample.mirrored();
  std::int64_t issuing = 0;
  if (sample_is_the_run) {
    for (int rank = 0; rank < sample.world_size(); ++rank) issuing += sample.issues_ops(rank);
  } else {
    issuing = sample.world_size();
  }
  const auto traced = trace_ranks(options.trace_ranks, st::layout_of(experiment), mirrored);
  RunShape shape =
      run_shape(sample, issuing, options.record_spans, static_cast<std::int64_t>(traced.size()),
                options.spans_of_traced_ranks_only);
  if (experiment.cluster.network_model == hw::NetworkModel::flow) {
    const hw::Topology topology = hw::build_topology(experiment.cluster);
    shape.flow_network = true;
    shape.devices = topology.device_count();
    shape.vertices = topology.vertex_count();
    shape.routing_tables = !topology.routes_in_closed_form();
  }
  if (program != nullptr && sample_is_the_run) *program = std::move(sample);
  return study::estimate_host_memory(shape);
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
  std::optional<st::Program> program;
  const HostMemoryEstimate estimate = estimate_host_memory(experiment, options, &program);
  const bool given = options.max_memory.has_value();
  const Bytes limit = given ? *options.max_memory : available_host_memory();
  if (limit.count() > 0 && estimate.total() > limit) {
    throw HostMemoryExceeded(
        "the simulation " + describe(estimate) + ", more than " +
        (given ? "--max-memory (" + to_string(limit) + ")"
               : "this machine has available (" + to_string(limit) +
                     "; --max-memory sets another limit)") +
        ". To make it fit: " + advice(estimate.shape, options.exact, options.trace_ranks));
  }
  Result r = prepare(std::move(experiment), options, std::move(program), false);
  r.host_memory = estimate;
  sim::SimOptions sim_options;
  sim_options.record_spans = options.record_spans;
  sim_options.record_memory = options.record_memory;
  sim_options.overheads = memory_overheads(r.experiment);
  sim_options.stop_on_oom = options.stop_on_oom;
  sim_options.memory_sample_ranks = r.traced_ranks;
  std::vector<traces::LinkLoad> links;
  if (!options.spans_of_traced_ranks_only) {
    r.timeline = simulate_program(r.program, r.experiment.cluster, sim_options, &links);
    r.report = traces::make_report(r.program, r.timeline, r.context);
  } else {
    // The report's span figures while the run goes; the timeline keeps the traced ranks' spans.
    traces::SpanStatistics stats(r.program);
    StatisticsObserver observer(stats);
    sim_options.observers.push_back(&observer);
    sim_options.span_ranks = r.traced_ranks;
    r.timeline = simulate_program(r.program, r.experiment.cluster, sim_options, &links);
    r.report = traces::make_report(r.program, r.timeline, stats, r.context);
  }
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
