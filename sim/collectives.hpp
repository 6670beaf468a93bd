// Collective algorithms, each a schedule of flows, and their alpha-beta times.
//
// A collective over a group of n members (in the group's order) becomes phases; the flows of a
// phase run at the same time and the next phase starts when all of them have finished. A phase
// pays its latency once, before its flows move bytes: `steps` times the latency of its slowest
// flow's path. Steps of a ring that move equal chunks in lock step are one phase of n flows,
// each carrying the steps' total volume (the pipelined ring's steady state), with the steps'
// latencies: a ring all-reduce is one phase of n flows i -> i+1 of 2(n-1)/n S bytes and
// 2(n-1) latencies, so the flow count grows with ranks, not with ranks times steps.
//
// The same schedule gives both models their numbers, so they agree wherever links are not
// shared with other transfers:
// - collective_time (analytical): each phase takes max over the members' ports of
//   load / B + steps * alpha, a port being one member's intra-node link (NVLink to the NVSwitch)
//   or inter-node link (its NIC), in one direction; load the bytes of the phase's flows through
//   it; B that member's own link bandwidth (cluster.intra_link_of / inter_link_of, so a
//   degraded link slows the whole collective) times collectives.protocol_efficiency; alpha the
//   largest latency among the links the phase's flows use. A flow between members of one node
//   uses their intra-node ports, else their NICs.
// - plan_collective (flow-level): the same flows between topology vertices, each routed over
//   the topology's links and sharing them max-min fairly with every other flow in the network.
//   A phase's latency is `steps` times its slowest route's latency. The builders put a route's
//   whole latency on its first link (hw_models/topology.cpp: the sender pays), so on the
//   two-level, nvswitch and fat-tree topologies a route between devices costs the intra- or
//   inter-node latency, as in the formulas (which take the larger of the two ends' latencies:
//   they differ only where an override gives one device another latency).
//
// Algorithms (S bytes, n members; figures for equal links of bandwidth B and latency alpha,
// fractions rounded up to whole bytes):
// - ring: all-reduce one phase, flows i -> i+1 of 2(n-1)/n S, 2(n-1) alpha:
//   2(n-1)/n S/B + 2(n-1) alpha; reduce-scatter, all-gather (n-1)/n S/B + (n-1) alpha;
//   broadcast (reduce) a pipelined chain 0 -> 1 -> ... -> n-1 (reverse), flows of S:
//   S/B + (n-1) alpha; all-to-all a pairwise exchange in n-1 lock-step phases (phase s: i sends
//   its S/n share to i+s), each paced by its slowest pair: (n-1)/n S/B + (n-1) alpha.
// - tree (NCCL's double binary tree; all-reduce): two binary trees over the members (NCCL's
//   in-order tree and its mirror, or its shift by one for odd n), each carrying half the data
//   D = S/2, reduce up and broadcast down pipelined. Each tree edge carries D up and D down, so
//   a member with e edges in the two trees sends and receives e D. A member is interior (a
//   parent and two children: 3 edges) in one tree and a leaf (1 edge) in the other, so
//   e <= 4 and the busiest member moves 4 D = 2 S each way: time 2 S/B + 2 d alpha with d the
//   deeper tree's depth (about log2 n): the reduction climbs d levels, the broadcast descends
//   d. (For n = 2: e = 2, S/B + 2 alpha, as the ring.) All other kinds run the ring.
// - halving_doubling (all-reduce, reduce-scatter, all-gather): with p the largest power of two
//   <= n, members 0, 2, ..., 2(n-p)-1 first hand their data to the next member (a pre-step of
//   S; S/n for all-gather) and get the result at the end (a post-step of S; S/n for
//   reduce-scatter); the p others reduce-scatter by recursive halving (step j exchanges S/2^(j+1)
//   with the member 2^j away: near ones carry the big halves) and all-gather by recursive
//   doubling (the same steps backwards), one phase per step. n = p: all-reduce
//   2(p-1)/p S/B + 2 log2(p) alpha, reduce-scatter and all-gather (p-1)/p S/B + log2(p) alpha.
//   Broadcast, reduce and all-to-all run the ring.
// - direct: every member sends its S/n share to every other member at once (one phase):
//   reduce-scatter, all-gather and all-to-all (n-1)/n S/B + alpha (a member's n-1 flows share
//   its link); all-reduce a direct reduce-scatter then a direct all-gather, 2(n-1)/n S/B +
//   2 alpha; broadcast a scatter from the root (the root sends S/n to each other member) then a
//   direct all-gather; reduce a direct reduce-scatter then a gather to the root.
// - hierarchical (all-reduce, reduce-scatter, all-gather, for a group spanning N >= 2 nodes with
//   up to k >= 2 members on a node): a reduce-scatter inside every node (ring of k over S:
//   (k-1)/k S/B_intra + (k-1) alpha_intra), then k rings across nodes in parallel, ring j
//   linking the j-th member of every node, on the shard S/k (all-reduce 2(N-1)/N S/k / B_inter +
//   2(N-1) alpha_inter), then an all-gather inside every node (as the reduce-scatter);
//   reduce-scatter is the first two phases (the inter-node one a reduce-scatter), all-gather
//   the last two (an inter-node all-gather, then the intra-node one). A node with fewer than k
//   members lends its member j mod k_node to ring j (its NIC then carries several rings: the
//   flow model sees that contention, the analytical one does not). Groups on one node or with
//   one member per node, and broadcast, reduce and all-to-all, run the ring.
// - nvls (NVLink SHARP; a switch one hop from every member reduces): all-reduce as NCCL runs
//   it, a reduce-scatter through the switch (multimem.ld_reduce: S up, the reduced S/n shard
//   down) pipelined with an all-gather through it (multimem.st: S/n up, the switch multicasts
//   S down): (n+1)/n S each way, (n+1)/n S/B + alpha, alpha the latency device -> switch ->
//   device — so algbw = B n/(n+1), the growth with n that users measure (nccl-h100-nvlink);
//   reduce-scatter: S up, the member's S/n shard down; all-gather: the S/n shard up, S down;
//   broadcast: the root sends S up, the switch multicasts S down to the others; reduce: every
//   member sends S up, the root receives S. These S/B + alpha. All-to-all has nothing to reduce
//   or multicast: std::invalid_argument. Needs a reducing switch (cluster topology `nvswitch`
//   with `sharp`, or an explicit graph vertex with `reduces`): plan_collective and the
//   analytical network throw std::invalid_argument without one.
// - collnet_direct, collnet_chain (SHARP: the network's switches reduce) and pat (NCCL's
//   Parallel Aggregated Trees) are the NCCL model's (sim/nccl_model.hpp); these schedules run
//   them as hierarchical and ring (the traffic inside a node is the same; what the switches
//   save is the NCCL model's to cost).
// A group of one member moves nothing: no phases, zero time.
//
// The rule that chooses (choose_algorithm with the cluster's choice `automatic`), like NCCL's
// tuner (which takes the algorithm of least predicted time) on the cases that matter, and equal
// to the analytical model before algorithms were selectable wherever the tree does not win:
// - nvls for an all-reduce within one node whose switch reduces;
// - the default: hierarchical for all-reduce, reduce-scatter and all-gather spanning nodes with
//   several members on a node; ring otherwise (a flat ring within one node, or across nodes
//   with one member per node; broadcast, reduce and all-to-all spanning nodes run flat at the
//   slower, inter-node links);
// - but the tree for an all-reduce spanning nodes smaller than kTreeThreshold (256 KiB), where
//   latency dominates, when its alpha-beta time is less than the default's (2 d latencies
//   against the flat ring's 2(n-1) or the hierarchical 2(k-1) intra- plus 2(N-1) inter-node
//   ones, for up to twice the bytes through the busiest member): with one member per node on
//   many nodes it wins; a hierarchical group of 8 per node, whose inter-node rings already pay
//   few latencies, keeps the hierarchical algorithm.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/topology.hpp"
#include "strategies/program.hpp"

