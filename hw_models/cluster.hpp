// A cluster: identical nodes of identical devices, with one link figure inside a node
// (NVLink/NVSwitch) and one between nodes (the NIC each device uses). Bandwidths are per
// device and per direction. Richer topologies extend this without changing these fields.
#pragma once

#include <string>

#include "hw_models/config_reader.hpp"
#include "hw_models/device.hpp"

namespace stratasim::hw {

struct LinkSpec {
  Bandwidth bandwidth;  // per device, per direction (bytes/s)
  Time latency;         // per message (alpha of the alpha-beta model)
};

struct ClusterSpec {
  std::string name;
  std::string source;
  int nodes = 1;
  int devices_per_node = 8;
  DeviceSpec device;
  LinkSpec intra_node;
  LinkSpec inter_node;

  /// Checks ranges; throws config::ValidationError with the offending key's path.
  void validate() const;

  int world_size() const { return nodes * devices_per_node; }
  /// Devices are numbered node by node: rank r lives on node r / devices_per_node.
  int node_of(int rank) const { return rank / devices_per_node; }
};

/// Reads a cluster from the object at `path` of `doc`; a string "device" names a device file
/// relative to the cluster's file and is inlined first.
ClusterSpec read_cluster(config::Document& doc, const std::string& path);

/// Loads a device or cluster file on its own.
DeviceSpec load_device(const std::filesystem::path& file);
ClusterSpec load_cluster(const std::filesystem::path& file);

}  // namespace stratasim::hw
