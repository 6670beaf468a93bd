// ZeRO (Rajbhandari et al., SC 2020) through the whole path: model-state memory per device
// and per-process communication volume read from the lowered program, and the simulated
// throughput of ZeRO-3 as the data-parallel degree grows at a fixed global batch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// A small hand-written stage of `parameters` parameters in one unit and one measured op per
// pass, on a free network: only the model states matter.
PipelineSpec one_unit_spec(std::int64_t parameters, int dp, int stage, DType dtype) {
  PipelineSpec spec;
  spec.layout = RankLayout{1, dp, 1};
  spec.dtype = dtype;
  spec.zero.stage = stage;
  StagePlan plan;
  Segment f, b;
  f.kernels = {Kernel{Measured{Time::us(10)}, "forward"}};
  f.label = "forward";
  b.kernels = {Kernel{Measured{Time::us(20)}, "backward"}};
  b.label = "backward";
  b.grads_done = {0};
  plan.forward = {f};
  plan.backward = {b};
  plan.grad_units = {GradUnit{"model", parameters}};
  plan.parameters = parameters;
  spec.stages = {plan};
  return spec;
}

// Per-process communication volume in elements of the data-parallel collectives of one rank,
// with nccl-tests sizes S (bytes): an all-reduce moves 2(n-1)/n S, a reduce-scatter or
// all-gather (n-1)/n S; the (n-1)/n factor is removed as the paper does.
struct Volume {
  std::int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  std::int64_t total() const { return all_reduce + reduce_scatter + all_gather; }
};

Volume dp_volume(const Program& p, int rank, std::int64_t element_bytes) {
  Volume v;
  for (const auto& op : p.ops_of(rank)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (!c || !p.groups()[c->group].name.starts_with("dp")) continue;
    const std::int64_t elements = c->bytes.count() / element_bytes;
    if (c->kind == CollectiveKind::all_reduce) v.all_reduce += 2 * elements;
    if (c->kind == CollectiveKind::reduce_scatter) v.reduce_scatter += elements;
    if (c->kind == CollectiveKind::all_gather) v.all_gather += elements;
  }
  return v;
}

Experiment with_zero(Experiment e, int stage) {
  e.parallelism.zero = stage;
  return e;
}

}  // namespace

TEST_CASE("zero-model-state-bytes: 16 bytes per parameter, 24 GB for GPT-2 1.5B without ZeRO") {
  auto ref = reference_case("zero-model-state-bytes");
  const auto psi = static_cast<std::int64_t>(ref["inputs"]["psi_params"].get<double>());
  const auto& breakdown = ref["expected"]["breakdown_bytes_per_param"];
  // Mixed-precision Adam with fp16 gradient buffers (ZeRO's setting; strategies/optimizer.hpp).
  const ModelStateFormat fp16{DType::fp16, DType::fp16, OptimizerKind::adam, false, {}, 2};
  const StateBytes bytes = state_bytes_per_parameter(fp16);
  const std::int64_t optimizer = optimizer_state_bytes(fp16, 1).count();
  CHECK(bytes.parameters == breakdown["fp16_params"].get<std::int64_t>());
  CHECK(bytes.gradients == breakdown["fp16_grads"].get<std::int64_t>());
  CHECK(optimizer == breakdown["fp32_master_params"].get<std::int64_t>() +
                         breakdown["fp32_momentum"].get<std::int64_t>() +
                         breakdown["fp32_variance"].get<std::int64_t>());
  CHECK(bytes.parameters + bytes.gradients + optimizer ==
        ref["expected"]["bytes_per_param_total"].get<std::int64_t>());

  auto program = assemble_pipeline(one_unit_spec(psi, 1, 0, DType::fp16));
  validate(program);
  // GB = 1e9 bytes: 16 * 1.5e9 = 24e9 in all, of which the fp16 weights are 2 * 1.5e9 = 3e9.
  CHECK(static_cast<double>(model_state_bytes(program, 0)) ==
        ref["expected"]["gpt2_1p5B_model_state_GB"].get<double>() * 1e9);
  CHECK(static_cast<double>(initial_bytes(program, 0, MemoryCategory::parameters)) ==
        ref["expected"]["gpt2_1p5B_fp16_weights_GB"].get<double>() * 1e9);
  Experiment e;
  e.cluster = test_cluster(1, 1);
  simulate_checked(e, program);
}

