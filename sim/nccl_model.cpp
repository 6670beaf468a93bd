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
constexpr CollectiveAlgorithm kAlgorithms[] = {
    CollectiveAlgorithm::ring,          CollectiveAlgorithm::tree,
    CollectiveAlgorithm::nvls,          CollectiveAlgorithm::collnet_direct,
    CollectiveAlgorithm::collnet_chain, CollectiveAlgorithm::pat};

// NCCL's tree correction (tuning.cc treeCorrectionFactor): the tree all-reduce's bandwidth at
// medium sizes over its model's, per protocol (LL, LL128, Simple), index floor(log2(S / 64 B))
// for 0 <= index < 23 (64 B to 256 MiB); 1 elsewhere.
constexpr double kTreeCorrection[3][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7,  .7,  .7,  .6,  .5,
     .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7,  .6,  .6,
     .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
     .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};

// CollNet's latencies inside a node (NCCL hwLat, NVLink, Simple; us) and its arity
// serialization per extra local rank (CollNetDirect), tuning.cc.
constexpr double kCollnetDirectIntraUs = 3.7;
constexpr double kCollnetChainIntraUs = 2.8;
constexpr double kCollnetArityUs = 0.4;
// PAT (tuning.cc): base latency 8 us, a linear part of 2.8 us per rank, its network latency
// over 3.5 per tree level, and its bandwidth 0.75 of the ring's.
constexpr double kPatBaseUs = 8.0;
constexpr double kPatPerRankUs = 2.8;
constexpr double kPatLevelDivisor = 3.5;
constexpr double kPatFraction = 0.75;
// The ring's plateau (ncclTopoGetAlgoTime): a Simple ring all-reduce spanning nodes with at least
// 64 bytes per channel and rank pays 1.4 times its latency (compute capability 8.0 and newer).
constexpr double kRingPlateau = 1.4;
// NCCL's network post overhead per ring step (tuning.cc getNetOverhead: 1 us on Intel x86 hosts,
// 2 us on AMD; the Intel figure, that of the calibration cases' hosts).
constexpr double kNetOverheadUs = 1.0;
// Point to point (src/init.cc, src/enqueue.cc addP2pToPlan): the chunk NCCL steps by over NVLink
// (NCCL_P2P_NVL_CHUNKSIZE); a part of a transfer is at least 1/8 and at most 32 chunks.
constexpr std::int64_t kP2pNvlChunk = 512 * 1024;
// NVLS chunking (src/transport/nvls.cc NCCL_NVLS_CHUNKSIZE; src/enqueue.cc calcCollChunking):
// the largest chunk, and the steps down to 64, 32 and 16 KiB below 64, 8 and 2 concurrent
// operations' worth of the chunk then in force.
constexpr std::int64_t kNvlsChunk = 128 * 1024;

