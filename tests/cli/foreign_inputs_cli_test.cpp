// --deepspeed, --megatron-args and --model (a Hugging Face config.json) on the command line: the
// shipped samples simulate, the same experiment written as stratasim flags gives a byte-identical
// report, notes go to stderr, and bad input exits 2 naming the file or argument and the key.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

namespace {

using namespace stratasim::testing::cli;
using stratasim::testing::configs_dir;

bool has(const std::string& output, const std::string& text) {
  return output.find(text) != std::string::npos;
}

// The report.json of `simulate ARGS --out DIR/name`.
std::string report_of(const fs::path& dir, const std::string& name, const std::string& args) {
  const auto out = dir / name;
  auto r = run("simulate " + args + " --quiet --out " + out.string());
  CAPTURE(args);
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  return read(out / "report.json");
}

}  // namespace

TEST_CASE("every shipped DeepSpeed config simulates with a shipped experiment") {
  int n = 0;
  for (const auto& f : fs::directory_iterator(configs_dir() / "deepspeed")) {
    CAPTURE(f.path());
    auto r = run("simulate llama2-7b-h100-8 --deepspeed " + f.path().string());
    CAPTURE(r.output);
    CHECK(r.status == 0);
    CHECK(has(r.output, "iteration time"));
    CHECK(has(r.output, "ZeRO"));
    ++n;
  }
  CHECK(n >= 2);
}

TEST_CASE("every shipped Hugging Face config.json simulates as the model of an experiment") {
  int n = 0;
  for (const auto& f : fs::directory_iterator(configs_dir() / "models" / "hf")) {
    CAPTURE(f.path());
    // Short sequences and a small batch: GPT-2 learns only 1,024 positions. Sequence
    // parallelism, which the mixture-of-experts models need with tp > 1 (Megatron-Core's rule).
    auto r = run("simulate llama2-7b-h100-8 --model " + f.path().string() +
                 " --seq-len 1024 --global-batch 8 --set parallelism.sequence_parallel=true");
    CAPTURE(r.output);
    CHECK(r.status == 0);
    CHECK(has(r.output, "model            " + f.path().stem().string()));
    ++n;
  }
  CHECK(n >= 4);
}

TEST_CASE("--deepspeed gives the same simulation as the equivalent flags") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("foreign-ds");
  const std::string ds = (configs_dir() / "deepspeed" / "zero2-offload.json").string();
  // zero2-offload.json as stratasim settings (micro 1 x 32 steps x dp 2 = 64 samples).
  const std::string flags =
      "--global-batch 64 --micro-batch 1 --zero 2 --offload optimizer --set training.dtype=bf16 "
      "--set parallelism.reduce_bucket_size=500000000 "
      "--set parallelism.allgather_bucket_size=500000000 --set parallelism.dp_overlap=true "
      "--set training.grad_clip=1 "          // gradient_clipping 1.0
      "--set training.framework=deepspeed";  // any DeepSpeed config
  CHECK(report_of(dir, "ds", "llama2-7b-h100-8 --deepspeed " + ds) ==
        report_of(dir, "flags", "llama2-7b-h100-8 " + flags));
  // Flags given with --deepspeed win over it.
  auto r = run("simulate llama2-7b-h100-8 --deepspeed " + ds + " --zero 1");
  CHECK(r.status == 0);
  CHECK(has(r.output, "ZeRO 1"));
}

TEST_CASE("--megatron-args gives the same simulation as the equivalent flags") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("foreign-megatron");
  CHECK(report_of(dir, "megatron",
                  "gpt3-1.7b-a100-8 --megatron-args \"--tensor-model-parallel-size 2 "
                  "--pipeline-model-parallel-size 2 --sequence-parallel --micro-batch-size 2 "
                  "--global-batch-size 32 --recompute-activations --use-distributed-optimizer "
                  "--lr 1e-4\"") ==
        report_of(dir, "flags",
                  "gpt3-1.7b-a100-8 --tp 2 --pp 2 --sequence-parallel --micro-batch 2 "
                  "--global-batch 32 --recompute selective "
                  "--set training.framework=megatron --set training.distributed_optimizer=true "
                  // Megatron-LM's default --clip-grad 1.0, which the arguments bring.
                  "--set training.grad_clip=1"));
}

TEST_CASE("--model with Llama-2-7B's config.json simulates as configs/models/llama2-7b.json") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("foreign-hf");
  const std::string hf = (configs_dir() / "models" / "hf" / "llama2-7b.json").string();
  CHECK(report_of(dir, "hf", "llama2-7b-h100-8 --model " + hf) ==
        report_of(dir, "ours", "llama2-7b-h100-8"));
  // By catalog name too; notes on stderr, none with --quiet.
  auto r = run("simulate llama2-7b-h100-8 --model mistral-7b");
  CHECK(r.status == 0);
  CHECK(has(r.output, "note: "));
  CHECK(has(r.output, "torch_dtype \"bfloat16\""));
  CHECK(!has(r.output, "sliding_window"));  // modelled (at 4,096 tokens it changes nothing)
  CHECK(has(r.output, "model            mistral-7b: 32 layers"));
  auto quiet = run("simulate llama2-7b-h100-8 --model mistral-7b --quiet");
  CHECK(quiet.status == 0);
  CHECK(quiet.output.empty());
}

TEST_CASE("foreign inputs work with the other experiment commands") {
  for (const std::string command : {"memory", "partition", "schedules"}) {
    CAPTURE(command);
    auto r = run(command + " gpt3-1.7b-a100-8 --megatron-args \"--tensor-model-parallel-size 2\"");
    CAPTURE(r.output);
    CHECK(r.status == 0);
    if (command == "memory") CHECK(has(r.output, "tp 2 x pp 1 x dp 4"));
  }
}

