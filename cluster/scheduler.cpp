#include "cluster/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "cluster/ones.hpp"
#include "cluster/pollux.hpp"
#include "study/errors.hpp"

namespace stratasim::cluster {

int SchedulerInput::free_gpus() const {
  int held = 0;
  for (const JobView& j : jobs) held += j.gpus;
  return total_gpus - held;
}

std::vector<int> Scheduler::allocate(const SchedulerInput& input) {
  std::vector<int> out;
  for (const Allocation& a : decide(input)) out.push_back(a.gpus);
  return out;
}

std::vector<Allocation> Scheduler::decide(const SchedulerInput& input) {
  std::vector<Allocation> out;
  for (int gpus : allocate(input)) out.push_back({gpus, 0});
  return out;
}

namespace {

/// Indices of input.jobs sorted by `key` (smaller first), ties by arrival then id (the input's
/// order is already (arrival, id), and the sort is stable).
template <typename Key>
std::vector<std::size_t> ranked(const SchedulerInput& input, Key key) {
  std::vector<std::size_t> order(input.jobs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return key(input.jobs[a]) < key(input.jobs[b]);
  });
  return order;
}

/// Gives each job, in `order`, its requested GPUs while they are free; a job that does not fit
/// is skipped (preemptive policies: every job starts from 0).
std::vector<int> greedy(const SchedulerInput& input, const std::vector<std::size_t>& order) {
  std::vector<int> out(input.jobs.size(), 0);
  int free = input.total_gpus;
  for (std::size_t i : order) {
    const int want = input.jobs[i].job->gpus;
    if (want <= free) {
      out[i] = want;
      free -= want;
    }
  }
  return out;
}

class Fifo : public Scheduler {
 public:
  std::string name() const override { return "fifo"; }
  std::vector<int> allocate(const SchedulerInput& input) override {
    std::vector<int> out(input.jobs.size(), 0);
    int free = input.free_gpus();
    bool blocked = false;
    for (std::size_t i = 0; i < input.jobs.size(); ++i) {  // (arrival, id) order
      const JobView& j = input.jobs[i];
      if (j.gpus > 0) {
        out[i] = j.gpus;  // non-preemptive: running jobs keep their GPUs
      } else if (!blocked && j.job->gpus <= free) {
        out[i] = j.job->gpus;
        free -= j.job->gpus;
      } else {
        blocked = true;  // head-of-line blocking: nothing behind it starts
      }
    }
    return out;
  }
};

class Srtf : public Scheduler {
 public:
  std::string name() const override { return "srtf"; }
  std::vector<int> allocate(const SchedulerInput& input) override {
    return greedy(input, ranked(input, [&](const JobView& j) {
                    const Speed s = input.speeds->speed(*j.job, j.job->gpus);
                    return s.runnable ? j.remaining_samples / s.samples_per_s : 1e300;
                  }));
  }
};

class Tiresias : public Scheduler {
 public:
  explicit Tiresias(const SchedulerOptions& options)
      : thresholds_(options.tiresias_thresholds_gpu_s), tick_(options.tick_s.value_or(60.0)) {}
  std::string name() const override { return "tiresias"; }
  std::vector<int> allocate(const SchedulerInput& input) override {
    return greedy(input, ranked(input, [&](const JobView& j) { return queue_of(j); }));
  }
  std::optional<double> tick_s() const override { return tick_; }

 private:
  /// The number of thresholds the job's attained GPU-seconds has reached.
  std::size_t queue_of(const JobView& j) const {
    return static_cast<std::size_t>(
        std::upper_bound(thresholds_.begin(), thresholds_.end(), j.attained_gpu_s) -
        thresholds_.begin());
  }
  std::vector<double> thresholds_;
  double tick_;
};

}  // namespace

std::vector<std::string> scheduler_names() {
  return {"fifo", "srtf", "tiresias", "pollux", "ones"};
}

std::unique_ptr<Scheduler> make_scheduler(const std::string& name,
                                          const SchedulerOptions& options) {
  if (options.tick_s && !(*options.tick_s > 0)) {
    throw study::BadInput("--tick: expected a time > 0");
  }
  if (name == "fifo") return std::make_unique<Fifo>();
  if (name == "srtf") return std::make_unique<Srtf>();
  if (name == "tiresias") {
    const auto& t = options.tiresias_thresholds_gpu_s;
    if (!std::is_sorted(t.begin(), t.end()) ||
        std::any_of(t.begin(), t.end(), [](double v) { return !(v > 0); })) {
      throw study::BadInput("tiresias thresholds: expected ascending GPU-seconds > 0");
    }
    return std::make_unique<Tiresias>(options);
  }
  if (name == "pollux") {
    if (!std::isfinite(options.pollux_p)) throw study::BadInput("--pollux-p: expected a number");
    return make_pollux(options);
  }
  if (name == "ones") {
    if (options.ones_population < 2 || options.ones_generations < 0 ||
        !(options.ones_min_resize_interval_s >= 0)) {
      throw study::BadInput(
          "--ones-population, --ones-generations, --ones-resize-interval: expected a population "
          ">= 2, generations >= 0 and an interval >= 0");
    }
    return make_ones(options);
  }
  throw study::BadInput("--scheduler: expected fifo, srtf, tiresias, pollux or ones, got \"" +
                        name + "\"");
}

}  // namespace stratasim::cluster
