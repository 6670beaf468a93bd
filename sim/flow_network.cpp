#include "sim/flow_network.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace stratasim::sim {

namespace {

using hw::CollectiveAlgorithm;
using strategies::CollectiveKind;

/// splitmix64's finaliser.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// The ECMP key of flow `index` of transfer `id`.
std::uint64_t flow_key(TransferId id, std::uint64_t index) {
  return mix((static_cast<std::uint64_t>(id) << 32) ^ index);
}

/// With a symmetry: the ECMP key of flow `index` of a transfer whose key base is `base`.
std::uint64_t symmetric_key(std::uint64_t base, std::uint64_t index) {
  return mix(base ^ mix(index + 0x632be59bd9b4e019ULL));
}

/// A hash of a list of ranks, in order.
template <class RankOf>
std::uint64_t hash_ranks(const std::vector<std::int32_t>& ranks, RankOf rank_of) {
  std::uint64_t h = mix(ranks.size());
  for (std::int32_t r : ranks) h = mix(h ^ static_cast<std::uint64_t>(rank_of(r)));
  return h;
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
         static_cast<std::uint32_t>(b);
}

/// Why `replicas` is not a cyclic replica map of `world` ranks ("" when it is).
std::string replica_map_problem(const ReplicaMap& m, int world) {
  const auto w = static_cast<std::size_t>(world);
  if (m.replica.size() != w || m.next.size() != w) {
    return "the replica map covers " + std::to_string(m.replica.size()) + " ranks, not " +
           std::to_string(world);
  }
  for (std::size_t r = 0; r < w; ++r) {
    const std::int32_t n = m.next[r];
    if (n < 0 || n >= world || m.replica[r] < 0 || m.replica[r] >= m.replicas ||
        m.replica[static_cast<std::size_t>(n)] != (m.replica[r] + 1) % m.replicas) {
      return "rank " + std::to_string(r) + " has no place in the next replica";
    }
  }
  return "";
}

}  // namespace

std::optional<FlowSymmetry> flow_symmetry(const hw::ClusterSpec& cluster,
                                          const hw::Topology& topology, ReplicaMap replicas,
                                          FlowSymmetry::Mode mode, std::string& why) {
  if (cluster.network_model != hw::NetworkModel::flow) {
    why = "the cluster does not use the flow-level network";
    return std::nullopt;
  }
  if (!cluster.homogeneous()) {
    why =
        "the cluster has per-device overrides (other device types, stragglers or degraded "
        "links), so replicas differ";
    return std::nullopt;
  }
  if (cluster.load_balancing == hw::LoadBalancing::spray) {
    why = "the cluster sprays flows over equal-cost paths (load_balancing spray)";
    return std::nullopt;
  }
  if (replicas.replicas < 2) {
    why = "there is one data-parallel replica";
    return std::nullopt;
  }
  why = replica_map_problem(replicas, topology.device_count());
  if (!why.empty()) return std::nullopt;
  std::vector<int> next(replicas.next.begin(), replicas.next.end());
  auto shift = topology.automorphism(next, why, replicas.replicas);
  if (!shift) {
    why = "moving a replica onto the next is not a symmetry of the topology: " + why;
    return std::nullopt;
  }
  return FlowSymmetry{mode, std::move(replicas), std::move(*shift)};
}

FlowNetwork::FlowNetwork(const hw::ClusterSpec& cluster, hw::Topology topology,
                         const strategies::Program& program)
    : cluster_(cluster), topology_(std::move(topology)) {
  const double efficiency =
      cluster_.collectives.nccl ? 1.0 : cluster_.collectives.protocol_efficiency;
  for (int l = 0; l < topology_.link_count(); ++l) {
    solver_.add_link(topology_.link(l).bandwidth.bytes_per_second() * efficiency);
  }
  groups_.resize(program.groups().size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    GroupInfo& info = groups_[g];
    info.ranks = program.groups()[g].ranks;
    for (std::int32_t r : info.ranks) {
      if (r < 0 || r >= topology_.device_count()) {
        throw std::invalid_argument("group \"" + program.groups()[g].name + "\" has rank " +
                                    std::to_string(r) + ", but the topology has " +
                                    std::to_string(topology_.device_count()) + " devices");
      }
    }
    info.shape = shape_of(info.ranks, cluster_);
    info.members = member_links(info.ranks, cluster_);
    for (const auto& m : info.members) info.nodes.push_back(m.node);
    info.nccl = nccl_group(info.ranks, cluster_);
    info.switch_reduces = info.ranks.size() > 1 && topology_.reducing_switch(info.ranks) >= 0;
  }
}

