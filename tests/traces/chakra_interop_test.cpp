// Chakra exports read the way Chakra's own tools and ASTRA-sim read them, independently of
// traces/chakra.cpp's reader: the rank files are decoded here with the classes protoc generates
// from et_def.proto, and checked against the attribute names and value types that Chakra's
// feeder (src/feeder/et_feeder_node.cpp: is_cpu_op bool_val, num_ops int64_val, tensor_size
// uint64_val, comm_type int64_val, comm_size int64_val, comm_src/comm_dst/comm_tag int32_val,
// pg_name string_val; any other type reads as 0) and ASTRA-sim (Workload::issue_coll_comm:
// involved_dim a bool_list; extract_comm_group: pg_name "" or "0" is all ranks, any other must
// be a key of the comm-group file; issue_send_comm: comm_src is the sender) read.
//
// Then a small replayer with ASTRA-sim's semantics (astra-sim/workload/Workload.cc,
// HardwareResource.cc, network_frontend/analytical/common/CommonNetworkApi.cc), written here
// from those sources and nothing of stratasim's simulator:
//  - a node is dependency-free when all its data_deps and ctrl_deps have finished; the
//    dependency-free nodes are issued in increasing node id (Workload::issue_dep_free_nodes
//    walks a std::set), each when its resource is free;
//  - one GPU compute node at a time, one CPU node at a time, and ONE communication node at a
//    time per rank (collectives, sends, memory nodes); receives take no resource;
//  - a collective starts when every member of its group has issued its k-th collective on that
//    group and takes the node's duration_micros; every member's queue is held until it ends;
//  - a send does not wait for its receive: it holds the queue for its duration_micros (the
//    transfer), then its data has arrived; a receive ends when it has been issued and its data
//    has arrived (messages match by source, destination and comm_tag).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <nlohmann/json.hpp>

#include "et_def.pb.h"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "traces/chakra.hpp"
#include "traces/helpers.hpp"

namespace fs = std::filesystem;
using namespace stratasim;
namespace st = stratasim::strategies;
namespace pb = ChakraProtoMsg;
using stratasim::testing::TempDir;

