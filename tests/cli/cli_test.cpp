// The stratasim executable, run as a user runs it.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <unistd.h>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;
using stratasim::testing::configs_dir;

namespace {

using namespace stratasim::testing::cli;

// A small experiment (GPT-3 1.7B on one DGX A100) written to `dir`, with `edit` applied.
fs::path small_experiment(const fs::path& dir,
                          const std::function<void(nlohmann::json&)>& edit = {}) {
  nlohmann::json e = {
      {"name", "cli-test"},
      {"model", (configs_dir() / "models/gpt3-1.7b.json").string()},
      {"cluster", (configs_dir() / "hardware/clusters/dgx-a100-1.json").string()},
      {"parallelism", {{"tp", 2}, {"pp", 2}, {"dp", 2}, {"micro_batch", 1}, {"schedule", "1f1b"}}},
      {"training", {{"global_batch", 16}, {"seq_len", 2048}, {"dtype", "bf16"}}}};
  if (edit) edit(e);
  fs::path file = dir / "experiment.json";
  std::ofstream(file) << e.dump(2);
  return file;
}

}  // namespace

TEST_CASE("--version and --help") {
  auto v = run("--version");
  CHECK(v.status == 0);
  CHECK(v.output.find("stratasim 0.") != std::string::npos);
  auto h = run("simulate --help");
  CHECK(h.status == 0);
  CHECK(h.output.find("--tp") != std::string::npos);
  auto top = run("--help");
  CHECK(top.output.find("Examples:") != std::string::npos);
}

TEST_CASE("list shows the catalog") {
  auto r = run("list models");
  CHECK(r.status == 0);
  CHECK(r.output.find("gpt3-175b") != std::string::npos);
  CHECK(r.output.find("llama2-70b") != std::string::npos);
  auto devices = run("list devices");  // loads every device file: any error exits 2
  CHECK(devices.status == 0);
  CHECK(devices.output.find("H100-SXM5-80GB") != std::string::npos);
  CHECK(run("list clusters").status == 0);
  CHECK(run("list experiments").status == 0);
  CHECK(run("list widgets").status == 2);
}

TEST_CASE("bad inputs exit 2 naming the file and the JSON path") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("bad");
  auto file = small_experiment(dir);
  const std::string f = file.string();

  // Malformed JSON.
  fs::path broken = dir / "broken.json";
  std::ofstream(broken) << "{\"name\": \"x\",\n \"model\": }";
  check_bad_input("simulate " + broken.string(), {broken.string(), "malformed JSON at line 2"});
  // Missing file.
  check_bad_input("simulate " + (dir / "nope.json").string(), {"nope.json", "no such file"});
  // Unknown key, with a suggestion.
  check_bad_input(
      "simulate " +
          small_experiment(dir, [](auto& e) { e["parallelism"]["micro_bach"] = 2; }).string(),
      {f, "parallelism.micro_bach", "did you mean 'micro_batch'"});
}

TEST_CASE("bad inputs: a cluster's NCCL fabric") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("bad-fabric");
  // dgx-h100-1 with its intra fabric inline and an efficiency beyond 1.
  auto cluster = nlohmann::json::parse(read(stratasim::testing::source_dir() / "configs" /
                                            "hardware" / "clusters" / "dgx-h100-1.json"));
  cluster["device"] = (stratasim::testing::source_dir() / "configs" / "hardware" / "devices" /
                       "h100-sxm5-80gb.json")
                          .string();
  auto fabric = nlohmann::json::parse(read(stratasim::testing::source_dir() / "configs" /
                                           "hardware" / "nccl" / "nvlink4-nvswitch3.json"));
  fabric["efficiency"] = 1.5;
  cluster["collectives"]["intra_fabric"] = fabric;
  cluster["collectives"]["network_fabric"] =
      (stratasim::testing::source_dir() / "configs" / "hardware" / "nccl" / "ib-ndr400.json")
          .string();
  const auto file = dir / "cluster.json";
  std::ofstream(file) << cluster.dump(2);
  check_bad_input("collective " + file.string(),
                  {file.string(), "collectives.intra_fabric.efficiency", "(0, 1]"});
  // A fabric file that is not there.
  cluster["collectives"]["network_fabric"] = "no-such-fabric.json";
  std::ofstream(file) << cluster.dump(2);
  check_bad_input("collective " + file.string(), {"collectives.network_fabric", "does not exist"});
}

