// Compute-communication interference in a run (hw_models/interference.hpp gives the rates;
// docs/network.md the model): each transfer holds the SMs its op says (Collective::sms,
// Send::sms; NCCL's communication_units by default), and a rank's compute runs at the f_sm of
// the most any of its running transfers holds. The simulator reports compute ops and transfers
// starting and ending, and the tracker keeps each rank's load, re-times running compute ops
// (rescheduling their end events with a new version, so the old ones are stale) and re-rates
// transfers through Network::set_rate. What each op lost goes into `losses`
// (Timeline::interference).
//
// Sums are kept in integers (shares in units of 2^-30, demands in bytes/s), so that they do not
// depend on the order of their terms: a mirrored run and an exact one agree to the picosecond.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <variant>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/interference.hpp"
#include "sim/collectives.hpp"
#include "sim/cost.hpp"
#include "sim/engine.hpp"
#include "sim/network.hpp"
#include "strategies/matching.hpp"
#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::sim {

class InterferenceTracker {
 public:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFu;
  using Op = strategies::Op;
  using OpId = strategies::OpId;
  static constexpr std::size_t kStreamCount = strategies::kStreamCount;

  /// `engine` receives compute ops' end events (kind: the end's version, target: the op);
  /// `matching` names each rendezvous' member ops (it must be built before transfers begin).
  InterferenceTracker(const strategies::Program& program, const hw::ClusterSpec& cluster,
                      Network& network, Engine& engine, const strategies::Matching& matching,
                      std::vector<traces::InterferenceLoss>& losses)
      : program_(program),
        cluster_(cluster),
        network_(network),
        engine_(engine),
        matching_(matching),
        losses_(losses),
        world_(program.world_size()),
        network_rates_(network.enable_rates()) {}

 public:
  /// The work mix of kernel-list slot `slot` (cost class x lists + list), after setup.
  void set_mix(std::size_t slot, const hw::WorkMix& mix) { list_mix_[slot] = mix; }
  /// Room for `rendezvous` transfers (once the matching is built).
  void size_transfers(std::uint32_t rendezvous) { transfer_slot_.assign(rendezvous, kNone); }

  // setup: sizes the per-rank state from the ranks' cost models (`class_of`: each rank's entry
  // of `costs`), for `lists` kernel lists per class.
  // start_compute: a compute op starts at `now` with list slot `slot`, taking `duration` alone;
  // its end is scheduled on the engine. end_compute: its end event; false when stale, else
  // `start` is when the op began. begin_transfer (after Network::start) and end_transfer: a
  // rendezvous' transfer starts or ends.
  void setup(const std::vector<DeviceCostModel>& costs, const std::vector<std::uint32_t>& class_of,
             std::size_t lists) {
    list_mix_.assign(lists * costs.size(), hw::WorkMix{});
    running_.assign(static_cast<std::size_t>(world_) * kStreamCount, Running{});
    rank_load_.assign(static_cast<std::size_t>(world_), RankLoad{});
    compute_units_.resize(static_cast<std::size_t>(world_));
    memory_bw_.resize(static_cast<std::size_t>(world_));
    for (int r = 0; r < world_; ++r) {
      const DeviceCostModel& cost = costs[class_of[static_cast<std::size_t>(r)]];
      if (cost.device().is_fpga()) {  // its network ports are apart from its compute
        compute_units_[static_cast<std::size_t>(r)] = 0;         // f_sm: 1
        memory_bw_[static_cast<std::size_t>(r)] = Bandwidth(0);  // memory_share_rate: 1
        continue;
      }
      compute_units_[static_cast<std::size_t>(r)] = cost.device().compute_units;
      memory_bw_[static_cast<std::size_t>(r)] = cost.streaming_bandwidth();
    }
    group_spans_nodes_.assign(program_.groups().size(), -1);
  }

  void start_compute(OpId id, std::uint32_t slot, Time duration, Time now) {
    now_ = now;
    Running& run = running_of(id);
    run.op = id;
    run.start = now_;
    run.last = now_;
    run.remaining = static_cast<double>(duration.picoseconds());
    run.lost = 0;
    run.mix = list_mix_[slot];
    const std::int32_t rank = program_.op(id).rank;
    run.rate = rank_compute_rate(rank, run.mix);
    schedule_end(run);
    // Work off the device (host optimizer steps, PCIe copies) neither holds SMs nor streams
    // device memory: it does not slow the rank's transfers.
    if (touches_device(run.mix)) count_compute(rank, run.mix.memory_bound, +1);
  }

