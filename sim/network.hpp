// Networks carry transfers: collectives over a communicator group and point-to-point messages.
// A network is a resource in the SimGrid sense: it answers when its next transfer completes
// and advances to a time, so that models with bandwidth sharing (flow-level) plug in beside
// the analytical one without changing the program simulator.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hw_models/cluster.hpp"
#include "strategies/program.hpp"

namespace stratasim::sim {

using TransferId = std::uint32_t;

/// Where a group's ranks live: how many nodes it spans and the most ranks it has on one node.
struct GroupShape {
  int size = 1;
  int nodes = 1;
  int max_ranks_per_node = 1;
};
GroupShape shape_of(std::span<const std::int32_t> ranks, const hw::ClusterSpec& cluster);

struct TransferRequest {
  bool collective = true;
  strategies::CollectiveKind kind = strategies::CollectiveKind::all_reduce;
  std::uint32_t group = 0;  // for collectives: index into the program's groups
  std::int32_t src = 0;     // for point-to-point
  std::int32_t dst = 0;
  Bytes bytes;
};

class Network {
 public:
  virtual ~Network() = default;
  /// Starts a transfer at `now`.
  virtual void start(TransferId id, const TransferRequest& request, Time now) = 0;
  /// When the earliest active transfer completes; Time::infinity() when none is active.
  virtual Time next_completion() const = 0;
  /// Advances to `t` (at most next_completion()) and appends the transfers finished by then, in
  /// a deterministic order.
  virtual void advance_to(Time t, std::vector<TransferId>& finished) = 0;
};

/// Alpha-beta costs per collective algorithm, with no contention between transfers.
/// Ring all-reduce of S bytes over n ranks: 2(n-1)/n * S/B + 2(n-1) * alpha; reduce-scatter and
/// all-gather: (n-1)/n * S/B + (n-1) * alpha; broadcast and reduce (pipelined ring): S/B +
/// (n-1) * alpha; all-to-all: (n-1)/n * S/B + (n-1) * alpha. B and alpha are the intra-node
/// link's when the group lives on one node, else the inter-node link's. A group spanning
/// nodes with k > 1 ranks per node runs hierarchically: intra-node reduce-scatter, k parallel
/// inter-node rings on S/k bytes, intra-node all-gather.
class AnalyticalNetwork final : public Network {
 public:
  AnalyticalNetwork(const hw::ClusterSpec& cluster, const strategies::Program& program);

  Time collective_time(strategies::CollectiveKind kind, const GroupShape& shape, Bytes bytes) const;
  Time p2p_time(std::int32_t src, std::int32_t dst, Bytes bytes) const;

  void start(TransferId id, const TransferRequest& request, Time now) override;
  Time next_completion() const override;
  void advance_to(Time t, std::vector<TransferId>& finished) override;

 private:
  struct Active {
    Time end;
    std::uint64_t sequence;
    TransferId id;
  };
  struct Later {
    bool operator()(const Active& a, const Active& b) const {
      return a.end != b.end ? a.end > b.end : a.sequence > b.sequence;
    }
  };
  hw::ClusterSpec cluster_;
  std::vector<GroupShape> shapes_;  // per program group
  std::vector<Active> active_;      // binary heap ordered by Later
  std::uint64_t sequence_ = 0;
};

}  // namespace stratasim::sim
