#include "exec/host_device.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "exec/host_kernels.hpp"
#include "exec/memory_pool.hpp"

namespace stratasim::exec {

using namespace strategies;
using Clock = std::chrono::steady_clock;

namespace {

/// The value element `i` of rank `rank`'s input to its `seq`-th collective on a group holds:
/// small integers, so that float sums over any group are exact and checkable.
float input_value(int rank, std::uint32_t seq, std::int64_t i) {
  return static_cast<float>(1 + (rank * 7 + static_cast<std::int64_t>(seq) * 3 + i) % 13);
}

/// Byte `i` of the `seq`-th transfer from `from` to `to`.
std::uint8_t transfer_byte(int from, int to, std::uint32_t seq, std::int64_t i) {
  return static_cast<std::uint8_t>(
      (from * 31 + to * 17 + static_cast<std::int64_t>(seq) * 7 + i * 13) & 0xFF);
}

struct CollectiveSlot {
  int arrived = 0;
  std::vector<bool> present;                // per member
  std::vector<std::vector<float>> inputs;   // per member
  std::vector<std::vector<float>> outputs;  // per member
  bool done = false;
  Clock::time_point start, end;
  int taken = 0;
};

struct TransferSlot {
  bool sent = false;
  bool receiving = false;
  std::vector<std::uint8_t> data;      // the sender's buffer
  std::vector<std::uint8_t> received;  // the receiver's buffer, filled by the copy
  bool done = false;
  Clock::time_point start, end;
  int taken = 0;  // sides that saw it done; the second erases the slot
};

/// What all ranks of a host run share: the rendezvous of collectives and transfers.
struct HostShared {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::pair<std::uint32_t, std::uint32_t>, CollectiveSlot> collectives;  // group, seq
  std::map<std::tuple<int, int, std::uint32_t>, TransferSlot> transfers;          // from, to, seq
  std::uint64_t generation = 0;  // bumped (under mutex) whenever a slot changes
  std::atomic<Clock::rep> last_progress{0};
  std::vector<Clock::time_point> epochs;  // start of each iteration
  std::atomic<bool> aborted{false};

  void progress() { last_progress.store(Clock::now().time_since_epoch().count()); }
  void changed() {
    ++generation;
    cv.notify_all();
  }
  Clock::time_point epoch(std::size_t iteration) {
    std::lock_guard lock(mutex);
    while (epochs.size() <= iteration) epochs.push_back(Clock::now());
    return epochs[iteration];
  }
};

/// Computes every member's output from the inputs (the reduction or exchange of `kind`).
void exchange(CollectiveKind kind, CollectiveSlot& slot, std::int64_t count) {
  const auto n = static_cast<std::int64_t>(slot.inputs.size());
  const std::int64_t chunk = count / n;
  slot.outputs.assign(static_cast<std::size_t>(n), {});
  auto sum_range = [&](std::int64_t begin, std::int64_t len) {
    std::vector<float> out(static_cast<std::size_t>(len), 0.0f);
    for (const auto& in : slot.inputs) {
      for (std::int64_t i = 0; i < len; ++i) {
        out[static_cast<std::size_t>(i)] += in[static_cast<std::size_t>(begin + i)];
      }
    }
    return out;
  };
  for (std::int64_t m = 0; m < n; ++m) {
    auto& out = slot.outputs[static_cast<std::size_t>(m)];
    switch (kind) {
      case CollectiveKind::all_reduce:
        out = sum_range(0, count);
        break;
      case CollectiveKind::reduce:
        if (m == 0) out = sum_range(0, count);
        break;
      case CollectiveKind::reduce_scatter:
        out = sum_range(m * chunk, chunk);
        break;
      case CollectiveKind::broadcast:
        out = slot.inputs[0];
        break;
      case CollectiveKind::all_gather:
        out.resize(static_cast<std::size_t>(chunk * n));
        for (std::int64_t j = 0; j < n; ++j) {
          std::copy_n(slot.inputs[static_cast<std::size_t>(j)].begin(), chunk,
                      out.begin() + j * chunk);
        }
        break;
      case CollectiveKind::all_to_all:
        out.resize(static_cast<std::size_t>(chunk * n));
        for (std::int64_t j = 0; j < n; ++j) {
          std::copy_n(slot.inputs[static_cast<std::size_t>(j)].begin() + m * chunk, chunk,
                      out.begin() + j * chunk);
        }
        break;
    }
  }
}

class HostRankDevice final : public RankDevice {
 public:
  HostRankDevice(const ExecPlan& plan, int rank, HostShared& shared, const WorldOptions& options)
      : plan_(plan),
        program_(plan.program()),
        rank_(rank),
        shared_(shared),
        options_(options),
        scratch_(options.device.seed * 1000003 + static_cast<std::uint64_t>(rank)),
        first_(program_.first_op(rank)),
        count_(program_.ops_of(rank).size()) {
    const std::string who = "rank " + std::to_string(rank);
    const Bytes capacity =
        options.capacity.count() > 0 ? options.capacity : Bytes(std::int64_t{4} << 30);
    auto allocate = [](std::size_t bytes) { return std::malloc(bytes); };
    auto release = [](void* p, std::size_t) { std::free(p); };
    pools_[0] = std::make_unique<MemoryPool>(who + " device memory", capacity, allocate, release);
    pools_[1] = std::make_unique<MemoryPool>(who + " host memory", Bytes(0), allocate, release);
    pools_[2] = std::make_unique<MemoryPool>(who + " NVMe", Bytes(0));
    state_.assign(count_, State::idle);
    timings_.resize(count_);
  }

