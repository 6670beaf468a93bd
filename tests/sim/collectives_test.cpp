// Collective algorithms: the rule that chooses them, their schedules, and their alpha-beta
// times worked out by hand in the comments.
#include <doctest/doctest.h>

#include <numeric>
#include <stdexcept>
#include <vector>

#include "hw_models/topology.hpp"
#include "sim/collectives.hpp"
#include "sim/helpers.hpp"

using namespace stratasim;
using hw::CollectiveAlgorithm;
using strategies::CollectiveKind;

// The test cluster: intra-node 100 GB/s and 1 us; inter-node 10 GB/s and 5 us; 8 per node.

namespace {

std::vector<std::int32_t> iota(int n, int first = 0) {
  std::vector<std::int32_t> r(static_cast<std::size_t>(n));
  std::iota(r.begin(), r.end(), first);
  return r;
}

hw::ClusterSpec sharp_cluster(int nodes) {
  auto c = testing::test_cluster(nodes, 8);
  hw::TopologySpec t;
  t.kind = hw::TopologyKind::nvswitch;
  t.sharp = true;
  c.topology = t;
  return c;
}

}  // namespace

TEST_CASE("collectives: the rule that chooses an algorithm") {
  const auto cluster = testing::test_cluster(4, 8);
  const Bytes big(1 << 30), small(64 * 1024);
  const sim::GroupShape node{8, 1, 8}, spread{4, 4, 1}, hier{32, 4, 8};
  using K = CollectiveKind;
  using A = CollectiveAlgorithm;
  auto choose = [&](K k, const sim::GroupShape& s, Bytes b, bool sw = false) {
    return sim::choose_algorithm(k, s, b, cluster, sw);
  };
  // Within a node: the ring, or NVLS for an all-reduce where the switch reduces.
  CHECK(choose(K::all_reduce, node, big) == A::ring);
  CHECK(choose(K::all_reduce, node, big, true) == A::nvls);
  CHECK(choose(K::all_reduce, node, small, true) == A::nvls);
  CHECK(choose(K::reduce_scatter, node, big, true) == A::ring);
  CHECK(choose(K::all_to_all, node, big) == A::ring);
  // Across nodes: hierarchical with several ranks per node; the flat ring with one per node
  // and for broadcast, reduce, all-to-all; but the tree for all-reduces below 256 KiB where its
  // alpha-beta time is less.
  // One rank on each of 4 nodes, 64 KiB: the tree (two trees 2 deep) pays 4 x 5 us and sends
  // 2 x 65536 B through the busiest NIC (13.1 us): 33.1 us; the ring 6 x 5 us and
  // 1.5 x 65536 B (9.8 us): 39.8 us. The tree.
  CHECK(choose(K::all_reduce, spread, small) == A::tree);
  CHECK(choose(K::all_reduce, spread, sim::kTreeThreshold) == A::ring);
  // On 3 nodes the trees are 2 deep: 4 latencies as the ring, and more bytes: the ring.
  CHECK(choose(K::all_reduce, sim::GroupShape{3, 3, 1}, small) == A::ring);
  // 4 nodes of 8: the trees over 32 ranks are 5 deep (10 x 5 us = 50 us); the hierarchical
  // algorithm pays 2 x 7 x 1 us + 2 x 3 x 5 us = 44 us and fewer bytes: hierarchical.
  CHECK(choose(K::all_reduce, hier, small) == A::hierarchical);
  CHECK(choose(K::all_reduce, hier, big) == A::hierarchical);
  // With the candidates' times given (the group's own links), the faster wins.
  auto tree_faster = [](A a) { return a == A::tree ? Time::us(1) : Time::us(2); };
  CHECK(sim::choose_algorithm(K::all_reduce, hier, small, cluster, false, tree_faster) == A::tree);
  CHECK(sim::choose_algorithm(K::all_reduce, hier, big, cluster, false, tree_faster) ==
        A::hierarchical);
  CHECK(choose(K::reduce_scatter, hier, big) == A::hierarchical);
  CHECK(choose(K::all_gather, hier, small) == A::hierarchical);
  CHECK(choose(K::broadcast, hier, big) == A::ring);
  CHECK(choose(K::reduce, hier, big) == A::ring);
  CHECK(choose(K::all_to_all, hier, big) == A::ring);
  CHECK(choose(K::all_reduce, sim::GroupShape{1, 1, 1}, big, true) == A::ring);

  // A fixed choice wins, resolved where it does not apply.
  auto fixed = cluster;
  fixed.collectives.algorithm[static_cast<std::size_t>(K::all_reduce)] = A::direct;
  fixed.collectives.algorithm[static_cast<std::size_t>(K::reduce_scatter)] = A::tree;
  fixed.collectives.algorithm[static_cast<std::size_t>(K::all_gather)] = A::hierarchical;
  fixed.collectives.algorithm[static_cast<std::size_t>(K::all_to_all)] = A::nvls;
  CHECK(sim::choose_algorithm(K::all_reduce, node, small, fixed, true) == A::direct);
  CHECK(sim::choose_algorithm(K::reduce_scatter, hier, big, fixed, false) == A::ring);
  CHECK(sim::choose_algorithm(K::all_gather, node, big, fixed, false) == A::ring);
  CHECK(sim::choose_algorithm(K::all_gather, hier, big, fixed, false) == A::hierarchical);
  CHECK_THROWS_AS(sim::choose_algorithm(K::all_to_all, node, big, fixed, true),
                  std::invalid_argument);

  // Where the analytical model sees a reducing switch.
  CHECK_FALSE(sim::cluster_switch_reduces(cluster, node));
  CHECK(sim::cluster_switch_reduces(sharp_cluster(2), node));
  CHECK_FALSE(sim::cluster_switch_reduces(sharp_cluster(2), hier));
}

