// The Chrome trace, memory.csv and the atomic writing of an output folder.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "traces/export.hpp"
#include "traces/helpers.hpp"
#include "traces/report.hpp"

namespace {

using namespace stratasim;
using strategies::Collective;
using strategies::CollectiveKind;
using strategies::Compute;
using strategies::MemoryTier;
using strategies::Phase;
using strategies::Program;
using strategies::Recv;
using strategies::Send;
using strategies::Stream;
using testing::approx;
using testing::gemm;
using testing::info;
using traces::Timeline;
namespace fs = std::filesystem;

const std::string kOddLabel = "send \"x\", \\y\t";

// rank 0: op0 forward compute 'fwd layers 0-5' (microbatch 2, layers [0, 6)), op1 unlabelled
//         all-reduce of 4096 B on "tp 0", op2 send of 100 B to rank 1 with an odd label;
// rank 1: op3 recv of 100 B from rank 0 'recv', op4 optimizer compute 'adam, step'.
struct Small {
  Program program{2};
  Timeline timeline;
  traces::ReportContext context;

  Small() {
    auto k = program.add_kernels({gemm(2, 2, 2)});
    auto tp = program.add_group({0}, "tp 0");
    program.begin_rank(0);
    auto fwd = info(Stream::compute, Phase::forward, "fwd layers 0-5", 2);
    fwd.layer_begin = 0;
    fwd.layer_end = 6;
    program.add(Compute{k}, fwd);
    program.add(Collective{CollectiveKind::all_reduce, DType::bf16, tp, Bytes(4096)},
                info(Stream::tp_comm, Phase::forward));
    program.add(Send{1, Bytes(100)}, info(Stream::pp_send, Phase::forward, kOddLabel, 2));
    program.begin_rank(1);
    program.add(Recv{0, Bytes(100)}, info(Stream::pp_recv, Phase::forward, "recv", 2));
    program.add(Compute{k}, info(Stream::compute, Phase::optimizer, "adam, step"));
    program.finish();

    timeline.world_size = 2;
    timeline.spans = {
        traces::Span{0, Stream::compute, 0, Time::ps(1234567), Time::ps(3000000)},
        traces::Span{0, Stream::tp_comm, 1, Time::ps(3000000), Time::ps(4000000)},
        traces::Span{0, Stream::pp_send, 2, Time::ps(0), Time::ps(999)},
        traces::Span{1, Stream::pp_recv, 3, Time::ps(5), Time::ps(1000005)},
        traces::Span{1, Stream::compute, 4, Time::ps(123456789012), Time::ps(123456789013)}};
    timeline.memory = {
        traces::MemorySample{0, MemoryTier::device, Time::ps(0), Bytes(100), 0},
        traces::MemorySample{0, MemoryTier::device, Time::ps(1), Bytes(50), 2},
        traces::MemorySample{0, MemoryTier::device, Time::ps(3000000), Bytes(300), 0},
        traces::MemorySample{1, MemoryTier::host, Time::ps(1500000000000), Bytes(7), 4}};
    timeline.ranks.resize(2);
    context.experiment = "small";
    context.stage_of_rank = {0, 1};
  }

