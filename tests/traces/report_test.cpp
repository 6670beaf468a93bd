// The report: every expected value below is worked out by hand in the comments.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>

#include "traces/helpers.hpp"
#include "traces/report.hpp"

namespace {

using namespace stratasim;
using strategies::Attention;
using strategies::Collective;
using strategies::CollectiveKind;
using strategies::Compute;
using strategies::Kernel;
using strategies::OptimizerStep;
using strategies::Phase;
using strategies::Program;
using strategies::Recv;
using strategies::Send;
using strategies::Stream;
using testing::approx;
using testing::gemm;
using testing::info;
using testing::span_us;
using traces::Timeline;

// Two ranks. Kernel lists (matmul FLOPs = 2 m n k batch; attention 4 b h sq skv d):
//   A = {gemm 64x32x16, gemm 10x10x10 batch 3}: 65536 + 6000 = 71536
//   B = {attention b1 h2 4x4 d8, forward}:      4*1*2*4*4*8 = 1024
//   C = {optimizer step}:                       0
//   D = {gemm 8x8x8}:                           1024 (phase other: hardware flops only)
// rank 0: op0 fwd A [0,10]us, op1 bwd A [20,40], op2 bwd all-reduce on dp-comm [35,50],
//         op3 opt C [50,60], op4 opt C [60,65]
// rank 1: op5 fwd B [5,15], op6 bwd A [15,30], op7 other D [30,32], op8 opt C [40,70]
struct TwoRanks {
  Program program{2};
  Timeline timeline;
  traces::ReportContext context;

  TwoRanks() {
    auto a = program.add_kernels({gemm(64, 32, 16), gemm(10, 10, 10, 3)});
    auto b = program.add_kernels(
        {Kernel{Attention{1, 2, 2, 4, 4, 8, true, DType::bf16, false}, "attention"}});
    auto c = program.add_kernels({Kernel{OptimizerStep{1000}, "adam"}});
    auto d = program.add_kernels({gemm(8, 8, 8)});
    auto dp = program.add_group({0, 1}, "dp 0");
    program.begin_rank(0);
    program.add(Compute{a}, info(Stream::compute, Phase::forward));
    program.add(Compute{a}, info(Stream::compute, Phase::backward));
    program.add(Collective{CollectiveKind::all_reduce, DType::bf16, dp, Bytes(1 << 20)},
                info(Stream::dp_comm, Phase::backward));
    program.add(Compute{c}, info(Stream::compute, Phase::optimizer));
    program.add(Compute{c}, info(Stream::compute, Phase::optimizer));
    program.begin_rank(1);
    program.add(Compute{b}, info(Stream::compute, Phase::forward));
    program.add(Compute{a}, info(Stream::compute, Phase::backward));
    program.add(Compute{d}, info(Stream::compute, Phase::other));
    program.add(Compute{c}, info(Stream::compute, Phase::optimizer));
    program.finish();

    timeline.world_size = 2;
    timeline.spans = {
        span_us(0, Stream::compute, 0, 0, 10),  span_us(0, Stream::compute, 1, 20, 40),
        span_us(0, Stream::dp_comm, 2, 35, 50), span_us(0, Stream::compute, 3, 50, 60),
        span_us(0, Stream::compute, 4, 60, 65), span_us(1, Stream::compute, 5, 5, 15),
        span_us(1, Stream::compute, 6, 15, 30), span_us(1, Stream::compute, 7, 30, 32),
        span_us(1, Stream::compute, 8, 40, 70)};
    timeline.ranks.resize(2);

    context.experiment = "two-ranks";
    context.samples_per_iteration = 70;
    context.tokens_per_iteration = 7000;
    context.device_peak = FlopRate(1e9);
    context.device_capacity = Bytes(1000);
    context.stage_of_rank = {0, 1};
  }
};

}  // namespace

