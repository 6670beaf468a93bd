#include "study/calibration_set.hpp"

#include <algorithm>
#include <fstream>

#include "hw_models/config_reader.hpp"
#include "study/errors.hpp"

namespace stratasim::study {

namespace {

using strategies::Attention;
using strategies::Gemm;
using strategies::Kernel;

[[noreturn]] void bad(const std::string& file, const std::string& path, const std::string& what) {
  throw config::ConfigError(file, path, what);
}

const nlohmann::json& member(const nlohmann::json& j, const char* key, const std::string& file,
                             const std::string& path) {
  if (!j.is_object() || !j.contains(key)) bad(file, path, std::string("expected \"") + key + "\"");
  return j.at(key);
}

double number(const nlohmann::json& j, const char* key, const std::string& file,
              const std::string& path) {
  const auto& v = member(j, key, file, path);
  if (!v.is_number()) bad(file, path + "." + key, "expected a number");
  return v.get<double>();
}

std::string text(const nlohmann::json& j, const char* key, const std::string& file,
                 const std::string& path) {
  const auto& v = member(j, key, file, path);
  if (!v.is_string()) bad(file, path + "." + key, "expected a string");
  return v.get<std::string>();
}

std::int64_t dimension(const nlohmann::json& j, const char* key, const std::string& file,
                       const std::string& path) {
  const double v = number(j, key, file, path);
  if (!(v >= 1 && v < 1e12) || v != static_cast<double>(static_cast<std::int64_t>(v))) {
    bad(file, path + "." + key, "expected a positive integer");
  }
  return static_cast<std::int64_t>(v);
}

/// "1024x10240x5120" -> {1024, 10240, 5120}.
std::vector<std::int64_t> parse_shape(const std::string& s) {
  std::vector<std::int64_t> dims;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t x = s.find('x', at);
    const std::string part = s.substr(at, x == std::string::npos ? std::string::npos : x - at);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) return {};
    dims.push_back(std::stoll(part));
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return dims;
}

std::optional<hw::AttentionImpl> impl_of(const std::string& kernel) {
  if (kernel == "FlashAttention") return hw::AttentionImpl::flash_attention;
  if (kernel == "FlashAttention-2") return hw::AttentionImpl::flash_attention_2;
  if (kernel == "FlashAttention-3") return hw::AttentionImpl::flash_attention_3;
  if (kernel == "cuDNN") return hw::AttentionImpl::cudnn;
  // The FlashAttention-2 paper's "FlashAttention Triton" series (Tri Dao's Triton kernel, on
  // A100). The FlashAttention-3 paper's "Triton" series is another kernel (the Triton tutorial's,
  // on a later Triton with Hopper instructions) and stays out.
  if (kernel == "FlashAttention Triton") return hw::AttentionImpl::flash_attention_triton;
  return std::nullopt;
}

void gemm_case(const nlohmann::json& c, const std::string& id, const std::string& path,
               const std::string& file, KernelCase base, std::vector<KernelCase>& out,
               std::vector<std::string>* skipped) {
  const auto& config = member(c, "config", file, path);
  const auto& measured = member(c, "measured", file, path);
  const std::string dtype_text = text(config, "dtype", file, path + ".config");
  const DType dtype = dtype_text.rfind("fp8", 0) == 0 ? DType::fp8 : DType::bf16;
  if (dtype_text != "bf16" && dtype == DType::bf16) {
    if (skipped) skipped->push_back(id + ": dtype " + dtype_text + " not modelled");
    return;
  }
  Gemm g;
  g.dtype = dtype;
  // DeepGEMM's "fp8_e4m3 (block-scaled)": 1x128 / 128x128 scales, its own kernel class.
  if (dtype == DType::fp8 && dtype_text.find("block-scaled") != std::string::npos) {
    g.scaling = hw::GemmScaling::block;
  }
  if (config.contains("best_shape_printed")) {
    const auto dims = parse_shape(text(config, "best_shape_printed", file, path + ".config"));
    if (dims.size() != 3) bad(file, path + ".config.best_shape_printed", "expected MxNxK");
    g.m = dims[0];
    g.n = dims[1];
    g.k = dims[2];
  } else if (config.contains("groups")) {
    g.batch = dimension(config, "groups", file, path + ".config");
    g.m = dimension(config, "m_per_group", file, path + ".config");
    g.n = dimension(config, "n", file, path + ".config");
    g.k = dimension(config, "k", file, path + ".config");
  } else {
    g.m = dimension(config, "m", file, path + ".config");
    g.n = dimension(config, "n", file, path + ".config");
    g.k = dimension(config, "k", file, path + ".config");
  }
  const char* rate_key = measured.contains("mamf_tflops") ? "mamf_tflops" : "tflops";
  const auto& rate = member(measured, rate_key, file, path + ".measured");
  if (rate.is_null()) {
    if (skipped)
      skipped->push_back(id + ": published value not legible (null in the calibration set)");
    return;
  }
  const double tflops = number(measured, rate_key, file, path + ".measured");
  if (!(tflops > 0)) bad(file, path + ".measured." + rate_key, "expected a positive rate");
  base.series = std::string("gemm ") + (dtype == DType::fp8 ? "fp8" : "bf16");
  base.flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) *
               static_cast<double>(g.k) * static_cast<double>(g.batch);
  base.published_tflops = tflops;
  base.measured_seconds = base.flops / (tflops * 1e12);
  base.kernels.push_back(Kernel{g, "gemm"});
  out.push_back(std::move(base));
}