  /// The end event (op `id`, version `version`) of a compute op: false when stale; else the op
  /// leaves its rank's load and `start` is when it began.
  bool end_compute(OpId id, std::uint32_t version, Time now, Time& start) {
    now_ = now;
    Running& run = running_of(id);
    if (run.op != id || run.version != version) return false;
    rerate(run, run.rate);  // up to now: its lost time
    start = run.start;
    if (run.lost >= 0.5) {
      losses_.push_back({id, Time::ps(static_cast<std::int64_t>(std::llround(run.lost)))});
    }
    const std::int32_t rank = program_.op(id).rank;
    const double memory_bound = run.mix.memory_bound;
    const bool counted = touches_device(run.mix);
    run.op = kNone;
    if (counted) count_compute(rank, memory_bound, -1);
    return true;
  }

  void begin_transfer(std::uint32_t instance, const TransferRequest& request, Time now) {
    now_ = now;
    std::uint32_t slot;
    if (!free_transfers_.empty()) {
      slot = free_transfers_.back();
      free_transfers_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(transfers_.size());
      transfers_.emplace_back();
    }
    transfer_slot_[instance] = slot;
    TransferLoad& t = transfers_[slot];
    t.instance = instance;
    t.ranks.clear();
    t.demand.clear();
    t.computing = 0;
    t.memory_bound = 0;
    t.rate = 1;
    t.last = now_;
    t.lost = 0;
    t.f_hbm = 1;
    t.units = units_of(instance);
    const bool inter = spans_nodes(request);
    const double traffic = cluster_.interference.memory_traffic_per_byte;
    // The share of the link a transfer reaches: the NCCL model's fabric efficiency, else the
    // cluster's protocol efficiency.
    const double efficiency =
        cluster_.collectives.nccl
            ? (inter ? cluster_.collectives.nccl->network : cluster_.collectives.nccl->intra)
                  .efficiency
            : cluster_.collectives.protocol_efficiency;
    for (const OpId member : matching_.ops_of(instance)) {
      const std::int32_t rank = program_.op(member).rank;
      const auto r = static_cast<std::size_t>(rank);
      const hw::LinkSpec& link =
          inter ? cluster_.inter_link_of(rank) : cluster_.intra_link_of(rank);
      const auto demand = static_cast<std::int64_t>(
          std::llround(traffic * link.bandwidth.bytes_per_second() * efficiency));
      t.ranks.push_back(rank);
      t.demand.push_back(demand);
      t.f_hbm = std::min(
          t.f_hbm, hw::memory_share_rate(Bandwidth(static_cast<double>(demand)), memory_bw_[r]));
      RankLoad& load = rank_load_[r];
      load.demand += demand;
      ++load.transfers;
      load.active.push_back(slot);
      if (load.computing > 0) {
        ++t.computing;
        t.memory_bound += load.memory_bound / load.computing;
      }
    }
    for (const std::int32_t rank : t.ranks) rerate_rank(rank);
    rerate_transfer(t);
  }

  void end_transfer(std::uint32_t instance, Time now) {
    now_ = now;
    const std::uint32_t slot = transfer_slot_[instance];
    if (slot == kNone) return;
    TransferLoad& t = transfers_[slot];
    rerate_transfer(t);  // up to now: its lost time
    if (t.lost >= 0.5) {
      const Time lost = Time::ps(static_cast<std::int64_t>(std::llround(t.lost)));
      for (const OpId member : matching_.ops_of(instance)) {
        losses_.push_back({member, lost});
      }
    }
    for (std::size_t i = 0; i < t.ranks.size(); ++i) {
      const auto r = static_cast<std::size_t>(t.ranks[i]);
      RankLoad& load = rank_load_[r];
      load.demand -= t.demand[i];
      --load.transfers;
      load.active.erase(std::find(load.active.begin(), load.active.end(), slot));
    }
    for (const std::int32_t rank : t.ranks) rerate_rank(rank);
    transfer_slot_[instance] = kNone;
    t.instance = kNone;
    free_transfers_.push_back(slot);
  }

