// Elastic batches and the elastic policies (cluster/efficiency.hpp, cluster/pollux.hpp,
// cluster/ones.hpp): statistical efficiency by hand, a batch chosen for goodput, the restart a
// batch change costs, the simulator's checks, determinism, and a property test over random
// elastic traces.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "cluster/efficiency.hpp"
#include "cluster/random.hpp"
#include "cluster/scheduler.hpp"
#include "cluster/simulator.hpp"
#include "cluster/throughput.hpp"
#include "cluster/trace.hpp"
#include "helpers.hpp"
#include "study/errors.hpp"

using namespace stratasim;
using namespace stratasim::cluster;

namespace {

// One job "e" on 4 GPUs, base batch 100, batch in [100, 400], phi = 100 samples, 1,100 samples.
Job elastic_job() {
  Job j;
  j.id = "e1";
  j.experiment = "e";
  j.samples = 1100;
  j.gpus = j.min_gpus = j.max_gpus = 4;
  j.batch = j.min_batch = 100;
  j.max_batch = 400;
  j.noise_scale = 100;
  return j;
}

// Speeds of "e" at 4 GPUs: 1, 2, 3 samples/s at batch 100, 200, 400.
const TableThroughput& batch_table() {
  static const TableThroughput t({{"e", {{4, 1.0}}}}, {{"e", {{{4, 200}, 2.0}, {{4, 400}, 3.0}}}});
  return t;
}

ClusterResult run(const std::vector<Job>& jobs, Scheduler& policy, const Throughput& speeds,
                  int gpus, double restart_s) {
  JobTrace trace{"hand-made", jobs};
  SimulationOptions options;
  options.total_gpus = gpus;
  options.restart_cost = Time::from_seconds(restart_s);
  return simulate_cluster(trace, policy, speeds, options);
}

// Batch 100 until 10 s, then batch 200 (a tick at 10 s), on 4 GPUs.
class SwitchBatch : public Scheduler {
 public:
  std::string name() const override { return "switch"; }
  std::vector<Allocation> decide(const SchedulerInput& input) override {
    return std::vector<Allocation>(input.jobs.size(), Allocation{4, input.now_s < 10 ? 100 : 200});
  }
  std::optional<double> tick_s() const override { return 10.0; }
};

// Gives the job batch 800, above its max_batch.
class TooLarge : public Scheduler {
 public:
  std::string name() const override { return "too-large"; }
  std::vector<Allocation> decide(const SchedulerInput& input) override {
    return std::vector<Allocation>(input.jobs.size(), Allocation{4, 800});
  }
};

}  // namespace

TEST_CASE("statistical efficiency is Pollux's (phi + M0) / (phi + M)") {
  // phi 1000, M0 100: at M = 400, 1100 / 1400; at M0, 1; at M = 50 (smaller), 1100 / 1050.
  CHECK(statistical_efficiency(1000, 100, 400) == doctest::Approx(1100.0 / 1400.0));
  CHECK(statistical_efficiency(1000, 100, 100) == 1.0);
  CHECK(statistical_efficiency(1000, 100, 50) == doctest::Approx(1100.0 / 1050.0));
  // phi = 0: a larger batch adds nothing, E = M0 / M.
  CHECK(statistical_efficiency(0, 100, 400) == doctest::Approx(0.25));
  Job j = elastic_job();
  CHECK(j.efficiency(200) == doctest::Approx(200.0 / 300.0));
  j.min_batch = j.max_batch = j.batch;  // a fixed batch: E = 1 at it
  CHECK(j.efficiency(j.batch) == 1.0);
}

TEST_CASE("pollux picks the batch of the highest goodput") {
  // Goodput at 4 GPUs: batch 100: 1 x 1 = 1; 200: 2 x 200/300 = 4/3; 400: 3 x 200/500 = 1.2.
  // Pollux takes 200: 1,100 samples / (4/3 per s) = 825 s.
  const auto pollux = make_scheduler("pollux");
  const ClusterResult r = run({elastic_job()}, *pollux, batch_table(), 4, 30);
  CHECK(r.jobs[0].completion_s == doctest::Approx(825.0));
  REQUIRE(!r.segments.empty());
  CHECK(r.segments[0].batch == 200);
}

TEST_CASE("a batch change is a resize: it pays the restart cost") {
  // 0-10 s at batch 100: 10 samples of progress. At 10 s batch 200: 30 s restart, then 1,090
  // samples at 4/3 per s = 817.5 s. Completion 10 + 30 + 817.5 = 857.5 s.
  SwitchBatch policy;
  const ClusterResult r = run({elastic_job()}, policy, batch_table(), 4, 30);
  CHECK(r.jobs[0].completion_s == doctest::Approx(857.5));
  CHECK(r.jobs[0].restarts == 1);
  CHECK(r.jobs[0].preemptions == 0);
}

