// Compute-communication interference (hw_models/interference.hpp): the rates by hand, and the
// simulator applying them to a compute op and an all-reduce that overlap.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "hw_models/interference.hpp"
#include "sim/helpers.hpp"
#include "sim/simulator.hpp"
#include "traces/export.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using strategies::Collective;
using strategies::CollectiveKind;
using strategies::OpId;
using strategies::OpInfo;
using strategies::Program;
using strategies::Stream;

namespace {

OpInfo on(Stream s) {
  OpInfo info;
  info.stream = s;
  return info;
}

// The test cluster (tests/sim/helpers.hpp) with interference on and no launch overhead:
// 108 SMs, 1 TB/s memory at 50% (B = 500 GB/s), NVLink 100 GB/s with 1 us per message.
hw::ClusterSpec interfering(int units = 16, double traffic = 3.0) {
  hw::ClusterSpec c = testing::test_cluster();
  c.device.kernel_launch_overhead = Time::zero();
  c.interference.enabled = true;
  c.interference.communication_units = units;
  c.interference.memory_traffic_per_byte = traffic;
  return c;
}

// Two ranks; rank 0 runs `work` on its compute stream while both run a 100 MB all-reduce (op
// ids: rank 0's work 0, its all-reduce 1; rank 1's all-reduce 2). A two-member ring all-reduce
// takes 2(n-1)/n S / B + 2(n-1) alpha = 1e8 / 1e11 s + 2 us = 1002 us alone.
Program overlap(const strategies::Kernel& work) {
  Program p(2);
  const auto g = p.add_group({0, 1}, "dp 0");
  const Collective ar{CollectiveKind::all_reduce, DType::bf16, g, Bytes(100'000'000)};
  p.begin_rank(0);
  p.add(strategies::Compute{p.add_kernels({work})}, on(Stream::compute));
  p.add(ar, on(Stream::dp_comm));
  p.begin_rank(1);
  p.add(ar, on(Stream::dp_comm));
  p.finish();
  return p;
}

// 5e9 FLOPs at 1e14 x 0.5 (the test device's bf16 peak and roofline efficiency): 100 us alone.
const strategies::Kernel kCompute100us{strategies::RooflineWork{Flops(5e9), Bytes(0)}, "gemm-like"};
// 1e8 bytes read at B = 500 GB/s: 200 us alone.
const strategies::Kernel kStream200us{strategies::Elementwise{1, Bytes(100'000'000), Bytes(0)},
                                      "elementwise"};

Time ps_of(double us) {
  return Time::ps(static_cast<std::int64_t>(std::llround(us * 1e6)));
}

}  // namespace

TEST_CASE("interference rates by hand") {
  // 24 of 108 SMs held: 84 / 108.
  CHECK(hw::compute_units_rate(24, 108) == doctest::Approx(84.0 / 108.0));
  CHECK(hw::compute_units_rate(0, 108) == 1.0);
  CHECK(hw::compute_units_rate(500, 108) == doctest::Approx(1.0 / 108.0));  // at least one SM
  // 3 x 240 GB/s demanded of 1733 GB/s: 1733 / (1733 + 720).
  CHECK(hw::memory_share_rate(Bandwidth(720e9), Bandwidth(1733e9)) ==
        doctest::Approx(1733.0 / 2453.0));
  CHECK(hw::memory_share_rate(Bandwidth(720e9), Bandwidth(0)) == 1.0);  // not modelled
  // 80% compute-bound, 20% memory-bound: 1 / (0.8 / f_sm + 0.2 / f_hbm).
  const double f_sm = 84.0 / 108.0, f_hbm = 1733.0 / 2453.0;
  CHECK(hw::compute_rate({0.8, 0.2}, f_sm, f_hbm) ==
        doctest::Approx(1.0 / (0.8 / f_sm + 0.2 / f_hbm)));
  // Half unaffected (launches), half compute-bound: 1 / (0.5 + 0.5 / f_sm).
  CHECK(hw::compute_rate({0.5, 0.0}, f_sm, f_hbm) == doctest::Approx(1.0 / (0.5 + 0.5 / f_sm)));
  CHECK(hw::transfer_rate(0.0, 0.5) == 1.0);
  CHECK(hw::transfer_rate(1.0, 0.5) == 0.5);
  CHECK(hw::transfer_rate(0.25, 0.5) == doctest::Approx(1.0 / (0.75 + 0.25 / 0.5)));
}

