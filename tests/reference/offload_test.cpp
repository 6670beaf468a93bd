// Offload (Ren et al., ZeRO-Offload, USENIX ATC 2021, arXiv:2101.06840; Rajbhandari et al.,
// ZeRO-Infinity, SC 2021): model states on the host or NVMe, lowered and simulated.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// Llama 2 13B on one 32 GB V100 of a DGX-2 (its host: 48 cores, 1.5 TiB, PCIe 3 x16; 20 GB/s of
// NVMe), fp16, ZeRO-2, micro batch 1 of 2048 tokens, 4 microbatches, full recomputation.
Experiment v100_13b(const std::vector<std::string>& offload, int microbatches = 4) {
  auto model = load_model(configs_dir() / "models/llama2-13b.json");
  auto e = make_experiment(model, 1, 1, 1, microbatches, 1, 2048);
  e.cluster = shipped_cluster("dgx2-v100-1", 1, 1);
  e.training.dtype = DType::fp16;
  e.parallelism.zero = 2;
  e.parallelism.recompute = RecomputeKind::full;
  for (const auto& o : offload) {
    if (o == "optimizer") e.parallelism.offload.optimizer = true;
    if (o == "params") e.parallelism.offload.params = true;
    if (o == "nvme") e.parallelism.offload.nvme = true;
  }
  if (e.parallelism.offload.params) e.parallelism.zero = 3;
  return e;
}

bool device_oom(const traces::Timeline& t) {
  for (const auto& o : t.out_of_memory) {
    if (o.tier == MemoryTier::device) return true;
  }
  return false;
}

struct Run {
  Program program;
  traces::Timeline timeline;
  traces::Report report;
};

Run run(const Experiment& e) {
  auto program = lower_checked(e);
  auto timeline = simulate_checked(e, program, true);
  auto report = report_of(e, program, timeline);
  return {std::move(program), std::move(timeline), std::move(report)};
}

// The first and last time a span of `stream` on rank 0 is running.
std::pair<Time, Time> stream_extent(const Run& r, Stream stream, Phase phase) {
  Time first = Time::infinity(), last;
  for (const auto& span : r.timeline.spans) {
    const Op& op = r.program.op(span.op);
    if (span.rank != 0 || op.stream != stream || op.phase != phase) continue;
    first = std::min(first, span.start);
    last = std::max(last, span.end);
  }
  return {first, last};
}

}  // namespace

