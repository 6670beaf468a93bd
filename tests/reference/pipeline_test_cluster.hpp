// The cluster the pipeline reference tests run on: one node of `devices` test devices whose
// links move `bandwidth` bytes/s with no latency, so 0-byte boundaries make communication free
// and B bytes take B / bandwidth.
#pragma once

#include "hw_models/cluster.hpp"

namespace stratasim::testing {

inline hw::ClusterSpec pipeline_test_cluster(int devices, Bandwidth bandwidth = Bandwidth(1e12)) {
  hw::ClusterSpec c;
  c.name = "free";
  c.nodes = 1;
  c.devices_per_node = devices;
  c.device.name = "test";
  c.device.peak_flops[static_cast<std::size_t>(DType::bf16)] = FlopRate(100e12);
  c.device.memory_capacity = Bytes(80LL << 30);
  c.device.memory_bandwidth = Bandwidth(2e12);
  c.intra_node = {bandwidth, Time::zero()};
  c.inter_node = {bandwidth, Time::zero()};
  return c;
}

}  // namespace stratasim::testing
