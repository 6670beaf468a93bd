#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "hw_models/topology.hpp"
#include "sim/flow_network.hpp"
#include "sim/helpers.hpp"
#include "sim/network.hpp"

using namespace stratasim;
using strategies::CollectiveKind;

// The test cluster: intra-node 100 GB/s and 1 us; inter-node 10 GB/s and 5 us; 8 per node.

namespace {

sim::GroupShape one_node(int n) {
  return sim::GroupShape{n, 1, n};
}

}  // namespace

TEST_CASE("network: shape of a group") {
  auto cluster = testing::test_cluster(4, 8);
  std::vector<std::int32_t> ranks{0, 1, 8, 9, 10};
  auto s = sim::shape_of(ranks, cluster);
  CHECK(s.size == 5);
  CHECK(s.nodes == 2);
  CHECK(s.max_ranks_per_node == 3);
  std::vector<std::int32_t> spread{0, 8, 16, 24};
  s = sim::shape_of(spread, cluster);
  CHECK(s.nodes == 4);
  CHECK(s.max_ranks_per_node == 1);
}

TEST_CASE("network: ring collectives inside one node") {
  auto cluster = testing::test_cluster(1, 8);
  strategies::Program program(8);
  sim::AnalyticalNetwork net(cluster, program);
  const Bytes s(1'000'000'000);
  // n = 2: 2*1/2 * 1e9 B / 1e11 B/s = 10 ms, plus 2*1 alpha = 2 us.
  CHECK(net.collective_time(CollectiveKind::all_reduce, one_node(2), s) ==
        Time::ms(10) + Time::us(2));
  // n = 8: 2*7/8 * 1e9 = 1.75e9 B / 1e11 = 17.5 ms, plus 14 alpha = 14 us.
  CHECK(net.collective_time(CollectiveKind::all_reduce, one_node(8), s) ==
        Time::us(17'500) + Time::us(14));
  // Reduce-scatter and all-gather, n = 8: 7/8 * 1e9 / 1e11 = 8.75 ms, plus 7 us.
  CHECK(net.collective_time(CollectiveKind::reduce_scatter, one_node(8), s) ==
        Time::us(8'750) + Time::us(7));
  CHECK(net.collective_time(CollectiveKind::all_gather, one_node(8), s) ==
        Time::us(8'750) + Time::us(7));
  CHECK(net.collective_time(CollectiveKind::all_to_all, one_node(8), s) ==
        Time::us(8'750) + Time::us(7));
  // Broadcast (pipelined): 1e9 / 1e11 = 10 ms, plus 7 us.
  CHECK(net.collective_time(CollectiveKind::broadcast, one_node(8), s) ==
        Time::ms(10) + Time::us(7));
  // One rank moves nothing.
  CHECK(net.collective_time(CollectiveKind::all_reduce, one_node(1), s) == Time::zero());
}

TEST_CASE("network: a group spread over nodes uses the inter-node link") {
  auto cluster = testing::test_cluster(8, 8);
  strategies::Program program(64);
  program.add_group({0, 8, 16, 24, 32, 40, 48, 56}, "dp 0");
  sim::AnalyticalNetwork net(cluster, program);
  std::vector<std::int32_t> ranks{0, 8, 16, 24, 32, 40, 48, 56};
  auto shape = sim::shape_of(ranks, cluster);
  CHECK(shape.nodes == 8);
  // 1.75e9 B / 1e10 B/s = 175 ms, plus 14 * 5 us = 70 us.
  CHECK(net.collective_time(CollectiveKind::all_reduce, shape, Bytes(1'000'000'000)) ==
        Time::ms(175) + Time::us(70));
}

TEST_CASE("network: hierarchical collectives") {
  auto cluster = testing::test_cluster(2, 8);
  strategies::Program program(16);
  sim::AnalyticalNetwork net(cluster, program);
  sim::GroupShape shape{16, 2, 8};
  const Bytes s(1'000'000'000);
  // All-reduce: intra RS over 8 of 1e9 (8.75 ms + 7 us) + inter AR over 2 nodes of 1.25e8
  // (2*1/2 * 1.25e8 / 1e10 = 12.5 ms + 2*5 us) + intra AG over 8 (8.75 ms + 7 us).
  CHECK(net.collective_time(CollectiveKind::all_reduce, shape, s) ==
        Time::us(8'750 + 7 + 12'500 + 10 + 8'750 + 7));
  // Reduce-scatter: intra RS (8.75 ms + 7 us) + inter RS of 1.25e8 over 2
  // (1/2 * 1.25e8 / 1e10 = 6.25 ms + 5 us).
  CHECK(net.collective_time(CollectiveKind::reduce_scatter, shape, s) ==
        Time::us(8'750 + 7 + 6'250 + 5));
  CHECK(net.collective_time(CollectiveKind::all_gather, shape, s) ==
        Time::us(6'250 + 5 + 8'750 + 7));
  // Broadcast runs flat over the inter-node link: 1e9 / 1e10 = 100 ms + 15 * 5 us.
  CHECK(net.collective_time(CollectiveKind::broadcast, shape, s) == Time::ms(100) + Time::us(75));
}

TEST_CASE("network: point to point and the resource protocol") {
  auto cluster = testing::test_cluster(2, 8);
  strategies::Program program(16);
  program.add_group({0, 1}, "tp 0");
  sim::AnalyticalNetwork net(cluster, program);
  // Same node: 1 us + 1e6 / 1e11 = 10 us. Across nodes: 5 us + 1e6 / 1e10 = 100 us.
  CHECK(net.p2p_time(0, 7, Bytes(1'000'000)) == Time::us(11));
  CHECK(net.p2p_time(7, 8, Bytes(1'000'000)) == Time::us(105));

  CHECK(net.next_completion() == Time::infinity());
  sim::TransferRequest p2p{false, CollectiveKind::all_reduce, 0, 7, 8, Bytes(1'000'000)};
  net.start(5, p2p, Time::us(0));  // ends at 105 us
  // All-reduce over 2 ranks of 1e6: 1e6 / 1e11 = 10 us + 2 us; started at 93 us: ends at 105.
  sim::TransferRequest ar{true, CollectiveKind::all_reduce, 0, 0, 0, Bytes(1'000'000)};
  net.start(3, ar, Time::us(93));
  sim::TransferRequest early{false, CollectiveKind::all_reduce, 0, 0, 1, Bytes(0)};
  net.start(9, early, Time::us(10));  // 1 us: ends at 11 us
  CHECK(net.next_completion() == Time::us(11));
  std::vector<sim::TransferId> done;
  net.advance_to(Time::us(50), done);
  CHECK(done == std::vector<sim::TransferId>{9});
  CHECK(net.next_completion() == Time::us(105));
  net.advance_to(Time::us(105), done);
  // Equal ends finish in the order they were started.
  CHECK(done == std::vector<sim::TransferId>{9, 5, 3});
  CHECK(net.next_completion() == Time::infinity());
}

TEST_CASE("network: the factory picks the cluster's model") {
  auto cluster = testing::test_cluster(2, 8);
  strategies::Program program(16);
  program.add_group({0, 1}, "tp 0");
  CHECK(dynamic_cast<sim::AnalyticalNetwork*>(sim::make_network(cluster, program).get()) !=
        nullptr);
  cluster.network_model = hw::NetworkModel::flow;
  CHECK(dynamic_cast<sim::AnalyticalNetwork*>(sim::make_network(cluster, program).get()) ==
        nullptr);
}

TEST_CASE("network: groups use their members' own links and the protocol efficiency") {
  auto cluster = testing::test_cluster(2, 8);
  cluster.collectives.protocol_efficiency = 0.8;
  hw::DeviceOverride slow;
  slow.ranks = {9};
  slow.inter_node = hw::LinkSpec{Bandwidth(5e9), Time::us(8)};
  cluster.overrides.push_back(slow);
  strategies::Program program(16);
  program.add_group({0, 1, 2, 3, 4, 5, 6, 7}, "tp 0");
  program.add_group({1, 9}, "dp 1");
  sim::AnalyticalNetwork net(cluster, program);
  const Bytes s(1'000'000'000);
  // 1.75e9 B at 80 GB/s = 21.875 ms, + 14 us.
  CHECK(net.collective_time(CollectiveKind::all_reduce, 0u, s) == Time::us(21'875 + 14));
  CHECK(net.algorithm(CollectiveKind::all_reduce, 0u, s) == hw::CollectiveAlgorithm::ring);
  // Rank 9's NIC (5 GB/s, 8 us) paces the ring of two across nodes: 1e9 B at 4 GB/s = 250 ms,
  // + 2 * 8 us.
  CHECK(net.collective_time(CollectiveKind::all_reduce, 1u, s) == Time::us(250'000 + 16));
  // Point to point: the slower end's link, at the protocol efficiency: 8 us + 1e6 / 4e9.
  CHECK(net.p2p_time(1, 9, Bytes(1'000'000)) == Time::us(8 + 250));
  CHECK(net.p2p_time(9, 1, Bytes(1'000'000)) == Time::us(8 + 250));
  CHECK(net.p2p_time(0, 1, Bytes(1'000'000)) == Time::ps(1'000'000 + 12'500'000));
  // An unknown group is an error.
  CHECK_THROWS_AS(net.collective_time(CollectiveKind::all_reduce, 5u, s), std::invalid_argument);
  // NVLS fixed by the cluster, without a reducing switch: an error naming why.
  auto fixed = testing::test_cluster(1, 8);
  fixed.collectives.algorithm[0] = hw::CollectiveAlgorithm::nvls;
  strategies::Program one_node(8);
  one_node.add_group({0, 1, 2, 3, 4, 5, 6, 7}, "tp 0");
  sim::AnalyticalNetwork nvls(fixed, one_node);
  CHECK_THROWS_AS(nvls.collective_time(CollectiveKind::all_reduce, 0u, s), std::invalid_argument);
  hw::TopologySpec sharp;
  sharp.kind = hw::TopologyKind::nvswitch;
  sharp.sharp = true;
  fixed.topology = sharp;
  sim::AnalyticalNetwork with_switch(fixed, one_node);
  // NVLS all-reduce over n = 8: (n+1)/n S / B + alpha = 9/8 * 10 ms + 1 us.
  CHECK(with_switch.collective_time(CollectiveKind::all_reduce, 0u, s) == Time::us(11'251));
}

TEST_CASE("network: a copy-engine message takes the link, not NCCL's send channels") {
  // Transformer Engine's ring-exchange steps (a Send with sms 0) are cudaMemcpyAsync between
  // peers: with collectives.nccl an NCCL send within the node runs at the intra fabric's p2p
  // efficiency (0.5 here), a copy-engine one at the link's rate times protocol_efficiency
  // (1): 1 us + 1e8 B / 100 GB/s = 1.001 ms, against 1 us + 1e8 B / 50 GB/s for NCCL's.
  auto cluster = testing::test_cluster(1, 8);
  hw::NcclSettings nccl;
  nccl.intra.name = "nvlink";
  nccl.intra.step_latency = {Time::us(1), Time::us(1), Time::us(1)};
  nccl.intra.efficiency = 0.8;
  nccl.intra.p2p_efficiency = 0.5;
  nccl.intra.channels = 32;
  nccl.intra.channel_busbw = Bandwidth(40e9);
  nccl.network = nccl.intra;
  nccl.network.name = "net";
  cluster.collectives.nccl = nccl;
  const Bytes bytes(100'000'000);
  const sim::AnalyticalNetwork net(cluster);
  CHECK(net.p2p_time(0, 1, bytes, true) == Time::us(1001));
  CHECK(net.p2p_time(0, 1, bytes) > Time::us(1900));
  // The flow model: the copy-engine message's flow carries its bytes, not bytes / 0.5.
  auto flow_cluster = cluster;
  flow_cluster.network_model = hw::NetworkModel::flow;
  const strategies::Program program(8);
  for (const bool copy_engine : {true, false}) {
    CAPTURE(copy_engine);
    sim::FlowNetwork flow(flow_cluster, hw::build_topology(flow_cluster), program);
    sim::TransferRequest r;
    r.collective = false;
    r.src = 0;
    r.dst = 1;
    r.bytes = bytes;
    r.copy_engine = copy_engine;
    flow.start(0, r, Time::zero());
    std::vector<sim::TransferId> finished;
    Time end = Time::zero();
    while (finished.empty() && flow.next_completion() != Time::infinity()) {
      end = flow.next_completion();
      flow.advance_to(end, finished);
    }
    REQUIRE(finished.size() == 1);
    // Its route's latency, then the bytes at the link's 100 GB/s (or NCCL's half of it).
    const double bandwidth_time = 1e8 / (copy_engine ? 100e9 : 50e9);
    CHECK(end.seconds() > bandwidth_time);
    CHECK(end.seconds() < bandwidth_time + 10e-6);
  }
}
