// Networks carry transfers: collectives over a communicator group and point-to-point messages.
// A network is a resource in the SimGrid sense: it answers when it next needs attention (a
// transfer completing, or an internal event) and advances to a time, so that models with
// bandwidth sharing (the flow-level one, sim/flow_network.hpp) plug in beside the analytical one
// without changing the program simulator. make_network picks the cluster's model.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "hw_models/cluster.hpp"
#include "sim/collectives.hpp"
#include "sim/nccl_model.hpp"
#include "strategies/program.hpp"
#include "strategies/transport.hpp"

namespace stratasim::sim {

using TransferId = std::uint32_t;

struct TransferRequest {
  bool collective = true;
  strategies::CollectiveKind kind = strategies::CollectiveKind::all_reduce;
  std::uint32_t group = 0;  // for collectives: index into the program's groups
  std::int32_t src = 0;     // for point-to-point
  std::int32_t dst = 0;
  Bytes bytes;
  /// Point to point: moved by the copy engines (a Send with sms 0: cudaMemcpyAsync between
  /// peers, Transformer Engine's userbuffers), at the link's rate and latency rather than
  /// through NCCL's point-to-point channels.
  bool copy_engine = false;
  /// Priority class, 0 most urgent (strategies::TransportPolicy::class_of): on the flow-level
  /// network, its flows' level (strict) or weight (weighted) at every link; the analytical
  /// network, with no links to share, ignores it.
  std::int64_t priority = 0;
  /// The fraction of `bytes` that may be dropped (bounded loss, strategies/transport.hpp:
  /// loss_bound for a gradient message, else 0): the transfer completes once the rest is
  /// delivered, on either network, and the dropped tail takes no time.
  double droppable = 0;
  /// The bytes dropped: droppable x bytes, rounded to the nearest byte (0 when droppable is 0).
  Bytes dropped() const {
    return droppable > 0 ? Bytes(std::llround(droppable * static_cast<double>(bytes.count())))
                         : Bytes(0);
  }
  /// What the network carries: bytes - dropped().
  Bytes delivered() const { return bytes - dropped(); }
};

/// Contract between the program simulator and a network model. The simulator starts
/// transfers, asks when the network next needs attention and advances it there:
/// - next_completion() is the time of the network's next event: a transfer's completion, or an
///   internal event of a model with phases and shared links (a phase's latency elapsing, a flow
///   ending and freeing bandwidth). It never goes back in time;
/// - advance_to(t), t <= next_completion() (or any t when nothing is due before it), processes
///   the events up to t and appends the transfers finished by then, in a deterministic order.
///   It may finish none (an internal event): the simulator then asks again. Each call at the
///   announced time makes progress: the next announced time is later, or something finished.
class Network {
 public:
  virtual ~Network() = default;
  /// Starts a transfer at `now`.
  virtual void start(TransferId id, const TransferRequest& request, Time now) = 0;
  /// The time of the next event (see above); Time::infinity() when nothing is active.
  virtual Time next_completion() const = 0;
  /// Advances to `t` and appends the transfers finished by then (see above).
  virtual void advance_to(Time t, std::vector<TransferId>& finished) = 0;
  /// Interference (hw_models/interference.hpp): asks the network to accept set_rate for the
  /// transfers started from now on; false when it does not (the flow-level network without
  /// the cluster's interference.flow_transfers): set_rate is then ignored.
  virtual bool enable_rates() { return false; }
  /// The transport policy's link scheduling (strict or weighted classes), before any start.
  /// Networks without shared links ignore it (the analytical one).
  virtual void set_transport(const strategies::TransportPolicy& policy) { (void)policy; }
  /// From `now` on, transfer `id` (started, not finished) moves at `rate` in (0, 1] of its own
  /// speed: what remains of it takes 1 / rate times longer than it would alone.
  virtual void set_rate(TransferId id, double rate, Time now) {
    (void)id;
    (void)rate;
    (void)now;
  }
};

/// The network the cluster names (cluster.network_model): AnalyticalNetwork, or FlowNetwork on
/// the cluster's topology (hw::build_topology), which it owns.
std::unique_ptr<Network> make_network(const hw::ClusterSpec& cluster,
                                      const strategies::Program& program);

/// With the cluster's `collectives.nccl` (intra_fabric / network_fabric), collectives and
/// point-to-point messages take the NCCL-structured model's time instead (sim/nccl_model.hpp:
/// algorithm x protocol of least predicted time); measured profile rows still come first.
///
/// Alpha-beta costs per collective algorithm (sim/collectives.hpp), with no contention between
/// transfers: each collective takes its algorithm's time (the cluster's fixed choice or the
/// NCCL-like rule of choose_algorithm) over its members' own links, bandwidths times the
/// protocol efficiency. A point-to-point message takes the latency plus bytes / bandwidth of
/// the pair's link: the intra-node link on one node, else the NICs; the slower end's figures
/// (so does a copy-engine message with `collectives.nccl`).
/// Costs are compiled on first use per (group, kind, algorithm), also from const members: one
/// network is not to be shared between threads.
///
/// Measured collectives (docs/calibration.md): a collective over a group within one node whose
/// members all use one device profile (hw_models/profile.hpp) with rows for its kind and group
/// size, and whose members have no intra-node link override, takes the time interpolated from
/// those rows (hw::interpolate_collective) instead of its algorithm's alpha-beta time. The
/// shape-based collective_time does the same for a shape within one node with the cluster's
/// base device's profile. The flow-level network keeps its link model.
class AnalyticalNetwork final : public Network {
 public:
  AnalyticalNetwork(const hw::ClusterSpec& cluster, const strategies::Program& program);
  /// A network without program groups, for cost models that know only group shapes (the
  /// shape overload of collective_time; the group overloads have no group to look up).
  explicit AnalyticalNetwork(const hw::ClusterSpec& cluster);

