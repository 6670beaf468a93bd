// The sweep machinery: the grid's order, invalid combinations and their reasons, the ordered
// parallel run (deterministic for any thread count, a prefix when stopped), resume, and the
// exactness of mirroring tensor-parallel ranks.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "search/sweep.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "study/partition.hpp"
#include "study/study.hpp"
#include "temp_dir.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::search;

namespace {

const std::string kConfigs = std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/";

std::string file_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The whole CSV of `combos` evaluated with `jobs` threads.
std::string sweep_text(const Evaluator& evaluator, const std::vector<Combination>& combos,
                       int jobs) {
  std::string text = csv_header();
  run_ordered(
      0, combos.size(), jobs,
      [&](std::size_t i) { return csv_row(combos[i], evaluator.evaluate(combos[i])); },
      [&](std::size_t, std::string&& line) { text += line; }, nullptr);
  return text;
}

Grid small_grid() {
  Grid g;
  g.tp = {1, 2, 8};
  g.pp = {1, 2};
  g.zero = {0, 3};
  g.recompute = {"none", "full"};
  g.micro_batch = {1, 2};
  return g;
}

}  // namespace

TEST_CASE("the grid is enumerated in a fixed order, last axis fastest") {
  Grid g;
  g.tp = {1, 2};
  g.pp = {1, 4};
  g.zero = {0, 3};
  g.recompute = {"none", "full"};
  g.micro_batch = {1};
  const auto combos = enumerate(g);
  REQUIRE(combos.size() == 2 * 2 * 2 * 2);  // the product of the axis lengths
  CHECK(combos[0].tp == 1);
  CHECK(combos[0].pp == 1);
  CHECK(combos[0].zero == 0);
  CHECK(combos[0].recompute == "none");
  CHECK(combos[1].recompute == "full");  // recompute changes before zero
  CHECK(combos[2].zero == 3);
  CHECK(combos[4].pp == 4);  // after 2 zero x 2 recompute
  CHECK(combos[8].tp == 2);  // after 2 pp x 2 zero x 2 recompute
  CHECK(combos[15].tp == 2);
  CHECK(combos[15].pp == 4);
  CHECK(combos[15].zero == 3);
  CHECK(combos[15].recompute == "full");
  for (const auto& c : combos) CHECK(c.dp == 0);  // no --dp: derived from the cluster
  g.schedule = {"1f1b", "gpipe"};
  g.sequence_parallel = {0, 1};
  CHECK(enumerate(g).size() == 16 * 2 * 2);
  CHECK(enumerate(g)[1].sequence_parallel == 1);
  CHECK(enumerate(g)[2].schedule == "gpipe");
}

TEST_CASE("lists on the command line: values, ranges and errors naming the flag") {
  CHECK(parse_int_list("0..3", "--zero") == std::vector<int>{0, 1, 2, 3});
  CHECK(parse_int_list("1,2,8..10", "--tp") == std::vector<int>{1, 2, 8, 9, 10});
  CHECK(parse_int_list("4,4,1", "--pp") == std::vector<int>{4, 1});  // repeats dropped
  for (const char* bad : {"1,x", "", "1,,2", "3..1", "-1", "1.5"}) {
    CAPTURE(bad);
    try {
      parse_int_list(bad, "--tp");
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("--tp") != std::string::npos);
    }
  }
  CHECK(parse_name_list("none,full", "--recompute", {"none", "selective", "full"}) ==
        std::vector<std::string>{"none", "full"});
  CHECK_THROWS_WITH_AS(parse_name_list("none,fast", "--recompute", {"none", "full"}),
                       doctest::Contains("\"fast\""), std::invalid_argument);
}

