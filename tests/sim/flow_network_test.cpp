// The flow-level network: agreement with the alpha-beta formulas where nothing contends,
// slowdowns from shared and oversubscribed links worked out by hand, nccl-tests' bus
// bandwidths, and the resource protocol.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/topology.hpp"
#include "sim/collective_bench.hpp"
#include "sim/collectives.hpp"
#include "sim/flow_network.hpp"
#include "sim/helpers.hpp"
#include "sim/network.hpp"
#include "sim/simulator.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using hw::CollectiveAlgorithm;
using strategies::CollectiveKind;
using testing::drive;

namespace {

std::vector<std::int32_t> iota(int n, int first = 0) {
  std::vector<std::int32_t> r(static_cast<std::size_t>(n));
  std::iota(r.begin(), r.end(), first);
  return r;
}

sim::TransferRequest collective(std::uint32_t group, Bytes bytes,
                                CollectiveKind kind = CollectiveKind::all_reduce) {
  sim::TransferRequest r;
  r.collective = true;
  r.kind = kind;
  r.group = group;
  r.bytes = bytes;
  return r;
}

sim::TransferRequest p2p(std::int32_t src, std::int32_t dst, Bytes bytes) {
  sim::TransferRequest r;
  r.collective = false;
  r.src = src;
  r.dst = dst;
  r.bytes = bytes;
  return r;
}

/// H100-like figures: 450 GB/s and 1 us inside a node, 50 GB/s and 5 us between nodes; 80%
/// protocol efficiency.
hw::ClusterSpec h100_like(int nodes, int devices_per_node) {
  auto c = testing::test_cluster(nodes, devices_per_node);
  c.intra_node = hw::LinkSpec{Bandwidth(450e9), Time::us(1)};
  c.inter_node = hw::LinkSpec{Bandwidth(50e9), Time::us(5)};
  c.collectives.protocol_efficiency = 0.8;
  return c;
}

const nlohmann::json& reference_case(const std::string& id) {
  static const nlohmann::json doc = [] {
    std::ifstream in(testing::reference_file());
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  for (const auto& c : doc.at("cases")) {
    if (c.at("id") == id) return c;
  }
  FAIL("no reference case " << id);
  return doc;
}

}  // namespace

TEST_CASE("flow network: agrees with the alpha-beta times where nothing contends") {
  // Every (kind, algorithm) that applies, alone on the cluster, 256 MiB: within 2%.
  const Bytes size(256LL << 20);
  const std::vector<Bytes> sizes{size};
  const CollectiveAlgorithm algorithms[] = {
      CollectiveAlgorithm::ring, CollectiveAlgorithm::tree, CollectiveAlgorithm::halving_doubling,
      CollectiveAlgorithm::direct, CollectiveAlgorithm::hierarchical};
  const CollectiveKind kinds[] = {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                                  CollectiveKind::all_gather, CollectiveKind::broadcast,
                                  CollectiveKind::reduce,     CollectiveKind::all_to_all};
  struct Case {
    int nodes, per_node;
    bool sharp;
  };
  int checked = 0;
  for (const Case c : {Case{1, 8, false}, Case{4, 8, false}, Case{8, 1, false}, Case{3, 2, false},
                       Case{1, 8, true}}) {
    auto cluster = h100_like(c.nodes, c.per_node);
    if (c.sharp) {
      hw::TopologySpec t;
      t.kind = hw::TopologyKind::nvswitch;
      t.sharp = true;
      cluster.topology = t;
    }
    const auto ranks = iota(cluster.world_size());
    const auto shape = sim::shape_of(ranks, cluster);
    for (const auto kind : kinds) {
      std::set<CollectiveAlgorithm> tried;
      std::vector<CollectiveAlgorithm> todo;
      if (c.sharp) {
        if (kind != CollectiveKind::all_to_all) todo.push_back(CollectiveAlgorithm::nvls);
      } else {
        for (const auto a : algorithms) {
          const auto resolved = sim::resolve_algorithm(kind, a, shape);
          if (tried.insert(resolved).second) todo.push_back(resolved);
        }
      }
      for (const auto a : todo) {
        CAPTURE(c.nodes);
        CAPTURE(c.per_node);
        CAPTURE(strategies::name_of(kind));
        CAPTURE(hw::name_of(a));
        const Time formula = sim::collective_time(kind, a, ranks, size, cluster);
        auto flow_cluster = cluster;
        flow_cluster.network_model = hw::NetworkModel::flow;
        const auto flow = sim::measure_collective(flow_cluster, kind, ranks, sizes, a);
        const auto analytical = sim::measure_collective(cluster, kind, ranks, sizes, a);
        REQUIRE(flow.size() == 1);
        CHECK(flow[0].algorithm == a);
        CHECK(analytical[0].time == formula);
        const double ratio = flow[0].time.seconds() / formula.seconds();
        CAPTURE(ratio);
        CHECK(std::abs(ratio - 1) <= 0.02);
        ++checked;
      }
    }
  }
  // 1x8: ring, tree, hd, direct for all-reduce; ring, hd, direct for RS and AG; ring, direct
  // for the others (16). 4x8 adds hierarchical for AR, RS, AG (19). 8x1 and 3x2 as 1x8 (16
  // each; 3x2 has hierarchical too: 19). NVLS: 5.
  CHECK(checked == 16 + 19 + 16 + 19 + 5);
}

TEST_CASE("flow network: two all-reduces sharing one link take twice as long") {
  // Two nodes of two devices; each node's devices hang off its own switch and the two switches
  // share one link (10 GB/s, 1 us per hop, in each direction). Groups {0, 2} and {1, 3} each
  // all-reduce 1e9 B: a ring of two, one flow each way of 2 * 1/2 * 1e9 = 1e9 B over three
  // hops (3 us), two steps: 6 us of latency.
  // Alone: 1e9 / 1e10 = 100 ms + 6 us. Together, the two flows in each direction share the
  // switches' link: 5 GB/s each, 200 ms + 6 us.
  auto cluster = testing::test_cluster(2, 2);
  hw::TopologySpec t;
  t.kind = hw::TopologyKind::graph;
  for (const char* d : {"d0", "d1", "d2", "d3"}) {
    t.vertices.push_back(hw::ExplicitVertex{d, hw::VertexKind::device, false});
  }
  t.vertices.push_back(hw::ExplicitVertex{"a", hw::VertexKind::network_switch, false});
  t.vertices.push_back(hw::ExplicitVertex{"b", hw::VertexKind::network_switch, false});
  const hw::ExplicitLink links[] = {{"d0", "a", Bandwidth(1e10), Time::us(1), true},
                                    {"d1", "a", Bandwidth(1e10), Time::us(1), true},
                                    {"d2", "b", Bandwidth(1e10), Time::us(1), true},
                                    {"d3", "b", Bandwidth(1e10), Time::us(1), true},
                                    {"a", "b", Bandwidth(1e10), Time::us(1), true}};
  t.links.assign(std::begin(links), std::end(links));
  t.devices = {"d0", "d1", "d2", "d3"};
  cluster.topology = t;
  cluster.network_model = hw::NetworkModel::flow;
  strategies::Program program(4);
  program.add_group({0, 2}, "dp 0");
  program.add_group({1, 3}, "dp 1");
  const Bytes s(1'000'000'000);

  auto alone = sim::make_network(cluster, program);
  REQUIRE(dynamic_cast<sim::FlowNetwork*>(alone.get()) != nullptr);
  alone->start(7, collective(0, s), Time::zero());
  CHECK(drive(*alone).at(7) == Time::us(100'000 + 6));

  auto both = sim::make_network(cluster, program);
  both->start(1, collective(0, s), Time::zero());
  both->start(2, collective(1, s), Time::zero());
  const auto done = drive(*both);
  CHECK(done.at(1) == Time::us(200'000 + 6));
  CHECK(done.at(2) == Time::us(200'000 + 6));

  // A message d3 -> d2 (5e8 B, route d3 -> b -> d2: 2 us) shares b -> d2 with the
  // all-reduce's flow 0 -> 2 (d0 -> a -> b -> d2). It runs alone at 10 GB/s from 2 us to 6 us
  // (4e4 B), then both get 5 GB/s: the message's 4.9996e8 B left take 99.992 ms, it ends at
  // 99.998 ms. The flow 0 -> 2 has carried 4.9996e8 B by then; its 5.0004e8 B left at 10 GB/s
  // take 50.004 ms: the all-reduce ends at 150.002 ms (its flow 2 -> 0, alone, ended at
  // 100.006 ms).
  auto three = sim::make_network(cluster, program);
  three->start(1, collective(0, s), Time::zero());
  three->start(3, p2p(3, 2, Bytes(500'000'000)), Time::zero());
  const auto done3 = drive(*three);
  CHECK(done3.at(3) == Time::us(99'998));
  CHECK(done3.at(1) == Time::us(150'002));
}

TEST_CASE("flow network: an oversubscribed fat-tree slows a cross-rack all-reduce") {
  // Four nodes of two devices, two nodes per rack, one spine; rail 0's leaves are
  // rack0.rail0 (nodes 0, 1) and rack1.rail0 (nodes 2, 3). A leaf's uplink to the spine carries
  // its 2 downlinks' 2 x 10 GB/s over the oversubscription: 20 GB/s at 1:1, 10 GB/s at 2:1.
  // The data-parallel group of rail 0 in the ring order {0, 4, 2, 6} (nodes 0, 2, 1, 3)
  // crosses racks at every hop: flows 0 -> 4 and 2 -> 6 both climb rack0.rail0's uplink, and
  // 4 -> 2 and 6 -> 0 rack1.rail0's. At 1:1 two flows on 20 GB/s get 10 GB/s each, the NICs'
  // speed: no slowdown. At 2:1 they get 5 GB/s: the bandwidth term doubles.
  // All-reduce of 1e9 B over 4: flows of 1.5e9 B, 6 steps of 5 us: 150 ms + 30 us at 1:1,
  // 300 ms + 30 us at 2:1.
  // In the order {0, 2, 4, 6} only 2 -> 4 and 6 -> 0 cross racks, one flow per uplink: 10 GB/s
  // even at 2:1, no slowdown.
  auto run = [](double oversubscription, std::vector<std::int32_t> ranks) {
    auto cluster = testing::test_cluster(4, 2);
    hw::TopologySpec t;
    t.kind = hw::TopologyKind::fat_tree;
    t.nodes_per_rack = 2;
    t.spines = 1;
    t.oversubscription = oversubscription;
    cluster.topology = t;
    cluster.network_model = hw::NetworkModel::flow;
    strategies::Program program(8);
    program.add_group(std::move(ranks), "dp");
    auto net = sim::make_network(cluster, program);
    net->start(0, collective(0, Bytes(1'000'000'000)), Time::zero());
    return drive(*net).at(0);
  };
  CHECK(run(1.0, {0, 4, 2, 6}) == Time::us(150'000 + 30));
  CHECK(run(2.0, {0, 4, 2, 6}) == Time::us(300'000 + 30));
  CHECK(run(2.0, {0, 2, 4, 6}) == Time::us(150'000 + 30));
}

TEST_CASE("flow network: nccl-tests bus bandwidth of a ring all-reduce on one NVSwitch node") {
  // 8 GPUs, 2 GiB all-reduce: busbw = 2(n-1)/n S / t ~ link bandwidth x protocol efficiency
  // (the 14 latencies add 0.1%): 450 GB/s x 0.82 = 369 GB/s against nccl-tests' 370 GB/s,
  // 300 GB/s x 0.8 = 240 GB/s against 230 GB/s; both within the cases' 10%.
  struct Case {
    const char* id;
    const char* expected_key;
    double link_gbps;
    double efficiency;
  };
  for (const Case c : {Case{"nccl-h100-nvlink", "ring_effective_busbw_GBps", 450, 0.82},
                       Case{"nccl-a100-nvlink", "allreduce_busbw_GBps", 300, 0.8}}) {
    const auto& ref = reference_case(c.id);
    const double expected = ref.at("expected").at(c.expected_key).get<double>() * 1e9;
    const double tolerance = ref.at("tolerance_rel").get<double>();
    auto cluster = testing::test_cluster(1, 8);
    cluster.intra_node = hw::LinkSpec{Bandwidth(c.link_gbps * 1e9), Time::us(1)};
    cluster.collectives.protocol_efficiency = c.efficiency;
    const std::vector<Bytes> sizes{Bytes(2LL << 30)};
    for (const auto model : {hw::NetworkModel::analytical, hw::NetworkModel::flow}) {
      cluster.network_model = model;
      const auto m = sim::measure_collective(cluster, CollectiveKind::all_reduce, iota(8), sizes);
      REQUIRE(m.size() == 1);
      CAPTURE(c.id);
      CAPTURE(hw::name_of(model));
      CAPTURE(m[0].busbw / 1e9);
      CHECK(m[0].algorithm == CollectiveAlgorithm::ring);
      CHECK(std::abs(m[0].busbw / expected - 1) <= tolerance);
      CHECK(m[0].busbw == doctest::Approx(c.link_gbps * 1e9 * c.efficiency).epsilon(0.002));
      CHECK(m[0].algbw == doctest::Approx(m[0].busbw / 1.75));
    }
  }
}

TEST_CASE("flow network: point to point, zero bytes, internal events") {
  auto cluster = testing::test_cluster(2, 8);
  cluster.network_model = hw::NetworkModel::flow;
  strategies::Program program(16);
  program.add_group(iota(8), "tp 0");
  program.add_group(iota(16), "dp");
  SUBCASE("a message takes its route's latency plus bytes over the bottleneck") {
    // As the analytical model: 5 us + 1e6 / 1e10 = 105 us across nodes, 1 us + 10 us inside.
    auto net = sim::make_network(cluster, program);
    net->start(0, p2p(7, 8, Bytes(1'000'000)), Time::us(3));
    net->start(1, p2p(0, 7, Bytes(1'000'000)), Time::us(3));
    const auto done = drive(*net);
    CHECK(done.at(0) == Time::us(108));
    CHECK(done.at(1) == Time::us(14));
  }
  SUBCASE("zero bytes complete after their latency") {
    auto net = sim::make_network(cluster, program);
    net->start(0, p2p(7, 8, Bytes(0)), Time::zero());
    net->start(1, collective(0, Bytes(0)), Time::zero());  // ring over 8: 14 us
    // Across both nodes: hierarchical, 7 + 10 + 7 us (the tree would pay 8 x 5 us: two trees
    // 4 deep over 16 ranks, with edges across nodes).
    net->start(2, collective(1, Bytes(0)), Time::zero());
    const auto done = drive(*net);
    CHECK(done.at(0) == Time::us(5));
    CHECK(done.at(1) == Time::us(14));
    CHECK(done.at(2) == Time::us(24));
  }
  SUBCASE("phase boundaries are events that finish nothing") {
    // Hierarchical all-reduce of 1.6e9 B over 2 nodes of 8: the intra-node reduce-scatter
    // (7 us, then 1.4e9 B at 100 GB/s: 14 ms) ends at 14.007 ms, an event with no transfer
    // finished; then 10 us + 2e8 / 1e10 = 20 ms; then 7 us + 14 ms.
    auto net = sim::make_network(cluster, program);
    net->start(0, collective(1, Bytes(1'600'000'000)), Time::zero());
    std::vector<sim::TransferId> finished;
    CHECK(net->next_completion() == Time::us(7));  // the first phase's latency
    net->advance_to(Time::us(7), finished);
    CHECK(finished.empty());
    CHECK(net->next_completion() == Time::us(14'007));
    net->advance_to(Time::us(14'007), finished);
    CHECK(finished.empty());
    CHECK(net->next_completion() == Time::us(14'017));
    CHECK(drive(*net).at(0) == Time::us(14'007 + 20'010 + 14'007));
  }
  SUBCASE("a transfer of one rank completes at once") {
    strategies::Program solo(16);
    solo.add_group({3}, "alone");
    auto net = sim::make_network(cluster, solo);
    net->start(4, collective(0, Bytes(1000)), Time::us(9));
    CHECK(net->next_completion() == Time::us(9));
    CHECK(drive(*net).at(4) == Time::us(9));
  }
  SUBCASE("ranks outside the topology are an error") {
    strategies::Program big(32);
    big.add_group(iota(32), "too many");
    CHECK_THROWS_AS(sim::make_network(cluster, big), std::invalid_argument);
  }
}

TEST_CASE("flow network: observers see every flow; link usage") {
  // Two ranks of one node all-reduce 1e9 B: flows 0 -> 1 and 1 -> 0 of 1e9 B each, over
  // dev -> NVSwitch -> dev: 10 ms + 2 us. Each of the 4 links carries 1e9 B: utilisation
  // 1e9 / (1e11 x 10.002 ms) = 0.9998.
  auto cluster = testing::test_cluster(1, 2);
  strategies::Program program(2);
  program.add_group({0, 1}, "tp");
  sim::FlowNetwork net(cluster, hw::build_topology(cluster), program);
  sim::LinkUsage usage(net);
  net.set_observer(&usage);
  net.start(0, collective(0, Bytes(1'000'000'000)), Time::zero());
  const Time end = drive(net).at(0);
  CHECK(end == Time::us(10'002));
  CHECK(net.flows_started() == 2);
  CHECK(usage.flows() == 2);
  const auto busy = usage.busiest(end, 10);
  REQUIRE(busy.size() == 4);
  for (const auto& b : busy) {
    CHECK(b.bytes == Bytes(1'000'000'000));
    CHECK(b.utilisation == doctest::Approx(1e9 / (1e11 * 10.002e-3)));
  }
  CHECK(busy[0].link < busy[1].link);  // ties: lower link first
  CHECK(usage.busiest(end, 1).size() == 1);
}

TEST_CASE("flow network: deterministic, and ECMP spreads flows") {
  // A fat-tree with two spines: many cross-rack messages use both spines, and two runs give
  // identical results.
  auto cluster = testing::test_cluster(4, 2);
  hw::TopologySpec t;
  t.kind = hw::TopologyKind::fat_tree;
  t.nodes_per_rack = 2;
  t.spines = 2;
  cluster.topology = t;
  strategies::Program program(8);
  program.add_group(iota(8), "all");
  program.add_group({0, 2, 4, 6}, "rail 0");
  auto once = [&](std::map<int, std::int64_t>* per_link) {
    sim::FlowNetwork net(cluster, hw::build_topology(cluster), program);
    sim::LinkUsage usage(net);
    net.set_observer(&usage);
    sim::TransferId id = 0;
    for (int i = 0; i < 16; ++i) {
      net.start(id++, p2p(i % 4, 4 + (i * 3) % 4, Bytes(1'000'000 * (1 + i % 3))), Time::us(i));
    }
    net.start(id++, collective(0, Bytes(64 << 20)), Time::us(20));
    net.start(id++, collective(1, Bytes(100 << 10)), Time::us(20));  // small: the tree
    std::vector<std::pair<sim::TransferId, std::int64_t>> out;
    for (const auto& [k, v] : drive(net)) out.emplace_back(k, v.picoseconds());
    if (per_link != nullptr) {
      for (int l = 0; l < net.topology().link_count(); ++l) {
        (*per_link)[l] = usage.bytes(l).count();
      }
    }
    return out;
  };
  std::map<int, std::int64_t> per_link;
  const auto a = once(&per_link);
  CHECK(a.size() == 18);
  CHECK(a == once(nullptr));
  // Both spines carried traffic.
  const auto topology = hw::build_topology(cluster);
  int spines_used = 0;
  for (int v = 0; v < topology.vertex_count(); ++v) {
    if (topology.name(v).rfind("spine", 0) != 0) continue;
    std::int64_t into = 0;
    for (int l = 0; l < topology.link_count(); ++l) {
      if (topology.link(l).to == v) into += per_link[l];
    }
    if (into > 0) ++spines_used;
  }
  CHECK(spines_used == 2);
}

TEST_CASE("flow network: a program simulated on it") {
  // Two nodes of two devices. Every rank computes for 10 us, then all-reduces 1e8 B with its
  // data-parallel peer on the other node ({0, 2} and {1, 3}): a ring of two across nodes, one
  // flow each way of 1e8 B, 2 x 5 us of latency: 10 ms + 10 us, ending at 10.02 ms on either
  // model. Rank 0 also sends 1e8 B to rank 2 once its compute is done.
  // Analytical: the message takes 5 us + 10 ms and ends at 10.015 ms, blind to the all-reduce.
  // Flow: the message starts moving at 15 us, alone on rank 0's NIC until the all-reduce's
  // flows start at 20 us (5e4 B at 10 GB/s); then it shares the NIC path 0 -> 2 with the
  // all-reduce's flow 0 -> 2 at 5 GB/s each: its 9.995e7 B left take 19.99 ms, it ends at
  // 20.01 ms. The all-reduce's flow has 5e4 B left then, 5 us alone: it ends at 20.015 ms.
  using strategies::OpId;
  strategies::Program p(4);
  const auto dp0 = p.add_group({0, 2}, "dp 0");
  const auto dp1 = p.add_group({1, 3}, "dp 1");
  OpId ar0 = 0, send = 0;
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    strategies::OpInfo compute;
    const OpId a = p.add(testing::measured(p, Time::us(10)), compute);
    strategies::OpInfo comm;
    comm.stream = strategies::Stream::dp_comm;
    const strategies::Collective ar{CollectiveKind::all_reduce, DType::bf16, r % 2 == 0 ? dp0 : dp1,
                                    Bytes(100'000'000)};
    const OpId c = p.add(ar, comm, std::vector<OpId>{a});
    if (r == 0) ar0 = c;
    strategies::OpInfo pp;
    pp.stream = r == 0 ? strategies::Stream::pp_send : strategies::Stream::pp_recv;
    if (r == 0) send = p.add(strategies::Send{2, Bytes(100'000'000)}, pp, std::vector<OpId>{a});
    if (r == 2) p.add(strategies::Recv{0, Bytes(100'000'000)}, pp, std::vector<OpId>{a});
  }
  p.finish();
  auto cluster = testing::test_cluster(2, 2);
  const auto analytical = sim::simulate(p, cluster);
  REQUIRE(analytical.completed);
  CHECK(analytical.spans[ar0].end == Time::us(10'020));
  CHECK(analytical.spans[send].end == Time::us(10'015));
  cluster.network_model = hw::NetworkModel::flow;
  const auto flow = sim::simulate(p, cluster);
  REQUIRE(flow.completed);
  CHECK(flow.spans[ar0].end == Time::us(20'015));
  CHECK(flow.spans[send].end == Time::us(20'010));
  // The other pair's all-reduce crosses other NICs: as on the analytical model.
  for (const auto& span : flow.spans) {
    if (span.rank == 1 || span.rank == 3) {
      CHECK(span.end == analytical.spans[span.op].end);
    }
  }
}