namespace stratasim::sim {

/// Where a group's ranks live: how many nodes it spans and the most ranks it has on one node.
struct GroupShape {
  int size = 1;
  int nodes = 1;
  int max_ranks_per_node = 1;
};
GroupShape shape_of(std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster);

/// All-reduces spanning nodes smaller than this run the tree when the algorithm is automatic.
inline constexpr Bytes kTreeThreshold{256 * 1024};

/// A fraction of the collective's size S: ceil(ceil(S * num1 / den1) * num2 / den2) bytes.
struct Share {
  std::int64_t num1 = 1, den1 = 1, num2 = 1, den2 = 1;
  Bytes of(Bytes size) const;
  bool operator==(const Share&) const = default;
};

/// A flow of a schedule between members (indices into the group's ranks) or with the reducing
/// switch (kSwitch).
inline constexpr int kSwitch = -1;
struct ScheduleFlow {
  int src = 0;
  int dst = 0;
  Share share;
};
struct SchedulePhase {
  std::vector<ScheduleFlow> flows;
  std::int64_t steps = 1;  // latencies paid before the flows move
};
struct Schedule {
  hw::CollectiveAlgorithm algorithm = hw::CollectiveAlgorithm::ring;
  std::vector<SchedulePhase> phases;
};

/// The algorithm that runs when `requested` (not automatic) is asked for `kind` on a group of
/// `shape`: the algorithm itself where it applies, else the ring (see above). Throws
/// std::invalid_argument for nvls on an all-to-all.
hw::CollectiveAlgorithm resolve_algorithm(strategies::CollectiveKind kind,
                                          hw::CollectiveAlgorithm requested,
                                          const GroupShape& shape);

/// The alpha-beta time of an algorithm for the collective being chosen (for the tree's test).
using AlgorithmTime = std::function<Time(hw::CollectiveAlgorithm)>;

/// The algorithm for one collective: the cluster's fixed choice for `kind`, resolved, else the
/// rule above. `switch_reduces`: a switch one hop from every member reduces (NVLS). `time_of`
/// gives the candidates' times on the group's own links; without it, the group is taken as
/// `shape` (k members per node, node by node) on the cluster's nominal links.
hw::CollectiveAlgorithm choose_algorithm(strategies::CollectiveKind kind, const GroupShape& shape,
                                         Bytes bytes, const hw::ClusterSpec& cluster,
                                         bool switch_reduces, const AlgorithmTime& time_of = {});

/// Whether the cluster's topology section makes a switch reduce for a group of `shape`, as the
/// analytical model sees it: an `nvswitch` topology with `sharp` and a group within one node.
bool cluster_switch_reduces(const hw::ClusterSpec& cluster, const GroupShape& shape);

/// The schedule of `kind` with `algorithm` (resolved, not automatic) over members whose nodes
/// are `member_nodes` (any ids; equal ids: same node), in group order. Root: member 0.
Schedule build_schedule(strategies::CollectiveKind kind, hw::CollectiveAlgorithm algorithm,
                        std::span<const int> member_nodes);

/// A member's links as the analytical model uses them (bandwidth times protocol efficiency).
struct MemberLinks {
  int node = 0;
  hw::LinkSpec intra;
  hw::LinkSpec inter;
};
/// Members' links from the cluster, overrides applied, for the group's ranks (a rank beyond
/// the cluster's devices gets the nominal links).
std::vector<MemberLinks> member_links(std::span<const std::int32_t> ranks,
                                      const hw::ClusterSpec& cluster);
/// Members of a group of `shape` (k per node, node by node) on the cluster's nominal links.
std::vector<MemberLinks> nominal_members(const GroupShape& shape, const hw::ClusterSpec& cluster);

/// A schedule's alpha-beta time as a function of S, compiled once per group, kind and
/// algorithm: per phase, the distinct port loads that can be the slowest, with their
/// bandwidths; evaluating it is a few divisions.
class CollectiveCost {
 public:
  CollectiveCost() = default;
  CollectiveCost(const Schedule& schedule, std::span<const MemberLinks> members);
  Time time(Bytes size) const;
  hw::CollectiveAlgorithm algorithm() const { return algorithm_; }

