// RNN experiments through the stratasim executable: bad inputs exit 2 naming the key, the
// report's time to train, and byte-identical reports run after run.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;
using namespace stratasim::testing::cli;

namespace {

std::string experiment(const std::string& name) {
  return (stratasim::testing::configs_dir() / "experiments" / (name + ".json")).string();
}

}  // namespace

TEST_CASE("RNN bad inputs exit 2 naming the key") {
  check_bad_input("simulate " + experiment("lstm-2x1024-a100-8") + " --set model.timesteps=0",
                  {"model.timesteps", "at least 1"});
  check_bad_input("simulate " + experiment("gpt3-1.7b-a100-8") + " --set training.algorithm=admm",
                  {"training.algorithm", "RNN"});
  check_bad_input("simulate " + experiment("lstm-2x1024-a100-8") + " --set training.algorithm=admm",
                  {"at cell", "vanilla"});
}

TEST_CASE("an ADMM run reports the time to train, identically twice") {
  const TempDir tmp("cli-rnn");
  const fs::path dir = tmp.path();
  const std::string args = "simulate " + experiment("rnn-vanilla-1024-admm-a100-8") +
                           " --set training.iterations_to_accuracy=1000 --out ";
  const auto a = run(args + (dir / "a").string());
  CAPTURE(a.output);
  REQUIRE(a.status == 0);
  CHECK(a.output.find("time to train") != std::string::npos);
  CHECK(a.output.find("ADMMiRNN") != std::string::npos);
  REQUIRE(run(args + (dir / "b").string() + " --quiet").status == 0);
  const std::string first = read(dir / "a" / "report.json");
  CHECK(first == read(dir / "b" / "report.json"));
  const auto report = nlohmann::json::parse(first);
  CHECK(report["iterations_to_accuracy"] == 1000);
  const double iteration = report["iteration_time_s"];
  CHECK(iteration > 0);
  CHECK(double(report["time_to_train_s"]) == doctest::Approx(1000 * iteration));
  // Without iterations to accuracy the report has no such keys.
  const auto c = run("simulate " + experiment("rnn-vanilla-1024-admm-a100-8") + " --quiet --out " +
                     (dir / "c").string());
  REQUIRE(c.status == 0);
  const auto plain = nlohmann::json::parse(read(dir / "c" / "report.json"));
  CHECK_FALSE(plain.contains("time_to_train_s"));
  CHECK(double(plain["iteration_time_s"]) == doctest::Approx(iteration).epsilon(1e-12));
}

TEST_CASE("list models shows the RNN models") {
  const auto r = run("list models");
  CHECK(r.status == 0);
  CHECK(r.output.find("lstm-gnmt-8x1024") != std::string::npos);
  CHECK(r.output.find("lstm RNN") != std::string::npos);
}

TEST_CASE("search ranks an RNN experiment's data-parallel strategies; partition has none to plan") {
  // Before: search's model-states pre-filter planned transformer stages (a division by zero);
  // partition likewise.
  const auto r = run("search " + experiment("lstm-2x1024-a100-8") + " --gpus 8");
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("3 simulated, 3 fit") != std::string::npos);
  check_bad_input("partition " + experiment("lstm-2x1024-a100-8"),
                  {"partition", "recurrent model", "no partition to plan"});
}
