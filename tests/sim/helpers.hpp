// Hand-picked hardware for the simulator's tests, with round figures that make hand
// calculations easy.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/device.hpp"
#include "sim/network.hpp"
#include "strategies/program.hpp"

namespace stratasim::testing {

/// 100 TFLOP/s bf16, 1 TB/s memory, 50% of both achievable, 4 us launches, 108 units, 128x128
/// tiles, 1000 bytes of memory unless told otherwise.
inline hw::DeviceSpec test_device(Bytes capacity = Bytes(1000)) {
  hw::DeviceSpec d;
  d.name = "test-device";
  d.peak_flops[static_cast<std::size_t>(DType::bf16)] = FlopRate(1e14);
  d.peak_flops[static_cast<std::size_t>(DType::fp32)] = FlopRate(1e13);
  d.memory_capacity = capacity;
  d.memory_bandwidth = Bandwidth(1e12);
  d.kernel_launch_overhead = Time::us(4);
  d.compute_units = 108;
  d.efficiency.gemm = 0.5;
  d.efficiency.attention = 0.5;
  d.efficiency.memory = 0.5;
  d.efficiency.tile_m = 128;
  d.efficiency.tile_n = 128;
  return d;
}

/// Intra-node: 100 GB/s and 1 us per message; inter-node: 10 GB/s and 5 us. Interference is off
/// (overlap is free), as the hand calculations of these tests assume; interference_test.cpp
/// turns it on.
inline hw::ClusterSpec test_cluster(int nodes = 1, int devices_per_node = 8,
                                    Bytes capacity = Bytes(1000)) {
  hw::ClusterSpec c;
  c.name = "test-cluster";
  c.nodes = nodes;
  c.devices_per_node = devices_per_node;
  c.device = test_device(capacity);
  c.intra_node = hw::LinkSpec{Bandwidth(1e11), Time::us(1)};
  c.inter_node = hw::LinkSpec{Bandwidth(1e10), Time::us(5)};
  c.interference.enabled = false;
  return c;
}

/// A compute op's work: one measured kernel of exactly `duration`.
inline strategies::Compute measured(strategies::Program& p, Time duration) {
  return strategies::Compute{
      p.add_kernels({strategies::Kernel{strategies::Measured{duration}, "measured"}})};
}

/// Runs a network until nothing is left; each transfer's completion time.
inline std::map<sim::TransferId, Time> drive(sim::Network& net) {
  std::map<sim::TransferId, Time> done;
  std::vector<sim::TransferId> finished;
  for (;;) {
    const Time t = net.next_completion();
    if (t == Time::infinity()) break;
    finished.clear();
    net.advance_to(t, finished);
    for (auto id : finished) done[id] = t;
  }
  return done;
}

/// The provenance of layer `layer`'s gradient message: the dp-comm stream, the backward phase,
/// layers [layer, layer + 1).
inline strategies::OpInfo gradient_info(int layer) {
  strategies::OpInfo info;
  info.stream = strategies::Stream::dp_comm;
  info.phase = strategies::Phase::backward;
  info.layer_begin = static_cast<std::int16_t>(layer);
  info.layer_end = static_cast<std::int16_t>(layer + 1);
  return info;
}

/// A detached send (strategies::Send::detached, eager too) of `bytes` to `peer`.
inline strategies::Send detached_send(std::int32_t peer, Bytes bytes) {
  strategies::Send send{peer, bytes};
  send.eager = true;
  send.detached = true;
  return send;
}

}  // namespace stratasim::testing