  void begin_iteration() override {
    epoch_ = shared_.epoch(iteration_++);
    for (auto& pool : pools_) pool->reset();
    std::fill(state_.begin(), state_.end(), State::idle);
    for (auto& q : queues_) q.clear();
    std::fill(std::begin(heads_), std::end(heads_), std::size_t{0});
    kernels_.clear();
    unfinished_ = 0;
    for (const ResidentMemory& m : program_.initial_memory(rank_)) {
      pools_[static_cast<std::size_t>(m.tier)]->apply(m.bytes, m.category, first_, Time(),
                                                      "the rank's initial memory");
    }
  }

  void issue(OpId id) override {
    const Op& op = program_.op(id);
    queues_[static_cast<std::size_t>(op.stream)].push_back(id);
    state_[id - first_] = State::issued;
    ++unfinished_;
  }

  bool synchronize(std::chrono::milliseconds watchdog) override {
    shared_.progress();
    while (unfinished_ > 0) {
      std::uint64_t generation;
      {
        std::lock_guard lock(shared_.mutex);
        generation = shared_.generation;
      }
      if (step()) continue;
      if (shared_.aborted) return false;
      const auto idle = Clock::now().time_since_epoch().count() - shared_.last_progress.load();
      if (std::chrono::duration_cast<std::chrono::milliseconds>(Clock::duration(idle)) >=
          watchdog) {
        return false;
      }
      std::unique_lock lock(shared_.mutex);
      shared_.cv.wait_for(lock, std::chrono::milliseconds(20),
                          [&] { return shared_.generation != generation || shared_.aborted; });
    }
    return true;
  }

  std::vector<PendingOp> pending() const override {
    std::vector<PendingOp> out;
    for (int s = 0; s < kStreamCount; ++s) {
      const auto& q = queues_[static_cast<std::size_t>(s)];
      const std::size_t head = heads_[static_cast<std::size_t>(s)];
      if (head >= q.size()) continue;
      out.push_back({q[head], waiting_for(q[head])});
    }
    return out;
  }

  RankMeasurement measurement() const override {
    RankMeasurement m;
    m.rank = rank_;
    m.ops = timings_;
    m.kernels = kernels_;
    for (int t = 0; t < kMemoryTierCount; ++t) {
      const MemoryPool& pool = *pools_[static_cast<std::size_t>(t)];
      m.memory.tiers[static_cast<std::size_t>(t)] = pool.peak();
      for (const auto& s : pool.samples()) {
        m.samples.push_back({rank_, static_cast<MemoryTier>(t), s.time, s.total, s.op});
      }
    }
    return m;
  }

 private:
  enum class State : std::uint8_t { idle, issued, waiting, done };

  Time since_epoch(Clock::time_point t) const {
    return Time::ps(std::chrono::duration_cast<std::chrono::nanoseconds>(t - epoch_).count() *
                    1000);
  }
  Time now() const { return since_epoch(Clock::now()); }

  bool deps_done(const Op& op) const {
    for (OpId d : program_.deps_of(op)) {
      if (state_[d - first_] != State::done) return false;
    }
    return true;
  }

  void apply_effects(OpId id, bool at_end, Time when) {
    const Op& op = program_.op(id);
    for (const MemoryEffect& e : program_.effects_of(op)) {
      if (e.at_end != at_end) continue;
      pools_[static_cast<std::size_t>(e.tier)]->apply(e.delta, e.category, id, when,
                                                      program_.describe(id));
    }
  }

