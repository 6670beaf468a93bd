#include "hw_models/device.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "hw_models/sane_bounds.hpp"

namespace stratasim::hw {

namespace {

void check_fraction(double v, const std::string& path) {
  if (!is_efficiency(v)) {
    throw config::ValidationError(path,
                                  "expected " + efficiency_expected() + ", got " + number_text(v));
  }
}

void check_tier(const MemoryTierSpec& t, const std::string& path) {
  if (t.capacity.count() <= 0) {
    throw config::ValidationError(path + ".capacity", "expected a positive size");
  }
  if (!(t.bandwidth.bytes_per_second() > 0)) {
    throw config::ValidationError(path + ".bandwidth", "expected a positive bandwidth");
  }
}

void check_port(const PortSpec& p, const std::string& path) {
  if (p.count < 1) throw config::ValidationError(path + ".count", "expected at least 1 port");
  if (!(p.bandwidth.bytes_per_second() > 0)) {
    throw config::ValidationError(path + ".bandwidth", "expected a positive bandwidth");
  }
  if (p.latency < Time::zero()) {
    throw config::ValidationError(path + ".latency", "expected a non-negative time");
  }
}

MemoryTierSpec read_tier(config::ObjectReader r) {
  MemoryTierSpec t{r.bytes("capacity"), r.bandwidth("bandwidth")};
  r.finish();
  return t;
}

PortSpec read_port(config::ObjectReader r, int default_count) {
  PortSpec p;
  p.count = static_cast<int>(r.integer_in_or("count", 1, 1024, default_count));
  p.bandwidth = r.bandwidth("bandwidth");
  p.latency = r.time("latency");
  r.finish();
  return p;
}

/// The "fpga" object of an FPGA device.
FpgaSpec read_fpga(config::ObjectReader r) {
  FpgaSpec f;
  f.dsp_count = r.integer_in("dsp_count", 1, std::int64_t{1} << 40);
  const std::string clock = r.string("clock");
  try {
    f.clock_hz = parse_frequency(clock);
  } catch (const UnitError& e) {
    r.fail("clock", e.what());
  }
  auto ops = r.object("ops_per_dsp_per_cycle", "operations per DSP per cycle, per dtype");
  for (DType t : kAllDTypes) {
    if (ops.has(name_of(t)))
      f.ops_per_dsp_per_cycle[static_cast<std::size_t>(t)] = ops.number(name_of(t));
  }
  if (ops.has("int8")) f.int8_ops_per_dsp_per_cycle = ops.number("int8");
  ops.finish();
  f.dataflow_efficiency = r.number_or("dataflow_efficiency", f.dataflow_efficiency);
  f.on_chip = read_tier(r.object("on_chip_memory", "on-chip SRAM (capacity, bandwidth)"));
  auto off = r.object("off_chip_memory", "off-chip memory: \"hbm\" and/or \"ddr\"");
  if (off.has("hbm")) f.hbm = read_tier(off.object("hbm", "in-package HBM (capacity, bandwidth)"));
  if (off.has("ddr")) f.ddr = read_tier(off.object("ddr", "on-board DDR (capacity, bandwidth)"));
  if (!f.hbm && !f.ddr) {
    off.document().fail(off.path(), "expected \"hbm\" and/or \"ddr\" (capacity, bandwidth)");
  }
  off.finish();
  if (r.has("pcie")) f.pcie = read_port(r.object("pcie", "the host link"), 1);
  if (r.has("network_ports")) {
    f.network = read_port(r.object("network_ports", "FPGA-to-FPGA ports"), 1);
  }
  r.finish();
  return f;
}

}  // namespace

double parse_frequency(std::string_view text) {
  const std::string s(text);
  const char* begin = s.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  auto bad = [&]() -> double {
    throw UnitError(
        "expected a frequency with a unit (Hz, kHz, MHz, GHz), such as \"300 MHz\"; "
        "got \"" +
        s + "\"");
  };
  if (end == begin || !std::isfinite(value) || value <= 0) return bad();
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  if (unit == "Hz") return value;
  if (unit == "kHz") return value * 1e3;
  if (unit == "MHz") return value * 1e6;
  if (unit == "GHz") return value * 1e9;
  return bad();
}

std::optional<FlopRate> FpgaSpec::peak(DType t) const {
  const auto& ops = ops_per_dsp_per_cycle[static_cast<std::size_t>(t)];
  if (!ops) return std::nullopt;
  return FlopRate(static_cast<double>(dsp_count) * clock_hz * *ops);
}

std::optional<double> FpgaSpec::int8_peak_ops() const {
  if (!int8_ops_per_dsp_per_cycle) return std::nullopt;
  return static_cast<double>(dsp_count) * clock_hz * *int8_ops_per_dsp_per_cycle;
}

Bytes FpgaSpec::off_chip_capacity() const {
  return (hbm ? hbm->capacity : Bytes(0)) + (ddr ? ddr->capacity : Bytes(0));
}

Bandwidth FpgaSpec::off_chip_bandwidth() const {
  if (hbm) return hbm->bandwidth;
  return ddr ? ddr->bandwidth : Bandwidth(0);
}

void FpgaSpec::validate() const {
  if (dsp_count <= 0) throw config::ValidationError("dsp_count", "expected at least 1 DSP");
  if (!(clock_hz > 0)) throw config::ValidationError("clock", "expected a positive frequency");
  bool any = false;
  for (DType t : kAllDTypes) {
    const auto& ops = ops_per_dsp_per_cycle[static_cast<std::size_t>(t)];
    if (!ops) continue;
    any = true;
    if (!(*ops > 0)) {
      throw config::ValidationError("ops_per_dsp_per_cycle." + std::string(name_of(t)),
                                    "expected a positive number of operations");
    }
  }
  if (int8_ops_per_dsp_per_cycle && !(*int8_ops_per_dsp_per_cycle > 0)) {
    throw config::ValidationError("ops_per_dsp_per_cycle.int8",
                                  "expected a positive number of operations");
  }
  if (!any) {
    throw config::ValidationError("ops_per_dsp_per_cycle",
                                  "expected a floating-point dtype (fp32, fp16, bf16, ...)");
  }
  check_fraction(dataflow_efficiency, "dataflow_efficiency");
  check_tier(on_chip, "on_chip_memory");
  if (!hbm && !ddr) {
    throw config::ValidationError("off_chip_memory", "expected \"hbm\" and/or \"ddr\"");
  }
  if (hbm) check_tier(*hbm, "off_chip_memory.hbm");
  if (ddr) check_tier(*ddr, "off_chip_memory.ddr");
  if (pcie) check_port(*pcie, "pcie");
  if (network) check_port(*network, "network_ports");
}

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
      case DType::fp4:  // no FP4 tensor cores: no rate (strategies/precision.hpp refuses it)
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
  if (kind != "gpu" && kind != "fpga") {
    throw config::ValidationError("kind", "expected \"gpu\" or \"fpga\"");
  }
  if (kind == "fpga") {
    if (!fpga) throw config::ValidationError("fpga", "expected the FPGA's figures");
    try {
      fpga->validate();
    } catch (const config::ValidationError& e) {
      throw config::ValidationError(config::join_path("fpga", e.path()), e.what());
    }
  } else if (fpga) {
    throw config::ValidationError("fpga", "FPGA figures on a device of kind \"" + kind + "\"");
  }
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
  if (kernel_launch_overhead < Time::zero()) {
    throw config::ValidationError("kernel_launch_overhead", "expected a non-negative time");
  }
  if (compute_units <= 0) throw config::ValidationError("compute_units", "expected at least 1");
  check_fraction(efficiency.gemm, "efficiency.gemm");
  check_fraction(efficiency.attention, "efficiency.attention");
  check_fraction(efficiency.memory, "efficiency.memory");
  if (efficiency.tile_m <= 0 || efficiency.tile_n <= 0) {
    throw config::ValidationError("efficiency.tile_m", "expected positive tile sizes");
  }
}

