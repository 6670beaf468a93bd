// `stratasim fit`: kernel models fitted for the shipped GPUs from the calibration set (the
// files it writes load as the devices' kernel models and reproduce the shipped ones), and bad
// input: no device, a device without cases, a malformed calibration file (exit 2).
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

using namespace stratasim::testing::cli;
using nlohmann::json;
using stratasim::testing::configs_dir;

TEST_CASE("cli fit: the shipped kernel models are what the fit writes") {
  const TempDir tmp("cli-fit");
  const auto out = tmp.subdir("models");
  auto r =
      run("fit --device a100-sxm4-40gb --device a100-sxm4-80gb --device h100-sxm5-80gb "
          "--device h200-sxm-141gb --out-dir " +
          out.string() + " --residuals " + (out / "residuals.csv").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("fit gemm bf16") != std::string::npos);
  for (const char* name :
       {"a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"}) {
    CAPTURE(name);
    const std::string file = std::string(name) + ".kernel-model.json";
    // Deterministic, and what scripts/fit-profiles committed.
    CHECK(read(out / file) == read(configs_dir() / "hardware" / "profiles" / file));
  }
  CHECK(read(out / "residuals.csv") ==
        read(configs_dir() / "hardware" / "profiles" / "kernel-model-residuals.csv"));
}

TEST_CASE("cli fit: the shipped Blackwell kernel models are what their own fit writes") {
  // scripts/fit-profiles fits the Blackwell GPUs apart from the others (their cases would move
  // the shared kernel-class parameters of the A100/H100/H200 fit).
  const TempDir tmp("cli-fit");
  const auto out = tmp.subdir("models");
  auto r =
      run("fit --device b200-sxm-180gb --device b300-sxm-288gb --device gb200-186gb "
          "--device gb300-288gb --quiet --out-dir " +
          out.string() + " --residuals " + (out / "residuals.csv").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  for (const char* name : {"b200-sxm-180gb", "b300-sxm-288gb", "gb200-186gb", "gb300-288gb"}) {
    CAPTURE(name);
    const std::string file = std::string(name) + ".kernel-model.json";
    CHECK(read(out / file) == read(configs_dir() / "hardware" / "profiles" / file));
  }
  CHECK(read(out / "residuals.csv") ==
        read(configs_dir() / "hardware" / "profiles" / "blackwell-kernel-model-residuals.csv"));
}

TEST_CASE("cli fit: bad input exits 2 with what was wrong") {
  const TempDir tmp("cli-fit");
  const auto out = tmp.subdir("models");
  check_bad_input("fit --out-dir " + out.string(), {"--device"});
  // A device no calibration case was measured on.
  check_bad_input("fit --device v100-sxm2-32gb --out-dir " + out.string(),
                  {"V100-SXM2-32GB", "no calibration case"});
  check_bad_input("fit --device h100-sxm5-80gb --out-dir " + (out / "missing").string(),
                  {"--out-dir", "not a directory"});
  // A calibration file whose GEMM shape does not parse: the file and the JSON path.
  const auto bad = tmp.path() / "bad.json";
  std::ofstream(bad) << R"({"cases": [{"id": "g", "category": "gemm",
    "source": {"ref": "s"}, "hardware": {"gpu": "NVIDIA H100 SXM"},
    "config": {"dtype": "bf16", "best_shape_printed": "1024x2048"},
    "measured": {"mamf_tflops": 700}}]})";
  check_bad_input(
      "fit --calibration " + bad.string() + " --device h100-sxm5-80gb --out-dir " + out.string(),
      {bad.string(), "cases.0.config.best_shape_printed", "MxNxK"});
}

TEST_CASE("cli: a device whose kernel model is wrong is bad input naming the file and key") {
  const TempDir tmp("cli-fit");
  auto model =
      json::parse(read(configs_dir() / "hardware/profiles/h100-sxm5-80gb.kernel-model.json"));
  auto device = json::parse(read(configs_dir() / "hardware/devices/h100-sxm5-80gb.json"));
  device["kernel_model"] = (tmp.path() / "model.json").string();
  std::ofstream(tmp.path() / "device.json") << device.dump();
  const std::string simulate =
      "simulate llama2-7b-h100-8 --set cluster.device=" + (tmp.path() / "device.json").string();
  // A negative efficiency.
  model["gemm"]["bf16"]["peak_fraction"] = -0.3;
  std::ofstream(tmp.path() / "model.json") << model.dump();
  check_bad_input(simulate, {"model.json", "gemm.bf16.peak_fraction", "(0, 1]"});
  // No device: a kernel model says which device it was fitted for.
  model["gemm"]["bf16"]["peak_fraction"] = 0.8;
  model.erase("device");
  std::ofstream(tmp.path() / "model.json") << model.dump();
  check_bad_input(simulate, {"model.json", "device"});
  // Another device's model.
  model["device"] = "A100-SXM4-80GB";
  std::ofstream(tmp.path() / "model.json") << model.dump();
  check_bad_input(simulate, {"fitted for A100-SXM4-80GB", "H100-SXM5-80GB"});
}

TEST_CASE("cli fit: a fit that does not converge within its budget exits 2 naming it") {
  // Three evaluations cannot converge even the one-parameter GEMM block (its simplex alone
  // takes two): the fit stops with the block, the budget and how to give it more.
  const TempDir tmp("cli-fit");
  const auto out = tmp.subdir("models");
  check_bad_input(
      "fit --device h100-sxm5-80gb --max-evaluations 3 --out-dir " + out.string(),
      {"the fit of gemm bf16 did not converge within 3 evaluations", "--max-evaluations"});
  // Nothing half-written: no kernel model was written.
  CHECK(!std::filesystem::exists(out / "h100-sxm5-80gb.kernel-model.json"));
  // The frameworks' and dies' fit: the same (its first evaluation already simulates every run).
  check_bad_input(
      "fit --frameworks " + (out / "frameworks.json").string() + " --max-framework-evaluations 2",
      {"the fit of the frameworks and dies", "did not converge within 2 evaluations",
       "--max-framework-evaluations"});
  CHECK(!std::filesystem::exists(out / "frameworks.json"));
  check_bad_input("fit --device h100-sxm5-80gb --max-evaluations 0 --out-dir " + out.string(),
                  {"--max-evaluations"});
}