TEST_CASE("collectives: resolving an algorithm for a kind") {
  using K = CollectiveKind;
  using A = CollectiveAlgorithm;
  const sim::GroupShape node{8, 1, 8}, hier{16, 2, 8};
  CHECK(sim::resolve_algorithm(K::all_reduce, A::tree, node) == A::tree);
  CHECK(sim::resolve_algorithm(K::broadcast, A::tree, node) == A::ring);
  CHECK(sim::resolve_algorithm(K::reduce_scatter, A::halving_doubling, node) ==
        A::halving_doubling);
  CHECK(sim::resolve_algorithm(K::all_to_all, A::halving_doubling, node) == A::ring);
  CHECK(sim::resolve_algorithm(K::all_reduce, A::hierarchical, node) == A::ring);
  CHECK(sim::resolve_algorithm(K::all_reduce, A::hierarchical, hier) == A::hierarchical);
  CHECK(sim::resolve_algorithm(K::broadcast, A::hierarchical, hier) == A::ring);
  CHECK(sim::resolve_algorithm(K::broadcast, A::direct, hier) == A::direct);
  CHECK(sim::resolve_algorithm(K::reduce, A::nvls, node) == A::nvls);
  CHECK_THROWS_AS(sim::resolve_algorithm(K::all_to_all, A::nvls, node), std::invalid_argument);
  CHECK_THROWS_AS(sim::resolve_algorithm(K::all_reduce, A::automatic, node), std::logic_error);
}