TEST_CASE("ZeRO-Offload: 13B parameters fit one 32 GB V100 with optimizer offload, not without") {
  // Ren et al. (ZeRO-Offload, ATC 2021) train 13B parameters on one 32 GB V100. Without offload
  // a 13B model's states need 16 bytes per parameter (2 fp16 weights + 2 fp16 gradients + 12
  // fp32 Adam: master weights, momentum, variance): 16 x 13e9 = 208 GB, far beyond 32 GB even
  // with ZeRO (one device: nothing to shard over). With the optimizer offloaded the device
  // keeps the fp16 weights (2 Psi = 26 GB), the two gradient staging buffers (2 x 798,254,080
  // elements x 2 bytes = 3.2 GB, see the next test) and the activations of one recomputed
  // microbatch; the fp32 states and gradients (16 Psi) live in host memory and Adam runs on the
  // CPU.
  const auto without = run(v100_13b({}));
  const auto with = run(v100_13b({"optimizer"}));
  const std::int64_t psi = pipeline_spec(v100_13b({})).stages[0].parameters;
  CHECK(psi > 13'000'000'000);

  CHECK(device_oom(without.timeline));
  CHECK_FALSE(device_oom(with.timeline));
  CHECK(with.timeline.out_of_memory.empty());
  const double capacity = static_cast<double>(v100_13b({}).cluster.device.memory_capacity.count());
  MESSAGE("Llama 2 13B on one V100 32 GB: peak device memory "
          << static_cast<double>(without.report.peak_memory.count()) / 1e9
          << " GB without offload, " << static_cast<double>(with.report.peak_memory.count()) / 1e9
          << " GB with optimizer offload (capacity " << capacity / 1e9 << " GB); iteration "
          << with.report.iteration_time_s << " s, " << with.report.model_tflops_per_device
          << " model TFLOP/s");

  // Model states: weights on the device, states and fp32 gradients on the host.
  const Program& p = with.program;
  CHECK(initial_bytes(p, 0, MemoryCategory::parameters) == 2 * psi);
  CHECK(initial_bytes(p, 0, MemoryCategory::gradients) == 0);
  CHECK(initial_bytes(p, 0, MemoryCategory::optimizer_states) == 0);
  CHECK(initial_bytes(p, 0, MemoryCategory::optimizer_states, MemoryTier::host) == 12 * psi);
  CHECK(initial_bytes(p, 0, MemoryCategory::gradients, MemoryTier::host) == 4 * psi);
  CHECK(model_state_bytes(without.program, 0) == 16 * psi);

  // Gradients go to the host as their buckets are reduced, overlapped with the backward
  // passes; Adam runs on the host after the last copy; the weights come back over PCIe.
  const auto backward = stream_extent(with, Stream::compute, Phase::backward);
  const auto copies = stream_extent(with, Stream::copy, Phase::other);
  CHECK(copies.first < backward.second);
  bool host_adam = false;
  Time host_start, params_back_start;
  for (const auto& span : with.timeline.spans) {
    const Op& op = p.op(span.op);
    if (op.stream == Stream::host) {
      const auto& kernels = p.kernels_of(std::get<Compute>(op.work));
      const auto* step = std::get_if<OptimizerStep>(&kernels.front().work);
      REQUIRE(step != nullptr);
      CHECK(step->on_host);
      CHECK(step->params == psi);
      host_adam = true;
      host_start = span.start;
      CHECK(span.start >= copies.second);
    }
    if (op.stream == Stream::copy && op.phase == Phase::optimizer) params_back_start = span.start;
  }
  CHECK(host_adam);
  CHECK(params_back_start > host_start);
  // No optimizer step on the device.
  CHECK(stream_extent(with, Stream::compute, Phase::optimizer).first == Time::infinity());
}

TEST_CASE("ZeRO-Infinity: optimizer states on NVMe; parameters offloaded with ZeRO-3") {
  const auto host = run(v100_13b({"optimizer"}));
  const std::int64_t psi = pipeline_spec(v100_13b({})).stages[0].parameters;

  // Optimizer states on NVMe: read before and written after the host step, at 20 GB/s in all.
  const auto nvme = run(v100_13b({"optimizer", "nvme"}));
  CHECK(initial_bytes(nvme.program, 0, MemoryCategory::optimizer_states, MemoryTier::nvme) ==
        12 * psi);
  CHECK(initial_bytes(nvme.program, 0, MemoryCategory::optimizer_states, MemoryTier::host) == 0);
  CHECK_FALSE(device_oom(nvme.timeline));
  // The host stream reads the 12 Psi bytes of states from NVMe (12 Psi / 20 GB/s) before the
  // step and writes them back after it, while the copy stream returns the 2 Psi bytes of fp16
  // weights over PCIe (2 Psi / 16 GB/s): the iteration grows by read + write - that copy.
  const double states = 12.0 * static_cast<double>(psi) / 20e9;
  const double weights = 2.0 * static_cast<double>(psi) / 16e9;
  CHECK(nvme.report.iteration_time_s - host.report.iteration_time_s ==
        doctest::Approx(2 * states - weights).epsilon(0.01));

  // ZeRO-3 with the parameters on the host too: the device keeps no model states at all and
  // copies each layer's weights in before each use.
  const auto params = run(v100_13b({"optimizer", "params"}));
  CHECK(model_state_bytes(params.program, 0) == 0);
  CHECK(initial_bytes(params.program, 0, MemoryCategory::parameters, MemoryTier::host) == 2 * psi);
  CHECK_FALSE(device_oom(params.timeline));
  CHECK(params.report.peak_memory < host.report.peak_memory);
  int fetches = 0;
  for (const auto& op : params.program.ops_of(0)) {
    if (op.stream == Stream::copy && op.phase != Phase::other && op.phase != Phase::optimizer) {
      ++fetches;
    }
  }
  // Each of the 40 layers, the embedding and the head, before each forward and backward of
  // each of the 4 microbatches.
  CHECK(fetches == 42 * 2 * 4);
  MESSAGE("Llama 2 13B on one V100: iteration "
          << host.report.iteration_time_s << " s (optimizer on the host), "
          << nvme.report.iteration_time_s << " s (on NVMe), " << params.report.iteration_time_s
          << " s (optimizer and parameters on the host)");
}

TEST_CASE("parameter offload with data parallelism: copy the shard in, then all-gather") {
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  for (bool nvme : {false, true}) {
    CAPTURE(nvme);
    auto e = make_experiment(model, 1, 1, 4, 8, 1, 2048);
    e.cluster = shipped_cluster("dgx-a100-8", 1, 4);
    e.parallelism.zero = 3;
    e.parallelism.offload.params = true;
    e.parallelism.offload.nvme = nvme;
    const auto program = lower_checked(e);
    const auto timeline = simulate_checked(e, program, true);
    CHECK(timeline.out_of_memory.empty());
    const MemoryTier tier = nvme ? MemoryTier::nvme : MemoryTier::host;
    const std::int64_t psi = pipeline_spec(e).stages[0].parameters;
    CHECK(initial_bytes(program, 0, MemoryCategory::parameters, tier) == 2 * ((psi + 3) / 4));
    // The device optimizer step's updated shard goes back to where the parameters live.
    int gathers = 0;
    for (const auto& op : program.ops_of(0)) {
      const auto* c = std::get_if<Collective>(&op.work);
      if (!c || c->kind != CollectiveKind::all_gather) continue;
      ++gathers;
      bool after_fetch = false;
      for (OpId dep : program.deps_of(op)) {
        const Op& d = program.op(dep);
        if (d.stream != Stream::copy) continue;
        const auto& kernel = program.kernels_of(std::get<Compute>(d.work)).front();
        const auto* copy = std::get_if<Copy>(&kernel.work);
        after_fetch = copy && copy->from == tier && copy->to == MemoryTier::device &&
                      copy->bytes.count() * 4 >= c->bytes.count();
      }
      CHECK(after_fetch);
    }
    CHECK(gathers == 2 * 2 * (model.layers + 2));
  }
}

namespace {

// The largest amount of comm_buffers rank 0 holds on the device at any time of the run: its
// initial amount plus the effects of the ops, applied at their start or end as the spans say.
std::int64_t peak_comm_buffers(const Run& r) {
  std::vector<std::pair<Time, std::int64_t>> changes;
  for (const auto& span : r.timeline.spans) {
    if (span.rank != 0) continue;
    for (const auto& fx : r.program.effects_of(r.program.op(span.op))) {
      if (fx.category != MemoryCategory::comm_buffers || fx.tier != MemoryTier::device) continue;
      changes.emplace_back(fx.at_end ? span.end : span.start, fx.delta.count());
    }
  }
  std::sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second < b.second);
  });
  std::int64_t now = initial_bytes(r.program, 0, MemoryCategory::comm_buffers);
  std::int64_t peak = now;
  for (const auto& [time, bytes] : changes) peak = std::max(peak, now += bytes);
  return peak;
}

}  // namespace

