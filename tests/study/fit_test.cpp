// Fitting kernel models (study/fit.hpp): cases made from a known model are fitted back to it;
// a device without cases is an error; the shipped kernel models and framework fits keep every
// parameter at the scope docs/gemm-efficiency.md gives it (a device, a kernel class, a
// framework: never a case).
#include <doctest/doctest.h>

#include <fstream>
#include <memory>
#include <set>

#include "study/calibration_set.hpp"
#include "study/catalog.hpp"
#include "study/fit.hpp"

using namespace stratasim;
using strategies::Attention;
using strategies::Gemm;
using strategies::Kernel;

namespace {

hw::DeviceSpec device(const std::string& name) {
  hw::DeviceSpec d;
  d.name = name;
  d.peak_flops[static_cast<std::size_t>(DType::bf16)] = FlopRate(1e15);
  d.peak_flops[static_cast<std::size_t>(DType::fp16)] = FlopRate(1e15);
  d.memory_capacity = Bytes(80LL << 30);
  d.memory_bandwidth = Bandwidth(3e12);
  d.compute_units = 132;
  d.published_names = {name + " SXM"};
  return d;
}

hw::KernelModel truth(const std::string& name, double peak_fraction, double forward) {
  hw::KernelModel m;
  m.device = name;
  hw::GemmModel g;
  g.peak_fraction = peak_fraction;
  g.k_overhead = 300;
  g.wave_loss = 0.6;
  g.latency = 3e-6;
  m.gemm[static_cast<std::size_t>(DType::bf16)] = g;
  hw::AttentionModel a;
  a.forward = forward;
  a.backward = forward * 0.7;
  a.seq_half = 200;
  a.causal_seq_half = 700;
  a.head_dim_64 = 0.85;
  m.attention[static_cast<std::size_t>(hw::AttentionImpl::flash_attention_2)] = a;
  return m;
}

/// GEMM and attention cases of `d`, timed under `model`.
std::vector<study::KernelCase> cases_of(const hw::DeviceSpec& d, const hw::KernelModel& model) {
  hw::DeviceSpec timed = d;
  timed.kernel_model = std::make_shared<const hw::KernelModel>(model);
  std::vector<study::KernelCase> out;
  auto add = [&](std::vector<Kernel> kernels, bool attention, const std::string& id) {
    study::KernelCase c;
    c.id = d.name + "-" + id;
    c.gpu = d.published_names.front();
    c.attention = attention;
    c.kernels = std::move(kernels);
    c.measured_seconds = study::predicted_seconds(timed, c);
    out.push_back(std::move(c));
  };
  int i = 0;
  for (std::int64_t m : {64, 1024, 4096, 8192}) {
    for (std::int64_t k : {512, 2048, 8192}) {
      add({Kernel{Gemm{m, 4096, k, 1, DType::bf16}, "gemm"}}, false, "gemm" + std::to_string(i++));
    }
  }
  for (bool causal : {false, true}) {
    for (std::int64_t hd : {64, 128}) {
      for (std::int64_t s : {512, 2048, 8192}) {
        Attention a{16384 / s, 2048 / hd, 2048 / hd, s, s, hd, causal, DType::fp16, false};
        add({Kernel{a, "fwd"}}, true, "fwd" + std::to_string(i++));
        Attention b = a;
        b.backward = true;
        add({Kernel{a, "fwd"}, Kernel{b, "bwd"}}, true, "both" + std::to_string(i++));
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("fit: cases made from a known model are fitted back to it") {
  const auto a = device("gpu-a"), b = device("gpu-b");
  auto cases = cases_of(a, truth("gpu-a", 0.85, 0.6));
  for (auto& c : cases_of(b, truth("gpu-b", 0.75, 0.4))) cases.push_back(std::move(c));
  const auto fit = study::fit_kernel_models({a, b}, cases, "test");
  REQUIRE(fit.models.size() == 2);
  const auto& ga = *fit.models[0].gemm_for(DType::bf16);
  const auto& gb = *fit.models[1].gemm_for(DType::bf16);
  CHECK(ga.peak_fraction == doctest::Approx(0.85).epsilon(0.01));
  CHECK(gb.peak_fraction == doctest::Approx(0.75).epsilon(0.01));
  // Kernel-class parameters: shared, and recovered.
  CHECK(ga.k_overhead == gb.k_overhead);
  CHECK(ga.k_overhead == doctest::Approx(300).epsilon(0.02));
  CHECK(ga.wave_loss == doctest::Approx(0.6).epsilon(0.02));
  CHECK(ga.latency == doctest::Approx(3e-6).epsilon(0.02));
  const auto& aa = *fit.models[0].attention_for(hw::AttentionImpl::flash_attention_2);
  const auto& ab = *fit.models[1].attention_for(hw::AttentionImpl::flash_attention_2);
  CHECK(aa.forward == doctest::Approx(0.6).epsilon(0.01));
  CHECK(ab.forward == doctest::Approx(0.4).epsilon(0.01));
  CHECK(aa.backward / aa.forward == doctest::Approx(0.7).epsilon(0.01));
  CHECK(aa.causal_seq_half == doctest::Approx(700).epsilon(0.02));
  CHECK(aa.head_dim_64 == doctest::Approx(0.85).epsilon(0.01));
  CHECK(aa.seq_half == ab.seq_half);
  for (const auto& r : fit.residuals) CHECK(std::abs(r.error()) < 0.01);
  // Traceability: each block lists the cases it was fitted to.
  CHECK(ga.cases.size() == 12);
}

TEST_CASE("fit: a device without cases is an error naming it and its published names") {
  const auto a = device("gpu-a");
  const auto cases = cases_of(a, truth("gpu-a", 0.85, 0.6));
  auto lonely = device("gpu-c");
  try {
    study::fit_kernel_models({a, lonely}, cases, "test");
    FAIL("expected BadInput");
  } catch (const study::BadInput& e) {
    CHECK(std::string(e.what()).find("gpu-c: no calibration case") != std::string::npos);
    CHECK(std::string(e.what()).find("gpu-c SXM") != std::string::npos);
  }
}

TEST_CASE(
    "fit: the shipped fits keep each parameter at a device, kernel-class or framework scope") {
  // The four shipped GPUs' kernel models: peak fractions and attention forward fractions are per
  // device; every other parameter is per kernel class and so equal on every device that has it.
  std::vector<hw::DeviceSpec> gpus;
  for (const char* name :
       {"a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"}) {
    gpus.push_back(study::load_device(name));
    REQUIRE(gpus.back().kernel_model != nullptr);
  }
  for (const auto& [t, scaling] : hw::kGemmClasses) {
    std::set<double> k, wave, latency;
    for (const auto& d : gpus) {
      if (const auto& g = d.kernel_model->gemm_slot(t, scaling)) {
        k.insert(g->k_overhead);
        wave.insert(g->wave_loss);
        latency.insert(g->latency);
        CHECK(!g->cases.empty());
      }
    }
    CHECK(k.size() <= 1);
    CHECK(wave.size() <= 1);
    CHECK(latency.size() <= 1);
  }
  // DeepGEMM (fp8-block): memory_fraction is per device, the rest the kernel class's.
  std::set<double> overlap, load, tile, promotion;
  for (const auto& d : gpus) {
    const auto& g = d.kernel_model->gemm_fp8_block;
    if (!g) continue;
    REQUIRE(g->deepgemm);
    overlap.insert(g->deepgemm->overlap);
    load.insert(g->deepgemm->load_latency);
    tile.insert(g->deepgemm->tile_latency);
    promotion.insert(g->deepgemm->predicated_promotion);
  }
  CHECK(overlap.size() == 1);
  CHECK(load.size() == 1);
  CHECK(tile.size() == 1);
  CHECK(promotion.size() == 1);
  for (hw::AttentionImpl i : hw::kAllAttentionImpls) {
    std::set<double> ratio, half, causal_half, hd64, hd256;
    for (const auto& d : gpus) {
      if (const auto& a = d.kernel_model->attention[static_cast<std::size_t>(i)]) {
        ratio.insert(std::round(a->backward / a->forward * 1e9));
        half.insert(a->seq_half);
        causal_half.insert(a->causal_seq_half);
        hd64.insert(a->head_dim_64);
        hd256.insert(a->head_dim_256);
        CHECK(!a->cases.empty());
      }
    }
    CHECK(ratio.size() <= 1);
    CHECK(half.size() <= 1);
    CHECK(causal_half.size() <= 1);
    CHECK(hd64.size() <= 1);
    CHECK(hd256.size() <= 1);
  }
  // FlashAttention in Triton is measured on the A100s only: the H100 and H200 carry it through
  // FlashAttention (v1) at the A100s' ratio of the two forward fractions (study/fit.hpp; the
  // two A100s fit the same series to within rounding).
  const auto triton = static_cast<std::size_t>(hw::AttentionImpl::flash_attention_triton);
  const auto fa1 = static_cast<std::size_t>(hw::AttentionImpl::flash_attention);
  const auto& a100 = *gpus[1].kernel_model;
  REQUIRE(a100.attention[triton]);
  const double ratio = a100.attention[triton]->forward / a100.attention[fa1]->forward;
  for (std::size_t d : {2, 3}) {
    const auto& m = *gpus[d].kernel_model;
    REQUIRE(m.attention[triton]);
    CHECK(m.attention[triton]->forward ==
          doctest::Approx(m.attention[fa1]->forward * ratio).epsilon(1e-6));
    // Its cases: the A100's Triton series and this device's own FlashAttention series.
    CHECK(m.attention[triton]->cases.size() ==
          a100.attention[triton]->cases.size() + m.attention[fa1]->cases.size());
  }
  // configs/frameworks.json: one entry per framework, with framework-level keys only.
  std::ifstream in(study::config_dir() / "frameworks.json");
  const auto j = nlohmann::json::parse(in);
  for (const auto& [name, f] : j.at("frameworks").items()) {
    CAPTURE(name);
    for (const auto& [key, value] : f.items()) {
      CHECK(std::set<std::string>{"compute_efficiency", "elementwise_traffic",
                                  "attention_efficiency", "runs", "mean_abs_error", "max_abs_error",
                                  "cases"}
                .count(key) == 1);
    }
    CHECK(f.at("cases").size() == f.at("runs").get<std::size_t>());
  }
  // Its "dies": per GPU die, die-level keys only; exactly one is the reference.
  int references = 0;
  for (const auto& [name, d] : j.at("dies").items()) {
    CAPTURE(name);
    for (const auto& [key, value] : d.items()) {
      CHECK(std::set<std::string>{"gemm", "attention", "reference", "runs", "mean_abs_error",
                                  "max_abs_error", "cases"}
                .count(key) == 1);
    }
    references += d.at("reference").get<bool>() ? 1 : 0;
  }
  CHECK(references == 1);
}

TEST_CASE("calibration set: DeepGEMM's block-scaled FP8 GEMMs are a kernel class of their own") {
  // DeepGEMM prints "fp8_e4m3 (block-scaled) -> bf16" (1x128 / 128x128 scales); mamf-finder's
  // torch FP8 matmuls scale per tensor.
  const auto file = study::default_calibration_file();
  const auto cases = study::kernel_cases(study::load_calibration(file.string()), file.string());
  int block = 0, tensor = 0;
  for (const auto& c : cases) {
    if (c.attention) continue;
    const auto& g = std::get<Gemm>(c.kernels.front().work);
    if (c.id.starts_with("deepgemm")) {
      CHECK(g.scaling == hw::GemmScaling::block);
      ++block;
    } else if (g.dtype == DType::fp8) {
      CHECK(g.scaling == hw::GemmScaling::tensor);
      ++tensor;
    }
  }
  CHECK(block == 28);
  CHECK(tensor >= 2);
  // The shipped H100 model holds both classes apart.
  const auto h100 = study::load_device("h100-sxm5-80gb");
  REQUIRE(h100.kernel_model->gemm_fp8_block);
  CHECK(h100.kernel_model->gemm_for(DType::fp8, hw::GemmScaling::block) !=
        h100.kernel_model->gemm_for(DType::fp8));
}
