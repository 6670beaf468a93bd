// Merak's sub-pipelined tensor parallelism as a pass over stage plans (strategies/tp_overlap.hpp):
// k copies of every segment, one chain per sub-batch, interleaved block by block; per copy one
// sub-batch's shapes, bytes and activations, which over the k copies add up to the full
// microbatch's plan.
#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "strategies/tp_overlap.hpp"
#include "strategies/transformer.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// 4 layers, h = 1024, a = 16, s = 1024, 4 samples per microbatch: N = sbh = 4,194,304.
constexpr std::int64_t kMicroBatch = 4;
constexpr std::int64_t kSbh = 1024 * 4 * 1024;

LayerSetting setting(int tp, bool sp, bool flash = false) {
  LayerSetting s;
  s.tp = tp;
  s.sequence_parallel = sp;
  s.micro_batch = kMicroBatch;
  s.seq_len = 1024;
  s.flash_attention = flash;
  return s;
}

struct Case {
  const char* name;
  int tp;
  bool sp;
  bool flash;
  int stage, stages, layer_begin, layer_end;
  StageRecompute recompute;
};

// One stage with the embedding and the head, a middle stage, and recomputation of both kinds.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"tp 2, one stage", 2, false, false, 0, 1, 0, 4, {}},
      {"tp 2 + sp, one stage", 2, true, false, 0, 1, 0, 4, {}},
      {"tp 2, flash, middle stage", 2, false, true, 1, 3, 1, 3, {}},
      {"tp 2 + sp, full recompute in groups of 2", 2, true, false, 0, 2, 0, 2, {false, 2, 2}},
      {"tp 2, selective, last stage", 2, false, false, 1, 2, 2, 4, {true, 0, 1}},
      {"tp 1", 1, false, false, 0, 1, 0, 4, {}},
  };
  return all;
}

StagePlan full_plan(const Case& c) {
  return plan_transformer_stage(gpt(16, 1024, 4), setting(c.tp, c.sp, c.flash), c.stage, c.stages,
                                c.layer_begin, c.layer_end, c.recompute);
}

StagePlan sub_plan(const Case& c, int k) {
  LayerSetting s = setting(c.tp, c.sp, c.flash);
  s.micro_batch /= k;
  return plan_transformer_stage(gpt(16, 1024, 4), s, c.stage, c.stages, c.layer_begin, c.layer_end,
                                c.recompute);
}

StagePlan overlapped(const Case& c, int k) {
  return plan_transformer_stage_sub_pipelined(gpt(16, 1024, 4), setting(c.tp, c.sp, c.flash),
                                              c.stage, c.stages, c.layer_begin, c.layer_end,
                                              c.recompute, k);
}

std::vector<Segment> of_chain(const std::vector<Segment>& pass, int chain) {
  std::vector<Segment> out;
  for (const auto& s : pass) {
    if (s.chain == chain) out.push_back(s);
  }
  return out;
}

Bytes activations(const std::vector<Segment>& pass) {
  Bytes total;
  for (const auto& s : pass) total += s.activation_delta;
  return total;
}

// Matrix FLOPs of a pass by kernel name.
std::map<std::string, double> flops_by_kernel(const std::vector<Segment>& pass) {
  std::map<std::string, double> flops;
  for (const auto& s : pass) {
    for (const auto& k : s.kernels) flops[k.name] += matmul_flops(k).count();
  }
  return flops;
}

// Each segment's index within its own chain: the index of the sub plan's segment it copies.
std::vector<std::size_t> original_index(const std::vector<Segment>& pass, int k) {
  std::vector<std::size_t> next(static_cast<std::size_t>(k), 0), index;
  for (const auto& s : pass) index.push_back(next[static_cast<std::size_t>(s.chain)]++);
  return index;
}

// Where the block holding segment i of `pass` begins: just after the previous collective.
std::size_t block_begin(const std::vector<Segment>& pass, std::size_t i) {
  while (i > 0 && pass[i - 1].compute) --i;
  return i;
}

// The passes of a plan, by name.
std::vector<std::pair<const char*, const std::vector<Segment>*>> passes(const StagePlan& p) {
  return {{"forward", &p.forward}, {"backward", &p.backward}, {"weight", &p.weight}};
}

}  // namespace

