// A cluster: nodes of devices, with one link figure inside a node (NVLink/NVSwitch) and one
// between nodes (the NIC each device uses). Bandwidths are per device and per direction.
// Optional sections refine it: `topology` (how the links connect, hw_models/topology.hpp),
// `network_model` (analytical or flow-level), `collectives` (algorithms and protocol
// efficiency), `interference` (what overlapping communication and compute cost each other) and
// `overrides` (devices of another type, stragglers, degraded links).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "hw_models/device.hpp"
#include "hw_models/interference.hpp"
#include "hw_models/topology.hpp"

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

/// How the network is simulated: alpha-beta formulas per collective algorithm with no
/// contention, or flows over the topology's links sharing bandwidth max-min fairly.
enum class NetworkModel : std::uint8_t { analytical, flow };
std::string_view name_of(NetworkModel m);

/// How the flow-level network uses the symmetry of data-parallel replicas (`flow_symmetry`,
/// docs/network.md "Symmetry"): `off` simulates every replica with per-transfer ECMP keys (as
/// before it existed); `auto` simulates one replica for all where the symmetry provably holds
/// (the others' flows enter max-min sharing as weighted copies) and every replica otherwise;
/// `symmetric_routes` simulates every replica with the routes the reduced run gives them (each
/// replica's flows the shifted image of replica 0's), the unreduced run `auto` is exact against.
enum class FlowSymmetry : std::uint8_t { off, automatic, symmetric_routes };
std::string_view name_of(FlowSymmetry m);

/// How the flow-level network spreads a flow over equal-cost paths (`load_balancing`,
/// docs/priorities.md): `ecmp` (default) hashes each flow onto one path; `spray` splits its
/// bytes evenly over every equal-cost path (per-packet spraying, as DLCP balances load), each
/// path a sub-flow of max-min sharing. The analytical network has no paths and ignores it.
enum class LoadBalancing : std::uint8_t { ecmp, spray };
std::string_view name_of(LoadBalancing m);

/// Collective algorithms (sim/collectives.hpp says what each one sends). `automatic` lets a
/// rule like NCCL's choose per collective from its size and group.
enum class CollectiveAlgorithm : std::uint8_t {
  automatic,
  ring,
  tree,              // double binary tree
  halving_doubling,  // recursive halving-doubling
  direct,            // every rank to every rank at once (all-to-all's natural form)
  hierarchical,      // intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather
  nvls,              // NVLink SHARP: the NVSwitch reduces
  // NCCL-model only (sim/nccl_model.hpp); the alpha-beta schedules run them as their nearest
  // schedule (collnet: hierarchical, pat: ring):
  collnet_direct,  // CollNet (SHARP in-network reduction), every GPU to its node's NICs
  collnet_chain,   // CollNet through a chain inside each node
  pat,             // PAT (NCCL 2.23+ Parallel Aggregated Trees), one GPU per node
};
std::string_view name_of(CollectiveAlgorithm a);
std::optional<CollectiveAlgorithm> collective_algorithm_from_name(std::string_view name);

/// Collective kinds by their config names, in strategies::CollectiveKind order.
inline constexpr std::string_view kCollectiveKindNames[] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"};

/// NCCL's protocols: LL (8-byte stores of 4 data bytes and a flag: half the bandwidth, the
/// lowest latency), LL128 (128-byte lines of 120 data bytes), Simple (bulk copies, the full
/// bandwidth, the highest latency). Index order of NcclFabric::step_latency.
enum class NcclProtocol : std::uint8_t { ll, ll128, simple };
inline constexpr std::string_view kNcclProtocolNames[] = {"LL", "LL128", "Simple"};
std::string_view name_of(NcclProtocol p);