TEST_CASE("ZeRO-Offload: gradients pass through two fixed buffers, whatever the microbatches") {
  // DeepSpeed (stage_1_and_2.py, contiguous_gradients and overlap_comm): two ipg buffers of
  // reduce_bucket_size elements (default 5e8) in the training dtype; the backward fills one
  // while the other is reduced and copied to the host, and waits when both are taken.
  // Llama 2 13B: a layer is 4h^2 + 3 h ffn + 2h = 104,857,600 + 212,336,640 + 10,240 =
  // 317,204,480 parameters, the head vocab h + h = 163,845,120. Buckets close once they reach
  // 5e8 elements, in backward order: [head, layer 39, layer 38] = 798,254,080, then 19 pairs of
  // layers (634,408,960) and the embedding (163,840,000): 21 buckets. A buffer holds the largest
  // bucket, which is more than 5e8 (a layer is not split): 2 x 798,254,080 x 2 bytes.
  const std::int64_t pool = 2LL * 798'254'080 * 2;
  const auto two = run(v100_13b({"optimizer"}, 2));
  const auto eight = run(v100_13b({"optimizer"}, 8));
  for (const Run* r : {&two, &eight}) {
    CHECK(initial_bytes(r->program, 0, MemoryCategory::comm_buffers) == pool);
    // Nothing else is staged on the device: the pool is all there is.
    CHECK(peak_comm_buffers(*r) == pool);
    CHECK_FALSE(device_oom(r->timeline));
  }
  // Memory does not grow with the microbatches: one stage, one microbatch's activations at a
  // time, the same pool; the peak is the same at 2 and at 8.
  CHECK(two.report.peak_memory == eight.report.peak_memory);

  // Every bucket after the first two waits for the one two before it to reach the host: the
  // compute op that starts filling it depends on that bucket's copy, 21 x 8 - 2 of them.
  int waits = 0;
  std::int64_t copied = 0;
  for (const auto& op : eight.program.ops_of(0)) {
    if (op.stream == Stream::copy && op.phase == Phase::other) {
      const auto& kernel = eight.program.kernels_of(std::get<Compute>(op.work)).front();
      copied += std::get<Copy>(kernel.work).bytes.count();
    }
    if (op.stream != Stream::compute) continue;
    for (OpId dep : eight.program.deps_of(op)) {
      if (eight.program.op(dep).stream == Stream::copy) ++waits;
    }
  }
  CHECK(waits == 21 * 8 - 2);
  // Each microbatch sends all of its fp16 gradients to the host once: 2 Psi bytes each.
  const std::int64_t psi = pipeline_spec(v100_13b({})).stages[0].parameters;
  CHECK(copied == 8 * 2 * psi);
  MESSAGE("Llama 2 13B, ZeRO-Offload on one V100: staging pool "
          << static_cast<double>(pool) / (1 << 30) << " GiB; peak device memory "
          << static_cast<double>(two.report.peak_memory.count()) / (1 << 30) << " GiB at 2, "
          << static_cast<double>(eight.report.peak_memory.count()) / (1 << 30)
          << " GiB at 8 microbatches");
}