TEST_CASE("bad inputs: types and strategy checks") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("bad2");
  const std::string f = (dir / "experiment.json").string();
  auto with = [&](auto edit) { return "simulate " + small_experiment(dir, edit).string(); };
  check_bad_input(with([](auto& e) { e["training"]["seq_len"] = "long"; }),
                  {f, "training.seq_len", "expected an integer"});
  check_bad_input(with([](auto& e) {
                    e["parallelism"]["tp"] = 5;
                    e["parallelism"]["dp"] = nullptr;
                  }),
                  {f, "parallelism.tp", "must divide the model's attention heads"});
  check_bad_input(with([](auto& e) {
                    e["parallelism"]["pp"] = 25;
                    e["parallelism"]["tp"] = 1;
                  }),
                  {f, "parallelism.pp", "must not exceed the model's layers (24)"});
  check_bad_input(with([](auto& e) { e["parallelism"]["dp"] = 4; }),
                  {f, "parallelism.dp", "tp * pp * dp = 2 * 2 * 4 = 16", "has 8 devices"});
  check_bad_input(with([](auto& e) { e["training"]["global_batch"] = 15; }),
                  {f, "training.global_batch", "divisible by dp * micro_batch"});
  // The same checks when the value comes from a flag.
  check_bad_input("simulate " + small_experiment(dir).string() + " --tp 5",
                  {"command line (--tp 5)", "parallelism.tp", "must divide"});
  check_bad_input("simulate " + small_experiment(dir).string() + " --set parallelism.tp=x",
                  {"--set parallelism.tp=x", "expected an integer"});
  // An error inside a referenced file names that file.
  fs::path model = dir / "model.json";
  std::ofstream(model) << R"({"type": "transformer", "name": "m", "layers": 2, "hidden": 64,
    "heads": 4, "ffn_hidden": 256, "vocab": "many"})";
  check_bad_input(with([&](auto& e) { e["model"] = "model.json"; }), {model.string(), "vocab"});
  // Arguments.
  check_bad_input("simulate " + small_experiment(dir).string() + " --tp 0", {"--tp"});
  check_bad_input("frobnicate", {"subcommand"});
}

TEST_CASE("bad inputs: dropout, clipping, loss scaling and host overheads") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("bad3");
  const std::string f = (dir / "experiment.json").string();
  auto with = [&](auto edit) { return "simulate " + small_experiment(dir, edit).string(); };
  check_bad_input(with([](auto& e) { e["training"]["hidden_dropout"] = 1.0; }),
                  {f, "training.hidden_dropout", "expected a dropout probability"});
  check_bad_input(with([](auto& e) { e["training"]["attention_dropout"] = "some"; }),
                  {f, "training.attention_dropout", "expected a number"});
  check_bad_input(with([](auto& e) { e["training"]["grad_clip"] = -1; }),
                  {f, "training.grad_clip", "expected a max gradient norm"});
  check_bad_input(with([](auto& e) { e["training"]["loss_scaling"] = "dynamc"; }),
                  {f, "training.loss_scaling", "did you mean \"dynamic\""});
  check_bad_input(with([](auto& e) { e["training"]["step_overhead"] = 5; }),
                  {f, "training.step_overhead"});
  check_bad_input(with([](auto& e) { e["training"]["microbatch_overhead"] = "-2 ms"; }),
                  {f, "training.microbatch_overhead"});
  check_bad_input("simulate " + small_experiment(dir).string() + " --set model.hidden_dropout=-0.1",
                  {"model.hidden_dropout", "expected a dropout probability"});
  // Good values run.
  const auto ok = run(with([](auto& e) {
    e["training"]["grad_clip"] = 1.0;
    e["training"]["dtype"] = "fp16";
    e["training"]["hidden_dropout"] = 0.0;
    e["training"]["step_overhead"] = "10 ms";
    e["training"]["microbatch_overhead"] = "200 us";
  }));
  CAPTURE(ok.output);
  CHECK(ok.status == 0);
}

TEST_CASE("nothing is written to --out when the input is bad") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("nothing");
  auto bad = small_experiment(dir, [](auto& e) { e["training"]["global_batch"] = 15; });
  auto out = dir / "out";
  CHECK(run("simulate " + bad.string() + " --out " + out.string()).status == 2);
  CHECK_FALSE(fs::exists(out));
  auto file_in_the_way = dir / "file";
  std::ofstream(file_in_the_way) << "x";
  CHECK(run("simulate " + small_experiment(dir).string() + " --out " + file_in_the_way.string())
            .status == 2);
}

