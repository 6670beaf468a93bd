#include "hw_models/profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "hw_models/cluster.hpp"
#include "hw_models/files.hpp"

namespace stratasim::hw {

namespace {

constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;

constexpr std::int64_t kMaxRanks = std::int64_t{1} << 20;

std::string row_path(std::size_t i) {
  return "gemm[" + std::to_string(i) + "]";
}

std::string collective_path(std::size_t i) {
  return "collectives[" + std::to_string(i) + "]";
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

CollectiveMeasurementRow read_collective(config::ObjectReader& r) {
  static_assert(std::size(kCollectiveKindNames) == 6);
  CollectiveMeasurementRow c;
  const std::string kind =
      r.choice("kind", {kCollectiveKindNames[0], kCollectiveKindNames[1], kCollectiveKindNames[2],
                        kCollectiveKindNames[3], kCollectiveKindNames[4], kCollectiveKindNames[5]});
  c.kind = static_cast<std::uint8_t>(
      std::find(std::begin(kCollectiveKindNames), std::end(kCollectiveKindNames), kind) -
      std::begin(kCollectiveKindNames));
  c.ranks = static_cast<int>(r.integer_in("ranks", 2, kMaxRanks));
  c.bytes = r.bytes("bytes");
  if (c.bytes <= Bytes(0)) r.fail("bytes", "expected a positive size");
  c.time = r.time("time");
  if (c.time <= Time::zero()) r.fail("time", "expected a positive duration");
  r.finish();
  return c;
}

/// Reads the array at `key` row by row. Dotted paths cannot index arrays: each row is read from
/// a document of its own keyed "key[i]", and its errors are raised again at that path in `doc`
/// (naming its file).
template <class Read>
void read_rows(const config::Document& doc, const std::string& path, config::ObjectReader& r,
               std::string_view key, std::string_view what_array, std::string_view what_row,
               Read read) {
  const nlohmann::json& list = *doc.find(r.path_of(key));
  if (!list.is_array()) r.fail(key, "expected an array of " + std::string(what_array));
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string at = std::string(key) + "[" + std::to_string(i) + "]";
    auto single = config::Document::from_json(nlohmann::json::object({{at, list[i]}}), "row");
    try {
      config::ObjectReader rr(single, at, what_row);
      read(rr);
    } catch (const config::ConfigError& e) {
      doc.fail(config::join_path(path, e.path()), e.message());
    }
  }
}

std::string exact(double v, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g %s", v, unit);
  return buf;
}

std::string exact(Time t) {
  return std::to_string(t.picoseconds()) + " ps";
}

std::string exact(Bytes b) {
  return std::to_string(b.count()) + " B";
}

}  // namespace

Time lower_median(std::vector<Time> values) {
  if (values.empty()) throw std::invalid_argument("lower_median: no timings");
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

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

Time interpolate_collective(const CollectiveCurve& curve, Bytes bytes) {
  if (curve.empty()) throw std::invalid_argument("interpolate_collective: no measured points");
  const auto& [first_bytes, first_time] = curve.front();
  if (bytes <= first_bytes) return first_time;  // the floor (and the smallest size itself)
  const auto& [last_bytes, last_time] = curve.back();
  if (bytes >= last_bytes) {
    // The largest row's bandwidth: t_n S / S_n.
    const double t = static_cast<double>(last_time.picoseconds()) *
                     (static_cast<double>(bytes.count()) / static_cast<double>(last_bytes.count()));
    return Time::ps(std::llround(t));
  }
  // First point at or above `bytes`; its predecessor is below.
  const auto above = std::lower_bound(curve.begin(), curve.end(), bytes,
                                      [](const auto& point, Bytes b) { return point.first < b; });
  if (above->first == bytes) return above->second;
  const auto below = above - 1;
  const double x = std::log(static_cast<double>(bytes.count()));
  const double xa = std::log(static_cast<double>(below->first.count()));
  const double xb = std::log(static_cast<double>(above->first.count()));
  const double ta = static_cast<double>(below->second.picoseconds());
  const double tb = static_cast<double>(above->second.picoseconds());
  return Time::ps(std::llround(ta + (tb - ta) * (x - xa) / (xb - xa)));
}

CollectiveCurve DeviceProfile::collective_curve(std::size_t kind, int ranks) const {
  CollectiveCurve curve;
  for (const auto& c : collectives) {
    if (c.kind == kind && c.ranks == ranks) curve.emplace_back(c.bytes, c.time);
  }
  std::sort(curve.begin(), curve.end());
  return curve;
}

std::optional<Time> DeviceProfile::collective_time(std::size_t kind, int ranks, Bytes bytes) const {
  const CollectiveCurve curve = collective_curve(kind, ranks);
  if (curve.empty()) return std::nullopt;
  return interpolate_collective(curve, bytes);
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
  if (host_to_device_bandwidth && !(host_to_device_bandwidth->bytes_per_second() > 0)) {
    throw ValidationError("copy_bandwidth.host_to_device", "expected a positive bandwidth");
  }
  if (device_to_host_bandwidth && !(device_to_host_bandwidth->bytes_per_second() > 0)) {
    throw ValidationError("copy_bandwidth.device_to_host", "expected a positive bandwidth");
  }
  for (std::size_t i = 0; i < collectives.size(); ++i) {
    const CollectiveMeasurementRow& c = collectives[i];
    const std::string at = collective_path(i);
    if (c.kind >= std::size(kCollectiveKindNames)) {
      throw ValidationError(config::join_path(at, "kind"),
                            "expected a collective kind, got index " + std::to_string(c.kind));
    }
    if (c.ranks < 2) {
      throw ValidationError(config::join_path(at, "ranks"),
                            "expected at least 2 devices, got " + std::to_string(c.ranks));
    }
    if (c.bytes <= Bytes(0)) {
      throw ValidationError(config::join_path(at, "bytes"), "expected a positive size");
    }
    if (c.time <= Time::zero()) {
      throw ValidationError(config::join_path(at, "time"), "expected a positive duration");
    }
    for (std::size_t j = 0; j < i; ++j) {
      const CollectiveMeasurementRow& o = collectives[j];
      if (o.kind == c.kind && o.ranks == c.ranks && o.bytes == c.bytes) {
        throw ValidationError(at, "measures the same collective, group size and size as " +
                                      collective_path(j) +
                                      "; keep one row per (kind, ranks, bytes)");
      }
    }
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
    read_rows(doc, path, r, "gemm", "measured GEMM shapes", "a measured GEMM",
              [&](config::ObjectReader& rr) { p.gemm.push_back(read_row(rr)); });
  }
  // Keys of schema version 2.
  for (const char* key : {"copy_bandwidth", "collectives"}) {
    if (version < 2 && present(r, key)) {
      r.fail(key, "was added in schema version 2; this file says \"schema_version\": " +
                      std::to_string(version));
    }
  }
  if (present(r, "copy_bandwidth")) {
    auto c = r.object("copy_bandwidth", "achieved host <-> device copy bandwidths");
    if (c.has("host_to_device")) p.host_to_device_bandwidth = c.bandwidth("host_to_device");
    if (c.has("device_to_host")) p.device_to_host_bandwidth = c.bandwidth("device_to_host");
    c.finish();
  }
  if (present(r, "collectives")) {
    read_rows(doc, path, r, "collectives", "measured collectives", "a measured collective",
              [&](config::ObjectReader& rr) { p.collectives.push_back(read_collective(rr)); });
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
  j["schema_version"] = DeviceProfile::kSchemaVersion;
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
  nlohmann::json copy = nlohmann::json::object();
  if (p.host_to_device_bandwidth) {
    copy["host_to_device"] = exact(p.host_to_device_bandwidth->bytes_per_second(), "B/s");
  }
  if (p.device_to_host_bandwidth) {
    copy["device_to_host"] = exact(p.device_to_host_bandwidth->bytes_per_second(), "B/s");
  }
  if (!copy.empty()) j["copy_bandwidth"] = copy;
  if (!p.collectives.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& c : p.collectives) {
      list.push_back({{"kind", std::string(kCollectiveKindNames[c.kind])},
                      {"ranks", c.ranks},
                      {"bytes", exact(c.bytes)},
                      {"time", exact(c.time)}});
    }
    j["collectives"] = list;
  }
  return j;
}

void write_profile(const DeviceProfile& profile, const std::filesystem::path& file) {
  files::write_atomically(file, to_json(profile).dump(2) + "\n");
}

}  // namespace stratasim::hw
