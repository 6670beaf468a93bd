// The Blackwell devices and clusters (B200, B300, GB200, GB300; DGX B200/B300, GB200/GB300 NVL72
// racks): the shipped files load with their datasheet figures, an NVL72 rack is one 72-GPU
// NVLink node, and a node larger than its intra fabric's NVLink domain or an unknown device is
// an error naming the key.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hw_models/cluster.hpp"
#include "hw_models/device.hpp"
#include "hw_models/helpers.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"

using namespace stratasim;

namespace {

using testing::error_of;

const std::filesystem::path kDevices = testing::configs_dir() / "hardware/devices";
const std::filesystem::path kClusters = testing::configs_dir() / "hardware/clusters";

double tflops(const hw::DeviceSpec& d, DType t) {
  return d.peak(t).flops_per_second() / 1e12;
}

double gb(Bytes b) {
  return static_cast<double>(b.count()) / 1e9;
}

double gb_per_s(Bandwidth b) {
  return b.bytes_per_second() / 1e9;
}

}  // namespace

TEST_CASE("Blackwell devices: the datasheet figures, dense (sparse tensor figures halved)") {
  // NVIDIA HGX B200: per 8 GPUs BF16 36 PFLOP/s, TF32 18, FP8 72 (sparse), FP32 600 TFLOP/s;
  // 1,440 GB HBM3e at 64 TB/s; 148 SMs (Blackwell technical brief).
  const auto b200 = hw::load_device(kDevices / "b200-sxm-180gb.json");
  CHECK(tflops(b200, DType::bf16) == doctest::Approx(36000.0 / 8 / 2));
  CHECK(tflops(b200, DType::tf32) == doctest::Approx(18000.0 / 8 / 2));
  CHECK(tflops(b200, DType::fp8) == doctest::Approx(72000.0 / 8 / 2));
  CHECK(tflops(b200, DType::fp32) == doctest::Approx(600.0 / 8));
  CHECK(gb(b200.memory_capacity) == doctest::Approx(1440.0 / 8));
  CHECK(gb_per_s(b200.memory_bandwidth) == doctest::Approx(64000.0 / 8));
  CHECK(b200.compute_units == 148);

  // NVIDIA HGX B300: the B200's BF16, TF32 and FP8 figures; 288 GB HBM3e per GPU at 8 TB/s;
  // 160 SMs (NVIDIA, "Inside NVIDIA Blackwell Ultra").
  const auto b300 = hw::load_device(kDevices / "b300-sxm-288gb.json");
  CHECK(tflops(b300, DType::bf16) == doctest::Approx(36000.0 / 8 / 2));
  CHECK(tflops(b300, DType::fp8) == doctest::Approx(72000.0 / 8 / 2));
  CHECK(gb(b300.memory_capacity) == doctest::Approx(288));
  CHECK(gb_per_s(b300.memory_bandwidth) == doctest::Approx(8000));
  CHECK(b300.compute_units == 160);

  // NVIDIA GB200 NVL72, per 72 GPUs: BF16 360 PFLOP/s, TF32 180, FP8 720 (sparse), FP32 5,760
  // TFLOP/s; 13.4 TB HBM3e at 576 TB/s (186 GB, 8 TB/s per GPU).
  const auto gb200 = hw::load_device(kDevices / "gb200-186gb.json");
  CHECK(tflops(gb200, DType::bf16) == doctest::Approx(360000.0 / 72 / 2));
  CHECK(tflops(gb200, DType::tf32) == doctest::Approx(180000.0 / 72 / 2));
  CHECK(tflops(gb200, DType::fp8) == doctest::Approx(720000.0 / 72 / 2));
  CHECK(tflops(gb200, DType::fp32) == doctest::Approx(5760.0 / 72));
  CHECK(gb(gb200.memory_capacity) == doctest::Approx(13400.0 / 72).epsilon(0.001));
  CHECK(gb_per_s(gb200.memory_bandwidth) == doctest::Approx(576000.0 / 72));

  // NVIDIA GB300 NVL72, per 72 GPUs: BF16 360 PFLOP/s, FP8 720 (sparse); 288 GB per GPU.
  const auto gb300 = hw::load_device(kDevices / "gb300-288gb.json");
  CHECK(tflops(gb300, DType::bf16) == doctest::Approx(360000.0 / 72 / 2));
  CHECK(tflops(gb300, DType::fp8) == doctest::Approx(720000.0 / 72 / 2));
  CHECK(gb(gb300.memory_capacity) == doctest::Approx(288));
  CHECK(gb300.compute_units == 160);

  // One die per generation (NVIDIA publishes no die code names): the GB parts are the same dies
  // as the HGX parts, so they share what the end-to-end fit learns of them.
  CHECK(b200.die == "Blackwell");
  CHECK(gb200.die == "Blackwell");
  CHECK(b300.die == "Blackwell Ultra");
  CHECK(gb300.die == "Blackwell Ultra");
  // Each has a calibrated GEMM model for bf16 and fp8 (fitted to mamf-finder's best shapes).
  for (const auto* d : {&b200, &b300, &gb200, &gb300}) {
    CAPTURE(d->name);
    REQUIRE(d->kernel_model != nullptr);
    CHECK(d->kernel_model->gemm_for(DType::bf16) != nullptr);
    CHECK(d->kernel_model->gemm_for(DType::fp8) != nullptr);
  }
}

