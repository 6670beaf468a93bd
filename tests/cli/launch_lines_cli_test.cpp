// Configs and launch lines as users paste them (issue 18, "Configs and launch lines"): whole
// launch lines in --megatron-args size the cluster, --deepspeed_config inside them is read, a
// model changed by the arguments says so, `list models` names Hugging Face configs as --model
// takes them, no "pipeline bubble" without a pipeline, --no-notes beside --quiet, and DeepSpeed
// sections that are not modelled are noted.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

namespace {

using namespace stratasim::testing::cli;
using stratasim::testing::configs_dir;

bool has(const std::string& output, const std::string& text) {
  return output.find(text) != std::string::npos;
}

// report.json of `simulate ARGS --quiet --out DIR/name`, parsed.
nlohmann::json report_of(const fs::path& dir, const std::string& name, const std::string& args) {
  const auto out = dir / name;
  auto r = run("simulate " + args + " --quiet --out " + out.string());
  CAPTURE(args);
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(read(out / "report.json"));
}

// The same report as text, for byte comparisons.
std::string report_text(const fs::path& dir, const std::string& name, const std::string& args) {
  report_of(dir, name, args);
  return read(dir / name / "report.json");
}

const std::string kMegatron =
    "pretrain_gpt.py --tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64";

}  // namespace

TEST_CASE("the world size in a launch line is dropped: torchrun --nnodes 2 --nproc_per_node 8") {
  const TempDir tmp("cli");
  // llama2-7b-h100-8 runs on one DGX H100 (1 node x 8). The launch line starts 2 x 8 = 16
  // processes: the same as the arguments alone on that cluster given 2 nodes.
  const std::string launched = report_text(
      tmp.path(), "torchrun",
      "llama2-7b-h100-8 --megatron-args \"torchrun --nnodes 2 --nproc_per_node 8 --master_addr "
      "host0 --master_port 6000 " +
          kMegatron + "\"");
  const std::string by_hand =
      report_text(tmp.path(), "sets",
                  "llama2-7b-h100-8 --set cluster.nodes=2 --set cluster.devices_per_node=8 "
                  "--megatron-args \"" +
                      kMegatron + "\"");
  CHECK(launched == by_hand);
  // 16 ranks: tp 2 x dp 8 (Megatron's dp = world / (tp x pp)).
  CHECK(nlohmann::json::parse(launched)["ranks"].size() == 16);
  // It says what it did.
  auto r =
      run("simulate llama2-7b-h100-8 --megatron-args \"torchrun --nnodes 2 --nproc_per_node 8 " +
          kMegatron + "\"");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "the cluster is sized by the launch line (torchrun): 2 node(s) x 8 GPU(s)"));
  CHECK(has(r.output, "tp 2 x pp 1 x dp 8"));
}

TEST_CASE(
    "the world size in a launch line is dropped: python -m torch.distributed.run, "
    "deepspeed, srun and mpirun") {
  const TempDir tmp("cli");
  auto ranks = [&](const std::string& name, const std::string& line) {
    return report_of(tmp.path(), name, "llama2-7b-h100-8 --megatron-args \"" + line + "\"")["ranks"]
        .size();
  };
  // Each starts 2 nodes x 4 GPUs = 8 or 4 x 8 = 32 processes.
  CHECK(ranks("run",
              "python -m torch.distributed.run --nnodes=2 --nproc_per_node=4 " + kMegatron) == 8);
  CHECK(ranks("ds", "deepspeed --num_nodes 4 --num_gpus 8 " + kMegatron + " --deepspeed") == 32);
  CHECK(ranks("srun", "srun -N 2 --ntasks-per-node=4 python " + kMegatron) == 8);
  CHECK(ranks("mpirun", "mpirun -np 32 -npernode 8 python " + kMegatron) == 32);
  // A size given by no launcher stays the cluster's: 2 nodes x the 8 GPUs of a DGX H100.
  CHECK(ranks("nodes", "deepspeed --num_nodes 2 " + kMegatron) == 16);
}

