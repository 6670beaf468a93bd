// Algorithm and bus bandwidth of a collective, as nccl-tests reports them (doc/PERFORMANCE.md
// of NVIDIA/nccl-tests; case `nccl-busbw-factors` of the published reference).
//
// algbw = S / t, with S the collective's size as nccl-tests counts it (the whole buffer: the
// input of an all-reduce or reduce-scatter, the output of an all-gather). busbw = algbw times a
// factor that makes the figure comparable with a link's bandwidth whatever the rank count n:
// an all-reduce moves 2(n-1)/n S over each rank's link at best, a reduce-scatter, all-gather or
// all-to-all (n-1)/n S, a broadcast or reduce S (everything leaves or reaches the root):
//
//   AllReduce 2(n-1)/n; ReduceScatter, AllGather, AlltoAll (n-1)/n; Broadcast, Reduce 1.
//
// PERFORMANCE.md also lists (n-1)/(n+1) for an all-reduce reduced in the network (NVLink
// SHARP, InfiniBand SHARP); it is available with `in_network_reduction`. The nccl-tests
// binaries print every all-reduce's busbw with 2(n-1)/n, whichever algorithm NCCL ran (which is
// why an NVLS all-reduce on H100 reports 480 GB/s of busbw on 450 GB/s links): compare with
// published tables through the default.
#pragma once

#include <cstdint>

#include "hw_models/units.hpp"
#include "strategies/program.hpp"

namespace stratasim::traces {

/// S / t in bytes per second; 0 for a zero time.
constexpr double algbw(Bytes bytes, Time time) {
  return time.picoseconds() <= 0 ? 0.0 : static_cast<double>(bytes.count()) / time.seconds();
}

/// nccl-tests' correction factor from algbw to busbw for `kind` over `n` ranks (the factors
/// are strategies::kCollectiveTraits' busbw columns; 0 for a per-peer kind over one rank).
constexpr double busbw_factor(strategies::CollectiveKind kind, std::int64_t n,
                              bool in_network_reduction = false) {
  const strategies::CollectiveTraits& t = strategies::traits_of(kind);
  if (!t.busbw_per_peer) return t.busbw_scale;
  if (n <= 1) return 0.0;
  const auto nd = static_cast<double>(n);
  if (in_network_reduction && kind == strategies::CollectiveKind::all_reduce) {
    return (nd - 1) / (nd + 1);
  }
  return t.busbw_scale * (nd - 1) / nd;
}

/// algbw(bytes, time) * busbw_factor(kind, n, in_network_reduction), bytes per second.
constexpr double busbw(strategies::CollectiveKind kind, std::int64_t n, Bytes bytes, Time time,
                       bool in_network_reduction = false) {
  return algbw(bytes, time) * busbw_factor(kind, n, in_network_reduction);
}

}  // namespace stratasim::traces
