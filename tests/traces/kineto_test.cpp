// Kineto (PyTorch profiler) traces in: the 2-rank sample simulates as calculated by hand;
// malformed traces give errors with the JSON path.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "hw_models/cluster.hpp"
#include "sim/simulator.hpp"
#include "traces/kineto.hpp"

namespace fs = std::filesystem;
using namespace stratasim;
namespace st = stratasim::strategies;

namespace {

const fs::path kSource = STRATASIM_SOURCE_DIR;

Time iteration_time(const traces::Timeline& t) {
  Time end;
  for (const auto& s : t.spans) end = std::max(end, s.end);
  return end;
}

std::int64_t ops_on(const st::Program& p, int rank, st::Stream s) {
  std::int64_t n = 0;
  for (const auto& op : p.ops_of(rank)) n += op.stream == s ? 1 : 0;
  return n;
}

// One rank's trace: a GEMM and, optionally, an NCCL kernel with the given args.
std::string trace(int rank, int world, const std::string& nccl_args) {
  std::string events =
      "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"gemm\", \"pid\": 0, \"tid\": 7, "
      "\"ts\": 10.0, \"dur\": 5.5, \"args\": {\"stream\": 7}}";
  if (!nccl_args.empty()) {
    events +=
        ", {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"ncclDevKernel_AllReduce_Sum_f32\", "
        "\"pid\": 0, \"tid\": 20, \"ts\": 20, \"dur\": 3, \"args\": {\"stream\": 20" +
        nccl_args + "}}";
  }
  return "{\"distributedInfo\": {\"rank\": " + std::to_string(rank) +
         ", \"world_size\": " + std::to_string(world) + "}, \"traceEvents\": [" + events + "]}";
}

const std::string kGoodComm =
    ", \"Collective name\": \"allreduce\", \"In msg nelems\": 256, \"Out msg nelems\": 256, "
    "\"Group size\": 2, \"dtype\": \"Float\", \"Process Group Name\": \"0\", "
    "\"Process Group Ranks\": \"[0, 1]\"";

}  // namespace

TEST_CASE("kineto: the 2-rank sample imports and simulates as calculated by hand") {
  const auto imported = traces::import_kineto(kSource / "tests" / "data" / "traces" / "kineto");
  const auto& p = imported.program;
  REQUIRE(p.world_size() == 2);
  // GPU activity: 3 compute kernels and one all-reduce per rank; the time between them with no
  // GPU work becomes 3 host ops; the CPU events are noted.
  for (int r = 0; r < 2; ++r) {
    const auto ops = p.ops_of(r);
    REQUIRE(ops.size() == 7);
    CHECK(ops_on(p, r, st::Stream::compute) == 3);
    CHECK(ops_on(p, r, st::Stream::host) == 3);
    const auto comm = std::find_if(ops.begin(), ops.end(), [](const auto& op) {
      return std::holds_alternative<st::Collective>(op.work);
    });
    REQUIRE(comm != ops.end());
    const auto& c = std::get<st::Collective>(comm->work);
    // 524288 BFloat16 elements = 1 MiB, on process group "0" = ranks [0, 1], PyTorch's default
    // group: data parallel.
    CHECK(c.kind == st::CollectiveKind::all_reduce);
    CHECK(c.bytes == Bytes(1048576));
    CHECK(c.dtype == DType::bf16);
    CHECK(p.groups()[c.group].ranks == std::vector<std::int32_t>{0, 1});
    CHECK(comm->stream == st::Stream::dp_comm);
  }
  bool noted_cpu = false;
  for (const auto& n : imported.notes) noted_cpu |= n.find("CPU-side events") != std::string::npos;
  CHECK(noted_cpu);

  const auto cluster =
      hw::load_cluster(kSource / "configs" / "hardware" / "clusters" / "dgx-a100-1.json");
  const auto t = sim::simulate(p, cluster);
  REQUIRE(t.completed);
  // Measured kernels with the host time between them (make_sample.py): rank 0's GEMMs end at
  // 120 + 3 + 80 = 203 us, rank 1's at 125 + 3 + 85 = 213 us. Both ranks then spend host time
  // until 215 us, when the all-reduce started in the trace.
  // In issue order: forward GEMM, host time, backward GEMM, ...
  for (int r = 0; r < 2; ++r) REQUIRE(p.op(p.first_op(r) + 2).stream == st::Stream::compute);
  CHECK(t.spans[p.first_op(0) + 2].end == Time::us(203));
  CHECK(t.spans[p.first_op(1) + 2].end == Time::us(213));
  // The all-reduce starts at 215 us, then 5 us of host time and the optimizer (40 us):
  // 215 + T + 5 + 40 us, with T the all-reduce alone in a Program built by hand.
  st::Program alone(2);
  const auto g = alone.add_group({0, 1}, "pg");
  for (int r = 0; r < 2; ++r) {
    alone.begin_rank(r);
    st::OpInfo info;
    info.stream = st::Stream::tp_comm;
    alone.add(st::Collective{st::CollectiveKind::all_reduce, DType::bf16, g, Bytes(1048576)}, info);
  }
  alone.finish();
  const Time all_reduce = iteration_time(sim::simulate(alone, cluster));
  CHECK(all_reduce > Time::zero());
  CHECK(iteration_time(t) == Time::us(260) + all_reduce);
}