TEST_CASE("interference: a compute-bound op beside an all-reduce loses the SMs NCCL holds") {
  const Program p = overlap(kCompute100us);
  const auto t = sim::simulate(p, interfering(16));
  REQUIRE(t.completed);
  // f_sm = (108 - 16) / 108: 100 us of work takes 100 x 108 / 92 us. The all-reduce is not
  // slowed (its member computes nothing memory-bound) and ends at 1002 us.
  CHECK(t.spans[0].start == Time::zero());
  CHECK(t.spans[0].end == ps_of(100.0 * 108.0 / 92.0));
  CHECK(t.spans[1].end == Time::us(1002));
  CHECK(t.spans[2].end == Time::us(1002));
  REQUIRE(t.interference.size() == 1);
  CHECK(t.interference[0].op == 0);
  CHECK(t.interference[0].lost == ps_of(100.0 * 108.0 / 92.0 - 100.0));

  // The report: compute lost 17.39 us on rank 0, none on rank 1: 8.70 us mean per rank.
  traces::ReportContext context;
  const auto report = traces::make_report(p, t, context);
  CHECK(report.interference_s[static_cast<std::size_t>(Stream::compute)] ==
        doctest::Approx((100.0 * 108.0 / 92.0 - 100.0) * 1e-6 / 2));
  CHECK(report.interference_s[static_cast<std::size_t>(Stream::dp_comm)] == 0.0);
  const auto json = traces::to_json(report, context);
  CHECK(json.at("interference_s").at("compute").get<double>() ==
        doctest::Approx((100.0 * 108.0 / 92.0 - 100.0) * 1e-6 / 2));
}

TEST_CASE("interference: a memory-bound op and an all-reduce share device memory") {
  const Program p = overlap(kStream200us);
  const auto t = sim::simulate(p, interfering(16, 3.0));
  REQUIRE(t.completed);
  // The transfer demands D = 3 x 100 GB/s of B = 500 GB/s: f_hbm = 500 / 800 = 0.625. The
  // elementwise op (all memory-bound) runs at 0.625: 200 us of work takes 320 us. The
  // all-reduce runs at 0.625 while rank 0 computes: by 320 us it has done 200 us of its 1002;
  // the other 802 us at full speed end it at 1122 us.
  CHECK(t.spans[0].end == Time::us(320));
  CHECK(t.spans[1].start == Time::zero());
  CHECK(t.spans[1].end == Time::us(1122));
  CHECK(t.spans[2].end == Time::us(1122));
  traces::ReportContext context;
  const auto report = traces::make_report(p, t, context);
  // Lost: compute 120 us on rank 0 (mean 60 us); the all-reduce 120 us on both ranks.
  CHECK(report.interference_s[static_cast<std::size_t>(Stream::compute)] == doctest::Approx(60e-6));
  CHECK(report.interference_s[static_cast<std::size_t>(Stream::dp_comm)] ==
        doctest::Approx(120e-6));

  // The Chrome trace (Perfetto) carries each slowed op's loss: 120 us for rank 0's elementwise
  // op and for both all-reduce calls.
  std::ostringstream out;
  traces::write_chrome_trace(out, p, t);
  const auto trace = nlohmann::json::parse(out.str());
  int slowed = 0;
  for (const auto& event : trace.at("traceEvents")) {
    if (event.value("ph", "") != "X") continue;
    const auto& args = event.at("args");
    if (!args.contains("interference_us")) continue;
    CHECK(args.at("interference_us").get<double>() == doctest::Approx(120.0));
    ++slowed;
  }
  CHECK(slowed == 3);
}

TEST_CASE("interference off reproduces free overlap, and runs are deterministic") {
  hw::ClusterSpec off = interfering();
  off.interference.enabled = false;
  const Program p = overlap(kStream200us);
  const auto t = sim::simulate(p, off);
  CHECK(t.spans[0].end == Time::us(200));
  CHECK(t.spans[1].end == Time::us(1002));
  CHECK(t.interference.empty());

  const auto a = sim::simulate(p, interfering());
  const auto b = sim::simulate(p, interfering());
  REQUIRE(a.spans.size() == b.spans.size());
  for (std::size_t i = 0; i < a.spans.size(); ++i) {
    CHECK(a.spans[i].start == b.spans[i].start);
    CHECK(a.spans[i].end == b.spans[i].end);
  }
  // No communication units and no memory traffic: nothing to lose.
  const auto none = sim::simulate(overlap(kCompute100us), interfering(0, 0.0));
  CHECK(none.spans[0].end == Time::us(100));
  CHECK(none.interference.empty());
  // A measured kernel (a replayed trace) already holds the interference it met: not slowed.
  const strategies::Kernel measured{strategies::Measured{Time::us(100)}, "measured"};
  const auto replayed = sim::simulate(overlap(measured), interfering());
  CHECK(replayed.spans[0].end == Time::us(100));
}

