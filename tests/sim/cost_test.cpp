#include <doctest/doctest.h>

#include <stdexcept>

#include "sim/cost.hpp"
#include "sim/helpers.hpp"

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

// The test device: 100 TFLOP/s bf16, 1 TB/s, efficiencies 0.5, 4 us launch, 108 units, 128x128.

TEST_CASE("cost: GEMM roofline with a partial wave") {
  sim::DeviceCostModel cost(testing::test_device());
  // 1024^3: 8 x 8 = 64 tiles, tile_q = 1, one wave on 108 units: wave_q = 64/108.
  Gemm g{1024, 1024, 1024, 1, DType::bf16};
  CHECK(cost.gemm_efficiency(g) == doctest::Approx(0.5 * 64.0 / 108.0));
  // FLOPs 2 * 1024^3 = 2147483648 at 1e14 * 0.5 * 64/108 FLOP/s = 72477573.12 ps -> 72477574.
  // Memory: 3 * 1024^2 * 2 bytes = 6291456 at 5e11 B/s = 12.58 us, shorter.
  CHECK(cost.kernel_time(Kernel{g, "g"}) == Time::us(4) + Time::ps(72477574));
}

TEST_CASE("cost: GEMM wave quantisation, 108 vs 109 tiles on 108 units") {
  sim::DeviceCostModel cost(testing::test_device());
  // 108 tiles of 128 x 128 (m = 13824, n = 128): one full wave, efficiency 0.5.
  Gemm full{108 * 128, 128, 4096, 1, DType::bf16};
  CHECK(cost.gemm_efficiency(full) == doctest::Approx(0.5));
  // 2 * 13824 * 128 * 4096 = 14495514624 FLOPs at 5e13 FLOP/s = 289910292.48 ps -> 289910293.
  // Memory: (13824*4096 + 4096*128 + 13824*128) * 2 = 117833728 B at 5e11 B/s = 235.7 us.
  CHECK(cost.kernel_time(Kernel{full, "full"}) == Time::us(4) + Time::ps(289910293));

  // 109 tiles: two waves, the second with one tile: wave_q = 109 / 216.
  Gemm spill{109 * 128, 128, 4096, 1, DType::bf16};
  CHECK(cost.gemm_efficiency(spill) == doctest::Approx(0.5 * 109.0 / 216.0));
  // 14629732352 FLOPs at 1e14 * 0.5 * 109/216 = 579820584.96 ps -> 579820585 (twice one wave).
  CHECK(cost.kernel_time(Kernel{spill, "spill"}) == Time::us(4) + Time::ps(579820585));
}

TEST_CASE("cost: GEMM tile quantisation") {
  sim::DeviceCostModel cost(testing::test_device());
  // m = 129 needs 2 row tiles: tile_q = 129*128 / (256*128) = 0.50390625; 2 tiles: 2/108.
  Gemm g{129, 128, 4096, 1, DType::bf16};
  CHECK(cost.gemm_efficiency(g) == doctest::Approx(0.5 * 0.50390625 * 2.0 / 108.0));
  // 2*129*128*4096 = 135266304 FLOPs at that rate: 289910292.48 ps -> 289910293.
  CHECK(cost.kernel_time(Kernel{g, "g"}) == Time::us(4) + Time::ps(289910293));
  // Batching fills the units: batch 54 of the same gives 108 tiles, one full wave.
  Gemm batched{129, 128, 4096, 54, DType::bf16};
  CHECK(cost.gemm_efficiency(batched) == doctest::Approx(0.5 * 0.50390625));
}

