// Closed-form routing (Topology::route on two_level, nvswitch and fat_tree graphs) against the
// reference, route_by_tables (one BFS per destination, the next hops in link order, the same
// ECMP hash): the same links for every source vertex, every device and NVSwitch destination and
// several flow keys, on small clusters with and without oversubscription, several spines and a
// partial last rack; and no per-destination table kept.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/topology.hpp"

using namespace stratasim;
using hw::TopologyKind;
using hw::VertexKind;

namespace {

hw::ClusterSpec cluster_of(int nodes, int devices_per_node, hw::TopologySpec topology) {
  hw::ClusterSpec c;
  c.name = "routing-test";
  c.nodes = nodes;
  c.devices_per_node = devices_per_node;
  c.intra_node = {Bandwidth(300e9), Time::us(2)};
  c.inter_node = {Bandwidth(25e9), Time::us(5)};
  c.topology = std::move(topology);
  return c;
}

hw::TopologySpec fat_tree(int nodes_per_rack, double oversubscription, int spines) {
  hw::TopologySpec s;
  s.kind = TopologyKind::fat_tree;
  s.nodes_per_rack = nodes_per_rack;
  s.oversubscription = oversubscription;
  s.spines = spines;
  return s;
}

hw::TopologySpec two_level(TopologyKind kind = TopologyKind::two_level, bool sharp = false) {
  hw::TopologySpec s;
  s.kind = kind;
  s.sharp = sharp;
  return s;
}

/// Every route from any vertex to every device and NVSwitch, for several keys, equals the
/// reference; returns how many routes had more than one shortest path to choose from (the
/// closed form's ECMP was exercised), counted as routes whose links differ between keys.
int check_all_routes(const hw::Topology& t) {
  const std::vector<std::uint64_t> keys = {0, 1, 7, 0x9e3779b97f4a7c15ULL, 123456789};
  int spread = 0;
  std::vector<int> closed, reference, first;
  for (int to = 0; to < t.vertex_count(); ++to) {
    const VertexKind kind = t.kind(to);
    if (kind != VertexKind::device && kind != VertexKind::nvswitch) continue;
    for (int from = 0; from < t.vertex_count(); ++from) {
      bool differs = false;
      for (std::size_t k = 0; k < keys.size(); ++k) {
        closed.clear();
        reference.clear();
        t.route(from, to, keys[k], closed);
        t.route_by_tables(from, to, keys[k], reference);
        CHECK_MESSAGE(closed == reference, t.name(from)
                                               << " -> " << t.name(to) << " key " << keys[k]);
        if (k == 0) first = closed;
        differs = differs || closed != first;
      }
      spread += differs ? 1 : 0;
    }
  }
  return spread;
}

}  // namespace

TEST_CASE("fat-tree closed-form routes equal the BFS tables' routes, link for link") {
  struct Case {
    std::string what;
    int nodes, devices_per_node;
    hw::TopologySpec spec;
  };
  const std::vector<Case> cases = {
      {"2 racks of 2 nodes, 2 rails, spines by default", 4, 2, fat_tree(2, 1.0, 0)},
      {"partial last rack (5 nodes in racks of 2), 4 rails, 3 spines, 2:1 oversubscribed", 5, 4,
       fat_tree(2, 2.0, 3)},
      {"one rack, one rail (no NVSwitch detours)", 3, 1, fat_tree(4, 1.0, 0)},
      {"a rack per node, one spine, 3:1", 6, 2, fat_tree(1, 3.0, 1)},
      {"3 racks of 3 nodes, 3 rails, 5 spines", 9, 3, fat_tree(3, 1.5, 5)},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    const hw::Topology t = hw::build_topology(cluster_of(c.nodes, c.devices_per_node, c.spec));
    // Route first (no table may be built), then compare against the tables.
    std::vector<int> out;
    for (int a = 0; a < t.device_count(); ++a) {
      for (int b = 0; b < t.device_count(); ++b) {
        t.route(t.vertex_of_device(a), t.vertex_of_device(b), 42, out);
      }
    }
    CHECK(t.routing_tables() == 0);
    const int spread = check_all_routes(t);
    // With more than one rail, devices of one rack on different rails have three kinds of
    // 6-hop path (NVSwitch first, spine, NVSwitch last), so the keys must spread some routes.
    if (c.devices_per_node > 1) CHECK(spread > 0);
  }
}

