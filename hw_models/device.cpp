#include "hw_models/device.hpp"

namespace stratasim::hw {

namespace {

void check_fraction(double v, const char* path) {
  if (!(v > 0 && v <= 1)) {
    throw config::ValidationError(path, "expected a fraction in (0, 1], got " + std::to_string(v));
  }
}

}  // namespace

FlopRate DeviceSpec::peak(DType t) const {
  auto at = [&](DType d) { return peak_flops[static_cast<std::size_t>(d)]; };
  std::optional<FlopRate> rate = at(t);
  if (!rate) {
    switch (t) {
      case DType::tf32:
        rate = at(DType::fp32);
        break;
      case DType::bf16:
        rate = at(DType::fp16);
        break;
      case DType::fp16:
        rate = at(DType::bf16);
        break;
      case DType::fp8:
        rate = at(DType::fp16) ? at(DType::fp16) : at(DType::bf16);
        break;
      case DType::fp32:
        break;
    }
  }
  if (!rate) {
    throw std::invalid_argument("device " + name + " has no peak rate for " +
                                std::string(name_of(t)));
  }
  return *rate;
}

void DeviceSpec::validate() const {
  if (kind != "gpu") throw config::ValidationError("kind", "expected \"gpu\"");
  bool any = false;
  for (DType t : kAllDTypes) {
    const auto& r = peak_flops[static_cast<std::size_t>(t)];
    if (!r) continue;
    any = true;
    if (!(r->flops_per_second() > 0)) {
      throw config::ValidationError("peak_flops." + std::string(name_of(t)),
                                    "expected a positive rate");
    }
  }
  if (!any) throw config::ValidationError("peak_flops", "expected at least one dtype's peak rate");
  if (memory_capacity.count() <= 0) {
    throw config::ValidationError("memory.capacity", "expected a positive size");
  }
  if (!(memory_bandwidth.bytes_per_second() > 0)) {
    throw config::ValidationError("memory.bandwidth", "expected a positive bandwidth");
  }
  if (compute_units <= 0) throw config::ValidationError("compute_units", "expected at least 1");
  check_fraction(efficiency.gemm, "efficiency.gemm");
  check_fraction(efficiency.attention, "efficiency.attention");
  check_fraction(efficiency.memory, "efficiency.memory");
  if (efficiency.tile_m <= 0 || efficiency.tile_n <= 0) {
    throw config::ValidationError("efficiency.tile_m", "expected positive tile sizes");
  }
}

DeviceSpec read_device(const config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a device");
  DeviceSpec d;
  d.name = r.string("name");
  d.kind = r.choice("kind", {"gpu"});
  d.source = r.string_or("source", "");
  auto peaks = r.object("peak_flops", "peak rates per dtype");
  for (DType t : kAllDTypes) {
    if (peaks.has(name_of(t))) {
      d.peak_flops[static_cast<std::size_t>(t)] = peaks.flop_rate(name_of(t));
    }
  }
  peaks.finish();
  auto memory = r.object("memory", "device memory");
  d.memory_capacity = memory.bytes("capacity");
  d.memory_bandwidth = memory.bandwidth("bandwidth");
  memory.finish();
  d.kernel_launch_overhead = r.time_or("kernel_launch_overhead", d.kernel_launch_overhead);
  d.compute_units = static_cast<int>(r.integer_in_or("compute_units", 1, 1 << 20, d.compute_units));
  if (r.has("efficiency")) {
    auto e = r.object("efficiency", "efficiency settings");
    d.efficiency.gemm = e.number_or("gemm", d.efficiency.gemm);
    d.efficiency.attention = e.number_or("attention", d.efficiency.attention);
    d.efficiency.memory = e.number_or("memory", d.efficiency.memory);
    d.efficiency.tile_m = static_cast<int>(e.integer_in_or("tile_m", 1, 4096, d.efficiency.tile_m));
    d.efficiency.tile_n = static_cast<int>(e.integer_in_or("tile_n", 1, 4096, d.efficiency.tile_n));
    e.finish();
  }
  r.finish();
  doc.validated(path, [&] { d.validate(); });
  return d;
}

}  // namespace stratasim::hw
