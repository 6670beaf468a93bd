// Calibrated kernel models (hw_models/kernel_model.hpp): reading, the errors of bad files (a
// negative or out-of-range parameter, another device's model), the round trip through to_json,
// and the attention efficiency formula by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

#include "hw_models/cluster.hpp"
#include "hw_models/device.hpp"
#include "hw_models/helpers.hpp"
#include "hw_models/kernel_model.hpp"
#include "temp_dir.hpp"

using namespace stratasim;

namespace {

using testing::error_of;
constexpr auto kFa2 = hw::AttentionImpl::flash_attention_2;

nlohmann::json model_json() {
  return nlohmann::json::parse(R"({
    "schema": "stratasim-kernel-model", "schema_version": 1, "device": "test-gpu",
    "source": "test",
    "gemm": {"bf16": {"peak_fraction": 0.9, "k_overhead": 128, "wave_loss": 0.5,
                      "latency": "2 us", "cases": ["a", "b"]}},
    "attention": {"flash-attention-2": {"forward": 0.6, "backward": 0.4, "seq_half": 100,
                                        "causal_seq_half": 400, "head_dim_64": 0.8,
                                        "head_dim_256": 1.1}}
  })");
}

hw::KernelModel read(const nlohmann::json& j) {
  const auto doc = config::Document::from_json(j, "model.json");
  return hw::read_kernel_model(doc, "");
}

}  // namespace

TEST_CASE("kernel model: reads every parameter, latency as a time") {
  const auto m = read(model_json());
  CHECK(m.device == "test-gpu");
  const auto* g = m.gemm_for(DType::bf16);
  REQUIRE(g != nullptr);
  CHECK(g->peak_fraction == 0.9);
  CHECK(g->k_overhead == 128);
  CHECK(g->wave_loss == 0.5);
  CHECK(g->latency == doctest::Approx(2e-6));
  CHECK(g->cases == std::vector<std::string>{"a", "b"});
  // fp16 shares bf16's tensor-core datapath; fp8 has no parameters.
  CHECK(m.gemm_for(DType::fp16) == g);
  CHECK(m.gemm_for(DType::fp8) == nullptr);
  CHECK(m.attention_for(hw::AttentionImpl::flash_attention_2) != nullptr);
  CHECK(m.attention_for(hw::AttentionImpl::flash_attention_3) == nullptr);
}

TEST_CASE("kernel model: attention efficiency by hand") {
  const auto m = read(model_json());
  const auto& a = *m.attention_for(hw::AttentionImpl::flash_attention_2);
  // Forward, head dim 128 (factor 1), non-causal, s = 900: 0.6 x 900 / (900 + 100) = 0.54.
  CHECK(a.efficiency(kFa2, false, false, 128, 900) == doctest::Approx(0.54));
  // Backward, causal, head dim 64: 0.4 x 0.8 x 1200 / (1200 + 400) = 0.24.
  CHECK(a.efficiency(kFa2, true, true, 64, 1200) == doctest::Approx(0.24));
  // Head dim 256: 1.1; halfway in ln d between 128 and 256 (d = 181.02): sqrt(1.1).
  CHECK(a.efficiency(kFa2, false, false, 256, 1e12) == doctest::Approx(0.66));
  CHECK(a.efficiency(kFa2, false, false, 128 * std::sqrt(2.0), 1e12) ==
        doctest::Approx(0.6 * std::sqrt(1.1)));
  // Clamped outside 64..256: head dim 32 uses the factor of 64.
  CHECK(a.efficiency(kFa2, false, false, 32, 1e12) == doctest::Approx(0.48));
  // A causal factor scales causal kernels only: 0.24 x 0.9 = 0.216; non-causal stays 0.54.
  auto j = model_json();
  j["attention"]["flash-attention-2"]["causal_factor"] = 0.9;
  const auto c = read(j);
  const auto& ca = *c.attention_for(hw::AttentionImpl::flash_attention_2);
  CHECK(ca.efficiency(kFa2, true, true, 64, 1200) == doctest::Approx(0.216));
  CHECK(ca.efficiency(kFa2, false, false, 128, 900) == doctest::Approx(0.54));
  CHECK(a.causal_factor == 1);  // absent: 1
  j["attention"]["flash-attention-2"]["causal_factor"] = -1;
  const auto e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("attention.flash-attention-2.causal_factor") !=
        std::string::npos);
}

