// Several training iterations back to back (`stratasim simulate --iterations N`): a pass over a
// lowering's one-iteration Program that repeats it N times, so that the next iteration's work
// starts where the model's parameters allow it instead of after a barrier.
//
// Contract (repeat_iterations):
// - every rank's ops are the one-iteration Program's ops N times over, in the same order, with
//   the same kernels, labels, groups, memory effects, initial memory and mirroring: iteration
//   i + 1's ops on a (rank, stream) follow iteration i's on it (the stream runs in issue order),
//   and the k-th collective and Send/Recv pairings carry over unchanged (strategies/matching.hpp);
// - dependencies inside an iteration are kept (moved to that iteration's copies);
// - the per-layer parameter dependency: an op of phase forward in iteration i + 1 that covers
//   layers [a, b) (Op::layer_begin / layer_end) also waits, on each stream, for the last op of
//   iteration i on that rank and stream that updates any of those layers. The updates are the
//   ops of Phase::optimizer: the optimizer step, the checks before it (loss scale, clipping),
//   the parameter gathers after it, and with a parameter server the pull of the layer
//   (strategies/lowering/techniques.hpp ParameterServerWorker). An update without a layer range
//   (-1: the one optimizer step of a chunk, which updates all of its layers at once) covers every
//   layer; a forward op without a layer range waits for the last update of any layer on each
//   stream. Nothing else of iteration i is waited for: the next forward of layer 0 may start
//   before the last layer's update ends when the streams allow it (updates on another stream
//   than the forward, as a parameter server's pulls);
// - Program::iterations() is N, so a back end or report can tell the iterations apart
//   (Program::iteration_of);
// - N = 1 returns the Program unchanged (a copy).
//
// What the lowering emits decides how much overlap is possible: the all-reduce strategy's
// optimizer step is one op per chunk on the compute stream, so there the next forward follows
// the whole step (stream order and the dependency agree); with a parameter server the pulls run
// on their own stream and each forward waits for its layer's pull only.
#pragma once

#include "strategies/program.hpp"

namespace stratasim::strategies {

/// The most iterations one run may hold (its ops are N times the iteration's).
inline constexpr int kMaxIterations = 1000;

/// `one` repeated `n` times as the contract above says. Throws std::invalid_argument when n is
/// not in [1, kMaxIterations], when `one` already holds several iterations, or when its schedule
/// overlaps iterations by itself (Program::overlapping_iterations: PipeDream-2BW, ZB-H2 are
/// reported as a steady state of one iteration).
Program repeat_iterations(const Program& one, int n);

}  // namespace stratasim::strategies
