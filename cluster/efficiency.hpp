// Statistical efficiency: how much training progress a sample processed at global batch M makes,
// relative to a sample processed at the job's base batch M0 (cluster/simulator.hpp counts a job's
// `samples` at M0).
//
// Model (Pollux: Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep
// Learning", OSDI 2021, section 3.1, "statistical efficiency"; the gradient noise scale is
// McCandlish et al., "An Empirical Model of Large-Batch Training", arXiv:1812.06162, 2018,
// B_noise):
//
//     E(M) = (phi + M0) / (phi + M)
//
// phi is the gradient noise scale in samples (the ratio of the per-sample gradient variance to the
// squared norm of the true gradient). E(M0) = 1; E falls towards M0 / M as M grows past phi (a
// larger batch then only repeats what a smaller one already estimates); with phi >> M, E ~ 1 (a
// larger batch is as good, sample for sample). AdaptDL, Pollux's open-source implementation,
// computes the same quantity as gain / scale with scale = M / M0 and gain = (var + sqr) /
// (var / scale + sqr) (var: the gradient variance at M0, sqr: the squared gradient norm; phi =
// var x M0 / sqr), so that E = (phi + M0) / (phi + M) (adaptdl/goodput.py).
//
// Goodput, Pollux's objective: goodput(g, M) = throughput(g, M) x E(M) — samples per second at
// (g GPUs, batch M) times the progress each makes, in base-batch samples per second: the rate at
// which a job's remaining `samples` fall.
//
// Assumption (stated, not Pollux's): phi is constant over a job's training. Pollux measures
// phi_t as training goes (it grows, so large batches pay off more later); the trace gives one phi
// per job (per model), so a job's E(M) never changes. Units: phi, M, M0 in samples (global batch:
// samples per optimiser step); E dimensionless, > 0.
#pragma once

namespace stratasim::cluster {

/// E(M) = (phi + M0) / (phi + M); phi >= 0, M0 > 0, M > 0 (see the top of this file).
inline double statistical_efficiency(double noise_scale, double base_batch, double batch) {
  return (noise_scale + base_batch) / (noise_scale + batch);
}

}  // namespace stratasim::cluster
