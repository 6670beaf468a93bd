#include "sim/nccl_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "sim/collectives.hpp"

namespace stratasim::sim {

namespace {

using hw::CollectiveAlgorithm;
using hw::NcclProtocol;
using strategies::CollectiveKind;

constexpr NcclProtocol kProtocols[] = {NcclProtocol::simple, NcclProtocol::ll128, NcclProtocol::ll};
constexpr CollectiveAlgorithm kAlgorithms[] = {CollectiveAlgorithm::ring, CollectiveAlgorithm::tree,
                                               CollectiveAlgorithm::nvls};

// NCCL's model refinements (tuning.cc): LL moves 4 data bytes per 8; LL128 120 per 128 (0.92
// in NCCL's ring figure); the tree's own factor 0.92, its LL 1/3.8.
constexpr double kLlFraction = 0.5;
constexpr double kRingLl128Fraction = 0.92;
constexpr double kTreeFactor = 0.92;
constexpr double kTreeLlFraction = 1.0 / 3.8;
constexpr double kTreeLl128Fraction = 120.0 / 128.0;

std::size_t index(NcclProtocol p) {
  return static_cast<std::size_t>(p);
}

/// Steps of a ring (NCCL's nsteps).
std::int64_t ring_steps(CollectiveKind kind, int n) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return 2LL * (n - 1);
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
      return n - 1;
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
      return n;
  }
  return n;
}

int floor_log2(int x) {
  int l = 0;
  while (x > 1) {
    x >>= 1;
    ++l;
  }
  return l;
}

}  // namespace

Time nccl_base_latency(CollectiveAlgorithm algorithm, NcclProtocol protocol) {
  // NCCL baseLat (us): Tree {6.8, 14.0, 8.4}, Ring {6.6, 14.0, 8.4} for LL, LL128, Simple.
  static constexpr double ring[] = {6.6, 14.0, 8.4};
  static constexpr double tree[] = {6.8, 14.0, 8.4};
  const double us =
      (algorithm == CollectiveAlgorithm::tree ? tree : ring)[static_cast<std::size_t>(protocol)];
  return Time::from_seconds(us * 1e-6);
}

int nccl_channels(CollectiveAlgorithm algorithm, NcclProtocol protocol, int ranks, Bytes bytes,
                  int max_channels) {
  // src/enqueue.cc: while (nBytes < nc * nt * threadThreshold) nc--; with NCCL's maximum threads
  // (Simple 512, LL 512, LL128 640) and thresholds (Simple 64, LL 8, LL128 8; the ring's LL
  // threshold times nRanks).
  std::int64_t per_channel = 0;
  switch (protocol) {
    case NcclProtocol::simple:
      per_channel = 512LL * 64;
      break;
    case NcclProtocol::ll128:
      per_channel = 640LL * 8;
      break;
    case NcclProtocol::ll:
      per_channel = 512LL * 8 * (algorithm == CollectiveAlgorithm::ring ? ranks : 1);
      break;
  }
  int c = std::max(1, max_channels);
  while (c > 1 && bytes.count() < c * per_channel) --c;
  return c;
}

