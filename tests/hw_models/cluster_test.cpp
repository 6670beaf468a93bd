// The cluster config's optional sections: topology, network model, collectives and per-device
// overrides (heterogeneous devices, stragglers, degraded links).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "hw_models/cluster.hpp"
#include "hw_models/config_reader.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using config::ConfigError;

namespace {

nlohmann::json base_cluster() {
  nlohmann::json device = {{"name", "gpu-a"},
                           {"kind", "gpu"},
                           {"peak_flops", {{"bf16", "100 TFLOP/s"}}},
                           {"memory", {{"capacity", "40 GiB"}, {"bandwidth", "1 TB/s"}}}};
  return {{"name", "test"},
          {"nodes", 2},
          {"devices_per_node", 4},
          {"device", device},
          {"intra_node", {{"bandwidth", "100 GB/s"}, {"latency", "1 us"}}},
          {"inter_node", {{"bandwidth", "10 GB/s"}, {"latency", "5 us"}}}};
}

hw::ClusterSpec read(const nlohmann::json& j) {
  auto doc = config::Document::from_json(j, "cluster.json");
  return hw::read_cluster(doc, "");
}

std::string error_path(const nlohmann::json& j) {
  try {
    read(j);
  } catch (const ConfigError& e) {
    return e.path();
  }
  FAIL("expected a ConfigError");
  return "";
}

}  // namespace

TEST_CASE("a cluster without the new sections keeps the spine's two-level form") {
  const auto c = read(base_cluster());
  CHECK_FALSE(c.topology.has_value());
  CHECK(c.network_model == hw::NetworkModel::analytical);
  CHECK(c.collectives.protocol_efficiency == 1.0);
  CHECK(c.homogeneous());
  for (int r = 0; r < c.world_size(); ++r) {
    CHECK(c.device_of(r).name == "gpu-a");
    CHECK(c.slowdown_of(r) == 1.0);
    CHECK(c.inter_link_of(r).bandwidth.bytes_per_second() == doctest::Approx(10e9));
  }
}

TEST_CASE("network model, collective settings and topology are read") {
  auto j = base_cluster();
  j["network_model"] = "flow";
  j["collectives"] = {{"protocol_efficiency", 0.82},
                      {"algorithm", {{"all_reduce", "tree"}, {"all_to_all", "direct"}}}};
  j["topology"] = {{"kind", "fat_tree"}, {"nodes_per_rack", 1}, {"oversubscription", 2.0}};
  const auto c = read(j);
  CHECK(c.network_model == hw::NetworkModel::flow);
  CHECK(c.collectives.protocol_efficiency == doctest::Approx(0.82));
  CHECK(c.collectives.algorithm[0] == hw::CollectiveAlgorithm::tree);    // all_reduce
  CHECK(c.collectives.algorithm[5] == hw::CollectiveAlgorithm::direct);  // all_to_all
  CHECK(c.collectives.algorithm[1] == hw::CollectiveAlgorithm::automatic);
  REQUIRE(c.topology.has_value());
  CHECK(c.topology->kind == hw::TopologyKind::fat_tree);
  CHECK(c.topology->oversubscription == 2.0);
}

TEST_CASE("bad network sections name their JSON path") {
  auto j = base_cluster();
  j["network_model"] = "packet";
  CHECK(error_path(j) == "network_model");
  j = base_cluster();
  j["collectives"] = {{"protocol_efficiency", 1.5}};
  CHECK(error_path(j) == "collectives.protocol_efficiency");
  j = base_cluster();
  j["collectives"] = {{"algorithm", {{"all_reduce", "butterfly"}}}};
  CHECK(error_path(j) == "collectives.algorithm.all_reduce");
  j = base_cluster();
  j["collectives"] = {{"algorithm", {{"allreduce", "ring"}}}};
  CHECK(error_path(j) == "collectives.algorithm.allreduce");
  j = base_cluster();
  j["topology"] = {{"kind", "torus"}, {"dims", {3, 3}}};  // 9 devices, the cluster has 8
  CHECK(error_path(j).rfind("topology", 0) == 0);
}

