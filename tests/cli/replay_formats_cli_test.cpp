// `stratasim replay` of the foreign formats, end to end: a Chakra trace written by
// `stratasim export` replays to the simulation of the same strategy, and the Kineto sample
// (tests/data/traces/kineto: 250 us of GEMMs then one 1 MiB bf16 all-reduce per rank) replays
// to 250 us plus that all-reduce as `stratasim collective` times it — at its own width and
// widened to 8 ranks.
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
  // 250 us of kernels before the all-reduce on each rank (the sample's make_sample.py).
  const double two = 250e-6 + all_reduce_time("0-1", kBytes, dir / "c2");
  CHECK(iteration_time(dir / "two") == doctest::Approx(two).epsilon(1e-6));

  // The sample's one group is PyTorch's default (world) group, named "default_pg": widened to
  // 8 ranks it becomes an all-reduce over all 8 GPUs of the node.
  r = run("replay " + trace + " --format kineto --cluster dgx-a100-1 --ranks 8 " +
          "--dp-groups default_pg --quiet --out " + (dir / "eight").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  const double eight = 250e-6 + all_reduce_time("0-7", kBytes, dir / "c8");
  CHECK(iteration_time(dir / "eight") == doctest::Approx(eight).epsilon(1e-6));
  CHECK(eight > two);  // a ring over 8 moves 2*7/8 of the buffer per rank, over 2 only 1/2
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
