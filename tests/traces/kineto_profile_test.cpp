// `stratasim calibrate --from-trace`: a device profile fitted from a Kineto trace with known
// kernels (written by tests/kineto_writer.hpp) has the hand-computed rows and rates, loads as a
// device's profile and makes the cost model predict the recorded times; bad traces give errors
// naming the file and the JSON path.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "hw_models/cluster.hpp"
#include "kineto_writer.hpp"
#include "sim/cost.hpp"
#include "temp_dir.hpp"
#include "traces/import.hpp"
#include "traces/kineto_profile.hpp"

namespace fs = std::filesystem;
using namespace stratasim;
using nlohmann::json;
using testing::KinetoWriter;

namespace {

const fs::path kSource = STRATASIM_SOURCE_DIR;
const fs::path kH100 = kSource / "configs" / "hardware" / "devices" / "h100-sxm5-80gb.json";

const json kBf16x2 = {"c10::BFloat16", "c10::BFloat16"};
// The "Input Dims" of an input that is not a tensor (a scalar, None), as the profiler writes it.
const json E = json::array();
constexpr std::int64_t MiB = 1 << 20;

doctest::Approx rel(double v) {
  return doctest::Approx(v).scale(0).epsilon(1e-12);
}

// The trace every figure below is computed from by hand.
KinetoWriter sample() {
  KinetoWriter w;
  // GEMMs.
  // aten::mm 4096^3 bf16, three calls of 210, 190 and 200 us: the median is 200 us.
  w.launch_us = 50;  // the first launch is slow (a warm-up); the others take 5 us
  for (double us : {210.0, 190.0, 200.0}) {
    w.call("aten::mm", {{4096, 4096}, {4096, 4096}}, kBf16x2, {us});
    w.launch_us = 5;
  }
  // aten::linear(input [4, 2048, 4096], weight [1024, 4096], bias) over aten::addmm: one GEMM
  // call of m = 4 x 2048 = 8192, k = 4096, n = 1024. The first call's kernels are 60 us of GEMM
  // and 40 us of a bias copy (aten::copy_ inside aten::addmm): 100 us; the second 120 us. Lower
  // median of {100, 120}: 100 us.
  for (int i = 0; i < 2; ++i) {
    w.open("aten::linear", {{4, 2048, 4096}, {1024, 4096}, {1024}},
           {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16"});
    w.open("aten::addmm", {{1024}, {8192, 4096}, {4096, 1024}, E, E},
           {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"});
    if (i == 0) {
      w.kernel(60);
      w.open("aten::copy_", {{8192, 1024}, {1024}}, kBf16x2);
      w.kernel(40);
      w.close();
    } else {
      w.kernel(120);
    }
    w.close();
    w.close();
  }
  // aten::bmm fp16 [32, 2048, 128] x [32, 128, 2048]: 50 us, the kernel linked to its launch
  // only by "correlation".
  w.open("aten::bmm", {{32, 2048, 128}, {32, 128, 2048}}, {"c10::Half", "c10::Half"});
  w.kernel(50, "kernel", /*by_external=*/false);
  w.close();
  // aten::matmul [8, 16, 512, 64] x [8, 16, 64, 512]: batch 128 of 512 x 512 x 64, 30 us.
  w.call("aten::matmul", {{8, 16, 512, 64}, {8, 16, 64, 512}}, kBf16x2, {30});
  // fp32 at 687 TFLOP/s, above the H100's fp32 peak (TF32 was on): kept, and noted.
  w.call("aten::mm", {{4096, 4096}, {4096, 4096}}, {"float", "float"}, {200});
  // double: no profile dtype.
  w.call("aten::mm", {{64, 64}, {64, 64}}, {"double", "double"}, {10});

  // Attention, causal, b = 2, h = 16, s = 2048, d = 128 in bf16 through SDPA's flash path.
  const json bhsd = {2, 16, 2048, 128}, bshd = {2, 2048, 16, 128};
  w.open("aten::_scaled_dot_product_flash_attention", {bhsd, bhsd, bhsd, E, E, E, E},
         {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", ""},
         {"", "", "", "0.", "True", "False", ""});
  w.open("aten::_flash_attention_forward", {bshd, bshd, bshd, E, E, E, E, E, E, E},
         {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "", "Scalar", "Scalar", "Scalar",
          "Scalar", "Scalar"},
         {"", "", "", "", "", "2048", "2048", "0.", "True", "False"});
  w.kernel(400, "flash_fwd_kernel");
  w.close();
  w.close();
  w.open("aten::_scaled_dot_product_flash_attention_backward",
         {bhsd, bhsd, bhsd, bhsd, bhsd, {2, 16, 2048}, E, E, E, E, E, E, E, E, E},
         {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16",
          "float", "", "", "Scalar", "Scalar", "Scalar", "Scalar", "long int", "long int", ""},
         {"", "", "", "", "", "", "", "", "2048", "2048", "0.", "True", "", "", ""});
  w.open("aten::_flash_attention_backward");  // no shapes needed: the outer call has them
  for (double us : {20.0, 900.0, 80.0}) w.kernel(us, "flash_bwd_kernel");
  w.close();
  w.close();
  // Without "Concrete Inputs" is_causal is unknown: skipped.
  w.call("aten::_scaled_dot_product_flash_attention", {bhsd, bhsd, bhsd, E, E, E, E},
         {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", ""},
         {300});

  // Memory-bound operators.
  const json big = {4096, 4096};
  // add: reads 2 x 32 MiB, writes 32 MiB: 96 MiB in 40 us.
  w.call("aten::add", {big, big, E}, {"c10::BFloat16", "c10::BFloat16", "Scalar"}, {40});
  // add_: reads 2 x 32 MiB, writes its first input, 32 MiB: 96 MiB in 40 us.
  w.call("aten::add_", {big, big, E}, {"c10::BFloat16", "c10::BFloat16", "Scalar"}, {40});
  // layer_norm > native_layer_norm of [8192, 4096] bf16 with weight and bias [4096]: reads
  // 64 MiB + 2 x 8 KiB, writes 64 MiB: 134234112 bytes in 50 us.
  const json ln_dims = {{8192, 4096}, {1}, {4096}, {4096}, E};
  const json ln_types = {"c10::BFloat16", "ScalarList", "c10::BFloat16", "c10::BFloat16", "Scalar"};
  w.open("aten::layer_norm", ln_dims, ln_types);
  w.call("aten::native_layer_norm", ln_dims, ln_types, {50});
  w.close();
  // to > _to_copy > copy_(self [8192, 4096] float, src bf16): writes 128 MiB, reads 64 MiB:
  // 192 MiB in 80 us.
  w.open("aten::to", {{8192, 4096}, E, E, E}, {"c10::BFloat16", "Scalar", "Scalar", "Scalar"});
  w.open("aten::_to_copy", {{8192, 4096}, E, E}, {"c10::BFloat16", "Scalar", "Scalar"});
  w.call("aten::copy_", {{8192, 4096}, {8192, 4096}, E}, {"float", "c10::BFloat16", "Scalar"},
         {80});
  w.close();
  w.close();
  // gelu of 1024 elements: 4 KiB, under the 16 MiB threshold: skipped.
  w.call("aten::gelu", {{1024}, E}, {"c10::BFloat16", "Scalar"}, {3});

  // Copies: 64 MiB device to device in 50 us; 64 MiB pinned host to device in 2500 us; a
  // pageable copy and a 1 MiB one are skipped.
  w.memcpy("Memcpy DtoD (Device -> Device)", 64 * MiB, 50);
  w.memcpy("Memcpy HtoD (Pinned -> Device)", 64 * MiB, 2500);
  w.memcpy("Memcpy HtoD (Pageable -> Device)", 64 * MiB, 5000);
  w.memcpy("Memcpy DtoD (Device -> Device)", 1 * MiB, 3);

  // Not fitted: an operator of no class, a kernel launched outside any operator, NCCL.
  w.call("aten::embedding", {{50304, 4096}, {8, 2048}}, {"c10::BFloat16", "long int"}, {25});
  w.kernel(7);
  w.nccl(300);
  return w;
}

hw::DeviceSpec h100() {
  return hw::load_device(kH100);
}

void check_error(const std::string& text, const std::string& where, const std::string& what) {
  CAPTURE(text);
  try {
    traces::calibrate_from_kineto_text("bad.json", text, h100());
    FAIL("no error");
  } catch (const traces::TraceError& e) {
    CAPTURE(e.what());
    CHECK(e.file() == "bad.json");
    CHECK(e.where() == where);
    CHECK(std::string(e.what()).find(what) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("calibrate from trace: GEMM rows are the median time per shape, M, N, K as derived") {
  const auto fit = traces::calibrate_from_kineto_text("job.json", sample().text(), h100());
  const auto& p = fit.profile;
  CHECK(p.device == "H100-SXM5-80GB");
  CHECK(fit.gpu == "NVIDIA H100 80GB HBM3");
  CHECK(p.source.find("job.json") != std::string::npos);
  REQUIRE(p.gemm.size() == 5);
  // 4096^3 bf16: median of 210, 190, 200 us = 200 us; 2 x 4096^3 / 200 us = 687.19476736 TFLOP/s.
  const auto* square = p.find_gemm(4096, 4096, 4096, 1, DType::bf16);
  REQUIRE(square != nullptr);
  CHECK(square->time == Time::us(200));
  CHECK(square->rate().flops_per_second() == rel(687.19476736e12));
  // aten::linear: m = 4 x 2048, k = 4096, n = 1024; lower median of 100 (60 + 40) and 120 us.
  const auto* linear = p.find_gemm(8192, 1024, 4096, 1, DType::bf16);
  REQUIRE(linear != nullptr);
  CHECK(linear->time == Time::us(100));
  // bmm fp16, linked through "correlation": batch 32 of 2048 x 2048 x 128.
  const auto* bmm = p.find_gemm(2048, 2048, 128, 32, DType::fp16);
  REQUIRE(bmm != nullptr);
  CHECK(bmm->time == Time::us(50));
  // matmul: batch 8 x 16 of 512 x 512 x 64.
  const auto* matmul = p.find_gemm(512, 512, 64, 128, DType::bf16);
  REQUIRE(matmul != nullptr);
  CHECK(matmul->time == Time::us(30));
  const auto* fp32 = p.find_gemm(4096, 4096, 4096, 1, DType::fp32);
  REQUIRE(fp32 != nullptr);
  CHECK(fp32->time == Time::us(200));
  // 3 + 2 + 1 + 1 + 1 calls used; the double GEMM skipped.
  CHECK(fit.gemm_calls == 8);
  CHECK(fit.skipped.at("gemm: dtype double has no profile dtype") == 1);
  // fp32 above the fp32 peak (66.9 TFLOP/s): noted.
  REQUIRE(fit.notes.size() == 1);
  CHECK(fit.notes[0].find("TF32") != std::string::npos);
}

TEST_CASE("calibrate from trace: attention, elementwise, copies and launch overhead") {
  const auto fit = traces::calibrate_from_kineto_text("job.json", sample().text(), h100());
  const auto& p = fit.profile;
  // Attention: forward F = 4 b h s_q s_kv d = 4 x 2 x 16 x 2048 x 2048 x 128 = 68719476736,
  // causal: half; backward twice the forward, causal: half. (F/2 + F) / (400 + 1000 us).
  const double f = 4.0 * 2 * 16 * 2048 * 2048 * 128;
  REQUIRE(p.attention[static_cast<std::size_t>(DType::bf16)]);
  CHECK(p.attention[static_cast<std::size_t>(DType::bf16)]->flops_per_second() ==
        rel((f / 2 + f) / 1400e-6));
  CHECK(fit.attention_calls == 2);
  CHECK(fit.skipped.at("attention: is_causal not recorded (\"Concrete Inputs\" is written by "
                       "PyTorch 2.2 and later)") == 1);
  // Elementwise: add 3 x 32 MiB, add_ 3 x 32 MiB, layer norm 2 x 64 MiB + 2 x 8 KiB, copy_
  // 128 + 64 MiB, in 40 + 40 + 50 + 80 us; gelu (4 KiB) skipped.
  const double bytes = 96.0 * MiB + 96.0 * MiB + (128.0 * MiB + 16384) + 192.0 * MiB;
  REQUIRE(p.elementwise_bandwidth);
  CHECK(p.elementwise_bandwidth->bytes_per_second() == rel(bytes / 210e-6));
  CHECK(fit.elementwise_calls == 4);
  CHECK(fit.skipped.at("elementwise: calls moving under 16 MiB (latency-bound)") == 1);
  // Copies: 2 x 64 MiB / 50 us device to device; 64 MiB / 2500 us pinned host to device.
  REQUIRE(p.memory_bandwidth);
  CHECK(p.memory_bandwidth->bytes_per_second() == rel(2.0 * 64 * MiB / 50e-6));
  REQUIRE(p.host_to_device_bandwidth);
  CHECK(p.host_to_device_bandwidth->bytes_per_second() == rel(64.0 * MiB / 2500e-6));
  CHECK_FALSE(p.device_to_host_bandwidth);
  CHECK(fit.copies == 2);
  CHECK(fit.skipped.at("copies: pageable or peer-to-peer memcpys") == 1);
  CHECK(fit.skipped.at("copies: memcpys under 16 MiB") == 1);
  // Launch calls: one of 50 us, every other of 5 us.
  REQUIRE(p.kernel_launch_overhead);
  CHECK(*p.kernel_launch_overhead == Time::us(5));
  // The rest.
  CHECK(fit.skipped.at("collectives: NCCL kernels (not fitted: they wait for other ranks)") == 1);
  CHECK(fit.skipped.at(
            "other: kernels not linked to a CPU operator (no matching \"External id\")") == 1);
  CHECK(fit.skipped.at("other: kernels of operators not fitted (aten::embedding 1)") == 1);
}

TEST_CASE(
    "calibrate from trace: the written profile loads in a device and the cost model uses it") {
  const testing::TempDir tmp("trace-calib");
  const auto fit = traces::calibrate_from_kineto_text("job.json", sample().text(), h100());
  hw::write_profile(fit.profile, tmp.path() / "profile.json");
  json device;
  std::ifstream(kH100) >> device;
  device["profile"] = (tmp.path() / "profile.json").string();
  // The shipped kernel model, by absolute path (the copy lives elsewhere): the measured profile
  // wins over it where it has measurements.
  device["kernel_model"] =
      (kH100.parent_path() / device["kernel_model"].get<std::string>()).lexically_normal().string();
  std::ofstream(tmp.path() / "device.json") << device.dump(2);
  const auto measured = hw::load_device(tmp.path() / "device.json");
  REQUIRE(measured.profile);
  CHECK(measured.profile->gemm.size() == 5);

  const strategies::Kernel gemm{strategies::Gemm{4096, 4096, 4096, 1, DType::bf16}, "gemm"};
  // The recorded 200 us plus the fitted 5 us launch overhead.
  CHECK(sim::DeviceCostModel(measured).kernel_time(gemm) == Time::us(205));
  // Without the profile the roofline model predicts something else.
  CHECK(sim::DeviceCostModel(h100()).kernel_time(gemm) != Time::us(205));
  // The causal forward attention of the trace at the fitted rate: F/2 / rate + 5 us.
  const strategies::Kernel attention{
      strategies::Attention{2, 16, 16, 2048, 2048, 128, true, DType::bf16, false}, "attention"};
  const double f = 4.0 * 2 * 16 * 2048 * 2048 * 128;
  const double rate = (f / 2 + f) / 1400e-6;
  CHECK(sim::DeviceCostModel(measured).kernel_time(attention).seconds() ==
        doctest::Approx(f / 2 / rate + 5e-6).epsilon(1e-8));
}

TEST_CASE("calibrate from trace: bad traces name the file, the JSON path and what to do") {
  check_error("{not json", "", "not valid JSON");
  check_error(R"({"events": []})", "traceEvents", "not a PyTorch profiler (Kineto) trace");
  {
    KinetoWriter w;
    w.open("aten::mm", {{4, 4}, {4, 4}}, kBf16x2);
    w.close();
    check_error(w.text(), "traceEvents", "no GPU kernels");
  }
  {
    KinetoWriter w;
    w.shapes = false;
    w.call("aten::mm", {{4096, 4096}, {4096, 4096}}, kBf16x2, {200});
    check_error(w.text(), "traceEvents[0].args.Input Dims", "record_shapes=True");
  }
  {
    json trace = {{"traceEvents",
                   {{{"ph", "X"}, {"cat", "kernel"}, {"name", "gemm"}, {"ts", 1}, {"dur", 2}}}}};
    check_error(trace.dump(), "traceEvents", "no CPU operators");
  }
  {
    KinetoWriter w;
    w.call("aten::embedding", {{50304, 4096}, {8, 2048}}, {"c10::BFloat16", "long int"}, {25});
    check_error(w.text(), "traceEvents", "nothing to calibrate from");
  }
  {
    KinetoWriter w;
    w.call("aten::mm", {{4096, 4096}, {4096, 4096}}, kBf16x2, {200});
    json doc = w.document();
    doc["traceEvents"][2]["dur"] = "long";
    check_error(doc.dump(), "traceEvents[2].dur", "expected a number");
  }
  CHECK_THROWS_AS(traces::calibrate_from_kineto(kSource / "no-such-trace.json", h100()),
                  traces::TraceError);
}