FlowNetwork::FlowNetwork(const hw::ClusterSpec& cluster, hw::Topology topology,
                         const strategies::Program& program, FlowSymmetry symmetry)
    : FlowNetwork(cluster, std::move(topology), program) {
  const int world = topology_.device_count();
  const std::string problem = replica_map_problem(symmetry.replicas, world);
  if (!problem.empty()) throw std::invalid_argument("flow network symmetry: " + problem);
  if (spraying()) {
    throw std::invalid_argument("flow network symmetry: not with load_balancing spray");
  }
  symmetry_ = std::move(symmetry);
  const ReplicaMap& m = symmetry_->replicas;
  canonical_rank_.assign(static_cast<std::size_t>(world), -1);
  for (int r = 0; r < world; ++r) {
    if (m.replica[static_cast<std::size_t>(r)] != 0) continue;
    int at = r;
    for (int j = 0; j < m.replicas; ++j) {
      canonical_rank_[static_cast<std::size_t>(at)] = r;
      at = m.next[static_cast<std::size_t>(at)];
    }
  }
  auto canonical = [&](std::int32_t r) { return canonical_rank_[static_cast<std::size_t>(r)]; };
  auto itself = [](std::int32_t r) { return r; };
  group_symmetry_.resize(groups_.size());
  std::unordered_map<std::uint64_t, int> replica0;  // replica 0's groups by their ranks
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& ranks = groups_[g].ranks;
    GroupSymmetry& gs = group_symmetry_[g];
    gs.replica = ranks.empty() ? -1 : m.replica[static_cast<std::size_t>(ranks.front())];
    for (std::int32_t r : ranks) {
      if (m.replica[static_cast<std::size_t>(r)] != gs.replica) gs.replica = -1;
    }
    gs.tag = gs.replica >= 0 ? hash_ranks(ranks, canonical) : mix(hash_ranks(ranks, itself));
    if (gs.replica == 0) replica0.emplace(gs.tag, static_cast<int>(g));
  }
  for (GroupSymmetry& gs : group_symmetry_) {
    if (gs.replica < 0) continue;
    const auto it = replica0.find(gs.tag);
    gs.canonical = it == replica0.end() ? -1 : it->second;
  }
  // Each link's orbit under the replica move, represented by its lowest link id.
  const auto& image = symmetry_->shift.link;
  canonical_link_.assign(image.size(), -1);
  for (std::size_t l = 0; l < image.size(); ++l) {
    if (canonical_link_[l] >= 0) continue;
    auto at = static_cast<int>(l);
    do {
      canonical_link_[static_cast<std::size_t>(at)] = static_cast<int>(l);
      at = image[static_cast<std::size_t>(at)];
    } while (at != static_cast<int>(l));
  }
}

int FlowNetwork::link_representative(int link) const {
  if (!symmetry_ || symmetry_->mode != FlowSymmetry::Mode::reduce) return link;
  return canonical_link_[static_cast<std::size_t>(link)];
}

CollectiveAlgorithm FlowNetwork::algorithm(CollectiveKind kind, std::uint32_t group,
                                           Bytes bytes) const {
  if (group >= groups_.size()) {
    throw std::invalid_argument("collective on group " + std::to_string(group) +
                                ", but the program has " + std::to_string(groups_.size()) +
                                " groups");
  }
  const GroupInfo& info = groups_[group];
  if (cluster_.collectives.nccl) {
    return nccl_choose(kind, info.nccl, bytes, *cluster_.collectives.nccl,
                       cluster_.collectives.algorithm[static_cast<std::size_t>(kind)],
                       cluster_.collectives.max_channels)
        .algorithm;
  }
  return choose_algorithm(
      kind, info.shape, bytes, cluster_, info.switch_reduces, [&](CollectiveAlgorithm a) {
        auto& slot =
            info.costs[static_cast<std::size_t>(kind) * kAlgorithms + static_cast<std::size_t>(a)];
        if (!slot) {
          slot =
              std::make_unique<CollectiveCost>(build_schedule(kind, a, info.nodes), info.members);
        }
        return slot->time(bytes);
      });
}

int FlowNetwork::fixed_route(int src, int dst) {
  const std::uint64_t pair = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(src)) << 32) |
                             static_cast<std::uint32_t>(dst);
  if (const auto it = route_of_pair_.find(pair); it != route_of_pair_.end()) return it->second;
  route_.clear();
  topology_.route(src, dst, 0, route_);
  // The route is the only shortest one when no vertex along it has another link to a vertex
  // as close to `dst` as the next one (a vertex's distance: the length of a route from it).
  bool unique = true;
  for (std::size_t i = 0; i < route_.size() && unique; ++i) {
    const auto& taken = topology_.link(route_[i]);
    const auto left = route_.size() - i - 1;  // hops after this one
    for (int l : topology_.links_from(taken.from)) {
      if (l == route_[i]) continue;
      const int w = topology_.link(l).to;
      if (i > 0 && w == topology_.link(route_[i - 1]).from) continue;  // back where it came from
      probe_.clear();
      try {
        topology_.route(w, dst, 0, probe_);
      } catch (const std::invalid_argument&) {
        continue;  // dst is not reachable from there
      }
      if (probe_.size() == left) {
        unique = false;
        break;
      }
    }
  }
  int id = -1;
  if (unique) {
    id = static_cast<int>(route_offset_.size()) - 1;
    route_links_.insert(route_links_.end(), route_.begin(), route_.end());
    route_offset_.push_back(static_cast<int>(route_links_.size()));
  }
  route_of_pair_.emplace(pair, id);
  return id;
}

