// The topology graph, its builders and its config section.
//
// Storage: vertices and links are kept in plain vectors (ids are indices, link ids are in
// insertion order) beside a Boost.Graph adjacency list with the same vertices and one edge per
// link; Boost computes the hop distances (BFS on the reversed graph from a destination) and the
// strongly connected components (reachability check of explicit graphs).
//
// Routing: for each destination asked for, one BFS gives every vertex's hop distance to it, and
// from those a table of next hops: for every vertex, the links out of it whose far end is one
// hop closer. A route walks that table from the source, choosing among several next hops by a
// hash of (source, destination, flow key, current vertex), so one flow keeps one path and the
// flows between one pair spread over all shortest paths (ECMP). Tables are built on first use
// and kept; a route then costs one table lookup per hop and allocates nothing beyond `out`.
// Memory: one table per destination, about (vertices + next hops) ints each. Those tables are
// the reference (route_by_tables) and serve explicit graphs and the other builders; the
// two_level/nvswitch and fat_tree graphs route to devices and NVSwitches in closed form
// (RoutingStructure below): the same hop distances and the same candidate links in the same
// order, so the same hash picks the same link, with no table.
//
// Latency placement ("the sender pays"): the builders put a route's configured latency on the
// link where a message enters the fabric and zero on the links after it, so that the sum over a
// route equals the configured figure exactly (integer picoseconds, no halving):
// - NVSwitch (two_level, nvswitch, fat_tree): device -> NVSwitch carries the device's intra_node
//   latency, NVSwitch -> device zero; intra-node route = intra_node.latency.
// - NIC: device -> NIC carries the device's inter_node latency; NIC -> switch, switch -> switch,
//   switch -> NIC, NIC -> device carry zero; inter-node route = inter_node.latency (whether it
//   crosses one switch or a leaf, a spine and a leaf).
// - pcie_tree: every upward PCIe hop (GPU -> PCIe switch, PCIe switch -> root complex) carries
//   the PCIe latency, downward hops zero; PCIe switch -> NIC carries the inter_node latency. So
//   GPUs under one PCIe switch: pcie latency; across the root complex: 2 x pcie latency; across
//   nodes: pcie + inter_node latency.
// - ring, torus, explicit graphs: every link carries its own latency in both directions (a
//   message pays it at each hop).
#include "hw_models/topology.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/breadth_first_search.hpp>
#include <boost/graph/reverse_graph.hpp>
#include <boost/graph/strong_components.hpp>
#include <boost/graph/visitors.hpp>

#include "hw_models/cluster.hpp"

namespace stratasim::hw {

namespace {

constexpr std::string_view kVertexKindNames[] = {"device",         "nic", "pcie_switch", "nvswitch",
                                                 "network_switch", "host"};
constexpr std::string_view kTopologyKindNames[] = {"two_level", "nvswitch", "pcie_tree", "fat_tree",
                                                   "ring",      "torus",    "graph"};

// The config keys of each kind (besides "kind"), in TopologyKind order.
constexpr std::string_view kNvswitchKeys[] = {"sharp"};
constexpr std::string_view kPcieKeys[] = {"devices_per_pcie_switch", "pcie"};
constexpr std::string_view kFatTreeKeys[] = {"nodes_per_rack", "oversubscription", "spines"};
constexpr std::string_view kRingKeys[] = {"link"};
constexpr std::string_view kTorusKeys[] = {"dims", "link"};
constexpr std::string_view kGraphKeys[] = {"vertices", "links", "devices"};

std::span<const std::string_view> keys_of(TopologyKind kind) {
  switch (kind) {
    case TopologyKind::two_level:
      return {};  // no parameters
    case TopologyKind::nvswitch:
      return kNvswitchKeys;
    case TopologyKind::pcie_tree:
      return kPcieKeys;
    case TopologyKind::fat_tree:
      return kFatTreeKeys;
    case TopologyKind::ring:
      return kRingKeys;
    case TopologyKind::torus:
      return kTorusKeys;
    case TopologyKind::graph:
      return kGraphKeys;
  }
  return {};
}

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS>;

// splitmix64's finaliser: a cheap, well-mixed 64-bit hash, identical on every machine.
constexpr std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

// ECMP, one rule for both routing paths (tables and closed form): a flow's hash mixes its key
// with its two ends, and the choice at each vertex mixes that hash with the vertex, so that the
// choices at successive vertices are independent and one flow always takes one path.
std::uint64_t flow_hash(int from, int to, std::uint64_t flow_key) {
  return mix(flow_key ^ mix((static_cast<std::uint64_t>(static_cast<std::uint32_t>(from)) << 32) |
                            static_cast<std::uint32_t>(to)));
}

/// Which of `choices` (> 0) equally short next hops the flow takes at vertex `at`.
int ecmp_pick(std::uint64_t flow, int at, int choices) {
  if (choices <= 1) return 0;
  const std::uint64_t h = mix(flow ^ (static_cast<std::uint64_t>(at) * 0x9e3779b97f4a7c15ULL));
  return static_cast<int>(h % static_cast<std::uint64_t>(choices));
}

// The shape of a graph built by the two_level/nvswitch or fat_tree builder (more than one
// node), the ring, torus or pcie_tree builder (pcie_tree_next_link below), recorded at build time
// so that routes to a device or an NVSwitch follow from vertex and link numbering instead of
// per-destination tables. The builders' numbering (W devices, R = devices per node, N nodes;
// fat_tree: P nodes per rack, K racks, S spines):
// - vertices: devices [0, W), NVSwitch of node n: W + n; two_level: the network switch W + N,
//   NIC of rank r: W + N + 1 + r; fat_tree: leaf of (rack k, rail i): W + N + k R + i, spine j:
//   W + N + K R + j, NIC of rank r: W + N + K R + S + r.
// - links: device r -> NVSwitch 2r (back 2r + 1); device r -> NIC 2W + 2r (back + 1); NIC r ->
//   network switch / leaf 4W + 2r (back + 1); fat_tree: leaf (k, i) -> spine j
//   6W + 2((k R + i) S + j) (back + 1).
// Hop distances to a device or NVSwitch are closed forms (dist_to); the next hops at a vertex
// are its out-links (insertion order, as the tables list them) whose far end is one hop
// closer, so the ECMP pick is the tables' pick. Cleared by any change to the graph.
struct RoutingStructure {
  enum class Shape : std::uint8_t { none, two_level, fat_tree, ring, torus, pcie_tree };
  Shape shape = Shape::none;
  int devices = 0, per_node = 0, nodes = 0;  // W, R, N
  int per_rack = 1, racks = 0, spines = 0;   // P, K, S (fat_tree)
  int per_switch = 1;                        // pcie_tree: GPUs per PCIe switch
  // torus (N = 0): extents, row-major (the last varies fastest); unused ones are 1. The hop
  // distance is the sum over dimensions of the way round each ring (extent 2: one cable,
  // extent 1: none); next hops are found by scanning a device's few out-links.
  std::array<int, 3> dims = {1, 1, 1};

  int torus_dist(int v, int to) const {
    int sum = 0;
    for (int d = 2; d >= 0; --d) {
      const int e = dims[static_cast<std::size_t>(d)];
      const int diff = ((v % e) - (to % e) + e) % e;
      sum += std::min(diff, e - diff);
      v /= e;
      to /= e;
    }
    return sum;
  }

  int nvswitch0() const { return devices; }
  int network() const { return devices + nodes; }  // two_level
  int leaf0() const { return devices + nodes; }    // fat_tree
  int spine0() const { return leaf0() + racks * per_node; }
  int nic0() const { return shape == Shape::two_level ? network() + 1 : spine0() + spines; }

  /// Ring (W >= 3 devices, N = 0): cable r joins r and r + 1 mod W, link 2r forward (r -> r +
  /// 1) and 2r + 1 back. Out-links of device 0: forward then back; of any other: back then
  /// forward. The shorter way round is the one next hop; half-way round, both are.
  int ring_next_link(int v, int to, std::uint64_t flow) const {
    const int forward = (to - v + devices) % devices, back = devices - forward;
    const int forward_link = 2 * v, back_link = 2 * ((v - 1 + devices) % devices) + 1;
    if (forward != back) return forward < back ? forward_link : back_link;
    const int pick = ecmp_pick(flow, v, 2);
    const bool first_is_forward = v == 0;
    return (pick == 0) == first_is_forward ? forward_link : back_link;
  }

