// Device profiles, schema version 2: copy bandwidths and collectives measured within one node
// (reading, errors naming the JSON path, the round trip through to_json, version 1 files) and
// the interpolation of a collective's time between measured sizes.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "hw_models/cluster.hpp"
#include "hw_models/helpers.hpp"
#include "hw_models/profile.hpp"
#include "temp_dir.hpp"

using namespace stratasim;

namespace {

using testing::error_of;

constexpr std::size_t kAllReduce = 0;  // index of "all_reduce" in hw::kCollectiveKindNames
constexpr std::size_t kAllGather = 2;

nlohmann::json v2_json() {
  return nlohmann::json::parse(R"({
    "schema": "stratasim-device-profile", "schema_version": 2,
    "device": "test-gpu", "date": "2025-01-01", "source": "test",
    "kernel_launch_overhead": "3 us",
    "memory_bandwidth": "300 GB/s",
    "copy_bandwidth": {"host_to_device": "25 GB/s", "device_to_host": "24 GB/s"},
    "gemm": [{"m": 64, "n": 64, "k": 64, "dtype": "fp32", "time": "2 us"}],
    "collectives": [
      {"kind": "all_reduce", "ranks": 8, "bytes": "64 MiB", "time": "1.2 ms"},
      {"kind": "all_reduce", "ranks": 8, "bytes": "1 MiB", "time": "40 us"},
      {"kind": "all_gather", "ranks": 8, "bytes": "1 MiB", "time": "30 us"},
      {"kind": "all_reduce", "ranks": 4, "bytes": "1 MiB", "time": "25 us"}
    ]
  })");
}

hw::DeviceProfile read(const nlohmann::json& j) {
  auto doc = config::Document::from_json(j, "p.json");
  return hw::read_profile(doc, "");
}

config::ConfigError fails_at(const nlohmann::json& j) {
  return error_of([&] { read(j); });
}

}  // namespace

TEST_CASE("profile v2: copy bandwidths and measured collectives read") {
  const auto p = read(v2_json());
  CHECK(p.schema_version == 2);
  REQUIRE(p.host_to_device_bandwidth.has_value());
  CHECK(p.host_to_device_bandwidth->bytes_per_second() == doctest::Approx(25e9));
  CHECK(p.device_to_host_bandwidth->bytes_per_second() == doctest::Approx(24e9));
  REQUIRE(p.collectives.size() == 4);
  CHECK(p.collectives[0].kind == kAllReduce);
  CHECK(p.collectives[0].ranks == 8);
  CHECK(p.collectives[0].bytes == Bytes(64 << 20));
  CHECK(p.collectives[0].time == Time::us(1200));
  CHECK(p.collectives[2].kind == kAllGather);
  // Curves hold one kind and group size, sorted by bytes.
  const auto curve = p.collective_curve(kAllReduce, 8);
  REQUIRE(curve.size() == 2);
  CHECK(curve[0] == std::pair{Bytes(1 << 20), Time::us(40)});
  CHECK(curve[1] == std::pair{Bytes(64 << 20), Time::us(1200)});
  CHECK(p.collective_curve(kAllReduce, 4).size() == 1);
  CHECK(p.collective_curve(kAllGather, 4).empty());
  CHECK_FALSE(p.collective_time(kAllGather, 4, Bytes(1 << 20)).has_value());
  CHECK(p.collective_time(kAllGather, 8, Bytes(1 << 20)) == Time::us(30));

  // Each direction is optional; so is the whole section.
  auto j = v2_json();
  j["copy_bandwidth"].erase("device_to_host");
  const auto q = read(j);
  CHECK(q.host_to_device_bandwidth.has_value());
  CHECK_FALSE(q.device_to_host_bandwidth.has_value());
  j.erase("copy_bandwidth");
  j.erase("collectives");
  const auto r = read(j);
  CHECK_FALSE(r.host_to_device_bandwidth.has_value());
  CHECK(r.collectives.empty());
}

TEST_CASE("profile v2: a version 1 file still reads, without the keys version 2 added") {
  auto j = v2_json();
  j["schema_version"] = 1;
  j.erase("copy_bandwidth");
  j.erase("collectives");
  const auto p = read(j);
  CHECK(p.schema_version == 1);
  CHECK(p.gemm.size() == 1);

  j["collectives"] = v2_json()["collectives"];
  auto e = fails_at(j);
  CHECK(e.path() == "collectives");
  CHECK(e.message().find("added in schema version 2") != std::string::npos);
  j.erase("collectives");
  j["copy_bandwidth"] = v2_json()["copy_bandwidth"];
  CHECK(fails_at(j).path() == "copy_bandwidth");
}

