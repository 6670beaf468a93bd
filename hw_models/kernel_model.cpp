#include "hw_models/kernel_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

#include "hw_models/files.hpp"
#include "hw_models/sane_bounds.hpp"

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
  if (!is_efficiency(v)) {
    throw config::ValidationError(
        path, "expected " + efficiency_expected() + " of peak, got " + number_text(v));
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

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

/// DeepGEMM's scale granularity along k (and B's along n): 128.
constexpr std::int64_t kScaleBlock = 128;
/// Shared memory an SM90 CTA may use (DeepGEMM's sm90_capacity).
constexpr std::int64_t kSharedMemory = 232448;

/// DeepGEMM's get_smem_size: C tile (bf16), A, B and A-scale buffers per stage, the B scales of
/// a tile's whole k (twice when they straddle), two barriers per stage.
std::int64_t deepgemm_smem(std::int64_t stages, std::int64_t k, std::int64_t block_m,
                           std::int64_t block_n) {
  const std::int64_t scales_b = ceil_div(k, kScaleBlock) * 4 * (kScaleBlock % block_n == 0 ? 1 : 2);
  return block_m * block_n * 2 + stages * (block_m * kScaleBlock + block_m * 4) +
         stages * block_n * kScaleBlock + ceil_div(scales_b, 8) * 8 + stages * 16;
}

}  // namespace

DeepGemmLaunch deepgemm_launch(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t groups,
                               int sms) {
  const std::int64_t units = std::max(1, sms);
  m = std::max<std::int64_t>(m, 1);
  n = std::max<std::int64_t>(n, 1);
  k = std::max<std::int64_t>(k, 1);
  groups = std::max<std::int64_t>(groups, 1);
  DeepGemmLaunch l;
  l.block_m = m <= 64 ? 64 : 128;
  auto tiles_of = [&](std::int64_t block_n) {
    return ceil_div(m, l.block_m) * ceil_div(n, block_n) * groups;
  };
  // A full last wave counts as `units` (DeepGEMM's fix_wave_saturate).
  auto last_wave = [&](std::int64_t tiles) { return tiles % units == 0 ? units : tiles % units; };
  std::vector<int> block_ns;
  for (int b = 16; b <= 128; b += 8) block_ns.push_back(b);
  block_ns.push_back(144);
  block_ns.push_back(160);
  // Fewest waves, then the fullest last wave, then the smallest block_n (the first seen).
  int best = 0;
  for (int b : block_ns) {
    if (best == 0) {
      best = b;
      continue;
    }
    const std::int64_t waves = ceil_div(tiles_of(b), units);
    const std::int64_t best_waves = ceil_div(tiles_of(best), units);
    if (waves < best_waves ||
        (waves == best_waves && last_wave(tiles_of(b)) > last_wave(tiles_of(best)))) {
      best = b;
    }
  }
  l.block_n = best;
  const std::int64_t straddle = kScaleBlock / std::gcd<std::int64_t>(kScaleBlock, l.block_n);
  const bool straddles = kScaleBlock % l.block_n != 0;
  // Unrolling both the stages and the straddle point makes too much code: 4 stages only.
  const std::vector<int> stage_candidates =
      straddles && straddle <= 4 ? std::vector<int>{4} : std::vector<int>{8, 7, 6, 5, 4};
  l.stages = stage_candidates.back();
  for (int s : stage_candidates) {
    if (deepgemm_smem(s, k, l.block_m, l.block_n) <= kSharedMemory) {
      l.stages = s;
      break;
    }
  }
  l.predicated_promotion = straddles && straddle > 4;
  // TMA multicast over a cluster of 2 SMs, on the larger block's operand first.
  const bool legal_a = n % (2 * l.block_n) == 0 && units % 2 == 0;
  const bool legal_b = m % (2 * l.block_m) == 0 && units % 2 == 0;
  if (m >= 512 && groups == 1) {
    const bool a_first = l.block_m > l.block_n;
    for (bool on_a : {a_first, !a_first}) {
      if (on_a ? legal_a : legal_b) {
        l.multicast = 2;
        l.multicast_on_a = on_a;
        break;
      }
    }
  }
  l.tiles = tiles_of(l.block_n);
  l.waves = ceil_div(l.tiles, units);
  // The fewest SMs that run the tiles in as many waves, at least SMs - 8 (less L2 pressure,
  // higher clocks), in whole clusters.
  const std::int64_t fewest = std::max(ceil_div(l.tiles, l.waves), units - 8);
  l.sms = std::min(units, ceil_div(fewest, l.multicast) * l.multicast);
  return l;
}

