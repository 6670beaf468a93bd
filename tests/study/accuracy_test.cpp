// The accuracy harness itself (study/accuracy.hpp), on a tiny calibration file written here:
// the mapping of an MPT case against the same experiment written by hand, the GEMM and
// attention FLOP counts of the sources, the error formula, the summaries, the reasons of a case
// that cannot be expressed, and the errors of a malformed file. Independent of how well the
// cost model predicts (that is the gate's business: tests/accuracy/).
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "hw_models/cluster.hpp"
#include "hw_models/config_reader.hpp"
#include "sim/cost.hpp"
#include "study/accuracy.hpp"
#include "study/catalog.hpp"
#include "study/study.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using nlohmann::json;

namespace {

// An llm-foundry-style MPT-125M run on one DGX H100 (FSDP FULL_SHARD, activation
// checkpointing), with a made-up published 1,000 tokens/s per GPU.
json mpt_case() {
  return {{"id", "mpt-125m-h100"},
          {"category", "e2e_training"},
          {"source", {{"ref", "llm-foundry-benchmarks"}}},
          {"hardware", {{"gpu", "H100-SXM-80GB"}, {"gpu_count", 8}}},
          {"config",
           {{"model", "MPT-125m"},
            {"d_model", 768},
            {"n_heads", 12},
            {"n_layers", 12},
            {"expansion_ratio", 4},
            {"vocab_size", 50368},
            {"attn_impl", "flash"},
            {"seq_len", 2048},
            {"micro_batch_size", 8},
            {"global_batch_size", 128},
            {"precision", "amp_bf16"},
            {"fsdp_sharding", "FULL_SHARD"},
            {"activation_checkpointing", true},
            {"tp", 1},
            {"pp", 1},
            {"dp", 8}}},
          {"measured", {{"tokens_per_s_per_gpu", 1000}}}};
}

// A GEMM of 1536 x 1408 x 4096 in bf16 on an H100 SXM, published at a made-up 500 TFLOP/s.
json gemm_case() {
  return {{"id", "gemm-h100"},
          {"category", "gemm"},
          {"source", {{"ref", "ml-engineering-mamf"}}},
          {"hardware", {{"gpu", "NVIDIA H100 SXM"}, {"gpu_count", 1}}},
          {"config", {{"dtype", "bf16"}, {"best_shape_printed", "1536x1408x4096"}}},
          {"measured", {{"mamf_tflops", 500}}}};
}

// FlashAttention-2 forward + backward, causal, head dim 128 on an H100: one point published at
// a made-up 200 TFLOP/s, one not legible (null).
json attention_case() {
  return {{"id", "fa2-h100"},
          {"category", "attention_kernel"},
          {"source", {{"ref", "flash-attn-benchmark-images"}}},
          {"hardware", {{"gpu", "H100 80GB SXM5"}, {"gpu_count", 1}}},
          {"config",
           {{"kernel", "FlashAttention-2"},
            {"pass_", "fwd+bwd"},
            {"dtype", "fp16"},
            {"causal", true},
            {"headdim", 128}}},
          {"measured",
           {{"sweep",
             {{{"seqlen", 1024}, {"batch", 2}, {"nheads", 16}, {"tflops", 200}},
              {{"seqlen", 2048}, {"batch", 1}, {"nheads", 16}, {"tflops", nullptr}}}}}}};
}

// A Megatron-Bridge-style MoE run in MXFP8 on MI300Xs: nothing of it is modelled.
json mi300x_case() {
  return {{"id", "qwen3-mi300x"},
          {"category", "e2e_training"},
          {"source", {{"ref", "megatron-bridge-perf-archive"}}},
          {"hardware", {{"gpu", "MI300X"}, {"gpu_count", 8}}},
          {"config",
           {{"model", "Qwen3_30B_a3B"},
            {"precision", "MXFP8"},
            {"global_batch_size", 512},
            {"micro_batch_size", 4},
            {"seq_len", 4096},
            {"tp", 1},
            {"pp", 1},
            {"cp", 1},
            {"ep", 8}}},
          {"measured", {{"tokens_per_s_per_gpu", 100}}}};
}

// Megatron-Bridge's Qwen3-30B-A3B pre-training row of release 26.04 on DGX-GB200, as the
// calibration set prints it (mbridge-26.04-pre-training-qwen3-30b-a3b-dgx-gb200-8-mxfp8: 8 GPUs,
// MXFP8, GBS 512, MBS 4, sequence 4096, FSDP 0, TP 1, PP 1, CP 1, VP n/a, EP 8, 26,032 tokens/s
// per GPU); `model` and `precision` replaceable for the variants.
json qwen3_moe_case(const std::string& id, const std::string& model, const json& precision) {
  return {{"id", id},
          {"category", "e2e_training"},
          {"source", {{"ref", "megatron-bridge-perf-archive"}}},
          {"hardware", {{"gpu", "GB200"}, {"gpu_count", 8}, {"system", "DGX-GB200"}}},
          {"config",
           {{"model", model},
            {"task", "Pre-Training"},
            {"release", "26.04"},
            {"precision", precision},
            {"global_batch_size", 512},
            {"micro_batch_size", 4},
            {"seq_len", 4096},
            {"fsdp", 0},
            {"tp", 1},
            {"pp", 1},
            {"cp", 1},
            {"vp", nullptr},
            {"ep", 8}}},
          {"measured", {{"tokens_per_s_per_gpu", 26032}}}};
}

std::filesystem::path write(const testing::TempDir& tmp, const json& cases) {
  const auto file = tmp.path() / "calibration.json";
  std::ofstream(file) << json{{"schema_version", 1}, {"cases", cases}}.dump(1);
  return file;
}

const study::AccuracyRow& row(const study::AccuracyReport& report, const std::string& id) {
  for (const auto& r : report.rows) {
    if (r.id == id) return r;
  }
  FAIL("no row " << id);
  throw std::logic_error("unreachable");
}

hw::DeviceSpec h100() {
  return hw::load_device(testing::configs_dir() / "hardware/devices/h100-sxm5-80gb.json");
}

}  // namespace

