// The NCCL-structured collective model (sim/nccl_model.hpp): latencies, bandwidths, channels and
// the algorithm x protocol choice, each expected value worked out by hand from NCCL's formulas
// (NVIDIA/nccl src/graph/tuning.cc, src/enqueue.cc) in the comments; and both network models
// using it.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "hw_models/topology.hpp"
#include "sim/collective_bench.hpp"
#include "sim/flow_network.hpp"
#include "sim/helpers.hpp"
#include "sim/nccl_model.hpp"
#include "sim/network.hpp"

using namespace stratasim;
using hw::CollectiveAlgorithm;
using hw::NcclProtocol;
using strategies::CollectiveKind;

namespace {

Time us(double x) {
  return Time::from_seconds(x * 1e-6);
}

// An H100-like NVLink fabric: efficiency 0.8, NCCL's NVLink ring step latencies (0.6, 1.9,
// 3.4 us), 32 channels of at most 40 GB/s, LL ceiling 141 GB/s, LL128 36.7 GB/s per channel,
// NVLS at 0.68 of the link after 25 us. Network: efficiency 0.9, NET steps (2.7, 4, 14 us).
hw::NcclSettings settings(bool nvls) {
  hw::NcclSettings s;
  s.intra.name = "nvlink";
  s.intra.step_latency = {us(0.6), us(1.9), us(3.4)};
  s.intra.efficiency = 0.8;
  s.intra.p2p_efficiency = 0.7;
  s.intra.channels = 32;
  s.intra.channel_busbw = Bandwidth(40e9);
  s.intra.ll_max_busbw = Bandwidth(141e9);
  s.intra.ll128_channel_busbw = Bandwidth(36.7e9);
  s.intra.nvls_efficiency = nvls ? 0.68 : 0;
  s.intra.nvls_latency = us(25);
  s.network.name = "net";
  s.network.step_latency = {us(2.7), us(4), us(14)};
  s.network.efficiency = 0.9;
  s.network.p2p_efficiency = 0.9;
  return s;
}

sim::NcclGroup one_node(int n) {
  return {.ranks = n,
          .nodes = 1,
          .ranks_per_node = n,
          .intra = Bandwidth(450e9),
          .nic = Bandwidth(50e9)};
}

double seconds_of(const std::optional<sim::NcclEstimate>& e) {
  return e->time.seconds();
}

}  // namespace

TEST_CASE("nccl model: channels per message size (enqueue.cc)") {
  // Simple: nBytes < nc * 512 threads * 64 B -> nc--: 64 KiB = 2 x 32 KiB -> 2 channels.
  CHECK(sim::nccl_channels(CollectiveAlgorithm::ring, NcclProtocol::simple, 8, Bytes(65536), 32) ==
        2);
  // 100 KiB < 4 x 32 KiB -> 3.
  CHECK(sim::nccl_channels(CollectiveAlgorithm::ring, NcclProtocol::simple, 8, Bytes(102400), 32) ==
        3);
  // 1 GiB: every channel.
  CHECK(sim::nccl_channels(CollectiveAlgorithm::ring, NcclProtocol::simple, 8, Bytes(1 << 30),
                           32) == 32);
  // LL on a ring of 8: 512 threads x 8 B x 8 ranks = 32 KiB per channel; LL128 640 x 8 = 5 KiB.
  CHECK(sim::nccl_channels(CollectiveAlgorithm::ring, NcclProtocol::ll, 8, Bytes(65536), 32) == 2);
  CHECK(sim::nccl_channels(CollectiveAlgorithm::ring, NcclProtocol::ll128, 8, Bytes(65536), 32) ==
        12);
  // Never fewer than one.
  CHECK(sim::nccl_channels(CollectiveAlgorithm::ring, NcclProtocol::simple, 8, Bytes(8), 32) == 1);
}

