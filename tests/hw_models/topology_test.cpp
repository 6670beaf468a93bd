// The topology graph: the builders' vertex and link counts, routes (hop counts, latencies,
// bottlenecks) worked out by hand, ECMP, the config section and its errors.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/helpers.hpp"
#include "hw_models/topology.hpp"

using namespace stratasim;
using hw::TopologyKind;
using hw::VertexKind;

namespace {

// 300 GB/s and 2 us inside a node (NVLink), 25 GB/s (200 Gb/s) and 5 us between nodes.
constexpr double kIntraBw = 300e9;
constexpr double kInterBw = 25e9;
constexpr Time kIntraLatency = Time::us(2);
constexpr Time kInterLatency = Time::us(5);

hw::ClusterSpec test_cluster(int nodes, int devices_per_node,
                             std::optional<hw::TopologySpec> topology = std::nullopt) {
  hw::ClusterSpec c;
  c.name = "topology-test";
  c.nodes = nodes;
  c.devices_per_node = devices_per_node;
  c.intra_node = {Bandwidth(kIntraBw), kIntraLatency};
  c.inter_node = {Bandwidth(kInterBw), kInterLatency};
  c.topology = std::move(topology);
  return c;
}

hw::TopologySpec spec_of(TopologyKind kind) {
  hw::TopologySpec s;
  s.kind = kind;
  return s;
}

/// The route between two devices (ranks).
std::vector<int> route(const hw::Topology& t, int a, int b, std::uint64_t key = 0) {
  std::vector<int> out;
  t.route(t.vertex_of_device(a), t.vertex_of_device(b), key, out);
  return out;
}

/// The kinds of the vertices a route enters, in order.
std::vector<VertexKind> kinds_along(const hw::Topology& t, const std::vector<int>& r) {
  std::vector<VertexKind> kinds;
  for (int l : r) kinds.push_back(t.kind(t.link(l).to));
  return kinds;
}

int vertex_named(const hw::Topology& t, const std::string& name) {
  for (int v = 0; v < t.vertex_count(); ++v) {
    if (t.name(v) == name) return v;
  }
  FAIL("no vertex named " << name);
  return -1;
}

using testing::error_of;

/// The bandwidth of the first link from vertex `a` to vertex `b`.
double link_bandwidth(const hw::Topology& t, int a, int b) {
  for (int l : t.links_from(a)) {
    if (t.link(l).to == b) return t.link(l).bandwidth.bytes_per_second();
  }
  FAIL("no link " << t.name(a) << " -> " << t.name(b));
  return 0;
}

template <class F>
config::ValidationError validation_error_of(F&& f) {
  try {
    f();
  } catch (const config::ValidationError& e) {
    return e;
  }
  FAIL("expected a ValidationError");
  return config::ValidationError("", "");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

hw::TopologySpec read(const nlohmann::json& topology) {
  auto doc = config::Document::from_json(nlohmann::json{{"topology", topology}}, "cluster.json");
  return hw::read_topology(config::ObjectReader(doc, "topology"));
}

}  // namespace

TEST_CASE("the graph API: ids, links in insertion order, copies that do not share changes") {
  hw::Topology t;
  const int a = t.add_vertex(VertexKind::device, "a");
  const int b = t.add_vertex(VertexKind::device, "b");
  const int s = t.add_vertex(VertexKind::network_switch, "s", true);
  CHECK(t.add_duplex(a, s, Bandwidth(10e9), Time::ns(100)) == 0);  // s -> a is link 1
  CHECK(t.add_duplex(b, s, Bandwidth(20e9), Time::ns(200)) == 2);
  t.set_device(0, a);
  t.set_device(1, b);
  CHECK(t.vertex_count() == 3);
  CHECK(t.link_count() == 4);
  CHECK(t.device_count() == 2);
  CHECK(t.vertex_of_device(1) == b);
  CHECK(t.reduces(s));
  CHECK(t.link(1).from == s);
  CHECK(t.link(1).to == a);
  CHECK(t.links_from(s) == std::vector<int>{1, 3});
  // a -> s -> b: 100 ns + 200 ns, limited by a's 10 GB/s.
  const auto r = route(t, 0, 1);
  CHECK(r == std::vector<int>{0, 3});
  CHECK(t.latency(r) == Time::ns(300));
  CHECK(t.bottleneck(r).bytes_per_second() == 10e9);
  CHECK(t.latency({}) == Time::zero());
  CHECK(t.bottleneck({}).bytes_per_second() > 1e300);  // nothing limits an empty route
  CHECK(t.reducing_switch({0, 1}) == s);

  // An isolated vertex: routes to it name both ends.
  const int lonely = t.add_vertex(VertexKind::device, "lonely");
  std::vector<int> out;
  try {
    t.route(a, lonely, 0, out);
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& e) {
    CHECK(contains(e.what(), "'a'"));
    CHECK(contains(e.what(), "'lonely'"));
  }
  CHECK_THROWS_AS(t.route(a, 99, 0, out), std::invalid_argument);
  CHECK_THROWS_AS(t.vertex_of_device(2), std::invalid_argument);
  CHECK_THROWS_AS(t.set_device(2, a), std::invalid_argument);  // a is already device 0
  CHECK_THROWS_AS(t.add_link(a, a, Bandwidth(1e9), Time::zero()), std::invalid_argument);

  // A copy is a value: adding to it leaves the original as it was (copy on write).
  hw::Topology copy = t;
  copy.add_duplex(a, lonely, Bandwidth(1e9), Time::zero());
  CHECK(copy.link_count() == 6);
  CHECK(t.link_count() == 4);
  CHECK_NOTHROW(copy.route(a, lonely, 0, out));
  CHECK_THROWS_AS(t.route(a, lonely, 0, out), std::invalid_argument);
}

TEST_CASE("two-level: an NVSwitch per node, a NIC per device, one network switch") {
  // 2 nodes x 4: 8 devices + 2 NVSwitches + 8 NICs + 1 network switch = 19 vertices;
  // links: 8 device<->NVSwitch pairs (16) + 8 device<->NIC (16) + 8 NIC<->switch (16) = 48.
  const auto t = hw::build_topology(test_cluster(2, 4));
  CHECK(t.vertex_count() == 19);
  CHECK(t.link_count() == 48);
  CHECK(t.device_count() == 8);
  for (int r = 0; r < 8; ++r) CHECK(t.kind(t.vertex_of_device(r)) == VertexKind::device);
  // One node: no network at all: 8 devices + 1 NVSwitch, 16 links.
  const auto one = hw::build_topology(test_cluster(1, 8));
  CHECK(one.vertex_count() == 9);
  CHECK(one.link_count() == 16);
}

TEST_CASE("two-level routes: 2 hops inside a node, 4 across, latency equal to the config") {
  const auto t = hw::build_topology(test_cluster(2, 4));
  const auto intra = route(t, 0, 1);
  CHECK(kinds_along(t, intra) == std::vector{VertexKind::nvswitch, VertexKind::device});
  CHECK(t.latency(intra) == kIntraLatency);
  CHECK(t.bottleneck(intra).bytes_per_second() == kIntraBw);
  const auto inter = route(t, 0, 5);
  CHECK(kinds_along(t, inter) == std::vector{VertexKind::nic, VertexKind::network_switch,
                                             VertexKind::nic, VertexKind::device});
  CHECK(t.latency(inter) == kInterLatency);
  CHECK(t.bottleneck(inter).bytes_per_second() == kInterBw);
  // Every ordered pair: the configured latency exactly, intra-node traffic on the NVSwitch.
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      CAPTURE(a);
      CAPTURE(b);
      const bool same_node = a / 4 == b / 4;
      const auto r = route(t, a, b, static_cast<std::uint64_t>(a * 8 + b));
      CHECK(r.size() == (same_node ? 2u : 4u));
      CHECK(t.latency(r) == (same_node ? kIntraLatency : kInterLatency));
    }
  }
  CHECK(t.reducing_switch({0, 1, 2, 3}) == -1);  // plain two-level: nothing reduces
}

