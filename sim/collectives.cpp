#include "sim/collectives.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace stratasim::sim {

namespace {

using hw::CollectiveAlgorithm;
using strategies::CollectiveKind;

std::int64_t ceil_fraction(std::int64_t size, std::int64_t num, std::int64_t den) {
  if (size <= 0) return 0;
  return (size * num + den - 1) / den;
}

std::string kind_name(CollectiveKind kind) {
  return std::string(strategies::name_of(kind));
}

Share share(std::int64_t num, std::int64_t den) {
  return Share{num, den, 1, 1};
}

// ---- Double binary tree (NCCL's ncclGetBtree / ncclGetDtree).

/// Parent of `r` in NCCL's in-order binary tree over n ranks (rank 0 is the root, with one
/// child); -1 for the root.
int btree_parent(int n, int r) {
  if (r == 0) return -1;
  int bit = 1;
  while (bit < n && (bit & r) == 0) bit <<= 1;
  int up = (r ^ bit) | (bit << 1);
  if (up >= n) up = r ^ bit;
  return up;
}

/// Parents in the two trees: the binary tree and its mirror (n even) or its shift by one (odd).
void dtree_parents(int n, std::vector<int>& first, std::vector<int>& second) {
  first.assign(static_cast<std::size_t>(n), -1);
  second.assign(static_cast<std::size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    first[static_cast<std::size_t>(r)] = btree_parent(n, r);
    if (n % 2 == 1) {
      const int u = btree_parent(n, (r - 1 + n) % n);
      second[static_cast<std::size_t>(r)] = u == -1 ? -1 : (u + 1) % n;
    } else {
      const int u = btree_parent(n, n - 1 - r);
      second[static_cast<std::size_t>(r)] = u == -1 ? -1 : n - 1 - u;
    }
  }
}

int tree_depth(const std::vector<int>& parent) {
  int deepest = 0;
  for (std::size_t v = 0; v < parent.size(); ++v) {
    int d = 0;
    for (int u = parent[v]; u != -1; u = parent[static_cast<std::size_t>(u)]) {
      ++d;
      if (d > static_cast<int>(parent.size())) throw std::logic_error("tree has a cycle");
    }
    deepest = std::max(deepest, d);
  }
  return deepest;
}

// ---- Schedules.

SchedulePhase ring_phase(int n, Share s, std::int64_t steps) {
  SchedulePhase p;
  p.steps = steps;
  p.flows.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) p.flows.push_back(ScheduleFlow{i, (i + 1) % n, s});
  return p;
}

SchedulePhase all_pairs_phase(int n, Share s) {
  SchedulePhase p;
  p.steps = 1;
  p.flows.reserve(static_cast<std::size_t>(n) * static_cast<std::size_t>(n - 1));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) p.flows.push_back(ScheduleFlow{i, j, s});
    }
  }
  return p;
}

void ring_schedule(CollectiveKind kind, int n, Schedule& out) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      out.phases.push_back(ring_phase(n, share(2 * (n - 1), n), 2 * (n - 1)));
      return;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      out.phases.push_back(ring_phase(n, share(n - 1, n), n - 1));
      return;
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce: {
      SchedulePhase p;
      p.steps = n - 1;
      for (int i = 0; i + 1 < n; ++i) {
        if (kind == CollectiveKind::broadcast) {
          p.flows.push_back(ScheduleFlow{i, i + 1, share(1, 1)});
        } else {
          p.flows.push_back(ScheduleFlow{i + 1, i, share(1, 1)});
        }
      }
      out.phases.push_back(std::move(p));
      return;
    }
    case CollectiveKind::all_to_all:
      for (int s = 1; s < n; ++s) {
        SchedulePhase p;
        p.steps = 1;
        p.flows.reserve(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) p.flows.push_back(ScheduleFlow{i, (i + s) % n, share(1, n)});
        out.phases.push_back(std::move(p));
      }
      return;
  }
}