  /// Routes to `to` have a closed form: a device or an NVSwitch of a recorded shape (a
  /// pcie_tree has no NVSwitch: devices only).
  bool handles(int to) const {
    if (shape == Shape::pcie_tree) return to >= 0 && to < devices;
    return shape != Shape::none && to >= 0 && to < devices + nodes;
  }

  /// pcie_tree (build_pcie_tree's numbering; Q = per_switch GPUs per switch, K = R / Q switches
  /// per node, net = N > 1):
  /// - vertices: devices [0, W); the network switch W (net only); then node n's block of
  ///   B = 1 + K (1 + net) vertices from W + net: its root complex (host) first, then per
  ///   switch k the switch and (net only) its NIC.
  /// - links: switch (n, k) owns L = 2 + 2Q + 4 net consecutive ids from (n K + k) L: switch ->
  ///   root, root -> switch, then per GPU i of the switch GPU -> switch, switch -> GPU, then
  ///   switch -> NIC, NIC -> switch, NIC -> network, network -> NIC.
  /// Every shortest path is unique except from a root complex to another node (any of its K
  /// switches, then that switch's NIC) and from a NIC to another switch of its own node (back
  /// through its switch and the root, or out through the network: 4 hops either way); there
  /// the pick is the tables' (out-links in insertion order).
  int pcie_next_link(int v, int to, std::uint64_t flow) const {
    const bool net = nodes > 1;
    const int q = per_switch, k_count = per_node / q, stride = net ? 2 : 1;
    const int block = 1 + k_count * stride, first = devices + (net ? 1 : 0);
    const int per_switch_links = 2 + 2 * q + (net ? 4 : 0);
    auto links_of = [&](int n, int k) { return (n * k_count + k) * per_switch_links; };
    const int tn = to / per_node, tk = (to % per_node) / q, ti = to % q;
    if (v < devices) {  // up to its switch
      return links_of(v / per_node, (v % per_node) / q) + 2 + 2 * (v % q);
    }
    if (net && v == devices) return links_of(tn, tk) + 5 + 2 * q;  // network -> the target's NIC
    const int n = (v - first) / block, j = (v - first) % block;
    if (j == 0) {  // the root complex: down to the target's switch, or to any switch's NIC
      return links_of(n, n == tn ? tk : ecmp_pick(flow, v, k_count)) + 1;
    }
    const int k = (j - 1) / stride;
    const int base = links_of(n, k);
    if ((j - 1) % stride == 0) {  // a switch: down to the GPU, up to the root, out to the NIC
      if (n == tn && k == tk) return base + 3 + 2 * ti;
      return n == tn ? base : base + 2 + 2 * q;
    }
    // A NIC: to its own switch, else both ways are 4 hops within the node, else the network.
    if (n == tn && k == tk) return base + 3 + 2 * q;
    if (n == tn) return ecmp_pick(flow, v, 2) == 0 ? base + 3 + 2 * q : base + 4 + 2 * q;
    return base + 4 + 2 * q;
  }

  int node_of(int rank) const { return rank / per_node; }
  int rail_of(int rank) const { return rank % per_node; }
  int rack_of(int node) const { return node / per_rack; }

  /// Hop distance from vertex `v` to `to` (handles(to)). Worked out from the builders'
  /// graphs; routing_test checks it against BFS for every vertex pair on small clusters.
  int dist_to(int v, int to) const {
    if (shape == Shape::torus) return torus_dist(v, to);
    const bool to_device = to < devices;
    const int tn = to_device ? node_of(to) : to - nvswitch0();  // the target's node
    if (v < devices) {                                          // device
      if (v == to) return 0;
      if (node_of(v) == tn) return to_device ? 2 : 1;
      if (shape == Shape::two_level) return to_device ? 4 : 5;
      const bool same_rack = rack_of(node_of(v)) == rack_of(tn);
      if (to_device) return same_rack && rail_of(v) == rail_of(to) ? 4 : 6;
      return same_rack ? 5 : 7;
    }
    if (v < nvswitch0() + nodes) {  // NVSwitch
      const int n = v - nvswitch0();
      if (n == tn) return to_device ? 1 : 0;
      if (shape == Shape::two_level) return to_device ? 5 : 6;
      const bool same_rack = rack_of(n) == rack_of(tn);
      if (to_device) return same_rack ? 5 : 7;
      return same_rack ? 6 : 8;
    }
    if (v >= nic0()) {  // NIC of rank r: through its device or its switch
      const int r = v - nic0();
      if (r == to) return 1;
      const int up = shape == Shape::two_level ? network() : leaf0() + leaf_index(r);
      return 1 + std::min(dist_to(r, to), dist_to(up, to));
    }
    if (shape == Shape::two_level) return to_device ? 2 : 3;  // the network switch
    if (v >= spine0()) return to_device ? 3 : 4;              // a spine
    const int leaf = v - leaf0();
    const int k = leaf / per_node;
    if (to_device) return k == rack_of(tn) && leaf % per_node == rail_of(to) ? 2 : 4;
    return k == rack_of(tn) ? 3 : 5;
  }

  /// The leaf of rank r: (rack, rail) as an index from leaf0().
  int leaf_index(int r) const { return rack_of(node_of(r)) * per_node + rail_of(r); }

  /// The top switch (two_level: the network switch; fat_tree: a spine) has too many out-links
  /// to scan; its next hops toward `to` are closed forms. Toward a device: the one link down
  /// to its NIC (two_level) or leaf (fat_tree); toward an NVSwitch: the links down to the NICs
  /// of that node's devices, or to the leaves of that node's rack, in rail order (their order
  /// among the switch's out-links).
  bool top_switch(int v) const {
    return shape == Shape::two_level ? v == network() : v >= spine0() && v < spine0() + spines;
  }
  int top_choices(int to) const { return to < devices ? 1 : per_node; }

  bool is_nvswitch(int v) const { return v >= nvswitch0() && v < nvswitch0() + nodes; }
  /// An NVSwitch's next hops toward `to`: its links down to its node's devices (link 2r + 1 to
  /// rank r, in rank order), all of them or one: (the one's rank or -1 for all). Toward
  /// another node's device, one hop closer are all its devices, except on a fat-tree within
  /// the target's rack, where only the device on the target's rail is (4 hops from it).
  int nvswitch_only(int v, int to) const {
    const int n = v - nvswitch0();
    if (to >= devices) return -1;
    if (node_of(to) == n) return to;
    if (shape == Shape::fat_tree && rack_of(n) == rack_of(node_of(to))) {
      return n * per_node + rail_of(to);
    }
    return -1;
  }

