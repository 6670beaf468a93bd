// Megatron-LM's --tp-comm-overlap (Transformer Engine userbuffers; parallelism.tp_comm_overlap,
// strategies/tp_overlap.hpp): a tp 8 sequence-parallel GPT layer stack on one DGX-like node,
// simulated with and without it. The sp all-gathers and reduce-scatters, on the critical path
// without it, run in ring steps and chunks beside the GEMM chunks with it: what stays exposed
// is about one reduce-scatter chunk per reduce-scatter, and the GEMM chunks beside
// communication lose the SMs NCCL holds.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "experiment_helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// GPT with h = 8192, 64 heads, 2 layers, tp 8 + sp, one microbatch of 4 x 2048 on 8 A100s
// (300 GB/s NVLink, 2 us), no launch overheads.
Experiment layer_stack(bool overlap) {
  Experiment e = make_experiment(gpt(64, 8192, 2), 8, 1, 1, 4, 4, 2048, true);
  e.cluster.device.kernel_launch_overhead = Time::zero();
  e.parallelism.tp_comm_overlap = overlap;
  return e;
}

struct Run {
  Program program;
  traces::Timeline timeline;
  traces::Report report;
};

Run run(const Experiment& e) {
  Program p = lower(e);
  validate(p);
  traces::Timeline t = sim::simulate(p, e.cluster);
  REQUIRE(t.completed);
  traces::ReportContext context;
  traces::Report r = traces::make_report(p, t, context);
  return {std::move(p), std::move(t), std::move(r)};
}

}  // namespace

// Rank 0's time in the ops labelled `label` (a collective the pass leaves whole).
double seconds_in(const Run& r, const std::string& label) {
  double total = 0;
  const auto end = r.program.first_op(1);
  for (auto id = r.program.first_op(0); id < end; ++id) {
    if (r.program.describe(id).find("'" + label + "'") == std::string::npos) continue;
    total += (r.timeline.spans[id].end - r.timeline.spans[id].start).seconds();
  }
  return total;
}

TEST_CASE("tp comm overlap hides the sp collectives of a tp 8 layer behind its GEMMs") {
  Experiment plain = layer_stack(false);
  Experiment overlapped = layer_stack(true);
  plain.cluster.interference.enabled = false;
  overlapped.cluster.interference.enabled = false;
  const Run a = run(plain);
  const Run b = run(overlapped);
  // With one rank of work per stream and no data parallelism, a collective on the critical
  // path is exposed in full. Three stay whole with the pass (no GEMM beside them): the
  // embedding's reduce-scatter, its backward's all-gather and the loss all-reduce.
  const double whole = seconds_in(a, "embedding tp reduce-scatter") +
                       seconds_in(a, "embedding bwd tp all-gather") +
                       seconds_in(a, "loss tp all-reduce");
  CHECK(whole > 0);
  // Without the pass every sp collective is exposed: per layer 4 in forward and 6 in
  // backward, plus the head's all-gather and its backward's reduce-scatter: 22 of 128 MiB
  // (s b h x 2 = 2048 x 4 x 8192 x 2), each 7/8 x 128 MiB / 300 GB/s + 7 x 2 us = 0.405 ms:
  // 8.9 ms. With it the ring steps and reduce-scatter chunks (16 MiB on the wire per rank,
  // ~56 us + 14 us of latency) run beside GEMM chunks of ~0.27 ms (a 1024-token slice of the
  // 550 GFLOP fc1 at ~250 TFLOP/s), so only the last reduce-scatter chunk of each (~65 us)
  // and the bulk reduce-scatters' starts stay exposed: under a tenth.
  const double layers_without = a.report.exposed_comm_s - whole;
  const double layers_with = b.report.exposed_comm_s - whole;
  MESSAGE("exposed tp comm: " << a.report.exposed_comm_s * 1e3 << " ms without, "
                              << b.report.exposed_comm_s * 1e3 << " ms with, of which "
                              << whole * 1e3 << " ms in the three whole collectives");
  CHECK(layers_without > 8e-3);
  CHECK(layers_with < layers_without / 10);
  // Here (1024-token chunks) the GEMM chunks lose less than the overlap saves.
  CHECK(b.report.iteration_time_s < a.report.iteration_time_s);
}

TEST_CASE("tp comm overlap: GEMM chunks beside a chunk's transfer lose the SMs it holds") {
  // Only the SM side of interference (no memory traffic): a GEMM (compute-bound, no launch
  // overhead) beside a transfer runs at f_sm = (108 - 16) / 108 (hw_models/interference.hpp),
  // so an op that overlaps communication for its whole life takes 108 / 92 of its time alone,
  // and none takes longer.
  Experiment e = layer_stack(true);
  e.cluster.interference.enabled = true;
  e.cluster.interference.communication_units = 16;
  e.cluster.interference.memory_traffic_per_byte = 0;
  const Run r = run(e);
  REQUIRE_FALSE(r.timeline.interference.empty());
  double slowest = 0;
  for (const auto& loss : r.timeline.interference) {
    const auto& op = r.program.op(loss.op);
    if (op.stream != Stream::compute) continue;
    const auto& span = r.timeline.spans[loss.op];
    const double taken = static_cast<double>((span.end - span.start).picoseconds());
    const double alone = taken - static_cast<double>(loss.lost.picoseconds());
    slowest = std::max(slowest, taken / alone);
  }
  CHECK(slowest == doctest::Approx(108.0 / 92.0).epsilon(1e-6));
  CHECK(r.report.interference_s[static_cast<std::size_t>(Stream::compute)] > 0);
  // Channels capped at 4 (collectives.max_channels, NCCL_MAX_NCHANNELS): 108 / 104.
  e.cluster.collectives.max_channels = 4;
  const Run capped = run(e);
  double capped_slowest = 0;
  for (const auto& loss : capped.timeline.interference) {
    if (capped.program.op(loss.op).stream != Stream::compute) continue;
    const auto& span = capped.timeline.spans[loss.op];
    const double taken = static_cast<double>((span.end - span.start).picoseconds());
    capped_slowest =
        std::max(capped_slowest, taken / (taken - static_cast<double>(loss.lost.picoseconds())));
  }
  CHECK(capped_slowest == doctest::Approx(108.0 / 104.0).epsilon(1e-6));
}
