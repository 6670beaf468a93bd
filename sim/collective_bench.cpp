#include "sim/collective_bench.hpp"

#include <stdexcept>
#include <string>

#include "sim/collectives.hpp"
#include "sim/flow_network.hpp"
#include "sim/nccl_model.hpp"
#include "traces/bus_bandwidth.hpp"

namespace stratasim::sim {

std::vector<CollectiveMeasurement> measure_collective(
    const hw::ClusterSpec& cluster, strategies::CollectiveKind kind,
    std::span<const std::int32_t> ranks, std::span<const Bytes> sizes,
    std::optional<hw::CollectiveAlgorithm> algorithm) {
  for (std::int32_t r : ranks) {
    if (r < 0 || r >= cluster.world_size()) {
      throw std::invalid_argument("measure_collective: rank " + std::to_string(r) +
                                  " is outside the cluster's " +
                                  std::to_string(cluster.world_size()) + " devices");
    }
  }
  hw::ClusterSpec c = cluster;
  if (algorithm && *algorithm != hw::CollectiveAlgorithm::automatic) {
    c.collectives.algorithm[static_cast<std::size_t>(kind)] = *algorithm;
  }
  strategies::Program program(c.world_size());
  program.add_group(std::vector<std::int32_t>(ranks.begin(), ranks.end()), "measured");
  const auto n = static_cast<std::int64_t>(ranks.size());
  std::vector<CollectiveMeasurement> out;
  out.reserve(sizes.size());
  auto record = [&](Bytes bytes, Time time, hw::CollectiveAlgorithm a) {
    CollectiveMeasurement m;
    m.bytes = bytes;
    m.time = time;
    m.algbw = traces::algbw(bytes, time);
    m.busbw = traces::busbw(kind, n, bytes, time);
    m.algorithm = a;
    if (c.collectives.nccl) {
      const NcclEstimate e = nccl_choose(kind, nccl_group(ranks, c), bytes, *c.collectives.nccl,
                                         c.collectives.algorithm[static_cast<std::size_t>(kind)],
                                         c.collectives.max_channels);
      m.protocol = e.protocol;
      m.channels = e.channels;
    }
    out.push_back(m);
  };
  if (c.network_model == hw::NetworkModel::analytical) {
    const AnalyticalNetwork network(c, program);
    for (Bytes s : sizes) {
      record(s, network.collective_time(kind, 0, s), network.algorithm(kind, 0, s));
    }
    return out;
  }
  const hw::Topology topology = hw::build_topology(c);
  for (Bytes s : sizes) {
    FlowNetwork network(c, topology, program);
    TransferRequest request;
    request.collective = true;
    request.kind = kind;
    request.group = 0;
    request.bytes = s;
    network.start(0, request, Time::zero());
    std::vector<TransferId> finished;
    Time end = Time::zero();
    while (finished.empty()) {
      const Time next = network.next_completion();
      if (next == Time::infinity()) throw std::logic_error("measure_collective: never finished");
      network.advance_to(next, finished);
      end = next;
    }
    record(s, end, network.algorithm(kind, 0, s));
  }
  return out;
}

}  // namespace stratasim::sim
