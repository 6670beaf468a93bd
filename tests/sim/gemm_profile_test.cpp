// GEMM efficiency from a measured profile (docs/gemm-efficiency.md): exact shapes take their
// measured time; other shapes of a measured dtype interpolate the measured efficiency in log
// space with the roofline quantisation applied; unmeasured dtypes keep the roofline model.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "hw_models/cluster.hpp"
#include "sim/cost.hpp"
#include "sim/helpers.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using strategies::Attention;
using strategies::Elementwise;
using strategies::Gemm;
using strategies::Kernel;

namespace {

// The test device (100 TFLOP/s bf16, 10 TFLOP/s fp32, 1 TB/s x 0.5, gemm efficiency 0.5, 4 us
// launches, 108 units, 128 x 128 tiles) with a profile of two bf16 rows:
// - A: 4096^3, 137438953472 FLOPs in 2290649225 ps (60 TFLOP/s, rounded to a picosecond):
//   efficiency 0.6; 32 x 32 = 1024 tiles in 10 waves of 108: quantisation 1024/1080;
// - B: 1024^3, 2147483648 FLOPs in 107374182.4 -> 107374182 ps (20 TFLOP/s): efficiency
//   0.2; 64 tiles in one wave: quantisation 64/108.
hw::DeviceSpec profiled(bool with_b = true) {
  auto d = testing::test_device();
  hw::DeviceProfile p;
  p.device = d.name;
  p.source = "test";
  p.gemm.push_back({4096, 4096, 4096, 1, DType::bf16, Time::ps(2'290'649'225)});
  if (with_b) p.gemm.push_back({1024, 1024, 1024, 1, DType::bf16, Time::ps(107'374'182)});
  d.profile = std::make_shared<const hw::DeviceProfile>(std::move(p));
  return d;
}

Time time_of(const sim::DeviceCostModel& cost, strategies::KernelWork work) {
  return cost.kernel_time(Kernel{std::move(work), "k"});
}

}  // namespace

TEST_CASE("profile: a measured shape takes its measured time") {
  sim::DeviceCostModel cost(profiled());
  const Gemm a{4096, 4096, 4096, 1, DType::bf16};
  CHECK(cost.gemm_efficiency(a) == doctest::Approx(0.6));
  CHECK(time_of(cost, a) == Time::us(4) + Time::ps(2'290'649'225));
  CHECK(time_of(cost, Gemm{1024, 1024, 1024, 1, DType::bf16}) ==
        Time::us(4) + Time::ps(107'374'182));
  // Without the profile the model says 0.5 x 1024/1080 of peak: 2899102924.8 -> 2899102925 ps.
  sim::DeviceCostModel model(testing::test_device());
  CHECK(model.gemm_efficiency(a) == doctest::Approx(0.5 * 1024.0 / 1080.0));
  CHECK(time_of(model, a) == Time::us(4) + Time::ps(2'899'102'925));
}

TEST_CASE("profile: one neighbour carries its efficiency over, with the quantisation ratio") {
  sim::DeviceCostModel cost(profiled(/*with_b=*/false));
  // A's efficiency without its quantisation: 0.6 x 1080/1024 = 0.6328125.
  // 4096 x 4096 x 8192: the same tiles and waves: 0.6328125 x 1024/1080 = 0.6.
  CHECK(cost.gemm_efficiency(Gemm{4096, 4096, 8192, 1, DType::bf16}) == doctest::Approx(0.6));
  // 4224 x 4096 x 4096: 33 x 32 = 1056 tiles, 10 waves: 0.6328125 x 1056/1080 = 0.61875.
  const Gemm g{4224, 4096, 4096, 1, DType::bf16};
  CHECK(cost.gemm_efficiency(g) == doctest::Approx(0.61875));
  // 2 x 4224 x 4096^2 = 141733920768 FLOPs at 1e14 x 0.61875 = 2290649224.53 ps -> ...225.
  // Memory: (4224*4096 + 4096^2 + 4224*4096) x 2 = 102760448 bytes at 5e11 = 205.5 us, shorter.
  CHECK(time_of(cost, g).picoseconds() ==
        doctest::Approx(4'000'000 + 2'290'649'224.53).epsilon(1e-9));
}

TEST_CASE("profile: between measured shapes, a log-space weighted mean") {
  sim::DeviceCostModel cost(profiled());
  // 2048^3 is ln 2 x sqrt(3) from both A and B: equal weights, so the geometric mean of their
  // efficiencies without quantisation: sqrt(0.6328125 x 0.3375) = 0.46214091 (B: 0.2 x 108/64
  // = 0.3375); times 2048^3's quantisation: 16 x 16 = 256 tiles in 3 waves: 256/324:
  // 0.46214091 x 0.79012346 = 0.36514837.
  const Gemm q{2048, 2048, 2048, 1, DType::bf16};
  CHECK(cost.gemm_efficiency(q) == doctest::Approx(0.36514837));
  // 17179869184 FLOPs at 1e14 x 0.36514837 = 470490094 ps (memory: 25165824 bytes at 5e11 =
  // 50.3 us, shorter).
  CHECK(time_of(cost, q).picoseconds() ==
        doctest::Approx(4'000'000 + 470'490'094.35).epsilon(1e-8));
  // Closer to A, closer to A's efficiency: 3072^3 (ln 4/3 from A, ln 3 from B per dimension).
  const double w_a = 1 / std::pow(std::log(4.0 / 3.0), 2), w_b = 1 / std::pow(std::log(3.0), 2);
  const double base = std::exp((w_a * std::log(0.6328125) + w_b * std::log(0.3375)) / (w_a + w_b));
  // 3072^3: 24 x 24 = 576 tiles, 6 waves (648): quantisation 576/648.
  CHECK(cost.gemm_efficiency(Gemm{3072, 3072, 3072, 1, DType::bf16}) ==
        doctest::Approx(base * 576.0 / 648.0));
}

TEST_CASE("profile: dtypes without rows keep the roofline model") {
  sim::DeviceCostModel cost(profiled());
  const Gemm g{4096, 4096, 4096, 1, DType::fp32};
  CHECK(cost.gemm_efficiency(g) == doctest::Approx(0.5 * 1024.0 / 1080.0));
  CHECK(cost.gemm_efficiency(g) == cost.modelled_gemm_efficiency(g));
}

TEST_CASE("profile: attention rate, bandwidths and launch overhead replace the model's") {
  auto d = testing::test_device();
  hw::DeviceProfile p;
  p.device = d.name;
  p.source = "test";
  p.attention[static_cast<std::size_t>(DType::bf16)] = FlopRate(25e12);
  p.memory_bandwidth = Bandwidth(250e9);
  p.kernel_launch_overhead = Time::us(2);
  d.profile = std::make_shared<const hw::DeviceProfile>(p);
  sim::DeviceCostModel cost(d);
  // Causal forward attention, 2147483648 FLOPs at the measured 25e12 = 85899345.92 ps ->
  // 85899346; launch 2 us.
  CHECK(time_of(cost, Attention{1, 8, 8, 1024, 1024, 128, true, DType::bf16, false}) ==
        Time::us(2) + Time::ps(85'899'346));
  // Elementwise at the measured streaming bandwidth: 2e9 / 2.5e11 = 8 ms.
  const Elementwise e{500'000'000, Bytes(1'000'000'000), Bytes(1'000'000'000)};
  CHECK(time_of(cost, e) == Time::us(2) + Time::ms(8));
  // An elementwise figure of its own wins: 2e9 / 4e11 = 5 ms.
  p.elementwise_bandwidth = Bandwidth(400e9);
  d.profile = std::make_shared<const hw::DeviceProfile>(p);
  CHECK(time_of(sim::DeviceCostModel(d), e) == Time::us(2) + Time::ms(5));
}

TEST_CASE("profile: the example A100 profile on the A100 device") {
  auto a100 = hw::load_device(testing::configs_dir() / "hardware/devices/a100-sxm4-80gb.json");
  a100.profile = std::make_shared<const hw::DeviceProfile>(
      hw::load_profile(testing::configs_dir() / "hardware/profiles/example-a100.json"));
  sim::DeviceCostModel cost(a100);
  // The example's 4096^3 bf16 row: 260 TFLOP/s of 312: efficiency 0.8333.
  CHECK(cost.gemm_efficiency(Gemm{4096, 4096, 4096, 1, DType::bf16}) ==
        doctest::Approx(260.0 / 312.0).epsilon(1e-6));
  // 137438953472 FLOPs at 260e12 = 528.6 us, plus the example's 4 us launch.
  CHECK(time_of(cost, Gemm{4096, 4096, 4096, 1, DType::bf16}).seconds() ==
        doctest::Approx(4e-6 + 137438953472.0 / 260e12).epsilon(1e-6));
  // Unmeasured shapes stay within (0, 1] and below the measured large-GEMM figures.
  const double e = cost.gemm_efficiency(Gemm{3000, 5000, 7000, 1, DType::bf16});
  CHECK(e > 0.5);
  CHECK(e <= 275.0 / 312.0);
  // fp16 has no GEMM rows: the roofline model.
  const Gemm h{4096, 4096, 4096, 1, DType::fp16};
  CHECK(cost.gemm_efficiency(h) == cost.modelled_gemm_efficiency(h));
}