void tree_schedule(int n, Schedule& out) {
  std::vector<int> first, second;
  dtree_parents(n, first, second);
  SchedulePhase p;
  p.steps = 2 * std::max(tree_depth(first), tree_depth(second));
  for (const auto* parents : {&first, &second}) {
    for (int v = 0; v < n; ++v) {
      const int u = (*parents)[static_cast<std::size_t>(v)];
      if (u == -1) continue;
      p.flows.push_back(ScheduleFlow{v, u, share(1, 2)});  // reduce: up
      p.flows.push_back(ScheduleFlow{u, v, share(1, 2)});  // broadcast: down
    }
  }
  out.phases.push_back(std::move(p));
}

void halving_doubling_schedule(CollectiveKind kind, int n, Schedule& out) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  std::vector<int> members;  // the p that take part in the exchanges
  members.reserve(static_cast<std::size_t>(p));
  for (int i = 0; i < extra; ++i) members.push_back(2 * i + 1);
  for (int i = 2 * extra; i < n; ++i) members.push_back(i);
  const bool reduces = kind != CollectiveKind::all_gather;
  const bool gathers = kind != CollectiveKind::reduce_scatter;
  if (extra > 0) {
    SchedulePhase pre;
    for (int i = 0; i < extra; ++i) {
      pre.flows.push_back(ScheduleFlow{2 * i, 2 * i + 1, reduces ? share(1, 1) : share(1, n)});
    }
    out.phases.push_back(std::move(pre));
  }
  auto step = [&](int distance, std::int64_t fraction) {
    SchedulePhase ph;
    ph.flows.reserve(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) {
      ph.flows.push_back(ScheduleFlow{members[static_cast<std::size_t>(q)],
                                      members[static_cast<std::size_t>(q ^ distance)],
                                      share(1, fraction)});
    }
    out.phases.push_back(std::move(ph));
  };
  if (reduces) {
    for (int d = 1; d < p; d *= 2) step(d, 2 * static_cast<std::int64_t>(d));
  }
  if (gathers) {
    for (int d = p / 2; d >= 1; d /= 2) step(d, 2 * static_cast<std::int64_t>(d));
  }
  if (extra > 0) {
    SchedulePhase post;
    for (int i = 0; i < extra; ++i) {
      post.flows.push_back(ScheduleFlow{2 * i + 1, 2 * i, gathers ? share(1, 1) : share(1, n)});
    }
    out.phases.push_back(std::move(post));
  }
}

void direct_schedule(CollectiveKind kind, int n, Schedule& out) {
  const Share part = share(1, n);
  switch (kind) {
    case CollectiveKind::all_reduce:
      out.phases.push_back(all_pairs_phase(n, part));
      out.phases.push_back(all_pairs_phase(n, part));
      return;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
      out.phases.push_back(all_pairs_phase(n, part));
      return;
    case CollectiveKind::broadcast: {
      SchedulePhase scatter;
      for (int j = 1; j < n; ++j) scatter.flows.push_back(ScheduleFlow{0, j, part});
      out.phases.push_back(std::move(scatter));
      out.phases.push_back(all_pairs_phase(n, part));
      return;
    }
    case CollectiveKind::reduce: {
      out.phases.push_back(all_pairs_phase(n, part));
      SchedulePhase gather;
      for (int j = 1; j < n; ++j) gather.flows.push_back(ScheduleFlow{j, 0, part});
      out.phases.push_back(std::move(gather));
      return;
    }
  }
}