void attention_case(const nlohmann::json& c, const std::string& id, const std::string& path,
                    const std::string& file, const KernelCase& base, std::vector<KernelCase>& out,
                    std::vector<std::string>* skipped) {
  const auto& config = member(c, "config", file, path);
  const std::string kernel = text(config, "kernel", file, path + ".config");
  const auto impl = impl_of(kernel);
  if (!impl) {
    if (skipped) skipped->push_back(id + ": kernel " + kernel + " is not a modelled fused kernel");
    return;
  }
  const std::string pass = text(config, "pass_", file, path + ".config");
  if (pass != "fwd" && pass != "bwd" && pass != "fwd+bwd") {
    bad(file, path + ".config.pass_", "expected fwd, bwd or fwd+bwd");
  }
  const auto& causal_v = member(config, "causal", file, path + ".config");
  if (!causal_v.is_boolean()) bad(file, path + ".config.causal", "expected true or false");
  const bool causal = causal_v.get<bool>();
  const std::int64_t d = dimension(config, "headdim", file, path + ".config");
  const auto& sweep = member(member(c, "measured", file, path), "sweep", file, path + ".measured");
  if (!sweep.is_array()) bad(file, path + ".measured.sweep", "expected a list of points");
  for (std::size_t i = 0; i < sweep.size(); ++i) {
    const std::string at = path + ".measured.sweep." + std::to_string(i);
    const auto& p = sweep[i];
    const std::int64_t s = dimension(p, "seqlen", file, at);
    const std::int64_t b = dimension(p, "batch", file, at);
    const std::int64_t h = dimension(p, "nheads", file, at);
    const std::string point = id + "@" + std::to_string(s);
    if (member(p, "tflops", file, at).is_null()) {
      if (skipped)
        skipped->push_back(point + ": published value not legible (null in the calibration set)");
      continue;
    }
    const double tflops = number(p, "tflops", file, at);
    if (!(tflops > 0)) bad(file, at + ".tflops", "expected a positive rate");
    KernelCase k = base;
    k.id = point;
    k.attention = true;
    k.series = std::string(hw::name_of(*impl)) + " " + pass + (causal ? " causal" : "") + " hd" +
               std::to_string(d);
    const double forward = 4.0 * static_cast<double>(b) * static_cast<double>(s) *
                           static_cast<double>(s) * static_cast<double>(h) *
                           static_cast<double>(d) * (causal ? 0.5 : 1.0);
    k.flops = forward * (pass == "fwd" ? 1.0 : pass == "bwd" ? 2.5 : 3.5);
    k.published_tflops = tflops;
    k.measured_seconds = k.flops / (tflops * 1e12);
    for (bool backward : {false, true}) {
      if ((backward && pass == "fwd") || (!backward && pass == "bwd")) continue;
      k.kernels.push_back(Kernel{Attention{b, h, h, s, s, d, causal, DType::fp16, backward, *impl},
                                 backward ? "attention.bwd" : "attention"});
    }
    out.push_back(std::move(k));
  }
}

}  // namespace

nlohmann::json load_calibration(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw config::ConfigError(file, "", "cannot read the calibration file");
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded()) throw config::ConfigError(file, "", "not valid JSON");
  if (!doc.is_object() || !doc.contains("cases") || !doc["cases"].is_array()) {
    throw config::ConfigError(file, "cases", "expected a list of cases (a calibration file)");
  }
  return doc;
}

std::vector<KernelCase> kernel_cases(const nlohmann::json& doc, const std::string& file,
                                     std::vector<std::string>* skipped) {
  std::vector<KernelCase> out;
  const auto& cases = member(doc, "cases", file, "");
  if (!cases.is_array()) bad(file, "cases", "expected a list of cases");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string path = "cases." + std::to_string(i);
    const auto& c = cases[i];
    const std::string category = text(c, "category", file, path);
    if (category != "gemm" && category != "attention_kernel") continue;
    KernelCase base;
    base.id = text(c, "id", file, path);
    base.source = text(member(c, "source", file, path), "ref", file, path + ".source");
    base.gpu = text(member(c, "hardware", file, path), "gpu", file, path + ".hardware");
    if (category == "gemm") {
      gemm_case(c, base.id, path, file, base, out, skipped);
    } else {
      attention_case(c, base.id, path, file, base, out, skipped);
    }
  }
  return out;
}

std::vector<KernelCase> cases_for(const std::vector<KernelCase>& cases,
                                  const hw::DeviceSpec& device) {
  std::vector<KernelCase> out;
  for (const auto& c : cases) {
    if (std::find(device.published_names.begin(), device.published_names.end(), c.gpu) !=
        device.published_names.end()) {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace stratasim::study