std::span<const int> FlowNetwork::fixed_route_links(int id) const {
  const auto begin = static_cast<std::size_t>(route_offset_[static_cast<std::size_t>(id)]);
  const auto end = static_cast<std::size_t>(route_offset_[static_cast<std::size_t>(id) + 1]);
  return std::span<const int>(route_links_).subspan(begin, end - begin);
}

const FlowNetwork::Plan& FlowNetwork::plan(std::uint32_t group, CollectiveKind kind,
                                           CollectiveAlgorithm algorithm) {
  GroupInfo& info = groups_[group];
  auto& slot = info.plans[static_cast<std::size_t>(kind) * kAlgorithms +
                          static_cast<std::size_t>(algorithm)];
  if (!slot) {
    auto p = std::make_unique<Plan>();
    p->plan = plan_template(kind, algorithm, info.ranks, cluster_, topology_);
    for (const auto& phase : p->plan.phases) {
      for (const auto& f : phase.flows) {
        p->routes.push_back(fixed_route(f.src_vertex, f.dst_vertex));
      }
    }
    if (symmetry_) plan_symmetry(group, kind, algorithm, *p);
    slot = std::move(p);
  }
  return *slot;
}

Time FlowNetwork::schedule_bandwidth_time(std::uint32_t group, CollectiveKind kind,
                                          CollectiveAlgorithm algorithm, Bytes bytes) const {
  const GroupInfo& info = groups_[group];
  auto& slot = info.costs[static_cast<std::size_t>(kind) * kAlgorithms +
                          static_cast<std::size_t>(algorithm)];
  if (!slot) {
    slot =
        std::make_unique<CollectiveCost>(build_schedule(kind, algorithm, info.nodes), info.members);
  }
  return slot->time(bytes) - slot->time(Bytes(0));
}

void FlowNetwork::schedule(int transfer, Time at) {
  timers_.push_back(Timer{at, sequence_++, transfer});
  std::push_heap(timers_.begin(), timers_.end(), Later{});
}

void FlowNetwork::start(TransferId id, const TransferRequest& given, Time now) {
  // Bounded loss: the network carries what must be delivered; the dropped tail is never sent.
  TransferRequest request = given;
  request.bytes = given.delivered();
  if (now < now_) {
    throw std::logic_error("flow network: transfer " + std::to_string(id) + " started at " +
                           to_string(now) + ", before the network's time " + to_string(now_));
  }
  now_ = now;
  int slot;
  if (!free_transfers_.empty()) {
    slot = free_transfers_.back();
    free_transfers_.pop_back();
  } else {
    slot = static_cast<int>(transfers_.size());
    transfers_.emplace_back();
  }
  Transfer& t = transfers_[static_cast<std::size_t>(slot)];
  t.id = id;
  t.rate = 1;
  t.flows.clear();
  if (rates_) {
    if (slot_of_.size() <= id) slot_of_.resize(static_cast<std::size_t>(id) + 1, -1);
    slot_of_[id] = slot;
  }
  t.bytes = request.bytes;
  t.phase = 0;
  t.outstanding = 0;
  t.route.clear();
  t.scale = 1;
  t.nccl = false;
  t.key = 0;
  t.replica = -1;
  t.copies = 1;
  t.cls = flow_class(request.priority);
  t.spray = -1;
  if (symmetry_) symmetric_start(t, request);
  if (request.collective && cluster_.collectives.nccl) {
    (void)algorithm(request.kind, request.group, request.bytes);  // throws for an unknown group
    const GroupInfo& info = groups_[request.group];
    const NcclEstimate e =
        nccl_choose(request.kind, info.nccl, request.bytes, *cluster_.collectives.nccl,
                    cluster_.collectives.algorithm[static_cast<std::size_t>(request.kind)],
                    cluster_.collectives.max_channels);
    const bool spans = info.shape.nodes > 1 && info.shape.max_ranks_per_node > 1;
    const bool rs_ag = request.kind == CollectiveKind::all_reduce ||
                       request.kind == CollectiveKind::reduce_scatter ||
                       request.kind == CollectiveKind::all_gather;
    CollectiveAlgorithm carrier = CollectiveAlgorithm::ring;
    if (e.algorithm == CollectiveAlgorithm::nvls && info.switch_reduces) {
      carrier = CollectiveAlgorithm::nvls;
    } else if (spans && rs_ag && e.algorithm != CollectiveAlgorithm::nvls) {
      carrier = CollectiveAlgorithm::hierarchical;
    } else if (e.algorithm == CollectiveAlgorithm::tree) {
      carrier = CollectiveAlgorithm::tree;
    }
    const Plan& p = plan(request.group, request.kind, carrier);
    t.plan = &p;
    t.nccl = true;
    const Time own = schedule_bandwidth_time(request.group, request.kind, carrier, request.bytes);
    const Time model = e.time - e.latency;
    if (own > Time::zero()) t.scale = model.seconds() / own.seconds();
    schedule(slot, now + e.latency);
    return;
  }
  if (request.collective) {
    const CollectiveAlgorithm a = algorithm(request.kind, request.group, request.bytes);
    const Plan& p = plan(request.group, request.kind, a);
    t.plan = &p;
    const Time latency = p.plan.phases.empty() ? Time::zero() : p.plan.phases.front().latency;
    schedule(slot, now + latency);
    return;
  }
  t.plan = nullptr;
  t.nccl = !request.copy_engine;  // NCCL's point-to-point efficiency applies
  t.src = request.src;
  t.dst = request.dst;
  for (std::int32_t r : {request.src, request.dst}) {
    if (r < 0 || r >= topology_.device_count()) {
      throw std::invalid_argument("point-to-point transfer " + std::to_string(id) + " names rank " +
                                  std::to_string(r) + ", but the topology has " +
                                  std::to_string(topology_.device_count()) + " devices");
    }
  }
  const int src = topology_.vertex_of_device(request.src);
  const int dst = topology_.vertex_of_device(request.dst);
  const int fixed = fixed_route(src, dst);
  if (fixed >= 0) {
    const auto links = fixed_route_links(fixed);
    t.route.assign(links.begin(), links.end());
  } else if (spraying()) {
    t.spray = spray_paths(src, dst);
    t.route = spray_sets_[static_cast<std::size_t>(t.spray)].front();  // for its latency
  } else if (symmetry_) {
    // Replica 0's message at this place, shifted to this replica.
    const int back = symmetry_->replicas.replicas - t.replica;
    route_.clear();
    topology_.route(shift_vertex(src, back), shift_vertex(dst, back), symmetric_key(t.key, 0),
                    route_);
    shift_route(route_, t.replica, t.route);
  } else {
    topology_.route(src, dst, flow_key(id, 0), t.route);
  }
  schedule(slot, now + topology_.latency(t.route));
}

