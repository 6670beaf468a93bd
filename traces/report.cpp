// The report of one iteration, computed from a Program and its Timeline (the span figures
// gathered by traces::SpanStatistics, from timeline.spans or while a simulation ran).
//
// Definitions (all times from the spans that exist, so an incomplete run is still reported):
// - iteration_time_s: earliest span start to latest span end over all spans (0 if none).
// - pipeline_time_s: earliest start of a span whose op has phase forward to the latest end of a
//   span whose op has phase backward, on any stream; 0 when there is no forward or no backward
//   span (or the backward ends before the forward starts).
// - optimizer_time_s: max over ranks of the summed durations of that rank's compute- or host-stream
//   spans with phase optimizer.
// - tokens_per_s = tokens_per_iteration / iteration_time_s; samples_per_s likewise (0 when the
//   iteration time is 0).
// - model_flops_per_iteration: sum of strategies::matmul_flops over the kernel lists of all
//   Compute ops with phase forward or backward. hardware_flops_per_iteration: the same over all
//   Compute ops of every phase (so recomputation, once it has its own phase, counts only there).
//   Counted per kernel list: flops of each list once, times how many ops use it.
// - model_tflops_per_device = model_flops / iteration_time / world_size / 1e12;
//   mfu = model_flops / (iteration_time * world_size * device_peak); hfu likewise with the
//   hardware flops (0 when the time or the peak is 0).
// - overlapping iterations (Program::overlapping_iterations: PipeDream-2BW, ZB-H2): the next
//   iteration starts before this one ends, so iteration_time_s is the steady-state period, the
//   longest busy window of a rank (its first compute-stream span start to its last span end),
//   and pipeline_time_s the longest window of a rank's forward/backward/recompute compute spans;
//   each rank's busy time is clipped to its own window.
// - per rank compute_busy_s: summed durations of the rank's compute-stream spans with phase
//   forward, backward or recompute, clipped to the pipeline window. compute_idle_fraction = 1 -
//   mean over ranks of compute_busy_s / pipeline_time_s (0 when pipeline_time_s is 0): the time
//   the compute stream waits (on communication, on other stages). bubble_fraction is that figure
//   when there is a pipeline (more than one stage in context.stage_of_rank, or no stages given),
//   else 0: at pp = 1 the idle time is waiting on communication, not a pipeline bubble.
// - per rank exposed_comm_s: length of the time during which at least one span on a
//   communication stream (tp_comm, dp_comm, pp_send, pp_recv) is active and no compute-stream
//   span is; the report's exposed_comm_s is the mean over ranks. Computed from the union of the
//   rank's communication spans and the union of its compute spans (traces/span_statistics.hpp,
//   gathered span by span in any order): the measure of the first minus the second.
//   exposed_copy_s is the same for the copy stream (offload copies, an embedding cache's
//   host <-> device rows): the union of its spans minus the union of compute spans.
// - per rank peak_memory and breakdown: timeline.ranks[r].tiers[device]; fits: no OutOfMemory
//   entry for the rank (any tier). Report peak_memory: max over ranks; fits: no OutOfMemory
//   entry at all. stage: context.stage_of_rank[r] (0 when the vector is short).
// - completed and problem are copied from the timeline.
#include "traces/report.hpp"

#include "traces/bus_bandwidth.hpp"
#include "traces/span_statistics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace stratasim::traces {

