// The calibrated kernel model in the cost model (sim/cost.hpp, hw_models/kernel_model.hpp):
// GEMMs at peak_fraction x tile x wave factor x k / (k + k_overhead) with split-K and a
// latency, fused attention at the fitted rate of its implementation, and the training
// framework's compute and memory-traffic factors; every expected time by hand.
#include <doctest/doctest.h>

#include <memory>

#include "sim/cost.hpp"
#include "sim/helpers.hpp"

using namespace stratasim;
using strategies::Attention;
using strategies::Elementwise;
using strategies::Gemm;
using strategies::Kernel;

namespace {

/// test_device (100 TFLOP/s bf16) with 10 units and 10 TB/s of memory (50% achievable), so that
/// the GEMMs below are compute-bound, and a kernel model: bf16 GEMMs at 0.9 of peak, k_overhead
/// 128, full wave loss, no latency; FlashAttention-2 forward 0.5, backward 0.4, causal s_half
/// 1000, head-dim factors 1.
hw::DeviceSpec calibrated(double wave_loss = 1, double latency = 0) {
  hw::DeviceSpec d = testing::test_device();
  d.compute_units = 10;
  d.memory_bandwidth = Bandwidth(1e13);
  hw::KernelModel m;
  m.device = d.name;
  hw::GemmModel g;
  g.peak_fraction = 0.9;
  g.k_overhead = 128;
  g.wave_loss = wave_loss;
  g.latency = latency;
  m.gemm[static_cast<std::size_t>(DType::bf16)] = g;
  hw::AttentionModel a;
  a.forward = 0.5;
  a.backward = 0.4;
  a.seq_half = 0;
  a.causal_seq_half = 1000;
  m.attention[static_cast<std::size_t>(hw::AttentionImpl::flash_attention_2)] = a;
  d.kernel_model = std::make_shared<const hw::KernelModel>(m);
  return d;
}

double work_us(const hw::DeviceSpec& d, const Kernel& k) {
  const sim::DeviceCostModel cost(d);
  return (cost.kernel_time(k) - cost.launch_overhead()).seconds() * 1e6;
}

}  // namespace

TEST_CASE("calibrated GEMM: peak fraction x k / (k + k_overhead), whole waves") {
  // 1280 x 256 x 1024: 10 x 2 = 20 tiles on 10 units, two whole waves; k factor
  // 1024 / (1024 + 128) = 0.8889; efficiency 0.9 x 0.8889 = 0.8. 2 x 1280 x 256 x 1024 =
  // 671,088,640 FLOPs at 80 TFLOP/s: 8.388608 us.
  const Gemm g{1280, 256, 1024, 1, DType::bf16};
  const hw::DeviceSpec d = calibrated();
  CHECK(sim::DeviceCostModel(d).gemm_efficiency(g) == doctest::Approx(0.8));
  CHECK(work_us(d, {g, "gemm"}) == doctest::Approx(8.388608).epsilon(1e-6));
  // fp16 shares the bf16 parameters; fp32 has none: the roofline's efficiency.gemm (0.5) x
  // quantisation (1).
  CHECK(sim::DeviceCostModel(d).gemm_efficiency({1280, 256, 1024, 1, DType::fp16}) ==
        doctest::Approx(0.8));
  CHECK(sim::DeviceCostModel(d).gemm_efficiency({1280, 256, 1024, 1, DType::fp32}) ==
        doctest::Approx(0.5));
}

TEST_CASE("calibrated GEMM: split-K fills idle units") {
  // 128 x 128 x 8192: one tile on 10 units. Split over s units: wave factor s / 10, k_s = 8192 / s;
  // s = 10 gives 1 x 819.2 / 947.2 = 0.86486 (s = 9: 0.9 x 910.2 / 1038.2 = 0.789, lower).
  // Efficiency 0.9 x 0.86486 = 0.77838.
  const Gemm g{128, 128, 8192, 1, DType::bf16};
  CHECK(sim::DeviceCostModel(calibrated()).gemm_efficiency(g) ==
        doctest::Approx(0.9 * 819.2 / 947.2).epsilon(1e-9));
}