TEST_CASE("accuracy: an MPT case is simulated as the experiment written by hand") {
  const testing::TempDir tmp("accuracy");
  const auto report = study::accuracy(write(tmp, json::array({mpt_case()})));
  REQUIRE(report.rows.size() == 1);
  CHECK(report.unexpressed.empty());
  // The same run written as an experiment by hand, as docs/accuracy.md maps MPT: no biases,
  // LayerNorm, GELU, tied embeddings, ffn 4 x 768, rotary for ALiBi; FULL_SHARD as PyTorch
  // FSDP's runtime with llm-foundry's limit_all_gathers and Composer's BACKWARD_POST over the 8
  // GPUs; activation checkpointing = full recomputation.
  const json experiment = {
      {"name", "by-hand"},
      {"model",
       {{"type", "transformer"},
        {"name", "MPT-125m"},
        {"layers", 12},
        {"hidden", 768},
        {"heads", 12},
        {"kv_heads", 12},
        {"ffn_hidden", 3072},
        {"vocab", 50368},
        {"activation", "gelu"},
        {"tied_embeddings", true},
        {"position_embedding", "rotary"},
        {"max_seq_len", 2048},
        {"norm", "layernorm"},
        {"bias", false},
        {"causal", true},
        {"hidden_dropout", 0.0},
        {"attention_dropout", 0.0}}},
      {"cluster", (testing::configs_dir() / "hardware/clusters/dgx-h100-1.json").string()},
      {"parallelism", {{"tp", 1}, {"pp", 1}, {"dp", 8}, {"micro_batch", 8}, {"recompute", "full"}}},
      {"training",
       {{"global_batch", 128},
        {"seq_len", 2048},
        {"dtype", "bf16"},
        {"flash_attention", true},
        {"framework", "fsdp"},
        {"fsdp",
         {{"sharding_strategy", "FULL_SHARD"},
          {"limit_all_gathers", true},
          {"backward_prefetch", "BACKWARD_POST"},
          {"forward_prefetch", false}}},
        // llm-foundry's benchmarks ran MPT with attn_impl: triton: docs/accuracy.md.
        {"attention_kernel", "flash-attention-triton"}}}};
  const auto expected = study::simulate(study::from_json(experiment));
  const double predicted = expected.report.tokens_per_s / 8;
  const auto& r = row(report, "mpt-125m-h100");
  CHECK(r.level == study::AccuracyLevel::e2e);
  CHECK(r.mapped_to == "dgx-h100-1");
  CHECK(r.quantity == "tokens/s per GPU");
  CHECK(r.published == 1000);
  CHECK(r.predicted == doctest::Approx(predicted).epsilon(1e-12));
  CHECK(r.error == doctest::Approx((predicted - 1000) / 1000).epsilon(1e-12));
  // The row carries the experiment it was mapped to and the predicted peak over capacity.
  CHECK(r.experiment.at("training").at("attention_kernel") == "flash-attention-triton");
  CHECK(r.experiment.at("training").at("fsdp").at("sharding_strategy") == "FULL_SHARD");
  CHECK_FALSE(r.experiment.at("parallelism").contains("zero"));  // the sharding's
  CHECK(r.peak_memory_fraction ==
        doctest::Approx(static_cast<double>(expected.report.peak_memory.count()) /
                        static_cast<double>(expected.context.device_capacity.count())));
  // One row: the summary's mean and max are its |error|.
  const auto s = study::summaries(report, study::AccuracyLevel::e2e);
  REQUIRE(s.size() == 2);
  CHECK(s[0].group == "all");
  CHECK(s[1].group == "llm-foundry-benchmarks");
  CHECK(s[0].mean_abs_error == doctest::Approx(std::abs(r.error)));
  CHECK(s[0].max_abs_error == doctest::Approx(std::abs(r.error)));
}

