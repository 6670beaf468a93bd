// Megatron-LM's --tp-comm-overlap (Transformer Engine userbuffers; parallelism.tp_comm_overlap,
// strategies/tp_overlap.hpp): a tp 8 sequence-parallel GPT layer stack on one DGX-like node,
// simulated with and without it. The sp all-gathers become ring exchanges of point-to-point
// steps beside the GEMM chunks, the forward's reduce-scatters pipelines of 4 chunks and the
// backward's regathers and reduce-scatters bulk overlaps: what stays exposed is about one
// reduce-scatter chunk per forward reduce-scatter, and only the GEMMs beside TE's SM-driven
// kernels lose the SMs they hold (16: TE's num_sm), not those beside the copy-engine steps.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
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
  // 8.9 ms. With it the ring steps (one 16 MiB shard, 2 us + 56 us) run beside GEMM chunks of
  // ~0.27 ms (a 1024-token slice of the 550 GFLOP fc1 at ~250 TFLOP/s), the bulk collectives
  // (0.405 ms) beside whole dgrad and wgrad GEMMs of over 1.6 ms, and of each forward
  // reduce-scatter only the last of its 4 chunks (32 MiB: 14 us + 98 us) stays exposed:
  // 4 x 0.112 ms of the 8.9 ms, under a tenth.
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

TEST_CASE("tp comm overlap: only TE's SM-driven kernels take SMs from the GEMMs beside them") {
  // Only the SM side of interference (no memory traffic), NCCL holding 32 SMs. A GEMM
  // (compute-bound, no launch overhead) beside one of TE's pipeline or bulk kernels runs at
  // f_sm = (108 - 16) / 108 (TE's num_sm, not NCCL's 32: hw_models/interference.hpp), so over
  // the w seconds a bulk reduce-scatter runs beside the wgrad GEMM that GEMM loses
  // w x 16 / 108; no op takes more than 108 / 92 of its time alone. Beside the ring exchange's
  // copy-engine steps a GEMM loses nothing: the forward's fc1 chunks, which run beside those
  // steps only, lose no time.
  Experiment e = layer_stack(true);
  e.cluster.interference.enabled = true;
  e.cluster.interference.communication_units = 32;
  e.cluster.interference.memory_traffic_per_byte = 0;
  const Run r = run(e);
  REQUIRE_FALSE(r.timeline.interference.empty());
  double slowest = 0;
  std::map<OpId, double> lost;
  for (const auto& loss : r.timeline.interference) {
    const auto& op = r.program.op(loss.op);
    if (op.stream != Stream::compute) continue;
    lost[loss.op] = loss.lost.seconds();
    const auto& span = r.timeline.spans[loss.op];
    const double taken = static_cast<double>((span.end - span.start).picoseconds());
    const double alone = taken - static_cast<double>(loss.lost.picoseconds());
    slowest = std::max(slowest, taken / alone);
    const auto& kernels = r.program.kernels_of(std::get<Compute>(op.work));
    if (op.phase == Phase::forward && kernels.size() == 1) {
      CAPTURE(kernels[0].name);
      CHECK(kernels[0].name.rfind("fc1 [chunk", 0) != 0);
    }
  }
  CHECK(slowest > 1);
  CHECK(slowest <= 108.0 / 92.0 + 1e-9);
  // Rank 0's wgrad GEMMs of fc1 and qkv, each with its bulk reduce-scatter beside it.
  int bulk = 0;
  const auto end = r.program.first_op(1);
  for (auto id = r.program.first_op(0); id < end; ++id) {
    const Op& op = r.program.op(id);
    const auto* c = std::get_if<Collective>(&op.work);
    if (c == nullptr || r.program.label_of(op).find("reduce-scatter [bulk]") == std::string::npos) {
      continue;
    }
    auto wgrad = id;  // the GEMM issued before it
    while (!std::holds_alternative<Compute>(r.program.op(--wgrad).work)) {
    }
    CAPTURE(r.program.describe(wgrad));
    const auto& rs = r.timeline.spans[id];
    const auto& gemm = r.timeline.spans[wgrad];
    REQUIRE(gemm.start <= rs.start);
    REQUIRE(rs.end <= gemm.end);
    CHECK(lost[wgrad] == doctest::Approx((rs.end - rs.start).seconds() * 16 / 108).epsilon(1e-6));
    ++bulk;
  }
  CHECK(bulk == 4);  // 2 layers x (fc1, qkv)
  CHECK(r.report.interference_s[static_cast<std::size_t>(Stream::compute)] > 0);
}

