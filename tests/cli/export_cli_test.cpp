// `stratasim export`: Chakra files for every rank, deterministic, and clear errors.
#include <string>

#include "cli/helpers.hpp"

using namespace stratasim::testing::cli;

namespace {
const std::string kTiny =
    std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt-tiny-3d-8.json";
}

TEST_CASE("cli export: writes a Chakra file per rank and the comm groups, deterministically") {
  const TempDir tmp("cli");
  const fs::path out = tmp.subdir("export-chakra");
  const auto r = run("export " + kTiny + " --format chakra --out " + out.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  // gpt-tiny-3d-8 runs on 8 devices: one file per rank.
  for (int rank = 0; rank < 8; ++rank) {
    CHECK(fs::exists(out / ("gpt-tiny-3d-8." + std::to_string(rank) + ".et")));
  }
  CHECK(!fs::exists(out / "gpt-tiny-3d-8.8.et"));
  // Group ids start at 1: ASTRA-sim reserves 0 (no group, all ranks).
  const std::string groups = read(out / "gpt-tiny-3d-8.comm_groups.json");
  CHECK(groups.find("\"1\": [") != std::string::npos);
  CHECK(groups.find("\"0\": [") == std::string::npos);
  const fs::path again = tmp.subdir("export-chakra-again");
  REQUIRE(run("export " + kTiny + " --quiet --out " + again.string()).status == 0);
  CHECK(read(out / "gpt-tiny-3d-8.3.et") == read(again / "gpt-tiny-3d-8.3.et"));
}

TEST_CASE("cli export: the JSON form with simulated durations") {
  const TempDir tmp("cli");
  const fs::path out = tmp.subdir("export-chakra-json");
  const auto r =
      run("export " + kTiny + " --format chakra-json --simulate --quiet --out " + out.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  const std::string text = read(out / "gpt-tiny-3d-8.0.json");
  CHECK(text.find("\"durationMicros\"") != std::string::npos);
  CHECK(text.find("\"COMM_COLL_NODE\"") != std::string::npos);
}

TEST_CASE("cli export: a bad format is bad input (exit 2)") {
  const TempDir tmp("cli");
  const fs::path out = tmp.subdir("export-bad");
  const auto r = run("export " + kTiny + " --format foo --out " + out.string());
  CHECK(r.status == 2);
  CHECK(r.output.find("--format foo: expected chakra or chakra-json") != std::string::npos);
  CHECK(fs::is_empty(out));
}

TEST_CASE("cli export: a new export to the same folder removes the rank files of the old one") {
  // Left behind, the old files would be read back with the new ones by `replay`.
  const TempDir tmp("cli");
  const fs::path out = tmp.subdir("export-chakra-replace");
  REQUIRE(run("export " + kTiny + " --quiet --out " + out.string()).status == 0);
  REQUIRE(fs::exists(out / "gpt-tiny-3d-8.5.et"));
  REQUIRE(run("export " + kTiny + " --format chakra-json --quiet --out " + out.string()).status ==
          0);
  for (int rank = 0; rank < 8; ++rank) {
    CHECK(!fs::exists(out / ("gpt-tiny-3d-8." + std::to_string(rank) + ".et")));
    CHECK(fs::exists(out / ("gpt-tiny-3d-8." + std::to_string(rank) + ".json")));
  }
  // Fewer ranks (tp 2 x pp 2 x dp 1 on 4 devices of one node): ranks 4-7 go.
  REQUIRE(run("export " + kTiny +
              " --dp 1 --set cluster.devices_per_node=4 --format chakra-json --quiet --out " +
              out.string())
              .status == 0);
  CHECK(fs::exists(out / "gpt-tiny-3d-8.3.json"));
  CHECK(!fs::exists(out / "gpt-tiny-3d-8.4.json"));
  CHECK(fs::exists(out / "gpt-tiny-3d-8.comm_groups.json"));
}

TEST_CASE("cli export: --order simulated needs --simulate and records the cluster") {
  const TempDir tmp("cli");
  const fs::path bad = tmp.subdir("export-order-bad");
  const auto r = run("export " + kTiny + " --order simulated --out " + bad.string());
  CHECK(r.status == 2);
  CHECK(r.output.find("--order simulated needs --simulate") != std::string::npos);
  const auto foo = run("export " + kTiny + " --order foo --out " + bad.string());
  CHECK(foo.status == 2);
  CHECK(foo.output.find("--order foo: expected stream or simulated") != std::string::npos);
  const fs::path out = tmp.subdir("export-order");
  const auto ok =
      run("export " + kTiny + " --format chakra-json --simulate --order simulated --quiet --out " +
          out.string());
  INFO(ok.output);
  REQUIRE(ok.status == 0);
  // The experiment's cluster (gpt-tiny-3d-8 names dgx-a100-1) is in the GlobalMetadata.
  CHECK(read(out / "gpt-tiny-3d-8.0.json").find("stratasim.cluster") != std::string::npos);
}
