// A nccl-tests-like sweep: one collective alone on a cluster's network model, size by size,
// with its time, algorithm bandwidth and bus bandwidth (traces/bus_bandwidth.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "hw_models/cluster.hpp"
#include "strategies/program.hpp"

namespace stratasim::sim {

struct CollectiveMeasurement {
  Bytes bytes;
  Time time;
  double algbw = 0;  // bytes / s: S / t
  double busbw = 0;  // bytes / s: algbw times nccl-tests' factor (2(n-1)/n for all-reduce)
  hw::CollectiveAlgorithm algorithm = hw::CollectiveAlgorithm::ring;  // the one that ran
  /// With the NCCL model (sim/nccl_model.hpp): the protocol chosen and the channels it uses.
  std::optional<hw::NcclProtocol> protocol;
  int channels = 0;
};

/// Simulates one `kind` over `ranks` alone on the cluster's network model (analytical or
/// flow-level on its topology) for each size: with `algorithm` where given (resolved as
/// sim/collectives.hpp says), else the cluster's choice. busbw uses nccl-tests' printed factor
/// (2(n-1)/n for every all-reduce, NVLS included). Throws std::invalid_argument for ranks
/// outside the cluster or an algorithm that cannot run there.
std::vector<CollectiveMeasurement> measure_collective(
    const hw::ClusterSpec& cluster, strategies::CollectiveKind kind,
    std::span<const std::int32_t> ranks, std::span<const Bytes> sizes,
    std::optional<hw::CollectiveAlgorithm> algorithm = std::nullopt);

}  // namespace stratasim::sim