  /// A collective over a group of `shape` (k members per node, node by node) with the cluster's
  /// nominal links (per-device overrides are not seen): for cost models that know only shapes.
  Time collective_time(strategies::CollectiveKind kind, const GroupShape& shape, Bytes bytes) const;
  /// A collective over program group `group`, with its members' own links.
  Time collective_time(strategies::CollectiveKind kind, std::uint32_t group, Bytes bytes) const;
  /// The algorithm a collective over program group `group` runs.
  hw::CollectiveAlgorithm algorithm(strategies::CollectiveKind kind, std::uint32_t group,
                                    Bytes bytes) const;
  /// A point-to-point message; `copy_engine`: by the copy engines, the link's latency plus
  /// bytes over its bandwidth (times protocol_efficiency) even where collectives.nccl costs
  /// NCCL's sends.
  Time p2p_time(std::int32_t src, std::int32_t dst, Bytes bytes, bool copy_engine = false) const;
  /// The NCCL model's choice for a collective over program group `group` (the cluster must have
  /// `collectives.nccl`).
  NcclEstimate nccl_estimate(strategies::CollectiveKind kind, std::uint32_t group,
                             Bytes bytes) const;

  void start(TransferId id, const TransferRequest& request, Time now) override;
  Time next_completion() const override;
  void advance_to(Time t, std::vector<TransferId>& finished) override;
  bool enable_rates() override {
    rates_ = true;
    return true;
  }
  /// What remains (kept in unrounded picoseconds at full speed) takes remaining / rate; the end
  /// is rounded to the picosecond, so changes at one instant leave no drift.
  void set_rate(TransferId id, double rate, Time now) override;

 private:
  struct Active {
    Time end;
    std::uint64_t sequence;
    TransferId id;
    std::uint32_t version = 0;  // of the transfer's rate: an older entry is stale
  };
  // Per transfer (with rates enabled): its end and rate now, and the version of its live entry.
  struct Rated {
    Time end;
    Time last;             // when `remaining` was last brought up to date
    double remaining = 0;  // picoseconds left at full speed (kept unrounded: no drift)
    double rate = 1;
    std::uint32_t version = 0;
    bool done = false;  // finished: set_rate no longer applies
  };
  void drop_stale();
  struct Later {
    bool operator()(const Active& a, const Active& b) const {
      return a.end != b.end ? a.end > b.end : a.sequence > b.sequence;
    }
  };
  static constexpr std::size_t kKinds = 6;
  static constexpr std::size_t kAlgorithms = 10;
  struct GroupInfo {
    GroupShape shape;
    NcclGroup nccl;
    std::vector<MemberLinks> members;
    std::vector<int> nodes;
    bool switch_reduces = false;
    // Measured times per kind (into curves_), when the group's device profile has them.
    std::array<const hw::CollectiveCurve*, kKinds> measured{};
    // Compiled costs per (kind, algorithm), made on first use.
    std::array<std::unique_ptr<CollectiveCost>, kKinds * kAlgorithms> costs;
    // The NCCL model's choices so far, per (kind, bytes): a pure function of those, the
    // group and the cluster's settings, and a program repeats each collective every
    // microbatch, so each is worked out once (its 15 algorithm x protocol candidates).
    std::unordered_map<std::uint64_t, NcclEstimate> nccl_choices;
  };
  const GroupInfo& group(std::uint32_t group) const;
  const CollectiveCost& cost(std::uint32_t group, strategies::CollectiveKind kind,
                             hw::CollectiveAlgorithm algorithm) const;
  /// The measured curve of `kind` over `ranks` devices in `profile`, or nullptr.
  const hw::CollectiveCurve* measured_curve(const hw::DeviceProfile* profile, std::size_t kind,
                                            int ranks);

  hw::ClusterSpec cluster_;
  // Measured collective curves per (profile, kind, group size), built once.
  std::map<std::tuple<const hw::DeviceProfile*, std::size_t, int>, hw::CollectiveCurve> curves_;
  // Per kind and group size, the base device's measured curve (for shape-based costs).
  std::map<std::pair<std::size_t, int>, const hw::CollectiveCurve*> nominal_measured_;
  mutable std::vector<GroupInfo> groups_;  // per program group; costs filled lazily
  std::vector<Active> active_;             // binary heap ordered by Later
  bool rates_ = false;                     // enable_rates was called
  std::vector<Rated> rated_;               // by transfer id, with rates_
  std::uint64_t sequence_ = 0;
};

}  // namespace stratasim::sim