TEST_CASE("interference: compute that starts after the transfer ended is not slowed") {
  // Rank 0's work depends on its all-reduce: they never overlap.
  Program p(2);
  const auto g = p.add_group({0, 1}, "dp 0");
  const Collective ar{CollectiveKind::all_reduce, DType::bf16, g, Bytes(100'000'000)};
  p.begin_rank(0);
  const OpId c = p.add(ar, on(Stream::dp_comm));
  p.add(strategies::Compute{p.add_kernels({kCompute100us})}, on(Stream::compute),
        std::vector<OpId>{c});
  p.begin_rank(1);
  p.add(ar, on(Stream::dp_comm));
  p.finish();
  const auto t = sim::simulate(p, interfering());
  CHECK(t.spans[1].start == Time::us(1002));
  CHECK(t.spans[1].end == Time::us(1102));
  CHECK(t.interference.empty());
}

TEST_CASE("interference on the flow network: a lone transfer slows as on the analytical one") {
  // No link latency, so that the transfer is all bandwidth time: the two-member all-reduce
  // takes 2(n-1)/n S / B = 1e8 / 1e11 s = 1000 us alone on either network. Beside the 200 us
  // memory-bound op it runs at f_hbm = 500 / (500 + 3 x 100) = 0.625 (interference.hpp:
  // transfer_rate(1, f_hbm)), the op too: the op ends at 320 us, the all-reduce has done
  // 0.625 x 320 = 200 us of its work by then and ends 800 us later, at 1120 us.
  hw::ClusterSpec analytical = interfering(16, 3.0);
  analytical.intra_node.latency = Time::zero();
  hw::ClusterSpec flow = analytical;
  flow.network_model = hw::NetworkModel::flow;
  flow.interference.flow_transfers = true;
  const Program p = overlap(kStream200us);
  const auto a = sim::simulate(p, analytical);
  const auto f = sim::simulate(p, flow);
  REQUIRE(a.completed);
  REQUIRE(f.completed);
  // The flows' completions round up to the picosecond: equal within a few.
  for (const auto* t : {&a, &f}) {
    CHECK(t->spans[0].end == Time::us(320));
    CHECK(std::abs((t->spans[1].end - Time::us(1120)).picoseconds()) <= 2);
    CHECK(std::abs((t->spans[2].end - Time::us(1120)).picoseconds()) <= 2);
  }
  // Deterministic: the same inputs, the same picoseconds.
  const auto again = sim::simulate(p, flow);
  for (std::size_t i = 0; i < f.spans.size(); ++i) CHECK(again.spans[i].end == f.spans[i].end);

  // Without flow_transfers (the default) the flow network slows only the compute: the
  // all-reduce ends at 1000 us.
  flow.interference.flow_transfers = false;
  const auto unslowed = sim::simulate(p, flow);
  CHECK(unslowed.spans[0].end == Time::us(320));
  CHECK(std::abs((unslowed.spans[1].end - Time::us(1000)).picoseconds()) <= 2);
  // ... and reports no loss for the all-reduce, which did not slow: only the op's 120 us.
  REQUIRE(unslowed.interference.size() == 1);
  CHECK(unslowed.interference[0].op == 0);
  CHECK(unslowed.interference[0].lost == Time::us(120));
}

TEST_CASE("interference: collectives.max_channels caps the SMs communication holds") {
  // communication_units 16, NCCL_MAX_NCHANNELS 4: the collective holds 4 of 108 SMs, so the
  // 100 us compute-bound op takes 100 x 108 / 104 us beside it (16 SMs: 100 x 108 / 92 us).
  hw::ClusterSpec c = interfering(16);
  c.collectives.max_channels = 4;
  CHECK(hw::communication_units(c) == 4);
  const auto t = sim::simulate(overlap(kCompute100us), c);
  CHECK(t.spans[0].end == ps_of(100.0 * 108.0 / 104.0));
  // A limit above communication_units changes nothing.
  c.collectives.max_channels = 32;
  CHECK(hw::communication_units(c) == 16);
  CHECK(sim::simulate(overlap(kCompute100us), c).spans[0].end == ps_of(100.0 * 108.0 / 92.0));
}