TEST_CASE("accuracy: a GEMM case's TFLOP/s are 2 m n k over the device model's time") {
  const testing::TempDir tmp("accuracy");
  const auto report =
      study::accuracy(write(tmp, json::array({gemm_case()})), {.e2e = true, .kernels = true});
  REQUIRE(report.rows.size() == 1);
  const sim::DeviceCostModel model(h100());
  const strategies::Gemm gemm{1536, 1408, 4096, 1, DType::bf16};
  // Work time: the sources time kernels back to back, so the launch overhead is not counted.
  const double seconds = (model.kernel_time({gemm, "gemm"}) - model.launch_overhead()).seconds();
  const double flops = 17'716'740'096.0;  // 2 x 1536 x 1408 x 4096
  const double predicted = flops / seconds / 1e12;
  const auto& r = row(report, "gemm-h100");
  CHECK(r.level == study::AccuracyLevel::gemm);
  CHECK(r.mapped_to == "h100-sxm5-80gb");
  CHECK(r.predicted == doctest::Approx(predicted).epsilon(1e-12));
  CHECK(r.error == doctest::Approx((predicted - 500) / 500).epsilon(1e-12));
  // Without --kernels the GEMM case is not read at all.
  CHECK(study::accuracy(write(tmp, json::array({gemm_case()}))).rows.empty());
}

