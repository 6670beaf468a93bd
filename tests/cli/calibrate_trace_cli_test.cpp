// stratasim calibrate --from-trace: a Kineto trace with known kernels (tests/kineto_writer.hpp)
// gives a profile file with the recorded times; bad traces and flags exit 2 naming what is wrong.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "hw_models/profile.hpp"
#include "kineto_writer.hpp"

using namespace stratasim::testing::cli;
using nlohmann::json;
using stratasim::testing::KinetoWriter;

namespace {

const json kBf16x2 = {"c10::BFloat16", "c10::BFloat16"};

// aten::mm 4096^3 bf16 in 200 us; aten::add of two [4096, 4096] bf16 tensors (96 MiB read and
// written) in 40 us; every launch call 5 us.
KinetoWriter job() {
  KinetoWriter w;
  w.call("aten::mm", {{4096, 4096}, {4096, 4096}}, kBf16x2, {200});
  w.call("aten::add", {{4096, 4096}, {4096, 4096}, json::array()},
         {"c10::BFloat16", "c10::BFloat16", "Scalar"}, {40});
  return w;
}

}  // namespace

TEST_CASE("cli calibrate --from-trace: the trace's kernels become the profile's figures") {
  const TempDir tmp("cli-trace-calib");
  const auto trace = tmp.write("rank0.pt.trace.json", job().text());
  const auto profile = tmp / "h100.json";
  const auto r = run("calibrate --from-trace " + trace.string() +
                     " --device h100-sxm5-80gb --out " + profile.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("calibrating H100-SXM5-80GB from " + trace.string() +
                      " (recorded on NVIDIA H100 80GB HBM3)") != std::string::npos);
  CHECK(r.output.find("gemm: 1 calls of 1 shapes") != std::string::npos);
  CHECK(r.output.find("elementwise: 1 calls of at least 16 MiB") != std::string::npos);
  CHECK(r.output.find("launch overhead: median of 2 launch calls -> 5 us") != std::string::npos);
  CHECK(r.output.find("wrote " + profile.string()) != std::string::npos);
  const auto p = json::parse(read(profile));
  CHECK(p["device"] == "H100-SXM5-80GB");
  REQUIRE(p["gemm"].size() == 1);
  CHECK(p["gemm"][0]["m"] == 4096);
  CHECK(p["gemm"][0]["dtype"] == "bf16");
  CHECK(p["gemm"][0]["time"] == "200000000 ps");  // 200 us
  CHECK(p["kernel_launch_overhead"] == "5000000 ps");
  // 3 x 32 MiB / 40 us = 2516582400000 B/s.
  const auto loaded = stratasim::hw::load_profile(profile);
  REQUIRE(loaded.elementwise_bandwidth);
  CHECK(loaded.elementwise_bandwidth->bytes_per_second() ==
        doctest::Approx(3.0 * 32 * 1024 * 1024 / 40e-6).epsilon(1e-12));
  // Without --out it reports and writes nothing.
  const auto dry = run("calibrate --from-trace " + trace.string() + " --device h100-sxm5-80gb");
  CHECK(dry.status == 0);
  CHECK(dry.output.find("no --out: nothing written") != std::string::npos);
}

TEST_CASE("cli calibrate --from-trace: bad traces and flags exit 2 saying what is wrong") {
  const TempDir tmp("cli-trace-calib");
  KinetoWriter w;
  w.shapes = false;
  w.call("aten::mm", {{4096, 4096}, {4096, 4096}}, kBf16x2, {200});
  const auto bare = tmp.write("bare.json", w.text());
  check_bad_input("calibrate --from-trace " + bare.string() + " --device h100-sxm5-80gb",
                  {bare.string(), "traceEvents[0].args.Input Dims", "record_shapes=True"});
  const auto not_kineto = tmp.write("not.json", R"({"nodes": []})");
  check_bad_input("calibrate --from-trace " + not_kineto.string() + " --device h100-sxm5-80gb",
                  {not_kineto.string(), "traceEvents", "not a PyTorch profiler (Kineto) trace"});
  const auto good = tmp.write("good.json", job().text());
  check_bad_input("calibrate --from-trace " + good.string(), {"--from-trace needs --device"});
  check_bad_input("calibrate --from-trace " + good.string() + " --device h100-sxm5-80gb --ranks 2",
                  {"--ranks, --repetitions, --quick and --name are for measuring"});
  check_bad_input(
      "calibrate --from-trace " + good.string() + " --device no-such-gpu",
      {"--device no-such-gpu: neither a device config file nor a shipped device's name"});
  check_bad_input("calibrate --device host", {"calibrate needs --out PROFILE.json"});
}
