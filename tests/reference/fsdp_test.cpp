// PyTorch FSDP's runtime (strategies/fsdp.hpp, FsdpRuntime in techniques.hpp) on a hand-written
// model: bytes of every gather and reduction per unit, by sharding strategy and mixed precision
// (hand-calculated from FSDP's semantics: an all-gather moves the unit's parameters in
// param_dtype, a reduce-scatter its gradients in reduce_dtype, HYBRID_SHARD all-reduces the
// shard across nodes), the rate limiter's bound on gathers in flight, the issue order of
// backward prefetching on the one NCCL stream, and the first unit's gather on the critical path.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

constexpr std::int64_t kLayerParams = 1000;  // per layer
constexpr std::int64_t kEdgeParams = 500;    // the embedding and the head each: the root, 1000

Segment compute(const std::string& label, Time t, int layer, std::vector<int> grads = {}) {
  Segment s;
  s.kernels = {Kernel{Measured{t}, label}};
  s.label = label;
  if (layer >= 0) {
    s.layer_begin = layer;
    s.layer_end = layer + 1;
  }
  s.grads_done = std::move(grads);
  return s;
}

// `layers` layers of kLayerParams between an embedding and a head of kEdgeParams each; one
// measured op per layer and pass (forward `fwd`, backward 2 x fwd), one microbatch.
PipelineSpec fsdp_spec(const FsdpSpec& fsdp, int dp, int layers, Time fwd = Time::us(100)) {
  PipelineSpec spec;
  spec.layout = RankLayout{1, dp, 1};
  spec.dtype = DType::bf16;
  spec.zero.stage = fsdp.zero_stage();
  spec.fsdp = fsdp;
  StagePlan plan;
  const int head = layers + 1;
  plan.grad_units.push_back(GradUnit{"embedding", kEdgeParams, -1});
  for (int l = 0; l < layers; ++l) {
    plan.grad_units.push_back(GradUnit{"layer " + std::to_string(l), kLayerParams, l});
  }
  plan.grad_units.push_back(GradUnit{"head", kEdgeParams, -1});
  plan.forward.push_back(compute("embedding", fwd, -1));
  for (int l = 0; l < layers; ++l) plan.forward.push_back(compute("L" + std::to_string(l), fwd, l));
  plan.forward.push_back(compute("head", fwd, -1));
  plan.backward.push_back(compute("head bwd", fwd * 2, -1, {head}));
  for (int l = layers - 1; l >= 0; --l) {
    plan.backward.push_back(compute("L" + std::to_string(l) + " bwd", fwd * 2, l, {l + 1}));
  }
  plan.backward.push_back(compute("embedding bwd", fwd * 2, -1, {0}));
  plan.parameters = layers * kLayerParams + 2 * kEdgeParams;
  spec.stages = {plan};
  return spec;
}

struct Call {
  CollectiveKind kind;
  std::string label;
  std::int64_t bytes;
  std::vector<std::int32_t> group;
};

// Rank 0's data-parallel collectives in issue order.
std::vector<Call> calls(const Program& p) {
  std::vector<Call> out;
  for (const Op& op : p.ops_of(0)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (c == nullptr) continue;
    out.push_back({c->kind, p.label_of(op), c->bytes.count(), p.groups()[c->group].ranks});
  }
  return out;
}

std::vector<std::int64_t> bytes_of(const std::vector<Call>& all, CollectiveKind kind) {
  std::vector<std::int64_t> out;
  for (const Call& c : all) {
    if (c.kind == kind) out.push_back(c.bytes);
  }
  return out;
}

FsdpSpec with(FsdpSharding sharding, DType param, DType reduce) {
  FsdpSpec f = fsdp_defaults(DType::bf16);
  f.sharding = sharding;
  f.precision = {param, reduce, param};
  return f;
}

// The largest total of the parameters category of rank 0's memory effects over the run, from
// the effects and the spans (an effect applies at its op's end or start), the initial states
// left out.
std::int64_t peak_gathered(const Program& p, const traces::Timeline& t) {
  std::vector<std::pair<Time, std::int64_t>> events;
  for (const Op& op : p.ops_of(0)) {
    const auto id = static_cast<OpId>(&op - &p.op(0));
    for (const MemoryEffect& e : p.effects_of(op)) {
      if (e.category != MemoryCategory::parameters || e.tier != MemoryTier::device) continue;
      events.push_back({e.at_end ? t.spans[id].end : t.spans[id].start, e.delta.count()});
    }
  }
  // Frees before allocations at the same instant (a free at an op's end precedes what waits).
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;
  });
  std::int64_t now = 0, peak = 0;
  for (const auto& [time, delta] : events) {
    now += delta;
    peak = std::max(peak, now);
  }
  return peak;
}