TEST_CASE("report: iteration, pipeline and optimizer times") {
  TwoRanks f;
  auto r = traces::make_report(f.program, f.timeline, f.context);
  CHECK(r.completed);
  CHECK(r.iteration_time_s == approx(70e-6));  // 0 .. 70 us
  CHECK(r.pipeline_time_s == approx(50e-6));   // fwd at 0 .. bwd all-reduce ends at 50
  CHECK(r.optimizer_time_s == approx(30e-6));  // rank 0: 10 + 5, rank 1: 30
  CHECK(r.tokens_per_s == approx(1e8));        // 7000 / 70 us
  CHECK(r.samples_per_s == approx(1e6));       // 70 / 70 us
}

TEST_CASE("report: model and hardware flops, TFLOP/s, MFU and HFU") {
  TwoRanks f;
  auto r = traces::make_report(f.program, f.timeline, f.context);
  // model: A (op0) + A (op1) + B (op5) + A (op6) = 3 * 71536 + 1024; hardware adds D = 1024.
  CHECK(r.model_flops_per_iteration == 215632.0);
  CHECK(r.hardware_flops_per_iteration == 216656.0);
  // 215632 / 70e-6 s / 2 devices / 1e12
  CHECK(r.model_tflops_per_device == approx(215632.0 / 70e-6 / 2 / 1e12));
  // 215632 / (70e-6 * 2 * 1e9) = 1.54022857...
  CHECK(r.mfu == approx(1.5402285714));
  CHECK(r.hfu == approx(216656.0 / 140000.0));

  SUBCASE("no peak gives zero utilisation, not infinity") {
    f.context.device_peak = FlopRate(0);
    auto z = traces::make_report(f.program, f.timeline, f.context);
    CHECK(z.mfu == 0);
    CHECK(z.hfu == 0);
  }
}

TEST_CASE("report: pipeline bubble on two ranks") {
  TwoRanks f;
  auto r = traces::make_report(f.program, f.timeline, f.context);
  // window [0, 50] us. rank 0 busy fwd/bwd on compute: 10 + 20 = 30; rank 1: 10 + 15 = 25.
  REQUIRE(r.ranks.size() == 2);
  CHECK(r.ranks[0].compute_busy_s == approx(30e-6));
  CHECK(r.ranks[1].compute_busy_s == approx(25e-6));
  CHECK(r.bubble_fraction == approx(1 - (0.6 + 0.5) / 2));

  SUBCASE("busy time is clipped to the pipeline window") {
    // rank 1's forward now runs [45, 60] us, past the last backward end (50): it counts 5 us.
    f.timeline.spans[5] = span_us(1, Stream::compute, 5, 45, 60);
    auto c = traces::make_report(f.program, f.timeline, f.context);
    CHECK(c.pipeline_time_s == approx(50e-6));  // [0, 50] still
    CHECK(c.ranks[0].compute_busy_s == approx(30e-6));
    CHECK(c.ranks[1].compute_busy_s == approx(20e-6));  // 5 + 15
    CHECK(c.bubble_fraction == approx(1 - (30.0 + 20.0) / 2 / 50));
  }
}

TEST_CASE(
    "report: \"pipeline bubble\" is printed with pp = 1 (issue 18): now compute idle, no bubble") {
  // The same two ranks as data-parallel replicas of one stage: no pipeline, so no bubble; the
  // compute stream's idle share is still 1 - (30 + 25) / 2 / 50 (waiting on communication).
  TwoRanks f;
  f.context.stage_of_rank = {0, 0};
  auto r = traces::make_report(f.program, f.timeline, f.context);
  CHECK(r.bubble_fraction == 0);
  CHECK(r.compute_idle_fraction == approx(1 - (0.6 + 0.5) / 2));
  std::ostringstream text;
  traces::print_summary(text, r, f.context);
  CHECK(text.str().find("pipeline bubble") == std::string::npos);
  CHECK(text.str().find("compute idle") != std::string::npos);
  // With two stages both say the same.
  f.context.stage_of_rank = {0, 1};
  auto p = traces::make_report(f.program, f.timeline, f.context);
  CHECK(p.bubble_fraction == approx(1 - (0.6 + 0.5) / 2));
  CHECK(p.compute_idle_fraction == p.bubble_fraction);
}