DeviceSpec make_fpga_device(std::string name, FpgaSpec fpga) {
  DeviceSpec d;
  d.name = std::move(name);
  d.kind = "fpga";
  for (DType t : kAllDTypes) d.peak_flops[static_cast<std::size_t>(t)] = fpga.peak(t);
  d.memory_capacity = fpga.off_chip_capacity();
  d.memory_bandwidth = fpga.off_chip_bandwidth();
  d.kernel_launch_overhead = Time::us(1);
  d.efficiency.gemm = fpga.dataflow_efficiency;
  d.fpga = std::move(fpga);
  return d;
}

namespace {

// A device's "profile" or "kernel_model": the path of a file (relative to the file that names
// it) or the object inline. What it reads must name this device.
template <class T, class Load, class Read>
std::shared_ptr<const T> read_referenced(const config::Document& doc, config::ObjectReader& r,
                                         const char* key, const std::string& what,
                                         const std::string& other_device, const std::string& device,
                                         Load load, Read read) {
  const std::string at = r.path_of(key);
  const nlohmann::json* value = doc.find(at);
  std::shared_ptr<const T> out;
  if (value != nullptr && value->is_string()) {
    std::filesystem::path file = value->get<std::string>();
    const std::filesystem::path base = doc.file_of(at);
    if (file.is_relative() && !base.empty()) file = base.parent_path() / file;
    file = file.lexically_normal();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) {
      r.fail(key, "names the file " + file.string() + ", which does not exist");
    }
    out = std::make_shared<const T>(load(file));
  } else if (value != nullptr && value->is_object()) {
    out = std::make_shared<const T>(read(doc, at));
  } else if (value != nullptr) {
    r.fail(key, "expected the path of " + what + " file or " + what + " object");
  }
  if (out && out->device != device) {
    doc.fail(value->is_object() ? config::join_path(at, "device") : at,
             other_device + out->device + ", but this device is " + device);
  }
  return out;
}

}  // namespace