TEST_CASE("accuracy: attention points count FLOPs as FlashAttention's benchmarks do") {
  // 4 x batch 2 x 1024^2 x 16 heads x 128 = 17,179,869,184 forward FLOPs; causal halves them
  // (8,589,934,592); forward + backward counts 3.5 times that: 30,064,771,072.
  const testing::TempDir tmp("accuracy");
  const auto report =
      study::accuracy(write(tmp, json::array({attention_case()})), {.e2e = true, .kernels = true});
  REQUIRE(report.rows.size() == 1);
  const sim::DeviceCostModel model(h100());
  strategies::Attention a{2, 16, 16, 1024, 1024, 128, true, DType::fp16, false};
  Time time = model.kernel_time({a, "fwd"}) - model.launch_overhead();
  a.backward = true;
  time += model.kernel_time({a, "bwd"}) - model.launch_overhead();
  const double predicted = 30'064'771'072.0 / time.seconds() / 1e12;
  const auto& r = row(report, "fa2-h100@1024");
  CHECK(r.series == "flash-attention-2 fwd+bwd causal hd128 on H100-SXM5-80GB");
  CHECK(r.predicted == doctest::Approx(predicted).epsilon(1e-12));
  CHECK(r.error == doctest::Approx((predicted - 200) / 200).epsilon(1e-12));
  // The illegible point is listed, not compared.
  REQUIRE(report.unexpressed.size() == 1);
  CHECK(report.unexpressed[0].id == "fa2-h100@2048");
  CHECK(report.unexpressed[0].reason.find("not legible") != std::string::npos);
}

TEST_CASE("accuracy: a case the project cannot express is listed with every reason") {
  const testing::TempDir tmp("accuracy");
  const auto report = study::accuracy(write(tmp, json::array({mi300x_case(), mpt_case()})));
  CHECK(report.rows.size() == 1);
  REQUIRE(report.unexpressed.size() == 1);
  const auto& u = report.unexpressed[0];
  CHECK(u.id == "qwen3-mi300x");
  CHECK(u.source == "megatron-bridge-perf-archive");
  // The device is the only reason: MXFP8 (docs/precision.md), the model (the catalog's
  // Qwen3-30B-A3B) and expert parallelism 8 are mapped.
  CHECK(u.reason == "device MI300X not modelled");
  // The JSON the notebook reads lists it too.
  const json j = study::to_json(report);
  CHECK(j["unexpressed"][0]["id"] == "qwen3-mi300x");
  CHECK(j["rows"][0]["id"] == "mpt-125m-h100");
  CHECK(j["summary"]["e2e"][0]["rows"] == 1);
}

TEST_CASE("accuracy: summaries per group, by hand") {
  study::AccuracyReport report;
  auto add = [&](const std::string& series, double error) {
    study::AccuracyRow r;
    r.series = series;
    r.published = 100;
    r.predicted = 100 * (1 + error);
    r.error = error;
    report.rows.push_back(r);
  };
  add("a", 0.04);
  add("b", -0.08);
  add("a", 0.2);
  const auto s = study::summaries(report, study::AccuracyLevel::e2e);
  REQUIRE(s.size() == 3);
  // all: mean (0.04 + 0.08 + 0.2) / 3, max 0.2; within 5%: 0.04; within 10%: 0.04 and 0.08.
  CHECK(s[0].rows == 3);
  CHECK(s[0].mean_abs_error == doctest::Approx(0.32 / 3));
  CHECK(s[0].max_abs_error == doctest::Approx(0.2));
  CHECK(s[0].within_5 == 1);
  CHECK(s[0].within_10 == 2);
  CHECK(s[1].group == "a");
  CHECK(s[1].mean_abs_error == doctest::Approx(0.12));
  CHECK(s[2].group == "b");
  CHECK(s[2].max_abs_error == doctest::Approx(0.08));
  CHECK(study::summaries(report, study::AccuracyLevel::gemm)[0].rows == 0);
}