  bool is_leaf(int v) const { return shape == Shape::fat_tree && v >= leaf0() && v < spine0(); }
  /// A leaf's next hops toward `to`, in its out-link order (downlinks to NICs by rank, then
  /// one uplink per spine): the downlink one hop closer, if any (its link, else -1), then
  /// every spine or none.
  std::pair<int, bool> leaf_next_hops(int v, int to) const {
    const int leaf = v - leaf0();
    const int k = leaf / per_node, i = leaf % per_node;
    auto down = [&](int r) { return 4 * devices + 2 * r + 1; };  // leaf -> NIC r
    if (to < devices) {
      if (leaf == leaf_index(to)) return {down(to), false};
      const int n = node_of(to);
      return {k == rack_of(n) ? down(n * per_node + i) : -1, true};
    }
    const int m = to - nvswitch0();
    if (k == rack_of(m)) return {down(m * per_node + i), false};
    return {-1, true};
  }
  /// The uplink of leaf vertex `v` to spine j.
  int leaf_uplink(int v, int j) const { return 6 * devices + 2 * ((v - leaf0()) * spines + j); }
  int top_link(int v, int to, int index) const {
    const bool to_device = to < devices;
    if (shape == Shape::two_level) {  // network -> NIC r: 4W + 2r + 1
      const int r = to_device ? to : (to - nvswitch0()) * per_node + index;
      return 4 * devices + 2 * r + 1;
    }
    // spine j -> leaf (k, i): 6W + 2((k R + i) S + j) + 1
    const int leaf = to_device ? leaf_index(to) : rack_of(to - nvswitch0()) * per_node + index;
    return 6 * devices + 2 * (leaf * spines + (v - spine0())) + 1;
  }
};

}  // namespace

std::string_view name_of(VertexKind kind) {
  return kVertexKindNames[static_cast<int>(kind)];
}

std::string_view name_of(TopologyKind kind) {
  return kTopologyKindNames[static_cast<int>(kind)];
}

// ---------------------------------------------------------------------------------------------
// Topology

struct Topology::Impl {
  struct Vertex {
    VertexKind kind = VertexKind::device;
    std::string name;
    bool reduces = false;
    int rank = -1;  // the device rank this vertex is, or -1
  };
  // For one destination, the links out of every vertex that start a shortest path to it:
  // links[offset[v] .. offset[v + 1]). Empty for the destination itself and for vertices that
  // cannot reach it.
  struct NextHops {
    std::vector<int> offset;
    std::vector<int> links;
  };

  Graph graph;
  std::vector<Vertex> vertices;
  std::vector<TopologyLink> links;
  std::vector<std::vector<int>> out_links, in_links;  // link ids by vertex, insertion order
  std::vector<int> device_vertex;                     // by rank; -1 while unset
  // Routing tables by destination vertex, built on first use. Shared (immutable) between
  // copies of an Impl; cleared whenever the graph changes.
  mutable std::vector<std::shared_ptr<const NextHops>> next_hops;
  // Destinations whose table is held, oldest first, and the ints the tables hold: at most
  // table_limit (Topology::set_routing_table_limit) are kept, so that routing memory stays
  // bounded on explicit graphs however many destinations their flows reach.
  std::size_t table_limit = kDefaultRoutingTableLimit;
  mutable std::deque<int> table_order;
  mutable std::size_t table_ints = 0;
  // The builder's shape, for closed-form routes (none: every route uses the tables).
  RoutingStructure structure;

  int vertex_count() const { return static_cast<int>(vertices.size()); }

  void check_vertex(int v) const {
    if (v < 0 || v >= vertex_count()) {
      throw std::invalid_argument("no vertex " + std::to_string(v) + " (the topology has " +
                                  std::to_string(vertex_count()) + ")");
    }
  }

  std::string describe(int v) const {
    return in_quotes(vertices[v].name) + " (" + std::to_string(v) + ")";
  }

  /// Hop distance from every vertex to `to` (-1: unreachable): a BFS from `to` over the
  /// reversed edges.
  std::vector<int> hop_distances_to(int to) const {
    std::vector<int> dist(vertices.size(), -1);
    dist[static_cast<std::size_t>(to)] = 0;
    auto reversed = boost::make_reverse_graph(graph);
    boost::breadth_first_search(
        reversed, boost::vertex(static_cast<std::size_t>(to), reversed),
        boost::visitor(boost::make_bfs_visitor(boost::record_distances(
            boost::make_iterator_property_map(dist.begin(), boost::get(boost::vertex_index, graph)),
            boost::on_tree_edge()))));
    return dist;
  }

  const NextHops& next_hops_to(int to) const {
    if (next_hops.size() != vertices.size()) next_hops.assign(vertices.size(), nullptr);
    auto& slot = next_hops[static_cast<std::size_t>(to)];
    if (slot) return *slot;
    const std::vector<int> dist = hop_distances_to(to);
    auto table = std::make_shared<NextHops>();
    table->offset.reserve(vertices.size() + 1);
    table->links.reserve(vertices.size());
    for (std::size_t v = 0; v < vertices.size(); ++v) {
      table->offset.push_back(static_cast<int>(table->links.size()));
      if (dist[v] <= 0) continue;  // the destination, or unreachable
      for (int l : out_links[v]) {
        if (dist[static_cast<std::size_t>(links[static_cast<std::size_t>(l)].to)] == dist[v] - 1) {
          table->links.push_back(l);
        }
      }
    }
    table->offset.push_back(static_cast<int>(table->links.size()));
    table_ints += table->offset.size() + table->links.size();
    slot = std::move(table);
    table_order.push_back(to);
    // Bounded: the oldest tables go first (never the one just made); a later route to their
    // destination builds them again.
    while (table_ints > table_limit && table_order.size() > 1) {
      auto& old = next_hops[static_cast<std::size_t>(table_order.front())];
      table_ints -= old->offset.size() + old->links.size();
      old.reset();
      table_order.pop_front();
    }
    return *slot;
  }

  bool has_link(int from, int to) const {
    // Scans the shorter of the two lists: a device has a handful of links, a switch many.
    const auto& out = out_links[static_cast<std::size_t>(from)];
    const auto& in = in_links[static_cast<std::size_t>(to)];
    if (out.size() <= in.size()) {
      return std::any_of(out.begin(), out.end(),
                         [&](int l) { return links[static_cast<std::size_t>(l)].to == to; });
    }
    return std::any_of(in.begin(), in.end(),
                       [&](int l) { return links[static_cast<std::size_t>(l)].from == from; });
  }

