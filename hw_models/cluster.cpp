#include "hw_models/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "hw_models/sane_bounds.hpp"

namespace stratasim::hw {

namespace {

LinkSpec read_link(config::ObjectReader r) {
  LinkSpec link;
  link.bandwidth = r.bandwidth("bandwidth");
  link.latency = r.time("latency");
  r.finish();
  return link;
}

/// A fabric of the NCCL model (hw::NcclFabric), inline or from a file the cluster names.
NcclFabric read_fabric(config::Document& doc, const std::string& path, bool intra) {
  doc.inline_reference(path);
  config::ObjectReader r(doc, path, intra ? "an intra-node fabric" : "a network fabric");
  NcclFabric f;
  f.name = r.string("name");
  f.source = r.string_or("source", "");
  if (r.has("fitted_to")) {
    const nlohmann::json* ids = doc.find(r.path_of("fitted_to"));
    if (!ids->is_array()) r.fail("fitted_to", "expected a list of calibration case ids");
    for (const auto& id : *ids) {
      if (!id.is_string()) r.fail("fitted_to", "expected a list of calibration case ids");
      f.fitted_to.push_back(id.get<std::string>());
    }
  }
  r.has("fit");  // the fit's own summary (errors over its cases): for readers, not the model
  auto lat = r.object("step_latency", "the latency per step of each protocol");
  f.step_latency = {lat.time("LL"), lat.time("LL128"), lat.time("Simple")};
  lat.finish();
  f.efficiency = r.number("efficiency");
  f.p2p_efficiency = r.number_or("p2p_efficiency", f.efficiency);
  if (intra) {
    f.channels = static_cast<int>(r.integer_in("channels", 1, 64));
    f.ll_max_busbw = r.bandwidth("ll_max_busbw");
    f.ll128_channel_busbw = r.bandwidth("ll128_channel_busbw");
    f.channel_busbw = r.bandwidth("channel_busbw");
    f.nvlink_domain = static_cast<int>(r.integer_in_or("nvlink_domain", 1, 1 << 16, 0));
    if (r.has("p2p_channel_bandwidth")) {
      f.p2p_channel_bandwidth = r.bandwidth("p2p_channel_bandwidth");
    }
    if (r.has("nvls")) {
      auto n = r.object("nvls", "NVLink SHARP figures");
      f.nvls_efficiency = n.number("efficiency");
      f.nvls_latency = n.time("latency");
      if (n.has("channels")) {
        f.nvls_channels = static_cast<int>(n.integer_in("channels", 1, 64));
        f.nvls_loop_latency = n.time("loop_latency");
      }
      n.finish();
    }
  } else {
    if (r.has("ll_max_busbw")) f.ll_max_busbw = r.bandwidth("ll_max_busbw");
    f.ll = r.boolean_or("ll", true);
    f.ll128 = r.boolean_or("ll128", true);
    f.pat = r.boolean_or("pat", true);
    if (r.has("collnet")) {
      auto n = r.object("collnet", "CollNet (SHARP in-network reduction) figures");
      f.collnet_efficiency = n.number("efficiency");
      f.collnet_latency = n.time("latency");
      n.finish();
    }
  }
  r.finish();
  return f;
}

constexpr std::string_view kNetworkModelNames[] = {"analytical", "flow"};
constexpr std::string_view kAlgorithmNames[] = {
    "auto",         "ring", "tree",           "halving_doubling", "direct",
    "hierarchical", "nvls", "collnet_direct", "collnet_chain",    "pat"};

/// The override that applies to `rank` last, or nullptr.
template <class Field>
const DeviceOverride* last_override(const std::vector<DeviceOverride>& overrides, int rank,
                                    Field&& has_field) {
  const DeviceOverride* found = nullptr;
  for (const auto& o : overrides) {
    if (!has_field(o)) continue;
    for (int r : o.ranks) {
      if (r == rank) {
        found = &o;
        break;
      }
    }
  }
  return found;
}

/// "0-7,16,18-19" or a JSON array of integers: the ranks an override applies to.
std::vector<int> read_ranks(config::ObjectReader& r, std::string_view key, int world) {
  const auto* value = r.document().find(r.path_of(key));
  std::vector<int> ranks;
  auto add = [&](long long lo, long long hi) {
    if (lo < 0 || hi >= world || lo > hi) {
      r.fail(key, "expected ranks in [0, " + std::to_string(world - 1) + "], got " +
                      std::to_string(lo) + (lo == hi ? "" : "-" + std::to_string(hi)));
    }
    for (long long x = lo; x <= hi; ++x) ranks.push_back(static_cast<int>(x));
  };
  if (value != nullptr && value->is_array()) {
    r.has(key);
    for (const auto& v : *value) {
      if (!v.is_number_integer()) r.fail(key, "expected an array of integer ranks");
      if (v.is_number_unsigned() && v.get<std::uint64_t>() >= static_cast<std::uint64_t>(world)) {
        // As written: get<long long> would wrap values of 2^63 and above to negative ones.
        r.fail(key, "expected ranks in [0, " + std::to_string(world - 1) + "], got " + v.dump());
      }
      add(v.get<long long>(), v.get<long long>());
    }
  } else {
    const std::string text = r.string(key);
    try {
      for (int x : parse_device_ranges(text, world)) ranks.push_back(x);
    } catch (const std::invalid_argument& e) {
      r.fail(key, e.what());
    }
  }
  if (ranks.empty()) r.fail(key, "expected at least one rank");
  return ranks;
}

}  // namespace

std::vector<int> parse_device_ranges(std::string_view text, int world) {
  std::vector<int> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string part(text.substr(at, comma - at));
    const std::size_t dash = part.find('-');
    long long lo = 0, hi = 0;
    try {
      std::size_t used = 0, used_hi = 0;
      if (dash == std::string::npos) {
        lo = hi = std::stoll(part, &used);
        if (used != part.size()) throw std::invalid_argument(part);
      } else {
        const std::string a = part.substr(0, dash), b = part.substr(dash + 1);
        lo = std::stoll(a, &used);
        hi = std::stoll(b, &used_hi);
        if (used != a.size() || used_hi != b.size()) throw std::invalid_argument(part);
      }
    } catch (const std::logic_error&) {
      throw std::invalid_argument("expected device ranges like \"0-7,16\", got \"" +
                                  std::string(text) + "\"");
    }
    if (lo < 0 || hi >= world || lo > hi) {
      throw std::invalid_argument("devices " + part + " are outside 0-" +
                                  std::to_string(world - 1));
    }
    for (long long d = lo; d <= hi; ++d) {
      if (std::find(out.begin(), out.end(), d) != out.end()) {
        throw std::invalid_argument("device " + std::to_string(d) + " is listed twice in \"" +
                                    std::string(text) + "\"");
      }
      out.push_back(static_cast<int>(d));
    }
    at = comma + 1;
  }
  return out;
}

