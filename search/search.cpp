// The strategy search's space, objectives and Pareto frontier.
#include "search/search.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "strategies/schedule.hpp"

namespace stratasim::search {

std::string_view name_of(Objective o) {
  switch (o) {
    case Objective::throughput:
      return "throughput";
    case Objective::memory:
      return "memory";
    case Objective::cost:
      return "cost";
  }
  return "?";
}

std::optional<Objective> objective_from_name(std::string_view name) {
  for (Objective o : {Objective::throughput, Objective::memory, Objective::cost}) {
    if (name_of(o) == name) return o;
  }
  return std::nullopt;
}

Combination with_schedule(Combination c, strategies::ScheduleKind kind, int virtual_stages) {
  c.schedule = std::string(strategies::name_of(kind));
  c.virtual_stages = kind == strategies::ScheduleKind::interleaved ? virtual_stages : 1;
  c.sequence_slices = kind == strategies::ScheduleKind::terapipe ? 4 : 1;
  return c;
}

std::optional<std::string> excluded_because(const strategies::Experiment& base,
                                            const SearchSpace& s, const Combination& c) {
  const auto& p = base.parallelism;
  const strategies::ScheduleKind kind =
      c.schedule.empty() ? p.schedule
                         : strategies::schedule_from_name(c.schedule).value_or(p.schedule);
  const int virtual_stages = c.virtual_stages > 0 ? c.virtual_stages : p.virtual_stages;
  const int slices = c.sequence_slices > 0 ? c.sequence_slices : p.sequence_slices;
  const bool sp = c.sequence_parallel >= 0 ? c.sequence_parallel == 1 : p.sequence_parallel;
  const bool fsdp = c.framework == "fsdp";
  const int parts = strategies::schedule_parts(kind, c.pp, {virtual_stages, slices});
  if (kind == strategies::ScheduleKind::interleaved && c.pp == 1) {
    return "the interleaved schedule needs pp > 1";
  }
  // Whole layers per stage (per model chunk with interleaving), as Megatron-LM requires of its
  // pipeline (uneven splits are valid experiments, but slower than a neighbouring even one and
  // costly to simulate).
  if (parts > 0 && base.model.layers % parts != 0) {
    const std::string layers = "layers (" + std::to_string(base.model.layers) + ")";
    if (kind == strategies::ScheduleKind::interleaved) {
      return layers + " not divisible by pp x virtual stages (" + std::to_string(c.pp) + " x " +
             std::to_string(virtual_stages) + ")";
    }
    if (parts == c.pp) return layers + " not divisible by pp (" + std::to_string(c.pp) + ")";
    return layers + " not divisible by the " + std::to_string(parts) + " model chunks of " +
           std::string(strategies::name_of(kind)) + " at pp " + std::to_string(c.pp);
  }
  if (c.pp == 1 && !c.schedule.empty()) {
    // Without a pipeline the schedules coincide: only the first one listed that applies.
    for (const auto& name : s.schedules) {
      if (name == "interleaved") continue;
      if (name != c.schedule) return "pp 1: the schedules coincide (" + name + " is tried)";
      break;
    }
  }
  if (sp && c.tp == 1) return "sequence parallelism needs tp > 1";
  if (fsdp && c.pp > 1) return "FSDP needs pp 1 (its runtime is modelled without a pipeline)";
  if (fsdp && c.dp == 1) return "FSDP needs dp > 1 (nothing to shard)";
  // ZeRO shards over the data-parallel group: with dp 1 every stage is the same strategy, so
  // only the first stage listed is tried.
  if (!fsdp && c.dp * std::max(1, c.cp) == 1 && !s.zero.empty() && c.zero != s.zero.front()) {
    return "dp 1: the ZeRO stages coincide (" + std::to_string(s.zero.front()) + " is tried)";
  }
  return std::nullopt;
}

std::vector<Combination> search_space(const strategies::Experiment& base, const SearchSpace& s) {
  // A cluster with its own topology or per-device overrides describes exactly its devices:
  // only its own size is searched.
  const bool resizable = !base.cluster.topology && base.cluster.overrides.empty();
  if (!resizable && s.gpus != base.cluster.world_size()) {
    throw std::invalid_argument(
        "cluster " + base.cluster.name + " describes its topology or individual devices for " +
        std::to_string(base.cluster.world_size()) + " devices and cannot be resized; use --gpus " +
        std::to_string(base.cluster.world_size()));
  }
  std::vector<int> budgets;
  const int fewest = s.min_gpus > 0 ? s.min_gpus : std::max(1, s.gpus / 4);
  for (int g = s.gpus; g >= fewest; g /= 2) {
    try {
      resize_overrides(base.cluster, g);
    } catch (const std::invalid_argument&) {
      if (g == s.gpus) throw;  // the budget itself must be a cluster
      break;
    }
    budgets.push_back(g);
    if (!s.fewer_gpus || !resizable || g % 2 != 0) break;
  }
  const int per_node = std::max(1, base.cluster.devices_per_node);
  // The sharding axis: the ZeRO stages, then PyTorch FSDP (FULL_SHARD, ZeRO-3's states).
  std::vector<std::pair<int, std::string>> sharding;
  for (int zero : s.zero) sharding.emplace_back(zero, "");
  if (s.fsdp) sharding.emplace_back(3, "fsdp");
  // The schedule axis: the experiment's, or each listed (interleaved once per virtual-stage
  // count).
  std::vector<Combination> schedules;
  if (s.schedules.empty()) schedules.push_back({});
  for (const auto& name : s.schedules) {
    const auto kind = strategies::schedule_from_name(name);
    if (!kind) throw std::invalid_argument("unknown pipeline schedule \"" + name + "\"");
    if (*kind != strategies::ScheduleKind::interleaved) {
      schedules.push_back(with_schedule({}, *kind, 1));
      continue;
    }
    for (int v : s.virtual_stages) schedules.push_back(with_schedule({}, *kind, v));
  }
  const std::vector<int> sps =
      s.sequence_parallel.empty() ? std::vector<int>{-1} : s.sequence_parallel;
  // The cp axis (opt in): the listed degrees, else the experiment's (left as it is: 0).
  const std::vector<int> cps =
      s.cp.empty() ? std::vector<int>{std::max(1, base.parallelism.cp)} : s.cp;
  std::vector<Combination> out;
  for (int gpus : budgets) {
    for (int tp = 1; tp <= std::min(per_node, gpus); tp *= 2) {
      for (int pp = 1; pp <= std::max(1, base.model.layers) && tp * pp <= gpus; pp *= 2) {
        for (int cp : cps) {
          if (gpus % (tp * cp * pp) != 0) continue;
          const int dp = gpus / (tp * cp * pp);
          for (const auto& [zero, framework] : sharding) {
            for (const auto& schedule : schedules) {
              for (int sp : sps) {
                Combination c = schedule;
                c.tp = tp;
                c.pp = pp;
                c.dp = dp;
                c.zero = zero;
                c.framework = framework;
                c.sequence_parallel = sp;
                c.gpus = gpus;
                c.cp = s.cp.empty() ? 0 : cp;
                if (excluded_because(base, s, c)) continue;
                for (const auto& recompute : s.recompute) {
                  for (int mb : s.micro_batch) {
                    c.recompute = recompute;
                    c.micro_batch = mb;
                    out.push_back(c);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

double objective_value(Objective objective, const Result& r) {
  switch (objective) {
    case Objective::throughput:
      return -r.tokens_per_s;
    case Objective::memory:
      return static_cast<double>(r.peak_memory_bytes);
    case Objective::cost:
      return r.tokens_per_s > 0 ? static_cast<double>(r.gpus) / r.tokens_per_s : 0;
  }
  return 0;
}

std::vector<std::size_t> rank_by(Objective objective, const std::vector<Result>& results) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].status == Status::ok) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double va = objective_value(objective, results[a]);
    const double vb = objective_value(objective, results[b]);
    if (va != vb) return va < vb;
    // Ties (ZeRO stages that cost no time, say) go to the one that also wins on the other
    // axis: less memory for equal speed, more speed for equal memory.
    if (objective == Objective::memory) return results[a].tokens_per_s > results[b].tokens_per_s;
    return results[a].peak_memory_bytes < results[b].peak_memory_bytes;
  });
  return order;
}

std::vector<bool> pareto_frontier(const std::vector<Point>& points) {
  // Sorted by time then memory, a point is on the frontier when its memory is below that of
  // every point before it (equal points: the same as the best so far).
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (points[i].use) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (points[a].time != points[b].time) return points[a].time < points[b].time;
    return points[a].memory < points[b].memory;
  });
  std::vector<bool> on(points.size(), false);
  bool any = false;
  double best_memory = 0, best_time = 0;
  for (std::size_t i : order) {
    const Point& p = points[i];
    if (!any || p.memory < best_memory) {
      on[i] = true;
      any = true;
      best_memory = p.memory;
      best_time = p.time;
    } else if (p.memory == best_memory && p.time == best_time) {
      on[i] = true;  // the same point twice: neither dominates the other
    }
  }
  return on;
}

std::vector<Combination> schedule_combinations(const strategies::Experiment& base,
                                               std::vector<int> micro_batches) {
  if (micro_batches.empty()) {
    for (int mb = 1; mb <= 64; mb *= 2) micro_batches.push_back(mb);
  }
  const auto& p = base.parallelism;
  std::vector<Combination> out;
  for (strategies::ScheduleKind kind : strategies::kAllSchedules) {
    for (int mb : micro_batches) {
      if (mb < 1 || base.training.global_batch % (std::int64_t{p.dp} * mb) != 0) continue;
      Combination c;
      c.tp = p.tp;
      c.pp = p.pp;
      c.dp = p.dp;
      c.zero = p.zero;
      c.recompute = std::string(strategies::name_of(p.recompute));
      c.micro_batch = mb;
      out.push_back(with_schedule(std::move(c), kind, p.virtual_stages > 1 ? p.virtual_stages : 2));
    }
  }
  return out;
}

std::vector<std::size_t> fastest_first(const std::vector<Result>& results) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].simulated) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (results[a].fits != results[b].fits) return results[a].fits;
    return results[a].iteration_time_s < results[b].iteration_time_s;
  });
  return order;
}

