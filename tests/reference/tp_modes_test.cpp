// Tensor parallelism beyond 1D (parallelism.tp_mode) against Colossal-AI's published shapes and
// cost table (reference case colossalai-tp-costs-and-shapes): per-device weight shards and
// activations of the reference MLP, parameters per rank, compute per device, activation bytes,
// how the per-layer communication scales with the mesh side q, and whole programs on 2D, 2.5D
// and 3D meshes.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "reference/helpers.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

TpMode mode_named(const std::string& name) {
  static const std::map<std::string, TpMode> modes = {{"1D", TpMode::one_d},
                                                      {"2D", TpMode::two_d},
                                                      {"2.5D", TpMode::two_half_d},
                                                      {"3D", TpMode::three_d}};
  return modes.at(name);
}

MatrixShape shape_of(const nlohmann::json& pair) {
  return MatrixShape{pair[0].get<std::int64_t>(), pair[1].get<std::int64_t>()};
}

// A GPT layer whose dimensions every mesh below divides: h = 576 (12 heads of 48), ffn = 4h,
// GELU, LayerNorm, biases, vocabulary 51200.
TransformerModel test_model() {
  TransformerModel m = gpt(12, 576, 4);
  m.max_seq_len = 2048;
  return m;
}

LayerSetting setting_for(TpMode mode, int tp, int depth, std::int64_t micro_batch,
                         std::int64_t seq) {
  LayerSetting s;
  s.tp = tp;
  s.tp_mode = mode;
  s.tp_depth = depth;
  s.micro_batch = micro_batch;
  s.seq_len = seq;
  s.dtype = DType::bf16;
  return s;
}

// One middle-stage layer (no embedding, no head).
StagePlan one_layer(const TransformerModel& m, const LayerSetting& s) {
  return plan_transformer_stage(m, s, 1, 3, 0, 1);
}

double layer_flops(const StagePlan& plan) {
  double flops = 0;
  for (const auto* pass : {&plan.forward, &plan.backward}) {
    for (const Segment& seg : *pass) {
      for (const Kernel& k : seg.kernels) flops += matmul_flops(k).count();
    }
  }
  return flops;
}

// Per-rank traffic of a plan's collectives (forward and backward), in bytes, with the ring
// factors of an n-rank group for an S-byte collective: all-reduce 2(n-1)/n S, reduce-scatter
// and all-gather (n-1)/n S, broadcast and reduce (n-1)/n S (a pipelined chain: every member
// but the last forwards S; averaged over the members). Only segments on `axes`.
double traffic(const StagePlan& plan, const TpMesh& mesh, const std::set<TpAxis>& axes) {
  double bytes = 0;
  for (const auto* pass : {&plan.forward, &plan.backward}) {
    for (const Segment& seg : *pass) {
      if (seg.compute || !axes.contains(seg.axis)) continue;
      const double n = mesh.axis_size(seg.axis), s = static_cast<double>(seg.bytes.count());
      bytes += (seg.collective == CollectiveKind::all_reduce ? 2.0 : 1.0) * (n - 1) / n * s;
    }
  }
  return bytes;
}

double stored_bytes(const StagePlan& plan) {
  double bytes = 0;
  for (const Segment& seg : plan.forward)
    bytes += static_cast<double>(seg.activation_delta.count());
  return bytes;
}

Experiment tp_experiment(TpMode mode, int tp, int depth, int micro_batch) {
  Experiment e = make_experiment(test_model(), tp, 2, 1, 4 * micro_batch, micro_batch, 256);
  e.parallelism.tp_mode = mode;
  e.parallelism.tp_depth = depth;
  return e;
}

}  // namespace

TEST_CASE("colossalai-tp-costs-and-shapes: weight shards and activations of the reference MLP") {
  // The reference MLP: Linear 256 -> 1024, GELU, Linear 1024 -> 256 on a batch of 16.
  const auto ref = reference_case("colossalai-tp-costs-and-shapes");
  CHECK(ref["inputs"]["mlp"].get<std::string>() ==
        "Linear 256->1024, GELU, Linear 1024->256, input batch 16");
  const std::vector<std::int64_t> features = {256, 1024, 256};
  const std::int64_t batch = 16;
  for (const auto& [name, inputs] : ref["inputs"]["modes"].items()) {
    CAPTURE(name);
    const int p = inputs["P"];
    const int depth = inputs.contains("d") ? inputs["d"].get<int>() : 1;
    const TpMesh mesh = make_tp_mesh(mode_named(name), p, depth);
    if (inputs.contains("q")) CHECK(mesh.q == inputs["q"].get<int>());
    const auto shards = linear_stack_shards(mesh, batch, features);
    REQUIRE(shards.size() == 2);
    const auto& weights = ref["expected"]["weight_shard_shapes"][name];
    CHECK(shards[0].weight == shape_of(weights[0]));
    CHECK(shards[1].weight == shape_of(weights[1]));
    const auto& acts = ref["expected"]["activation_shapes"][name];
    if (acts.contains("input")) CHECK(shards[0].input == shape_of(acts["input"]));
    CHECK(shards[0].output == shape_of(acts["out1"]));
    CHECK(shards[1].output == shape_of(acts["out2"]));
    // The second Linear takes the first one's output as it lies on the device (GELU is
    // elementwise).
    CHECK(shards[1].input == shards[0].output);
  }
}

