#include "hw_models/cluster.hpp"

namespace stratasim::hw {

namespace {

LinkSpec read_link(config::ObjectReader r) {
  LinkSpec link;
  link.bandwidth = r.bandwidth("bandwidth");
  link.latency = r.time("latency");
  r.finish();
  return link;
}

}  // namespace

void ClusterSpec::validate() const {
  if (nodes <= 0) throw config::ValidationError("nodes", "expected at least 1 node");
  if (devices_per_node <= 0) {
    throw config::ValidationError("devices_per_node", "expected at least 1 device per node");
  }
  if (static_cast<long long>(nodes) * devices_per_node > (1LL << 24)) {
    throw config::ValidationError("nodes", "expected at most 16,777,216 devices in all");
  }
  if (!(intra_node.bandwidth.bytes_per_second() > 0)) {
    throw config::ValidationError("intra_node.bandwidth", "expected a positive bandwidth");
  }
  if (!(inter_node.bandwidth.bytes_per_second() > 0)) {
    throw config::ValidationError("inter_node.bandwidth", "expected a positive bandwidth");
  }
}

ClusterSpec read_cluster(config::Document& doc, const std::string& path) {
  doc.inline_reference(config::join_path(path, "device"));
  config::ObjectReader r(doc, path, "a cluster");
  ClusterSpec c;
  c.name = r.string("name");
  c.source = r.string_or("source", "");
  c.nodes = static_cast<int>(r.integer_in("nodes", 1, 1 << 24));
  c.devices_per_node = static_cast<int>(r.integer_in("devices_per_node", 1, 1 << 16));
  r.has("device");
  c.device = read_device(doc, r.path_of("device"));
  c.intra_node = read_link(r.object("intra_node", "the link figures inside a node"));
  c.inter_node = read_link(r.object("inter_node", "the link figures between nodes"));
  if (r.has("host")) {
    auto h = r.object("host", "the host side of a node");
    HostSpec host;
    auto memory = h.object("memory", "host memory");
    host.memory_capacity = memory.bytes("capacity");
    host.memory_bandwidth = memory.bandwidth("bandwidth");
    memory.finish();
    host.cores = static_cast<int>(h.integer_in("cores", 1, 1 << 20));
    host.adam_params_per_second_per_core =
        h.number_or("adam_params_per_second_per_core", host.adam_params_per_second_per_core);
    if (!(host.adam_params_per_second_per_core > 0)) {
      h.fail("adam_params_per_second_per_core", "expected a positive rate");
    }
    host.pcie = read_link(h.object("pcie", "the host-device link of each device"));
    h.finish();
    c.host = host;
  }
  if (r.has("nvme")) {
    auto n = r.object("nvme", "NVMe storage of a node");
    c.nvme = NvmeSpec{n.bytes("capacity"), n.bandwidth("bandwidth")};
    n.finish();
  }
  r.finish();
  doc.validated(path, [&] { c.validate(); });
  return c;
}

DeviceSpec load_device(const std::filesystem::path& file) {
  auto doc = config::Document::load(file);
  return read_device(doc, "");
}

ClusterSpec load_cluster(const std::filesystem::path& file) {
  auto doc = config::Document::load(file);
  return read_cluster(doc, "");
}

}  // namespace stratasim::hw