  /// A pair of device ranks (a, b) with no path from a to b, if any.
  std::optional<std::pair<int, int>> disconnected_devices() const {
    if (device_vertex.size() < 2) return std::nullopt;
    std::vector<int> component(vertices.size());
    boost::strong_components(graph, boost::make_iterator_property_map(
                                        component.begin(), boost::get(boost::vertex_index, graph)));
    const int first = device_vertex.front();
    for (std::size_t r = 1; r < device_vertex.size(); ++r) {
      const int v = device_vertex[r];
      if (component[static_cast<std::size_t>(v)] == component[static_cast<std::size_t>(first)]) {
        continue;
      }
      // Not mutually reachable: find the direction that fails.
      const bool first_reaches = hop_distances_to(v)[static_cast<std::size_t>(first)] >= 0;
      if (!first_reaches) return std::pair{0, static_cast<int>(r)};
      return std::pair{static_cast<int>(r), 0};
    }
    return std::nullopt;
  }
};

const Topology::Impl& Topology::get() const {
  static const Impl empty;
  return impl_ ? *impl_ : empty;
}

Topology::Impl& Topology::own() {
  if (!impl_) {
    impl_ = std::make_shared<Impl>();
  } else if (impl_.use_count() > 1) {
    impl_ = std::make_shared<Impl>(*impl_);  // copy on write: other copies keep their graph
  }
  return *impl_;
}

Topology::Impl& Topology::edit() {
  own();
  impl_->next_hops.clear();  // the graph changes: routes must be recomputed
  impl_->table_order.clear();
  impl_->table_ints = 0;
  impl_->structure = {};  // and may no longer have the builder's shape
  return *impl_;
}

int Topology::add_vertex(VertexKind kind, std::string name, bool reduces) {
  Impl& m = edit();
  m.vertices.push_back({kind, std::move(name), reduces, -1});
  m.out_links.emplace_back();
  m.in_links.emplace_back();
  boost::add_vertex(m.graph);
  return m.vertex_count() - 1;
}

int Topology::add_link(int from, int to, Bandwidth bandwidth, Time latency) {
  Impl& m = edit();
  m.check_vertex(from);
  m.check_vertex(to);
  if (from == to) {
    throw std::invalid_argument("a link must join two different vertices, got " + m.describe(from) +
                                " to itself");
  }
  if (!(bandwidth.bytes_per_second() > 0)) {
    throw std::invalid_argument("link " + m.describe(from) + " -> " + m.describe(to) +
                                ": expected a positive bandwidth");
  }
  if (latency < Time::zero()) {
    throw std::invalid_argument("link " + m.describe(from) + " -> " + m.describe(to) +
                                ": expected a latency of at least zero");
  }
  const int id = static_cast<int>(m.links.size());
  m.links.push_back({from, to, bandwidth, latency});
  m.out_links[static_cast<std::size_t>(from)].push_back(id);
  m.in_links[static_cast<std::size_t>(to)].push_back(id);
  boost::add_edge(static_cast<std::size_t>(from), static_cast<std::size_t>(to), m.graph);
  return id;
}

int Topology::add_duplex(int a, int b, Bandwidth bandwidth, Time latency) {
  const int id = add_link(a, b, bandwidth, latency);
  add_link(b, a, bandwidth, latency);
  return id;
}

void Topology::set_device(int rank, int vertex) {
  Impl& m = edit();
  m.check_vertex(vertex);
  if (rank < 0) throw std::invalid_argument("negative rank " + std::to_string(rank));
  auto& v = m.vertices[static_cast<std::size_t>(vertex)];
  if (v.rank >= 0 && v.rank != rank) {
    throw std::invalid_argument("vertex " + m.describe(vertex) + " is already device " +
                                std::to_string(v.rank) + ", cannot also be device " +
                                std::to_string(rank));
  }
  if (static_cast<std::size_t>(rank) >= m.device_vertex.size()) {
    m.device_vertex.resize(static_cast<std::size_t>(rank) + 1, -1);
  }
  int& slot = m.device_vertex[static_cast<std::size_t>(rank)];
  if (slot >= 0) m.vertices[static_cast<std::size_t>(slot)].rank = -1;
  slot = vertex;
  v.rank = rank;
}

int Topology::vertex_count() const {
  return get().vertex_count();
}

int Topology::link_count() const {
  return static_cast<int>(get().links.size());
}

int Topology::device_count() const {
  return static_cast<int>(get().device_vertex.size());
}

int Topology::vertex_of_device(int rank) const {
  const Impl& m = get();
  if (rank < 0 || static_cast<std::size_t>(rank) >= m.device_vertex.size() ||
      m.device_vertex[static_cast<std::size_t>(rank)] < 0) {
    throw std::invalid_argument("device " + std::to_string(rank) +
                                " has no vertex in the topology (it has " +
                                std::to_string(m.device_vertex.size()) + " devices)");
  }
  return m.device_vertex[static_cast<std::size_t>(rank)];
}

VertexKind Topology::kind(int vertex) const {
  get().check_vertex(vertex);
  return get().vertices[static_cast<std::size_t>(vertex)].kind;
}

const std::string& Topology::name(int vertex) const {
  get().check_vertex(vertex);
  return get().vertices[static_cast<std::size_t>(vertex)].name;
}

bool Topology::reduces(int vertex) const {
  get().check_vertex(vertex);
  return get().vertices[static_cast<std::size_t>(vertex)].reduces;
}

const TopologyLink& Topology::link(int id) const {
  const Impl& m = get();
  if (id < 0 || static_cast<std::size_t>(id) >= m.links.size()) {
    throw std::invalid_argument("no link " + std::to_string(id) + " (the topology has " +
                                std::to_string(m.links.size()) + ")");
  }
  return m.links[static_cast<std::size_t>(id)];
}

std::vector<int> Topology::links_from(int vertex) const {
  get().check_vertex(vertex);
  return get().out_links[static_cast<std::size_t>(vertex)];
}

void Topology::route(int from, int to, std::uint64_t flow_key, std::vector<int>& out) const {
  const Impl& m = get();
  m.check_vertex(from);
  m.check_vertex(to);
  if (from == to) return;
  const RoutingStructure& s = m.structure;
  if (!s.handles(to)) {
    route_by_tables(from, to, flow_key, out);
    return;
  }
  const std::uint64_t flow = flow_hash(from, to, flow_key);
  int at = from;
  // Hops still to go (used where next hops are found by scanning; not on a ring).
  const bool by_next_link =
      s.shape == RoutingStructure::Shape::ring || s.shape == RoutingStructure::Shape::pcie_tree;
  int left = by_next_link ? 0 : s.dist_to(from, to);
  while (at != to) {
    int l = -1;
    if (s.shape == RoutingStructure::Shape::ring) {
      l = s.ring_next_link(at, to, flow);
    } else if (s.shape == RoutingStructure::Shape::pcie_tree) {
      l = s.pcie_next_link(at, to, flow);
    } else if (s.top_switch(at)) {
      const int choices = s.top_choices(to);
      l = s.top_link(at, to, ecmp_pick(flow, at, choices));
    } else if (s.is_leaf(at)) {
      const auto [down, up] = s.leaf_next_hops(at, to);
      int pick = ecmp_pick(flow, at, (down >= 0 ? 1 : 0) + (up ? s.spines : 0));
      if (down >= 0 && pick-- == 0) {
        l = down;
      } else {
        l = s.leaf_uplink(at, pick);
      }
    } else if (s.is_nvswitch(at)) {
      const int only = s.nvswitch_only(at, to);
      const int first = (at - s.nvswitch0()) * s.per_node;  // the node's first rank
      l = 2 * (only >= 0 ? only : first + ecmp_pick(flow, at, s.per_node)) + 1;
    } else {
      // A device or a NIC (two out-links): the ones one hop closer, in insertion order (as a
      // table lists them): count them, then take the picked one.
      const auto& outs = m.out_links[static_cast<std::size_t>(at)];
      auto closer = [&](int link) {
        return s.dist_to(m.links[static_cast<std::size_t>(link)].to, to) == left - 1;
      };
      const int choices = static_cast<int>(std::count_if(outs.begin(), outs.end(), closer));
      int pick = ecmp_pick(flow, at, choices);
      for (int link : outs) {
        if (closer(link) && pick-- == 0) {
          l = link;
          break;
        }
      }
    }
    out.push_back(l);
    at = m.links[static_cast<std::size_t>(l)].to;
    --left;
  }
}

void Topology::route_by_tables(int from, int to, std::uint64_t flow_key,
                               std::vector<int>& out) const {
  const Impl& m = get();
  m.check_vertex(from);
  m.check_vertex(to);
  if (from == to) return;
  const Impl::NextHops& table = m.next_hops_to(to);
  const auto* offset = table.offset.data();
  if (offset[from] == offset[from + 1]) {
    throw std::invalid_argument("no path from vertex " + m.describe(from) + " to vertex " +
                                m.describe(to));
  }
  const std::uint64_t flow = flow_hash(from, to, flow_key);
  int at = from;
  while (at != to) {
    const int first = offset[at];
    const int pick = first + ecmp_pick(flow, at, offset[at + 1] - first);
    const int l = table.links[static_cast<std::size_t>(pick)];
    out.push_back(l);
    at = m.links[static_cast<std::size_t>(l)].to;
  }
}

void Topology::set_routing_table_limit(std::size_t ints) {
  own().table_limit = std::max<std::size_t>(ints, 1);
}

std::size_t Topology::routing_tables() const {
  const auto& tables = get().next_hops;
  return static_cast<std::size_t>(std::count_if(
      tables.begin(), tables.end(), [](const auto& table) { return table != nullptr; }));
}

bool Topology::routes_in_closed_form() const {
  return get().structure.shape != RoutingStructure::Shape::none;
}

Time Topology::latency(const std::vector<int>& route) const {
  Time sum = Time::zero();
  for (int l : route) sum += link(l).latency;
  return sum;
}

Bandwidth Topology::bottleneck(const std::vector<int>& route) const {
  Bandwidth least(std::numeric_limits<double>::infinity());
  for (int l : route) least = std::min(least, link(l).bandwidth);
  return least;
}

namespace {

/// The vertex images of a device permutation on a two_level/nvswitch/fat_tree graph (see
/// Topology::automorphism); empty with `why` set where the permutation does not move whole
/// nodes keeping rails.
std::vector<int> structured_vertex_map(const RoutingStructure& s, int vertices,
                                       std::span<const int> device_map, int period,
                                       std::string& why) {
  const int w = s.devices, per = s.per_node;
  std::vector<int> image(static_cast<std::size_t>(vertices));
  for (int v = 0; v < vertices; ++v) image[static_cast<std::size_t>(v)] = v;  // switches stay
  std::vector<char> hit(static_cast<std::size_t>(w), 0);
  for (int r = 0; r < w; ++r) {
    const int to = device_map[static_cast<std::size_t>(r)];
    if (to < 0 || to >= w || hit[static_cast<std::size_t>(to)]) {
      why = "the replica map is not a permutation of the devices";
      return {};
    }
    hit[static_cast<std::size_t>(to)] = 1;
    if (to % per != r % per ||
        to / per != device_map[static_cast<std::size_t>(r - r % per)] / per) {
      why = "the replica map moves device " + std::to_string(r) + " to device " +
            std::to_string(to) + ", not the same place in a whole node";
      return {};
    }
    image[static_cast<std::size_t>(r)] = to;
    image[static_cast<std::size_t>(s.nic0() + r)] = s.nic0() + to;
  }
  for (int n = 0; n < s.nodes; ++n) {
    image[static_cast<std::size_t>(s.nvswitch0() + n)] =
        s.nvswitch0() + device_map[static_cast<std::size_t>(n * per)] / per;
  }
  if (s.shape == RoutingStructure::Shape::fat_tree) {
    for (int k = 0; k < s.racks; ++k) {
      const int rack = s.rack_of(device_map[static_cast<std::size_t>(k * s.per_rack * per)] / per);
      for (int i = 0; i < per; ++i) {
        image[static_cast<std::size_t>(s.leaf0() + k * per + i)] = s.leaf0() + rack * per + i;
      }
    }
    // Spines turn by S / gcd(period, S): `period` moves bring them back.
    const int step = s.spines / std::gcd(std::max(period, 1), s.spines);
    for (int j = 0; j < s.spines; ++j) {
      image[static_cast<std::size_t>(s.spine0() + j)] = s.spine0() + (j + step) % s.spines;
    }
  }
  return image;
}

}  // namespace

std::optional<Topology::Automorphism> Topology::automorphism(std::span<const int> device_map,
                                                             std::string& why, int period) const {
  const Impl& m = get();
  const RoutingStructure& s = m.structure;
  if (s.shape != RoutingStructure::Shape::two_level &&
      s.shape != RoutingStructure::Shape::fat_tree) {
    why = "the topology is not a two_level, nvswitch or fat_tree graph of more than one node";
    return std::nullopt;
  }
  if (device_map.size() != static_cast<std::size_t>(s.devices)) {
    why = "the replica map names " + std::to_string(device_map.size()) + " devices of " +
          std::to_string(s.devices);
    return std::nullopt;
  }
  Automorphism a;
  a.vertex = structured_vertex_map(s, m.vertex_count(), device_map, period, why);
  if (a.vertex.empty()) return std::nullopt;
  // Links by their ends (the builders lay no two links between one ordered pair).
  auto key = [](int from, int to) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(from)) << 32) |
           static_cast<std::uint32_t>(to);
  };
  std::unordered_map<std::uint64_t, int> by_ends;
  by_ends.reserve(m.links.size());
  for (std::size_t l = 0; l < m.links.size(); ++l) {
    if (!by_ends.emplace(key(m.links[l].from, m.links[l].to), static_cast<int>(l)).second) {
      why = "the topology has two links between one pair of vertices";
      return std::nullopt;
    }
  }
  a.link.resize(m.links.size());
  for (std::size_t l = 0; l < m.links.size(); ++l) {
    const TopologyLink& link = m.links[l];
    const int from = a.vertex[static_cast<std::size_t>(link.from)];
    const int to = a.vertex[static_cast<std::size_t>(link.to)];
    const auto it = by_ends.find(key(from, to));
    const TopologyLink* other =
        it == by_ends.end() ? nullptr : &m.links[static_cast<std::size_t>(it->second)];
    if (other == nullptr ||
        other->bandwidth.bytes_per_second() != link.bandwidth.bytes_per_second() ||
        other->latency != link.latency) {
      why = "the link " + m.describe(link.from) + " -> " + m.describe(link.to) +
            (other == nullptr ? " has no counterpart " : " differs from its counterpart ") +
            m.describe(from) + " -> " + m.describe(to) + " under the replica map";
      return std::nullopt;
    }
    a.link[l] = it->second;
  }
  return a;
}

