// Context parallelism (strategies/context_parallel.hpp): Transformer Engine's ring attention
// with its load-balanced causal split, the ring's and Ulysses' traffic against their closed
// forms, the rank layout and the configuration errors.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

#include "experiment_helpers.hpp"
#include "strategies/context_parallel.hpp"
#include "strategies/lowering.hpp"

namespace stratasim::testing {
namespace {

using namespace strategies;

const std::filesystem::path kGpt = configs_dir() / "experiments/gpt3-1.7b-a100-8.json";

// gpt3-1.7b (24 layers, hidden 2304, 24 heads of 96, seq 2048) on tp x cp ranks, one stage,
// one replica, `microbatches` microbatches of one sample.
Experiment gpt_cp(int tp, int cp, const std::string& mode, int microbatches = 2) {
  return load_experiment(
      kGpt, {cli("parallelism.tp", tp), cli("parallelism.pp", 1), cli("parallelism.dp", 1),
             cli("parallelism.cp", cp), cli("parallelism.cp_mode", mode),
             cli("training.global_batch", microbatches), cli("training.flash_attention", true),
             cli("cluster.nodes", 1), cli("cluster.devices_per_node", tp * cp)});
}

TEST_CASE("ring attention: the 2cp load-balanced split gives every rank the same causal work") {
  // A causal sequence of S tokens has S^2 / 2 (query, key) pairs (attention_flops' convention:
  // half the square). Split over cp ranks each should compute S^2 / (2 cp).
  const std::int64_t seq = 65536;
  for (int cp : {2, 3, 4, 8}) {
    const double expected = static_cast<double>(seq) * seq / 2 / cp;
    double total = 0;
    for (int r = 0; r < cp; ++r) {
      double pairs = 0;
      for (int step = 0; step < cp; ++step) {
        pairs += ring_attention_pairs(seq, cp, r, step, true, true);
      }
      CHECK(pairs == doctest::Approx(expected).epsilon(0.01));
      total += pairs;
    }
    CHECK(total == doctest::Approx(static_cast<double>(seq) * seq / 2).epsilon(1e-12));
  }
}

TEST_CASE("ring attention: the contiguous split leaves the last rank 2cp - 1 times the first's") {
  // Contiguous shards of s = S / cp tokens: rank r computes its causal diagonal (s^2 / 2) and
  // the whole blocks of the r ranks before it (r s^2), (r + 1/2) s^2; the whole is cp^2 s^2 / 2,
  // so rank r's share is (2r + 1) / cp^2 and the last rank does (2cp - 1) times the first's.
  const std::int64_t seq = 32768;
  for (int cp : {2, 4, 8}) {
    std::vector<double> work(static_cast<std::size_t>(cp), 0.0);
    double total = 0;
    for (int r = 0; r < cp; ++r) {
      for (int step = 0; step < cp; ++step) {
        work[static_cast<std::size_t>(r)] += ring_attention_pairs(seq, cp, r, step, true, false);
      }
      total += work[static_cast<std::size_t>(r)];
    }
    for (int r = 0; r < cp; ++r) {
      CHECK(work[static_cast<std::size_t>(r)] / total ==
            doctest::Approx((2.0 * r + 1) / (cp * cp)).epsilon(1e-12));
    }
    CHECK(work.back() / work.front() == doctest::Approx(2.0 * cp - 1));
  }
  // Without a causal mask every step is a whole block: balanced either way.
  CHECK(ring_attention_pairs(seq, 4, 0, 3, false, false) ==
        ring_attention_pairs(seq, 4, 3, 1, false, true));
}

// Sums of one rank's ops of the Program: attention FLOPs as the cost model counts them, the
// bytes it sends on the cp ring, and its all-to-alls' bytes.
struct RankTraffic {
  double attention_flops = 0, model_attention_flops = 0, ring_bytes = 0, all_to_all_bytes = 0;
  int ring_sends = 0;
};
RankTraffic traffic(const Program& p, int rank) {
  RankTraffic t;
  for (const Op& op : p.ops_of(rank)) {
    if (const auto* c = std::get_if<Compute>(&op.work)) {
      for (const Kernel& k : p.kernels_of(*c)) {
        if (const auto* a = std::get_if<Attention>(&k.work)) {
          t.attention_flops += attention_flops(*a).count();
          t.model_attention_flops += matmul_flops(k).count();
        }
      }
    } else if (const auto* s = std::get_if<Send>(&op.work)) {
      if (p.label_of(op).find("cp ring") != std::string::npos) {
        t.ring_bytes += static_cast<double>(s->bytes.count());
        ++t.ring_sends;
      }
    } else if (const auto* coll = std::get_if<Collective>(&op.work)) {
      if (coll->kind == CollectiveKind::all_to_all) {
        t.all_to_all_bytes += static_cast<double>(coll->bytes.count());
      }
    }
  }
  return t;
}

TEST_CASE("ring attention: per-rank FLOPs and send volume equal their closed forms") {
  // gpt3-1.7b: L = 24 layers, a = 24 heads of d = 96, S = 2048 tokens, bf16 (e = 2), b = 1,
  // m = 2 microbatches, tp t, cp c. Causal attention of one sequence: 4 S^2 a d / 2 FLOPs forward
  // (2 matmuls, 2 FLOPs per multiply-add, half the pairs), twice that backward; each rank does
  // 1/(c t) of it: L m 3 (4 S^2 a d / 2) / (c t).
  // Ring traffic per rank: a KV block is 2 b (S / c) a d e / t bytes; forward c - 1 messages,
  // backward 2 (c - 1) (KV then dKV), so L m 3 (c - 1) KV bytes.
  const double L = 24, a = 24, d = 96, S = 2048, e = 2, m = 2;
  for (auto [t, c] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 4}, std::pair{2, 4}}) {
    CAPTURE(t);
    CAPTURE(c);
    const Program p = lower(gpt_cp(t, c, "ring"));
    const double flops = L * m * 3 * (4 * S * S * a * d / 2) / (c * t);
    const double kv = 2 * (S / c) * a * d * e / t;
    std::set<double> per_rank;
    for (int r = 0; r < p.world_size(); ++r) {
      const RankTraffic x = traffic(p, r);
      CHECK(x.attention_flops == doctest::Approx(flops).epsilon(1e-9));
      // Model FLOPs count the whole score matrix, as without cp: twice the causal work.
      CHECK(x.model_attention_flops == doctest::Approx(2 * flops).epsilon(1e-9));
      CHECK(x.ring_bytes == doctest::Approx(L * m * 3 * (c - 1) * kv).epsilon(1e-12));
      per_rank.insert(x.attention_flops);
    }
    CHECK(per_rank.size() == 1);  // balanced exactly
  }
}