TEST_CASE("nccl model: ring candidates on one node, by hand") {
  const auto s = settings(false);
  const auto g = one_node(8);
  const Bytes mib(1 << 20);
  // Simple: busbw 0.8 x 450 = 360 GB/s, algbw 360 x 8 / 14 = 205.714 GB/s; latency
  // 8.4 + 14 x 3.4 = 56 us; 32 channels (1 MiB / 32 KiB), 32 x 40 GB/s > 360: no ceiling.
  // 56 us + 1048576 / 205.714e9 = 56 + 5.0972 = 61.0972 us.
  const auto simple = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                          NcclProtocol::simple, g, mib, s);
  REQUIRE(simple);
  CHECK(simple->busbw == doctest::Approx(360e9));
  CHECK(simple->latency.seconds() == doctest::Approx(56e-6));
  CHECK(seconds_of(simple) == doctest::Approx(61.0972e-6).epsilon(1e-4));
  // LL128: min(0.92 x 360, 32 x 36.7) = 331.2 GB/s, algbw 189.257; latency 14 + 14 x 1.9 =
  // 40.6 us; 40.6 + 5.5405 = 46.1405 us.
  const auto ll128 = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                         NcclProtocol::ll128, g, mib, s);
  CHECK(ll128->busbw == doctest::Approx(331.2e9));
  CHECK(seconds_of(ll128) == doctest::Approx(46.1405e-6).epsilon(1e-4));
  // LL: min(360 / 2, 141) = 141 GB/s, algbw 80.571; latency 6.6 + 14 x 0.6 = 15 us;
  // 15 + 13.0142 = 28.0142 us.
  const auto ll = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                      NcclProtocol::ll, g, mib, s);
  CHECK(ll->busbw == doctest::Approx(141e9));
  CHECK(seconds_of(ll) == doctest::Approx(28.0142e-6).epsilon(1e-4));
  // The tuner takes the least: LL at 1 MiB; Simple at 1 GiB (LL 15 + 13326.6 us, LL128
  // 40.6 + 5673.5 us, Simple 56 + 5219.6 us).
  const auto small = sim::nccl_choose(CollectiveKind::all_reduce, g, mib, s);
  CHECK(small.algorithm == CollectiveAlgorithm::ring);
  CHECK(small.protocol == NcclProtocol::ll);
  const auto big = sim::nccl_choose(CollectiveKind::all_reduce, g, Bytes(1 << 30), s);
  CHECK(big.protocol == NcclProtocol::simple);
  CHECK(big.time.seconds() == doctest::Approx(56e-6 + 1073741824 / 205.714286e9).epsilon(1e-6));
  // A channel's ceiling: 64 KiB Simple uses 2 channels of 40 GB/s = 80 GB/s of busbw, algbw
  // 80 x 8 / 14 = 45.714 GB/s: 56 + 65536 / 45.714e9 = 57.4336 us.
  const auto few = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                       NcclProtocol::simple, g, Bytes(65536), s);
  CHECK(few->channels == 2);
  CHECK(seconds_of(few) == doctest::Approx(57.4336e-6).epsilon(1e-4));
  // All-gather: n - 1 = 7 steps, algbw 360 x 8 / 7; latency 8.4 + 7 x 3.4 = 32.2 us.
  const auto ag = sim::nccl_candidate(CollectiveKind::all_gather, CollectiveAlgorithm::ring,
                                      NcclProtocol::simple, g, Bytes(1 << 30), s);
  CHECK(ag->latency.seconds() == doctest::Approx(32.2e-6));
  CHECK(ag->algbw == doctest::Approx(360e9 * 8 / 7));
}

TEST_CASE("nccl model: NVLS within one node, and its choice") {
  const auto s = settings(true);
  const auto g = one_node(8);
  // All-reduce through the switch: algbw 0.68 x 450 x 8 / 9 = 272 GB/s after 25 us.
  const auto nvls = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::nvls,
                                        NcclProtocol::simple, g, Bytes(1 << 30), s);
  REQUIRE(nvls);
  CHECK(nvls->algbw == doctest::Approx(272e9));
  // 1 GiB: 25 + 3947.6 us beats the ring's 5275.6 us; 1 MiB: 25 + 3.855 = 28.855 us loses to
  // ring LL's 28.014 us.
  CHECK(sim::nccl_choose(CollectiveKind::all_reduce, g, Bytes(1 << 30), s).algorithm ==
        CollectiveAlgorithm::nvls);
  CHECK(sim::nccl_choose(CollectiveKind::all_reduce, g, Bytes(1 << 20), s).algorithm ==
        CollectiveAlgorithm::ring);
  // Only Simple, only within one node, never for broadcast; a fixed ring is honoured.
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::nvls,
                                  NcclProtocol::ll, g, Bytes(1 << 30), s));
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::broadcast, CollectiveAlgorithm::nvls,
                                  NcclProtocol::simple, g, Bytes(1 << 30), s));
  CHECK(
      sim::nccl_choose(CollectiveKind::all_reduce, g, Bytes(1 << 30), s, CollectiveAlgorithm::ring)
          .algorithm == CollectiveAlgorithm::ring);
  // A fixed nvls that cannot run is an error.
  CHECK_THROWS_AS(sim::nccl_choose(CollectiveKind::all_reduce, g, Bytes(1 << 30), settings(false),
                                   CollectiveAlgorithm::nvls),
                  std::invalid_argument);
}