std::optional<NcclEstimate> nccl_candidate(CollectiveKind kind, CollectiveAlgorithm algorithm,
                                           NcclProtocol protocol, const NcclGroup& group,
                                           Bytes bytes, const hw::NcclSettings& settings,
                                           int max_channels) {
  const hw::NcclFabric& in = settings.intra;
  const hw::NcclFabric& net = settings.network;
  const int n = group.ranks;
  const int nodes = group.nodes;
  const int k = std::max(1, group.ranks_per_node);
  if (n <= 1) return std::nullopt;
  const double b_in = group.intra.bytes_per_second();
  const double b_net = group.nic.bytes_per_second();
  const bool all_to_all = kind == CollectiveKind::all_to_all;
  const double e_in = all_to_all ? in.p2p_efficiency : in.efficiency;
  const double e_net = all_to_all ? net.p2p_efficiency : net.efficiency;
  const int channels = std::max(1, hw::channel_limit(in.channels, max_channels));
  double ll_max = in.ll_max_busbw.bytes_per_second();
  if (nodes > 1 && net.ll_max_busbw.bytes_per_second() > 0) {
    ll_max = std::min(ll_max, net.ll_max_busbw.bytes_per_second());
  }
  if (nodes > 1 && protocol == NcclProtocol::ll128 && !net.ll128) return std::nullopt;
  const double ll128_max = channels * in.ll128_channel_busbw.bytes_per_second();

  NcclEstimate e;
  e.algorithm = algorithm;
  e.protocol = protocol;
  const std::size_t p = index(protocol);
  if (algorithm == CollectiveAlgorithm::ring) {
    if (all_to_all && protocol != NcclProtocol::simple) return std::nullopt;
    const double simple = nodes == 1 ? e_in * b_in : std::min(e_in * b_in, e_net * k * b_net);
    e.busbw = protocol == NcclProtocol::simple  ? simple
              : protocol == NcclProtocol::ll128 ? std::min(kRingLl128Fraction * simple, ll128_max)
                                                : std::min(kLlFraction * simple, ll_max);
    const std::int64_t steps = ring_steps(kind, n);
    e.algbw = e.busbw * n / static_cast<double>(steps);
    const std::int64_t inter =
        nodes == 1 ? 0 : (kind == CollectiveKind::all_reduce ? 2LL * (nodes - 1) : nodes - 1);
    e.latency =
        nccl_base_latency(algorithm, protocol) +
        Time::from_seconds(static_cast<double>(steps - inter) * in.step_latency[p].seconds() +
                           static_cast<double>(inter) * net.step_latency[p].seconds());
    e.channels = nccl_channels(algorithm, protocol, n, bytes, channels);
  } else if (algorithm == CollectiveAlgorithm::tree) {
    if (kind != CollectiveKind::all_reduce || nodes <= 1) return std::nullopt;
    const double simple =
        2 * kTreeFactor * std::min(e_in * b_in, e_net * k * b_net / (nodes == 2 ? 1.0 : 2.0));
    e.busbw = protocol == NcclProtocol::simple  ? simple
              : protocol == NcclProtocol::ll128 ? std::min(kTreeLl128Fraction * simple, ll128_max)
                                                : std::min(kTreeLlFraction * simple, ll_max);
    e.algbw = e.busbw / 2;
    e.latency = nccl_base_latency(algorithm, protocol) +
                Time::from_seconds(2 * ((k - 1) * in.step_latency[p].seconds() +
                                        floor_log2(nodes) * net.step_latency[p].seconds()));
    e.channels = nccl_channels(algorithm, protocol, n, bytes, channels);
  } else if (algorithm == CollectiveAlgorithm::nvls) {
    if (protocol != NcclProtocol::simple || nodes != 1 || !(in.nvls_efficiency > 0)) {
      return std::nullopt;
    }
    const double rate = in.nvls_efficiency * b_in;
    if (kind == CollectiveKind::all_reduce) {
      e.algbw = rate * n / (n + 1.0);
    } else if (kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_gather) {
      e.algbw = rate;
    } else {
      return std::nullopt;
    }
    e.busbw = e.algbw;
    e.latency = in.nvls_latency;
    e.channels = channels;
  } else {
    return std::nullopt;
  }
  if (!(e.algbw > 0)) return std::nullopt;
  // A channel moves at most channel_busbw (the protocol's share of it) of bus bandwidth.
  double rate = e.algbw;
  if (algorithm != CollectiveAlgorithm::nvls && in.channel_busbw.bytes_per_second() > 0) {
    const double fraction = protocol == NcclProtocol::simple  ? 1.0
                            : protocol == NcclProtocol::ll128 ? kRingLl128Fraction
                                                              : kLlFraction;
    const double cap = e.channels * in.channel_busbw.bytes_per_second() * fraction;
    if (cap < e.busbw) rate = e.algbw * cap / e.busbw;
  }
  e.time = e.latency + Time::from_seconds(static_cast<double>(bytes.count()) / rate);
  return e;
}

