#include "cluster/ones.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "cluster/elastic.hpp"
#include "cluster/random.hpp"

namespace stratasim::cluster {

namespace {

using Genes = std::vector<int>;  // per job: -1 queued, else a rung of its ladder

struct Individual {
  Genes genes;
  double fitness = 0;
  std::uint64_t age = 0;  // creation order: ties go to the older
};

class Ones : public Scheduler {
 public:
  explicit Ones(const SchedulerOptions& options)
      : rng_(options.seed),
        population_size_(std::max(2, options.ones_population)),
        generations_(std::max(0, options.ones_generations)),
        interval_s_(options.ones_min_resize_interval_s),
        tick_(options.tick_s.value_or(60.0)) {}
  std::string name() const override { return "ones"; }
  std::optional<double> tick_s() const override { return tick_; }

  std::vector<Allocation> decide(const SchedulerInput& input) override;

 private:
  const Config& rung(std::size_t k, int r) const {
    return (*ladders_[k])[static_cast<std::size_t>(r)];
  }
  int rungs(std::size_t k) const { return static_cast<int>(ladders_[k]->size()); }

  /// The rung a running job holds (the nearest in GPUs when its configuration is not a rung).
  int current_rung(std::size_t k, const JobView& j) const;

  void prepare(const SchedulerInput& input);

  /// 1 / T_j: the job's predicted completions per second at rung r (0 when queued).
  double contribution(std::size_t k, int r) const;

  double fitness(const Genes& genes) const {
    double f = 0;
    for (std::size_t k = 0; k < genes.size(); ++k) f += contribution(k, genes[k]);
    return f;
  }

  int used_gpus(const Genes& genes) const;

  /// Jobs with `pick` true, by contribution at `rung_of(k)`, the largest first when `descending`
  /// (ties: the earlier job).
  template <typename Pick, typename RungOf>
  std::vector<std::size_t> by_contribution(std::size_t n, Pick pick, RungOf rung_of,
                                           bool descending) const {
    std::vector<std::pair<double, std::size_t>> keyed;
    for (std::size_t k = 0; k < n; ++k) {
      if (pick(k)) keyed.push_back({contribution(k, rung_of(k)), k});
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      return descending ? a.first > b.first : a.first < b.first;
    });
    std::vector<std::size_t> out;
    for (const auto& [value, k] : keyed) out.push_back(k);
    return out;
  }

  /// Frozen genes kept; the cluster's GPUs respected; queued jobs started while they fit.
  void repair(Genes& genes) const;

  Individual make(Genes genes);

  /// The previous population carried to today's jobs, the current schedule, the greedy one, and
  /// random individuals up to the population size.
  void seed_population(const SchedulerInput& input);

  Genes random_genes(std::size_t n);

  /// Fitter first; ties: the older individual. Keeps the population size.
  void truncate();

  const Individual& tournament() {
    const auto size = static_cast<std::uint64_t>(population_.size());
    const std::size_t a = rng_.below_by_scaling(size), b = rng_.below_by_scaling(size);
    return population_[std::min(a, b)];  // sorted: the smaller index is the fitter
  }

  void mutate_gene(std::size_t k, int& gene);

  Genes offspring();

  void evolve();

  void remember(const SchedulerInput& input) {
    previous_.clear();
    for (const JobView& j : input.jobs) previous_.push_back({j.job, j.job->id});
  }

