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