  void finish(OpId id, Time start, Time end) {
    apply_effects(id, true, end);
    state_[id - first_] = State::done;
    timings_[id - first_] = {id, start, end};
    --unfinished_;
    shared_.progress();
  }

  /// Tries to start or finish the head op of every stream; true when anything changed.
  bool step() {
    bool progressed = false;
    for (int s = 0; s < kStreamCount; ++s) {
      auto& q = queues_[static_cast<std::size_t>(s)];
      std::size_t& head = heads_[static_cast<std::size_t>(s)];
      while (head < q.size()) {
        const OpId id = q[head];
        const Op& op = program_.op(id);
        State& st = state_[id - first_];
        if (st == State::issued) {
          if (!deps_done(op)) break;
          start(id, op);
          progressed = true;
        }
        if (st == State::waiting && !poll(id, op)) break;
        if (st != State::done) break;
        progressed = true;
        ++head;
      }
    }
    return progressed;
  }

  void start(OpId id, const Op& op) {
    const Time begin = now();
    apply_effects(id, false, begin);
    if (const auto* c = std::get_if<Compute>(&op.work)) {
      const auto& kernels = program_.kernels_of(*c);
      Time t = begin;
      for (std::size_t k = 0; k < kernels.size(); ++k) {
        host::run_kernel(kernels[k], scratch_);
        const Time end = now();
        kernels_.push_back({id, static_cast<std::uint32_t>(k), t, end});
        t = end;
      }
      finish(id, begin, now());
      return;
    }
    state_[id - first_] = State::waiting;
    std::lock_guard lock(shared_.mutex);
    if (const auto* c = std::get_if<Collective>(&op.work)) {
      arrive(id, *c);
    } else if (const auto* snd = std::get_if<Send>(&op.work)) {
      auto& slot = shared_.transfers[{rank_, snd->peer, plan_.sequence(id)}];
      slot.data.resize(static_cast<std::size_t>(snd->bytes.count()));
      for (std::size_t i = 0; i < slot.data.size(); ++i) {
        slot.data[i] =
            transfer_byte(rank_, snd->peer, plan_.sequence(id), static_cast<std::int64_t>(i));
      }
      slot.sent = true;
      if (slot.receiving) complete(slot);
    } else if (const auto* rcv = std::get_if<Recv>(&op.work)) {
      auto& slot = shared_.transfers[{rcv->peer, rank_, plan_.sequence(id)}];
      slot.receiving = true;
      if (slot.sent) complete(slot);
    }
    shared_.changed();
  }

  void complete(TransferSlot& slot) {
    slot.start = Clock::now();
    // The bytes cross from the sender's buffer to the receiver's.
    slot.received = slot.data;
    slot.done = true;
    slot.end = Clock::now();
  }

  void arrive(OpId id, const Collective& c) {
    const auto& group = program_.groups()[c.group];
    const auto n = group.ranks.size();
    auto& slot = shared_.collectives[{c.group, plan_.sequence(id)}];
    if (slot.present.empty()) {
      slot.present.assign(n, false);
      slot.inputs.resize(n);
    }
    const auto member = static_cast<std::size_t>(plan_.member_index(c.group, rank_));
    const std::int64_t count = c.bytes.count() / size_of(c.dtype);
    std::int64_t input = count;
    if (strategies::traits_of(c.kind).input_is_slice) input = count / static_cast<std::int64_t>(n);
    auto& in = slot.inputs[member];
    in.resize(static_cast<std::size_t>(input));
    for (std::int64_t i = 0; i < input; ++i) {
      in[static_cast<std::size_t>(i)] = input_value(rank_, plan_.sequence(id), i);
    }
    slot.present[member] = true;
    if (++slot.arrived == static_cast<int>(n)) {
      slot.start = Clock::now();
      exchange(c.kind, slot, count);
      slot.done = true;
      slot.end = Clock::now();
    }
  }

