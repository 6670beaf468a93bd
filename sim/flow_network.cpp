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

}  // namespace

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

void FlowNetwork::start(TransferId id, const TransferRequest& request, Time now) {
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
        start_flow(slot, t.route, static_cast<double>(t.bytes.count()) * scale);
        t.outstanding = 1;
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
  std::size_t first = 0;
  for (std::size_t p = 0; p < t.phase; ++p) first += phases[p].flows.size();
  const PlanTemplate::Phase& phase = phases[t.phase];
  for (std::size_t i = 0; i < phase.flows.size(); ++i) {
    const auto& f = phase.flows[i];
    const Bytes bytes = f.share.of(t.bytes);
    if (bytes.count() <= 0) continue;
    const int fixed = t.plan->routes[first + i];
    std::span<const int> route;
    if (fixed >= 0) {
      route = fixed_route_links(fixed);
    } else {
      route_.clear();
      topology_.route(f.src_vertex, f.dst_vertex, flow_key(t.id, first + i), route_);
      route = route_;
    }
    start_flow(slot, route, static_cast<double>(bytes.count()) * t.scale);
    ++t.outstanding;
  }
  if (t.outstanding == 0) phase_done(slot);
}

void FlowNetwork::start_flow(int slot, std::span<const int> route, double bytes) {
  const int flow = solver_.start_flow(route, bytes, now_, static_cast<std::uint64_t>(slot));
  ++flows_started_;
  if (!rates_) return;
  Transfer& t = transfers_[static_cast<std::size_t>(slot)];
  t.flows.emplace_back(flow, solver_.sequence(flow));
  if (t.rate < 1) solver_.set_rate_factor(flow, t.rate);
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
      solver_.take_completions(
          at, [&](int, std::span<const int> route, double bytes, Time start, std::uint64_t tag) {
            done_tags_.push_back(tag);
            if (observer_ != nullptr) {
              observer_->on_flow(route, Bytes(std::llround(bytes)), start, at);
            }
          });
      for (std::uint64_t tag : done_tags_) {
        const int slot = static_cast<int>(tag);
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

LinkUsage::LinkUsage(const FlowNetwork& network) {
  const int links = network.topology().link_count();
  capacity_.reserve(static_cast<std::size_t>(links));
  for (int l = 0; l < links; ++l) capacity_.push_back(network.capacity(l));
  bytes_.assign(static_cast<std::size_t>(links), Bytes(0));
}

void LinkUsage::on_flow(std::span<const int> route_links, Bytes bytes, Time start, Time end) {
  (void)start;
  (void)end;
  ++flows_;
  for (int l : route_links) bytes_[static_cast<std::size_t>(l)] += bytes;
}

double LinkUsage::utilisation(int link, Time span) const {
  const double seconds = span.seconds();
  if (!(seconds > 0)) return 0;
  const auto l = static_cast<std::size_t>(link);
  return static_cast<double>(bytes_[l].count()) / (capacity_[l] * seconds);
}

std::vector<LinkUsage::Busy> LinkUsage::busiest(Time span, std::size_t count) const {
  std::vector<Busy> all;
  for (std::size_t l = 0; l < bytes_.size(); ++l) {
    if (bytes_[l].count() <= 0) continue;
    all.push_back(Busy{static_cast<int>(l), bytes_[l], utilisation(static_cast<int>(l), span)});
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