TEST_CASE("invalid combinations are rows with the experiment's own reason") {
  // gpt-tiny: 4 heads, 8 devices, global batch 8.
  const Evaluator evaluator(kConfigs + "gpt-tiny-3d-8.json", {});
  // tp 8 cannot split 4 heads.
  const Result heads = evaluator.evaluate({8, 1, 0, 0, "none", 1, "", -1, 0});
  CHECK(heads.status == Status::invalid);
  CHECK(heads.reason.find("heads") != std::string::npos);
  CHECK_FALSE(heads.simulated);
  // tp 1, pp 1: dp 8; micro batch 2 makes dp * micro_batch = 16, which does not divide 8.
  const Result batch = evaluator.evaluate({1, 1, 0, 0, "none", 2, "", -1, 0});
  CHECK(batch.status == Status::invalid);
  CHECK(batch.reason.find("global_batch") != std::string::npos);
  CHECK(batch.reason.find("16") != std::string::npos);
  // 3 pipeline stages of 8 devices leave no whole dp.
  CHECK(evaluator.evaluate({1, 3, 0, 0, "none", 1, "", -1, 0}).status == Status::invalid);
  // A valid one is simulated and resolves dp from the cluster: 8 / (2 * 2) = 2.
  const Result ok = evaluator.evaluate({2, 2, 0, 1, "full", 1, "", -1, 0});
  CHECK(ok.status == Status::ok);
  CHECK(ok.simulated);
  CHECK(ok.dp == 2);
  CHECK(ok.iteration_time_s > 0);
  CHECK(ok.fits);
  // The row says the same.
  const auto fields = csv_fields(csv_row({2, 2, 0, 1, "full", 1, "", -1, 0}, ok));
  REQUIRE(fields.size() == csv_fields(csv_header()).size());
  CHECK(fields[column("dp")] == "2");
  CHECK(fields[column("status")] == "ok");
  CHECK(fields[column("fits")] == "true");
  const auto bad = csv_fields(csv_row({1, 1, 0, 0, "none", 2, "", -1, 0}, batch));
  CHECK(bad[column("status")] == "invalid");
  CHECK(bad[column("reason")] == batch.reason);  // commas survive the quoting
  CHECK(bad[column("iteration_time_s")].empty());
}

TEST_CASE("a sweep's rows are the same for any number of threads") {
  const Evaluator evaluator(kConfigs + "gpt-tiny-3d-8.json", {});
  const auto combos = enumerate(small_grid());
  const std::string one = sweep_text(evaluator, combos, 1);
  CHECK(one == sweep_text(evaluator, combos, 2));
  CHECK(one == sweep_text(evaluator, combos, 5));
  // One line per combination after the header.
  CHECK(static_cast<std::size_t>(std::count(one.begin(), one.end(), '\n')) == combos.size() + 1);
}

TEST_CASE("the ordered run emits in index order, and a stopped run emits a prefix") {
  constexpr std::size_t n = 40;
  std::vector<std::size_t> seen;
  // Later items finish first: emission must still follow the index.
  run_ordered(
      0, n, 4,
      [](std::size_t i) {
        std::this_thread::sleep_for(std::chrono::microseconds(100 * ((n - i) % 7)));
        return std::to_string(i);
      },
      [&](std::size_t i, std::string&& line) {
        CHECK(line == std::to_string(i));
        seen.push_back(i);
      },
      nullptr);
  REQUIRE(seen.size() == n);
  for (std::size_t i = 0; i < n; ++i) CHECK(seen[i] == i);

  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  seen.clear();
  const std::size_t emitted = run_ordered(
      0, n, 3,
      [&](std::size_t i) {
        if (++started == 10) stop = true;  // as SIGINT would, part way through
        return std::to_string(i);
      },
      [&](std::size_t i, std::string&&) { seen.push_back(i); }, &stop);
  CHECK(emitted < n);
  CHECK(emitted == seen.size());
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == i);

  // Starting at `first`: items before it are not evaluated.
  seen.clear();
  CHECK(run_ordered(
            35, n, 2, [](std::size_t i) { return std::to_string(i); },
            [&](std::size_t i, std::string&&) { seen.push_back(i); }, nullptr) == 5);
  CHECK(seen == std::vector<std::size_t>{35, 36, 37, 38, 39});
}

