// The flow-level network: every transfer becomes flows over the topology's links, which share
// bandwidth max-min fairly with every other flow in flight (sim/max_min.hpp), so that
// concurrent collectives (tensor-, data- and pipeline-parallel traffic, or several jobs) slow
// each other down where they cross the same links.
//
// A collective runs its algorithm's plan (sim/collectives.hpp): phase after phase, each phase
// waiting for its latency and then starting its flows, the next phase starting when the last
// flow ends; the transfer completes with its last phase. A point-to-point message is one flow
// after its route's latency. Each flow takes topology.route(src, dst, key) with a key hashed
// from (transfer id, flow index), so that ECMP spreads flows over equal-cost paths and the
// same inputs always give the same paths. A link's capacity is its bandwidth times the
// cluster's protocol efficiency.
//
// With the NCCL model (the cluster's `collectives.nccl`, sim/nccl_model.hpp) a collective runs
// the schedule that carries the chosen algorithm's traffic (ring: the ring on one node, the
// hierarchical schedule across nodes, whose inter-node flows spread over every member's NIC as
// NCCL's channels do; tree: the hierarchical schedule across nodes; nvls: nvls where the topology
// has a reducing switch, else the ring), each flow's bytes scaled by the model's bandwidth time
// over the schedule's own (so the protocol's bandwidth fraction, the fabric's efficiency and
// the channels in use act on every flow, and a collective alone takes the model's time), and
// waits the model's whole latency (the chosen protocol's per-step latencies) before its first
// phase. A point-to-point message carries its bytes over the pair's p2p efficiency.
//
// Symmetry (cluster.flow_symmetry, docs/network.md "Symmetry"). With a FlowSymmetry, replica r
// of the data-parallel replicas is replica 0 moved r times by a device permutation that is an
// automorphism of the topology (Topology::automorphism: every link onto a link of the same
// figures). ECMP routes then follow the symmetry: a transfer inside replica r routes each flow
// as the corresponding flow of replica 0 (key hashed from the canonical group's ranks or the
// canonical pair, how many transfers that group or pair has started, and the flow's index)
// and takes the shifted image of that route; a collective whose group spans the replicas (and
// which the permutation maps onto itself) routes one flow of each orbit of its plan's flows
// under the permutation by its key and gives the others the shifted images. So the whole flow
// set is invariant under the permutation, and since max-min rates are unique, corresponding
// flows of different replicas get equal rates at every moment. Mode `routes` simulates every
// replica so (the unreduced symmetric run); mode `reduce` is for a Program with data-parallel
// mirroring. There every link of an orbit of links under the move carries the same load, so
// the solver keeps only each orbit's representative (its lowest link id) loaded: a transfer
// inside replica 0 stands for its k copies (one per replica), and each of its flows enters the
// solver once, on the representative links its copies' shifted routes cross, weighted by how
// many of the copies cross each (MaxMinSolver weights); a collective across replicas (complete
// already: mirrored members only skip issuing ops) starts one flow per orbit of its phase's
// flows, standing for the orbit, weighted the same way. Water-filling that system gives the
// rates of the unreduced symmetric run (max-min rates are unique and symmetric; each of its
// bottleneck links has a representative with the same load), at the cost of one replica's
// flows on one replica's links. The two agree up to floating-point rounding (a link's load
// summed copy by copy, or as weight x rate).
// A plan whose flows do not map onto each other, a group that spans replicas but is not mapped
// onto itself, or (reduce) a transfer outside replica 0 throws SymmetryBroken.
//
// Classes and loss (strategies/transport.hpp, docs/priorities.md). A transfer's priority class
// becomes its flows' FlowClass in the solver (sim/max_min.hpp): with strict scheduling the
// class is the flow's level (a class gets a link's bandwidth only after every more urgent
// class's flows there have their max-min rates); with weighted scheduling every flow is at
// level 0 with its class's weight. A transfer carries request.delivered() bytes: a gradient
// message's droppable tail is never sent, so its flows end when the rest has arrived.
//
// Load balancing (cluster.load_balancing). `ecmp` routes a flow as above. `spray` splits every
// flow that has several shortest paths evenly over all of them (per-packet spraying: each path
// a sub-flow of bytes / paths, all starting together; the flow ends with its last sub-flow);
// flows with one shortest path are unchanged. The paths of a vertex pair are enumerated once
// (at most kMaxSprayPaths, else std::invalid_argument); a message's latency is its first
// path's. Packet reordering is not modelled (DLCP's order-independent packets make it
// harmless). Spraying and the replica symmetry do not combine (flow_symmetry refuses).
//
// Cost: the plan of each (group, kind, algorithm) is made once, with the route of every flow
// whose path is the only shortest one (inside a node, under one leaf switch); per transfer the
// network routes only the flows that ECMP can spread (a table lookup per hop) and hands the
// flows to the solver, whose work per start or end is the connected component of flows sharing
// links with them. Nothing is allocated per flow once buffers have grown.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/topology.hpp"
#include "sim/collectives.hpp"
#include "sim/max_min.hpp"
#include "sim/nccl_model.hpp"
#include "sim/network.hpp"
#include "strategies/program.hpp"