TEST_CASE("nvswitch with sharp: the node's NVSwitch is the reducing switch of its devices") {
  auto s = spec_of(TopologyKind::nvswitch);
  s.sharp = true;
  const auto t = hw::build_topology(test_cluster(2, 4, s));
  CHECK(t.vertex_count() == 19);  // as two-level
  const int sw0 = vertex_named(t, "node0.nvswitch");
  const int sw1 = vertex_named(t, "node1.nvswitch");
  CHECK(t.reduces(sw0));
  CHECK(t.reducing_switch({0, 1, 2, 3}) == sw0);
  CHECK(t.reducing_switch({5, 6}) == sw1);
  CHECK(t.reducing_switch({0, 4}) == -1);  // no switch is one hop from both nodes
  CHECK(t.reducing_switch({}) == -1);
  s.sharp = false;
  CHECK(hw::build_topology(test_cluster(2, 4, s)).reducing_switch({0, 1}) == -1);
}

TEST_CASE("pcie tree: GPUs behind PCIe switches under the root complex share the switch's NIC") {
  auto s = spec_of(TopologyKind::pcie_tree);
  s.devices_per_pcie_switch = 4;
  s.pcie_bandwidth = Bandwidth(16e9);
  s.pcie_latency = Time::us(1);
  const auto t = hw::build_topology(test_cluster(2, 8, s));
  // 16 devices + 1 network switch + per node (1 host + 2 PCIe switches + 2 NICs) = 27;
  // links: 16 GPU<->PCIe switch (32) + 4 switch<->root (8) + 4 switch<->NIC (8) + 4 NIC<->net
  // (8) = 56.
  CHECK(t.vertex_count() == 27);
  CHECK(t.link_count() == 56);
  // Under one PCIe switch: GPU -> switch -> GPU, one PCIe latency.
  const auto same_switch = route(t, 0, 1);
  CHECK(kinds_along(t, same_switch) == std::vector{VertexKind::pcie_switch, VertexKind::device});
  CHECK(t.latency(same_switch) == Time::us(1));
  CHECK(t.bottleneck(same_switch).bytes_per_second() == 16e9);
  // Across the root complex: two upward PCIe hops pay the latency.
  const auto across_root = route(t, 0, 4);
  CHECK(kinds_along(t, across_root) == std::vector{VertexKind::pcie_switch, VertexKind::host,
                                                   VertexKind::pcie_switch, VertexKind::device});
  CHECK(t.latency(across_root) == Time::us(2));
  // Across nodes: GPU -> PCIe switch -> NIC -> network -> NIC -> PCIe switch -> GPU, PCIe
  // latency + inter-node latency, limited by the 16 GB/s PCIe links.
  const auto across_nodes = route(t, 0, 8);
  CHECK(kinds_along(t, across_nodes) == std::vector{VertexKind::pcie_switch, VertexKind::nic,
                                                    VertexKind::network_switch, VertexKind::nic,
                                                    VertexKind::pcie_switch, VertexKind::device});
  CHECK(t.latency(across_nodes) == Time::us(1) + kInterLatency);
  CHECK(t.bottleneck(across_nodes).bytes_per_second() == 16e9);
  // GPUs 0 and 3 sit behind the same PCIe switch: the same switch -> NIC link carries both;
  // GPU 4 is behind the node's other switch and NIC.
  const auto other_gpu = route(t, 3, 12);
  CHECK(other_gpu[1] == across_nodes[1]);
  CHECK(t.kind(t.link(across_nodes[1]).to) == VertexKind::nic);
  CHECK(t.link(across_nodes[1]).bandwidth.bytes_per_second() == kInterBw);
  CHECK(route(t, 4, 8)[1] != across_nodes[1]);
}

