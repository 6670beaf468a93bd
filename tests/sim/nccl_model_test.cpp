// The NCCL-structured collective model (sim/nccl_model.hpp): latencies, bandwidths, channels and
// the algorithm x protocol choice, each expected value worked out by hand from NCCL's formulas
// (NVIDIA/nccl src/graph/tuning.cc, src/enqueue.cc) in the comments; and both network models
// using it.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "sim/collective_bench.hpp"
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

TEST_CASE("nccl model: tree and ring across two nodes, by hand") {
  const auto s = settings(false);
  const sim::NcclGroup g{.ranks = 16,
                         .nodes = 2,
                         .ranks_per_node = 8,
                         .intra = Bandwidth(450e9),
                         .nic = Bandwidth(50e9)};
  const Bytes gib(1 << 30);
  // Tree Simple: 2 x 0.92 x min(0.8 x 450, 0.9 x 8 x 50 / 1) = 662.4 GB/s busbw, algbw 331.2;
  // latency 8.4 + 2 (7 x 3.4 + log2(2) x 14) = 84 us.
  const auto tree = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                                        NcclProtocol::simple, g, gib, s);
  REQUIRE(tree);
  CHECK(tree->algbw == doctest::Approx(331.2e9));
  CHECK(tree->latency.seconds() == doctest::Approx(84e-6));
  // Ring Simple: busbw min(360, 360) = 360, algbw 360 x 16 / 30 = 192 GB/s; 30 steps, 2 of them
  // between nodes: 8.4 + 28 x 3.4 + 2 x 14 = 131.6 us.
  const auto ring = sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::ring,
                                        NcclProtocol::simple, g, gib, s);
  CHECK(ring->algbw == doctest::Approx(192e9));
  CHECK(ring->latency.seconds() == doctest::Approx(131.6e-6));
  // 1 GiB: tree 84 + 3242.0 us < ring 131.6 + 5592.4 us.
  const auto chosen = sim::nccl_choose(CollectiveKind::all_reduce, g, gib, s);
  CHECK(chosen.algorithm == CollectiveAlgorithm::tree);
  CHECK(chosen.time.seconds() == doctest::Approx(84e-6 + 1073741824 / 331.2e9).epsilon(1e-6));
  // Four nodes: the busiest node's NICs carry 2 S, so min(360, 360 / 2) = 180.
  const sim::NcclGroup four{.ranks = 32,
                            .nodes = 4,
                            .ranks_per_node = 8,
                            .intra = Bandwidth(450e9),
                            .nic = Bandwidth(50e9)};
  CHECK(sim::nccl_candidate(CollectiveKind::all_reduce, CollectiveAlgorithm::tree,
                            NcclProtocol::simple, four, gib, s)
            ->algbw == doctest::Approx(0.92 * 180e9));
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