TEST_CASE("tp meshes: coordinates t = col + q (row + q depth) and the axis groups") {
  const TpMesh m = make_tp_mesh(TpMode::two_half_d, 18, 2);  // q = 3, d = 2
  CHECK(m.q == 3);
  CHECK(m.d == 2);
  CHECK(m.coord(14) == TpCoord{2, 1, 1});  // 14 = 2 + 3 (1 + 3 * 1)
  CHECK(m.axis_members(TpAxis::tp_row, 14) == std::vector<int>{12, 13, 14});
  CHECK(m.axis_members(TpAxis::tp_col, 14) == std::vector<int>{11, 14, 17});
  CHECK(m.axis_members(TpAxis::tp_depth, 14) == std::vector<int>{5, 14});
  CHECK(m.batch_split() == 6);
  const TpMesh cube = make_tp_mesh(TpMode::three_d, 27);
  CHECK(cube.q == 3);
  CHECK(cube.axis_size(TpAxis::tp_depth) == 3);
  CHECK(cube.batch_split() == 9);
  CHECK(make_tp_mesh(TpMode::two_d, 16).q == 4);
  CHECK(make_tp_mesh(TpMode::two_d, 16).axis_size(TpAxis::tp_depth) == 1);
  CHECK(tp_mesh_problem(TpMode::two_d, 8).has_value());
  CHECK(tp_mesh_problem(TpMode::three_d, 9).has_value());
  CHECK(tp_mesh_problem(TpMode::two_half_d, 12, 2).has_value());  // 12 / 2 = 6 is no square
  CHECK(tp_mesh_problem(TpMode::two_d, 1).has_value());           // q >= 2
  CHECK_FALSE(tp_mesh_problem(TpMode::two_half_d, 8, 2).has_value());
}

TEST_CASE("parameters per rank: 1/q^2 of a layer with 2D and 2.5D, weights over q^3 with 3D") {
  const TransformerModel m = test_model();
  const std::int64_t h = 576, f = 4 * h;
  // By hand: weights h*3h + h*h + h*f + f*h, biases 3h + h + f + h, two LayerNorms 2 * 2h.
  const std::int64_t weights = h * 3 * h + h * h + h * f + f * h;
  const std::int64_t biases = 3 * h + h + f + h;
  const std::int64_t norms = 2 * 2 * h;
  REQUIRE(m.layer_parameters() == weights + biases + norms);
  const std::int64_t total = weights + biases + norms;
  for (int q : {2, 3, 4}) {
    CAPTURE(q);
    // 2D: P = q^2 ranks, each 1/P of everything (Colossal-AI shards biases and norms in q^2).
    CHECK(layer_parameters_per_rank(m, setting_for(TpMode::two_d, q * q, 1, q, 64)) ==
          total / (q * q));
    // 2.5D with d = 2: P = 2 q^2, replicated over the depth: total / q^2.
    CHECK(layer_parameters_per_rank(m, setting_for(TpMode::two_half_d, 2 * q * q, 2, 2 * q, 64)) ==
          total / (q * q));
  }
  for (int q : {2, 3}) {
    CAPTURE(q);
    // 3D: P = q^3; weights W[in/q, out/q^2] are total/P, biases [out/q] and norms [h/q] are q
    // slices (Colossal-AI's Linear3D and LayerNorm3D).
    CHECK(layer_parameters_per_rank(m, setting_for(TpMode::three_d, q * q * q, 1, q * q, 64)) ==
          weights / (q * q * q) + biases / q + norms / q);
    TransformerModel bare = m;  // no biases, RMSNorm: only the norms stay in slices
    bare.bias = false;
    bare.norm = Norm::rmsnorm;
    CHECK(layer_parameters_per_rank(bare, setting_for(TpMode::three_d, q * q * q, 1, q * q, 64)) ==
          weights / (q * q * q) + 2 * h / q);
  }
  // The stage plan's gradient unit carries the same count.
  const auto s = setting_for(TpMode::two_d, 4, 1, 2, 64);
  const StagePlan plan = one_layer(m, s);
  REQUIRE(plan.grad_units.size() == 1);
  CHECK(plan.grad_units[0].parameters == total / 4);
}

