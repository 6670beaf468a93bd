#include "sim/network.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "sim/flow_network.hpp"
#include "sim/nccl_model.hpp"

namespace stratasim::sim {

namespace {

using hw::CollectiveAlgorithm;
using strategies::CollectiveKind;

}  // namespace

std::unique_ptr<Network> make_network(const hw::ClusterSpec& cluster,
                                      const strategies::Program& program) {
  if (cluster.network_model == hw::NetworkModel::flow) {
    return std::make_unique<FlowNetwork>(cluster, hw::build_topology(cluster), program);
  }
  return std::make_unique<AnalyticalNetwork>(cluster, program);
}

AnalyticalNetwork::AnalyticalNetwork(const hw::ClusterSpec& cluster) : cluster_(cluster) {
  if (const hw::DeviceProfile* profile = cluster_.device.profile.get()) {
    for (const auto& row : profile->collectives) {
      nominal_measured_[{row.kind, row.ranks}] = measured_curve(profile, row.kind, row.ranks);
    }
  }
}

AnalyticalNetwork::AnalyticalNetwork(const hw::ClusterSpec& cluster,
                                     const strategies::Program& program)
    : AnalyticalNetwork(cluster) {
  // An explicit graph may hold reducing switches: ask its topology which groups they serve.
  // Otherwise the cluster's topology section says (nvswitch with sharp), without building it.
  std::optional<hw::Topology> graph;
  if (cluster_.topology && cluster_.topology->kind == hw::TopologyKind::graph &&
      std::any_of(cluster_.topology->vertices.begin(), cluster_.topology->vertices.end(),
                  [](const hw::ExplicitVertex& v) { return v.reduces; })) {
    graph = hw::build_topology(cluster_);
  }
  groups_.resize(program.groups().size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& ranks = program.groups()[g].ranks;
    GroupInfo& info = groups_[g];
    info.members = member_links(ranks, cluster_);
    info.nodes.reserve(ranks.size());
    for (const auto& m : info.members) info.nodes.push_back(m.node);
    info.shape = shape_of(ranks, cluster_);
    info.nccl = nccl_group(ranks, cluster_);
    info.switch_reduces =
        graph
            ? info.shape.nodes <= 1 && ranks.size() > 1 &&
                  graph->reducing_switch(std::vector<std::int32_t>(ranks.begin(), ranks.end())) >= 0
            : cluster_switch_reduces(cluster_, info.shape);
    // Measured collectives: a group within one node, every member with the same profile and
    // the nominal intra-node link.
    if (info.shape.nodes <= 1 && ranks.size() > 1) {
      const hw::DeviceProfile* profile = cluster_.device_of(ranks.front()).profile.get();
      auto uniform = [&] {
        return std::all_of(ranks.begin(), ranks.end(), [&](std::int32_t r) {
          return cluster_.device_of(r).profile.get() == profile &&
                 &cluster_.intra_link_of(r) == &cluster_.intra_node;
        });
      };
      if (profile != nullptr && !profile->collectives.empty() && uniform()) {
        for (std::size_t k = 0; k < kKinds; ++k) {
          info.measured[k] = measured_curve(profile, k, static_cast<int>(ranks.size()));
        }
      }
    }
  }
}

const hw::CollectiveCurve* AnalyticalNetwork::measured_curve(const hw::DeviceProfile* profile,
                                                             std::size_t kind, int ranks) {
  const auto key = std::tuple{profile, kind, ranks};
  auto it = curves_.find(key);
  if (it == curves_.end()) it = curves_.emplace(key, profile->collective_curve(kind, ranks)).first;
  return it->second.empty() ? nullptr : &it->second;
}

const AnalyticalNetwork::GroupInfo& AnalyticalNetwork::group(std::uint32_t group) const {
  if (group >= groups_.size()) {
    throw std::invalid_argument("collective on group " + std::to_string(group) +
                                ", but the program has " + std::to_string(groups_.size()) +
                                " groups");
  }
  return groups_[group];
}

Time AnalyticalNetwork::collective_time(CollectiveKind kind, const GroupShape& shape,
                                        Bytes bytes) const {
  if (shape.size <= 1) return Time::zero();
  if (shape.nodes <= 1) {
    const auto it = nominal_measured_.find({static_cast<std::size_t>(kind), shape.size});
    if (it != nominal_measured_.end()) return hw::interpolate_collective(*it->second, bytes);
  }
  if (cluster_.collectives.nccl) {
    NcclGroup g;
    g.ranks = shape.size;
    g.nodes = shape.nodes;
    g.ranks_per_node = shape.max_ranks_per_node;
    g.intra = cluster_.intra_node.bandwidth;
    g.nic = cluster_.inter_node.bandwidth;
    return nccl_choose(kind, g, bytes, *cluster_.collectives.nccl,
                       cluster_.collectives.algorithm[static_cast<std::size_t>(kind)],
                       cluster_.collectives.max_channels)
        .time;
  }
  const auto members = nominal_members(shape, cluster_);
  std::vector<int> nodes;
  nodes.reserve(members.size());
  for (const auto& m : members) nodes.push_back(m.node);
  const CollectiveAlgorithm algorithm =
      choose_algorithm(kind, shape, bytes, cluster_, cluster_switch_reduces(cluster_, shape));
  return CollectiveCost(build_schedule(kind, algorithm, nodes), members).time(bytes);
}

const CollectiveCost& AnalyticalNetwork::cost(std::uint32_t g, CollectiveKind kind,
                                              CollectiveAlgorithm a) const {
  GroupInfo& info = groups_[g];
  auto& slot =
      info.costs[static_cast<std::size_t>(kind) * kAlgorithms + static_cast<std::size_t>(a)];
  if (!slot) {
    slot = std::make_unique<CollectiveCost>(build_schedule(kind, a, info.nodes), info.members);
  }
  return *slot;
}

CollectiveAlgorithm AnalyticalNetwork::algorithm(CollectiveKind kind, std::uint32_t g,
                                                 Bytes bytes) const {
  const GroupInfo& info = group(g);
  if (cluster_.collectives.nccl) return nccl_estimate(kind, g, bytes).algorithm;
  return choose_algorithm(kind, info.shape, bytes, cluster_, info.switch_reduces,
                          [&](CollectiveAlgorithm a) { return cost(g, kind, a).time(bytes); });
}

Time AnalyticalNetwork::collective_time(CollectiveKind kind, std::uint32_t g, Bytes bytes) const {
  const GroupInfo& info = group(g);
  if (info.shape.size <= 1) return Time::zero();
  if (const hw::CollectiveCurve* measured = info.measured[static_cast<std::size_t>(kind)]) {
    return hw::interpolate_collective(*measured, bytes);
  }
  if (cluster_.collectives.nccl) return nccl_estimate(kind, g, bytes).time;
  const CollectiveAlgorithm a = algorithm(kind, g, bytes);
  if (a == CollectiveAlgorithm::nvls && !info.switch_reduces) {
    throw std::invalid_argument(
        "nvls " + std::string(strategies::name_of(kind)) + " over " +
        std::to_string(info.shape.size) + " ranks on " + std::to_string(info.shape.nodes) +
        " node(s): no switch one hop from every member reduces (a cluster topology `nvswitch` "
        "with `sharp` and a group within one node, or a graph vertex with `reduces`, is needed)");
  }
  return cost(g, kind, a).time(bytes);
}

NcclEstimate AnalyticalNetwork::nccl_estimate(CollectiveKind kind, std::uint32_t g,
                                              Bytes bytes) const {
  const GroupInfo& info = group(g);
  auto choose = [&] {
    return nccl_choose(kind, info.nccl, bytes, *cluster_.collectives.nccl,
                       cluster_.collectives.algorithm[static_cast<std::size_t>(kind)],
                       cluster_.collectives.max_channels);
  };
  // Remembered per (kind, bytes) where the key holds both: kinds below 8, sizes below 2^60.
  const auto k = static_cast<std::uint64_t>(kind);
  if (bytes.count() < 0 || static_cast<std::uint64_t>(bytes.count()) >= (std::uint64_t{1} << 60) ||
      k >= 8) {
    return choose();
  }
  const std::uint64_t key = static_cast<std::uint64_t>(bytes.count()) << 3 | k;
  auto& seen = groups_[g].nccl_choices;
  const auto it = seen.find(key);
  if (it != seen.end()) return it->second;
  return seen.emplace(key, choose()).first->second;
}

Time AnalyticalNetwork::p2p_time(std::int32_t src, std::int32_t dst, Bytes bytes,
                                 bool copy_engine) const {
  if (cluster_.collectives.nccl && !copy_engine) return nccl_p2p_time(src, dst, bytes, cluster_);
  const bool same_node = cluster_.node_of(src) == cluster_.node_of(dst);
  const auto& a = same_node ? cluster_.intra_link_of(src) : cluster_.inter_link_of(src);
  const auto& b = same_node ? cluster_.intra_link_of(dst) : cluster_.inter_link_of(dst);
  const Bandwidth bw =
      std::min(a.bandwidth, b.bandwidth) * cluster_.collectives.protocol_efficiency;
  return std::max(a.latency, b.latency) + transfer_time(bytes, bw);
}

void AnalyticalNetwork::start(TransferId id, const TransferRequest& request, Time now) {
  // Bounded loss: only the delivered bytes take time (classes are ignored: no shared links).
  const Bytes bytes = request.delivered();
  const Time duration = request.collective
                            ? collective_time(request.kind, request.group, bytes)
                            : p2p_time(request.src, request.dst, bytes, request.copy_engine);
  const Time end = now + duration;
  if (rates_) {
    if (id >= rated_.size()) rated_.resize(static_cast<std::size_t>(id) + 1);
    rated_[id] = Rated{end, now, static_cast<double>(duration.picoseconds()), 1.0, 0, false};
  }
  active_.push_back(Active{end, sequence_++, id, 0});
  std::push_heap(active_.begin(), active_.end(), Later{});
}

void AnalyticalNetwork::set_rate(TransferId id, double rate, Time now) {
  if (!(rate > 0 && rate <= 1)) {
    throw std::invalid_argument("AnalyticalNetwork::set_rate: rate " + std::to_string(rate) +
                                " is not in (0, 1]");
  }
  if (!rates_ || id >= rated_.size()) return;
  Rated& r = rated_[id];
  // A transfer already handed back as finished (the simulator may not have processed it yet)
  // keeps its end.
  if (r.done || rate == r.rate) return;
  r.remaining =
      std::max(0.0, r.remaining - static_cast<double>((now - r.last).picoseconds()) * r.rate);
  r.last = now;
  r.end = now + Time::ps(static_cast<std::int64_t>(std::llround(r.remaining / rate)));
  r.rate = rate;
  ++r.version;
  active_.push_back(Active{r.end, sequence_++, id, r.version});
  std::push_heap(active_.begin(), active_.end(), Later{});
  drop_stale();
}

void AnalyticalNetwork::drop_stale() {
  while (!active_.empty()) {
    const Active& top = active_.front();
    if (!rates_ || top.version == rated_[top.id].version) return;
    std::pop_heap(active_.begin(), active_.end(), Later{});
    active_.pop_back();
  }
}

Time AnalyticalNetwork::next_completion() const {
  return active_.empty() ? Time::infinity() : active_.front().end;
}

void AnalyticalNetwork::advance_to(Time t, std::vector<TransferId>& finished) {
  while (!active_.empty() && active_.front().end <= t) {
    std::pop_heap(active_.begin(), active_.end(), Later{});
    finished.push_back(active_.back().id);
    if (rates_) rated_[active_.back().id].done = true;
    active_.pop_back();
    drop_stale();
  }
}

}  // namespace stratasim::sim
