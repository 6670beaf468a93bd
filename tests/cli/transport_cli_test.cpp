// The experiment's `transport` section and the cluster's `load_balancing` through the stratasim
// executable (docs/priorities.md): bad values are exit 2 naming the file and JSON path; a loss
// bound of 0 reproduces the lossless report byte for byte; a loss bound's dropped bytes reach
// report.json's figures.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;
using namespace stratasim::testing::cli;

namespace {

// A shipped experiment: GPT-3 1.7B on one DGX A100 (8 GPUs, data parallel).
std::string experiment() {
  return (stratasim::testing::configs_dir() / "experiments" / "gpt3-1.7b-a100-8.json").string();
}

// The shipped experiment with `transport` set, written into `dir` (model and cluster by
// absolute path).
fs::path with_transport(const fs::path& dir, const nlohmann::json& transport) {
  auto e = nlohmann::json::parse(read(experiment()));
  e["model"] = (stratasim::testing::configs_dir() / "models" / "gpt3-1.7b.json").string();
  e["cluster"] =
      (stratasim::testing::configs_dir() / "hardware" / "clusters" / "dgx-a100-1.json").string();
  e["transport"] = transport;
  const auto file = dir / "experiment.json";
  std::ofstream(file) << e.dump(2);
  return file;
}

}  // namespace

TEST_CASE("transport: bad keys and values are exit 2 naming the file and the path") {
  const TempDir tmp("cli");
  const auto file = with_transport(tmp.path(), {{"priority", "layer"}, {"clases", 4}});
  check_bad_input("simulate " + file.string(),
                  {file.string(), "transport.clases", "did you mean 'classes'"});
  const auto loss = with_transport(tmp.path(), {{"loss_bound", 1.0}});
  check_bad_input("simulate " + loss.string(), {"transport.loss_bound", "[0, 1)"});
  check_bad_input("simulate " + experiment() +
                      " --set 'transport={\"scheduling\": \"weighted\", \"classes\": 2}'",
                  {"transport.weights", "one weight per class (2)"});
  check_bad_input("simulate " + experiment() +
                      " --set 'transport={\"priority\": \"rules\", \"classes\": 2, \"rules\": "
                      "[{\"stream\": \"dp_comm\", \"class\": 5}]}'",
                  {"transport.rules.0.class", "below classes (2), got 5"});
  check_bad_input("simulate " + experiment() +
                      " --set 'transport={\"priority\": \"rules\", \"classes\": 2, \"rules\": "
                      "[{\"stream\": \"dp_com\", \"class\": 1}]}'",
                  {"transport.rules.0.stream", "did you mean \"dp-comm\""});
  check_bad_input("simulate " + experiment() + " --set cluster.load_balancing=sprey",
                  {"load_balancing", "spray"});
}

TEST_CASE("transport: loss bound 0 is the lossless report; a bound drops gradient bytes") {
  const TempDir tmp("cli");
  const auto dir = tmp.path();
  const std::string flow = " --set cluster.network_model=flow --quiet --out ";
  REQUIRE(run("simulate " + experiment() + flow + (dir / "plain").string()).status == 0);
  const auto zero = with_transport(dir, {{"loss_bound", 0.0}});
  REQUIRE(run("simulate " + zero.string() + flow + (dir / "zero").string()).status == 0);
  CHECK(read(dir / "plain" / "report.json") == read(dir / "zero" / "report.json"));

  const auto lossy = with_transport(dir, {{"loss_bound", 0.1}});
  REQUIRE(run("simulate " + lossy.string() + flow + (dir / "lossy").string()).status == 0);
  const auto plain = nlohmann::json::parse(read(dir / "plain" / "report.json"));
  const auto report = nlohmann::json::parse(read(dir / "lossy" / "report.json"));
  const auto& figures = report["figures"];
  // Every gradient bucket's all-reduce drops 10% of its bytes (rounded to the byte).
  CHECK(figures["gradient_bytes_per_iteration"].get<double>() > 0);
  CHECK(figures["gradient_dropped_fraction"].get<double>() == doctest::Approx(0.1).epsilon(1e-6));
  CHECK(figures["gradient_bytes_dropped_per_iteration"].get<double>() ==
        doctest::Approx(0.1 * figures["gradient_bytes_per_iteration"].get<double>()).epsilon(1e-6));
  CHECK(report["iteration_time_s"].get<double>() < plain["iteration_time_s"].get<double>());
  CHECK(plain["figures"].empty());
}

