#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "experiment_helpers.hpp"
#include "strategies/model.hpp"
#include "strategies/program.hpp"
#include "strategies/transformer.hpp"

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

TEST_CASE("sliding-window attention: keys per query, FLOPs and the layers that use it") {
  using strategies::Attention;
  // 8 tokens, causal, window 3. Counted continuously as the causal share is (F(n) = n^2 / 2
  // for n <= w, else w^2 / 2 + (n - w) w): F(8) = 4.5 + 15 = 19.5 keys for 8 queries.
  Attention a{1, 1, 1, 8, 8, 16};
  a.window = 3;
  CHECK(strategies::attention_keys_per_query(a) == doctest::Approx(19.5 / 8));
  // Without a window, or with one no shorter than the keys: s - s/2 = 4 keys per query.
  a.window = 0;
  CHECK(strategies::attention_keys_per_query(a) == doctest::Approx(4.0));
  a.window = 8;
  CHECK(strategies::attention_keys_per_query(a) == doctest::Approx(4.0));
  // 4096 queries after 4096 earlier tokens (seq_kv 8192), window 1024: every query sees
  // exactly 1024 keys (F(8192) - F(4096) = 4096 x 1024).
  Attention late{1, 1, 1, 4096, 8192, 128};
  late.window = 1024;
  CHECK(strategies::attention_keys_per_query(late) == doctest::Approx(1024.0));
  // FLOPs: 4 s_q s_kv d x keys / s_kv = 4 x 4096 x 1024 x 128 per head.
  CHECK(strategies::attention_flops(late).count() == doctest::Approx(4.0 * 4096 * 1024 * 128));

  // A Gemma-2-like model, every other layer local (window 1024) at 4096 tokens: the fused
  // attention kernels of layers 0 and 2 carry the window, layers 1 and 3 none.
  strategies::TransformerModel m;
  m.name = "windowed";
  m.layers = 4;
  m.hidden = 512;
  m.heads = 4;
  m.kv_heads = 2;
  m.explicit_head_dim = 256;  // query width 1024, twice the hidden size
  m.ffn_hidden = 1024;
  m.vocab = 1000;
  m.activation = strategies::Activation::geglu;
  m.norm = strategies::Norm::rmsnorm;
  m.position_embedding = strategies::PositionEmbedding::rotary;
  m.bias = false;
  m.qk_norm = true;
  m.post_norm = true;
  m.sliding_window = 1024;
  m.global_attention_every = 2;
  m.final_logit_softcap = 30;
  m.hidden_dropout = m.attention_dropout = 0;
  m.validate();
  strategies::LayerSetting set;
  set.seq_len = 4096;
  set.flash_attention = true;
  set.split_layers = true;  // one layer per compute segment, to read each one's window
  const auto plan = strategies::plan_transformer_stage(m, set, 0, 1, 0, 4);
  std::map<int, std::int64_t> window_of_layer;
  int post_norms = 0, qk_norms = 0, softcaps = 0, geglus = 0;
  for (const auto& seg : plan.forward) {
    for (const auto& k : seg.kernels) {
      if (const auto* at = std::get_if<Attention>(&k.work)) {
        window_of_layer[seg.layer_begin] = at->window;
      }
      if (const auto* g = std::get_if<strategies::Gemm>(&k.work); g && k.name == "proj") {
        CHECK(g->k == 1024);  // the output projection reads heads x head_dim
        CHECK(g->n == 512);
      }
      post_norms += k.name.starts_with("post_ln") ? 1 : 0;
      qk_norms += k.name == "qk_norm" ? 1 : 0;
      softcaps += k.name == "logits.softcap" ? 1 : 0;
      geglus += k.name == "geglu" ? 1 : 0;
    }
  }
  CHECK(window_of_layer == std::map<int, std::int64_t>{{0, 1024}, {1, 0}, {2, 1024}, {3, 0}});
  CHECK(post_norms == 8);  // two a layer
  CHECK(qk_norms == 4);
  CHECK(softcaps == 1);
  CHECK(geglus == 4);
  // Per-rank parameters at tp 1 are the model's layer parameters: q, k, v 512 x (1024 + 1024),
  // proj 1024 x 512, MLP 3 x 512 x 1024, four RMSNorms 4 x 512 and q/k norms 2 x 256.
  const std::int64_t by_hand = 512 * 2048 + 1024 * 512 + 3 * 512 * 1024 + 4 * 512 + 2 * 256;
  CHECK(m.layer_parameters() == by_hand);
  CHECK(strategies::layer_parameters_per_rank(m, 1) == by_hand);
  // At tp 2 the Linears split and the norms stay whole.
  CHECK(strategies::layer_parameters_per_rank(m, 2) ==
        (512 * 2048 + 1024 * 512 + 3 * 512 * 1024) / 2 + 4 * 512 + 2 * 256);
}