TEST_CASE("sub-pipelining with one sub-batch leaves the plan as it is") {
  for (const auto& c : cases()) {
    CAPTURE(std::string(c.name));
    const StagePlan plain = full_plan(c);
    const StagePlan one = overlapped(c, 1);
    for (std::size_t p = 0; p < 3; ++p) {
      const auto& a = *passes(plain)[p].second;
      const auto& b = *passes(one)[p].second;
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        CHECK(b[i].label == a[i].label);
        CHECK(b[i].chain == 0);
        CHECK(b[i].compute == a[i].compute);
        CHECK(b[i].bytes == a[i].bytes);
        CHECK(b[i].kernels.size() == a[i].kernels.size());
        CHECK(b[i].activation_delta == a[i].activation_delta);
        CHECK(b[i].grads_done == a[i].grads_done);
      }
    }
    CHECK(one.boundary_bytes == plain.boundary_bytes);
    CHECK(one.parameters == plain.parameters);
  }
}

TEST_CASE("each sub-batch's chain is the sub-batch plan, in order, labelled") {
  for (const auto& c : cases()) {
    for (int k : {2, 4}) {
      CAPTURE(std::string(c.name));
      CAPTURE(k);
      const StagePlan sub = sub_plan(c, k);
      const StagePlan plan = overlapped(c, k);
      for (std::size_t p = 0; p < 3; ++p) {
        CAPTURE(std::string(passes(plan)[p].first));
        const auto& original = *passes(sub)[p].second;
        const auto& pass = *passes(plan)[p].second;
        CHECK(pass.size() == static_cast<std::size_t>(k) * original.size());
        for (int j = 0; j < k; ++j) {
          const auto chain = of_chain(pass, j);
          REQUIRE(chain.size() == original.size());
          for (std::size_t i = 0; i < chain.size(); ++i) {
            CHECK(chain[i].label == original[i].label + " [sub " + std::to_string(j) + "]");
            CHECK(chain[i].compute == original[i].compute);
            CHECK(chain[i].recompute == original[i].recompute);
            CHECK(chain[i].collective == original[i].collective);
            CHECK(chain[i].bytes == original[i].bytes);
            CHECK(chain[i].layer_begin == original[i].layer_begin);
            CHECK(chain[i].layer_end == original[i].layer_end);
            CHECK(chain[i].activation_delta == original[i].activation_delta);
            CHECK(chain[i].checkpoint_delta == original[i].checkpoint_delta);
            CHECK(chain[i].checkpoint_fetch == original[i].checkpoint_fetch);
            REQUIRE(chain[i].kernels.size() == original[i].kernels.size());
            for (std::size_t n = 0; n < chain[i].kernels.size(); ++n) {
              CHECK(chain[i].kernels[n].name == original[i].kernels[n].name);
              CHECK(matmul_flops(chain[i].kernels[n]) == matmul_flops(original[i].kernels[n]));
            }
            // Gradients are complete only once the last sub-batch's copy has run.
            CHECK(chain[i].grads_done ==
                  (j == k - 1 ? original[i].grads_done : std::vector<int>{}));
          }
        }
      }
      CHECK(plan.grad_units.size() == sub.grad_units.size());
      CHECK(plan.parameters == full_plan(c).parameters);
      CHECK(plan.boundary_bytes == full_plan(c).boundary_bytes);
      CHECK(plan.boundary_bytes == sub.boundary_bytes * k);
    }
  }
}

TEST_CASE(
    "copies interleave block by block: a sub-batch's collective precedes the next's compute") {
  for (const auto& c : cases()) {
    for (int k : {2, 4}) {
      CAPTURE(std::string(c.name));
      CAPTURE(k);
      const StagePlan sub = sub_plan(c, k);
      const StagePlan plan = overlapped(c, k);
      for (std::size_t p = 0; p < 3; ++p) {
        CAPTURE(std::string(passes(plan)[p].first));
        const auto& original = *passes(sub)[p].second;
        const auto& pass = *passes(plan)[p].second;
        const auto index = original_index(pass, k);
        for (std::size_t i = 0; i + 1 < pass.size(); ++i) {
          const int j = pass[i].chain;
          const bool ends_pass = index[i] + 1 == original.size();
          if (pass[i].compute && !ends_pass) {
            // Within a block a sub-batch's segments run back to back.
            CHECK(pass[i + 1].chain == j);
            CHECK(index[i + 1] == index[i] + 1);
          } else if (j < k - 1) {
            // Sub-batch j's collective (or the end of its pass), then sub-batch j + 1 starts the
            // same block.
            CHECK(pass[i + 1].chain == j + 1);
            CHECK(index[i + 1] == block_begin(original, index[i]));
          } else {
            // The last sub-batch's collective ends the block; the next block begins at sub 0.
            CHECK(pass[i + 1].chain == 0);
            CHECK(index[i + 1] == index[i] + 1);
          }
        }
      }
    }
  }
}