TEST_CASE("nccl model: NVLS chunk size and loops (calcCollChunking), unseen by the tuner") {
  // Blackwell, one node: 24 NVLS channels x 8 heads = 192 concurrent operations. NCCL starts
  // from 128 KiB and drops to 64 KiB below 64 x 192 x 128 KiB = 1.5 GiB, to 32 KiB below
  // 8 x 192 x 64 KiB = 96 MiB, to 16 KiB below 2 x 192 x 32 KiB = 12 MiB.
  constexpr std::int64_t KiB = 1024;
  constexpr std::int64_t MiB = 1024 * KiB;
  CHECK(sim::nccl_nvls_chunk(Bytes(16 * 1024 * MiB), 24, 8) == 128 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(1536 * MiB), 24, 8) == 128 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(1536 * MiB - 1), 24, 8) == 64 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(96 * MiB), 24, 8) == 64 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(96 * MiB - 1), 24, 8) == 32 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(12 * MiB), 24, 8) == 32 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(12 * MiB - 1), 24, 8) == 16 * KiB);
  // Hopper: 16 x 8 = 128 operations: 128 KiB from 1 GiB, 64 KiB from 64 MiB, 32 KiB from 8 MiB.
  CHECK(sim::nccl_nvls_chunk(Bytes(1024 * MiB), 16, 8) == 128 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(64 * MiB - 1), 16, 8) == 32 * KiB);
  CHECK(sim::nccl_nvls_chunk(Bytes(8 * MiB - 1), 16, 8) == 16 * KiB);
  // Loops: 8 MiB over 192 x 16 KiB = 3 MiB per loop: 3; 16 GiB over 24 MiB: ceil(682.7) = 683.
  CHECK(sim::nccl_nvls_loops(Bytes(8 * MiB), 24, 8) == 3);
  CHECK(sim::nccl_nvls_loops(Bytes(16 * 1024 * MiB), 24, 8) == 683);
  CHECK(sim::nccl_nvls_loops(Bytes(1), 24, 8) == 1);

  // The H100-like fabric with 24 NVLS channels and 10 us per loop. 8 MiB all-reduce over 8
  // ranks: NVLS algbw 272 GB/s, the tuner's time 25 + 8388608 / 272e9 s = 25 + 30.840 us =
  // 55.840 us, the real one 3 loops x 10 us more = 85.840 us. Ring LL128: busbw
  // min(0.92 x 0.8 x 450, 32 x 36.7) = 331.2 GB/s, algbw x 8 / 14 = 189.26 GB/s, latency
  // 14 + 14 x 1.9 = 40.6 us: 40.6 + 44.324 = 84.924 us, faster in truth, yet NCCL's tuner runs
  // NVLS (55.840 < 84.924), and so does the model.
  auto s = settings(true);
  s.intra.nvls_channels = 24;
  s.intra.nvls_loop_latency = us(10);
  const auto g = one_node(8);
  const auto nvls = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::nvls,
                                        NcclProtocol::simple, g, Bytes(8 * MiB), s);
  REQUIRE(nvls);
  CHECK(nvls->tuner_time.seconds() == doctest::Approx(55.840e-6).epsilon(1e-4));
  CHECK(nvls->time.seconds() == doctest::Approx(85.840e-6).epsilon(1e-4));
  CHECK(nvls->channels == 24);
  const auto ll128 = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                         NcclProtocol::ll128, g, Bytes(8 * MiB), s);
  REQUIRE(ll128);
  CHECK(ll128->time.seconds() == doctest::Approx(84.924e-6).epsilon(1e-4));
  CHECK(ll128->tuner_time == ll128->time);
  const auto chosen = sim::nccl_choose(CollectiveKind::all_reduce, g, Bytes(8 * MiB), s);
  CHECK(chosen.algorithm == CollectiveAlgorithm::nvls);
  CHECK(chosen.time.seconds() == doctest::Approx(85.840e-6).epsilon(1e-4));
  // Without nvls_channels there is no loop cost.
  const auto plain = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::nvls,
                                         NcclProtocol::simple, g, Bytes(8 * MiB), settings(true));
  REQUIRE(plain);
  CHECK(plain->time.seconds() == doctest::Approx(55.840e-6).epsilon(1e-4));
}

