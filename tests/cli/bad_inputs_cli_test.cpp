// Bad inputs found by probing the stratasim executable (issue 18): each is exit code 2 with a
// message naming the flag or JSON path and what was expected; never a crash, a success on
// nonsense, a 309-digit bound or a number the user never wrote.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;
using namespace stratasim::testing::cli;

namespace {

// A shipped experiment: GPT-3 1.7B on one DGX A100 (8 GPUs).
std::string experiment() {
  return (stratasim::testing::configs_dir() / "experiments" / "gpt3-1.7b-a100-8.json").string();
}

// CLI11's PositiveNumber printed its bound as a double: "0.000000 to 1797693134862315708...".
void check_no_huge_bound(const std::string& args) {
  CAPTURE(args);
  const auto r = run(args);
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("179769") == std::string::npos);
}

}  // namespace

TEST_CASE("schedules --micro-batches 0 is exit 2 naming the flag") {
  // Before: a division by zero (SIGFPE) while counting microbatches.
  check_bad_input("schedules " + experiment() + " --micro-batches 0",
                  {"--micro-batches", "expected a positive integer, got 0"});
  check_bad_input("schedules " + experiment() + " --micro-batches 1,0",
                  {"--micro-batches", "expected a positive integer, got 0"});
}

TEST_CASE("schedules --micro-batches -1 is exit 2 naming the flag") {
  // Before: exit 0.
  check_bad_input("schedules " + experiment() + " --micro-batches -1",
                  {"--micro-batches", "expected a positive integer, got -1"});
}

TEST_CASE(
    "--gpus 0, --jobs 0 and --ranks 0 say 'expected a positive integer', not a 309-digit range") {
  check_bad_input("search " + experiment() + " --gpus 0",
                  {"--gpus", "expected a positive integer, got 0"});
  check_no_huge_bound("search " + experiment() + " --gpus 0");
  check_bad_input("sweep " + experiment() + " --jobs 0",
                  {"--jobs", "expected a positive integer, got 0"});
  check_no_huge_bound("sweep " + experiment() + " --jobs 0");
  check_bad_input("replay no-such-trace.json --ranks 0",
                  {"--ranks", "expected a positive integer, got 0"});
  check_bad_input("calibrate --ranks 0", {"--ranks", "expected a positive integer, got 0"});
  check_bad_input("simulate " + experiment() + " --tp 0", {"--tp", "expected a positive integer"});
  check_bad_input("simulate " + experiment() + " --pp abc",
                  {"--pp", "expected a positive integer, got abc"});
  check_bad_input("simulate " + experiment() + " --global-batch -4",
                  {"--global-batch", "expected a positive integer, got -4"});
  check_bad_input("fit --max-evaluations 0", {"--max-evaluations", "expected a positive integer"});
  check_bad_input("fit --max-evaluations 100000001",
                  {"--max-evaluations", "of at most 100000000, got 100000001"});
  check_bad_input("run " + experiment() + " --warmup -1",
                  {"--warmup", "expected an integer of at least 0, got -1"});
  check_bad_input("run " + experiment() + " --iterations 0",
                  {"--iterations", "expected a positive integer, got 0"});
}

TEST_CASE("collective --ranks with a device listed twice is exit 2 naming --ranks") {
  // Before: 0,0,0,0 ran as a group of 4 devices.
  check_bad_input("collective dgx-a100-1 --ranks 0,0,0,0 --sizes 1M",
                  {"--ranks", "device 0 is listed twice"});
  check_bad_input("collective dgx-a100-1 --ranks 0-3,2 --sizes 1M",
                  {"--ranks", "device 2 is listed twice"});
}

TEST_CASE("collective --ranks '' is exit 2, not every device") {
  // Before: an empty value meant the default, every device.
  check_bad_input("collective dgx-a100-1 --ranks '' --sizes 1M",
                  {"--ranks", "expected device ranges"});
}

TEST_CASE("an integer of 2^64 - 8 in a config is reported as written, not as -8") {
  const TempDir tmp("cli");
  // 18446744073709551608 = 2^64 - 8: nlohmann::json holds it unsigned; read as int64 it is -8.
  check_bad_input("simulate " + experiment() + " --set parallelism.tp=18446744073709551608",
                  {"parallelism.tp", "got 18446744073709551608"});
  const auto r = run("simulate " + experiment() + " --set parallelism.tp=18446744073709551608");
  CHECK(r.output.find("got -8") == std::string::npos);
  // The same in a file (nlohmann::json writes the unsigned value as it is).
  auto e = nlohmann::json::parse(read(experiment()));
  e["model"] = (stratasim::testing::configs_dir() / "models" / "gpt3-1.7b.json").string();
  e["cluster"] =
      (stratasim::testing::configs_dir() / "hardware" / "clusters" / "dgx-a100-1.json").string();
  e["parallelism"]["tp"] = std::uint64_t{18446744073709551608ULL};
  const auto file = tmp.path() / "experiment.json";
  std::ofstream(file) << e.dump(2);
  REQUIRE(read(file).find("18446744073709551608") != std::string::npos);
  check_bad_input("simulate " + file.string(),
                  {file.string(), "parallelism.tp", "got 18446744073709551608"});
}

