// Issue 19's lean exact mode: the report computed by an observer while the run goes
// (traces/span_statistics.hpp) equals the report computed from every stored span; spans are
// kept for the traced ranks only; 1D tensor-parallel mirroring in study::simulate gives the
// same report as simulating every tensor-parallel rank, and --trace-ranks turns it off where a
// traced rank would be a mirror.
//
// Expected values: the reports of the unreduced paths (every span stored, every rank simulated),
// which this change does not touch, and hand-computed interval measures below.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "experiment_helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/program.hpp"
#include "study/study.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"
#include "traces/span_statistics.hpp"
#include "traces/timeline.hpp"

using namespace stratasim;
using stratasim::testing::cli;

namespace {

strategies::Experiment shipped(const std::string& name,
                               std::vector<strategies::Override> overrides = {}) {
  return strategies::load_experiment(testing::configs_dir() / ("experiments/" + name + ".json"),
                                     std::move(overrides));
}

std::string json_of(const traces::Report& report, const traces::ReportContext& context) {
  return traces::to_json(report, context).dump(1);
}

// The report from every stored span, and the one from an observer on a run that stores the
// spans of rank 0 only.
std::pair<std::string, std::string> both_reports(const strategies::Experiment& e, bool mirror) {
  auto program = study::lower(e, {.mirror_data_parallel = mirror});
  const auto context = traces::report_context(e);
  sim::SimOptions all;
  all.overheads = study::memory_overheads(e);
  const auto stored = sim::simulate(program, e.cluster, all);
  REQUIRE(stored.spans.size() == program.op_count());

  traces::SpanStatistics stats(program);
  struct Feed : sim::Observer {
    traces::SpanStatistics* stats = nullptr;
    void on_span(const traces::Span& s) override { stats->add(s); }
  } feed;
  feed.stats = &stats;
  sim::SimOptions lean = all;
  lean.span_ranks = {0};
  lean.observers = {&feed};
  const auto observed = sim::simulate(program, e.cluster, lean);
  // Rank 0's spans only, in op order.
  CHECK(observed.spans.size() == program.ops_of(0).size());
  for (std::size_t i = 0; i < observed.spans.size(); ++i) {
    CHECK(observed.spans[i].rank == 0);
    CHECK(observed.spans[i].op == stored.spans[i].op);
    CHECK(observed.spans[i].end == stored.spans[i].end);
  }
  return {json_of(traces::make_report(program, stored, context), context),
          json_of(traces::make_report(program, observed, stats, context), context)};
}

}  // namespace

TEST_CASE("the lean layouts: Op 48 bytes, Span 24, MemoryEffect 12") {
  // Also static_asserts in the headers; here so that a change shows in the test log.
  CHECK(sizeof(strategies::Op) == 48);
  CHECK(sizeof(strategies::Work) == 18);
  CHECK(sizeof(traces::Span) == 24);
  CHECK(sizeof(strategies::MemoryEffect) == 12);
  // The packed fields read back what was stored.
  strategies::Op op;
  op.work = strategies::Collective{strategies::CollectiveKind::all_gather, DType::fp8, 7,
                                   Bytes(0x123456789ABCLL), 24};
  const auto& c = std::get<strategies::Collective>(op.work);
  CHECK(c.bytes == Bytes(0x123456789ABCLL));
  CHECK(c.group == 7u);
  CHECK(c.sms == 24);
  const traces::Span span{traces::kMaxSpanRanks - 1, strategies::Stream::pp_recv, 5, Time::ps(1),
                          Time::ps(2)};
  CHECK(span.rank == (1 << 23) - 1);
  CHECK(span.stream == strategies::Stream::pp_recv);
}

TEST_CASE("an interval union: measures by hand, in any order, and overlaps counted once more") {
  traces::IntervalUnion u;
  std::vector<traces::IntervalUnion::Interval> overlap;
  u.add(10, 20, &overlap);
  u.add(30, 40, &overlap);
  u.add(20, 25, &overlap);  // touches [10, 20): joined
  u.add(5, 8, &overlap);    // before everything
  u.add(35, 50, &overlap);  // overlaps [30, 40) on [35, 40)
  u.add(7, 7, &overlap);    // empty: nothing
  CHECK(u.intervals() == std::vector<traces::IntervalUnion::Interval>{{5, 8}, {10, 25}, {30, 50}});
  CHECK(overlap == std::vector<traces::IntervalUnion::Interval>{{35, 40}});
  // Within [9, 35): [10, 25) and [30, 35) = 15 + 5.
  CHECK(u.measure_within(9, 35) == 20);
  traces::IntervalUnion v;
  v.add(0, 12);
  v.add(22, 32);
  // u minus v: [5,8) all covered; [10,25) minus [10,12) and [22,25) = 10; [30,50) minus [30,32)
  // = 18.
  CHECK(traces::measure_minus(u, v) == 28);
}