TEST_CASE("a launch line that cannot size the cluster is exit 2 naming the launcher's option") {
  check_bad_input(
      "simulate llama2-7b-h100-8 --megatron-args \"torchrun --nnodes \\$NNODES "
      "--nproc_per_node 8 pretrain_gpt.py\"",
      {"--megatron-args: at --nnodes", "got \"$NNODES\"", "shell variable"});
  check_bad_input(
      "simulate llama2-7b-h100-8 --megatron-args \"mpirun -np 16 python "
      "pretrain_gpt.py --bf16\"",
      {"--megatron-args: at -np", "-npernode"});
  check_bad_input(
      "simulate llama2-7b-h100-8 --megatron-args \"srun -N 2 -n 12 "
      "--ntasks-per-node 8 python pretrain_gpt.py\"",
      {"--megatron-args: at -n", "starts 12 processes"});
  // The world does not hold tp x pp: the error names the argument, the note the world's size.
  check_bad_input(
      "simulate llama2-7b-h100-8 --megatron-args \"torchrun --nproc_per_node 2 "
      "pretrain_gpt.py --tensor-model-parallel-size 4\"",
      {"--tensor-model-parallel-size 4", "the 2 devices", "1 node(s) x 2 GPU(s)"});
}

TEST_CASE("--deepspeed_config inside --megatron-args reads that DeepSpeed config") {
  const TempDir tmp("cli");
  const std::string ds = (configs_dir() / "deepspeed" / "zero2-offload.json").string();
  // The same simulation as stratasim's own --deepspeed with the same arguments.
  CHECK(report_text(tmp.path(), "inside",
                    "llama2-7b-h100-8 --megatron-args \"deepspeed --num_gpus 8 pretrain_gpt.py "
                    "--deepspeed --deepspeed_config " +
                        ds + " --tensor-model-parallel-size 4\"") ==
        report_text(tmp.path(), "flag",
                    "llama2-7b-h100-8 --deepspeed " + ds +
                        " --megatron-args \"--tensor-model-parallel-size 4\""));
  // The Hugging Face Trainer's --deepspeed FILE too.
  CHECK(report_text(tmp.path(), "trainer",
                    "llama2-7b-h100-8 --megatron-args \"--deepspeed " + ds +
                        " --tensor-model-parallel-size 4\"") ==
        read(tmp.path() / "flag" / "report.json"));
  // A pasted line names a file of the machine it ran on: a note, nothing read.
  auto missing = run(
      "simulate gpt3-1.7b-a100-8 --megatron-args \"--deepspeed --deepspeed_config nowhere.json\"");
  CHECK(missing.status == 0);
  CHECK(has(missing.output, "--deepspeed_config \"nowhere.json\": no such file here"));
  // A directory is bad input.
  check_bad_input("simulate gpt3-1.7b-a100-8 --megatron-args \"--deepspeed_config " +
                      tmp.path().string() + "\"",
                  {"--megatron-args: at --deepspeed_config", "not a regular file"});
}

TEST_CASE("a model keeps the experiment's name when --megatron-args change its architecture") {
  auto r =
      run("simulate llama2-7b-h100-8 --megatron-args \"--num-layers 16 --hidden-size 2048 "
          "--num-attention-heads 16 --ffn-hidden-size 5504\"");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output,
            "llama2-7b (modified by --megatron-args: --num-layers 16, --hidden-size 2048, "
            "--ffn-hidden-size 5504, --num-attention-heads 16): 16 layers, hidden 2048, 16 heads"));
  // Arguments that leave the model as it is keep its name: Llama 2 7B has 32 layers.
  auto same = run("simulate llama2-7b-h100-8 --megatron-args \"--num-layers 32\"");
  CHECK(same.status == 0);
  CHECK(has(same.output, "model            llama2-7b: "));
  // --set model.* says so too; naming the model wins.
  auto set = run("simulate llama2-7b-h100-8 --set model.layers=16");
  CHECK(has(set.output, "llama2-7b (modified by command line: --set model.layers=16)"));
  auto named = run("simulate llama2-7b-h100-8 --set model.layers=16 --set model.name=half");
  CHECK(has(named.output, "model            half: "));
}