TEST_CASE("pcie tree: PCIe figures default to the host's link, else 32 GB/s and 1 us") {
  auto s = spec_of(TopologyKind::pcie_tree);
  s.devices_per_pcie_switch = 2;
  auto c = test_cluster(1, 4, s);
  auto plain = hw::build_topology(c);
  // 4 devices + 1 host + 2 PCIe switches, no NICs on a single node.
  CHECK(plain.vertex_count() == 7);
  CHECK(plain.bottleneck(route(plain, 0, 1)).bytes_per_second() == 32e9);
  CHECK(plain.latency(route(plain, 0, 1)) == Time::us(1));
  c.host = hw::HostSpec{};
  c.host->pcie = {Bandwidth(64e9), Time::us(3)};
  auto with_host = hw::build_topology(c);
  CHECK(with_host.bottleneck(route(with_host, 0, 1)).bytes_per_second() == 64e9);
  CHECK(with_host.latency(route(with_host, 0, 1)) == Time::us(3));
  // A PCIe switch count must divide the node.
  c.topology->devices_per_pcie_switch = 3;
  auto e = validation_error_of([&] { hw::build_topology(c); });
  CHECK(e.path() == "topology.devices_per_pcie_switch");
}

TEST_CASE("fat-tree: leaves per rack and rail, spines above, oversubscribed uplinks") {
  // 8 nodes x 2 devices, racks of 4 nodes, 2:1: 2 racks x 2 rails = 4 leaves, 4 spines (one
  // per node of a rack). Vertices: 16 devices + 8 NVSwitches + 16 NICs + 4 leaves + 4 spines
  // = 48. Links: 16 device<->NVSwitch (32) + 16 device<->NIC (32) + 16 NIC<->leaf (32) +
  // 4 leaves x 4 spines (32) = 128.
  auto s = spec_of(TopologyKind::fat_tree);
  s.nodes_per_rack = 4;
  s.oversubscription = 2;
  const auto t = hw::build_topology(test_cluster(8, 2, s));
  CHECK(t.vertex_count() == 48);
  CHECK(t.link_count() == 128);
  // Each leaf: 4 downlinks x 25 GB/s / 2 = 50 GB/s of uplink, 12.5 GB/s to each of 4 spines.
  const int leaf = vertex_named(t, "rack0.rail0.leaf");
  double uplink_total = 0;
  for (int l : t.links_from(leaf)) {
    if (t.name(t.link(l).to).starts_with("spine")) {
      CHECK(t.link(l).bandwidth.bytes_per_second() == 12.5e9);
      uplink_total += t.link(l).bandwidth.bytes_per_second();
    }
  }
  CHECK(uplink_total == 4 * kInterBw / 2);

  // Cross-rack, same rail: device 0 (node 0, rail 0) to device 8 (node 4 in rack 1, rail 0):
  // NIC -> leaf -> spine -> leaf -> NIC -> device, limited by the 12.5 GB/s uplink.
  const auto cross = route(t, 0, 8);
  REQUIRE(cross.size() == 6);
  CHECK(kinds_along(t, cross) == std::vector{VertexKind::nic, VertexKind::network_switch,
                                             VertexKind::network_switch, VertexKind::network_switch,
                                             VertexKind::nic, VertexKind::device});
  CHECK(t.name(t.link(cross[1]).to) == "rack0.rail0.leaf");
  CHECK(t.name(t.link(cross[2]).to).starts_with("spine"));
  CHECK(t.name(t.link(cross[3]).to) == "rack1.rail0.leaf");
  CHECK(t.bottleneck(cross).bytes_per_second() == 12.5e9);
  CHECK(t.latency(cross) == kInterLatency);
  // Same rack, same rail: device 0 to device 2 (node 1, rail 0) turns at the leaf.
  const auto in_rack = route(t, 0, 2);
  CHECK(kinds_along(t, in_rack) == std::vector{VertexKind::nic, VertexKind::network_switch,
                                               VertexKind::nic, VertexKind::device});
  CHECK(t.latency(in_rack) == kInterLatency);
  CHECK(t.bottleneck(in_rack).bytes_per_second() == kInterBw);
  // Inside a node: the NVSwitch.
  CHECK(kinds_along(t, route(t, 0, 1)) == std::vector{VertexKind::nvswitch, VertexKind::device});
}

