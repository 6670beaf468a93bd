// The cluster simulator with hand-made speeds (cluster::TableThroughput): JCTs worked by hand in
// the comments, a property test over random traces, restart cost and determinism.
#include <doctest/doctest.h>

#include <random>
#include <sstream>
#include <string>

#include "cluster/scheduler.hpp"
#include "cluster/simulator.hpp"
#include "cluster/throughput.hpp"
#include "cluster/trace.hpp"
#include "helpers.hpp"

using namespace stratasim;
using namespace stratasim::cluster;

namespace {

Job job(std::string id, double arrival_s, std::string experiment, double samples, int gpus) {
  Job j;
  j.id = std::move(id);
  j.arrival_s = arrival_s;
  j.experiment = std::move(experiment);
  j.samples = samples;
  j.gpus = j.min_gpus = j.max_gpus = gpus;
  return j;
}

ClusterResult simulate(const std::vector<Job>& jobs, const std::string& policy,
                       const Throughput& speeds, int gpus, double restart_s,
                       SchedulerOptions scheduler_options = {}) {
  JobTrace trace{"hand-made", jobs};
  const auto scheduler = make_scheduler(policy, scheduler_options);
  SimulationOptions options;
  options.total_gpus = gpus;
  options.restart_cost = Time::from_seconds(restart_s);
  return simulate_cluster(trace, *scheduler, speeds, options);
}

// Experiment "a" runs at 1 sample/s on 4 GPUs, "b" at 1 sample/s on 2 GPUs.
const TableThroughput& table() {
  static const TableThroughput t({{"a", {{4, 1.0}}}, {"b", {{2, 1.0}}}});
  return t;
}

// On 4 GPUs: j1 (0 s, 4 GPUs, 100 samples), j2 (10 s, 2 GPUs, 20 samples), j3 (20 s, 2 GPUs,
// 10 samples).
std::vector<Job> three_jobs() {
  return {job("j1", 0, "a", 100, 4), job("j2", 10, "b", 20, 2), job("j3", 20, "b", 10, 2)};
}

}  // namespace

TEST_CASE("FIFO gives the hand-computed JCTs") {
  // j1 holds all 4 GPUs from 0 to 100. At 100 j2 and j3 start together (2 + 2 GPUs): j2 ends at
  // 120, j3 at 110. JCTs: j1 100 - 0 = 100, j2 120 - 10 = 110, j3 110 - 20 = 90; mean 100;
  // queueing delays 0, 90, 80; makespan 120.
  const ClusterResult r = simulate(three_jobs(), "fifo", table(), 4, 30);
  REQUIRE(r.jobs.size() == 3);
  CHECK(r.jobs[0].jct_s == 100);
  CHECK(r.jobs[1].jct_s == 110);
  CHECK(r.jobs[2].jct_s == 90);
  CHECK(r.jobs[1].queueing_s == 90);
  CHECK(r.jobs[2].queueing_s == 80);
  CHECK(r.summary.mean_jct_s == 100);
  CHECK(r.summary.makespan_s == 120);
  CHECK(r.summary.preemptions == 0);
  // Nearest rank of {90, 100, 110}: p50 the 2nd, p90 and p99 the 3rd.
  CHECK(r.summary.p50_jct_s == 100);
  CHECK(r.summary.p90_jct_s == 110);
  CHECK(r.summary.p99_jct_s == 110);
  // GPU-seconds held: 400 + 40 + 20 = 460 over 4 GPUs x 120 s.
  CHECK(r.summary.mean_utilisation == doctest::Approx(460.0 / 480.0));
}

TEST_CASE("SRTF gives the hand-computed JCTs") {
  // Restart cost 0. At 10 j1 has 90 s left, j2 20 s: j2 first (2 GPUs); j1's 4 no longer fit,
  // so j1 is preempted. At 20 j2 has 10 s left, j3 10 s (a tie: j2 arrived first), j1 90 s:
  // j2 and j3 run, both end at 30. j1 resumes at 30 with 90 samples: ends at 120.
  // JCTs: j1 120, j2 20, j3 10; mean 50; makespan 120; one preemption.
  const ClusterResult r = simulate(three_jobs(), "srtf", table(), 4, 0);
  CHECK(r.jobs[0].jct_s == 120);
  CHECK(r.jobs[1].jct_s == 20);
  CHECK(r.jobs[2].jct_s == 10);
  CHECK(r.jobs[0].preemptions == 1);
  CHECK(r.summary.mean_jct_s == 50);
  CHECK(r.summary.makespan_s == 120);
}

TEST_CASE("a preempted job is delayed by exactly the restart cost") {
  // The SRTF case with a restart cost of 30 s: j1 resumes at 30, restarts until 60, and its 90
  // samples take it to 150 = 120 + 30. j2 and j3 never restart.
  const ClusterResult r = simulate(three_jobs(), "srtf", table(), 4, 30);
  CHECK(r.jobs[0].completion_s == 150);
  CHECK(r.jobs[0].restarts == 1);
  CHECK(r.jobs[1].jct_s == 20);
  CHECK(r.jobs[2].jct_s == 10);
  bool saw_restart = false;
  for (const Segment& s : r.segments) {
    if (s.restarting) {
      saw_restart = true;
      CHECK(s.job == 0);
      CHECK(s.start_s == 30);
      CHECK(s.end_s == 60);
    }
  }
  CHECK(saw_restart);
}

