// Cluster scheduling speed: 1,000 jobs arriving over 7 days on 512 GPUs under each policy
// (cluster/simulator.hpp), twice:
// 1. with hand-made speeds (cluster::TableThroughput) so that the figure is the event loop's and
//    the policy's alone (rigid jobs: every policy gives each job its requested GPUs);
// 2. on a Philly-like trace from the generator (cluster/workload.hpp: 1,000 jobs over 7 days,
//    seed 1, elastic bounds), mapped to catalog experiments with memoised simulated speeds
//    (cluster::SimulatedThroughput, shared by all policies: the first policy pays the
//    simulations, reported apart), so that pollux and ones choose GPUs and batches from
//    stratasim's own predictions.
// Prints wall time and the outcome (mean and p90 JCT, makespan, utilisation) per policy.
//   build/bench/bench_cluster [JOBS] [GPUS]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>

#include "cluster/scheduler.hpp"
#include "cluster/simulator.hpp"
#include "cluster/throughput.hpp"
#include "cluster/workload.hpp"

using namespace stratasim;
using namespace stratasim::cluster;

namespace {

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_policy(const std::string& policy, const JobTrace& trace, const Throughput& speeds,
                int gpus) {
  SchedulerOptions scheduler_options;
  scheduler_options.seed = 1;
  const auto scheduler = make_scheduler(policy, scheduler_options);
  SimulationOptions options;
  options.total_gpus = gpus;
  const auto start = std::chrono::steady_clock::now();
  const ClusterResult r = simulate_cluster(trace, *scheduler, speeds, options);
  std::printf(
      "  %-9s %8.3f s wall   mean JCT %9.0f s   p90 %9.0f s   p99 %9.0f s   makespan %9.0f s   "
      "utilisation %5.1f%%   preemptions %d\n",
      policy.c_str(), since(start), r.summary.mean_jct_s, r.summary.p90_jct_s, r.summary.p99_jct_s,
      r.summary.makespan_s, 100 * r.summary.mean_utilisation, r.summary.preemptions);
}

/// The generator's Philly-like trace with simulated, memoised speeds: over `days` (> 0), or at
/// `load`.
void philly_like(int jobs, int gpus, double days, double load) {
  GenerateOptions generate;
  generate.jobs = jobs;
  generate.gpus = gpus;
  generate.days = days;
  generate.load = load;
  generate.seed = 1;
  const SimulatedThroughput speeds;
  auto start = std::chrono::steady_clock::now();
  const JobTrace trace = map_recorded(generate_recorded(generate), gpus, speeds);
  double last = 0;
  for (const Job& j : trace.jobs) last = std::max(last, j.arrival_s);
  std::printf(
      "%d Philly-like jobs arriving over %.1f days on %d GPUs (generator seed 1, %s, simulated "
      "speeds): mapping %.3f s, %d simulations\n",
      jobs, last / 86400, gpus, days > 0 ? "--days 7" : "--load 3", since(start),
      speeds.simulations());
  const int before = speeds.simulations();
  start = std::chrono::steady_clock::now();
  // Warm the memo for the elastic policies' candidates once, so that each policy's wall time
  // below is its scheduling alone.
  for (const std::string policy : {"pollux", "ones"}) {
    const auto scheduler = make_scheduler(policy);
    SimulationOptions options;
    options.total_gpus = gpus;
    (void)simulate_cluster(trace, *scheduler, speeds, options);
  }
  std::printf("  warming the elastic candidates: %.3f s, %d more simulations\n", since(start),
              speeds.simulations() - before);
  for (const std::string& policy : scheduler_names()) run_policy(policy, trace, speeds, gpus);
}

}  // namespace

int main(int argc, char** argv) {
  const int jobs = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int gpus = argc > 2 ? std::atoi(argv[2]) : 512;
  // Ten experiments, each scaling at 90% efficiency per doubling from 100 samples/s on 1 GPU.
  std::map<std::string, std::map<int, double>> table;
  const int sizes[] = {1, 2, 4, 8, 16, 32, 64};
  for (int e = 0; e < 10; ++e) {
    for (int k = 0; k < 7; ++k) {
      table["e" + std::to_string(e)][sizes[k]] = 100.0 * (1 + e) * sizes[k] * std::pow(0.9, k);
    }
  }
  const TableThroughput speeds(table);
  // Arrivals uniform over 7 days; GPUs mostly small (as in published traces, most jobs use one
  // GPU); durations log-uniform from 1 to 50 hours at the requested GPUs (about 85% of 512 GPUs
  // demanded on average: queues form).
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> day(0, 7 * 24 * 3600.0),
      log_h(std::log(1.0), std::log(50.0));
  const int weights[] = {50, 15, 12, 10, 7, 4, 2};
  std::discrete_distribution<int> size(std::begin(weights), std::end(weights));
  JobTrace trace{"bench", {}};
  for (int i = 0; i < jobs; ++i) {
    Job j;
    j.id = "j" + std::to_string(i);
    j.arrival_s = std::floor(day(rng));
    j.experiment = "e" + std::to_string(i % 10);
    j.gpus = j.min_gpus = j.max_gpus = std::min(gpus, sizes[size(rng)]);
    j.samples = std::floor(speeds.speed(j, j.gpus).samples_per_s * 3600 * std::exp(log_h(rng)));
    trace.jobs.push_back(j);
  }
  std::printf("%d jobs over 7 days on %d GPUs (hand-made speeds), restart cost 30 s\n", jobs, gpus);
  for (const std::string& policy : scheduler_names()) run_policy(policy, trace, speeds, gpus);
  philly_like(jobs, gpus, 7, 1.0);
  philly_like(jobs, gpus, 0, 3.0);
  return 0;
}
