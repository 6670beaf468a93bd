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
};

/// The combinations of the search, in a fixed order (GPU count from N down, then tp, pp, zero,
/// recompute, micro batch): tp in powers of two up to a node's devices (tensor parallelism
/// stays inside a node, as Megatron-LM places it), pp in powers of two that divide the layers
/// (whole layers per stage, as Megatron-LM requires), dp the
/// GPUs left, so tp * pp * dp = the GPU count; with dp 1 only the first ZeRO stage listed (ZeRO
/// shards over data parallelism, so the stages coincide). Each sets `gpus`, so the cluster is
/// resized to it (resize_overrides). A cluster with an explicit topology or per-device overrides is
/// not resized: std::invalid_argument unless gpus is its size.
std::vector<Combination> search_space(const strategies::Experiment& base, const SearchSpace& s);

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

}  // namespace stratasim::search
