// The job trace reader (cluster/trace.hpp) and the simulated speeds (cluster/throughput.hpp).
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster/throughput.hpp"
#include "cluster/trace.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"

using namespace stratasim;
using namespace stratasim::cluster;

namespace {

JobTrace parse(const std::string& text, int gpus = 8, bool check = false) {
  std::istringstream in(text);
  return parse_trace(in, "t.jsonl", gpus, check);
}

void check_error(const std::string& text, const std::string& expected, bool check = false) {
  CAPTURE(text);
  CHECK_THROWS_WITH_AS(parse(text, 8, check), doctest::Contains(expected.c_str()), study::BadInput);
}

}  // namespace

TEST_CASE("a trace reads jobs, defaults and epochs") {
  const JobTrace t = parse(
      "# provenance\n"
      "\n"
      R"({"id": "a", "arrival_s": 0, "experiment": "x", "samples": 100, "gpus": 4})"
      "\n"
      R"({"id": "b", "arrival_s": 5.5, "experiment": "y", "epochs": 2, "dataset_samples": 50,)"
      R"( "gpus": 2, "min_gpus": 1, "max_gpus": 8, "priority": 3})"
      "\n");
  REQUIRE(t.jobs.size() == 2);
  CHECK(t.jobs[0].line == 3);
  CHECK(t.jobs[0].min_gpus == 4);
  CHECK(t.jobs[0].max_gpus == 4);
  CHECK(!t.jobs[0].elastic());
  CHECK(t.jobs[1].samples == 100);
  CHECK(t.jobs[1].arrival_s == 5.5);
  CHECK(t.jobs[1].elastic());
  CHECK(t.jobs[1].priority == 3);
}

TEST_CASE("bad traces name the file, the line and the field") {
  const std::string ok =
      R"({"id": "a", "arrival_s": 0, "experiment": "x", "samples": 1, "gpus": 1})";
  check_error(
      ok + "\n" + R"({"id": "b", "arrival_s": -1, "experiment": "x", "samples": 1, "gpus": 1})",
      "t.jsonl:2: arrival_s: expected a number >= 0, got -1");
  check_error(R"({"id": "b", "experiment": "x", "samples": 1, "gpus": 1})",
              "t.jsonl:1: arrival_s: missing");
  check_error(R"({"id": "b", "arrival_s": 0, "experiment": "x", "samples": 1, "gpus": 16})",
              "t.jsonl:1: gpus: the job asks for 16 GPUs, more than the cluster's 8");
  check_error(
      R"({"id": "b", "arrival_s": 0, "experiment": "x", "samples": 1, "gpus": 1, "arival": 2})",
      "t.jsonl:1: arival: unknown field");
  check_error(R"({"id": "b", "arrival_s": 0, "experiment": "x", "gpus": 1})",
              "t.jsonl:1: samples: missing");
  check_error(ok + "\n" + ok, "t.jsonl:2: id: \"a\" appears twice");
  check_error("not json", "t.jsonl:1: not JSON");
  check_error(R"({"id": "a,b", "arrival_s": 0, "experiment": "x", "samples": 1, "gpus": 1})",
              "t.jsonl:1: id: expected no comma");
  check_error(R"({"id": "b", "arrival_s": 1e12, "experiment": "x", "samples": 1, "gpus": 1})",
              "t.jsonl:1: arrival_s: expected at most 7776000 s");
  check_error(R"({"id": "b", "arrival_s": 0, "experiment": "x", "samples": 1, "gpus": 1.5})",
              "t.jsonl:1: gpus: expected an integer, got 1.5");
  check_error("", "t.jsonl: no jobs");
  check_error(
      R"({"id": "b", "arrival_s": 0, "experiment": "no-such-experiment", "samples": 1, "gpus": 1})",
      "t.jsonl:1: experiment: \"no-such-experiment\" does not load", true);
}

TEST_CASE("simulated speeds grow with GPUs and are memoised") {
  // gpt-tiny-3d-8: tp 2 x pp 2, global batch 8, micro-batch 1. At 4 GPUs dp = 1 (8 microbatches
  // a pipeline), at 8 GPUs dp = 2 (4 each): the same samples per iteration in less time.
  Job j;
  j.id = "tiny";
  j.experiment = "gpt-tiny-3d-8";
  j.experiment_file = stratasim::study::resolve_experiment(j.experiment);
  const SimulatedThroughput speeds;
  const Speed four = speeds.speed(j, 4);
  const Speed eight = speeds.speed(j, 8);
  CAPTURE(four.why_not);
  REQUIRE(four.runnable);
  REQUIRE(eight.runnable);
  CHECK(eight.samples_per_s > four.samples_per_s);
  CHECK(speeds.simulations() == 2);
  CHECK(speeds.speed(j, 8).samples_per_s == eight.samples_per_s);
  CHECK(speeds.simulations() == 2);  // memoised
  // 2 GPUs cannot hold tp 2 x pp 2.
  const Speed two = speeds.speed(j, 2);
  CHECK(!two.runnable);
  CHECK(two.why_not.find("not runnable at 2 GPUs") != std::string::npos);
}

TEST_CASE("simulated speeds asked from several threads are simulated once each") {
  Job j;
  j.id = "tiny";
  j.experiment = "gpt-tiny-3d-8";
  j.experiment_file = stratasim::study::resolve_experiment(j.experiment);
  const SimulatedThroughput speeds;
  std::vector<double> seen(8, 0);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] { seen[t] = speeds.speed(j, t % 2 ? 4 : 8).samples_per_s; });
  }
  for (auto& t : threads) t.join();
  CHECK(speeds.simulations() == 2);
  for (std::size_t t = 2; t < seen.size(); ++t) CHECK(seen[t] == seen[t % 2]);
}