TEST_CASE("Blackwell clusters: DGX nodes of 8, an NVL72 rack one NVLink node of 72") {
  const auto dgx_b200 = hw::load_cluster(kClusters / "dgx-b200-1.json");
  CHECK(dgx_b200.world_size() == 8);
  CHECK(gb_per_s(dgx_b200.intra_node.bandwidth) == doctest::Approx(900));  // 1.8 TB/s both ways
  CHECK(gb_per_s(dgx_b200.inter_node.bandwidth) == doctest::Approx(50));   // 400 Gb/s ConnectX-7
  const auto dgx_b300 = hw::load_cluster(kClusters / "dgx-b300-1.json");
  CHECK(gb_per_s(dgx_b300.inter_node.bandwidth) == doctest::Approx(100));  // 800 Gb/s ConnectX-8

  const auto rack = hw::load_cluster(kClusters / "gb200-nvl72-1.json");
  CHECK(rack.nodes == 1);
  CHECK(rack.devices_per_node == 72);
  CHECK(rack.device.name == "GB200-186GB");
  REQUIRE(rack.collectives.nccl.has_value());
  CHECK(rack.collectives.nccl->intra.nvlink_domain == 72);
  // The host tier: 36 Grace CPUs of 480 GB LPDDR5X at 512 GB/s and 72 cores each; NVLink-C2C
  // 900 GB/s both ways per superchip = 450 GB/s per direction for its two GPUs.
  REQUIRE(rack.host.has_value());
  CHECK(gb(rack.host->memory_capacity) == doctest::Approx(36 * 480));
  CHECK(gb_per_s(rack.host->memory_bandwidth) == doctest::Approx(36 * 512));
  CHECK(rack.host->cores == 36 * 72);
  CHECK(gb_per_s(rack.host->pcie.bandwidth) == doctest::Approx(900.0 / 2 / 2));

  // Eight racks joined by one 800 Gb/s NIC per GB300 GPU.
  const auto racks = hw::load_cluster(kClusters / "gb300-nvl72-8.json");
  CHECK(racks.world_size() == 8 * 72);
  CHECK(gb_per_s(racks.inter_node.bandwidth) == doctest::Approx(100));
  // The calibration set's 8-GPU GB200 rows: two compute trays (4 Graces) of a rack.
  const auto trays = hw::load_cluster(kClusters / "gb200-nvl72-8gpus.json");
  CHECK(trays.world_size() == 8);
  CHECK(gb(trays.host->memory_capacity) == doctest::Approx(4 * 480));
}

TEST_CASE(
    "Blackwell clusters: a node beyond its NVLink domain, or an unknown device, is an error") {
  const testing::TempDir tmp("blackwell");
  auto load = [&](const nlohmann::json& j) {
    // Written beside the shipped clusters' relative paths: the device and fabric files resolve.
    const auto file = tmp.path() / "cluster.json";
    std::ofstream(file) << j.dump();
    return hw::load_cluster(file);
  };
  auto shipped = [&](const char* name) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(kClusters / name));
    const auto rel = [&](const std::string& p) {
      return (kClusters / p).lexically_normal().string();
    };
    j["device"] = rel(j["device"].get<std::string>());
    j["collectives"]["intra_fabric"] = rel(j["collectives"]["intra_fabric"].get<std::string>());
    j["collectives"]["network_fabric"] = rel(j["collectives"]["network_fabric"].get<std::string>());
    return j;
  };
  // As shipped, both load.
  CHECK(load(shipped("gb200-nvl72-1.json")).world_size() == 72);
  CHECK(load(shipped("dgx-b200-1.json")).world_size() == 8);
  {
    // 144 GPUs in one node: an NVL72 rack's NVLink domain holds 72.
    auto j = shipped("gb200-nvl72-1.json");
    j["devices_per_node"] = 144;
    const auto e = error_of([&] { load(j); });
    CHECK(e.path() == "devices_per_node");
    CHECK(std::string(e.what()).find("at most 72") != std::string::npos);
    CHECK(std::string(e.what()).find("nvlink5-nvl72") != std::string::npos);
  }
  {
    // A 72-GPU node on the HGX B200 fabric, whose baseboard connects 8.
    auto j = shipped("dgx-b200-1.json");
    j["devices_per_node"] = 72;
    const auto e = error_of([&] { load(j); });
    CHECK(e.path() == "devices_per_node");
    CHECK(std::string(e.what()).find("at most 8") != std::string::npos);
  }
  {
    // 64 of a rack's 72 GPUs (NVL72 racks often run 16 of 18 trays): within the domain.
    auto j = shipped("gb200-nvl72-1.json");
    j["devices_per_node"] = 64;
    CHECK(load(j).world_size() == 64);
  }
  {
    auto j = shipped("gb200-nvl72-1.json");
    j["device"] = (kDevices / "gb400-999gb.json").string();
    const auto e = error_of([&] { load(j); });
    CHECK(e.path() == "device");
  }
}