TEST_CASE("simulate writes the report, the Perfetto timeline and memory.csv, identically twice") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("determinism");
  auto file = small_experiment(dir);
  auto a = run("simulate " + file.string() + " --out " + (dir / "a").string());
  REQUIRE(a.status == 0);
  CHECK(a.output.find("MFU") != std::string::npos);
  auto b = run("simulate " + file.string() + " --quiet --out " + (dir / "b").string());
  REQUIRE(b.status == 0);
  CHECK(b.output.empty());
  for (const char* name : {"report.json", "timeline.json", "memory.csv"}) {
    CAPTURE(name);
    auto first = read(dir / "a" / name);
    CHECK_FALSE(first.empty());
    CHECK(first == read(dir / "b" / name));
  }
  auto report = nlohmann::json::parse(read(dir / "a" / "report.json"));
  for (const char* key :
       {"iteration_time_s", "pipeline_time_s", "optimizer_time_s", "tokens_per_s", "samples_per_s",
        "model_flops_per_iteration", "hardware_flops_per_iteration", "model_tflops_per_device",
        "mfu", "hfu", "bubble_fraction", "exposed_comm_s", "peak_memory_bytes", "fits", "ranks"}) {
    CHECK_MESSAGE(report.contains(key), key);
  }
  CHECK(report["ranks"].size() == 8);
  auto trace = nlohmann::json::parse(read(dir / "a" / "timeline.json"));
  CHECK(trace["traceEvents"].size() > 100);
}

TEST_CASE("flags override the experiment, and dp follows tp and pp") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("flags");
  auto file = small_experiment(dir);
  auto r = run("simulate " + file.string() +
               " --tp 1 --pp 1 --global-batch 32 --micro-batch 2 --schedule gpipe --out " +
               (dir / "o").string());
  REQUIRE(r.status == 0);
  CHECK(r.output.find("tp 1 x pp 1 x dp 8") != std::string::npos);
  auto report = nlohmann::json::parse(read(dir / "o" / "report.json"));
  CHECK(report["samples_per_s"].get<double>() > 0);
}

TEST_CASE("every shipped experiment simulates") {
  int n = 0;
  for (const auto& f : fs::directory_iterator(configs_dir() / "experiments")) {
    CAPTURE(f.path());
    auto r = run("simulate " + f.path().string());
    CAPTURE(r.output);
    CHECK(r.status == 0);
    CHECK(r.output.find("iteration") != std::string::npos);
    ++n;
  }
  CHECK(n >= 6);
  // By name, as the README shows.
  CHECK(run("simulate gpt3-1.7b-a100-8 --quiet").status == 0);
}

TEST_CASE("--out creates missing folders, as scripts/demo needs on a fresh clone") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("nested");
  auto out = dir / "a" / "b";
  REQUIRE(
      run("simulate " + small_experiment(dir).string() + " --quiet --out " + out.string()).status ==
      0);
  CHECK(fs::exists(out / "report.json"));
  // A file where a parent folder should be is bad input.
  std::ofstream(dir / "file") << "x";
  CHECK(run("simulate " + small_experiment(dir).string() + " --out " +
            (dir / "file" / "sub").string())
            .status == 2);
}

TEST_CASE("context parallelism: bad settings exit 2 at parallelism.cp") {
  // docs/context-parallelism.md: tp 2 x cp 2 x pp 2 x dp 1 on the 8 GPUs, 2048 tokens.
  const TempDir tmp("cli");
  auto dir = tmp.subdir("cp-bad");
  const std::string e = small_experiment(dir, [](auto& x) {
                          x["parallelism"]["dp"] = 1;
                          x["parallelism"]["cp"] = 2;
                          x["training"]["flash_attention"] = true;
                        }).string();
  CHECK(run("simulate " + e).status == 0);
  // The causal ring's load balancing cuts each sequence in 2 cp = 4 chunks: 2042 tokens do not
  // split into 4.
  check_bad_input("simulate " + e + " --set training.seq_len=2042",
                  {"parallelism.cp", "2 * cp = 4 equal chunks"});
  // Ulysses splits the 24 heads over tp x cp = 2 x 16 = 32 ranks: they do not divide.
  check_bad_input("simulate " + e +
                      " --set parallelism.cp=16 --set parallelism.cp_mode=ulysses --set "
                      "parallelism.pp=1 --set cluster.nodes=4",
                  {"parallelism.cp", "must divide heads (24)"});
}