TEST_CASE("cost: memory-bound kernels") {
  sim::DeviceCostModel cost(testing::test_device());
  // Elementwise: (1e9 + 1e9) bytes at 5e11 B/s = 4 ms.
  Elementwise e{500'000'000, Bytes(1'000'000'000), Bytes(1'000'000'000)};
  CHECK(cost.kernel_time(Kernel{e, "e"}) == Time::us(4) + Time::ms(4));
  // Adam with bf16 weights: 12 + 2 read, 12 + 2 written = 28 B/param: 28e6 B / 5e11 = 56 us.
  OptimizerStep adam{1'000'000, OptimizerKind::adam, DType::bf16, false};
  CHECK(cost.kernel_time(Kernel{adam, "adam"}) == Time::us(4) + Time::us(56));
  // Adam with fp32 weights (no master copy, no second weight copy): read weights, m, v and the
  // gradient 4 + 8 + 4, write weights, m, v 4 + 8 = 28 B/param: 56 us.
  OptimizerStep adam32{1'000'000, OptimizerKind::adam, DType::fp32, false};
  CHECK(cost.kernel_time(Kernel{adam32, "adam"}) == Time::us(4) + Time::us(56));
  // Adam with bf16 weights and fp32 gradient buffers (Megatron's main grads): read 4 + 4 + 8,
  // write 4 + 8 + 2 = 30 B/param: 60 us.
  OptimizerStep adam_main_grads{1'000'000, OptimizerKind::adam, DType::bf16, false, true};
  CHECK(cost.kernel_time(Kernel{adam_main_grads, "adam"}) == Time::us(4) + Time::us(60));
  // SGD, bf16: 4 + 4 + 2 + 2 = 12 B/param: 24 us.
  OptimizerStep sgd{1'000'000, OptimizerKind::sgd, DType::bf16, false};
  CHECK(cost.kernel_time(Kernel{sgd, "sgd"}) == Time::us(4) + Time::us(24));
  // One state (momentum, RMSProp's square average, Adagrad's sum, Lion's momentum) read and
  // written: 12 + 4 + 4 = 20 B/param: 40 us.
  for (OptimizerKind k : {OptimizerKind::sgd_momentum, OptimizerKind::rmsprop,
                          OptimizerKind::adagrad, OptimizerKind::lion}) {
    CHECK(cost.kernel_time(Kernel{OptimizerStep{1'000'000, k, DType::bf16, false}, "step"}) ==
          Time::us(4) + Time::us(40));
  }
  // 8-bit Adam on 1,024,000 parameters (500 blocks of 2048): 12 B/param of gradient, master
  // and weights as SGD, plus m and v in 1 byte each with one fp32 absmax per block and state
  // (2 x 1,024,000 + 500 x 4 x 2 = 2,052,000 B), read and written: 12,288,000 + 4,104,000 =
  // 16,392,000 B at 5e11 B/s = 32.784 us.
  OptimizerStep adam8{1'024'000, OptimizerKind::adam8bit, DType::bf16, false};
  // (Rounded up to a whole picosecond: within 1 ps of the exact figure.)
  const Time adam8_time = cost.kernel_time(Kernel{adam8, "adam8bit"});
  CHECK(adam8_time >= Time::us(4) + Time::ns(32'784));
  CHECK(adam8_time <= Time::us(4) + Time::ns(32'784) + Time::ps(1));
  // Adafactor on 1,000,000 parameters: the gradient read twice (2 x 2) and the master (4),
  // the master and weights written (4 + 2): 14 B/param, plus its factored second moment,
  // 8 x sqrt(1e6) = 8,000 B read and written: 14,016,000 B = 28.032 us.
  OptimizerStep adafactor{1'000'000, OptimizerKind::adafactor, DType::bf16, false};
  const Time adafactor_time = cost.kernel_time(Kernel{adafactor, "adafactor"});
  CHECK(adafactor_time >= Time::us(4) + Time::ns(28'032));
  CHECK(adafactor_time <= Time::us(4) + Time::ns(28'032) + Time::ps(1));
  // Device-to-device copy reads and writes: 2e6 B / 5e11 = 4 us.
  Copy c{Bytes(1'000'000), MemoryTier::device, MemoryTier::device};
  CHECK(cost.kernel_time(Kernel{c, "copy"}) == Time::us(8));
}

TEST_CASE("cost: attention") {
  sim::DeviceCostModel cost(testing::test_device());
  // b 1, h 8, s 1024, d 128: forward 4*8*1024*1024*128 = 4294967296 FLOPs, causal half:
  // 2147483648 at 5e13 = 42949672.96 ps -> 42949673. Memory (2*8*1024*128*2)*2 = 8388608 B
  // at 5e11 = 16.8 us, shorter.
  Attention a{1, 8, 8, 1024, 1024, 128, true, DType::bf16, false};
  CHECK(cost.kernel_time(Kernel{a, "attn"}) == Time::us(4) + Time::ps(42949673));
  // Backward doubles the FLOPs: 85899345.92 -> 85899346 ps; memory 2.5x = 41.9 us, shorter.
  a.backward = true;
  CHECK(cost.kernel_time(Kernel{a, "attn.bwd"}) == Time::us(4) + Time::ps(85899346));
  // Not causal: the full forward, 85899345.92 -> 85899346 ps.
  a.backward = false;
  a.causal = false;
  CHECK(cost.kernel_time(Kernel{a, "attn"}) == Time::us(4) + Time::ps(85899346));
  // Memory-bound decode-like shape: seq_q 1, seq_kv 65536, 8 heads, d 128, not causal.
  // FLOPs 4*8*65536*128 = 268435456 at 5e13 = 5.37 us. Bytes (2*8*1*128 + 2*8*65536*128)*2
  // = 268439552 at 5e11 = 536879.104 ns -> 536879104 ps.
  Attention decode{1, 8, 8, 1, 65536, 128, false, DType::bf16, false};
  CHECK(cost.kernel_time(Kernel{decode, "decode"}) == Time::us(4) + Time::ps(536879104));
}

TEST_CASE("cost: measured kernels, lists, and what is not modelled") {
  sim::DeviceCostModel cost(testing::test_device());
  // Measured kernels pay no launch overhead.
  CHECK(cost.kernel_time(Kernel{Measured{Time::ns(1500)}, "m"}) == Time::ns(1500));
  std::vector<Kernel> list{Kernel{Measured{Time::us(10)}, "a"},
                           Kernel{Elementwise{1, Bytes(250'000), Bytes(250'000)}, "b"}};
  // 10 us + (4 us + 500000 B / 5e11 = 1 us).
  CHECK(cost.kernels_time(list) == Time::us(15));
  CHECK(cost.kernels_time({}) == Time::zero());
  CHECK_THROWS_AS(cost.kernel_time(Kernel{OptimizerStep{10, OptimizerKind::adam, DType::bf16, true},
                                          "host adam"}),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      cost.kernel_time(Kernel{Copy{Bytes(10), MemoryTier::device, MemoryTier::host}, "offload"}),
      std::invalid_argument);
}

TEST_CASE("cost: the GEMM efficiency is base x tile quantisation x wave quantisation") {
  sim::DeviceCostModel cost(testing::test_device());
  // m = 200, n = 300: 2 x 3 tiles of 128 x 128 padding 256 x 384: tile_q = 60000 / 98304;
  // 6 tiles on 108 units, one wave: wave_q = 6/108.
  const Gemm g{200, 300, 64, 1, DType::bf16};
  CHECK(cost.quantisation(g) == doctest::Approx(60000.0 / 98304.0 * 6.0 / 108.0));
  CHECK(cost.modelled_gemm_efficiency(g) == doctest::Approx(0.5 * 60000.0 / 98304.0 * 6.0 / 108.0));
  CHECK(cost.gemm_efficiency(g) == cost.modelled_gemm_efficiency(g));  // no profile
  // The quantisation ignores k: the same at k = 8192.
  CHECK(cost.quantisation(Gemm{200, 300, 8192, 1, DType::bf16}) == cost.quantisation(g));
  // 2 x 2 tiles x batch 27 = 108 tiles: one full wave; tile_q 1 at 256 x 256.
  CHECK(cost.quantisation(Gemm{256, 256, 64, 27, DType::bf16}) == doctest::Approx(1.0));
}
