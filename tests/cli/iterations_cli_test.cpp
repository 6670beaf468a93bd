// `stratasim simulate --iterations N` and the parameter-server strategy from the command line:
// --iterations 1 changes no byte of report.json, N > 1 reports the mean, the total and each
// iteration's end, and bad settings exit 2 naming the key (docs/parameter-server.md).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"

namespace stratasim::testing {

using namespace stratasim::testing::cli;

TEST_CASE("--iterations 1 writes the same report.json, byte for byte, as no flag") {
  const TempDir tmp("cli-iterations");
  // Shipped experiments of every kind of lowering the pass sees: a transformer with data
  // parallelism, a pipeline of a layer table, DLRM, RNN and a parameter server.
  for (const std::string name :
       {"gpt3-1.7b-a100-8", "vgg16-bapipe-v100-16", "dlrm-criteo-terabyte-a100-8",
        "lstm-2x1024-a100-8", "vgg16-ps-v100-10", "resnet50-ps-v100-10"}) {
    CAPTURE(name);
    const auto plain = tmp.subdir(name + "-plain");
    const auto once = tmp.subdir(name + "-once");
    REQUIRE(run("simulate " + name + " --quiet --out " + plain.string()).status == 0);
    REQUIRE(run("simulate " + name + " --quiet --iterations 1 --out " + once.string()).status == 0);
    CHECK(read(plain / "report.json") == read(once / "report.json"));
  }
}

TEST_CASE("--iterations 3: the mean iteration, the total and each iteration's end") {
  const TempDir tmp("cli-iterations-3");
  const auto one = tmp.subdir("one");
  const auto three = tmp.subdir("three");
  REQUIRE(run("simulate vgg16-ps-v100-10 --quiet --out " + one.string()).status == 0);
  REQUIRE(run("simulate vgg16-ps-v100-10 --quiet --iterations 3 --out " + three.string()).status ==
          0);
  const auto a = nlohmann::json::parse(read(one / "report.json"));
  const auto b = nlohmann::json::parse(read(three / "report.json"));
  CHECK_FALSE(a.contains("iterations"));
  REQUIRE(b["iterations"] == 3);
  const auto ends = b["iteration_end_s"].get<std::vector<double>>();
  REQUIRE(ends.size() == 3);
  CHECK(ends[0] < ends[1]);
  CHECK(ends[1] < ends[2]);
  CHECK(ends[2] == doctest::Approx(b["total_time_s"].get<double>()));
  // The mean is the total over 3; FLOPs per iteration and MFU per mean iteration.
  CHECK(b["iteration_time_s"].get<double>() ==
        doctest::Approx(b["total_time_s"].get<double>() / 3));
  CHECK(b["model_flops_per_iteration"].get<double>() ==
        doctest::Approx(a["model_flops_per_iteration"].get<double>()));
  CHECK(b["samples_per_s"].get<double>() ==
        doctest::Approx(256 / b["iteration_time_s"].get<double>()));
  // The first iteration is the one-iteration run (nothing before it to wait for).
  CHECK(ends[0] == doctest::Approx(a["iteration_time_s"].get<double>()));
  // Memory peaks over the run: the same states, and no iteration leaks.
  CHECK(b["peak_memory_bytes"] == a["peak_memory_bytes"]);
}

TEST_CASE("parameter servers are ranks a trace may name") {
  const TempDir tmp("cli-ps-trace");
  const auto out = tmp.subdir("out");
  // 8 workers (ranks 0-7) and 2 servers (ranks 8, 9).
  REQUIRE(run("simulate vgg16-ps-v100-10 --quiet --trace-ranks 0,9 --out " + out.string()).status ==
          0);
  CHECK(read(out / "timeline.json").find("ps update") != std::string::npos);
  check_bad_input("simulate vgg16-ps-v100-10 --trace-ranks 10", {"--trace-ranks", "0 to 9"});
}

TEST_CASE("--iterations and the parameter server: bad input exits 2 naming the key") {
  check_bad_input("simulate vgg16-ps-v100-10 --iterations 0", {"--iterations"});
  check_bad_input("simulate vgg16-bapipe-v100-16 --schedule pipedream-2bw --iterations 2",
                  {"--iterations", "overlaps iterations"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.zero=1",
                  {"parallelism.zero", "parameter_server"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.pp=2 --set parallelism.dp=4",
                  {"parallelism.pp", "parameter_server"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.servers=10",
                  {"parallelism.servers", "no device"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.servers=0", {"parallelism.servers"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.data_parallel=allreduce",
                  {"parallelism.servers", "parameter_server"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.data_parallel=ps",
                  {"parallelism.data_parallel"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.dp=9",
                  {"parallelism.dp", "besides its 2 parameter servers"});
  check_bad_input("simulate vgg16-ps-v100-10 --set parallelism.slice_parameters=-1",
                  {"parallelism.slice_parameters"});
  check_bad_input("simulate gpt3-1.7b-dp32-oversubscribed --set parallelism.slice_parameters=1000",
                  {"parallelism.slice_parameters", "parameter_server"});
  check_bad_input("simulate vgg16-ps-v100-10 --set transport.within_class=fifo",
                  {"transport.within_class", "layer"});
  check_bad_input("simulate vgg16-ps-v100-10 --set transport.within_class=lifo",
                  {"transport.within_class"});
}

}  // namespace stratasim::testing