TEST_CASE("fat-tree ECMP: one key one path, many keys over every spine") {
  auto s = spec_of(TopologyKind::fat_tree);
  s.nodes_per_rack = 4;
  const auto t = hw::build_topology(test_cluster(8, 2, s));
  std::map<std::string, int> hits;
  for (std::uint64_t key = 0; key < 400; ++key) {
    const auto r = route(t, 0, 8, key);
    CHECK(r == route(t, 0, 8, key));  // deterministic
    hits[t.name(t.link(r[2]).to)] += 1;
  }
  // 400 flows over 4 spines: every spine is used, each near 100.
  CHECK(hits.size() == 4);
  for (const auto& [spine, n] : hits) {
    CAPTURE(spine);
    CHECK(n >= 70);
    CHECK(n <= 130);
  }
  // Other pairs spread too (the hash mixes the endpoints, not only the key).
  std::map<int, int> by_pair;
  for (int b = 8; b < 16; b += 2) by_pair[t.link(route(t, 0, b, 7)[2]).to] += 1;
  CHECK(!by_pair.empty());
}

TEST_CASE("fat-tree: explicit spines, and a smaller last rack keeps the oversubscription") {
  auto s = spec_of(TopologyKind::fat_tree);
  s.nodes_per_rack = 4;
  s.oversubscription = 2;
  s.spines = 2;  // 4 x 25 GB/s / 2 = 50 GB/s spread over 2 uplinks: 25 GB/s each
  const auto two = hw::build_topology(test_cluster(8, 2, s));
  CHECK(two.vertex_count() == 46);
  CHECK(link_bandwidth(two, vertex_named(two, "rack1.rail1.leaf"), vertex_named(two, "spine1")) ==
        25e9);
  // 6 nodes in racks of 4: rack 1 holds 2 nodes, so its leaves have 2 downlinks and
  // 2 x 25 GB/s / 2 / 4 spines = 6.25 GB/s per uplink; rack 0's leaves 12.5 GB/s.
  s.spines = 0;
  const auto t = hw::build_topology(test_cluster(6, 2, s));
  CHECK(link_bandwidth(t, vertex_named(t, "rack0.rail0.leaf"), vertex_named(t, "spine3")) ==
        12.5e9);
  CHECK(link_bandwidth(t, vertex_named(t, "rack1.rail0.leaf"), vertex_named(t, "spine3")) ==
        6.25e9);
  CHECK(route(t, 0, 10).size() == 6);  // node 0 to node 5 crosses the spine
}