namespace {

// The shipped job `name` (configs/jobs/) with `transport` set, written into `dir` (model and
// cluster by absolute path).
fs::path job_with_transport(const fs::path& dir, const std::string& name,
                            const nlohmann::json& transport) {
  const auto jobs = stratasim::testing::configs_dir() / "jobs";
  auto e = nlohmann::json::parse(read(jobs / (name + ".json")));
  for (const char* key : {"model", "cluster"}) {
    e[key] = fs::weakly_canonical(jobs / e[key].get<std::string>()).string();
  }
  e["transport"] = transport;
  const auto file = dir / (name + ".json");
  std::ofstream(file) << e.dump(2);
  return file;
}

}  // namespace

TEST_CASE("transport: jobs on one cluster, each with its own section") {
  const TempDir tmp("cli");
  const auto dir = tmp.path();
  const std::string cluster = " --cluster dgx-a100-32-oversubscribed --placement interleaved";
  // The fabric has one link scheduling: the jobs that set classes must agree on it.
  const auto strict =
      job_with_transport(dir, "gpt3-1.7b-dp16", {{"priority", "layer"}, {"classes", 2}});
  const auto weighted = job_with_transport(
      dir, "llama2-7b-tp8-dp2",
      {{"priority", "layer"}, {"classes", 2}, {"scheduling", "weighted"}, {"weights", {3, 1}}});
  check_bad_input("simulate " + strict.string() + " " + weighted.string() + cluster,
                  {"job 2 (llama2-7b-tp8-dp2): transport.scheduling \"weighted\"",
                   "job 1 (gpt3-1.7b-dp16)'s \"strict\""});
  // A loss bound in one job: its report has the loss figures, the other's none.
  const auto lossy = job_with_transport(dir, "gpt3-1.7b-dp16", {{"loss_bound", 0.1}});
  const auto plain =
      (stratasim::testing::configs_dir() / "jobs" / "llama2-7b-tp8-dp2.json").string();
  const auto out = dir / "out";
  REQUIRE(
      run("simulate " + lossy.string() + " " + plain + cluster + " --quiet --out " + out.string())
          .status == 0);
  const auto first = nlohmann::json::parse(read(out / "job1-gpt3-1.7b-dp16" / "report.json"));
  const auto second = nlohmann::json::parse(read(out / "job2-llama2-7b-tp8-dp2" / "report.json"));
  CHECK(first["figures"]["gradient_bytes_per_iteration"].get<double>() > 0);
  CHECK(first["figures"]["gradient_dropped_fraction"].get<double>() ==
        doctest::Approx(0.1).epsilon(1e-6));
  CHECK(second["figures"].empty());
}

TEST_CASE("transport: a job whose traffic yields lets the other job's pass first") {
  // Two copies of the 16-GPU data-parallel job, interleaved on racks of 2 nodes with 2:1
  // oversubscribed uplinks: both jobs' reduce-scatters and all-gathers cross the same leaf
  // uplinks. With the second job's transfers all in class 1 (strict), the first job's take
  // those links first: it is faster, and the second no faster than the first.
  const TempDir tmp("cli");
  const auto dir = tmp.path();
  const std::string cluster = " --cluster dgx-a100-32-oversubscribed --placement interleaved";
  const auto job = (stratasim::testing::configs_dir() / "jobs" / "gpt3-1.7b-dp16.json").string();
  const auto yielding = job_with_transport(
      dir, "gpt3-1.7b-dp16", {{"priority", "rules"}, {"classes", 2}, {"rules", {{{"class", 1}}}}});
  auto times = [&](const std::string& second, const std::string& out) {
    REQUIRE(
        run("simulate " + job + " " + second + cluster + " --quiet --out " + (dir / out).string())
            .status == 0);
    std::pair<double, double> t;
    for (int j : {1, 2}) {
      const auto report = nlohmann::json::parse(
          read(dir / out / ("job" + std::to_string(j) + "-gpt3-1.7b-dp16") / "report.json"));
      (j == 1 ? t.first : t.second) = report["iteration_time_s"].get<double>();
    }
    return t;
  };
  const auto fair = times(job, "fair");
  const auto ranked = times(yielding.string(), "ranked");
  CHECK(fair.first == fair.second);
  CHECK(ranked.first < fair.first);
  CHECK(ranked.first < ranked.second);
}
