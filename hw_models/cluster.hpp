// A cluster: identical nodes of identical devices, with one link figure inside a node
// (NVLink/NVSwitch) and one between nodes (the NIC each device uses). Bandwidths are per
// device and per direction. Richer topologies extend this without changing these fields.
#pragma once

#include <optional>
#include <string>

#include "hw_models/config_reader.hpp"
#include "hw_models/device.hpp"

namespace stratasim::hw {

struct LinkSpec {
  Bandwidth bandwidth;  // per device, per direction (bytes/s)
  Time latency;         // per message (alpha of the alpha-beta model)
};

/// A node's host side: CPU memory shared by the node's devices, the cores that run offloaded
/// optimizer steps, and the PCIe link each device has to it.
struct HostSpec {
  Bytes memory_capacity;                         // per node
  Bandwidth memory_bandwidth;                    // per node (bytes/s)
  int cores = 1;                                 // per node
  double adam_params_per_second_per_core = 8e7;  // CPU Adam (DeepSpeed's vectorised kernel)
  LinkSpec pcie;                                 // per device, per direction, host <-> device
};

/// A node's NVMe storage (ZeRO-Infinity), shared by its devices.
struct NvmeSpec {
  Bytes capacity;       // per node
  Bandwidth bandwidth;  // per node, read or write (bytes/s)
};

struct ClusterSpec {
  std::string name;
  std::string source;
  int nodes = 1;
  int devices_per_node = 8;
  DeviceSpec device;
  LinkSpec intra_node;
  LinkSpec inter_node;
  std::optional<HostSpec> host;  // absent: host memory is not modelled (no offload)
  std::optional<NvmeSpec> nvme;

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
