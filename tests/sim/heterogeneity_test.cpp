// Clusters whose devices differ (per-device overrides): each rank is costed on its own device,
// a straggler's compute takes `slowdown` times longer, memory capacity is the rank's own.
#include <doctest/doctest.h>

#include "sim/helpers.hpp"
#include "sim/simulator.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using stratasim::testing::measured;
using stratasim::testing::test_cluster;
using stratasim::testing::test_device;

namespace {

// Each of 2 ranks runs one op of 1 ms of measured work, then they all-reduce 0 bytes.
Program two_ranks() {
  Program p(2);
  const auto work = measured(p, Time::ms(1));
  const auto g = p.add_group({0, 1}, "dp 0");
  for (int r = 0; r < 2; ++r) {
    p.begin_rank(r);
    const MemoryEffect alloc{Bytes(600), MemoryCategory::activations, MemoryTier::device, false};
    p.add(work, OpInfo{Stream::compute, Phase::forward, 0, -1, -1, "work"}, {},
          std::span(&alloc, 1));
    p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(0)},
          OpInfo{Stream::compute, Phase::backward, 0, -1, -1, "sync"});
  }
  p.finish();
  return p;
}

}  // namespace

TEST_CASE("a straggler's compute takes slowdown times longer and holds up the collective") {
  auto cluster = test_cluster(1, 2);
  hw::DeviceOverride slow;
  slow.ranks = {1};
  slow.slowdown = 2.5;
  cluster.overrides.push_back(slow);
  const auto program = two_ranks();
  const auto t = sim::simulate(program, cluster);
  REQUIRE(t.completed);
  // Measured work (no launch overhead: the measurement includes it) is on-device work: rank 0
  // takes 1 ms, rank 1 2.5 ms.
  const auto ops0 = program.first_op(0);
  const auto ops1 = program.first_op(1);
  CHECK(t.spans[ops0].end - t.spans[ops0].start == Time::ms(1));
  CHECK(t.spans[ops1].end - t.spans[ops1].start == Time::us(2500));
  // The all-reduce starts when both are there: at rank 1's end.
  CHECK(t.spans[ops0 + 1].start == Time::us(2500));
}

TEST_CASE("a rank of another device type has that device's memory capacity") {
  auto cluster = test_cluster(1, 2, Bytes(1000));
  hw::DeviceOverride other;
  other.ranks = {1};
  other.device = test_device(Bytes(500));
  other.device->name = "small-device";
  cluster.overrides.push_back(other);
  const auto t = sim::simulate(two_ranks(), cluster);
  // Both ranks allocate 600 bytes: it fits in rank 0's 1000, not in rank 1's 500.
  REQUIRE(t.out_of_memory.size() == 1);
  CHECK(t.out_of_memory[0].rank == 1);
  CHECK(t.out_of_memory[0].capacity == Bytes(500));
  CHECK(t.ranks[0].tiers[0].capacity == Bytes(1000));
}
