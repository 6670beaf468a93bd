// pollux: a goodput-optimising elastic policy after Pollux (Qiao et al., "Pollux: Co-adaptive
// Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI 2021, sections 3-4).
//
// Per job: goodput(g, M) = speed(g, M) x E(M) (cluster/efficiency.hpp); at each GPU count g the
// job takes the batch M maximising it (cluster/elastic.hpp's candidates). Across jobs, Pollux
// maximises the generalised (power) mean of speedups,
//     FITNESS_p(A) = ( (1/J) sum_j SPEEDUP_j(A_j)^p )^(1/p),  SPEEDUP_j(A_j) = goodput_j(A_j) /
//     goodput_j(fair share),
// with p = -1 by default (SchedulerOptions::pollux_p; Pollux's default favours fairness: one job
// at a low speedup pulls the mean down); the fair share is the largest candidate count <= the
// cluster's GPUs / the active jobs (at least the job's smallest candidate).
//
// Search (not Pollux's): Pollux searches allocations with a genetic algorithm; this policy uses a
// deterministic greedy with the same objective, because for p < 0 any job left at speedup 0 makes
// the fitness 0, so admission comes first, and because the power mean is a monotone function of
// the sum of u(s) = s^p / p (log s for p = 0), a separable objective that a marginal-gain greedy
// climbs well when speedups are concave in GPUs:
//   1. admission: jobs that hold GPUs first, then queued ones, each in (arrival, id) order, each
//      at its smallest candidate count while it fits (a job that does not fit is skipped, not
//      blocking);
//   2. growth: repeatedly the admitted job whose next candidate count adds the most u per added
//      GPU takes it, while it fits and adds something (a max-heap; ties: the earlier job).
// Every step is deterministic. Decisions on arrivals, completions and every 60 s (Pollux's
// scheduling interval; --tick). Restart costs are not in the objective (Pollux discounts them);
// the simulator charges them on every change.
#pragma once

#include <memory>

#include "cluster/scheduler.hpp"

namespace stratasim::cluster {

std::unique_ptr<Scheduler> make_pollux(const SchedulerOptions& options);

}  // namespace stratasim::cluster