TEST_CASE("the simulator refuses a batch outside the job's bounds") {
  TooLarge policy;
  CHECK_THROWS_WITH_AS(run({elastic_job()}, policy, batch_table(), 4, 30),
                       doctest::Contains("batch 800 (outside [100, 400])"), std::logic_error);
}

TEST_CASE("xoshiro256** is the reference generator") {
  // splitmix64 from 0: its first output is 0xe220a8397b1dcdaf (Vigna's splitmix64.c).
  std::uint64_t state = 0;
  CHECK(splitmix64(state) == 0xe220a8397b1dcdafULL);
  Xoshiro256 a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t x = a.next();
    CHECK(x == b.next());
    differs = differs || x != c.next();
  }
  CHECK(differs);
  for (int i = 0; i < 1000; ++i) {
    CHECK(a.below(7) < 7);
    const double u = a.unit();
    CHECK((u >= 0 && u < 1));
  }
}

namespace {

// Elastic speeds for "x": s(g, M) = M / (M / (100 g) + 0.02 g) samples/s — compute time per
// step grows with the per-GPU batch M / g, plus a synchronisation cost growing with g: concave in
// g, increasing in M. Tabulated at g in 1..16 and M in 64..1024 (powers of two).
const TableThroughput& elastic_table() {
  static const TableThroughput t = [] {
    std::map<std::pair<int, int>, double> rows;
    for (int g = 1; g <= 16; ++g) {
      for (int m = 64; m <= 1024; m *= 2) rows[{g, m}] = m / (m / (100.0 * g) + 0.02 * g);
    }
    return TableThroughput({}, {{"x", rows}});
  }();
  return t;
}

std::vector<Job> random_elastic_jobs(std::uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  const int sizes[] = {1, 2, 4, 8, 16};
  std::vector<Job> jobs;
  double t = 0;
  for (int i = 0; i < count; ++i) {
    t += static_cast<double>(rng() % 900);
    Job j;
    j.id = "r" + std::to_string(i);
    j.arrival_s = t;
    j.experiment = "x";
    j.gpus = sizes[rng() % 5];
    j.min_gpus = std::max(1, j.gpus / 2);
    j.max_gpus = std::min(16, j.gpus * 2);
    j.batch = j.min_batch = 64 << (rng() % 3);
    j.max_batch = j.batch * 4;
    j.noise_scale = static_cast<double>(100 + rng() % 2000);
    j.samples = 1e4 + static_cast<double>(rng() % 200000);
    jobs.push_back(j);
  }
  return jobs;
}

/// The most any allocation of `j` progresses: max over (g, M) of speed x E(M).
double best_goodput(const Job& j) {
  double best = 0;
  for (int g = j.min_gpus; g <= j.max_gpus; ++g) {
    for (int m = j.min_batch; m <= j.max_batch; m *= 2) {
      const Speed s = elastic_table().speed(j, g, m);
      if (s.runnable) best = std::max(best, s.samples_per_s * j.efficiency(m));
    }
  }
  return best;
}

}  // namespace

TEST_CASE("property: elastic policies keep within the cluster and the bounds, and finish") {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    const std::vector<Job> jobs = random_elastic_jobs(seed, 30);
    for (const std::string policy : {"pollux", "ones"}) {
      CAPTURE(seed);
      CAPTURE(policy);
      SchedulerOptions options;
      options.seed = seed;
      const auto scheduler = make_scheduler(policy, options);
      const ClusterResult r = run(jobs, *scheduler, elastic_table(), 16, 30);
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        // Finished, no sooner than its work at its best goodput allows.
        CHECK(r.jobs[i].completion_s >=
              jobs[i].arrival_s + jobs[i].samples / best_goodput(jobs[i]) - 1e-6);
      }
      for (const Segment& s : r.segments) {
        const Job& j = jobs[static_cast<std::size_t>(s.job)];
        CHECK(s.gpus >= j.min_gpus);
        CHECK(s.gpus <= j.max_gpus);
        CHECK(s.batch >= j.min_batch);
        CHECK(s.batch <= j.max_batch);
      }
      const testing::Held held = testing::gpus_held(r);
      CHECK(held.most <= 16);
      CHECK(held.final == 0);
    }
  }
}