double deepgemm_seconds(const GemmModel& model, std::int64_t m, std::int64_t n, std::int64_t k,
                        std::int64_t groups, int sms, double peak_flops, double hbm) {
  const DeepGemmModel p = model.deepgemm.value_or(DeepGemmModel{});
  const DeepGemmLaunch l = deepgemm_launch(m, n, k, groups, sms);
  const double units = std::max(1, sms);
  double rate = peak_flops / units * model.peak_fraction;  // one SM's main loop, FLOP/s
  if (l.predicated_promotion) rate *= p.predicated_promotion;
  const double k_blocks = static_cast<double>(ceil_div(k, kScaleBlock));
  const double main_loop = std::max(2.0 * l.block_m * l.block_n * static_cast<double>(k) / rate,
                                    k_blocks / l.stages * p.load_latency);
  const double compute = static_cast<double>(l.waves) * (main_loop + p.tile_latency);
  const double md = static_cast<double>(m), nd = static_cast<double>(n),
               kd = static_cast<double>(k);
  const double bytes =
      static_cast<double>(groups) * (md * kd + nd * kd + 2 * md * nd + 4 * md * k_blocks +
                                     4 * static_cast<double>(ceil_div(n, kScaleBlock)) * k_blocks);
  const double memory = bytes / (hbm * p.memory_fraction);
  const double e = std::max(1.0, p.overlap);
  return std::pow(std::pow(compute, e) + std::pow(memory, e), 1 / e) + model.latency;
}

std::string_view name_of(GemmScaling scaling) {
  switch (scaling) {
    case GemmScaling::tensor:
      return "tensor";
    case GemmScaling::block:
      return "block";
    case GemmScaling::mx:
      return "mx";
  }
  return "tensor";
}

std::optional<GemmScaling> gemm_scaling_from_name(std::string_view name) {
  for (GemmScaling s : {GemmScaling::tensor, GemmScaling::block, GemmScaling::mx}) {
    if (name_of(s) == name) return s;
  }
  return std::nullopt;
}

std::optional<GemmModel>& KernelModel::gemm_slot(DType dtype, GemmScaling scaling) {
  const GemmClass c = gemm_class_of(dtype, scaling);
  if (c == GemmClass{DType::fp8, GemmScaling::block}) return gemm_fp8_block;
  if (c == GemmClass{DType::fp8, GemmScaling::mx}) return gemm_fp8_mx;
  return gemm[static_cast<std::size_t>(dtype)];
}

const std::optional<GemmModel>& KernelModel::gemm_slot(DType dtype, GemmScaling scaling) const {
  return const_cast<KernelModel*>(this)->gemm_slot(dtype, scaling);
}

std::string KernelModel::gemm_key(DType dtype, GemmScaling scaling) {
  const GemmClass c = gemm_class_of(dtype, scaling);
  if (c.scaling == GemmScaling::tensor) return std::string(name_of(dtype));
  return std::string(name_of(dtype)) + "-" + std::string(name_of(c.scaling));
}

const GemmModel* KernelModel::gemm_for(DType dtype, GemmScaling scaling) const {
  if (const auto& g = gemm_slot(dtype, scaling)) return &*g;
  // Fallbacks (kernel_model.hpp): the FP8 classes and NVFP4 on tensor-scaled FP8, the 16-bit
  // dtypes on each other.
  const auto slot = [&](DType t) { return gemm[static_cast<std::size_t>(t)]; };
  std::optional<DType> other;
  if (dtype == DType::fp8 || dtype == DType::fp4) other = DType::fp8;
  if (dtype == DType::fp16) other = DType::bf16;
  if (dtype == DType::bf16) other = DType::fp16;
  if (other && slot(*other)) return &*gemm[static_cast<std::size_t>(*other)];
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
    if (const auto& d = g->deepgemm) {
      const std::string dg = at + ".deepgemm";
      check_fraction(d->memory_fraction, dg + ".memory_fraction");
      if (!(d->overlap >= 1) || !std::isfinite(d->overlap)) {
        throw config::ValidationError(
            dg + ".overlap", "expected an exponent >= 1, got " + std::to_string(d->overlap));
      }
      check_non_negative(d->load_latency, dg + ".load_latency");
      check_non_negative(d->tile_latency, dg + ".tile_latency");
      check_fraction(d->predicated_promotion, dg + ".predicated_promotion");
    }
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
      if (e.has("deepgemm")) {
        auto d = e.object("deepgemm", "DeepGEMM parameters (docs/gemm-efficiency.md)");
        DeepGemmModel dm;
        dm.memory_fraction = d.number("memory_fraction");
        dm.overlap = d.number("overlap");
        dm.load_latency = d.time("load_latency").seconds();
        dm.tile_latency = d.time("tile_latency").seconds();
        dm.predicated_promotion = d.number_or("predicated_promotion", 1);
        d.finish();
        gm.deepgemm = dm;
      }
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
    nlohmann::json e = {{"peak_fraction", g->peak_fraction},
                        {"latency", format_time(g->latency)},
                        {"cases", g->cases}};
    if (const auto& d = g->deepgemm) {
      e["deepgemm"] = {{"memory_fraction", d->memory_fraction},
                       {"overlap", d->overlap},
                       {"load_latency", format_time(d->load_latency)},
                       {"tile_latency", format_time(d->tile_latency)},
                       {"predicated_promotion", d->predicated_promotion}};
    } else {
      e["k_overhead"] = g->k_overhead;
      e["wave_loss"] = g->wave_loss;
    }
    gemm[KernelModel::gemm_key(t, scaling)] = std::move(e);
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