namespace stratasim::sim {

/// Sees every flow when it ends: its links, bytes and when it ran. A flow of the symmetry
/// reduction stands for `copies` flows (one per replica) and crosses route_links[i] weights[i]
/// times in all (weights empty: once each, copies 1); `bytes` is per copy.
class FlowObserver {
 public:
  virtual ~FlowObserver() = default;
  virtual void on_flow(std::span<const int> route_links, std::span<const int> weights, int copies,
                       Bytes bytes, Time start, Time end) = 0;
};

/// Data-parallel replicas as the symmetry sees them: replica r's ranks are replica 0's moved by
/// `next` r times.
struct ReplicaMap {
  int replicas = 1;
  std::vector<std::int32_t> replica;  // by rank: its replica, 0 .. replicas - 1
  std::vector<std::int32_t> next;     // by rank: the rank at its place in the next replica
};

/// The symmetry a FlowNetwork uses (see the header comment). Made by flow_symmetry().
struct FlowSymmetry {
  enum class Mode : std::uint8_t { routes, reduce };
  Mode mode = Mode::routes;
  ReplicaMap replicas;
  hw::Topology::Automorphism shift;  // what `replicas.next` does to vertices and links
};

/// The symmetry of `replicas` on `cluster`'s flow network where it provably holds: one job's
/// replicas (the caller's), identical devices and links (no per-device overrides, so no
/// stragglers or degraded links), ECMP load balancing (not spray), at least two replicas, and a
/// replica shift that is an automorphism of the topology (replicas on whole, identically placed
/// nodes, racks or pods). Otherwise nothing, with `why` saying which condition failed.
std::optional<FlowSymmetry> flow_symmetry(const hw::ClusterSpec& cluster,
                                          const hw::Topology& topology, ReplicaMap replicas,
                                          FlowSymmetry::Mode mode, std::string& why);

/// Thrown by a FlowNetwork with a symmetry when the program's traffic breaks it (the caller
/// simulates every replica instead).
class SymmetryBroken : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class FlowNetwork final : public Network {
 public:
  FlowNetwork(const hw::ClusterSpec& cluster, hw::Topology topology,
              const strategies::Program& program);
  /// With a symmetry (see the header comment): routes follow it, and with Mode::reduce a
  /// transfer of replica 0 stands for every replica's.
  FlowNetwork(const hw::ClusterSpec& cluster, hw::Topology topology,
              const strategies::Program& program, FlowSymmetry symmetry);

