// The NCCL-structured collective cost model: for one collective, every algorithm x protocol that
// NCCL could run gets a latency and a bandwidth, and the one of least predicted time runs, as
// NCCL's tuner chooses (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and
// ncclTopoGetAlgoTime; the channel count per message size from src/enqueue.cc). Our own code
// with that structure; the per-fabric figures (hw::NcclFabric) are fitted to the published
// collective sweeps (study/collective_fit.hpp), NCCL's own constants are named below.
//
// A group: n ranks on N nodes, at most k on a node; B_in each member's intra-node link (the
// slowest member's), B_net each member's NIC (per direction, line rate); I and E the cluster's
// intra-node and network fabrics. Times in seconds, bandwidths in bytes/s, S the collective's
// size (nccl-tests' size: the buffer of every rank).
//
// Bus bandwidth of the Simple protocol (busbw, nccl-tests' definition):
// - ring: N = 1: I.eff B_in; N > 1: min(I.eff B_in, E.eff k B_net) (each channel's ring leaves
//   every node once, and the channels spread over the node's k NICs, so the node's NICs
//   together carry the ring's bandwidth);
// - tree (all-reduce spanning nodes: a chain inside each node, a double binary tree between
//   nodes; the busiest node's NICs carry S each way for N = 2, 2 S for N > 2; each chain link S):
//   2 x 0.92 x min(I.eff B_in, E.eff k B_net / (N = 2 ? 1 : 2)) (0.92: NCCL's tree factor);
// - nvls (all-reduce, reduce-scatter, all-gather within one node whose switch reduces:
//   I.nvls_efficiency > 0, at least 2 ranks; Simple only): the switch moves (n+1)/n S through
//   each member's link for an all-reduce, S for the others, at I.nvls_efficiency B_in. Where
//   I.nvls_channels is set (NCCL's nvlsChannels), NVLS moves the message in loops of
//   channels x heads chunks (heads: the node's ranks; the chunk by size, nccl_nvls_chunk) and
//   every loop costs I.nvls_loop_latency: + nccl_nvls_loops(S) x I.nvls_loop_latency.
// - collnet_direct / collnet_chain (CollNet: the network's switches reduce, SHARP; all-reduce
//   spanning nodes with E.collnet_efficiency > 0 and k <= 8; Simple only): algbw =
//   min(E.collnet_efficiency k B_net (each node's NICs send S up, receive the reduced S),
//   inside), inside = I.eff B_in k / (2(k-1)) for direct (a reduce-scatter to and an all-gather
//   from the k heads), I.eff B_in for the chain (infinite for k = 1); busbw = algbw 2(n-1)/n.
//   Latency E.collnet_latency + 2(min(1, k-1) 3.7 + (k-1) 0.4) us (direct) or + 2(k-1) 2.8 us
//   (chain): NCCL's NVLink CollNet hwLat and arity serialization.
// - pat (NCCL 2.23+ Parallel Aggregated Trees: reduce-scatter and all-gather with one rank per
//   node on N >= 2 nodes, where E.pat; Simple only): algbw 0.75 x the Simple ring's busbw
//   (NCCL's own conversion: none), latency 8 us + 2.8 us n + floor(log2 N) E.tree_step / 3.5.
// Protocols scale the Simple figure as NCCL's model refinements do: ring LL
// min(busbw / 2, I.ll_max_busbw), ring LL128 min(0.92 busbw, C I.ll128_channel_busbw), tree LL
// min(busbw / 3.8, I.ll_max_busbw), tree LL128 min(120/128 busbw, C I.ll128_channel_busbw),
// C = I.channels. Spanning nodes, LL's ceiling is the smaller of I's and E's (E.ll_max_busbw,
// NCCL's multi-node llMaxBws), and LL128 runs only where E.ll128, LL only where E.ll.
// Algorithm bandwidth (S / time without latency): ring busbw n / nsteps (nsteps: all-reduce
// 2(n-1), reduce-scatter and all-gather n-1, broadcast and reduce n, all-to-all n-1); tree
// busbw / 2; nvls all-reduce I.nvls_efficiency B_in n/(n+1), reduce-scatter and all-gather
// I.nvls_efficiency B_in.
// Channels (message-size dependence, src/enqueue.cc): ring and tree use c of the C channels,
// c = clamp(floor(S / (threads x threshold)), 1, C) with NCCL's threads and per-thread
// thresholds (Simple 512 x 64 B, LL128 640 x 8 B, LL 512 x 8 B, times n for the ring), and a
// channel moves at most I.channel_busbw of bus bandwidth (times 0.92 for LL128, 1/2 for LL: one
// SM's copy rate), so a small message reaches min(busbw, c x that) (algbw in proportion); NVLS
// always runs its channels at full rate.
// Latency: ring base[p] + (nsteps - nInter) I.step[p] + nInter E.step[p], nInter = 0 on one
// node, else 2(N-1) for all-reduce and N-1 otherwise, an intra step spanning nodes costing at
// least NCCL's net overhead, 1 us (3 us for Simple; Intel hosts) (times 1.4 for a Simple all-reduce
// spanning nodes with S / (C n) >= 64 B: NCCL's ring plateau); tree base[p] + 2((k-1)
// I.tree_step[p] + floor(log2 N) E.tree_step[p]); nvls I.nvls_latency. The tree's steps are NCCL's
// tree hwLat (nccl_tree_step_latency): NVLink I.step scaled by tree/ring
// {0.6, 1.25, 4.0}/{0.6, 1.9, 3.4}, the network E.step plus {5.0, 8.5, 14} - {2.7, 4.0, 14} us;
// with one rank per node (k = 1) every algorithm's network steps are the tree's (NCCL: ppn = 1
// exposes the latencies). Tree correction: the tree all-reduce's bandwidth times NCCL's
// treeCorrectionFactor[p][floor( log2(S / 64))] (0.4 to 1 between 64 B and 256 MiB: trees fall
// short of their model there). base (NCCL's baseLat, us): ring LL 6.6, LL128 14, Simple 8.4;
// tree 6.8, 14, 8.4. All-to-all (NCCL runs it as point-to-point sends) is costed as a ring of n-1
// steps with the Simple protocol at the fabrics' p2p efficiency; spanning nodes, its algbw is
// 1 / max((k-1) / (n I.p2p B_in), (n-k) / (n E.p2p B_net)): each rank's NVLink and NIC shares
// move at once (docs/moe.md). Time: latency + S / algbw (the
// channels' ceiling applied); the chosen (algorithm, protocol) is the least tuner time among the
// candidates that apply (ties: ring before tree before nvls, Simple before LL128 before LL): the
// time as NCCL's tuner sees it (ncclTopoGetAlgoTime), which is the time except for NVLS with
// I.nvls_channels: there the tuner charges its own NVLS latency (kNcclNvlsTunerLatencyUs, 25 us)
// for I.nvls_latency and S / (channels x heads x 128 KiB) loops (its bandwidth is that of full
// chunks) for the loops the message takes; the chosen candidate then costs its real time. A
// fixed algorithm (the cluster's `collectives.algorithm`, or --algorithm) restricts the candidates
// to it where it applies (ring, tree, nvls; hierarchical means the tree); elsewhere the choice is
// free, except that a fixed nvls that cannot run is an error.
//
// Point to point: the larger latency of the two ends' links plus S / (p2p_efficiency x the
// smaller bandwidth), the intra fabric's p2p efficiency within a node, the network's between.
// Within a node NCCL spreads a send over c channels (src/enqueue.cc addP2pToPlan, nccl-tests'
// sendrecv: every rank sends S to the next): P = pow2up(C) p2p channels, c starts at P halved
// until c n <= P and doubles while S / c exceeds 32 NVLink chunks (32 x 512 KiB = 16 MiB), up to
// P; each channel moves at most I.p2p_channel_bandwidth (its warps split between the send and
// the receive), so the rate is min(p2p_efficiency B, c I.p2p_channel_bandwidth). E.g. C = 16,
// n = 8: c = 2 -> 8 for 128 MiB, 16 from 256 MiB.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "hw_models/cluster.hpp"
#include "strategies/program.hpp"