TEST_CASE("profile v2: errors name the collective row and key") {
  auto j = v2_json();
  j["collectives"][2]["ranks"] = 1;
  CHECK(fails_at(j).path() == "collectives[2].ranks");
  j = v2_json();
  j["collectives"][1]["kind"] = "all-reduce";
  CHECK(fails_at(j).path() == "collectives[1].kind");
  j = v2_json();
  j["collectives"][0]["bytes"] = "0 B";
  CHECK(fails_at(j).path() == "collectives[0].bytes");
  j = v2_json();
  j["collectives"][3]["time"] = "0 us";
  CHECK(fails_at(j).path() == "collectives[3].time");
  j = v2_json();
  j["collectives"][3].erase("time");
  CHECK(fails_at(j).path() == "collectives[3].time");
  j = v2_json();
  j["collectives"][0]["algorithm"] = "ring";  // strict: unknown keys are errors
  CHECK(fails_at(j).path() == "collectives[0].algorithm");
  j = v2_json();
  j["collectives"] = "all_reduce";
  CHECK(fails_at(j).path() == "collectives");
  j = v2_json();
  j["collectives"].push_back(j["collectives"][1]);  // (kind, ranks, bytes) twice
  j["collectives"][4]["time"] = "41 us";
  auto ed = fails_at(j);
  CHECK(ed.path() == "collectives[4]");
  CHECK(ed.message().find("as collectives[1]") != std::string::npos);
  j = v2_json();
  j["copy_bandwidth"]["host_to_device"] = "0 GB/s";
  CHECK(fails_at(j).path() == "copy_bandwidth.host_to_device");
  j = v2_json();
  j["copy_bandwidth"]["host-to-device"] = "1 GB/s";
  CHECK(fails_at(j).path() == "copy_bandwidth.host-to-device");
}

TEST_CASE("profile v2: validate() names the JSON path of a bad field") {
  auto p = read(v2_json());
  p.collectives[2].ranks = 1;
  auto ranks = [&] {
    try {
      p.validate();
    } catch (const config::ValidationError& e) {
      return e.path();
    }
    return std::string("no error");
  };
  CHECK(ranks() == "collectives[2].ranks");
  p = read(v2_json());
  p.device_to_host_bandwidth = Bandwidth(0);
  CHECK(ranks() == "copy_bandwidth.device_to_host");
}

TEST_CASE("profile v2: to_json writes version 2, and read_profile reads it back exactly") {
  auto p = read(v2_json());
  p.collectives.push_back({5, 2, Bytes(12345), Time::ps(987654321)});  // all_to_all
  const testing::TempDir tmp("hw-models");
  const auto file = tmp.write("v2-roundtrip.json", "");
  hw::write_profile(p, file);
  const auto q = hw::load_profile(file);
  CHECK(q.schema_version == 2);
  CHECK(q.host_to_device_bandwidth == p.host_to_device_bandwidth);
  CHECK(q.device_to_host_bandwidth == p.device_to_host_bandwidth);
  REQUIRE(q.collectives.size() == p.collectives.size());
  for (std::size_t i = 0; i < p.collectives.size(); ++i) {
    CHECK(q.collectives[i].kind == p.collectives[i].kind);
    CHECK(q.collectives[i].ranks == p.collectives[i].ranks);
    CHECK(q.collectives[i].bytes == p.collectives[i].bytes);  // exact: written in bytes
    CHECK(q.collectives[i].time == p.collectives[i].time);    // exact: in picoseconds
  }
  CHECK(hw::to_json(q)["collectives"][4]["kind"] == "all_to_all");

  // A version 1 profile is written as version 2.
  auto j = v2_json();
  j["schema_version"] = 1;
  j.erase("copy_bandwidth");
  j.erase("collectives");
  const auto out = hw::to_json(read(j));
  CHECK(out["schema_version"] == 2);
  CHECK_FALSE(out.contains("collectives"));
  CHECK_FALSE(out.contains("copy_bandwidth"));
  CHECK(read(out).schema_version == 2);
}

TEST_CASE("profile v2: a collective's time between, below and above the measured sizes") {
  // Points (1 MiB, 40 us) and (64 MiB, 1200 us).
  const hw::CollectiveCurve curve = {{Bytes(1 << 20), Time::us(40)},
                                     {Bytes(64 << 20), Time::us(1200)}};
  // At a measured size: its time.
  CHECK(hw::interpolate_collective(curve, Bytes(1 << 20)) == Time::us(40));
  CHECK(hw::interpolate_collective(curve, Bytes(64 << 20)) == Time::us(1200));
  // 8 MiB is 3 of the 6 binary orders of magnitude between them: linear in ln S gives
  // 40 + (1200 - 40) * ln(8) / ln(64) = 40 + 1160 / 2 = 620 us.
  CHECK(hw::interpolate_collective(curve, Bytes(8 << 20)) == Time::us(620));
  // 2 MiB: 40 + 1160 * ln 2 / ln 64 = 40 + 1160 / 6 = 233.333... us, to the picosecond.
  CHECK(hw::interpolate_collective(curve, Bytes(2 << 20)) == Time::ps(233'333'333));
  // Below the smallest: its time, a floor.
  CHECK(hw::interpolate_collective(curve, Bytes(4096)) == Time::us(40));
  CHECK(hw::interpolate_collective(curve, Bytes(0)) == Time::us(40));
  // Above the largest: at its bandwidth, 1200 us * 256 MiB / 64 MiB = 4800 us.
  CHECK(hw::interpolate_collective(curve, Bytes(256 << 20)) == Time::us(4800));
  // One point: the floor below, its bandwidth above.
  const hw::CollectiveCurve one = {{Bytes(1000), Time::us(10)}};
  CHECK(hw::interpolate_collective(one, Bytes(10)) == Time::us(10));
  CHECK(hw::interpolate_collective(one, Bytes(3000)) == Time::us(30));
  CHECK_THROWS_AS(hw::interpolate_collective({}, Bytes(1)), std::invalid_argument);
}