  /// Finishes a waiting collective or transfer whose data has moved; true when it did.
  bool poll(OpId id, const Op& op) {
    Time start, end;
    {
      std::lock_guard lock(shared_.mutex);
      if (const auto* c = std::get_if<Collective>(&op.work)) {
        const auto key = std::make_pair(c->group, plan_.sequence(id));
        auto& slot = shared_.collectives.at(key);
        if (!slot.done) return false;
        const auto member = static_cast<std::size_t>(plan_.member_index(c->group, rank_));
        received_ = std::move(slot.outputs[member]);
        start = since_epoch(slot.start);
        end = since_epoch(slot.end);
        if (++slot.taken == static_cast<int>(slot.inputs.size())) shared_.collectives.erase(key);
        if (options_.device.verify) verify(id, *c, program_.groups()[c->group].ranks);
      } else if (const auto* rcv = std::get_if<Recv>(&op.work)) {
        const auto key = std::make_tuple(rcv->peer, rank_, plan_.sequence(id));
        auto& slot = shared_.transfers.at(key);
        if (!slot.done) return false;
        bytes_ = std::move(slot.received);
        start = since_epoch(slot.start);
        end = since_epoch(slot.end);
        if (++slot.taken == 2) shared_.transfers.erase(key);
        if (options_.device.verify) verify(id, *rcv);
      } else {
        const auto* snd = std::get_if<Send>(&op.work);
        const auto key = std::make_tuple(rank_, snd->peer, plan_.sequence(id));
        auto& slot = shared_.transfers.at(key);
        if (!slot.done) return false;
        start = since_epoch(slot.start);
        end = since_epoch(slot.end);
        if (++slot.taken == 2) shared_.transfers.erase(key);
      }
    }
    finish(id, start, end);
    return true;
  }

  void verify(OpId id, const Collective& c, const std::vector<std::int32_t>& ranks) const {
    const auto n = static_cast<std::int64_t>(ranks.size());
    const std::int64_t count = c.bytes.count() / size_of(c.dtype);
    const std::int64_t chunk = count / n;
    const int member = plan_.member_index(c.group, rank_);
    const std::uint32_t seq = plan_.sequence(id);
    auto sum = [&](std::int64_t i) {
      float s = 0;
      for (int r : ranks) s += input_value(r, seq, i);
      return s;
    };
    std::vector<float> expected;
    switch (c.kind) {
      case CollectiveKind::all_reduce:
        for (std::int64_t i = 0; i < count; ++i) expected.push_back(sum(i));
        break;
      case CollectiveKind::reduce:
        if (member == 0) {
          for (std::int64_t i = 0; i < count; ++i) expected.push_back(sum(i));
        }
        break;
      case CollectiveKind::reduce_scatter:
        for (std::int64_t i = 0; i < chunk; ++i) expected.push_back(sum(member * chunk + i));
        break;
      case CollectiveKind::broadcast:
        for (std::int64_t i = 0; i < count; ++i) expected.push_back(input_value(ranks[0], seq, i));
        break;
      case CollectiveKind::all_gather:
        for (std::int64_t j = 0; j < n; ++j) {
          for (std::int64_t i = 0; i < chunk; ++i) {
            expected.push_back(input_value(ranks[static_cast<std::size_t>(j)], seq, i));
          }
        }
        break;
      case CollectiveKind::all_to_all:
        for (std::int64_t j = 0; j < n; ++j) {
          for (std::int64_t i = 0; i < chunk; ++i) {
            expected.push_back(
                input_value(ranks[static_cast<std::size_t>(j)], seq, member * chunk + i));
          }
        }
        break;
    }
    if (expected.size() != received_.size()) {
      throw ExecError(program_.describe(id) + ": " + std::string(name_of(c.kind)) + " gave " +
                      std::to_string(received_.size()) + " elements, expected " +
                      std::to_string(expected.size()));
    }
    for (std::size_t i = 0; i < expected.size(); ++i) {
      if (received_[i] != expected[i]) {
        throw ExecError(program_.describe(id) + ": " + std::string(name_of(c.kind)) +
                        " gave element " + std::to_string(i) + " = " +
                        std::to_string(received_[i]) + ", expected " + std::to_string(expected[i]));
      }
    }
  }

  void verify(OpId id, const Recv& r) const {
    if (static_cast<std::int64_t>(bytes_.size()) != r.bytes.count()) {
      throw ExecError(program_.describe(id) + ": received " + std::to_string(bytes_.size()) +
                      " bytes, expected " + std::to_string(r.bytes.count()));
    }
    for (std::size_t i = 0; i < bytes_.size(); ++i) {
      if (bytes_[i] !=
          transfer_byte(r.peer, rank_, plan_.sequence(id), static_cast<std::int64_t>(i))) {
        throw ExecError(program_.describe(id) + ": byte " + std::to_string(i) +
                        " differs from what rank " + std::to_string(r.peer) + " sent");
      }
    }
  }