namespace {

using strategies::Phase;

constexpr double kPsToS = 1e-12;
constexpr std::int64_t kNoTime = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kNoEnd = std::numeric_limits<std::int64_t>::min();

// Flops of forward/backward (model) and of all (hardware) Compute ops, per kernel list.
void count_flops(const strategies::Program& program, Report& report) {
  const auto& lists = program.kernel_lists();
  std::vector<std::uint64_t> model_uses(lists.size(), 0);
  std::vector<std::uint64_t> all_uses(lists.size(), 0);
  for (const auto& op : program.ops()) {
    const auto* compute = std::get_if<strategies::Compute>(&op.work);
    if (compute == nullptr || compute->kernels >= lists.size()) continue;
    // A rank that stands for mirrored replicas does their work too.
    const auto times = static_cast<std::uint64_t>(program.multiplicity(op.rank));
    all_uses[compute->kernels] += times;
    if (op.phase == Phase::forward || op.phase == Phase::backward) {
      model_uses[compute->kernels] += times;
    }
  }
  double model = 0;
  double hardware = 0;
  for (std::size_t i = 0; i < lists.size(); ++i) {
    if (all_uses[i] == 0) continue;
    double per_use = 0;
    for (const auto& kernel : lists[i]) per_use += strategies::matmul_flops(kernel).count();
    model += per_use * static_cast<double>(model_uses[i]);
    hardware += per_use * static_cast<double>(all_uses[i]);
  }
  report.model_flops_per_iteration = model;
  report.hardware_flops_per_iteration = hardware;
}

void fill_times(const strategies::Program& program, const SpanStatistics& stats,
                const ReportContext& context, Report& report) {
  const auto world = static_cast<std::size_t>(program.world_size());
  const auto& ranks = stats.ranks();
  const std::int64_t forward_start = stats.forward_start_ps();
  const std::int64_t backward_end = stats.backward_end_ps();
  if (stats.spans() > 0) {
    report.iteration_time_s =
        static_cast<double>(stats.last_end_ps() - stats.first_start_ps()) * kPsToS;
  }
  const bool have_pipeline =
      forward_start != kNoTime && backward_end != kNoEnd && backward_end > forward_start;
  if (have_pipeline) {
    report.pipeline_time_s = static_cast<double>(backward_end - forward_start) * kPsToS;
  }
  const bool overlapping = program.overlapping_iterations();
  if (overlapping) {
    // The steady-state period: the longest busy window of a rank (iterations overlap, so the
    // first-to-last span of one iteration overstates what an iteration costs).
    std::int64_t period = 0, pipeline = 0;
    for (const auto& r : ranks) {
      if (r.first != kNoTime && r.last > r.first) period = std::max(period, r.last - r.first);
      if (r.fb_first != kNoTime && r.fb_last > r.fb_first) {
        pipeline = std::max(pipeline, r.fb_last - r.fb_first);
      }
    }
    if (period > 0) report.iteration_time_s = static_cast<double>(period) * kPsToS;
    report.pipeline_time_s = static_cast<double>(pipeline) * kPsToS;
  }
  std::int64_t optimizer_max = 0;
  for (const auto& r : ranks) optimizer_max = std::max(optimizer_max, r.optimizer_ps);
  report.optimizer_time_s = static_cast<double>(optimizer_max) * kPsToS;

  // Per rank: compute-busy time within the pipeline window, and the union of communication
  // minus the union of compute.
  report.ranks.resize(world);
  double busy_ratio_sum = 0;
  double exposed_sum = 0;
  double exposed_copy_sum = 0;
  for (std::size_t r = 0; r < world; ++r) {
    RankReport& rank = report.ranks[r];
    rank.rank = static_cast<int>(r);
    rank.stage = r < context.stage_of_rank.size() ? context.stage_of_rank[r] : 0;
    const auto source = static_cast<std::size_t>(program.replica_of(static_cast<int>(r)));
    if (source != r) {  // a mirrored rank ran exactly what its representative (a lower rank) ran
      rank.compute_busy_s = report.ranks[source].compute_busy_s;
      rank.exposed_comm_s = report.ranks[source].exposed_comm_s;
      rank.exposed_copy_s = report.ranks[source].exposed_copy_s;
    } else {
      const auto& figures = ranks[r];
      if (have_pipeline) {
        const std::int64_t busy = overlapping
                                      ? stats.busy_within(r, figures.fb_first, figures.fb_last)
                                      : stats.busy_within(r, forward_start, backward_end);
        rank.compute_busy_s = static_cast<double>(busy) * kPsToS;
      }
      rank.exposed_comm_s =
          static_cast<double>(measure_minus(figures.comm, figures.compute)) * kPsToS;
      rank.exposed_copy_s =
          static_cast<double>(measure_minus(figures.copy, figures.compute)) * kPsToS;
    }
    if (report.pipeline_time_s > 0) busy_ratio_sum += rank.compute_busy_s / report.pipeline_time_s;
    exposed_sum += rank.exposed_comm_s;
    exposed_copy_sum += rank.exposed_copy_s;
  }
  if (report.pipeline_time_s > 0) {
    report.compute_idle_fraction = 1.0 - busy_ratio_sum / static_cast<double>(world);
    if (pipelined(context)) report.bubble_fraction = report.compute_idle_fraction;
  }
  report.exposed_comm_s = exposed_sum / static_cast<double>(world);
  report.exposed_copy_s = exposed_copy_sum / static_cast<double>(world);
}

// Several iterations (Program::iterations() > 1): the run's figures as per-iteration means
// (report.hpp, Report), with the run's total and each iteration's end.
void divide_into_iterations(const strategies::Program& program, const SpanStatistics& stats,
                            Report& report) {
  const int n = program.iterations();
  if (n <= 1) return;
  const double per = 1.0 / static_cast<double>(n);
  report.iterations = n;
  report.total_time_s = report.iteration_time_s;
  for (std::int64_t end : stats.iteration_end_ps()) {
    if (end == SpanStatistics::kNoEnd) continue;
    report.iteration_end_s.push_back(static_cast<double>(end - stats.first_start_ps()) * kPsToS);
  }
  report.iteration_time_s *= per;
  report.pipeline_time_s *= per;
  report.optimizer_time_s *= per;
  report.exposed_comm_s *= per;
  report.exposed_copy_s *= per;
  report.model_flops_per_iteration *= per;
  report.hardware_flops_per_iteration *= per;
  for (double& s : report.interference_s) s *= per;
  for (RankReport& rank : report.ranks) {
    rank.compute_busy_s *= per;
    rank.exposed_comm_s *= per;
    rank.exposed_copy_s *= per;
  }
  for (CommTraffic& c : report.communication) {
    c.calls /= n;
    c.bytes = Bytes(c.bytes.count() / n);
    c.wire_bytes = Bytes(c.wire_bytes.count() / n);
    c.time_s *= per;
  }
}

// Interference losses per (issuing rank, stream); a mirrored rank counts its representative's.
void fill_interference(const strategies::Program& program, const Timeline& timeline,
                       Report& report) {
  if (timeline.interference.empty()) return;
  const auto world = static_cast<std::size_t>(program.world_size());
  std::vector<std::array<double, strategies::kStreamCount>> lost(world);
  for (const InterferenceLoss& loss : timeline.interference) {
    if (loss.op >= program.op_count()) continue;
    const strategies::Op& o = program.op(loss.op);
    lost[static_cast<std::size_t>(o.rank)][static_cast<std::size_t>(o.stream)] +=
        loss.lost.seconds();
  }
  for (std::size_t r = 0; r < world; ++r) {
    const auto source = static_cast<std::size_t>(program.replica_of(static_cast<int>(r)));
    for (std::size_t s = 0; s < strategies::kStreamCount; ++s) {
      report.interference_s[s] += lost[source][s] / static_cast<double>(world);
    }
  }
}

// Per rank and (stream, kind): calls, bytes, wire bytes and time with data moving; the report
// keeps, per (stream, kind), the rank with the most wire bytes (ties: the lowest rank). A
// context-parallel transfer counts under a stream of its own, "cp".
void fill_communication(const strategies::Program& program, const SpanStatistics& stats,
                        Report& report) {
  constexpr int kKinds = SpanStatistics::kCommKinds;      // the collective kinds, then "send"
  constexpr int kStreams = SpanStatistics::kCommStreams;  // the streams, then "cp"
  struct Tally {
    std::int64_t calls = 0;
    std::int64_t bytes = 0;
    double wire = 0;
    std::int64_t time_ps = 0;
  };
  const auto world = static_cast<std::size_t>(program.world_size());
  std::vector<Tally> tally(world * kStreams * kKinds);
  std::vector<char> used(kStreams * kKinds, 0);
  // Times only when every op has its span (as when they were read from a timeline indexed by op).
  const bool indexed = stats.spans() == program.op_count();
  for (OpId id = 0; id < program.op_count(); ++id) {
    const auto& op = program.op(id);
    std::int64_t bytes = 0;
    double wire = 0;
    if (const auto* c = std::get_if<strategies::Collective>(&op.work)) {
      bytes = c->bytes.count();
      const std::uint32_t group = c->group;
      const auto n = group < program.groups().size()
                         ? static_cast<int>(program.groups()[group].ranks.size())
                         : 1;
      wire = n <= 1 ? 0.0 : static_cast<double>(bytes) * busbw_factor(c->kind, n);
    } else if (const auto* send = std::get_if<strategies::Send>(&op.work)) {
      bytes = send->bytes.count();
      wire = static_cast<double>(bytes);
    } else {
      continue;
    }
    const auto slot = static_cast<std::size_t>(stats.comm_slot(op));
    used[slot] = 1;
    Tally& t = tally[static_cast<std::size_t>(op.rank) * kStreams * kKinds + slot];
    ++t.calls;
    t.bytes += bytes;
    t.wire += wire;
  }
  if (indexed) {
    for (std::size_t r = 0; r < world; ++r) {
      for (std::size_t slot = 0; slot < used.size(); ++slot) {
        if (used[slot]) tally[r * used.size() + slot].time_ps = stats.comm_time(r, slot);
      }
    }
  }
  for (std::size_t slot = 0; slot < used.size(); ++slot) {
    if (!used[slot]) continue;
    std::size_t best = 0;
    for (std::size_t r = 0; r < world; ++r) {
      if (tally[r * used.size() + slot].wire > tally[best * used.size() + slot].wire) best = r;
    }
    const Tally& t = tally[best * used.size() + slot];
    CommTraffic c;
    if (slot / kKinds == static_cast<std::size_t>(strategies::kStreamCount)) {
      c.stream = "cp";
    } else {
      const auto stream = static_cast<strategies::Stream>(slot / kKinds);
      c.stream = stream == strategies::Stream::tp_comm   ? "tp"
                 : stream == strategies::Stream::dp_comm ? "dp"
                 : stream == strategies::Stream::pp_send || stream == strategies::Stream::pp_recv
                     ? "pp"
                     : std::string(strategies::name_of(stream));
    }
    const int kind = static_cast<int>(slot % kKinds);
    c.kind = kind == kKinds - 1
                 ? "send"
                 : std::string(strategies::name_of(static_cast<strategies::CollectiveKind>(kind)));
    c.rank = static_cast<int>(best);
    c.calls = t.calls;
    c.bytes = Bytes(t.bytes);
    c.wire_bytes = Bytes(static_cast<std::int64_t>(std::llround(t.wire)));
    c.time_s = static_cast<double>(t.time_ps) * kPsToS;
    if (c.time_s > 0) {
      c.algbw = static_cast<double>(t.bytes) / c.time_s;
      c.busbw = t.wire / c.time_s;
    }
    report.communication.push_back(std::move(c));
  }
}

void fill_memory(const Timeline& timeline, Report& report) {
  const auto device = static_cast<std::size_t>(MemoryTier::device);
  for (RankReport& rank : report.ranks) {
    const auto r = static_cast<std::size_t>(rank.rank);
    if (r < timeline.ranks.size()) {
      const TierPeak& peak = timeline.ranks[r].tiers[device];
      rank.peak_memory = peak.peak;
      rank.capacity = peak.capacity;
      rank.breakdown = peak.breakdown;
    }
    rank.fits = true;
    report.peak_memory = std::max(report.peak_memory, rank.peak_memory);
  }
  for (const OutOfMemory& oom : timeline.out_of_memory) {
    if (oom.rank >= 0 && static_cast<std::size_t>(oom.rank) < report.ranks.size()) {
      report.ranks[static_cast<std::size_t>(oom.rank)].fits = false;
    }
  }
  report.out_of_memory = timeline.out_of_memory;
  report.stopped_on_oom = timeline.stopped_on_oom;
  report.fits = timeline.out_of_memory.empty();
}

// ---- Printing helpers.

std::string seconds_text(double s) {
  if (s == 0) return "0 s";
  if (!(s > 0) || s > 9e6) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g s", s);
    return buf;
  }
  return to_string(Time::from_seconds(s));
}