TEST_CASE("memory techniques: bad settings exit 2 at the key to change") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("memory-bad");
  const std::string e = small_experiment(dir).string();
  check_bad_input("simulate " + e + " --zero 4", {"parallelism.zero", "from 0 to 3", "--zero 4"});
  check_bad_input(
      "simulate " + e + " --recompute full --recompute-num-layers 13",
      {"parallelism.recompute_num_layers", "must not exceed the layers of a pipeline stage (12)"});
  check_bad_input("simulate " + e + " --recompute sometimes",
                  {"parallelism.recompute", "expected one of"});
  check_bad_input("simulate " + e + " --offload params",
                  {"parallelism.offload", "needs ZeRO stage 3"});
  check_bad_input("simulate " + e + " --offload optimzer --zero 1",
                  {"parallelism.offload", "did you mean \"optimizer\""});
  // A cluster without a host section cannot take offloaded state.
  auto no_host = small_experiment(dir, [](auto& j) {
    auto cluster = nlohmann::json::parse(read(configs_dir() / "hardware/clusters/dgx-a100-1.json"));
    cluster.erase("host");
    cluster["device"] = (configs_dir() / "hardware/devices/a100-sxm4-80gb.json").string();
    for (const char* fabric : {"intra_fabric", "network_fabric"}) {  // relative to the cluster
      cluster["collectives"][fabric] =
          (configs_dir() / "hardware/clusters" / cluster["collectives"][fabric].get<std::string>())
              .lexically_normal()
              .string();
    }
    j["cluster"] = cluster;
  });
  check_bad_input("simulate " + no_host.string() + " --zero 1 --offload optimizer",
                  {"parallelism.offload", "needs host memory"});
  check_bad_input("simulate " + e + " --set memory.fragmentation=0.5",
                  {"memory.fragmentation", "from 1 to 10"});
}

TEST_CASE("stratasim memory reports the same peaks as the simulation, fast") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("memory-cmd");
  const std::string e = small_experiment(dir).string();
  auto fast = run("memory " + e);
  REQUIRE(fast.status == 0);
  CHECK(fast.output.find("stratasim memory") != std::string::npos);
  CHECK(fast.output.find("verdict: fits in memory") != std::string::npos);
  REQUIRE(run("simulate " + e + " --quiet --out " + (dir / "o").string()).status == 0);
  auto report = nlohmann::json::parse(read(dir / "o" / "report.json"));
  // The per-stage table prints the same peak for stage 0 in both commands.
  auto full = run("simulate " + e);
  auto stage0 = [](const std::string& text) {
    auto at = text.find("\n  0 ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at + 1) - at);
  };
  CHECK_FALSE(stage0(fast.output).empty());
  CHECK(stage0(fast.output) == stage0(full.output));
}

TEST_CASE("--stop-on-oom ends the run at the first out-of-memory and still reports") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("stop");
  const std::string e = small_experiment(dir).string();
  auto r = run("simulate " + e + " --tp 1 --pp 1 --micro-batch 4 --global-batch 32 --stop-on-oom");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("stopped at the first out-of-memory") != std::string::npos);
  CHECK(r.output.find("OUT OF MEMORY") != std::string::npos);
  auto full = run("simulate " + e + " --tp 1 --pp 1 --micro-batch 4 --global-batch 32");
  CHECK(full.status == 0);
  CHECK(full.output.find("first exceeded at rank 0 op") != std::string::npos);
}

TEST_CASE("--exact simulates every replica and reports exactly what mirroring reports") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("exact");
  const std::string e = small_experiment(dir).string();  // tp 2 x pp 2 x dp 2
  REQUIRE(run("simulate " + e + " --quiet --out " + (dir / "mirrored").string()).status == 0);
  REQUIRE(run("simulate " + e + " --exact --quiet --out " + (dir / "exact").string()).status == 0);
  CHECK(read(dir / "mirrored" / "report.json") == read(dir / "exact" / "report.json"));
  // The mirrored trace holds replica 0's ranks; the exact one every rank.
  auto pids = [](const nlohmann::json& trace) {
    std::set<int> p;
    for (const auto& ev : trace["traceEvents"]) {
      if (ev["ph"] == "X") p.insert(ev["pid"].get<int>());
    }
    return p;
  };
  CHECK(pids(nlohmann::json::parse(read(dir / "mirrored" / "timeline.json"))) ==
        std::set<int>{0, 1, 4, 5});
  CHECK(pids(nlohmann::json::parse(read(dir / "exact" / "timeline.json"))).size() == 8);
  check_bad_input("simulate " + e + " --trace-ranks 2", {"rank 2 mirrors rank 0", "--exact"});
}