  std::string waiting_for(OpId id) const {
    const Op& op = program_.op(id);
    if (state_[id - first_] == State::issued) {
      for (OpId d : program_.deps_of(op)) {
        if (state_[d - first_] != State::done) {
          return "waiting for its dependency " + program_.describe(d);
        }
      }
      return "ready";
    }
    std::lock_guard lock(shared_.mutex);
    if (const auto* c = std::get_if<Collective>(&op.work)) {
      const auto& group = program_.groups()[c->group];
      std::string missing;
      const auto it = shared_.collectives.find({c->group, plan_.sequence(id)});
      for (std::size_t m = 0; m < group.ranks.size(); ++m) {
        if (it != shared_.collectives.end() && it->second.present[m]) continue;
        missing += (missing.empty() ? "" : ", ") + std::to_string(group.ranks[m]);
      }
      return "waiting for rank(s) " + missing + " of '" + group.name + "' (collective #" +
             std::to_string(plan_.sequence(id)) + " on the group)";
    }
    if (const auto* r = std::get_if<Recv>(&op.work)) {
      return "waiting for rank " + std::to_string(r->peer) + "'s send #" +
             std::to_string(plan_.sequence(id)) + " to rank " + std::to_string(rank_);
    }
    const auto* s = std::get_if<Send>(&op.work);
    return "waiting for rank " + std::to_string(s->peer) + " to receive (#" +
           std::to_string(plan_.sequence(id)) + " from rank " + std::to_string(rank_) + ")";
  }

  const ExecPlan& plan_;
  const Program& program_;
  int rank_;
  HostShared& shared_;
  WorldOptions options_;
  host::Scratch scratch_;
  OpId first_;
  std::size_t count_;
  std::array<std::unique_ptr<MemoryPool>, kMemoryTierCount> pools_;
  std::vector<State> state_;
  std::vector<OpTiming> timings_;
  std::vector<KernelTiming> kernels_;
  std::array<std::vector<OpId>, kStreamCount> queues_;
  std::size_t heads_[kStreamCount] = {};
  std::size_t unfinished_ = 0;
  std::size_t iteration_ = 0;
  Clock::time_point epoch_;
  std::vector<float> received_;
  std::vector<std::uint8_t> bytes_;
};

class HostWorld final : public LocalWorld {
 public:
  HostWorld(const ExecPlan& plan, const WorldOptions& options)
      : LocalWorld(plan.world_size(), [this, &plan, options](int rank) {
          return std::make_unique<HostRankDevice>(plan, rank, shared_, options);
        }) {}
  void abort() override {
    LocalWorld::abort();
    std::lock_guard lock(shared_.mutex);
    shared_.aborted = true;
    shared_.cv.notify_all();
  }

 private:
  HostShared shared_;
};

}  // namespace

std::unique_ptr<World> make_host_world(const ExecPlan& plan, const WorldOptions& options) {
  const Program& program = plan.program();
  if (program.world_size() > 1024) {
    throw ExecError("the host device runs one thread per rank; " +
                    std::to_string(program.world_size()) + " ranks are too many (at most 1024)");
  }
  for (OpId id = 0; id < program.op_count(); ++id) {
    const Op& op = program.op(id);
    if (const auto* c = std::get_if<Compute>(&op.work)) {
      for (const Kernel& k : program.kernels_of(*c)) {
        if (host::work_size(k) > kHostKernelLimit) {
          throw ExecError(program.describe(id) + ": kernel '" + k.name + "' is too large for " +
                          "the host device (" + std::to_string(host::work_size(k)) +
                          " multiply-adds or elements; at most " +
                          std::to_string(kHostKernelLimit) +
                          "); run a smaller model on the host, or run on GPUs with --device cuda");
        }
      }
      continue;
    }
    Bytes bytes;
    if (const auto* c = std::get_if<Collective>(&op.work)) bytes = c->bytes;
    if (const auto* s = std::get_if<Send>(&op.work)) bytes = s->bytes;
    if (const auto* r = std::get_if<Recv>(&op.work)) bytes = r->bytes;
    if (bytes.count() > kHostTransferLimit) {
      throw ExecError(program.describe(id) + " moves " + to_string(bytes) +
                      ", too much for the host device (at most " +
                      to_string(Bytes(kHostTransferLimit)) + "); run a smaller model");
    }
  }
  return std::make_unique<HostWorld>(plan, options);
}

}  // namespace stratasim::exec
