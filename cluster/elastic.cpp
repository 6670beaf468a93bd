#include "cluster/elastic.hpp"

#include <algorithm>

namespace stratasim::cluster {

namespace {

void sort_unique(std::vector<int>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

/// The largest candidate count <= want, at least the smallest candidate.
int floor_candidate(const std::vector<int>& counts, double want) {
  int out = counts.front();
  for (int g : counts) {
    if (g <= want + 1e-9) out = g;
  }
  return out;
}

}  // namespace

std::vector<int> candidate_gpus(const Job& job) {
  std::vector<int> out = {job.min_gpus, job.gpus, job.max_gpus};
  for (long g = 1; g <= job.max_gpus; g *= 2) {
    if (g >= job.min_gpus) out.push_back(static_cast<int>(g));
  }
  sort_unique(out);
  return out;
}

std::vector<int> candidate_batches(const Job& job) {
  if (!job.elastic_batch()) return {job.batch};
  std::vector<int> out = {job.min_batch, job.batch, job.max_batch};
  for (long m = job.batch; m <= job.max_batch; m *= 2) out.push_back(static_cast<int>(m));
  for (long m = job.batch; m >= job.min_batch && m >= 1; m /= 2) {
    out.push_back(static_cast<int>(m));
    if (m == 1) break;
  }
  sort_unique(out);
  return out;
}

double goodput(const Job& job, int gpus, int batch, const Throughput& speeds) {
  const Speed s = speeds.speed(job, gpus, batch);
  return s.runnable ? s.samples_per_s * job.efficiency(batch) : 0.0;
}

GoodputCache::Entry& GoodputCache::entry(const Job& job) {
  Entry& e = entries_[&job];
  const std::string key = job.id + '\n' + job.experiment;
  if (e.id != key) e = Entry{key, false, false, {}, {}};
  return e;
}

const std::vector<Config>& GoodputCache::best_by_gpus(const Job& job, const Throughput& speeds) {
  Entry& e = entry(job);
  if (e.has_best) return e.best;
  e.has_best = true;
  const std::vector<int> batches = candidate_batches(job);
  for (int g : candidate_gpus(job)) {
    Config best{g, 0, 0};
    for (int m : batches) {
      const double v = goodput(job, g, m, speeds);
      if (v > best.goodput) best = {g, m, v};
    }
    if (best.goodput > 0) e.best.push_back(best);
  }
  return e.best;
}

const std::vector<Config>& GoodputCache::ladder(const Job& job, const Throughput& speeds) {
  Entry& e = entry(job);
  if (e.has_ladder) return e.ladder;
  e.has_ladder = true;
  const std::vector<int> counts = candidate_gpus(job);
  if (!job.elastic_batch()) {  // GPUs elastic (or nothing): one rung per GPU count
    for (int g : counts) {
      const double v = goodput(job, g, job.batch, speeds);
      if (v > 0) e.ladder.push_back({g, job.batch, v});
    }
  } else {
    for (int m : candidate_batches(job)) {
      const double per_gpu = static_cast<double>(job.batch) / job.gpus;
      const int g = floor_candidate(counts, m / per_gpu);
      const double v = goodput(job, g, m, speeds);
      if (v > 0) e.ladder.push_back({g, m, v});
    }
  }
  if (e.ladder.empty()) {
    e.ladder.push_back({job.gpus, job.batch, goodput(job, job.gpus, job.batch, speeds)});
  }
  return e.ladder;
}

}  // namespace stratasim::cluster