TEST_CASE("resume keeps the prefix, drops a cut row and ends with an uninterrupted run's bytes") {
  const Evaluator evaluator(kConfigs + "gpt-tiny-3d-8.json", {});
  const auto combos = enumerate(small_grid());
  const std::string full = sweep_text(evaluator, combos, 2);
  const std::string header = csv_header();
  // Cut after 7 whole rows and half of the 8th, as a kill during a write leaves it.
  std::size_t cut = header.size();
  for (int k = 0; k < 7; ++k) cut = full.find('\n', cut) + 1;
  const std::size_t half = cut + (full.find('\n', cut) - cut) / 2;
  const testing::TempDir tmp("search");
  const auto path = tmp / "resume.csv";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << full.substr(0, half);
  }
  const std::size_t kept = resume(path, header, combos);
  CHECK(kept == 7);
  CHECK(file_text(path) == full.substr(0, cut));  // the cut row is gone
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    run_ordered(
        kept, combos.size(), 2,
        [&](std::size_t i) { return csv_row(combos[i], evaluator.evaluate(combos[i])); },
        [&](std::size_t, std::string&& line) { out << line; }, nullptr);
  }
  CHECK(file_text(path) == full);

  // A file of another grid, or another tool's, is refused with the line that differs.
  Grid other = small_grid();
  other.zero = {1, 3};
  CHECK_THROWS_WITH_AS(resume(path, header, enumerate(other)),
                       doctest::Contains("line 2: not the row of combination 1"),
                       std::runtime_error);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "a,b,c\n1,2,3\n";
  }
  CHECK_THROWS_WITH_AS(resume(path, header, combos), doctest::Contains("line 1"),
                       std::runtime_error);
}

TEST_CASE("mirroring tensor-parallel ranks gives the same iteration time and memory") {
  // Several strategies: tensor parallelism with pipeline and data parallelism, ZeRO-3 and
  // recomputation, sequence parallelism, the interleaved schedule. Mirrored and unmirrored
  // simulations of the same experiment must agree exactly (the analytical network has no
  // contention, and every rank of a 1D tensor-parallel group runs the same plan).
  struct Case {
    const char* file;
    std::vector<strategies::Override> overrides;
  };
  const std::vector<Case> cases = {
      {"gpt3-1.7b-a100-8.json",
       {{"parallelism.tp", 2, "t"}, {"parallelism.pp", 2, "t"}, {"parallelism.dp", 2, "t"}}},
      {"gpt3-1.7b-a100-8.json",
       {{"parallelism.tp", 4, "t"},
        {"parallelism.pp", 1, "t"},
        {"parallelism.dp", 2, "t"},
        {"parallelism.zero", 3, "t"},
        {"parallelism.recompute", "selective", "t"},
        {"parallelism.sequence_parallel", true, "t"}}},
      {"gpt3-1.7b-a100-8.json",
       {{"parallelism.tp", 2, "t"},
        {"parallelism.pp", 4, "t"},
        {"parallelism.dp", 1, "t"},
        {"parallelism.schedule", "interleaved", "t"},
        {"parallelism.virtual_stages", 2, "t"},
        {"parallelism.recompute", "full", "t"}}},
      {"gpt-tiny-3d-8.json", {}},
  };
  for (const auto& c : cases) {
    const auto e = strategies::load_experiment(kConfigs + c.file, c.overrides);
    CAPTURE(c.file);
    CAPTURE(e.parallelism.tp);
    CAPTURE(e.parallelism.pp);
    const auto context = traces::report_context(e);
    sim::SimOptions options;
    options.overheads = study::memory_overheads(e);
    auto run = [&](bool mirror_tp) {
      const auto program =
          study::lower(e, {.mirror_data_parallel = true, .mirror_tensor_parallel = mirror_tp});
      strategies::validate(program);
      return std::make_pair(
          program.op_count(),
          traces::make_report(program, sim::simulate(program, e.cluster, options), context));
    };
    const auto [ops_all, all] = run(false);
    const auto [ops_mirrored, mirrored] = run(true);
    // Only tensor-parallel rank 0 issues ops: a tp-th of them.
    CHECK(ops_mirrored * static_cast<std::size_t>(e.parallelism.tp) == ops_all);
    CHECK(mirrored.iteration_time_s == all.iteration_time_s);
    CHECK(mirrored.peak_memory == all.peak_memory);
    CHECK(mirrored.fits == all.fits);
    CHECK(mirrored.mfu == doctest::Approx(all.mfu).epsilon(1e-12));
    CHECK(mirrored.bubble_fraction == doctest::Approx(all.bubble_fraction).epsilon(1e-12));
    CHECK(mirrored.exposed_comm_s == doctest::Approx(all.exposed_comm_s).epsilon(1e-12));
    REQUIRE(mirrored.ranks.size() == all.ranks.size());
    for (std::size_t r = 0; r < all.ranks.size(); ++r) {
      CHECK(mirrored.ranks[r].peak_memory == all.ranks[r].peak_memory);
    }
  }
}