 private:
  /// A compute op running on one (rank, stream): its work left at full speed, its rate now.
  struct Running {
    OpId op = kNone;
    std::uint32_t version = 0;  // of its scheduled end: older end events are stale
    Time start;
    Time last;             // when remaining and lost were last brought up to date
    double remaining = 0;  // picoseconds of work at full speed
    double lost = 0;       // picoseconds lost to interference so far
    double rate = 1;
    hw::WorkMix mix;
  };
  /// A rank's share in interference: the transfers it takes part in and what it computes.
  // Sums are kept in integers (shares in units of 2^-30, demands in bytes/s), so that they do not
  // depend on the order of their terms: a mirrored run and an exact one agree to the picosecond.
  static constexpr double kShareUnit = 1073741824.0;  // 2^30
  static std::int64_t share_units(double share) {
    return static_cast<std::int64_t>(std::llround(share * kShareUnit));
  }
  struct RankLoad {
    std::int64_t demand = 0;  // bytes/s of device memory its transfers demand
    std::uint32_t transfers = 0;
    std::uint32_t computing = 0;
    std::int64_t memory_bound = 0;      // sum of the running compute ops' memory-bound shares
    std::vector<std::uint32_t> active;  // slots of transfer_ it takes part in
  };
  /// A transfer in flight.
  struct TransferLoad {
    std::uint32_t instance = kNone;
    std::vector<std::int32_t> ranks;   // issuing members
    std::vector<std::int64_t> demand;  // per member: bytes/s of its device memory
    double f_hbm = 1;                  // the transfer's own share of memory beside compute
    std::uint32_t computing = 0;       // members computing
    std::int64_t memory_bound = 0;     // sum of their memory-bound shares (kShareUnit)
    double rate = 1;
    Time last;
    double lost = 0;  // picoseconds
    int units = 0;    // SMs it holds on each member (strategies::Collective::sms resolved)
  };

  /// The SMs rendezvous `instance`'s transfer holds on each member: its Collective's or Send's
  /// `sms`, NCCL's channels (hw::communication_units) for kNcclSms.
  int units_of(std::uint32_t instance) const {
    std::int16_t sms = strategies::kNcclSms;
    for (const OpId member : matching_.ops_of(instance)) {
      const auto& work = program_.op(member).work;
      if (const auto* c = std::get_if<strategies::Collective>(&work)) sms = c->sms;
      if (const auto* s = std::get_if<strategies::Send>(&work)) sms = s->sms;
    }
    return sms == strategies::kNcclSms ? hw::communication_units(cluster_) : sms;
  }

  /// f_sm of `rank` now: the SMs held are the most any of its running transfers holds (NCCL's
  /// kernels of concurrent collectives share the channels' SMs), none on an FPGA.
  double rank_f_sm(std::int32_t rank) const {
    const auto r = static_cast<std::size_t>(rank);
    if (compute_units_[r] == 0) return 1.0;
    int units = 0;
    for (const std::uint32_t slot : rank_load_[r].active)
      units = std::max(units, transfers_[slot].units);
    return units == 0 ? 1.0 : hw::compute_units_rate(units, compute_units_[r]);
  }

  double rank_compute_rate(std::int32_t rank, const hw::WorkMix& mix) const {
    const RankLoad& load = rank_load_[static_cast<std::size_t>(rank)];
    if (load.transfers == 0) return 1.0;
    const auto r = static_cast<std::size_t>(rank);
    return hw::compute_rate(
        mix, rank_f_sm(rank),
        hw::memory_share_rate(Bandwidth(static_cast<double>(load.demand)), memory_bw_[r]));
  }

  Running& running_of(OpId id) {
    const Op& o = program_.op(id);
    return running_[static_cast<std::size_t>(o.rank) * kStreamCount +
                    static_cast<std::size_t>(o.stream)];
  }

  void schedule_end(Running& run) {
    const double left = run.remaining / run.rate;
    ++run.version;
    engine_.schedule(now_ + Time::ps(static_cast<std::int64_t>(std::llround(left))), run.version,
                     run.op);
  }

