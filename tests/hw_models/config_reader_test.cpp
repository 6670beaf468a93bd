#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "hw_models/cluster.hpp"
#include "hw_models/config_reader.hpp"
#include "hw_models/helpers.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using config::ConfigError;

using testing::error_of;
using testing::TempDir;

TEST_CASE("unknown keys are errors with a suggestion") {
  auto doc =
      config::Document::from_json(nlohmann::json{{"name", "x"}, {"layres", 3}}, "model.json");
  config::ObjectReader r(doc, "");
  r.string("name");
  r.integer_or("layers", 1);
  auto e = error_of([&] { r.finish(); });
  CHECK(e.source() == "model.json");
  CHECK(e.path() == "layres");
  CHECK(std::string(e.what()).find("did you mean 'layers'") != std::string::npos);
}

TEST_CASE("wrong types and out-of-range values name the path") {
  auto doc = config::Document::from_json(
      nlohmann::json{{"a", {{"b", "three"}}}, {"c", 0}, {"bw", 900}}, "x.json");
  config::ObjectReader r(doc, "");
  auto inner = r.object("a");
  auto e1 = error_of([&] { inner.integer("b"); });
  CHECK(e1.path() == "a.b");
  CHECK(e1.message().find("expected an integer") != std::string::npos);
  auto e2 = error_of([&] { r.integer_in("c", 1, 10); });
  CHECK(e2.path() == "c");
  auto e3 = error_of([&] { r.bandwidth("bw"); });
  CHECK(e3.message().find("such as \"900 GB/s\"") != std::string::npos);
  auto e4 = error_of([&] { r.integer("missing"); });
  CHECK(e4.message().find("missing required key") != std::string::npos);
}

TEST_CASE("malformed JSON reports the line and column") {
  const TempDir tmp("hw-models");
  auto path = tmp.write("bad.json", "{\n  \"name\": \"x\",\n  \"nodes\": ,\n}\n");
  auto e = error_of([&] { config::Document::load(path); });
  CHECK(e.source() == path.string());
  CHECK(e.message().find("malformed JSON at line 3") != std::string::npos);
}

TEST_CASE("a number too large for a double is a config error, not a crash") {
  // 1e400 is valid JSON syntax but overflows a double: nlohmann throws out_of_range, which the
  // reader must turn into a ConfigError naming the file (found by fuzzing).
  const TempDir tmp("hw-models");
  auto path = tmp.write("huge.json", "{\"nodes\": 1e400}\n");
  auto e = error_of([&] { config::Document::load(path); });
  CHECK(e.source() == path.string());
  CHECK(e.message().find("unreadable JSON") != std::string::npos);
}

TEST_CASE("integers of 2^63 and above are reported as written, not wrapped to negative") {
  // 18446744073709551608 = 2^64 - 8; read as int64 it would be -8.
  auto doc =
      config::Document::from_json(nlohmann::json{{"tp", std::uint64_t{18446744073709551608ULL}},
                                                 {"big", std::uint64_t{9223372036854775808ULL}},
                                                 {"ok", std::uint64_t{7}}},
                                  "x.json");
  config::ObjectReader r(doc, "");
  auto e1 = error_of([&] { r.integer_in("tp", 1, 64); });
  CHECK(e1.path() == "tp");
  CHECK(e1.message() == "expected an integer from 1 to 64, got 18446744073709551608");
  auto e2 = error_of([&] { r.integer("big"); });  // 2^63
  CHECK(e2.message() == "expected an integer below 2^63, got 9223372036854775808");
  CHECK(r.integer_in("ok", 1, 64) == 7);
}

TEST_CASE("JSON nested deeper than 512 levels is a config error, not a stack overflow") {
  const TempDir tmp("hw-models");
  auto path =
      tmp.write("deep.json", "{\"a\": " + std::string(60000, '[') + std::string(60000, ']') + "}");
  auto e = error_of([&] { config::Document::load(path); });
  CHECK(e.source() == path.string());
  CHECK(e.message() == "JSON nested deeper than 512 levels");
  // 500 levels is fine.
  auto ok = tmp.write("ok.json", "{\"a\": " + std::string(500, '[') + std::string(500, ']') + "}");
  CHECK_NOTHROW(config::Document::load(ok));
}

TEST_CASE("a value in an error message is cut after 80 characters") {
  auto doc = config::Document::from_json(nlohmann::json{{"n", std::string(100000, 'x')}}, "x.json");
  config::ObjectReader r(doc, "");
  auto e = error_of([&] { r.integer("n"); });
  CHECK(e.message().size() < 200);
  CHECK(e.message().find("...") != std::string::npos);
}