TEST_CASE("zero-fig1-7p5B-nd64: model states per device for ZeRO stages 0-3 (GPT-3 7.5B)") {
  // Rajbhandari et al. Fig. 1 with Psi = 7.5B, K = 12, Nd = 64: baseline (2 + 2 + K) Psi,
  // P_os 2 Psi + 2 Psi + K Psi / Nd, P_os+g 2 Psi + (2 + K) Psi / Nd, P_os+g+p
  // (2 + 2 + K) Psi / Nd. Our gpt3-7.5b has Psi = 7.47e9 exactly (tp = pp = 1, dp = 64): the
  // program's per-device bytes must equal the formulas for that Psi (the shard rounds up to
  // whole parameters: below 1e-9 relative) and the paper's rounded GB within its 2%.
  auto ref = reference_case("zero-fig1-7p5B-nd64");
  const double tolerance = ref["tolerance_rel"];
  const int nd = ref["inputs"]["Nd_data_parallel"];
  const double k = ref["inputs"]["K"];
  const std::vector<double> paper_gb = {ref["expected"]["baseline_GB"], ref["expected"]["Pos_GB"],
                                        ref["expected"]["Pos_g_GB"], ref["expected"]["Pos_g_p_GB"]};
  auto model = load_model(configs_dir() / "models/gpt3-7.5b.json");
  const auto psi = static_cast<double>(model.parameters());
  CHECK(psi == doctest::Approx(ref["inputs"]["psi_params"].get<double>()).epsilon(0.005));
  const std::vector<double> formula = {(2 + 2 + k) * psi, 2 * psi + 2 * psi + k * psi / nd,
                                       2 * psi + (2 + k) * psi / nd, (2 + 2 + k) * psi / nd};
  auto base = make_experiment(model, 1, 1, nd, nd, 1, 2048);
  base.training.dtype = DType::fp16;
  base.training.flash_attention = true;
  base.cluster = shipped_cluster("dgx-a100-128", nd / 8);
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    const auto e = with_zero(base, stage);
    const auto program = lower_checked(e);
    for (int rank : {0, nd - 1}) {
      const auto bytes = static_cast<double>(model_state_bytes(program, rank));
      CHECK(bytes == doctest::Approx(formula[static_cast<std::size_t>(stage)]).epsilon(1e-9));
      CHECK(bytes / 1e9 ==
            doctest::Approx(paper_gb[static_cast<std::size_t>(stage)]).epsilon(tolerance));
    }
    MESSAGE("ZeRO stage " << stage << ": " << model_state_bytes(program, 0) / 1e9
                          << " GB of model states per device (paper "
                          << paper_gb[static_cast<std::size_t>(stage)] << ")");
    // 120 GB do not fit an 80 GB A100; every ZeRO stage does (with activations of one
    // 2048-token sample).
    const auto timeline = simulate_checked(e, program);
    CHECK(timeline.out_of_memory.empty() == (stage >= 1));
  }
}