TEST_CASE("nccl model: tree and ring across two nodes, by hand") {
  const auto s = settings(false);
  const sim::NcclGroup g{.ranks = 16,
                         .nodes = 2,
                         .ranks_per_node = 8,
                         .intra = Bandwidth(450e9),
                         .nic = Bandwidth(50e9)};
  const Bytes gib(1 << 30);
  // Tree Simple: 2 x 0.92 x min(0.8 x 450, 0.9 x 8 x 50 / 1) = 662.4 GB/s busbw, algbw 331.2
  // (1 GiB: floor(log2(2^30 / 64)) = 24, past the correction table); the tree's steps are NCCL's
  // tree hwLat, NVLink 3.4 x 4.0 / 3.4 = 4.0 us, NET 14 + (14 - 14) = 14 us: latency
  // 8.4 + 2 (7 x 4.0 + log2(2) x 14) = 92.4 us.
  const auto tree = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                                        NcclProtocol::simple, g, gib, s);
  REQUIRE(tree);
  CHECK(tree->algbw == doctest::Approx(331.2e9));
  CHECK(tree->latency.seconds() == doctest::Approx(92.4e-6));
  // Ring Simple: busbw min(360, 360) = 360, algbw 360 x 16 / 30 = 192 GB/s; 30 steps, 2 of them
  // between nodes, the others max(3.4, 3 x 1 us net overhead) = 3.4 us: 8.4 + 28 x 3.4 + 2 x 14 =
  // 131.6 us, times the ring plateau 1.4 (1 GiB / (32 channels x 16 ranks) >= 64 B): 184.24 us.
  const auto ring = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                        NcclProtocol::simple, g, gib, s);
  CHECK(ring->algbw == doctest::Approx(192e9));
  CHECK(ring->latency.seconds() == doctest::Approx(184.24e-6));
  // 1 GiB: tree 92.4 + 3242.0 us < ring 184.24 + 5592.4 us.
  const auto chosen = sim::nccl_choose(CollectiveKind::all_reduce, g, gib, s);
  CHECK(chosen.algorithm == CollectiveAlgorithm::tree);
  CHECK(chosen.time.seconds() == doctest::Approx(92.4e-6 + 1073741824 / 331.2e9).epsilon(1e-6));
  // Ring LL: 30 steps, the 28 inside the nodes at max(0.6, 1 us net overhead) = 1 us:
  // 6.6 + 28 x 1 + 2 x 2.7 = 40 us.
  CHECK(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring, NcclProtocol::ll,
                            g, gib, s)
            ->latency.seconds() == doctest::Approx(40e-6));
  // Tree LL128 at 1 MiB: NCCL's correction 0.6 (LL128, floor(log2(2^20 / 64)) = 14):
  // min(120/128 x 662.4, 32 x 36.7) x 0.6 = 621 x 0.6 = 372.6 GB/s busbw, algbw 186.3; latency
  // 14 + 2 (7 x 1.9 x 1.25 / 1.9 + 1 x (4 + 8.5 - 4)) = 14 + 2 (8.75 + 8.5) = 48.5 us.
  const auto tree128 = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                                           NcclProtocol::ll128, g, Bytes(1 << 20), s);
  CHECK(tree128->busbw == doctest::Approx(372.6e9));
  CHECK(tree128->algbw == doctest::Approx(186.3e9));
  CHECK(tree128->latency.seconds() == doctest::Approx(48.5e-6));
  // Four nodes: the busiest node's NICs carry 2 S, so min(360, 360 / 2) = 180.
  const sim::NcclGroup four{.ranks = 32,
                            .nodes = 4,
                            .ranks_per_node = 8,
                            .intra = Bandwidth(450e9),
                            .nic = Bandwidth(50e9)};
  CHECK(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                            NcclProtocol::simple, four, gib, s)
            ->algbw == doctest::Approx(0.92 * 180e9));
  // One rank per node: every step crosses the network at the tree's NET latency (LL: 2.7 + 2.3 =
  // 5 us): a ring LL all-reduce of 2 ranks on 2 nodes, 2 steps, 6.6 + 2 x 5 = 16.6 us.
  const sim::NcclGroup pair{.ranks = 2,
                            .nodes = 2,
                            .ranks_per_node = 1,
                            .intra = Bandwidth(450e9),
                            .nic = Bandwidth(50e9)};
  CHECK(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring, NcclProtocol::ll,
                            pair, gib, s)
            ->latency.seconds() == doctest::Approx(16.6e-6));
  // No tree within one node, nor for an all-gather.
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                                  NcclProtocol::simple, one_node(8), gib, s));
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_gather, CollectiveAlgorithm::tree,
                                  NcclProtocol::simple, g, gib, s));
  // A network without LL128 (ll128 false): no LL128 candidate spanning nodes; the network's LL
  // ceiling applies there.
  auto no_ll128 = s;
  no_ll128.network.ll128 = false;
  no_ll128.network.ll_max_busbw = Bandwidth(39e9);
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                                  NcclProtocol::ll128, g, gib, no_ll128));
  // Tree LL: min(662.4 / 3.8, 141, 39) = 39 GB/s.
  CHECK(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree, NcclProtocol::ll,
                            g, gib, no_ll128)
            ->busbw == doctest::Approx(39e9));
  // A network that runs only Simple (ll and ll128 false): no LL candidate spanning nodes, LL
  // still within one.
  auto simple_only = no_ll128;
  simple_only.network.ll = false;
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                  NcclProtocol::ll, g, gib, simple_only));
  CHECK(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring, NcclProtocol::ll,
                            one_node(8), gib, simple_only));
}

TEST_CASE("nccl model: NCCL's tree correction factor and tree step latencies") {
  // treeCorrectionFactor[protocol][floor(log2(S / 64))] for 64 B to 256 MiB, 1 elsewhere.
  CHECK(sim::nccl_tree_correction(NcclProtocol::ll, Bytes(32)) == 1.0);
  CHECK(sim::nccl_tree_correction(NcclProtocol::ll, Bytes(64)) == 1.0);           // index 0
  CHECK(sim::nccl_tree_correction(NcclProtocol::ll, Bytes(1 << 19)) == 0.4);      // index 13
  CHECK(sim::nccl_tree_correction(NcclProtocol::ll128, Bytes(1 << 20)) == 0.6);   // index 14
  CHECK(sim::nccl_tree_correction(NcclProtocol::simple, Bytes(1 << 28)) == 0.9);  // index 22
  CHECK(sim::nccl_tree_correction(NcclProtocol::simple, Bytes(1 << 29)) == 1.0);  // index 23
  const auto s = settings(false);
  // NVLink: the ring's step times NCCL's tree/ring hwLat: LL128 1.9 x 1.25 / 1.9 = 1.25 us.
  CHECK(sim::nccl_tree_step_latency(s.intra, false, NcclProtocol::ll128).seconds() ==
        doctest::Approx(1.25e-6));
  // Network: the ring's plus NCCL's tree - ring NET hwLat: LL 2.7 + (5.0 - 2.7) = 5 us.
  CHECK(sim::nccl_tree_step_latency(s.network, true, NcclProtocol::ll).seconds() ==
        doctest::Approx(5e-6));
  auto hop = s.network;
  hop.step_latency[0] = us(2.7 + 40);  // a 40 us hop
  CHECK(sim::nccl_tree_step_latency(hop, true, NcclProtocol::ll).seconds() ==
        doctest::Approx(45e-6));
}