TEST_CASE("a tensor-parallel layer's forward, two sub-batches: the issue order") {
  // Layer 1 alone with tp = 2: compute "attention" (ln1 .. proj), all-reduce, compute "mlp"
  // (dropout-residual, ln2, fc1, gelu, fc2), all-reduce, compute "residual". Three blocks; in
  // each, sub-batch 0 then sub-batch 1. On the compute stream attention[1] follows
  // attention[0], so the all-reduce of sub 0 overlaps it; mlp[0] waits for that all-reduce.
  const StagePlan plan =
      plan_transformer_stage_sub_pipelined(gpt(16, 1024, 4), setting(2, false), 1, 4, 1, 2, {}, 2);
  std::vector<std::string> labels;
  for (const auto& s : plan.forward) labels.push_back(s.label);
  CHECK(labels ==
        std::vector<std::string>{"L1 attention [sub 0]", "L1 attention tp all-reduce [sub 0]",
                                 "L1 attention [sub 1]", "L1 attention tp all-reduce [sub 1]",
                                 "L1 mlp [sub 0]", "L1 mlp tp all-reduce [sub 0]", "L1 mlp [sub 1]",
                                 "L1 mlp tp all-reduce [sub 1]", "L1 residual [sub 0]",
                                 "L1 residual [sub 1]"});
  std::vector<int> chains;
  for (const auto& s : plan.forward) chains.push_back(s.chain);
  CHECK(chains == std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1, 0, 1});
}

TEST_CASE("blocks: compute segments up to and including the next collective") {
  // A hand-made pass with two compute segments in a row (as recomputed and normal work are),
  // two collectives in a row and trailing compute: [a, b, X, Y, c] with k = 2 gives
  // a0 b0 X0 a1 b1 X1 | Y0 Y1 | c0 c1. The weight pass (no collectives) is one block.
  const auto compute = [](std::string label, std::vector<int> grads = {}) {
    Segment s;
    s.label = std::move(label);
    s.grads_done = std::move(grads);
    s.activation_delta = Bytes(10);
    return s;
  };
  const auto collective = [](std::string label) {
    Segment s;
    s.compute = false;
    s.bytes = Bytes(100);
    s.label = std::move(label);
    return s;
  };
  StagePlan sub;
  sub.forward = {compute("a"), compute("b"), collective("X"), collective("Y"), compute("c")};
  sub.weight = {compute("w1", {0}), compute("w2", {1, 2})};
  sub.grad_units = {{"u0", 1}, {"u1", 2}, {"u2", 3}};
  sub.parameters = 6;
  sub.boundary_bytes = Bytes(64);
  const StagePlan plan = sub_pipeline(sub, 2);
  std::vector<std::string> labels;
  for (const auto& s : plan.forward) labels.push_back(s.label);
  CHECK(labels == std::vector<std::string>{"a [sub 0]", "b [sub 0]", "X [sub 0]", "a [sub 1]",
                                           "b [sub 1]", "X [sub 1]", "Y [sub 0]", "Y [sub 1]",
                                           "c [sub 0]", "c [sub 1]"});
  CHECK(activations(plan.forward) == Bytes(2 * 30));
  labels.clear();
  for (const auto& s : plan.weight) labels.push_back(s.label);
  CHECK(labels == std::vector<std::string>{"w1 [sub 0]", "w2 [sub 0]", "w1 [sub 1]", "w2 [sub 1]"});
  CHECK(plan.weight[0].grads_done.empty());
  CHECK(plan.weight[1].grads_done.empty());
  CHECK(plan.weight[2].grads_done == std::vector<int>{0});
  CHECK(plan.weight[3].grads_done == std::vector<int>{1, 2});
  CHECK(plan.backward.empty());
  CHECK(plan.boundary_bytes == Bytes(128));
  CHECK(plan.parameters == 6);
  CHECK(plan.grad_units.size() == 3);
}

