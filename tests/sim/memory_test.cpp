// Memory accounting: overheads, tier capacities, and the fast estimate against the simulation.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "sim/memory.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

// A 2-op program on one rank: +1 GiB of activations, then -1 GiB, with 2 GiB of parameters.
Program two_ops() {
  Program p(1);
  auto k = p.add_kernels({Kernel{Measured{Time::us(10)}, "work"}});
  p.begin_rank(0);
  p.add_initial_memory(0, {MemoryCategory::parameters, MemoryTier::device, Bytes(2LL << 30)});
  MemoryEffect plus{Bytes(1LL << 30), MemoryCategory::activations, MemoryTier::device, true};
  MemoryEffect minus{Bytes(-(1LL << 30)), MemoryCategory::activations, MemoryTier::device, true};
  OpInfo info;
  p.add(Compute{k}, info, {}, std::span<const MemoryEffect>(&plus, 1));
  p.add(Compute{k}, info, {}, std::span<const MemoryEffect>(&minus, 1));
  p.finish();
  return p;
}

hw::ClusterSpec one_device(Bytes capacity) {
  hw::ClusterSpec c = testing::test_cluster(1, 1);
  c.device.memory_capacity = capacity;
  return c;
}

}  // namespace

TEST_CASE("fragmentation and reserved memory add to every device's total, under other") {
  // Allocated peak 3 GiB; with fragmentation 1.25 and 1 GiB reserved the device holds
  // 3 * 1.25 + 1 = 4.75 GiB, of which other = 0.75 + 1 = 1.75 GiB.
  auto program = two_ops();
  sim::SimOptions options;
  options.overheads = {1.25, Bytes(1LL << 30), Bytes(0), Bytes(0)};
  auto t = sim::simulate(program, one_device(Bytes(80LL << 30)), options);
  const auto& peak = t.ranks[0].tiers[0];
  CHECK(peak.peak.count() == (3LL << 30) * 5 / 4 + (1LL << 30));
  CHECK(peak.breakdown[static_cast<std::size_t>(MemoryCategory::other)].count() ==
        (3LL << 30) / 4 + (1LL << 30));
  CHECK(peak.breakdown[static_cast<std::size_t>(MemoryCategory::workspace)].count() == 0);
  CHECK(peak.breakdown[static_cast<std::size_t>(MemoryCategory::activations)].count() == 1LL << 30);
}

TEST_CASE("out of memory is a verdict naming the op; --stop-on-oom ends the run there") {
  auto program = two_ops();
  auto cluster = one_device(Bytes(2LL << 30) + Bytes(512LL << 20));  // 2.5 GiB
  auto t = sim::simulate(program, cluster);
  CHECK(t.completed);
  REQUIRE(t.out_of_memory.size() == 1);
  CHECK(t.out_of_memory[0].first_op == 0);
  CHECK(t.out_of_memory[0].peak.count() == 3LL << 30);
  sim::SimOptions stop;
  stop.stop_on_oom = true;
  auto s = sim::simulate(program, cluster, stop);
  CHECK_FALSE(s.completed);
  CHECK(s.stopped_on_oom);
  CHECK(s.problem.find("--stop-on-oom") != std::string::npos);
  CHECK(s.spans.size() == 1);  // the second op never ran
}

TEST_CASE("host and NVMe capacities are the node's shared evenly by its devices") {
  // A host tier of 1 TiB per 8-device node gives each rank 128 GiB; 200 GiB on it is too much.
  Program p(8);
  for (int r = 0; r < 8; ++r) {
    p.begin_rank(r);
    p.add_initial_memory(r,
                         {MemoryCategory::optimizer_states, MemoryTier::host, Bytes(200LL << 30)});
  }
  p.finish();
  auto cluster = testing::test_cluster(1, 8);
  cluster.host =
      hw::HostSpec{Bytes(1LL << 40), Bandwidth(400e9), 128, 8e7, {Bandwidth(32e9), Time::us(5)}};
  auto t = sim::simulate(p, cluster);
  CHECK(t.ranks[0].tiers[1].capacity.count() == 128LL << 30);
  CHECK(t.out_of_memory.size() == 8);
  CHECK(t.out_of_memory[0].tier == MemoryTier::host);
}

TEST_CASE("the fast estimate finds the simulated peaks of a pipeline") {
  // Issue order is execution order on the compute stream, where every memory effect of these
  // programs sits, so the per-rank peaks agree exactly.
  auto model = testing::load_model(testing::configs_dir() / "models/gpt3-1.7b.json");
  for (auto schedule : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe}) {
    auto e = testing::make_experiment(model, 2, 4, 1, 16, 1, 2048);
    e.parallelism.schedule = schedule;
    auto program = lower(e);
    auto simulated = sim::simulate(program, e.cluster);
    auto estimated = sim::estimate_memory(program, e.cluster, {});
    for (int r = 0; r < program.world_size(); ++r) {
      CAPTURE(r);
      CHECK(estimated.ranks[static_cast<std::size_t>(r)].tiers[0].peak ==
            simulated.ranks[static_cast<std::size_t>(r)].tiers[0].peak);
    }
  }
}