TEST_CASE("colossalai compute row: per-device layer FLOPs are 1/q^2, 1/(d q^2), 1/q^3") {
  // One GPT layer (ffn 4h, no GQA) forward and backward, 2 FLOPs per multiply-add, attention
  // over the full s x s score matrix: 3 (24 b s h^2 + 4 b s^2 h) (Narayanan et al., eq. 3's
  // per-layer term).
  const TransformerModel m = test_model();
  const double b = 36, s = 128, h = 576;
  const double layer = 3 * (24 * b * s * h * h + 4 * b * s * s * h);
  const auto flops = [&](TpMode mode, int tp, int depth) {
    return layer_flops(one_layer(m, setting_for(mode, tp, depth, 36, 128)));
  };
  CHECK(flops(TpMode::one_d, 1, 1) == doctest::Approx(layer).epsilon(1e-12));
  for (int q : {2, 3}) {
    CAPTURE(q);
    CHECK(flops(TpMode::two_d, q * q, 1) == doctest::Approx(layer / (q * q)).epsilon(1e-12));
    CHECK(flops(TpMode::two_half_d, 2 * q * q, 2) ==
          doctest::Approx(layer / (2 * q * q)).epsilon(1e-12));
    CHECK(flops(TpMode::three_d, q * q * q, 1) ==
          doctest::Approx(layer / (q * q * q)).epsilon(1e-12));
  }
  // The GEMM shapes themselves: 2D's fc1 step multiplies the [b s/q, h/q] input block by the
  // [h/q, 4h/q] weight block; 3D's fc1 multiplies the gathered [b s/q, h/q] input by the
  // gathered [h/q, 4h/q] weight.
  auto fc1 = [&](TpMode mode, int tp) {
    for (const Segment& seg : one_layer(m, setting_for(mode, tp, 1, 36, 128)).forward) {
      for (const Kernel& k : seg.kernels) {
        if (k.name == "fc1") return std::get<Gemm>(k.work);
      }
    }
    FAIL("no fc1 GEMM");
    return Gemm{};
  };
  const Gemm g2 = fc1(TpMode::two_d, 4);
  CHECK(g2.m == 36 * 128 / 2);
  CHECK(g2.k == 576 / 2);
  CHECK(g2.n == 4 * 576 / 2);
  const Gemm g3 = fc1(TpMode::three_d, 8);
  CHECK(g3.m == 36 * 128 / 2);
  CHECK(g3.k == 576 / 2);
  CHECK(g3.n == 4 * 576 / 2);
}

