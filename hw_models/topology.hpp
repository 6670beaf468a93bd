// A cluster's network as a graph (Boost.Graph): devices, NICs, PCIe switches, NVSwitches and
// network switches are vertices; every link is one directed edge with its own bandwidth and
// latency, so a duplex cable is two edges. Builders turn a cluster's `topology` section (or the
// spine's two-level form: an NVSwitch per node, one NIC per device, a non-blocking network) into
// a graph; routing takes shortest paths by hop count and picks among equal-cost next hops by
// hashing (ECMP), so one flow always takes one path and different flows spread. The structured
// builders' graphs route in closed form (no per-destination tables, see Topology::route).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "hw_models/units.hpp"

namespace stratasim::hw {

struct ClusterSpec;

enum class VertexKind : std::uint8_t { device, nic, pcie_switch, nvswitch, network_switch, host };
std::string_view name_of(VertexKind kind);

/// One direction of a link.
struct TopologyLink {
  int from = 0;  // vertex ids
  int to = 0;
  Bandwidth bandwidth;  // bytes/s in this direction
  Time latency;         // per message crossing this link
};

/// The `topology` section of a cluster config. `kind` picks the builder; the other fields are
/// that builder's parameters (unused ones keep their defaults and are rejected in the config).
enum class TopologyKind : std::uint8_t {
  two_level,  // the spine's form: NVSwitch per node, one NIC per device, non-blocking network
  nvswitch,   // two_level, with `sharp`: the NVSwitch reduces (NVLink SHARP / NVLS)
  pcie_tree,  // GPUs behind PCIe switches; the GPUs of one PCIe switch share its NIC
  fat_tree,   // rail-optimised two-level fat-tree (leaf per rail and rack, spines above)
  ring,       // devices in one ring (e.g. FPGAs cabled port to port)
  torus,      // 2D or 3D torus of devices
  graph,      // explicit vertices and links
};
std::string_view name_of(TopologyKind kind);

struct ExplicitVertex {
  std::string name;
  VertexKind kind = VertexKind::network_switch;
  bool reduces = false;  // a switch that reduces in the network (SHARP)
};
struct ExplicitLink {
  std::string from, to;  // vertex names
  Bandwidth bandwidth;
  Time latency;
  bool duplex = true;  // also the reverse direction, with the same figures
};

struct TopologySpec {
  TopologyKind kind = TopologyKind::two_level;
  // nvswitch
  bool sharp = false;
  // pcie_tree: GPUs per PCIe switch (they share one NIC), the PCIe link figures (per direction)
  int devices_per_pcie_switch = 4;
  std::optional<Bandwidth> pcie_bandwidth;  // default: the cluster host's pcie link, else 32 GB/s
  std::optional<Time> pcie_latency;
  // fat_tree: nodes under one leaf switch per rail (a rack), leaf-to-spine oversubscription
  // (downlink bandwidth / uplink bandwidth at a leaf), spine switches
  int nodes_per_rack = 4;
  double oversubscription = 1.0;
  int spines = 0;  // 0: as many as needed for the uplink count
  // ring, torus: the device-to-device link (default: the cluster's inter_node link)
  std::vector<int> dims;  // torus: 2 or 3 extents whose product is the device count
  std::optional<Bandwidth> link_bandwidth;
  std::optional<Time> link_latency;
  // graph
  std::vector<ExplicitVertex> vertices;
  std::vector<ExplicitLink> links;
  std::vector<std::string> devices;  // vertex name of each device, by rank

  /// Checks ranges; throws config::ValidationError with the offending key's path.
  void validate() const;
};

/// Reads a `topology` object (strict; validated by the caller through validate()).
TopologySpec read_topology(config::ObjectReader r);

class Topology {
 public:
  int add_vertex(VertexKind kind, std::string name, bool reduces = false);
  /// One direction; returns the link id.
  int add_link(int from, int to, Bandwidth bandwidth, Time latency);
  /// Both directions with the same figures; returns the id of from->to (to->from is id + 1).
  int add_duplex(int a, int b, Bandwidth bandwidth, Time latency);
  /// Device `rank` is vertex `vertex`. Every rank in [0, device_count) must be set.
  void set_device(int rank, int vertex);

  int vertex_count() const;
  int link_count() const;
  int device_count() const;
  int vertex_of_device(int rank) const;
  VertexKind kind(int vertex) const;
  const std::string& name(int vertex) const;
  bool reduces(int vertex) const;
  const TopologyLink& link(int id) const;
  /// Link ids out of `vertex`, in insertion order.
  std::vector<int> links_from(int vertex) const;

