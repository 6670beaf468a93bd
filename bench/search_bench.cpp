// Search speed: `stratasim search gpt3-175b-a100-1024 --gpus 1024` (GPT-3 175B on 1,024 A100s,
// throughput objective) with the default axes and with every opt-in axis on (--schedules
// 1f1b,interleaved --interleave 2 --sequence-parallel 0,1 --try-fsdp), as the CLI runs it:
// search_space, the pruned evaluation in THREADS threads, the ranking. Target: the whole search
// under 30 s on 2 threads. Prints per run the combinations (invalid, pruned by each check,
// simulated, fit), the wall time, the time summed over the evaluations by outcome, the slowest
// evaluations, and the top five plans with their MFU.
//
//   build/bench/bench_search            # 2 threads, both runs
//   build/bench/bench_search 1          # threads
//   build/bench/bench_search 2 --all    # only the run with every opt-in axis
//   build/bench/bench_search 2 --default
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "search/search.hpp"
#include "search/sweep.hpp"
#include "sim/memory.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "strategies/matching.hpp"
#include "study/partition.hpp"
#include "study/study.hpp"
#include "traces/context.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string describe(const search::Combination& c, const search::Result& r) {
  char text[200];
  std::snprintf(text, sizeof text, "tp %d pp %d dp %d %s %d %s v%d sp %s %s mb %d", c.tp, c.pp,
                r.dp, c.framework == "fsdp" ? "fsdp" : "zero", c.zero, r.schedule.c_str(),
                c.virtual_stages > 0 ? c.virtual_stages : 1, r.sequence_parallel ? "on" : "off",
                c.recompute.c_str(), c.micro_batch);
  return text;
}

// Where one evaluation's time goes (as Evaluator::evaluate does it, without the pruning).
void profile_one(const search::Evaluator& evaluator, const search::Combination& c,
                 const search::Result& r) {
  auto t = Clock::now();
  const auto e = evaluator.experiment(c);
  const double load = since(t);
  t = Clock::now();
  auto spec = strategies::pipeline_spec(e, study::partition_layers(e));
  spec.mirror_data_parallel = spec.mirror_tensor_parallel = study::mirrors(e, false);
  const auto program = strategies::assemble_pipeline(spec);
  const double lower = since(t);
  t = Clock::now();
  strategies::validate(program);
  const double validate = since(t);
  t = Clock::now();
  const auto overheads = study::memory_overheads(e);
  (void)sim::estimate_memory(program, e.cluster, overheads);
  const double estimate = since(t);
  t = Clock::now();
  sim::SimOptions options;
  options.overheads = overheads;
  options.record_memory = false;
  const auto timeline = sim::simulate(program, e.cluster, options);
  const double simulate = since(t);
  t = Clock::now();
  (void)traces::make_report(program, timeline, traces::report_context(e));
  const double report = since(t);
  std::printf(
      "    %-60s %8zu ops: load %.3f, lower %.3f, validate %.3f, estimate %.3f, "
      "simulate %.3f, report %.3f s\n",
      describe(c, r).c_str(), program.op_count(), load, lower, validate, estimate, simulate,
      report);
}

void run(const std::string& experiment, const char* label, const search::SearchSpace& space,
         int jobs) {
  const auto t0 = Clock::now();
  const search::Evaluator evaluator(experiment, {}, {.prune = true});
  const auto combos = search::search_space(evaluator.base(), space);
  std::vector<search::Result> results(combos.size());
  std::vector<double> seconds(combos.size(), 0);
  search::run_ordered(
      0, combos.size(), jobs,
      [&](std::size_t i) {
        const auto start = Clock::now();
        results[i] = evaluator.evaluate(combos[i]);
        seconds[i] = since(start);
        return std::string();
      },
      [](std::size_t, std::string&&) {}, nullptr);
  const auto ranking = search::rank_results(search::Objective::throughput, results);
  const double wall = since(t0);

  std::size_t invalid = 0, by_states = 0, by_estimate = 0, simulated = 0, fit = 0;
  double invalid_s = 0, pruned_s = 0, simulated_s = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (r.status == search::Status::invalid) {
      ++invalid;
      invalid_s += seconds[i];
    } else if (r.simulated) {
      ++simulated;
      simulated_s += seconds[i];
    } else if (r.status == search::Status::oom) {
      (r.reason.find("model states") != std::string::npos ? by_states : by_estimate) += 1;
      pruned_s += seconds[i];
    }
    fit += r.status == search::Status::ok ? 1 : 0;
  }
  std::printf(
      "%s: %zu combinations: %zu invalid, %zu pruned (model states), %zu pruned "
      "(estimate), %zu simulated, %zu fit\n",
      label, combos.size(), invalid, by_states, by_estimate, simulated, fit);
  std::printf(
      "  whole search %.2f s on %d thread%s (target: under 30 s on 2); evaluation "
      "time summed: invalid %.2f s, pruned %.2f s, simulated %.2f s\n",
      wall, jobs, jobs == 1 ? "" : "s", invalid_s, pruned_s, simulated_s);
  std::vector<std::size_t> slowest(combos.size());
  for (std::size_t i = 0; i < slowest.size(); ++i) slowest[i] = i;
  std::sort(slowest.begin(), slowest.end(),
            [&](std::size_t a, std::size_t b) { return seconds[a] > seconds[b]; });
  std::printf("  slowest evaluations:\n");
  for (std::size_t k = 0; k < std::min<std::size_t>(5, slowest.size()); ++k) {
    const std::size_t i = slowest[k];
    std::printf("    %.3f s  %-60s %s\n", seconds[i], describe(combos[i], results[i]).c_str(),
                std::string(search::name_of(results[i].status)).c_str());
  }
  std::printf("  the slowest three again, phase by phase (1 thread):\n");
  for (std::size_t k = 0; k < std::min<std::size_t>(3, slowest.size()); ++k) {
    if (results[slowest[k]].simulated) {
      profile_one(evaluator, combos[slowest[k]], results[slowest[k]]);
    }
  }
  std::printf("  top 5 by throughput:\n");
  for (std::size_t k = 0; k < std::min<std::size_t>(5, ranking.order.size()); ++k) {
    const std::size_t i = ranking.order[k];
    const auto& r = results[i];
    std::printf("    %zu. %-60s %7.3f s/iteration  MFU %.1f%%  peak %.1f GiB\n", k + 1,
                describe(combos[i], r).c_str(), r.iteration_time_s, 100 * r.mfu,
                static_cast<double>(r.peak_memory_bytes) / (1LL << 30));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int jobs = 2;
  bool with_default = true, with_all = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--all") == 0) {
      with_default = false;
    } else if (std::strcmp(argv[i], "--default") == 0) {
      with_all = false;
    } else {
      jobs = std::max(1, std::atoi(argv[i]));
    }
  }
  const std::string experiment =
      std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt3-175b-a100-1024.json";
  search::SearchSpace space;
  space.gpus = 1024;
  if (with_default) run(experiment, "default axes", space, jobs);
  space.schedules = {"1f1b", "interleaved"};
  space.virtual_stages = {2};
  space.sequence_parallel = {0, 1};
  space.fsdp = true;
  if (with_all) run(experiment, "every opt-in axis", space, jobs);
  return 0;
}