TEST_CASE("per-device overrides: another device, a straggler, a degraded NIC") {
  auto j = base_cluster();
  auto other = j["device"];
  other["name"] = "gpu-b";
  other["memory"]["capacity"] = "80 GiB";
  j["overrides"] = nlohmann::json::array(
      {{{"ranks", "4-7"}, {"device", other}},
       {{"ranks", nlohmann::json::array({1})}, {"slowdown", 1.5}},
       {{"ranks", "2,6"}, {"inter_node", {{"bandwidth", "5 GB/s"}, {"latency", "10 us"}}}}});
  const auto c = read(j);
  CHECK_FALSE(c.homogeneous());
  CHECK(c.device_of(0).name == "gpu-a");
  CHECK(c.device_of(5).name == "gpu-b");
  CHECK(c.device_of(5).memory_capacity == Bytes(80LL << 30));
  CHECK(c.slowdown_of(1) == 1.5);
  CHECK(c.slowdown_of(0) == 1.0);
  CHECK(c.inter_link_of(6).bandwidth.bytes_per_second() == doctest::Approx(5e9));
  CHECK(c.inter_link_of(6).latency == Time::us(10));
  CHECK(c.inter_link_of(7).bandwidth.bytes_per_second() == doctest::Approx(10e9));
  CHECK(c.intra_link_of(6).bandwidth.bytes_per_second() == doctest::Approx(100e9));
}

TEST_CASE("bad overrides name the entry and key") {
  auto j = base_cluster();
  j["overrides"] = nlohmann::json::array({{{"ranks", "0-8"}}});  // 8 devices: 0-7
  CHECK(error_path(j) == "overrides.0.ranks");
  j["overrides"] = nlohmann::json::array({{{"ranks", "x"}}});
  CHECK(error_path(j) == "overrides.0.ranks");
  j["overrides"] = nlohmann::json::array({{{"ranks", "1"}, {"slowdown", 0}}});
  CHECK(error_path(j) == "overrides.0.slowdown");
  j["overrides"] = nlohmann::json::array({{{"ranks", "1"}, {"slow", 2}}});
  CHECK(error_path(j) == "overrides.0.slow");
  j["overrides"] = {{"ranks", "1"}};
  CHECK(error_path(j) == "overrides");
}

TEST_CASE("interference: defaults, the figures read, bad values named by their path") {
  const auto plain = read(base_cluster());
  CHECK(plain.interference.enabled);
  CHECK(plain.interference.communication_units == 16);
  CHECK(plain.interference.memory_traffic_per_byte == 3.0);
  auto j = base_cluster();
  j["interference"] = {
      {"enabled", false}, {"communication_units", 24}, {"memory_traffic_per_byte", 2.5}};
  const auto c = read(j);
  CHECK_FALSE(c.interference.enabled);
  CHECK(c.interference.communication_units == 24);
  CHECK(c.interference.memory_traffic_per_byte == 2.5);
  j["interference"] = {{"communication_units", -1}};
  CHECK(error_path(j) == "interference.communication_units");
  j["interference"] = {{"memory_traffic_per_byte", -0.5}};
  CHECK(error_path(j) == "interference.memory_traffic_per_byte");
  j["interference"] = {{"communication_unit", 8}};  // a typo: unknown key
  CHECK(error_path(j) == "interference.communication_unit");
  j["interference"] = 3;
  CHECK(error_path(j) == "interference");
}