TEST_CASE("collectives: schedules") {
  using K = CollectiveKind;
  using A = CollectiveAlgorithm;
  const std::vector<int> one_node(4, 0);
  // Ring all-reduce over 4: one phase of 4 flows i -> i+1 of 2*3/4 S, 6 latencies.
  auto ring = sim::build_schedule(K::all_reduce, A::ring, one_node);
  REQUIRE(ring.phases.size() == 1);
  CHECK(ring.phases[0].steps == 6);
  REQUIRE(ring.phases[0].flows.size() == 4);
  CHECK(ring.phases[0].flows[3].src == 3);
  CHECK(ring.phases[0].flows[3].dst == 0);
  CHECK(ring.phases[0].flows[0].share.of(Bytes(1000)) == Bytes(1500));
  // Ring all-to-all: 3 lock-step phases of S/4 to the member s away.
  auto a2a = sim::build_schedule(K::all_to_all, A::ring, one_node);
  REQUIRE(a2a.phases.size() == 3);
  CHECK(a2a.phases[1].flows[3].dst == 1);
  // Tree over 8: two trees of 7 edges, each carrying S/2 up and S/2 down; depth 3.
  auto tree = sim::build_schedule(K::all_reduce, A::tree, std::vector<int>(8, 0));
  REQUIRE(tree.phases.size() == 1);
  CHECK(tree.phases[0].flows.size() == 28);
  CHECK(tree.phases[0].steps == 6);
  // Halving-doubling over 6: pre-step, 2 halving steps, 2 doubling steps, post-step.
  auto hd = sim::build_schedule(K::all_reduce, A::halving_doubling, std::vector<int>(6, 0));
  REQUIRE(hd.phases.size() == 6);
  CHECK(hd.phases[0].flows.size() == 2);  // 0 -> 1, 2 -> 3
  CHECK(hd.phases[1].flows.size() == 4);  // among 1, 3, 4, 5
  CHECK(hd.phases[1].flows[0].src == 1);
  CHECK(hd.phases[1].flows[0].dst == 3);
  CHECK(hd.phases[1].flows[0].share.of(Bytes(1000)) == Bytes(500));
  // Hierarchical over 2 nodes of 4: intra ring, 4 inter-node rings of 2, intra ring.
  auto h =
      sim::build_schedule(K::all_reduce, A::hierarchical, std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  REQUIRE(h.phases.size() == 3);
  CHECK(h.phases[0].flows.size() == 8);
  CHECK(h.phases[1].flows.size() == 8);
  CHECK(h.phases[1].flows[0].src == 0);
  CHECK(h.phases[1].flows[0].dst == 4);
  CHECK(h.phases[1].steps == 2);
  // S/4 per ring, all-reduced over 2 nodes: 2*1/2 * S/4.
  CHECK(h.phases[1].flows[0].share.of(Bytes(1000)) == Bytes(250));
  // NVLS all-reduce: S up and S down for each member, one phase.
  auto nvls = sim::build_schedule(K::all_reduce, A::nvls, one_node);
  REQUIRE(nvls.phases.size() == 1);
  CHECK(nvls.phases[0].flows.size() == 8);
  CHECK(nvls.phases[0].flows[0].dst == sim::kSwitch);
  // One member: nothing.
  CHECK(sim::build_schedule(K::all_reduce, A::ring, std::vector<int>{0}).phases.empty());
}

TEST_CASE("collectives: alpha-beta times by algorithm") {
  using K = CollectiveKind;
  using A = CollectiveAlgorithm;
  const auto cluster = testing::test_cluster(2, 8);
  const Bytes s(1'000'000'000);
  const auto node = iota(8);
  auto time = [&](K k, A a, const std::vector<std::int32_t>& ranks, Bytes b) {
    return sim::collective_time(k, a, ranks, b, cluster);
  };
  // Ring all-reduce over 8: 1.75e9 B / 1e11 B/s = 17.5 ms + 14 us.
  CHECK(time(K::all_reduce, A::ring, node, s) == Time::us(17'500 + 14));
  // Tree over 8 (NCCL's trees: 0-4, 4-{2,6}, 2-{1,3}, 6-{5,7} and the mirror 7-3, 3-{5,1},
  // 5-{6,4}, 1-{2,0}): ranks 1..6 have 4 edges, each carrying S/2 each way: 4 * 5e8 = 2e9 B
  // / 1e11 = 20 ms; both trees are 3 deep: 6 latencies.
  CHECK(time(K::all_reduce, A::tree, node, s) == Time::us(20'000 + 6));
  // Two ranks: one edge per tree, S each way: as the ring, 10 ms + 2 us.
  CHECK(time(K::all_reduce, A::tree, iota(2), s) == Time::us(10'000 + 2));
  // Halving-doubling over 8: halves of 5e8, 2.5e8, 1.25e8 B (5 + 2.5 + 1.25 ms) twice, 6 us.
  CHECK(time(K::all_reduce, A::halving_doubling, node, s) == Time::us(17'500 + 6));
  CHECK(time(K::reduce_scatter, A::halving_doubling, node, s) == Time::us(8'750 + 3));
  // Over 6: S to a partner (10 ms), halves of 5e8 and 2.5e8 B among 4 (7.5 ms), back up
  // (7.5 ms), S back (10 ms): 35 ms and 6 steps.
  CHECK(time(K::all_reduce, A::halving_doubling, iota(6), s) == Time::us(35'000 + 6));
  // Direct over 8: 7 shares of 1.25e8 B through each rank's link, twice: 17.5 ms + 2 us.
  CHECK(time(K::all_reduce, A::direct, node, s) == Time::us(17'500 + 2));
  CHECK(time(K::all_to_all, A::direct, node, s) == Time::us(8'750 + 1));
  // Broadcast direct: scatter 7 * 1.25e8 from the root, then all-gather: 2 * 8.75 ms + 2 us.
  CHECK(time(K::broadcast, A::direct, node, s) == Time::us(17'500 + 2));
  // Direct all-to-all over 2 nodes of 8, S = 1.6e9: shares of 1e8 B; each rank sends 7 inside
  // its node (7e8 / 1e11 = 7 ms) and 8 over its NIC (8e8 / 1e10 = 80 ms); the inter-node
  // latency: 80 ms + 5 us.
  CHECK(time(K::all_to_all, A::direct, iota(16), Bytes(1'600'000'000)) == Time::us(80'000 + 5));
  // Ring all-to-all (pairwise, lock step): 15 steps of 1e8 B, each with a pair across nodes:
  // 15 * (10 ms + 5 us), as the old flat formula 15/16 * 1.6e9 / 1e10 + 15 * 5 us.
  CHECK(time(K::all_to_all, A::ring, iota(16), Bytes(1'600'000'000)) == Time::us(150'000 + 75));
  // Hierarchical over 2 nodes of 8 (as the analytical network always did): 8.75 ms + 7 us,
  // 12.5 ms + 10 us, 8.75 ms + 7 us.
  CHECK(time(K::all_reduce, A::hierarchical, iota(16), s) ==
        Time::us(8'750 + 7 + 12'500 + 10 + 8'750 + 7));
  // A flat ring over 2 nodes of 8: the two NIC hops set the pace: 1.875e9 / 1e10 + 30 * 5 us.
  CHECK(time(K::all_reduce, A::ring, iota(16), s) == Time::us(187'500 + 150));
  // NVLS all-reduce: (n+1)/n S each way (reduce-scatter then multicast all-gather through the
  // switch, pipelined): 9/8 * 1e9 / 1e11 = 11.25 ms + alpha. Reduce-scatter: S up, S/B + alpha.
  CHECK(time(K::all_reduce, A::nvls, node, s) == Time::us(11'250 + 1));
  CHECK(time(K::reduce_scatter, A::nvls, node, s) == Time::us(10'000 + 1));
  // Automatic: the rule (a ring in one node), and zero for one rank.
  CHECK(time(K::all_reduce, A::automatic, node, s) == Time::us(17'500 + 14));
  CHECK(time(K::all_reduce, A::automatic, iota(1), s) == Time::zero());
  // Zero bytes: the latencies only.
  CHECK(time(K::all_reduce, A::ring, node, Bytes(0)) == Time::us(14));
  CHECK_THROWS_AS(time(K::all_reduce, A::ring, std::vector<std::int32_t>{0, 99}, s),
                  std::invalid_argument);
}

TEST_CASE("collectives: protocol efficiency and a member's own links") {
  using K = CollectiveKind;
  using A = CollectiveAlgorithm;
  const Bytes s(1'000'000'000);
  auto cluster = testing::test_cluster(2, 8);
  cluster.collectives.protocol_efficiency = 0.5;
  // 1.75e9 B at 50 GB/s: 35 ms + 14 us.
  CHECK(sim::collective_time(K::all_reduce, A::ring, iota(8), s, cluster) == Time::us(35'000 + 14));
  // Rank 3's NVLink degraded to 25 GB/s with 3 us: it paces the ring of node 0 (1.75e9 B at
  // 25 GB/s: 70 ms) and its latency is every step's: 14 * 3 us. Node 1's ring does not see it.
  cluster.collectives.protocol_efficiency = 1.0;
  hw::DeviceOverride slow;
  slow.ranks = {3};
  slow.intra_node = hw::LinkSpec{Bandwidth(25e9), Time::us(3)};
  cluster.overrides.push_back(slow);
  CHECK(sim::collective_time(K::all_reduce, A::ring, iota(8), s, cluster) == Time::us(70'000 + 42));
  CHECK(sim::collective_time(K::all_reduce, A::ring, iota(8, 8), s, cluster) ==
        Time::us(17'500 + 14));
  // Hierarchical over both nodes: the slow link paces the intra-node phases (8.75e8 B at
  // 25 GB/s = 35 ms + 7 * 3 us each); the inter-node rings do not use it (12.5 ms + 10 us).
  CHECK(sim::collective_time(K::all_reduce, A::hierarchical, iota(16), s, cluster) ==
        Time::us(35'000 + 21 + 12'500 + 10 + 35'000 + 21));
}

TEST_CASE("collectives: plans on the topology") {
  using K = CollectiveKind;
  using A = CollectiveAlgorithm;
  const auto cluster = testing::test_cluster(2, 8);
  const auto topology = hw::build_topology(cluster);
  const Bytes s(1'000'000'000);
  // Ring in one node: 8 flows between the devices' vertices, 14 intra-node latencies.
  auto plan = sim::plan_collective(K::all_reduce, A::ring, iota(8), s, cluster, topology);
  CHECK(plan.algorithm == A::ring);
  REQUIRE(plan.phases.size() == 1);
  CHECK(plan.phases[0].latency == Time::us(14));
  REQUIRE(plan.phases[0].flows.size() == 8);
  CHECK(plan.phases[0].flows[7].src_vertex == topology.vertex_of_device(7));
  CHECK(plan.phases[0].flows[7].dst_vertex == topology.vertex_of_device(0));
  CHECK(plan.phases[0].flows[7].bytes == Bytes(1'750'000'000));
  // Automatic over both nodes: hierarchical; the middle phase crosses nodes (2 * 5 us).
  plan = sim::plan_collective(K::all_reduce, A::automatic, iota(16), s, cluster, topology);
  CHECK(plan.algorithm == A::hierarchical);
  REQUIRE(plan.phases.size() == 3);
  CHECK(plan.phases[0].latency == Time::us(7));
  CHECK(plan.phases[1].latency == Time::us(10));
  CHECK(plan.phases[1].flows.size() == 16);
  CHECK(plan.phases[1].flows[0].bytes == Bytes(125'000'000));
  // NVLS needs a reducing switch.
  CHECK_THROWS_AS(sim::plan_collective(K::all_reduce, A::nvls, iota(8), s, cluster, topology),
                  std::invalid_argument);
  const auto sharp = sharp_cluster(1);
  const auto sharp_topology = hw::build_topology(sharp);
  plan = sim::plan_collective(K::all_reduce, A::automatic, iota(8), s, sharp, sharp_topology);
  CHECK(plan.algorithm == A::nvls);
  REQUIRE(plan.phases.size() == 1);
  CHECK(plan.phases[0].flows.size() == 16);
  CHECK(plan.phases[0].latency == Time::us(1));  // up to the switch and back: one NVLink hop
  CHECK(sharp_topology.kind(plan.phases[0].flows[0].dst_vertex) == hw::VertexKind::nvswitch);
}