TEST_CASE("the cluster is resized to a GPU count by whole nodes or part of one node") {
  const auto e = strategies::load_experiment(kConfigs + "gpt3-175b-a100-1024.json");
  REQUIRE(e.cluster.devices_per_node == 8);
  auto values = [](const std::vector<strategies::Override>& o) {
    return std::make_pair(o.at(0).value.get<int>(), o.at(1).value.get<int>());
  };
  CHECK(values(resize_overrides(e.cluster, 64)) == std::make_pair(8, 8));  // 8 nodes of 8
  CHECK(values(resize_overrides(e.cluster, 4)) == std::make_pair(1, 4));   // half a node
  CHECK_THROWS_AS(resize_overrides(e.cluster, 12), std::invalid_argument);
}

TEST_CASE("setting axes: any config value, fastest, one column each, checked on resume") {
  Grid g;
  g.tp = {1};
  g.pp = {1, 2};
  g.zero = {0};
  g.recompute = {"none"};
  g.micro_batch = {1};
  g.settings = {parse_setting_axis("training.global_batch=8,16", "--axis"),
                parse_setting_axis("training.dtype=bf16,fp32", "--axis")};
  const auto combos = enumerate(g);
  // 2 pp x 2 batches x 2 dtypes, the last axis fastest.
  REQUIRE(combos.size() == 8);
  using Setting = std::pair<std::string, std::string>;
  CHECK(combos[0].settings ==
        std::vector<Setting>{{"training.global_batch", "8"}, {"training.dtype", "bf16"}});
  CHECK(combos[1].settings[1].second == "fp32");
  CHECK(combos[2].settings[0].second == "16");
  CHECK(combos[4].pp == 2);
  // Each value is an override, as --set would apply it (JSON: 16 is a number).
  const Evaluator evaluator(kConfigs + "gpt-tiny-3d-8.json", {});
  const auto experiment = evaluator.experiment(combos[3]);
  CHECK(experiment.training.global_batch == 16);
  CHECK(experiment.training.dtype == DType::fp32);
  // The header names the axes after the standard columns, and each row holds its values.
  const std::string header = csv_header(setting_columns(g));
  const auto names = csv_fields(header.substr(0, header.size() - 1));
  REQUIRE(names.size() == csv_fields(csv_header()).size() + 2);
  CHECK(names[names.size() - 2] == "training.global_batch");
  const Result r = evaluator.evaluate(combos[3]);
  CHECK(r.status == Status::ok);
  const std::string row = csv_row(combos[3], r);
  const auto fields = csv_fields(row.substr(0, row.size() - 1));
  REQUIRE(fields.size() == names.size());
  CHECK(fields[names.size() - 2] == "16");
  CHECK(fields[names.size() - 1] == "fp32");
  // Resume checks the axis columns: a file of another axis value is refused.
  const testing::TempDir dir("axis");
  const auto csv = dir.path() / "sweep.csv";
  {
    std::ofstream out(csv, std::ios::binary);
    // Row 2 is combos[1]'s place (batch 8, fp32); combos[0]'s row there has bf16.
    const std::string first = csv_row(combos[0], evaluator.evaluate(combos[0]));
    out << header << first << first;
  }
  CHECK_THROWS_WITH_AS(resume(csv, header, combos),
                       doctest::Contains("training.dtype is bf16, this grid has fp32"),
                       std::runtime_error);
}

