#include "cluster/pollux.hpp"

#include <algorithm>
#include <cmath>
#include <queue>
#include <tuple>

#include "cluster/elastic.hpp"

namespace stratasim::cluster {

namespace {

class Pollux : public Scheduler {
 public:
  explicit Pollux(const SchedulerOptions& options)
      : p_(options.pollux_p), tick_(options.tick_s.value_or(60.0)) {}
  std::string name() const override { return "pollux"; }
  std::optional<double> tick_s() const override { return tick_; }

  std::vector<Allocation> decide(const SchedulerInput& input) override {
    const std::size_t n = input.jobs.size();
    ladders_.assign(n, nullptr);
    fair_.assign(n, 0.0);
    for (std::size_t k = 0; k < n; ++k) {
      ladders_[k] = &cache_.best_by_gpus(*input.jobs[k].job, *input.speeds);
      fair_[k] = fair_goodput(*ladders_[k], input.total_gpus, n);
    }
    std::vector<int> step(n, -1);  // index into the job's ladder; -1: queued
    int free = admit(input, step);
    grow(step, free);
    std::vector<Allocation> out(n);
    for (std::size_t k = 0; k < n; ++k) {
      if (step[k] >= 0) {
        const Config& c = (*ladders_[k])[static_cast<std::size_t>(step[k])];
        out[k] = {c.gpus, c.batch};
      }
    }
    return out;
  }

 private:
  static double fair_goodput(const std::vector<Config>& ladder, int total, std::size_t jobs) {
    const double share =
        static_cast<double>(total) / static_cast<double>(std::max<std::size_t>(1, jobs));
    double v = ladder.front().goodput;
    for (const Config& c : ladder) {
      if (c.gpus <= share) v = c.goodput;
    }
    return v;
  }

  double utility(std::size_t k, int step) const {
    const double s = (*ladders_[k])[static_cast<std::size_t>(step)].goodput / fair_[k];
    return p_ == 0 ? std::log(s) : std::pow(s, p_) / p_;
  }

  /// Running jobs first, then queued ones, each in (arrival, id) order, at their smallest count.
  int admit(const SchedulerInput& input, std::vector<int>& step) const {
    int free = input.total_gpus;
    for (const bool running : {true, false}) {
      for (std::size_t k = 0; k < input.jobs.size(); ++k) {
        if ((input.jobs[k].gpus > 0) != running) continue;
        const int need = ladders_[k]->front().gpus;
        if (need <= free) {
          step[k] = 0;
          free -= need;
        }
      }
    }
    return free;
  }

  /// Marginal utility per GPU of job k's next step; negative when it has none.
  std::tuple<double, int> next_gain(std::size_t k, int at) const {
    const auto& ladder = *ladders_[k];
    if (static_cast<std::size_t>(at + 1) >= ladder.size()) return {-1, 0};
    const int extra =
        ladder[static_cast<std::size_t>(at + 1)].gpus - ladder[static_cast<std::size_t>(at)].gpus;
    return {(utility(k, at + 1) - utility(k, at)) / extra, extra};
  }

  void grow(std::vector<int>& step, int free) const {
    // (gain per GPU, -job index, extra GPUs): the largest gain first, ties the earlier job.
    std::priority_queue<std::tuple<double, long, int>> heap;
    const auto offer = [&](std::size_t k) {
      const auto [gain, extra] = next_gain(k, step[k]);
      if (gain > 0) heap.push({gain, -static_cast<long>(k), extra});
    };
    for (std::size_t k = 0; k < step.size(); ++k) {
      if (step[k] >= 0) offer(k);
    }
    while (!heap.empty()) {
      const auto [gain, minus_k, extra] = heap.top();
      heap.pop();
      const auto k = static_cast<std::size_t>(-minus_k);
      if (extra > free) continue;  // this job cannot grow further: its next step is too large
      free -= extra;
      ++step[k];
      offer(k);
    }
  }

  double p_;
  double tick_;
  GoodputCache cache_;
  std::vector<const std::vector<Config>*> ladders_;
  std::vector<double> fair_;
};

}  // namespace

std::unique_ptr<Scheduler> make_pollux(const SchedulerOptions& options) {
  return std::make_unique<Pollux>(options);
}

}  // namespace stratasim::cluster