void FlowNetwork::on_timer(int slot, std::vector<TransferId>& finished) {
  Transfer& t = transfers_[static_cast<std::size_t>(slot)];
  if (t.plan == nullptr) {
    if (t.phase == 0) {
      t.phase = 1;
      if (t.bytes.count() > 0 && !t.route.empty()) {
        const double scale = cluster_.collectives.nccl && t.nccl
                                 ? 1.0 / nccl_p2p_efficiency(t.src, t.dst, t.bytes, cluster_)
                                 : 1.0;
        const double bytes = static_cast<double>(t.bytes.count()) * scale;
        if (t.spray >= 0) {
          t.outstanding = start_sprayed(slot, t.spray, bytes);
        } else {
          start_flow(slot, t.route, bytes);
          t.outstanding = 1;
        }
        return;
      }
    }
    finished.push_back(t.id);
    if (rates_) slot_of_[t.id] = -1;
    free_transfers_.push_back(slot);
    return;
  }
  const auto& phases = t.plan->plan.phases;
  if (t.phase >= phases.size()) {
    finished.push_back(t.id);
    if (rates_) slot_of_[t.id] = -1;
    t.plan = nullptr;
    free_transfers_.push_back(slot);
    return;
  }
  t.flows.clear();
  // The plan's flows are numbered phase by phase: this phase's first one.
  const std::size_t first = first_of_phase(t);
  const PlanTemplate::Phase& phase = phases[t.phase];
  const bool orbits = symmetry_ && t.replica < 0;
  if (orbits) phase_routes(t, first, phase);
  if (orbits && symmetry_->mode == FlowSymmetry::Mode::reduce) {
    start_orbits(slot, phase);
    if (t.outstanding == 0) phase_done(slot);
    return;
  }
  for (std::size_t i = 0; i < phase.flows.size(); ++i) {
    const auto& f = phase.flows[i];
    const Bytes bytes = f.share.of(t.bytes);
    if (bytes.count() <= 0) continue;
    const int fixed = t.plan->routes[first + i];
    if (fixed < 0 && spraying()) {
      t.outstanding += start_sprayed(slot, spray_paths(f.src_vertex, f.dst_vertex),
                                     static_cast<double>(bytes.count()) * t.scale);
      continue;
    }
    std::span<const int> route;
    if (fixed >= 0) {
      route = fixed_route_links(fixed);
    } else if (orbits) {
      const auto begin = static_cast<std::size_t>(phase_offset_[i]);
      route = std::span<const int>(phase_links_)
                  .subspan(begin, static_cast<std::size_t>(phase_offset_[i + 1]) - begin);
    } else {
      route_.clear();
      keyed_route(t, first + i, f, route_);
      route = route_;
    }
    start_flow(slot, route, static_cast<double>(bytes.count()) * t.scale);
    ++t.outstanding;
  }
  if (t.outstanding == 0) phase_done(slot);
}

