// `stratasim cluster` run as a user runs it: outputs, determinism, and bad input as exit 2
// naming the file, the line and the field (docs/cluster.md).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;
using namespace stratasim::testing::cli;

namespace {

// Three gpt-tiny-3d-8 jobs (fast to simulate) on dgx-a100-1's 8 GPUs.
const char* kTrace =
    "# three tiny jobs\n"
    R"({"id": "a", "arrival_s": 0, "experiment": "gpt-tiny-3d-8", "samples": 400000, "gpus": 8})"
    "\n"
    R"({"id": "b", "arrival_s": 10, "experiment": "gpt-tiny-3d-8", "samples": 20000, "gpus": 4})"
    "\n"
    R"({"id": "c", "arrival_s": 20, "experiment": "gpt-tiny-3d-8", "samples": 20000, "gpus": 4})"
    "\n";

}  // namespace

TEST_CASE("cluster writes jobs.csv, summary.json and timeline.json, the same twice") {
  const TempDir tmp("cluster");
  const auto trace = tmp.write("trace.jsonl", kTrace);
  for (const std::string policy : {"fifo", "srtf", "tiresias"}) {
    CAPTURE(policy);
    const std::string args =
        "cluster " + trace.string() + " --cluster dgx-a100-1 --scheduler " + policy + " --out ";
    const auto first = run(args + (tmp / (policy + "1")).string());
    CAPTURE(first.output);
    REQUIRE(first.status == 0);
    CHECK(first.output.find("JCT mean") != std::string::npos);
    REQUIRE(run(args + (tmp / (policy + "2")).string()).status == 0);
    for (const char* file : {"jobs.csv", "summary.json", "timeline.json"}) {
      CAPTURE(file);
      const std::string text = read(tmp / (policy + "1") / file);
      CHECK(!text.empty());
      CHECK(text == read(tmp / (policy + "2") / file));
    }
    const auto summary = nlohmann::json::parse(read(tmp / (policy + "1") / "summary.json"));
    CHECK(summary["scheduler"] == policy);
    CHECK(summary["gpus"] == 8);
    CHECK(summary["jobs"] == 3);
    const auto timeline = nlohmann::json::parse(read(tmp / (policy + "1") / "timeline.json"));
    CHECK(timeline["traceEvents"].size() > 3);
  }
}

TEST_CASE("the shipped sample trace runs under every scheduler") {
  const auto trace = stratasim::testing::configs_dir() / "cluster" / "sample-trace.jsonl";
  for (const std::string policy : {"fifo", "srtf", "tiresias"}) {
    CAPTURE(policy);
    const auto r = run("cluster " + trace.string() + " --cluster dgx-a100-2 --scheduler " + policy);
    CAPTURE(r.output);
    CHECK(r.status == 0);
    CHECK(r.output.find("8 jobs") != std::string::npos);
  }
}

TEST_CASE("srtf runs the short jobs first where fifo makes them wait") {
  // Job a holds all 8 GPUs; b and c (4 GPUs each, much shorter) arrive behind it. FIFO makes
  // them wait for a; SRTF preempts a for them, so their JCTs are shorter than under FIFO.
  const TempDir tmp("cluster");
  const auto trace = tmp.write("trace.jsonl", kTrace);
  const std::string base = "cluster " + trace.string() + " --cluster dgx-a100-1 --out ";
  REQUIRE(run(base + (tmp / "fifo").string() + " --scheduler fifo").status == 0);
  REQUIRE(run(base + (tmp / "srtf").string() + " --scheduler srtf").status == 0);
  const auto fifo = nlohmann::json::parse(read(tmp / "fifo" / "summary.json"));
  const auto srtf = nlohmann::json::parse(read(tmp / "srtf" / "summary.json"));
  CHECK(srtf["mean_jct_s"].get<double>() < fifo["mean_jct_s"].get<double>());
  // a is preempted at least once (at 10 s for b; again for c if it resumed in between).
  CHECK(srtf["preemptions"].get<int>() >= 1);
  CHECK(fifo["preemptions"] == 0);
}

