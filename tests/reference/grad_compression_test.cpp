// Compressed data-parallel gradient synchronisation (parallelism.grad_compression): the bytes
// each scheme puts on the data-parallel group, read from the lowered program and checked
// against the volume formulas of docs/grad-compression.md, the simulated time where the
// network is bandwidth-bound, the compression kernels and buffers, and whole programs.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

constexpr std::int64_t kN = 100'000'000;  // gradient elements of the one bucket

// One stage of `units` gradient units of kN / units parameters each, completed one per backward
// segment, with measured compute; buckets of `bucket_units` units.
PipelineSpec bucket_spec(int dp, GradCompression c, DType dtype, int units = 1,
                         int bucket_units = 1) {
  PipelineSpec spec;
  spec.layout = RankLayout{1, dp, 1};
  spec.dtype = dtype;
  spec.grad_compression = c;
  const std::int64_t per_unit = kN / units;
  spec.dp_bucket_size = Bytes(per_unit * bucket_units * size_of(dtype));
  StagePlan plan;
  Segment f;
  f.kernels = {Kernel{Measured{Time::us(10)}, "forward"}};
  f.label = "forward";
  plan.forward = {f};
  for (int u = 0; u < units; ++u) {
    Segment b;
    b.kernels = {Kernel{Measured{Time::us(20)}, "backward"}};
    b.label = "backward " + std::to_string(u);
    b.grads_done = {u};
    plan.backward.push_back(b);
    plan.grad_units.push_back(GradUnit{"unit " + std::to_string(u), per_unit});
  }
  plan.parameters = kN;
  spec.stages = {plan};
  return spec;
}

GradCompression compression(GradCompressionKind kind, double density = 0.01,
                            double sketch_ratio = 1.0) {
  return GradCompression{kind, density, sketch_ratio};
}

// n devices on one node behind a slow link (10 GB/s, 1 us), every collective a ring.
Experiment slow_node(int n) {
  Experiment e;
  e.cluster = test_cluster(1, n);
  e.cluster.intra_node = {Bandwidth(10e9), Time::us(1)};
  for (auto& a : e.cluster.collectives.algorithm) a = hw::CollectiveAlgorithm::ring;
  return e;
}

struct DpCollective {
  CollectiveKind kind;
  DType dtype;
  std::int64_t bytes;
  std::string label;
  double seconds;  // simulated duration (0 when not simulated)
};

// The data-parallel collectives rank 0 issues, in order, with their simulated durations.
std::vector<DpCollective> dp_collectives(const Program& p, const traces::Timeline* t = nullptr) {
  std::vector<DpCollective> out;
  for (std::size_t i = 0; i < p.ops_of(0).size(); ++i) {
    const OpId id = p.first_op(0) + static_cast<OpId>(i);
    const Op& op = p.op(id);
    const auto* c = std::get_if<Collective>(&op.work);
    if (!c || op.stream != Stream::dp_comm) continue;
    const double seconds = t ? (t->spans[id].end - t->spans[id].start).seconds() : 0.0;
    out.push_back({c->kind, c->dtype, c->bytes.count(), p.label_of(op), seconds});
  }
  return out;
}