namespace stratasim::sim {

/// The figures of a group the model needs.
struct NcclGroup {
  int ranks = 1;
  int nodes = 1;
  int ranks_per_node = 1;  // the most on one node (k)
  Bandwidth intra;         // B_in: the slowest member's intra-node link
  Bandwidth nic;           // B_net: the slowest member's NIC
};

/// One candidate's (or the chosen) prediction.
struct NcclEstimate {
  hw::CollectiveAlgorithm algorithm = hw::CollectiveAlgorithm::ring;
  hw::NcclProtocol protocol = hw::NcclProtocol::simple;
  Time latency;
  double busbw = 0;  // bytes/s, all channels, as above
  double algbw = 0;  // bytes/s, all channels
  int channels = 1;  // c: the channels this size uses
  Time time;         // latency + S / algbw, the channels' ceiling applied (+ NVLS's loops)
  /// What NCCL's tuner compares (ncclTopoGetAlgoTime): `time` without NVLS's loop cost, which
  /// the tuner does not model. nccl_choose picks the least of these.
  Time tuner_time;
};

/// NVLS's chunk size for a message of `bytes` (src/enqueue.cc calcCollChunking, all-reduce):
/// 128 KiB (NCCL_NVLS_CHUNKSIZE), concurrentOps = channels x heads (one head per rank of the
/// node), then 64 KiB below 64 concurrentOps chunks, 32 KiB below 8, 16 KiB below 2, each test
/// against the chunk then in force. E.g. 24 channels, 8 heads: 128 KiB from 1.5 GiB, 64 KiB from
/// 96 MiB, 32 KiB from 12 MiB, 16 KiB below.
std::int64_t nccl_nvls_chunk(Bytes bytes, int channels, int heads);

/// The NVLS loops of a message: ceil(bytes / (channels x heads x chunk)) (at least 1).
std::int64_t nccl_nvls_loops(Bytes bytes, int channels, int heads);

/// NCCL's hardware latency per pipeline step (tuning.cc hwLat, us; LL, LL128, Simple): NVLink and
/// the network (NET), ring and tree. The fabrics' step_latency are the ring's; the tree's follow
/// (nccl_tree_step_latency).
inline constexpr double kNcclNvlinkRingStepUs[3] = {0.6, 1.9, 3.4};
inline constexpr double kNcclNvlinkTreeStepUs[3] = {0.6, 1.25, 4.0};
inline constexpr double kNcclNetRingStepUs[3] = {2.7, 4.0, 14.0};
inline constexpr double kNcclNetTreeStepUs[3] = {5.0, 8.5, 14.0};
/// NCCL's latency of NVLS within one node (tuning.cc: baseLat 0, NVLink hwLat 25 us, Simple):
/// what its tuner charges NVLS; the fabric's nvls.latency is what NVLS really takes.
inline constexpr double kNcclNvlsTunerLatencyUs = 25.0;
/// CollNet runs with at most this many ranks on a node (NCCL_MAX_DIRECT_ARITY + 1).
inline constexpr int kCollnetMaxLocalRanks = 8;

/// The tree's step latency on `fabric`: NVLink, the ring's scaled by NCCL's tree/ring hwLat; the
/// network, the ring's plus NCCL's tree-minus-ring NET hwLat (the fabric's hop is the same).
Time nccl_tree_step_latency(const hw::NcclFabric& fabric, bool network, hw::NcclProtocol protocol);

/// NCCL's tree correction factor for an all-reduce of `bytes` (see above).
double nccl_tree_correction(hw::NcclProtocol protocol, Bytes bytes);

/// NCCL's base latency of `algorithm` (ring or tree; seconds) and protocol.
Time nccl_base_latency(hw::CollectiveAlgorithm algorithm, hw::NcclProtocol protocol);

/// The channels a message of `bytes` uses (ring and tree).
int nccl_channels(hw::CollectiveAlgorithm algorithm, hw::NcclProtocol protocol, int ranks,
                  Bytes bytes, int max_channels);

/// One candidate, or nullopt where it does not apply (see above). `max_channels` is the
/// cluster's collectives.max_channels (NCCL_MAX_NCHANNELS; 0: none): C = hw::channel_limit(
/// I.channels, max_channels) everywhere C appears above.
std::optional<NcclEstimate> nccl_candidate(strategies::CollectiveKind kind,
                                           hw::CollectiveAlgorithm algorithm,
                                           hw::NcclProtocol protocol, const NcclGroup& group,
                                           Bytes bytes, const hw::NcclSettings& settings,
                                           int max_channels = 0);

/// The least-time candidate, restricted to `fixed` where given and applicable (automatic: all).
/// A group of one rank moves nothing: zero time. Throws std::invalid_argument for a fixed nvls
/// that cannot run (see above).
NcclEstimate nccl_choose(strategies::CollectiveKind kind, const NcclGroup& group, Bytes bytes,
                         const hw::NcclSettings& settings,
                         hw::CollectiveAlgorithm fixed = hw::CollectiveAlgorithm::automatic,
                         int max_channels = 0);

/// The group's figures from the cluster (overrides applied) for `ranks`.
NcclGroup nccl_group(std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster);

/// Point to point between two ranks (see above); the cluster must have `collectives.nccl`.
Time nccl_p2p_time(std::int32_t src, std::int32_t dst, Bytes bytes, const hw::ClusterSpec& cluster);

/// The channels NCCL spreads a send of `bytes` over within a node whose communicator has
/// `ranks` ranks and `channels` collective channels (see above).
int nccl_p2p_channels(Bytes bytes, int ranks, int channels);

/// The p2p bandwidth between two ranks over the smaller line rate of their links (see above):
/// across nodes the network's p2p_efficiency; within a node the intra fabric's, capped by the
/// channels a transfer of `bytes` uses (communicator: the node's devices).
double nccl_p2p_efficiency(std::int32_t src, std::int32_t dst, Bytes bytes,
                           const hw::ClusterSpec& cluster);

}  // namespace stratasim::sim