TEST_CASE("accuracy: a malformed calibration file names the file and the JSON path") {
  const testing::TempDir tmp("accuracy");
  json bad = gemm_case();
  bad["config"]["best_shape_printed"] = "1536x1408";
  const auto file = write(tmp, json::array({mpt_case(), bad}));
  try {
    study::accuracy(file, {.e2e = true, .kernels = true});
    FAIL("expected a ConfigError");
  } catch (const config::ConfigError& e) {
    CHECK(e.source() == file.string());
    CHECK(e.path() == "cases.1.config.best_shape_printed");
    CHECK(e.message().find("MxNxK") != std::string::npos);
  }
  json no_gpu = mpt_case();
  no_gpu["hardware"].erase("gpu");
  CHECK_THROWS_WITH_AS(study::accuracy(write(tmp, json::array({no_gpu}))),
                       doctest::Contains("cases.0.hardware.gpu"), config::ConfigError);
  std::ofstream(tmp.path() / "no-cases.json") << R"({"schema_version": 1})";
  CHECK_THROWS_WITH_AS(study::accuracy(tmp.path() / "no-cases.json"), doctest::Contains("cases"),
                       config::ConfigError);
}

TEST_CASE("accuracy: a DeepEP low-latency case is S over the network fabric's p2p rate") {
  // 128 tokens x top-8 x 7168 hidden: dispatch in fp8 with one fp32 scale per 128 channels
  // (7168 x (1 + 4/128) = 7392 bytes a token), combine in bf16 (14336 bytes). dgx-h800-2048: a
  // 400 Gb/s NIC (50 GB/s) at the ib-ndr400 fabric's p2p efficiency 0.93 = 46.5 GB/s.
  const json c = {{"id", "ll-ep8"},
                  {"category", "moe_all_to_all"},
                  {"source", {{"ref", "deepep-readme-2025-04"}}},
                  {"hardware", {{"gpu", "H800"}, {"gpu_count", 8}}},
                  {"config",
                   {{"kernel", "DeepEP low-latency"},
                    {"ep", 8},
                    {"tokens_per_batch", 128},
                    {"hidden", 7168},
                    {"topk", 8}}},
                  {"measured", {{"dispatch_latency_us", 160}, {"combine_latency_us", 320}}}};
  const testing::TempDir tmp("accuracy");
  const auto report = study::accuracy(write(tmp, json::array({c})), {.collectives = true});
  REQUIRE(report.rows.size() == 2);
  const auto& d = row(report, "ll-ep8/dispatch");
  CHECK(d.level == study::AccuracyLevel::moe);
  CHECK(d.predicted == doctest::Approx(128.0 * 8 * 7392 / 46.5e9 * 1e6).epsilon(1e-9));
  CHECK(d.error == doctest::Approx(d.predicted / 160 - 1));
  CHECK(row(report, "ll-ep8/combine").predicted ==
        doctest::Approx(128.0 * 8 * 14336 / 46.5e9 * 1e6).epsilon(1e-9));
  // Without --collectives the case is counted among the other categories.
  const auto plain = study::accuracy(write(tmp, json::array({c})));
  CHECK(plain.rows.empty());
  REQUIRE(plain.other_categories.size() == 1);
  CHECK(plain.other_categories[0].first == "moe_all_to_all");
}

TEST_CASE("accuracy ratchet: the shipped DeepEP rows within 15% do not fall below 16 of 20") {
  // tests/reference/calibration.json's 10 moe_all_to_all cases (DeepEP on H800), dispatch and
  // combine each a row. 16 of 20 within kMoeMaxError today; beyond it: the normal kernels'
  // internode ep32 (58 and 57 GB/s of RDMA, above the 50 GB/s NIC: DeepEP counts forwarded
  // bytes once) and the low-latency dispatch at ep 128 and 256 (its latency grows with the peers;
  // the model has no per-peer term). Raise the count when the model improves; never lower it.
  const auto report =
      study::accuracy(testing::source_dir() / "tests" / "reference" / "calibration.json",
                      {.e2e = false, .collectives = true});
  int rows = 0, within = 0;
  for (const auto& r : report.rows) {
    if (r.level != study::AccuracyLevel::moe) continue;
    ++rows;
    within += std::abs(r.error) <= study::kMoeMaxError ? 1 : 0;
  }
  CHECK(rows == 20);
  CHECK(within >= 16);
}