int Topology::reducing_switch(const std::vector<std::int32_t>& ranks) const {
  if (ranks.empty()) return -1;
  const Impl& m = get();
  const int first = vertex_of_device(ranks.front());
  for (int l : m.out_links[static_cast<std::size_t>(first)]) {
    const int s = m.links[static_cast<std::size_t>(l)].to;
    if (!m.vertices[static_cast<std::size_t>(s)].reduces) continue;
    const bool serves_all = std::all_of(ranks.begin(), ranks.end(), [&](std::int32_t r) {
      const int d = vertex_of_device(r);
      return m.has_link(d, s) && m.has_link(s, d);
    });
    if (serves_all) return s;
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// The config section

void TopologySpec::validate() const {
  using config::ValidationError;
  if (devices_per_pcie_switch < 1) {
    throw ValidationError("devices_per_pcie_switch", "expected at least 1 device per PCIe switch");
  }
  if (pcie_bandwidth && !(pcie_bandwidth->bytes_per_second() > 0)) {
    throw ValidationError("pcie.bandwidth", "expected a positive bandwidth");
  }
  if (pcie_latency && *pcie_latency < Time::zero()) {
    throw ValidationError("pcie.latency", "expected a latency of at least zero");
  }
  if (nodes_per_rack < 1) {
    throw ValidationError("nodes_per_rack", "expected at least 1 node per rack");
  }
  if (!(oversubscription >= 1) || !std::isfinite(oversubscription)) {
    throw ValidationError("oversubscription",
                          "expected a finite ratio of at least 1 (a leaf's downlink to uplink "
                          "bandwidth; 1 = full bisection)");
  }
  if (spines < 0) {
    throw ValidationError("spines",
                          "expected a spine count of at least 1 (0: one per node of a "
                          "rack)");
  }
  if (link_bandwidth && !(link_bandwidth->bytes_per_second() > 0)) {
    throw ValidationError("link.bandwidth", "expected a positive bandwidth");
  }
  if (link_latency && *link_latency < Time::zero()) {
    throw ValidationError("link.latency", "expected a latency of at least zero");
  }
  if (kind == TopologyKind::torus) {
    if (dims.size() != 2 && dims.size() != 3) {
      throw ValidationError(
          "dims", "expected 2 or 3 extents (a 2D or 3D torus), got " + std::to_string(dims.size()));
    }
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] < 1) {
        throw ValidationError("dims." + std::to_string(i), "expected an extent of at least 1");
      }
    }
  }
  if (kind != TopologyKind::graph) return;

  if (vertices.empty()) throw ValidationError("vertices", "expected at least one vertex");
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < vertices.size(); ++i) {
    const std::string at = "vertices." + std::to_string(i);
    const auto& v = vertices[i];
    if (v.name.empty()) throw ValidationError(at + ".name", "expected a non-empty name");
    auto [it, added] = index.emplace(v.name, i);
    if (!added) {
      throw ValidationError(at + ".name", "duplicate vertex name " + in_quotes(v.name) +
                                              " (also vertices." + std::to_string(it->second) +
                                              ")");
    }
    if (v.reduces && v.kind != VertexKind::nvswitch && v.kind != VertexKind::network_switch &&
        v.kind != VertexKind::pcie_switch) {
      throw ValidationError(at + ".reduces", "only switches reduce in the network; " +
                                                 in_quotes(v.name) + " is a " +
                                                 std::string(name_of(v.kind)));
    }
  }
  auto unknown = [&](const std::string& at, const std::string& name) {
    std::vector<std::string> names;
    for (const auto& v : vertices) names.push_back(v.name);
    const std::string hint = config::closest_match(name, names);
    throw ValidationError(at, "unknown vertex " + in_quotes(name) +
                                  (hint.empty() ? "" : "; did you mean " + in_quotes(hint) + "?"));
  };
  for (std::size_t i = 0; i < links.size(); ++i) {
    const std::string at = "links." + std::to_string(i);
    const auto& l = links[i];
    if (!index.contains(l.from)) unknown(at + ".from", l.from);
    if (!index.contains(l.to)) unknown(at + ".to", l.to);
    if (l.from == l.to) {
      throw ValidationError(at + ".to", "a link must join two different vertices, got " +
                                            in_quotes(l.from) + " to itself");
    }
    if (!(l.bandwidth.bytes_per_second() > 0)) {
      throw ValidationError(at + ".bandwidth", "expected a positive bandwidth");
    }
    if (l.latency < Time::zero()) {
      throw ValidationError(at + ".latency", "expected a latency of at least zero");
    }
  }
  if (devices.empty()) {
    throw ValidationError("devices", "expected the vertex name of every device, by rank");
  }
  std::unordered_map<std::string, std::size_t> rank_of;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    const std::string at = "devices." + std::to_string(r);
    auto it = index.find(devices[r]);
    if (it == index.end()) unknown(at, devices[r]);
    const auto& v = vertices[it->second];
    if (v.kind != VertexKind::device) {
      throw ValidationError(at, in_quotes(v.name) + " is a " + std::string(name_of(v.kind)) +
                                    " vertex; expected a vertex of kind device");
    }
    auto [seen, added] = rank_of.emplace(devices[r], r);
    if (!added) {
      throw ValidationError(at, "vertex " + in_quotes(devices[r]) + " is already device " +
                                    std::to_string(seen->second));
    }
  }
}