namespace {

const fs::path kSource = STRATASIM_SOURCE_DIR;

struct EtFile {
  pb::GlobalMetadata metadata;
  std::vector<pb::Node> nodes;
};

// Chakra's encode_message framing: a varint32 length, then the message (protoio.hh).
EtFile decode_et(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string bytes = s.str();
  google::protobuf::io::CodedInputStream stream(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                                static_cast<int>(bytes.size()));
  EtFile out;
  bool first = true;
  std::uint32_t length = 0;
  while (stream.ReadVarint32(&length)) {
    const auto limit = stream.PushLimit(static_cast<int>(length));
    if (first) {
      REQUIRE(out.metadata.ParseFromCodedStream(&stream));
      first = false;
    } else {
      pb::Node node;
      REQUIRE(node.ParseFromCodedStream(&stream));
      out.nodes.push_back(std::move(node));
    }
    stream.PopLimit(limit);
  }
  REQUIRE(!first);
  return out;
}

std::vector<EtFile> decode_trace(const fs::path& prefix, int world) {
  std::vector<EtFile> files;
  for (int r = 0; r < world; ++r) {
    files.push_back(decode_et(prefix.string() + "." + std::to_string(r) + ".et"));
  }
  return files;
}

const pb::AttributeProto* attr(const pb::Node& n, const std::string& name) {
  for (const auto& a : n.attr()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

// ---- The ASTRA-sim-semantics replayer.

struct AstraReplay {
  bool completed = false;
  double end_us = 0;
  std::size_t finished = 0, total = 0;
};

AstraReplay astra_replay(const std::vector<EtFile>& files,
                         const std::map<std::string, std::vector<int>>& groups) {
  const int world = static_cast<int>(files.size());
  enum Resource { kGpu, kCpu, kComm, kNone };
  struct RankState {
    std::map<std::uint64_t, std::size_t> index;  // node id -> position in the file
    std::vector<std::vector<std::size_t>> dependents;
    std::vector<int> pending;
    std::set<std::uint64_t> ready;  // dependency-free, not issued: by node id
    std::vector<char> done;
    std::array<bool, 3> busy{};
    std::map<std::string, int> collectives_issued;  // pg_name -> count
  };
  std::vector<RankState> ranks(static_cast<std::size_t>(world));
  AstraReplay result;
  for (int r = 0; r < world; ++r) {
    auto& s = ranks[static_cast<std::size_t>(r)];
    const auto& nodes = files[static_cast<std::size_t>(r)].nodes;
    for (std::size_t i = 0; i < nodes.size(); ++i) s.index[nodes[i].id()] = i;
    s.dependents.resize(nodes.size());
    s.pending.assign(nodes.size(), 0);
    s.done.assign(nodes.size(), 0);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      std::set<std::uint64_t> deps(nodes[i].data_deps().begin(), nodes[i].data_deps().end());
      deps.insert(nodes[i].ctrl_deps().begin(), nodes[i].ctrl_deps().end());
      for (const auto d : deps) {
        const auto it = s.index.find(d);
        REQUIRE(it != s.index.end());
        s.dependents[it->second].push_back(i);
        ++s.pending[i];
      }
      if (s.pending[i] == 0) s.ready.insert(nodes[i].id());
    }
    result.total += nodes.size();
  }

  // Events: (time, sequence, rank, node); a node ends at its event.
  using Event = std::tuple<double, std::uint64_t, int, std::size_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  std::uint64_t sequence = 0;
  double now = 0;
  // Collectives: (pg_name, k) -> the members that issued it (rank, node).
  std::map<std::pair<std::string, int>, std::vector<std::pair<int, std::size_t>>> meetings;
  // Messages: (src, dst, tag) -> arrived; and receives waiting for their data.
  std::set<std::tuple<int, int, int>> arrived;
  std::map<std::tuple<int, int, int>, std::size_t> waiting_recv;

  auto resource_of = [&](const pb::Node& n) {
    const auto* cpu = attr(n, "is_cpu_op");
    if (cpu && cpu->bool_val()) return kCpu;
    if (n.type() == pb::COMP_NODE) return kGpu;
    if (n.type() == pb::COMM_RECV_NODE || n.type() == pb::METADATA_NODE) return kNone;
    return kComm;  // collectives, sends, memory nodes (HardwareResource::occupy)
  };
  auto group_of = [&](const std::string& pg) {
    if (pg.empty() || pg == "0") {
      std::vector<int> all(static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r) all[static_cast<std::size_t>(r)] = r;
      return all;
    }
    const auto it = groups.find(pg);
    REQUIRE(it != groups.end());
    return it->second;
  };
  auto end_at = [&](double t, int r, std::size_t i) { events.emplace(t, sequence++, r, i); };

  auto issue = [&](int r) {
    auto& s = ranks[static_cast<std::size_t>(r)];
    const auto& nodes = files[static_cast<std::size_t>(r)].nodes;
    for (auto it = s.ready.begin(); it != s.ready.end();) {
      const std::size_t i = s.index[*it];
      const pb::Node& n = nodes[i];
      const Resource res = resource_of(n);
      if (res != kNone && s.busy[res]) {
        ++it;
        continue;
      }
      it = s.ready.erase(it);
      if (res != kNone) s.busy[res] = true;
      const double duration = static_cast<double>(n.duration_micros());
      switch (n.type()) {
        case pb::COMM_COLL_NODE: {
          const auto* pg = attr(n, "pg_name");
          const std::string name = pg ? pg->string_val() : "";
          const int k = s.collectives_issued[name]++;
          auto& met = meetings[{name, k}];
          met.emplace_back(r, i);
          if (met.size() == group_of(name).size()) {
            for (const auto& [mr, mi] : met) end_at(now + duration, mr, mi);
          }
          break;
        }
        case pb::COMM_SEND_NODE:
          end_at(now + duration, r, i);  // the data arrives when the send ends
          break;
        case pb::COMM_RECV_NODE: {
          const std::tuple<int, int, int> key{attr(n, "comm_src")->int32_val(), r,
                                              attr(n, "comm_tag")->int32_val()};
          if (arrived.count(key)) {
            end_at(now, r, i);
          } else {
            waiting_recv[key] = i;
          }
          break;
        }
        default:
          end_at(now + duration, r, i);
      }
    }
  };

  for (int r = 0; r < world; ++r) issue(r);
  while (!events.empty()) {
    const auto [t, seq, r, i] = events.top();
    events.pop();
    now = t;
    auto& s = ranks[static_cast<std::size_t>(r)];
    const pb::Node& n = files[static_cast<std::size_t>(r)].nodes[i];
    s.done[i] = 1;
    ++result.finished;
    result.end_us = std::max(result.end_us, now);
    if (const Resource res = resource_of(n); res != kNone) s.busy[res] = false;
    if (n.type() == pb::COMM_SEND_NODE) {
      const int dst = attr(n, "comm_dst")->int32_val();
      const std::tuple<int, int, int> key{r, dst, attr(n, "comm_tag")->int32_val()};
      if (const auto w = waiting_recv.find(key); w != waiting_recv.end()) {
        end_at(now, dst, w->second);
        waiting_recv.erase(w);
      } else {
        arrived.insert(key);
      }
    }
    for (const std::size_t d : s.dependents[i]) {
      if (--s.pending[d] == 0) s.ready.insert(files[static_cast<std::size_t>(r)].nodes[d].id());
    }
    for (int q = 0; q < world; ++q) issue(q);
  }
  result.completed = result.finished == result.total;
  return result;
}

std::map<std::string, std::vector<int>> read_comm_groups(const fs::path& prefix) {
  std::ifstream in(prefix.string() + ".comm_groups.json");
  REQUIRE(in);
  const auto doc = nlohmann::json::parse(in);
  std::map<std::string, std::vector<int>> groups;
  for (const auto& [key, ranks] : doc.items()) groups[key] = ranks.get<std::vector<int>>();
  return groups;
}

// GPT-3 1.7B on 8 A100s with tp 2 and pp 2 (dp 2), the interleaved 1F1B schedule of two
// virtual stages per rank.
st::Experiment interleaved_experiment() {
  return st::load_experiment(kSource / "configs" / "experiments" / "gpt3-1.7b-a100-8.json",
                             {{"parallelism.tp", 2, "test"},
                              {"parallelism.pp", 2, "test"},
                              {"parallelism.dp", nullptr, "test"},
                              {"parallelism.schedule", "interleaved", "test"},
                              {"parallelism.virtual_stages", 2, "test"},
                              {"training.global_batch", 16, "test"}});
}

}  // namespace

TEST_CASE(
    "Chakra export read back through Chakra's own field conventions (the feeder's attribute "
    "types, ASTRA-sim's groups and message matching), without stratasim's reader") {
  const auto e = interleaved_experiment();
  const auto program = st::lower(e, {.mirror_data_parallel = false});
  const auto timeline = sim::simulate(program, e.cluster);
  REQUIRE(timeline.completed);
  const TempDir dir("traces");
  const fs::path prefix = dir.path() / "gpt";
  traces::write_chakra(prefix, program, {.timeline = &timeline, .single_comm_queue = true});
  const int world = program.world_size();
  const auto files = decode_trace(prefix, world);
  const auto groups = read_comm_groups(prefix);
  CHECK(!groups.count("0"));  // ASTRA-sim reserves communicator group 0

  std::size_t colls = 0, sends = 0, recvs = 0, comps = 0;
  // (src, dst, tag) -> comm_size, for sends and receives, to match them as ASTRA-sim does.
  std::map<std::tuple<int, int, int>, std::int64_t> sent, received;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const auto& f = files[static_cast<std::size_t>(r)];
    std::set<std::uint64_t> ids;
    for (const auto& n : f.nodes) CHECK(ids.insert(n.id()).second);  // ids are unique
    for (const auto& n : f.nodes) {
      CAPTURE(n.id());
      for (const auto d : n.data_deps()) CHECK((ids.count(d) && d != n.id()));
      for (const auto d : n.ctrl_deps()) CHECK((ids.count(d) && d != n.id()));
      const auto* cpu = attr(n, "is_cpu_op");
      REQUIRE(cpu);
      CHECK(cpu->value_case() == pb::AttributeProto::kBoolVal);
      CHECK_FALSE(cpu->bool_val());  // ASTRA-sim throws "Comm node should not be on CPU"
      if (const auto* dims = attr(n, "involved_dim")) {
        CHECK(dims->value_case() == pb::AttributeProto::kBoolList);
      }
      switch (n.type()) {
        case pb::COMP_NODE: {
          ++comps;
          const auto* ops = attr(n, "num_ops");
          const auto* size = attr(n, "tensor_size");
          REQUIRE(ops);
          REQUIRE(size);
          CHECK(ops->value_case() == pb::AttributeProto::kInt64Val);
          CHECK(size->value_case() == pb::AttributeProto::kUint64Val);
          CHECK(ops->int64_val() > 0);  // 0 stalls ASTRA-sim's roofline
          break;
        }
        case pb::COMM_COLL_NODE: {
          ++colls;
          const auto* type = attr(n, "comm_type");
          const auto* size = attr(n, "comm_size");
          const auto* pg = attr(n, "pg_name");
          REQUIRE(type);
          REQUIRE(size);
          REQUIRE(pg);
          CHECK(type->value_case() == pb::AttributeProto::kInt64Val);
          CHECK(pb::CollectiveCommType_IsValid(static_cast<int>(type->int64_val())));
          CHECK(size->value_case() == pb::AttributeProto::kInt64Val);
          CHECK(size->int64_val() > 0);
          CHECK(pg->value_case() == pb::AttributeProto::kStringVal);
          // ASTRA-sim: std::stoi(pg_name), a key of the comm-group file; the rank is a member.
          REQUIRE(groups.count(pg->string_val()));
          const auto& members = groups.at(pg->string_val());
          CHECK(std::find(members.begin(), members.end(), r) != members.end());
          CHECK(std::stoi(pg->string_val()) >= 1);
          break;
        }
        case pb::COMM_SEND_NODE:
        case pb::COMM_RECV_NODE: {
          const bool send = n.type() == pb::COMM_SEND_NODE;
          ++(send ? sends : recvs);
          const auto* src = attr(n, "comm_src");
          const auto* dst = attr(n, "comm_dst");
          const auto* tag = attr(n, "comm_tag");
          const auto* size = attr(n, "comm_size");
          REQUIRE((src && dst && tag && size));
          CHECK(src->value_case() == pb::AttributeProto::kInt32Val);
          CHECK(dst->value_case() == pb::AttributeProto::kInt32Val);
          CHECK(tag->value_case() == pb::AttributeProto::kInt32Val);
          CHECK(size->value_case() == pb::AttributeProto::kInt64Val);
          // issue_send_comm: "Send node should be issued by the sender"; receives likewise.
          CHECK((send ? src->int32_val() : dst->int32_val()) == r);
          const std::tuple<int, int, int> key{src->int32_val(), dst->int32_val(), tag->int32_val()};
          CHECK((send ? sent : received).emplace(key, size->int64_val()).second);
          break;
        }
        case pb::MEM_LOAD_NODE:
        case pb::MEM_STORE_NODE:
          REQUIRE(attr(n, "tensor_size"));
          CHECK(attr(n, "tensor_size")->value_case() == pb::AttributeProto::kUint64Val);
          break;
        default:
          FAIL("unexpected node type " << pb::NodeType_Name(n.type()));
      }
    }
  }
  CHECK(comps > 0);
  CHECK(colls > 0);
  CHECK(sends > 0);
  CHECK(sends == recvs);
  CHECK(sent == received);  // every message matches one receive of the same size
}