void FlowNetwork::start_orbits(int slot, const PlanTemplate::Phase& phase) {
  Transfer& t = transfers_[static_cast<std::size_t>(slot)];
  const auto& order = t.plan->orbit_order[t.phase];
  auto route_of = [&](int i) {
    const auto begin = static_cast<std::size_t>(phase_offset_[static_cast<std::size_t>(i)]);
    const auto end = static_cast<std::size_t>(phase_offset_[static_cast<std::size_t>(i) + 1]);
    return std::span<const int>(phase_links_).subspan(begin, end - begin);
  };
  const std::size_t first = first_of_phase(t);
  // `order` lists each orbit's first flow, then the rest of that orbit.
  for (std::size_t at = 0; at < order.size();) {
    const int head = order[at];
    std::size_t end = at + 1;
    while (end < order.size() &&
           t.plan->shifted_from[first + static_cast<std::size_t>(order[end])] >= 0) {
      ++end;
    }
    const Bytes bytes = phase.flows[static_cast<std::size_t>(head)].share.of(t.bytes);
    if (bytes.count() > 0) {
      merged_.clear();
      for (std::size_t m = at; m < end; ++m) {
        for (int l : route_of(order[m])) {
          if (canonical_link_[static_cast<std::size_t>(l)] == l) merged_.push_back(l);
        }
      }
      count_links();
      start_weighted(slot, merged_, weights_, static_cast<int>(end - at),
                     static_cast<double>(bytes.count()) * t.scale);
      ++t.outstanding;
    }
    at = end;
  }
}

std::size_t FlowNetwork::first_of_phase(const Transfer& t) const {
  std::size_t first = 0;
  for (std::size_t p = 0; p < t.phase; ++p) first += t.plan->plan.phases[p].flows.size();
  return first;
}

void FlowNetwork::start_flow(int slot, std::span<const int> route, double bytes) {
  const int copies = transfers_[static_cast<std::size_t>(slot)].copies;
  if (copies > 1) {
    copies_route(route);
    start_weighted(slot, merged_, weights_, copies, bytes);
  } else {
    start_weighted(slot, route, {}, 1, bytes);
  }
}

void FlowNetwork::start_weighted(int slot, std::span<const int> route, std::span<const int> weights,
                                 int copies, double bytes) {
  // The tag: the transfer's slot, and above it the copies the flow stands for (when several).
  const std::uint64_t tag =
      static_cast<std::uint64_t>(slot) |
      (copies > 1 ? static_cast<std::uint64_t>(copies) << 32 : std::uint64_t{0});
  const int flow = solver_.start_flow(route, bytes, now_, tag, weights,
                                      transfers_[static_cast<std::size_t>(slot)].cls);
  ++flows_started_;
  if (!rates_) return;
  Transfer& t = transfers_[static_cast<std::size_t>(slot)];
  t.flows.emplace_back(flow, solver_.sequence(flow));
  if (t.rate < 1) solver_.set_rate_factor(flow, t.rate);
}

void FlowNetwork::set_transport(const strategies::TransportPolicy& policy) {
  class_weights_.clear();
  if (policy.classed() && policy.scheduling == strategies::LinkScheduling::weighted) {
    class_weights_ = policy.weights;
  }
}

FlowClass FlowNetwork::flow_class(std::int64_t priority) const {
  if (priority <= 0) return class_weights_.empty() ? FlowClass{} : FlowClass{0, class_weights_[0]};
  if (class_weights_.empty()) return FlowClass{priority, 1.0};
  const auto c = std::min(static_cast<std::size_t>(priority), class_weights_.size() - 1);
  return FlowClass{0, class_weights_[c]};
}

int FlowNetwork::spray_paths(int src, int dst) {
  const std::uint64_t pair = pair_key(src, dst);
  if (const auto it = spray_of_pair_.find(pair); it != spray_of_pair_.end()) return it->second;
  // Hop distances to dst (a shortest route's length), asked once per vertex.
  std::unordered_map<int, std::size_t> distance;
  auto hops = [&](int v) -> std::size_t {
    if (const auto it = distance.find(v); it != distance.end()) return it->second;
    probe_.clear();
    std::size_t d = static_cast<std::size_t>(-1);
    try {
      topology_.route(v, dst, 0, probe_);
      d = probe_.size();
    } catch (const std::invalid_argument&) {
      // dst is not reachable from v
    }
    distance.emplace(v, d);
    return d;
  };
  std::vector<std::vector<int>> paths;
  std::vector<int> path;
  // Depth first over the out-links one hop closer, in insertion order.
  auto walk = [&](auto&& self, int at) -> void {
    if (at == dst) {
      if (paths.size() >= kMaxSprayPaths) {
        throw std::invalid_argument("load_balancing spray: more than " +
                                    std::to_string(kMaxSprayPaths) + " equal-cost paths from " +
                                    topology_.name(src) + " to " + topology_.name(dst) +
                                    "; use \"ecmp\" on this topology");
      }
      paths.push_back(path);
      return;
    }
    const std::size_t left = hops(at);
    for (int l : topology_.links_from(at)) {
      const int next = topology_.link(l).to;
      if (hops(next) + 1 != left) continue;
      path.push_back(l);
      self(self, next);
      path.pop_back();
    }
  };
  walk(walk, src);
  const auto id = static_cast<int>(spray_sets_.size());
  spray_sets_.push_back(std::move(paths));
  spray_of_pair_.emplace(pair, id);
  return id;
}