TEST_CASE("the same seed gives the same elastic schedule, byte for byte") {
  const std::vector<Job> jobs = random_elastic_jobs(3, 40);
  for (const std::string policy : {"pollux", "ones"}) {
    CAPTURE(policy);
    SchedulerOptions options;
    options.seed = 7;
    const auto first = make_scheduler(policy, options);
    const auto second = make_scheduler(policy, options);
    CHECK(testing::outputs(run(jobs, *first, elastic_table(), 16, 30)) ==
          testing::outputs(run(jobs, *second, elastic_table(), 16, 30)));
  }
}

TEST_CASE("elastic trace fields: batch bounds and the noise scale") {
  std::istringstream good(
      R"({"id": "a", "arrival_s": 0, "experiment": "x", "samples": 10, "gpus": 2, "batch": 64, )"
      R"("min_batch": 32, "max_batch": 256, "noise_scale": 500})"
      "\n");
  const JobTrace t = parse_trace(good, "t.jsonl", 8, false);
  CHECK(t.jobs[0].batch == 64);
  CHECK(t.jobs[0].min_batch == 32);
  CHECK(t.jobs[0].max_batch == 256);
  CHECK(t.jobs[0].noise_scale == 500);
  const auto bad = [](const std::string& line, const char* expected) {
    std::istringstream in(line + "\n");
    CHECK_THROWS_WITH_AS(parse_trace(in, "t.jsonl", 8, false), doctest::Contains(expected),
                         study::BadInput);
  };
  bad(R"({"id": "a", "arrival_s": 0, "experiment": "x", "samples": 10, "gpus": 2, "batch": 64, "max_batch": 128})",
      "t.jsonl:1: noise_scale: missing");
  bad(R"({"id": "a", "arrival_s": 0, "experiment": "x", "samples": 10, "gpus": 2, "batch": 64, "max_batch": 32, "noise_scale": 1})",
      "t.jsonl:1: max_batch: expected max_batch >= batch (64), got 32");
  bad(R"({"id": "a", "arrival_s": 0, "experiment": "x", "samples": 10, "gpus": 2, "max_batch": 32, "noise_scale": 1})",
      "t.jsonl:1: batch: missing");
  bad(R"({"id": "a", "arrival_s": 0, "experiment": "x", "samples": 10, "gpus": 2, "batch": 0})",
      "t.jsonl:1: batch: expected an integer >= 1");
}

TEST_CASE("pollux shares GPUs by marginal gain, then grows the job left alone") {
  // 4 GPUs; a and b arrive at 0, elastic in GPUs (1, 2 or 4), fixed batch. Speeds: a 1, 1.9, 3.4
  // and b 1, 1.2, 1.3 samples/s at 1, 2, 4 GPUs. The fair share is 4 / 2 = 2 GPUs: speedups are
  // over a's 1.9 and b's 1.2. With p = -1, u(s) = -1 / s. Admission: a and b at 1 GPU (2 free).
  // Growth to 2 GPUs: a gains -1 - (-1.9) = 0.9 per GPU, b -1 - (-1.2) = 0.2: a first, then a's
  // next step (2 more GPUs) does not fit the 1 free, so b takes it. a on 2 GPUs: 190 samples in
  // 100 s; b on 2 GPUs makes 120 of its 240 samples by then. At 100 s b is alone: its fair share
  // is 4 GPUs (speedups over 1.3), 4 GPUs add u, so it resizes: 30 s restart, then 120 samples at
  // 1.3/s = 92.3077 s. b completes at 100 + 30 + 120 / 1.3 = 222.3077 s.
  const TableThroughput speeds(
      {{"a", {{1, 1.0}, {2, 1.9}, {4, 3.4}}}, {"b", {{1, 1.0}, {2, 1.2}, {4, 1.3}}}});
  std::vector<Job> jobs(2);
  for (int k = 0; k < 2; ++k) {
    jobs[k].id = k == 0 ? "a" : "b";
    jobs[k].experiment = jobs[k].id;
    jobs[k].gpus = 2;
    jobs[k].min_gpus = 1;
    jobs[k].max_gpus = 4;
  }
  jobs[0].samples = 190;
  jobs[1].samples = 240;
  const auto pollux = make_scheduler("pollux");
  const ClusterResult r = run(jobs, *pollux, speeds, 4, 30);
  CHECK(r.jobs[0].completion_s == doctest::Approx(100.0));
  CHECK(r.jobs[1].completion_s == doctest::Approx(100.0 + 30.0 + 120.0 / 1.3));
  CHECK(r.jobs[1].restarts == 1);
  REQUIRE(r.segments.size() >= 3);
  for (const Segment& s : r.segments) {
    if (s.end_s <= 100.0 + 1e-9) CHECK(s.gpus == 2);    // a and b on 2 GPUs each until 100 s
    if (s.start_s >= 100.0 - 1e-9) CHECK(s.gpus == 4);  // then b on 4
  }
}