std::string percent_text(double fraction) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f%%", fraction * 100.0);
  return buf;
}

// 1234567.8 -> "1,234,568"; below 1000 with up to 4 significant digits.
std::string rate_text(double v) {
  char buf[64];
  if (!(std::fabs(v) >= 1000) || !std::isfinite(v) || std::fabs(v) >= 1e18) {
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.0f", v);
  std::string digits = buf;
  std::string out;
  std::size_t first = digits[0] == '-' ? 1 : 0;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > first && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

Bytes category(const MemoryBreakdown& b, MemoryCategory c) {
  return b[static_cast<std::size_t>(c)];
}

}  // namespace

bool pipelined(const ReportContext& context) {
  return context.stage_of_rank.empty() ||
         std::any_of(context.stage_of_rank.begin(), context.stage_of_rank.end(),
                     [](int stage) { return stage > 0; });
}

Report make_report(const strategies::Program& program, const Timeline& timeline,
                   const ReportContext& context) {
  SpanStatistics stats(program);
  for (const Span& span : timeline.spans) stats.add(span);
  return make_report(program, timeline, stats, context);
}

Report make_report(const strategies::Program& program, const Timeline& timeline,
                   const SpanStatistics& stats, const ReportContext& context) {
  Report report;
  report.completed = timeline.completed;
  report.problem = timeline.problem;
  count_flops(program, report);
  fill_times(program, stats, context, report);
  fill_memory(timeline, report);
  fill_communication(program, stats, report);
  fill_interference(program, timeline, report);
  divide_into_iterations(program, stats, report);
  for (RankReport& rank : report.ranks) {
    const auto r = static_cast<std::size_t>(rank.rank);
    if (r >= timeline.ranks.size()) continue;
    const auto& tiers = timeline.ranks[r].tiers;
    const TierPeak& device = tiers[static_cast<std::size_t>(MemoryTier::device)];
    rank.peak_time_s = device.time.seconds();
    if (device.peak.count() > 0 && device.op < program.op_count())
      rank.peak_at = program.describe(device.op, rank.rank);
    rank.host_peak = tiers[static_cast<std::size_t>(MemoryTier::host)].peak;
    rank.nvme_peak = tiers[static_cast<std::size_t>(MemoryTier::nvme)].peak;
  }
  for (const OutOfMemory& o : timeline.out_of_memory) {
    report.out_of_memory_at.push_back(o.first_op < program.op_count()
                                          ? program.describe(o.first_op, o.rank)
                                          : "before the first op");
    const bool known = o.first_op < program.op_count();
    report.out_of_memory_op_index.push_back(
        known ? o.first_op - program.first_op(program.op(o.first_op).rank) : 0);
  }

  const double t = report.iteration_time_s;
  report.time_to_train_s = static_cast<double>(context.iterations_to_accuracy) * t;
  const double world = static_cast<double>(program.world_size());
  const double peak = context.device_peak.flops_per_second();
  if (t > 0) {
    report.tokens_per_s = static_cast<double>(context.tokens_per_iteration) / t;
    report.samples_per_s = static_cast<double>(context.samples_per_iteration) / t;
    report.model_tflops_per_device = report.model_flops_per_iteration / t / world / 1e12;
    if (peak > 0) {
      report.mfu = report.model_flops_per_iteration / (t * world * peak);
      report.hfu = report.hardware_flops_per_iteration / (t * world * peak);
    }
  }
  return report;
}

nlohmann::json to_json(const Report& report, const ReportContext& context) {
  using nlohmann::json;
  json j = json::object();
  j["experiment"] = context.experiment;
  j["completed"] = report.completed;
  j["problem"] = report.problem;
  j["iteration_time_s"] = report.iteration_time_s;
  if (report.iterations > 1) {
    j["iterations"] = report.iterations;
    j["total_time_s"] = report.total_time_s;
    j["iteration_end_s"] = report.iteration_end_s;
  }
  j["pipeline_time_s"] = report.pipeline_time_s;
  if (context.iterations_to_accuracy > 0) {
    j["iterations_to_accuracy"] = context.iterations_to_accuracy;
    j["time_to_train_s"] = report.time_to_train_s;
  }
  j["optimizer_time_s"] = report.optimizer_time_s;
  j["tokens_per_s"] = report.tokens_per_s;
  j["samples_per_s"] = report.samples_per_s;
  j["model_flops_per_iteration"] = report.model_flops_per_iteration;
  j["hardware_flops_per_iteration"] = report.hardware_flops_per_iteration;
  j["model_tflops_per_device"] = report.model_tflops_per_device;
  j["mfu"] = report.mfu;
  j["hfu"] = report.hfu;
  j["bubble_fraction"] = report.bubble_fraction;
  j["compute_idle_fraction"] = report.compute_idle_fraction;
  j["exposed_comm_s"] = report.exposed_comm_s;
  j["exposed_copy_s"] = report.exposed_copy_s;
  json figures = json::object();
  for (const auto& [name, value] : context.figures) figures[name] = value;
  j["figures"] = std::move(figures);
  json interference = json::object();
  for (std::size_t s = 0; s < strategies::kStreamCount; ++s) {
    interference[std::string(strategies::name_of(static_cast<strategies::Stream>(s)))] =
        report.interference_s[s];
  }
  j["interference_s"] = interference;
  j["peak_memory_bytes"] = report.peak_memory.count();
  j["fits"] = report.fits;
  json ranks = json::array();
  for (const RankReport& r : report.ranks) {
    json breakdown = json::object();
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      breakdown[std::string(strategies::name_of(static_cast<MemoryCategory>(c)))] =
          r.breakdown[static_cast<std::size_t>(c)].count();
    }
    ranks.push_back(json{{"rank", r.rank},
                         {"stage", r.stage},
                         {"peak_memory_bytes", r.peak_memory.count()},
                         {"memory_breakdown", std::move(breakdown)},
                         {"fits", r.fits},
                         {"peak_time_s", r.peak_time_s},
                         {"peak_at", r.peak_at},
                         {"host_peak_memory_bytes", r.host_peak.count()},
                         {"nvme_peak_memory_bytes", r.nvme_peak.count()}});
  }
  j["ranks"] = std::move(ranks);
  json comm = json::array();
  for (const CommTraffic& c : report.communication) {
    comm.push_back(json{{"stream", c.stream},
                        {"kind", c.kind},
                        {"rank", c.rank},
                        {"calls", c.calls},
                        {"bytes", c.bytes.count()},
                        {"wire_bytes", c.wire_bytes.count()},
                        {"time_s", c.time_s},
                        {"algbw_bytes_per_s", c.algbw},
                        {"busbw_bytes_per_s", c.busbw}});
  }
  j["communication"] = std::move(comm);
  json links = json::array();
  for (const LinkLoad& l : report.links) {
    links.push_back(json{{"link", l.link},
                         {"capacity_bytes_per_s", l.capacity.bytes_per_second()},
                         {"bytes", l.bytes.count()},
                         {"utilisation", l.utilisation}});
  }
  j["links"] = std::move(links);
  json oom = json::array();
  for (std::size_t i = 0; i < report.out_of_memory.size(); ++i) {
    const OutOfMemory& o = report.out_of_memory[i];
    oom.push_back(json{
        {"rank", o.rank},
        {"at", i < report.out_of_memory_at.size() ? report.out_of_memory_at[i] : ""},
        {"tier", std::string(strategies::name_of(o.tier))},
        {"capacity_bytes", o.capacity.count()},
        {"peak_bytes", o.peak.count()},
        {"excess_bytes", (o.peak - o.capacity).count()},
        {"op", i < report.out_of_memory_op_index.size() ? report.out_of_memory_op_index[i] : 0},
        {"time_s", o.time.seconds()}});
  }
  j["out_of_memory"] = std::move(oom);
  j["stopped_on_oom"] = report.stopped_on_oom;
  return j;
}

