// `stratasim simulate --max-memory SIZE`: a run estimated to need more host memory than the limit
// stops at once with exit 2, the estimate and what would make it fit, and writes nothing; a run
// under the limit runs (study/footprint.hpp).
#include <doctest/doctest.h>

#include "helpers.hpp"
#include "test_paths.hpp"

using namespace stratasim::testing::cli;
using stratasim::testing::configs_dir;

namespace {

std::string experiment() {
  return (configs_dir() / "experiments/gpt3-1.7b-a100-8.json").string();
}

}  // namespace

TEST_CASE("--max-memory under the estimate: exit 2 with the estimate and advice, no outputs") {
  const TempDir tmp("cli-max-memory");
  const fs::path out = tmp.path() / "out";
  // gpt3-1.7b-a100-8 with --exact: 8 ranks of ops, several MiB of Program alone; 1 MiB is less
  // than the executable itself.
  const auto r =
      run("simulate " + experiment() + " --exact --max-memory \"1 MiB\" --out " + out.string());
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("--max-memory") != std::string::npos);
  CHECK(r.output.find("needs about") != std::string::npos);
  CHECK(r.output.find("ops") != std::string::npos);
  CHECK(r.output.find("drop --exact") != std::string::npos);  // the advice
  CHECK(r.output.find("bad_alloc") == std::string::npos);
  CHECK_FALSE(fs::exists(out / "report.json"));
  CHECK_FALSE(fs::exists(out / "timeline.json"));
}

TEST_CASE("--max-memory over the estimate: the run completes") {
  const TempDir tmp("cli-max-memory");
  const fs::path out = tmp.path() / "out";
  const auto r = run("simulate " + experiment() + " --max-memory \"64 GiB\" --out " + out.string());
  CAPTURE(r.output);
  CHECK(r.status == 0);
  CHECK(fs::exists(out / "report.json"));
}

TEST_CASE("--max-memory that is not a size: exit 2 naming the flag") {
  check_bad_input("simulate " + experiment() + " --max-memory lots", {"--max-memory", "a size"});
}