int FlowNetwork::start_sprayed(int slot, int paths, double bytes) {
  const auto& set = spray_sets_[static_cast<std::size_t>(paths)];
  const double each = bytes / static_cast<double>(set.size());
  for (const auto& path : set) start_flow(slot, path, each);
  return static_cast<int>(set.size());
}

bool FlowNetwork::enable_rates() {
  rates_ = cluster_.interference.flow_transfers;
  return rates_;
}

void FlowNetwork::set_rate(TransferId id, double rate, Time now) {
  if (!rates_ || id >= slot_of_.size() || slot_of_[id] < 0) return;
  if (now < now_) {
    throw std::logic_error("flow network: transfer " + std::to_string(id) + " re-rated at " +
                           to_string(now) + ", before the network's time " + to_string(now_));
  }
  now_ = now;
  Transfer& t = transfers_[static_cast<std::size_t>(slot_of_[id])];
  t.rate = rate;
  for (const auto& [flow, sequence] : t.flows) {
    if (solver_.active(flow) && solver_.sequence(flow) == sequence) {
      solver_.set_rate_factor(flow, rate);
    }
  }
}

void FlowNetwork::phase_done(int slot) {
  Transfer& t = transfers_[static_cast<std::size_t>(slot)];
  if (t.plan == nullptr) {
    schedule(slot, now_);  // a point-to-point message: finish
    return;
  }
  ++t.phase;
  const auto& phases = t.plan->plan.phases;
  const Time latency = t.phase < phases.size() && !t.nccl ? phases[t.phase].latency : Time::zero();
  schedule(slot, now_ + latency);
}

Time FlowNetwork::next_completion() const {
  const Time flows = solver_.next_completion(now_);
  const Time timers = timers_.empty() ? Time::infinity() : timers_.front().at;
  return std::min(flows, timers);
}

void FlowNetwork::advance_to(Time t, std::vector<TransferId>& finished) {
  for (;;) {
    const Time flows = solver_.next_completion(now_);
    const Time timers = timers_.empty() ? Time::infinity() : timers_.front().at;
    const Time at = std::min(flows, timers);
    if (at > t || at == Time::infinity()) break;
    now_ = at;
    if (flows == at) {
      done_tags_.clear();
      solver_.take_completions(at, [&](int flow, std::span<const int> route, double bytes,
                                       Time start, std::uint64_t tag) {
        done_tags_.push_back(tag);
        if (observer_ != nullptr) {
          const auto copies = static_cast<int>(tag >> 32);
          observer_->on_flow(route, solver_.weights(flow), std::max(copies, 1),
                             Bytes(std::llround(bytes)), start, at);
        }
      });
      for (std::uint64_t tag : done_tags_) {
        const auto slot = static_cast<int>(tag & 0xffffffffU);
        if (--transfers_[static_cast<std::size_t>(slot)].outstanding == 0) phase_done(slot);
      }
    }
    while (!timers_.empty() && timers_.front().at == at) {
      std::pop_heap(timers_.begin(), timers_.end(), Later{});
      const int slot = timers_.back().transfer;
      timers_.pop_back();
      on_timer(slot, finished);
    }
  }
  if (t > now_ && t != Time::infinity()) now_ = t;
}

void FlowNetwork::symmetric_start(Transfer& t, const TransferRequest& request) {
  const ReplicaMap& m = symmetry_->replicas;
  const bool reduce = symmetry_->mode == FlowSymmetry::Mode::reduce;
  if (request.collective) {
    if (request.group >= group_symmetry_.size()) return;  // algorithm() reports it
    GroupSymmetry& gs = group_symmetry_[request.group];
    t.replica = gs.replica;
    t.key = mix(gs.tag ^ mix(gs.count++));
  } else {
    const auto world = static_cast<std::int32_t>(canonical_rank_.size());
    if (request.src < 0 || request.src >= world || request.dst < 0 || request.dst >= world) {
      return;  // start() reports it
    }
    const std::int32_t rs = m.replica[static_cast<std::size_t>(request.src)];
    if (rs != m.replica[static_cast<std::size_t>(request.dst)]) {
      throw SymmetryBroken("a message from rank " + std::to_string(request.src) + " to rank " +
                           std::to_string(request.dst) + " crosses data-parallel replicas");
    }
    t.replica = rs;
    const std::uint32_t count = pair_count_[pair_key(request.src, request.dst)]++;
    t.key = mix(mix(pair_key(canonical_rank_[static_cast<std::size_t>(request.src)],
                             canonical_rank_[static_cast<std::size_t>(request.dst)])) ^
                mix(count));
  }
  if (reduce && t.replica > 0) {
    throw SymmetryBroken("replica " + std::to_string(t.replica) +
                         " started a transfer in a run that simulates replica 0 for all");
  }
  if (reduce && t.replica == 0) t.copies = m.replicas;
}

