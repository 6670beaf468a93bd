#include "sim/simulator.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "sim/cost.hpp"
#include "sim/engine.hpp"
#include "sim/interference_tracker.hpp"
#include "sim/memory.hpp"
#include "strategies/matching.hpp"

namespace stratasim::sim {

namespace {

using strategies::Collective;
using strategies::Compute;
using strategies::kMemoryCategoryCount;
using strategies::kMemoryTierCount;
using strategies::kStreamCount;
using strategies::MemoryTier;
using strategies::Op;
using strategies::OpId;
using strategies::Program;
using strategies::Recv;
using strategies::Send;
using traces::MemorySample;
using traces::Span;
using traces::Timeline;

constexpr std::uint32_t kNone = 0xFFFFFFFFu;

// In the order of strategies::Work's alternatives.
enum OpKind : std::uint8_t { kCompute, kCollective, kSend, kRecv };
static_assert(
    std::is_same_v<std::variant_alternative_t<kCompute, strategies::Work>, Compute> &&
    std::is_same_v<std::variant_alternative_t<kCollective, strategies::Work>, Collective> &&
    std::is_same_v<std::variant_alternative_t<kSend, strategies::Work>, Send> &&
    std::is_same_v<std::variant_alternative_t<kRecv, strategies::Work>, Recv>);
enum OpFlags : std::uint8_t { kStartEffects = 1, kEndEffects = 2 };
enum OpStatus : std::uint8_t { kWaiting, kStarted, kDone };

/// The hot, per-op state of a run, packed in 16 bytes. `pending` is at most an op's
/// dependencies (under 2^16), its stream predecessor and an unmatched rendezvous.
struct OpState {
  std::uint32_t next = kNone;      // next op on the same (rank, stream)
  std::uint32_t succ = 0;          // start of the op's successors in succ_ (ends at the next op's)
  std::uint32_t payload = 0;       // compute: kernel list; communication: rendezvous
  std::uint32_t pending : 24 = 0;  // unfinished predecessors (stream and dependencies)
  std::uint32_t kind : 2 = kCompute;    // OpKind
  std::uint32_t flags : 2 = 0;          // OpFlags
  std::uint32_t status : 2 = kWaiting;  // OpStatus
};
static_assert(sizeof(OpState) == 16);

/// The run's state of one rendezvous of strategies::Matching (a collective's k-th call on a
/// group, or the k-th message of a channel).
struct Instance {
  Time start;
  std::uint32_t arrived = 0;
  std::uint32_t expected = 0;
  bool eager = false;      // an eager send's message (strategies::Send::eager)
  bool started = false;    // its transfer started
  bool delivered = false;  // its transfer ended before the receive started (eager only)
  bool detached = false;   // its send ends when the transfer starts (strategies::Send)
};

// An engine event's kind for an eager message's receive that started after its data arrived:
// it ends at once (compute ends use kinds from 0, the interference tracker's versions).
constexpr std::uint32_t kDeliveredKind = 0xFFFFFFFFu;

class Simulator {
 public:
  Simulator(const Program& program, const hw::ClusterSpec& cluster, Network& network,
            const SimOptions& options)
      : program_(program),
        cluster_(cluster),
        network_(network),
        options_(options),
        n_(static_cast<std::uint32_t>(program.op_count())),
        world_(program.world_size()),
        notify_spans_(options.record_spans || !options.observers.empty()),
        notify_memory_(options.record_memory || !options.observers.empty()),
        memory_(
            program, cluster, options.overheads, timeline_, options.record_memory,
            options.observers.empty() ? std::function<void(const MemorySample&)>()
                                      : [this](const MemorySample& sample) {
                                          for (Observer* obs : options_.observers)
                                            obs->on_memory(sample);
                                        },
            options.memory_sample_ranks),
        interfere_(cluster.interference.enabled) {
    if (interfere_) {
      interference_.emplace(program_, cluster_, network_, engine_, matching_,
                            timeline_.interference);
    }
    setup_transport();
  }

  Timeline run();

 private:
  // ---- The timeline: spans of the recorded ranks, memory samples.

  // Whether rank r's spans are recorded, and where: span_offset_[r] + op id is the span's index.
  void plan_spans();

  void prepare_timeline();

  void finish_timeline(bool stopped);

  // ---- The event loop: the network's completions and the engine's events in time order.

  // Runs until nothing is left to happen (or the first out-of-memory with stop_on_oom: true).
  bool event_loop();