TEST_CASE("colossalai comm_bw row: per-layer traffic scales as the table says across q") {
  // The table's per-layer bandwidth terms (ring, forward and backward): 1D 2(P-1)/P, 2D
  // 6(q-1)/q, 2.5D 3(q-1)(d+1)/(d q), 3D 6(q-1)/q^3. Its 2D and 2.5D rows count each transfer
  // in units of one mesh row's panel of a tensor (S/q: the SUMMA broadcasts move q blocks of
  // S/q^2), its 3D row in units of S; per rank and in bytes a fixed layer's traffic is then
  // proportional to 6(q-1)/q^2 (2D), 3(q-1)(d+1)/(d q^2) (2.5D) and 6(q-1)/q^3 (3D). Every
  // collective of a layer (SUMMA broadcasts and reductions, 3D's all-gathers and
  // reduce-scatters, the norms' statistics) has that factor, so the ratios across q are exact.
  // 2.5D's all-reduce of weight gradients over the depth is outside the table's row (checked
  // apart below).
  const TransformerModel m = test_model();
  const std::set<TpAxis> mesh_axes = {TpAxis::tp_row, TpAxis::tp_col, TpAxis::tp_depth};
  const std::set<TpAxis> summa_axes = {TpAxis::tp_row, TpAxis::tp_col};
  auto volume = [&](TpMode mode, int tp, int depth, const std::set<TpAxis>& axes) {
    const LayerSetting s = setting_for(mode, tp, depth, 36, 128);
    return traffic(one_layer(m, s), s.mesh(), axes);
  };
  // 1D: the Megatron layer's four all-reduces scale as 2(P-1)/P.
  const auto one_d = [](double p) { return 2 * (p - 1) / p; };
  CHECK(volume(TpMode::one_d, 3, 1, {TpAxis::tp}) / volume(TpMode::one_d, 2, 1, {TpAxis::tp}) ==
        doctest::Approx(one_d(3) / one_d(2)).epsilon(1e-12));
  CHECK(volume(TpMode::one_d, 4, 1, {TpAxis::tp}) / volume(TpMode::one_d, 2, 1, {TpAxis::tp}) ==
        doctest::Approx(one_d(4) / one_d(2)).epsilon(1e-12));
  // 2D, q = 2, 3, 4 (in bytes: the row's 6(q-1)/q per panel of S/q).
  const auto two_d = [](double q) { return 6 * (q - 1) / q / q; };
  const double v2 = volume(TpMode::two_d, 4, 1, mesh_axes);
  CHECK(volume(TpMode::two_d, 9, 1, mesh_axes) / v2 ==
        doctest::Approx(two_d(3) / two_d(2)).epsilon(1e-12));
  CHECK(volume(TpMode::two_d, 16, 1, mesh_axes) / v2 ==
        doctest::Approx(two_d(4) / two_d(2)).epsilon(1e-12));
  // 2.5D, d = 2, q = 2, 3: the row and column traffic.
  const auto two_half_d = [](double q, double d) { return 3 * (q - 1) * (d + 1) / (d * q) / q; };
  CHECK(volume(TpMode::two_half_d, 18, 2, summa_axes) /
            volume(TpMode::two_half_d, 8, 2, summa_axes) ==
        doctest::Approx(two_half_d(3, 2) / two_half_d(2, 2)).epsilon(1e-12));
  // 3D, q = 2, 3.
  const auto three_d = [](double q) { return 6 * (q - 1) / (q * q * q); };
  CHECK(volume(TpMode::three_d, 27, 1, mesh_axes) / volume(TpMode::three_d, 8, 1, mesh_axes) ==
        doctest::Approx(three_d(3) / three_d(2)).epsilon(1e-12));

  // 2.5D's depth all-reduces: each Linear's [in/q, out/q] weight gradient once per backward,
  // 2(d-1)/d of it per rank: bf16, q = 2, d = 2, h = 576: (3h^2 + h^2 + 4h^2 + 4h^2) / 4 * 2 B.
  const double h = 576;
  CHECK(volume(TpMode::two_half_d, 8, 2, {TpAxis::tp_depth}) ==
        doctest::Approx(2.0 * (2 - 1) / 2 * (12 * h * h / 4 * 2)).epsilon(1e-12));
  // And no depth traffic without depth.
  CHECK(volume(TpMode::two_d, 4, 1, {TpAxis::tp_depth}) == 0);
}

TEST_CASE("colossalai act_mem row: stored activations per layer and mode") {
  // Korthikanti et al.'s per-layer activations without parallelism, bf16: s b h (34 + 5 a s/h)
  // bytes. Every tensor is split over the mesh: 1/q^2 with 2D, 1/(d q^2) with 2.5D (the
  // table's act_mem row). 3D keeps each Linear's input all-gathered ([b s/q, in/q]: the 2 + 2
  // + 2 + 8 = 14 s b h of the qkv, proj, fc1 and fc2 inputs, over q^2) and its gathered
  // weights ([in/q, out/q]: 2 (3 + 1 + 4 + 4) h^2 over q^2) from forward for backward, as
  // Colossal-AI's linear_3d does; the other 20 s b h + 5 a s^2 b are 1/q^3.
  const TransformerModel m = test_model();
  const double b = 36, s = 128, h = 576, a = 12;
  const double whole = s * b * h * 34 + 5 * a * s * s * b;
  const auto stored = [&](TpMode mode, int tp, int depth) {
    return stored_bytes(one_layer(m, setting_for(mode, tp, depth, 36, 128)));
  };
  CHECK(stored(TpMode::one_d, 1, 1) == doctest::Approx(whole).epsilon(1e-12));
  for (double q : {2.0, 3.0}) {
    CAPTURE(q);
    const int iq = static_cast<int>(q);
    CHECK(stored(TpMode::two_d, iq * iq, 1) == doctest::Approx(whole / (q * q)).epsilon(1e-12));
    CHECK(stored(TpMode::two_half_d, 2 * iq * iq, 2) ==
          doctest::Approx(whole / (2 * q * q)).epsilon(1e-12));
    const double three = (20 * s * b * h + 5 * a * s * s * b) / (q * q * q) +
                         14 * s * b * h / (q * q) + 2 * 12 * h * h / (q * q);
    CHECK(stored(TpMode::three_d, iq * iq * iq, 1) == doctest::Approx(three).epsilon(1e-12));
  }
}