TEST_CASE("nccl model: CollNet where the network's switches reduce, by hand") {
  auto s = settings(false);
  const sim::NcclGroup g{.ranks = 16,
                         .nodes = 2,
                         .ranks_per_node = 8,
                         .intra = Bandwidth(450e9),
                         .nic = Bandwidth(50e9)};
  const Bytes gib(1 << 30);
  // No CollNet on a network without it.
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_direct,
                                  NcclProtocol::simple, g, gib, s));
  s.network.collnet_efficiency = 0.9;
  s.network.collnet_latency = us(35);
  // Direct: through the switches 0.9 x 8 x 50 = 360 GB/s; inside the node 0.8 x 450 x 8 / 14 =
  // 205.714 GB/s: algbw 205.714, busbw x 2 x 15 / 16 = 385.714; latency 35 + 2 (1 x 3.7 +
  // 7 x 0.4) = 48 us.
  const auto direct =
      sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_direct,
                          NcclProtocol::simple, g, gib, s);
  REQUIRE(direct);
  CHECK(direct->algbw == doctest::Approx(0.8 * 450e9 * 8 / 14));
  CHECK(direct->busbw == doctest::Approx(0.8 * 450e9 * 8 / 14 * 30 / 16));
  CHECK(direct->latency.seconds() == doctest::Approx(48e-6));
  // Chain: inside 0.8 x 450 = 360, algbw min(360, 360) = 360 GB/s; latency 35 + 2 x 7 x 2.8 =
  // 74.2 us.
  const auto chain =
      sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_chain,
                          NcclProtocol::simple, g, gib, s);
  REQUIRE(chain);
  CHECK(chain->algbw == doctest::Approx(360e9));
  CHECK(chain->latency.seconds() == doctest::Approx(74.2e-6));
  // 1 GiB: chain 74.2 + 2982.6 us beats the tree's 92.4 + 3242.0 us and direct's 48 + 5219.6 us.
  const auto chosen = sim::nccl_choose(CollectiveKind::all_reduce, g, gib, s);
  CHECK(chosen.algorithm == CollectiveAlgorithm::collnet_chain);
  CHECK(chosen.time.seconds() == doctest::Approx(74.2e-6 + 1073741824 / 360e9).epsilon(1e-6));
  // One rank per node: direct moves 0.9 x 50 = 45 GB/s after 35 us (no steps inside a node).
  const sim::NcclGroup pair{.ranks = 2,
                            .nodes = 2,
                            .ranks_per_node = 1,
                            .intra = Bandwidth(450e9),
                            .nic = Bandwidth(50e9)};
  const auto lone =
      sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_direct,
                          NcclProtocol::simple, pair, gib, s);
  CHECK(lone->algbw == doctest::Approx(45e9));
  CHECK(lone->latency.seconds() == doctest::Approx(35e-6));
  // Only all-reduce, only Simple, only spanning nodes, at most 8 ranks on a node.
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_gather, CollectiveAlgorithm::collnet_direct,
                                  NcclProtocol::simple, g, gib, s));
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_chain,
                                  NcclProtocol::ll, g, gib, s));
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_direct,
                                  NcclProtocol::simple, one_node(8), gib, s));
  auto nine = g;
  nine.ranks = 18;
  nine.ranks_per_node = 9;
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_chain,
                                  NcclProtocol::simple, nine, gib, s));
  // A fixed algorithm is honoured.
  CHECK(sim::nccl_choose(CollectiveKind::all_reduce, g, gib, s, CollectiveAlgorithm::collnet_direct)
            .algorithm == CollectiveAlgorithm::collnet_direct);
}