TEST_CASE("setting axes: errors name --axis and what was expected") {
  for (const char* bad : {"training.dtype", "=1,2", "training.dtype=", "training.dtype=bf16,,fp32",
                          "parallelism.tp=1,2"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_setting_axis(bad, "--axis"), doctest::Contains("--axis"),
                         std::invalid_argument);
  }
  CHECK_THROWS_WITH_AS(parse_setting_axis("parallelism.tp=1,2", "--axis"),
                       doctest::Contains("use --tp"), std::invalid_argument);
  const SettingAxis first = parse_setting_axis("training.dtype=bf16", "--axis");
  CHECK_THROWS_WITH_AS(parse_setting_axis("training.dtype=fp32", "--axis", {first}),
                       doctest::Contains("given twice"), std::invalid_argument);
}

TEST_CASE("a DLRM sweep over the cache's size: figure columns, and the best row by samples/s") {
  // dlrm-criteo-terabyte-cache-a100-8: a frequency-aware cache on Zipf ids. A larger cache holds
  // a superset of the hottest rows, so its hit rate cannot fall and the rows it moves cannot
  // grow; the whole tables cached hit every lookup and move nothing.
  Grid g;
  g.tp = {1};
  g.pp = {1};
  g.zero = {0};
  g.recompute = {"none"};
  g.micro_batch = {8192};
  g.settings = {parse_setting_axis("embedding_cache.capacity=0.001,0.015,1", "--axis")};
  const Evaluator evaluator(kConfigs + "dlrm-criteo-terabyte-cache-a100-8.json", {});
  CHECK(evaluator.figure_columns() == std::vector<std::string>{"embedding_cache_hit_rate",
                                                               "pcie_host_to_device_bytes",
                                                               "pcie_device_to_host_bytes"});
  const auto combos = enumerate(g);
  REQUIRE(combos.size() == 3);
  const testing::TempDir dir("dlrm-sweep");
  const auto csv = dir.path() / "sweep.csv";
  {
    std::ofstream out(csv, std::ios::binary);
    out << csv_header(sweep_columns(g, evaluator));
    for (const auto& c : combos) out << csv_row(c, evaluator.evaluate(c));
  }
  const auto rows = read_csv_rows(csv);
  REQUIRE(rows.size() == 3);
  const std::size_t hit = csv_fields(csv_header()).size() + 1;  // after the capacity column
  double last_hit = 0, last_bytes = 1e300, last_time = 1e300;
  for (const auto& f : rows) {
    REQUIRE(f.size() == hit + 3);
    CHECK(f[column("status")] == "ok");
    CHECK(std::stod(f[hit]) >= last_hit);
    CHECK(std::stod(f[hit + 1]) <= last_bytes);
    CHECK(std::stod(f[column("iteration_time_s")]) <= last_time);
    last_hit = std::stod(f[hit]);
    last_bytes = std::stod(f[hit + 1]);
    last_time = std::stod(f[column("iteration_time_s")]);
  }
  CHECK(last_hit == 1.0);
  CHECK(last_bytes == 0.0);
  // No tokens: the best row is the one with the most samples/s, the whole tables cached.
  CHECK(std::stod(rows[0][column("tokens_per_s")]) == 0.0);
  const SweepSummary summary = summarize_sweep(csv);
  REQUIRE(summary.best);
  CHECK(*summary.best == 2);
}