TEST_CASE("accuracy: the Blackwell GPUs of the calibration set map to their clusters") {
  // Megatron-Bridge's 8-GPU rows: system DGX-B200 a DGX B200 node; DGX-GB200 8 GPUs (two
  // compute trays) of a GB200 NVL72 rack; likewise B300 and GB300. A bf16 Llama 3 8B case on
  // each (made-up published figures) is expressed, simulated on that cluster and its die.
  const testing::TempDir tmp("accuracy");
  const std::pair<const char*, const char*> gpus[] = {{"B200", "dgx-b200-1"},
                                                      {"B300", "dgx-b300-1"},
                                                      {"GB200", "gb200-nvl72-8gpus"},
                                                      {"GB300", "gb300-nvl72-8gpus"}};
  json cases = json::array();
  for (const auto& [gpu, cluster] : gpus) {
    cases.push_back({{"id", std::string("llama3-8b-") + gpu},
                     {"category", "e2e_training"},
                     {"source", {{"ref", "megatron-bridge-perf-archive"}}},
                     {"hardware", {{"gpu", gpu}, {"gpu_count", 8}}},
                     {"config",
                      {{"model", "LLAMA3_8B"},
                       {"precision", "bf16"},
                       {"global_batch_size", 32},
                       {"micro_batch_size", 1},
                       {"seq_len", 8192},
                       {"tp", 1},
                       {"pp", 1}}},
                     {"measured", {{"tokens_per_s_per_gpu", 10000}}}});
  }
  const auto report = study::accuracy(write(tmp, cases));
  CHECK(report.unexpressed.empty());
  for (const auto& [gpu, cluster] : gpus) {
    CAPTURE(gpu);
    const auto& r = row(report, std::string("llama3-8b-") + gpu);
    CHECK(r.mapped_to == cluster);
    CHECK(r.die ==
          (std::string(gpu).find("300") != std::string::npos ? "Blackwell Ultra" : "Blackwell"));
    CHECK(r.predicted > 0);
  }
}

TEST_CASE("accuracy: Megatron-Bridge's Qwen3-30B-A3B MXFP8 row is the catalog model with ep 8") {
  // The row prints no shape: the model is the catalog's Hugging Face config.json
  // (configs/models/hf/qwen3-30b-a3b.json), read as the model; the printed layout is the
  // experiment's (tp 1, pp 1, 8 GPUs -> dp 8; EP 8; Megatron-Core's expert tensor parallelism
  // with tp 1: 1), MBS 4, GBS 512, sequence 4096, Megatron's distributed optimizer (zero 1),
  // MXFP8 as Megatron-Bridge's bf16_with_mxfp8_mixed, DGX-GB200 as 8 GPUs of a GB200 NVL72 rack.
  const testing::TempDir tmp("accuracy");
  const auto report = study::accuracy(
      write(tmp, json::array({qwen3_moe_case("qwen3-gb200", "Qwen3_30B_a3B", "MXFP8")})));
  CHECK(report.unexpressed.empty());
  const auto& r = row(report, "qwen3-gb200");
  CHECK(r.mapped_to == "gb200-nvl72-8gpus");
  CHECK(r.die == "Blackwell");
  CHECK(r.published == 26032);
  const json& e = r.experiment;
  CHECK(e.at("model") == "qwen3-30b-a3b");
  const json& p = e.at("parallelism");
  CHECK(p.at("tp") == 1);
  CHECK(p.at("pp") == 1);
  CHECK(p.at("dp") == 8);
  CHECK(p.at("ep") == 8);
  CHECK(p.at("etp") == 1);
  CHECK(p.at("micro_batch") == 4);
  CHECK(p.at("zero") == 1);
  CHECK(p.at("moe_token_dispatcher") == "alltoall");
  CHECK_FALSE(p.contains("cp"));
  const json& t = e.at("training");
  CHECK(t.at("global_batch") == 512);
  CHECK(t.at("seq_len") == 4096);
  CHECK(t.at("dtype") == "fp8");
  CHECK(t.at("fp8").at("recipe") == "mxfp8");
  CHECK(t.at("framework") == "megatron");
  // Simulated as that experiment with the model file written out: the same prediction, and the
  // model is Qwen3-30B-A3B's 128 experts, 8 per token, 48 layers.
  json by_hand = e;
  by_hand["model"] = (testing::configs_dir() / "models/hf/qwen3-30b-a3b.json").string();
  const auto expected = study::simulate(study::from_json(by_hand));
  CHECK(expected.experiment.model.layers == 48);
  REQUIRE(expected.experiment.model.moe.has_value());
  CHECK(expected.experiment.model.moe->num_experts == 128);
  CHECK(expected.experiment.model.moe->top_k == 8);
  CHECK(r.predicted == doctest::Approx(expected.report.tokens_per_s / 8).epsilon(1e-12));
}