TEST_CASE("ring: each device to the next, routes the shorter way round") {
  auto s = spec_of(TopologyKind::ring);
  s.link_bandwidth = Bandwidth(100e9);
  s.link_latency = Time::us(1);
  const auto t = hw::build_topology(test_cluster(2, 3, s));  // 6 devices
  CHECK(t.vertex_count() == 6);
  CHECK(t.link_count() == 12);
  // 0 -> 4 goes 0 -> 5 -> 4 (2 hops), not 0 -> 1 -> 2 -> 3 -> 4.
  const auto back = route(t, 0, 4);
  REQUIRE(back.size() == 2);
  CHECK(t.link(back[0]).to == t.vertex_of_device(5));
  for (int a = 0; a < 6; ++a) {
    for (int b = 0; b < 6; ++b) {
      const int d = std::abs(a - b);
      const auto r = route(t, a, b, static_cast<std::uint64_t>(a));
      CHECK(static_cast<int>(r.size()) == std::min(d, 6 - d));
      CHECK(t.latency(r) == Time::us(1) * static_cast<std::int64_t>(r.size()));  // per hop
    }
  }
  // Two devices: one cable. Default figures: the cluster's inter_node link.
  const auto pair = hw::build_topology(test_cluster(1, 2, spec_of(TopologyKind::ring)));
  CHECK(pair.link_count() == 2);
  CHECK(pair.bottleneck(route(pair, 0, 1)).bytes_per_second() == kInterBw);
  CHECK(pair.latency(route(pair, 0, 1)) == kInterLatency);
}

TEST_CASE("torus: routes are as long as the Manhattan distance with wraparound") {
  auto check_all_pairs = [](const hw::Topology& t, const std::vector<int>& dims) {
    const int n = t.device_count();
    auto coords = [&](int r) {
      std::vector<int> c(dims.size());
      for (std::size_t d = dims.size(); d-- > 0;) {
        c[d] = r % dims[d];
        r /= dims[d];
      }
      return c;
    };
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        int manhattan = 0;
        const auto ca = coords(a), cb = coords(b);
        for (std::size_t d = 0; d < dims.size(); ++d) {
          const int delta = std::abs(ca[d] - cb[d]);
          manhattan += std::min(delta, dims[d] - delta);
        }
        CAPTURE(a);
        CAPTURE(b);
        CHECK(static_cast<int>(route(t, a, b, static_cast<std::uint64_t>(b)).size()) == manhattan);
      }
    }
  };
  auto s = spec_of(TopologyKind::torus);
  s.dims = {4, 4};
  // 16 devices, each with a cable to its +1 neighbour in both dimensions: 32 cables, 64 links.
  const auto square = hw::build_topology(test_cluster(2, 8, s));
  CHECK(square.vertex_count() == 16);
  CHECK(square.link_count() == 64);
  CHECK(route(square, 0, 15).size() == 2);  // (0,0) -> (3,3): one wraparound in each
  check_all_pairs(square, s.dims);
  // 2 x 2 x 4: extent 2 is one cable, not two: 8 + 8 + 16 cables = 64 links.
  s.dims = {2, 2, 4};
  const auto cube = hw::build_topology(test_cluster(2, 8, s));
  CHECK(cube.link_count() == 64);
  check_all_pairs(cube, s.dims);
  // The extents must multiply to the device count.
  s.dims = {4, 8};
  CHECK(validation_error_of([&] { hw::build_topology(test_cluster(2, 8, s)); }).path() ==
        "topology.dims");
  s.dims = {16};
  CHECK(validation_error_of([&] { hw::build_topology(test_cluster(2, 8, s)); }).path() ==
        "topology.dims");
}