TEST_CASE("nccl model: PAT for all-gather and reduce-scatter at one rank per node, by hand") {
  auto s = settings(false);
  // A network that runs only Simple, so that PAT meets the Simple ring alone.
  s.network.ll = false;
  s.network.ll128 = false;
  const sim::NcclGroup g{.ranks = 4,
                         .nodes = 4,
                         .ranks_per_node = 1,
                         .intra = Bandwidth(450e9),
                         .nic = Bandwidth(50e9)};
  const Bytes mib(1 << 20);
  // The Simple ring's busbw min(0.8 x 450, 0.9 x 1 x 50) = 45 GB/s; PAT's algbw 0.75 x 45 =
  // 33.75 GB/s, busbw x 3 / 4 = 25.3125; latency 8 + 2.8 x 4 + log2(4) x 14 / 3.5 = 27.2 us.
  const auto pat = sim::nccl_candidate(CollectiveKind::all_gather, CollectiveAlgorithm::pat,
                                       NcclProtocol::simple, g, mib, s);
  REQUIRE(pat);
  CHECK(pat->algbw == doctest::Approx(33.75e9));
  CHECK(pat->busbw == doctest::Approx(25.3125e9));
  CHECK(pat->latency.seconds() == doctest::Approx(27.2e-6));
  // The ring: algbw 45 x 4 / 3 = 60 GB/s, 3 steps all across nodes at the tree's NET Simple
  // step (one rank per node), 8.4 + 3 x 14 = 50.4 us. PAT wins while
  // S (1/33.75 - 1/60) GB/s < 23.2 us, below 1.79 MB: 1 MiB PAT (27.2 + 31.07 = 58.27 us
  // against 50.4 + 17.48 = 67.88 us), 16 MiB the ring.
  const auto small = sim::nccl_choose(CollectiveKind::all_gather, g, mib, s);
  CHECK(small.algorithm == CollectiveAlgorithm::pat);
  CHECK(small.time.seconds() == doctest::Approx(27.2e-6 + 1048576 / 33.75e9).epsilon(1e-6));
  CHECK(sim::nccl_choose(CollectiveKind::reduce_scatter, g, mib, s).algorithm ==
        CollectiveAlgorithm::pat);
  CHECK(sim::nccl_choose(CollectiveKind::all_gather, g, Bytes(16 << 20), s).algorithm ==
        CollectiveAlgorithm::ring);
  // Not for all-reduce, not with two ranks on a node, not where the network disables it.
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::pat,
                                  NcclProtocol::simple, g, mib, s));
  const sim::NcclGroup two{.ranks = 8,
                           .nodes = 4,
                           .ranks_per_node = 2,
                           .intra = Bandwidth(450e9),
                           .nic = Bandwidth(50e9)};
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_gather, CollectiveAlgorithm::pat,
                                  NcclProtocol::simple, two, mib, s));
  auto off = s;
  off.network.pat = false;
  CHECK_FALSE(sim::nccl_candidate(CollectiveKind::all_gather, CollectiveAlgorithm::pat,
                                  NcclProtocol::simple, g, mib, off));
  CHECK(sim::nccl_choose(CollectiveKind::all_gather, g, mib, off).algorithm ==
        CollectiveAlgorithm::ring);
}

TEST_CASE("nccl model: point to point spreads over channels by size (addP2pToPlan)") {
  // 16 channels, 8 ranks: P = 16, a send starts on 16 halved until 8 x c <= 16, c = 2, and
  // doubles while S / c > 32 x 512 KiB = 16 MiB (and c <= 8).
  CHECK(sim::nccl_p2p_channels(Bytes(128LL << 20), 8, 16) == 8);  // 64 -> 32 -> 16 MiB a part
  CHECK(sim::nccl_p2p_channels(Bytes(256LL << 20), 8, 16) == 16);
  CHECK(sim::nccl_p2p_channels(Bytes(1LL << 30), 8, 16) == 16);  // at most P
  CHECK(sim::nccl_p2p_channels(Bytes(102400), 8, 16) == 2);
  CHECK(sim::nccl_p2p_channels(Bytes(1000), 8, 16) == 1);  // at most ceil(S / 64 KiB)
  // Within a node of 8 at 100 GB/s, 32 channels (P = 32, c from 4), 5 GB/s per p2p channel:
  // 128 MiB on 8 channels, min(0.7, 8 x 5 / 100) = 0.4 of the link; 1 GiB on 32, 0.7.
  auto cluster = testing::test_cluster(1, 8);
  cluster.collectives.nccl = settings(false);
  cluster.collectives.nccl->intra.p2p_channel_bandwidth = Bandwidth(5e9);
  const Bytes mid(128LL << 20);
  CHECK(sim::nccl_p2p_efficiency(0, 1, mid, cluster) == doctest::Approx(0.4));
  CHECK(sim::nccl_p2p_efficiency(0, 1, Bytes(1LL << 30), cluster) == doctest::Approx(0.7));
  const sim::AnalyticalNetwork analytical(cluster);
  const double expected = 1e-6 + 134217728 / 40e9;
  CHECK(analytical.p2p_time(0, 1, mid).seconds() == doctest::Approx(expected));
  // The flow model: the same rate for a transfer alone.
  auto flow_cluster = cluster;
  flow_cluster.network_model = hw::NetworkModel::flow;
  const strategies::Program program(8);
  sim::FlowNetwork flow(flow_cluster, hw::build_topology(flow_cluster), program);
  sim::TransferRequest r;
  r.collective = false;
  r.src = 0;
  r.dst = 1;
  r.bytes = mid;
  flow.start(0, r, Time::zero());
  // Its route's latency first, then the flow.
  std::vector<sim::TransferId> finished;
  Time end = Time::zero();
  while (finished.empty() && flow.next_completion() != Time::infinity()) {
    end = flow.next_completion();
    flow.advance_to(end, finished);
  }
  CHECK(finished.size() == 1);
  CHECK(end.seconds() == doctest::Approx(expected).epsilon(1e-3));
}