TEST_CASE("two-level and nvswitch closed-form routes equal the BFS tables' routes") {
  for (const auto& [nodes, per_node, spec] : std::vector<std::tuple<int, int, hw::TopologySpec>>{
           {3, 4, two_level()},
           {2, 1, two_level()},
           {4, 2, two_level(TopologyKind::nvswitch, true)},
       }) {
    CAPTURE(nodes);
    CAPTURE(per_node);
    const hw::Topology t = hw::build_topology(cluster_of(nodes, per_node, spec));
    std::vector<int> out;
    t.route(t.vertex_of_device(0), t.vertex_of_device(t.device_count() - 1), 0, out);
    // 4 hops across nodes: device -> NIC -> network -> NIC -> device.
    CHECK(out.size() == 4);
    CHECK(t.routing_tables() == 0);
    check_all_routes(t);
  }
}

TEST_CASE("routing memory: no table per destination on structured graphs; tables elsewhere") {
  // 32 nodes x 8 = 256 devices on a fat-tree: routes between all pairs keep no table.
  const hw::Topology t = hw::build_topology(cluster_of(32, 8, fat_tree(4, 2.0, 0)));
  std::vector<int> out;
  for (int a = 0; a < t.device_count(); ++a) {
    for (int b = 0; b < t.device_count(); ++b) {
      out.clear();
      t.route(a, b, static_cast<std::uint64_t>(a), out);
    }
  }
  CHECK(t.routing_tables() == 0);
  // The reference keeps one table per destination asked for.
  t.route_by_tables(0, 5, 0, out);
  t.route_by_tables(1, 9, 0, out);
  CHECK(t.routing_tables() == 2);

  // A destination that is neither a device nor an NVSwitch (a spine) uses the tables.
  hw::Topology fresh = hw::build_topology(cluster_of(4, 2, fat_tree(2, 1.0, 0)));
  int spine = -1;
  for (int v = 0; v < fresh.vertex_count(); ++v) {
    if (fresh.name(v) == "spine0") spine = v;
  }
  REQUIRE(spine >= 0);
  fresh.route(0, spine, 0, out);
  CHECK(fresh.routing_tables() == 1);

  // A graph changed after building loses its shape: routes fall back to (correct) tables.
  hw::Topology changed = hw::build_topology(cluster_of(4, 2, fat_tree(2, 1.0, 0)));
  const int extra = changed.add_vertex(VertexKind::network_switch, "extra");
  changed.add_duplex(0, extra, Bandwidth(1e9), Time::zero());
  changed.add_duplex(extra, 7, Bandwidth(1e9), Time::zero());
  out.clear();
  changed.route(0, 7, 0, out);
  CHECK(out.size() == 2);  // the new shortcut: dev0 -> extra -> dev7
  CHECK(changed.routing_tables() == 1);
}

TEST_CASE("ring closed-form routes equal the BFS tables' routes (both ways round half-way)") {
  for (int devices : {3, 4, 5, 8}) {
    CAPTURE(devices);
    hw::TopologySpec spec;
    spec.kind = TopologyKind::ring;
    const hw::Topology t = hw::build_topology(cluster_of(devices, 1, spec));
    std::vector<int> out;
    t.route(0, devices / 2, 0, out);
    CHECK(static_cast<int>(out.size()) == devices / 2);  // the shorter way: W/2 hops
    CHECK(t.routing_tables() == 0);
    const int spread = check_all_routes(t);
    // An even ring has two equal ways to the device opposite: the keys spread those.
    CHECK((spread > 0) == (devices % 2 == 0));
  }
}