TEST_CASE("kernel model: a causal kernel's diagonal span follows its tiles") {
  using hw::AttentionImpl;
  using hw::causal_diagonal_span;
  // span = kBlockM + kBlockN - gcd(kBlockM, kBlockN), the tiles from FlashAttention's launch
  // code. FlashAttention-2 forward: 128x64 at head dim 128 -> 128 + 64 - 64 = 128; 64x64 at 256
  // -> 64; 128x128 at 64 -> 128. Head dim 80 runs the 128 kernel; 512 is clamped to 256's.
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_2, 128, false) == 128);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_2, 256, false) == 64);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_2, 64, false) == 128);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_2, 80, false) == 128);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_2, 512, false) == 64);
  // Backward 64x128 at 128 -> 128; 64x64 at 192 -> 64.
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_2, 128, true) == 128);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_2, 192, true) == 64);
  // FlashAttention-3 forward: 192x128 at 64 -> 192 + 128 - 64 = 256; 128x80 at 256 -> 128 + 80
  // - 16 = 192; backward 64x80 at 256 -> 64 + 80 - 16 = 128.
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_3, 64, false) == 256);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_3, 256, false) == 192);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention_3, 256, true) == 128);
  // FlashAttention (v1): 16-row steps over 256-key blocks at head dim 64 -> 256.
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention, 64, false) == 256);
  CHECK(causal_diagonal_span(AttentionImpl::flash_attention, 128, true) == 128);
  for (hw::AttentionImpl i : hw::kAllAttentionImpls) {
    CHECK(causal_diagonal_span(i, 32, false) > 0);
  }

  // The causal half point: seq_half 100, causal_seq_half 400 (at head dim 128). FlashAttention-2
  // forward at head dim 256: 100 + 300 x 64 / 128 = 250, so at s = 750 the forward rate is
  // 0.6 x 1.1 x 750 / (750 + 250) = 0.495. At head dim 128 it is 400: 0.6 x 750 / 1150.
  const auto m = read(model_json());
  const auto& a = *m.attention_for(hw::AttentionImpl::flash_attention_2);
  CHECK(a.causal_half(kFa2, false, 256) == doctest::Approx(250));
  CHECK(a.causal_half(kFa2, false, 128) == doctest::Approx(400));
  CHECK(a.efficiency(kFa2, false, true, 256, 750) == doctest::Approx(0.495));
  CHECK(a.efficiency(kFa2, false, true, 128, 750) == doctest::Approx(0.6 * 750 / 1150.0));
  // The same parameters as FlashAttention-3's at head dim 64: 100 + 300 x 256 / 128 = 700.
  CHECK(a.causal_half(hw::AttentionImpl::flash_attention_3, false, 64) == doctest::Approx(700));
  // Non-causal kernels keep seq_half at every head dimension.
  CHECK(a.efficiency(kFa2, false, false, 256, 900) == doctest::Approx(0.6 * 1.1 * 900 / 1000));
}

TEST_CASE("kernel model: bad parameters name their JSON path") {
  auto j = model_json();
  j["gemm"]["bf16"]["peak_fraction"] = -0.2;
  auto e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("gemm.bf16.peak_fraction") != std::string::npos);
  CHECK(std::string(e.what()).find("(0, 1]") != std::string::npos);

  j = model_json();
  j["attention"]["flash-attention-2"]["seq_half"] = -5;
  e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("attention.flash-attention-2.seq_half") != std::string::npos);

  j = model_json();
  j["gemm"]["bf16"]["wave_loss"] = 1.5;
  e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("wave_loss") != std::string::npos);

  j = model_json();
  j["gemm"]["bf16"]["peak_fractoin"] = 0.5;  // unknown key: a suggestion
  e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("peak_fraction") != std::string::npos);

  j = model_json();
  j.erase("device");
  e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("device") != std::string::npos);

  j = model_json();
  j["schema_version"] = 2;
  e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("schema_version") != std::string::npos);
}