  void start(TransferId id, const TransferRequest& request, Time now) override;
  Time next_completion() const override;
  void advance_to(Time t, std::vector<TransferId>& finished) override;
  /// Interference on flows: with the cluster's interference.flow_transfers only (off, a
  /// transfer's flows are paced by the links alone, as before it existed).
  bool enable_rates() override;
  /// Strict or weighted classes at every link (see the header comment).
  void set_transport(const strategies::TransportPolicy& policy) override;
  /// Spraying splits a flow over at most this many equal-cost paths.
  static constexpr std::size_t kMaxSprayPaths = 1024;
  /// A transfer at `rate` of its own speed: each of its flows in flight, and each it starts
  /// later, is capped at rate x the smallest link capacity on its route (what it would get
  /// alone; MaxMinSolver::set_rate_factor) and the max-min rates are solved again, so a flow
  /// already slowed more by its links' sharing is not slowed further and what a capped flow
  /// leaves goes to the others. Phase latencies are not stretched (the analytical network
  /// stretches all that remains): for a transfer alone on its links, the flows' time grows by
  /// 1 / rate, as on the analytical network.
  void set_rate(TransferId id, double rate, Time now) override;

  /// Called for every flow as it ends (nullptr: none).
  void set_observer(FlowObserver* observer) { observer_ = observer; }
  const hw::Topology& topology() const { return topology_; }
  /// A link's capacity in the model: its bandwidth times the protocol efficiency (bytes/s).
  double capacity(int link) const { return solver_.capacity(link); }
  /// The link whose load stands for `link`'s: with the symmetry reduction, the lowest link of
  /// its orbit under the replica move (every link of an orbit carries the same load); else
  /// the link itself.
  int link_representative(int link) const;
  /// Flows handed to the solver so far (zero-byte flows are not started).
  std::uint64_t flows_started() const { return flows_started_; }
  /// Flows whose rates water-filling computed so far (the solver's work).
  std::uint64_t flows_refilled() const { return solver_.refilled_flows(); }
  /// The algorithm a collective over program group `group` runs.
  hw::CollectiveAlgorithm algorithm(strategies::CollectiveKind kind, std::uint32_t group,
                                    Bytes bytes) const;

 private:
  static constexpr std::size_t kKinds = 6;
  static constexpr std::size_t kAlgorithms = 10;
  /// A plan and, per flow (phase by phase), its fixed route (fixed_route's id) or -1 where
  /// ECMP has a choice and each transfer routes the flow by its own key.
  struct Plan {
    PlanTemplate plan;
    std::vector<int> routes;
    /// With a symmetry, on a group across replicas: per flow (phase by phase), the flow of its
    /// phase whose route one shift takes to its own (-1: it is routed by its key), and per
    /// phase its flows in an order where each comes after that one.
    std::vector<int> shifted_from;
    std::vector<std::vector<int>> orbit_order;
  };
  /// A group as the symmetry sees it.
  struct GroupSymmetry {
    int replica = -1;         // the replica holding every member, or -1 (spans replicas)
    int canonical = -1;       // inside a replica: replica 0's group at its place (-1: none)
    std::uint64_t tag = 0;    // hash of the canonical group's ranks (ECMP keys)
    std::uint32_t count = 0;  // transfers started on it so far
  };
  struct GroupInfo {
    std::vector<std::int32_t> ranks;
    GroupShape shape;
    bool switch_reduces = false;
    std::vector<MemberLinks> members;  // for the rule's alpha-beta comparisons
    std::vector<int> nodes;
    NcclGroup nccl;  // with the NCCL model
    std::array<std::unique_ptr<Plan>, kKinds * kAlgorithms> plans;
    // Alpha-beta costs the rule compares (the tree's test), made on first use.
    mutable std::array<std::unique_ptr<CollectiveCost>, kKinds * kAlgorithms> costs;
  };
  struct Transfer {
    TransferId id = 0;
    const Plan* plan = nullptr;  // nullptr: point to point
    Bytes bytes;
    std::size_t phase = 0;
    std::int64_t outstanding = 0;  // flows of the current phase still running
    /// The NCCL model: each flow carries its share times this (the model's bandwidth time over
    /// the schedule's), and only the first phase waits, for the model's whole latency.
    double scale = 1;
    bool nccl = false;              // point to point: NCCL's send (not a copy-engine one)
    std::int32_t src = 0, dst = 0;  // point to point: its ranks
    std::vector<int> route;         // point to point: its route
    /// With rates enabled: its rate (set_rate) and its current phase's flows (solver id, start
    /// sequence: the id alone may have been reused by then).
    double rate = 1;
    std::vector<std::pair<int, std::uint64_t>> flows;
    /// With a symmetry: the ECMP key base, the replica the transfer lies in (-1: it spans them)
    /// and (reduce) how many copies it stands for.
    std::uint64_t key = 0;
    int replica = -1;
    int copies = 1;
    FlowClass cls;   // its flows' class in the solver
    int spray = -1;  // point to point, sprayed: its path set (spray_paths), else -1
  };
  struct Timer {
    Time at;
    std::uint64_t sequence;
    int transfer;
  };
  struct Later {
    bool operator()(const Timer& a, const Timer& b) const {
      return a.at != b.at ? a.at > b.at : a.sequence > b.sequence;
    }
  };