TEST_CASE(
    "a directory, a FIFO or /dev/zero as a config is an error, not malformed JSON or a hang") {
  const TempDir tmp("hw-models");
  const auto dir = tmp.subdir("a-folder");
  auto e1 = error_of([&] { config::Document::load(dir); });
  CHECK(e1.source() == dir.string());
  CHECK(e1.message() == "is a directory; expected a JSON file");
  const auto fifo = tmp.path() / "fifo.json";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);  // opening it for reading would block forever
  auto e2 = error_of([&] { config::Document::load(fifo); });
  CHECK(e2.message().find("not a regular file") != std::string::npos);
  auto e3 = error_of([&] { config::Document::load("/dev/zero"); });  // endless
  CHECK(e3.message().find("not a regular file") != std::string::npos);
}

TEST_CASE("a missing file is an error naming it") {
  auto e = error_of([] { config::Document::load("/nonexistent/stratasim/x.json"); });
  CHECK(e.source() == "/nonexistent/stratasim/x.json");
  CHECK(e.message() == "no such file");
}

TEST_CASE("errors inside an inlined file name that file and the path within it") {
  const TempDir tmp("hw-models");
  auto device = tmp.write("dev.json", R"({"name": "d", "kind": "gpu",
    "peak_flops": {"bf16": "100 TFLOP/s"}, "memory": {"capacity": "lots", "bandwidth": "1 TB/s"}})");
  auto cluster = tmp.write("cl.json", R"({"name": "c", "nodes": 1, "devices_per_node": 2,
    "device": "dev.json", "intra_node": {"bandwidth": "100 GB/s", "latency": "1 us"},
    "inter_node": {"bandwidth": "10 GB/s", "latency": "5 us"}})");
  auto e = error_of([&] { hw::load_cluster(cluster); });
  CHECK(e.source() == device.string());
  CHECK(e.path() == "memory.capacity");
}

TEST_CASE("overrides are reported as coming from the command line") {
  auto doc = config::Document::from_json(nlohmann::json{{"p", {{"tp", 2}}}}, "e.json");
  doc.set("p.tp", "eight", "command line (--tp eight)");
  config::ObjectReader r(doc, "p");
  auto e = error_of([&] { r.integer("tp"); });
  CHECK(e.source() == "command line (--tp eight)");
  doc.set("p.tp", nullptr, "removed");
  CHECK(doc.find("p.tp") == nullptr);
  CHECK(config::parse_override_value("4") == nlohmann::json(4));
  CHECK(config::parse_override_value("400 Gb/s") == nlohmann::json("400 Gb/s"));
}

TEST_CASE("every shipped device and cluster loads and matches its datasheet figures") {
  // hw-peaks in ../shared/reference/published.json: A100 312 TFLOP/s dense bf16 and 2.039 TB/s
  // (80 GB); H100 SXM5 989.4 TFLOP/s and 3.35 TB/s.
  auto a100 = hw::load_device(testing::configs_dir() / "hardware/devices/a100-sxm4-80gb.json");
  CHECK(a100.peak(DType::bf16).flops_per_second() == doctest::Approx(312e12));
  CHECK(a100.memory_bandwidth.bytes_per_second() == doctest::Approx(2.039e12));
  auto h100 = hw::load_device(testing::configs_dir() / "hardware/devices/h100-sxm5-80gb.json");
  CHECK(h100.peak(DType::bf16).flops_per_second() == doctest::Approx(989.4e12));
  CHECK(h100.memory_bandwidth.bytes_per_second() == doctest::Approx(3.35e12));
  int clusters = 0;
  for (const auto& f :
       std::filesystem::directory_iterator(testing::configs_dir() / "hardware/clusters")) {
    CAPTURE(f.path());
    auto c = hw::load_cluster(f.path());
    CHECK(c.world_size() > 0);
    ++clusters;
  }
  CHECK(clusters >= 10);
  // DGX A100: 8 x 200 Gb/s HDR, one per GPU = 25 GB/s per device.
  auto pod = hw::load_cluster(testing::configs_dir() / "hardware/clusters/dgx-a100-128.json");
  CHECK(pod.world_size() == 1024);
  CHECK(pod.inter_node.bandwidth.bytes_per_second() == doctest::Approx(25e9));
}