DeviceSpec read_device(const config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a device");
  DeviceSpec d;
  const std::string name = r.string("name");
  const std::string kind = r.choice("kind", {"gpu", "fpga"});
  if (kind == "fpga") {
    // The DSP array and the off-chip memory define the roofline: no second source of truth.
    if (r.has("peak_flops")) {
      r.fail("peak_flops",
             "an FPGA's peak is derived (fpga.dsp_count x fpga.clock x "
             "fpga.ops_per_dsp_per_cycle); remove \"peak_flops\"");
    }
    if (r.has("memory")) {
      r.fail("memory", "an FPGA's memory is derived from fpga.off_chip_memory; remove \"memory\"");
    }
    if (r.has("compute_units")) {
      r.fail("compute_units", "GPU-only (SMs); an FPGA's parallelism is fpga.dsp_count");
    }
    if (r.has("die")) r.fail("die", "GPU-only (the GPU's compute die, e.g. \"GH100\")");
    d = make_fpga_device(name, read_fpga(r.object("fpga", "the FPGA's figures")));
  } else {
    d.name = name;
    d.kind = kind;
    if (r.has("fpga")) {
      r.fail("fpga",
             "FPGA figures are only for devices of \"kind\": \"fpga\"; this one is a " + kind);
    }
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
    d.compute_units =
        static_cast<int>(r.integer_in_or("compute_units", 1, 1 << 20, d.compute_units));
    d.die = r.string_or("die", "");
  }
  d.source = r.string_or("source", "");
  if (r.has("published_names")) {
    const nlohmann::json* names = doc.find(r.path_of("published_names"));
    if (names == nullptr || !names->is_array()) {
      r.fail("published_names", "expected a list of names (strings)");
    }
    for (const auto& n : *names) {
      if (!n.is_string() || n.get<std::string>().empty()) {
        r.fail("published_names", "expected a list of non-empty names (strings)");
      }
      d.published_names.push_back(n.get<std::string>());
    }
  }
  d.kernel_launch_overhead = r.time_or("kernel_launch_overhead", d.kernel_launch_overhead);
  if (r.has("efficiency")) {
    auto e = r.object("efficiency", "efficiency settings");
    if (d.is_fpga()) {
      if (e.has("gemm")) e.fail("gemm", "an FPGA's GEMM efficiency is fpga.dataflow_efficiency");
      for (const char* tile : {"tile_m", "tile_n"}) {
        if (e.has(tile)) e.fail(tile, "GPU-only (GEMM tiles); FPGAs have no tile quantisation");
      }
    } else {
      d.efficiency.gemm = e.number_or("gemm", d.efficiency.gemm);
      d.efficiency.tile_m =
          static_cast<int>(e.integer_in_or("tile_m", 1, 4096, d.efficiency.tile_m));
      d.efficiency.tile_n =
          static_cast<int>(e.integer_in_or("tile_n", 1, 4096, d.efficiency.tile_n));
    }
    d.efficiency.attention = e.number_or("attention", d.efficiency.attention);
    d.efficiency.memory = e.number_or("memory", d.efficiency.memory);
    e.finish();
  }
  // "kernel_model_of": the device whose fitted kernel model this one uses, when both carry the
  // same die at the same clocks (the H800 SXM5 and the H100 SXM5: configs/hardware/devices/);
  // the file must have been fitted for that device.
  const std::string model_device = r.string_or("kernel_model_of", d.name);
  if (model_device != d.name && !r.has("kernel_model")) {
    r.fail("kernel_model_of",
           "names the device whose kernel_model this one uses: give kernel_model");
  }
  if (r.has("kernel_model")) {
    if (d.is_fpga()) r.fail("kernel_model", "GPU-only (fitted GEMM and attention parameters)");
    d.kernel_model = read_referenced<KernelModel>(doc, r, "kernel_model", "a kernel model",
                                                  "the kernel model was fitted for ", model_device,
                                                  load_kernel_model, read_kernel_model);
  }
  if (r.has("profile")) {
    d.profile = read_referenced<DeviceProfile>(doc, r, "profile", "a profile",
                                               "the profile was measured on ", d.name, load_profile,
                                               read_profile);
  }
  r.finish();
  doc.validated(path, [&] { d.validate(); });
  return d;
}

}  // namespace stratasim::hw