void hierarchical_schedule(CollectiveKind kind, std::span<const int> member_nodes, Schedule& out) {
  // Members by node, nodes in order of first appearance.
  std::vector<int> node_ids;
  std::vector<std::vector<int>> by_node;
  for (int i = 0; i < static_cast<int>(member_nodes.size()); ++i) {
    const int node = member_nodes[static_cast<std::size_t>(i)];
    auto it = std::find(node_ids.begin(), node_ids.end(), node);
    if (it == node_ids.end()) {
      node_ids.push_back(node);
      by_node.emplace_back();
      it = node_ids.end() - 1;
    }
    by_node[static_cast<std::size_t>(it - node_ids.begin())].push_back(i);
  }
  const auto nodes = static_cast<std::int64_t>(by_node.size());
  std::int64_t k = 0;
  for (const auto& m : by_node) k = std::max<std::int64_t>(k, static_cast<std::int64_t>(m.size()));

  auto intra = [&] {
    SchedulePhase p;
    p.steps = k - 1;
    for (const auto& m : by_node) {
      const auto local = static_cast<std::int64_t>(m.size());
      if (local < 2) continue;
      for (std::size_t a = 0; a < m.size(); ++a) {
        p.flows.push_back(ScheduleFlow{m[a], m[(a + 1) % m.size()], share(local - 1, local)});
      }
    }
    return p;
  };
  auto inter = [&](std::int64_t num, std::int64_t steps) {
    SchedulePhase p;
    p.steps = steps;
    const Share s{1, k, num, nodes};
    for (std::int64_t j = 0; j < k; ++j) {
      for (std::int64_t m = 0; m < nodes; ++m) {
        const auto& from = by_node[static_cast<std::size_t>(m)];
        const auto& to = by_node[static_cast<std::size_t>((m + 1) % nodes)];
        p.flows.push_back(ScheduleFlow{from[static_cast<std::size_t>(j) % from.size()],
                                       to[static_cast<std::size_t>(j) % to.size()], s});
      }
    }
    return p;
  };
  switch (kind) {
    case CollectiveKind::all_reduce:
      out.phases.push_back(intra());
      out.phases.push_back(inter(2 * (nodes - 1), 2 * (nodes - 1)));
      out.phases.push_back(intra());
      return;
    case CollectiveKind::reduce_scatter:
      out.phases.push_back(intra());
      out.phases.push_back(inter(nodes - 1, nodes - 1));
      return;
    case CollectiveKind::all_gather:
      out.phases.push_back(inter(nodes - 1, nodes - 1));
      out.phases.push_back(intra());
      return;
    default:
      throw std::logic_error("hierarchical schedule for " + kind_name(kind));
  }
}

void nvls_schedule(CollectiveKind kind, int n, Schedule& out) {
  SchedulePhase p;
  const Share whole = share(1, 1);
  const Share part = share(1, n);
  switch (kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather: {
      // NCCL's NVLS all-reduce is a reduce-scatter through the switch (multimem.ld_reduce:
      // the switch reads each rank's whole buffer, S up, and returns its reduced shard, S/n
      // down) pipelined with an all-gather through it (multimem.st: the shard goes up, S/n,
      // and the switch multicasts every shard, S down): (n+1)/n S each way.
      const Share both = share(n + 1, n);
      const Share up = kind == CollectiveKind::all_gather   ? part
                       : kind == CollectiveKind::all_reduce ? both
                                                            : whole;
      const Share down = kind == CollectiveKind::reduce_scatter ? part
                         : kind == CollectiveKind::all_reduce   ? both
                                                                : whole;
      for (int i = 0; i < n; ++i) p.flows.push_back(ScheduleFlow{i, kSwitch, up});
      for (int i = 0; i < n; ++i) p.flows.push_back(ScheduleFlow{kSwitch, i, down});
      break;
    }
    case CollectiveKind::broadcast:
      p.flows.push_back(ScheduleFlow{0, kSwitch, whole});
      for (int i = 1; i < n; ++i) p.flows.push_back(ScheduleFlow{kSwitch, i, whole});
      break;
    case CollectiveKind::reduce:
      for (int i = 0; i < n; ++i) p.flows.push_back(ScheduleFlow{i, kSwitch, whole});
      p.flows.push_back(ScheduleFlow{kSwitch, 0, whole});
      break;
    case CollectiveKind::all_to_all:
      throw std::invalid_argument(
          "nvls cannot run all_to_all: each pair exchanges its own data, which the switch has "
          "nothing to reduce or multicast (choose direct or ring)");
  }
  out.phases.push_back(std::move(p));
}