TEST_CASE(
    "accuracy: a tokendrop row is the model with capacity factor 1.0, when its precision "
    "is printed") {
  // Megatron-Bridge's "(tokendrop)" rows ran apply_moe_token_drop: --moe-expert-capacity-factor
  // 1.0 with the expert inputs padded to capacity. The calibration set's two such rows (release
  // 25.09) print no precision: that stays their one reason. With a precision (made up here) the
  // row is expressed, the capacity factor said in its note.
  const testing::TempDir tmp("accuracy");
  const auto report = study::accuracy(
      write(tmp, json::array({qwen3_moe_case("unprinted", "Qwen3_30B_a3B (tokendrop)", nullptr),
                              qwen3_moe_case("printed", "Qwen3_30B_a3B (tokendrop)", "MXFP8"),
                              qwen3_moe_case("dropless", "Qwen3_30B_a3B (dropless)", "MXFP8")})));
  REQUIRE(report.unexpressed.size() == 1);
  CHECK(report.unexpressed[0].id == "unprinted");
  CHECK(report.unexpressed[0].reason == "precision not printed");
  const auto& tokendrop = row(report, "printed");
  CHECK(tokendrop.note.find("model.moe.capacity_factor 1.0") != std::string::npos);
  CHECK(tokendrop.experiment.at("model") == "qwen3-30b-a3b");
  const auto& dropless = row(report, "dropless");
  CHECK(dropless.note.find("capacity_factor") == std::string::npos);
  // Balanced routing (Megatron-Bridge forces it in its MoE benchmarks) fills every expert to
  // exactly its even share, so capacity 1.0 drops and pads nothing: the same prediction.
  CHECK(tokendrop.predicted == doctest::Approx(dropless.predicted).epsilon(1e-9));
}

TEST_CASE("accuracy: MoE rows whose layout is not printed in full keep a precise reason") {
  const testing::TempDir tmp("accuracy");
  // tp 2 without an expert tensor-parallel degree: Megatron-Core's default (etp = tp = 2) and
  // Megatron-Bridge's recipes (etp 1) differ.
  json tp2 = qwen3_moe_case("tp2", "Qwen3_30B_a3B", "MXFP8");
  tp2["config"]["tp"] = 2;
  // An expert-parallel degree not printed ("n/a") on a MoE model.
  json no_ep = qwen3_moe_case("no-ep", "Qwen3_30B_a3B", "MXFP8");
  no_ep["config"]["ep"] = nullptr;
  // A variant the mapping does not know.
  json variant = qwen3_moe_case("variant", "Qwen3_30B_a3B (w/o MTP)", "MXFP8");
  const auto report = study::accuracy(write(tmp, json::array({tp2, no_ep, variant})));
  CHECK(report.rows.empty());
  REQUIRE(report.unexpressed.size() == 3);
  CHECK(report.unexpressed[0].reason == "expert tensor parallelism not printed (tp 2)");
  CHECK(report.unexpressed[1].reason == "MoE with no expert-parallel degree printed");
  CHECK(report.unexpressed[2].reason == "model variant (w/o MTP) not mapped");
}