void FlowNetwork::plan_symmetry(std::uint32_t group, CollectiveKind kind,
                                CollectiveAlgorithm algorithm, Plan& p) {
  const GroupSymmetry& gs = group_symmetry_[group];
  if (gs.replica < 0) {
    make_orbits(p);
    return;
  }
  if (gs.replica == 0) return;
  // Replica r's plan must be replica 0's, shifted r times, flow for flow.
  const std::string which = "the " + std::string(strategies::name_of(kind)) + " plan of group " +
                            std::to_string(group) + " in replica " + std::to_string(gs.replica);
  if (gs.canonical < 0) throw SymmetryBroken(which + " has no counterpart in replica 0");
  const Plan& base = plan(static_cast<std::uint32_t>(gs.canonical), kind, algorithm);
  bool same = base.plan.phases.size() == p.plan.phases.size();
  for (std::size_t ph = 0; same && ph < p.plan.phases.size(); ++ph) {
    const auto& a = base.plan.phases[ph].flows;
    const auto& b = p.plan.phases[ph].flows;
    same = a.size() == b.size() && base.plan.phases[ph].latency == p.plan.phases[ph].latency;
    for (std::size_t i = 0; same && i < a.size(); ++i) {
      same = shift_vertex(a[i].src_vertex, gs.replica) == b[i].src_vertex &&
             shift_vertex(a[i].dst_vertex, gs.replica) == b[i].dst_vertex &&
             a[i].share == b[i].share;
    }
  }
  if (!same) throw SymmetryBroken(which + " is not replica 0's moved onto it");
}

void FlowNetwork::make_orbits(Plan& p) const {
  const int k = symmetry_->replicas.replicas;
  for (const auto& phase : p.plan.phases) {
    const auto& flows = phase.flows;
    const std::size_t base = p.shifted_from.size();
    p.shifted_from.resize(base + flows.size(), -2);  // -2: not placed yet
    auto& order = p.orbit_order.emplace_back();
    std::unordered_multimap<std::uint64_t, int> by_ends;
    for (std::size_t i = 0; i < flows.size(); ++i) {
      by_ends.emplace(pair_key(flows[i].src_vertex, flows[i].dst_vertex), static_cast<int>(i));
    }
    for (std::size_t i = 0; i < flows.size(); ++i) {
      if (p.shifted_from[base + i] != -2) continue;
      p.shifted_from[base + i] = -1;
      order.push_back(static_cast<int>(i));
      int at = static_cast<int>(i);
      for (int times = 1;; ++times) {
        const auto& f = flows[static_cast<std::size_t>(at)];
        const int src = shift_vertex(f.src_vertex, 1), dst = shift_vertex(f.dst_vertex, 1);
        if (src == flows[i].src_vertex && dst == flows[i].dst_vertex) break;  // round
        int next = -1;
        const auto [lo, hi] = by_ends.equal_range(pair_key(src, dst));
        for (auto it = lo; it != hi && next < 0; ++it) {
          const auto j = static_cast<std::size_t>(it->second);
          if (p.shifted_from[base + j] == -2 && flows[j].share == f.share) next = it->second;
        }
        if (next < 0 || times >= k) {
          throw SymmetryBroken(
              "a collective's flows across data-parallel replicas do not map onto each other "
              "when replicas move by one");
        }
        p.shifted_from[base + static_cast<std::size_t>(next)] = at;
        order.push_back(next);
        at = next;
      }
    }
  }
}

void FlowNetwork::keyed_route(const Transfer& t, std::size_t index, const PlanTemplate::Flow& f,
                              std::vector<int>& out) {
  if (!symmetry_) {
    topology_.route(f.src_vertex, f.dst_vertex, flow_key(t.id, index), out);
    return;
  }
  const std::uint64_t key = symmetric_key(t.key, index);
  if (t.replica <= 0) {  // replica 0, or an orbit's first flow
    topology_.route(f.src_vertex, f.dst_vertex, key, out);
    return;
  }
  // Replica 0's flow at this place, shifted to this replica.
  const int back = symmetry_->replicas.replicas - t.replica;
  probe_.clear();
  topology_.route(shift_vertex(f.src_vertex, back), shift_vertex(f.dst_vertex, back), key, probe_);
  shift_route(probe_, t.replica, out);
}