Ranking rank_results(Objective objective, const std::vector<Result>& results) {
  Ranking r;
  r.order = rank_by(objective, results);
  std::vector<Point> points;
  for (const auto& result : results) {
    points.push_back({result.iteration_time_s, static_cast<double>(result.peak_memory_bytes),
                      result.status == Status::ok});
  }
  r.frontier = pareto_frontier(points);
  r.rank_of.assign(results.size(), 0);
  for (std::size_t k = 0; k < r.order.size(); ++k) r.rank_of[r.order[k]] = k + 1;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (r.frontier[i]) r.pareto.push_back(i);
  }
  std::sort(r.pareto.begin(), r.pareto.end(), [&](std::size_t a, std::size_t b) {
    if (results[a].iteration_time_s != results[b].iteration_time_s) {
      return results[a].iteration_time_s < results[b].iteration_time_s;
    }
    return a < b;
  });
  return r;
}

std::string search_csv(const std::vector<Combination>& combos, const std::vector<Result>& results,
                       const Ranking& ranking) {
  // The base experiment's figures (the same names on every row) come before the search's own.
  std::vector<std::string> columns;
  if (!results.empty()) {
    for (const auto& figure : results.front().figures) columns.push_back(figure.first);
  }
  for (const char* c : {"gpus", "rank", "pareto", "virtual_stages", "framework"}) {
    columns.emplace_back(c);
  }
  std::string text = csv_header(columns);
  for (std::size_t i = 0; i < combos.size(); ++i) {
    const auto& c = combos[i];
    text += csv_row(
        c, results[i],
        {std::to_string(c.gpus), ranking.rank_of[i] > 0 ? std::to_string(ranking.rank_of[i]) : "",
         ranking.frontier[i] ? "true" : "false",
         c.virtual_stages > 0 ? std::to_string(c.virtual_stages) : "", c.framework});
  }
  return text;
}

}  // namespace stratasim::search