  // The network's transfers that end at `when`; returns how many ended.
  std::size_t network_step(Time when, std::vector<TransferId>& finished);

  // The engine's next event: a compute op's end, or a delivered message's receive.
  void engine_step();

  // One past the last op of rank r.
  OpId rank_end(int r) const { return r + 1 < world_ ? program_.first_op(r + 1) : n_; }

  // ---- Setup: flat arrays for the hot loop.

  void setup();

  // Ranks own consecutive ranges of ops that cover them all (Program::finish was called).
  void check_rank_ranges() const;

  // Kernel-list durations are computed once per (device class, list) that some op uses. Ranks
  // of one class cost alike: the same device type and slowdown (one class unless the cluster
  // overrides some devices).
  struct CostClasses {
    std::vector<DeviceCostModel> costs;
    std::vector<std::uint32_t> class_of;  // per rank
  };
  CostClasses cost_classes() const;

  // The valid dependencies of every op, in op order.
  struct Edges {
    std::vector<OpId> dep;
    std::vector<std::uint16_t> count;  // per op
  };

  void read_rank(int r, const CostClasses& classes, strategies::Matching::Builder& matching,
                 Edges& edges);

  // The (cost class, kernel list) slot of a compute op, its duration computed on first use.
  std::uint32_t kernel_slot(OpId id, const Op& o, const CostClasses& classes);

  void build_instances();

  // Successors (CSR): counts become inclusive prefix sums (the end of each op's list), then
  // lists are filled backwards so that each ends up in increasing op order and
  // ops_[i].succ becomes the start of op i's list.
  void build_successors(const Edges& edges);

  // ---- The run.

  void start_op(OpId id);

  void start_transfer(std::uint32_t instance);

  void complete_instance(TransferId instance);

  void finish_op(OpId id, Time start);

  void release_successors(OpId id);

  // Event-driven ranks (Program::event_driven): a stream's compute ops run one at a time (one
  // device), in the order they became ready, instead of in program order. Whether compute op
  // `id` may start now (else it waits in its stream's queue), and, when one ends, the next.
  bool claim_stream(OpId id);
  void next_on_stream(OpId id);

  // ---- Deadlock report.

  std::string why_waiting(OpId id) const;

  std::string describe_deadlock() const;

  const Program& program_;
  const hw::ClusterSpec& cluster_;
  Network& network_;
  const SimOptions& options_;
  const std::uint32_t n_;
  const int world_;
  const bool notify_spans_;
  const bool notify_memory_;
  Timeline timeline_;  // before memory_, which writes into it
  MemoryTracker memory_;

  std::vector<OpState> ops_;
  std::vector<OpId> succ_;
  std::vector<Time> list_time_;           // per (cost class, kernel list)
  std::vector<std::uint8_t> list_known_;  // list_time_ computed
  // Per rank: op id + offset is the index of the op's span in timeline_.spans, or kNoSpans.
  std::vector<std::int64_t> span_offset_;
  static constexpr std::int64_t kNoSpans = INT64_MIN;
  strategies::Matching matching_;    // which ops meet
  std::vector<Instance> instances_;  // per rendezvous of matching_

  Engine engine_;
  Time now_;
  std::uint32_t done_ = 0;

  // Per (rank, stream) of an event-driven program (empty otherwise): whether a compute op runs,
  // and the ready ones that wait for it, in the order they became ready.
  struct ReadyQueue {
    bool busy = false;
    std::deque<OpId> waiting;
  };
  std::vector<ReadyQueue> ready_;

  // ---- Transport (SimOptions::transport, or one of SimOptions::transports per rank).

  // Checks SimOptions::transports, gives the network the link scheduling and works out each
  // classed policy's layer count.
  void setup_transport();

  // A policy's classes need its layer count: the largest layer_end of the ops of the ranks
  // that take it (of every rank with one policy).
  std::vector<int> layers_;  // per policy
  // The policy of rank r's transfers, and its layer count.
  struct RankTransport {
    const strategies::TransportPolicy& policy;
    int layers;
  };
  RankTransport transport_of(std::int32_t rank) const {
    if (options_.transport_of_rank.empty()) return {options_.transport, layers_.front()};
    const std::uint16_t p = options_.transport_of_rank[static_cast<std::size_t>(rank)];
    return {options_.transports[p], layers_[p]};
  }
  // A transfer's class and droppable fraction from the op that describes it, under its rank's
  // policy; under "fifo" its class is its start order (strategies/transport.hpp).
  // The start order is one counter over every rank's transfers.
  std::int64_t started_transfers_ = 0;
  void classify(TransferRequest& request, OpId op) {
    const Op& o = program_.op(op);
    const RankTransport t = transport_of(o.rank);
    request.priority = t.policy.level(o, t.layers, started_transfers_++);
    request.droppable = t.policy.droppable(o);
  }