TEST_CASE("torus closed-form routes equal the BFS tables' routes (extents 1, 2 and more)") {
  for (const std::vector<int>& dims :
       std::vector<std::vector<int>>{{3, 4}, {2, 4}, {4, 4}, {1, 5}, {2, 3, 2}, {3, 3, 2}}) {
    CAPTURE(dims.size());
    CAPTURE(dims.front());
    CAPTURE(dims[1]);
    hw::TopologySpec spec;
    spec.kind = TopologyKind::torus;
    spec.dims = dims;
    int devices = 1;
    for (int d : dims) devices *= d;
    const hw::Topology t = hw::build_topology(cluster_of(devices, 1, spec));
    // Rank 0 to the last rank: one hop back round each dimension of extent 3 or more, one
    // cable across each of extent 2, none across extent 1.
    std::vector<int> out;
    t.route(0, devices - 1, 0, out);
    int expected = 0;
    for (int d : dims) expected += d > 1 ? 1 : 0;
    CHECK(static_cast<int>(out.size()) == expected);
    CHECK(t.routing_tables() == 0);
    // Two or more dimensions with links: several shortest paths between diagonal devices
    // (either dimension first), so the keys spread some routes. {1, 5} is an odd ring: none.
    const int spread = check_all_routes(t);
    CHECK((spread > 0) == (expected >= 2));
  }
}

TEST_CASE("automorphisms: moving whole racks or nodes keeps the graph; straddling does not") {
  // 8 nodes of 4 GPUs, racks of 2 nodes (4 racks), 2 spines.
  const auto c = cluster_of(8, 4, fat_tree(2, 2.0, 2));
  const auto t = hw::build_topology(c);
  const int w = 32;
  auto shifted = [&](int by) {  // every device moved up by `by`, cyclically
    std::vector<int> m(w);
    for (int r = 0; r < w; ++r) m[static_cast<std::size_t>(r)] = (r + by) % w;
    return m;
  };
  std::string why;
  SUBCASE("one rack up: an automorphism") {
    const auto a = t.automorphism(shifted(8), why);
    REQUIRE(a.has_value());
    // Every link onto a link of the same figures joining the images of its ends, and no two
    // links onto one.
    std::vector<char> hit(static_cast<std::size_t>(t.link_count()), 0);
    for (int l = 0; l < t.link_count(); ++l) {
      const int m = a->link[static_cast<std::size_t>(l)];
      CHECK(t.link(m).from == a->vertex[static_cast<std::size_t>(t.link(l).from)]);
      CHECK(t.link(m).to == a->vertex[static_cast<std::size_t>(t.link(l).to)]);
      CHECK(t.link(m).bandwidth.bytes_per_second() == t.link(l).bandwidth.bytes_per_second());
      CHECK(hit[static_cast<std::size_t>(m)] == 0);
      hit[static_cast<std::size_t>(m)] = 1;
    }
    // Device 0 goes to device 8 (rack 1); spines (vertices 56 and 57: after 32 devices, 8
    // NVSwitches and 4 racks x 4 rails of leaves) stay.
    CHECK(a->vertex[0] == 8);
    CHECK(a->vertex[56] == 56);
    // With period 4 (four such moves bring every rack back), the 2 spines turn by
    // 2 / gcd(4, 2) = 1 place.
    const auto turned = t.automorphism(shifted(8), why, 4);
    REQUIRE(turned.has_value());
    CHECK(turned->vertex[56] == 57);
    CHECK(turned->vertex[57] == 56);
  }
  SUBCASE("one node up: node 1 would leave rack 0 while node 7 enters it") {
    CHECK_FALSE(t.automorphism(shifted(4), why).has_value());
    CHECK(why.find("no counterpart") != std::string::npos);
  }
  SUBCASE("half a node up: devices change rails") {
    CHECK_FALSE(t.automorphism(shifted(2), why).has_value());
    CHECK(why.find("whole node") != std::string::npos);
  }
  SUBCASE("a degraded NIC breaks it") {
    auto degraded = c;
    hw::DeviceOverride o;
    o.ranks = {3};
    o.inter_node = hw::LinkSpec{Bandwidth(12.5e9), Time::us(5)};
    degraded.overrides.push_back(o);
    CHECK_FALSE(hw::build_topology(degraded).automorphism(shifted(8), why).has_value());
    CHECK(why.find("differs") != std::string::npos);
  }
  SUBCASE("not a permutation") {
    auto m = shifted(8);
    m[1] = m[0];
    CHECK_FALSE(t.automorphism(m, why).has_value());
  }
}