std::string_view name_of(NcclProtocol p) {
  return kNcclProtocolNames[static_cast<std::size_t>(p)];
}

std::string_view name_of(NetworkModel m) {
  return kNetworkModelNames[static_cast<int>(m)];
}

std::string_view name_of(FlowSymmetry m) {
  constexpr std::string_view kNames[] = {"off", "auto", "symmetric_routes"};
  return kNames[static_cast<int>(m)];
}

std::string_view name_of(LoadBalancing m) {
  constexpr std::string_view kNames[] = {"ecmp", "spray"};
  return kNames[static_cast<int>(m)];
}

std::string_view name_of(CollectiveAlgorithm a) {
  return kAlgorithmNames[static_cast<int>(a)];
}

std::optional<CollectiveAlgorithm> collective_algorithm_from_name(std::string_view name) {
  for (std::size_t i = 0; i < std::size(kAlgorithmNames); ++i) {
    if (kAlgorithmNames[i] == name) return static_cast<CollectiveAlgorithm>(i);
  }
  return std::nullopt;
}

const DeviceSpec& ClusterSpec::device_of(int rank) const {
  const auto* o =
      last_override(overrides, rank, [](const DeviceOverride& x) { return x.device.has_value(); });
  return o ? *o->device : device;
}

double ClusterSpec::slowdown_of(int rank) const {
  const auto* o =
      last_override(overrides, rank, [](const DeviceOverride& x) { return x.slowdown != 1.0; });
  return o ? o->slowdown : 1.0;
}

const LinkSpec& ClusterSpec::intra_link_of(int rank) const {
  const auto* o = last_override(overrides, rank,
                                [](const DeviceOverride& x) { return x.intra_node.has_value(); });
  return o ? *o->intra_node : intra_node;
}