TEST_CASE("bad cluster traces and flags are exit 2 naming the line and field") {
  const TempDir tmp("cluster");
  const auto negative = tmp.write(
      "negative.jsonl",
      R"({"id": "a", "arrival_s": 0, "experiment": "gpt-tiny-3d-8", "samples": 1, "gpus": 4})"
      "\n"
      R"({"id": "b", "arrival_s": -5, "experiment": "gpt-tiny-3d-8", "samples": 1, "gpus": 4})"
      "\n");
  check_bad_input("cluster " + negative.string() + " --cluster dgx-a100-1",
                  {"negative.jsonl:2: arrival_s: expected a number >= 0, got -5"});
  const auto unknown = tmp.write(
      "unknown.jsonl",
      R"({"id": "a", "arrival_s": 0, "experiment": "no-such-model-run", "samples": 1, "gpus": 4})"
      "\n");
  check_bad_input("cluster " + unknown.string() + " --cluster dgx-a100-1",
                  {"unknown.jsonl:1: experiment: \"no-such-model-run\" does not load"});
  const auto large = tmp.write(
      "large.jsonl",
      R"({"id": "a", "arrival_s": 0, "experiment": "gpt-tiny-3d-8", "samples": 1, "gpus": 16})"
      "\n");
  check_bad_input("cluster " + large.string() + " --cluster dgx-a100-1",
                  {"large.jsonl:1: gpus: the job asks for 16 GPUs, more than the cluster's 8"});
  const auto odd = tmp.write(
      "odd.jsonl",
      R"({"id": "a", "arrival_s": 0, "experiment": "gpt-tiny-3d-8", "samples": 1, "gpus": 3})"
      "\n");
  check_bad_input("cluster " + odd.string() + " --cluster dgx-a100-1",
                  {"odd.jsonl:1: job a (gpt-tiny-3d-8) at its 3 GPUs: not runnable at 3 GPUs"});
  const auto ok = tmp.write("ok.jsonl", kTrace);
  check_bad_input("cluster " + ok.string() + " --cluster dgx-a100-1 --scheduler gandiva",
                  {"--scheduler: expected fifo, srtf, tiresias, pollux or ones"});
  check_bad_input("cluster " + ok.string() + " --cluster dgx-a100-1 --restart-cost soon",
                  {"--restart-cost"});
  check_bad_input("cluster " + ok.string() + " --cluster no-such-cluster", {"no-such-cluster"});
  check_bad_input("cluster " + (tmp / "missing.jsonl").string() + " --cluster dgx-a100-1",
                  {"missing.jsonl: cannot open the trace"});
}

TEST_CASE("cluster-trace generate writes a trace that cluster reads, elastic policies included") {
  const TempDir tmp("cluster");
  const auto trace = tmp / "helios.csv";
  const auto made =
      run("cluster-trace generate --format helios --jobs 20 --gpus 16 --seed 5 --out " +
          trace.string());
  CAPTURE(made.output);
  REQUIRE(made.status == 0);
  const std::string text = read(trace);
  CHECK(text.rfind("job_id,user,vc,gpu_num", 0) == 0);
  for (const std::string policy : {"pollux", "ones"}) {
    CAPTURE(policy);
    const std::string args = "cluster " + trace.string() +
                             " --trace-format helios --cluster dgx-a100-2 --seed 3 --scheduler " +
                             policy + " --out ";
    const auto first = run(args + (tmp / (policy + "1")).string());
    CAPTURE(first.output);
    REQUIRE(first.status == 0);
    CHECK(first.output.find("20 jobs") != std::string::npos);
    REQUIRE(run(args + (tmp / (policy + "2")).string()).status == 0);
    for (const char* file : {"jobs.csv", "summary.json", "timeline.json"}) {
      CAPTURE(file);
      CHECK(read(tmp / (policy + "1") / file) == read(tmp / (policy + "2") / file));
    }
  }
  const auto sample = stratasim::testing::configs_dir() / "cluster" / "sample-trace.jsonl";
  for (const std::string policy : {"pollux", "ones"}) {
    const auto r =
        run("cluster " + sample.string() + " --cluster dgx-a100-2 --scheduler " + policy);
    CAPTURE(r.output);
    CHECK(r.status == 0);
  }
}

TEST_CASE("bad trace formats and published-format lines are exit 2, naming what was expected") {
  const TempDir tmp("cluster");
  const auto bad = tmp.write("bad.csv",
                             "job_id,gpu_num,submit_time,duration\n"
                             "1,1,2020-06-09 18:41:01,60\n"
                             "2,1,2020-06-09 18:41:01,sixty\n");
  check_bad_input("cluster " + bad.string() + " --trace-format helios --cluster dgx-a100-1",
                  {"bad.csv:3: duration: expected a number >= 0, got \"sixty\""});
  check_bad_input("cluster " + bad.string() + " --trace-format alibaba --cluster dgx-a100-1",
                  {"--trace-format: expected jsonl, philly or helios"});
  const auto big = tmp.write("big.csv",
                             "job_id,gpu_num,submit_time,duration\n"
                             "1,16,2020-06-09 18:41:01,60\n");
  check_bad_input("cluster " + big.string() + " --trace-format helios --cluster dgx-a100-1",
                  {"big.csv:2: gpus: the job asks for 16 GPUs"});
  const auto ok = tmp.write("ok.csv",
                            "job_id,gpu_num,submit_time,duration\n"
                            "1,1,2020-06-09 18:41:01,60\n");
  check_bad_input("cluster " + ok.string() +
                      " --trace-format helios --cluster dgx-a100-1 --scheduler ones "
                      "--ones-population 1",
                  {"--ones-population, --ones-generations, --ones-resize-interval: expected"});
  check_bad_input(
      "cluster-trace generate --format philly --jobs 0 --out " + (tmp / "x.json").string(),
      {"--jobs: expected an integer >= 1"});
}