/// One fabric's collective figures as NCCL's tuner (src/graph/tuning.cc) structures them:
/// an intra-node fabric (NVLink and its switch, a property of the device generation) or a
/// network fabric (the NICs and what lies between nodes). sim/nccl_model.hpp combines them;
/// docs/network.md explains each figure. Read from the cluster's `collectives.intra_fabric` /
/// `collectives.network_fabric` (an object or a file under configs/hardware/nccl/; the fitted
/// ones are written there by `stratasim fit --collectives`, study/collective_fit.hpp).
struct NcclFabric {
  std::string name;
  std::string source;
  /// The calibration cases (tests/reference/calibration.json ids) the fitted fields came from;
  /// empty: nothing here is fitted.
  std::vector<std::string> fitted_to;
  /// Latency per pipeline step of each protocol (LL, LL128, Simple): NCCL's hwLat for NVLink,
  /// or for the network its NET hwLat plus the fabric's own hop latency (Simple pays the hop
  /// twice: its flush).
  std::array<Time, 3> step_latency{};
  /// The Simple ring's bus bandwidth over the link's line rate per direction (the device's
  /// intra_node bandwidth, or the NIC's inter_node bandwidth times the devices of a node). (0, 1].
  double efficiency = 1;
  /// Point-to-point (send/recv) bandwidth over the link's line rate. (0, 1].
  double p2p_efficiency = 1;
  /// LL's bus bandwidth ceiling (NCCL llMaxBws): the intra fabric's within a node; a network
  /// fabric's (optional, zero: none) also applies to collectives spanning nodes.
  Bandwidth ll_max_busbw;
  /// Network fabrics: whether NCCL runs LL128 across this network (it enables LL128 only over
  /// paths it trusts to keep 128-byte stores in order).
  bool ll128 = true;
  /// Network fabrics: whether NCCL runs LL across this network (aws-ofi-nccl sets
  /// NCCL_PROTO=simple where EFA cannot deliver 128-byte writes in order: then neither runs).
  bool ll = true;
  /// Network fabrics: whether NCCL may run PAT (NCCL_PAT_ENABLE; off where the network offloads
  /// to the device). PAT applies only to groups of one GPU per node.
  bool pat = true;
  /// Network fabrics: CollNet (SHARP: the switches reduce; NCCL_COLLNET_ENABLE=1 with the SHARP
  /// plugin). collnet_efficiency: the reduction's rate over the NICs' line rate; 0: no CollNet.
  /// collnet_latency: the network part of one CollNet all-reduce (NCCL's NET hwLat for CollNet,
  /// 30-31 us, plus the fabric's hop, twice for Simple's flush).
  double collnet_efficiency = 0;
  Time collnet_latency;
  // Intra-node fabrics only (a network fabric leaves them unset):
  int channels = 0;               // NCCL channels (rings) a collective spreads over, >= 1
  Bandwidth ll128_channel_busbw;  // LL128's ceiling per channel (NCCL perChMaxRingLL128Bws)
  /// One channel's Simple bus bandwidth (one SM's copy rate; LL128 0.92, LL 1/2 of it): what
  /// limits a message too small to use every channel. Zero: no limit.
  Bandwidth channel_busbw;
  /// One point-to-point channel's rate per direction (a channel's warps split between the send
  /// and the receive it carries): what limits a send/recv that NCCL spreads over few channels
  /// (sim/nccl_model.hpp, nccl_p2p_channels). Zero: no limit.
  Bandwidth p2p_channel_bandwidth;
  /// NVLink SHARP: the switch's reduction rate over the link's line rate; 0: it does not reduce.
  double nvls_efficiency = 0;
  Time nvls_latency;  // NVLS's whole latency (NCCL counts no steps for it)
  /// NCCL's NVLS channels (comm->nvlsChannels, src/transport/nvls.cc: 16 on Hopper, 24 on one
  /// Blackwell node, 32 spanning nodes): with the ranks they give the NVLS chunk size of a
  /// message (sim::nccl_nvls_chunk). 0: no chunk cost (nvls_loop_latency unused).
  int nvls_channels = 0;
  /// The fixed cost of one NVLS loop (every channel reduces and multicasts one chunk per head),
  /// paid once per chunk a channel moves: what makes small NVLS chunks slow. Fitted.
  Time nvls_loop_latency;
  /// Intra-node fabrics: the most GPUs one NVLink domain of this fabric connects (8 on an HGX
  /// baseboard, 72 through an NVL72 rack's NVLink switch trays); 0: not given. A cluster's node
  /// is one NVLink domain, so its devices_per_node may not exceed it (ClusterSpec::validate).
  int nvlink_domain = 0;
};

/// The NCCL-structured collective model (sim/nccl_model.hpp) a cluster opts into.
struct NcclSettings {
  NcclFabric intra;    // NVLink (or PCIe) inside a node
  NcclFabric network;  // between nodes
};