  // Interference (sim/interference_tracker.hpp), with it enabled.
  const bool interfere_;
  std::optional<InterferenceTracker> interference_;
};

void Simulator::setup_transport() {
  const auto& policies = options_.transports;
  const auto& of_rank = options_.transport_of_rank;
  if (policies.empty() && of_rank.empty()) {
    layers_.assign(1, 0);
    if (!options_.transport.classed()) return;
    network_.set_transport(options_.transport);
    for (OpId id = 0; id < n_; ++id) {
      layers_[0] = std::max(layers_[0], static_cast<int>(program_.op(id).layer_end));
    }
    return;
  }
  if (of_rank.size() != static_cast<std::size_t>(world_)) {
    throw std::invalid_argument("SimOptions::transport_of_rank: expected a policy for each of " +
                                std::to_string(world_) + " ranks, got " +
                                std::to_string(of_rank.size()));
  }
  for (std::size_t r = 0; r < of_rank.size(); ++r) {
    if (of_rank[r] >= policies.size()) {
      throw std::invalid_argument("SimOptions::transport_of_rank: rank " + std::to_string(r) +
                                  " takes policy " + std::to_string(of_rank[r]) + " of " +
                                  std::to_string(policies.size()));
    }
  }
  if (const auto conflict = transport_conflict(policies)) {
    throw std::invalid_argument("SimOptions::transports: policies " +
                                std::to_string(conflict->first) + " and " +
                                std::to_string(conflict->second) + " set different " +
                                conflict->key + " on the links they share");
  }
  layers_.assign(policies.size(), 0);
  const auto classed =
      std::find_if(policies.begin(), policies.end(), [](const auto& p) { return p.classed(); });
  if (classed == policies.end()) return;
  network_.set_transport(*classed);
  for (OpId id = 0; id < n_; ++id) {
    const Op& o = program_.op(id);
    int& layers = layers_[of_rank[static_cast<std::size_t>(o.rank)]];
    layers = std::max(layers, static_cast<int>(o.layer_end));
  }
}

Timeline Simulator::run() {
  setup();
  prepare_timeline();
  memory_.start();
  engine_.reserve(static_cast<std::size_t>(world_) * kStreamCount + 16);
  for (OpId id = 0; id < n_; ++id) {
    if (ops_[id].pending == 0) start_op(id);
  }
  const bool stopped = event_loop();
  finish_timeline(stopped);
  memory_.finish();
  return std::move(timeline_);
}

void Simulator::plan_spans() {
  span_offset_.assign(static_cast<std::size_t>(world_), kNoSpans);
  if (!options_.record_spans) return;
  std::vector<char> recorded(static_cast<std::size_t>(world_), options_.span_ranks.empty());
  for (std::int32_t r : options_.span_ranks) {
    if (r >= 0 && r < world_) recorded[static_cast<std::size_t>(r)] = 1;
  }
  // Recorded ranks in rank order, so that the spans stay in op order (as with every rank).
  std::int64_t slots = 0;
  for (int r = 0; r < world_; ++r) {
    if (!recorded[static_cast<std::size_t>(r)]) continue;
    span_offset_[static_cast<std::size_t>(r)] = slots - program_.first_op(r);
    slots += static_cast<std::int64_t>(rank_end(r) - program_.first_op(r));
  }
  timeline_.spans.resize(static_cast<std::size_t>(slots));
}

void Simulator::prepare_timeline() {
  timeline_.world_size = world_;
  plan_spans();
  if (!options_.record_memory) return;
  // At most one sample per rank and tier at the start and one per op and phase with
  // effects (more only where one op changes several tiers at once).
  std::vector<char> sampled(static_cast<std::size_t>(world_), options_.memory_sample_ranks.empty());
  for (std::int32_t r : options_.memory_sample_ranks) {
    if (r >= 0 && r < world_) sampled[static_cast<std::size_t>(r)] = 1;
  }
  std::size_t samples = static_cast<std::size_t>(world_) * kMemoryTierCount;
  for (int r = 0; r < world_; ++r) {
    if (!sampled[static_cast<std::size_t>(r)]) continue;
    for (OpId id = program_.first_op(r); id < rank_end(r); ++id) {
      const OpState& st = ops_[id];
      samples += static_cast<std::size_t>((st.flags & kStartEffects) != 0) +
                 static_cast<std::size_t>((st.flags & kEndEffects) != 0);
    }
  }
  timeline_.memory.reserve(samples);
}

void Simulator::finish_timeline(bool stopped) {
  timeline_.completed = done_ == n_;
  timeline_.stopped_on_oom = stopped;
  if (stopped) {
    timeline_.problem = "stopped at the first out-of-memory (--stop-on-oom) after " +
                        std::to_string(done_) + " of " + std::to_string(n_) + " ops";
  } else if (!timeline_.completed) {
    timeline_.problem = describe_deadlock();
  }
  if (!timeline_.completed && options_.record_spans) {  // keep the ops that ran
    std::size_t kept = 0;
    for (int r = 0; r < world_; ++r) {
      const std::int64_t offset = span_offset_[static_cast<std::size_t>(r)];
      if (offset == kNoSpans) continue;
      for (OpId id = program_.first_op(r); id < rank_end(r); ++id) {
        if (ops_[id].status == kDone) {
          timeline_.spans[kept++] = timeline_.spans[static_cast<std::size_t>(id + offset)];
        }
      }
    }
    timeline_.spans.resize(kept);
  }
}

bool Simulator::event_loop() {
  std::vector<TransferId> finished;
  std::uint64_t completions = 0;
  bool stopped = false;
  for (;;) {
    if (options_.stop_on_oom && memory_.out_of_memory()) {
      stopped = true;
      break;
    }
    const Time network_next = network_.next_completion();
    const Time engine_next = engine_.next_time();
    if (network_next == Time::infinity() && engine_next == Time::infinity()) break;
    if (network_next <= engine_next) {
      // Ties go to the network, so that equal inputs always give equal orders.
      completions += network_step(network_next, finished);
    } else {
      engine_step();
    }
  }
  timeline_.events = engine_.processed() + completions;
  return stopped;
}

std::size_t Simulator::network_step(Time when, std::vector<TransferId>& finished) {
  finished.clear();
  engine_.advance_to(when);
  now_ = engine_.now();  // a network never moves the clock back
  network_.advance_to(when, finished);
  // An internal event (a phase's latency passed) may finish nothing, but it must move
  // the network on: a network stuck at one time would loop forever.
  if (finished.empty() && network_.next_completion() <= when) {
    throw std::logic_error("simulate: the network announced an event at " + to_string(when) +
                           " but made no progress");
  }
  for (TransferId t : finished) complete_instance(t);
  return finished.size();
}

void Simulator::engine_step() {
  const Event e = engine_.pop();
  now_ = e.time;
  const OpId id = e.target;
  if (e.kind == kDeliveredKind) {
    // A detached send whose transfer ended at the time it started was ended with it.
    if (ops_[id].status == kDone) return;
    finish_op(id, now_);
  } else if (interfere_) {
    Time start;
    if (!interference_->end_compute(id, e.kind, now_, start)) return;  // a rescheduled op's old end
    finish_op(id, start);
    next_on_stream(id);
  } else {
    finish_op(id, now_ - list_time_[ops_[id].payload]);
    next_on_stream(id);
  }
  release_successors(id);
}

bool Simulator::claim_stream(OpId id) {
  const Op& o = program_.op(id);
  if (!program_.event_driven(o.rank)) return true;
  ReadyQueue& q =
      ready_[static_cast<std::size_t>(o.rank) * kStreamCount + static_cast<std::size_t>(o.stream)];
  if (q.busy) {
    q.waiting.push_back(id);
    return false;
  }
  q.busy = true;
  return true;
}

void Simulator::next_on_stream(OpId id) {
  if (ready_.empty()) return;
  const Op& o = program_.op(id);
  if (!program_.event_driven(o.rank)) return;
  ReadyQueue& q =
      ready_[static_cast<std::size_t>(o.rank) * kStreamCount + static_cast<std::size_t>(o.stream)];
  q.busy = false;
  if (q.waiting.empty()) return;
  const OpId next = q.waiting.front();
  q.waiting.pop_front();
  start_op(next);
}

void Simulator::setup() {
  check_rank_ranges();
  OpState unset;
  unset.payload = kNone;
  ops_.assign(static_cast<std::size_t>(n_) + 1, unset);  // one more: the end of succ_
  const std::size_t lists = program_.kernel_lists().size();
  CostClasses classes = cost_classes();
  list_time_.assign(lists * classes.costs.size(), Time());
  list_known_.assign(list_time_.size(), 0);
  if (interfere_) interference_->setup(classes.costs, classes.class_of, lists);

  // One pass, rank by rank: stream order, dependency counts, effects, kernel costs, and the
  // numbering of the communication ops (strategies::Matching, the Program's rule, built
  // along: the ops are too many to read twice).
  strategies::Matching::Builder matching(program_);
  // Dependencies in op order (valid ones only), to build the successor lists without reading
  // the ops a second time.
  Edges edges;
  edges.dep.reserve(n_);
  edges.count.resize(n_);
  for (int r = 0; r < world_; ++r) read_rank(r, classes, matching, edges);
  // Mirrored ranks issue no ops: a collective waits for the members that do (the network
  // still costs it over the whole group).
  matching_ = matching.finish(/*index_ops=*/false);
  build_instances();
  build_successors(edges);
  if (program_.has_event_driven()) {
    ready_.assign(static_cast<std::size_t>(world_) * kStreamCount, ReadyQueue{});
  }
}

void Simulator::check_rank_ranges() const {
  if (world_ > traces::kMaxSpanRanks) {
    throw std::invalid_argument("simulate: " + std::to_string(world_) +
                                " ranks; a timeline names at most " +
                                std::to_string(traces::kMaxSpanRanks));
  }
  for (int r = 0; r < world_; ++r) {
    const OpId end = rank_end(r);
    if (program_.first_op(r) > end || (r == 0 && program_.first_op(0) != 0) ||
        (r + 1 == world_ && program_.first_op(world_) != n_)) {
      throw std::invalid_argument(
          "simulate: the program's ranks do not cover its ops (was Program::finish called?)");
    }
  }
}

Simulator::CostClasses Simulator::cost_classes() const {
  CostClasses c;
  c.class_of.assign(static_cast<std::size_t>(world_), 0);
  if (cluster_.homogeneous()) {
    c.costs.emplace_back(cluster_);
    return c;
  }
  std::vector<std::pair<const hw::DeviceSpec*, double>> keys;
  for (int r = 0; r < world_; ++r) {
    const int device = r < cluster_.world_size() ? r : 0;
    const std::pair<const hw::DeviceSpec*, double> key{&cluster_.device_of(device),
                                                       cluster_.slowdown_of(device)};
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      c.costs.emplace_back(cluster_, device);
      it = keys.end() - 1;
    }
    c.class_of[static_cast<std::size_t>(r)] = static_cast<std::uint32_t>(it - keys.begin());
  }
  return c;
}

void Simulator::read_rank(int r, const CostClasses& classes,
                          strategies::Matching::Builder& matching, Edges& edges) {
  matching.begin_rank(r);
  std::array<std::uint32_t, kStreamCount> last;
  last.fill(kNone);
  const bool stream_order = !program_.event_driven(r);  // Program::event_driven
  for (OpId id = program_.first_op(r); id < rank_end(r); ++id) {
    const Op& o = program_.ops()[id];
    OpState& st = ops_[id];
    const auto s = static_cast<std::size_t>(o.stream);
    if (s >= static_cast<std::size_t>(kStreamCount)) {
      throw std::invalid_argument(program_.describe(id) + ": stream out of range");
    }
    std::uint32_t pending = o.deps_count;
    if (stream_order && last[s] != kNone) {
      ops_[last[s]].next = id;
      ++pending;
    }
    last[s] = id;
    std::uint16_t valid_deps = 0;
    for (OpId dep : program_.deps_of(o)) {
      if (dep >= n_) continue;  // a dependency out of range is never satisfied
      ++ops_[dep].succ;
      edges.dep.push_back(dep);
      ++valid_deps;
    }
    edges.count[id] = valid_deps;
    for (const auto& e : program_.effects_of(o)) {
      st.flags |= e.at_end ? kEndEffects : kStartEffects;
    }
    const auto kind = static_cast<std::uint8_t>(o.work.index());  // OpKind's order
    st.kind = kind;
    if (kind == kCompute) {
      st.payload = kernel_slot(id, o, classes);
    } else {
      if (kind == kCollective && std::get<Collective>(o.work).group >= program_.groups().size()) {
        throw std::invalid_argument(program_.describe(id) + ": group " +
                                    std::to_string(std::get<Collective>(o.work).group) +
                                    " out of range");
      }
      // A collective of a non-member or a message to no rank never arrives (reported as
      // waiting forever); the others get their rendezvous below.
      if (!matching.add(id, o)) ++pending;
    }
    st.pending = pending;
  }
  matching.end_rank();
}

std::uint32_t Simulator::kernel_slot(OpId id, const Op& o, const CostClasses& classes) {
  const auto& c = std::get<Compute>(o.work);
  const std::size_t lists = program_.kernel_lists().size();
  if (c.kernels >= lists) {
    throw std::invalid_argument(program_.describe(id) + ": kernel list " +
                                std::to_string(c.kernels) + " out of range");
  }
  const std::uint32_t cost_class = classes.class_of[static_cast<std::size_t>(o.rank)];
  const std::size_t slot = cost_class * lists + c.kernels;
  if (!list_known_[slot]) {
    const auto& kernels = program_.kernel_lists()[c.kernels];
    list_time_[slot] = classes.costs[cost_class].kernels_time(kernels);
    if (interfere_) interference_->set_mix(slot, classes.costs[cost_class].work_mix(kernels));
    list_known_[slot] = 1;
  }
  return static_cast<std::uint32_t>(slot);
}

void Simulator::build_instances() {
  for (std::uint32_t rv = 0; rv < matching_.rendezvous_count(); ++rv) {
    for (const OpId id : matching_.ops_of(rv)) ops_[id].payload = rv;
  }
  instances_.assign(matching_.rendezvous_count(), Instance{});
  if (interfere_) interference_->size_transfers(matching_.rendezvous_count());
  for (std::uint32_t i = 0; i < matching_.rendezvous_count(); ++i) {
    instances_[i].expected = matching_.expected(i);
    if (matching_.is_collective(i)) continue;
    for (const OpId id : matching_.ops_of(i)) {
      if (const auto* s = std::get_if<Send>(&program_.op(id).work);
          s && (s->eager || s->detached)) {
        instances_[i].eager = true;
        instances_[i].detached = s->detached;
      }
    }
  }
}

void Simulator::build_successors(const Edges& edges) {
  for (std::size_t i = 0; i < n_; ++i) ops_[i + 1].succ += ops_[i].succ;
  succ_.resize(ops_[n_].succ);
  std::size_t edge = edges.dep.size();
  for (OpId id = n_; id-- > 0;) {
    for (std::uint16_t k = edges.count[id]; k > 0; --k) {
      succ_[--ops_[edges.dep[--edge]].succ] = id;
    }
  }
}

void Simulator::start_op(OpId id) {
  OpState& st = ops_[id];
  if (st.kind == kCompute && !ready_.empty() && !claim_stream(id)) return;
  st.status = kStarted;
  // What this op's end will touch is fetched now, while its work runs: the ops of a thousand
  // ranks advance side by side, too many streams of accesses for the hardware to predict.
  if (st.next != kNone) {
    __builtin_prefetch(&ops_[st.next]);
    __builtin_prefetch(&program_.ops()[st.next]);
  }
  __builtin_prefetch(succ_.data() + st.succ);
  if (st.flags & kEndEffects) __builtin_prefetch(program_.effects_of(program_.op(id)).data());
  if (st.kind == kCompute) {
    if (st.flags & kStartEffects) memory_.apply(id, false, now_);
    if (interfere_) {
      interference_->start_compute(id, st.payload, list_time_[st.payload], now_);
    } else {
      engine_.schedule(now_ + list_time_[st.payload], 0, id);
    }
    return;
  }
  // The meeting rule of communication ops (strategies::Send::eager): a rendezvous starts its
  // transfer when all its members have started; an eager message when its send has.
  Instance& inst = instances_[st.payload];
  ++inst.arrived;
  if (inst.started) {  // an eager message's receive, after its send
    if (st.flags & kStartEffects) memory_.apply(id, false, now_);
    if (inst.delivered) engine_.schedule(now_, kDeliveredKind, id);  // its data is here
    return;
  }
  if (inst.arrived == inst.expected || (inst.eager && st.kind == kSend)) {
    start_transfer(st.payload);
    // A detached send ends now; its transfer runs on (strategies::Send::detached).
    if (inst.detached && st.kind == kSend) engine_.schedule(now_, kDeliveredKind, id);
  }
}

void Simulator::start_transfer(std::uint32_t instance) {
  instances_[instance].start = now_;
  instances_[instance].started = true;
  const auto members = matching_.ops_of(instance);
  for (const OpId member : members) {
    // The members that started (an eager message's receive may come later: start_op).
    if (ops_[member].status != kStarted) continue;
    if (ops_[member].flags & kStartEffects) memory_.apply(member, false, now_);
  }
  TransferRequest request;
  OpId describes = members.front();
  if (matching_.is_collective(instance)) {
    // The lowest rank's call describes the collective.
    const auto& c = std::get<Collective>(program_.op(members.front()).work);
    request.collective = true;
    request.kind = c.kind;
    request.group = c.group;
    request.bytes = c.bytes;
  } else {
    request.collective = false;
    for (const OpId member : members) {
      const Op& o = program_.op(member);
      if (const auto* s = std::get_if<Send>(&o.work)) {
        request.src = o.rank;
        request.dst = s->peer;
        request.bytes = s->bytes;
        request.copy_engine = s->sms == 0;
        describes = member;
      }
    }
  }
  classify(request, describes);
  for (Observer* obs : options_.observers) obs->on_transfer(program_.op(describes), request);
  network_.start(instance, request, now_);
  if (interfere_) interference_->begin_transfer(instance, request, now_);
}

void Simulator::complete_instance(TransferId instance) {
  if (instance >= instances_.size()) {
    throw std::logic_error("simulate: the network finished unknown transfer " +
                           std::to_string(instance));
  }
  Instance& inst = instances_[instance];
  if (!inst.started || inst.delivered || inst.arrived == kNone ||
      (!inst.eager && inst.arrived != inst.expected)) {
    throw std::logic_error("simulate: the network finished transfer " + std::to_string(instance) +
                           ", which was not running");
  }
  const Time start = inst.start;
  const auto members = matching_.ops_of(instance);
  if (interfere_) interference_->end_transfer(instance, now_);
  // Every member that started ends now: record them all before anything they release starts.
  // An eager message's receive that has not started ends when it starts (start_op).
  if (inst.arrived != inst.expected)
    inst.delivered = true;
  else
    inst.arrived = kNone;  // finished: never again
  // A detached send ended (and released what follows it) when the transfer started: not again.
  OpId ended_before = kNone;
  if (inst.detached) {
    for (const OpId member : members) {
      if (ops_[member].status == kDone) ended_before = member;
    }
  }
  for (const OpId member : members) {
    if (ops_[member].status == kStarted) finish_op(member, start);
  }
  for (const OpId member : members) {
    if (ops_[member].status == kDone && member != ended_before) release_successors(member);
  }
}

void Simulator::finish_op(OpId id, Time start) {
  OpState& st = ops_[id];
  st.status = kDone;
  ++done_;
  if (st.flags & kEndEffects) memory_.apply(id, true, now_);
  if (notify_spans_) {
    const Op& o = program_.op(id);
    const Span span{o.rank, o.stream, id, start, now_};
    if (options_.record_spans) {
      const std::int64_t offset = span_offset_[static_cast<std::size_t>(o.rank)];
      if (offset != kNoSpans) timeline_.spans[static_cast<std::size_t>(id + offset)] = span;
    }
    for (Observer* obs : options_.observers) obs->on_span(span);
  }
}

void Simulator::release_successors(OpId id) {
  const std::uint32_t next = ops_[id].next;
  if (next != kNone && --ops_[next].pending == 0) start_op(next);
  const std::uint32_t end = ops_[id + 1].succ;
  for (std::uint32_t i = ops_[id].succ; i < end; ++i) {
    const OpId s = succ_[i];
    if (--ops_[s].pending == 0) start_op(s);
  }
}

std::string Simulator::why_waiting(OpId id) const {
  const Op& o = program_.op(id);
  const OpState& st = ops_[id];
  if (st.status == kWaiting) {
    std::string deps;
    for (OpId dep : program_.deps_of(o)) {
      if (dep < n_ && ops_[dep].status == kDone) continue;
      if (!deps.empty()) deps += "; ";
      deps += dep < n_ ? program_.describe(dep)
                       : "op " + std::to_string(dep) + ", which does not exist";
    }
    if (!deps.empty()) return "waits for " + deps + " (dependency)";
    if (st.kind == kCollective && st.payload == kNone) {
      const auto& c = std::get<Collective>(o.work);
      return "can never run: rank " + std::to_string(o.rank) + " is not a member of group '" +
             program_.groups()[c.group].name + "'";
    }
    if (st.kind != kCompute && st.payload == kNone) {
      const std::int32_t peer =
          st.kind == kSend ? std::get<Send>(o.work).peer : std::get<Recv>(o.work).peer;
      return "can never run: its peer, rank " + std::to_string(peer) +
             ", is not a rank of the program";
    }
    return "is ready but never ran";
  }
  if (st.kind == kCompute) return "started and never ended";
  // Arrived at its rendezvous: name who is missing.
  const std::uint32_t instance = st.payload;
  if (st.kind == kCollective) {
    const auto members = matching_.issuing_members(matching_.group_of(instance));
    std::vector<std::int32_t> arrived;
    for (const OpId m : matching_.ops_of(instance)) {
      if (ops_[m].status != kWaiting) arrived.push_back(program_.op(m).rank);
    }
    std::string missing;
    int count = 0;
    for (std::int32_t r : members) {
      if (std::find(arrived.begin(), arrived.end(), r) != arrived.end()) continue;
      missing += (count++ ? ", " : "") + std::to_string(r);
    }
    return "waits for " + std::string(count == 1 ? "rank " : "ranks ") + missing +
           " to reach this collective";
  }
  if (st.kind == kSend) {
    return "waits for rank " + std::to_string(std::get<Send>(o.work).peer) +
           " to post the matching recv";
  }
  return "waits for rank " + std::to_string(std::get<Recv>(o.work).peer) +
         " to post the matching send";
}

std::string Simulator::describe_deadlock() const {
  constexpr std::size_t kMaxLines = 12;
  std::string text = "deadlock: " + std::to_string(n_ - done_) + " ops never ran; waiting:";
  std::size_t lines = 0;
  for (int r = 0; r < world_; ++r) {
    std::array<OpId, kStreamCount> head;
    head.fill(kNone);
    const OpId begin = program_.first_op(r);
    const OpId end = r + 1 < world_ ? program_.first_op(r + 1) : n_;
    for (OpId id = begin; id < end; ++id) {
      const auto s = static_cast<std::size_t>(program_.op(id).stream);
      if (head[s] == kNone && ops_[id].status != kDone) head[s] = id;
    }
    for (OpId id : head) {
      if (id == kNone) continue;
      if (lines++ < kMaxLines) text += "\n  " + program_.describe(id) + " " + why_waiting(id);
    }
  }
  if (lines > kMaxLines) text += "\n  ... and " + std::to_string(lines - kMaxLines) + " more";
  return text;
}

}  // namespace

