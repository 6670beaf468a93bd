// FP8 and FP4 GEMMs and the cast kernels of FP8 training on the roofline test device
// (sim/helpers.hpp: 100 TFLOP/s bf16, 1 TB/s at 50%, efficiency 0.5, 4 us launches), with FP8
// and FP4 peaks added: expected times from the roofline formula by hand.
#include <doctest/doctest.h>

#include "sim/cost.hpp"
#include "sim/helpers.hpp"
#include "strategies/precision.hpp"

using namespace stratasim;
using strategies::Gemm;
using strategies::Kernel;

namespace {

hw::DeviceSpec low_precision_device() {
  hw::DeviceSpec d = testing::test_device();
  d.peak_flops[static_cast<std::size_t>(DType::fp8)] = FlopRate(2e14);
  d.peak_flops[static_cast<std::size_t>(DType::fp4)] = FlopRate(4e14);
  return d;
}

}  // namespace

TEST_CASE("cost: an FP8 GEMM of a compute-bound shape takes bf16's time x the peak ratio") {
  const sim::DeviceCostModel cost(low_precision_device());
  // 8192^3: 64 x 64 = 4096 tiles on 108 units, 38 waves: wave_q = 4096 / 4104, tile_q = 1.
  // bf16: 2 x 8192^3 = 1.0995e12 FLOPs at 1e14 x 0.5 x 4096/4104 FLOP/s = 22.034 ms; memory
  // 3 x 8192^2 x 2 B at 5e11 B/s = 0.8 ms, shorter. fp8: the same FLOPs at twice the peak.
  const Gemm bf16{8192, 8192, 8192, 1, DType::bf16};
  const Gemm fp8{8192, 8192, 8192, 1, DType::fp8};
  const double flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
  const double t_bf16 = flops / (1e14 * 0.5 * 4096.0 / 4104.0);
  const Time launch = Time::us(4);
  CHECK((cost.kernel_time(Kernel{bf16, "bf16"}) - launch).seconds() ==
        doctest::Approx(t_bf16).epsilon(1e-9));
  CHECK((cost.kernel_time(Kernel{fp8, "fp8"}) - launch).seconds() ==
        doctest::Approx(t_bf16 / 2).epsilon(1e-9));
  // MXFP8 and block scaling run at the FP8 rate (no kernel model: the roofline), NVFP4 at FP4's.
  const Gemm mx{8192, 8192, 8192, 1, DType::fp8, hw::GemmScaling::mx};
  const Gemm fp4{8192, 8192, 8192, 1, DType::fp4, hw::GemmScaling::mx};
  CHECK((cost.kernel_time(Kernel{mx, "mx"}) - launch).seconds() ==
        doctest::Approx(t_bf16 / 2).epsilon(1e-9));
  CHECK((cost.kernel_time(Kernel{fp4, "fp4"}) - launch).seconds() ==
        doctest::Approx(t_bf16 / 4).epsilon(1e-9));
}

TEST_CASE("cost: the cast of bf16 to fp8 moves 3 bytes an element per direction") {
  const sim::DeviceCostModel cost(low_precision_device());
  strategies::LowPrecisionSpec delayed;  // tensor scaling: no scales stored
  // 1,000,000 elements: read 2 MB of bf16, write 1 MB of fp8 (one direction): 3 MB at 5e11 B/s.
  const Kernel cast = strategies::quantise_kernel(delayed, "x.cast", 1'000'000, 2, 1);
  const auto& w = std::get<strategies::Elementwise>(cast.work);
  CHECK(w.bytes_read == Bytes(2'000'000));
  CHECK(w.bytes_written == Bytes(1'000'000));
  CHECK(cost.kernel_time(cast) == Time::us(4) + Time::us(6));
  // Hopper's cast_transpose writes the transposed copy too: 2 + 1 + 1 bytes an element.
  const Kernel both = strategies::quantise_kernel(delayed, "x.cast", 1'000'000, 2, 2);
  CHECK(std::get<strategies::Elementwise>(both.work).bytes_written == Bytes(2'000'000));
  // MXFP8: one E8M0 scale per 32 elements (31,250 bytes); NVFP4: 4-bit elements (500,000 B) and
  // one E4M3 scale per 16 (62,500 B); block scaling: one fp32 per 128 (7,813 x 4 = 31,252 B).
  strategies::LowPrecisionSpec mx;
  mx.recipe = strategies::ScalingRecipe::mxfp8;
  CHECK(strategies::quantised_bytes(mx, 1'000'000, false) == 1'031'250);
  strategies::LowPrecisionSpec nvfp4;
  nvfp4.dtype = DType::fp4;
  nvfp4.recipe = strategies::ScalingRecipe::nvfp4;
  CHECK(strategies::quantised_bytes(nvfp4, 1'000'000, false) == 562'500);
  strategies::LowPrecisionSpec block;
  block.recipe = strategies::ScalingRecipe::block;
  CHECK(strategies::quantised_bytes(block, 1'000'000, false) == 1'031'252);
  // Weights' 128 x 128 blocks: ceil(1e6 / 16384) = 62 scales, 248 bytes.
  CHECK(strategies::quantised_bytes(block, 1'000'000, true) == 1'000'248);
  // fp4 packs two elements a byte (rounded up).
  CHECK(packed_bytes(DType::fp4, 1'000'001) == 500'001);
  CHECK(size_of(DType::fp4) == 1);
}