 private:
  struct Load {
    std::vector<std::pair<Share, std::int64_t>> parts;  // flows of a share, how many
    Bandwidth bandwidth;                                // the smallest among ports so loaded
  };
  struct Phase {
    std::vector<Load> loads;
    Time latency;  // steps times the largest latency of a link its flows use
    std::int64_t repeat = 1;
  };
  hw::CollectiveAlgorithm algorithm_ = hw::CollectiveAlgorithm::ring;
  std::vector<Phase> phases_;
};

/// Alpha-beta time of a collective with a given algorithm (`automatic`: choose_algorithm with
/// cluster_switch_reduces) over a group of `ranks`, using each member's own intra-/inter-node
/// link (the slowest member sets the pace) and the protocol efficiency. No contention with other
/// transfers.
Time collective_time(strategies::CollectiveKind kind, hw::CollectiveAlgorithm algorithm,
                     std::span<const std::int32_t> ranks, Bytes bytes,
                     const hw::ClusterSpec& cluster);

/// One flow between two topology vertices (devices, or a reducing switch).
struct PlannedFlow {
  int src_vertex = 0;
  int dst_vertex = 0;
  Bytes bytes;
};

struct FlowPhase {
  std::vector<PlannedFlow> flows;
  Time latency;  // paid once per phase, before its flows move bytes
};

struct CollectivePlan {
  hw::CollectiveAlgorithm algorithm = hw::CollectiveAlgorithm::ring;
  std::vector<FlowPhase> phases;
};

/// A plan with its sizes left as shares of S, made once per group, kind and algorithm. A
/// phase's latency is `steps` times the largest route latency among its flows (routes taken
/// with flow key 0: equal-cost paths have equal hop counts); for a phase through the reducing
/// switch, the largest latency up to it plus the largest down from it.
struct PlanTemplate {
  struct Flow {
    int src_vertex = 0;
    int dst_vertex = 0;
    Share share;
  };
  struct Phase {
    std::vector<Flow> flows;
    Time latency;
  };
  hw::CollectiveAlgorithm algorithm = hw::CollectiveAlgorithm::ring;
  std::vector<Phase> phases;
};

/// The template of `kind` with `algorithm` (resolved, not automatic) over `ranks` (program ranks
/// = topology devices). Throws std::invalid_argument for nvls where no switch one hop from
/// every member reduces.
PlanTemplate plan_template(strategies::CollectiveKind kind, hw::CollectiveAlgorithm algorithm,
                           std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster,
                           const hw::Topology& topology);

/// The flows of a collective over `ranks` on `topology` (`automatic`: choose_algorithm, with
/// the topology's reducing switch). Throws std::invalid_argument for an algorithm that cannot
/// run there (nvls with no reducing switch), naming the algorithm and why.
CollectivePlan plan_collective(strategies::CollectiveKind kind, hw::CollectiveAlgorithm algorithm,
                               std::span<const std::int32_t> ranks, Bytes bytes,
                               const hw::ClusterSpec& cluster, const hw::Topology& topology);

}  // namespace stratasim::sim