TEST_CASE("pcie_tree closed-form routes equal the BFS tables' routes (one node and several)") {
  // (nodes, GPUs per node, GPUs per PCIe switch): one node has no network and no NICs; with
  // several, a NIC reaches another switch of its node two ways (4 hops back through the root
  // complex or out through the network), and a root complex reaches another node through any
  // of its switches' NICs: the keys must spread both.
  for (const auto& [nodes, per_node, per_switch] : std::vector<std::tuple<int, int, int>>{
           {1, 8, 4}, {1, 4, 4}, {3, 4, 2}, {2, 8, 4}, {4, 2, 1}}) {
    CAPTURE(nodes);
    CAPTURE(per_node);
    CAPTURE(per_switch);
    hw::TopologySpec spec;
    spec.kind = TopologyKind::pcie_tree;
    spec.devices_per_pcie_switch = per_switch;
    const hw::Topology t = hw::build_topology(cluster_of(nodes, per_node, spec));
    CHECK(t.routes_in_closed_form());
    // Two GPUs on different switches of node 0 (when it has two): GPU -> switch -> root complex
    // -> switch -> GPU, 4 hops.
    if (per_node > per_switch) {
      std::vector<int> out;
      t.route(0, per_switch, 0, out);
      CHECK(out.size() == 4);
    }
    const int spread = check_all_routes(t);
    CHECK(t.routing_tables() == static_cast<std::size_t>(t.device_count()));  // the reference's
    CHECK((spread > 0) == (nodes > 1 && per_node > per_switch));
  }
}

TEST_CASE("explicit graphs: routing tables stay within the limit, and routes stay right") {
  // A ring of 12 devices written as a graph: each table holds (vertices + 1) offsets and one
  // or two next hops per vertex, about 25 ints, so a limit of 60 ints keeps two tables.
  hw::TopologySpec spec;
  spec.kind = TopologyKind::graph;
  const int n = 12;
  for (int i = 0; i < n; ++i)
    spec.vertices.push_back({"d" + std::to_string(i), VertexKind::device});
  for (int i = 0; i < n; ++i) {
    hw::ExplicitLink l;
    l.from = "d" + std::to_string(i);
    l.to = "d" + std::to_string((i + 1) % n);
    l.bandwidth = Bandwidth(1e9);
    l.latency = Time::us(1);
    l.duplex = true;
    spec.links.push_back(l);
    spec.devices.push_back("d" + std::to_string(i));
  }
  hw::Topology t = hw::build_topology(cluster_of(n, 1, spec));
  CHECK_FALSE(t.routes_in_closed_form());
  std::vector<std::vector<int>> before;
  std::vector<int> out;
  for (int to = 0; to < n; ++to) {
    out.clear();
    t.route(0, to, 3, out);
    before.push_back(out);
  }
  CHECK(t.routing_tables() == static_cast<std::size_t>(n - 1));  // all kept by default
  hw::Topology bounded = hw::build_topology(cluster_of(n, 1, spec));
  bounded.set_routing_table_limit(60);
  for (int round = 0; round < 2; ++round) {
    for (int to = 0; to < n; ++to) {
      out.clear();
      bounded.route(0, to, 3, out);
      CHECK(out == before[static_cast<std::size_t>(to)]);
      CHECK(bounded.routing_tables() <= 2);
    }
  }
}
