// The simulator's use of a calibrated profile's version 2 figures (docs/calibration.md):
// measured host <-> device copy bandwidths in the cost model, and collectives measured within
// one node in the analytical network (interpolated in log bytes), which the flow-level network
// does not use. Expected values by hand.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "sim/collective_bench.hpp"
#include "sim/cost.hpp"
#include "sim/helpers.hpp"
#include "sim/network.hpp"
#include "sim/simulator.hpp"

using namespace stratasim;
using strategies::CollectiveKind;
using strategies::Copy;
using strategies::Kernel;
using strategies::MemoryTier;

namespace {

constexpr std::size_t kAllReduce = 0;  // hw::kCollectiveKindNames order

/// The test device with a profile of measured all-reduces within a node: over 8 devices
/// (1 MiB, 40 us) and (64 MiB, 1200 us); over 4 devices (1 MiB, 25 us). Copy bandwidths as given.
std::shared_ptr<const hw::DeviceProfile> profile(std::optional<Bandwidth> h2d = std::nullopt,
                                                 std::optional<Bandwidth> d2h = std::nullopt) {
  hw::DeviceProfile p;
  p.device = "test-device";
  p.source = "test";
  p.host_to_device_bandwidth = h2d;
  p.device_to_host_bandwidth = d2h;
  p.collectives.push_back({kAllReduce, 8, Bytes(64 << 20), Time::us(1200)});
  p.collectives.push_back({kAllReduce, 8, Bytes(1 << 20), Time::us(40)});
  p.collectives.push_back({kAllReduce, 4, Bytes(1 << 20), Time::us(25)});
  return std::make_shared<const hw::DeviceProfile>(std::move(p));
}

/// Two nodes of 8 test devices (intra-node 100 GB/s, 1 us; inter-node 10 GB/s, 5 us) whose
/// devices carry the profile above.
hw::ClusterSpec profiled_cluster() {
  auto c = testing::test_cluster(2, 8);
  c.device.profile = profile();
  return c;
}

/// Groups: 0 = ranks 0-7 (node 0), 1 = ranks 8-11 (node 1), 2 = ranks 0-1 (no rows for 2),
/// 3 = ranks 0-7 and 8-15 (two nodes).
strategies::Program grouped_program() {
  strategies::Program program(16);
  program.add_group({0, 1, 2, 3, 4, 5, 6, 7}, "node 0");
  program.add_group({8, 9, 10, 11}, "half of node 1");
  program.add_group({0, 1}, "pair");
  program.add_group({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, "all");
  return program;
}

}  // namespace

TEST_CASE("measured profile: host <-> device copies take the measured bandwidth, pcie latency") {
  // One device per node; a 10 GB/s PCIe link with 5 us latency; 20 GB/s of NVMe.
  auto c = testing::test_cluster(1, 1);
  hw::HostSpec host;
  host.memory_capacity = Bytes(1LL << 40);
  host.memory_bandwidth = Bandwidth(100e9);
  host.pcie = hw::LinkSpec{Bandwidth(10e9), Time::us(5)};
  c.host = host;
  c.nvme = hw::NvmeSpec{Bytes(1LL << 42), Bandwidth(20e9)};
  c.device.profile = profile(Bandwidth(25e9), Bandwidth(20e9));
  const sim::DeviceCostModel cost(c);
  auto time_of = [&](MemoryTier from, MemoryTier to) {
    return cost.kernel_time(Kernel{Copy{Bytes(1'000'000'000), from, to}, "copy"});
  };
  // Host to device: 5 us + 1e9 B / 25e9 B/s = 5 us + 40 ms.
  CHECK(time_of(MemoryTier::host, MemoryTier::device) == Time::us(40'005));
  // Device to host: 5 us + 1e9 / 20e9 = 5 us + 50 ms.
  CHECK(time_of(MemoryTier::device, MemoryTier::host) == Time::us(50'005));
  // Device to NVMe: the device-to-host leg (50 ms + 5 us), then 1e9 / 20e9 of NVMe = 50 ms.
  CHECK(time_of(MemoryTier::device, MemoryTier::nvme) == Time::us(100'005));
  // NVMe to device: 5 us + 40 ms, then 50 ms.
  CHECK(time_of(MemoryTier::nvme, MemoryTier::device) == Time::us(90'005));
  // Device to device keeps the memory model: 2e9 B at 1e12 x 0.5, plus the 4 us launch.
  CHECK(time_of(MemoryTier::device, MemoryTier::device) == Time::us(4'004));

  // A direction the profile does not measure keeps the link: 5 us + 1e9 / 10e9 = 100 ms.
  c.device.profile = profile(Bandwidth(25e9), std::nullopt);
  const sim::DeviceCostModel half(c);
  CHECK(half.kernel_time(Kernel{Copy{Bytes(1'000'000'000), MemoryTier::device, MemoryTier::host},
                                "copy"}) == Time::us(100'005));
  CHECK(half.kernel_time(Kernel{Copy{Bytes(1'000'000'000), MemoryTier::host, MemoryTier::device},
                                "copy"}) == Time::us(40'005));
}

TEST_CASE("measured profile: collectives within one node come from the measured rows") {
  const auto cluster = profiled_cluster();
  const auto program = grouped_program();
  const sim::AnalyticalNetwork net(cluster, program);
  auto plain_cluster = testing::test_cluster(2, 8);
  const sim::AnalyticalNetwork plain(plain_cluster, program);

  // At a measured size: its time.
  CHECK(net.collective_time(CollectiveKind::all_reduce, 0, Bytes(1 << 20)) == Time::us(40));
  CHECK(net.collective_time(CollectiveKind::all_reduce, 0, Bytes(64 << 20)) == Time::us(1200));
  // 8 MiB: linear in ln S between 1 MiB and 64 MiB,
  // 40 us + (1200 - 40) us * ln(8 MiB / 1 MiB) / ln(64 MiB / 1 MiB) = 40 + 1160 * 3/6 = 620 us.
  CHECK(net.collective_time(CollectiveKind::all_reduce, 0, Bytes(8 << 20)) == Time::us(620));
  // Below 1 MiB: the 1 MiB time is a floor; above 64 MiB: 64 MiB's bandwidth,
  // 1200 us * 128 MiB / 64 MiB = 2400 us.
  CHECK(net.collective_time(CollectiveKind::all_reduce, 0, Bytes(1024)) == Time::us(40));
  CHECK(net.collective_time(CollectiveKind::all_reduce, 0, Bytes(128 << 20)) == Time::us(2400));
  // Four devices of node 1: its own row (one point: 25 us at 1 MiB, 50 us at 2 MiB).
  CHECK(net.collective_time(CollectiveKind::all_reduce, 1, Bytes(1 << 20)) == Time::us(25));
  CHECK(net.collective_time(CollectiveKind::all_reduce, 1, Bytes(2 << 20)) == Time::us(50));
  // No rows for the kind (all-gather) or the group size (2): the alpha-beta model.
  for (Bytes s : {Bytes(1 << 20), Bytes(8 << 20)}) {
    CHECK(net.collective_time(CollectiveKind::all_gather, 0, s) ==
          plain.collective_time(CollectiveKind::all_gather, 0, s));
    CHECK(net.collective_time(CollectiveKind::all_reduce, 2, s) ==
          plain.collective_time(CollectiveKind::all_reduce, 2, s));
    // A group spanning nodes: the model (hierarchical), never the rows.
    CHECK(net.collective_time(CollectiveKind::all_reduce, 3, s) ==
          plain.collective_time(CollectiveKind::all_reduce, 3, s));
  }
  // The ring's own figure for 8 MiB over 8 devices differs (2 * 7/8 * 8388608 B / 1e11 B/s
  // + 14 us = 146.8 us + 14 us), so the rows really replaced it.
  CHECK(plain.collective_time(CollectiveKind::all_reduce, 0, Bytes(8 << 20)) ==
        Time::ps(146'800'640) + Time::us(14));

  // Shape-based costs (partitioning) use the base device's rows for a shape within one node.
  CHECK(net.collective_time(CollectiveKind::all_reduce, sim::GroupShape{8, 1, 8}, Bytes(8 << 20)) ==
        Time::us(620));
  CHECK(
      net.collective_time(CollectiveKind::all_reduce, sim::GroupShape{16, 2, 8}, Bytes(8 << 20)) ==
      plain.collective_time(CollectiveKind::all_reduce, sim::GroupShape{16, 2, 8}, Bytes(8 << 20)));
}

TEST_CASE("measured profile: a link override or another device in the group keeps the model") {
  const auto program = grouped_program();
  const auto plain_cluster = testing::test_cluster(2, 8);
  const sim::AnalyticalNetwork plain(plain_cluster, program);
  const Bytes s(8 << 20);

  // Rank 3 has a degraded NVLink: the what-if must show, so group 0 is costed by the model.
  auto degraded = profiled_cluster();
  hw::DeviceOverride link;
  link.ranks = {3};
  link.intra_node = hw::LinkSpec{Bandwidth(5e10), Time::us(1)};
  degraded.overrides.push_back(link);
  auto plain_degraded = plain_cluster;
  plain_degraded.overrides.push_back(link);
  CHECK(
      sim::AnalyticalNetwork(degraded, program).collective_time(CollectiveKind::all_reduce, 0, s) ==
      sim::AnalyticalNetwork(plain_degraded, program)
          .collective_time(CollectiveKind::all_reduce, 0, s));
  // Group 1 (node 1) is not affected: still the rows.
  CHECK(sim::AnalyticalNetwork(degraded, program)
            .collective_time(CollectiveKind::all_reduce, 1, Bytes(1 << 20)) == Time::us(25));

  // Rank 5 is another device (without the profile): the group has no common profile.
  auto mixed = profiled_cluster();
  hw::DeviceOverride other;
  other.ranks = {5};
  other.device = testing::test_device();
  mixed.overrides.push_back(other);
  CHECK(sim::AnalyticalNetwork(mixed, program).collective_time(CollectiveKind::all_reduce, 0, s) ==
        plain.collective_time(CollectiveKind::all_reduce, 0, s));
}

TEST_CASE("measured profile: the flow-level network keeps its link model") {
  auto flow = profiled_cluster();
  flow.network_model = hw::NetworkModel::flow;
  auto plain = testing::test_cluster(2, 8);
  plain.network_model = hw::NetworkModel::flow;
  const std::vector<std::int32_t> ranks{0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<Bytes> sizes{Bytes(8 << 20)};
  const auto with_rows = sim::measure_collective(flow, CollectiveKind::all_reduce, ranks, sizes);
  const auto without = sim::measure_collective(plain, CollectiveKind::all_reduce, ranks, sizes);
  REQUIRE(with_rows.size() == 1);
  CHECK(with_rows[0].time == without[0].time);
  CHECK(with_rows[0].time != Time::us(620));
  // The analytical bench sees the rows.
  auto analytical = profiled_cluster();
  CHECK(sim::measure_collective(analytical, CollectiveKind::all_reduce, ranks, sizes)[0].time ==
        Time::us(620));
}

TEST_CASE("measured profile: a simulated all-reduce within a node takes the measured time") {
  auto cluster = testing::test_cluster(1, 8);
  cluster.device.profile = profile();
  strategies::Program program(8);
  const auto group = program.add_group({0, 1, 2, 3, 4, 5, 6, 7}, "node");
  for (int r = 0; r < 8; ++r) {
    program.begin_rank(r);
    strategies::OpInfo info;
    info.stream = strategies::Stream::dp_comm;
    info.label = "all-reduce";
    program.add(
        strategies::Collective{CollectiveKind::all_reduce, DType::bf16, group, Bytes(8 << 20)},
        info);
  }
  program.finish();
  const auto timeline = sim::simulate(program, cluster);
  // One all-reduce of 8 MiB over the 8 devices: 620 us (interpolated as above), from 0.
  REQUIRE(timeline.completed);
  REQUIRE(timeline.spans.size() == 8);
  for (const auto& span : timeline.spans) {
    CHECK(span.start == Time::zero());
    CHECK(span.end == Time::us(620));
  }
}