TEST_CASE("FIFO blocks behind the head of the queue") {
  // 4 GPUs. k1 (0 s, 2 GPUs, 50 samples) runs 0-50. k2 (1 s, 4 GPUs, 10 samples) cannot start
  // until k1 ends: 50-60. k3 (2 s, 2 GPUs, 5 samples) would fit at 2 s but waits behind k2:
  // 60-65, JCT 63 (no backfilling).
  const std::vector<Job> jobs = {job("k1", 0, "b", 50, 2), job("k2", 1, "a", 10, 4),
                                 job("k3", 2, "b", 5, 2)};
  const ClusterResult r = simulate(jobs, "fifo", table(), 4, 30);
  CHECK(r.jobs[1].start_s == 50);
  CHECK(r.jobs[2].start_s == 60);
  CHECK(r.jobs[2].jct_s == 63);
}

TEST_CASE("Tiresias demotes a long job below a short one") {
  // 2 GPUs, one threshold at 100 GPU-seconds, ticks every 10 s, restart cost 0. L (0 s, 2 GPUs,
  // 1000 samples at 1/s) has 80 GPU-seconds when S (40 s, 2 GPUs, 30 samples) arrives: both in
  // queue 0, L first by arrival, so S waits. At the tick at 50 L reaches 100 GPU-seconds and
  // drops to queue 1: S runs 50-80 (JCT 40), L resumes at 80 with 950 samples: ends at 1030.
  // FIFO would keep S waiting until 1000 (JCT 990).
  const TableThroughput speeds({{"x", {{2, 1.0}}}});
  const std::vector<Job> jobs = {job("L", 0, "x", 1000, 2), job("S", 40, "x", 30, 2)};
  SchedulerOptions o;
  o.tiresias_thresholds_gpu_s = {100};
  o.tick_s = 10;
  const ClusterResult r = simulate(jobs, "tiresias", speeds, 2, 0, o);
  CHECK(r.jobs[1].start_s == 50);
  CHECK(r.jobs[1].jct_s == 40);
  CHECK(r.jobs[0].completion_s == 1030);
  CHECK(r.jobs[0].preemptions == 1);
  const ClusterResult fifo = simulate(jobs, "fifo", speeds, 2, 0);
  CHECK(fifo.jobs[1].jct_s == 990);
}

TEST_CASE("an unknown scheduler is bad input naming --scheduler") {
  CHECK_THROWS_WITH(
      make_scheduler("gandiva"),
      doctest::Contains("--scheduler: expected fifo, srtf, tiresias, pollux or ones"));
}

namespace {

std::vector<Job> random_jobs(std::uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  const int sizes[] = {1, 2, 4, 8, 16};
  std::vector<Job> jobs;
  double t = 0;
  for (int i = 0; i < count; ++i) {
    t += static_cast<double>(rng() % 600);
    const int g = sizes[rng() % 5];
    jobs.push_back(
        job("r" + std::to_string(i), t, "e", 100.0 + static_cast<double>(rng() % 5000), g));
  }
  return jobs;
}

// "e" at g GPUs: 0.9 g samples/s (imperfect scaling, exact in binary for the test's checks).
const TableThroughput& scaling() {
  static const TableThroughput t({{"e", {{1, 0.9}, {2, 1.8}, {4, 3.6}, {8, 7.2}, {16, 14.4}}}});
  return t;
}

}  // namespace

TEST_CASE("property: no policy exceeds the cluster's GPUs and every job finishes") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<Job> jobs = random_jobs(seed, 40);
    for (const std::string& policy : scheduler_names()) {
      CAPTURE(seed);
      CAPTURE(policy);
      const ClusterResult r = simulate(jobs, policy, scaling(), 16, 30);
      // Every job finished, no sooner than its work at its speed allows.
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        const double alone = jobs[i].samples / (0.9 * jobs[i].gpus);
        CHECK(r.jobs[i].completion_s >= jobs[i].arrival_s + alone - 1e-6);
        CHECK(r.jobs[i].start_s >= jobs[i].arrival_s);
      }
      // GPUs held at every instant, from the segments (independently of the utilisation steps).
      const testing::Held held = testing::gpus_held(r);
      CHECK(held.most <= 16);
      CHECK(held.final == 0);
      for (const UtilisationStep& u : r.utilisation) CHECK(u.busy_gpus <= 16);
    }
  }
}

TEST_CASE("the same trace and policy give byte-identical outputs") {
  const std::vector<Job> jobs = random_jobs(7, 60);
  for (const std::string& policy : scheduler_names()) {
    CAPTURE(policy);
    const std::string first = testing::outputs(simulate(jobs, policy, scaling(), 16, 30));
    const std::string second = testing::outputs(simulate(jobs, policy, scaling(), 16, 30));
    CHECK(first == second);
  }
}

namespace {

// A broken policy: gives every job `gpus` (0: leaves them all queued).
class Fixed : public Scheduler {
 public:
  explicit Fixed(int gpus) : gpus_(gpus) {}
  std::string name() const override { return "fixed"; }
  std::vector<int> allocate(const SchedulerInput& input) override {
    return std::vector<int>(input.jobs.size(), gpus_);
  }
  std::optional<double> tick_s() const override { return 10.0; }

 private:
  int gpus_;
};

}  // namespace

TEST_CASE("the simulator refuses a policy that over-allocates or never runs anything") {
  JobTrace trace{"hand-made", three_jobs()};
  SimulationOptions options;
  options.total_gpus = 4;
  Fixed idle(0);
  CHECK_THROWS_WITH_AS(simulate_cluster(trace, idle, table(), options),
                       doctest::Contains("queued on an idle cluster"), std::logic_error);
  // j1 asks for 4 GPUs: 4 + 4 at 10 s exceeds the cluster (and j2 cannot take 4).
  Fixed greedy(4);
  CHECK_THROWS_AS(simulate_cluster(trace, greedy, table(), options), std::logic_error);
}