TEST_CASE("schedules: every applicable schedule, best first, and a CSV") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("schedules");
  auto file = small_experiment(dir, [](nlohmann::json& e) {
    e["parallelism"] = {{"tp", 2}, {"pp", 4}, {"dp", 1}, {"micro_batch", 1}};
  });
  auto r = run("schedules " + file.string() + " --micro-batches 1,2 --out " + (dir / "o").string());
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  for (const char* name : {"gpipe", "1f1b", "interleaved", "pipedream-2bw", "merak-scp", "zb-h1",
                           "zb-h2", "zb-v", "chimera", "terapipe", "dualpipe"}) {
    CHECK(r.output.find(name) != std::string::npos);
  }
  // Rows are sorted by iteration time among the runs that fit.
  const std::string csv = read(dir / "o" / "schedules.csv");
  std::stringstream lines(csv);
  std::string line;
  std::getline(lines, line);
  CHECK(line.starts_with("schedule,micro_batch,microbatches,iteration_time_s"));
  double previous = 0;
  int rows = 0;
  while (std::getline(lines, line)) {
    std::stringstream fields(line);
    std::string f[4];
    for (auto& x : f) std::getline(fields, x, ',');
    const double t = std::stod(f[3]);
    CHECK(t >= previous);
    previous = t;
    ++rows;
  }
  // 11 schedules x micro batches 1 and 2 (16 and 8 microbatches; dualpipe needs m >= 2p = 8).
  CHECK(rows == 22);
}

TEST_CASE("partition prints the plan with predicted stage times") {
  auto r =
      run("partition gpt3-1.7b-a100-8 --tp 2 --pp 4 --dp 1 --global-batch 16 --partition 9,7,5,3");
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("partition explicit") != std::string::npos);
  CHECK(r.output.find("0-8") != std::string::npos);    // stage 0: layers 0-8
  CHECK(r.output.find("21-23") != std::string::npos);  // stage 3: layers 21-23
  CHECK(r.output.find("bottleneck") != std::string::npos);
  CHECK(r.output.find("balanced split:") != std::string::npos);
  // The list must fit the schedule's parts.
  check_bad_input("partition gpt3-1.7b-a100-8 --tp 2 --pp 4 --dp 1 --partition 9,7,5",
                  {"parallelism.partition", "expected 4 positive layer counts"});
  check_bad_input("simulate gpt3-1.7b-a100-8 --tp 2 --pp 4 --dp 1 --schedule zb-h9",
                  {"parallelism.schedule", "zb-h1"});
}

namespace {

// The first "iteration time   X ms|s" after `from` in a report, in seconds.
double iteration_seconds(const std::string& output, std::size_t from = 0) {
  const auto at = output.find("iteration time", from);
  REQUIRE(at != std::string::npos);
  std::istringstream in(output.substr(at + std::string("iteration time").size()));
  double value = 0;
  std::string unit;
  in >> value >> unit;
  return unit == "ms" ? value / 1e3 : unit == "us" ? value / 1e6 : value;
}

}  // namespace

