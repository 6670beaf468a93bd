// stratasim run and validate, on the host device (CPU threads) so that they run everywhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

using namespace stratasim::testing::cli;

namespace {

nlohmann::json read_json(const fs::path& p) {
  return nlohmann::json::parse(read(p));
}

}  // namespace

TEST_CASE("cli run: the tiny 3D-parallel GPT runs on the host device and is reported") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("run-host");
  const auto r = run("run gpt-tiny-3d-8 --device host --verify --warmup 1 --iterations 2 --out " +
                     (dir / "out").string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("measured on      the host device (CPU threads)") != std::string::npos);
  CHECK(r.output.find("measured 2 iteration(s) after 1 warm-up") != std::string::npos);
  const auto report = read_json(dir / "out/report.json");
  CHECK(report["iteration_time_s"].get<double>() > 0);
  CHECK(report["completed"].get<bool>());
  // Every rank's memory was measured by its pool: the parameters at least.
  for (const auto& rank : report["ranks"]) CHECK(rank["peak_memory_bytes"].get<double>() > 0);
  const auto trace = read_json(dir / "out/timeline.json");
  CHECK(trace["traceEvents"].size() > 380);  // 380 ops and the memory counters
}

TEST_CASE("cli run: CUDA runs say what they need where there is no GPU") {
  const auto r = run("run gpt-tiny-3d-8 --iterations 1");
  if (r.status == 0) return;  // a machine with 8 GPUs ran it
  CHECK(r.status == 2);
  const bool explained = r.output.find("--device host") != std::string::npos ||
                         r.output.find("the strategy needs 8 GPUs") != std::string::npos;
  CHECK_MESSAGE(explained, r.output);
}

TEST_CASE("cli run: bad real-run options are clear errors") {
  auto r = run("run gpt-tiny-3d-8 --device tpu");
  CHECK(r.status == 2);
  CHECK(r.output.find("--device expects cuda or host, got \"tpu\"") != std::string::npos);
  r = run("run gpt-tiny-3d-8 --device host --capacity lots");
  CHECK(r.status == 2);
  CHECK(r.output.find("--capacity expects a size") != std::string::npos);
  r = run("run gpt3-1.7b-a100-8 --device host");
  CHECK(r.status == 2);
  CHECK(r.output.find("too large for the host device") != std::string::npos);
}

TEST_CASE("cli run: a pool too small for the program fails with exit code 3 and names the op") {
  const auto r = run("run gpt-tiny-3d-8 --device host --capacity \"1 MiB\" --iterations 1");
  CHECK(r.status == 3);
  CHECK(r.output.find("error: the real run failed: rank") != std::string::npos);
  CHECK(r.output.find("device memory: out of memory at") != std::string::npos);
}

TEST_CASE("cli validate: predicted and measured runs aligned op by op") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("validate-host");
  const auto r =
      run("validate gpt-tiny-3d-8 --device host --iterations 1 --out " + (dir / "v").string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("error = (predicted - measured) / measured") != std::string::npos);
  const auto v = read_json(dir / "v/validation.json");
  std::set<std::string> classes;
  for (const auto& row : v["classes"]) classes.insert(row["name"].get<std::string>());
  for (const char* c : {"gemm", "attention", "elementwise", "optimizer", "all-reduce", "p2p"}) {
    CHECK_MESSAGE(classes.count(c) == 1, c);
  }
  CHECK(v["stages"].size() == 2);
  const auto& it = v["iteration"];
  // The error is what the figures say it is: (predicted - measured) / measured.
  CHECK(it["error"].get<double>() ==
        doctest::Approx((it["predicted_s"].get<double>() - it["measured_s"].get<double>()) /
                        it["measured_s"].get<double>()));
  // Both back ends apply the same memory effects; only the order of ops on different streams
  // can move a peak.
  CHECK(std::abs(v["memory"]["error"].get<double>()) < 0.05);
  // validation_ops.csv: a header and one row per compared kernel or communication op.
  std::int64_t compared = 0;
  for (const auto& row : v["classes"]) compared += row["count"].get<std::int64_t>();
  const auto csv = read(dir / "v/validation_ops.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + compared);
  CHECK(compared > 1000);
  CHECK(fs::exists(dir / "v/predicted/report.json"));
  CHECK(fs::exists(dir / "v/measured/timeline.json"));
}

TEST_CASE("cli calibrate: the host device writes a profile that validate predicts with") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("calibrate-host");
  const auto profile = dir / "host.json";
  auto r = run("calibrate --device host --quick --ranks 2 --repetitions 3 --quiet --out " +
               profile.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto p = read_json(profile);
  CHECK(p["schema"] == "stratasim-device-profile");
  CHECK(p["schema_version"] == 2);
  CHECK(p["gemm"].size() > 0);
  CHECK(p["collectives"].size() > 0);
  CHECK(p.contains("kernel_launch_overhead"));
  CHECK(p.contains("copy_bandwidth"));
  r = run("validate gpt-tiny-3d-8 --device host --iterations 1 --profile " + profile.string());
  CHECK(r.status == 0);
  CHECK(r.output.find("with its measured profile") != std::string::npos);
}

TEST_CASE("cli calibrate: without the GPUs it needs, it says so and writes nothing") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("calibrate-cuda");
  const auto r = run("calibrate --ranks 64 --out " + (dir / "p.json").string());
  CHECK(r.status == 2);
  CHECK(r.output.find("calibrate needs 64 GPU(s)") != std::string::npos);
  CHECK(!fs::exists(dir / "p.json"));
}