TEST_CASE("zero-comm-volume: 2 Psi per process for stages 0-2, 3 Psi for stage 3") {
  // ZeRO Sec. 7: baseline DP all-reduces the gradients (2 Psi); P_os and P_os+g reduce-scatter
  // them (Psi) and all-gather the updated parameters (Psi); P_os+g+p also all-gathers the
  // parameters before the forward (Psi) and again before the backward (Psi): 3 Psi, 1.5x. One
  // microbatch per iteration, as in the paper (with m microbatches stage 3 gathers 2m times).
  auto ref = reference_case("zero-comm-volume");
  const double ratio = ref["expected"]["ratio_stage3_to_DP"];
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  struct Setup {
    int tp, pp, dp;
  };
  for (Setup s : {Setup{1, 1, 4}, Setup{2, 2, 2}}) {
    CAPTURE(s.tp);
    CAPTURE(s.pp);
    auto base = make_experiment(model, s.tp, s.pp, s.dp, s.dp, 1, 2048);
    base.parallelism.reduce_bucket_size = 40'000'000;  // several buckets of each kind
    base.parallelism.allgather_bucket_size = 30'000'000;
    std::map<int, std::int64_t> volume;
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(stage);
      const auto e = with_zero(base, stage);
      const auto program = lower_checked(e);
      simulate_checked(e, program);
      const auto layout = layout_of(e);
      for (int rank = 0; rank < layout.world_size(); ++rank) {
        // Psi: the parameters this rank's data-parallel group replicates (its stage's shard of
        // the tensor-parallel split).
        const std::int64_t psi =
            pipeline_spec(e).stages[static_cast<std::size_t>(layout.stage(rank))].parameters;
        const Volume v = dp_volume(program, rank, 2);
        if (stage == 0) {
          CHECK(v.all_reduce == 2 * psi);
          CHECK(v.total() == 2 * psi);
        } else if (stage < 3) {
          CHECK(v.reduce_scatter == psi);
          CHECK(v.all_gather == psi);
          CHECK(v.total() == 2 * psi);
        } else {
          CHECK(v.reduce_scatter == psi);
          CHECK(v.all_gather == 2 * psi);
          CHECK(v.total() == 3 * psi);
        }
        if (rank == 0) volume[stage] = v.total();
      }
    }
    CHECK(static_cast<double>(volume[3]) / static_cast<double>(volume[0]) == ratio);
    CHECK(volume[1] == volume[0]);
    CHECK(volume[2] == volume[0]);
  }
}

namespace {

// Most transformer layers' gathered parameters alive at once on `rank`: a layer is alive from
// the start of its all-gather to the end of the op that releases it (an op with a negative
// parameters effect of a layer's size); releases come first at equal times. (The embedding and
// the head share merged ops with the first and last layer, and are not counted.)
int most_layers_alive(const Program& p, const traces::Timeline& timeline, int rank,
                      std::int64_t layer_bytes) {
  std::vector<std::pair<std::int64_t, int>> events;
  const OpId first = p.first_op(rank);
  const auto ops = p.ops_of(rank);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const auto& span = timeline.spans[first + i];
    const auto* c = std::get_if<Collective>(&op.work);
    if (c && c->kind == CollectiveKind::all_gather && op.layer_begin >= 0) {
      CHECK(c->bytes.count() == layer_bytes);
      events.emplace_back(span.start.picoseconds(), +1);
    }
    for (const auto& effect : p.effects_of(op)) {
      if (effect.category == MemoryCategory::parameters && effect.delta.count() == -layer_bytes &&
          std::holds_alternative<Compute>(op.work)) {
        events.emplace_back(span.end.picoseconds(), -1);
      }
    }
  }
  std::sort(events.begin(), events.end());
  int alive = 0, most = 0;
  for (const auto& [time, delta] : events) {
    alive += delta;
    most = std::max(most, alive);
  }
  CHECK(alive == 0);
  return most;
}

}  // namespace