TEST_CASE("several experiments share one cluster's network, each with its own report") {
  const std::string jobs = (configs_dir() / "jobs").string();
  const std::string both = jobs + "/gpt3-1.7b-dp16.json " + jobs + "/llama2-7b-tp8-dp2.json";
  auto packed = run("simulate " + both + " --cluster dgx-a100-32-oversubscribed");
  REQUIRE(packed.status == 0);
  auto interleaved =
      run("simulate " + both + " --cluster dgx-a100-32-oversubscribed --placement interleaved");
  REQUIRE(interleaved.status == 0);
  CAPTURE(interleaved.output);
  CHECK(packed.output.find("job 1 of 2") != std::string::npos);
  CHECK(packed.output.find("devices 0-15") != std::string::npos);
  CHECK(interleaved.output.find("devices 0-7,16-23") != std::string::npos);
  // Packed, each job has its own racks (2 nodes of a 2-node rack): its leaf uplinks carry only
  // its own traffic. Interleaved, both jobs' cross-node all-reduces share every rack's 2:1
  // oversubscribed uplinks: both are slower.
  const auto second_packed = packed.output.find("job 2 of 2");
  const auto second_interleaved = interleaved.output.find("job 2 of 2");
  CHECK(iteration_seconds(interleaved.output) > iteration_seconds(packed.output));
  CHECK(iteration_seconds(interleaved.output, second_interleaved) >
        iteration_seconds(packed.output, second_packed));
  CHECK(interleaved.output.find("busiest links") != std::string::npos);

  const TempDir tmp("cli");
  auto dir = tmp.subdir("jobs");
  auto written = run("simulate " + both + " --cluster dgx-a100-32-oversubscribed --quiet --out " +
                     dir.string());
  REQUIRE(written.status == 0);
  CHECK(fs::exists(dir / "job1-gpt3-1.7b-dp16" / "report.json"));
  CHECK(fs::exists(dir / "job2-llama2-7b-tp8-dp2" / "report.json"));
  auto report = nlohmann::json::parse(read(dir / "job1-gpt3-1.7b-dp16" / "report.json"));
  CHECK_FALSE(report["links"].empty());
}

TEST_CASE("bad multi-job input is a clear error with exit code 2") {
  const std::string jobs = (configs_dir() / "jobs").string();
  const std::string both = jobs + "/gpt3-1.7b-dp16.json " + jobs + "/llama2-7b-tp8-dp2.json";
  auto no_cluster = run("simulate " + both);
  CHECK(no_cluster.status == 2);
  CHECK(no_cluster.output.find("--cluster") != std::string::npos);
  auto too_small = run("simulate " + both + " --cluster dgx-a100-1");
  CHECK(too_small.status == 2);
  CHECK(too_small.output.find("need 32 devices") != std::string::npos);
  auto overlap = run("simulate " + both + " --cluster dgx-a100-32-oversubscribed --placement " +
                     "\"0-15;8-23\"");
  CHECK(overlap.status == 2);
  CHECK(overlap.output.find("device 8") != std::string::npos);
  auto other_device = run("simulate " + both + " --cluster dgx-h100-8");
  CHECK(other_device.status == 2);
  CHECK(other_device.output.find("A100") != std::string::npos);
  auto with_flags = run("simulate " + both + " --cluster dgx-a100-32-oversubscribed --tp 2");
  CHECK(with_flags.status == 2);
}

TEST_CASE("collective: nccl-tests figures for one collective on a cluster") {
  // nccl-h100-nvlink: ring all-reduce on 8 H100s reaches ~370 GB/s busbw (the NCCL model's
  // fitted NVLink efficiency); 2 GiB is on the plateau.
  auto r = run("collective dgx-h100-1-nvls --op all_reduce --algorithm ring --sizes 2G");
  REQUIRE(r.status == 0);
  CAPTURE(r.output);
  // nccl-tests' columns: size (B), count (float32 elements), type, redop, time (us), algbw,
  // busbw (GB/s), then the algorithm (and, with the NCCL model, protocol and channels).
  const auto line = r.output.find(" 2147483648 ");
  REQUIRE(line != std::string::npos);
  std::istringstream in(r.output.substr(line));
  std::int64_t size = 0, count = 0;
  std::string type, redop, algorithm, protocol;
  double time_us = 0, algbw = 0, busbw = 0;
  in >> size >> count >> type >> redop >> time_us >> algbw >> busbw >> algorithm >> protocol;
  CHECK(count == size / 4);
  CHECK(type == "float");
  CHECK(busbw == doctest::Approx(370).epsilon(0.1));
  CHECK(busbw == doctest::Approx(algbw * 1.75).epsilon(0.01));  // 2(n-1)/n for n = 8
  CHECK(algbw == doctest::Approx(2147483648 / time_us / 1e3).epsilon(0.01));
  CHECK(algorithm == "ring");
  CHECK(protocol == "Simple");  // the NCCL model's choice at 2 GiB (with the alpha-beta one: -)
  // With the NCCL model (dgx-h100-1 opts in): the protocol it chose; 1 KiB runs LL, latency-bound
  // (NCCL's ring LL: 6.6 us + 14 steps x ~0.6 us).
  auto nccl = run("collective dgx-h100-1 --op all_reduce --sizes 1K,16G");
  REQUIRE(nccl.status == 0);
  CAPTURE(nccl.output);
  CHECK(nccl.output.find("NCCL model: nvlink4-nvswitch3") != std::string::npos);
  const auto small = nccl.output.find(" 1024 ");
  REQUIRE(small != std::string::npos);
  std::istringstream row(nccl.output.substr(small));
  row >> size >> count >> type >> redop >> time_us >> algbw >> busbw >> algorithm >> protocol;
  CHECK(protocol == "LL");
  CHECK(time_us > 10);
  CHECK(time_us < 25);
  const TempDir tmp("cli");
  auto dir = tmp.subdir("collective");
  auto csv =
      run("collective dgx-a100-1 --ranks 0-3 --sizes 1M,1G --network flow --out " + dir.string());
  REQUIRE(csv.status == 0);
  CHECK(read(dir / "collective.csv").find("all_reduce,4,1073741824,") != std::string::npos);
  CHECK(run("collective dgx-a100-1 --op allreduce").status == 2);
  CHECK(run("collective dgx-a100-1 --ranks 0-9").status == 2);
  CHECK(run("collective dgx-a100-1 --algorithm nvls").status == 2);  // no reducing switch
  CHECK(run("collective dgx-a100-1 --sizes 12Q").status == 2);
}