TEST_CASE("the sub-batches store the full microbatch's activations (Korthikanti)") {
  // One stage, 4 layers, a = 16, h = 1024, s = 1024, b = 4, t = 2: N = sbh = 4,194,304.
  // Per layer sbh(10 + 24/t + 5as/(ht)) = (10 + 12 + 40) N = 62 N; with sequence parallelism
  // sbh(34/t + 5as/(ht)) = (17 + 40) N = 57 N. Plus the embedding dropout mask (1 byte per
  // element of the, with sp sharded, [s, b, h] tensor: N, or N/2), the final norm's input and
  // output (4 N, or 2 N) and the fp32 logits, 4 sb v/t = 4 * 4096 * 25600 = 419,430,400.
  // Every term is linear in b, so k sub-batches of b/k store exactly as much.
  const std::int64_t logits = 4LL * 4096 * 25600;
  const Bytes tp_total(4 * 62 * kSbh + kSbh + 4 * kSbh + logits);      // 1,480,589,312
  const Bytes sp_total(4 * 57 * kSbh + kSbh / 2 + 2 * kSbh + logits);  // 1,386,217,472
  CHECK(tp_total == Bytes(1'480'589'312));
  CHECK(sp_total == Bytes(1'386'217'472));
  CHECK(activations(full_plan(cases()[0]).forward) == tp_total);
  CHECK(activations(full_plan(cases()[1]).forward) == sp_total);
  for (const auto& c : cases()) {
    for (int k : {1, 2, 4}) {
      CAPTURE(std::string(c.name));
      CAPTURE(k);
      const StagePlan full = full_plan(c);
      const StagePlan plan = overlapped(c, k);
      CHECK(activations(plan.forward) == activations(full.forward));
      CHECK(activations(plan.backward) == activations(full.backward));
      Bytes checkpoints, full_checkpoints, fetched, full_fetched;
      for (const auto* pass : {&plan.forward, &plan.backward}) {
        for (const auto& s : *pass) {
          checkpoints += s.checkpoint_delta;
          fetched += s.checkpoint_fetch;
        }
      }
      for (const auto* pass : {&full.forward, &full.backward}) {
        for (const auto& s : *pass) {
          full_checkpoints += s.checkpoint_delta;
          full_fetched += s.checkpoint_fetch;
        }
      }
      CHECK(checkpoints == full_checkpoints);  // stored in forward, released in backward: 0
      CHECK(fetched == full_fetched);
    }
  }
  // Full recomputation in groups of 2 over layers 0-1 with sp: one checkpoint of sbh/t bytes
  // (2-byte dtype), N bytes; each sub-batch's copy stores a k-th of it.
  const StagePlan two = overlapped(cases()[3], 2);
  Bytes stored;
  for (const auto& s : two.forward) stored += s.checkpoint_delta;
  CHECK(stored == Bytes(kSbh));
  for (const auto& s : of_chain(two.forward, 1)) {
    if (s.checkpoint_delta.count() != 0) CHECK(s.checkpoint_delta == Bytes(kSbh / 2));
  }
}

TEST_CASE("collectives carry a k-th of the full microbatch's bytes") {
  // All-reduce / reduce-scatter / all-gather of [s, b, h] (b s h e bytes), the loss all-reduce
  // of 3 fp32 per token: all linear in b.
  for (const auto& c : cases()) {
    for (int k : {2, 4}) {
      CAPTURE(std::string(c.name));
      CAPTURE(k);
      const StagePlan full = full_plan(c);
      const StagePlan plan = overlapped(c, k);
      for (std::size_t p = 0; p < 3; ++p) {
        const auto& whole = *passes(full)[p].second;
        for (int j = 0; j < k; ++j) {
          const auto chain = of_chain(*passes(plan)[p].second, j);
          REQUIRE(chain.size() == whole.size());
          for (std::size_t i = 0; i < whole.size(); ++i) {
            if (whole[i].compute) continue;
            CHECK(whole[i].bytes.count() % k == 0);
            CHECK(chain[i].bytes == Bytes(whole[i].bytes.count() / k));
            CHECK(chain[i].collective == whole[i].collective);
          }
        }
      }
    }
  }
}

TEST_CASE("the sub-batches' kernels do the full microbatch's matrix FLOPs") {
  // Every GEMM has the token dimension b s as m (forward, dgrad) or k (wgrad): 2 m n k is
  // linear in b. The unfused attention's batched GEMMs have batch b a/t, the fused kernel
  // batch b: linear too. So per kernel name the k copies sum exactly to the full plan's (the
  // FLOPs are integers well below 2^53, so the double sums are exact).
  for (const auto& c : cases()) {
    for (int k : {2, 4}) {
      CAPTURE(std::string(c.name));
      CAPTURE(k);
      const StagePlan full = full_plan(c);
      const StagePlan plan = overlapped(c, k);
      for (std::size_t p = 0; p < 3; ++p) {
        const auto expected = flops_by_kernel(*passes(full)[p].second);
        const auto actual = flops_by_kernel(*passes(plan)[p].second);
        CHECK(actual == expected);
      }
    }
  }
  // A hand check: layer 1's fc1 on the middle stage, tp = 2: 2 * (b s) * (4h/t) * h =
  // 2 * 4096 * 2048 * 1024; qkv 2 * 4096 * 1536 * 1024.
  const auto flops = flops_by_kernel(overlapped(cases()[2], 4).forward);
  CHECK(flops.at("fc1") == 2 * 2.0 * 4096 * 2048 * 1024);  // two layers (1 and 2)
  CHECK(flops.at("qkv") == 2 * 2.0 * 4096 * 1536 * 1024);
  // Fused attention: 4 b (a/t) s^2 d per layer.
  CHECK(flops.at("attention") == 2 * 4.0 * 4 * 8 * 1024 * 1024 * 64);
}

TEST_CASE("sub-pipelining rejects a split that does not divide the microbatch") {
  const auto model = gpt(16, 1024, 4);
  const auto split = [&](std::int64_t micro_batch, int k) {
    LayerSetting s = setting(2, false);
    s.micro_batch = micro_batch;
    return plan_transformer_stage_sub_pipelined(model, s, 0, 1, 0, 4, {}, k);
  };
  CHECK_THROWS_WITH_AS(split(4, 3),
                       doctest::Contains("tp_overlap = 3 must be >= 1 and divide the micro batch "
                                         "(4 samples)"),
                       std::invalid_argument);
  CHECK_THROWS_AS(split(2, 4), std::invalid_argument);
  CHECK_THROWS_AS(split(4, 0), std::invalid_argument);
  CHECK_THROWS_AS(split(4, -2), std::invalid_argument);
  CHECK_NOTHROW(split(4, 4));
  CHECK_THROWS_WITH_AS(sub_pipeline(full_plan(cases()[0]), 0),
                       doctest::Contains("tp_overlap must be >= 1"), std::invalid_argument);
  // A plan already split into chains is not split again.
  StagePlan chained = full_plan(cases()[0]);
  chained.forward[1].chain = 1;
  CHECK_THROWS_WITH_AS(sub_pipeline(chained, 2), doctest::Contains("already on chain 1"),
                       std::invalid_argument);
}

// ---- Transformer Engine's userbuffers overlap (Megatron --tp-comm-overlap): tp_comm_overlap().

namespace {

// A middle stage of one layer of a GPT with h = 1024, 16 heads, tp 8 with sequence parallelism
// (no embedding or head: only the layer's collectives).
StagePlan sp_layer(bool recompute_full = false) {
  StageRecompute r;
  if (recompute_full) r = {false, 1, 1};
  return plan_transformer_stage(gpt(16, 1024, 3), setting(8, true), 1, 3, 1, 2, r);
}

std::string base_name(const std::string& name) {
  return name.substr(0, name.find(" ["));
}

bool tp_collective_of(const Segment& s, CollectiveKind kind) {
  return !s.compute && !s.ring_step && s.collective == kind && s.sms == 16;
}

}  // namespace

TEST_CASE("tp comm overlap: every sp gather and reduce-scatter beside its GEMM, as TE does") {
  for (bool recompute : {false, true}) {
    CAPTURE(recompute);
    const StagePlan plain = sp_layer(recompute);
    const StagePlan plan = tp_comm_overlap(plain, 8);
    for (std::size_t p = 0; p < 3; ++p) {
      CAPTURE(std::string(passes(plan)[p].first));
      const auto& before = *passes(plain)[p].second;
      const auto& after = *passes(plan)[p].second;
      // The same work: FLOPs per kernel, activations, gradients.
      std::map<std::string, double> flops_before, flops_after;
      for (const auto& s : before) {
        for (const auto& k : s.kernels) flops_before[k.name] += matmul_flops(k).count();
      }
      for (const auto& s : after) {
        for (const auto& k : s.kernels) flops_after[base_name(k.name)] += matmul_flops(k).count();
      }
      CHECK(flops_after.size() == flops_before.size());
      for (const auto& [name, f] : flops_before) {
        CAPTURE(name);
        CHECK(flops_after[name] == doctest::Approx(f));
      }
      std::vector<int> grads_before, grads_after;
      for (const auto& s : before) {
        grads_before.insert(grads_before.end(), s.grads_done.begin(), s.grads_done.end());
      }
      for (const auto& s : after) {
        grads_after.insert(grads_after.end(), s.grads_done.begin(), s.grads_done.end());
      }
      CHECK(grads_after == grads_before);
      CHECK(activations(after) == activations(before));
      // TE's methods (base.py's default configs): the layer's sp collectives are all of
      // s b h x 2 = 1024 x 4 x 1024 x 2 = 8 MiB. Per layer, forward: 2 gathers by ring exchange
      // (7 steps of one shard, S / 8, point-to-point over the copy engines: 0 SMs) and 2
      // reduce-scatters by pipeline (4 chunks of S / 4 on 16 SMs). Backward: 2 output-gradient
      // gathers by ring exchange, and per column-parallel GEMM (qkv, fc1) the input regather
      // and the dgrad's reduce-scatter whole by bulk overlap (16 SMs); with full recomputation
      // the forward's again.
      const std::int64_t S = 1024 * 4 * 1024 * 2;
      std::size_t gathers_before = 0, reductions_before = 0;
      for (const auto& s : before) {
        if (s.compute) continue;
        (s.collective == CollectiveKind::all_gather ? gathers_before : reductions_before) += 1;
      }
      std::size_t steps = 0, chunks = 0, bulk_gathers = 0, bulk_reductions = 0, other = 0;
      for (const auto& s : after) {
        if (s.compute) continue;
        if (s.ring_step) {
          ++steps;
          CHECK(s.bytes == Bytes(S / 8));
          CHECK(s.sms == 0);
        } else if (s.label.find("[bulk]") != std::string::npos) {
          (s.collective == CollectiveKind::all_gather ? bulk_gathers : bulk_reductions) += 1;
          CHECK(s.bytes == Bytes(S));
          CHECK(s.sms == 16);
        } else if (s.collective == CollectiveKind::reduce_scatter &&
                   s.label.find("[chunk") != std::string::npos) {
          ++chunks;
          CHECK(s.bytes == Bytes(S / 4));
          CHECK(s.sms == 16);
        } else {
          ++other;
        }
      }
      const std::size_t bulk = p == 1 ? 2u : 0u;  // per layer, in backward: qkv and fc1
      CHECK(other == 0);
      CHECK(bulk_gathers == bulk);
      CHECK(bulk_reductions == bulk);
      CHECK(steps == 7 * (gathers_before - bulk));
      CHECK(chunks == 4 * (reductions_before - bulk));
      // What follows the last chunk (on chain 0) is the rest of the pass, on chain 0.
      if (!after.empty()) CHECK(after.back().chain == 0);
    }
  }
}

TEST_CASE("tp comm overlap: the forward of an sp layer, piece by piece") {
  const StagePlan plan = tp_comm_overlap(sp_layer(), 8);
  const auto& f = plan.forward;
  // ln1 | qkv chunk 0, then 7 x (ring step, qkv chunk) | core | 4 x (proj chunk, reduce-scatter
  // chunk) | residual + ln2 | fc1 chunk 0, 7 x (step, chunk) | gelu | 4 x (fc2 chunk, rs chunk)
  // | residual.
  REQUIRE(f.size() == 1 + 15 + 1 + 8 + 1 + 15 + 1 + 8 + 1);
  CHECK(f[0].label == "L1 ln1");
  // Chunk 0, the rank's own shard, on chain 8 (no step); step j brings shard j for chunk j,
  // on the same chain: step 1 and chunk 1 on chain 0 (after ln1), step and chunk j >= 2 on
  // chain j.
  CHECK(f[1].chain == 8);
  CHECK(f[1].kernels.at(0).name == "qkv [chunk 0]");
  for (int j = 1; j < 8; ++j) {
    CAPTURE(j);
    const Segment& step = f[static_cast<std::size_t>(2 * j)];
    const Segment& qkv = f[static_cast<std::size_t>(2 * j + 1)];
    CHECK(step.ring_step);
    CHECK_FALSE(step.compute);
    CHECK(step.chain == (j == 1 ? 0 : j));
    CHECK(qkv.chain == step.chain);
    REQUIRE(qkv.kernels.size() == 1);
    // m: the b s = 4096 tokens of the microbatch, 512 per chunk.
    CHECK(std::get<Gemm>(qkv.kernels[0].work).m == 512);
  }
  CHECK(f[16].chain == 0);  // the attention core between the chunks
  CHECK(f[16].kernels.front().name == "attention.qk");
  // TE's pipeline: 4 chunks of 1024 tokens, chunk j's reduce-scatter on chain 3 - j.
  for (int j = 0; j < 4; ++j) {
    CAPTURE(j);
    const Segment& proj = f[static_cast<std::size_t>(17 + 2 * j)];
    const Segment& rs = f[static_cast<std::size_t>(18 + 2 * j)];
    CHECK(proj.kernels.at(0).name == "proj [chunk " + std::to_string(j) + "]");
    CHECK(std::get<Gemm>(proj.kernels[0].work).m == 1024);
    CHECK(proj.chain == 3 - j);
    CHECK(rs.collective == CollectiveKind::reduce_scatter);
    CHECK(rs.chain == 3 - j);
  }
  // The attention block's activations are stored when its last GEMM chunk ends.
  CHECK(f[23].activation_delta == sp_layer().forward[2].activation_delta);
  CHECK(tp_comm_overlap(sp_layer(), 1).forward.size() == sp_layer().forward.size());
  CHECK_THROWS_AS(tp_comm_overlap(sp_layer(), 0), std::invalid_argument);
  CHECK_THROWS_AS(tp_comm_overlap(sub_pipeline(sp_layer(), 2), 8), std::invalid_argument);
}

TEST_CASE("tp comm overlap: TE's bulk overlaps in the backward of an sp layer") {
  const StagePlan plain = sp_layer();
  const StagePlan plan = tp_comm_overlap(plain, 8);
  const auto& b = plan.backward;
  // fc1 (as qkv): ... | regather [bulk] (chain 0) | fc1.dgrad (chain 9) | fc1 wgrad (chain 0)
  // | reduce-scatter [bulk] (chain 9) | join (chain 9) | ln2 bwd (chain 0).
  for (const std::string gemm : {"fc1", "qkv"}) {
    CAPTURE(gemm);
    std::size_t d = 0;
    while (d < b.size() && !(b[d].kernels.size() == 1 && b[d].kernels[0].name == gemm + ".dgrad")) {
      ++d;
    }
    REQUIRE(d + 3 < b.size());
    REQUIRE(d >= 1);
    const Segment& regather = b[d - 1];
    CHECK(tp_collective_of(regather, CollectiveKind::all_gather));
    CHECK(regather.label.find("input regather") != std::string::npos);
    CHECK(regather.chain == 0);
    CHECK(b[d].chain == 9);
    CHECK(b[d + 1].kernels.at(0).name == gemm + ".wgrad");
    CHECK(b[d + 1].chain == 0);
    CHECK(tp_collective_of(b[d + 2], CollectiveKind::reduce_scatter));
    CHECK(b[d + 2].chain == 9);
    CHECK(b[d + 3].compute);
    CHECK(b[d + 3].kernels.empty());
    CHECK(b[d + 3].chain == 9);
    CHECK(b[d + 4].chain == 0);
  }
  // The output gradient's gathers (fc2_dgrad, proj_dgrad): ring exchanges.
  std::size_t steps = 0;
  for (const auto& s : b) steps += s.ring_step ? 1 : 0;
  CHECK(steps == 14);
}