namespace {

// Four devices on one reducing switch (100 GB/s, 1 us per hop), plus a one-way shortcut
// g0 -> g1 (50 GB/s, 500 ns).
hw::TopologySpec star() {
  auto s = spec_of(TopologyKind::graph);
  s.vertices.push_back({"sw", VertexKind::network_switch, true});
  for (int i = 0; i < 4; ++i) {
    const std::string g = "g" + std::to_string(i);
    s.vertices.push_back({g, VertexKind::device, false});
    s.links.push_back({g, "sw", Bandwidth(100e9), Time::us(1), true});
    s.devices.push_back(g);
  }
  s.links.push_back({"g0", "g1", Bandwidth(50e9), Time::ns(500), false});
  return s;
}

}  // namespace

TEST_CASE("graph: explicit vertices and links; one-way links route one way") {
  const auto t = hw::build_topology(test_cluster(1, 4, star()));
  CHECK(t.vertex_count() == 5);
  CHECK(t.link_count() == 9);  // 4 duplex + 1 one-way
  CHECK(t.vertex_of_device(2) == vertex_named(t, "g2"));
  const auto forward = route(t, 0, 1);
  CHECK(forward.size() == 1);
  CHECK(t.latency(forward) == Time::ns(500));
  const auto back = route(t, 1, 0);
  CHECK(back.size() == 2);
  CHECK(t.latency(back) == Time::us(2));  // explicit latencies are paid at every hop
  CHECK(t.reducing_switch({0, 1, 2, 3}) == vertex_named(t, "sw"));
}

TEST_CASE("graph: errors name the key") {
  auto s = star();
  s.vertices[2].name = "g0";
  CHECK(validation_error_of([&] { s.validate(); }).path() == "vertices.2.name");
  s = star();
  s.links[0].to = "sw1";
  auto e = validation_error_of([&] { s.validate(); });
  CHECK(e.path() == "links.0.to");
  CHECK(contains(e.what(), "did you mean 'sw'"));
  s = star();
  s.devices[2] = "sw";
  CHECK(validation_error_of([&] { s.validate(); }).path() == "devices.2");
  s = star();
  s.vertices[1].reduces = true;  // a device
  CHECK(validation_error_of([&] { s.validate(); }).path() == "vertices.1.reduces");
  // Checks against the cluster: one vertex per device, every device reaches every other.
  s = star();
  s.devices.pop_back();
  CHECK(validation_error_of([&] { hw::build_topology(test_cluster(1, 4, s)); }).path() ==
        "topology.devices");
  s = star();
  s.links[3].duplex = false;  // g3 -> sw only: nothing reaches g3
  e = validation_error_of([&] { hw::build_topology(test_cluster(1, 4, s)); });
  CHECK(e.path() == "topology.links");
  CHECK(contains(e.what(), "'g0'"));
  CHECK(contains(e.what(), "'g3'"));
  // validate() errors come out of build_topology under "topology".
  s = star();
  s.links[1].from = "nowhere";
  CHECK(validation_error_of([&] { hw::build_topology(test_cluster(1, 4, s)); }).path() ==
        "topology.links.1.from");
}

