// Sweep speed (issue 7): GPT-3 175B on 1,024 A100s over the whole grid tp {1,2,4,8} x
// pp {1,2,4,8,16} x zero 0..3 x recompute {none,selective,full} x micro-batch {1,2,4}
// (720 combinations), as `stratasim sweep` runs it. Target: the full sweep under 60 s on 2
// threads. Prints the combinations, how many were valid and simulated, the wall time and
// configurations per second, and the time spent per phase (load, lower, simulate, report) of
// a few single simulations for profiling.
//
//   build/bench/bench_sweep            # 2 threads
//   build/bench/bench_sweep 1          # threads
//   build/bench/bench_sweep 2 --dp-mirror-only  # data-parallel mirroring only, as simulate
//   build/bench/bench_sweep 2 --csv a.csv       # also write the rows (compare the two modes)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "search/sweep.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "study/study.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Where one simulation's time goes, for the largest cases of the grid.
void profile_one(const search::Evaluator& evaluator, const search::Combination& c) {
  auto t0 = Clock::now();
  const auto e = evaluator.experiment(c);
  const double load = since(t0);
  auto t1 = Clock::now();
  const auto program =
      study::lower(e, {.mirror_data_parallel = true, .mirror_tensor_parallel = true});
  const double lower = since(t1);
  auto t2 = Clock::now();
  sim::SimOptions options;
  options.overheads = study::memory_overheads(e);
  options.record_memory = false;
  const auto timeline = sim::simulate(program, e.cluster, options);
  const double simulate = since(t2);
  auto t3 = Clock::now();
  const auto report = traces::make_report(program, timeline, traces::report_context(e));
  const double report_s = since(t3);
  std::printf(
      "  tp %d pp %d zero %d %-9s mb %d: %9zu ops, load %.3f s, lower %.3f s, simulate %.3f s, "
      "report %.3f s; iteration %.3f s\n",
      c.tp, c.pp, c.zero, c.recompute.c_str(), c.micro_batch, program.op_count(), load, lower,
      simulate, report_s, report.iteration_time_s);
}

}  // namespace

int main(int argc, char** argv) {
  int jobs = 2;
  bool dp_only = false;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dp-mirror-only") == 0) {
      dp_only = true;
    } else if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv = argv[++i];
    } else {
      jobs = std::atoi(argv[i]);
    }
  }
  const std::string root = STRATASIM_SOURCE_DIR;
  search::Grid grid;
  grid.tp = {1, 2, 4, 8};
  grid.pp = {1, 2, 4, 8, 16};
  grid.zero = {0, 1, 2, 3};
  grid.recompute = {"none", "selective", "full"};
  grid.micro_batch = {1, 2, 4};
  const auto combos = search::enumerate(grid);
  auto t0 = Clock::now();
  const search::Evaluator evaluator(root + "/configs/experiments/gpt3-175b-a100-1024.json", {},
                                    {.mirror_tensor_parallel = !dp_only});
  const double load = since(t0);

  std::printf("profile of single simulations (mirrored tensor- and data-parallel ranks):\n");
  profile_one(evaluator, {8, 16, 0, 0, "none", 1, "", -1, 0});
  profile_one(evaluator, {8, 16, 0, 3, "full", 1, "", -1, 0});

  std::vector<search::Result> results(combos.size());
  auto t1 = Clock::now();
  search::run_ordered(
      0, combos.size(), jobs,
      [&](std::size_t i) {
        results[i] = evaluator.evaluate(combos[i]);
        return std::string();
      },
      [](std::size_t, std::string&&) {}, nullptr);
  const double wall = since(t1);
  if (!csv.empty()) {
    std::ofstream out(csv, std::ios::binary | std::ios::trunc);
    out << search::csv_header();
    for (std::size_t i = 0; i < combos.size(); ++i) out << search::csv_row(combos[i], results[i]);
  }
  std::size_t valid = 0, simulated = 0, fits = 0;
  for (const auto& r : results) {
    valid += r.status != search::Status::invalid ? 1 : 0;
    simulated += r.simulated ? 1 : 0;
    fits += r.status == search::Status::ok ? 1 : 0;
  }
  std::printf(
      "GPT-3 175B on 1,024 A100s, %zu combinations: %zu valid, %zu simulated, %zu fit; "
      "%d threads%s\n",
      combos.size(), valid, simulated, fits, jobs,
      dp_only ? ", data-parallel mirroring only" : ", tensor- and data-parallel mirroring");
  std::printf(
      "base experiment read in %.3f s; sweep %.2f s, %.1f configurations/s (target: under "
      "60 s)\n",
      load, wall, static_cast<double>(combos.size()) / wall);
  return 0;
}