const traces::Span& span_of(const Program& p, const traces::Timeline& t, const std::string& label) {
  for (const Op& op : p.ops_of(0)) {
    if (p.label_of(op) == label) return t.spans[static_cast<OpId>(&op - &p.op(0))];
  }
  FAIL("no op " << label);
  return t.spans.front();
}

traces::Timeline run(const Program& p, int dp) {
  sim::SimOptions options;
  options.record_memory = false;
  auto timeline = sim::simulate(p, pipeline_test_cluster(dp), options);
  REQUIRE_MESSAGE(timeline.completed, timeline.problem);
  return timeline;
}

}  // namespace

TEST_CASE("fsdp: bytes of each unit's gathers and reductions per sharding strategy and dtype") {
  // dp 4, two layers of 1000 parameters, a root of 1000 (embedding 500 + head 500).
  // FULL_SHARD gathers the root once (not freed after forward), each layer in forward and again
  // in backward: 5 all-gathers of 1000 x size(param_dtype); one reduce-scatter per unit of
  // 1000 x size(reduce_dtype).
  SUBCASE("FULL_SHARD, DEFAULT (bf16 parameters, fp32 reduction)") {
    const auto all = calls(assemble_pipeline(
        fsdp_spec(with(FsdpSharding::full_shard, DType::bf16, DType::fp32), 4, 2)));
    CHECK(bytes_of(all, CollectiveKind::all_gather) ==
          std::vector<std::int64_t>{2000, 2000, 2000, 2000, 2000});
    CHECK(bytes_of(all, CollectiveKind::reduce_scatter) ==
          std::vector<std::int64_t>{4000, 4000, 4000});  // fp32: twice PURE's
    CHECK(bytes_of(all, CollectiveKind::all_reduce).empty());
    for (const Call& c : all) CHECK(c.group == std::vector<std::int32_t>{0, 1, 2, 3});
  }
  SUBCASE("FULL_SHARD, PURE (bf16 throughout)") {
    const auto all = calls(assemble_pipeline(
        fsdp_spec(with(FsdpSharding::full_shard, DType::bf16, DType::bf16), 4, 2)));
    CHECK(bytes_of(all, CollectiveKind::reduce_scatter) ==
          std::vector<std::int64_t>{2000, 2000, 2000});
  }
  SUBCASE("FULL_SHARD, FULL (fp32 throughout): gathers of 4 bytes per parameter") {
    const auto all = calls(assemble_pipeline(
        fsdp_spec(with(FsdpSharding::full_shard, DType::fp32, DType::fp32), 4, 2)));
    CHECK(bytes_of(all, CollectiveKind::all_gather) ==
          std::vector<std::int64_t>{4000, 4000, 4000, 4000, 4000});
  }
  SUBCASE("SHARD_GRAD_OP: gathered in forward only, kept until the unit's backward") {
    const auto all = calls(assemble_pipeline(
        fsdp_spec(with(FsdpSharding::shard_grad_op, DType::bf16, DType::fp32), 4, 2)));
    CHECK(bytes_of(all, CollectiveKind::all_gather) == std::vector<std::int64_t>{2000, 2000, 2000});
    CHECK(bytes_of(all, CollectiveKind::reduce_scatter).size() == 3);
  }
  SUBCASE("NO_SHARD: no gathers, an all-reduce per unit in the reduce dtype") {
    const auto all = calls(
        assemble_pipeline(fsdp_spec(with(FsdpSharding::no_shard, DType::bf16, DType::fp32), 4, 2)));
    CHECK(bytes_of(all, CollectiveKind::all_gather).empty());
    CHECK(bytes_of(all, CollectiveKind::all_reduce) == std::vector<std::int64_t>{4000, 4000, 4000});
  }
  SUBCASE("HYBRID_SHARD: shard groups of 2 (a node), the shard all-reduced across them") {
    PipelineSpec spec = fsdp_spec(with(FsdpSharding::hybrid_shard, DType::bf16, DType::fp32), 4, 2);
    spec.zero.shard_group = 2;
    const auto all = calls(assemble_pipeline(spec));
    for (const Call& c : all) {
      CAPTURE(c.label);
      if (c.kind == CollectiveKind::all_reduce) {
        // rank 0 holds shard 0 of its node; its replica on the other node is dp index 2.
        CHECK(c.group == std::vector<std::int32_t>{0, 2});
        CHECK(c.bytes == 500 * 4);  // ceil(1000 / 2) fp32 elements
      } else {
        CHECK(c.group == std::vector<std::int32_t>{0, 1});
      }
    }
    CHECK(bytes_of(all, CollectiveKind::all_reduce).size() == 3);
    CHECK(bytes_of(all, CollectiveKind::reduce_scatter) ==
          std::vector<std::int64_t>{4000, 4000, 4000});
  }
}

