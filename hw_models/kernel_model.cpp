#include "hw_models/kernel_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

#include "hw_models/files.hpp"

namespace stratasim::hw {

namespace {

constexpr std::string_view kImplNames[] = {"flash-attention", "flash-attention-2",
                                           "flash-attention-3", "cudnn", "flash-attention-triton"};
static_assert(std::size(kImplNames) == std::size(kAllAttentionImpls));

/// Reads the optional list of case ids at `key`.
std::vector<std::string> read_cases(const config::Document& doc, config::ObjectReader& r) {
  std::vector<std::string> out;
  if (!r.has("cases")) return out;
  const std::string at = r.path_of("cases");
  const nlohmann::json* v = doc.find(at);
  if (v == nullptr || !v->is_array()) r.fail("cases", "expected a list of calibration case ids");
  for (const auto& id : *v) {
    if (!id.is_string()) r.fail("cases", "expected a list of calibration case ids (strings)");
    out.push_back(id.get<std::string>());
  }
  return out;
}

void check_fraction(double v, const std::string& path) {
  if (!(v > 0 && v <= 1)) {
    throw config::ValidationError(
        path, "expected a fraction of peak in (0, 1], got " + std::to_string(v));
  }
}

void check_non_negative(double v, const std::string& path) {
  if (!(v >= 0) || !std::isfinite(v)) {
    throw config::ValidationError(path, "expected a number >= 0, got " + std::to_string(v));
  }
}

void check_positive(double v, const std::string& path) {
  if (!(v > 0) || !std::isfinite(v)) {
    throw config::ValidationError(path, "expected a positive number, got " + std::to_string(v));
  }
}

/// Seconds as a unit quantity with 4 significant digits: "2.345 us".
std::string format_time(double seconds) {
  char text[64];
  std::snprintf(text, sizeof text, "%.4g us", seconds * 1e6);
  return text;
}

}  // namespace

std::string_view name_of(AttentionImpl impl) {
  return kImplNames[static_cast<std::size_t>(impl)];
}

std::optional<AttentionImpl> attention_impl_from_name(std::string_view name) {
  for (AttentionImpl i : kAllAttentionImpls) {
    if (name_of(i) == name) return i;
  }
  return std::nullopt;
}

namespace {

/// A kernel's query x key tile (kBlockM x kBlockN) forward and backward, up to a head dimension.
struct AttentionTiles {
  AttentionImpl impl;
  int head_dim;  // the largest head dimension these tiles serve
  int forward_m, forward_n, backward_m, backward_n;
};

// Sources: causal_diagonal_span's comment (kernel_model.hpp). Rows of one implementation are in
// increasing head dimension; the last serves every larger one.
constexpr AttentionTiles kAttentionTiles[] = {
    {AttentionImpl::flash_attention_2, 64, 128, 128, 128, 128},
    {AttentionImpl::flash_attention_2, 128, 128, 64, 64, 128},
    {AttentionImpl::flash_attention_2, 192, 128, 64, 64, 64},
    {AttentionImpl::flash_attention_2, 256, 64, 64, 64, 64},
    {AttentionImpl::flash_attention, 64, 16, 256, 16, 256},
    {AttentionImpl::flash_attention, 256, 16, 128, 16, 128},
    {AttentionImpl::flash_attention_3, 64, 192, 128, 128, 128},
    {AttentionImpl::flash_attention_3, 96, 192, 144, 64, 128},
    {AttentionImpl::flash_attention_3, 128, 128, 128, 64, 128},
    {AttentionImpl::flash_attention_3, 192, 128, 112, 64, 96},
    {AttentionImpl::flash_attention_3, 256, 128, 80, 64, 80},
    {AttentionImpl::flash_attention_triton, 256, 128, 128, 128, 128},
    {AttentionImpl::cudnn, 256, 128, 128, 128, 128},
};

}  // namespace

int causal_diagonal_span(AttentionImpl impl, double head_dim, bool backward) {
  const AttentionTiles* found = nullptr;
  for (const auto& t : kAttentionTiles) {
    if (t.impl != impl) continue;
    found = &t;
    if (head_dim <= t.head_dim) break;
  }
  if (found == nullptr) {
    throw std::logic_error("no attention tiles for " + std::string(name_of(impl)));
  }
  const int m = backward ? found->backward_m : found->forward_m;
  const int n = backward ? found->backward_n : found->forward_n;
  return m + n - std::gcd(m, n);
}

double AttentionModel::causal_half(AttentionImpl impl, bool is_backward, double head_dim) const {
  const double span = causal_diagonal_span(impl, head_dim, is_backward);
  const double reference = causal_diagonal_span(impl, 128, is_backward);
  return std::max(0.0, seq_half + (causal_seq_half - seq_half) * span / reference);
}

double AttentionModel::efficiency(AttentionImpl impl, bool is_backward, bool causal,
                                  double head_dim, double keys) const {
  // ln-d interpolation through (64, head_dim_64), (128, 1), (256, head_dim_256), clamped.
  const double x = std::clamp(std::log2(std::max(head_dim, 1.0)), 6.0, 8.0);
  const double factor = x <= 7 ? std::exp((7 - x) * std::log(head_dim_64))
                               : std::exp((x - 7) * std::log(head_dim_256));
  const double half = causal ? causal_half(impl, is_backward, head_dim) : seq_half;
  const double falloff = keys / (keys + half);
  const double mask = causal ? causal_factor : 1.0;
  return std::clamp((is_backward ? backward : forward) * factor * falloff * mask, 1e-9, 1.0);
}

std::string_view name_of(GemmScaling scaling) {
  return scaling == GemmScaling::block ? "block" : "tensor";
}

namespace {
bool block_fp8(DType dtype, GemmScaling scaling) {
  return gemm_class_of(dtype, scaling) == GemmClass{DType::fp8, GemmScaling::block};
}
}  // namespace

std::optional<GemmModel>& KernelModel::gemm_slot(DType dtype, GemmScaling scaling) {
  return block_fp8(dtype, scaling) ? gemm_fp8_block : gemm[static_cast<std::size_t>(dtype)];
}

const std::optional<GemmModel>& KernelModel::gemm_slot(DType dtype, GemmScaling scaling) const {
  return block_fp8(dtype, scaling) ? gemm_fp8_block : gemm[static_cast<std::size_t>(dtype)];
}

std::string KernelModel::gemm_key(DType dtype, GemmScaling scaling) {
  return block_fp8(dtype, scaling) ? "fp8-block" : std::string(name_of(dtype));
}

const GemmModel* KernelModel::gemm_for(DType dtype, GemmScaling scaling) const {
  if (block_fp8(dtype, scaling) && gemm_fp8_block) return &*gemm_fp8_block;
  if (const auto& g = gemm[static_cast<std::size_t>(dtype)]) return &*g;
  if (dtype == DType::fp16) {
    if (const auto& g = gemm[static_cast<std::size_t>(DType::bf16)]) return &*g;
  }
  if (dtype == DType::bf16) {
    if (const auto& g = gemm[static_cast<std::size_t>(DType::fp16)]) return &*g;
  }
  return nullptr;
}

const AttentionModel* KernelModel::attention_for(AttentionImpl impl) const {
  const auto& a = attention[static_cast<std::size_t>(impl)];
  return a ? &*a : nullptr;
}

void KernelModel::validate() const {
  for (const auto& [t, scaling] : kGemmClasses) {
    const auto& g = gemm_slot(t, scaling);
    if (!g) continue;
    const std::string at = "gemm." + gemm_key(t, scaling);
    check_fraction(g->peak_fraction, at + ".peak_fraction");
    check_non_negative(g->k_overhead, at + ".k_overhead");
    if (!(g->wave_loss >= 0 && g->wave_loss <= 1)) {
      throw config::ValidationError(
          at + ".wave_loss", "expected a share in [0, 1], got " + std::to_string(g->wave_loss));
    }
    check_non_negative(g->latency, at + ".latency");
  }
  for (AttentionImpl i : kAllAttentionImpls) {
    const auto& a = attention[static_cast<std::size_t>(i)];
    if (!a) continue;
    const std::string at = "attention." + std::string(name_of(i));
    check_fraction(a->forward, at + ".forward");
    check_fraction(a->backward, at + ".backward");
    check_non_negative(a->seq_half, at + ".seq_half");
    check_non_negative(a->causal_seq_half, at + ".causal_seq_half");
    check_positive(a->head_dim_64, at + ".head_dim_64");
    check_positive(a->head_dim_256, at + ".head_dim_256");
    check_positive(a->causal_factor, at + ".causal_factor");
  }
}

KernelModel read_kernel_model(const config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a kernel model");
  const std::string schema = r.string("schema");
  if (schema != KernelModel::kSchema) {
    r.fail("schema",
           "expected \"" + std::string(KernelModel::kSchema) + "\", got \"" + schema + "\"");
  }
  const std::int64_t version = r.integer("schema_version");
  if (version < 1 || version > KernelModel::kSchemaVersion) {
    r.fail("schema_version", "this build reads version " +
                                 std::to_string(KernelModel::kSchemaVersion) + ", the file is " +
                                 std::to_string(version));
  }
  KernelModel m;
  m.device = r.string("device");
  m.source = r.string_or("source", "");
  if (r.has("gemm")) {
    auto g = r.object("gemm", "GEMM parameters per dtype");
    for (const auto& [t, scaling] : kGemmClasses) {
      const std::string key = KernelModel::gemm_key(t, scaling);
      if (!g.has(key)) continue;
      auto e = g.object(key, "GEMM parameters");
      GemmModel gm;
      gm.peak_fraction = e.number("peak_fraction");
      gm.k_overhead = e.number_or("k_overhead", 0);
      gm.wave_loss = e.number_or("wave_loss", 1);
      gm.latency = e.time_or("latency", Time::zero()).seconds();
      gm.cases = read_cases(doc, e);
      e.finish();
      m.gemm_slot(t, scaling) = gm;
    }
    g.finish();
  }
  if (r.has("attention")) {
    auto a = r.object("attention", "attention parameters per implementation");
    for (AttentionImpl i : kAllAttentionImpls) {
      const std::string key(name_of(i));
      if (!a.has(key)) continue;
      auto e = a.object(key, "attention parameters");
      AttentionModel am;
      am.forward = e.number("forward");
      am.backward = e.number("backward");
      am.seq_half = e.number_or("seq_half", 0);
      am.causal_seq_half = e.number_or("causal_seq_half", 0);
      am.head_dim_64 = e.number_or("head_dim_64", 1);
      am.head_dim_256 = e.number_or("head_dim_256", 1);
      am.causal_factor = e.number_or("causal_factor", 1);
      am.cases = read_cases(doc, e);
      e.finish();
      m.attention[static_cast<std::size_t>(i)] = am;
    }
    a.finish();
  }
  if (r.has("fit")) {
    const nlohmann::json* v = doc.find(r.path_of("fit"));
    if (v != nullptr) m.fit = *v;
  }
  r.finish();
  doc.validated(path, [&] { m.validate(); });
  return m;
}

KernelModel load_kernel_model(const std::filesystem::path& file) {
  auto doc = config::Document::load(file);
  return read_kernel_model(doc, "");
}

nlohmann::json to_json(const KernelModel& m) {
  nlohmann::json j = nlohmann::json::object();
  j["schema"] = std::string(KernelModel::kSchema);
  j["schema_version"] = KernelModel::kSchemaVersion;
  j["device"] = m.device;
  j["source"] = m.source;
  nlohmann::json gemm = nlohmann::json::object();
  for (const auto& [t, scaling] : kGemmClasses) {
    const auto& g = m.gemm_slot(t, scaling);
    if (!g) continue;
    gemm[KernelModel::gemm_key(t, scaling)] = {{"peak_fraction", g->peak_fraction},
                                               {"k_overhead", g->k_overhead},
                                               {"wave_loss", g->wave_loss},
                                               {"latency", format_time(g->latency)},
                                               {"cases", g->cases}};
  }
  if (!gemm.empty()) j["gemm"] = gemm;
  nlohmann::json attention = nlohmann::json::object();
  for (AttentionImpl i : kAllAttentionImpls) {
    const auto& a = m.attention[static_cast<std::size_t>(i)];
    if (!a) continue;
    attention[std::string(name_of(i))] = {{"forward", a->forward},
                                          {"backward", a->backward},
                                          {"seq_half", a->seq_half},
                                          {"causal_seq_half", a->causal_seq_half},
                                          {"head_dim_64", a->head_dim_64},
                                          {"head_dim_256", a->head_dim_256},
                                          {"causal_factor", a->causal_factor},
                                          {"cases", a->cases}};
  }
  if (!attention.empty()) j["attention"] = attention;
  if (!m.fit.empty()) j["fit"] = m.fit;
  return j;
}

void write_kernel_model(const KernelModel& model, const std::filesystem::path& file) {
  files::write_atomically(file, to_json(model).dump(2) + "\n");
}

}  // namespace stratasim::hw