  /// The links of a shortest path (by hop count) from vertex `from` to vertex `to`, appended to
  /// `out` in order. Where several next hops are equally short, `flow_key` picks one by hash,
  /// so equal keys give equal paths. Appends nothing when from == to. Throws
  /// std::invalid_argument when `to` is unreachable. A route allocates nothing beyond `out`.
  /// The hash: flow_key mixed with (from, to), then with the vertex at each choice; the
  /// candidates are the vertex's out-links one hop closer, in insertion order.
  /// Graphs from the two_level, nvswitch and fat_tree builders (more than one node), the ring
  /// builder (3 devices or more), the torus builder and the pcie_tree builder, unchanged since
  /// build_topology, route from any vertex to a device (or, but on a pcie_tree, an NVSwitch) in
  /// closed form: hop distances and next hops follow from the builder's numbering, no memory
  /// is kept, and a route costs O(1) per hop. Every other route (explicit graphs, graphs
  /// changed after building, destinations that are NICs, hosts or switches) uses
  /// route_by_tables. Both give the same links for the same (from, to, flow_key).
  void route(int from, int to, std::uint64_t flow_key, std::vector<int>& out) const;
  /// The reference routing: one BFS per destination on first use gives a next-hop table (the
  /// out-links, in insertion order, whose far end is one hop closer), kept for later routes;
  /// then a route costs a lookup per hop. Memory: about (vertices + next hops) ints per
  /// destination asked for, bounded: past the limit (set_routing_table_limit) the oldest
  /// tables are dropped and built again when asked for. `route` uses it wherever it has no
  /// closed form.
  void route_by_tables(int from, int to, std::uint64_t flow_key, std::vector<int>& out) const;
  /// The most ints route_by_tables' tables may hold together (at least one table is always
  /// kept, however large). Default kDefaultRoutingTableLimit: 32 Mi ints, 128 MiB.
  static constexpr std::size_t kDefaultRoutingTableLimit = std::size_t{32} << 20;
  void set_routing_table_limit(std::size_t ints);
  /// How many per-destination tables route_by_tables holds (a measure of routing memory).
  std::size_t routing_tables() const;
  /// Whether `route` finds every route to a device in closed form (the builders listed above,
  /// unchanged since build_topology): routing then keeps no tables for the flow network.
  bool routes_in_closed_form() const;
  /// Sum of the latencies of a route (zero for an empty route).
  Time latency(const std::vector<int>& route) const;
  /// The smallest bandwidth on a route (infinite for an empty route: nothing limits it).
  Bandwidth bottleneck(const std::vector<int>& route) const;
  /// A switch that reduces in the network and is one hop from every device of `ranks`, or -1.
  int reducing_switch(const std::vector<std::int32_t>& ranks) const;

  /// A symmetry of the graph: where each vertex and each link goes.
  struct Automorphism {
    std::vector<int> vertex;  // by vertex id: its image
    std::vector<int> link;    // by link id: its image
  };
  /// The automorphism that moves device r to device `device_map[r]`, where there is one that
  /// this method can prove: the graph comes from the two_level, nvswitch or fat_tree builder
  /// (more than one node, unchanged since build_topology); `device_map` is a permutation of
  /// the devices that maps whole nodes onto whole nodes keeping each device's place (rail) in
  /// its node; NVSwitches and NICs follow their node and device, a fat-tree's leaf (rack k,
  /// rail i) goes to the leaf of the rack its first node goes to, the two_level network switch
  /// stays, and a fat-tree's S spines turn by S / gcd(period, S) places (spines are
  /// interchangeable; `period` moves bring them back, and in between the images of one route
  /// spread over the spines as ECMP would spread independent flows). The result is then
  /// checked link by link: every link's image must be
  /// a link (joining the images of its ends) with the same bandwidth and latency, so a
  /// degraded link, a partial rack moved onto a full one or a rack split between two racks
  /// fails. Otherwise returns nothing and sets `why` to the first reason found. O(vertices +
  /// links) time and memory.
  std::optional<Automorphism> automorphism(std::span<const int> device_map, std::string& why,
                                           int period = 1) const;

 private:
  struct Impl;
  // Implementation (Boost.Graph adjacency list, per-destination next-hop tables computed by
  // BFS on first use, the builder's shape for closed-form routes) lives in topology.cpp. Copies
  // share it until one of them is changed (copy on write); the routing cache is mutable, so a
  // Topology is used by one thread.
  std::shared_ptr<Impl> impl_ = nullptr;
  const Impl& get() const;
  Impl& own();   // this copy's graph (copy on write), unchanged
  Impl& edit();  // own(), about to change: routing tables and the builder's shape dropped
  // Checks that every device reaches every other one (explicit graphs).
  friend Topology build_topology(const ClusterSpec& cluster);
};

/// The cluster's graph: its `topology` section, or the two-level form when it has none.
/// Per-device link overrides (cluster.overrides) apply to that device's own links. Builders add
/// the devices first (rank r is vertex r, named "dev<r>"; explicit graphs keep the config's
/// order). A route's latency is the configured end-to-end figure: builders put it on the link
/// where a message enters the fabric (topology.cpp says where, per kind); ring, torus and
/// explicit links pay their latency at every hop. Throws config::ValidationError (path from the
/// cluster object, e.g. "topology.dims") where the section does not fit the cluster.
Topology build_topology(const ClusterSpec& cluster);

}  // namespace stratasim::hw