traces::Timeline simulate(const strategies::Program& program, const hw::ClusterSpec& cluster,
                          const SimOptions& options) {
  const auto network = make_network(cluster, program);
  return simulate(program, cluster, *network, options);
}

traces::Timeline simulate(const strategies::Program& program, const hw::ClusterSpec& cluster,
                          Network& network, const SimOptions& options) {
  Simulator simulator(program, cluster, network, options);
  return simulator.run();
}

std::optional<TransportConflict> transport_conflict(
    std::span<const strategies::TransportPolicy> policies) {
  using strategies::PriorityPolicy;
  std::optional<std::size_t> first;
  for (std::size_t i = 0; i < policies.size(); ++i) {
    const auto& p = policies[i];
    if (!p.classed()) continue;
    if (!first) {
      first = i;
      continue;
    }
    const auto& f = policies[*first];
    const auto conflict = [&](std::string key) {
      return TransportConflict{*first, i, std::move(key)};
    };
    if ((f.priority == PriorityPolicy::fifo) != (p.priority == PriorityPolicy::fifo)) {
      return conflict("priority");
    }
    if (f.scheduling != p.scheduling) return conflict("scheduling");
    if (f.within_class != p.within_class) return conflict("within_class");
    if (f.scheduling == strategies::LinkScheduling::weighted && f.weights != p.weights) {
      return conflict("weights");
    }
  }
  return std::nullopt;
}

bool replicas_behave_alike(const hw::ClusterSpec& cluster) {
  return cluster.network_model == hw::NetworkModel::analytical && cluster.homogeneous();
}

}  // namespace stratasim::sim