namespace {

// Reads the members of one object inside an array (ObjectReader finds objects by a dotted
// path of object keys only). Same strictness and messages as ObjectReader.
class ElementReader {
 public:
  ElementReader(const config::Document& doc, std::string path, const nlohmann::json& value,
                std::string_view what)
      : doc_(&doc), path_(std::move(path)), value_(&value) {
    if (!value.is_object()) {
      doc.fail(path_, "expected " + std::string(what) + " (a JSON object)");
    }
  }

  std::string string(std::string_view key) {
    const auto& v = require(key);
    if (!v.is_string()) fail(key, "expected a string");
    return v.get<std::string>();
  }
  bool boolean_or(std::string_view key, bool fallback) {
    const auto* v = optional(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, "expected true or false");
    return v->get<bool>();
  }
  std::string choice(std::string_view key, std::span<const std::string_view> options) {
    const std::string value = string(key);
    std::vector<std::string> known(options.begin(), options.end());
    if (std::find(known.begin(), known.end(), value) != known.end()) return value;
    std::string list;
    for (const auto& o : known) list += (list.empty() ? "\"" : ", \"") + o + "\"";
    const std::string hint = config::closest_match(value, known);
    fail(key, "expected one of " + list + ", got \"" + value + "\"" +
                  (hint.empty() ? "" : "; did you mean \"" + hint + "\"?"));
  }
  Bandwidth bandwidth(std::string_view key) {
    return unit<Bandwidth>(key, "900 GB/s",
                           [](const std::string& s) { return parse_bandwidth(s); });
  }
  Time time(std::string_view key) {
    return unit<Time>(key, "2 us", [](const std::string& s) { return parse_time(s); });
  }

  void finish() const {
    std::vector<std::string> known(known_.begin(), known_.end());
    for (const auto& [key, unused] : value_->items()) {
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      const std::string hint = config::closest_match(key, known);
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      doc_->fail(config::join_path(path_, key),
                 "unknown key " + in_quotes(key) +
                     (hint.empty() ? "" : "; did you mean " + in_quotes(hint) + "?") +
                     " (known keys: " + list + ")");
    }
  }

 private:
  [[noreturn]] void fail(std::string_view key, const std::string& message) const {
    doc_->fail(config::join_path(path_, key), message);
  }
  const nlohmann::json* optional(std::string_view key) {
    known_.emplace_back(key);
    auto it = value_->find(key);
    return it == value_->end() || it->is_null() ? nullptr : &*it;
  }
  const nlohmann::json& require(std::string_view key) {
    const auto* v = optional(key);
    if (v == nullptr) fail(key, "missing required key " + in_quotes(key));
    return *v;
  }
  template <class T, class Parse>
  T unit(std::string_view key, std::string_view example, Parse parse) {
    const auto& v = require(key);
    if (!v.is_string()) {
      fail(key, "expected a quantity with its unit as a string, such as \"" + std::string(example) +
                    "\"");
    }
    try {
      return parse(v.get<std::string>());
    } catch (const UnitError& e) {
      fail(key, e.what());
    }
  }

  const config::Document* doc_;
  std::string path_;
  const nlohmann::json* value_;
  std::vector<std::string> known_;
};

/// A link's figures from an object {bandwidth, latency}, each optional.
void read_link_figures(config::ObjectReader r, std::optional<Bandwidth>& bandwidth,
                       std::optional<Time>& latency) {
  const auto* value = r.document().find(r.path());
  auto set = [&](std::string_view key) {
    r.has(key);
    auto it = value->find(key);
    return it != value->end() && !it->is_null();
  };
  if (set("bandwidth")) bandwidth = r.bandwidth("bandwidth");
  if (set("latency")) latency = r.time("latency");
  r.finish();
}

}  // namespace

