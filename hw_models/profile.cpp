#include "hw_models/profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <system_error>

namespace stratasim::hw {

namespace {

constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;

std::string row_path(std::size_t i) {
  return "gemm[" + std::to_string(i) + "]";
}

bool present(config::ObjectReader& r, std::string_view key) {
  if (!r.has(key)) return false;
  const nlohmann::json* v = r.document().find(r.path_of(key));
  return v != nullptr && !v->is_null();
}

GemmMeasurement read_row(config::ObjectReader& r) {
  GemmMeasurement g;
  g.m = r.integer_in("m", 1, kMaxDim);
  g.n = r.integer_in("n", 1, kMaxDim);
  g.k = r.integer_in("k", 1, kMaxDim);
  g.batch = r.integer_in_or("batch", 1, kMaxDim, 1);
  g.dtype = *dtype_from_name(r.choice("dtype", {"fp32", "tf32", "fp16", "bf16", "fp8"}));
  const bool has_time = present(r, "time");
  const bool has_rate = present(r, "rate");
  if (has_time == has_rate) {
    r.fail(has_time ? "rate" : "time",
           "a row gives either the kernel's \"time\" (\"0.18 ms\") or its achieved \"rate\" "
           "(\"610 TFLOP/s\"), exactly one of them");
  }
  if (has_time) {
    g.time = r.time("time");
    if (g.time <= Time::zero()) r.fail("time", "expected a positive duration");
  } else {
    const FlopRate rate = r.flop_rate("rate");
    if (!(rate.flops_per_second() > 0)) r.fail("rate", "expected a positive rate");
    g.time = Time::from_seconds(g.flops().count() / rate.flops_per_second());
    if (g.time <= Time::zero()) r.fail("rate", "gives a duration under one picosecond");
  }
  r.finish();
  return g;
}

std::string exact(double v, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g %s", v, unit);
  return buf;
}

std::string exact(Time t) {
  return std::to_string(t.picoseconds()) + " ps";
}

}  // namespace

Flops GemmMeasurement::flops() const {
  return Flops(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) *
               static_cast<double>(batch));
}

FlopRate GemmMeasurement::rate() const {
  return FlopRate(flops().count() / time.seconds());
}

const GemmMeasurement* DeviceProfile::find_gemm(std::int64_t m, std::int64_t n, std::int64_t k,
                                                std::int64_t batch, DType dtype) const {
  for (const auto& g : gemm) {
    if (g.m == m && g.n == n && g.k == k && g.batch == batch && g.dtype == dtype) return &g;
  }
  return nullptr;
}

bool DeviceProfile::has_gemm(DType dtype) const {
  return std::any_of(gemm.begin(), gemm.end(),
                     [&](const GemmMeasurement& g) { return g.dtype == dtype; });
}

