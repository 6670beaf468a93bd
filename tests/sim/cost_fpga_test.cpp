// The FPGA cost model (a layer-pipelined dataflow roofline, docs/fpga.md) and per-rank costs
// on heterogeneous clusters (device overrides, stragglers).
#include <doctest/doctest.h>

#include <stdexcept>

#include "sim/cost.hpp"
#include "sim/helpers.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using strategies::Attention;
using strategies::Copy;
using strategies::Elementwise;
using strategies::Gemm;
using strategies::Kernel;
using strategies::Measured;
using strategies::MemoryTier;
using strategies::OptimizerKind;
using strategies::OptimizerStep;
using strategies::RooflineWork;

namespace {

/// 1000 DSPs at 1 GHz: fp16 2 ops/DSP/cycle = 2e12 FLOP/s, fp32 1 = 1e12; dataflow efficiency
/// 0.5 (so 1e12 FLOP/s fp16 achieved); on chip `on_chip` bytes at 10 TB/s, DDR 1 GB at
/// 100 GB/s, efficiency.memory 0.5 (5 TB/s and 50 GB/s achieved); attention 0.25; 1 us per
/// kernel.
hw::DeviceSpec test_fpga(Bytes on_chip = Bytes(1'000'000)) {
  hw::FpgaSpec f;
  f.dsp_count = 1000;
  f.clock_hz = 1e9;
  f.ops_per_dsp_per_cycle[static_cast<std::size_t>(DType::fp16)] = 2;
  f.ops_per_dsp_per_cycle[static_cast<std::size_t>(DType::fp32)] = 1;
  f.dataflow_efficiency = 0.5;
  f.on_chip = {on_chip, Bandwidth(1e13)};
  f.ddr = hw::MemoryTierSpec{Bytes(1'000'000'000), Bandwidth(1e11)};
  auto d = hw::make_fpga_device("test-fpga", f);
  d.efficiency.memory = 0.5;
  d.efficiency.attention = 0.25;
  return d;
}

Time time_of(const sim::DeviceCostModel& cost, strategies::KernelWork work) {
  return cost.kernel_time(Kernel{std::move(work), "k"});
}

}  // namespace

TEST_CASE("FPGA cost: GEMMs at peak x dataflow efficiency, no tile or wave quantisation") {
  sim::DeviceCostModel cost(test_fpga());
  // Any shape: the dataflow efficiency, whatever the tiles would have been on a GPU.
  CHECK(cost.gemm_efficiency(Gemm{1000, 1000, 1000, 1, DType::fp16}) == 0.5);
  CHECK(cost.gemm_efficiency(Gemm{129, 7, 3, 5, DType::fp16}) == 0.5);
  CHECK(cost.quantisation(Gemm{129, 7, 3, 5, DType::fp16}) == 1.0);
  // 1000^3: 2e9 FLOPs at 2e12 x 0.5 = 2 ms. Bytes (3 x 1e6) x 2 = 6e6; the weights (B: 1000 x
  // 1000 x 2 = 2e6 bytes) exceed the 1e6 bytes on chip, so they stream from DDR at 5e10 B/s:
  // 120 us, shorter. Plus 1 us.
  CHECK(time_of(cost, Gemm{1000, 1000, 1000, 1, DType::fp16}) == Time::us(1) + Time::ms(2));
  // fp32: 1e12 x 0.5 = 5e11 FLOP/s: 4 ms.
  CHECK(time_of(cost, Gemm{1000, 1000, 1000, 1, DType::fp32}) == Time::us(1) + Time::ms(4));
  // Empty shapes cost the overhead only.
  CHECK(time_of(cost, Gemm{0, 10, 10, 1, DType::fp16}) == Time::us(1));
}

TEST_CASE("FPGA cost: on-chip memory when the weights fit, off-chip when they do not") {
  // m = 1e6, n = k = 8: 2 x 1e6 x 64 = 1.28e8 FLOPs at 1e12 = 128 us. Bytes (8e6 + 64 + 8e6) x
  // 2 = 32000128; weights 8 x 8 x 2 = 128 bytes.
  const Gemm thin{1'000'000, 8, 8, 1, DType::fp16};
  // On chip (128 <= 1e6 bytes): 32000128 / 5e12 = 6.4 us, shorter: 1 us + 128 us.
  CHECK(time_of(sim::DeviceCostModel(test_fpga()), thin) == Time::us(129));
  // Exactly fits (128 bytes on chip): still on chip.
  CHECK(time_of(sim::DeviceCostModel(test_fpga(Bytes(128))), thin) == Time::us(129));
  // 100 bytes on chip: the weights stream from DDR, and so does the layer: 32000128 / 5e10 =
  // 640.00256 us = 640002560 ps, longer than the 128 us of compute.
  CHECK(time_of(sim::DeviceCostModel(test_fpga(Bytes(100))), thin) ==
        Time::us(1) + Time::ps(640'002'560));
}

TEST_CASE("FPGA cost: layer-table work (RooflineWork) by its bytes") {
  sim::DeviceCostModel cost(test_fpga());
  // 1e9 FLOPs at 1e12 = 1 ms; 1e6 bytes fit on chip (1e6): 1e6 / 5e12 = 0.2 us. 1 us + 1 ms.
  CHECK(time_of(cost, RooflineWork{Flops(1e9), Bytes(1'000'000), DType::fp16}) ==
        Time::us(1) + Time::ms(1));
  // 1e8 FLOPs = 100 us; 1e8 bytes do not fit: 1e8 / 5e10 = 2 ms, memory-bound.
  CHECK(time_of(cost, RooflineWork{Flops(1e8), Bytes(100'000'000), DType::fp16}) ==
        Time::us(1) + Time::ms(2));
  // With 1 GB on chip they fit: 1e8 / 5e12 = 20 us, compute-bound at 100 us.
  CHECK(time_of(sim::DeviceCostModel(test_fpga(Bytes(1'000'000'000))),
                RooflineWork{Flops(1e8), Bytes(100'000'000), DType::fp16}) == Time::us(101));
}

TEST_CASE("FPGA cost: attention and memory-bound work as roofline from off-chip memory") {
  sim::DeviceCostModel cost(test_fpga());
  // b 1, h 8, s 1024, d 128, causal forward: 2147483648 FLOPs at 2e12 x 0.25 = 5e11:
  // 4294967296 ps. Bytes (2*8*1024*128*2)*2 = 8388608 at 5e10 = 167.8 us, shorter.
  CHECK(time_of(cost, Attention{1, 8, 8, 1024, 1024, 128, true, DType::fp16, false}) ==
        Time::us(1) + Time::ps(4'294'967'296));
  // Elementwise: 2e6 bytes at 5e10 = 40 us.
  CHECK(time_of(cost, Elementwise{1'000'000, Bytes(1'000'000), Bytes(1'000'000)}) == Time::us(41));
  // Adam, fp16 weights: 28 bytes per parameter: 2.8e7 / 5e10 = 560 us.
  CHECK(time_of(cost, OptimizerStep{1'000'000, OptimizerKind::adam, DType::fp16, false}) ==
        Time::us(561));
  // A device-to-device copy reads and writes: 2e6 / 5e10 = 40 us.
  CHECK(time_of(cost, Copy{Bytes(1'000'000), MemoryTier::device, MemoryTier::device}) ==
        Time::us(41));
  // Measured work is taken as measured.
  CHECK(time_of(cost, Measured{Time::us(7)}) == Time::us(7));
}

TEST_CASE("FPGA cost: a catalog FPGA by hand (Alveo U250, fp16)") {
  auto cluster = hw::load_cluster(testing::configs_dir() / "hardware/clusters/fpga-u250-8.json");
  sim::DeviceCostModel cost(cluster);
  // 4096^3 fp16: 2 x 4096^3 = 137438953472 FLOPs at 12288 x 300e6 x 1 x 0.8 = 2.94912e12
  // FLOP/s = 46603.55 us. Weights 4096 x 4096 x 2 = 33554432 bytes fit in 54 MB: bytes 3 x
  // 33554432 = 100663296 at 38e12 x 0.85 = 3.1 us. Plus 1 us.
  const Time t = time_of(cost, Gemm{4096, 4096, 4096, 1, DType::fp16});
  CHECK(t.seconds() == doctest::Approx(1e-6 + 137438953472.0 / 2.94912e12));
  // 8192^2 weights (134 MB) do not fit: DDR at 77e9 x 0.85 = 65.45 GB/s; m = 64: FLOPs 2 x 64 x
  // 8192^2 = 8589934592 -> 2.913 ms; bytes (64*8192*2 + 8192^2) x 2 = 136314880 -> 2.083 ms.
  const Time thin = time_of(cost, Gemm{64, 8192, 8192, 1, DType::fp16});
  CHECK(thin.seconds() == doctest::Approx(1e-6 + 8589934592.0 / 2.94912e12));
  const Time skinny = time_of(cost, Gemm{8, 8192, 8192, 1, DType::fp16});
  // m = 8: FLOPs 1073741824 -> 364 us; bytes (8*8192*2 + 8192^2) x 2 = 134479872 / 65.45e9 =
  // 2.0547 ms: memory-bound on DDR.
  CHECK(skinny.seconds() == doctest::Approx(1e-6 + 134479872.0 / 65.45e9));
}

TEST_CASE("heterogeneous clusters: each rank costs with its own device and slowdown") {
  auto c = testing::test_cluster(1, 4);
  c.host = hw::HostSpec{Bytes(1'000'000'000'000), Bandwidth(1e11), 8, 8e7,
                        hw::LinkSpec{Bandwidth(1e10), Time::us(5)}};
  c.overrides.push_back(hw::DeviceOverride{{1}, std::nullopt, 2.0, std::nullopt, std::nullopt});
  c.overrides.push_back(hw::DeviceOverride{{2, 3}, test_fpga(), 1.0, std::nullopt, std::nullopt});
  c.overrides.push_back(hw::DeviceOverride{{3}, std::nullopt, 3.0, std::nullopt, std::nullopt});

  const Gemm g{1024, 1024, 1024, 1, DType::bf16};
  const Elementwise e{500'000'000, Bytes(1'000'000'000), Bytes(1'000'000'000)};
  const Copy offload{Bytes(1'000'000), MemoryTier::device, MemoryTier::host};

  // Rank 0 is the cluster's device as before: the 1024^3 GEMM of cost_test takes 4 us +
  // 72477574 ps.
  sim::DeviceCostModel r0(c, 0);
  CHECK(r0.slowdown() == 1.0);
  CHECK(r0.device().name == "test-device");
  CHECK(time_of(r0, g) == time_of(sim::DeviceCostModel(c), g));
  CHECK(time_of(r0, g) == Time::us(4) + Time::ps(72'477'574));

  // Rank 1 is twice as slow: on-device work doubles, the launch overhead does not.
  sim::DeviceCostModel r1(c, 1);
  CHECK(r1.slowdown() == 2.0);
  CHECK(time_of(r1, g) == Time::us(4) + Time::ps(2 * 72'477'574));
  // Elementwise: 2e9 bytes at 5e11 = 4 ms, doubled.
  CHECK(time_of(r0, e) == Time::us(4) + Time::ms(4));
  CHECK(time_of(r1, e) == Time::us(4) + Time::ms(8));
  // Measured device work is slowed down too.
  CHECK(time_of(r1, Measured{Time::us(10)}) == Time::us(20));
  // Off the device, nothing changes: PCIe 5 us + 1e6 / 1e10 = 100 us.
  CHECK(time_of(r0, offload) == Time::us(105));
  CHECK(time_of(r1, offload) == Time::us(105));

  // Ranks 2 and 3 are FPGAs: the FPGA model, on their own figures.
  sim::DeviceCostModel r2(c, 2);
  CHECK(r2.device().is_fpga());
  const Gemm f{1000, 1000, 1000, 1, DType::fp16};
  CHECK(time_of(r2, f) == Time::us(1) + Time::ms(2));
  // Rank 3: the FPGA, three times slower: 1 us + 3 x 2 ms.
  sim::DeviceCostModel r3(c, 3);
  CHECK(r3.slowdown() == 3.0);
  CHECK(time_of(r3, f) == Time::us(1) + Time::ms(6));
  // A whole list: overheads once per kernel, work scaled: 2 x (1 us) + 3 x (2 ms + 40 us).
  std::vector<Kernel> list{Kernel{f, "a"},
                           Kernel{Elementwise{1, Bytes(1'000'000), Bytes(1'000'000)}, "b"}};
  CHECK(r3.kernels_time(list) == Time::us(2) + Time::us(3 * 2040));
}

TEST_CASE("heterogeneous clusters: the mixed U250/U280 server costs each card as itself") {
  auto c = hw::load_cluster(testing::configs_dir() / "hardware/clusters/fpga-u250-u280-8.json");
  // A GEMV-like layer whose 8192 x 8192 fp16 weights (134 MB) do not fit on chip.
  const Gemm fc{8, 8192, 8192, 1, DType::fp16};
  // Rank 0, a U250: 1073741824 FLOPs at 12288 x 300e6 x 0.8 = 2.94912e12 -> 364 us; bytes
  // (8*8192*2 + 8192^2) x 2 = 134479872 from DDR at 77e9 x 0.85 = 65.45e9 B/s -> 2054.7 us.
  CHECK(time_of(sim::DeviceCostModel(c, 0), fc).seconds() ==
        doctest::Approx(1e-6 + 134479872.0 / 65.45e9));
  // Rank 7, a U280: 1073741824 FLOPs at 9024 x 300e6 x 0.8 = 2.16576e12 -> 495.8 us; bytes from
  // HBM at 460e9 x 0.85 = 391e9 B/s -> 343.9 us: compute-bound.
  CHECK(time_of(sim::DeviceCostModel(c, 7), fc).seconds() ==
        doctest::Approx(1e-6 + 1073741824.0 / 2.16576e12));
}
