// Activation recomputation: what the lowered program stores and recomputes for none, full
// (uniform and block), selective and stage-aware recomputation. Expected values come from the
// published reference (korthikanti-activation-formulas) or from hand formulas in the comments.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "experiment_helpers.hpp"
#include "strategies/lowering.hpp"
#include "strategies/recompute.hpp"
#include "strategies/transformer.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// The layers that rank 0's compute and tensor-parallel ops of microbatch 0's backward pass
// touch, in issue order: "R2" for a recompute op covering layer 2, "B2" for a backward op (an op
// covering several layers runs them in its pass's order: backward from the last); repeats of
// the same token in a row are written once.
std::string backward_walk(const Program& p) {
  std::string walk, last;
  const auto visit = [&](const std::string& token) {
    if (token == last) return;
    walk += (walk.empty() ? "" : " ") + token;
    last = token;
  };
  for (const auto& op : p.ops_of(0)) {
    if (op.microbatch != 0 || op.layer_begin < 0) continue;
    if (op.phase == Phase::recompute) {
      for (int l = op.layer_begin; l < op.layer_end; ++l) visit("R" + std::to_string(l));
    } else if (op.phase == Phase::backward) {
      for (int l = op.layer_end - 1; l >= op.layer_begin; --l) visit("B" + std::to_string(l));
    }
  }
  return walk;
}

// Running activation total of rank 0 over its ops: lowest and final value.
std::pair<std::int64_t, std::int64_t> activation_walk(const Program& p) {
  std::int64_t held = 0, lowest = 0;
  for (const auto& op : p.ops_of(0)) {
    for (const auto& effect : p.effects_of(op)) {
      if (effect.category != MemoryCategory::activations) continue;
      held += effect.delta.count();
      lowest = std::min(lowest, held);
    }
  }
  return {lowest, held};
}

// 4 layers, 2 microbatches per pipeline.
Experiment small(int tp, int pp, RecomputeKind kind,
                 RecomputeMethod method = RecomputeMethod::uniform, int num_layers = 1,
                 int dp = 1) {
  auto e = make_experiment(gpt(16, 1024, 4), tp, pp, dp, 2 * dp, 1, 1024);
  e.parallelism.recompute = kind;
  e.parallelism.recompute_method = method;
  e.parallelism.recompute_num_layers = num_layers;
  return e;
}

}  // namespace

TEST_CASE("the lowered program stores Korthikanti's activations per layer in all six settings") {
  // korthikanti-activation-formulas, worked_values_derived for the four Table 3 models: none
  // sbh(34 + 5as/h), tp sbh(10 + 24/t + 5as/(ht)), tp+sp sbh(34/t + 5as/(ht)), tp+selective
  // sbh(10 + 24/t), tp+sp+selective 34sbh/t, full 2sbh. One stage, one microbatch: the forward
  // pass allocates L times that plus the embedding and head extras (p = 1), which the hand
  // formula of activations_test.cpp gives: with sp sbh/t (1 + 4(1 + v/h)) (embedding dropout
  // mask, final norm input and output, fp32 logits), else 5sbh + 4sbv/t.
  auto ref = reference_case("korthikanti-activation-formulas");
  struct Setting {
    const char* name;
    bool tp, sp;
    RecomputeKind recompute;
  };
  const Setting settings[] = {{"none", false, false, RecomputeKind::none},
                              {"tp", true, false, RecomputeKind::none},
                              {"tp_sp", true, true, RecomputeKind::none},
                              {"tp_sel", true, false, RecomputeKind::selective},
                              {"tp_sp_sel", true, true, RecomputeKind::selective},
                              {"full", true, false, RecomputeKind::full}};
  for (const auto& c : ref["inputs"]["configs_table3"]) {
    const std::string model_name = c["name"];
    const int heads = c["heads"], hidden = c["hidden"], layers = c["layers"], b = c["microbatch"];
    const int seq = c["seq"], vocab = c["vocab"];
    for (const auto& set : settings) {
      CAPTURE(model_name);
      CAPTURE(set.name);
      const int t = set.tp ? c["tp"].get<int>() : 1;
      auto e = make_experiment(gpt(heads, hidden, layers), t, 1, 1, b, b, seq, set.sp);
      e.parallelism.recompute = set.recompute;  // full: uniform, one layer per checkpoint
      const double s = seq, h = hidden, v = vocab, bb = b, tt = t;
      const double extra =
          set.sp ? s * bb * h / tt * (1 + 4 * (1 + v / h)) : 5 * s * bb * h + 4 * s * bb * v / tt;
      const double per_layer = (forward_activations(lower(e)) - extra) / layers;
      CHECK(
          per_layer ==
          doctest::Approx(
              ref["expected"]["worked_values_derived"][model_name][set.name]["bytes"].get<double>())
              .epsilon(0.01));
    }
  }
}