TEST_CASE("ZeRO-3 gathers each layer before use, prefetch_layers ahead, and releases it after") {
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  auto base = make_experiment(model, 1, 1, 4, 8, 1, 2048);  // 2 microbatches
  base.cluster = shipped_cluster("dgx-a100-8", 1, 4);
  base.parallelism.zero = 3;
  const std::int64_t layer_bytes = 2 * layer_parameters_per_rank(model, 1);
  for (int prefetch : {0, 1, 2, 4}) {
    CAPTURE(prefetch);
    auto e = base;
    e.parallelism.zero_prefetch_layers = prefetch;
    const auto program = lower_checked(e);
    const auto timeline = simulate_checked(e, program, true);
    // Gathers of a 128 MB layer take about 0.4 ms on NVLink, its compute about 1 ms: the
    // gathers run ahead as far as the prefetch lets them, and no further.
    CHECK(most_layers_alive(program, timeline, 0, layer_bytes) == 1 + prefetch);
    // Every op of a layer in a forward or backward pass runs after its gather: the first op
    // touching layer l depends on an all-gather labelled for l.
    const auto ops = program.ops_of(0);
    int checked = 0;
    const Op* previous = nullptr;  // the previous compute op
    for (const Op& op : ops) {
      if (!std::holds_alternative<Compute>(op.work)) continue;
      // Split layers: each layer's first compute op of a pass is the one that waits.
      const bool first_of_layer =
          op.layer_begin >= 0 &&
          (!previous || previous->layer_begin != op.layer_begin || previous->phase != op.phase ||
           previous->microbatch != op.microbatch);
      previous = &op;
      if (!first_of_layer) continue;
      bool waits_for_gather = false;
      for (OpId dep : program.deps_of(op)) {
        const Op& d = program.op(dep);
        const auto* c = std::get_if<Collective>(&d.work);
        if (c && c->kind == CollectiveKind::all_gather && d.layer_begin == op.layer_begin) {
          waits_for_gather = true;
        }
      }
      CHECK(waits_for_gather);
      ++checked;
    }
    CHECK(checked >= 2 * 2 * model.layers);
  }
  // Full recomputation of groups of 4 layers needs the 4 layers' parameters together in
  // backward: the prefetch limit yields to that rather than deadlock.
  auto e = base;
  e.parallelism.recompute = RecomputeKind::full;
  e.parallelism.recompute_num_layers = 4;
  e.parallelism.zero_prefetch_layers = 1;
  const auto program = lower_checked(e);
  const auto timeline = simulate_checked(e, program, true);
  CHECK(most_layers_alive(program, timeline, 0, layer_bytes) >= 4);
}

TEST_CASE("ZeRO-3 at a fixed global batch: TFLOP/s per device fall as dp doubles (GPT-3 175B)") {
  // GPT-3 175B, tp 8 with sequence parallelism, pp 1, ZeRO-3 over dp = 8, 16, 32 (64 to 256 A100s,
  // one data-parallel peer per node: every all-gather crosses 25 GB/s InfiniBand), global batch 64
  // sequences of 2048 tokens, micro batch 8, 4, 2 (one microbatch per iteration), full
  // recomputation.
  //
  // Why it falls: a rank's compute per layer is proportional to its micro batch and halves
  // each time dp doubles, while its parameter traffic per layer does not shrink: every rank
  // still all-gathers each layer's whole tensor-parallel shard (226M parameters, 453 MB) before
  // its forward and again before its backward, and reduce-scatters as much gradient, each
  // collective moving (n-1)/n of it over the node's 25 GB/s link: 15.9 ms per layer at dp 8,
  // 17.6 ms at dp 32, about 4.6-5.1 s per iteration on the dp-comm stream at any dp. At micro
  // batch 8 a layer's forward takes about 31 ms and its recompute + backward about 93 ms: the
  // prefetched gathers hide behind compute (13.6 s of compute, 4.6 s of collectives). At micro
  // batch 2 they take 8 and 24 ms, less than the gather (and reduce-scatter) each must wait
  // for: the dp-comm stream (5.1 s) paces an iteration whose compute is 3.5 s, and the GPUs
  // idle. The figures (simulated here; printed below): about 161, 159 and 101 model TFLOP/s
  // per device at dp 8, 16 and 32.
  auto model = load_model(configs_dir() / "models/gpt3-175b.json");
  std::vector<double> tflops;
  for (int dp : {8, 16, 32}) {
    auto e = make_experiment(model, 8, 1, dp, 64, 64 / dp, 2048, true);
    e.cluster = shipped_cluster("dgx-a100-128", dp);
    e.parallelism.zero = 3;
    e.parallelism.recompute = RecomputeKind::full;
    e.training.flash_attention = true;
    const auto program = lower_checked(e);
    const auto timeline = simulate_checked(e, program, true);
    const auto report = report_of(e, program, timeline);
    tflops.push_back(report.model_tflops_per_device);
    // Rank 0's busy time per stream: compute (with its blocking tensor-parallel collectives)
    // against the data-parallel gathers and reduce-scatters.
    double compute = 0, gathers = 0;
    for (const auto& span : timeline.spans) {
      if (span.rank != 0) continue;
      const double busy = (span.end - span.start).seconds();
      if (span.stream == Stream::compute || span.stream == Stream::tp_comm) compute += busy;
      if (span.stream == Stream::dp_comm) gathers += busy;
    }
    if (dp == 8) CHECK(gathers < 0.5 * compute);  // hidden behind compute
    if (dp == 32) CHECK(gathers > compute);       // longer than the compute they should hide in
    MESSAGE("GPT-3 175B ZeRO-3 tp 8 dp "
            << dp << " micro batch " << 64 / dp << ": " << report.model_tflops_per_device
            << " model TFLOP/s per device, iteration " << report.iteration_time_s
            << " s; rank 0 busy " << compute << " s computing (tp collectives included), "
            << gathers << " s in data-parallel gathers and reduce-scatters; peak memory "
            << static_cast<double>(report.peak_memory.count()) / 1e9 << " GB");
  }
  CHECK(tflops[1] < tflops[0]);
  CHECK(tflops[2] < tflops[1]);
}

