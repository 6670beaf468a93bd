#include "sim/network.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace stratasim::sim {

namespace {

using strategies::CollectiveKind;

/// ceil(numerator * size / denominator) bytes, in integers.
Bytes fraction(Bytes size, std::int64_t numerator, std::int64_t denominator) {
  if (size.count() <= 0) return Bytes(0);
  return Bytes((size.count() * numerator + denominator - 1) / denominator);
}

/// One flat ring (or pipelined chain) of `kind` over n ranks on `link`.
Time flat(CollectiveKind kind, std::int64_t n, Bytes size, const hw::LinkSpec& link) {
  if (n <= 1) return Time::zero();
  switch (kind) {
    case CollectiveKind::all_reduce:
      return transfer_time(fraction(size, 2 * (n - 1), n), link.bandwidth) +
             link.latency * (2 * (n - 1));
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
      return transfer_time(fraction(size, n - 1, n), link.bandwidth) + link.latency * (n - 1);
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
      return transfer_time(size, link.bandwidth) + link.latency * (n - 1);
  }
  return Time::zero();
}

}  // namespace

GroupShape shape_of(std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster) {
  GroupShape shape;
  shape.size = static_cast<int>(ranks.size());
  if (ranks.empty()) {
    shape.nodes = 0;
    shape.max_ranks_per_node = 0;
    return shape;
  }
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (std::int32_t r : ranks) nodes.push_back(cluster.node_of(r));
  std::sort(nodes.begin(), nodes.end());
  int distinct = 0;
  int most = 0;
  for (std::size_t i = 0; i < nodes.size();) {
    std::size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    ++distinct;
    most = std::max(most, static_cast<int>(j - i));
    i = j;
  }
  shape.nodes = distinct;
  shape.max_ranks_per_node = most;
  return shape;
}

AnalyticalNetwork::AnalyticalNetwork(const hw::ClusterSpec& cluster,
                                     const strategies::Program& program)
    : cluster_(cluster) {
  shapes_.reserve(program.groups().size());
  for (const auto& g : program.groups()) shapes_.push_back(shape_of(g.ranks, cluster_));
}

Time AnalyticalNetwork::collective_time(CollectiveKind kind, const GroupShape& shape,
                                        Bytes bytes) const {
  const std::int64_t n = shape.size;
  if (n <= 1) return Time::zero();
  if (shape.nodes <= 1) return flat(kind, n, bytes, cluster_.intra_node);
  const std::int64_t k = shape.max_ranks_per_node;
  if (k <= 1) return flat(kind, n, bytes, cluster_.inter_node);
  // Hierarchical: inside each node the k ranks reduce-scatter (or all-gather) the whole
  // buffer; k parallel inter-node rings, one per local shard, carry S/k bytes each.
  const std::int64_t nodes = shape.nodes;
  const Bytes shard = fraction(bytes, 1, k);
  const auto& intra = cluster_.intra_node;
  const auto& inter = cluster_.inter_node;
  switch (kind) {
    case CollectiveKind::all_reduce:
      return flat(CollectiveKind::reduce_scatter, k, bytes, intra) +
             flat(CollectiveKind::all_reduce, nodes, shard, inter) +
             flat(CollectiveKind::all_gather, k, bytes, intra);
    case CollectiveKind::reduce_scatter:
      return flat(CollectiveKind::reduce_scatter, k, bytes, intra) +
             flat(CollectiveKind::reduce_scatter, nodes, shard, inter);
    case CollectiveKind::all_gather:
      return flat(CollectiveKind::all_gather, nodes, shard, inter) +
             flat(CollectiveKind::all_gather, k, bytes, intra);
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
    case CollectiveKind::all_to_all:
      return flat(kind, n, bytes, inter);
  }
  return Time::zero();
}

Time AnalyticalNetwork::p2p_time(std::int32_t src, std::int32_t dst, Bytes bytes) const {
  const auto& link =
      cluster_.node_of(src) == cluster_.node_of(dst) ? cluster_.intra_node : cluster_.inter_node;
  return link.latency + transfer_time(bytes, link.bandwidth);
}

void AnalyticalNetwork::start(TransferId id, const TransferRequest& request, Time now) {
  Time duration;
  if (request.collective) {
    if (request.group >= shapes_.size()) {
      throw std::invalid_argument("collective on group " + std::to_string(request.group) +
                                  ", but the program has " + std::to_string(shapes_.size()) +
                                  " groups");
    }
    duration = collective_time(request.kind, shapes_[request.group], request.bytes);
  } else {
    duration = p2p_time(request.src, request.dst, request.bytes);
  }
  active_.push_back(Active{now + duration, sequence_++, id});
  std::push_heap(active_.begin(), active_.end(), Later{});
}

Time AnalyticalNetwork::next_completion() const {
  return active_.empty() ? Time::infinity() : active_.front().end;
}

void AnalyticalNetwork::advance_to(Time t, std::vector<TransferId>& finished) {
  while (!active_.empty() && active_.front().end <= t) {
    std::pop_heap(active_.begin(), active_.end(), Later{});
    finished.push_back(active_.back().id);
    active_.pop_back();
  }
}

}  // namespace stratasim::sim