GroupShape shape_of_nodes(std::span<const int> member_nodes) {
  GroupShape shape;
  shape.size = static_cast<int>(member_nodes.size());
  std::vector<int> nodes(member_nodes.begin(), member_nodes.end());
  std::sort(nodes.begin(), nodes.end());
  shape.nodes = 0;
  shape.max_ranks_per_node = 0;
  for (std::size_t i = 0; i < nodes.size();) {
    std::size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    ++shape.nodes;
    shape.max_ranks_per_node = std::max(shape.max_ranks_per_node, static_cast<int>(j - i));
    i = j;
  }
  return shape;
}

}  // namespace

GroupShape shape_of(std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster) {
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (std::int32_t r : ranks) nodes.push_back(cluster.node_of(r));
  return shape_of_nodes(nodes);
}

Bytes Share::of(Bytes size) const {
  return Bytes(ceil_fraction(ceil_fraction(size.count(), num1, den1), num2, den2));
}

CollectiveAlgorithm resolve_algorithm(CollectiveKind kind, CollectiveAlgorithm requested,
                                      const GroupShape& shape) {
  if (requested == CollectiveAlgorithm::automatic) {
    throw std::logic_error("resolve_algorithm: `automatic` is chosen by choose_algorithm");
  }
  if (requested == CollectiveAlgorithm::nvls && kind == CollectiveKind::all_to_all) {
    throw std::invalid_argument(
        "nvls cannot run all_to_all: each pair exchanges its own data, which the switch has "
        "nothing to reduce or multicast (choose direct or ring)");
  }
  if (shape.size <= 1) return CollectiveAlgorithm::ring;
  const bool reduces_or_gathers = kind == CollectiveKind::all_reduce ||
                                  kind == CollectiveKind::reduce_scatter ||
                                  kind == CollectiveKind::all_gather;
  switch (requested) {
    case CollectiveAlgorithm::collnet_direct:
    case CollectiveAlgorithm::collnet_chain:
      // No schedule of its own: the switches' reduction is the NCCL model's (nccl_model.hpp).
      return resolve_algorithm(kind, CollectiveAlgorithm::hierarchical, shape);
    case CollectiveAlgorithm::pat:
      return CollectiveAlgorithm::ring;
    case CollectiveAlgorithm::tree:
      return kind == CollectiveKind::all_reduce ? requested : CollectiveAlgorithm::ring;
    case CollectiveAlgorithm::halving_doubling:
      return reduces_or_gathers ? requested : CollectiveAlgorithm::ring;
    case CollectiveAlgorithm::hierarchical:
      return reduces_or_gathers && shape.nodes >= 2 && shape.max_ranks_per_node >= 2
                 ? requested
                 : CollectiveAlgorithm::ring;
    default:
      return requested;
  }
}

CollectiveAlgorithm choose_algorithm(CollectiveKind kind, const GroupShape& shape, Bytes bytes,
                                     const hw::ClusterSpec& cluster, bool switch_reduces,
                                     const AlgorithmTime& time_of) {
  const auto index = static_cast<std::size_t>(kind);
  const CollectiveAlgorithm fixed = index < cluster.collectives.algorithm.size()
                                        ? cluster.collectives.algorithm[index]
                                        : CollectiveAlgorithm::automatic;
  if (fixed != CollectiveAlgorithm::automatic) return resolve_algorithm(kind, fixed, shape);
  if (shape.size <= 1) return CollectiveAlgorithm::ring;
  const CollectiveAlgorithm fallback =
      resolve_algorithm(kind, CollectiveAlgorithm::hierarchical, shape);
  if (kind != CollectiveKind::all_reduce) return fallback;
  if (shape.nodes <= 1 && switch_reduces) return CollectiveAlgorithm::nvls;
  if (shape.nodes >= 2 && bytes < kTreeThreshold) {
    Time tree, other;
    if (time_of) {
      tree = time_of(CollectiveAlgorithm::tree);
      other = time_of(fallback);
    } else {
      const auto members = nominal_members(shape, cluster);
      std::vector<int> nodes;
      nodes.reserve(members.size());
      for (const auto& m : members) nodes.push_back(m.node);
      tree = CollectiveCost(build_schedule(kind, CollectiveAlgorithm::tree, nodes), members)
                 .time(bytes);
      other = CollectiveCost(build_schedule(kind, fallback, nodes), members).time(bytes);
    }
    if (tree < other) return CollectiveAlgorithm::tree;
  }
  return fallback;
}

