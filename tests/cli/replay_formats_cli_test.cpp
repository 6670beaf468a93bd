// `stratasim replay` of the foreign formats, end to end: a Chakra trace written by
// `stratasim export` replays to the simulation of the same strategy, and the Kineto sample
// (tests/data/traces/kineto: 215 us of GEMMs and host time, one 1 MiB bf16 all-reduce, 45 us of
// host time and optimizer per rank) replays to 260 us plus that all-reduce as `stratasim
// collective` times it — at its own width and widened to 8 ranks; one rank of it alone replays
// with its communication as measured.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"

namespace fs = std::filesystem;

namespace {

using namespace stratasim::testing::cli;

const std::string kSource = STRATASIM_SOURCE_DIR;

double iteration_time(const fs::path& dir) {
  return nlohmann::json::parse(read(dir / "report.json"))["iteration_time_s"].get<double>();
}

// The time of one all-reduce of `bytes` over devices `ranks` of dgx-a100-1, from the
// `collective` command's CSV (column time_s), a path that does not go through any importer.
double all_reduce_time(const std::string& ranks, long bytes, const fs::path& dir) {
  auto r = run("collective dgx-a100-1 --op all_reduce --ranks " + ranks + " --sizes " +
               std::to_string(bytes) + " --out " + dir.string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  std::istringstream csv(read(dir / "collective.csv"));
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  // Find the time_s column by name.
  auto split = [](const std::string& line) {
    std::vector<std::string> cells;
    std::stringstream s(line);
    std::string cell;
    while (std::getline(s, cell, ',')) cells.push_back(cell);
    return cells;
  };
  const auto names = split(header);
  const auto cells = split(row);
  for (std::size_t i = 0; i < names.size() && i < cells.size(); ++i) {
    if (names[i] == "time_s") return std::stod(cells[i]);
  }
  FAIL("collective.csv has no time_s column: " << header);
  return 0;
}

}  // namespace

TEST_CASE("replay: a Chakra trace from stratasim export replays to the direct simulation") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("replay-chakra");
  const std::string experiment = kSource + "/configs/experiments/gpt-tiny-3d-8.json";
  // A Chakra trace carries kernels, not the training framework's efficiency
  // (training.compute_efficiency): the simulation is run at 1 to compare like with like.
  const std::string plain = " --set training.compute_efficiency=1";
  auto r = run("simulate " + experiment + plain + " --quiet --out " + (dir / "sim").string());
  REQUIRE(r.status == 0);
  r = run("export " + experiment + plain + " --format chakra --quiet --out " +
          (dir / "et").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  r = run("replay " + (dir / "et").string() + " --format chakra --cluster dgx-a100-1 --quiet " +
          "--out " + (dir / "replay").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  const double simulated = iteration_time(dir / "sim");
  const double replayed = iteration_time(dir / "replay");
  // The bar is 0.1%; the export carries the kernels' shapes, so the replay is exact.
  CHECK(std::abs(replayed - simulated) <= 1e-3 * simulated);

  // A truncated rank file is bad input naming the file.
  const auto et = dir / "et";
  fs::path first;
  for (const auto& entry : fs::directory_iterator(et)) {
    if (entry.path().extension() == ".et") first = entry.path();
  }
  REQUIRE(!first.empty());
  fs::resize_file(first, fs::file_size(first) / 2);
  r = run("replay " + et.string() + " --format chakra --cluster dgx-a100-1");
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find(first.filename().string()) != std::string::npos);
}

TEST_CASE("replay: the Kineto sample replays as hand-calculated, also widened to 8 ranks") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("replay-kineto");
  const std::string trace = kSource + "/tests/data/traces/kineto";
  // 524,288 bf16 elements = 1 MiB per all-reduce.
  constexpr long kBytes = 524288L * 2;
  auto r = run("replay " + trace + " --format kineto --cluster dgx-a100-1 --quiet --out " +
               (dir / "two").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  // make_sample.py: the all-reduce starts at 215 us on both ranks (GEMMs, then host time), and
  // 5 us of host time and the 40 us optimizer follow it.
  const double two = 260e-6 + all_reduce_time("0-1", kBytes, dir / "c2");
  CHECK(iteration_time(dir / "two") == doctest::Approx(two).epsilon(1e-6));

  // The sample's one group is PyTorch's default (world) group, named "default_pg": widened to
  // 8 ranks it becomes an all-reduce over all 8 GPUs of the node, with --dp-groups naming it
  // or without.
  const double eight = 260e-6 + all_reduce_time("0-7", kBytes, dir / "c8");
  r = run("replay " + trace + " --format kineto --cluster dgx-a100-1 --ranks 8 " +
          "--dp-groups default_pg --quiet --out " + (dir / "eight").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(iteration_time(dir / "eight") == doctest::Approx(eight).epsilon(1e-6));
  CHECK(eight > two);  // a ring over 8 moves 2*7/8 of the buffer per rank, over 2 only 1/2
}

TEST_CASE("replay: Kineto's DDP default_pg is data parallel without --dp-groups (issue 18)") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("replay-kineto-dp");
  const std::string trace = kSource + "/tests/data/traces/kineto";
  constexpr long kBytes = 524288L * 2;
  auto r = run("replay " + trace + " --format kineto --cluster dgx-a100-1 --ranks 8 --out " +
               (dir / "eight").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(iteration_time(dir / "eight") ==
        doctest::Approx(260e-6 + all_reduce_time("0-7", kBytes, dir / "c8")).epsilon(1e-6));
  CHECK(r.output.find("dp all-reduce") != std::string::npos);  // not "tp all-reduce"
}

TEST_CASE(
    "replay: one rank of a multi-rank Kineto trace replays with its communication as measured "
    "(issue 18)") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("replay-kineto-one");
  const std::string rank0 = kSource + "/tests/data/traces/kineto/rank0.pt.trace.json";
  auto r = run("replay " + rank0 + " --format kineto --cluster dgx-a100-1 --out " +
               (dir / "one").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  // Rank 0 of make_sample.py: GEMMs and host time until 215 us, the all-reduce's measured
  // 300 us, 5 us of host time, the 40 us optimizer: 560 us.
  CHECK(iteration_time(dir / "one") == doctest::Approx(560e-6).epsilon(1e-9));
  CHECK(r.output.find("rank 0 of 2 replayed alone, communication as measured") !=
        std::string::npos);
  CHECK(r.output.find("Communication is taken as measured, not simulated") != std::string::npos);
  // It cannot be widened: its peers' files are missing.
  check_bad_input("replay " + rank0 + " --format kineto --cluster dgx-a100-1 --ranks 8",
                  {"--ranks 8", "cannot be re-targeted"});
  // --scale-compute speeds up the kernels, not the measured communication or the host time:
  // 200 us of GEMMs and 40 us of optimizer halve, 15 us of host time before the all-reduce,
  // 300 us of it and 5 us after stay: 100 + 15 + 300 + 5 + 20 = 440 us (rank 0's host time
  // before the all-reduce is 3 + 12 us).
  r = run("replay " + rank0 + " --format kineto --cluster dgx-a100-1 --scale-compute 2 --quiet " +
          "--out " + (dir / "fast").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(iteration_time(dir / "fast") == doctest::Approx(440e-6).epsilon(1e-9));
}

TEST_CASE("replay: --step picks a ProfilerStep of a Kineto trace (issue 18)") {
  const TempDir tmp("cli");
  // Two steps: #5 of 100 us (a 60 us kernel launched at 10 us, run at [20, 80)) and #6 of 50 us
  // (a 30 us kernel launched at 105, run at [110, 140)).
  const std::string text =
      "{\"traceEvents\": ["
      "{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#5\", \"pid\": 1, "
      "\"tid\": 1, \"ts\": 0, \"dur\": 100},"
      "{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#6\", \"pid\": 1, "
      "\"tid\": 1, \"ts\": 100, \"dur\": 50},"
      "{\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 1, "
      "\"tid\": 1, \"ts\": 10, \"dur\": 2, \"args\": {\"correlation\": 1}},"
      "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"pid\": 0, \"tid\": 7, \"ts\": 20, "
      "\"dur\": 60, \"args\": {\"stream\": 7, \"correlation\": 1}},"
      "{\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 1, "
      "\"tid\": 1, \"ts\": 105, \"dur\": 2, \"args\": {\"correlation\": 2}},"
      "{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"pid\": 0, \"tid\": 7, \"ts\": 110, "
      "\"dur\": 30, \"args\": {\"stream\": 7, \"correlation\": 2}}]}";
  const auto file = tmp.write("steps.json", text);
  const std::string base = "replay " + file.string() + " --format kineto --cluster dgx-a100-1 ";
  // The lower median of 100 and 50 us: #6.
  auto r = run(base + "--out " + (tmp / "median").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(iteration_time(tmp / "median") == doctest::Approx(50e-6).epsilon(1e-9));
  CHECK(r.output.find("2 ProfilerStep spans (#5 100 us, #6 50 us)") != std::string::npos);
  CHECK(r.output.find("ProfilerStep#6, 50 us measured (the median step") != std::string::npos);
  r = run(base + "--step 5 --quiet --out " + (tmp / "five").string());
  REQUIRE(r.status == 0);
  CHECK(iteration_time(tmp / "five") == doctest::Approx(100e-6).epsilon(1e-9));
  r = run(base + "--step all --quiet --out " + (tmp / "all").string());
  REQUIRE(r.status == 0);
  CHECK(iteration_time(tmp / "all") == doctest::Approx(150e-6).epsilon(1e-9));
  check_bad_input(base + "--step 7", {"ProfilerStep#7 is not in the trace (it has #5, #6)"});
  check_bad_input(base + "--step seven", {"--step expects a ProfilerStep number"});
}

TEST_CASE(
    "replay: Chakra's MSCCL-style ring all-reduce of send/recv nodes runs (sends do not wait) "
    "and the notes say which semantics were assumed") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("replay-ring");
  // ASTRA-sim's custom_ring_allreduce_8npus_1MB (tests/data/traces/chakra/.../PROVENANCE.md):
  // each rank's receive depends on its own send; with sends that wait it deadlocked (exit 3).
  const std::string trace =
      kSource + "/tests/data/traces/chakra/custom_ring_allreduce_8npus_1MB/custom_allreduce";
  auto r = run("replay " + trace + " --format chakra --cluster dgx-a100-1 --out " +
               (dir / "out").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("sends replayed with Chakra's semantics") != std::string::npos);
  CHECK(r.output.find("does not wait for its receive") != std::string::npos);
  // 14 transfers of 128 KiB one after another and 7 reductions of 7 us: more than 49 us.
  CHECK(iteration_time(dir / "out") > 49e-6);
  // The replay's own timeline.json keeps the sends eager ("eager": true), so replaying it runs
  // too, to the same time.
  r = run("replay " + (dir / "out").string() + " --format stratasim --quiet --out " +
          (dir / "again").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(iteration_time(dir / "again") == doctest::Approx(iteration_time(dir / "out")));
}

TEST_CASE(
    "replay: JSON that is not a Chakra trace, or a trace without nodes, is exit 2 naming the "
    "file and what was expected") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("replay-not-chakra");
  const std::string host_et =
      "{\"schema\": \"1.0.3-chakra.0.0.4\", \"pid\": 1, \"time\": \"2024-07-01 00:00:00\", "
      "\"start_ts\": 1, \"nodes\": [{\"id\": 1, \"name\": \"[pytorch|profiler|execution_trace|"
      "process]\", \"ctrl_deps\": 0}], \"finish_ts\": 2}";
  auto write = [](const fs::path& p, const std::string& text) {
    std::ofstream out(p);
    out << text;
  };
  // A PyTorch execution trace under a rank file's name, under any other name, and as rank 1
  // alone: each names the file and says to convert it with chakra_converter (it replayed as
  // "0 ops, 0 s" before, or as a missing rank 0).
  for (const std::string name : {"host_et.0.json", "pytorch_et.json", "host_et_r.1.json"}) {
    CAPTURE(name);
    const auto sub = dir / ("t-" + name);
    fs::create_directories(sub);
    write(sub / name, host_et);
    auto r = run("replay " + (sub / name).string() + " --format chakra --cluster dgx-a100-1");
    CAPTURE(r.output);
    CHECK(r.status == 2);
    CHECK(r.output.find(name + ": this is a PyTorch execution trace") != std::string::npos);
    CHECK(r.output.find("chakra_converter") != std::string::npos);
  }
  // Chakra's JSON workload graph.
  fs::create_directories(dir / "graph");
  write(dir / "graph" / "small_chakra.0.json",
        "{\"workload_graph\": [{\"Id\": 1, \"Name\": \"a\", \"NodeType\": 4, \"runtime\": 3}]}");
  auto r = run("replay " + (dir / "graph").string() + " --format chakra --cluster dgx-a100-1");
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("small_chakra.0.json: this is a JSON workload graph") != std::string::npos);
  // GlobalMetadata and no nodes.
  fs::create_directories(dir / "empty");
  write(dir / "empty" / "t.0.json", "{\"version\": \"0.0.4\"}\n");
  r = run("replay " + (dir / "empty").string() + " --format chakra --cluster dgx-a100-1");
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("t.0.json: the trace has no nodes") != std::string::npos);
}

TEST_CASE(
    "replay: --quiet prints nothing on success, --no-notes prints the report without the notes "
    "(issue 18: --quiet)") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("replay-quiet");
  // The ring trace's replay has a note (the send semantics assumed) and a report.
  const std::string trace =
      kSource + "/tests/data/traces/chakra/custom_ring_allreduce_8npus_1MB/custom_allreduce";
  const std::string base = "replay " + trace + " --format chakra --cluster dgx-a100-1 --out ";
  auto r = run(base + (dir / "plain").string());
  REQUIRE(r.status == 0);
  CHECK(r.output.find("note: ") != std::string::npos);
  CHECK(r.output.find("iteration time") != std::string::npos);
  r = run(base + (dir / "no-notes").string() + " --no-notes");
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("note: ") == std::string::npos);
  CHECK(r.output.find("iteration time") != std::string::npos);
  r = run(base + (dir / "quiet").string() + " --quiet");
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.empty());
  CHECK(std::filesystem::exists(dir / "quiet" / "report.json"));
}