TEST_CASE("channel limits and flow transfers: read, defaults, bad values by their path") {
  const auto plain = read(base_cluster());
  CHECK(plain.collectives.max_channels == 0);
  CHECK_FALSE(plain.interference.flow_transfers);
  CHECK(hw::communication_units(plain) == 16);
  auto j = base_cluster();
  j["collectives"] = {{"max_channels", 4}};
  j["interference"] = {{"flow_transfers", true}, {"communication_units", 24}};
  const auto c = read(j);
  CHECK(c.collectives.max_channels == 4);
  CHECK(c.interference.flow_transfers);
  CHECK(hw::communication_units(c) == 4);  // min(24, 4)
  j["collectives"] = {{"max_channels", -1}};
  CHECK(error_path(j) == "collectives.max_channels");
  j["collectives"] = {{"max_channel", 4}};  // a typo: unknown key
  CHECK(error_path(j) == "collectives.max_channel");
  j["collectives"] = nlohmann::json::object();
  j["interference"] = {{"flow_transfers", "yes"}};
  CHECK(error_path(j) == "interference.flow_transfers");
}

namespace {

nlohmann::json nvlink_fabric() {
  return {{"name", "nvlink"},
          {"step_latency", {{"LL", "0.6 us"}, {"LL128", "1.9 us"}, {"Simple", "3.4 us"}}},
          {"efficiency", 0.8},
          {"channels", 32},
          {"channel_busbw", "40 GB/s"},
          {"ll_max_busbw", "141 GB/s"},
          {"ll128_channel_busbw", "36.7 GB/s"},
          {"nvls", {{"efficiency", 0.68}, {"latency", "25 us"}}}};
}
nlohmann::json net_fabric() {
  return {{"name", "net"},
          {"step_latency", {{"LL", "2.7 us"}, {"LL128", "4 us"}, {"Simple", "14 us"}}},
          {"efficiency", 0.9},
          {"ll128", false}};
}

}  // namespace

