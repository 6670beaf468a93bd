#include "exec/interpreter.hpp"

#include <algorithm>
#include <exception>
#include <map>
#include <thread>

namespace stratasim::exec {

using namespace strategies;

bool ThreadBarrier::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  if (aborted_) return false;
  const auto generation = generation_;
  if (++waiting_ == parties_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
  return generation_ != generation;
}

void ThreadBarrier::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  cv_.notify_all();
}

LocalWorld::LocalWorld(int world_size, Factory factory)
    : world_size_(world_size), factory_(std::move(factory)), barrier_(world_size) {}

std::vector<int> LocalWorld::local_ranks() const {
  std::vector<int> ranks(static_cast<std::size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return ranks;
}

namespace {

std::string pending_text(const Program& program, int rank, const std::vector<PendingOp>& pending) {
  std::string text;
  const std::size_t shown = std::min<std::size_t>(pending.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) {
    text += "\n  " + program.describe(pending[i].op) + ": " + pending[i].waiting_for;
  }
  if (pending.size() > shown) {
    text += "\n  ... and " + std::to_string(pending.size() - shown) + " more op(s) of rank " +
            std::to_string(rank);
  }
  return text;
}

}  // namespace

traces::Timeline assemble_timeline(const Program& program,
                                   const std::vector<RankMeasurement>& ranks) {
  traces::Timeline t;
  t.world_size = program.world_size();
  t.spans.resize(program.op_count());
  t.ranks.resize(static_cast<std::size_t>(program.world_size()));
  for (const RankMeasurement& m : ranks) {
    for (const OpTiming& o : m.ops) {
      const Op& op = program.op(o.op);
      t.spans[o.op] = traces::Span{op.rank, op.stream, o.op, o.start, o.end};
    }
    t.ranks[static_cast<std::size_t>(m.rank)] = m.memory;
    t.memory.insert(t.memory.end(), m.samples.begin(), m.samples.end());
    for (int tier = 0; tier < kMemoryTierCount; ++tier) {
      const traces::TierPeak& p = m.memory.tiers[static_cast<std::size_t>(tier)];
      if (p.capacity.count() > 0 && p.peak > p.capacity) {
        t.out_of_memory.push_back(
            {m.rank, static_cast<MemoryTier>(tier), p.capacity, p.peak, p.op, p.time});
      }
    }
  }
  std::stable_sort(
      t.memory.begin(), t.memory.end(),
      [](const traces::MemorySample& a, const traces::MemorySample& b) { return a.time < b.time; });
  return t;
}

MeasuredRun run(const ExecPlan& plan, World& world, const RunOptions& options) {
  const Program& program = plan.program();
  const std::vector<int> local = world.local_ranks();
  const int iterations = options.warmup_iterations + options.iterations;
  if (options.iterations < 1) throw std::invalid_argument("a run needs at least one iteration");

  std::mutex mutex;
  std::exception_ptr first_error;
  std::map<int, std::string> hang;  // pending ops of every stuck local rank
  std::vector<std::vector<RankMeasurement>> measured(
      static_cast<std::size_t>(options.iterations),
      std::vector<RankMeasurement>(static_cast<std::size_t>(program.world_size())));

  auto rank_main = [&](int rank) {
    try {
      std::unique_ptr<RankDevice> device = world.make_device(rank);
      const auto ops = program.ops_of(rank);
      const OpId first = program.first_op(rank);
      for (int it = 0; it < iterations; ++it) {
        if (!world.barrier()) return;
        device->begin_iteration();
        for (std::size_t i = 0; i < ops.size(); ++i) device->issue(first + static_cast<OpId>(i));
        if (!device->synchronize(options.watchdog)) {
          const auto pending = device->pending();
          std::lock_guard lock(mutex);
          if (!pending.empty()) {
            hang[rank] = "\nrank " + std::to_string(rank) + " has " +
                         std::to_string(pending.size()) +
                         " unfinished op(s):" + pending_text(program, rank, pending);
          }
          world.abort();
          return;
        }
        if (it >= options.warmup_iterations) {
          measured[static_cast<std::size_t>(it - options.warmup_iterations)]
                  [static_cast<std::size_t>(rank)] = device->measurement();
        }
      }
      world.barrier();
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!first_error) first_error = std::current_exception();
      world.abort();
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(local.size());
  for (int rank : local) threads.emplace_back(rank_main, rank);
  for (auto& t : threads) t.join();

  if (first_error) std::rethrow_exception(first_error);
  if (!hang.empty() || world.aborted()) {
    std::string stuck;
    for (const auto& [rank, text] : hang) stuck += text;
    throw HangError("the run stopped: no op finished for " +
                    std::to_string(options.watchdog.count()) + " ms (a deadlock or a hang)" +
                    (stuck.empty() ? std::string(" on another process") : stuck));
  }

  world.gather(measured);
  MeasuredRun result;
  if (!world.reports()) return result;
  std::vector<traces::Timeline> timelines;
  for (const auto& ranks : measured) {
    timelines.push_back(assemble_timeline(program, ranks));
    Time end;
    for (const auto& s : timelines.back().spans) end = std::max(end, s.end);
    result.iteration_times_s.push_back(end.seconds());
  }
  std::vector<int> order(result.iteration_times_s.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return result.iteration_times_s[static_cast<std::size_t>(a)] <
           result.iteration_times_s[static_cast<std::size_t>(b)];
  });
  result.median_iteration = order[(order.size() - 1) / 2];
  const auto median = static_cast<std::size_t>(result.median_iteration);
  result.timeline = std::move(timelines[median]);
  for (const RankMeasurement& m : measured[median]) {
    result.kernels.insert(result.kernels.end(), m.kernels.begin(), m.kernels.end());
    result.reserved_peak = std::max(result.reserved_peak, m.reserved_peak);
  }
  return result;
}

}  // namespace stratasim::exec