std::vector<std::pair<const GemmMeasurement*, double>> DeviceProfile::nearest_gemms(
    std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, DType dtype,
    std::size_t count) const {
  auto ln = [](std::int64_t v) {
    return std::log(static_cast<double>(std::max<std::int64_t>(1, v)));
  };
  std::vector<std::pair<const GemmMeasurement*, double>> rows;
  for (const auto& g : gemm) {
    if (g.dtype != dtype) continue;
    const double dm = ln(m) - ln(g.m), dn = ln(n) - ln(g.n), dk = ln(k) - ln(g.k),
                 db = ln(batch) - ln(g.batch);
    rows.emplace_back(&g, std::sqrt(dm * dm + dn * dn + dk * dk + db * db));
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  if (rows.size() > count) rows.resize(count);
  return rows;
}

void DeviceProfile::validate() const {
  using config::ValidationError;
  if (schema_version < 1 || schema_version > kSchemaVersion) {
    throw ValidationError("schema_version", "expected 1 to " + std::to_string(kSchemaVersion) +
                                                ", got " + std::to_string(schema_version));
  }
  if (device.empty()) throw ValidationError("device", "expected the measured device's name");
  for (std::size_t i = 0; i < gemm.size(); ++i) {
    const GemmMeasurement& g = gemm[i];
    const std::string at = row_path(i);
    for (auto [key, v] : {std::pair{"m", g.m}, {"n", g.n}, {"k", g.k}, {"batch", g.batch}}) {
      if (v < 1) {
        throw ValidationError(config::join_path(at, key),
                              "expected at least 1, got " + std::to_string(v));
      }
    }
    if (g.time <= Time::zero()) {
      throw ValidationError(config::join_path(at, "time"), "expected a positive duration");
    }
    for (std::size_t j = 0; j < i; ++j) {
      const GemmMeasurement& o = gemm[j];
      if (o.m == g.m && o.n == g.n && o.k == g.k && o.batch == g.batch && o.dtype == g.dtype) {
        throw ValidationError(at, "measures the same shape and dtype as " + row_path(j) +
                                      "; keep one row per (m, n, k, batch, dtype)");
      }
    }
  }
  for (DType t : kAllDTypes) {
    const auto& a = attention[static_cast<std::size_t>(t)];
    if (a && !(a->flops_per_second() > 0)) {
      throw ValidationError("attention." + std::string(name_of(t)), "expected a positive rate");
    }
  }
  if (memory_bandwidth && !(memory_bandwidth->bytes_per_second() > 0)) {
    throw ValidationError("memory_bandwidth", "expected a positive bandwidth");
  }
  if (elementwise_bandwidth && !(elementwise_bandwidth->bytes_per_second() > 0)) {
    throw ValidationError("elementwise_bandwidth", "expected a positive bandwidth");
  }
  if (kernel_launch_overhead && *kernel_launch_overhead < Time::zero()) {
    throw ValidationError("kernel_launch_overhead", "expected a non-negative time");
  }
}

DeviceProfile read_profile(const config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a device profile");
  DeviceProfile p;
  const std::string schema = r.string("schema");
  if (schema != DeviceProfile::kSchema) {
    r.fail("schema",
           "expected \"" + std::string(DeviceProfile::kSchema) + "\", got \"" + schema + "\"");
  }
  const std::int64_t version = r.integer("schema_version");
  if (version > DeviceProfile::kSchemaVersion) {
    r.fail("schema_version", "written for schema version " + std::to_string(version) +
                                 "; this stratasim reads versions up to " +
                                 std::to_string(DeviceProfile::kSchemaVersion));
  }
  if (version < 1) r.fail("schema_version", "expected 1 or more, got " + std::to_string(version));
  p.schema_version = static_cast<int>(version);
  p.device = r.string("device");
  p.date = r.string_or("date", "");
  p.source = r.string("source");
  if (present(r, "kernel_launch_overhead"))
    p.kernel_launch_overhead = r.time("kernel_launch_overhead");
  if (present(r, "memory_bandwidth")) p.memory_bandwidth = r.bandwidth("memory_bandwidth");
  if (present(r, "elementwise_bandwidth")) {
    p.elementwise_bandwidth = r.bandwidth("elementwise_bandwidth");
  }
  if (present(r, "attention")) {
    auto a = r.object("attention", "achieved attention rates per dtype");
    for (DType t : kAllDTypes) {
      if (a.has(name_of(t))) p.attention[static_cast<std::size_t>(t)] = a.flop_rate(name_of(t));
    }
    a.finish();
  }
  if (present(r, "gemm")) {
    const nlohmann::json& list = *doc.find(r.path_of("gemm"));
    if (!list.is_array()) r.fail("gemm", "expected an array of measured GEMM shapes");
    p.gemm.reserve(list.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
      // Dotted paths cannot index arrays: each row is read from a document of its own keyed
      // "gemm[i]", and its errors are raised again at that path in `doc` (naming its file).
      const std::string key = row_path(i);
      auto single = config::Document::from_json(nlohmann::json::object({{key, list[i]}}), "row");
      try {
        config::ObjectReader rr(single, key, "a measured GEMM");
        p.gemm.push_back(read_row(rr));
      } catch (const config::ConfigError& e) {
        doc.fail(config::join_path(path, e.path()), e.message());
      }
    }
  }
  r.finish();
  doc.validated(path, [&] { p.validate(); });
  return p;
}

DeviceProfile load_profile(const std::filesystem::path& file) {
  auto doc = config::Document::load(file);
  return read_profile(doc, "");
}

nlohmann::json to_json(const DeviceProfile& p) {
  nlohmann::json j = nlohmann::json::object();
  j["schema"] = std::string(DeviceProfile::kSchema);
  j["schema_version"] = p.schema_version;
  j["device"] = p.device;
  j["date"] = p.date;
  j["source"] = p.source;
  if (p.kernel_launch_overhead) j["kernel_launch_overhead"] = exact(*p.kernel_launch_overhead);
  if (p.memory_bandwidth)
    j["memory_bandwidth"] = exact(p.memory_bandwidth->bytes_per_second(), "B/s");
  if (p.elementwise_bandwidth) {
    j["elementwise_bandwidth"] = exact(p.elementwise_bandwidth->bytes_per_second(), "B/s");
  }
  nlohmann::json attention = nlohmann::json::object();
  for (DType t : kAllDTypes) {
    const auto& a = p.attention[static_cast<std::size_t>(t)];
    if (a) attention[std::string(name_of(t))] = exact(a->flops_per_second(), "FLOP/s");
  }
  if (!attention.empty()) j["attention"] = attention;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& g : p.gemm) {
    rows.push_back({{"m", g.m},
                    {"n", g.n},
                    {"k", g.k},
                    {"batch", g.batch},
                    {"dtype", std::string(name_of(g.dtype))},
                    {"time", exact(g.time)}});
  }
  j["gemm"] = rows;
  return j;
}

void write_profile(const DeviceProfile& profile, const std::filesystem::path& file) {
  const std::filesystem::path partial = file.string() + ".partial";
  {
    std::ofstream out(partial);
    out << to_json(profile).dump(2) << "\n";
    if (!out) throw std::runtime_error("cannot write " + partial.string());
  }
  std::error_code ec;
  std::filesystem::rename(partial, file, ec);
  if (ec) {
    std::filesystem::remove(partial, ec);
    throw std::runtime_error("cannot write " + file.string());
  }
}

}  // namespace stratasim::hw