TEST_CASE("full recomputation runs each group's forward again right before its backward") {
  // 4 layers on one stage, tp 2: uniform groups of 2 layers recompute layers 2-3 before the
  // backward of layer 3 and layers 0-1 before that of layer 1; block with 1 layer recomputes
  // layer 0 only, right before its backward.
  auto uniform = lower(small(2, 1, RecomputeKind::full, RecomputeMethod::uniform, 2));
  validate(uniform);
  CHECK(backward_walk(uniform) == "R2 R3 B3 B2 R0 R1 B1 B0");
  auto block = lower(small(2, 1, RecomputeKind::full, RecomputeMethod::block, 1));
  CHECK(backward_walk(block) == "B3 B2 B1 R0 B0");
  auto none = lower(small(2, 1, RecomputeKind::none));
  CHECK(backward_walk(none) == "B3 B2 B1 B0");

  // The recomputed forward repeats the forward's tensor-parallel all-reduces (two per layer)
  // and GEMMs; it has no backward work.
  int recompute_all_reduces = 0, forward_all_reduces = 0;
  for (const auto& op : uniform.ops_of(0)) {
    if (op.microbatch != 0) continue;
    const auto* c = std::get_if<Collective>(&op.work);
    if (c && op.layer_begin >= 0 && op.phase == Phase::recompute) ++recompute_all_reduces;
    if (c && op.layer_begin >= 0 && op.phase == Phase::forward) ++forward_all_reduces;
    if (op.phase != Phase::recompute) continue;
    if (const auto* k = std::get_if<Compute>(&op.work)) {
      for (const auto& kernel : uniform.kernels_of(*k))
        CHECK(kernel.name.find("grad") == std::string::npos);
    }
  }
  CHECK(forward_all_reduces == 2 * 4);
  CHECK(recompute_all_reduces == 2 * 4);
}

TEST_CASE("recomputation keeps memory balanced and gradients complete in the same order") {
  for (auto kind : {RecomputeKind::none, RecomputeKind::full, RecomputeKind::selective,
                    RecomputeKind::stage_aware}) {
    for (auto method : {RecomputeMethod::uniform, RecomputeMethod::block}) {
      for (int tp : {1, 2}) {
        for (int variant : {0, 1, 2}) {  // plain, sequence parallel, ZeRO-3 (one op per layer)
          CAPTURE(name_of(kind));
          CAPTURE(static_cast<int>(method));
          CAPTURE(tp);
          CAPTURE(variant);
          auto e = small(tp, 2, kind, method, 2, variant == 2 ? 2 : 1);
          e.parallelism.sequence_parallel = variant == 1;
          if (variant == 2) e.parallelism.zero = 3;
          auto p = lower(e);
          validate(p);
          // Every allocation is released, and nothing is released before it is allocated.
          auto [lowest, left] = activation_walk(p);
          CHECK(lowest == 0);
          CHECK(left == 0);
          // Each gradient unit completes once, in the order of the plan without recomputation.
          auto spec = pipeline_spec(e);
          auto base = e;
          base.parallelism.recompute = RecomputeKind::none;
          auto base_spec = pipeline_spec(base);
          for (std::size_t s = 0; s < spec.stages.size(); ++s) {
            std::vector<int> done, base_done;
            for (const auto& seg : spec.stages[s].backward)
              done.insert(done.end(), seg.grads_done.begin(), seg.grads_done.end());
            for (const auto& seg : base_spec.stages[s].backward)
              base_done.insert(base_done.end(), seg.grads_done.begin(), seg.grads_done.end());
            CHECK(done == base_done);
            CHECK(done.size() == spec.stages[s].grad_units.size());
          }
        }
      }
    }
  }
}

TEST_CASE("selective recomputation recomputes each layer's attention core before its backward") {
  // Per layer and microbatch the core stores 5as^2b/t bytes (softmax output 2, dropout mask 1,
  // dropout output 2 bytes per score), which the recompute op allocates again.
  const double a = 16, s = 1024, b = 1, t = 2;
  auto p = lower(small(2, 1, RecomputeKind::selective));
  int recompute_ops = 0;
  std::set<int> layers;
  for (const auto& op : p.ops_of(0)) {
    if (op.phase != Phase::recompute) continue;
    ++recompute_ops;
    layers.insert(op.layer_begin);
    REQUIRE(std::holds_alternative<Compute>(op.work));
    std::set<std::string> names;
    for (const auto& k : p.kernels_of(std::get<Compute>(op.work))) names.insert(k.name);
    CHECK(names == std::set<std::string>{"attention.qk", "attention.softmax", "attention.dropout",
                                         "attention.pv"});
    std::int64_t allocated = 0;
    for (const auto& effect : p.effects_of(op)) allocated += effect.delta.count();
    CHECK(static_cast<double>(allocated) == doctest::Approx(5 * a * s * s * b / t));
  }
  CHECK(recompute_ops == 4 * 2);  // 4 layers, 2 microbatches
  CHECK(layers == std::set<int>{0, 1, 2, 3});
  CHECK(backward_walk(p) == "B3 R3 B3 B2 R2 B2 B1 R1 B1 B0 R0 B0");
}