TEST_CASE("report: exposed communication") {
  Program p(2);
  auto k = p.add_kernels({gemm(1, 1, 1)});
  auto g = p.add_group({0, 1}, "tp 0");
  Collective ar{CollectiveKind::all_reduce, DType::bf16, g, Bytes(64)};
  p.begin_rank(0);
  for (int i = 0; i < 3; ++i) p.add(Compute{k}, info(Stream::compute, Phase::forward));  // 0-2
  p.add(ar, info(Stream::tp_comm, Phase::forward));                                      // 3
  p.add(ar, info(Stream::dp_comm, Phase::backward));                                     // 4
  p.add(Send{1, Bytes(8)}, info(Stream::pp_send, Phase::forward));                       // 5
  p.add(Recv{1, Bytes(8)}, info(Stream::pp_recv, Phase::backward));                      // 6
  p.add(Compute{k}, info(Stream::copy, Phase::other));                                   // 7
  p.begin_rank(1);
  p.add(Compute{k}, info(Stream::compute, Phase::forward));  // 8
  p.add(ar, info(Stream::tp_comm, Phase::forward));          // 9
  p.add(ar, info(Stream::dp_comm, Phase::backward));         // 10
  p.finish();

  Timeline t;
  t.world_size = 2;
  // rank 0: compute [0,10] [20,30] [52,53]; tp [5,15] and dp [12,25] overlap: comm union
  //   [5,25], exposed [10,20] = 10. send [40,50] and recv [45,55]: union [40,55] minus the
  //   compute [52,53] = 14. The copy stream [60,70] is not communication. Total 24 us.
  // rank 1: compute [0,100] covers tp [10,20] and dp [30,40]: 0.
  t.spans = {span_us(0, Stream::compute, 0, 0, 10),  span_us(0, Stream::compute, 1, 20, 30),
             span_us(0, Stream::compute, 2, 52, 53), span_us(0, Stream::tp_comm, 3, 5, 15),
             span_us(0, Stream::dp_comm, 4, 12, 25), span_us(0, Stream::pp_send, 5, 40, 50),
             span_us(0, Stream::pp_recv, 6, 45, 55), span_us(0, Stream::copy, 7, 60, 70),
             span_us(1, Stream::compute, 8, 0, 100), span_us(1, Stream::tp_comm, 9, 10, 20),
             span_us(1, Stream::dp_comm, 10, 30, 40)};
  traces::ReportContext ctx;

  SUBCASE("spans in op order") {
    auto r = traces::make_report(p, t, ctx);
    CHECK(r.ranks[0].exposed_comm_s == approx(24e-6));
    CHECK(r.ranks[1].exposed_comm_s == 0.0);
    CHECK(r.exposed_comm_s == approx(12e-6));
    // The copy stream's [60,70] on rank 0 runs beside no compute: 10 us exposed; rank 1 has no
    // copies. Mean 5 us.
    CHECK(r.ranks[0].exposed_copy_s == approx(10e-6));
    CHECK(r.ranks[1].exposed_copy_s == 0.0);
    CHECK(r.exposed_copy_s == approx(5e-6));
  }
  SUBCASE("a copy beside compute is hidden up to the compute's end") {
    t.spans.push_back(span_us(0, Stream::compute, 2, 58, 65));  // covers [60,65] of the copy
    auto r = traces::make_report(p, t, ctx);
    CHECK(r.ranks[0].exposed_copy_s == approx(5e-6));
  }
  SUBCASE("spans in any order (an incomplete or imported timeline)") {
    std::reverse(t.spans.begin(), t.spans.end());
    t.completed = false;
    auto r = traces::make_report(p, t, ctx);
    CHECK(r.ranks[0].exposed_comm_s == approx(24e-6));
    CHECK(r.exposed_comm_s == approx(12e-6));
  }
  SUBCASE("communication with no compute at all is fully exposed") {
    t.spans = {span_us(1, Stream::tp_comm, 9, 10, 20), span_us(1, Stream::dp_comm, 10, 15, 40)};
    auto r = traces::make_report(p, t, ctx);
    CHECK(r.ranks[0].exposed_comm_s == 0);
    CHECK(r.ranks[1].exposed_comm_s == approx(30e-6));
    CHECK(r.exposed_comm_s == approx(15e-6));
  }
}