namespace {

// Memory per pipeline stage: the rank with the highest device peak stands for its stage.
void print_memory_table(std::ostream& out, const Report& report, const ReportContext& context) {
  struct StageRow {
    const RankReport* worst = nullptr;
    int ranks = 0;
    Bytes device_excess;  // largest device-tier excess of the stage's ranks
    std::string other_tier;
    Bytes other_excess;
  };
  std::map<int, StageRow> stages;
  for (const RankReport& r : report.ranks) {
    StageRow& row = stages[r.stage];
    ++row.ranks;
    if (row.worst == nullptr || r.peak_memory > row.worst->peak_memory) row.worst = &r;
  }
  for (const OutOfMemory& o : report.out_of_memory) {
    if (o.rank < 0 || static_cast<std::size_t>(o.rank) >= report.ranks.size()) continue;
    StageRow& row = stages[report.ranks[static_cast<std::size_t>(o.rank)].stage];
    const Bytes excess = o.peak - o.capacity;
    if (o.tier == MemoryTier::device) {
      row.device_excess = std::max(row.device_excess, excess);
    } else if (excess > row.other_excess) {
      row.other_excess = excess;
      row.other_tier = std::string(strategies::name_of(o.tier));
    }
  }
  if (!stages.empty()) {
    std::vector<std::vector<std::string>> table;
    table.push_back({"stage", "ranks", "peak / capacity", "params", "grads", "optimizer",
                     "activations", "buffers", "other", "status"});
    for (const auto& [stage, row] : stages) {
      if (row.worst == nullptr) continue;
      const MemoryBreakdown& b = row.worst->breakdown;
      std::string peak = to_string(row.worst->peak_memory);
      const Bytes capacity =
          row.worst->capacity.count() > 0 ? row.worst->capacity : context.device_capacity;
      if (capacity.count() > 0) peak += " / " + to_string(capacity);
      std::string status = "fits";
      if (row.device_excess.count() > 0) {
        status = "OUT OF MEMORY by " + to_string(row.device_excess);
      } else if (!row.other_tier.empty()) {
        status = "OUT OF MEMORY (" + row.other_tier + ") by " + to_string(row.other_excess);
      }
      table.push_back({std::to_string(stage), std::to_string(row.ranks), peak,
                       to_string(category(b, MemoryCategory::parameters)),
                       to_string(category(b, MemoryCategory::gradients)),
                       to_string(category(b, MemoryCategory::optimizer_states)),
                       to_string(category(b, MemoryCategory::activations)),
                       to_string(category(b, MemoryCategory::workspace) +
                                 category(b, MemoryCategory::comm_buffers)),
                       to_string(category(b, MemoryCategory::other)), status});
    }
    std::vector<std::size_t> widths(table[0].size(), 0);
    for (const auto& cells : table) {
      for (std::size_t c = 0; c < cells.size(); ++c)
        widths[c] = std::max(widths[c], cells[c].size());
    }
    out << "\n  device memory per pipeline stage (peak rank of the stage, breakdown at its peak)\n";
    for (const auto& cells : table) {
      std::string line = " ";
      for (std::size_t c = 0; c < cells.size(); ++c) {
        line += ' ';
        line += c + 1 < cells.size() ? pad(cells[c], widths[c] + 1) : cells[c];
      }
      out << line << '\n';
    }
  }
}

void print_verdict(std::ostream& out, const Report& report) {
  out << '\n';
  if (!report.completed && !report.stopped_on_oom) {
    out << "verdict: INCOMPLETE: the run stopped before every op finished (see above)";
    if (!report.fits) out << "; out of memory as well";
    out << '\n';
  } else if (!report.fits) {
    const OutOfMemory* worst = nullptr;
    std::string worst_at;
    std::vector<bool> failing(report.ranks.size(), false);
    for (std::size_t i = 0; i < report.out_of_memory.size(); ++i) {
      const OutOfMemory& o = report.out_of_memory[i];
      if (worst == nullptr || o.peak - o.capacity > worst->peak - worst->capacity) {
        worst = &o;
        worst_at = i < report.out_of_memory_at.size() ? report.out_of_memory_at[i] : "";
      }
      if (o.rank >= 0 && static_cast<std::size_t>(o.rank) < failing.size()) {
        failing[static_cast<std::size_t>(o.rank)] = true;
      }
    }
    const auto count = std::count(failing.begin(), failing.end(), true);
    out << "verdict: OUT OF MEMORY on " << count << " of " << report.ranks.size() << " ranks";
    if (worst != nullptr) {
      out << " (worst: rank " << worst->rank << ", " << strategies::name_of(worst->tier)
          << " memory, by " << to_string(worst->peak - worst->capacity) << ", first exceeded at "
          << (worst_at.empty() ? "op " + std::to_string(worst->first_op) : worst_at) << ")";
    }
    out << '\n';
  } else {
    out << "verdict: fits in memory; " << seconds_text(report.iteration_time_s) << " per iteration";
    if (report.model_flops_per_iteration > 0) out << " at " << percent_text(report.mfu) << " MFU";
    out << '\n';
  }
}

}  // namespace

