// FLOPs of activation recomputation against published closed forms, measured by the real
// report on a simulated run of the lowered program: model FLOPs count forward and backward
// only, hardware FLOPs also the recomputed forward work.
#include <doctest/doctest.h>

#include "experiment_helpers.hpp"

#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"
#include "traces/report.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

traces::Report run(const Program& program) {
  validate(program);
  auto cluster = testing::test_cluster(1, program.world_size());
  cluster.device.memory_capacity = Bytes(std::int64_t{1} << 50);  // FLOPs only: never short
  auto timeline = sim::simulate(program, cluster);
  REQUIRE(timeline.completed);
  traces::ReportContext context;
  context.device_peak = FlopRate(312e12);
  context.device_capacity = cluster.device.memory_capacity;
  return traces::make_report(program, timeline, context);
}

}  // namespace

TEST_CASE("selective recomputation costs about s/(6h) more hardware FLOPs (Korthikanti)") {
  // korthikanti-selective-savings: model FLOPs 72BLsh^2(1 + s/(6h) + v/(12hL)), hardware FLOPs
  // with selective recomputation 72BLsh^2(1 + s/(3h) + v/(12hL)), ratio_approx 1 + s/(6h)
  // (2.7% for GPT-3, 1.6% for MT-NLG), tolerance 2%.
  //
  // Megatron's selective recomputation (which stratasim lowers) re-runs the whole core
  // attention's forward, QK^T and attention over V: 2 * 2bs^2h = 4bs^2h FLOPs per layer. A
  // layer's forward and backward are 3(24bsh^2 + 4bs^2h) = 72bsh^2(1 + s/(6h)), so a layer stack
  // (no embedding or head: a middle pipeline stage) measures exactly
  //   hardware / model = 1 + (s/(18h)) / (1 + s/(6h)),
  // 1.0090 for GPT-3 and 1.0055 for MT-NLG: a third of the paper's overhead, whose
  // 1 + s/(3h) charges 12bs^2h per layer (the s^2 work of a whole forward and backward). The
  // measured ratio is checked exactly against that, and against the reference's 1 + s/(6h) at
  // its 2% tolerance, which it meets because the two differ by about s/(9h) of the ratio:
  // 1.83% for GPT-3 (s/h = 1/6), 1.10% for MT-NLG (s/h = 1/10).
  auto ref = testing::reference_case("korthikanti-selective-savings");
  for (const std::string name : {"gpt3", "mtnlg"}) {
    CAPTURE(name);
    const auto& in = ref["inputs"][name];
    const int a = in["a"], h = in["h"], s = in["s"];
    const int layers = name == "gpt3" ? 96 : 105;
    const auto model = gpt(a, h, layers);
    LayerSetting setting;
    setting.seq_len = s;
    PipelineSpec spec;
    spec.layout = RankLayout{1, 1, 1};
    // A middle stage of three: the layers alone.
    spec.stages.push_back(plan_transformer_stage(model, setting, 1, 3, 0, layers, {true, 0, 1}));
    auto report = run(assemble_pipeline(spec));

    const double S = s, H = h, L = layers;
    CHECK(report.model_flops_per_iteration ==
          doctest::Approx(72 * L * S * H * H * (1 + S / (6 * H))).epsilon(1e-9));
    const double ratio = report.hardware_flops_per_iteration / report.model_flops_per_iteration;
    CHECK(ratio == doctest::Approx(1 + (S / (18 * H)) / (1 + S / (6 * H))).epsilon(1e-9));
    CHECK(ratio == doctest::Approx(1 + S / (6 * H)).epsilon(ref["tolerance_rel"].get<double>()));
  }
}

TEST_CASE("full recomputation adds one forward of every recomputed layer (Megatron eq. 3)") {
  // megatron-eq3-flops: with every layer recomputed, hardware FLOPs per iteration are
  // F = 96BslH^2(1 + s/(6h) + V/(16lh)) (4 forwards' worth of the layers, 3 of the LM head,
  // whose logits are never recomputed); model FLOPs 72Bslh^2(1 + s/(6h) + V/(12lh))
  // (Korthikanti eq. 7). So hardware - model = l * per_layer_forward, with per_layer_forward
  // = 24Bsh^2 + 4Bs^2h: hardware ~ 96/72 of model, less the head's share.
  auto ref = testing::reference_case("megatron-eq3-flops");
  const double V = ref["inputs"]["V"], s = ref["inputs"]["s"];
  const double h = 12288, l = 96, B = 1;
  auto e = testing::make_experiment(gpt(96, 12288, 96), 1, 1, 1, 1, 1, 2048);
  e.parallelism.recompute = RecomputeKind::full;
  auto full = run(lower(e));
  const double per_layer_forward = 24 * B * s * h * h + 4 * B * s * s * h;
  CHECK(
      full.hardware_flops_per_iteration ==
      doctest::Approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))).epsilon(1e-9));
  CHECK(
      full.model_flops_per_iteration ==
      doctest::Approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))).epsilon(1e-9));
  CHECK(full.hardware_flops_per_iteration - full.model_flops_per_iteration ==
        doctest::Approx(l * per_layer_forward).epsilon(1e-9));

  // Block recomputation of 3 layers per stage, 2 stages, tp 2, 4 microbatches: 6 layers are
  // recomputed per microbatch; the tensor-parallel ranks split the work.
  auto block = testing::make_experiment(gpt(96, 12288, 8), 2, 2, 1, 4, 1, 2048);
  block.parallelism.recompute = RecomputeKind::full;
  block.parallelism.recompute_method = RecomputeMethod::block;
  block.parallelism.recompute_num_layers = 3;
  auto r = run(lower(block));
  CHECK(r.model_flops_per_iteration ==
        doctest::Approx(4 * 72 * B * s * 8 * h * h * (1 + s / (6 * h) + V / (12 * 8 * h)))
            .epsilon(1e-9));
  CHECK(r.hardware_flops_per_iteration - r.model_flops_per_iteration ==
        doctest::Approx(4 * 6 * per_layer_forward).epsilon(1e-9));
}