  /// Brings a running op's work up to now at its old rate, then gives it `rate`.
  void rerate(Running& run, double rate) {
    const double dt = static_cast<double>((now_ - run.last).picoseconds());
    run.remaining = std::max(0.0, run.remaining - dt * run.rate);
    run.lost += dt * (1 - run.rate);
    run.last = now_;
    if (rate == run.rate) return;
    run.rate = rate;
    schedule_end(run);
  }

  void rerate_rank(std::int32_t rank) {
    const std::size_t base = static_cast<std::size_t>(rank) * kStreamCount;
    for (std::size_t s = 0; s < kStreamCount; ++s) {
      Running& run = running_[base + s];
      if (run.op != kNone) rerate(run, rank_compute_rate(rank, run.mix));
    }
  }

  void rerate_transfer(TransferLoad& t) {
    // A network that takes no rates (the flow-level one without interference.flow_transfers)
    // runs the transfer at its own speed: it loses nothing.
    if (!network_rates_) return;
    const double rate =
        t.computing == 0
            ? 1.0
            : hw::transfer_rate(static_cast<double>(t.memory_bound / t.computing) / kShareUnit,
                                t.f_hbm);
    const double dt = static_cast<double>((now_ - t.last).picoseconds());
    t.lost += dt * (1 - t.rate);
    t.last = now_;
    if (rate == t.rate) return;
    t.rate = rate;
    if (network_rates_) network_.set_rate(t.instance, rate, now_);
  }

  /// Adds (sign +1) or removes (-1) a compute op's share from its rank's transfers.
  void count_compute(std::int32_t rank, double memory_bound, int sign) {
    RankLoad& load = rank_load_[static_cast<std::size_t>(rank)];
    const std::int64_t share = share_units(memory_bound);
    // What the rank's transfers see of it: the mean share of its running ops.
    const std::int64_t before = load.computing == 0 ? 0 : load.memory_bound / load.computing;
    const bool was_computing = load.computing > 0;
    load.computing = static_cast<std::uint32_t>(static_cast<int>(load.computing) + sign);
    load.memory_bound += sign * share;
    const std::int64_t after = load.computing == 0 ? 0 : load.memory_bound / load.computing;
    const bool is_computing = load.computing > 0;
    if (was_computing == is_computing && before == after) return;
    for (const std::uint32_t slot : load.active) {
      TransferLoad& t = transfers_[slot];
      rerate_transfer(t);  // up to now at the old rate first
      t.computing = t.computing - (was_computing ? 1 : 0) + (is_computing ? 1 : 0);
      t.memory_bound += after - before;
      rerate_transfer(t);
    }
  }

  static bool touches_device(const hw::WorkMix& mix) {
    return mix.compute_bound + mix.memory_bound > 0;
  }

  bool spans_nodes(const TransferRequest& request) {
    if (!request.collective) return cluster_.node_of(request.src) != cluster_.node_of(request.dst);
    std::int8_t& known = group_spans_nodes_[request.group];
    if (known < 0) {
      known = shape_of(program_.groups()[request.group].ranks, cluster_).nodes > 1 ? 1 : 0;
    }
    return known == 1;
  }

  const strategies::Program& program_;
  const hw::ClusterSpec& cluster_;
  Network& network_;
  Engine& engine_;
  const strategies::Matching& matching_;
  std::vector<traces::InterferenceLoss>& losses_;
  const int world_;
  const bool network_rates_;
  Time now_;
  std::vector<hw::WorkMix> list_mix_;           // per kernel list slot
  std::vector<Running> running_;                // per (rank, stream)
  std::vector<RankLoad> rank_load_;             // per rank
  std::vector<int> compute_units_;              // per rank: SMs, 0 on an FPGA
  std::vector<Bandwidth> memory_bw_;            // per rank
  std::vector<std::int8_t> group_spans_nodes_;  // per group: -1 unknown
  std::vector<TransferLoad> transfers_;         // pool
  std::vector<std::uint32_t> free_transfers_;
  std::vector<std::uint32_t> transfer_slot_;  // per rendezvous: its slot, or kNone
};

}  // namespace stratasim::sim