  Xoshiro256 rng_;
  int population_size_;
  int generations_;
  double interval_s_;
  double tick_;
  GoodputCache cache_;
  // This decision's jobs.
  int total_ = 0;
  double restart_s_ = 0;
  std::vector<const std::vector<Config>*> ladders_;
  Genes current_;
  std::vector<bool> frozen_;
  std::vector<double> remaining_;
  // Carried between decisions.
  std::vector<Individual> population_;
  std::vector<std::pair<const Job*, std::string>> previous_;
  std::uint64_t age_ = 0;
};

std::vector<Allocation> Ones::decide(const SchedulerInput& input) {
  prepare(input);
  seed_population(input);
  for (int g = 0; g < generations_; ++g) evolve();
  remember(input);
  std::vector<Allocation> out(input.jobs.size());
  const Genes& best = population_.front().genes;
  for (std::size_t k = 0; k < best.size(); ++k) {
    if (best[k] >= 0) out[k] = {rung(k, best[k]).gpus, rung(k, best[k]).batch};
  }
  return out;
}

int Ones::current_rung(std::size_t k, const JobView& j) const {
  if (j.gpus == 0) return -1;
  int nearest = 0;
  for (int r = 0; r < rungs(k); ++r) {
    const Config& c = rung(k, r);
    if (c.gpus == j.gpus && c.batch == j.batch) return r;
    if (std::abs(c.gpus - j.gpus) < std::abs(rung(k, nearest).gpus - j.gpus)) nearest = r;
  }
  return nearest;
}

void Ones::prepare(const SchedulerInput& input) {
  const std::size_t n = input.jobs.size();
  total_ = input.total_gpus;
  restart_s_ = input.restart_cost_s;
  ladders_.assign(n, nullptr);
  current_.assign(n, -1);
  frozen_.assign(n, false);
  remaining_.assign(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    const JobView& j = input.jobs[k];
    ladders_[k] = &cache_.ladder(*j.job, *input.speeds);
    current_[k] = current_rung(k, j);
    remaining_[k] = j.remaining_samples;
    const double since = j.last_change_s >= 0 ? input.now_s - j.last_change_s : j.attained_s;
    frozen_[k] = j.gpus > 0 && since < interval_s_;
  }
}

double Ones::contribution(std::size_t k, int r) const {
  if (r < 0) return 0;
  double t = remaining_[k] / rung(k, r).goodput;
  if (current_[k] >= 0 && r != current_[k]) t += restart_s_;
  return 1.0 / std::max(t, 1e-9);
}

int Ones::used_gpus(const Genes& genes) const {
  int used = 0;
  for (std::size_t k = 0; k < genes.size(); ++k) {
    if (genes[k] >= 0) used += rung(k, genes[k]).gpus;
  }
  return used;
}

void Ones::repair(Genes& genes) const {
  const std::size_t n = genes.size();
  for (std::size_t k = 0; k < n; ++k) {
    if (frozen_[k]) genes[k] = current_[k];
  }
  int used = used_gpus(genes);
  if (used > total_) {
    const auto order = by_contribution(
        n, [&](std::size_t k) { return !frozen_[k] && genes[k] >= 0; },
        [&](std::size_t k) { return genes[k]; }, false);
    for (std::size_t k : order) {
      while (used > total_ && genes[k] >= 0) {
        used -= rung(k, genes[k]).gpus;
        if (--genes[k] >= 0) used += rung(k, genes[k]).gpus;
      }
      if (used <= total_) break;
    }
  }
  const auto queued = by_contribution(
      n, [&](std::size_t k) { return genes[k] < 0; }, [](std::size_t) { return 0; }, true);
  for (std::size_t k : queued) {
    if (rung(k, 0).gpus <= total_ - used) {
      genes[k] = 0;
      used += rung(k, 0).gpus;
    }
  }
}

Individual Ones::make(Genes genes) {
  repair(genes);
  Individual out{std::move(genes), 0, age_++};
  out.fitness = fitness(out.genes);
  return out;
}

void Ones::seed_population(const SchedulerInput& input) {
  const std::size_t n = input.jobs.size();
  std::unordered_map<const Job*, std::size_t> index;
  for (std::size_t k = 0; k < n; ++k) index[input.jobs[k].job] = k;
  std::vector<Individual> next;
  for (const Individual& old : population_) {
    Genes genes(n, -1);
    for (std::size_t p = 0; p < previous_.size(); ++p) {
      const auto it = index.find(previous_[p].first);
      if (it != index.end() && input.jobs[it->second].job->id == previous_[p].second) {
        genes[it->second] = std::min(old.genes[p], rungs(it->second) - 1);
      }
    }
    next.push_back(make(std::move(genes)));
  }
  next.push_back(make(current_));
  next.push_back(make(Genes(n, -1)));
  while (static_cast<int>(next.size()) < population_size_) next.push_back(make(random_genes(n)));
  population_ = std::move(next);
  truncate();
}

Genes Ones::random_genes(std::size_t n) {
  Genes genes(n, -1);
  for (std::size_t k = 0; k < n; ++k) {
    if (rng_.below_by_scaling(2) == 1)
      genes[k] = static_cast<int>(rng_.below_by_scaling(static_cast<std::uint64_t>(rungs(k))));
  }
  return genes;
}

void Ones::truncate() {
  std::sort(population_.begin(), population_.end(), [](const Individual& a, const Individual& b) {
    return a.fitness != b.fitness ? a.fitness > b.fitness : a.age < b.age;
  });
  if (static_cast<int>(population_.size()) > population_size_) {
    population_.resize(static_cast<std::size_t>(population_size_));
  }
}

void Ones::mutate_gene(std::size_t k, int& gene) {
  if (gene < 0) {
    gene = static_cast<int>(rng_.below_by_scaling(static_cast<std::uint64_t>(rungs(k))));
  } else if (rng_.below_by_scaling(2) == 0) {
    gene = std::min(gene + 1, rungs(k) - 1);  // scale the batch up
  } else {
    --gene;  // scale it down (below the lowest rung: queued)
  }
}

Genes Ones::offspring() {
  const Genes& a = tournament().genes;
  const Genes& b = tournament().genes;
  Genes child(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) child[k] = rng_.below_by_scaling(2) == 0 ? a[k] : b[k];
  if (child.empty()) return child;
  const double rate = 1.0 / static_cast<double>(child.size());
  const std::size_t forced = rng_.below_by_scaling(child.size());
  for (std::size_t k = 0; k < child.size(); ++k) {
    if (!frozen_[k] && (k == forced || rng_.unit() < rate)) mutate_gene(k, child[k]);
  }
  return child;
}

void Ones::evolve() {
  std::vector<Individual> children;
  for (int c = 0; c < population_size_; ++c) children.push_back(make(offspring()));
  for (Individual& child : children) population_.push_back(std::move(child));
  truncate();
}

}  // namespace

std::unique_ptr<Scheduler> make_ones(const SchedulerOptions& options) {
  return std::make_unique<Ones>(options);
}

}  // namespace stratasim::cluster