TEST_CASE("with flash attention selective recomputation changes nothing") {
  auto none = small(1, 2, RecomputeKind::none);
  none.training.flash_attention = true;
  auto selective = none;
  selective.parallelism.recompute = RecomputeKind::selective;
  auto a = lower(none), b = lower(selective);
  REQUIRE(a.op_count() == b.op_count());
  for (OpId i = 0; i < a.op_count(); ++i) {
    CHECK(a.op(i).phase == b.op(i).phase);
    CHECK(a.effects_of(a.op(i)).size() == b.effects_of(b.op(i)).size());
  }
  CHECK(forward_activations(a) == forward_activations(b));
}

TEST_CASE("recompute_plan follows Megatron's uniform and block methods") {
  // 10 layers on 3 stages: 4, 3, 3 layers.
  auto e = make_experiment(gpt(16, 1024, 10), 1, 3, 1, 8, 1, 1024);
  e.parallelism.recompute = RecomputeKind::full;
  e.parallelism.recompute_num_layers = 2;
  auto uniform = recompute_plan(e);
  REQUIRE(uniform.size() == 3);
  CHECK(uniform[0] == StageRecompute{false, 4, 2});
  CHECK(uniform[1] == StageRecompute{false, 3, 2});
  e.parallelism.recompute_method = RecomputeMethod::block;
  e.parallelism.recompute_num_layers = 4;
  auto block = recompute_plan(e);
  CHECK(block[0] == StageRecompute{false, 4, 1});
  CHECK(block[2] == StageRecompute{false, 3, 1});
  e.parallelism.recompute = RecomputeKind::selective;
  CHECK(recompute_plan(e)[1] == StageRecompute{true, 0, 1});
  e.parallelism.recompute = RecomputeKind::none;
  CHECK(recompute_plan(e)[1] == StageRecompute{});
}

TEST_CASE("stage-aware recomputation recomputes fewer layers on later stages") {
  // GPT-3 175B on 1,024 A100 80 GB (tp 8, pp 16, dp 8, 1F1B, 192 microbatches), micro batch 4:
  // without recomputation stage 0 holds 16 microbatches of 6 layers,
  // 16 * 6 * sbh(10 + 24/t + 5as/(ht)) = 16 * 6 * 4 * 552 MiB = 207 GiB, far beyond 80 GB;
  // the last stage holds one microbatch (13 GiB of layers and head) and needs none.
  auto e = load_experiment(
      configs_dir() / "experiments/gpt3-175b-a100-1024.json",
      {{"parallelism.recompute", "stage_aware", "test"}, {"parallelism.micro_batch", 4, "test"}});
  const auto plan = recompute_plan(e);
  REQUIRE(plan.size() == 16);
  auto none = e;
  none.parallelism.recompute = RecomputeKind::none;
  const Bytes capacity = e.cluster.device.memory_capacity;
  CHECK(estimated_stage_peak(none, 0, {}) > capacity);
  int recomputed = 0;
  for (int s = 0; s < 16; ++s) {
    CAPTURE(s);
    const auto& r = plan[static_cast<std::size_t>(s)];
    CHECK_FALSE(r.selective);
    CHECK(r.group == 1);
    if (s > 0)
      CHECK(r.recomputed_layers <= plan[static_cast<std::size_t>(s - 1)].recomputed_layers);
    CHECK(estimated_stage_peak(e, s, r) <= capacity);
    if (r.recomputed_layers > 0) {  // the fewest that fit
      StageRecompute fewer = r;
      --fewer.recomputed_layers;
      CHECK(estimated_stage_peak(e, s, fewer) > capacity);
    }
    recomputed += r.recomputed_layers;
  }
  CHECK(plan.front().recomputed_layers > 0);
  CHECK(plan.back().recomputed_layers == 0);
  CHECK(recomputed < 96);
}