bool cluster_switch_reduces(const hw::ClusterSpec& cluster, const GroupShape& shape) {
  return cluster.topology && cluster.topology->kind == hw::TopologyKind::nvswitch &&
         cluster.topology->sharp && shape.nodes <= 1;
}

Schedule build_schedule(CollectiveKind kind, CollectiveAlgorithm algorithm,
                        std::span<const int> member_nodes) {
  Schedule out;
  const int n = static_cast<int>(member_nodes.size());
  out.algorithm = resolve_algorithm(kind, algorithm, shape_of_nodes(member_nodes));
  if (n <= 1) return out;
  switch (out.algorithm) {
    case CollectiveAlgorithm::automatic:
    case CollectiveAlgorithm::ring:
    case CollectiveAlgorithm::pat:  // resolved to ring above
      ring_schedule(kind, n, out);
      break;
    case CollectiveAlgorithm::tree:
      tree_schedule(n, out);
      break;
    case CollectiveAlgorithm::halving_doubling:
      halving_doubling_schedule(kind, n, out);
      break;
    case CollectiveAlgorithm::direct:
      direct_schedule(kind, n, out);
      break;
    case CollectiveAlgorithm::hierarchical:
    case CollectiveAlgorithm::collnet_direct:  // resolved to hierarchical above
    case CollectiveAlgorithm::collnet_chain:
      hierarchical_schedule(kind, member_nodes, out);
      break;
    case CollectiveAlgorithm::nvls:
      nvls_schedule(kind, n, out);
      break;
  }
  return out;
}

std::vector<MemberLinks> member_links(std::span<const std::int32_t> ranks,
                                      const hw::ClusterSpec& cluster) {
  const double efficiency = cluster.collectives.protocol_efficiency;
  std::vector<MemberLinks> out;
  out.reserve(ranks.size());
  for (std::int32_t r : ranks) {
    MemberLinks m;
    m.node = cluster.node_of(r);
    const bool known = r >= 0 && r < cluster.world_size();
    m.intra = known ? cluster.intra_link_of(r) : cluster.intra_node;
    m.inter = known ? cluster.inter_link_of(r) : cluster.inter_node;
    m.intra.bandwidth = m.intra.bandwidth * efficiency;
    m.inter.bandwidth = m.inter.bandwidth * efficiency;
    out.push_back(m);
  }
  return out;
}

std::vector<MemberLinks> nominal_members(const GroupShape& shape, const hw::ClusterSpec& cluster) {
  const int k = std::max(1, shape.max_ranks_per_node);
  MemberLinks nominal;
  nominal.intra = cluster.intra_node;
  nominal.inter = cluster.inter_node;
  nominal.intra.bandwidth = nominal.intra.bandwidth * cluster.collectives.protocol_efficiency;
  nominal.inter.bandwidth = nominal.inter.bandwidth * cluster.collectives.protocol_efficiency;
  std::vector<MemberLinks> members(static_cast<std::size_t>(std::max(0, shape.size)), nominal);
  for (std::size_t i = 0; i < members.size(); ++i) members[i].node = static_cast<int>(i) / k;
  return members;
}