TEST_CASE(
    "Chakra export with --order simulated runs to completion under ASTRA-sim's semantics "
    "(eager sends, one communication queue per rank); the per-stream order deadlocks there") {
  const auto e = interleaved_experiment();
  const auto program = st::lower(e, {.mirror_data_parallel = false});
  const auto timeline = sim::simulate(program, e.cluster);
  REQUIRE(timeline.completed);
  const TempDir dir("traces");
  const int world = program.world_size();
  Time ours;
  for (const auto& s : timeline.spans) ours = std::max(ours, s.end);

  traces::write_chakra(dir.path() / "simulated", program,
                       {.timeline = &timeline, .single_comm_queue = true});
  const auto simulated = astra_replay(decode_trace(dir.path() / "simulated", world),
                                      read_comm_groups(dir.path() / "simulated"));
  CAPTURE(simulated.finished);
  CAPTURE(simulated.total);
  CHECK(simulated.completed);
  // Durations are stratasim's (duration_micros); the time differs only by the semantics and
  // by microsecond rounding: loosely the same iteration.
  const double ours_us = ours.seconds() * 1e6;
  CAPTURE(ours_us);
  CAPTURE(simulated.end_us);
  CHECK(simulated.end_us > ours_us / 2);
  CHECK(simulated.end_us < ours_us * 2);

  // The same program exported in per-stream order only: its communication streams interleave,
  // and under one queue per rank some rank holds a collective whose peer first needs data that
  // sits behind it in another queue.
  traces::write_chakra(dir.path() / "streams", program, {.timeline = &timeline});
  const auto streams = astra_replay(decode_trace(dir.path() / "streams", world),
                                    read_comm_groups(dir.path() / "streams"));
  CAPTURE(streams.finished);
  CAPTURE(streams.total);
  CHECK_FALSE(streams.completed);
}
