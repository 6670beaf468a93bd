#include "study/replay.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "hw_models/config_reader.hpp"
#include "sim/simulator.hpp"
#include "strategies/retarget.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"
#include "study/study.hpp"
#include "traces/import.hpp"
#include "traces/kineto.hpp"
#include "traces/timeline_import.hpp"

namespace stratasim::study {

namespace {

namespace fs = std::filesystem;
namespace st = strategies;

// The cluster file with the --set cluster.* overrides applied.
hw::ClusterSpec load_cluster(const fs::path& file, const std::vector<std::string>& sets) {
  auto doc = config::Document::load(file);
  if (const auto* device = doc.find("device"); device != nullptr && device->is_string()) {
    doc.inline_reference("device");
  }
  for (const auto& s : sets) {
    const auto eq = s.find('=');
    static constexpr std::string_view kPrefix = "cluster.";
    if (eq == std::string::npos || s.compare(0, kPrefix.size(), kPrefix) != 0 ||
        eq <= kPrefix.size()) {
      throw BadInput("--set expects cluster.key=value (replay changes only the cluster), got \"" +
                     s + "\"");
    }
    doc.set(s.substr(kPrefix.size(), eq - kPrefix.size()),
            config::parse_override_value(s.substr(eq + 1)), "command line (--set " + s + ")");
  }
  return hw::read_cluster(doc, "");
}

// X times the device's compute: peak rates and memory bandwidth up, launch overhead down.
void speed_up(hw::DeviceSpec& device, double x) {
  for (auto& peak : device.peak_flops) {
    if (peak) *peak = *peak * x;
  }
  device.memory_bandwidth = device.memory_bandwidth * x;
  device.kernel_launch_overhead =
      Time::ps(std::llround(static_cast<double>(device.kernel_launch_overhead.picoseconds()) / x));
  device.profile = nullptr;
}

// A copy of `program` with every Measured kernel taking 1/x of its time (same op ids), except
// those of ops on the host stream (host time between GPU work) and on communication streams
// (communication replayed as measured): they are not compute.
st::Program with_measured_scaled(const st::Program& program, double x) {
  st::Program out(program.world_size());
  for (const auto& label : program.labels()) out.intern_label(label);
  std::vector<char> fixed(program.kernel_lists().size(), 0);
  for (int r = 0; r < program.world_size(); ++r) {
    for (const auto& op : program.ops_of(r)) {
      const auto* c = std::get_if<st::Compute>(&op.work);
      if (c && op.stream != st::Stream::compute && op.stream != st::Stream::copy) {
        fixed[c->kernels] = 1;
      }
    }
  }
  for (std::size_t l = 0; l < program.kernel_lists().size(); ++l) {
    auto list = program.kernel_lists()[l];
    for (auto& k : list) {
      if (fixed[l]) break;
      if (auto* m = std::get_if<st::Measured>(&k.work)) {
        m->duration = Time::ps(std::llround(static_cast<double>(m->duration.picoseconds()) / x));
      }
    }
    out.add_kernels(std::move(list));
  }
  for (const auto& g : program.groups()) out.add_group(g.ranks, g.name);
  out.reserve(program.op_count(), 0, 0);
  std::vector<st::OpId> deps;
  for (int r = 0; r < program.world_size(); ++r) {
    out.begin_rank(r);
    for (const auto& m : program.initial_memory(r)) out.add_initial_memory(r, m);
    for (const auto& op : program.ops_of(r)) {
      st::OpInfo info = st::info_of(op);
      const auto d = program.deps_of(op);
      deps.assign(d.begin(), d.end());
      out.add(op.work, info, deps, program.effects_of(op));
    }
  }
  out.finish();
  out.set_overlapping_iterations(program.overlapping_iterations());
  for (int r = 0; r < program.world_size(); ++r) {
    if (!program.issues_ops(r)) out.set_replica(r, program.replica_of(r));
    if (program.event_driven(r)) out.set_event_driven(r);
  }
  return out;
}

// The dtype the program computes in: its first GEMM's, attention's or roofline work's.
DType compute_dtype(const st::Program& program) {
  for (const auto& list : program.kernel_lists()) {
    for (const auto& k : list) {
      if (const auto* g = std::get_if<st::Gemm>(&k.work)) return g->dtype;
      if (const auto* a = std::get_if<st::Attention>(&k.work)) return a->dtype;
      if (const auto* w = std::get_if<st::RooflineWork>(&k.work)) return w->dtype;
    }
  }
  return DType::bf16;
}

std::string cluster_line(const hw::ClusterSpec& c) {
  return c.name + ": " + std::to_string(c.nodes) + " x " + std::to_string(c.devices_per_node) +
         " " + c.device.name + " (" + traces::with_commas(c.world_size()) + " devices, " +
         std::string(hw::name_of(c.network_model)) + " network)";
}

// The trace's format; --scale-compute checked with it, before anything is read.
traces::TraceFormat replay_format(const ReplayRequest& args) {
  const auto format = traces::trace_format_from_name(args.format);
  if (!format) throw BadInput("--format expects chakra, kineto or stratasim, got " + args.format);
  if (!(args.scale_compute > 0) || !std::isfinite(args.scale_compute)) {
    throw BadInput("--scale-compute expects a number > 0 (2: compute twice as fast)");
  }
  return *format;
}

// The imported trace and, for a stratasim timeline, the context its simulation recorded.
struct LoadedTrace {
  traces::ImportedTrace imported;
  std::optional<traces::ReportContext> recorded;
};

// --step: a ProfilerStep number or "all" (Kineto only).
traces::KinetoOptions kineto_options(const ReplayRequest& args, traces::TraceFormat format) {
  traces::KinetoOptions options;
  options.dp_groups = args.dp_groups;
  if (args.step.empty()) return options;
  if (format != traces::TraceFormat::kineto) {
    throw BadInput("--step picks a ProfilerStep of a Kineto trace; it does not apply to --format " +
                   args.format);
  }
  if (args.step == "all") {
    options.all_steps = true;
    return options;
  }
  std::int64_t n = 0;
  const bool digits =
      args.step.size() <= 15 &&
      std::all_of(args.step.begin(), args.step.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    throw BadInput("--step expects a ProfilerStep number (7 for ProfilerStep#7) or all, got \"" +
                   args.step + "\"");
  }
  for (const char c : args.step) n = n * 10 + (c - '0');
  options.step = n;
  return options;
}

LoadedTrace load_trace(const ReplayRequest& args, traces::TraceFormat format) {
  const std::string& trace = args.trace;
  LoadedTrace loaded;
  const traces::KinetoOptions kineto = kineto_options(args, format);
  if (format == traces::TraceFormat::stratasim) {
    auto t = traces::import_timeline(trace);
    loaded.imported = std::move(t.trace);
    loaded.recorded = std::move(t.context);
  } else if (format == traces::TraceFormat::kineto) {
    loaded.imported = traces::import_kineto(trace, kineto);
  } else {
    loaded.imported = traces::import_trace(trace, format);
  }
  return loaded;
}

// The cluster `cluster_given` names, with the --set overrides; with a recorded context its
// kernels are costed as the simulation that wrote the timeline costed them: with its training
// framework's efficiency (strategies::TrainingSpec::compute_efficiency, ...).
hw::ClusterSpec replay_cluster(const std::string& cluster_given, const ReplayRequest& args,
                               const std::optional<traces::ReportContext>& recorded) {
  if (cluster_given.empty()) {
    throw BadInput(
        "the trace does not say which cluster it ran on: give one with --cluster "
        "(a file, or a name from stratasim list clusters)");
  }
  hw::ClusterSpec cluster = load_cluster(resolve_cluster(cluster_given), args.sets);
  if (recorded) {
    auto apply = [&](hw::DeviceSpec& d) {
      if (d.is_fpga()) return;
      d.efficiency.framework_compute = recorded->framework_compute;
      d.efficiency.framework_memory_traffic = recorded->framework_memory_traffic;
      d.efficiency.framework_attention = recorded->framework_attention;
    };
    apply(cluster.device);
    for (auto& o : cluster.overrides) {
      if (o.device) apply(*o.device);
    }
  }
  return cluster;
}

// --ranks: `program` re-targeted to `world` data-parallel ranks. Returns the re-targeting's
// placement block (strategies/retarget.hpp); the program's width when it is unchanged.
int retarget_ranks(st::Program& program, int world, const ReplayRequest& args,
                   bool analytical_homogeneous, std::vector<std::string>& notes) {
  const int old_world = program.world_size();
  if (world > traces::kMaxTraceRanks) {
    throw BadInput("--ranks " + std::to_string(world) + ": at most " +
                   std::to_string(traces::kMaxTraceRanks) + " ranks are supported");
  }
  int block = old_world;
  if (world != old_world) {
    st::RetargetOptions options;
    if (!args.dp_groups.empty()) options.dp_groups = args.dp_groups;
    options.mirror = !args.exact && analytical_homogeneous;
    options.notes = &notes;
    try {
      block = st::data_parallel_block(program, options);
      program = st::retarget_data_parallel(program, world, options);
    } catch (const st::RetargetError& e) {
      throw BadInput("--ranks " + std::to_string(world) + ": " + e.what());
    }
  }
  return block;
}

// A cluster with fewer devices than `world` grows by whole nodes (one with a fixed topology
// cannot).
void grow_cluster(hw::ClusterSpec& cluster, int world, std::vector<std::string>& notes) {
  if (cluster.world_size() >= world) return;
  if (cluster.topology) {
    throw BadInput("cluster " + cluster.name + " has " + std::to_string(cluster.world_size()) +
                   " devices and a fixed topology, the replay needs " + std::to_string(world) +
                   ": give a --cluster with enough devices");
  }
  const int nodes = (world + cluster.devices_per_node - 1) / cluster.devices_per_node;
  notes.push_back("cluster " + cluster.name + " has " + std::to_string(cluster.world_size()) +
                  " devices: grown to " + std::to_string(nodes) + " nodes of " +
                  std::to_string(cluster.devices_per_node) + " for " + std::to_string(world) +
                  " ranks");
  cluster.nodes = nodes;
}

// A mirrored program simulates one data-parallel replica for all: only where they behave alike.
void check_mirrored(const st::Program& program, const hw::ClusterSpec& cluster,
                    bool analytical_homogeneous) {
  if (program.mirrored() && !analytical_homogeneous) {
    throw BadInput(
        "the trace simulates data-parallel replicas once (mirrored), which holds only on the "
        "analytical network with identical devices; cluster " +
        cluster.name +
        " needs every rank: write the trace with stratasim simulate --exact (or drop --exact "
        "from a re-targeted replay)");
  }
}

// --scale-compute x: the devices and the measured kernels x times as fast.
void scale_compute(hw::ClusterSpec& cluster, st::Program& program, double x,
                   std::vector<std::string>& notes) {
  if (x == 1.0) return;
  const bool profiled = cluster.device.profile != nullptr;
  speed_up(cluster.device, x);
  for (auto& o : cluster.overrides) {
    if (o.device) speed_up(*o.device, x);
  }
  program = with_measured_scaled(program, x);
  if (profiled) {
    notes.push_back("--scale-compute sets the device's measured profile aside (roofline model)");
  }
}

// Validates the program and simulates it on `cluster` into out.timeline (and
// out.traced_ranks); the links' loads go to `links`.
void simulate_replay(const st::Program& program, const hw::ClusterSpec& cluster, int world,
                     const std::string& trace, ReplayResult& out,
                     std::vector<traces::LinkLoad>& links) {
  try {
    st::validate(program);
  } catch (const st::ProgramError& e) {
    throw InvalidProgram(std::string("the replayed program is invalid: ") + e.what());
  }
  // Mirrored ranks run no ops: the trace and memory samples cover the ranks that do.
  if (program.mirrored()) {
    for (int r = 0; r < world; ++r) {
      if (program.issues_ops(r)) out.traced_ranks.push_back(r);
    }
  }
  sim::SimOptions options;
  options.memory_sample_ranks = out.traced_ranks;
  try {
    out.timeline = simulate_program(program, cluster, options, &links);
  } catch (const std::overflow_error& e) {
    // Only an absurd input gets here (durations or sizes near the importers' bounds).
    throw BadInput(trace + ": the trace cannot be replayed: " + e.what());
  }
}

// The report's context: the recorded one (else one naming the trace), scaled to the new width
// `world`; ranks map back to the old ones through the re-targeting's `block`.
traces::ReportContext scaled_context(const std::optional<traces::ReportContext>& recorded,
                                     const std::string& trace, int old_world, int world,
                                     int block) {
  traces::ReportContext context;
  if (recorded) {
    context = *recorded;
  } else {
    context.experiment = fs::path(trace).filename().string();
  }
  const int k = world / old_world;
  context.samples_per_iteration *= k;
  context.tokens_per_iteration *= k;
  if (k > 1 && !context.stage_of_rank.empty()) {
    std::vector<int> stages(static_cast<std::size_t>(world), 0);
    for (int nr = 0; nr < world; ++nr) {
      const auto old = static_cast<std::size_t>(st::retarget_source_rank(nr, block, k));
      stages[static_cast<std::size_t>(nr)] =
          old < context.stage_of_rank.size() ? context.stage_of_rank[old] : 0;
    }
    context.stage_of_rank = std::move(stages);
  }
  return context;
}

// The context's device figures on the new cluster: the mean peak rate in the program's dtype
// (kept where the cluster is the one recorded) and the memory capacity.
void set_device_figures(traces::ReportContext& context, const st::Program& program,
                        const hw::ClusterSpec& cluster, int world, bool same_cluster) {
  if (!same_cluster) {
    const DType dtype = compute_dtype(program);
    double sum = 0;
    try {
      for (int r = 0; r < world; ++r) {
        sum += cluster.device_of(cluster.homogeneous() ? 0 : r).peak(dtype).flops_per_second();
      }
    } catch (const std::invalid_argument&) {
      sum = 0;  // the device has no rate for the dtype: no MFU
    }
    context.device_peak = FlopRate(sum / world);
  }
  context.device_capacity = cluster.device.memory_capacity;
}

// The context's setup lines: the cluster replayed on, and what the replay did.
void set_setup_lines(traces::ReportContext& context, const hw::ClusterSpec& cluster,
                     const ReplayRequest& args, int old_world, int world) {
  bool had_cluster_line = false;
  for (auto& [key, value] : context.setup) {
    if (key == "cluster") {
      value = cluster_line(cluster);
      had_cluster_line = true;
    }
  }
  if (!had_cluster_line) context.setup.emplace_back("cluster", cluster_line(cluster));
  std::ostringstream replay_line;
  replay_line << args.trace << " (" << args.format << ", " << old_world << " ranks)";
  if (world != old_world) replay_line << ", re-targeted to " << world << " ranks";
  if (args.scale_compute != 1.0) replay_line << ", compute x" << args.scale_compute << " faster";
  auto earlier = std::find_if(context.setup.begin(), context.setup.end(),
                              [](const auto& line) { return line.first == "replay"; });
  if (earlier != context.setup.end()) {
    earlier->second = replay_line.str();  // a replay of a replay: the latest
  } else {
    context.setup.emplace_back("replay", replay_line.str());
  }
}

}  // namespace

ReplayResult replay(const ReplayRequest& args) {
  const traces::TraceFormat format = replay_format(args);
  ReplayResult out;
  LoadedTrace loaded = load_trace(args, format);
  std::vector<std::string>& notes = out.notes;
  notes = std::move(loaded.imported.notes);
  st::Program program = std::move(loaded.imported.program);

  const std::string cluster_given =
      args.cluster.empty() ? loaded.imported.cluster.value_or("") : args.cluster;
  hw::ClusterSpec cluster = replay_cluster(cluster_given, args, loaded.recorded);
  const bool analytical_homogeneous = sim::replicas_behave_alike(cluster);

  const int old_world = program.world_size();
  const int world = args.ranks.value_or(old_world);
  if (world != old_world && loaded.imported.measured_communication) {
    throw BadInput("--ranks " + std::to_string(world) +
                   ": the trace holds only some ranks of its job, replayed with their "
                   "communication as measured, so it cannot be re-targeted; give every rank's "
                   "file to widen it");
  }
  const int block = retarget_ranks(program, world, args, analytical_homogeneous, notes);
  grow_cluster(cluster, world, notes);
  check_mirrored(program, cluster, analytical_homogeneous);
  scale_compute(cluster, program, args.scale_compute, notes);
  std::vector<traces::LinkLoad> links;
  simulate_replay(program, cluster, world, args.trace, out, links);

  out.context = scaled_context(loaded.recorded, args.trace, old_world, world, block);
  const bool same_cluster = loaded.recorded && loaded.imported.cluster &&
                            *loaded.imported.cluster == cluster_given && args.sets.empty() &&
                            args.scale_compute == 1.0;
  set_device_figures(out.context, program, cluster, world, same_cluster);
  set_setup_lines(out.context, cluster, args, old_world, world);
  for (auto& line : loaded.imported.setup) out.context.setup.push_back(std::move(line));
  out.report = traces::make_report(program, out.timeline, out.context);
  out.report.links = std::move(links);
  out.program = std::move(program);
  out.cluster = std::move(cluster);
  out.cluster_given = cluster_given;
  return out;
}

}  // namespace stratasim::study
