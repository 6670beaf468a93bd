#include <doctest/doctest.h>

#include "experiment_helpers.hpp"
#include "strategies/lowering.hpp"
#include "strategies/transformer.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

std::int64_t layer_total(const TransformerModel& m, int tp, bool sp, int b, int s) {
  LayerSetting set;
  set.tp = tp;
  set.sequence_parallel = sp;
  set.micro_batch = b;
  set.seq_len = s;
  set.dtype = DType::bf16;
  std::int64_t total = 0;
  for (const auto& item : layer_activations(m, set)) total += item.bytes.count();
  return total;
}

}  // namespace

TEST_CASE("activation bytes per layer match Korthikanti et al. for the four Table 3 models") {
  // korthikanti-activation-formulas: none sbh(34 + 5as/h), tp sbh(10 + 24/t + 5as/(ht)),
  // tp+sp sbh(34/t + 5as/(ht)); worked values for each model.
  auto ref = reference_case("korthikanti-activation-formulas");
  for (const auto& c : ref["inputs"]["configs_table3"]) {
    const std::string name = c["name"];
    CAPTURE(name);
    auto m = gpt(c["heads"], c["hidden"], c["layers"]);
    const int t = c["tp"], b = c["microbatch"], s = c["seq"];
    const auto& worked = ref["expected"]["worked_values_derived"][name];
    CHECK(layer_total(m, 1, false, b, s) ==
          doctest::Approx(worked["none"]["bytes"].get<double>()).epsilon(0.01));
    CHECK(layer_total(m, t, false, b, s) ==
          doctest::Approx(worked["tp"]["bytes"].get<double>()).epsilon(0.01));
    CHECK(layer_total(m, t, true, b, s) ==
          doctest::Approx(worked["tp_sp"]["bytes"].get<double>()).epsilon(0.01));
  }
}

TEST_CASE("the lowered program allocates those activations during one forward pass") {
  // 175B layer stack on one stage, tp 8, one microbatch: the forward pass allocates
  // L * sbh(34/t + 5as/(ht)) with sequence parallelism, plus Korthikanti's extra terms for
  // p = 1: embedding dropout mask sbh/t and the output layer 4sbh/t (1 + v/h).
  auto ref = reference_case("korthikanti-activation-formulas");
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8, v = 51200, L = 96;
  auto model = load_model(configs_dir() / "models/gpt3-175b.json");
  for (bool sp : {false, true}) {
    CAPTURE(sp);
    auto p = lower(make_experiment(model, 8, 1, 1, 1, 1, 2048, sp));
    const double allocated = forward_activations(p);
    double per_layer = sp ? s * b * h * (34 / t + 5 * a * s / (h * t))
                          : s * b * h * (10 + 24 / t + 5 * a * s / (h * t));
    // Without sp the embedding mask (sbh) and the final norm's input and output (2 * 2sbh)
    // are not sharded; the fp32 logits are (4sbv/t).
    double extra =
        sp ? s * b * h / t * (1 + 4 * (1 + v / h)) : s * b * h * (1 + 4) + 4 * s * b * v / t;
    CHECK(allocated == doctest::Approx(L * per_layer + extra).epsilon(0.01));
    CHECK(per_layer ==
          doctest::Approx(
              ref["expected"]["worked_values_derived"]["175B"][sp ? "tp_sp" : "tp"]["bytes"]
                  .get<double>()));
  }
}

TEST_CASE("flash attention stores no score matrix") {
  auto m = gpt(96, 12288, 96);
  LayerSetting set;
  set.tp = 8;
  set.seq_len = 2048;
  set.flash_attention = true;
  std::int64_t total = 0;
  for (const auto& item : layer_activations(m, set)) total += item.bytes.count();
  // tp: sbh(10 + 24/t) plus fp32 softmax statistics 4 a s b / t.
  const double s = 2048, h = 12288;
  CHECK(static_cast<double>(total) == doctest::Approx(s * h * (10 + 24.0 / 8) + 4 * 96 * s / 8));
}