void FlowNetwork::phase_routes(const Transfer& t, std::size_t first,
                               const PlanTemplate::Phase& phase) {
  const std::size_t n = phase.flows.size();
  // Route each orbit's first flow by its key and every other as its predecessor shifted once,
  // in orbit order, then lay the routes out in plan order.
  const std::size_t ph = t.phase;
  auto& routes = orbit_routes_;
  if (routes.size() < n) routes.resize(n);
  for (int i : t.plan->orbit_order[ph]) {
    const auto u = static_cast<std::size_t>(i);
    routes[u].clear();
    const int fixed = t.plan->routes[first + u];
    const int from = t.plan->shifted_from[first + u];
    if (fixed >= 0) {
      const auto links = fixed_route_links(fixed);
      routes[u].assign(links.begin(), links.end());
    } else if (from < 0) {
      keyed_route(t, first + u, phase.flows[u], routes[u]);
    } else {
      shift_route(routes[static_cast<std::size_t>(from)], 1, routes[u]);
    }
  }
  phase_links_.clear();
  phase_offset_.assign(1, 0);
  for (std::size_t u = 0; u < n; ++u) {
    const auto& r = routes[u];
    phase_links_.insert(phase_links_.end(), r.begin(), r.end());
    phase_offset_.push_back(static_cast<int>(phase_links_.size()));
  }
}

int FlowNetwork::shift_vertex(int vertex, int times) const {
  const auto& image = symmetry_->shift.vertex;
  times %= symmetry_->replicas.replicas;  // k moves are none
  for (int i = 0; i < times; ++i) vertex = image[static_cast<std::size_t>(vertex)];
  return vertex;
}

void FlowNetwork::shift_route(std::span<const int> route, int times, std::vector<int>& out) const {
  const auto& image = symmetry_->shift.link;
  out.assign(route.begin(), route.end());
  times %= symmetry_->replicas.replicas;
  for (int i = 0; i < times; ++i) {
    for (int& l : out) l = image[static_cast<std::size_t>(l)];
  }
}

void FlowNetwork::copies_route(std::span<const int> route) {
  const auto& image = symmetry_->shift.link;
  shifted_.assign(route.begin(), route.end());
  merged_.clear();
  for (int j = 0; j < symmetry_->replicas.replicas; ++j) {
    if (j > 0) {
      for (int& l : shifted_) l = image[static_cast<std::size_t>(l)];
    }
    for (int l : shifted_) {
      if (canonical_link_[static_cast<std::size_t>(l)] == l) merged_.push_back(l);
    }
  }
  count_links();
}

void FlowNetwork::count_links() {
  std::sort(merged_.begin(), merged_.end());
  weights_.clear();
  std::size_t out = 0;
  for (std::size_t i = 0; i < merged_.size(); ++i) {
    if (out > 0 && merged_[out - 1] == merged_[i]) {
      ++weights_.back();
    } else {
      merged_[out++] = merged_[i];
      weights_.push_back(1);
    }
  }
  merged_.resize(out);
}

LinkUsage::LinkUsage(const FlowNetwork& network) {
  const int links = network.topology().link_count();
  capacity_.reserve(static_cast<std::size_t>(links));
  representative_.reserve(static_cast<std::size_t>(links));
  for (int l = 0; l < links; ++l) {
    capacity_.push_back(network.capacity(l));
    representative_.push_back(network.link_representative(l));
  }
  bytes_.assign(static_cast<std::size_t>(links), Bytes(0));
}

void LinkUsage::on_flow(std::span<const int> route_links, std::span<const int> weights, int copies,
                        Bytes bytes, Time start, Time end) {
  (void)start;
  (void)end;
  flows_ += static_cast<std::uint64_t>(copies);
  for (std::size_t i = 0; i < route_links.size(); ++i) {
    const auto l = static_cast<std::size_t>(route_links[i]);
    bytes_[l] += weights.empty() ? bytes : Bytes(bytes.count() * weights[i]);
  }
}

double LinkUsage::utilisation(int link, Time span) const {
  const double seconds = span.seconds();
  if (!(seconds > 0)) return 0;
  const auto l = static_cast<std::size_t>(link);
  return static_cast<double>(bytes(link).count()) / (capacity_[l] * seconds);
}

std::vector<LinkUsage::Busy> LinkUsage::busiest(Time span, std::size_t count) const {
  std::vector<Busy> all;
  for (std::size_t l = 0; l < bytes_.size(); ++l) {
    const Bytes b = bytes(static_cast<int>(l));
    if (b.count() <= 0) continue;
    all.push_back(Busy{static_cast<int>(l), b, utilisation(static_cast<int>(l), span)});
  }
  const std::size_t keep = std::min(count, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keep), all.end(),
                    [](const Busy& a, const Busy& b) {
                      return a.utilisation != b.utilisation ? a.utilisation > b.utilisation
                                                            : a.link < b.link;
                    });
  all.resize(keep);
  return all;
}

}  // namespace stratasim::sim
