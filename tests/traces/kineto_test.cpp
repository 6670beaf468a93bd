// Kineto (PyTorch profiler) traces in: the 2-rank sample simulates as calculated by hand;
// malformed traces give errors with the JSON path.
#include <doctest/doctest.h>

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
  // GPU activity only: 3 compute kernels and one all-reduce per rank; the CPU events are noted.
  for (int r = 0; r < 2; ++r) {
    const auto ops = p.ops_of(r);
    REQUIRE(ops.size() == 4);
    CHECK(std::holds_alternative<st::Collective>(ops[2].work));
    const auto& c = std::get<st::Collective>(ops[2].work);
    // 524288 BFloat16 elements = 1 MiB, on process group "0" = ranks [0, 1].
    CHECK(c.kind == st::CollectiveKind::all_reduce);
    CHECK(c.bytes == Bytes(1048576));
    CHECK(c.dtype == DType::bf16);
    CHECK(p.groups()[c.group].ranks == std::vector<std::int32_t>{0, 1});
    CHECK(ops[0].stream == st::Stream::compute);
    CHECK(ops[3].stream == st::Stream::compute);
  }
  bool noted_cpu = false;
  for (const auto& n : imported.notes) noted_cpu |= n.find("CPU-side events") != std::string::npos;
  CHECK(noted_cpu);

  const auto cluster =
      hw::load_cluster(kSource / "configs" / "hardware" / "clusters" / "dgx-a100-1.json");
  const auto t = sim::simulate(p, cluster);
  REQUIRE(t.completed);
  // Measured kernels back to back: rank 0's GEMMs end at 120 + 80 = 200 us, rank 1's at
  // 125 + 85 = 210 us.
  CHECK(t.spans[p.first_op(0) + 1].end == Time::us(200));
  CHECK(t.spans[p.first_op(1) + 1].end == Time::us(210));
  // The all-reduce waits for the later rank (the trace shows it started after both GEMMs), then
  // the optimizer (40 us) waits for the all-reduce: 210 + T + 40 us, with T the all-reduce
  // alone in a Program built by hand.
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
  CHECK(iteration_time(t) == Time::us(250) + all_reduce);
}

TEST_CASE("kineto: a single file without distributedInfo is rank 0; durations keep their ps") {
  const std::string text =
      "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1, "
      "\"dur\": 2.5}, {\"ph\": \"X\", \"cat\": \"gpu_memcpy\", \"name\": \"Memcpy HtoD\", "
      "\"ts\": 4, \"dur\": 1.25}]}";
  const auto t = traces::import_kineto_texts({{"one.json", text}});
  REQUIRE(t.program.op_count() == 2);
  const auto& k = t.program.kernels_of(std::get<st::Compute>(t.program.op(0).work));
  CHECK(std::get<st::Measured>(k[0].work).duration == Time::ps(2'500'000));  // 2.5 us
  CHECK(t.program.op(1).stream == st::Stream::copy);
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
                         doctest::Contains("unmatched collective on group 'pg 0' (ranks 0, 1)"),
                         traces::TraceError);
  }
  SUBCASE("fewer files than the world size") {
    CHECK_THROWS_WITH_AS(traces::import_kineto_texts({{"r0.json", trace(0, 2, kGoodComm)}}),
                         doctest::Contains("the trace is of 2 ranks, but 1 files were given"),
                         traces::TraceError);
  }
  SUBCASE("not JSON") {
    CHECK_THROWS_WITH_AS(traces::import_kineto_texts({{"x.json", "{\"traceEvents\": [1,"}}),
                         doctest::Contains("x.json: byte "), traces::TraceError);
  }
  SUBCASE("the good pair imports") {
    const auto t = traces::import_kineto_texts(
        {{"r0.json", trace(0, 2, kGoodComm)}, {"r1.json", trace(1, 2, kGoodComm)}});
    CHECK(t.program.op_count() == 4);
    // 256 Float elements = 1 KiB.
    CHECK(std::get<st::Collective>(t.program.op(1).work).bytes == Bytes(1024));
  }
}
