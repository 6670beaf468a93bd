// Activation-checkpoint offload (DeepSpeed's cpu_checkpointing): with full recomputation the
// checkpoints of in-flight microbatches wait on the host instead of the device.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

TEST_CASE("offloaded checkpoints leave the device and come back for their recompute") {
  // GPT-3 1.7B (24 layers, h = 2304), pp 2, 8 microbatches of 1 x 2048, full recomputation
  // with one checkpoint per layer: a checkpoint is s b h * 2 bytes = 9,437,184 B. Under 1F1B
  // stage 0 holds 2 microbatches, i.e. 2 x 12 checkpoints on the device without offload;
  // with offload at most a few (the one being recomputed and those still in flight to the
  // host), so the device's activation peak drops by at least 20 checkpoints and the host holds
  // at least one microbatch's 12.
  const std::int64_t checkpoint = 2048LL * 2304 * 2;
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  auto base = make_experiment(model, 1, 2, 1, 8, 1, 2048);
  base.parallelism.recompute = RecomputeKind::full;
  // Overlap is free here (no interference): only then can extra PCIe copies never shorten the
  // iteration (with interference, delaying a compute op can move it away from a transfer).
  base.cluster.interference.enabled = false;
  base.cluster.host =
      hw::HostSpec{Bytes(1LL << 40), Bandwidth(400e9), 128, 8e7, {Bandwidth(32e9), Time::us(5)}};
  auto offloaded = base;
  offloaded.parallelism.offload.activations = true;

  auto run = [](const Experiment& e) {
    auto program = lower(e);
    validate(program);
    auto timeline = sim::simulate(program, e.cluster);
    REQUIRE(timeline.completed);
    return std::pair{std::move(program), std::move(timeline)};
  };
  auto [p0, t0] = run(base);
  auto [p1, t1] = run(offloaded);
  const auto activations = static_cast<std::size_t>(MemoryCategory::activations);
  const auto& device0 = t0.ranks[0].tiers[static_cast<std::size_t>(MemoryTier::device)];
  const auto& device1 = t1.ranks[0].tiers[static_cast<std::size_t>(MemoryTier::device)];
  CHECK(device0.breakdown[activations].count() - device1.breakdown[activations].count() >=
        20 * checkpoint);
  CHECK(t1.ranks[0].tiers[static_cast<std::size_t>(MemoryTier::host)].peak.count() >=
        12 * checkpoint);
  CHECK(t0.ranks[0].tiers[static_cast<std::size_t>(MemoryTier::host)].peak.count() == 0);

  // Each microbatch's 12 checkpoints go out once its forward op has stored them (tp 1: the
  // stage's forward is one op, so one copy carries all 12) and come back one per recomputed
  // layer: 8 x 12 x checkpoint bytes each way.
  std::int64_t out = 0, in = 0;
  int fetches = 0;
  for (const auto& op : p1.ops_of(0)) {
    if (op.stream != Stream::copy) continue;
    for (const auto& k : p1.kernels_of(std::get<Compute>(op.work))) {
      const auto& c = std::get<Copy>(k.work);
      (c.to == MemoryTier::host ? out : in) += c.bytes.count();
      fetches += c.to == MemoryTier::device ? 1 : 0;
    }
  }
  CHECK(out == 8 * 12 * checkpoint);
  CHECK(in == 8 * 12 * checkpoint);
  CHECK(fetches == 8 * 12);
  // Everything allocated is released by the end: the last host sample is back to zero.
  for (auto it = t1.memory.rbegin(); it != t1.memory.rend(); ++it) {
    if (it->rank == 0 && it->tier == MemoryTier::host) {
      CHECK(it->total.count() == 0);
      break;
    }
  }
  // The copies take PCIe time that compute cannot always hide: the iteration never gets shorter.
  auto iteration_end = [](const traces::Timeline& t) {
    Time end;
    for (const auto& span : t.spans) end = std::max(end, span.end);
    return end;
  };
  CHECK(iteration_end(t1) >= iteration_end(t0));
}