  const Plan& plan(std::uint32_t group, strategies::CollectiveKind kind,
                   hw::CollectiveAlgorithm algorithm);
  /// The schedule's bandwidth time (no latencies) of `algorithm` over the group's links.
  Time schedule_bandwidth_time(std::uint32_t group, strategies::CollectiveKind kind,
                               hw::CollectiveAlgorithm algorithm, Bytes bytes) const;
  /// The only shortest route between two vertices (an id for fixed_route_links), or -1 where
  /// there are several (equal-cost next hops somewhere along it). Found once per pair.
  int fixed_route(int src, int dst);
  std::span<const int> fixed_route_links(int id) const;
  void schedule(int transfer, Time at);
  /// The current phase's latency has passed: start its flows (or finish the transfer).
  void on_timer(int transfer, std::vector<TransferId>& finished);
  void phase_done(int transfer);
  /// Hands a flow of transfer slot `transfer` to the solver (and, with rates, caps it).
  void start_flow(int transfer, std::span<const int> route, double bytes);
  /// The routes of the current phase's flows of transfer `t` (phase_links_, phase_offset_).
  void phase_routes(const Transfer& t, std::size_t first, const PlanTemplate::Phase& phase);
  /// The route of flow `index` (phase by phase) of transfer `t`'s plan, `f`, by its key.
  void keyed_route(const Transfer& t, std::size_t index, const PlanTemplate::Flow& f,
                   std::vector<int>& out);
  /// Symmetry: the ECMP key base, replica and copies of a transfer being started.
  void symmetric_start(Transfer& t, const TransferRequest& request);
  /// Symmetry: a new plan's orbits (group across replicas) or its check against replica 0's.
  void plan_symmetry(std::uint32_t group, strategies::CollectiveKind kind,
                     hw::CollectiveAlgorithm algorithm, Plan& plan);
  void make_orbits(Plan& plan) const;
  /// `route` moved `times` shifts along (into `out`).
  void shift_route(std::span<const int> route, int times, std::vector<int>& out) const;
  int shift_vertex(int vertex, int times) const;
  /// Reduce: the copies' routes, kept on their links' orbit representatives, counted into
  /// merged_ (links) and weights_.
  void copies_route(std::span<const int> route);
  void count_links();  // merged_ sorted and counted into distinct links and weights_
  /// Reduce, a collective across replicas: one flow per orbit of the phase's flows, standing
  /// for the orbit (phase_routes first).
  void start_orbits(int slot, const PlanTemplate::Phase& phase);
  std::size_t first_of_phase(const Transfer& t) const;
  void start_weighted(int slot, std::span<const int> route, std::span<const int> weights,
                      int copies, double bytes);
  /// The solver class of a transfer of priority class `priority`.
  FlowClass flow_class(std::int64_t priority) const;
  /// Spray: the id of the set of every shortest path between two vertices (enumerated once).
  int spray_paths(int src, int dst);
  /// Spray: starts one sub-flow of bytes / paths on each path of set `paths`; returns how many.
  int start_sprayed(int slot, int paths, double bytes);
  bool spraying() const { return cluster_.load_balancing == hw::LoadBalancing::spray; }