TEST_CASE("chunked attention: keys per query, FLOPs and the layers that use it") {
  using strategies::Attention;
  // 8 tokens, causal, chunks of 3: [0, 3), [3, 6), [6, 8). Counted continuously as the causal
  // share is (c^2 / 2 per whole chunk, r^2 / 2 for a partial one of r): 4.5 + 4.5 + 2 = 11
  // keys for 8 queries. A sliding window of 3 over the same tokens sees 19.5 (the test above):
  // a chunk is not a window.
  Attention a{1, 1, 1, 8, 8, 16};
  a.chunk = 3;
  CHECK(strategies::attention_keys_per_query(a) == doctest::Approx(11.0 / 8));
  a.chunk = 0;
  a.window = 3;
  CHECK(strategies::attention_keys_per_query(a) == doctest::Approx(19.5 / 8));
  // A chunk no shorter than the keys is plain causal attention: s / 2.
  a.window = 0;
  a.chunk = 8;
  CHECK(strategies::attention_keys_per_query(a) == doctest::Approx(4.0));
  // Llama 4's chunk of 8192 at 10,000 tokens: one whole chunk and 1,808 tokens of the next,
  // (8192^2 + 1808^2) / 2 / 10000 = 3,518.8864 keys per query (causal without chunks: 5,000).
  Attention llama4{1, 40, 8, 10000, 10000, 128};
  llama4.chunk = 8192;
  CHECK(strategies::attention_keys_per_query(llama4) == doctest::Approx(3518.8864));
  // FLOPs: 4 s_q s_kv d heads x keys / s_kv = 4 x 10000 x 3518.8864 x 128 x 40.
  CHECK(strategies::attention_flops(llama4).count() ==
        doctest::Approx(4.0 * 10000 * 3518.8864 * 128 * 40));
  // 4096 queries after 4096 earlier tokens in chunks of 2048: the queries fill chunks 2 and 3
  // whole, c / 2 = 1024 keys each on average.
  Attention late{1, 1, 1, 4096, 8192, 128};
  late.chunk = 2048;
  CHECK(strategies::attention_keys_per_query(late) == doctest::Approx(1024.0));

  // A Llama-4-like model: chunks of 1024 on all layers but every 4th (layers 3 and 7 global,
  // Llama 4's NoPE layers) at 4096 tokens; its weightless L2 q/k norm runs, with no weights.
  strategies::TransformerModel m;
  m.name = "chunked";
  m.layers = 8;
  m.hidden = 512;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_hidden = 1024;
  m.vocab = 1000;
  m.activation = strategies::Activation::swiglu;
  m.norm = strategies::Norm::rmsnorm;
  m.position_embedding = strategies::PositionEmbedding::rotary;
  m.bias = false;
  m.qk_norm = true;
  m.qk_norm_l2 = true;
  m.attention_chunk = 1024;
  m.global_attention_every = 4;
  m.hidden_dropout = m.attention_dropout = 0;
  m.validate();
  strategies::LayerSetting set;
  set.seq_len = 4096;
  set.flash_attention = true;
  set.split_layers = true;
  const auto plan = strategies::plan_transformer_stage(m, set, 0, 1, 0, 8);
  std::map<int, std::int64_t> chunk_of_layer;
  int qk_norms = 0;
  for (const auto& seg : plan.forward) {
    for (const auto& k : seg.kernels) {
      if (const auto* at = std::get_if<Attention>(&k.work)) {
        chunk_of_layer[seg.layer_begin] = at->chunk;
        CHECK(at->window == 0);
      }
      qk_norms += k.name == "qk_norm" ? 1 : 0;
    }
  }
  CHECK(chunk_of_layer ==
        std::map<int, std::int64_t>{
            {0, 1024}, {1, 1024}, {2, 1024}, {3, 0}, {4, 1024}, {5, 1024}, {6, 1024}, {7, 0}});
  CHECK(qk_norms == 8);
  // A layer: q 512 x 512, k and v 512 x 256 each, proj 512 x 512, SwiGLU 3 x 512 x 1024, two
  // RMSNorms 2 x 512 and no q/k norm weights.
  CHECK(m.layer_parameters() == 512 * 512 + 2 * 512 * 256 + 512 * 512 + 3 * 512 * 1024 + 2 * 512);

  // A window and chunks together, or chunks in an encoder, name the key.
  auto both = m;
  both.sliding_window = 512;
  CHECK_THROWS_WITH(both.validate(), doctest::Contains("sliding window or within chunks"));
  auto encoder = m;
  encoder.causal = false;
  CHECK_THROWS_WITH(encoder.validate(), doctest::Contains("needs causal attention"));
}