void print_memory_summary(std::ostream& out, const Report& report, const ReportContext& context) {
  const std::string title = "stratasim memory: " + context.experiment;
  out << title << '\n' << std::string(title.size(), '=') << '\n' << '\n';
  std::size_t width = 0;
  for (const auto& [label, value] : context.setup) width = std::max(width, label.size());
  for (const auto& [label, value] : context.setup)
    out << "  " << pad(label, width + 2) << value << '\n';
  print_memory_table(out, report, context);
  out << '\n';
  if (!report.fits) {
    print_verdict(out, report);
  } else {
    out << "verdict: fits in memory (peak " << to_string(report.peak_memory) << " of "
        << to_string(context.device_capacity) << ")\n";
  }
}

void print_summary(std::ostream& out, const Report& report, const ReportContext& context) {
  const std::string title = "stratasim report: " + context.experiment;
  out << title << '\n' << std::string(title.size(), '=') << '\n';
  if (!report.completed) {
    out << "\n!! THE RUN DID NOT COMPLETE: " << report.problem << '\n'
        << "!! The figures below cover only the ops that ran.\n";
  }

  std::vector<std::pair<std::string, std::string>> lines = context.setup;
  const std::size_t setup_count = lines.size();
  lines.emplace_back("iteration time",
                     seconds_text(report.iteration_time_s) +
                         (report.iterations > 1
                              ? " (mean of " + std::to_string(report.iterations) + " back to back)"
                              : std::string()));
  if (report.iterations > 1) {
    std::string ends;
    for (double e : report.iteration_end_s) ends += (ends.empty() ? "" : ", ") + seconds_text(e);
    lines.emplace_back("all iterations", seconds_text(report.total_time_s) + "; ends " + ends);
  }
  if (context.iterations_to_accuracy > 0) {
    lines.emplace_back("time to train", seconds_text(report.time_to_train_s) + " (" +
                                            std::to_string(context.iterations_to_accuracy) +
                                            " iterations to accuracy)");
  }
  // Imported traces may not know the batch (Kineto, Chakra) or the kernels' shapes (measured
  // durations only): say so rather than print zeros that read like results.
  if (context.samples_per_iteration > 0) {
    // A model without sequences (DLRM) has no tokens: samples only.
    lines.emplace_back("throughput", (context.tokens_per_iteration > 0
                                          ? rate_text(report.tokens_per_s) + " tokens/s, "
                                          : std::string()) +
                                         rate_text(report.samples_per_s) + " samples/s");
  } else {
    lines.emplace_back("throughput", "unknown (the trace does not say the batch size)");
  }
  if (report.model_flops_per_iteration > 0) {
    lines.emplace_back("model FLOP rate",
                       to_string(FlopRate(report.model_tflops_per_device * 1e12)) + " per device");
    lines.emplace_back("MFU / HFU", percent_text(report.mfu) + " / " + percent_text(report.hfu));
  } else {
    lines.emplace_back("model FLOP rate", "unknown (no kernel shapes: measured durations only)");
  }
  if (pipelined(context)) {
    lines.emplace_back("pipeline bubble", percent_text(report.bubble_fraction) + " of " +
                                              seconds_text(report.pipeline_time_s) +
                                              " (first forward to last backward)");
  } else {  // one stage: no pipeline, the compute stream only waits on communication
    lines.emplace_back("compute idle", percent_text(report.compute_idle_fraction) + " of " +
                                           seconds_text(report.pipeline_time_s) +
                                           " (first forward to last backward; no pipeline)");
  }
  lines.emplace_back("exposed comm", seconds_text(report.exposed_comm_s) + " (mean per rank)");
  if (report.exposed_copy_s > 0) {
    lines.emplace_back("exposed copies",
                       seconds_text(report.exposed_copy_s) +
                           " (mean per rank: host <-> device copies with no compute running)");
  }
  std::string lost;
  for (std::size_t s = 0; s < strategies::kStreamCount; ++s) {
    if (report.interference_s[s] <= 0) continue;
    lost += (lost.empty() ? "" : ", ") +
            std::string(strategies::name_of(static_cast<strategies::Stream>(s))) + " " +
            seconds_text(report.interference_s[s]);
  }
  if (!lost.empty()) {
    lines.emplace_back("interference", lost + " (mean per rank: time lost beside overlap)");
  }
  lines.emplace_back("optimizer step", seconds_text(report.optimizer_time_s));
  std::size_t width = 0;
  for (const auto& [label, value] : lines) width = std::max(width, label.size());
  out << '\n';
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i == setup_count && setup_count > 0) out << '\n';
    out << "  " << pad(lines[i].first, width + 2) << lines[i].second << '\n';
  }

  if (!report.communication.empty()) {
    out << "\n  communication per iteration (the busiest rank of each kind; busbw as nccl-tests)\n";
    out << "    " << pad("stream/kind", 20) << pad("calls", 8) << pad("size", 12)
        << pad("on the wire", 14) << pad("time", 12) << "busbw\n";
    for (const CommTraffic& c : report.communication) {
      out << "    " << pad(c.stream + " " + c.kind, 20) << pad(std::to_string(c.calls), 8)
          << pad(to_string(c.bytes), 12) << pad(to_string(c.wire_bytes), 14)
          << pad(seconds_text(c.time_s), 12)
          << (c.time_s > 0 ? to_string(Bandwidth(c.busbw)) : std::string("-")) << '\n';
    }
  }
  if (!report.links.empty()) {
    out << "\n  busiest links (flow-level network)\n";
    for (const LinkLoad& l : report.links) {
      out << "    " << pad(l.link, 32) << pad(percent_text(l.utilisation), 8) << to_string(l.bytes)
          << " at " << to_string(l.capacity) << '\n';
    }
  }
  print_memory_table(out, report, context);
  print_verdict(out, report);
}

}  // namespace stratasim::traces