TEST_CASE("bad foreign inputs exit 2 naming the file or argument and the key") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("foreign-bad");
  auto check_bad = [](const std::string& args, const std::vector<std::string>& expected) {
    CAPTURE(args);
    auto r = run(args);
    CAPTURE(r.output);
    CHECK(r.status == 2);
    for (const auto& text : expected) CHECK(has(r.output, text));
  };
  const auto ds = dir / "ds.json";
  std::ofstream(ds) << R"({"zero_optimization": {"stage": 5}})";
  check_bad("simulate gpt3-1.7b-a100-8 --deepspeed " + ds.string(),
            {ds.string(), "zero_optimization.stage", "expected a ZeRO stage 0, 1, 2 or 3, got 5"});
  std::ofstream(ds) << R"({"train_batch_size": 64, "gradient_accumulation_steps": 3})";
  check_bad("simulate gpt3-1.7b-a100-8 --deepspeed " + ds.string(),
            {"ds.json (gradient_accumulation_steps)", "must be divisible by"});
  check_bad("simulate gpt3-1.7b-a100-8 --deepspeed " + (dir / "missing.json").string(),
            {"missing.json", "no such file"});
  check_bad("simulate gpt3-1.7b-a100-8 --megatron-args \"--tensor-model-parallel-size x\"",
            {"--megatron-args: at --tensor-model-parallel-size: expected an integer"});
  check_bad("simulate gpt3-1.7b-a100-8 --megatron-args=\"--tensor-model-parallel-size 5\"",
            {"--megatron-args (--tensor-model-parallel-size 5): at parallelism.tp: must divide"});
  // --overlap-param-gather needs the distributed optimizer (ZeRO stage 1).
  check_bad("simulate gpt3-1.7b-a100-8 --megatron-args \"--overlap-param-gather\"",
            {"--megatron-args (--overlap-param-gather): at parallelism.overlap_param_gather",
             "distributed optimizer"});
  const auto hf = dir / "config.json";
  std::ofstream(hf) << R"({"model_type": "t5", "d_model": 512})";
  check_bad("simulate gpt3-1.7b-a100-8 --model " + hf.string(),
            {hf.string(), "model_type", "llama, mistral, gpt2, gpt_neox"});
}

TEST_CASE("bad ZeRO++ keys of a DeepSpeed config exit 2 naming the file and the key") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("zeropp-bad");
  const auto ds = dir / "ds.json";
  auto check_bad = [&ds](const std::string& text, const std::string& expected) {
    std::ofstream(ds) << text;
    auto r = run("simulate gpt3-1.7b-a100-8 --deepspeed " + ds.string());
    CAPTURE(text);
    CAPTURE(r.output);
    CHECK(r.status == 2);
    CHECK(has(r.output,
              "ds.json (zero_optimization.zero_hpz_partition_size): at "
              "parallelism.zero_hpz_partition_size"));
    CHECK(has(r.output, expected));
  };
  // gpt3-1.7b-a100-8 has dp 8: a partition of 3 ranks does not divide it.
  check_bad(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}})",
            "must divide the data-parallel degree (parallelism.dp 8)");
  check_bad(R"({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 4}})",
            "needs parallelism.zero 3, got ZeRO stage 2");
  // Valid, it simulates.
  std::ofstream(ds) << R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4,
                            "zero_quantized_weights": true, "zero_quantized_gradients": true}})";
  auto ok = run("simulate gpt3-1.7b-a100-8 --deepspeed " + ds.string() + " --quiet");
  CAPTURE(ok.output);
  CHECK(ok.status == 0);
}

TEST_CASE("Megatron-DeepSpeed's --normalization rmsnorm (lower case) is read") {
  // Megatron-DeepSpeed's argparse choices are "layernorm" and "rmsnorm"; Megatron-LM's
  // "LayerNorm" and "RMSNorm". Both spellings give the same simulation.
  const TempDir tmp("cli");
  auto dir = tmp.subdir("normalization");
  CHECK(report_of(dir, "lower", "gpt3-1.7b-a100-8 --megatron-args \"--normalization rmsnorm\"") ==
        report_of(dir, "upper", "gpt3-1.7b-a100-8 --megatron-args \"--normalization RMSNorm\""));
  auto r = run("simulate gpt3-1.7b-a100-8 --megatron-args \"--normalization rms\"");
  CHECK(r.status == 2);
  CHECK(has(r.output, "--normalization"));
}

TEST_CASE("--megatron-args setting tp x pp beyond the cluster blames --megatron-args") {
  // docs/inputs.md: errors name the argument that set the value, not the experiment file.
  auto r =
      run("simulate llama2-7b-h100-8 --megatron-args \"--tensor-model-parallel-size 8 "
          "--pipeline-model-parallel-size 4\"");
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(has(r.output, "--tensor-model-parallel-size"));
  CHECK(!has(r.output, "llama2-7b-h100-8.json"));
}

TEST_CASE("--set cluster=dgx-h100-128 takes a shipped cluster by name, as --cluster does") {
  auto r =
      run("simulate llama2-7b-h100-8 --set cluster=dgx-h100-128 --set parallelism.dp=256 "
          "--set training.global_batch=256");  // 128 nodes x 8 = 1,024 = tp 4 x dp 256
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "dgx-h100-128"));
  // A name that is neither a file nor in the catalog stays an error at the key.
  auto bad = run("simulate llama2-7b-h100-8 --set cluster=no-such-cluster");
  CHECK(bad.status == 2);
  CHECK(has(bad.output, "no-such-cluster"));
}
