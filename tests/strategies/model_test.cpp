#include <doctest/doctest.h>

#include <cmath>

#include "experiment_helpers.hpp"
#include "strategies/model.hpp"

using namespace stratasim;
using namespace stratasim::testing;

TEST_CASE("GPT-3 family parameter counts match Megatron-LM Eq. (2) and Table 1") {
  // P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), V = 51200, s = 2048
  // (reference case megatron-eq2-param-count). Our count adds the final layer norm (2h).
  auto ref = reference_case("megatron-eq2-param-count");
  const double V = ref["inputs"]["V"], s = ref["inputs"]["s"];
  const auto& configs = ref["inputs"]["configs"];
  const auto& printed = ref["expected"]["params_B"];
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(configs_dir() / "models")) {
    if (!entry.path().filename().string().starts_with("gpt3-")) continue;
    auto model = load_model(entry.path());
    for (std::size_t i = 0; i < configs.size(); ++i) {
      if (configs[i]["hidden"] != model.hidden || configs[i]["layers"] != model.layers) continue;
      CAPTURE(model.name);
      const double l = model.layers, h = model.hidden;
      const double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
      CHECK(static_cast<double>(model.parameters()) == doctest::Approx(eq2).epsilon(0.002));
      // Table 1 prints billions to 0.1 B.
      CHECK(std::abs(static_cast<double>(model.parameters()) / 1e9 - printed[i].get<double>()) <=
            0.051);
      ++found;
    }
  }
  CHECK(found == 10);
}

TEST_CASE("Llama parameter counts match the published sizes") {
  // Llama 2 7B: 6.74 B (Touvron et al. 2023, Table 1 rounds to 7B; the release reports
  // 6,738,415,616 parameters). Llama 3 8B: 8,030,261,248 (model card).
  CHECK(load_model(configs_dir() / "models/llama2-7b.json").parameters() == 6'738'415'616);
  CHECK(load_model(configs_dir() / "models/llama3-8b.json").parameters() == 8'030'261'248);
}

TEST_CASE("model validation names the key") {
  strategies::TransformerModel m;
  m.layers = 2;
  m.hidden = 100;
  m.heads = 3;
  m.kv_heads = 3;
  m.ffn_hidden = 400;
  m.vocab = 10;
  CHECK_THROWS_WITH(m.validate(), doctest::Contains("must divide hidden"));
  try {
    m.validate();
  } catch (const config::ValidationError& e) {
    CHECK(e.path() == "heads");
  }
}