TEST_CASE(
    "list models names shipped Hugging Face configs after their files, as --model takes "
    "them") {
  auto r = run("list models");
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  // Not by model_type or _name_or_path.
  CHECK_FALSE(has(r.output, "\nmistral  "));
  CHECK_FALSE(has(r.output, "gpt_neox  "));
  CHECK_FALSE(has(r.output, "meta-llama/Llama-2-7b-hf"));
  CHECK(has(r.output, "\nmistral-7b  "));
  CHECK(has(r.output, "\ngemma-2-9b  "));
  CHECK(has(r.output, "\ngpt-neox-20b  "));
  // configs/models/llama2-7b.json comes first for "llama2-7b": the Hugging Face one is
  // "hf/llama2-7b".
  CHECK(has(r.output, "\nhf/llama2-7b  "));
  // Every listed name is one --model takes.
  std::istringstream lines(r.output);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == ' ') continue;
    const std::string name = line.substr(0, line.find("  "));
    if (name.rfind("hf/", 0) != 0 && name != "mistral-7b") continue;  // the Hugging Face ones
    CAPTURE(name);
    auto m = run("memory llama2-7b-h100-8 --model " + name +
                 " --seq-len 1024 --global-batch 8 --set parallelism.sequence_parallel=true");
    CAPTURE(m.output);
    CHECK(m.status == 0);
    ++n;
  }
  CHECK(n == 2);
}

TEST_CASE("pipeline bubble is printed with pp = 1") {
  const TempDir tmp("cli");
  // llama2-7b-h100-8: tp 4, pp 1, dp 2. No pipeline: no bubble; the compute stream's idle
  // share is named for what it is.
  auto r = run("simulate llama2-7b-h100-8");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK_FALSE(has(r.output, "pipeline bubble"));
  CHECK(has(r.output, "compute idle"));
  auto j = report_of(tmp.path(), "pp1", "llama2-7b-h100-8");
  CHECK(j["bubble_fraction"] == 0.0);
  CHECK(j["compute_idle_fraction"].get<double>() > 0);
  // With a pipeline, the bubble is what it was: the compute stream's idle share.
  auto pp = report_of(tmp.path(), "pp2", "llama2-7b-h100-8 --tp 2 --pp 2");
  CHECK(pp["bubble_fraction"].get<double>() > 0);
  CHECK(pp["bubble_fraction"] == pp["compute_idle_fraction"]);
  auto piped = run("simulate llama2-7b-h100-8 --tp 2 --pp 2");
  CHECK(has(piped.output, "pipeline bubble"));
}

TEST_CASE("--quiet hides the whole report, not just the notes: --no-notes hides only the notes") {
  auto notes = run("simulate llama2-7b-h100-8 --model mistral-7b");
  REQUIRE(notes.status == 0);
  REQUIRE(has(notes.output, "note: "));
  auto r = run("simulate llama2-7b-h100-8 --model mistral-7b --no-notes");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK_FALSE(has(r.output, "note: "));
  CHECK(has(r.output, "iteration time"));
  // --quiet keeps its promise (--help: "Print nothing on success"), which scripts rely on.
  auto quiet = run("simulate llama2-7b-h100-8 --model mistral-7b --quiet");
  CHECK(quiet.status == 0);
  CHECK(quiet.output.empty());
  CHECK(has(run("simulate --help").output, "--no-notes"));
}