  std::string trace() const {
    std::ostringstream out;
    traces::write_chrome_trace(out, program, timeline);
    return out.str();
  }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const nlohmann::json* find_x(const nlohmann::json& events, int op) {
  for (const auto& e : events) {
    if (e["ph"] == "X" && e["args"]["op"] == op) return &e;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("chrome trace: valid JSON with one X event per span") {
  Small f;
  const std::string text = f.trace();
  auto j = nlohmann::json::parse(text);  // throws when not valid JSON
  CHECK(j["displayTimeUnit"] == "ns");
  const auto& events = j["traceEvents"];
  std::map<std::string, int> by_phase;
  std::map<std::string, int> metadata;
  for (const auto& e : events) {
    ++by_phase[e["ph"].get<std::string>()];
    if (e["ph"] == "M") ++metadata[e["name"].get<std::string>()];
  }
  CHECK(by_phase["X"] == 5);
  CHECK(by_phase["C"] == 4);
  CHECK(metadata["process_name"] == 2);
  CHECK(metadata["process_sort_index"] == 2);
  // (rank, stream) pairs with spans: 0 compute, 0 tp-comm, 0 pp-send, 1 pp-recv, 1 compute
  CHECK(metadata["thread_name"] == 5);
  CHECK(metadata["thread_sort_index"] == 5);

  // Timestamps and durations: exact microseconds from picoseconds.
  CHECK(text.find(R"("ts":1.234567,"dur":1.765433)") != std::string::npos);
  CHECK(text.find(R"("ts":3.000000,"dur":1.000000)") != std::string::npos);
  CHECK(text.find(R"("ts":0.000000,"dur":0.000999)") != std::string::npos);
  CHECK(text.find(R"("ts":0.000005,"dur":1.000000)") != std::string::npos);
  CHECK(text.find(R"("ts":123456.789012,"dur":0.000001)") != std::string::npos);

  const auto* fwd = find_x(events, 0);
  REQUIRE(fwd != nullptr);
  CHECK((*fwd)["name"] == "fwd layers 0-5");
  CHECK((*fwd)["cat"] == "forward");
  CHECK((*fwd)["pid"] == 0);
  CHECK((*fwd)["tid"] == 0);
  CHECK((*fwd)["args"]["microbatch"] == 2);
  CHECK((*fwd)["args"]["layers"] == "0-5");  // layers 0 to 5 inclusive = [0, 6)
  CHECK_FALSE((*fwd)["args"].contains("bytes"));

  const auto* ar = find_x(events, 1);
  REQUIRE(ar != nullptr);
  CHECK((*ar)["name"] == "all-reduce");  // no label: the kind of work
  CHECK((*ar)["tid"] == 1);
  CHECK((*ar)["args"]["kind"] == "all-reduce");
  CHECK((*ar)["args"]["bytes"] == 4096);
  CHECK((*ar)["args"]["group"] == "tp 0");
  CHECK_FALSE((*ar)["args"].contains("microbatch"));
  CHECK_FALSE((*ar)["args"].contains("layers"));

  const auto* send = find_x(events, 2);
  REQUIRE(send != nullptr);
  CHECK((*send)["name"] == kOddLabel);  // escaped and read back intact
  CHECK((*send)["args"]["peer"] == 1);
  CHECK((*send)["args"]["bytes"] == 100);
  CHECK((*send)["tid"] == 3);

  const auto* recv = find_x(events, 3);
  REQUIRE(recv != nullptr);
  CHECK((*recv)["pid"] == 1);
  CHECK((*recv)["args"]["peer"] == 0);

  const auto* opt = find_x(events, 4);
  REQUIRE(opt != nullptr);
  CHECK((*opt)["cat"] == "optimizer");

  for (const auto& e : events) {
    if (e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == 1) {
      CHECK(e["args"]["name"] == "rank 1");
    }
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 0 && e["tid"] == 1) {
      CHECK(e["args"]["name"] == "tp-comm");
    }
  }
}

TEST_CASE("chrome trace: memory counters") {
  Small f;
  auto j = nlohmann::json::parse(f.trace());
  std::vector<nlohmann::json> counters;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "C") counters.push_back(e);
  }
  REQUIRE(counters.size() == 4);
  CHECK(counters[0]["name"] == "memory (device)");
  CHECK(counters[0]["pid"] == 0);
  CHECK(counters[0]["args"]["bytes"] == 100);
  CHECK(counters[2]["args"]["bytes"] == 300);
  CHECK(counters[2]["ts"].get<double>() == approx(3.0));
  CHECK(counters[3]["name"] == "memory (host)");
  CHECK(counters[3]["pid"] == 1);
  CHECK(counters[3]["ts"].get<double>() == approx(1.5e6));
}

TEST_CASE("chrome trace: byte-identical when written twice") {
  Small f;
  CHECK(f.trace() == f.trace());
  Small g;
  CHECK(f.trace() == g.trace());
}

TEST_CASE("chrome trace: an empty timeline is still valid JSON") {
  Small f;
  f.timeline.spans.clear();
  f.timeline.memory.clear();
  auto j = nlohmann::json::parse(f.trace());
  CHECK(j["traceEvents"].size() == 4);  // process name and sort index of two ranks
}

TEST_CASE("memory.csv: one row per sample, exact times, quoted labels") {
  Small f;
  std::ostringstream out;
  traces::write_memory_csv(out, f.program, f.timeline);
  CHECK(out.str() ==
        "rank,tier,time_s,total_bytes,op,label\n"
        "0,device,0.000000000000,100,0,fwd layers 0-5\n"
        "0,device,0.000000000001,50,2,\"send \"\"x\"\", \\y\t\"\n"
        "0,device,0.000003000000,300,0,fwd layers 0-5\n"
        "1,host,1.500000000000,7,4,\"adam, step\"\n");
}

TEST_CASE("write_outputs: three files, no temporary folder left") {
  Small f;
  auto report = traces::make_report(f.program, f.timeline, f.context);
  const testing::TempDir scratch("traces");
  const fs::path dir = scratch.path() / "run";

  traces::write_outputs(dir, f.program, f.timeline, report, f.context);
  CHECK(fs::is_regular_file(dir / "report.json"));
  CHECK(fs::is_regular_file(dir / "timeline.json"));
  CHECK(fs::is_regular_file(dir / "memory.csv"));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(scratch.path())) {
    ++entries;
    CHECK(e.path().filename() == "run");
  }
  CHECK(entries == 1);