CollectiveCost::CollectiveCost(const Schedule& schedule, std::span<const MemberLinks> members)
    : algorithm_(schedule.algorithm) {
  const std::size_t n = members.size();
  bool one_node = true;
  for (const auto& m : members) one_node = one_node && m.node == members.front().node;
  // Ports: member * 4 + (inter ? 2 : 0) + (in ? 1 : 0).
  std::vector<std::vector<std::pair<Share, std::int64_t>>> ports(4 * n);
  std::vector<std::size_t> used;
  auto add = [&](std::size_t port, const Share& s) {
    auto& parts = ports[port];
    if (parts.empty()) used.push_back(port);
    for (auto& p : parts) {
      if (p.first == s) {
        ++p.second;
        return;
      }
    }
    parts.emplace_back(s, 1);
  };
  auto link_of = [&](std::size_t port) -> const hw::LinkSpec& {
    const auto& m = members[port / 4];
    return (port & 2) != 0 ? m.inter : m.intra;
  };
  for (const auto& sp : schedule.phases) {
    used.clear();
    Time alpha;
    for (const auto& f : sp.flows) {
      if (f.src == kSwitch || f.dst == kSwitch) {
        const int member = f.src == kSwitch ? f.dst : f.src;
        const std::size_t port =
            static_cast<std::size_t>(member) * 4 + (one_node ? 0 : 2) + (f.src == kSwitch ? 1 : 0);
        add(port, f.share);
        alpha = std::max(alpha, link_of(port).latency);
        continue;
      }
      const auto src = static_cast<std::size_t>(f.src);
      const auto dst = static_cast<std::size_t>(f.dst);
      const std::size_t cls = members[src].node == members[dst].node ? 0 : 2;
      add(src * 4 + cls, f.share);
      add(dst * 4 + cls + 1, f.share);
      alpha = std::max({alpha, link_of(src * 4 + cls).latency, link_of(dst * 4 + cls).latency});
    }
    Phase phase;
    phase.latency = alpha * sp.steps;
    std::sort(used.begin(), used.end());
    for (std::size_t port : used) {
      auto& parts = ports[port];
      std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) {
        const Share& x = a.first;
        const Share& y = b.first;
        if (x.num1 != y.num1) return x.num1 < y.num1;
        if (x.den1 != y.den1) return x.den1 < y.den1;
        if (x.num2 != y.num2) return x.num2 < y.num2;
        if (x.den2 != y.den2) return x.den2 < y.den2;
        return a.second < b.second;
      });
      const Bandwidth bw = link_of(port).bandwidth;
      auto same = std::find_if(phase.loads.begin(), phase.loads.end(),
                               [&](const Load& l) { return l.parts == parts; });
      if (same == phase.loads.end()) {
        phase.loads.push_back(Load{parts, bw});
      } else if (bw < same->bandwidth) {
        same->bandwidth = bw;
      }
      parts.clear();
    }
    if (!phases_.empty()) {
      Phase& last = phases_.back();
      const bool equal = last.latency == phase.latency && last.loads.size() == phase.loads.size() &&
                         std::equal(last.loads.begin(), last.loads.end(), phase.loads.begin(),
                                    [](const Load& a, const Load& b) {
                                      return a.parts == b.parts && a.bandwidth == b.bandwidth;
                                    });
      if (equal) {
        ++last.repeat;
        continue;
      }
    }
    phases_.push_back(std::move(phase));
  }
}

Time CollectiveCost::time(Bytes size) const {
  Time total;
  for (const Phase& p : phases_) {
    Time slowest;
    for (const Load& l : p.loads) {
      std::int64_t bytes = 0;
      for (const auto& [s, count] : l.parts) bytes += s.of(size).count() * count;
      slowest = std::max(slowest, transfer_time(Bytes(bytes), l.bandwidth));
    }
    total += (slowest + p.latency) * p.repeat;
  }
  return total;
}

Time collective_time(CollectiveKind kind, CollectiveAlgorithm algorithm,
                     std::span<const std::int32_t> ranks, Bytes bytes,
                     const hw::ClusterSpec& cluster) {
  for (std::int32_t r : ranks) {
    if (r < 0 || r >= cluster.world_size()) {
      throw std::invalid_argument("collective member rank " + std::to_string(r) +
                                  " is outside the cluster's " +
                                  std::to_string(cluster.world_size()) + " devices");
    }
  }
  const auto members = member_links(ranks, cluster);
  std::vector<int> nodes;
  nodes.reserve(members.size());
  for (const auto& m : members) nodes.push_back(m.node);
  if (algorithm == CollectiveAlgorithm::automatic) {
    const GroupShape shape = shape_of_nodes(nodes);
    algorithm = choose_algorithm(
        kind, shape, bytes, cluster, cluster_switch_reduces(cluster, shape),
        [&](CollectiveAlgorithm a) {
          return CollectiveCost(build_schedule(kind, a, nodes), members).time(bytes);
        });
  }
  return CollectiveCost(build_schedule(kind, algorithm, nodes), members).time(bytes);
}