TEST_CASE("DeepSpeed sparse_attention is ignored without a note") {
  const TempDir tmp("cli");
  const auto ds = tmp.path() / "ds.json";
  // DeepSpeed's documented sparse_attention section (mode fixed), and other sections that
  // change a run's cost; a disabled one is not noted.
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 1,
    "sparse_attention": {"mode": "fixed", "block": 16, "num_local_blocks": 4},
    "communication_data_type": "fp32",
    "progressive_layer_drop": {"enabled": true, "theta": 0.5, "gamma": 0.001},
    "curriculum_learning": {"enabled": false}})";
  auto r = run("simulate gpt3-1.7b-a100-8 --deepspeed " + ds.string());
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "ds.json: sparse_attention {\"block\":16,"));
  CHECK(has(r.output, "sparse attention is not modelled: attention is dense"));
  CHECK(has(r.output, "ds.json: communication_data_type \"fp32\": not modelled"));
  CHECK(has(r.output, "ds.json: progressive_layer_drop"));
  CHECK_FALSE(has(r.output, "curriculum_learning"));
}

// Real files others wrote (tests/data/*/PROVENANCE.md), one test each.

namespace {

std::string data(const std::string& name) {
  return (stratasim::testing::source_dir() / "tests" / "data" / name).string();
}

// A launch line from tests/data/megatron as --megatron-args, read by the shell from its file
// ("$(cat FILE)": one word, as it is), with `from` replaced by `to` when given (into `dir`).
std::string megatron_args(const std::string& name, const fs::path& dir,
                          const std::string& from = "", const std::string& to = "") {
  std::string file = data("megatron/" + name);
  if (!from.empty()) {
    std::string line = read(file);
    const auto at = line.find(from);
    REQUIRE(at != std::string::npos);
    line.replace(at, from.size(), to);
    file = (dir / name).string();
    std::ofstream(file) << line;
  }
  return "--megatron-args \"$(cat " + file + ")\"";
}

}  // namespace

TEST_CASE("tests/data/hf: BERT-Large's released config.json is the model of bert-large.json") {
  const TempDir tmp("cli");
  const std::string hf =
      data("hf/deepspeedexamples-bert-large-uncased-whole-word-masking-config.json");
  // Before: "model_type bert is not supported". BERT-Large (Devlin et al.: L 24, H 1024, A 16,
  // vocab 30,522, 512 positions, tied MLM head) as configs/models/bert-large.json: the same
  // simulation, byte for byte.
  CHECK(report_text(tmp.path(), "hf", "bert-large-v100-16 --model " + hf) ==
        report_text(tmp.path(), "ours", "bert-large-v100-16"));
  // Given as a DeepSpeed config it was accepted, a note per key: now an error pointing at --model.
  check_bad_input("simulate gpt3-1.7b-a100-8 --deepspeed " + hf,
                  {hf, "not a DeepSpeed config: give it to --model"});
}

TEST_CASE("tests/data/deepspeed: transformers' ds_config_zero2.json, all \"auto\"") {
  auto r = run("memory gpt3-1.7b-a100-8 --deepspeed " +
               data("deepspeed/hf-transformers-ds_config_zero2.json"));
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "ZeRO 2, recompute none, offload optimizer"));
  CHECK(has(r.output, "train_batch_size is \"auto\""));
}

TEST_CASE("tests/data/deepspeed: DeepSpeedExamples' 1-bit Adam config notes its compression") {
  auto r = run("memory gpt3-1.7b-a100-8 --deepspeed " +
               data("deepspeed/deepspeedexamples-bing_bert-onebitadam-seq128-nccl.json"));
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "optimizer.type \"OneBitAdam\" is not modelled"));
  CHECK(has(r.output, "compressed (1-bit) gradient communication is not modelled"));
}

TEST_CASE("tests/data/deepspeed: DeepSpeedExamples' progressive layer drop is noted") {
  auto r = run("memory gpt3-1.7b-a100-8 --deepspeed " +
               data("deepspeed/deepspeedexamples-bing_bert-progressive-layer-drop-seq128.json"));
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "progressive_layer_drop {\"enabled\":true"));
  CHECK(has(r.output, "every layer runs in every iteration"));
}