namespace {

// Rank 0's window of layer `layer` in `phase` (first start to last end of its ops), the summed
// time of its compute ops and of its tp-comm ops (one stream: they never overlap each other).
struct LayerTimes {
  double window = 0, compute = 0, comm = 0;
};

LayerTimes layer_times(const Run& r, const std::string& layer, Phase phase) {
  LayerTimes t;
  double start = 1e30, end = 0;
  const auto last = r.program.first_op(1);
  for (auto id = r.program.first_op(0); id < last; ++id) {
    const Op& op = r.program.op(id);
    if (op.phase != phase || r.program.label_of(op).rfind(layer + " ", 0) != 0) continue;
    const auto& span = r.timeline.spans[id];
    start = std::min(start, span.start.seconds());
    end = std::max(end, span.end.seconds());
    const double d = (span.end - span.start).seconds();
    if (op.stream == Stream::compute) t.compute += d;
    if (op.stream == Stream::tp_comm) t.comm += d;
  }
  t.window = end - start;
  return t;
}

}  // namespace

TEST_CASE("tp comm overlap: one layer takes less than without it and more than its tails allow") {
  Experiment plain = layer_stack(false);
  Experiment overlapped = layer_stack(true);
  plain.cluster.interference.enabled = false;
  overlapped.cluster.interference.enabled = false;
  const Run a = run(plain);
  const Run b = run(overlapped);
  // The 300 GB/s, 2 us alpha-beta node of 8 ranks; the layer's sp tensors are
  // S = s b h x 2 = 2048 x 4 x 8192 x 2 = 128 MiB.
  const double S = 2048.0 * 4 * 8192 * 2, B = 300e9, alpha = 2e-6;
  // A ring step is a point-to-point message of one shard: alpha + (S / 8) / B = 57.9 us (as a
  // ring all-gather of 1/7 of the bytes it paid 7 alpha: 69.9 us).
  const double step = alpha + S / 8 / B;
  // A pipeline chunk's reduce-scatter (S / 4, ring): 7 alpha + 7/8 (S / 4) / B = 111.9 us.
  const double rs_chunk = 7 * alpha + 7.0 / 8 * (S / 4) / B;
  const auto last = b.program.first_op(1);
  int steps = 0, chunks = 0;
  for (auto id = b.program.first_op(0); id < last; ++id) {
    const Op& op = b.program.op(id);
    const auto& span = b.timeline.spans[id];
    if (std::holds_alternative<Send>(op.work)) {
      ++steps;
      CHECK((span.end - span.start).seconds() == doctest::Approx(step).epsilon(1e-6));
    }
    const auto* c = std::get_if<Collective>(&op.work);
    if (c != nullptr && c->kind == CollectiveKind::reduce_scatter &&
        b.program.label_of(op).find("[chunk") != std::string::npos) {
      ++chunks;
      CHECK((span.end - span.start).seconds() == doctest::Approx(rs_chunk).epsilon(1e-6));
    }
  }
  // Per layer 2 + 2 ring exchanges of 7 steps, 2 pipelines of 4 chunks; 2 layers; the head's
  // gather (a ring exchange beside the logits GEMM) and its backward's reduce-scatter (a
  // pipeline after the dgrad GEMM).
  CHECK(steps == 2 * 4 * 7 + 7);
  CHECK(chunks == 2 * 2 * 4 + 4);
  for (const std::string layer : {"L0", "L1"}) {
    CAPTURE(layer);
    LayerTimes without, with;
    for (Phase phase : {Phase::forward, Phase::backward}) {
      const LayerTimes x = layer_times(a, layer, phase), y = layer_times(b, layer, phase);
      without.window += x.window;
      without.compute += x.compute;
      without.comm += x.comm;
      with.window += y.window;
      with.compute += y.compute;
      with.comm += y.comm;
    }
    MESSAGE(layer << ": " << without.window * 1e3 << " ms without (compute "
                  << without.compute * 1e3 << ", comm " << without.comm * 1e3 << "), "
                  << with.window * 1e3 << " ms with (compute " << with.compute * 1e3 << ", comm "
                  << with.comm * 1e3 << ")");
    // Without the pass, nothing overlaps in the layer: its window is its compute plus its
    // 10 collectives of 0.405 ms.
    CHECK(without.window == doctest::Approx(without.compute + without.comm).epsilon(1e-6));
    CHECK(without.comm == doctest::Approx(10 * (7 * alpha + 7.0 / 8 * S / B)).epsilon(1e-6));
    // With it the layer is faster...
    CHECK(with.window < without.window);
    // ... but cannot beat max(compute, communication) plus what no GEMM can hide: each
    // forward reduce-scatter's last chunk (after the last GEMM chunk; the residual after it
    // waits for it, and the compute stream has nothing else to do), 2 x rs_chunk = 224 us:
    //   window >= max(compute, comm) + 2 (7 alpha + 7/8 (S / 4) / B).
    CHECK(with.compute > with.comm);
    CHECK(with.window >= std::max(with.compute, with.comm) + 2 * rs_chunk - 1e-9);
  }
}