TEST_CASE("the stage peak estimate counts in-flight microbatches, checkpoints and one recompute") {
  // reserved + fragmentation * (states + activations), as the simulator accounts memory.
  // Stage 1 of 2 (the last) of the 4-layer model, tp 1, s = 1024, b = 1, h = 1024, a = 16,
  // v = 51200: 1F1B holds min(p - 1, m) = 1 microbatch, GPipe m = 2. A layer stores
  // sbh(34 + 5as/h) = 114 sbh, the head 4sbh + 4sbv = 204 sbh, a checkpoint 2sbh. With both
  // layers recomputed one microbatch stores 2 * 2 + 204 = 208 sbh, and the backward adds a
  // recomputed layer (114 sbh) once the head's 204 sbh are released, so 208 sbh is the most.
  auto e = small(1, 2, RecomputeKind::none);
  e.memory.fragmentation = 1.5;
  e.memory.reserved = Bytes(1000);
  const double sbh = 1024.0 * 1024;
  const auto states = [](int, std::int64_t parameters) { return Bytes(parameters * 10); };
  const auto params = pipeline_spec(e).stages[1].parameters;
  const auto peak = [&](double activations) {
    return 1000 + 1.5 * (static_cast<double>(params * 10) + activations * sbh);
  };
  CHECK(static_cast<double>(estimated_stage_peak(e, 1, {}, states).count()) ==
        doctest::Approx(peak(2 * 114 + 204)));
  CHECK(static_cast<double>(estimated_stage_peak(e, 1, {false, 2, 1}, states).count()) ==
        doctest::Approx(peak(2 * 2 + 204)));
  e.parallelism.schedule = ScheduleKind::gpipe;
  CHECK(static_cast<double>(estimated_stage_peak(e, 1, {false, 2, 1}, states).count()) ==
        doctest::Approx(peak(2 * (2 * 2 + 204))));
  // Stage 0 under GPipe: 2 microbatches of 2 checkpoints and the embedding dropout mask (1 sbh
  // in bytes: 1 byte per element), plus one recomputed layer.
  CHECK(static_cast<double>(estimated_stage_peak(e, 0, {false, 2, 1}, states).count()) ==
        doctest::Approx(1000 +
                        1.5 * (static_cast<double>(pipeline_spec(e).stages[0].parameters * 10) +
                               (2 * (2 * 2 + 1) + 114) * sbh)));
  CHECK(microbatches_in_flight(ScheduleKind::one_f_one_b, 4, 0, 8) == 4);
  CHECK(microbatches_in_flight(ScheduleKind::one_f_one_b, 4, 3, 8) == 1);
  CHECK(microbatches_in_flight(ScheduleKind::one_f_one_b, 4, 0, 2) == 2);
  CHECK(microbatches_in_flight(ScheduleKind::gpipe, 4, 3, 8) == 8);
}

TEST_CASE("recompute_num_layers beyond a stage's layers is an error at that key") {
  // GPT-3 175B on 16 stages: 6 layers per stage.
  try {
    load_experiment(configs_dir() / "experiments/gpt3-175b-a100-1024.json",
                    {{"parallelism.recompute", "full", "command line (--recompute full)"},
                     {"parallelism.recompute_num_layers", 7, "command line (--set)"}});
    FAIL("expected a ConfigError");
  } catch (const config::ConfigError& error) {
    CHECK(error.path() == "parallelism.recompute_num_layers");
    CHECK(error.message().find("(6), got 7") != std::string::npos);
  }
  CHECK_NOTHROW(load_experiment(configs_dir() / "experiments/gpt3-175b-a100-1024.json",
                                {{"parallelism.recompute", "full", "test"},
                                 {"parallelism.recompute_num_layers", 6, "test"}}));
}

TEST_CASE("stage-aware recomputation counts the memory ZeRO frees") {
  // GPT-3 175B on 1,024 A100s, micro batch 4: without ZeRO a stage-0 rank holds 16 bytes per
  // parameter of model state; ZeRO-1 over dp = 8 keeps 2 + 2 + 12/8, about 14 GB less for its
  // 1.36 B parameters, so the stage-aware plan needs to recompute fewer layers on every stage
  // (and strictly fewer in all).
  auto count = [](int zero) {
    auto e = load_experiment(configs_dir() / "experiments/gpt3-175b-a100-1024.json",
                             {cli("parallelism.micro_batch", 4), cli("parallelism.zero", zero),
                              cli("parallelism.recompute", "stage_aware")});
    std::vector<int> recomputed;
    for (const auto& stage : pipeline_spec(e).stages) {
      std::set<int> layers;
      for (const auto& s : stage.backward) {
        if (s.recompute && s.layer_begin >= 0) layers.insert(s.layer_begin);
      }
      recomputed.push_back(static_cast<int>(layers.size()));
    }
    return recomputed;
  };
  const auto plain = count(0), zero1 = count(1);
  int total_plain = 0, total_zero1 = 0;
  for (std::size_t s = 0; s < plain.size(); ++s) {
    CAPTURE(s);
    CHECK(zero1[s] <= plain[s]);
    total_plain += plain[s];
    total_zero1 += zero1[s];
  }
  MESSAGE("recomputed layers without ZeRO: " << total_plain << ", with ZeRO-1: " << total_zero1);
  CHECK(total_zero1 < total_plain);
}