TEST_CASE("kernel model: to_json reads back exactly") {
  const auto m = read(model_json());
  const auto back = read(hw::to_json(m));
  CHECK(back.gemm_for(DType::bf16)->peak_fraction == 0.9);
  CHECK(back.gemm_for(DType::bf16)->latency == doctest::Approx(2e-6));
  CHECK(back.attention_for(hw::AttentionImpl::flash_attention_2)->head_dim_256 == 1.1);
  CHECK(hw::to_json(back) == hw::to_json(m));
}

TEST_CASE("kernel model: a device names it; another device's model is an error") {
  const testing::TempDir tmp("kernel-model");
  { std::ofstream(tmp.path() / "m.json") << model_json().dump(); }
  auto device = nlohmann::json::parse(R"({
    "name": "test-gpu", "kind": "gpu", "peak_flops": {"bf16": "100 TFLOP/s"},
    "memory": {"capacity": "16 GiB", "bandwidth": "1 TB/s"},
    "kernel_model": "m.json", "published_names": ["Test GPU"]
  })");
  { std::ofstream(tmp.path() / "d.json") << device.dump(); }
  const auto d = hw::load_device(tmp.path() / "d.json");
  REQUIRE(d.kernel_model != nullptr);
  CHECK(d.published_names == std::vector<std::string>{"Test GPU"});
  device["name"] = "other-gpu";
  { std::ofstream(tmp.path() / "d.json") << device.dump(); }
  const auto e = error_of([&] { hw::load_device(tmp.path() / "d.json"); });
  CHECK(std::string(e.what()).find("fitted for test-gpu") != std::string::npos);
  device["kernel_model"] = "missing.json";
  { std::ofstream(tmp.path() / "d.json") << device.dump(); }
  const auto e2 = error_of([&] { hw::load_device(tmp.path() / "d.json"); });
  CHECK(std::string(e2.what()).find("does not exist") != std::string::npos);
}

TEST_CASE("kernel model: every attention implementation's name reads back") {
  // The names docs/gemm-efficiency.md and training.attention_kernel use.
  CHECK(hw::attention_impl_from_name("flash-attention-triton") ==
        hw::AttentionImpl::flash_attention_triton);
  CHECK(hw::name_of(hw::AttentionImpl::cudnn) == "cudnn");
  CHECK(!hw::attention_impl_from_name("triton").has_value());
  for (hw::AttentionImpl i : hw::kAllAttentionImpls) {
    CHECK(hw::attention_impl_from_name(hw::name_of(i)) == i);
  }
}

TEST_CASE("kernel model: FP8 GEMMs by scaling; block-scaled falls back on tensor-scaled") {
  auto j = model_json();
  j["gemm"]["fp8"] = {{"peak_fraction", 0.8}};
  auto m = read(j);
  // No block-scaled parameters: a block-scaled FP8 GEMM is costed as a tensor-scaled one.
  CHECK(m.gemm_for(DType::fp8, hw::GemmScaling::block) == m.gemm_for(DType::fp8));
  j["gemm"]["fp8-block"] = {{"peak_fraction", 0.7}, {"k_overhead", 400}};
  m = read(j);
  CHECK(m.gemm_for(DType::fp8)->peak_fraction == 0.8);
  CHECK(m.gemm_for(DType::fp8, hw::GemmScaling::block)->peak_fraction == 0.7);
  CHECK(m.gemm_for(DType::fp8, hw::GemmScaling::block)->k_overhead == 400);
  // A block scaling of another dtype is that dtype's class.
  CHECK(m.gemm_for(DType::bf16, hw::GemmScaling::block) == m.gemm_for(DType::bf16));
  CHECK(hw::to_json(read(hw::to_json(m))) == hw::to_json(m));
  CHECK(hw::to_json(m)["gemm"].contains("fp8-block"));
  // Its parameters are checked under its own key.
  j["gemm"]["fp8-block"]["peak_fraction"] = 1.5;
  const auto e = error_of([&] { read(j); });
  CHECK(std::string(e.what()).find("gemm.fp8-block.peak_fraction") != std::string::npos);
}