const LinkSpec& ClusterSpec::inter_link_of(int rank) const {
  const auto* o = last_override(overrides, rank,
                                [](const DeviceOverride& x) { return x.inter_node.has_value(); });
  return o ? *o->inter_node : inter_node;
}

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
  if (!is_efficiency(collectives.protocol_efficiency)) {
    throw config::ValidationError("collectives.protocol_efficiency",
                                  "expected " + efficiency_expected() + ", got " +
                                      number_text(collectives.protocol_efficiency));
  }
  interference.validate();
  if (collectives.max_channels < 0) {
    throw config::ValidationError("collectives.max_channels",
                                  "expected a channel count >= 1 (NCCL_MAX_NCHANNELS), or 0 for "
                                  "no limit");
  }
  if (collectives.nccl && collectives.protocol_efficiency != 1.0) {
    throw config::ValidationError(
        "collectives.protocol_efficiency",
        "the NCCL model (intra_fabric / network_fabric) has its own efficiencies per fabric; "
        "remove protocol_efficiency");
  }
  if (collectives.nccl) {
    for (const auto* f : {&collectives.nccl->intra, &collectives.nccl->network}) {
      const std::string at =
          f == &collectives.nccl->intra ? "collectives.intra_fabric" : "collectives.network_fabric";
      if (!is_efficiency(f->efficiency)) {
        throw config::ValidationError(at + ".efficiency", "expected " + efficiency_expected());
      }
      if (!is_efficiency(f->p2p_efficiency)) {
        throw config::ValidationError(at + ".p2p_efficiency", "expected " + efficiency_expected());
      }
      for (std::size_t p = 0; p < f->step_latency.size(); ++p) {
        if (!(f->step_latency[p].seconds() >= 0)) {
          throw config::ValidationError(at + ".step_latency." + std::string(kNcclProtocolNames[p]),
                                        "expected a latency >= 0");
        }
      }
    }
    const NcclFabric& in = collectives.nccl->intra;
    if (in.nvlink_domain > 0 && devices_per_node > in.nvlink_domain) {
      throw config::ValidationError(
          "devices_per_node",
          "expected at most " + std::to_string(in.nvlink_domain) +
              " devices per node: a node is one NVLink domain, and the intra fabric " + in.name +
              " (collectives.intra_fabric) connects at most " + std::to_string(in.nvlink_domain) +
              " GPUs in one (its nvlink_domain), got " + std::to_string(devices_per_node) +
              "; more GPUs are more nodes, or a fabric whose domain holds them (nvlink5-nvl72: "
              "72)");
    }
    if (!(in.ll_max_busbw.bytes_per_second() > 0)) {
      throw config::ValidationError("collectives.intra_fabric.ll_max_busbw",
                                    "expected a positive bandwidth");
    }
    if (!(in.channel_busbw.bytes_per_second() > 0)) {
      throw config::ValidationError("collectives.intra_fabric.channel_busbw",
                                    "expected a positive bandwidth");
    }
    if (!(in.ll128_channel_busbw.bytes_per_second() > 0)) {
      throw config::ValidationError("collectives.intra_fabric.ll128_channel_busbw",
                                    "expected a positive bandwidth");
    }
    if (in.nvls_efficiency != 0 && !is_efficiency(in.nvls_efficiency)) {
      throw config::ValidationError(
          "collectives.intra_fabric.nvls.efficiency",
          "expected 0 (the switch does not reduce) or " + efficiency_expected());
    }
    if (!(in.p2p_channel_bandwidth.bytes_per_second() >= 0)) {
      throw config::ValidationError("collectives.intra_fabric.p2p_channel_bandwidth",
                                    "expected a bandwidth >= 0 (0: no limit)");
    }
    const NcclFabric& net = collectives.nccl->network;
    if (net.collnet_efficiency != 0 && !is_efficiency(net.collnet_efficiency)) {
      throw config::ValidationError("collectives.network_fabric.collnet.efficiency",
                                    "expected 0 (no CollNet) or " + efficiency_expected());
    }
    if (!(net.collnet_latency.seconds() >= 0)) {
      throw config::ValidationError("collectives.network_fabric.collnet.latency",
                                    "expected a latency >= 0");
    }
    if (!(in.nvls_latency.seconds() >= 0)) {
      throw config::ValidationError("collectives.intra_fabric.nvls.latency",
                                    "expected a latency >= 0");
    }
    if (!(in.nvls_loop_latency.seconds() >= 0)) {
      throw config::ValidationError("collectives.intra_fabric.nvls.loop_latency",
                                    "expected a latency >= 0");
    }
  }
  for (std::size_t i = 0; i < overrides.size(); ++i) {
    const std::string at = "overrides." + std::to_string(i);
    if (!is_slowdown(overrides[i].slowdown)) {
      throw config::ValidationError(at + ".slowdown",
                                    "expected a factor from 1e-6 to 1e6 (2 = twice as slow), got " +
                                        number_text(overrides[i].slowdown));
    }
    for (const auto* link : {&overrides[i].intra_node, &overrides[i].inter_node}) {
      if (*link && !((*link)->bandwidth.bytes_per_second() > 0)) {
        throw config::ValidationError(
            at + (link == &overrides[i].intra_node ? ".intra_node" : ".inter_node") + ".bandwidth",
            "expected a positive bandwidth");
      }
    }
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
    if (!(host.adam_params_per_second_per_core >= kMinItemsPerSecond) ||
        !std::isfinite(host.adam_params_per_second_per_core)) {
      h.fail("adam_params_per_second_per_core",
             "expected a rate of at least 1000 parameters per second per core");
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
  if (r.has("topology")) c.topology = read_topology(r.object("topology", "the network topology"));
  c.network_model = r.choice_or("network_model", {"analytical", "flow"}, "analytical") == "flow"
                        ? NetworkModel::flow
                        : NetworkModel::analytical;
  {
    const std::string symmetry =
        r.choice_or("flow_symmetry", {"off", "auto", "symmetric_routes"}, "off");
    c.flow_symmetry = symmetry == "auto"               ? FlowSymmetry::automatic
                      : symmetry == "symmetric_routes" ? FlowSymmetry::symmetric_routes
                                                       : FlowSymmetry::off;
  }
  c.load_balancing = r.choice_or("load_balancing", {"ecmp", "spray"}, "ecmp") == "spray"
                         ? LoadBalancing::spray
                         : LoadBalancing::ecmp;
  if (r.has("collectives")) {
    auto coll = r.object("collectives", "collective settings");
    c.collectives.protocol_efficiency =
        coll.number_or("protocol_efficiency", c.collectives.protocol_efficiency);
    const bool has_intra = coll.has("intra_fabric");
    const bool has_network = coll.has("network_fabric");
    if (has_intra != has_network) {
      coll.fail(has_intra ? "network_fabric" : "intra_fabric",
                "expected both intra_fabric and network_fabric (the NCCL model needs the fabric "
                "inside a node and the one between nodes), or neither");
    }
    if (has_intra) {
      c.collectives.nccl = NcclSettings{read_fabric(doc, coll.path_of("intra_fabric"), true),
                                        read_fabric(doc, coll.path_of("network_fabric"), false)};
    }
    c.collectives.max_channels =
        static_cast<int>(coll.integer_in_or("max_channels", 0, 1 << 16, 0));
    if (coll.has("algorithm")) {
      auto alg = coll.object("algorithm", "a fixed algorithm per collective kind");
      for (std::size_t k = 0; k < std::size(kCollectiveKindNames); ++k) {
        const std::string key(kCollectiveKindNames[k]);
        if (!alg.has(key)) continue;
        const std::string name =
            alg.choice(key, {"auto", "ring", "tree", "halving_doubling", "direct", "hierarchical",
                             "nvls", "collnet_direct", "collnet_chain", "pat"});
        c.collectives.algorithm[k] = *collective_algorithm_from_name(name);
      }
      alg.finish();
    }
    coll.finish();
  }
  if (r.has("interference")) {
    c.interference = read_interference(
        r.object("interference", "what overlapping communication and compute cost each other"));
  }
  if (r.has("overrides")) {
    const auto* list = doc.find(r.path_of("overrides"));
    if (!list->is_array()) r.fail("overrides", "expected an array of per-device overrides");
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::string at = config::join_path(r.path_of("overrides"), std::to_string(i));
      doc.inline_reference(config::join_path(at, "device"));
      config::ObjectReader o(doc, at, "a per-device override");
      DeviceOverride d;
      d.ranks = read_ranks(o, "ranks", c.world_size());
      if (o.has("device")) d.device = read_device(doc, o.path_of("device"));
      d.slowdown = o.number_or("slowdown", 1.0);
      if (o.has("intra_node"))
        d.intra_node = read_link(o.object("intra_node", "this device's link inside its node"));
      if (o.has("inter_node"))
        d.inter_node = read_link(o.object("inter_node", "this device's NIC"));
      o.finish();
      c.overrides.push_back(std::move(d));
    }
  }
  r.finish();
  doc.validated(path, [&] { c.validate(); });
  if (c.topology) {
    doc.validated(config::join_path(path, "topology"), [&] { c.topology->validate(); });
    // Checks that need the whole cluster (a torus's extents, a graph's devices) run by building
    // the graph once.
    doc.validated(path, [&] { (void)build_topology(c); });
  }
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