TEST_CASE("report: memory peaks, fits and stages") {
  TwoRanks f;
  f.timeline.ranks[0].tiers[0].peak = Bytes(600);
  f.timeline.ranks[0].tiers[0].breakdown[0] = Bytes(400);  // parameters
  f.timeline.ranks[0].tiers[0].breakdown[3] = Bytes(200);  // activations
  f.timeline.ranks[1].tiers[0].peak = Bytes(1500);
  f.timeline.ranks[1].tiers[0].breakdown[2] = Bytes(1500);  // optimizer states
  f.timeline.ranks[1].tiers[1].peak = Bytes(99999);         // host: not the device peak

  SUBCASE("everything fits") {
    auto r = traces::make_report(f.program, f.timeline, f.context);
    CHECK(r.peak_memory == Bytes(1500));
    CHECK(r.fits);
    CHECK(r.ranks[0].peak_memory == Bytes(600));
    CHECK(r.ranks[0].breakdown[0] == Bytes(400));
    CHECK(r.ranks[0].breakdown[3] == Bytes(200));
    CHECK(r.ranks[1].breakdown[2] == Bytes(1500));
    CHECK(r.ranks[0].stage == 0);
    CHECK(r.ranks[1].stage == 1);
    CHECK(r.ranks[0].fits);
    CHECK(r.ranks[1].fits);
  }
  SUBCASE("an out-of-memory entry marks its rank") {
    f.timeline.out_of_memory.push_back(traces::OutOfMemory{
        1, strategies::MemoryTier::device, Bytes(1000), Bytes(1500), 8, Time::us(40)});
    auto r = traces::make_report(f.program, f.timeline, f.context);
    CHECK_FALSE(r.fits);
    CHECK(r.ranks[0].fits);
    CHECK_FALSE(r.ranks[1].fits);
    REQUIRE(r.out_of_memory.size() == 1);
    CHECK(r.out_of_memory[0].first_op == 8);
  }
  SUBCASE("a short stage list means stage 0") {
    f.context.stage_of_rank = {3};
    auto r = traces::make_report(f.program, f.timeline, f.context);
    CHECK(r.ranks[0].stage == 3);
    CHECK(r.ranks[1].stage == 0);
  }
}

TEST_CASE("report: incomplete and empty timelines") {
  TwoRanks f;
  SUBCASE("deadlocked after the forward pass: figures over the spans that exist") {
    f.timeline.completed = false;
    f.timeline.problem = "deadlock: rank 1 waits for op 2";
    f.timeline.spans = {span_us(0, Stream::compute, 0, 0, 10),
                        span_us(1, Stream::compute, 5, 5, 15)};
    auto r = traces::make_report(f.program, f.timeline, f.context);
    CHECK_FALSE(r.completed);
    CHECK(r.problem == "deadlock: rank 1 waits for op 2");
    CHECK(r.iteration_time_s == approx(15e-6));
    CHECK(r.pipeline_time_s == 0);  // no backward span
    CHECK(r.bubble_fraction == 0);
    CHECK(r.model_flops_per_iteration == 215632.0);  // from the program, not the spans
  }
  SUBCASE("no spans at all") {
    f.timeline.spans.clear();
    auto r = traces::make_report(f.program, f.timeline, f.context);
    CHECK(r.iteration_time_s == 0);
    CHECK(r.tokens_per_s == 0);
    CHECK(r.mfu == 0);
    CHECK(r.bubble_fraction == 0);
    CHECK(r.exposed_comm_s == 0);
    CHECK(r.ranks.size() == 2);
  }
  SUBCASE("a span of an op the program lacks is an error") {
    f.timeline.spans.push_back(span_us(0, Stream::compute, 99, 0, 1));
    CHECK_THROWS_AS(traces::make_report(f.program, f.timeline, f.context), std::invalid_argument);
  }
}

