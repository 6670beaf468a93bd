// The program simulator: runs every rank's ops on the engine. Compute ops take the device cost
// model's time; collectives and sends rendezvous with their peers and then take the network's
// time; memory effects are accounted per rank and tier, with peaks by category and
// out-of-memory verdicts. A deadlock ends the run with the waiting ops named, never a hang.
//
// Interference (cluster.interference, hw_models/interference.hpp): with it enabled, a compute
// op progresses at a rate below 1 while its rank has a transfer in flight (NCCL's channels hold
// SMs; its copies share device memory), and a transfer at a rate below 1 while its members run
// memory-bound kernels (through Network::set_rate; a network that cannot re-time transfers
// slows only compute). Rates change when a compute op or a transfer starts or ends; the time an
// op loses is recorded in Timeline::interference. Disabled, every op takes its own time, as
// before interference was modelled.
//
// Transport (SimOptions::transport, docs/priorities.md): each transfer's priority class and
// droppable fraction come from the op that describes it (stream, phase, layer range), so the
// Program does not change; observers see each transfer as it starts (on_transfer). Several
// jobs merged into one Program take a policy per rank (SimOptions::transports).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hw_models/cluster.hpp"
#include "sim/memory.hpp"
#include "sim/network.hpp"
#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::sim {

/// Attached from outside to see the run as it happens (statistics, trace writers).
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on_span(const traces::Span& span) { (void)span; }
  virtual void on_memory(const traces::MemorySample& sample) { (void)sample; }
  /// A transfer as it starts: the op that describes it (a collective's lowest rank's, a
  /// message's send) and what the network is asked to carry (its class, its dropped bytes).
  virtual void on_transfer(const strategies::Op& op, const TransferRequest& request) {
    (void)op;
    (void)request;
  }
};

struct SimOptions {
  /// Record every span and memory sample in the returned Timeline (reports and exports need
  /// them; a benchmark may switch them off and keep only the summary figures).
  bool record_spans = true;
  bool record_memory = true;
  /// Ranks whose spans are recorded (empty: all). The timeline then holds the spans of these
  /// ranks only, in op order (not indexed by op id unless every rank is recorded); observers
  /// see every span either way (a report's figures: traces/span_statistics.hpp).
  std::vector<std::int32_t> span_ranks;
  /// Ranks whose memory samples are recorded (empty: all). Peaks and out-of-memory verdicts
  /// are kept for every rank either way; samples only feed memory.csv and the trace.
  std::vector<std::int32_t> memory_sample_ranks;
  /// Allocator and framework overheads added to every device's memory.
  MemoryOverheads overheads;
  /// End the run at the first time a rank exceeds a memory capacity (the timeline is then
  /// incomplete, with stopped_on_oom set); otherwise the run completes and reports it.
  bool stop_on_oom = false;
  /// Extra observers, called in order.
  std::vector<Observer*> observers;
  /// The experiment's transport policy (strategies/transport.hpp): each transfer's priority
  /// class and droppable fraction are derived from the op that describes it when it starts;
  /// the network gets the policy's link scheduling. Default: class 0, nothing dropped.
  strategies::TransportPolicy transport;
  /// Several policies at once (several jobs in one Program, study/jobs.hpp): the transfer
  /// described by an op of rank r takes transports[transport_of_rank[r]], and `transport` is
  /// not used. Both empty (the default): `transport` for every rank, exactly as without them.
  /// - A policy's layer count ("layer": class floor(layer_begin x classes / L)) is the largest
  ///   layer_end of the ops of the ranks that take it (one job's layers, not the merged
  ///   Program's); "fifo" numbers the transfers of every rank that takes a "fifo" policy in one
  ///   start order.
  /// - Classes are levels of the one fabric: class c of one policy and class c of another are
  ///   the same level at a link. The classed policies must agree on what links do
  ///   (transport_conflict); the network gets the first classed policy's link scheduling.
  /// std::invalid_argument when they do not agree, or transport_of_rank does not give every
  /// rank a policy.
  std::vector<strategies::TransportPolicy> transports;
  std::vector<std::uint16_t> transport_of_rank;
};

/// Where transport policies simulated together (SimOptions::transports) cannot share links: a
/// later classed policy (`second`) that disagrees with the first classed one (`first`) on
/// `key`, relative to the `transport` section: "priority" ("fifo" mixed with a class-based
/// policy: fifo's levels are the start order of messages, the others' are classes),
/// "scheduling" (strict or weighted), "within_class" (FIFO within a class makes a level of
/// (class, start order), fair sharing one of the class alone) or "weights" (weighted: the same
/// weight per class).
/// Unclassed policies (priority "none", or one class) take class 0 and never conflict.
struct TransportConflict {
  std::size_t first = 0;
  std::size_t second = 0;
  std::string key;
};
std::optional<TransportConflict> transport_conflict(
    std::span<const strategies::TransportPolicy> policies);

/// Simulates one iteration of `program` on `cluster` with the network model the cluster names
/// (cluster.network_model: analytical or flow-level).
traces::Timeline simulate(const strategies::Program& program, const hw::ClusterSpec& cluster,
                          const SimOptions& options = {});

/// The same with a given network model.
traces::Timeline simulate(const strategies::Program& program, const hw::ClusterSpec& cluster,
                          Network& network, const SimOptions& options = {});

/// Whether the replicas of a rank (data-parallel, or 1D tensor-parallel) behave alike on
/// `cluster`, so that one may be simulated for all (Program::set_replica): on the analytical
/// network (no contention) with identical devices. On the flow-level network replicas contend
/// for links, and with per-device overrides they differ.
bool replicas_behave_alike(const hw::ClusterSpec& cluster);

}  // namespace stratasim::sim