NcclEstimate nccl_choose(CollectiveKind kind, const NcclGroup& group, Bytes bytes,
                         const hw::NcclSettings& settings, CollectiveAlgorithm fixed,
                         int max_channels) {
  NcclEstimate zero;
  if (group.ranks <= 1) return zero;
  if (fixed == CollectiveAlgorithm::hierarchical) fixed = CollectiveAlgorithm::tree;
  auto search = [&](bool restrict) {
    std::optional<NcclEstimate> best;
    for (CollectiveAlgorithm a : kAlgorithms) {
      if (restrict && a != fixed) continue;
      for (NcclProtocol p : kProtocols) {
        const auto c = nccl_candidate(kind, a, p, group, bytes, settings, max_channels);
        if (c && (!best || c->time < best->time)) best = c;
      }
    }
    return best;
  };
  std::optional<NcclEstimate> best;
  if (fixed != CollectiveAlgorithm::automatic) best = search(true);
  if (!best && fixed == CollectiveAlgorithm::nvls) {
    throw std::invalid_argument(
        "nvls " + std::string(strategies::name_of(kind)) + " over " + std::to_string(group.ranks) +
        " ranks on " + std::to_string(group.nodes) +
        " node(s): NVLS runs all-reduce, reduce-scatter and all-gather within one node whose "
        "intra_fabric has nvls (the switch reduces)");
  }
  if (!best) best = search(false);
  return best ? *best : zero;
}

NcclGroup nccl_group(std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster) {
  const GroupShape shape = shape_of(ranks, cluster);
  NcclGroup g;
  g.ranks = shape.size;
  g.nodes = shape.nodes;
  g.ranks_per_node = shape.max_ranks_per_node;
  double intra = std::numeric_limits<double>::infinity();
  double nic = std::numeric_limits<double>::infinity();
  for (std::int32_t r : ranks) {
    const bool known = r >= 0 && r < cluster.world_size();
    intra = std::min(
        intra,
        (known ? cluster.intra_link_of(r) : cluster.intra_node).bandwidth.bytes_per_second());
    nic = std::min(
        nic, (known ? cluster.inter_link_of(r) : cluster.inter_node).bandwidth.bytes_per_second());
  }
  if (ranks.empty()) {
    intra = cluster.intra_node.bandwidth.bytes_per_second();
    nic = cluster.inter_node.bandwidth.bytes_per_second();
  }
  g.intra = Bandwidth(intra);
  g.nic = Bandwidth(nic);
  return g;
}

double nccl_p2p_efficiency(std::int32_t src, std::int32_t dst, const hw::ClusterSpec& cluster) {
  const hw::NcclSettings& s = *cluster.collectives.nccl;
  return cluster.node_of(src) == cluster.node_of(dst) ? s.intra.p2p_efficiency
                                                      : s.network.p2p_efficiency;
}

Time nccl_p2p_time(std::int32_t src, std::int32_t dst, Bytes bytes,
                   const hw::ClusterSpec& cluster) {
  const bool same_node = cluster.node_of(src) == cluster.node_of(dst);
  const auto& a = same_node ? cluster.intra_link_of(src) : cluster.inter_link_of(src);
  const auto& b = same_node ? cluster.intra_link_of(dst) : cluster.inter_link_of(dst);
  const Bandwidth bw = std::min(a.bandwidth, b.bandwidth) * nccl_p2p_efficiency(src, dst, cluster);
  return std::max(a.latency, b.latency) + transfer_time(bytes, bw);
}

}  // namespace stratasim::sim