TEST_CASE("calibrated GEMM: wave loss and latency") {
  // 11 tiles (1408 x 128) on 10 units: two waves, 11 / 20 = 0.55 used. Full loss: 0.55; no loss
  // (a persistent kernel): 1. k = 128: k factor 0.5.
  const Gemm g{1408, 128, 128, 1, DType::bf16};
  CHECK(sim::DeviceCostModel(calibrated(1)).gemm_efficiency(g) ==
        doctest::Approx(0.9 * 0.55 * 0.5));
  CHECK(sim::DeviceCostModel(calibrated(0)).gemm_efficiency(g) == doctest::Approx(0.9 * 0.5));
  // Half the loss: 1 - 0.5 x 0.45 = 0.775.
  CHECK(sim::DeviceCostModel(calibrated(0.5)).gemm_efficiency(g) ==
        doctest::Approx(0.9 * 0.775 * 0.5));
  // A 2 us latency adds 2 us to the work.
  const Gemm big{1280, 256, 1024, 1, DType::bf16};
  CHECK(work_us(calibrated(1, 2e-6), {big, "gemm"}) == doctest::Approx(10.388608).epsilon(1e-6));
}

TEST_CASE("calibrated attention: the implementation's fitted rate") {
  // Causal self-attention, s = 1000, 8 heads of 128, batch 1. Keys per query: 1000 - 500; the
  // fall-off is looked up at s = 1000: 1000 / (1000 + 1000) = 0.5. Forward: 0.5 x 0.5 = 0.25 of
  // 100 TFLOP/s. FLOPs: 4 x 8 x 1000^2 x 128 = 4.096e9, half of it unmasked: 2.048e9 -> 81.92 us.
  const Attention fwd{1, 8, 8, 1000, 1000, 128, true, DType::bf16, false};
  const hw::DeviceSpec d = calibrated();
  CHECK(sim::DeviceCostModel(d).attention_efficiency(fwd) == doctest::Approx(0.25));
  CHECK(work_us(d, {fwd, "attention"}) == doctest::Approx(81.92).epsilon(1e-6));
  // Backward: 0.4 x 0.5 = 0.2 of peak on twice the FLOPs: 4.096e9 / 20e12 = 204.8 us.
  Attention bwd = fwd;
  bwd.backward = true;
  CHECK(work_us(d, {bwd, "attention.bwd"}) == doctest::Approx(204.8).epsilon(1e-6));
  // Another implementation without parameters: efficiency.attention (0.5) of peak.
  Attention fa3 = fwd;
  fa3.impl = hw::AttentionImpl::flash_attention_3;
  CHECK(sim::DeviceCostModel(d).attention_efficiency(fa3) == doctest::Approx(0.5));
}

TEST_CASE("framework factors: compute share and memory traffic") {
  hw::DeviceSpec d = calibrated();
  d.efficiency.framework_compute = 0.5;
  d.efficiency.framework_memory_traffic = 2;
  // Half the compute rate: the GEMM above takes 2 x 8.388608 us.
  CHECK(work_us(d, {Gemm{1280, 256, 1024, 1, DType::bf16}, "gemm"}) ==
        doctest::Approx(16.777216).epsilon(1e-6));
  // An elementwise kernel of 1 MB read + 1 MB written at 5 TB/s achievable: 0.4 us; twice the
  // traffic: 0.8 us.
  const Elementwise e{500'000, Bytes(1'000'000), Bytes(1'000'000)};
  CHECK(work_us(d, {e, "add"}) == doctest::Approx(0.8).epsilon(1e-6));
}

TEST_CASE("framework factors: attention efficiency multiplies the fused-attention rate") {
  // The forward kernel above (81.92 us at 0.25 of 100 TFLOP/s): framework_compute 0.5 and
  // framework_attention 4 run it at 0.25 x 0.5 x 4 = 0.5 of peak: 40.96 us. GEMMs keep
  // framework_compute alone.
  hw::DeviceSpec d = calibrated();
  d.efficiency.framework_compute = 0.5;
  d.efficiency.framework_attention = 4;
  const Attention fwd{1, 8, 8, 1000, 1000, 128, true, DType::bf16, false};
  CHECK(work_us(d, {fwd, "attention"}) == doctest::Approx(40.96).epsilon(1e-6));
  CHECK(work_us(d, {Gemm{1280, 256, 1024, 1, DType::bf16}, "gemm"}) ==
        doctest::Approx(16.777216).epsilon(1e-6));
}