  hw::ClusterSpec cluster_;
  hw::Topology topology_;
  mutable MaxMinSolver solver_;  // settles lazily, also when asked for its next completion
  std::vector<GroupInfo> groups_;
  std::vector<Transfer> transfers_;
  std::vector<int> free_transfers_;
  std::vector<Timer> timers_;  // binary heap by Later
  std::vector<int> route_;     // scratch
  std::vector<int> probe_;     // scratch
  // Fixed routes by (src, dst) vertex pair; route i's links are
  // route_links_[route_offset_[i] .. route_offset_[i + 1]).
  std::unordered_map<std::uint64_t, int> route_of_pair_;
  std::vector<int> route_offset_{0};
  std::vector<int> route_links_;
  std::vector<std::uint64_t> done_tags_;  // scratch
  FlowObserver* observer_ = nullptr;
  bool rates_ = false;        // enable_rates was called (and flow_transfers is on)
  std::vector<int> slot_of_;  // with rates_: per transfer id, its slot or -1
  Time now_;
  std::uint64_t sequence_ = 0;
  std::uint64_t flows_started_ = 0;
  // Classes (set_transport): weighted scheduling's weight per class; empty: strict levels.
  std::vector<double> class_weights_;
  // Spray: path sets by (src, dst) vertex pair; set i's paths are spray_sets_[i].
  std::unordered_map<std::uint64_t, int> spray_of_pair_;
  std::vector<std::vector<std::vector<int>>> spray_sets_;
  // Symmetry (absent: none).
  std::optional<FlowSymmetry> symmetry_;
  std::vector<GroupSymmetry> group_symmetry_;
  std::vector<std::int32_t> canonical_rank_;  // by rank: its place in replica 0
  std::vector<int> canonical_link_;  // by link: the lowest link of its orbit under the move
  std::unordered_map<std::uint64_t, std::uint32_t> pair_count_;
  std::vector<int> shifted_, merged_, weights_;  // scratch
  std::vector<int> phase_links_, phase_offset_;  // scratch: a phase's routes
  std::vector<std::vector<int>> orbit_routes_;   // scratch: a phase's routes, by flow
};

/// Sums the bytes that cross each link, for per-link utilisation (bytes / (capacity * span))
/// and the busiest links of a run.
class LinkUsage final : public FlowObserver {
 public:
  explicit LinkUsage(const FlowNetwork& network);
  void on_flow(std::span<const int> route_links, std::span<const int> weights, int copies,
               Bytes bytes, Time start, Time end) override;

  /// Bytes that crossed a link (with the symmetry reduction: its orbit representative's).
  Bytes bytes(int link) const {
    return bytes_[static_cast<std::size_t>(representative_[static_cast<std::size_t>(link)])];
  }
  /// Flows seen, a reduced flow counting its copies.
  std::uint64_t flows() const { return flows_; }
  /// bytes / (capacity * span) of one link over a run of length `span`.
  double utilisation(int link, Time span) const;

  struct Busy {
    int link = 0;
    Bytes bytes;
    double utilisation = 0;
  };
  /// The `count` links with the highest utilisation over `span` (ties: lower link id first),
  /// links that carried nothing left out.
  std::vector<Busy> busiest(Time span, std::size_t count) const;

 private:
  std::vector<double> capacity_;
  std::vector<int> representative_;  // FlowNetwork::link_representative
  std::vector<Bytes> bytes_;
  std::uint64_t flows_ = 0;
};

}  // namespace stratasim::sim