TEST_CASE("report: to_json has exactly the documented keys") {
  TwoRanks f;
  f.timeline.ranks[1].tiers[0].peak = Bytes(1500);
  f.timeline.out_of_memory.push_back(traces::OutOfMemory{
      1, strategies::MemoryTier::device, Bytes(1000), Bytes(1500), 8, Time::us(40)});
  auto r = traces::make_report(f.program, f.timeline, f.context);
  auto j = traces::to_json(r, f.context);

  std::set<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.insert(key);
  CHECK(keys == std::set<std::string>{"iteration_time_s",
                                      "pipeline_time_s",
                                      "optimizer_time_s",
                                      "tokens_per_s",
                                      "samples_per_s",
                                      "model_flops_per_iteration",
                                      "hardware_flops_per_iteration",
                                      "model_tflops_per_device",
                                      "mfu",
                                      "hfu",
                                      "bubble_fraction",
                                      "compute_idle_fraction",
                                      "exposed_comm_s",
                                      "exposed_copy_s",
                                      "figures",
                                      "interference_s",
                                      "peak_memory_bytes",
                                      "fits",
                                      "ranks",
                                      "experiment",
                                      "completed",
                                      "problem",
                                      "out_of_memory",
                                      "stopped_on_oom",
                                      "communication",
                                      "links"});
  CHECK(j["experiment"] == "two-ranks");
  CHECK(j["completed"] == true);
  CHECK(j["problem"] == "");
  CHECK(j["fits"] == false);
  CHECK(j["iteration_time_s"].is_number_float());
  CHECK(j["peak_memory_bytes"].is_number_integer());
  CHECK(j["peak_memory_bytes"] == 1500);
  CHECK(j["model_flops_per_iteration"].get<double>() == 215632.0);

  REQUIRE(j["ranks"].size() == 2);
  std::set<std::string> rank_keys;
  for (const auto& [key, value] : j["ranks"][1].items()) rank_keys.insert(key);
  CHECK(rank_keys == std::set<std::string>{"rank", "stage", "peak_memory_bytes", "memory_breakdown",
                                           "fits", "peak_time_s", "peak_at",
                                           "host_peak_memory_bytes", "nvme_peak_memory_bytes"});
  CHECK(j["ranks"][1]["stage"] == 1);
  CHECK(j["ranks"][1]["fits"] == false);
  std::set<std::string> breakdown_keys;
  for (const auto& [key, value] : j["ranks"][1]["memory_breakdown"].items()) {
    breakdown_keys.insert(key);
    CHECK(value.is_number_integer());
  }
  CHECK(breakdown_keys == std::set<std::string>{"parameters", "gradients", "optimizer_states",
                                                "activations", "workspace", "comm_buffers",
                                                "other"});

  REQUIRE(j["out_of_memory"].size() == 1);
  const auto& o = j["out_of_memory"][0];
  std::set<std::string> oom_keys;
  for (const auto& [key, value] : o.items()) oom_keys.insert(key);
  CHECK(oom_keys == std::set<std::string>{"rank", "at", "tier", "capacity_bytes", "peak_bytes",
                                          "excess_bytes", "op", "time_s"});
  CHECK(o["tier"] == "device");
  CHECK(o["excess_bytes"] == 500);
  // "op" is the op's place in its rank's program: global op 8 counted from rank 1's first op.
  CHECK(o["op"] == 8 - f.program.first_op(1));
  CHECK(o["time_s"].get<double>() == approx(40e-6));
}