TEST_CASE("graph: parse errors name the JSON path") {
  const nlohmann::json good = {
      {"kind", "graph"},
      {"vertices",
       {{{"name", "sw"}, {"kind", "nvswitch"}, {"reduces", true}},
        {{"name", "a"}, {"kind", "device"}},
        {{"name", "b"}, {"kind", "device"}}}},
      {"links",
       {{{"from", "a"}, {"to", "sw"}, {"bandwidth", "450 GB/s"}, {"latency", "1 us"}},
        {{"from", "b"}, {"to", "sw"}, {"bandwidth", "450 GB/s"}, {"latency", "1 us"}},
        {{"from", "a"},
         {"to", "b"},
         {"bandwidth", "100 GB/s"},
         {"latency", "2 us"},
         {"duplex", false}}}},
      {"devices", {"a", "b"}}};
  const auto s = read(good);
  CHECK(s.kind == TopologyKind::graph);
  REQUIRE(s.vertices.size() == 3);
  CHECK(s.vertices[0].kind == VertexKind::nvswitch);
  CHECK(s.vertices[0].reduces);
  REQUIRE(s.links.size() == 3);
  CHECK(s.links[0].bandwidth.bytes_per_second() == 450e9);
  CHECK(s.links[0].duplex);
  CHECK(!s.links[2].duplex);
  CHECK(s.devices == std::vector<std::string>{"a", "b"});
  CHECK_NOTHROW(s.validate());
  CHECK(hw::build_topology(test_cluster(1, 2, s)).link_count() == 5);

  auto bad = good;
  bad["vertices"][1]["kind"] = "switch";
  auto e = error_of([&] { read(bad); });
  CHECK(e.source() == "cluster.json");
  CHECK(e.path() == "topology.vertices.1.kind");
  CHECK(contains(e.message(), "did you mean \"nvswitch\""));
  bad = good;
  bad["links"][0].erase("bandwidth");
  e = error_of([&] { read(bad); });
  CHECK(e.path() == "topology.links.0.bandwidth");
  CHECK(contains(e.message(), "missing required key"));
  bad = good;
  bad["links"][1]["bandwith"] = "1 GB/s";
  e = error_of([&] { read(bad); });
  CHECK(e.path() == "topology.links.1.bandwith");
  CHECK(contains(e.message(), "did you mean 'bandwidth'"));
  bad = good;
  bad["links"][2]["latency"] = 2;
  CHECK(error_of([&] { read(bad); }).path() == "topology.links.2.latency");
  bad = good;
  bad["devices"][1] = 7;
  CHECK(error_of([&] { read(bad); }).path() == "topology.devices.1");
  bad = good;
  bad["vertices"] = "sw";
  CHECK(error_of([&] { read(bad); }).path() == "topology.vertices");
}

TEST_CASE("read_topology: each kind's keys, and only those") {
  auto fat = read(
      {{"kind", "fat_tree"}, {"nodes_per_rack", 16}, {"oversubscription", 2.0}, {"spines", 8}});
  CHECK(fat.kind == TopologyKind::fat_tree);
  CHECK(fat.nodes_per_rack == 16);
  CHECK(fat.oversubscription == 2.0);
  CHECK(fat.spines == 8);
  auto pcie = read({{"kind", "pcie_tree"},
                    {"devices_per_pcie_switch", 2},
                    {"pcie", {{"bandwidth", "16 GB/s"}, {"latency", "2 us"}}}});
  CHECK(pcie.devices_per_pcie_switch == 2);
  CHECK(pcie.pcie_bandwidth->bytes_per_second() == 16e9);
  CHECK(*pcie.pcie_latency == Time::us(2));
  auto torus = read({{"kind", "torus"}, {"dims", {4, 8}}, {"link", {{"bandwidth", "100 GB/s"}}}});
  CHECK(torus.dims == std::vector<int>{4, 8});
  CHECK(torus.link_bandwidth->bytes_per_second() == 100e9);
  CHECK(!torus.link_latency);
  auto ring = read({{"kind", "ring"}, {"link", {{"latency", "3 us"}}}});
  CHECK(*ring.link_latency == Time::us(3));
  CHECK(read({{"kind", "nvswitch"}, {"sharp", true}}).sharp);
  CHECK(read({{"kind", "two_level"}}).kind == TopologyKind::two_level);

  auto e = error_of([&] { read({{"kind", "fat_tree"}, {"nodes_per_rak", 4}}); });
  CHECK(e.path() == "topology.nodes_per_rak");
  CHECK(contains(e.message(), "did you mean 'nodes_per_rack'"));
  e = error_of([&] { read({{"kind", "ring"}, {"dims", {2, 3}}}); });
  CHECK(e.path() == "topology.dims");
  CHECK(contains(e.message(), "kind \"torus\""));
  e = error_of([&] { read({{"kind", "two_level"}, {"sharp", true}}); });
  CHECK(e.path() == "topology.sharp");
  e = error_of([&] { read({{"kind", "fat-tree"}}); });
  CHECK(e.path() == "topology.kind");
  CHECK(contains(e.message(), "did you mean \"fat_tree\""));
  e = error_of([&] { read({{"kind", "torus"}, {"dims", "4x4"}}); });
  CHECK(e.path() == "topology.dims");
  e = error_of([&] { read({{"kind", "pcie_tree"}, {"pcie", {{"bandwdith", "1 GB/s"}}}}); });
  CHECK(e.path() == "topology.pcie.bandwdith");
  CHECK(error_of([&] { read({{"nodes_per_rack", 4}}); }).path() == "topology.kind");
}