  const std::string report_text = read_all(dir / "report.json");
  REQUIRE_FALSE(report_text.empty());
  CHECK(report_text.back() == '\n');
  auto j = nlohmann::json::parse(report_text);
  CHECK(j == traces::to_json(report, f.context));
  // write_outputs records the report context in the trace (for replays).
  std::ostringstream trace;
  traces::ExportOptions with_context;
  with_context.context = &f.context;
  traces::write_chrome_trace(trace, f.program, f.timeline, with_context);
  CHECK(read_all(dir / "timeline.json") == trace.str());
  std::ostringstream csv;
  traces::write_memory_csv(csv, f.program, f.timeline);
  CHECK(read_all(dir / "memory.csv") == csv.str());

  SUBCASE("writing again replaces the files") {
    f.context.experiment = "second";
    traces::write_outputs(dir, f.program, f.timeline, report, f.context);
    CHECK(nlohmann::json::parse(read_all(dir / "report.json"))["experiment"] == "second");
    int count = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(scratch.path())) ++count;
    CHECK(count == 1);
  }
  SUBCASE("a trailing slash and missing parents are fine") {
    const fs::path nested = scratch.path() / "a" / "b" / "run2/";
    traces::write_outputs(nested, f.program, f.timeline, report, f.context);
    CHECK(fs::is_regular_file(scratch.path() / "a" / "b" / "run2" / "memory.csv"));
    int count = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(scratch.path() / "a" / "b")) {
      ++count;
    }
    CHECK(count == 1);
  }
}

TEST_CASE("write_outputs: a failure throws and leaves nothing behind") {
  Small f;
  auto report = traces::make_report(f.program, f.timeline, f.context);
  const testing::TempDir scratch("traces");

  SUBCASE("the parent of dir is a regular file") {
    const fs::path file = scratch.path() / "not-a-folder";
    std::ofstream(file) << "x";
    CHECK_THROWS_AS(traces::write_outputs(file / "run", f.program, f.timeline, report, f.context),
                    std::runtime_error);
    CHECK(read_all(file) == "x");
  }
  SUBCASE("dir itself is a regular file") {
    const fs::path file = scratch.path() / "run";
    std::ofstream(file) << "keep";
    CHECK_THROWS_AS(traces::write_outputs(file, f.program, f.timeline, report, f.context),
                    std::runtime_error);
    CHECK(read_all(file) == "keep");
  }
  SUBCASE("an exporter fails half-way (a span of an op the program lacks)") {
    f.timeline.spans.push_back(traces::Span{0, Stream::compute, 99, Time::ps(0), Time::ps(1)});
    CHECK_THROWS(
        traces::write_outputs(scratch.path() / "run", f.program, f.timeline, report, f.context));
    CHECK_FALSE(fs::exists(scratch.path() / "run"));
  }
  // Only what the test made itself is left: no temporary folder, no output folder.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(scratch.path())) {
    names.push_back(e.path().filename().string());
  }
  CHECK(names.size() <= 1);
  for (const auto& n : names) CHECK(n.rfind(".", 0) != 0);
}
