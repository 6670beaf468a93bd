// `stratasim accuracy`: the table of the shipped calibration set, the formats, and bad files
// (exit code 2 naming the file and the JSON path).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"

using namespace stratasim::testing::cli;
using nlohmann::json;

namespace {

// One MPT case on a DGX H100 and one MI300X case nothing of which is modelled.
const char* kTiny = R"({"schema_version": 1, "cases": [
  {"id": "mpt-125m-h100", "category": "e2e_training", "source": {"ref": "llm-foundry-benchmarks"},
   "hardware": {"gpu": "H100-SXM-80GB", "gpu_count": 8},
   "config": {"model": "MPT-125m", "d_model": 768, "n_heads": 12, "n_layers": 12,
              "expansion_ratio": 4, "vocab_size": 50368, "attn_impl": "flash", "seq_len": 2048,
              "micro_batch_size": 8, "global_batch_size": 128, "precision": "amp_bf16",
              "fsdp_sharding": "FULL_SHARD", "activation_checkpointing": false},
   "measured": {"tokens_per_s_per_gpu": 1000}},
  {"id": "mi300x-case", "category": "e2e_training", "source": {"ref": "megatron-bridge-perf-archive"},
   "hardware": {"gpu": "MI300X", "gpu_count": 8},
   "config": {"model": "LLAMA3_8B", "precision": "FP8-CS", "global_batch_size": 128,
              "micro_batch_size": 2, "seq_len": 8192},
   "measured": {"tokens_per_s_per_gpu": 100}}]})";

}  // namespace

TEST_CASE("cli accuracy: the shipped calibration set, end to end and kernels") {
  auto r = run("accuracy --kernels");
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  for (const char* text :
       {"llm-foundry-benchmarks", "flash-attn-training-gpt3", "ml-engineering-mamf",
        "flash-attention-2 fwd+bwd causal hd64 on A100-SXM4-80GB",
        "device H100 SXM 96GB HBM2e (500W) not modelled", "not compared (e2e)", "gate ("}) {
    CAPTURE(text);
    CHECK(r.output.find(text) != std::string::npos);
  }
}

TEST_CASE("cli accuracy: json and csv of a calibration file") {
  const TempDir tmp("cli-accuracy");
  const auto file = tmp.path() / "tiny.json";
  std::ofstream(file) << kTiny;
  auto r = run("accuracy --calibration " + file.string() + " --format json");
  REQUIRE(r.status == 0);
  const json j = json::parse(r.output);
  REQUIRE(j["rows"].size() == 1);
  CHECK(j["rows"][0]["id"] == "mpt-125m-h100");
  CHECK(j["rows"][0]["mapped_to"] == "dgx-h100-1");
  const double predicted = j["rows"][0]["predicted"];
  CHECK(j["rows"][0]["error"].get<double>() == doctest::Approx((predicted - 1000) / 1000));
  REQUIRE(j["unexpressed"].size() == 1);
  CHECK(j["unexpressed"][0]["reason"] == "device MI300X not modelled");  // FP8-CS is mapped
  CHECK(j["bounds"]["e2e_mean_abs_error"] == 0.05);

  r = run("accuracy --calibration " + file.string() + " --format csv");
  REQUIRE(r.status == 0);
  CHECK(r.output.starts_with(
      "level,id,source,series,device,mapped_to,quantity,published,predicted,error,note,reason\n"));
  CHECK(r.output.find("\ne2e,mi300x-case,megatron-bridge-perf-archive,,,,,,,,,"
                      "device MI300X not modelled\n") != std::string::npos);
}

TEST_CASE("cli accuracy: a bad calibration file is bad input naming the file and JSON path") {
  const TempDir tmp("cli-accuracy");
  const auto file = tmp.path() / "bad.json";
  std::string text = kTiny;
  text.replace(text.find("\"d_model\": 768"), 14, "\"d_model\": \"768\"");
  std::ofstream(file) << text;
  check_bad_input("accuracy --calibration " + file.string(),
                  {file.string(), "cases.0.config.d_model", "positive integer"});
  check_bad_input("accuracy --calibration " + (tmp.path() / "missing.json").string(),
                  {"missing.json"});
  check_bad_input("accuracy --format xml", {"--format"});
}