TEST_CASE("TopologySpec::validate checks ranges") {
  auto s = spec_of(TopologyKind::fat_tree);
  CHECK_NOTHROW(s.validate());
  s.oversubscription = 0.5;
  CHECK(validation_error_of([&] { s.validate(); }).path() == "oversubscription");
  s = spec_of(TopologyKind::fat_tree);
  s.nodes_per_rack = 0;
  CHECK(validation_error_of([&] { s.validate(); }).path() == "nodes_per_rack");
  s = spec_of(TopologyKind::torus);
  s.dims = {4};
  CHECK(validation_error_of([&] { s.validate(); }).path() == "dims");
  s.dims = {4, 0};
  CHECK(validation_error_of([&] { s.validate(); }).path() == "dims.1");
  s = spec_of(TopologyKind::pcie_tree);
  s.devices_per_pcie_switch = 0;
  CHECK(validation_error_of([&] { s.validate(); }).path() == "devices_per_pcie_switch");
  s = spec_of(TopologyKind::ring);
  s.link_bandwidth = Bandwidth(0);
  CHECK(validation_error_of([&] { s.validate(); }).path() == "link.bandwidth");
  CHECK(hw::name_of(TopologyKind::fat_tree) == "fat_tree");
  CHECK(hw::name_of(VertexKind::network_switch) == "network_switch");
}

TEST_CASE("per-device overrides change that device's own links") {
  auto c = test_cluster(2, 4);
  hw::DeviceOverride slow_nic;
  slow_nic.ranks = {5};
  slow_nic.inter_node = hw::LinkSpec{Bandwidth(5e9), Time::us(10)};
  hw::DeviceOverride slow_nvlink;
  slow_nvlink.ranks = {2};
  slow_nvlink.intra_node = hw::LinkSpec{Bandwidth(100e9), Time::us(3)};
  c.overrides = {slow_nic, slow_nvlink};
  const auto t = hw::build_topology(c);
  // Device 5's NIC links run at 5 GB/s; the sender pays its own latency.
  CHECK(t.bottleneck(route(t, 0, 5)).bytes_per_second() == 5e9);
  CHECK(t.latency(route(t, 0, 5)) == kInterLatency);
  CHECK(t.latency(route(t, 5, 0)) == Time::us(10));
  CHECK(t.bottleneck(route(t, 0, 6)).bytes_per_second() == kInterBw);
  // Device 2's NVLink: 100 GB/s both ways, 3 us when it sends.
  CHECK(t.bottleneck(route(t, 2, 3)).bytes_per_second() == 100e9);
  CHECK(t.bottleneck(route(t, 3, 2)).bytes_per_second() == 100e9);
  CHECK(t.latency(route(t, 2, 3)) == Time::us(3));
  CHECK(t.latency(route(t, 3, 2)) == kIntraLatency);
  CHECK(t.bottleneck(route(t, 0, 1)).bytes_per_second() == kIntraBw);

  // In a fat-tree the slow NIC's leaf link is slow too; in a ring both of its cables are.
  auto fat = spec_of(TopologyKind::fat_tree);
  fat.nodes_per_rack = 1;
  c.topology = fat;
  const auto f = hw::build_topology(c);
  CHECK(f.bottleneck(route(f, 1, 5)).bytes_per_second() == 5e9);  // same rail, other rack
  c.topology = spec_of(TopologyKind::ring);
  const auto ring = hw::build_topology(c);
  CHECK(ring.bottleneck(route(ring, 4, 5)).bytes_per_second() == 5e9);
  CHECK(ring.bottleneck(route(ring, 6, 5)).bytes_per_second() == 5e9);
  CHECK(ring.bottleneck(route(ring, 6, 7)).bytes_per_second() == kInterBw);
}