TEST_CASE("ring attention: each step's kernel does the work of a load-balanced ring block") {
  // The lowering costs every ring step as the causal local block; its attention FLOPs must equal
  // TE's block of that step (ring_attention_pairs) for every rank: 4 a d pairs per sample.
  const Experiment e = gpt_cp(1, 4, "ring");
  const StagePlan plan = pipeline_spec(e).stages.front();
  std::vector<double> steps;
  for (const Segment& s : plan.forward) {
    if (s.layer_begin != 3 || !s.compute) continue;
    for (const Kernel& k : s.kernels) {
      if (const auto* a = std::get_if<Attention>(&k.work)) {
        steps.push_back(attention_flops(*a).count());
      }
    }
  }
  REQUIRE(steps.size() == 4);
  for (int r = 0; r < 4; ++r) {
    for (int step = 0; step < 4; ++step) {
      CHECK(steps[static_cast<std::size_t>(step)] ==
            doctest::Approx(4.0 * 24 * 96 * ring_attention_pairs(2048, 4, r, step, true, true)));
    }
  }
}

TEST_CASE("ulysses: all-to-all volume per rank equals its closed form") {
  // Per layer and microbatch, forward q, k, v and the output, backward dO, dQ, dK, dV: eight
  // all-to-alls of one rank's b (S / c) (a / t) d e bytes each (kv_heads = heads here), so
  // L m 8 b (S / c) (a / t) d e; each rank sends (c - 1) / c of it.
  const double L = 24, a = 24, d = 96, S = 2048, e = 2, m = 2;
  for (auto [t, c] : {std::pair{1, 2}, std::pair{2, 4}, std::pair{1, 8}}) {
    CAPTURE(t);
    CAPTURE(c);
    const Program p = lower(gpt_cp(t, c, "ulysses"));
    const double flops = L * m * 3 * (4 * S * S * a * d / 2) / (c * t);
    for (int r = 0; r < p.world_size(); r += t) {
      const RankTraffic x = traffic(p, r);
      CHECK(x.all_to_all_bytes == doctest::Approx(L * m * 8 * (S / c) * (a / t) * d * e));
      CHECK(x.ring_sends == 0);
      CHECK(x.attention_flops == doctest::Approx(flops).epsilon(1e-9));
    }
  }
}

