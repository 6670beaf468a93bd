// Strategy search: the best feasible parallel strategies for a GPU budget. The space is
// tensor x pipeline x data parallelism over at most N GPUs, ZeRO stages, recomputation and
// micro-batch sizes; combinations whose memory cannot fit are pruned with cheap checks
// (Evaluator with EvalOptions::prune) before any full simulation, the rest are simulated, and
// the feasible ones are ranked by an objective, with the Pareto frontier of iteration time
// against peak memory (TensorOpt's multi-objective view).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "search/sweep.hpp"
#include "strategies/experiment.hpp"

namespace stratasim::search {

enum class Objective {
  throughput,  // most tokens per second
  memory,      // lowest peak device memory (then most tokens per second)
  cost,        // fewest GPU-seconds per token: gpus / tokens_per_s (fewer GPUs may win)
};
std::string_view name_of(Objective o);
std::optional<Objective> objective_from_name(std::string_view name);

struct SearchSpace {
  int gpus = 0;  // the budget N
  std::vector<int> zero = {0, 1, 2, 3};
  std::vector<std::string> recompute = {"none", "selective", "full"};
  std::vector<int> micro_batch = {1, 2, 4};
  /// Also try N/2, N/4, ... GPUs (as long as the cluster can be resized to them): what the
  /// cost objective needs; throughput and memory use all N.
  bool fewer_gpus = false;
  /// The fewest GPUs tried with fewer_gpus (0: gpus / 4). Fewer GPUs mean more microbatches
  /// per pipeline for the same global batch, so their simulations are the longest.
  int min_gpus = 0;
  /// Pipeline schedules tried (names of strategies::kAllSchedules); empty: the experiment's.
  std::vector<std::string> schedules;
  /// Virtual stages (model chunks per device) tried with the interleaved schedule (each >= 2).
  std::vector<int> virtual_stages = {2};
  /// Sequence parallelism tried (0 off, 1 on); empty: the experiment's.
  std::vector<int> sequence_parallel;
  /// Also try PyTorch FSDP (training.framework "fsdp", FULL_SHARD as ZeRO-3) where it applies.
  bool fsdp = false;
  /// Context-parallel degrees tried (parallelism.cp, opt in); empty: the experiment's. cp ranks
  /// come out of the data-parallel ones: dp = GPUs / (tp x cp x pp).
  std::vector<int> cp;
};

/// Why a point of the space is left out of the search before any evaluation, or nullopt when
/// it is searched: sequence parallelism needs tp > 1 (with tp 1 it is the same strategy);
/// interleaved needs pp > 1 and layers divisible by pp x virtual stages (whole layers per
/// model chunk, as Megatron-LM requires); PyTorch FSDP needs pp 1 (its runtime is modelled
/// without pipeline parallelism) and dp > 1 (nothing to shard otherwise); with dp 1 only the
/// first ZeRO stage listed (ZeRO shards over data parallelism, so the stages coincide).
/// `c` carries tp, pp, dp, zero, schedule ("" the experiment's), virtual_stages,
/// sequence_parallel and framework as search_space sets them.
std::optional<std::string> excluded_because(const strategies::Experiment& base,
                                            const SearchSpace& s, const Combination& c);

/// The combinations of the search, in a fixed order (GPU count from N down, then tp, pp,
/// sharding (ZeRO stages, then FSDP), schedule (interleaved once per virtual-stage count),
/// sequence parallelism, recompute, micro batch), those excluded_because() leaves out omitted: tp
/// in powers of two up to a node's devices (tensor parallelism stays inside a node, as Megatron-LM
/// places it), pp in powers of two that divide the layers (whole layers per stage, as Megatron-LM
/// requires), dp the GPUs left, so tp * pp * dp = the GPU count; with dp 1 only the first ZeRO
/// stage listed (ZeRO shards over data parallelism, so the stages coincide); with SearchSpace::cp,
/// each listed cp (slowest after pp) and dp = GPUs / (tp x cp x pp). Each sets `gpus`, so
/// the cluster is resized to it (resize_overrides). A cluster with an explicit topology or
/// per-device overrides is not resized: std::invalid_argument unless gpus is its size.
std::vector<Combination> search_space(const strategies::Experiment& base, const SearchSpace& s);

/// `c` under schedule `kind` with its own knobs: interleaved `virtual_stages` model chunks per
/// device, TeraPipe 4 sequence slices, every other schedule 1 virtual stage and 1 slice.
Combination with_schedule(Combination c, strategies::ScheduleKind kind, int virtual_stages);

/// The value `objective` ranks by (lower is better) for a feasible result.
double objective_value(Objective objective, const Result& r);

/// Indices of the feasible results (status ok), best first by `objective`; ties go to less
/// memory (throughput, cost) or more tokens/s (memory), then keep the enumeration order.
std::vector<std::size_t> rank_by(Objective objective, const std::vector<Result>& results);

/// A point (iteration time, peak memory); `use` false leaves it out.
struct Point {
  double time = 0;
  double memory = 0;
  bool use = true;
};
/// Marks the Pareto-optimal points among those in use: no other point in use is at least as
/// good in both time and memory and better in one. Equal points are all on the frontier.
std::vector<bool> pareto_frontier(const std::vector<Point>& points);

/// The search's verdict on its results.
struct Ranking {
  std::vector<std::size_t> order;    // rank_by(objective, results): the feasible, best first
  std::vector<bool> frontier;        // pareto_frontier of (iteration time, peak memory), fits only
  std::vector<std::size_t> rank_of;  // per result: its 1-based place in `order`, 0 if unranked
  std::vector<std::size_t> pareto;   // the frontier's results, fastest first (ties: index order)
};
Ranking rank_results(Objective objective, const std::vector<Result>& results);

/// The search's CSV: csv_header() with the columns gpus, rank (empty when unranked), pareto,
/// virtual_stages and framework (empty: the experiment's), one row per combination in
/// enumeration order.
std::string search_csv(const std::vector<Combination>& combos, const std::vector<Result>& results,
                       const Ranking& ranking);

/// The schedules study (`stratasim schedules`): the base experiment's strategy under every
/// pipeline schedule (strategies::kAllSchedules) at every micro-batch size of `micro_batches`
/// that divides the global batch per data-parallel replica (the empty list: 1, 2, 4, ..., 64).
/// Order: schedule, then micro batch. Each schedule gets its own knobs: interleaved the base's
/// virtual stages, or 2 when the base has 1; TeraPipe 4 sequence slices; every other schedule 1
/// virtual stage and 1 slice.
std::vector<Combination> schedule_combinations(const strategies::Experiment& base,
                                               std::vector<int> micro_batches);

/// Indices of the simulated results (status ok or oom after a simulation), those that fit
/// first, then by iteration time; ties keep the enumeration order.
std::vector<std::size_t> fastest_first(const std::vector<Result>& results);

}  // namespace stratasim::search
