// Whole-path checks against published closed forms: pipeline schedules lowered by the real
// assembly, simulated by the real engine, measured by the real report.
#include <doctest/doctest.h>

#include "reference/helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "strategies/schedule.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

hw::ClusterSpec free_network_cluster(int devices) {
  return stratasim::testing::pipeline_test_cluster(devices);
}

// Every stage takes t_f forward and t_b backward per microbatch; boundaries carry 0 bytes.
PipelineSpec uniform_pipeline(ScheduleKind kind, int p, int m, Time tf, Time tb) {
  PipelineSpec spec;
  spec.layout = RankLayout{1, 1, p};
  spec.schedule = kind;
  spec.microbatches = m;
  for (int s = 0; s < p; ++s) {
    StagePlan plan;
    Segment f, b;
    f.kernels = {Kernel{Measured{tf}, "forward"}};
    f.label = "forward";
    b.kernels = {Kernel{Measured{tb}, "backward"}};
    b.label = "backward";
    plan.forward = {f};
    plan.backward = {b};
    spec.stages.push_back(plan);
  }
  return spec;
}

traces::Report run(const PipelineSpec& spec) {
  auto program = assemble_pipeline(spec);
  validate(program);
  auto timeline = sim::simulate(program, free_network_cluster(spec.layout.world_size()));
  REQUIRE(timeline.completed);
  traces::ReportContext context;
  context.device_peak = FlopRate(100e12);
  context.device_capacity = Bytes(80LL << 30);
  return traces::make_report(program, timeline, context);
}

}  // namespace

TEST_CASE("GPipe and 1F1B pipeline time is (m + p - 1)(t_f + t_b) with uniform stages") {
  // megatron-bubble-formulas batch_time_eq1 and gpipe-formulas: with free communication both
  // schedules take (m + p - 1)(t_f + t_b); the idle fraction of that time is
  // (p - 1)/(m + p - 1) (GPipe's definition, which report.bubble_fraction uses), i.e.
  // (p - 1)/m of the ideal time (Megatron's definition).
  const Time tf = Time::us(300), tb = Time::us(700);
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, p, 2 * p, 4 * p + 1}) {
        CAPTURE(static_cast<int>(kind));
        CAPTURE(p);
        CAPTURE(m);
        auto report = run(uniform_pipeline(kind, p, m, tf, tb));
        const double expected = (m + p - 1) * (tf + tb).seconds();
        CHECK(report.pipeline_time_s == doctest::Approx(expected).epsilon(1e-12));
        CHECK(report.bubble_fraction ==
              doctest::Approx(static_cast<double>(p - 1) / (m + p - 1)).epsilon(1e-9));
      }
    }
  }
  // The worked example of the reference: p = 4, m = 8 gives (p - 1)/m = 0.375 of ideal time.
  auto report = run(uniform_pipeline(ScheduleKind::one_f_one_b, 4, 8, tf, tb));
  const double ideal = 8 * (tf + tb).seconds();
  CHECK((report.pipeline_time_s - ideal) / ideal == doctest::Approx(0.375));
}

TEST_CASE("a simulated ring all-reduce takes the nccl-tests ideal time") {
  // nccl-busbw-factors: t = (S/B) * 2(n-1)/n for an all-reduce, plus 2(n-1) latencies.
  const int n = 8;
  const Bytes size(1LL << 30);
  hw::ClusterSpec cluster = free_network_cluster(n);
  cluster.intra_node = {Bandwidth(300e9), Time::us(2)};
  Program program(n);
  std::vector<std::int32_t> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(r);
  auto group = program.add_group(ranks, "all");
  for (int r = 0; r < n; ++r) {
    program.begin_rank(r);
    OpInfo info;
    info.stream = Stream::dp_comm;
    program.add(Collective{CollectiveKind::all_reduce, DType::bf16, group, size}, info);
  }
  program.finish();
  auto timeline = sim::simulate(program, cluster);
  REQUIRE(timeline.completed);
  const double expected =
      2.0 * (n - 1) / n * static_cast<double>(size.count()) / 300e9 + 2 * (n - 1) * 2e-6;
  for (const auto& span : timeline.spans) {
    CHECK((span.end - span.start).seconds() == doctest::Approx(expected).epsilon(1e-9));
  }
}
