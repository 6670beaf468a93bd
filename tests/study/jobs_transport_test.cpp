// Several jobs on one cluster, each with its own `transport` section (docs/priorities.md,
// "Several jobs"): each job's transfers are classed by its own policy and layer count and lose
// what its own loss_bound allows; the fabric's link scheduling is shared and must agree.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "experiment_helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/transport.hpp"
#include "study/errors.hpp"
#include "study/jobs.hpp"
#include "study/study.hpp"

namespace stratasim::testing {
namespace {

using namespace strategies;

/// Two nodes of two A100s on the flow-level network (test_cluster: 25 GB/s and 5 us between
/// nodes), the two GPUs of a node behind one PCIe switch (100 GB/s, 1 us) that owns the
/// node's one NIC. A message from device 0 to device 2 and one from 1 to 3 each cross their
/// own PCIe links (100 GB/s) and the same NIC links (25 GB/s): the NIC is their bottleneck.
/// Latency (topology.hpp, "the sender pays"): 1 us up the PCIe switch + 5 us into the NIC.
hw::ClusterSpec shared_nic() {
  auto c = test_cluster(2, 2);
  c.network_model = hw::NetworkModel::flow;
  hw::TopologySpec t;
  t.kind = hw::TopologyKind::pcie_tree;
  t.devices_per_pcie_switch = 2;
  t.pcie_bandwidth = Bandwidth(100e9);
  t.pcie_latency = Time::us(1);
  c.topology = t;
  return c;
}

/// A data-parallel GPT job of two ranks (placed "0,2;1,3": one rank per node, so that its
/// gradient all-reduce crosses the NIC that the other job's shares).
Experiment dp_job(const std::string& name, int layers) {
  auto e = make_experiment(gpt(8, 512, layers), 1, 1, 2, 8, 1, 256);
  e.name = name;
  return e;
}

/// A job of two ranks whose rank 0 sends one gradient message of 1e8 B to rank 1 (dp_comm,
/// backward: a parameter server's push) carrying layer `layer` of a model of `layer + 1`
/// layers (the job's layer count is the message's layer_end).
Program message_job(int layer) {
  Program p(2);
  OpInfo info;
  info.stream = Stream::dp_comm;
  info.phase = Phase::backward;
  info.layer_begin = static_cast<std::int16_t>(layer);
  info.layer_end = static_cast<std::int16_t>(layer + 1);
  info.label = "push";
  p.begin_rank(0);
  p.add(Send{1, Bytes(100'000'000)}, info);
  p.begin_rank(1);
  p.add(Recv{0, Bytes(100'000'000)}, info);
  p.finish();
  return p;
}

/// A rule with no keys: it matches every transfer, giving it `klass`.
PriorityRule every_transfer(int klass) {
  PriorityRule rule;
  rule.klass = klass;
  return rule;
}

/// Everything in class 1 of 2: the job's traffic yields, at every link, to class 0 of every
/// other job (a job without a section is all class 0).
TransportPolicy yielding() {
  TransportPolicy t;
  t.priority = PriorityPolicy::rules;
  t.classes = 2;
  t.rules.push_back(every_transfer(1));
  return t;
}

/// Job a's message (layer `layer_a`) on devices 0 -> 2 and job b's (layer `layer_b`) on
/// 1 -> 3, under policies `ta` and `tb`: when each message ends (its send's span).
std::pair<Time, Time> two_messages(int layer_a, const TransportPolicy& ta, int layer_b,
                                   const TransportPolicy& tb) {
  const auto cluster = shared_nic();
  const Program a = message_job(layer_a);
  const Program b = message_job(layer_b);
  const int sizes[] = {2, 2};
  const auto placements = study::place_jobs(sizes, "0,2;1,3", cluster);
  const Program* programs[] = {&a, &b};
  const std::string names[] = {"a", "b"};
  const Program merged = study::merge_programs(programs, placements, names, cluster.world_size());
  sim::SimOptions options;
  const TransportPolicy policies[] = {ta, tb};
  study::set_job_transports(options, policies, placements, names, cluster.world_size());
  const auto timeline = sim::simulate(merged, cluster, options);
  REQUIRE(timeline.completed);
  const auto sa = study::split_timeline(timeline, merged, a, placements[0]);
  const auto sb = study::split_timeline(timeline, merged, b, placements[1]);
  return {sa.spans[0].end, sb.spans[0].end};
}

/// The value of report figure `name`, or -1 when the report has none.
double figure(const study::Result& r, const std::string& name) {
  const auto& figures = r.context.figures;
  const auto it =
      std::find_if(figures.begin(), figures.end(), [&](const auto& f) { return f.first == name; });
  return it == figures.end() ? -1 : it->second;
}

/// What `f` throws (BadInput): its message.
template <class F>
std::string bad_input(F&& f) {
  try {
    f();
  } catch (const study::BadInput& e) {
    return e.what();
  }
  FAIL("expected BadInput");
  return {};
}

}  // namespace

TEST_CASE("jobs without transport sections: the results of before") {
  const auto cluster = shared_nic();
  const auto result = study::simulate_jobs(cluster, {dp_job("a", 2), dp_job("b", 4)}, "0,2;1,3");
  REQUIRE(result.merged.completed);
  // The iteration times this run gave before jobs took transport sections (main at 26a4e90,
  // the same test): 8.696661827 ms and 10.884773077 ms.
  CHECK(result.jobs[0].report.iteration_time_s == 0.008696661827);
  CHECK(result.jobs[1].report.iteration_time_s == 0.010884773077);
  // The merged run through SimOptions::transports (a default policy per job) is the run with
  // one default SimOptions::transport for every rank, span for span.
  std::vector<const Program*> programs;
  for (const auto& job : result.jobs) programs.push_back(&job.program);
  const Program merged =
      study::merge_programs(programs, result.placements, result.names, cluster.world_size());
  const auto plain = sim::simulate(merged, cluster);
  REQUIRE(plain.spans.size() == result.merged.spans.size());
  for (std::size_t i = 0; i < plain.spans.size(); ++i) {
    CHECK(plain.spans[i].start == result.merged.spans[i].start);
    CHECK(plain.spans[i].end == result.merged.spans[i].end);
  }
  for (const auto& job : result.jobs) CHECK(figure(job, "gradient_dropped_fraction") == -1);
}

TEST_CASE("jobs: one job's traffic takes precedence over another's on a shared link") {
  // Each message: 6 us of latency (1 us PCIe + 5 us NIC), then 1e8 B through the NIC links
  // they share at 25 GB/s: 1e8 / 2.5e10 = 4 ms alone.
  // - Both in one class (no sections): max-min gives each 12.5 GB/s; both end at
  //   6 us + 2e8 / 2.5e10 = 8.006 ms.
  // - Strict levels: the class-0 message takes the whole 25 GB/s and ends at 6 us + 4 ms =
  //   4.006 ms, as if alone; the class-1 message gets nothing until then and ends at
  //   6 us + (1e8 + 1e8) / 2.5e10 = 8.006 ms.
  const Time alone = Time::us(4'006);
  const Time after = Time::us(8'006);
  const TransportPolicy none;
  CHECK(two_messages(0, none, 0, none) == std::pair{after, after});
  // Job b yields (rules: everything class 1); job a, without a section, is class 0: a first.
  CHECK(two_messages(0, none, 0, yielding()) == std::pair{alone, after});
  // The other way round: the policy is the job's, not the cluster's.
  CHECK(two_messages(0, yielding(), 0, none) == std::pair{after, alone});
  // "layer" with 2 classes counts each job's own layers: job a's message is layer 1 of its 2
  // layers, class floor(1 x 2 / 2) = 1; job b (no section) is class 0: b first. Over the
  // merged Program's 8 layers (b's message is layer 7) a's would be class floor(1 x 2 / 8) =
  // 0, and both would end at 8.006 ms.
  TransportPolicy layer;
  layer.priority = PriorityPolicy::layer;
  layer.classes = 2;
  CHECK(two_messages(1, layer, 7, none) == std::pair{after, alone});
  // Both by layer: a's layer 0 of 1 is class 0, b's layer 7 of 8 class floor(7 x 2 / 8) = 1.
  CHECK(two_messages(0, layer, 7, layer) == std::pair{alone, after});
}

TEST_CASE("jobs: a loss bound drops only its own job's gradient bytes") {
  auto a = dp_job("a", 2);
  a.transport.loss_bound = 0.25;
  const auto b = dp_job("b", 4);
  const auto result = study::simulate_jobs(shared_nic(), {a, b}, "0,2;1,3");
  REQUIRE(result.merged.completed);
  const auto& ra = result.jobs[0];
  // Job a's gradient messages: its data-parallel all-reduces, each described by rank 0's op
  // (the lowest rank of the pair) and counted once, by their per-rank buffer.
  double bytes = 0;
  for (const auto& op : ra.program.ops_of(0)) {
    if (is_gradient_message(op))
      bytes += static_cast<double>(std::get<Collective>(op.work).bytes.count());
  }
  REQUIRE(bytes > 0);
  CHECK(figure(ra, "gradient_bytes_per_iteration") == bytes);
  // Each message drops a quarter of its bytes, rounded to the byte.
  CHECK(figure(ra, "gradient_dropped_fraction") == doctest::Approx(0.25).epsilon(1e-6));
  CHECK(figure(ra, "gradient_bytes_dropped_per_iteration") ==
        doctest::Approx(0.25 * bytes).epsilon(1e-6));
  // The same figures as job a's report alone (the one implementation, study/study.cpp).
  study::Options exact;
  exact.exact = true;
  const auto alone = study::simulate(a, exact);
  for (const char* name : {"gradient_bytes_per_iteration", "gradient_bytes_dropped_per_iteration",
                           "gradient_dropped_fraction"}) {
    CAPTURE(name);
    CHECK(figure(ra, name) == figure(alone, name));
  }
  // Job b set no loss bound: no loss figures, and its all-reduces carry all their bytes.
  const auto& rb = result.jobs[1];
  CHECK(figure(rb, "gradient_dropped_fraction") == -1);
  CHECK(rb.context.figures.empty());
  // Job a's lighter all-reduces end sooner than without the bound; b's is not dropped.
  const auto lossless = study::simulate_jobs(shared_nic(), {dp_job("a", 2), b}, "0,2;1,3");
  CHECK(ra.report.iteration_time_s < lossless.jobs[0].report.iteration_time_s);
}

TEST_CASE("jobs: transport sections that cannot share the fabric are BadInput naming the job") {
  auto a = dp_job("a", 2);
  auto b = dp_job("b", 4);
  a.transport.priority = PriorityPolicy::layer;
  a.transport.classes = 2;
  b.transport = a.transport;
  b.transport.scheduling = LinkScheduling::weighted;
  b.transport.weights = {3, 1};
  const auto run = [&] { return study::simulate_jobs(shared_nic(), {a, b}, "0,2;1,3"); };
  const std::string scheduling = bad_input(run);
  CAPTURE(scheduling);
  CHECK(scheduling.find("job 2 (b): transport.scheduling \"weighted\"") != std::string::npos);
  CHECK(scheduling.find("job 1 (a)'s \"strict\"") != std::string::npos);

  a.transport = b.transport;
  a.transport.weights = {4, 1};
  const std::string weights = bad_input(run);
  CAPTURE(weights);
  CHECK(weights.find("job 2 (b): transport.weights [3, 1]") != std::string::npos);
  CHECK(weights.find("job 1 (a)'s [4, 1]") != std::string::npos);

  a.transport = TransportPolicy{};
  a.transport.priority = PriorityPolicy::fifo;
  b.transport = TransportPolicy{};
  b.transport.priority = PriorityPolicy::rules;
  b.transport.classes = 2;
  b.transport.rules.push_back(every_transfer(1));
  const std::string priority = bad_input(run);
  CAPTURE(priority);
  CHECK(priority.find("job 2 (b): transport.priority \"rules\"") != std::string::npos);
  CHECK(priority.find("job 1 (a)'s \"fifo\"") != std::string::npos);

  a.transport = TransportPolicy{};
  a.transport.priority = PriorityPolicy::layer;
  a.transport.classes = 2;
  b.transport = a.transport;
  b.transport.within_class = strategies::ClassOrder::fifo;
  const std::string within = bad_input(run);
  CAPTURE(within);
  CHECK(within.find("job 2 (b): transport.within_class \"fifo\"") != std::string::npos);
  CHECK(within.find("job 1 (a)'s \"fair\"") != std::string::npos);

  // A job without classes (no section, or one class) takes class 0 under any scheduling; the
  // simulator refuses disagreeing policies on its own too.
  a.transport = TransportPolicy{};
  b.transport = TransportPolicy{};
  b.transport.priority = PriorityPolicy::layer;
  b.transport.classes = 2;
  b.transport.scheduling = LinkScheduling::weighted;
  b.transport.weights = {3, 1};
  CHECK(run().merged.completed);
  const TransportPolicy policies[] = {a.transport, b.transport};
  CHECK_FALSE(sim::transport_conflict(policies));
  a.transport.classes = 2;
  a.transport.priority = PriorityPolicy::layer;
  const TransportPolicy clashing[] = {a.transport, b.transport};
  const auto conflict = sim::transport_conflict(clashing);
  REQUIRE(conflict);
  CHECK(conflict->first == 0);
  CHECK(conflict->second == 1);
  CHECK(conflict->key == "scheduling");
}

}  // namespace stratasim::testing