TEST_CASE("tests/data/deepspeed: DeepSpeedExamples' ZeroQuant config, written for 2 GPUs") {
  const std::string ds = data("deepspeed/deepspeedexamples-compression-gpt2-W8A8-fp16.json");
  // train_batch_size 8 = micro 4 x 1 step x 2 GPUs: on 8 GPUs DeepSpeed refuses it too.
  check_bad_input("memory gpt3-1.7b-a100-8 --deepspeed " + ds,
                  {"(train_batch_size): at training.global_batch", "8 * 4 = 32, got 8"});
  auto r =
      run("memory gpt3-1.7b-a100-8 --deepspeed " + ds + " --dp 2 --set cluster.devices_per_node=2");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "compression_training"));
  CHECK(has(r.output, "the model trains uncompressed"));
}

TEST_CASE("tests/data/megatron: Megatron-LM's GPT-3 175B launch line, sized by --nnodes") {
  const TempDir tmp("cli");
  const std::string name = "megatron-lm-gpt3-175b-distributed.txt";
  // As written, 1 node x 8 GPUs: tp 8 x pp 16 does not fit; the error names the argument.
  check_bad_input("memory gpt3-175b-a100-1024 " + megatron_args(name, tmp.path()),
                  {"--tensor-model-parallel-size 8", "does not divide the 8 devices"});
  // With the 16 nodes it needs: 16 x 8 = 128 = tp 8 x pp 16.
  auto r = run("memory gpt3-175b-a100-1024 " +
               megatron_args(name, tmp.path(), "--nnodes 1", "--nnodes 16"));
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "16 x 8 A100-SXM4-80GB (128 devices"));
  CHECK(has(r.output, "tp 8 x pp 16 x dp 1"));
  CHECK(has(r.output, "unknown argument \"--step-batch-size-schedule\"") == false);
  CHECK(has(r.output, "--step-batch-size-schedule a batch-size ramp is not modelled"));
}

TEST_CASE("tests/data/megatron: Megatron-LM's Llama 3 8B FP8 launch line") {
  const TempDir tmp("cli");
  auto r = run("memory llama2-7b-h100-8 " +
               megatron_args("megatron-lm-llama3-8b-h100-fp8.txt", tmp.path()));
  CAPTURE(r.output);
  CHECK(r.status == 0);
  // Llama 3 8B's shape replaces Llama 2 7B's: 8,030,261,248 parameters (configs/models/hf/
  // llama3.1-8b.json's count, docs/inputs.md), named after the change.
  CHECK(has(r.output, "llama2-7b (modified by --megatron-args: --ffn-hidden-size 14336"));
  CHECK(has(r.output, "8.03 B parameters"));
  CHECK(has(r.output, "bf16 with fp8 linear layers"));
  CHECK(has(r.output, "flash attention"));  // --attention-backend auto
  CHECK(has(r.output, "--grad-reduce-in-bf16 gradients reduced in bf16 is not modelled"));
  CHECK_FALSE(has(r.output, "unknown argument \"--attention-backend\""));
}

TEST_CASE("tests/data/megatron: Megatron-LM's Mixtral 8x7B launch line needs 4 nodes") {
  const TempDir tmp("cli");
  const std::string name = "megatron-lm-mixtral-8x7b-distributed.txt";
  // pp 4 on 8 GPUs leaves dp 2, which cannot hold ep 8 (Megatron refuses it as well).
  check_bad_input("memory mixtral-8x7b-h100-64-ep8 " + megatron_args(name, tmp.path()),
                  {"--expert-model-parallel-size 8"});
  // On 4 nodes (its --nnodes $SLURM_NNODES): 32 = pp 4 x dp 8, ep 8 within dp.
  auto r = run("memory mixtral-8x7b-h100-64-ep8 " +
               megatron_args(name, tmp.path(), "--nnodes 1", "--nnodes 4"));
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "4 x 8 H100-SXM5-80GB (32 devices"));
  CHECK(has(r.output, "tp 1 x pp 4 x dp 8"));
  CHECK(has(r.output, "ep 8"));
}