TEST_CASE("a bandwidth of 1e-30 Gb/s is exit 2 at the key, naming the 1 MB/s bound") {
  // Before: accepted, then simulated time overflowed (exit 1 with a 300-digit number).
  check_bad_input(
      "simulate " + experiment() + " --set 'cluster.inter_node.bandwidth=\"1e-30 Gb/s\"'",
      {"inter_node.bandwidth", "at least 1 MB/s", "1e-30 Gb/s"});
}

TEST_CASE("a peak of 1e-20 TFLOP/s is exit 2 at the key, naming the 1 MFLOP/s bound") {
  check_bad_input(
      "simulate " + experiment() + " --set 'cluster.device.peak_flops.bf16=\"1e-20 TFLOP/s\"'",
      {"peak_flops.bf16", "at least 1 MFLOP/s"});
}

TEST_CASE("protocol_efficiency 1e-300 is exit 2 at the key, naming the 1e-6 bound") {
  const auto args =
      "simulate " + experiment() + " --set cluster.collectives.protocol_efficiency=1e-300";
  check_bad_input(args, {"collectives.protocol_efficiency", "at least 1e-6", "got 1e-300"});
}

TEST_CASE("a host Adam rate of 1e-300 per core is exit 2 at the key") {
  check_bad_input(
      "simulate " + experiment() + " --set cluster.host.adam_params_per_second_per_core=1e-300",
      {"host.adam_params_per_second_per_core", "at least 1000"});
}

TEST_CASE("a slowdown of 1e300 is exit 2 at the key, naming the 1e6 bound, in few digits") {
  const auto args = "simulate " + experiment() +
                    " --set 'cluster.overrides=[{\"ranks\": \"1\", \"slowdown\": 1e300}]'";
  check_bad_input(args, {"overrides.0.slowdown", "1e-6 to 1e6", "got 1e+300"});
  CHECK(run(args).output.find("000000000000") == std::string::npos);
}

TEST_CASE("JSON nested 60,000 levels deep is exit 2 naming the file, not a stack overflow") {
  const TempDir tmp("cli");
  const auto file = tmp.path() / "deep.json";
  {
    std::ofstream out(file);
    out << "{\"name\": ";
    out << std::string(60000, '[') << std::string(60000, ']') << "}";
  }
  // Before: SIGSEGV in a recursive copy of the value.
  check_bad_input("simulate " + file.string(), {file.string(), "nested deeper than 512 levels"});
  check_bad_input("collective " + file.string(), {file.string(), "nested deeper than 512 levels"});
}

TEST_CASE("a --deepspeed file nested 100,000 levels deep is exit 2 naming the file") {
  const TempDir tmp("cli");
  const auto deep = [&](const std::string& name, const std::string& head, const std::string& tail) {
    const auto file = tmp.path() / name;
    std::ofstream(file) << head << std::string(100000, '[') << std::string(100000, ']') << tail;
    return file.string();
  };
  // Before: SIGSEGV (the DeepSpeed reader printed the value in its error, recursively).
  const auto ds = deep("ds.json", "{\"zero_optimization\": {\"stage\": ", "}}");
  check_bad_input("simulate " + experiment() + " --deepspeed " + ds,
                  {ds, "nested deeper than 512 levels"});
  // The same file named inside a launch line, and the other foreign inputs read as JSON.
  check_bad_input("simulate " + experiment() + " --megatron-args \"--deepspeed_config " + ds + "\"",
                  {ds, "nested deeper than 512 levels"});
  const auto hf = deep("config.json", "{\"model_type\": \"llama\", \"hidden_size\": ", "}");
  check_bad_input("simulate " + experiment() + " --model " + hf, {hf, "nested deeper than 512"});
  const auto fsdp = deep("fsdp.json", "{\"sharding_strategy\": ", "}");
  check_bad_input("simulate " + experiment() + " --fsdp " + fsdp, {fsdp, "nested deeper than 512"});
}

