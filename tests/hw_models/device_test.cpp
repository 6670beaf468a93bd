// Devices: FPGA figures (peaks derived from the DSP array, memory from the off-chip tiers),
// strict reading of GPU and FPGA device files, the shipped FPGA catalog, and measured profiles
// (schema, errors, references from a device file).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "hw_models/cluster.hpp"
#include "hw_models/device.hpp"
#include "hw_models/helpers.hpp"
#include "hw_models/profile.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using config::ConfigError;

namespace {

using testing::error_of;

double peak_of(const hw::DeviceSpec& d, DType t) {
  return d.peak(t).flops_per_second();
}

/// A small valid FPGA device as JSON; tests break one key at a time.
nlohmann::json fpga_json() {
  return nlohmann::json::parse(R"({
    "name": "test-fpga", "kind": "fpga", "source": "test",
    "fpga": {
      "dsp_count": 1000, "clock": "500 MHz",
      "ops_per_dsp_per_cycle": {"int8": 4, "fp16": 1, "fp32": 0.5},
      "dataflow_efficiency": 0.75,
      "on_chip_memory": {"capacity": "32 MB", "bandwidth": "10 TB/s"},
      "off_chip_memory": {"hbm": {"capacity": "8 GiB", "bandwidth": "400 GB/s"},
                          "ddr": {"capacity": "32 GiB", "bandwidth": "40 GB/s"}},
      "pcie": {"bandwidth": "16 GB/s", "latency": "1 us"},
      "network_ports": {"count": 2, "bandwidth": "100 Gb/s", "latency": "1 us"}
    },
    "efficiency": {"attention": 0.4, "memory": 0.9}
  })");
}

hw::DeviceSpec read(const nlohmann::json& j) {
  auto doc = config::Document::from_json(j, "dev.json");
  return hw::read_device(doc, "");
}

nlohmann::json profile_json() {
  return nlohmann::json::parse(R"({
    "schema": "stratasim-device-profile", "schema_version": 1,
    "device": "test-fpga", "date": "2025-01-01", "source": "test",
    "kernel_launch_overhead": "3 us",
    "memory_bandwidth": "300 GB/s",
    "attention": {"fp16": "1 TFLOP/s"},
    "gemm": [
      {"m": 1024, "n": 1024, "k": 1024, "dtype": "fp16", "time": "2 ms"},
      {"m": 512, "n": 512, "k": 512, "batch": 4, "dtype": "fp16", "rate": "0.5 TFLOP/s"}
    ]
  })");
}

}  // namespace

TEST_CASE("FPGA: the peak per dtype is DSPs x clock x operations per DSP per cycle") {
  auto d = read(fpga_json());
  CHECK(d.kind == "fpga");
  REQUIRE(d.is_fpga());
  // 1000 DSPs x 500e6 Hz: fp16 1 op -> 5e11 FLOP/s; fp32 0.5 -> 2.5e11; int8 4 -> 2e12 ops/s.
  CHECK(peak_of(d, DType::fp16) == doctest::Approx(5e11));
  CHECK(peak_of(d, DType::fp32) == doctest::Approx(2.5e11));
  CHECK(d.fpga->int8_peak_ops().value() == doctest::Approx(2e12));
  // The usual fallbacks: bf16 and fp8 run on the fp16 datapath, tf32 on fp32's.
  CHECK(peak_of(d, DType::bf16) == doctest::Approx(5e11));
  CHECK(peak_of(d, DType::fp8) == doctest::Approx(5e11));
  CHECK(peak_of(d, DType::tf32) == doctest::Approx(2.5e11));
  // Memory is the off-chip memory: 8 GiB HBM + 32 GiB DDR, streamed at HBM's 400 GB/s.
  CHECK(d.memory_capacity == Bytes(40LL << 30));
  CHECK(d.memory_bandwidth.bytes_per_second() == doctest::Approx(4e11));
  CHECK(d.fpga->on_chip.capacity == Bytes(32'000'000));
  CHECK(d.fpga->dataflow_efficiency == 0.75);
  CHECK(d.efficiency.gemm == 0.75);  // the dataflow efficiency stands in for it
  CHECK(d.efficiency.attention == 0.4);
  CHECK(d.efficiency.memory == 0.9);
  CHECK(d.kernel_launch_overhead == Time::us(1));  // the FPGA default
  CHECK(d.fpga->network->count == 2);
  CHECK(d.fpga->network->bandwidth.bytes_per_second() == doctest::Approx(12.5e9));
  CHECK(d.fpga->pcie->latency == Time::us(1));

  // DDR only: memory bandwidth is the DDR's.
  auto j = fpga_json();
  j["fpga"]["off_chip_memory"].erase("hbm");
  auto ddr = read(j);
  CHECK(ddr.memory_capacity == Bytes(32LL << 30));
  CHECK(ddr.memory_bandwidth.bytes_per_second() == doctest::Approx(4e10));
}