std::int64_t pow2_up(std::int64_t x) {
  std::int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

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
  // NCCL baseLat (us): Tree {6.8, 14.0, 8.4}, Ring {6.6, 14.0, 8.4} for LL, LL128, Simple;
  // CollNet, NVLS and PAT have their own (nccl_candidate).
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

std::int64_t nccl_nvls_chunk(Bytes bytes, int channels, int heads) {
  const std::int64_t ops = static_cast<std::int64_t>(std::max(1, channels)) *
                           static_cast<std::int64_t>(std::max(1, heads));
  const std::int64_t n = bytes.count();
  std::int64_t chunk = kNvlsChunk;
  if (n < 64 * ops * chunk && chunk > 65536) chunk = 65536;
  if (n < 8 * ops * chunk && chunk > 32768) chunk = 32768;
  if (n < 2 * ops * chunk && chunk > 16384) chunk = 16384;
  return chunk;
}

std::int64_t nccl_nvls_loops(Bytes bytes, int channels, int heads) {
  const std::int64_t per_loop = static_cast<std::int64_t>(std::max(1, channels)) *
                                std::max(1, heads) * nccl_nvls_chunk(bytes, channels, heads);
  return std::max<std::int64_t>(1, (bytes.count() + per_loop - 1) / per_loop);
}

Time nccl_tree_step_latency(const hw::NcclFabric& fabric, bool network, NcclProtocol protocol) {
  const std::size_t p = index(protocol);
  const double ring = fabric.step_latency[p].seconds();
  if (network) {
    return Time::from_seconds(ring + (kNcclNetTreeStepUs[p] - kNcclNetRingStepUs[p]) * 1e-6);
  }
  return Time::from_seconds(ring * kNcclNvlinkTreeStepUs[p] / kNcclNvlinkRingStepUs[p]);
}

double nccl_tree_correction(NcclProtocol protocol, Bytes bytes) {
  if (bytes.count() < 64) return 1.0;
  const int i = floor_log2(static_cast<int>(std::min<std::int64_t>(bytes.count() >> 6, 1 << 30)));
  return i < 23 ? kTreeCorrection[index(protocol)][i] : 1.0;
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
  if (nodes > 1 && protocol == NcclProtocol::ll && !net.ll) return std::nullopt;
  const double ll128_max = channels * in.ll128_channel_busbw.bytes_per_second();
  const std::size_t p = index(protocol);
  // With one rank per node every step crosses the network at the tree's NET latency (NCCL:
  // "with ppn = 1 latencies are fully exposed").
  const double net_step =
      (k == 1 ? nccl_tree_step_latency(net, true, protocol) : net.step_latency[p]).seconds();
  // The Simple ring's bus bandwidth (the bandwidth every algorithm but NVLS and CollNet scales).
  const double ring_simple = nodes == 1 ? e_in * b_in : std::min(e_in * b_in, e_net * k * b_net);
  // Channels: NVLS and CollNet run all theirs at full rate; the others the size's share.
  bool capped = true;
  // What NCCL's tuner does not see of NVLS (where nvls_channels is set): the part of
  // I.nvls_latency beyond its own NVLS latency, and the loops of chunks smaller than the full
  // one (its NVLS bandwidth is that of full chunks: it charges S / (channels x heads x 128 KiB)
  // loops of I.nvls_loop_latency, where the message really takes nccl_nvls_loops).
  Time unseen;

  NcclEstimate e;
  e.algorithm = algorithm;
  e.protocol = protocol;
  if (algorithm == CollectiveAlgorithm::ring) {
    if (all_to_all && protocol != NcclProtocol::simple) return std::nullopt;
    e.busbw = protocol == NcclProtocol::simple ? ring_simple
              : protocol == NcclProtocol::ll128
                  ? std::min(kRingLl128Fraction * ring_simple, ll128_max)
                  : std::min(kLlFraction * ring_simple, ll_max);
    const std::int64_t steps = ring_steps(kind, n);
    e.algbw = e.busbw * n / static_cast<double>(steps);
    if (all_to_all && nodes > 1) {
      // Point-to-point sends: a rank's (k - 1) / n of the buffer over NVLink and (n - k) / n
      // through its own NIC at once (not the ring's node-shared NICs).
      const double t_in = k > 1 ? (k - 1.0) / n / (e_in * b_in) : 0.0;
      const double t_net = (n - k) / static_cast<double>(n) / (e_net * b_net);
      e.algbw = 1.0 / std::max(t_in, t_net);
      e.busbw = e.algbw * static_cast<double>(steps) / n;
    }
    const std::int64_t inter =
        nodes == 1 ? 0 : (kind == CollectiveKind::all_reduce ? 2LL * (nodes - 1) : nodes - 1);
    // Spanning nodes, every step of the ring also posts to the network: an intra-node step costs
    // at least NCCL's net overhead (three times it for Simple).
    double in_step = in.step_latency[p].seconds();
    if (nodes > 1) {
      in_step =
          std::max(in_step, kNetOverheadUs * 1e-6 * (protocol == NcclProtocol::simple ? 3 : 1));
    }
    e.latency = nccl_base_latency(algorithm, protocol) +
                Time::from_seconds(static_cast<double>(steps - inter) * in_step +
                                   static_cast<double>(inter) * net_step);
    if (protocol == NcclProtocol::simple && nodes > 1 && kind == CollectiveKind::all_reduce &&
        bytes.count() / (static_cast<std::int64_t>(channels) * n) >= 64) {
      e.latency = Time::from_seconds(e.latency.seconds() * kRingPlateau);
    }
    e.channels = nccl_channels(algorithm, protocol, n, bytes, channels);
  } else if (algorithm == CollectiveAlgorithm::tree) {
    if (kind != CollectiveKind::all_reduce || nodes <= 1) return std::nullopt;
    const double simple =
        2 * kTreeFactor * std::min(e_in * b_in, e_net * k * b_net / (nodes == 2 ? 1.0 : 2.0));
    e.busbw = protocol == NcclProtocol::simple  ? simple
              : protocol == NcclProtocol::ll128 ? std::min(kTreeLl128Fraction * simple, ll128_max)
                                                : std::min(kTreeLlFraction * simple, ll_max);
    e.busbw *= nccl_tree_correction(protocol, bytes);
    e.algbw = e.busbw / 2;
    e.latency =
        nccl_base_latency(algorithm, protocol) +
        Time::from_seconds(
            2 * ((k - 1) * nccl_tree_step_latency(in, false, protocol).seconds() +
                 floor_log2(nodes) * nccl_tree_step_latency(net, true, protocol).seconds()));
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
    capped = false;
    if (in.nvls_channels > 0) {
      e.channels = in.nvls_channels;
      const double tuner = kNcclNvlsTunerLatencyUs * 1e-6;
      const double loop = in.nvls_loop_latency.seconds();
      const double tuner_loops =
          static_cast<double>(bytes.count()) /
          (static_cast<double>(in.nvls_channels) * n * static_cast<double>(kNvlsChunk));
      const auto loops = static_cast<double>(nccl_nvls_loops(bytes, in.nvls_channels, n));
      unseen = Time::from_seconds(std::max(0.0, loops - tuner_loops) * loop +
                                  std::max(0.0, in.nvls_latency.seconds() - tuner));
      e.latency = Time::from_seconds(std::min(tuner, in.nvls_latency.seconds()) +
                                     std::min(loops, tuner_loops) * loop);
    }
  } else if (algorithm == CollectiveAlgorithm::collnet_direct ||
             algorithm == CollectiveAlgorithm::collnet_chain) {
    if (kind != CollectiveKind::all_reduce || nodes <= 1 || protocol != NcclProtocol::simple ||
        !(net.collnet_efficiency > 0) || k > kCollnetMaxLocalRanks) {
      return std::nullopt;
    }
    const bool direct = algorithm == CollectiveAlgorithm::collnet_direct;
    // The switches reduce: each node's NICs send S up and receive the reduced S.
    const double through_switch = net.collnet_efficiency * k * b_net;
    // Inside a node: direct, a reduce-scatter to and an all-gather from the k heads (2(k-1)/k S
    // each way on every link); chain, S each way along the chain.
    double inside = std::numeric_limits<double>::infinity();
    if (k > 1) inside = direct ? e_in * b_in * k / (2.0 * (k - 1)) : e_in * b_in;
    e.algbw = std::min(through_switch, inside);
    e.busbw = e.algbw * 2.0 * (n - 1) / n;
    const double intra_us =
        direct ? 2 * (std::min(1, k - 1) * kCollnetDirectIntraUs + (k - 1) * kCollnetArityUs)
               : 2 * (k - 1) * kCollnetChainIntraUs;
    e.latency = net.collnet_latency + Time::from_seconds(intra_us * 1e-6);
    e.channels = channels;
    capped = false;
  } else if (algorithm == CollectiveAlgorithm::pat) {
    if ((kind != CollectiveKind::all_gather && kind != CollectiveKind::reduce_scatter) || k != 1 ||
        nodes <= 1 || protocol != NcclProtocol::simple || !net.pat) {
      return std::nullopt;
    }
    e.algbw = kPatFraction * ring_simple;
    e.busbw = e.algbw * (n - 1) / n;
    e.latency = Time::from_seconds((kPatBaseUs + kPatPerRankUs * n) * 1e-6 +
                                   floor_log2(nodes) *
                                       nccl_tree_step_latency(net, true, protocol).seconds() /
                                       kPatLevelDivisor);
    e.channels = nccl_channels(CollectiveAlgorithm::ring, protocol, n, bytes, channels);
  } else {
    return std::nullopt;
  }
  if (!(e.algbw > 0)) return std::nullopt;
  // A channel moves at most channel_busbw (the protocol's share of it) of bus bandwidth.
  double rate = e.algbw;
  if (capped && in.channel_busbw.bytes_per_second() > 0) {
    const double fraction = protocol == NcclProtocol::simple  ? 1.0
                            : protocol == NcclProtocol::ll128 ? kRingLl128Fraction
                                                              : kLlFraction;
    const double cap = e.channels * in.channel_busbw.bytes_per_second() * fraction;
    if (cap < e.busbw) rate = e.algbw * cap / e.busbw;
  }
  e.tuner_time = e.latency + Time::from_seconds(static_cast<double>(bytes.count()) / rate);
  e.time = e.tuner_time + unseen;
  e.latency = e.latency + unseen;
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
        if (c && (!best || c->tuner_time < best->tuner_time)) best = c;
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

int nccl_p2p_channels(Bytes bytes, int ranks, int channels) {
  // addP2pToPlan over one node (src/enqueue.cc): p2pnChannels and the channels per peer are the
  // collective channels rounded up to a power of two (an NVSwitch path offers 2 per NVLink, more
  // than the channels); a send starts on nChannelsMin = the per-peer channels halved until
  // ranks of them fit in p2pnChannels, and doubles them while a part exceeds 32 chunks.
  const std::int64_t p2p_channels = pow2_up(std::max(1, channels));
  std::int64_t lo = p2p_channels;
  while (lo * std::max(1, ranks) > p2p_channels && lo > 1) lo /= 2;
  const std::int64_t min_part = kP2pNvlChunk / 8;
  const std::int64_t max_part = kP2pNvlChunk * 32;
  const std::int64_t b = std::max<std::int64_t>(1, bytes.count());
  std::int64_t c = std::min(lo, (b + min_part - 1) / min_part);
  std::int64_t part = std::max(min_part, (b + c - 1) / c);
  while (part > max_part && c <= p2p_channels / 2) {
    c *= 2;
    part = (b + c - 1) / c;
  }
  return static_cast<int>(c);
}

double nccl_p2p_efficiency(std::int32_t src, std::int32_t dst, Bytes bytes,
                           const hw::ClusterSpec& cluster) {
  const hw::NcclSettings& s = *cluster.collectives.nccl;
  if (cluster.node_of(src) != cluster.node_of(dst)) return s.network.p2p_efficiency;
  double e = s.intra.p2p_efficiency;
  const double per_channel = s.intra.p2p_channel_bandwidth.bytes_per_second();
  if (per_channel > 0) {
    const double line = std::min(cluster.intra_link_of(src).bandwidth.bytes_per_second(),
                                 cluster.intra_link_of(dst).bandwidth.bytes_per_second());
    const int c = nccl_p2p_channels(bytes, cluster.devices_per_node, s.intra.channels);
    e = std::min(e, c * per_channel / line);
  }
  return e;
}

Time nccl_p2p_time(std::int32_t src, std::int32_t dst, Bytes bytes,
                   const hw::ClusterSpec& cluster) {
  const bool same_node = cluster.node_of(src) == cluster.node_of(dst);
  const auto& a = same_node ? cluster.intra_link_of(src) : cluster.inter_link_of(src);
  const auto& b = same_node ? cluster.intra_link_of(dst) : cluster.inter_link_of(dst);
  const Bandwidth bw =
      std::min(a.bandwidth, b.bandwidth) * nccl_p2p_efficiency(src, dst, bytes, cluster);
  return std::max(a.latency, b.latency) + transfer_time(bytes, bw);
}

}  // namespace stratasim::sim
