// ones: an online evolutionary search over batch sizes after ONES (Bian, Li, Wang and You,
// "Online Evolutionary Batch Size Orchestration for Scheduling Deep Learning Workloads in GPU
// Clusters", SC 2021, arXiv:2108.03645).
//
// What the paper gives (its abstract and overview, the parts this project could reach): each
// job's elasticity is managed through its training batch size, its GPUs following from the batch;
// a population of candidate schedules (a batch size per job) is evolved online, continuously, by
// crossover, mutation and selection, towards shorter average job completion time; evaluated on 64
// GPUs against earlier schedulers. The paper's exact operators' rates, population size,
// generations, fitness formula and resize limit were not reachable here: the choices below are
// this project's, named as such.
//
// Model:
// - An individual holds one gene per active job: -1 (queued) or a rung of the job's ladder
//   (cluster/elastic.hpp: one configuration per candidate batch, ascending, GPUs following from
//   the batch at the job's base per-GPU batch; a job with a fixed batch climbs its candidate GPU
//   counts instead; a rigid job has one rung).
// - Fitness (choice): the sum over scheduled jobs of 1 / T_j, T_j = remaining_j / goodput_j(rung)
//   (+ the restart cost when a running job's configuration changes): the predicted rate of job
//   completions, which favours jobs close to completion (SRTF's rule for mean JCT) and larger
//   goodput, with goodput = speed x E(M) (cluster/efficiency.hpp). Higher is better.
// - Repair (choice): genes of frozen jobs are forced to their running configuration; while the
//   GPUs exceed the cluster, scheduled jobs step down one rung (the lowest rung: queued) in order
//   of their contribution, the smallest first; then queued jobs start at their lowest rung, in
//   order of their contribution there, the largest first, while they fit (work-conserving).
// - Operators: uniform crossover of two parents (each gene from either, probability 1/2);
//   mutation of each gene with probability 1 / J (at least one gene): scale the batch up one rung,
//   down one rung (below the lowest: queued), or, for a queued job, start it at a random rung;
//   parents by binary tournament; survivors by (mu + lambda) truncation to the population size
//   (ties: the older individual).
// - Online: the population persists between decisions (genes carried to the same jobs; new jobs
//   queued), joined at each decision by the current schedule and the greedy one (every job
//   queued, then repaired), and by random individuals up to the size; SchedulerOptions::
//   ones_population (default 16) individuals, ones_generations (default 5) generations per
//   decision, decisions on arrivals, completions and every 60 s (--tick).
// - Resize limit (choice): a running job whose allocation changed less than
//   ones_min_resize_interval_s (default 300 s) ago, or that has run less than that since its
//   first start, keeps its configuration (a frozen gene).
// - Determinism: one xoshiro256** stream (cluster/random.hpp) seeded from SchedulerOptions::seed;
//   the same seed, trace and speeds give the same schedule.
#pragma once

#include <memory>

#include "cluster/scheduler.hpp"

namespace stratasim::cluster {

std::unique_ptr<Scheduler> make_ones(const SchedulerOptions& options);

}  // namespace stratasim::cluster