TEST_CASE("nccl model: both network models take its time for a collective alone") {
  auto cluster = testing::test_cluster(1, 8);  // 100 GB/s NVLink
  cluster.collectives.nccl = settings(false);
  std::vector<std::int32_t> ranks(8);
  std::iota(ranks.begin(), ranks.end(), 0);
  const std::vector<Bytes> sizes{Bytes(1 << 20), Bytes(256 << 20)};
  const auto analytical =
      sim::measure_collective(cluster, CollectiveKind::all_reduce, ranks, sizes);
  auto flow_cluster = cluster;
  flow_cluster.network_model = hw::NetworkModel::flow;
  const auto flow = sim::measure_collective(flow_cluster, CollectiveKind::all_reduce, ranks, sizes);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto expected =
        sim::nccl_choose(CollectiveKind::all_reduce, sim::nccl_group(ranks, cluster), sizes[i],
                         *cluster.collectives.nccl);
    CHECK(analytical[i].time == expected.time);
    CHECK(analytical[i].protocol == expected.protocol);
    // The flow model: the schedule's flows scaled to the model's bandwidth, its latency first.
    CHECK(flow[i].time.seconds() == doctest::Approx(expected.time.seconds()).epsilon(1e-3));
  }
  // 256 MiB on 100 GB/s links: ring Simple, busbw 0.8 x 100 = 80 GB/s.
  CHECK(analytical[1].busbw == doctest::Approx(80e9).epsilon(0.01));
  // Point to point at the intra fabric's p2p efficiency: 1 us + 1 GiB / (0.7 x 100 GB/s).
  const sim::AnalyticalNetwork network(cluster);
  CHECK(network.p2p_time(0, 1, Bytes(1 << 30)).seconds() ==
        doctest::Approx(1e-6 + 1073741824 / 70e9));
}

TEST_CASE("nccl model: collectives.max_channels (NCCL_MAX_NCHANNELS) trades bandwidth for SMs") {
  const auto s = settings(false);
  const auto g = one_node(8);
  const Bytes gib(1 << 30);
  // Unlimited: 32 channels x 40 GB/s > busbw 360 GB/s: 56 us + 2^30 / 205.714 GB/s.
  const auto all = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                       NcclProtocol::simple, g, gib, s);
  CHECK(all->channels == 32);
  // 4 channels: the channels' ceiling 4 x 40 = 160 GB/s of busbw under 360: algbw
  // 205.714 x 160 / 360 = 91.4286 GB/s, 56 us + 2^30 / 91.4286e9 s = 56 + 11743.99 us.
  const auto four = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                        NcclProtocol::simple, g, gib, s, 4);
  CHECK(four->channels == 4);
  CHECK(seconds_of(four) == doctest::Approx(56e-6 + 1073741824 / 91.4286e9).epsilon(1e-5));
  CHECK(four->time > all->time);
  // 9 channels: 360 GB/s, no longer under busbw: the unlimited time. A limit above the
  // fabric's 32 channels changes nothing.
  CHECK(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                            NcclProtocol::simple, g, gib, s, 9)
            ->time == all->time);
  CHECK(sim::nccl_choose(CollectiveKind::all_reduce, g, gib, s, CollectiveAlgorithm::automatic, 64)
            .time == sim::nccl_choose(CollectiveKind::all_reduce, g, gib, s).time);
  // The one rule the SM side shares.
  CHECK(hw::channel_limit(32, 4) == 4);
  CHECK(hw::channel_limit(32, 0) == 32);
  CHECK(hw::channel_limit(16, 32) == 16);
}

TEST_CASE("nccl model: both network models take CollNet's and PAT's times") {
  struct Case {
    int nodes, per_node;
    CollectiveKind kind;
    CollectiveAlgorithm expected;
    Bytes bytes;
  };
  // CollNet across 2 nodes of 8 at 1 GiB (the CollNet case above, on the test cluster's
  // 100 GB/s NVLink and 10 GB/s NICs: chain 0.9 x 8 x 10 = 72 GB/s beats the tree); PAT on 4
  // nodes of one at 256 KiB.
  for (const Case c :
       {Case{2, 8, CollectiveKind::all_reduce, CollectiveAlgorithm::collnet_chain, Bytes(1 << 30)},
        Case{4, 1, CollectiveKind::all_gather, CollectiveAlgorithm::pat, Bytes(256 << 10)}}) {
    auto cluster = testing::test_cluster(c.nodes, c.per_node);
    cluster.collectives.nccl = settings(false);
    cluster.collectives.nccl->network.collnet_efficiency = 0.9;
    cluster.collectives.nccl->network.collnet_latency = us(35);
    cluster.collectives.nccl->network.ll = false;
    cluster.collectives.nccl->network.ll128 = false;
    std::vector<std::int32_t> ranks(static_cast<std::size_t>(c.nodes * c.per_node));
    std::iota(ranks.begin(), ranks.end(), 0);
    const std::vector<Bytes> sizes{c.bytes};
    const auto expected = sim::nccl_choose(c.kind, sim::nccl_group(ranks, cluster), c.bytes,
                                           *cluster.collectives.nccl);
    CHECK(expected.algorithm == c.expected);
    const auto analytical = sim::measure_collective(cluster, c.kind, ranks, sizes);
    CHECK(analytical[0].algorithm == c.expected);
    CHECK(analytical[0].time == expected.time);
    auto flow_cluster = cluster;
    flow_cluster.network_model = hw::NetworkModel::flow;
    const auto flow = sim::measure_collective(flow_cluster, c.kind, ranks, sizes);
    CHECK(flow[0].time.seconds() == doctest::Approx(expected.time.seconds()).epsilon(1e-3));
  }
}