struct CollectiveSettings {
  /// Fraction of a link's bandwidth that collectives and point-to-point transfers reach (NCCL's
  /// protocol overhead: ~0.82 on H100 NVLink, 0.8 on A100). In (0, 1]. Used by the alpha-beta
  /// model only (without `nccl`).
  double protocol_efficiency = 1.0;
  /// Present: collectives are costed by the NCCL-structured model (algorithm x protocol chosen
  /// by least predicted time); absent: the alpha-beta schedules of sim/collectives.hpp.
  std::optional<NcclSettings> nccl;
  /// A fixed algorithm per collective kind (index: kCollectiveKindNames); automatic: the rule.
  std::vector<CollectiveAlgorithm> algorithm = std::vector<CollectiveAlgorithm>(
      std::size(kCollectiveKindNames), CollectiveAlgorithm::automatic);
  /// NCCL_MAX_NCHANNELS: at most this many channels per collective (0: no limit, NCCL's
  /// default). It caps the channels the NCCL model spreads a collective over (the intra fabric's
  /// `channels`: fewer channels, less bandwidth where one channel's copy rate limits it) and the
  /// SMs communication holds beside compute (`interference.communication_units`): see
  /// channel_limit(). The alpha-beta model has no channels: there it changes only the SMs.
  int max_channels = 0;
};

/// `channels` under a max_channels limit (NCCL_MAX_NCHANNELS; 0: none): min(channels, limit).
/// The one rule for both what a collective can use and the SMs it holds.
constexpr int channel_limit(int channels, int max_channels) {
  return max_channels > 0 && max_channels < channels ? max_channels : channels;
}

/// Changes to some devices of the cluster: another device type (mixed generations, GPUs and
/// FPGAs), a straggler's slowdown, degraded links.
struct DeviceOverride {
  std::vector<int> ranks;              // the devices it applies to
  std::optional<DeviceSpec> device;    // another device type
  double slowdown = 1.0;               // compute takes this many times longer (>= 1 slower)
  std::optional<LinkSpec> intra_node;  // this device's link inside its node
  std::optional<LinkSpec> inter_node;  // this device's NIC
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
  std::optional<TopologySpec> topology;  // absent: the two-level form
  NetworkModel network_model = NetworkModel::analytical;
  FlowSymmetry flow_symmetry = FlowSymmetry::off;
  LoadBalancing load_balancing = LoadBalancing::ecmp;
  CollectiveSettings collectives;
  /// What communication and compute cost each other when they overlap on a GPU
  /// (hw_models/interference.hpp); FPGAs' network ports are apart from their compute.
  InterferenceSpec interference;
  std::vector<DeviceOverride> overrides;  // later entries win where they overlap

  /// Checks ranges; throws config::ValidationError with the offending key's path.
  void validate() const;

  int world_size() const { return nodes * devices_per_node; }
  /// Devices are numbered node by node: rank r lives on node r / devices_per_node.
  int node_of(int rank) const { return rank / devices_per_node; }

  /// Device type, compute slowdown and links of one rank, overrides applied.
  const DeviceSpec& device_of(int rank) const;
  double slowdown_of(int rank) const;
  const LinkSpec& intra_link_of(int rank) const;
  const LinkSpec& inter_link_of(int rank) const;
  /// True when every device is the same type with no slowdown and no link override.
  bool homogeneous() const { return overrides.empty(); }
};

/// The SMs communication holds beside compute on a GPU (hw_models/interference.hpp's f_sm):
/// interference.communication_units under collectives.max_channels (channel_limit).
inline int communication_units(const ClusterSpec& cluster) {
  return channel_limit(cluster.interference.communication_units, cluster.collectives.max_channels);
}

/// Device ranges as configs and flags write them, "0-7,16,18-19", within [0, world): the
/// listed devices in the order given. Throws std::invalid_argument saying what is wrong (a
/// part that is not a range, a device outside [0, world), a device listed twice, an empty text).
std::vector<int> parse_device_ranges(std::string_view text, int world);

/// Reads a cluster from the object at `path` of `doc`; a string "device" names a device file
/// relative to the cluster's file and is inlined first.
ClusterSpec read_cluster(config::Document& doc, const std::string& path);

/// Loads a device or cluster file on its own.
DeviceSpec load_device(const std::filesystem::path& file);
ClusterSpec load_cluster(const std::filesystem::path& file);

}  // namespace stratasim::hw