TEST_CASE("the report from an observer equals the report from every stored span") {
  struct Case {
    const char* experiment;
    std::vector<strategies::Override> overrides;
  };
  const std::vector<Case> cases = {
      {"gpt3-1.7b-a100-8", {}},
      {"llama2-7b-h100-8", {}},
      {"gpt3-1.7b-zb-h1-a100-8", {}},
      {"gpt3-18.4b-interleaved-a100-64", {}},
      // Overlapping iterations: the steady-state period and per-rank windows.
      {"gpt3-1.7b-a100-8", {cli("parallelism.schedule", "pipedream-2bw")}},
      // Interference and ZeRO-3 with offload.
      {"gpt3-1.7b-a100-8", {cli("cluster.interference.enabled", true)}},
      {"gpt3-1.7b-a100-8", {cli("parallelism.zero", 3), cli("parallelism.recompute", "full")}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.experiment);
    CAPTURE(c.overrides.size());
    const auto e = shipped(c.experiment, c.overrides);
    for (bool mirror : {false, true}) {
      CAPTURE(mirror);
      const auto [stored, observed] = both_reports(e, mirror);
      CHECK(observed == stored);
    }
  }
}

TEST_CASE("the span figures do not depend on the order the spans come in") {
  const auto e = shipped("gpt3-1.7b-a100-8");
  auto program = study::lower(e, {.mirror_data_parallel = false});
  const auto context = traces::report_context(e);
  auto timeline = sim::simulate(program, e.cluster);
  const std::string in_order = json_of(traces::make_report(program, timeline, context), context);
  traces::SpanStatistics shuffled(program);
  auto spans = timeline.spans;
  std::mt19937 random(19);
  std::shuffle(spans.begin(), spans.end(), random);
  for (const auto& s : spans) shuffled.add(s);
  CHECK(json_of(traces::make_report(program, timeline, shuffled, context), context) == in_order);
}

TEST_CASE("tensor-parallel mirroring in simulate reports what simulating every tp rank reports") {
  for (const char* name : {"gpt3-1.7b-zb-h1-a100-8", "gpt3-22b-korthikanti-a100-8",
                           "llama2-7b-h100-8", "gpt3-18.4b-a100-64", "gpt3-175b-a100-1024"}) {
    CAPTURE(name);
    const auto e = shipped(name);
    study::Options plain;
    plain.mirror_tensor_parallel = false;
    plain.trace_ranks = "stages";
    plain.spans_of_traced_ranks_only = true;
    plain.max_memory = Bytes(0);
    study::Options tp = plain;
    tp.mirror_tensor_parallel = true;
    const auto a = study::simulate(e, plain);
    const auto b = study::simulate(e, tp);
    const int tp_degree = strategies::layout_of(a.experiment).tp;
    REQUIRE(tp_degree > 1);
    // The tp ranks of one replica are lowered once: 1/tp of the ops.
    CHECK(b.program.op_count() * static_cast<std::size_t>(tp_degree) == a.program.op_count());
    CHECK(json_of(b.report, b.context) == json_of(a.report, a.context));
    // The traced ranks (tp 0 of every stage) issue their ops and keep their spans either way.
    CHECK(b.timeline.spans.size() == a.timeline.spans.size());
  }
}

TEST_CASE("--trace-ranks naming a tensor-parallel mirror keeps that rank simulated") {
  const auto e = shipped("llama2-7b-h100-8");
  const auto layout = strategies::layout_of(e);
  REQUIRE(layout.tp > 1);
  const int mirror = layout.rank(1, 0, 0);  // tp index 1 of replica 0, stage 0
  study::Options options;
  options.spans_of_traced_ranks_only = true;
  options.max_memory = Bytes(0);
  options.trace_ranks = "stages";
  CHECK(study::effective_options(e, options).mirror_tensor_parallel);
  options.trace_ranks = std::to_string(mirror);
  CHECK_FALSE(study::effective_options(e, options).mirror_tensor_parallel);
  options.trace_ranks = "all";
  CHECK_FALSE(study::effective_options(e, options).mirror_tensor_parallel);

  options.trace_ranks = std::to_string(mirror);
  const auto r = study::simulate(e, options);
  CHECK(r.program.issues_ops(mirror));
  REQUIRE_FALSE(r.timeline.spans.empty());
  for (const auto& s : r.timeline.spans) CHECK(s.rank == mirror);
  CHECK(r.timeline.spans.size() == r.program.ops_of(mirror).size());
  // The same report as with every tp rank mirrored and rank 0 traced.
  options.trace_ranks = "stages";
  const auto mirrored = study::simulate(e, options);
  CHECK(mirrored.program.op_count() < r.program.op_count());
  CHECK(json_of(mirrored.report, mirrored.context) == json_of(r.report, r.context));
}