TEST_CASE("an experiment's description nested 60,000 levels deep is exit 2 for sweep and search") {
  const TempDir tmp("cli");
  const auto file = tmp.path() / "deep-description.json";
  {
    auto e = nlohmann::json::parse(std::ifstream(experiment()));
    const std::string model =
        (stratasim::testing::configs_dir() / "models" / "gpt3-1.7b.json").string();
    const std::string cluster =
        (stratasim::testing::configs_dir() / "hardware" / "clusters" / "dgx-a100-1.json").string();
    e["model"] = model;
    e["cluster"] = cluster;
    std::string text = e.dump();
    const std::string key = "\"description\":";
    const auto at = text.find(key);
    REQUIRE(at != std::string::npos);
    const auto end = text.find("\",\"", at + key.size() + 1);  // the end of the description
    text = text.substr(0, at + key.size()) + std::string(60000, '[') + std::string(60000, ']') +
           text.substr(end + 1);
    std::ofstream(file) << text;
  }
  // Before: SIGSEGV in a recursive copy of the experiment for each combination.
  check_bad_input("sweep " + file.string() + " --tp 1,2 --out " + (tmp.path() / "s.csv").string(),
                  {file.string(), "nested deeper than 512"});
  check_bad_input("search " + file.string() + " --gpus 8",
                  {file.string(), "nested deeper than 512"});
}

TEST_CASE("a directory or a FIFO as the experiment is exit 2, not malformed JSON or a hang") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("a-folder");
  check_bad_input("simulate " + dir.string(), {dir.string(), "is a directory"});
  const auto fifo = tmp.path() / "fifo.json";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Before: reading the FIFO blocked forever.
  check_bad_input("simulate " + fifo.string(), {fifo.string(), "not a regular file"});
  check_bad_input("simulate /dev/zero", {"/dev/zero", "not a regular file"});
}

TEST_CASE("search --gpus 1073741824 is exit 2 when every combination is invalid") {
  // Before: exit 0 with "no strategy fits in memory" although no row was even valid.
  check_bad_input("search " + experiment() + " --gpus 1073741824 --quiet",
                  {"--gpus 1073741824", "all", "combinations are invalid"});
}

TEST_CASE(
    "an unwritable --out is exit 2 naming --out before any work, for collective and export too") {
  // /proc takes no new folders or files, even for root. Before: exit 1 after the whole work,
  // and collective and export did not name --out.
  check_bad_input("simulate " + experiment() + " --quiet --out /proc/stratasim-out",
                  {"--out /proc/stratasim-out", "cannot create the folder"});
  check_bad_input("collective dgx-a100-1 --sizes 1M --out /proc/stratasim-out",
                  {"--out /proc/stratasim-out", "cannot create the folder"});
  check_bad_input("export " + experiment() + " --out /proc/stratasim-out",
                  {"--out /proc/stratasim-out", "cannot create the folder"});
  check_bad_input("search " + experiment() + " --gpus 8 --quiet --out /proc/stratasim.csv",
                  {"--out /proc", "cannot write files"});
  const auto collective = run("collective dgx-a100-1 --sizes 1M --out /proc/stratasim-out");
  CHECK(collective.output.find("busbw") == std::string::npos);  // no table: nothing ran
}

TEST_CASE("host memory exhaustion is exit 3 with a hint, not a bare std::bad_alloc") {
  // GPT-3 175B on 1024 A100s with every replica simulated, in 150 MB of address space.
  const std::string command =
      "(ulimit -v 150000; " + std::string(STRATASIM_BINARY) + " simulate " +
      (stratasim::testing::configs_dir() / "experiments" / "gpt3-175b-a100-1024.json").string() +
      " --quiet --exact) 2>&1";
  const auto r = run_shell(command);
  CAPTURE(r.output);
  CHECK(r.status == 3);
  CHECK(r.output.find("out of host memory") != std::string::npos);
  CHECK(r.output.find("--exact") != std::string::npos);
}

TEST_CASE("a Kineto or Chakra JSON trace nested 100,000 levels deep is exit 2 naming the file") {
  const TempDir tmp("cli");
  const auto deep = [&](const std::string& name, const std::string& head, const std::string& tail) {
    const auto file = tmp.path() / name;
    std::ofstream(file) << head << std::string(100000, '[') << std::string(100000, ']') << tail;
    return file.string();
  };
  // A Kineto trace whose event's args nest 100,000 levels.
  const auto kineto = deep("rank0.json",
                           "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": "
                           "\"k\", \"ts\": 0, \"dur\": 1, \"args\": ",
                           "}]}");
  check_bad_input("replay " + kineto + " --format kineto --cluster dgx-a100-1",
                  {kineto, "nested deeper than 512 levels"});
  // Chakra's JSON form: the GlobalMetadata object nests 100,000 levels.
  const auto dir = tmp.subdir("chakra");
  const auto chakra = (dir / "t.0.json").string();
  std::ofstream(chakra) << "{\"version\": " << std::string(100000, '[') << std::string(100000, ']')
                        << "}";
  check_bad_input("replay " + (dir / "t").string() + " --format chakra --cluster dgx-a100-1",
                  {chakra, "nested deeper than 512 levels"});
}
