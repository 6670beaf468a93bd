// Cluster scheduling speed: 1,000 jobs arriving over 7 days on 512 GPUs under each policy
// (cluster/simulator.hpp), with hand-made speeds (cluster::TableThroughput) so that the figure is
// the event loop's and the policy's alone (real runs add one memoised simulation per distinct
// experiment and GPU count). Prints wall time, decisions' outcome (mean JCT, makespan) per policy.
//   build/bench/bench_cluster [JOBS] [GPUS]
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

using namespace stratasim;
using namespace stratasim::cluster;

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
  for (const std::string& policy : scheduler_names()) {
    const auto scheduler = make_scheduler(policy);
    SimulationOptions options;
    options.total_gpus = gpus;
    const auto start = std::chrono::steady_clock::now();
    const ClusterResult r = simulate_cluster(trace, *scheduler, speeds, options);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "  %-9s %8.3f s wall   mean JCT %9.0f s   p99 %9.0f s   makespan %9.0f s   "
        "utilisation %5.1f%%   preemptions %d\n",
        policy.c_str(), wall, r.summary.mean_jct_s, r.summary.p99_jct_s, r.summary.makespan_s,
        100 * r.summary.mean_utilisation, r.summary.preemptions);
  }
  return 0;
}