TEST_CASE("the NCCL model's fabrics are read, and bad ones name their JSON path") {
  auto j = base_cluster();
  j["collectives"] = {{"intra_fabric", nvlink_fabric()}, {"network_fabric", net_fabric()}};
  const auto c = read(j);
  REQUIRE(c.collectives.nccl);
  CHECK(c.collectives.nccl->intra.step_latency[2].seconds() == doctest::Approx(3.4e-6));
  CHECK(c.collectives.nccl->intra.nvls_efficiency == doctest::Approx(0.68));
  CHECK(c.collectives.nccl->intra.p2p_efficiency == doctest::Approx(0.8));  // efficiency's
  CHECK_FALSE(c.collectives.nccl->network.ll128);
  // Both fabrics or neither.
  j = base_cluster();
  j["collectives"] = {{"intra_fabric", nvlink_fabric()}};
  CHECK(error_path(j) == "collectives.network_fabric");
  // An efficiency beyond 1.
  j = base_cluster();
  auto bad = nvlink_fabric();
  bad["efficiency"] = 1.5;
  j["collectives"] = {{"intra_fabric", bad}, {"network_fabric", net_fabric()}};
  CHECK(error_path(j) == "collectives.intra_fabric.efficiency");
  // A latency without a unit, an unknown key, a protocol missing.
  bad = nvlink_fabric();
  bad["nvls"]["latency"] = 25;
  j["collectives"] = {{"intra_fabric", bad}, {"network_fabric", net_fabric()}};
  CHECK(error_path(j) == "collectives.intra_fabric.nvls.latency");
  bad = nvlink_fabric();
  bad["efficency"] = 0.8;
  j["collectives"] = {{"intra_fabric", bad}, {"network_fabric", net_fabric()}};
  CHECK(error_path(j) == "collectives.intra_fabric.efficency");
  auto net = net_fabric();
  net["step_latency"].erase("LL128");
  j["collectives"] = {{"intra_fabric", nvlink_fabric()}, {"network_fabric", net}};
  CHECK(error_path(j) == "collectives.network_fabric.step_latency.LL128");
  // CollNet, PAT, LL and the p2p channel rate: defaults (no CollNet, PAT and LL on, no p2p
  // channel limit), then read; a CollNet efficiency beyond 1 and a bare latency are named.
  CHECK(c.collectives.nccl->network.collnet_efficiency == 0);
  CHECK(c.collectives.nccl->network.pat);
  CHECK(c.collectives.nccl->network.ll);
  CHECK(c.collectives.nccl->intra.p2p_channel_bandwidth.bytes_per_second() == 0);
  net = net_fabric();
  net["collnet"] = {{"efficiency", 0.9}, {"latency", "35 us"}};
  net["pat"] = false;
  net["ll"] = false;
  auto in = nvlink_fabric();
  in["p2p_channel_bandwidth"] = "13.9 GB/s";
  j["collectives"] = {{"intra_fabric", in}, {"network_fabric", net}};
  const auto with = read(j);
  CHECK(with.collectives.nccl->network.collnet_efficiency == doctest::Approx(0.9));
  CHECK(with.collectives.nccl->network.collnet_latency.seconds() == doctest::Approx(35e-6));
  CHECK_FALSE(with.collectives.nccl->network.pat);
  CHECK_FALSE(with.collectives.nccl->network.ll);
  CHECK(with.collectives.nccl->intra.p2p_channel_bandwidth.bytes_per_second() ==
        doctest::Approx(13.9e9));
  net["collnet"]["efficiency"] = 1.2;
  j["collectives"] = {{"intra_fabric", nvlink_fabric()}, {"network_fabric", net}};
  CHECK(error_path(j) == "collectives.network_fabric.collnet.efficiency");
  net["collnet"] = {{"efficiency", 0.9}, {"latency", 35}};
  j["collectives"] = {{"intra_fabric", nvlink_fabric()}, {"network_fabric", net}};
  CHECK(error_path(j) == "collectives.network_fabric.collnet.latency");
  // NVLS's chunk model: absent, none; channels with a loop latency read; channels alone name
  // the missing loop_latency, channels out of 1-64 name themselves.
  CHECK(c.collectives.nccl->intra.nvls_channels == 0);
  in = nvlink_fabric();
  in["nvls"]["channels"] = 24;
  in["nvls"]["loop_latency"] = "7.5 us";
  j["collectives"] = {{"intra_fabric", in}, {"network_fabric", net_fabric()}};
  const auto chunked = read(j);
  CHECK(chunked.collectives.nccl->intra.nvls_channels == 24);
  CHECK(chunked.collectives.nccl->intra.nvls_loop_latency.seconds() == doctest::Approx(7.5e-6));
  in["nvls"].erase("loop_latency");
  j["collectives"] = {{"intra_fabric", in}, {"network_fabric", net_fabric()}};
  CHECK(error_path(j) == "collectives.intra_fabric.nvls.loop_latency");
  in["nvls"]["loop_latency"] = "7.5 us";
  in["nvls"]["channels"] = 0;
  j["collectives"] = {{"intra_fabric", in}, {"network_fabric", net_fabric()}};
  CHECK(error_path(j) == "collectives.intra_fabric.nvls.channels");
  // The new algorithms by name.
  j["collectives"] = {{"intra_fabric", nvlink_fabric()},
                      {"network_fabric", net_fabric()},
                      {"algorithm", {{"all_reduce", "collnet_direct"}, {"all_gather", "pat"}}}};
  const auto fixed = read(j);
  CHECK(fixed.collectives.algorithm[0] == hw::CollectiveAlgorithm::collnet_direct);
  CHECK(fixed.collectives.algorithm[2] == hw::CollectiveAlgorithm::pat);
  // The alpha-beta model's protocol efficiency beside the NCCL model's own.
  j["collectives"] = {{"intra_fabric", nvlink_fabric()},
                      {"network_fabric", net_fabric()},
                      {"protocol_efficiency", 0.8}};
  CHECK(error_path(j) == "collectives.protocol_efficiency");
}