TEST_CASE("tp_mode 2d end to end: layer collectives on q-rank rows and columns") {
  // tp = 4 (q = 2), pp = 2, dp = 1 on 8 devices; micro_batch 2 splits over the q rows.
  const Experiment e = tp_experiment(TpMode::two_d, 4, 1, 2);
  const Program program = lower_checked(e);
  std::map<std::string, int> kinds;
  for (int r = 0; r < program.world_size(); ++r) {
    for (const Op& op : program.ops_of(r)) {
      const auto* c = std::get_if<Collective>(&op.work);
      if (!c || op.stream != Stream::tp_comm) continue;
      const Group& g = program.groups()[c->group];
      const bool row = g.name.starts_with("tp_row"), col = g.name.starts_with("tp_col");
      if (op.layer_begin >= 0) CHECK((row || col));  // inside a layer: a mesh row or column
      if (row || col) {
        CHECK(g.ranks.size() == 2);
        // Rows are consecutive tp indices (stride 1), columns stride q = 2.
        CHECK(g.ranks[1] - g.ranks[0] == (row ? 1 : 2));
        ++kinds[std::string(row ? "row " : "col ") + std::string(name_of(c->kind))];
      } else {  // the vocabulary-parallel embedding and head: the whole tp group
        CHECK(op.layer_begin < 0);
        CHECK(g.ranks.size() == 4);
        CHECK(g.name.starts_with("tp "));
      }
    }
  }
  // SUMMA: broadcasts along rows (input blocks) and columns (weight blocks), reductions of
  // input gradients along rows and of weight gradients along columns; norm statistics
  // all-reduced along rows.
  CHECK(kinds["row broadcast"] > 0);
  CHECK(kinds["col broadcast"] > 0);
  CHECK(kinds["row reduce"] > 0);
  CHECK(kinds["col reduce"] > 0);
  CHECK(kinds["row all-reduce"] > 0);
  CHECK(kinds["col all-reduce"] == 0);
  simulate_checked(e, program);
}

TEST_CASE("tp_mode 2.5d and 3d lower, validate and simulate; 1d programs keep their groups") {
  const Program p25 = lower_checked(tp_experiment(TpMode::two_half_d, 8, 2, 4));
  const Program p3 = lower_checked(tp_experiment(TpMode::three_d, 8, 1, 4));
  bool depth = false;
  for (const Group& g : p25.groups()) depth = depth || g.name.starts_with("tp_depth");
  CHECK(depth);
  simulate_checked(tp_experiment(TpMode::two_half_d, 8, 2, 4), p25);
  simulate_checked(tp_experiment(TpMode::three_d, 8, 1, 4), p3);
  // The 3D program's layer collectives are all-gathers and reduce-scatters on q-rank lines.
  for (int r = 0; r < p3.world_size(); ++r) {
    for (const Op& op : p3.ops_of(r)) {
      const auto* c = std::get_if<Collective>(&op.work);
      if (!c || op.layer_begin < 0 || op.stream != Stream::tp_comm) continue;
      CHECK(p3.groups()[c->group].ranks.size() == 2);
      CHECK((c->kind == CollectiveKind::all_gather || c->kind == CollectiveKind::reduce_scatter ||
             c->kind == CollectiveKind::all_reduce));
    }
  }
  // 1D: no mesh groups.
  const Program p1 = lower_checked(tp_experiment(TpMode::one_d, 4, 1, 2));
  for (const Group& g : p1.groups()) CHECK_FALSE(g.name.starts_with("tp_"));
  // Recomputation and ZeRO-3 work on meshes too.
  Experiment full = tp_experiment(TpMode::two_d, 4, 1, 2);
  full.parallelism.recompute = RecomputeKind::full;
  simulate_checked(full, lower_checked(full));
  Experiment zero = tp_experiment(TpMode::three_d, 8, 1, 4);
  zero.parallelism.zero = 3;
  zero.cluster = test_cluster(2, 16);
  zero.parallelism.dp = 2;
  zero.training.global_batch = 2 * 4 * 4;
  simulate_checked(zero, lower_checked(zero));
}