TEST_CASE("ZeRO and offload combinations validate, simulate and release what they allocate") {
  // tp 2 x pp 2 x dp 2 on one DGX A100 (host and NVMe included), 4 microbatches: each
  // combination must lower to a valid program that runs to completion, fits, and whose memory
  // effects balance on every rank, category and tier (gathered layers, gradient buckets and
  // activations all released within the iteration).
  auto model = load_model(configs_dir() / "models/gpt3-1.7b.json");
  struct Case {
    int zero;
    bool optimizer, params, nvme;
    RecomputeKind recompute;
    ScheduleKind schedule;
    int prefetch;
    bool overlap;
  };
  const auto full = RecomputeKind::full, none = RecomputeKind::none;
  const auto selective = RecomputeKind::selective;
  const auto f1b = ScheduleKind::one_f_one_b, gpipe = ScheduleKind::gpipe;
  const std::vector<Case> cases = {
      {0, false, false, false, none, f1b, 1, true},
      {1, false, false, false, none, f1b, 1, true},
      {2, false, false, false, none, gpipe, 1, true},
      {3, false, false, false, none, f1b, 1, true},
      {3, false, false, false, full, f1b, 0, true},
      {3, false, false, false, selective, gpipe, 2, false},
      {1, true, false, false, none, f1b, 1, true},
      {1, true, false, true, none, f1b, 1, false},
      {2, true, false, false, full, f1b, 1, true},
      {2, true, false, false, none, f1b, 1, false},
      {3, true, false, false, none, gpipe, 1, true},
      {3, false, true, false, none, f1b, 1, true},
      {3, true, true, false, full, f1b, 3, true},
      {3, true, true, true, selective, f1b, 1, true},
  };
  for (const Case& c : cases) {
    auto e = make_experiment(model, 2, 2, 2, 16, 2, 2048);
    e.cluster = shipped_cluster("dgx-a100-8", 1);
    e.parallelism.zero = c.zero;
    e.parallelism.offload.optimizer = c.optimizer;
    e.parallelism.offload.params = c.params;
    e.parallelism.offload.nvme = c.nvme;
    e.parallelism.recompute = c.recompute;
    e.parallelism.schedule = c.schedule;
    e.parallelism.zero_prefetch_layers = c.prefetch;
    e.parallelism.dp_overlap = c.overlap;
    e.parallelism.reduce_bucket_size = 100'000'000;
    CAPTURE(c.zero);
    CAPTURE(c.optimizer);
    CAPTURE(c.params);
    CAPTURE(c.nvme);
    CAPTURE(static_cast<int>(c.recompute));
    CAPTURE(c.prefetch);
    CAPTURE(c.overlap);
    const auto program = lower_checked(e);
    const auto timeline = simulate_checked(e, program);
    CHECK(timeline.out_of_memory.empty());
    for (int r = 0; r < program.world_size(); ++r) {
      std::map<std::pair<int, int>, std::int64_t> balance;
      for (const auto& op : program.ops_of(r)) {
        for (const auto& effect : program.effects_of(op)) {
          balance[{static_cast<int>(effect.tier), static_cast<int>(effect.category)}] +=
              effect.delta.count();
        }
      }
      for (const auto& [key, bytes] : balance) {
        CAPTURE(key.first);
        CAPTURE(key.second);
        CHECK(bytes == 0);
      }
    }
  }
}