PlanTemplate plan_template(CollectiveKind kind, CollectiveAlgorithm algorithm,
                           std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster,
                           const hw::Topology& topology) {
  std::vector<int> nodes;
  std::vector<int> vertices;
  nodes.reserve(ranks.size());
  vertices.reserve(ranks.size());
  for (std::int32_t r : ranks) {
    if (r < 0 || r >= topology.device_count()) {
      throw std::invalid_argument("collective member rank " + std::to_string(r) +
                                  " is outside the topology's " +
                                  std::to_string(topology.device_count()) + " devices");
    }
    nodes.push_back(cluster.node_of(r));
    vertices.push_back(topology.vertex_of_device(r));
  }
  const Schedule schedule = build_schedule(kind, algorithm, nodes);
  PlanTemplate out;
  out.algorithm = schedule.algorithm;
  int hub = -1;
  if (schedule.algorithm == CollectiveAlgorithm::nvls && !schedule.phases.empty()) {
    hub = topology.reducing_switch(std::vector<std::int32_t>(ranks.begin(), ranks.end()));
    if (hub < 0) {
      throw std::invalid_argument(
          "nvls " + kind_name(kind) + " over " + std::to_string(ranks.size()) +
          " ranks: no switch one hop from every member reduces (a cluster topology `nvswitch` "
          "with `sharp`, or a graph vertex with `reduces`, is needed)");
    }
  }
  std::vector<int> route;
  for (const auto& sp : schedule.phases) {
    PlanTemplate::Phase phase;
    phase.flows.reserve(sp.flows.size());
    Time slowest, up, down;
    bool through_switch = false;
    for (const auto& f : sp.flows) {
      const int src = f.src == kSwitch ? hub : vertices[static_cast<std::size_t>(f.src)];
      const int dst = f.dst == kSwitch ? hub : vertices[static_cast<std::size_t>(f.dst)];
      phase.flows.push_back(PlanTemplate::Flow{src, dst, f.share});
      route.clear();
      topology.route(src, dst, 0, route);
      const Time latency = topology.latency(route);
      if (f.dst == kSwitch) {
        up = std::max(up, latency);
        through_switch = true;
      } else if (f.src == kSwitch) {
        down = std::max(down, latency);
        through_switch = true;
      } else {
        slowest = std::max(slowest, latency);
      }
    }
    phase.latency = (through_switch ? std::max(slowest, up + down) : slowest) * sp.steps;
    out.phases.push_back(std::move(phase));
  }
  return out;
}

CollectivePlan plan_collective(CollectiveKind kind, CollectiveAlgorithm algorithm,
                               std::span<const std::int32_t> ranks, Bytes bytes,
                               const hw::ClusterSpec& cluster, const hw::Topology& topology) {
  if (algorithm == CollectiveAlgorithm::automatic) {
    const GroupShape shape = shape_of(ranks, cluster);
    const bool reduces = ranks.size() > 1 && topology.reducing_switch(std::vector<std::int32_t>(
                                                 ranks.begin(), ranks.end())) >= 0;
    const auto members = member_links(ranks, cluster);
    std::vector<int> nodes;
    for (const auto& m : members) nodes.push_back(m.node);
    algorithm = choose_algorithm(kind, shape, bytes, cluster, reduces, [&](CollectiveAlgorithm a) {
      return CollectiveCost(build_schedule(kind, a, nodes), members).time(bytes);
    });
  }
  const PlanTemplate t = plan_template(kind, algorithm, ranks, cluster, topology);
  CollectivePlan plan;
  plan.algorithm = t.algorithm;
  plan.phases.reserve(t.phases.size());
  for (const auto& tp : t.phases) {
    FlowPhase phase;
    phase.latency = tp.latency;
    phase.flows.reserve(tp.flows.size());
    for (const auto& f : tp.flows) {
      phase.flows.push_back(PlannedFlow{f.src_vertex, f.dst_vertex, f.share.of(bytes)});
    }
    plan.phases.push_back(std::move(phase));
  }
  return plan;
}

}  // namespace stratasim::sim