TEST_CASE("context parallelism: Megatron-Core's rank order and groups") {
  // tp 2, cp 2, pp 2, dp 2 on 16 devices: rank = t + 2 (c + 2 (d + 2 s)). The cp group of rank 0
  // is {0, 2}; gradients are reduced over dp x cp: {0, 2, 4, 6}.
  const Experiment e = load_experiment(
      kGpt, {cli("parallelism.tp", 2), cli("parallelism.pp", 2), cli("parallelism.dp", 2),
             cli("parallelism.cp", 2), cli("training.global_batch", 8),
             cli("training.flash_attention", true), cli("cluster.nodes", 2)});
  const RankLayout layout = layout_of(e);
  CHECK(layout.world_size() == 16);
  CHECK(layout.rank(1, 3, 1) == 1 + 2 * (3 + 4 * 1));
  CHECK(layout.cp_index(2) == 1);
  CHECK(layout.replica(4) == 1);
  CHECK(e.microbatches() == 4);  // 8 / (dp 2 x micro batch 1): the cp ranks share them
  const Program p = lower(e);
  std::set<std::vector<std::int32_t>> groups;
  for (const Group& g : p.groups()) groups.insert(g.ranks);
  CHECK(groups.count({0, 2}) == 1);
  CHECK(groups.count({9, 11}) == 1);
  CHECK(groups.count({0, 2, 4, 6}) == 1);
  CHECK(groups.count({0, 4}) == 0);  // no dp group without cp
}

TEST_CASE("context parallelism: ZeRO shards over the dp x cp ranks") {
  // ZeRO 1 with tp 2, cp 2, pp 1, dp 2 on 8 GPUs: mixed-precision Adam keeps 12 bytes per
  // parameter (fp32 master weights, m, v; ZeroSettings), sharded over dp x cp = 4 ranks:
  // 12 ceil(P / 4) bytes of optimizer states for the stage's P parameters per rank.
  const Experiment e = load_experiment(
      kGpt, {cli("parallelism.tp", 2), cli("parallelism.pp", 1), cli("parallelism.dp", 2),
             cli("parallelism.cp", 2), cli("parallelism.zero", 1), cli("training.global_batch", 4),
             cli("training.flash_attention", true)});
  const std::int64_t P = pipeline_spec(e).stages.front().parameters;
  const Program p = lower(e);
  std::int64_t optimizer = 0;
  for (const ResidentMemory& m : p.initial_memory(0)) {
    if (m.category == MemoryCategory::optimizer_states) optimizer += m.bytes.count();
  }
  CHECK(optimizer == 12 * ((P + 3) / 4));
}

TEST_CASE("context parallelism: activations per rank scale by 1 / cp") {
  // Every stored activation is per token (flash attention stores no S^2 tensor): a rank with
  // S / 2 tokens stores half of what one with S tokens stores, plus nothing at the end of a
  // forward (the KV receive buffers are released with the attention).
  const Program one = lower(gpt_cp(2, 1, "ring", 1));
  const Program two = lower(gpt_cp(2, 2, "ring", 1));
  CHECK(forward_activations(two) == doctest::Approx(forward_activations(one) / 2).epsilon(1e-3));
}

TEST_CASE("context parallelism: bad settings name parallelism.cp") {
  // 2048 tokens do not split into 2 x 3 = 6 chunks for the causal ring...
  auto e1 = experiment_error(
      kGpt, {cli("parallelism.tp", 1), cli("parallelism.pp", 1), cli("parallelism.dp", 1),
             cli("parallelism.cp", 3), cli("training.flash_attention", true),
             cli("cluster.nodes", 1), cli("cluster.devices_per_node", 3)});
  CHECK(e1.path() == "parallelism.cp");
  CHECK(e1.message().find("2 * cp = 6") != std::string::npos);
  // ... nor into 3 shards for Ulysses.
  auto e2 = experiment_error(
      kGpt, {cli("parallelism.tp", 1), cli("parallelism.pp", 1), cli("parallelism.dp", 1),
             cli("parallelism.cp", 3), cli("parallelism.cp_mode", "ulysses"),
             cli("training.flash_attention", true), cli("cluster.nodes", 1),
             cli("cluster.devices_per_node", 3)});
  CHECK(e2.path() == "parallelism.cp");
  // Ulysses with tp 2 x cp 8 = 16 ranks does not divide 24 heads.
  auto e3 = experiment_error(
      kGpt, {cli("parallelism.tp", 2), cli("parallelism.pp", 1), cli("parallelism.dp", 1),
             cli("parallelism.cp", 8), cli("parallelism.cp_mode", "ulysses"),
             cli("training.flash_attention", true), cli("cluster.nodes", 2)});
  CHECK(e3.path() == "parallelism.cp");
  CHECK(e3.message().find("heads (24)") != std::string::npos);
  // The ring needs fused attention.
  auto e4 = experiment_error(kGpt, {cli("parallelism.tp", 1), cli("parallelism.pp", 1),
                                    cli("parallelism.dp", 4), cli("parallelism.cp", 2)});
  CHECK(e4.path() == "training.flash_attention");
  // tp * cp * pp must divide the cluster.
  auto e5 = experiment_error(
      kGpt, {cli("parallelism.tp", 2), cli("parallelism.pp", 1), cli("parallelism.cp", 3),
             cli("parallelism.dp", nullptr), cli("training.flash_attention", true)});
  CHECK(e5.path() == "parallelism.cp");
  CHECK(e5.message().find("tp * cp * pp = 6") != std::string::npos);
}

}  // namespace
}  // namespace stratasim::testing