TEST_CASE("FPGA: make_fpga_device derives what read_device derives") {
  hw::FpgaSpec f;
  f.dsp_count = 2000;
  f.clock_hz = 250e6;
  f.ops_per_dsp_per_cycle[static_cast<std::size_t>(DType::fp16)] = 2;
  f.dataflow_efficiency = 0.5;
  f.on_chip = {Bytes(1'000'000), Bandwidth(1e13)};
  f.ddr = hw::MemoryTierSpec{Bytes(1'000'000'000), Bandwidth(1e11)};
  auto d = hw::make_fpga_device("f", f);
  // 2000 x 250e6 x 2 = 1e12 FLOP/s.
  CHECK(peak_of(d, DType::fp16) == doctest::Approx(1e12));
  CHECK_THROWS_AS(d.peak(DType::fp32), std::invalid_argument);  // no fp32 datapath
  CHECK(d.memory_capacity == Bytes(1'000'000'000));
  CHECK(d.memory_bandwidth.bytes_per_second() == doctest::Approx(1e11));
  CHECK_NOTHROW(d.validate());
}

TEST_CASE("FPGA: clock frequencies parse with their unit") {
  CHECK(hw::parse_frequency("300 MHz") == doctest::Approx(3e8));
  CHECK(hw::parse_frequency("1.2 GHz") == doctest::Approx(1.2e9));
  CHECK(hw::parse_frequency("600e6 Hz") == doctest::Approx(6e8));
  CHECK(hw::parse_frequency("250kHz") == doctest::Approx(2.5e5));
  CHECK_THROWS_AS(hw::parse_frequency("300"), UnitError);
  CHECK_THROWS_AS(hw::parse_frequency("300 MB"), UnitError);
  CHECK_THROWS_AS(hw::parse_frequency("-1 MHz"), UnitError);
}

TEST_CASE("FPGA: device file errors name the path") {
  SUBCASE("a missing DSP count") {
    auto j = fpga_json();
    j["fpga"].erase("dsp_count");
    auto e = error_of([&] { read(j); });
    CHECK(e.source() == "dev.json");
    CHECK(e.path() == "fpga.dsp_count");
    CHECK(e.message().find("missing required key") != std::string::npos);
  }
  SUBCASE("an FPGA without its figures") {
    auto j = fpga_json();
    j.erase("fpga");
    CHECK(error_of([&] { read(j); }).path() == "fpga");
  }
  SUBCASE("a clock without a unit") {
    auto j = fpga_json();
    j["fpga"]["clock"] = "300";
    auto e = error_of([&] { read(j); });
    CHECK(e.path() == "fpga.clock");
    CHECK(e.message().find("MHz") != std::string::npos);
  }
  SUBCASE("no off-chip memory") {
    auto j = fpga_json();
    j["fpga"]["off_chip_memory"] = nlohmann::json::object();
    CHECK(error_of([&] { read(j); }).path() == "fpga.off_chip_memory");
  }
  SUBCASE("an efficiency out of range") {
    auto j = fpga_json();
    j["fpga"]["dataflow_efficiency"] = 1.5;
    CHECK(error_of([&] { read(j); }).path() == "fpga.dataflow_efficiency");
  }
  SUBCASE("no floating-point datapath") {
    auto j = fpga_json();
    j["fpga"]["ops_per_dsp_per_cycle"] = {{"int8", 4}};
    CHECK(error_of([&] { read(j); }).path() == "fpga.ops_per_dsp_per_cycle");
  }
  SUBCASE("a misspelt key is suggested") {
    auto j = fpga_json();
    j["fpga"]["dsp_cuont"] = 3;
    auto e = error_of([&] { read(j); });
    CHECK(e.path() == "fpga.dsp_cuont");
    CHECK(std::string(e.what()).find("did you mean 'dsp_count'") != std::string::npos);
  }
  SUBCASE("GPU keys an FPGA derives or lacks") {
    auto j = fpga_json();
    j["peak_flops"] = {{"fp16", "10 TFLOP/s"}};
    auto e = error_of([&] { read(j); });
    CHECK(e.path() == "peak_flops");
    CHECK(e.message().find("derived") != std::string::npos);
    j = fpga_json();
    j["memory"] = {{"capacity", "1 GiB"}, {"bandwidth", "1 TB/s"}};
    CHECK(error_of([&] { read(j); }).path() == "memory");
    j = fpga_json();
    j["compute_units"] = 10;
    CHECK(error_of([&] { read(j); }).path() == "compute_units");
    j = fpga_json();
    j["die"] = "GH100";
    CHECK(error_of([&] { read(j); }).path() == "die");
    j = fpga_json();
    j["efficiency"]["tile_m"] = 64;
    CHECK(error_of([&] { read(j); }).path() == "efficiency.tile_m");
    j = fpga_json();
    j["efficiency"]["gemm"] = 0.5;
    auto eg = error_of([&] { read(j); });
    CHECK(eg.path() == "efficiency.gemm");
    CHECK(eg.message().find("dataflow_efficiency") != std::string::npos);
  }
  SUBCASE("FPGA keys on a GPU are rejected") {
    auto j = nlohmann::json::parse(R"({"name": "g", "kind": "gpu",
      "peak_flops": {"bf16": "100 TFLOP/s"}, "memory": {"capacity": "1 GiB", "bandwidth": "1 TB/s"}})");
    CHECK_NOTHROW(read(j));
    j["fpga"] = fpga_json()["fpga"];
    auto e = error_of([&] { read(j); });
    CHECK(e.path() == "fpga");
    CHECK(e.message().find("only for devices of \"kind\": \"fpga\"") != std::string::npos);
  }
  SUBCASE("an unknown kind") {
    auto j = fpga_json();
    j["kind"] = "tpu";
    CHECK(error_of([&] { read(j); }).path() == "kind");
  }
}

TEST_CASE("FPGA catalog: every shipped FPGA loads with its datasheet figures") {
  const auto dir = testing::configs_dir() / "hardware/devices";
  // Alveo U250: 12,288 DSP48E2 at an assumed 300 MHz: fp16 1 op/DSP/cycle -> 3.6864 TFLOP/s,
  // fp32 0.5 -> 1.8432, int8 4 (2 packed MACs) -> 14.7456 TOPS; 64 GiB DDR4 at 77 GB/s; 54 MB
  // of BRAM + URAM.
  auto u250 = hw::load_device(dir / "alveo-u250.json");
  CHECK(u250.name == "Alveo-U250");
  CHECK(peak_of(u250, DType::fp16) == doctest::Approx(12288 * 300e6 * 1));
  CHECK(peak_of(u250, DType::fp16) == doctest::Approx(3.6864e12));
  CHECK(peak_of(u250, DType::fp32) == doctest::Approx(1.8432e12));
  CHECK(u250.fpga->int8_peak_ops().value() == doctest::Approx(14.7456e12));
  CHECK(u250.memory_capacity == Bytes(64LL << 30));
  CHECK(u250.memory_bandwidth.bytes_per_second() == doctest::Approx(77e9));
  CHECK(u250.fpga->on_chip.capacity == Bytes(54'000'000));
  CHECK(u250.fpga->network->count == 2);
  CHECK(u250.fpga->network->bandwidth.bytes_per_second() == doctest::Approx(100e9 / 8));
  // Alveo U280: 9,024 DSPs x 300 MHz = 2.7072 TFLOP/s fp16; 8 GiB HBM2 (460 GB/s) + 32 GiB DDR4.
  auto u280 = hw::load_device(dir / "alveo-u280.json");
  CHECK(peak_of(u280, DType::fp16) == doctest::Approx(2.7072e12));
  CHECK(u280.memory_capacity == Bytes(40LL << 30));
  CHECK(u280.memory_bandwidth.bytes_per_second() == doctest::Approx(460e9));
  CHECK(u280.fpga->ddr->bandwidth.bytes_per_second() == doctest::Approx(38.5e9));
  // VU9P on AWS F1: 6,840 DSPs x 250 MHz = 1.71 TFLOP/s fp16, 6.84 int8 TOPS; 64 GiB DDR4;
  // no network ports (PCIe only).
  auto f1 = hw::load_device(dir / "vu9p-aws-f1.json");
  CHECK(peak_of(f1, DType::fp16) == doctest::Approx(1.71e12));
  CHECK(f1.fpga->int8_peak_ops().value() == doctest::Approx(6.84e12));
  CHECK(f1.memory_capacity == Bytes(64LL << 30));
  CHECK_FALSE(f1.fpga->network.has_value());
  CHECK(f1.fpga->pcie.has_value());
  // Stratix 10 NX 2100: 3,960 AI tensor blocks x 30 MACs x 2 x 600 MHz = 142.56 TOPS int8 and
  // TFLOP/s block fp16 (Intel's "143"); no fp32 multipliers in the tensor blocks.
  auto nx = hw::load_device(dir / "stratix10-nx-2100.json");
  CHECK(peak_of(nx, DType::fp16) == doctest::Approx(142.56e12));
  CHECK(nx.fpga->int8_peak_ops().value() == doctest::Approx(142.56e12));
  CHECK_THROWS_AS(nx.peak(DType::fp32), std::invalid_argument);
  CHECK(nx.memory_bandwidth.bytes_per_second() == doctest::Approx(512e9));
  // Every FPGA cluster loads, with its device and a link per level.
  for (const char* name : {"fpga-u250-8", "fpga-u280-8", "aws-f1-16xlarge", "fpga-s10nx-8"}) {
    CAPTURE(name);
    auto c = hw::load_cluster(testing::configs_dir() / "hardware/clusters" /
                              (std::string(name) + ".json"));
    CHECK(c.world_size() == 8);
    CHECK(c.device.is_fpga());
  }
  // The mixed server: U250s with U280s as a per-device override.
  auto mixed = hw::load_cluster(testing::configs_dir() / "hardware/clusters/fpga-u250-u280-8.json");
  CHECK(mixed.device_of(0).name == "Alveo-U250");
  CHECK(mixed.device_of(3).name == "Alveo-U250");
  CHECK(mixed.device_of(4).name == "Alveo-U280");
  CHECK(mixed.device_of(7).memory_bandwidth.bytes_per_second() == doctest::Approx(460e9));
  // QSFP28 ring: 100 Gb/s = 12.5 GB/s per direction, 1 us.
  auto ring = hw::load_cluster(testing::configs_dir() / "hardware/clusters/fpga-u250-8.json");
  CHECK(ring.intra_node.bandwidth.bytes_per_second() == doctest::Approx(12.5e9));
  CHECK(ring.intra_node.latency == Time::us(1));
}

TEST_CASE("GPU devices read as before and carry no FPGA figures") {
  auto a100 = hw::load_device(testing::configs_dir() / "hardware/devices/a100-sxm4-80gb.json");
  CHECK(a100.kind == "gpu");
  CHECK_FALSE(a100.is_fpga());
  CHECK(a100.profile == nullptr);
  CHECK(a100.compute_units == 108);
  CHECK(a100.efficiency.tile_m == 128);
}

TEST_CASE("profile: the schema reads, and every row is a measurement") {
  auto doc = config::Document::from_json(profile_json(), "p.json");
  auto p = hw::read_profile(doc, "");
  CHECK(p.device == "test-fpga");
  CHECK(p.date == "2025-01-01");
  CHECK(p.kernel_launch_overhead == Time::us(3));
  CHECK(p.memory_bandwidth->bytes_per_second() == doctest::Approx(3e11));
  CHECK_FALSE(p.elementwise_bandwidth.has_value());
  CHECK(p.attention[static_cast<std::size_t>(DType::fp16)]->flops_per_second() ==
        doctest::Approx(1e12));
  REQUIRE(p.gemm.size() == 2);
  CHECK(p.gemm[0].time == Time::ms(2));
  // 2 * 1024^3 = 2147483648 FLOPs in 2 ms: 1.073741824e12 FLOP/s.
  CHECK(p.gemm[0].rate().flops_per_second() == doctest::Approx(1.073741824e12));
  // A rate row becomes a time: 2 * 512^3 * 4 = 1073741824 FLOPs at 5e11 = 2147483.648 ns.
  CHECK(p.gemm[1].batch == 4);
  CHECK(p.gemm[1].time == Time::ps(2147483648));
  CHECK(p.find_gemm(1024, 1024, 1024, 1, DType::fp16) == &p.gemm[0]);
  CHECK(p.find_gemm(1024, 1024, 1024, 1, DType::bf16) == nullptr);
  CHECK(p.find_gemm(1024, 1024, 1024, 2, DType::fp16) == nullptr);
  // Nearest by log distance: (1024, 1024, 2048) is ln 2 from row 0; row 1 is
  // sqrt(3 ln^2 2 ... ) farther.
  auto near = p.nearest_gemms(1024, 1024, 2048, 1, DType::fp16, 4);
  REQUIRE(near.size() == 2);
  CHECK(near[0].first == &p.gemm[0]);
  CHECK(near[0].second == doctest::Approx(std::log(2.0)));
  CHECK(p.nearest_gemms(1024, 1024, 2048, 1, DType::fp16, 1).size() == 1);
  CHECK(p.nearest_gemms(1024, 1024, 2048, 1, DType::fp32, 4).empty());
}

TEST_CASE("profile: errors name the row and key") {
  auto fails_at = [](const nlohmann::json& j) {
    auto doc = config::Document::from_json(j, "p.json");
    return error_of([&] { hw::read_profile(doc, ""); });
  };
  auto j = profile_json();
  j["schema"] = "something-else";
  CHECK(fails_at(j).path() == "schema");
  j = profile_json();
  j["schema_version"] = 3;
  auto ev = fails_at(j);
  CHECK(ev.path() == "schema_version");
  CHECK(ev.message().find("reads versions up to 2") != std::string::npos);
  j = profile_json();
  j["gemm"][1]["time"] = "1 ms";  // both time and rate
  CHECK(fails_at(j).path() == "gemm[1].rate");
  j = profile_json();
  j["gemm"][0].erase("time");  // neither
  CHECK(fails_at(j).path() == "gemm[0].time");
  j = profile_json();
  j["gemm"][0]["m"] = 0;
  CHECK(fails_at(j).path() == "gemm[0].m");
  j = profile_json();
  j["gemm"][1]["dtype"] = "int4";
  CHECK(fails_at(j).path() == "gemm[1].dtype");
  j = profile_json();
  j["gemm"].push_back(j["gemm"][0]);  // the same shape twice
  auto ed = fails_at(j);
  CHECK(ed.path() == "gemm[2]");
  CHECK(ed.message().find("same shape and dtype as gemm[0]") != std::string::npos);
  j = profile_json();
  j.erase("device");
  CHECK(fails_at(j).path() == "device");
}

TEST_CASE("profile: to_json writes what read_profile reads back") {
  auto doc = config::Document::from_json(profile_json(), "p.json");
  auto p = hw::read_profile(doc, "");
  const testing::TempDir tmp("hw-models");
  auto file = tmp.write("roundtrip-profile.json", "");
  hw::write_profile(p, file);
  auto q = hw::load_profile(file);
  CHECK(q.device == p.device);
  CHECK(q.source == p.source);
  CHECK(q.kernel_launch_overhead == p.kernel_launch_overhead);
  CHECK(q.memory_bandwidth->bytes_per_second() == p.memory_bandwidth->bytes_per_second());
  REQUIRE(q.gemm.size() == p.gemm.size());
  for (std::size_t i = 0; i < p.gemm.size(); ++i) {
    CHECK(q.gemm[i].time == p.gemm[i].time);  // exact: written in picoseconds
    CHECK(q.gemm[i].batch == p.gemm[i].batch);
  }
  CHECK(q.attention[static_cast<std::size_t>(DType::fp16)]->flops_per_second() ==
        p.attention[static_cast<std::size_t>(DType::fp16)]->flops_per_second());
  CHECK_FALSE(std::filesystem::exists(file.string() + ".partial"));
}

TEST_CASE("profile: a device names its profile file relative to itself, or inlines it") {
  const testing::TempDir tmp("hw-models");
  tmp.write("profiles/p.json", profile_json().dump());
  auto j = fpga_json();
  j["profile"] = "profiles/p.json";
  auto device_file = tmp.write("profiled-fpga.json", j.dump());
  auto d = hw::load_device(device_file);
  REQUIRE(d.profile != nullptr);
  CHECK(d.profile->gemm.size() == 2);
  // Copies share the profile.
  auto copy = d;
  CHECK(copy.profile.get() == d.profile.get());

  j["profile"] = profile_json();  // inline
  CHECK(read(j).profile->kernel_launch_overhead == Time::us(3));

  j["profile"] = "profiles/missing.json";
  auto missing = tmp.write("profiled-missing.json", j.dump());
  auto e = error_of([&] { hw::load_device(missing); });
  CHECK(e.path() == "profile");
  CHECK(e.message().find("does not exist") != std::string::npos);

  // An error inside the profile names the profile's file.
  auto bad = profile_json();
  bad["gemm"][0]["k"] = -1;
  auto bad_file = tmp.write("profiles/bad.json", bad.dump());
  j["profile"] = "profiles/bad.json";
  auto with_bad = tmp.write("profiled-bad.json", j.dump());
  auto eb = error_of([&] { hw::load_device(with_bad); });
  CHECK(eb.source() == bad_file.string());
  CHECK(eb.path() == "gemm[0].k");

  // A profile measured on another device is a mistake.
  auto other = profile_json();
  other["device"] = "H100-SXM5-80GB";
  j["profile"] = other;
  auto eo = error_of([&] { read(j); });
  CHECK(eo.path() == "profile.device");
  CHECK(eo.message().find("measured on H100-SXM5-80GB") != std::string::npos);
}

TEST_CASE("profile: the shipped example loads and says it is not a measurement") {
  auto p = hw::load_profile(testing::configs_dir() / "hardware/profiles/example-a100.json");
  CHECK(p.device == "A100-SXM4-80GB");
  CHECK(p.source.find("ILLUSTRATIVE EXAMPLE") != std::string::npos);
  CHECK(p.has_gemm(DType::bf16));
  CHECK_FALSE(p.gemm.empty());
}