TEST_CASE("nccl model: the analytical network's remembered choices are nccl_choose's") {
  // AnalyticalNetwork works out each (group, kind, size) once and reuses it: every answer,
  // asked in any order and again, must be the one nccl_choose gives for that group and size.
  auto cluster = testing::test_cluster(2, 8);
  cluster.collectives.nccl = settings(true);
  strategies::Program program(16);
  std::vector<std::int32_t> node(8), both(16);
  std::iota(node.begin(), node.end(), 0);
  std::iota(both.begin(), both.end(), 0);
  const std::uint32_t inside = program.add_group(node, "tp 0");
  const std::uint32_t across = program.add_group(both, "dp 0");
  const sim::AnalyticalNetwork network(cluster, program);
  const std::vector<CollectiveKind> kinds{CollectiveKind::all_reduce, CollectiveKind::all_gather,
                                          CollectiveKind::reduce_scatter};
  const std::vector<Bytes> sizes{Bytes(4096), Bytes(1 << 20), Bytes(256 << 20), Bytes(4096)};
  for (int pass = 0; pass < 2; ++pass) {
    for (const std::uint32_t g : {inside, across}) {
      const auto group = sim::nccl_group(g == inside ? node : both, cluster);
      for (const Bytes bytes : sizes) {
        for (const CollectiveKind kind : kinds) {
          const auto expected = sim::nccl_choose(kind, group, bytes, *cluster.collectives.nccl);
          const auto got = network.nccl_estimate(kind, g, bytes);
          CAPTURE(pass);
          CAPTURE(bytes.count());
          CHECK(got.time == expected.time);
          CHECK(got.algorithm == expected.algorithm);
          CHECK(got.protocol == expected.protocol);
          CHECK(network.collective_time(kind, g, bytes) == expected.time);
        }
      }
    }
  }
  // The answers differ between the kinds and between the sizes (so a mixed-up entry would
  // show): an all-reduce moves twice an all-gather's bytes (2 (n-1)/n against (n-1)/n).
  const Bytes big(256 << 20);
  CHECK(network.nccl_estimate(CollectiveKind::all_gather, inside, big).time <
        network.nccl_estimate(CollectiveKind::all_reduce, inside, big).time);
  CHECK(network.nccl_estimate(CollectiveKind::all_reduce, inside, Bytes(4096)).time <
        network.nccl_estimate(CollectiveKind::all_reduce, inside, big).time);
}

TEST_CASE("nccl model: an all-to-all across nodes sends each rank's shares over NVLink and NIC") {
  // 16 ranks on 2 nodes of 8: of S, a rank sends 7/16 over NVLink at 0.7 x 450 = 315 GB/s and
  // 8/16 through its NIC at 0.9 x 50 = 45 GB/s, at once: algbw = 1 / max(7 / (16 x 315e9),
  // 8 / (16 x 45e9)) = 90 GB/s, busbw = 90 x 15 / 16 = 84.375 GB/s. (A ring counting the node's
  // 8 NICs as shared, min(315, 8 x 45) x 16 / 15, would say 336 GB/s.)
  const auto s = settings(false);
  const sim::NcclGroup g{.ranks = 16,
                         .nodes = 2,
                         .ranks_per_node = 8,
                         .intra = Bandwidth(450e9),
                         .nic = Bandwidth(50e9)};
  const auto a2a = sim::nccl_candidate(CollectiveKind::all_to_all, CollectiveAlgorithm::ring,
                                       NcclProtocol::simple, g, Bytes(1 << 30), s);
  REQUIRE(a2a);
  CHECK(a2a->algbw == doctest::Approx(90e9));
  CHECK(a2a->busbw == doctest::Approx(84.375e9));
  // Within one node nothing changes: busbw 0.7 x 450 = 315 GB/s.
  CHECK(sim::nccl_candidate(CollectiveKind::all_to_all, CollectiveAlgorithm::ring,
                            NcclProtocol::simple, one_node(8), Bytes(1 << 30), s)
            ->busbw == doctest::Approx(315e9));
}