TEST_CASE("fsdp: limit_all_gathers bounds the gathers in flight; without it they run ahead") {
  // Gathers of 2 kB on a 1 TB/s link take microseconds, the layers 100 us: unbounded, every
  // layer is gathered while the first computes. FSDP's limiter (two queued frees) makes the
  // gather of layer k wait for the end of layer k-2's forward, so at most the root and two
  // layers are unsharded in forward, three in backward with BACKWARD_PRE (current, prefetched,
  // one being freed): peak 2 x (1000 + 3 x 1000) bytes.
  const int layers = 8;
  FsdpSpec f = with(FsdpSharding::full_shard, DType::bf16, DType::fp32);
  f.unit_host_time = Time::zero();
  const Program limited = assemble_pipeline(fsdp_spec(f, 2, layers));
  const auto t = run(limited, 2);
  for (int k = 2; k < layers; ++k) {
    CAPTURE(k);
    CHECK(span_of(limited, t, "fsdp all-gather layer " + std::to_string(k)).start >=
          span_of(limited, t, "L" + std::to_string(k - 2)).end);
  }
  CHECK(peak_gathered(limited, t) <= 2 * (1000 + 3 * kLayerParams));

  f.limit_all_gathers = false;
  const Program unlimited = assemble_pipeline(fsdp_spec(f, 2, layers));
  const auto u = run(unlimited, 2);
  CHECK(span_of(unlimited, u, "fsdp all-gather layer " + std::to_string(layers - 1)).end <
        span_of(unlimited, u, "L0").end);
  CHECK(peak_gathered(unlimited, u) >= 2 * (1000 + layers * kLayerParams));
}

TEST_CASE("fsdp: the first unit's gather is on the critical path, later ones are hidden") {
  // The root's pre-forward hook (unit_host_time / 2 = 10 us on the host) issues its gather;
  // nothing runs before the embedding can start, so it starts when that gather ends. The layers'
  // gathers (prefetched two layers ahead of 100 us layers) hide behind compute.
  FsdpSpec f = with(FsdpSharding::full_shard, DType::bf16, DType::fp32);
  f.unit_host_time = Time::us(20);
  const Program p = assemble_pipeline(fsdp_spec(f, 2, 4));
  const auto t = run(p, 2);
  const traces::Span& root = span_of(p, t, "fsdp all-gather root");
  CHECK(root.start == Time::us(10));
  CHECK(root.end > root.start);
  CHECK(span_of(p, t, "embedding").start == root.end);
  for (int k = 0; k < 4; ++k) {
    CAPTURE(k);
    const std::string before = k == 0 ? "embedding" : "L" + std::to_string(k - 1);
    CHECK(span_of(p, t, "L" + std::to_string(k)).start == span_of(p, t, before).end);
  }
}

TEST_CASE("fsdp: backward prefetch decides where a unit's gather sits on the NCCL stream") {
  // One NCCL stream per process group runs gathers and reduce-scatters in issue order. With
  // BACKWARD_PRE (and BACKWARD_POST: issued in the post-backward hook before its reduce-scatter)
  // layer 0's backward gather is issued before layer 1's reduce-scatter; with NONE only in
  // layer 0's own pre-backward hook, after it.
  auto order = [](FsdpBackwardPrefetch prefetch) {
    FsdpSpec f = with(FsdpSharding::full_shard, DType::bf16, DType::fp32);
    f.backward_prefetch = prefetch;
    std::vector<std::string> labels;
    for (const Call& c : calls(assemble_pipeline(fsdp_spec(f, 2, 2)))) labels.push_back(c.label);
    const auto gather = std::find(labels.rbegin(), labels.rend(), "fsdp all-gather layer 0");
    const auto reduce = std::find(labels.begin(), labels.end(), "fsdp reduce-scatter layer 1");
    return (labels.rend() - gather - 1) < (reduce - labels.begin());
  };
  CHECK(order(FsdpBackwardPrefetch::backward_pre));
  CHECK(order(FsdpBackwardPrefetch::backward_post));
  CHECK_FALSE(order(FsdpBackwardPrefetch::none));
}
