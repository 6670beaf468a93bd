// A GB200 NVL72 rack is one 72-GPU NVLink domain: an all-reduce over its 72 GPUs moves no byte
// through a NIC or the network, while one over two racks does. Run on the flow-level network,
// which routes every flow over the cluster's topology graph and counts the bytes per link.
#include <doctest/doctest.h>

#include <map>
#include <numeric>
#include <vector>

#include "hw_models/cluster.hpp"
#include "hw_models/topology.hpp"
#include "sim/flow_network.hpp"
#include "test_paths.hpp"

using namespace stratasim;

namespace {

struct LinkBytes {
  std::int64_t nvlink = 0;   // links with an NVSwitch at one end
  std::int64_t network = 0;  // links with a NIC or a network switch at one end
};

/// All-reduces `bytes` over the first `ranks` devices of `cluster` on the flow network; the
/// bytes each kind of link carried.
LinkBytes all_reduce_bytes(const hw::ClusterSpec& cluster, int ranks, Bytes bytes) {
  std::vector<std::int32_t> members(static_cast<std::size_t>(ranks));
  std::iota(members.begin(), members.end(), 0);
  strategies::Program program(cluster.world_size());
  program.add_group(members, "dp");
  sim::FlowNetwork net(cluster, hw::build_topology(cluster), program);
  sim::LinkUsage usage(net);
  net.set_observer(&usage);
  sim::TransferRequest r;
  r.collective = true;
  r.kind = strategies::CollectiveKind::all_reduce;
  r.group = 0;
  r.bytes = bytes;
  net.start(0, r, Time::zero());
  std::vector<sim::TransferId> finished;
  std::size_t done = 0;
  while (net.next_completion() != Time::infinity()) {
    finished.clear();
    net.advance_to(net.next_completion(), finished);
    done += finished.size();
  }
  REQUIRE(done == 1);
  const hw::Topology& t = net.topology();
  LinkBytes out;
  for (int l = 0; l < t.link_count(); ++l) {
    const auto from = t.kind(t.link(l).from), to = t.kind(t.link(l).to);
    const auto network = [](hw::VertexKind k) {
      return k == hw::VertexKind::nic || k == hw::VertexKind::network_switch;
    };
    if (network(from) || network(to)) {
      out.network += usage.bytes(l).count();
    } else if (from == hw::VertexKind::nvswitch || to == hw::VertexKind::nvswitch) {
      out.nvlink += usage.bytes(l).count();
    }
  }
  return out;
}

}  // namespace

TEST_CASE(
    "NVL72: an all-reduce over one rack stays on NVLink, over two racks it crosses the network") {
  // Two GB200 NVL72 racks (the shipped 8-rack cluster cut to 2): 144 GPUs, 72 per NVLink node.
  auto cluster = hw::load_cluster(testing::configs_dir() / "hardware/clusters/gb200-nvl72-8.json");
  REQUIRE(cluster.devices_per_node == 72);
  cluster.nodes = 2;
  const Bytes size(1LL << 30);
  // The 72 GPUs of rack 0: every flow goes device -> NVSwitch -> device; nothing reaches a NIC
  // (a ring moves 2 (n - 1) / n x 1 GiB out of each GPU, so the NVLink links carry bytes).
  const auto rack = all_reduce_bytes(cluster, 72, size);
  CHECK(rack.network == 0);
  CHECK(rack.nvlink > 0);
  // All 144: the ring (or tree) joins the racks through their NICs.
  const auto racks = all_reduce_bytes(cluster, 144, size);
  CHECK(racks.network > 0);
  CHECK(racks.nvlink > 0);
}
