// --fsdp on the command line: the shipped FSDP configs (llm-foundry's fsdp_config, Accelerate's)
// simulate, and a bad one exits 2 naming the file and the key.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "cli/helpers.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"

namespace {

using namespace stratasim::testing::cli;
using stratasim::testing::configs_dir;

bool has(const std::string& output, const std::string& text) {
  return output.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("every shipped FSDP config simulates with a shipped experiment") {
  int n = 0;
  for (const auto& f : fs::directory_iterator(configs_dir() / "fsdp")) {
    CAPTURE(f.path());
    auto r = run("simulate llama2-7b-h100-8 --tp 1 --dp 8 --fsdp " + f.path().string());
    CAPTURE(r.output);
    CHECK(r.status == 0);
    CHECK(has(r.output, "fsdp"));
    CHECK(has(r.output, "ZeRO 3"));
    ++n;
  }
  CHECK(n >= 2);
}

TEST_CASE("--fsdp: an unknown key close to a known one exits 2 naming the file and the key") {
  const TempDir dir("cli-fsdp");
  const auto file = dir.path() / "fsdp.yaml";
  std::ofstream(file)
      << "fsdp_config:\n  sharding_strategy: FULL_SHARD\n  limit_all_gather: true\n";
  auto r = run("simulate llama2-7b-h100-8 --tp 1 --dp 8 --fsdp " + file.string());
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(has(r.output, file.string()));
  CHECK(has(r.output, "fsdp_config.limit_all_gather"));
  CHECK(has(r.output, "did you mean 'limit_all_gathers'"));
}