TEST_CASE("the flow-level network gives byte-identical outputs twice") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("flow-determinism");
  const std::string exp = (configs_dir() / "experiments" / "llama2-7b-a100-pcie-16.json").string();
  REQUIRE(run("simulate " + exp + " --quiet --out " + (dir / "a").string()).status == 0);
  REQUIRE(run("simulate " + exp + " --quiet --out " + (dir / "b").string()).status == 0);
  for (const char* name : {"report.json", "timeline.json", "memory.csv"}) {
    CAPTURE(name);
    auto first = read(dir / "a" / name);
    CHECK_FALSE(first.empty());
    CHECK(first == read(dir / "b" / name));
  }
  // Every rank is simulated (no mirroring on the flow network) and the busiest links are kept.
  auto report = nlohmann::json::parse(read(dir / "a" / "report.json"));
  CHECK(report["ranks"].size() == 16);
  CHECK(report["links"].size() == 10);
}

TEST_CASE("top-k gradient compression at 1% cuts the data-parallel traffic the report shows") {
  const TempDir tmp("cli");
  auto dir = tmp.subdir("topk");
  const std::string exp = "gpt3-1.7b-a100-8 --global-batch 8 --quiet --out ";
  REQUIRE(run("simulate " + exp + (dir / "dense").string()).status == 0);
  REQUIRE(
      run("simulate " + exp + (dir / "topk").string() + " --set parallelism.grad_compression=topk")
          .status == 0);
  auto wire = [&](const char* run_name, const char* kind) {
    auto report = nlohmann::json::parse(read(dir / run_name / "report.json"));
    for (const auto& c : report["communication"]) {
      if (c["stream"] == "dp" && c["kind"] == kind) return c["wire_bytes"].get<double>();
    }
    FAIL("no dp " << kind << " in " << run_name);
    return 0.0;
  };
  // N gradient elements of e = 2 bytes (bf16) over n = 8 ranks. Dense ring all-reduce: each
  // rank sends 2(n-1)/n N e = 3.5 N bytes. Top-k at density 0.01: k = 0.01 N values plus int32
  // indices all-gathered, each rank sending (n-1) k (e + 4) = 7 * 0.01 N * 6 = 0.42 N bytes.
  // Factor 3.5 / 0.42 = 8.33 (k is rounded up per bucket: within 1%).
  const double dense = wire("dense", "all-reduce");
  const double topk = wire("topk", "all-gather");
  CHECK(dense / topk == doctest::Approx(3.5 / 0.42).epsilon(0.01));
  CHECK(read(dir / "topk" / "timeline.json").find("compressed topk") != std::string::npos);
}

TEST_CASE("--tp-mode lowers 2D tensor parallelism on a 2 x 2 mesh") {
  auto r =
      run("simulate gpt3-1.7b-a100-8 --tp 4 --pp 1 --tp-mode 2d --micro-batch 2 --global-batch 8");
  REQUIRE(r.status == 0);
  CHECK(r.output.find("tp 4 (2d)") != std::string::npos);
  CHECK(run("simulate gpt3-1.7b-a100-8 --tp 2 --pp 1 --tp-mode 2d").status == 2);  // not q^2
}