TopologySpec read_topology(config::ObjectReader r) {
  TopologySpec s;
  const std::string kind_name = r.choice(
      "kind", {"two_level", "nvswitch", "pcie_tree", "fat_tree", "ring", "torus", "graph"});
  for (std::size_t k = 0; k < std::size(kTopologyKindNames); ++k) {
    if (kTopologyKindNames[k] == kind_name) s.kind = static_cast<TopologyKind>(k);
  }
  // A key of another kind gets a message that says so (finish() would only call it unknown).
  const auto own = keys_of(s.kind);
  for (const auto& [key, unused] : r.document().find(r.path())->items()) {
    if (key == "kind" || std::find(own.begin(), own.end(), key) != own.end()) continue;
    for (std::size_t k = 0; k < std::size(kTopologyKindNames); ++k) {
      const auto other = keys_of(static_cast<TopologyKind>(k));
      if (std::find(other.begin(), other.end(), key) == other.end()) continue;
      std::string list;
      for (auto o : own) list += (list.empty() ? "" : ", ") + std::string(o);
      r.fail(key, in_quotes(key) + " is a key of kind \"" + std::string(kTopologyKindNames[k]) +
                      "\", not of \"" + kind_name + "\" (which takes " +
                      (list.empty() ? std::string("no other keys") : "only: " + list) + ")");
    }
  }

  switch (s.kind) {
    case TopologyKind::two_level:
      break;
    case TopologyKind::nvswitch:
      s.sharp = r.boolean_or("sharp", false);
      break;
    case TopologyKind::pcie_tree:
      s.devices_per_pcie_switch = static_cast<int>(
          r.integer_in_or("devices_per_pcie_switch", 1, 1 << 16, s.devices_per_pcie_switch));
      if (r.has("pcie")) {
        read_link_figures(r.object("pcie", "the PCIe link figures {bandwidth, latency}"),
                          s.pcie_bandwidth, s.pcie_latency);
      }
      break;
    case TopologyKind::fat_tree:
      s.nodes_per_rack =
          static_cast<int>(r.integer_in_or("nodes_per_rack", 1, 1 << 24, s.nodes_per_rack));
      s.oversubscription = r.number_or("oversubscription", s.oversubscription);
      s.spines = static_cast<int>(r.integer_in_or("spines", 0, 1 << 20, s.spines));
      break;
    case TopologyKind::torus: {
      const auto& dims =
          config::array_of(r, "dims",
                           "an array of 2 or 3 extents whose product is the device count, "
                           "such as [4, 8]");
      for (const auto& d : dims) {
        if (!d.is_number_integer() || d.get<std::int64_t>() < 1 ||
            d.get<std::int64_t>() > (1 << 24)) {
          r.fail("dims", "expected an array of positive integer extents, such as [4, 8]");
        }
        s.dims.push_back(static_cast<int>(d.get<std::int64_t>()));
      }
    }
      [[fallthrough]];
    case TopologyKind::ring:
      if (r.has("link")) {
        read_link_figures(r.object("link", "the device-to-device link {bandwidth, latency}"),
                          s.link_bandwidth, s.link_latency);
      }
      break;
    case TopologyKind::graph: {
      const auto& doc = r.document();
      const auto& vertices =
          config::array_of(r, "vertices", "an array of vertices {name, kind, reduces}");
      for (std::size_t i = 0; i < vertices.size(); ++i) {
        ElementReader e(doc, config::join_path(r.path_of("vertices"), std::to_string(i)),
                        vertices[i], "a vertex {name, kind, reduces}");
        ExplicitVertex v;
        v.name = e.string("name");
        const std::string kind = e.choice("kind", kVertexKindNames);
        for (std::size_t k = 0; k < std::size(kVertexKindNames); ++k) {
          if (kVertexKindNames[k] == kind) v.kind = static_cast<VertexKind>(k);
        }
        v.reduces = e.boolean_or("reduces", false);
        e.finish();
        s.vertices.push_back(std::move(v));
      }
      const auto& links =
          config::array_of(r, "links", "an array of links {from, to, bandwidth, latency, duplex}");
      for (std::size_t i = 0; i < links.size(); ++i) {
        ElementReader e(doc, config::join_path(r.path_of("links"), std::to_string(i)), links[i],
                        "a link {from, to, bandwidth, latency, duplex}");
        ExplicitLink l;
        l.from = e.string("from");
        l.to = e.string("to");
        l.bandwidth = e.bandwidth("bandwidth");
        l.latency = e.time("latency");
        l.duplex = e.boolean_or("duplex", true);
        e.finish();
        s.links.push_back(std::move(l));
      }
      const auto& devices =
          config::array_of(r, "devices", "an array with the vertex name of every device, by rank");
      for (std::size_t i = 0; i < devices.size(); ++i) {
        if (!devices[i].is_string()) {
          doc.fail(config::join_path(r.path_of("devices"), std::to_string(i)),
                   "expected a vertex name (a string)");
        }
        s.devices.push_back(devices[i].get<std::string>());
      }
      break;
    }
  }
  r.finish();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Builders. Every one adds the devices first, so device rank r is vertex r (except explicit
// graphs, whose vertices come in the config's order).

namespace {

std::string numbered(std::string_view prefix, int n) {
  return std::string(prefix) + std::to_string(n);
}

void add_devices(Topology& t, const ClusterSpec& c) {
  for (int r = 0; r < c.world_size(); ++r) {
    t.set_device(r, t.add_vertex(VertexKind::device, numbered("dev", r)));
  }
}

/// A link pair a <-> b whose latency is paid on a -> b only (see "the sender pays" above).
void add_paid_pair(Topology& t, int a, int b, Bandwidth bandwidth, Time latency) {
  t.add_link(a, b, bandwidth, latency);
  t.add_link(b, a, bandwidth, Time::zero());
}

/// One NVSwitch per node; each device duplex-linked to it with its own intra_node link.
void add_nvswitches(Topology& t, const ClusterSpec& c, bool reduces) {
  for (int n = 0; n < c.nodes; ++n) {
    const int sw =
        t.add_vertex(VertexKind::nvswitch, "node" + std::to_string(n) + ".nvswitch", reduces);
    for (int i = 0; i < c.devices_per_node; ++i) {
      const int r = n * c.devices_per_node + i;
      const LinkSpec& l = c.intra_link_of(r);
      add_paid_pair(t, t.vertex_of_device(r), sw, l.bandwidth, l.latency);
    }
  }
}

/// Each device's own NIC (device <-> NIC carries the device's inter_node link, latency paid
/// leaving the device); returns the NIC vertices by rank.
std::vector<int> add_device_nics(Topology& t, const ClusterSpec& c) {
  std::vector<int> nics;
  for (int r = 0; r < c.world_size(); ++r) {
    const LinkSpec& l = c.inter_link_of(r);
    const int nic = t.add_vertex(VertexKind::nic, numbered("dev", r) + ".nic");
    add_paid_pair(t, t.vertex_of_device(r), nic, l.bandwidth, l.latency);
    nics.push_back(nic);
  }
  return nics;
}

void build_two_level(Topology& t, const ClusterSpec& c, bool sharp) {
  add_devices(t, c);
  add_nvswitches(t, c, sharp);
  if (c.nodes == 1) return;  // no network inside one node
  // One non-blocking switch: its per-port bandwidth is the NIC's, so only NICs limit flows.
  const int network = t.add_vertex(VertexKind::network_switch, "network");
  const auto nics = add_device_nics(t, c);
  for (int r = 0; r < c.world_size(); ++r) {
    t.add_duplex(nics[static_cast<std::size_t>(r)], network, c.inter_link_of(r).bandwidth,
                 Time::zero());
  }
}

void build_pcie_tree(Topology& t, const ClusterSpec& c, const TopologySpec& s) {
  // A PCIe switch never holds more GPUs than a node has (the default 4 fits 8-GPU nodes).
  const int per_switch = std::min(s.devices_per_pcie_switch, c.devices_per_node);
  if (c.devices_per_node % per_switch != 0) {
    throw config::ValidationError("topology.devices_per_pcie_switch",
                                  "expected a divisor of devices_per_node (" +
                                      std::to_string(c.devices_per_node) + "), got " +
                                      std::to_string(s.devices_per_pcie_switch));
  }
  const Bandwidth pcie_bandwidth = s.pcie_bandwidth.value_or(
      c.host ? c.host->pcie.bandwidth : Bandwidth(32e9));  // PCIe 5.0 x16, per direction
  const Time pcie_latency = s.pcie_latency.value_or(c.host ? c.host->pcie.latency : Time::us(1));
  add_devices(t, c);
  const int network = c.nodes > 1 ? t.add_vertex(VertexKind::network_switch, "network") : -1;
  for (int n = 0; n < c.nodes; ++n) {
    const std::string node = "node" + std::to_string(n);
    const int root = t.add_vertex(VertexKind::host, node + ".host");
    for (int k = 0; k < c.devices_per_node / per_switch; ++k) {
      const std::string name = node + ".pcie" + std::to_string(k);
      const int sw = t.add_vertex(VertexKind::pcie_switch, name);
      add_paid_pair(t, sw, root, pcie_bandwidth, pcie_latency);
      // The shared NIC is as slow as the slowest of its devices' NIC figures (an override of
      // one device's inter_node link degrades the NIC its switch-mates share).
      Bandwidth nic_bandwidth(std::numeric_limits<double>::infinity());
      Time nic_latency = Time::zero();
      for (int i = 0; i < per_switch; ++i) {
        const int r = n * c.devices_per_node + k * per_switch + i;
        add_paid_pair(t, t.vertex_of_device(r), sw, pcie_bandwidth, pcie_latency);
        nic_bandwidth = std::min(nic_bandwidth, c.inter_link_of(r).bandwidth);
        nic_latency = std::max(nic_latency, c.inter_link_of(r).latency);
      }
      if (network < 0) continue;
      const int nic = t.add_vertex(VertexKind::nic, name + ".nic");
      add_paid_pair(t, sw, nic, nic_bandwidth, nic_latency);
      t.add_duplex(nic, network, nic_bandwidth, Time::zero());
    }
  }
}

int fat_tree_spines(const TopologySpec& s) {
  return s.spines > 0 ? s.spines : s.nodes_per_rack;
}

void build_fat_tree(Topology& t, const ClusterSpec& c, const TopologySpec& s) {
  add_devices(t, c);
  add_nvswitches(t, c, false);
  if (c.nodes == 1) return;
  const int per_rack = s.nodes_per_rack;
  const int racks = (c.nodes + per_rack - 1) / per_rack;  // the last rack may be smaller
  const int rails = c.devices_per_node;
  const int spines = fat_tree_spines(s);
  // Leaf of (rack, rail) is leaves[rack * rails + rail].
  std::vector<int> leaves;
  for (int k = 0; k < racks; ++k) {
    for (int i = 0; i < rails; ++i) {
      leaves.push_back(
          t.add_vertex(VertexKind::network_switch,
                       "rack" + std::to_string(k) + ".rail" + std::to_string(i) + ".leaf"));
    }
  }
  std::vector<int> spine;
  for (int j = 0; j < spines; ++j) {
    spine.push_back(t.add_vertex(VertexKind::network_switch, numbered("spine", j)));
  }
  const auto nics = add_device_nics(t, c);
  for (int r = 0; r < c.world_size(); ++r) {
    const int leaf =
        leaves[static_cast<std::size_t>(c.node_of(r) / per_rack * rails + r % c.devices_per_node)];
    t.add_duplex(nics[static_cast<std::size_t>(r)], leaf, c.inter_link_of(r).bandwidth,
                 Time::zero());
  }
  // A leaf's uplink capacity is its downlinks' nominal capacity over the oversubscription,
  // spread evenly over one uplink to every spine (the nominal inter_node figure: a degraded
  // NIC does not shrink the switch's uplinks).
  for (int k = 0; k < racks; ++k) {
    const int downlinks = std::min(per_rack, c.nodes - k * per_rack);
    const Bandwidth uplink(downlinks * c.inter_node.bandwidth.bytes_per_second() /
                           s.oversubscription / spines);
    for (int i = 0; i < rails; ++i) {
      for (int j = 0; j < spines; ++j) {
        t.add_duplex(leaves[static_cast<std::size_t>(k * rails + i)],
                     spine[static_cast<std::size_t>(j)], uplink, Time::zero());
      }
    }
  }
}

/// A device's ring/torus link figures: its inter_node override where it has one, else the
/// topology's link figures (default: the cluster's inter_node link).
LinkSpec device_link(const ClusterSpec& c, const TopologySpec& s, int rank) {
  const LinkSpec& own = c.inter_link_of(rank);
  if (&own != &c.inter_node) return own;  // an override
  return {s.link_bandwidth.value_or(c.inter_node.bandwidth),
          s.link_latency.value_or(c.inter_node.latency)};
}

/// A cable between two devices: as fast as the slower end.
void add_cable(Topology& t, const ClusterSpec& c, const TopologySpec& s, int a, int b) {
  const LinkSpec la = device_link(c, s, a), lb = device_link(c, s, b);
  t.add_duplex(t.vertex_of_device(a), t.vertex_of_device(b), std::min(la.bandwidth, lb.bandwidth),
               std::max(la.latency, lb.latency));
}

void build_ring(Topology& t, const ClusterSpec& c, const TopologySpec& s) {
  add_devices(t, c);
  const int n = c.world_size();
  if (n == 1) return;
  // Two devices are one cable, not two parallel ones.
  for (int r = 0; r < (n == 2 ? 1 : n); ++r) add_cable(t, c, s, r, (r + 1) % n);
}

void build_torus(Topology& t, const ClusterSpec& c, const TopologySpec& s) {
  long long product = 1;
  std::string shape;
  for (int d : s.dims) {
    product *= d;
    shape += (shape.empty() ? "" : " x ") + std::to_string(d);
  }
  if (product != c.world_size()) {
    throw config::ValidationError(
        "topology.dims", "expected extents whose product is the device count " +
                             std::to_string(c.world_size()) + " (" + std::to_string(c.nodes) +
                             " nodes x " + std::to_string(c.devices_per_node) + "), got " + shape +
                             " = " + std::to_string(product));
  }
  add_devices(t, c);
  // Rank r has coordinates in row-major order: the last dimension varies fastest.
  std::vector<int> stride(s.dims.size(), 1);
  for (std::size_t d = s.dims.size() - 1; d > 0; --d) stride[d - 1] = stride[d] * s.dims[d];
  for (int r = 0; r < c.world_size(); ++r) {
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      const int extent = s.dims[d];
      const int coord = r / stride[d] % extent;
      // Extent 1: no link; extent 2: the wraparound is the same neighbour, so one cable.
      if (extent == 1 || (extent == 2 && coord == 1)) continue;
      const int next = r + ((coord + 1) % extent - coord) * stride[d];
      add_cable(t, c, s, r, next);
    }
  }
}

void build_graph(Topology& t, const ClusterSpec& c, const TopologySpec& s) {
  if (static_cast<int>(s.devices.size()) != c.world_size()) {
    throw config::ValidationError(
        "topology.devices", "expected the vertex of each of the " + std::to_string(c.world_size()) +
                                " devices (" + std::to_string(c.nodes) + " nodes x " +
                                std::to_string(c.devices_per_node) + "), got " +
                                std::to_string(s.devices.size()));
  }
  std::unordered_map<std::string, int> id;
  for (const auto& v : s.vertices) id[v.name] = t.add_vertex(v.kind, v.name, v.reduces);
  for (const auto& l : s.links) {
    t.add_link(id.at(l.from), id.at(l.to), l.bandwidth, l.latency);
    if (l.duplex) t.add_link(id.at(l.to), id.at(l.from), l.bandwidth, l.latency);
  }
  for (std::size_t r = 0; r < s.devices.size(); ++r) {
    t.set_device(static_cast<int>(r), id.at(s.devices[r]));
  }
}

}  // namespace

Topology build_topology(const ClusterSpec& cluster) {
  const TopologySpec spec = cluster.topology.value_or(TopologySpec{});
  try {
    spec.validate();
  } catch (const config::ValidationError& e) {
    throw config::ValidationError(config::join_path("topology", e.path()), e.what());
  }
  Topology t;
  switch (spec.kind) {
    case TopologyKind::two_level:
    case TopologyKind::nvswitch:
      build_two_level(t, cluster, spec.kind == TopologyKind::nvswitch && spec.sharp);
      if (cluster.nodes > 1) {
        t.edit().structure = {RoutingStructure::Shape::two_level, cluster.world_size(),
                              cluster.devices_per_node, cluster.nodes};
      }
      break;
    case TopologyKind::pcie_tree: {
      build_pcie_tree(t, cluster, spec);
      RoutingStructure shape{RoutingStructure::Shape::pcie_tree, cluster.world_size(),
                             cluster.devices_per_node, cluster.nodes};
      shape.per_switch = std::min(spec.devices_per_pcie_switch, cluster.devices_per_node);
      t.edit().structure = shape;
      break;
    }
    case TopologyKind::fat_tree:
      build_fat_tree(t, cluster, spec);
      if (cluster.nodes > 1) {
        t.edit().structure = {RoutingStructure::Shape::fat_tree,
                              cluster.world_size(),
                              cluster.devices_per_node,
                              cluster.nodes,
                              spec.nodes_per_rack,
                              (cluster.nodes + spec.nodes_per_rack - 1) / spec.nodes_per_rack,
                              fat_tree_spines(spec)};
      }
      break;
    case TopologyKind::ring:
      build_ring(t, cluster, spec);
      if (cluster.world_size() >= 3) {
        t.edit().structure = {RoutingStructure::Shape::ring, cluster.world_size(), 1, 0};
      }
      break;
    case TopologyKind::torus:
      build_torus(t, cluster, spec);
      if (cluster.world_size() > 1) {
        RoutingStructure shape{RoutingStructure::Shape::torus, cluster.world_size(), 1, 0};
        std::copy(spec.dims.begin(), spec.dims.end(), shape.dims.begin());
        t.edit().structure = shape;
      }
      break;
    case TopologyKind::graph: {
      build_graph(t, cluster, spec);
      if (auto pair = t.get().disconnected_devices()) {
        const auto& [a, b] = *pair;
        throw config::ValidationError("topology.links",
                                      "no path from device " + std::to_string(a) + " (" +
                                          in_quotes(spec.devices[static_cast<std::size_t>(a)]) +
                                          ") to device " + std::to_string(b) + " (" +
                                          in_quotes(spec.devices[static_cast<std::size_t>(b)]) +
                                          "): every device must reach every other one");
      }
      break;
    }
  }
  return t;
}

}  // namespace stratasim::hw
