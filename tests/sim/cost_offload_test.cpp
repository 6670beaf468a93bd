// Costs off the device (ZeRO-Offload, ZeRO-Infinity): the host Adam step and copies between
// device, host and NVMe, by hand.
#include <doctest/doctest.h>

#include <stdexcept>

#include "sim/cost.hpp"
#include "sim/helpers.hpp"

using namespace stratasim;
using strategies::Copy;
using strategies::Kernel;
using strategies::MemoryTier;
using strategies::OptimizerKind;
using strategies::OptimizerStep;

namespace {

// 4 devices per node sharing a host of 100 GB/s memory, 8 cores at 1e8 Adam params/s each, a
// 10 GB/s PCIe link with 5 us latency per device, and 20 GB/s of NVMe per node.
hw::ClusterSpec offload_cluster() {
  auto c = testing::test_cluster(1, 4);
  hw::HostSpec host;
  host.memory_capacity = Bytes(1LL << 40);
  host.memory_bandwidth = Bandwidth(100e9);
  host.cores = 8;
  host.adam_params_per_second_per_core = 1e8;
  host.pcie = hw::LinkSpec{Bandwidth(10e9), Time::us(5)};
  c.host = host;
  c.nvme = hw::NvmeSpec{Bytes(1LL << 42), Bandwidth(20e9)};
  return c;
}

Time time_of(const sim::DeviceCostModel& cost, strategies::KernelWork work) {
  return cost.kernel_time(Kernel{work, "k"});
}

}  // namespace

TEST_CASE("cost: host Adam is bound by the node's cores or memory, shared by its devices") {
  sim::DeviceCostModel cost(offload_cluster());
  // 1e9 parameters, fp16 weights: each device gets 8 / 4 = 2 cores at 1e8 params/s = 5 s; its
  // memory share is 100 / 4 = 25 GB/s for (16 + 12 + 2) = 30 bytes per parameter = 30e9 bytes
  // = 1.2 s. Compute bound: 5 s, with no launch overhead.
  OptimizerStep adam{1'000'000'000, OptimizerKind::adam, DType::fp16, true};
  CHECK(time_of(cost, adam) == Time::ms(5000));

  // A node of one device with slow memory: 8 cores = 1.25 s of compute, 30e9 bytes at 10 GB/s
  // = 3 s of memory: memory bound.
  auto c = offload_cluster();
  c.devices_per_node = 1;
  c.host->memory_bandwidth = Bandwidth(10e9);
  sim::DeviceCostModel one(c);
  CHECK(time_of(one, adam) == Time::ms(3000));
  // SGD moves (8 + 4 + 2) = 14 bytes per parameter: 14e9 bytes at 10 GB/s = 1.4 s, longer
  // than its 1.25 s of compute.
  OptimizerStep sgd{1'000'000'000, OptimizerKind::sgd, DType::fp16, true};
  CHECK(time_of(one, sgd) == Time::ms(1400));
  // A step on the device keeps its roofline: 28e6 bytes at 5e11 B/s = 56 us, plus the launch.
  OptimizerStep on_device{1'000'000, OptimizerKind::adam, DType::bf16, false};
  CHECK(time_of(one, on_device) == Time::us(4) + Time::us(56));
}

TEST_CASE("cost: copies over PCIe, to and from NVMe, and within the host") {
  sim::DeviceCostModel cost(offload_cluster());
  const Bytes gb(1'000'000'000);
  // Device <-> host: 5 us + 1e9 / 10e9 s = 100.005 ms, either way.
  CHECK(time_of(cost, Copy{gb, MemoryTier::device, MemoryTier::host}) == Time::us(100'005));
  CHECK(time_of(cost, Copy{gb, MemoryTier::host, MemoryTier::device}) == Time::us(100'005));
  // Host <-> NVMe: 1e9 bytes at 20 / 4 = 5 GB/s per device = 200 ms.
  CHECK(time_of(cost, Copy{gb, MemoryTier::nvme, MemoryTier::host}) == Time::ms(200));
  CHECK(time_of(cost, Copy{gb, MemoryTier::host, MemoryTier::nvme}) == Time::ms(200));
  // Device <-> NVMe: PCIe and NVMe in series: 100.005 + 200 ms.
  CHECK(time_of(cost, Copy{gb, MemoryTier::nvme, MemoryTier::device}) == Time::us(300'005));
  CHECK(time_of(cost, Copy{gb, MemoryTier::device, MemoryTier::nvme}) == Time::us(300'005));
  // Within the host: read and write 2e9 bytes at 25 GB/s = 80 ms.
  CHECK(time_of(cost, Copy{gb, MemoryTier::host, MemoryTier::host}) == Time::ms(80));
  // Device to device keeps the HBM roofline: 4 us launch + 2e9 / 5e11 = 4 ms.
  CHECK(time_of(cost, Copy{gb, MemoryTier::device, MemoryTier::device}) ==
        Time::us(4) + Time::ms(4));
}

TEST_CASE("cost: off-device work needs the cluster's host and NVMe") {
  auto c = offload_cluster();
  c.nvme.reset();
  sim::DeviceCostModel no_nvme(c);
  // PCIe copies need no NVMe: 5 us + 1e9 / 10e9 s.
  CHECK(time_of(no_nvme, Copy{Bytes(1'000'000'000), MemoryTier::device, MemoryTier::host}) ==
        Time::us(100'005));
  CHECK_THROWS_WITH_AS(time_of(no_nvme, Copy{Bytes(10), MemoryTier::host, MemoryTier::nvme}),
                       doctest::Contains("NVMe"), std::invalid_argument);
  c.host.reset();
  sim::DeviceCostModel bare(c);
  CHECK_THROWS_WITH_AS(time_of(bare, OptimizerStep{10, OptimizerKind::adam, DType::bf16, true}),
                       doctest::Contains("host"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(time_of(bare, Copy{Bytes(10), MemoryTier::device, MemoryTier::host}),
                       doctest::Contains("host"), std::invalid_argument);
  // A device alone (no cluster) cannot cost them either.
  sim::DeviceCostModel device_only(testing::test_device());
  CHECK_THROWS_AS(time_of(device_only, OptimizerStep{10, OptimizerKind::adam, DType::bf16, true}),
                  std::invalid_argument);
}