TEST_CASE("kineto: a single file without distributedInfo is rank 0; durations keep their ps") {
  const std::string text =
      "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1, "
      "\"dur\": 2.5}, {\"ph\": \"X\", \"cat\": \"gpu_memcpy\", \"name\": \"Memcpy HtoD\", "
      "\"ts\": 4, \"dur\": 1.25}]}";
  const auto t = traces::import_kineto_texts({{"one.json", text}});
  // The kernel [1, 3.5), host time [3.5, 4), the copy [4, 5.25).
  REQUIRE(t.program.op_count() == 3);
  const auto& k = t.program.kernels_of(std::get<st::Compute>(t.program.op(0).work));
  CHECK(std::get<st::Measured>(k[0].work).duration == Time::ps(2'500'000));  // 2.5 us
  const auto& host = t.program.kernels_of(std::get<st::Compute>(t.program.op(1).work));
  CHECK(t.program.op(1).stream == st::Stream::host);
  CHECK(std::get<st::Measured>(host[0].work).duration == Time::ps(500'000));  // 0.5 us
  CHECK(t.program.op(2).stream == st::Stream::copy);
}

TEST_CASE("kineto: malformed traces give errors with the JSON path") {
  SUBCASE("a missing field of an NCCL kernel") {
    const std::string bad =
        ", \"Collective name\": \"allreduce\", \"In msg nelems\": 256, "
        "\"dtype\": \"Float\", \"Process Group Ranks\": \"[0, 1]\"";
    CHECK_THROWS_WITH_AS(
        traces::import_kineto_texts({{"r0.json", trace(0, 2, bad)}, {"r1.json", trace(1, 2, bad)}}),
        doctest::Contains("r0.json: traceEvents[1].args.Out msg nelems: expected an integer"),
        traces::TraceError);
  }
  SUBCASE("a field of the wrong type") {
    const std::string bad = kGoodComm + ", \"Group size\": \"two\"";
    CHECK_THROWS_WITH_AS(
        traces::import_kineto_texts({{"r0.json", trace(0, 2, bad)}, {"r1.json", trace(1, 2, bad)}}),
        doctest::Contains("traceEvents[1].args.Group size: expected an integer"),
        traces::TraceError);
  }
  SUBCASE("a kernel without a duration") {
    const std::string text =
        "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1}]}";
    CHECK_THROWS_WITH_AS(traces::import_kineto_texts({{"k.json", text}}),
                         doctest::Contains("k.json: traceEvents[0].dur: expected a number"),
                         traces::TraceError);
  }
  SUBCASE("an unmatched collective") {
    CHECK_THROWS_WITH_AS(traces::import_kineto_texts(
                             {{"r0.json", trace(0, 2, kGoodComm)}, {"r1.json", trace(1, 2, "")}}),
                         doctest::Contains("unmatched collective on group 'dp pg 0' (ranks 0, 1)"),
                         traces::TraceError);
  }
  SUBCASE("not JSON") {
    CHECK_THROWS_WITH_AS(traces::import_kineto_texts({{"x.json", "{\"traceEvents\": [1,"}}),
                         doctest::Contains("x.json: byte "), traces::TraceError);
  }
  SUBCASE("the good pair imports") {
    const auto t = traces::import_kineto_texts(
        {{"r0.json", trace(0, 2, kGoodComm)}, {"r1.json", trace(1, 2, kGoodComm)}});
    // Per rank the GEMM [10, 15.5), host time [15.5, 20), the all-reduce.
    CHECK(t.program.op_count() == 6);
    // 256 Float elements = 1 KiB.
    CHECK(std::get<st::Collective>(t.program.op(2).work).bytes == Bytes(1024));
  }
}

namespace {

// Kineto's events, as PyTorch 2.x writes them: GPU kernels on pid 0 (args.stream, correlation),
// their cudaLaunchKernel calls and ProfilerStep#N spans on the host thread (pid/tid 1).
std::string kernel_event(const std::string& name, double ts, double dur, int correlation,
                         const std::string& extra_args = "", int stream = 7) {
  std::ostringstream e;
  e << "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"" << name
    << "\", \"pid\": 0, \"tid\": " << stream << ", \"ts\": " << ts << ", \"dur\": " << dur
    << ", \"args\": {\"device\": 0, \"stream\": " << stream << ", \"correlation\": " << correlation
    << extra_args << "}}";
  return e.str();
}
std::string launch_event(double ts, int correlation) {
  std::ostringstream e;
  e << "{\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 1, "
       "\"tid\": 1, \"ts\": "
    << ts << ", \"dur\": 2, \"args\": {\"correlation\": " << correlation << "}}";
  return e.str();
}
std::string step_event(int n, double ts, double dur) {
  std::ostringstream e;
  e << "{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#" << n
    << "\", \"pid\": 1, \"tid\": 1, \"ts\": " << ts << ", \"dur\": " << dur << "}";
  return e.str();
}
std::string document(const std::vector<std::string>& events, const std::string& header = "") {
  std::string text = "{" + header + (header.empty() ? "" : ", ") + "\"traceEvents\": [";
  for (std::size_t i = 0; i < events.size(); ++i) text += (i ? ", " : "") + events[i];
  return text + "]}";
}

Time replayed(const traces::ImportedTrace& t) {
  const auto cluster =
      hw::load_cluster(kSource / "configs" / "hardware" / "clusters" / "dgx-a100-1.json");
  const auto timeline = sim::simulate(t.program, cluster);
  REQUIRE(timeline.completed);
  return iteration_time(timeline);
}

std::string setup_line(const traces::ImportedTrace& t, const std::string& key) {
  for (const auto& [k, v] : t.setup) {
    if (k == key) return v;
  }
  return "";
}

// Timestamps are microseconds since the epoch in doubles: differences of them are good to a
// fraction of a nanosecond.
bool within_a_ns(Time a, Time b) {
  return std::llabs(a.picoseconds() - b.picoseconds()) <= 1000;
}

bool noted(const traces::ImportedTrace& t, const std::string& text) {
  for (const auto& n : t.notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

// Three steps of 100 (warm-up), 50 and 52 us, each launching one kernel:
//   #1 [0, 100):   launch at 10,  kernel [20, 80)
//   #2 [100, 150): launch at 105, kernel [110, 140)
//   #3 [150, 202): launch at 152, kernel [160, 190)
std::vector<std::string> three_steps() {
  return {step_event(1, 0, 100),          step_event(2, 100, 50),
          step_event(3, 150, 52),         launch_event(10, 1),
          kernel_event("k1", 20, 60, 1),  launch_event(105, 2),
          kernel_event("k2", 110, 30, 2), launch_event(152, 3),
          kernel_event("k3", 160, 30, 3)};
}

}  // namespace

TEST_CASE("kineto: several ProfilerStep spans replay one step, not their sum (issue 18)") {
  const std::string text = document(three_steps());
  // By default the lower median step by measured duration, the first step (no previous step's
  // end to begin at; often warm-up) left out when 3 or more have GPU work: of 50 (#2) and
  // 52 us (#3), #2. Its replay is its measured time: 10 us of host time before its kernel, the
  // 30 us kernel, 10 us of host time after it (before, the three kernels were summed: 120 us).
  const auto median = traces::import_kineto_texts({{"t.json", text}});
  CHECK(ops_on(median.program, 0, st::Stream::compute) == 1);
  CHECK(replayed(median) == Time::us(50));
  CHECK(setup_line(median, "recorded steps").find("3 ProfilerStep spans") != std::string::npos);
  CHECK(setup_line(median, "recorded steps").find("median 52") != std::string::npos);
  CHECK(setup_line(median, "replayed step").find("ProfilerStep#2") != std::string::npos);
  CHECK(noted(median, "ProfilerStep#1, the first step"));  // 100 us: warm-up

  traces::KinetoOptions options;
  options.step = 3;  // 10 + 30 + 12 us
  CHECK(replayed(traces::import_kineto_texts({{"t.json", text}}, options)) == Time::us(52));
  options.step = 9;
  CHECK_THROWS_WITH_AS(traces::import_kineto_texts({{"t.json", text}}, options),
                       doctest::Contains("ProfilerStep#9 is not in the trace (it has #1, #2, #3)"),
                       traces::TraceError);
  // All steps back to back: from the first step's start to the last's end, 202 us.
  options.step.reset();
  options.all_steps = true;
  const auto all = traces::import_kineto_texts({{"t.json", text}}, options);
  CHECK(ops_on(all.program, 0, st::Stream::compute) == 3);
  CHECK(replayed(all) == Time::us(202));
}

TEST_CASE("kineto: a kernel launched in one step and run in the next extends its launch's step") {
  auto events = three_steps();
  events.push_back(launch_event(145, 4));  // in #2
  events.push_back(kernel_event("late", 150, 5, 4));
  traces::KinetoOptions options;
  options.step = 2;  // [100, 110) host, k2 30, [140, 150) host, late 5: 55 us
  const auto two = traces::import_kineto_texts({{"t.json", document(events)}}, options);
  CHECK(ops_on(two.program, 0, st::Stream::compute) == 2);
  CHECK(replayed(two) == Time::us(55));
  // Step #3's time begins where #2's ends, at 155 us: [155, 160) host, k3 30, [190, 202) host.
  options.step = 3;
  const auto three = traces::import_kineto_texts({{"t.json", document(events)}}, options);
  CHECK(ops_on(three.program, 0, st::Stream::compute) == 1);
  CHECK(replayed(three) == Time::us(47));
}

TEST_CASE("kineto: the last step cut short when profiling stopped is not the default") {
  // Two steps with GPU work (60 and 80 us) and a third of 3 us without any: the lower median
  // of the steps with work is #1 (of 3, 60 and 80 us over all steps it would be #3, empty).
  const std::vector<std::string> events = {step_event(1, 0, 60),        step_event(2, 60, 80),
                                           step_event(3, 140, 3),       launch_event(1, 1),
                                           kernel_event("a", 5, 50, 1), launch_event(61, 2),
                                           kernel_event("b", 65, 70, 2)};
  const auto t = traces::import_kineto_texts({{"t.json", document(events)}});
  CHECK(setup_line(t, "replayed step").find("ProfilerStep#1") != std::string::npos);
  CHECK(replayed(t) == Time::us(60));  // [0, 5) host, a 50, [55, 60) host
}

TEST_CASE("kineto: host-idle gaps are kept as host time (issue 18)") {
  // No steps: the trace from its first GPU event to its last is one iteration. Two 10 us
  // kernels 1 ms apart: 1010 us (before, 20 us: the 990 us without GPU work vanished).
  const std::vector<std::string> events = {kernel_event("a", 0, 10, 1),
                                           kernel_event("b", 1000, 10, 2)};
  const auto t = traces::import_kineto_texts({{"t.json", document(events)}});
  CHECK(ops_on(t.program, 0, st::Stream::host) == 1);
  CHECK(replayed(t) == Time::us(1010));
  CHECK(setup_line(t, "host-bound time").rfind("990", 0) == 0);
  // Overlapping GPU work on two streams leaves no host time between.
  const std::vector<std::string> overlapping = {kernel_event("a", 0, 10, 1),
                                                kernel_event("copy", 5, 20, 2, "", 9),
                                                kernel_event("b", 25, 10, 3)};
  const auto o = traces::import_kineto_texts({{"t.json", document(overlapping)}});
  CHECK(ops_on(o.program, 0, st::Stream::host) == 0);
}

TEST_CASE(
    "kineto: one rank of a multi-rank job replays with its communication as measured (issue 18)") {
  // Rank 0 of 2 alone: the GEMM [10, 15.5), 4.5 us of host time, the all-reduce's measured 3 us
  // (its peer is absent): 13 us.
  const auto t = traces::import_kineto_texts({{"r0.json", trace(0, 2, kGoodComm)}});
  CHECK(t.measured_communication);
  REQUIRE(t.program.world_size() == 1);
  CHECK(replayed(t) == Time::ps(13'000'000));
  const auto ops = t.program.ops_of(0);
  const auto comm = std::find_if(ops.begin(), ops.end(),
                                 [](const auto& op) { return op.stream == st::Stream::dp_comm; });
  REQUIRE(comm != ops.end());
  CHECK(std::holds_alternative<st::Compute>(comm->work));
  CHECK(noted(t, "Communication is taken as measured, not simulated"));
  CHECK(setup_line(t, "ranks") == "rank 0 of 2 replayed alone, communication as measured");
  // Rank 3 of 8: the rank need not be below the number of files.
  const auto three = traces::import_kineto_texts({{"r3.json", trace(3, 8, kGoodComm)}});
  CHECK(setup_line(three, "ranks") == "rank 3 of 8 replayed alone, communication as measured");
  // More files than the world still is an error.
  CHECK_THROWS_WITH_AS(
      traces::import_kineto_texts({{"a.json", trace(0, 1, "")}, {"b.json", trace(1, 1, "")}}),
      doctest::Contains("the trace is of 1 ranks, but 2 files were given"), traces::TraceError);
}

TEST_CASE("kineto: DDP's default_pg is data parallel, Megatron's tensor group is not (issue 18)") {
  auto comm = [](const std::string& desc) {
    return ", \"Collective name\": \"allreduce\", \"In msg nelems\": 256, \"Out msg nelems\": "
           "256, \"Group size\": 2, \"dtype\": \"Float\", \"Process Group Name\": \"0\", "
           "\"Process Group Description\": \"" +
           desc + "\", \"Process Group Ranks\": \"[0, 1]\"";
  };
  auto group_of = [&](const std::string& desc, const traces::KinetoOptions& options) {
    const auto t = traces::import_kineto_texts(
        {{"r0.json", trace(0, 2, comm(desc))}, {"r1.json", trace(1, 2, comm(desc))}}, options);
    for (const auto& op : t.program.ops_of(0)) {
      if (const auto* c = std::get_if<st::Collective>(&op.work)) {
        return std::make_pair(op.stream, t.program.groups()[c->group].name);
      }
    }
    FAIL("no collective");
    return std::make_pair(st::Stream::compute, std::string());
  };
  const traces::KinetoOptions rule;
  // PyTorch's default group of the whole world: DDP's gradient all-reduces.
  CHECK(group_of("default_pg", rule) ==
        std::make_pair(st::Stream::dp_comm, std::string("dp pg 0 (default_pg)")));
  CHECK(group_of("undefined", rule).first == st::Stream::dp_comm);
  CHECK(group_of("DATA_PARALLEL_GROUP", rule).first == st::Stream::dp_comm);
  CHECK(group_of("TENSOR_MODEL_PARALLEL_GROUP", rule) ==
        std::make_pair(st::Stream::tp_comm, std::string("pg 0 (TENSOR_MODEL_PARALLEL_GROUP)")));
  // --dp-groups decides when given.
  traces::KinetoOptions user;
  user.dp_groups = "TENSOR";
  CHECK(group_of("TENSOR_MODEL_PARALLEL_GROUP", user) ==
        std::make_pair(st::Stream::dp_comm, std::string("pg 0 (TENSOR_MODEL_PARALLEL_GROUP)")));
  CHECK(group_of("default_pg", user).first == st::Stream::tp_comm);
  user.dp_groups = "(";
  CHECK_THROWS_WITH_AS(group_of("default_pg", user),
                       doctest::Contains("is not a regular expression"), traces::TraceError);
}

TEST_CASE(
    "kineto: NCCL kernels without record_param_comms metadata keep their measured durations") {
  // PyTorch before 2.1 (HTA's traces) names only the kernel: the size is unknown.
  const std::string bare =
      "{\"traceEvents\": [" +
      kernel_event("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 10, 40, 5, "", 20) +
      "]}";
  const auto t = traces::import_kineto_texts({{"rank0.json", bare}, {"rank1.json", bare}});
  for (int r = 0; r < 2; ++r) {
    const auto ops = t.program.ops_of(r);
    REQUIRE(ops.size() == 1);
    CHECK(ops[0].stream == st::Stream::dp_comm);
    CHECK(std::holds_alternative<st::Compute>(ops[0].work));
  }
  CHECK(replayed(t) == Time::us(40));
  CHECK(noted(t, "carry no record_param_comms metadata"));
}

// Real traces from Holistic Trace Analysis' test data (tests/data/traces/kineto/hta/, see
// PROVENANCE.md). The expected times are the traces' own figures, read with a few lines of
// Python (PROVENANCE.md): span durations and the end of the last GPU event launched in a step.

TEST_CASE(
    "kineto: HTA's sampled trace of rank 1 alone replays ProfilerStep#1009 with its host time") {
  // distributedInfo {"rank": 1} without a world size: one rank of a job of at least 2. Two
  // steps, #1009 (100.298 ms) and #1010 (122.149 ms): the lower median is #1009. A kernel
  // launched in it (correlation 1954286, at ts ...365315) ran at ...422491 for 4 us (the trace
  // is sampled: the kernels ahead of it are not in the file), so the replayed step runs from
  // the step's start, ...265087, to ...422495: 157.408 ms, all of it measured GPU work (with
  // #1010's that ran in that time) or host time.
  const auto t = traces::import_kineto(kSource / "tests" / "data" / "traces" / "kineto" / "hta" /
                                       "trace_compare_base.json");
  CHECK(t.measured_communication);
  CHECK(setup_line(t, "ranks") == "rank 1 of at least 2 replayed alone, communication as measured");
  CHECK(setup_line(t, "replayed step").find("ProfilerStep#1009") != std::string::npos);
  // 5 memcpys and 4 memsets, 4 kernels: launched in #1009 or running in its time.
  CHECK(ops_on(t.program, 0, st::Stream::copy) == 9);
  CHECK(ops_on(t.program, 0, st::Stream::compute) == 4);
  CHECK(within_a_ns(replayed(t), Time::us(157408)));
}

TEST_CASE(
    "kineto: an AMD ROCm trace (HTA's MI250 sample) replays its step, not the GPU annotation") {
  // ProfilerStep#1 appears twice: the host span (9288.291 us) and a gpu_user_annotation on
  // the GPU's timeline, which is not a step. ProfilerStep#2 (49 us) is the step cut short when
  // profiling stopped, with no GPU work: not the default. All of #1's GPU work ends within it.
  const auto t = traces::import_kineto(kSource / "tests" / "data" / "traces" / "kineto" / "hta" /
                                       "mi250_minitoy_train_ROCm6_2_kineto.json");
  CHECK(setup_line(t, "recorded steps").rfind("2 ProfilerStep spans", 0) == 0);
  CHECK(setup_line(t, "replayed step").find("ProfilerStep#1,") != std::string::npos);
  CHECK(ops_on(t.program, 0, st::Stream::compute) + ops_on(t.program, 0, st::Stream::copy) == 16);
  CHECK(within_a_ns(replayed(t), Time::ps(9'288'291'000)));
}

TEST_CASE(
    "kineto: a real DDP trace of rank 0 of 2 (HTA, trimmed to its NCCL kernels) replays alone") {
  // PyTorch 2.x record_param_comms args: "Process Group Description": "default_pg", ranks
  // [0, 1]. Rank 0's file alone: its all-reduces and broadcasts keep their measured durations,
  // on the data-parallel stream. Steps 222.442 (#4, the first: left out), 219.727 and 224.936
  // ms: the lower median is #5. Its 7 NCCL kernels (launched by cudaLaunchKernelExC) end
  // within its span, and so do #4's (which ends 61 us before #5 starts): its time is its span,
  // 219.726905 ms.
  const auto t = traces::import_kineto(kSource / "tests" / "data" / "traces" / "kineto" / "hta" /
                                       "nccl_parser_config_rank0_trimmed.json");
  CHECK(t.measured_communication);
  CHECK(setup_line(t, "ranks") == "rank 0 of 2 replayed alone, communication as measured");
  CHECK(setup_line(t, "replayed step").find("ProfilerStep#5,") != std::string::npos);
  CHECK(ops_on(t.program, 0, st::Stream::dp_comm) == 7);
  CHECK(ops_on(t.program, 0, st::Stream::tp_comm) == 0);
  CHECK(within_a_ns(replayed(t), Time::ps(219'726'905'000)));
}

TEST_CASE("kineto: a PyTorch 1.8 trace (Kineto's tb_plugin test) keeps its 13.36 ms of host time") {
  // Categories "Operator", "Runtime", "Kernel", "Memcpy"; one ProfilerStep#2 of 13410 us in
  // which the 32 GPU events (all launched in it) are busy for 50 us: the other 13360 us are host
  // time, and the replay is the step's measured 13.41 ms, not its 50 us of kernels.
  const auto t = traces::import_kineto(kSource / "tests" / "data" / "traces" / "kineto" /
                                       "kineto_tb_plugin" / "gpu_metrics_input.json");
  CHECK(setup_line(t, "replayed step").find("ProfilerStep#2,") != std::string::npos);
  CHECK(ops_on(t.program, 0, st::Stream::compute) == 30);
  CHECK(ops_on(t.program, 0, st::Stream::copy) == 2);
  CHECK(setup_line(t, "host-bound time").rfind("13.36 ms of 13.41 ms", 0) == 0);
  CHECK(within_a_ns(replayed(t), Time::us(13410)));
}

TEST_CASE("kineto: a trace without GPU events is bad input, not a 0 s iteration") {
  // HTA's cpu_only and MTIA traces: CPU operators (and another accelerator's events) only.
  const std::string cpu_only =
      document({step_event(1, 0, 100),
                "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", "
                "\"pid\": 1, \"tid\": 1, \"ts\": 5, \"dur\": 50}"});
  CHECK_THROWS_WITH_AS(traces::import_kineto_texts({{"cpu.json", cpu_only}}),
                       doctest::Contains("cpu.json: traceEvents: no GPU kernels, memcpys or "
                                         "memsets"),
                       traces::TraceError);
  // A step without GPU work, asked for: says which.
  traces::KinetoOptions options;
  options.step = 3;
  CHECK_THROWS_WITH_AS(
      traces::import_kineto_texts(
          {{"t.json", document({step_event(2, 0, 60), step_event(3, 60, 5), launch_event(1, 1),
                                kernel_event("a", 5, 50, 1)})}},
          options),
      doctest::Contains("ProfilerStep#3 has no GPU kernels, memcpys or memsets"),
      traces::TraceError);
}

TEST_CASE("kineto: kernels of several GPUs in one file are one rank's, with a note") {
  // A single-process multi-GPU trace (torch.nn.DataParallel): args.device 0 and 1.
  const std::string two_gpus =
      document({kernel_event("a", 0, 10, 1),
                "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"b\", "
                "\"pid\": 1, \"tid\": 7, \"ts\": 0, \"dur\": 10, \"args\": "
                "{\"device\": 1, \"stream\": 7, \"correlation\": 2}}"});
  const auto t = traces::import_kineto_texts({{"dp.json", two_gpus}});
  CHECK(t.program.world_size() == 1);
  CHECK(noted(t, "1 files hold kernels of several GPUs"));
}