// Per-rank bytes on the wire of a ring over n ranks: all-reduce 2(n-1)/n S; reduce-scatter,
// all-gather and all-to-all (n-1)/n S.
double per_rank(const std::vector<DpCollective>& cs, int n) {
  double total = 0;
  for (const auto& c : cs) {
    const double factor =
        c.kind == CollectiveKind::all_reduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
    total += factor * static_cast<double>(c.bytes);
  }
  return total;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("topk: data-parallel traffic drops by 2(n-1)/n N e / ((n-1) k (e+4)), indices counted") {
  // n = 8 ranks, N = 1e8 bf16 gradients (e = 2), density 0.01: k = 1e6.
  // Dense ring all-reduce per rank: 2 (n-1)/n N e = 2 * 7/8 * 1e8 * 2 = 3.5e8 bytes.
  // Top-k all-gather of values and int32 indices per rank: (n-1) k (e+4) = 7 * 1e6 * 6 = 4.2e7.
  // The factor: 3.5e8 / 4.2e7 = 25/3 = 8.33.
  const int n = 8;
  const Experiment e = slow_node(n);
  const Program dense = assemble_pipeline(bucket_spec(n, {}, DType::bf16));
  const Program topk =
      assemble_pipeline(bucket_spec(n, compression(GradCompressionKind::topk), DType::bf16));
  validate(dense);
  validate(topk);
  const auto dense_t = simulate_checked(e, dense, true);
  const auto topk_t = simulate_checked(e, topk, true);
  const auto d = dp_collectives(dense, &dense_t);
  const auto k = dp_collectives(topk, &topk_t);
  REQUIRE(d.size() == 1);
  REQUIRE(k.size() == 1);
  CHECK(d[0].kind == CollectiveKind::all_reduce);
  CHECK(d[0].bytes == kN * 2);
  CHECK(k[0].kind == CollectiveKind::all_gather);
  CHECK(k[0].bytes == n * 1'000'000 * (2 + 4));  // nccl-tests size: the gathered output
  CHECK(contains(k[0].label, "compressed topk"));
  CHECK(per_rank(d, n) == doctest::Approx(3.5e8));
  CHECK(per_rank(k, n) == doctest::Approx(4.2e7));
  CHECK(per_rank(d, n) / per_rank(k, n) == doctest::Approx(25.0 / 3.0));
  // Bandwidth-bound (10 GB/s, 1 us): ring all-reduce 2(n-1)/n S/B + 2(n-1) alpha = 35 ms +
  // 14 us; ring all-gather (n-1)/n S/B + (n-1) alpha = 4.2 ms + 7 us; ratio 8.32, the traffic
  // factor up to the latencies.
  CHECK(d[0].seconds == doctest::Approx(3.5e8 / 10e9 + 14e-6).epsilon(1e-6));
  CHECK(k[0].seconds == doctest::Approx(4.2e7 / 10e9 + 7e-6).epsilon(1e-6));
  CHECK(d[0].seconds / k[0].seconds == doctest::Approx(25.0 / 3.0).epsilon(0.002));
}

TEST_CASE("fp16 and int8: half and a quarter of fp32 gradients, int8 as all-to-all + all-gather") {
  const int n = 8;
  // fp32 training (e = 4): the dense all-reduce is 4N bytes.
  const auto dense = dp_collectives(assemble_pipeline(bucket_spec(n, {}, DType::fp32)));
  REQUIRE(dense.size() == 1);
  CHECK(dense[0].bytes == 4 * kN);
  // fp16: an all-reduce of 2N bytes, half the per-rank traffic.
  const auto half = dp_collectives(
      assemble_pipeline(bucket_spec(n, compression(GradCompressionKind::fp16), DType::fp32)));
  REQUIRE(half.size() == 1);
  CHECK(half[0].kind == CollectiveKind::all_reduce);
  CHECK(half[0].dtype == DType::fp16);
  CHECK(half[0].bytes == 2 * kN);
  CHECK(contains(half[0].label, "compressed fp16"));
  CHECK(per_rank(dense, n) / per_rank(half, n) == doctest::Approx(2.0));
  // int8: n chunks of c = N/n = 12.5e6 one-byte values with a 4-byte scale each, all-to-all
  // (n (c + 4) bytes sent and received), then the owned chunk requantised and all-gathered
  // (n (c + 4) bytes out). Per rank 2 (n-1)/n n (c + 4) = 2 (n-1) (c + 4) bytes: a quarter of
  // the fp32 all-reduce's 2 (n-1)/n 4N, up to the scales.
  const auto int8 = dp_collectives(
      assemble_pipeline(bucket_spec(n, compression(GradCompressionKind::int8), DType::fp32)));
  REQUIRE(int8.size() == 2);
  const std::int64_t c = kN / n;
  CHECK(int8[0].kind == CollectiveKind::all_to_all);
  CHECK(int8[0].bytes == n * (c + 4));
  CHECK(int8[1].kind == CollectiveKind::all_gather);
  CHECK(int8[1].bytes == n * (c + 4));
  CHECK(per_rank(int8, n) == doctest::Approx(2.0 * (n - 1) * (c + 4)));
  CHECK(per_rank(dense, n) / per_rank(int8, n) == doctest::Approx(4.0).epsilon(1e-5));
  // With bf16 training fp16 sends what the dense all-reduce sends (2 bytes either way).
  const auto bf16 = dp_collectives(
      assemble_pipeline(bucket_spec(n, compression(GradCompressionKind::fp16), DType::bf16)));
  CHECK(bf16[0].bytes == 2 * kN);
}

TEST_CASE("s2-reducer: a count sketch and a bitmap, both all-reduced") {
  // N = 1e8, density 0.01: 1e6 non-zeros; sketch_ratio 1: C = 1e6 fp32 counters (4e6 bytes);
  // the bitmap N/8 = 1.25e7 bytes. Per rank 2 (n-1)/n (4C + N/8) against the dense bf16
  // 2 (n-1)/n 2N: a factor 2e8 / 1.65e7 = 12.1.
  const int n = 4;
  const auto dense = dp_collectives(assemble_pipeline(bucket_spec(n, {}, DType::bf16)));
  const auto s2 = dp_collectives(
      assemble_pipeline(bucket_spec(n, compression(GradCompressionKind::s2_reducer), DType::bf16)));
  REQUIRE(s2.size() == 2);
  CHECK(s2[0].kind == CollectiveKind::all_reduce);
  CHECK(s2[0].dtype == DType::fp32);
  CHECK(s2[0].bytes == 4'000'000);
  CHECK(contains(s2[0].label, "sketch all-reduce (compressed s2-reducer)"));
  CHECK(s2[1].kind == CollectiveKind::all_reduce);
  CHECK(s2[1].bytes == 12'500'000);
  CHECK(contains(s2[1].label, "bitmap all-reduce (compressed s2-reducer)"));
  CHECK(per_rank(dense, n) / per_rank(s2, n) == doctest::Approx(2e8 / 1.65e7));
  // A wider sketch (2 counters per non-zero) doubles the sketch only.
  const auto wide = dp_collectives(assemble_pipeline(
      bucket_spec(n, compression(GradCompressionKind::s2_reducer, 0.01, 2.0), DType::bf16)));
  CHECK(wide[0].bytes == 8'000'000);
  CHECK(wide[1].bytes == 12'500'000);
}

TEST_CASE("compression kernels run on the compute stream around the collective; buffers") {
  // Two buckets of N/2 bf16 gradients over n = 4 ranks, top-k at density 0.01:
  // k = 5e5 per bucket, k (e + 4) = 3e6 bytes sent per bucket.
  const int n = 4;
  const std::int64_t half = kN / 2, k = 500'000, e = 2, sent = k * (e + 4);
  const Program p =
      assemble_pipeline(bucket_spec(n, compression(GradCompressionKind::topk), DType::bf16, 2, 1));
  validate(p);
  // Compute stream of rank 0, in issue order: each bucket's compression right after the
  // backward segment that completes it (inside the backward), the decompressions after the
  // backward, then the optimizer step.
  std::vector<std::string> compute;
  for (const Op& op : p.ops_of(0)) {
    if (op.stream == Stream::compute) compute.push_back(p.label_of(op));
  }
  CHECK(compute == std::vector<std::string>{"forward", "backward 0", "dp grad compress bucket 0",
                                            "backward 1", "dp grad compress bucket 1",
                                            "dp grad decompress bucket 0",
                                            "dp grad decompress bucket 1", "optimizer step"});
  for (std::size_t i = 0; i < p.ops_of(0).size(); ++i) {
    const OpId id = p.first_op(0) + static_cast<OpId>(i);
    const Op& op = p.op(id);
    const std::string& label = p.label_of(op);
    if (label == "dp grad compress bucket 0") {
      // Top-k with error feedback: read the gradient and the residual, write the new residual
      // and the k values with their indices; n + 1 payloads buffered (sent and gathered).
      const auto& kernels = p.kernels_of(std::get<Compute>(op.work));
      REQUIRE(kernels.size() == 1);
      const auto& w = std::get<Elementwise>(kernels[0].work);
      CHECK(w.elements == half);
      CHECK(w.bytes_read.count() == 2 * half * e);
      CHECK(w.bytes_written.count() == half * e + sent);
      REQUIRE(p.effects_of(op).size() == 1);
      const MemoryEffect& buffer = p.effects_of(op)[0];
      CHECK(buffer.category == MemoryCategory::comm_buffers);
      CHECK(buffer.delta.count() == (n + 1) * sent);
      CHECK_FALSE(buffer.at_end);
    }
    if (label == "dp grad all-gather (compressed topk) bucket 0") {
      // It waits for the compression.
      REQUIRE(p.deps_of(op).size() == 1);
      CHECK(p.label_of(p.op(p.deps_of(op)[0])) == "dp grad compress bucket 0");
    }
    if (label == "dp grad decompress bucket 0") {
      // Scatter-add of the n k gathered entries into the dense gradient.
      REQUIRE(p.deps_of(op).size() == 1);
      CHECK(p.label_of(p.op(p.deps_of(op)[0])) == "dp grad all-gather (compressed topk) bucket 0");
      const auto& w = std::get<Elementwise>(p.kernels_of(std::get<Compute>(op.work))[0].work);
      CHECK(w.bytes_read.count() == n * sent);
      CHECK(w.bytes_written.count() == half * e);
      REQUIRE(p.effects_of(op).size() == 1);
      CHECK(p.effects_of(op)[0].delta.count() == -(n + 1) * sent);
      CHECK(p.effects_of(op)[0].at_end);
    }
  }
  // The error-feedback residual: N e bytes of gradients held from the start, beside the
  // gradients themselves.
  CHECK(initial_bytes(p, 0, MemoryCategory::gradients) == 2 * kN * e);
  simulate_checked(slow_node(n), p);

  // Without dp_overlap every step waits for the end of the backward.
  PipelineSpec late = bucket_spec(n, compression(GradCompressionKind::topk), DType::bf16, 2, 1);
  late.dp_overlap = false;
  const Program q = assemble_pipeline(late);
  validate(q);
  compute.clear();
  for (const Op& op : q.ops_of(0)) {
    if (op.stream == Stream::compute) compute.push_back(q.label_of(op));
  }
  CHECK(compute ==
        std::vector<std::string>{"forward", "backward 0", "backward 1", "dp grad compress bucket 0",
                                 "dp grad decompress bucket 0", "dp grad compress bucket 1",
                                 "dp grad decompress bucket 1", "optimizer step"});
}

TEST_CASE("every compression lowers and simulates: transformer, chimera, layer table") {
  for (GradCompressionKind kind : kAllGradCompressions) {
    CAPTURE(name_of(kind));
    Experiment e = make_experiment(gpt(12, 576, 4), 2, 2, 2, 8, 1, 256);
    e.parallelism.grad_compression = compression(kind);
    simulate_checked(e, lower_checked(e));
    // Chimera: the data-parallel group spans both pipelines' devices of a stage.
    Experiment chimera = make_experiment(gpt(12, 576, 4), 1, 2, 2, 8, 1, 256);
    chimera.parallelism.schedule = ScheduleKind::chimera;
    chimera.parallelism.grad_compression = compression(kind);
    const Program p = lower_checked(chimera);
    simulate_checked(chimera, p);
    if (kind != GradCompressionKind::none) {
      bool compressed = false;
      for (const Op& op : p.ops_of(0)) {
        const auto* c = std::get_if<Collective>(&op.work);
        if (!c || op.stream != Stream::dp_comm) continue;
        compressed = compressed || contains(p.label_of(op), "compressed");
        CHECK(p.groups()[c->group].ranks.size() == 4);  // 2 replicas x 2 directions
      }
      CHECK(compressed);
    }
    // A layer-table model (VGG16 on 16 V100s).
    Experiment table =
        load_experiment(configs_dir() / "experiments/vgg16-bapipe-v100-16.json",
                        {cli("parallelism.partition", "even"),
                         cli("parallelism.grad_compression", std::string(name_of(kind)))});
    simulate_checked(table, lower_checked(table));
  }
}

TEST_CASE("gradient compression with ZeRO sharding is refused by the lowering") {
  PipelineSpec spec = bucket_spec(4, compression(GradCompressionKind::topk), DType::bf16);
  spec.zero.stage = 1;
  CHECK_THROWS_AS(assemble_pipeline(spec), std::invalid_argument);
}