TEST_CASE("report: print_summary") {
  TwoRanks f;
  f.context.setup = {{"model", "tiny, 1 k params"}, {"parallelism", "pp 2"}};
  f.context.device_capacity = Bytes(1024);
  f.timeline.ranks[0].tiers[0].peak = Bytes(512);
  f.timeline.ranks[0].tiers[0].breakdown[0] = Bytes(512);
  f.timeline.ranks[1].tiers[0].peak = Bytes(2048);
  f.timeline.ranks[1].tiers[0].breakdown[3] = Bytes(2048);

  SUBCASE("fits") {
    f.timeline.ranks[1].tiers[0].peak = Bytes(1000);
    auto r = traces::make_report(f.program, f.timeline, f.context);
    std::ostringstream out;
    traces::print_summary(out, r, f.context);
    const std::string s = out.str();
    CHECK(s.find("two-ranks") != std::string::npos);
    CHECK(s.find("tiny, 1 k params") != std::string::npos);
    CHECK(s.find("70 us") != std::string::npos);  // iteration time
    CHECK(s.find("100,000,000 tokens/s") != std::string::npos);
    CHECK(s.find("154.0%") != std::string::npos);         // MFU of 1.5402
    CHECK(s.find("45.0%") != std::string::npos);          // bubble
    CHECK(s.find("512 B / 1 KiB") != std::string::npos);  // stage 0
    CHECK(s.find("verdict: fits") != std::string::npos);
    CHECK(s.find("OUT OF MEMORY") == std::string::npos);
  }
  SUBCASE("out of memory") {
    f.timeline.out_of_memory.push_back(traces::OutOfMemory{
        1, strategies::MemoryTier::device, Bytes(1024), Bytes(2048), 6, Time::us(20)});
    auto r = traces::make_report(f.program, f.timeline, f.context);
    std::ostringstream out;
    traces::print_summary(out, r, f.context);
    const std::string s = out.str();
    CHECK(s.find("2 KiB / 1 KiB") != std::string::npos);
    CHECK(s.find("OUT OF MEMORY by 1 KiB") != std::string::npos);
    CHECK(s.find("verdict: OUT OF MEMORY on 1 of 2 ranks") != std::string::npos);
  }
  SUBCASE("incomplete: the problem comes before the figures") {
    f.timeline.completed = false;
    f.timeline.problem = "deadlock at rank 1 op 6";
    auto r = traces::make_report(f.program, f.timeline, f.context);
    std::ostringstream out;
    traces::print_summary(out, r, f.context);
    const std::string s = out.str();
    auto problem = s.find("deadlock at rank 1 op 6");
    REQUIRE(problem != std::string::npos);
    CHECK(problem < s.find("iteration time"));
    CHECK(problem < s.find("tiny, 1 k params"));
    CHECK(s.find("verdict: INCOMPLETE") != std::string::npos);
  }
}

TEST_CASE("report: an offloaded optimizer step on the host stream counts as optimizer time") {
  strategies::Program p(1);
  auto k = p.add_kernels({strategies::Kernel{strategies::Measured{Time::ms(3)}, "adam"}});
  p.begin_rank(0);
  strategies::OpInfo info;
  info.stream = strategies::Stream::host;
  info.phase = strategies::Phase::optimizer;
  p.add(strategies::Compute{k}, info);
  p.finish();
  traces::Timeline t;
  t.world_size = 1;
  t.spans.push_back(traces::Span{0, strategies::Stream::host, 0, Time::ms(1), Time::ms(4)});
  t.ranks.resize(1);
  auto report = traces::make_report(p, t, traces::ReportContext{});
  CHECK(report.optimizer_time_s == doctest::Approx(3e-3));
}

TEST_CASE("report: communication per stream and kind, with nccl-tests' algbw and busbw") {
  TwoRanks f;
  const auto r = traces::make_report(f.program, f.timeline, f.context);
  REQUIRE(r.communication.size() == 1);
  const auto& c = r.communication.front();
  CHECK(c.stream == "dp");
  CHECK(c.kind == "all-reduce");
  CHECK(c.rank == 0);
  CHECK(c.calls == 1);
  CHECK(c.bytes == Bytes(1 << 20));
  // All-reduce over n = 2: busbw factor 2(n-1)/n = 1, so 1 MiB on the wire; 35 to 50 us.
  CHECK(c.wire_bytes == Bytes(1 << 20));
  CHECK(c.time_s == doctest::Approx(15e-6));
  CHECK(c.algbw == doctest::Approx(1048576 / 15e-6));
  CHECK(c.busbw == doctest::Approx(1048576 / 15e-6));
  const auto j = traces::to_json(r, f.context);
  CHECK(j["communication"][0]["wire_bytes"] == 1 << 20);
  CHECK(j["links"].empty());
}
