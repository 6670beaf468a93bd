// Chakra ET import (protobuf and JSON forms) and export.
#include "traces/chakra.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "et_def.pb.h"
#include "hw_models/files.hpp"
#include "hw_models/json_depth.hpp"
#include "strategies/kernel_bytes.hpp"
#include "strategies/optimizer.hpp"
#include "traces/trace_builder.hpp"

namespace stratasim::traces {

namespace fs = std::filesystem;
namespace st = stratasim::strategies;
namespace pb = ChakraProtoMsg;
using nlohmann::json;

namespace {

// Our own attributes: what Chakra has no field for, so that an exported Program comes back
// exactly. Other tools ignore attributes they do not know.
constexpr const char* kKernelsAttr = "stratasim.kernels";
constexpr const char* kStreamAttr = "stratasim.stream";
constexpr const char* kPhaseAttr = "stratasim.phase";
constexpr const char* kMicrobatchAttr = "stratasim.microbatch";
constexpr const char* kLayersAttr = "stratasim.layers";
constexpr const char* kEffectsAttr = "stratasim.effects";
constexpr const char* kDtypeAttr = "stratasim.dtype";
constexpr const char* kInitialMemoryAttr = "stratasim.initial_memory";
constexpr const char* kGroupNamesAttr = "stratasim.groups";
// The comm-group id of the Program's group 0 in our exports (GlobalMetadata attribute; absent
// in traces written before group ids started at 1, which used 0).
// A collective's exact bytes (the Program's convention) when comm_size cannot carry them: an
// all-gather whose output does not divide evenly among its ranks.
constexpr const char* kBytesAttr = "stratasim.bytes";
constexpr const char* kClusterAttr = "stratasim.cluster";
constexpr const char* kGroupIdBaseAttr = "stratasim.group_id_base";
// On a COMM_SEND_NODE: true when the send waits for its receive (stratasim's rendezvous,
// strategies::Send::eager false). Chakra's sends do not wait (ASTRA-sim issues them at once and
// ends them when their data has arrived), so a send without it is imported as eager.
constexpr const char* kRendezvousAttr = "stratasim.rendezvous";
// The name of the METADATA_NODE in which Chakra's PyTorch converter keeps the process groups
// (PyTorch's "## process_group:init ##" record_function): its inputs.values is the Python str()
// of a one-string list whose string is the JSON [{"pg_name": "0", "ranks": [0, 1], ...}, ...];
// empty ranks mean all ranks (ASTRA-sim's Workload::issue_pytorch_pg_metadata reads it so).
constexpr std::string_view kProcessGroupInit = "process_group:init";
// ASTRA-sim reserves communicator group id 0 (no group: all ranks). Its CommunicatorGroupManager
// numbers groups from 1 and Workload::issue_pytorch_pg_metadata adds 1 to PyTorch's pg names
// "to ensure pgName > 0"; a comm-group file keyed "0" makes every collective abort there. We
// export the Program's group g as id g + 1.
constexpr std::uint32_t kExportedGroupIdBase = 1;
constexpr const char* kChakraVersion = "0.0.4";  // what Chakra's converters write

// Bounds that keep imported numbers meaningful and the arithmetic on them from overflowing.
constexpr std::int64_t kMaxBytes = kMaxTraceBytes;
constexpr std::int64_t kMaxDim = kMaxTraceDim;
constexpr std::uint64_t kMaxMicros = 1'000'000'000'000ULL;  // 11.6 days, in microseconds
constexpr int kMaxRanks = kMaxTraceRanks;

template <typename E, int N>
std::optional<E> enum_from_name(std::string_view name) {
  for (int i = 0; i < N; ++i) {
    const auto e = static_cast<E>(i);
    if (st::name_of(e) == name) return e;
  }
  return std::nullopt;
}

template <typename E, int N>
std::string enum_names() {
  std::string text;
  for (int i = 0; i < N; ++i) {
    text += (i == 0 ? "\"" : ", \"") + std::string(st::name_of(static_cast<E>(i))) + "\"";
  }
  return text;
}

// ---- Reading JSON values of our attributes, with the path of what is wrong.

class AttrReader {
 public:
  AttrReader(std::string file, std::string where, std::string attr)
      : file_(std::move(file)), where_(std::move(where)), attr_(std::move(attr)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& expected) const {
    throw TraceError(file_, where_, "attribute " + attr_ + path + ": expected " + expected);
  }
  json parse(const std::string& text) const {
    try {
      return config::parse_json_depth_bounded(text, file_);
    } catch (const config::ConfigError& e) {  // nested deeper than config::kMaxJsonDepth
      throw TraceError(file_, where_, "attribute " + attr_ + ": " + e.message());
    } catch (const json::exception& e) {
      throw TraceError(file_, where_, "attribute " + attr_ + " is not valid JSON: " + e.what());
    }
  }
  const json& array(const json& v, const std::string& path, std::size_t min_size,
                    std::size_t max_size) const {
    if (!v.is_array() || v.size() < min_size || v.size() > max_size) {
      fail(path, min_size == max_size ? "an array of " + std::to_string(min_size) + " values"
                                      : "an array of " + std::to_string(min_size) + " to " +
                                            std::to_string(max_size) + " values");
    }
    return v;
  }
  std::int64_t integer(const json& v, const std::string& path, std::int64_t lo,
                       std::int64_t hi) const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned()) {
        const auto u = v.get<std::uint64_t>();
        if (u <= static_cast<std::uint64_t>(hi) && static_cast<std::int64_t>(u) >= lo) {
          return static_cast<std::int64_t>(u);
        }
      } else {
        const auto i = v.get<std::int64_t>();
        if (i >= lo && i <= hi) return i;
      }
    }
    fail(path, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  double number(const json& v, const std::string& path) const {
    if (v.is_number()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d >= 0 && d <= 1e30) return d;
    }
    fail(path, "a number from 0 to 1e30");
  }
  bool boolean(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "true or false");
    return v.get<bool>();
  }
  const std::string& string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "a string");
    return v.get_ref<const std::string&>();
  }
  DType dtype(const json& v, const std::string& path) const {
    const auto d = v.is_string() ? dtype_from_name(v.get_ref<const std::string&>()) : std::nullopt;
    if (!d) fail(path, "a dtype name (fp32, tf32, fp16, bf16, fp8, fp4)");
    return *d;
  }
  template <typename E, int N>
  E named(const json& v, const std::string& path) const {
    const auto e =
        v.is_string() ? enum_from_name<E, N>(v.get_ref<const std::string&>()) : std::nullopt;
    if (!e) fail(path, "one of " + enum_names<E, N>());
    return *e;
  }

 private:
  std::string file_, where_, attr_;
};

std::string idx(std::size_t i) {
  return "[" + std::to_string(i) + "]";
}

// ---- Kernels as compact JSON: ["gemm", name, m, n, k, batch, dtype], ...

json kernel_to_json(const st::Kernel& k) {
  return std::visit(
      [&](const auto& w) -> json {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, st::Gemm>) {
          return json::array({"gemm", k.name, w.m, w.n, w.k, w.batch, name_of(w.dtype)});
        } else if constexpr (std::is_same_v<W, st::Attention>) {
          json a = json::array({"attention", k.name, w.batch, w.heads, w.kv_heads, w.seq_q,
                                w.seq_kv, w.head_dim, w.causal, name_of(w.dtype), w.backward});
          // A sliding window: a twelfth value; an attention chunk: a thirteenth, after it.
          if (w.window > 0 || w.chunk > 0) a.push_back(w.window);
          if (w.chunk > 0) a.push_back(w.chunk);
          return a;
        } else if constexpr (std::is_same_v<W, st::Elementwise>) {
          return json::array(
              {"elementwise", k.name, w.elements, w.bytes_read.count(), w.bytes_written.count()});
        } else if constexpr (std::is_same_v<W, st::OptimizerStep>) {
          return json::array({"optimizer", k.name, w.params, st::name_of(w.kind), name_of(w.dtype),
                              w.on_host, w.fp32_grads});
        } else if constexpr (std::is_same_v<W, st::Copy>) {
          return json::array(
              {"copy", k.name, w.bytes.count(), st::name_of(w.from), st::name_of(w.to)});
        } else if constexpr (std::is_same_v<W, st::Measured>) {
          return json::array({"measured", k.name, w.duration.picoseconds()});
        } else {
          static_assert(std::is_same_v<W, st::RooflineWork>);
          return json::array(
              {"roofline", k.name, w.flops.count(), w.bytes.count(), name_of(w.dtype)});
        }
      },
      k.work);
}

st::Kernel kernel_from_json(const AttrReader& in, const json& v, const std::string& p) {
  in.array(v, p, 3, 13);
  const std::string& kind = in.string(v[0], p + "[0]");
  st::Kernel k;
  k.name = in.string(v[1], p + "[1]");
  auto dim = [&](std::size_t i) { return in.integer(v[i], p + idx(i), 0, kMaxDim); };
  auto bytes = [&](std::size_t i) { return Bytes(in.integer(v[i], p + idx(i), 0, kMaxBytes)); };
  if (kind == "gemm") {
    in.array(v, p, 7, 7);
    k.work = st::Gemm{dim(2), dim(3), dim(4), dim(5), in.dtype(v[6], p + "[6]")};
  } else if (kind == "attention") {
    in.array(v, p, 11, 13);
    st::Attention a{dim(2),
                    dim(3),
                    dim(4),
                    dim(5),
                    dim(6),
                    dim(7),
                    in.boolean(v[8], p + "[8]"),
                    in.dtype(v[9], p + "[9]"),
                    in.boolean(v[10], p + "[10]")};
    if (v.size() >= 12) a.window = dim(11);
    if (v.size() == 13) a.chunk = dim(12);
    k.work = a;
  } else if (kind == "elementwise") {
    in.array(v, p, 5, 5);
    k.work = st::Elementwise{dim(2), bytes(3), bytes(4)};
  } else if (kind == "optimizer") {
    in.array(v, p, 6, 7);
    const auto o = st::optimizer_from_name(in.string(v[3], p + "[3]"));
    if (!o) in.fail(p + "[3]", "an optimizer of strategies/optimizer.hpp (\"adam\", \"sgd\", ...)");
    k.work = st::OptimizerStep{dim(2), *o, in.dtype(v[4], p + "[4]"), in.boolean(v[5], p + "[5]"),
                               v.size() > 6 && in.boolean(v[6], p + "[6]")};
  } else if (kind == "copy") {
    in.array(v, p, 5, 5);
    k.work = st::Copy{bytes(2), in.named<st::MemoryTier, st::kMemoryTierCount>(v[3], p + "[3]"),
                      in.named<st::MemoryTier, st::kMemoryTierCount>(v[4], p + "[4]")};
  } else if (kind == "measured") {
    in.array(v, p, 3, 3);
    k.work = st::Measured{Time::ps(in.integer(v[2], p + "[2]", 0, kMaxTraceDurationPs))};
  } else if (kind == "roofline") {
    in.array(v, p, 5, 5);
    k.work =
        st::RooflineWork{Flops(in.number(v[2], p + "[2]")), bytes(3), in.dtype(v[4], p + "[4]")};
  } else {
    in.fail(p + "[0]",
            "a kernel kind (gemm, attention, elementwise, optimizer, copy, measured, roofline)");
  }
  return k;
}

// ---- Protobuf attribute access.

const pb::AttributeProto* find_attr(
    const google::protobuf::RepeatedPtrField<pb::AttributeProto>& attrs, std::string_view name) {
  for (const auto& a : attrs) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

std::string_view value_kind(const pb::AttributeProto& a) {
  switch (a.value_case()) {
    case pb::AttributeProto::kStringVal:
      return "a string";
    case pb::AttributeProto::kBoolVal:
      return "a bool";
    case pb::AttributeProto::kDoubleVal:
    case pb::AttributeProto::kFloatVal:
      return "a floating-point number";
    case pb::AttributeProto::VALUE_NOT_SET:
      return "no value";
    default:
      return "a list or bytes";
  }
}

// Any integer-typed value (Chakra's tools are not consistent about which one they use).
std::optional<std::int64_t> integer_value(const pb::AttributeProto& a) {
  using A = pb::AttributeProto;
  auto from_unsigned = [](std::uint64_t u) -> std::optional<std::int64_t> {
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return {};
    return static_cast<std::int64_t>(u);
  };
  switch (a.value_case()) {
    case A::kInt32Val:
      return a.int32_val();
    case A::kInt64Val:
      return a.int64_val();
    case A::kUint32Val:
      return a.uint32_val();
    case A::kUint64Val:
      return from_unsigned(a.uint64_val());
    case A::kSint32Val:
      return a.sint32_val();
    case A::kSint64Val:
      return a.sint64_val();
    case A::kFixed32Val:
      return a.fixed32_val();
    case A::kFixed64Val:
      return from_unsigned(a.fixed64_val());
    case A::kSfixed32Val:
      return a.sfixed32_val();
    case A::kSfixed64Val:
      return a.sfixed64_val();
    default:
      return std::nullopt;
  }
}

struct NodeReader {
  const std::string& file;
  const pb::Node& node;
  std::string where() const { return "node " + std::to_string(node.id()); }
  const pb::AttributeProto* attr(std::string_view name) const {
    return find_attr(node.attr(), name);
  }
  std::optional<std::int64_t> integer(std::string_view name, std::int64_t lo,
                                      std::int64_t hi) const {
    const auto* a = attr(name);
    if (!a) return std::nullopt;
    const auto v = integer_value(*a);
    if (!v || *v < lo || *v > hi) {
      throw TraceError(file, where(),
                       "attribute " + std::string(name) + ": expected an integer from " +
                           std::to_string(lo) + " to " + std::to_string(hi) + ", found " +
                           (v ? std::to_string(*v) : std::string(value_kind(*a))));
    }
    return v;
  }
  std::int64_t required(std::string_view name, std::int64_t lo, std::int64_t hi) const {
    auto v = integer(name, lo, hi);
    if (!v) {
      throw TraceError(file, where(),
                       "a " + std::string(pb::NodeType_Name(node.type())) +
                           " needs the attribute " + std::string(name));
    }
    return *v;
  }
  std::optional<std::string> string(std::string_view name) const {
    const auto* a = attr(name);
    if (!a) return std::nullopt;
    if (a->value_case() != pb::AttributeProto::kStringVal) {
      throw TraceError(file, where(),
                       "attribute " + std::string(name) + ": expected a string, found " +
                           std::string(value_kind(*a)));
    }
    return a->string_val();
  }
  std::optional<bool> boolean(std::string_view name) const {
    const auto* a = attr(name);
    if (!a) return std::nullopt;
    if (a->value_case() == pb::AttributeProto::kBoolVal) return a->bool_val();
    if (const auto v = integer_value(*a); v && (*v == 0 || *v == 1)) return *v == 1;
    throw TraceError(file, where(),
                     "attribute " + std::string(name) + ": expected a bool, found " +
                         std::string(value_kind(*a)));
  }
};

// Chakra's comm types by st::kCollectiveTraits' chakra_name, plus two that Chakra has and
// stratasim reads as another kind.
std::optional<st::CollectiveKind> collective_kind(pb::CollectiveCommType t) {
  if (t == pb::REDUCE_SCATTER_BLOCK) {  // the same traffic; only the output layout differs
    return st::CollectiveKind::reduce_scatter;
  }
  if (t == pb::BARRIER) {  // synchronizes like a zero-byte all-reduce (latency only)
    return st::CollectiveKind::all_reduce;
  }
  if (!pb::CollectiveCommType_IsValid(t)) return std::nullopt;
  const std::string& name = pb::CollectiveCommType_Name(t);
  for (const auto& row : st::kCollectiveTraits) {
    if (row.chakra_name == name) return row.kind;
  }
  return std::nullopt;
}

pb::CollectiveCommType comm_type_of(st::CollectiveKind k) {
  pb::CollectiveCommType t = pb::ALL_REDUCE;
  const bool known = pb::CollectiveCommType_Parse(std::string(st::traits_of(k).chakra_name), &t);
  if (!known) throw std::logic_error("Chakra has no comm type " + std::string(st::name_of(k)));
  return t;
}

// comm_size conventions. The Program's Collective::bytes is the whole buffer as nccl-tests counts
// it: the output of an all-gather, the input of a reduce-scatter, the buffer of an all-reduce.
// Chakra's PyTorch converter and ASTRA-sim take an all-gather's comm_size as one rank's input
// (ASTRA-sim's Ring and HalvingDoubling: final_data_size = data_size * nodes_in_ring) and a
// reduce-scatter's as the whole input (final_data_size = data_size / nodes_in_ring), which is
// ours. So only the all-gather differs, by the group's size.
std::int64_t program_to_chakra_bytes(st::CollectiveKind k, std::int64_t bytes, std::size_t ranks) {
  if (k != st::CollectiveKind::all_gather || ranks == 0) return bytes;
  return bytes / static_cast<std::int64_t>(ranks);
}
std::int64_t chakra_to_program_bytes(st::CollectiveKind k, std::int64_t comm_size,
                                     std::size_t ranks) {
  if (k != st::CollectiveKind::all_gather || ranks == 0) return comm_size;
  const auto n = static_cast<std::int64_t>(ranks);
  if (comm_size > kMaxBytes / n) return kMaxBytes;
  return comm_size * n;
}

bool looks_data_parallel(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.rfind("dp", 0) == 0 || lower.find("data") != std::string::npos ||
         lower.find("_dp") != std::string::npos || lower.find(" dp") != std::string::npos;
}

// A GPU kernel of NCCL's (ncclKernel_AllReduce_..., ncclDevKernel_SendRecv, ...), by name.
bool looks_like_nccl_kernel(std::string_view name) {
  return name.find("ncclKernel") != std::string_view::npos ||
         name.find("ncclDevKernel") != std::string_view::npos;
}

// ---- Decoding the two file forms into messages.

// What to tell a user who gave `replay --format chakra` a file that is not a Chakra ET.
constexpr const char* kChakraExpected =
    "expected a Chakra execution trace: per-rank protobuf files <prefix>.<rank>.et (as "
    "chakra_converter writes them) or Chakra's JSON form of them <prefix>.<rank>.json (as "
    "chakra_jsonizer writes them: a GlobalMetadata object {\"version\": ..., \"attr\": [...]}, "
    "then Node objects)";

// What a rank file decodes to, handed over as it is read: the GlobalMetadata first, then each
// Node (the same object, refilled: a rank's nodes are never all in memory). Without `node`,
// decoding stops after the GlobalMetadata.
struct RankVisitor {
  std::function<void(const pb::GlobalMetadata&)> metadata;
  std::function<void(const pb::Node&)> node;
};

void decode_protobuf(const std::string& bytes, const std::string& file, const RankVisitor& visit) {
  if (bytes.empty()) {
    throw TraceError(file, "byte 0", "the file is empty: expected a GlobalMetadata message first");
  }
  std::size_t pos = 0;
  bool first = true;
  pb::Node node;
  while (pos < bytes.size()) {
    const std::size_t start = pos;
    std::uint64_t length = 0;
    int shift = 0;
    while (true) {
      if (pos >= bytes.size()) {
        throw TraceError(file, "byte " + std::to_string(start),
                         "the message length is cut off by the end of the file (" +
                             std::to_string(bytes.size()) + " bytes)");
      }
      const auto b = static_cast<unsigned char>(bytes[pos++]);
      length |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) break;
      shift += 7;
      if (shift >= 35) {
        throw TraceError(file, "byte " + std::to_string(start),
                         "the message length is not a valid varint32");
      }
    }
    if (length > bytes.size() - pos) {
      throw TraceError(file, "byte " + std::to_string(start),
                       "message length " + std::to_string(length) +
                           " runs past the end of the file (" + std::to_string(bytes.size()) +
                           " bytes)");
    }
    const char* data = bytes.data() + pos;
    const int size = static_cast<int>(length);
    if (first) {
      pb::GlobalMetadata metadata;
      if (!metadata.ParseFromArray(data, size)) {
        throw TraceError(file, "byte " + std::to_string(start),
                         "the first message (" + std::to_string(length) +
                             " bytes) is not a valid Chakra GlobalMetadata");
      }
      first = false;
      visit.metadata(metadata);
      if (!visit.node) return;
    } else {
      if (!node.ParseFromArray(data, size)) {
        throw TraceError(
            file, "byte " + std::to_string(start),
            "message of " + std::to_string(length) + " bytes is not a valid Chakra Node");
      }
      visit.node(node);
    }
    pos += length;
  }
}

// The first JSON object of a rank file must be a GlobalMetadata ({"version", "attr"}): protobuf's
// parser, which ignores unknown fields, would take any object as an empty one and a PyTorch
// execution trace or another tool's JSON would replay as nothing.
void check_metadata_object(const std::string& object, const std::string& file) {
  json v;
  try {
    v = config::parse_json_depth_bounded(object, file);
  } catch (const config::ConfigError& e) {  // nested deeper than config::kMaxJsonDepth
    throw TraceError(file, "", e.message());
  } catch (const json::exception&) {
    return;  // protobuf's parser names what is wrong
  }
  if (!v.is_object()) return;
  if (v.contains("nodes") && v.contains("schema")) {
    throw TraceError(file, "",
                     "this is a PyTorch execution trace (host ET JSON with \"schema\" and "
                     "\"nodes\"), not a Chakra ET: convert it with chakra_converter first "
                     "(chakra_converter PyTorch --input <file> --output <prefix>.<rank>.et, one "
                     "per rank; with a Kineto trace of the same run, chakra_trace_link before it)");
  }
  if (v.contains("workload_graph")) {
    throw TraceError(file, "",
                     "this is a JSON workload graph ({\"workload_graph\": [...]}, what Chakra's "
                     "JSONNode feeder reads), not a Chakra ET: give the Chakra ET protobuf files "
                     "it was made from (<prefix>.<rank>.et, as chakra_converter writes them) or "
                     "their JSON form from chakra_jsonizer");
  }
  std::string unknown;
  for (const auto& [key, unused] : v.items()) {
    if (key == "version" || key == "attr") continue;
    unknown += (unknown.empty() ? "\"" : ", \"") + key + "\"";
  }
  if (!unknown.empty() || v.empty()) {
    throw TraceError(file, "",
                     "not a Chakra ET: its first JSON object " +
                         (unknown.empty() ? std::string("is empty")
                                          : "has the keys " + unknown +
                                                ", which a GlobalMetadata "
                                                "does not have") +
                         "; " + kChakraExpected);
  }
}

// decode_protobuf, with a hint when what failed to decode is text that looks like JSON.
void decode_protobuf_or_hint(const std::string& bytes, const std::string& file,
                             const RankVisitor& visit) {
  bool visiting = false;  // an error of the visitor's is not one of decoding
  RankVisitor watched{visit.metadata, nullptr};
  if (visit.node) {
    watched.node = [&](const pb::Node& node) {
      visiting = true;
      visit.node(node);
      visiting = false;
    };
  }
  try {
    decode_protobuf(bytes, file, watched);
  } catch (const TraceError& e) {
    if (visiting) throw;
    const auto first = bytes.find_first_not_of(" \t\r\n");
    const bool text = std::all_of(
        bytes.begin(),
        bytes.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(bytes.size(), 256)),
        [](char c) {
          const auto u = static_cast<unsigned char>(c);
          return u >= 0x20 || c == '\n' || c == '\r' || c == '\t';
        });
    if (first == std::string::npos || !text || (bytes[first] != '{' && bytes[first] != '[')) {
      throw;
    }
    throw TraceError(file, "",
                     "this is JSON text, not a Chakra ET protobuf: for Chakra's JSON form name "
                     "the files <prefix>.<rank>.json; a PyTorch execution trace must be converted "
                     "with chakra_converter first; " +
                         std::string(kChakraExpected));
  }
}

// Chakra's jsonizer writes the GlobalMetadata and then every Node as JSON objects one after
// another (not an array); an array of the same objects is accepted too.
void decode_json(const std::string& text, const std::string& file, const RankVisitor& visit) {
  std::size_t pos = 0;
  const std::size_t n = text.size();
  auto skip_space = [&] {
    while (pos < n &&
           (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\r' || text[pos] == '\t')) {
      ++pos;
    }
  };
  skip_space();
  bool in_array = false;
  if (pos < n && text[pos] == '[') {
    in_array = true;
    ++pos;
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // newer Chakra fields (storage) are not ours to read
  std::size_t count = 0;
  pb::Node node;
  while (true) {
    skip_space();
    if (in_array && pos < n && text[pos] == ',' && count > 0) {
      ++pos;
      skip_space();
    }
    if (pos >= n) {
      if (in_array) {
        throw TraceError(file, "byte " + std::to_string(pos),
                         "the JSON array is not closed before the end of the file");
      }
      break;
    }
    if (in_array && text[pos] == ']') {
      ++pos;
      skip_space();
      if (pos < n) {
        throw TraceError(file, "byte " + std::to_string(pos),
                         "unexpected text after the closing ']'");
      }
      break;
    }
    if (text[pos] != '{') {
      throw TraceError(
          file, "byte " + std::to_string(pos),
          std::string("expected '{' (a GlobalMetadata or Node object), found '") + text[pos] + "'");
    }
    const std::size_t start = pos;
    int depth = 0;
    bool in_string = false;
    for (; pos < n; ++pos) {
      const char c = text[pos];
      if (in_string) {
        if (c == '\\') {
          ++pos;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) break;
      }
    }
    if (pos >= n) {
      throw TraceError(file, "byte " + std::to_string(start),
                       "the JSON object starting here is not closed before the end of the file");
    }
    ++pos;
    const std::string object = text.substr(start, pos - start);
    const std::string where =
        "JSON object " + std::to_string(count) + " (byte " + std::to_string(start) + ")";
    if (count == 0) {
      check_metadata_object(object, file);
      pb::GlobalMetadata metadata;
      const auto status = google::protobuf::util::JsonStringToMessage(object, &metadata, options);
      if (!status.ok()) {
        throw TraceError(file, where,
                         "not a Chakra GlobalMetadata: " + std::string(status.message()));
      }
      visit.metadata(metadata);
      if (!visit.node) return;
    } else {
      node.Clear();
      const auto status = google::protobuf::util::JsonStringToMessage(object, &node, options);
      if (!status.ok()) {
        throw TraceError(file, where, "not a Chakra Node: " + std::string(status.message()));
      }
      visit.node(node);
    }
    ++count;
  }
  if (count == 0) {
    throw TraceError(file, "byte 0",
                     "the file holds no JSON objects: expected a GlobalMetadata "
                     "object, then Node objects");
  }
}

// A rank file of either form.
void decode_rank(const std::string& bytes, const std::string& file, bool json_form,
                 const RankVisitor& visit) {
  json_form ? decode_json(bytes, file, visit) : decode_protobuf_or_hint(bytes, file, visit);
}

// ---- Messages -> TraceOps.

struct ImportState {
  int world = 0;
  std::vector<st::Group> groups;
  std::map<std::string, std::uint32_t> group_of_pg;  // pg_name -> index in groups
  bool have_comm_groups = false;
  std::optional<std::uint32_t> world_group;
  std::set<std::string> pgs_taken_as_world;
  std::string groups_source;  // where the groups came from, for messages
  std::int64_t cpu_ops = 0, metadata_nodes = 0, other_nodes = 0, barriers = 0;
  std::int64_t eager_sends = 0, rendezvous_sends = 0, dangling_ctrl_deps = 0, cyclic_ctrl_deps = 0;
  std::int64_t cpu_comm_wrappers = 0, skipped_cpu_comm = 0, nccl_named_compute = 0;

  std::uint32_t world_group_index() {
    if (!world_group) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r) all[static_cast<std::size_t>(r)] = r;
      groups.push_back({std::move(all), "world"});
      world_group = static_cast<std::uint32_t>(groups.size() - 1);
    }
    return *world_group;
  }
};

TraceOp to_trace_op(ImportState& state, const NodeReader& in, int rank) {
  const pb::Node& node = in.node;
  TraceOp op;
  op.id = node.id();
  op.label = node.name();
  op.deps.assign(node.data_deps().begin(), node.data_deps().end());
  op.order_deps.assign(node.ctrl_deps().begin(), node.ctrl_deps().end());
  // Provenance (our own attributes; absent in other tools' traces).
  if (const auto s = in.string(kPhaseAttr)) {
    const auto p = enum_from_name<st::Phase, st::kPhaseCount>(*s);
    if (!p) {
      throw TraceError(in.file, in.where(),
                       std::string("attribute ") + kPhaseAttr + ": expected one of " +
                           enum_names<st::Phase, st::kPhaseCount>() + ", found \"" + *s + "\"");
    }
    op.phase = *p;
  }
  if (const auto m = in.integer(kMicrobatchAttr, -1, std::numeric_limits<std::int32_t>::max())) {
    op.microbatch = static_cast<std::int32_t>(*m);
  }
  if (const auto* a = in.attr(kLayersAttr)) {
    if (a->value_case() != pb::AttributeProto::kInt64List || a->int64_list().values_size() != 2 ||
        a->int64_list().values(0) < -1 || a->int64_list().values(1) < -1 ||
        a->int64_list().values(0) > std::numeric_limits<std::int16_t>::max() ||
        a->int64_list().values(1) > std::numeric_limits<std::int16_t>::max()) {
      throw TraceError(in.file, in.where(),
                       std::string("attribute ") + kLayersAttr +
                           ": expected an int64_list of two layer numbers (first, one past last)");
    }
    op.layer_begin = static_cast<std::int16_t>(a->int64_list().values(0));
    op.layer_end = static_cast<std::int16_t>(a->int64_list().values(1));
  }
  if (const auto e = in.string(kEffectsAttr)) {
    const AttrReader r(in.file, in.where(), kEffectsAttr);
    const json v = r.parse(*e);
    r.array(v, "", 0, 0xFFFF);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::string p = idx(i);
      r.array(v[i], p, 4, 4);
      st::MemoryEffect m;
      m.delta = Bytes(r.integer(v[i][0], p + "[0]", -kMaxBytes, kMaxBytes));
      m.category = r.named<st::MemoryCategory, st::kMemoryCategoryCount>(v[i][1], p + "[1]");
      m.tier = r.named<st::MemoryTier, st::kMemoryTierCount>(v[i][2], p + "[2]");
      m.at_end = r.boolean(v[i][3], p + "[3]");
      op.effects.push_back(m);
    }
  }
  std::optional<st::Stream> stream;
  if (const auto s = in.string(kStreamAttr)) {
    stream = enum_from_name<st::Stream, st::kStreamCount>(*s);
    if (!stream) {
      throw TraceError(in.file, in.where(),
                       std::string("attribute ") + kStreamAttr + ": expected one of " +
                           enum_names<st::Stream, st::kStreamCount>() + ", found \"" + *s + "\"");
    }
  }

  const auto micros = [&]() -> std::optional<Time> {
    if (node.duration_micros() == 0) return std::nullopt;
    if (node.duration_micros() > kMaxMicros) {
      throw TraceError(in.file, in.where(),
                       "duration_micros " + std::to_string(node.duration_micros()) + " is beyond " +
                           std::to_string(kMaxMicros) + " (11 days)");
    }
    return Time::us(static_cast<std::int64_t>(node.duration_micros()));
  };

  switch (node.type()) {
    case pb::COMP_NODE: {
      const bool cpu = in.boolean("is_cpu_op").value_or(false);
      op.stream = stream.value_or(cpu ? st::Stream::host : st::Stream::compute);
      if (cpu) ++state.cpu_ops;
      if (!cpu && looks_like_nccl_kernel(node.name())) ++state.nccl_named_compute;
      op.work = st::Compute{};
      if (const auto k = in.string(kKernelsAttr)) {
        const AttrReader r(in.file, in.where(), kKernelsAttr);
        const json v = r.parse(*k);
        r.array(v, "", 0, 1 << 20);
        for (std::size_t i = 0; i < v.size(); ++i) {
          op.kernels.push_back(kernel_from_json(r, v[i], idx(i)));
        }
        op.kernels_key = *k;  // nodes with the same list share it in the Program
      } else if (const auto d = micros()) {
        op.kernels.push_back({st::Measured{*d}, node.name()});
      } else {
        const auto flops = in.integer("num_ops", 0, std::numeric_limits<std::int64_t>::max());
        const auto bytes = in.integer("tensor_size", 0, kMaxBytes);
        op.kernels.push_back({st::RooflineWork{Flops(static_cast<double>(flops.value_or(0))),
                                               Bytes(bytes.value_or(0)), DType::bf16},
                              node.name()});
      }
      return op;
    }
    case pb::COMM_COLL_NODE: {
      if (!in.attr("comm_type") && in.boolean("is_cpu_op").value_or(false)) {
        // A host-side wrapper of a collective (c10d::allreduce_, nccl:all_reduce,
        // record_param_comms), as Chakra's older PyTorch converter typed them: the collective
        // itself is its GPU twin, which carries comm_type. The host's time issuing it runs on
        // the host stream; without a duration it is skipped (dependencies through it kept).
        ++state.cpu_comm_wrappers;
        op.stream = stream.value_or(st::Stream::host);
        op.work = st::Compute{};
        if (const auto d = micros()) {
          op.kernels.push_back({st::Measured{*d}, node.name()});
        } else {
          ++state.skipped_cpu_comm;
          op.skip = true;
        }
        return op;
      }
      if (!in.attr("comm_type")) {
        throw TraceError(in.file, in.where(),
                         "a COMM_COLL_NODE on the GPU (is_cpu_op false or absent) needs the "
                         "attribute comm_type (Chakra's CollectiveCommType: 0 ALL_REDUCE, ...); "
                         "only host-side wrappers (is_cpu_op true) may leave it out");
      }
      const auto t = in.required("comm_type", 0, std::numeric_limits<std::int32_t>::max());
      const auto type = static_cast<pb::CollectiveCommType>(t);
      const auto kind = pb::CollectiveCommType_IsValid(static_cast<int>(t)) ? collective_kind(type)
                                                                            : std::nullopt;
      if (!kind) {
        throw TraceError(in.file, in.where(),
                         "comm_type " + std::to_string(t) +
                             (pb::CollectiveCommType_IsValid(static_cast<int>(t))
                                  ? " (" + pb::CollectiveCommType_Name(type) + ")"
                                  : std::string()) +
                             " is not supported: stratasim simulates ALL_REDUCE, REDUCE, "
                             "ALL_GATHER, BROADCAST, ALL_TO_ALL, REDUCE_SCATTER(_BLOCK) and "
                             "BARRIER");
      }
      st::Collective c;
      c.kind = *kind;
      if (type == pb::BARRIER) {
        ++state.barriers;
        c.bytes = Bytes(in.integer("comm_size", 0, kMaxBytes).value_or(0));
      } else {
        c.bytes = Bytes(in.required("comm_size", 0, kMaxBytes));
      }
      if (const auto d = in.string(kDtypeAttr)) {
        const auto dt = dtype_from_name(*d);
        if (!dt) {
          throw TraceError(
              in.file, in.where(),
              std::string("attribute ") + kDtypeAttr +
                  ": expected a dtype name (fp32, tf32, fp16, bf16, fp8, fp4), found \"" + *d +
                  "\"");
        }
        c.dtype = *dt;
      }
      const auto pg = in.string("pg_name");
      if (!pg) {
        c.group = state.world_group_index();
      } else if (auto it = state.group_of_pg.find(*pg); it != state.group_of_pg.end()) {
        c.group = it->second;
      } else if (*pg == "0") {
        // ASTRA-sim's reserved group 0: no group, all ranks.
        c.group = state.world_group_index();
      } else if (state.have_comm_groups) {
        throw TraceError(
            in.file, in.where(),
            "pg_name \"" + *pg + "\" is not a process group of " + state.groups_source);
      } else {
        state.pgs_taken_as_world.insert(*pg);
        c.group = state.world_group_index();
      }
      // Chakra's and ASTRA-sim's all-gather comm_size is one rank's input (ASTRA-sim's Ring:
      // final_data_size = data_size * nodes_in_ring); the Program's is the whole output.
      if (c.kind == st::CollectiveKind::all_gather) {
        if (const auto exact = in.integer(kBytesAttr, 0, kMaxBytes)) {
          c.bytes = Bytes(*exact);
        } else {
          c.bytes = Bytes(
              chakra_to_program_bytes(c.kind, c.bytes.count(), state.groups[c.group].ranks.size()));
        }
      }
      const std::string& group_name = state.groups[c.group].name;
      op.stream =
          stream.value_or(looks_data_parallel(pg.value_or("")) || looks_data_parallel(group_name)
                              ? st::Stream::dp_comm
                              : st::Stream::tp_comm);
      op.work = c;
      return op;
    }
    case pb::COMM_SEND_NODE:
    case pb::COMM_RECV_NODE: {
      const bool send = node.type() == pb::COMM_SEND_NODE;
      const auto limit = static_cast<std::int64_t>(state.world) - 1;
      const auto bytes = Bytes(in.required("comm_size", 0, kMaxBytes));
      const auto peer =
          static_cast<std::int32_t>(in.required(send ? "comm_dst" : "comm_src", 0, limit));
      if (const auto self = in.integer(send ? "comm_src" : "comm_dst", 0, limit);
          self && *self != rank) {
        throw TraceError(in.file, in.where(),
                         std::string(send ? "comm_src" : "comm_dst") + " is " +
                             std::to_string(*self) + ", but the node is in rank " +
                             std::to_string(rank) + "'s file");
      }
      if (send) {
        // Chakra's semantics: a send does not wait for its receive (kRendezvousAttr: ours).
        const bool rendezvous = in.boolean(kRendezvousAttr).value_or(false);
        ++(rendezvous ? state.rendezvous_sends : state.eager_sends);
        op.work = st::Send{peer, bytes, st::kNcclSms, !rendezvous};
        op.stream = stream.value_or(st::Stream::pp_send);
      } else {
        op.work = st::Recv{peer, bytes};
        op.stream = stream.value_or(st::Stream::pp_recv);
      }
      return op;
    }
    case pb::MEM_LOAD_NODE:
    case pb::MEM_STORE_NODE: {
      // A transfer between host and device memory of tensor_size bytes.
      const bool load = node.type() == pb::MEM_LOAD_NODE;
      const auto bytes = Bytes(in.integer("tensor_size", 0, kMaxBytes).value_or(0));
      op.stream = stream.value_or(st::Stream::copy);
      op.work = st::Compute{};
      if (const auto k = in.string(kKernelsAttr)) {  // ours: the exact kernel and its name
        const AttrReader r(in.file, in.where(), kKernelsAttr);
        const json v = r.parse(*k);
        r.array(v, "", 0, 1 << 20);
        for (std::size_t i = 0; i < v.size(); ++i) {
          op.kernels.push_back(kernel_from_json(r, v[i], idx(i)));
        }
        op.kernels_key = *k;
        return op;
      }
      op.kernels.push_back({st::Copy{bytes, load ? st::MemoryTier::host : st::MemoryTier::device,
                                     load ? st::MemoryTier::device : st::MemoryTier::host},
                            node.name()});
      return op;
    }
    case pb::METADATA_NODE:
      ++state.metadata_nodes;
      op.skip = true;
      return op;
    default:
      ++state.other_nodes;
      op.skip = true;
      return op;
  }
}

// ---- Process groups from "## process_group:init ##" (kProcessGroupInit).

struct ProcessGroup {
  std::string name, desc;
  std::vector<std::int32_t> ranks;  // empty: all ranks
};

// The groups a process_group:init node lists in its inputs.values: the Python str() of a list
// holding one string, the JSON [{"pg_name": ..., "ranks": [...], ...}, ...] (Chakra's PyTorch
// converter writes str(inputs["values"])); a JSON array of that one string, or the JSON list
// itself, are read too. Empty values: none (ASTRA-sim skips such a node).
std::vector<ProcessGroup> process_groups_of(const pb::Node& node, const std::string& file,
                                            int world) {
  const std::string where = "node " + std::to_string(node.id()) + " (" + node.name() + ")";
  const std::string expected =
      "inputs.values: expected the process groups as PyTorch records them, ['[{\"pg_name\": "
      "\"0\", \"ranks\": [0, 1], ...}, ...]'] (a list holding the JSON of the groups)";
  std::string text = node.inputs().values();
  const auto b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  text = text.substr(b, text.find_last_not_of(" \t\r\n") - b + 1);
  if (text == "[]" || text == "['']" || text == "[\"\"]") return {};
  json groups;
  try {
    groups = config::parse_json_depth_bounded(text, file);
  } catch (const json::exception&) {
    // Python's str() of a one-string list: ['...'], with \\ and \' escaped.
    if (text.size() < 4 || !text.starts_with("['") || !text.ends_with("']")) {
      throw TraceError(file, where, expected);
    }
    std::string inner;
    for (std::size_t i = 2; i + 2 < text.size(); ++i) {
      if (text[i] == '\\' && i + 3 < text.size()) ++i;
      inner += text[i];
    }
    try {
      groups = config::parse_json_depth_bounded(inner, file);
    } catch (const json::exception& e) {
      throw TraceError(file, where, expected + "; the JSON in it is not valid: " + e.what());
    }
  }
  // Unwrap one-element lists down to the list of groups: ['<json>'] (the converter's str()),
  // ["<json>"], and [[<json list>]] (tools that write "[[" + json.dumps(groups) + "]]", which
  // ASTRA-sim's substr(2, size - 4) reads the same way).
  for (int depth = 0; depth < 4 && groups.is_array() && groups.size() == 1; ++depth) {
    if (groups[0].is_string()) {
      try {
        groups = config::parse_json_depth_bounded(groups[0].get<std::string>(), file);
      } catch (const json::exception& e) {
        throw TraceError(file, where, expected + "; the JSON in it is not valid: " + e.what());
      }
    } else if (groups[0].is_array()) {
      json inner = groups[0];
      groups = std::move(inner);
    } else {
      break;
    }
  }
  if (!groups.is_array()) throw TraceError(file, where, expected);
  std::vector<ProcessGroup> out;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const json& g = groups[i];
    const std::string path = "inputs.values" + idx(i);
    if (!g.is_object() || !g.contains("pg_name") || !g.contains("ranks") ||
        !(g["pg_name"].is_string() || g["pg_name"].is_number_integer()) || !g["ranks"].is_array()) {
      throw TraceError(file, where,
                       path + ": expected {\"pg_name\": \"<name>\", \"ranks\": [ranks...]}");
    }
    ProcessGroup pg;
    pg.name = g["pg_name"].is_string() ? g["pg_name"].get<std::string>() : g["pg_name"].dump();
    if (g.contains("pg_desc") && g["pg_desc"].is_string()) pg.desc = g["pg_desc"];
    const json& ranks = g["ranks"];
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      if (!ranks[k].is_number_integer() || ranks[k].get<std::int64_t>() < 0 ||
          ranks[k].get<std::int64_t>() >= world) {
        throw TraceError(file, where,
                         path + ".ranks" + idx(k) + ": expected a rank from 0 to " +
                             std::to_string(world - 1) + " (the trace has " +
                             std::to_string(world) + " rank files)");
      }
      pg.ranks.push_back(static_cast<std::int32_t>(ranks[k].get<std::int64_t>()));
    }
    out.push_back(std::move(pg));
  }
  return out;
}

// Positions of `ops` in a topological order of their data dependencies (and ctrl_deps, with
// `with_ctrl`), ties by file position (Kahn's algorithm); nullopt when the graph is cyclic or
// its ids are not unique (trace_builder reports those).
std::optional<std::vector<std::size_t>> topological_positions(const std::vector<TraceOp>& ops,
                                                              bool with_ctrl) {
  std::map<std::uint64_t, std::size_t> index;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!index.emplace(ops[i].id, i).second) return std::nullopt;
  }
  std::vector<std::vector<std::size_t>> next(ops.size());
  std::vector<std::size_t> pending(ops.size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    auto add = [&](std::uint64_t d) {
      if (const auto it = index.find(d); it != index.end()) {
        next[it->second].push_back(i);
        ++pending[i];
      }
    };
    for (const auto d : ops[i].deps) add(d);
    if (with_ctrl) {
      for (const auto d : ops[i].order_deps) add(d);
    }
  }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<std::size_t> position(ops.size());
  std::size_t placed = 0;
  while (!ready.empty()) {
    const std::size_t i = ready.top();
    ready.pop();
    position[i] = placed++;
    for (const std::size_t j : next[i]) {
      if (--pending[j] == 0) ready.push(j);
    }
  }
  if (placed != ops.size()) return std::nullopt;
  return position;
}

// When the ctrl_deps close a cycle that the data_deps alone do not, the ctrl_deps that point
// backwards in the data dependencies' order are dropped; returns how many. Traces that are
// acyclic keep every ctrl_dep.
std::int64_t drop_cyclic_ctrl_deps(std::vector<TraceOp>& ops) {
  if (topological_positions(ops, true)) return 0;
  const auto position = topological_positions(ops, false);
  if (!position) return 0;  // a cycle of data dependencies: trace_builder names it
  std::map<std::uint64_t, std::size_t> index;
  for (std::size_t i = 0; i < ops.size(); ++i) index.emplace(ops[i].id, i);
  std::int64_t dropped = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    auto& deps = ops[i].order_deps;
    const auto backwards = std::remove_if(deps.begin(), deps.end(), [&](std::uint64_t d) {
      return (*position)[index.at(d)] >= (*position)[i];
    });
    dropped += deps.end() - backwards;
    deps.erase(backwards, deps.end());
  }
  return dropped;
}

std::string rank_file(std::string_view source, int rank, bool json_form) {
  return std::string(source) + "." + std::to_string(rank) + (json_form ? ".json" : ".et");
}

}  // namespace

namespace {

// Rank r's file: the bytes given, or `storage` filled from the file when asked (one rank's
// bytes in memory at a time).
using RankBytes = std::function<const std::string&(int rank, std::string& storage)>;

// The Program's group names we wrote ourselves (stratasim.groups), index-aligned with the
// comm-group keys "<base>", "<base + 1>", ... (base 1 since group ids start at 1; 0 in older
// exports).
struct GroupNames {
  std::vector<std::string> names;
  std::int64_t id_base = 0;
};

GroupNames group_names_of(const pb::GlobalMetadata& metadata, const std::string& file) {
  GroupNames out;
  if (const auto* a = find_attr(metadata.attr(), kGroupIdBaseAttr)) {
    const auto v = integer_value(*a);
    if (!v || *v < 0 || *v > 1) {
      throw TraceError(file, "GlobalMetadata",
                       std::string("attribute ") + kGroupIdBaseAttr + ": expected 0 or 1");
    }
    out.id_base = *v;
  }
  if (const auto* a = find_attr(metadata.attr(), kGroupNamesAttr)) {
    const AttrReader r(file, "GlobalMetadata", kGroupNamesAttr);
    if (a->value_case() != pb::AttributeProto::kStringVal) r.fail("", "a JSON string");
    const json v = r.parse(a->string_val());
    r.array(v, "", 0, 1 << 24);
    for (std::size_t i = 0; i < v.size(); ++i) out.names.push_back(r.string(v[i], idx(i)));
  }
  return out;
}

// The comm-group file (ASTRA-sim's {"<pg_name>": [ranks...], ...}) into state.groups.
void read_comm_groups(ImportState& state, const std::string& text, const std::string& file,
                      const GroupNames& names) {
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw TraceError(file, "", std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) {
    throw TraceError(file, "", "expected an object {\"<pg_name>\": [ranks...], ...}");
  }
  state.have_comm_groups = true;
  state.groups_source = "the comm-group file";
  for (const auto& [key, ranks] : doc.items()) {
    if (!ranks.is_array() || ranks.empty()) {
      throw TraceError(file, key, "expected a non-empty array of ranks");
    }
    st::Group g;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const auto& v = ranks[i];
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
          v.get<std::int64_t>() >= state.world) {
        throw TraceError(file, key + idx(i),
                         "expected a rank from 0 to " + std::to_string(state.world - 1) +
                             " (the trace has " + std::to_string(state.world) + " rank files)");
      }
      g.ranks.push_back(static_cast<std::int32_t>(v.get<std::int64_t>()));
    }
    const std::size_t index = state.groups.size();
    g.name = index < names.names.size() &&
                     key == std::to_string(static_cast<std::int64_t>(index) + names.id_base)
                 ? names.names[index]
                 : "pg " + key;
    state.group_of_pg.emplace(key, static_cast<std::uint32_t>(index));
    state.groups.push_back(std::move(g));
  }
}

[[noreturn]] void no_nodes(const std::string& file, int world) {
  throw TraceError(file, "",
                   "the trace has no nodes (" + std::to_string(world) +
                       " rank files, each only a GlobalMetadata): nothing to replay");
}

// Without a comm-group file: the process groups that PyTorch-converted traces keep in their
// "## process_group:init ##" METADATA_NODEs (every rank lists every group). A pass over every
// rank's file that keeps only those nodes; returns how many there were.
std::size_t read_process_groups(ImportState& state, const RankBytes& bytes,
                                const std::vector<std::string>& files, bool json_form) {
  std::vector<std::pair<std::size_t, pb::Node>> pg_nodes;  // (rank, node)
  std::size_t nodes = 0;
  for (std::size_t r = 0; r < files.size(); ++r) {
    std::string storage;
    decode_rank(bytes(static_cast<int>(r), storage), files[r], json_form,
                {[](const pb::GlobalMetadata&) {},
                 [&](const pb::Node& node) {
                   ++nodes;
                   if (node.type() == pb::METADATA_NODE &&
                       node.name().find(kProcessGroupInit) != std::string::npos) {
                     pg_nodes.emplace_back(r, node);
                   }
                 }});
  }
  if (nodes == 0) no_nodes(files[0], state.world);
  std::map<std::string, std::string> first_file;  // pg_name -> the file that defined it
  for (const auto& [r, node] : pg_nodes) {
    for (auto& pg : process_groups_of(node, files[r], state.world)) {
      std::vector<std::int32_t> ranks = pg.ranks;
      if (ranks.empty()) {
        for (int k = 0; k < state.world; ++k) ranks.push_back(k);
      }
      if (const auto it = state.group_of_pg.find(pg.name); it != state.group_of_pg.end()) {
        if (state.groups[it->second].ranks != ranks) {
          throw TraceError(files[r], "node " + std::to_string(node.id()) + " (" + node.name() + ")",
                           "process group \"" + pg.name + "\" has ranks " + json(ranks).dump() +
                               " here but " + json(state.groups[it->second].ranks).dump() + " in " +
                               first_file[pg.name]);
        }
        continue;
      }
      first_file[pg.name] = files[r];
      state.group_of_pg.emplace(pg.name, static_cast<std::uint32_t>(state.groups.size()));
      state.groups.push_back({std::move(ranks), pg.desc.empty()
                                                    ? "pg " + pg.name
                                                    : pg.desc + " (pg " + pg.name + ")"});
    }
  }
  if (!state.groups.empty()) {
    state.have_comm_groups = true;
    state.groups_source = "the \"## process_group:init ##\" metadata nodes";
  }
  return pg_nodes.size();
}

// stratasim.initial_memory of a rank's GlobalMetadata.
void read_initial_memory(const pb::GlobalMetadata& metadata, const std::string& file,
                         TraceRank& rank) {
  const auto* a = find_attr(metadata.attr(), kInitialMemoryAttr);
  if (a == nullptr) return;
  const AttrReader in(file, "GlobalMetadata", kInitialMemoryAttr);
  if (a->value_case() != pb::AttributeProto::kStringVal) in.fail("", "a JSON string");
  const json v = in.parse(a->string_val());
  in.array(v, "", 0, 1 << 16);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string p = idx(i);
    in.array(v[i], p, 3, 3);
    rank.initial_memory.push_back(
        {in.named<st::MemoryCategory, st::kMemoryCategoryCount>(v[i][0], p + "[0]"),
         in.named<st::MemoryTier, st::kMemoryTierCount>(v[i][1], p + "[1]"),
         Bytes(in.integer(v[i][2], p + "[2]", 0, kMaxBytes))});
  }
}

// Rank r's file into `rank`: its initial memory and a TraceOp per node, converted as the nodes
// are decoded; returns how many nodes it has.
std::size_t read_rank(ImportState& state, const std::string& bytes, const std::string& file,
                      bool json_form, int r, TraceRank& rank) {
  rank.source = file;
  std::size_t nodes = 0;
  decode_rank(
      bytes, file, json_form,
      {[&](const pb::GlobalMetadata& metadata) { read_initial_memory(metadata, file, rank); },
       [&](const pb::Node& node) {
         ++nodes;
         rank.ops.push_back(to_trace_op(state, NodeReader{file, node}, r));
       }});
  rank.ops.shrink_to_fit();
  // Chakra's PyTorch converter keeps a node's ctrl_deps on its parent op even where it did
  // not convert the parent (the profiler's thread and process nodes); Chakra's feeder reads
  // only data_deps. Such ctrl_deps order nothing: dropped, counted. (A data_deps on a missing
  // node stays an error: the consumer would wait for it forever.)
  std::set<std::uint64_t> ids;
  for (const auto& op : rank.ops) ids.insert(op.id);
  for (auto& op : rank.ops) {
    const auto missing = std::remove_if(op.order_deps.begin(), op.order_deps.end(),
                                        [&](std::uint64_t d) { return !ids.contains(d); });
    state.dangling_ctrl_deps += op.order_deps.end() - missing;
    op.order_deps.erase(missing, op.order_deps.end());
  }
  state.cyclic_ctrl_deps += drop_cyclic_ctrl_deps(rank.ops);
  return nodes;
}

// The import of `world` rank files, read one at a time (`bytes`): rank 0's GlobalMetadata
// (group names), the comm groups, without a comm-group file a pass for the process-group
// nodes, then each rank's nodes converted as they are decoded and the rank built into the
// Program (ProgramBuilder). What stays in memory is the Program and one rank's file and
// TraceOps, not every file, decoded message or TraceOp.
ImportedTrace import_ranks(int world, const RankBytes& bytes,
                           const std::optional<std::string>& comm_groups, std::string_view source,
                           bool json_form) {
  const std::string name(source);
  ImportState state;
  state.world = world;
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) files.push_back(rank_file(source, r, json_form));
  pb::GlobalMetadata metadata0;
  {
    std::string storage;
    decode_rank(bytes(0, storage), files[0], json_form,
                {[&](const pb::GlobalMetadata& m) { metadata0 = m; }, nullptr});
  }
  const GroupNames names = group_names_of(metadata0, files[0]);
  if (comm_groups) read_comm_groups(state, *comm_groups, name + ".comm_groups.json", names);
  const std::size_t pg_nodes =
      comm_groups ? 0 : read_process_groups(state, bytes, files, json_form);
  std::optional<std::string> cluster;
  if (const auto* a = find_attr(metadata0.attr(), kClusterAttr)) {
    if (a->value_case() != pb::AttributeProto::kStringVal) {
      AttrReader(files[0], "GlobalMetadata", kClusterAttr).fail("", "a string");
    }
    if (!a->string_val().empty()) cluster = a->string_val();
  }
  // Each rank into the Program as soon as it is read: its TraceOps are freed before the next.
  ProgramBuilder builder(world, state.groups, files[0]);
  std::size_t nodes = 0;
  for (int r = 0; r < world; ++r) {
    std::string storage;
    const auto ru = static_cast<std::size_t>(r);
    TraceRank rank;
    nodes += read_rank(state, bytes(r, storage), files[ru], json_form, r, rank);
    // A group found while reading (the "world" group of pg_names taken as every rank).
    while (builder.group_count() < state.groups.size()) {
      builder.add_group(state.groups[builder.group_count()]);
    }
    builder.add_rank(rank);
  }
  if (nodes == 0) no_nodes(files[0], world);
  ImportedTrace result{std::move(builder).finish(), {}, cluster};
  if (!state.pgs_taken_as_world.empty()) {
    std::string pgs;
    for (const auto& pg : state.pgs_taken_as_world) pgs += (pgs.empty() ? "" : ", ") + pg;
    result.notes.push_back("no comm-group file (" + name +
                           ".comm_groups.json): collectives on process groups " + pgs +
                           " were taken as spanning all " + std::to_string(state.world) + " ranks");
  }
  if (pg_nodes > 0 && state.have_comm_groups) {
    result.notes.push_back("process groups read from " + std::to_string(pg_nodes) +
                           " \"## process_group:init ##\" metadata nodes (" +
                           std::to_string(state.groups.size()) +
                           " groups); collectives find theirs by pg_name");
  }
  if (state.dangling_ctrl_deps > 0) {
    result.notes.push_back(std::to_string(state.dangling_ctrl_deps) +
                           " ctrl_deps on nodes the trace does not have ignored (Chakra's "
                           "converter keeps the parent of a node whose parent it dropped; its "
                           "feeder orders by data_deps)");
  }
  if (state.cyclic_ctrl_deps > 0) {
    result.notes.push_back(std::to_string(state.cyclic_ctrl_deps) +
                           " ctrl_deps that would close a dependency cycle ignored (Chakra's "
                           "1.0.1 traces list a CPU op's own GPU kernel, or the op itself, as "
                           "its ctrl_deps; Chakra's feeder orders by data_deps)");
  }
  if (state.eager_sends > 0) {
    result.notes.push_back(
        std::to_string(state.eager_sends) +
        " sends replayed with Chakra's semantics (as ASTRA-sim runs them): a send does not wait "
        "for its receive; its transfer starts when it is issued and it ends when the data has "
        "arrived; the receive ends once it is posted and the data is there");
  }
  if (state.rendezvous_sends > 0) {
    result.notes.push_back(std::to_string(state.rendezvous_sends) +
                           " sends keep stratasim's rendezvous semantics (" + kRendezvousAttr +
                           ", written by stratasim export): a send and its receive start "
                           "together and end together");
  }
  if (state.cpu_comm_wrappers > 0) {
    result.notes.push_back(
        std::to_string(state.cpu_comm_wrappers) +
        " host-side COMM_COLL_NODEs without comm_type (is_cpu_op: the CPU wrappers of a "
        "collective, such as c10d::allreduce_ or nccl:all_reduce, which the collective's GPU "
        "node carries) run as host compute of their duration_micros" +
        (state.skipped_cpu_comm > 0
             ? "; " + std::to_string(state.skipped_cpu_comm) +
                   " without a duration skipped (dependencies through them kept)"
             : std::string()));
  }
  if (state.nccl_named_compute > 0) {
    result.notes.push_back(std::to_string(state.nccl_named_compute) +
                           " COMP_NODEs named as NCCL kernels kept as compute (Chakra types them "
                           "so; as ASTRA-sim does, their time is not simulated as communication)");
  }
  if (state.cpu_ops > 0) {
    result.notes.push_back(std::to_string(state.cpu_ops) +
                           " CPU compute nodes (is_cpu_op) run on the host stream");
  }
  if (state.barriers > 0) {
    result.notes.push_back(std::to_string(state.barriers) +
                           " BARRIER collectives simulated as all-reduces of comm_size bytes");
  }
  if (state.metadata_nodes > 0) {
    result.notes.push_back(std::to_string(state.metadata_nodes) + " METADATA nodes skipped");
  }
  if (state.other_nodes > 0) {
    result.notes.push_back(std::to_string(state.other_nodes) +
                           " nodes of other types (INVALID, STORAGE, BATCH, CHECKPOINT) skipped; "
                           "dependencies through them are kept");
  }
  return result;
}

}  // namespace

ImportedTrace import_chakra_buffers(const std::vector<std::string>& per_rank,
                                    const std::optional<std::string>& comm_groups,
                                    std::string_view source, bool json_form) {
  const std::string name(source);
  if (per_rank.empty()) throw TraceError(name, "", "the trace has no rank files");
  if (per_rank.size() > static_cast<std::size_t>(kMaxRanks)) {
    throw TraceError(name, "", "more than " + std::to_string(kMaxRanks) + " ranks");
  }
  return import_ranks(
      static_cast<int>(per_rank.size()),
      [&](int r, std::string&) -> const std::string& {
        return per_rank[static_cast<std::size_t>(r)];
      },
      comm_groups, source, json_form);
}

ImportedTrace import_chakra(const fs::path& path) {
  const std::string given = path.string();
  std::error_code ec;
  fs::path dir;
  std::string stem;  // empty: any prefix in `dir`, which must be unique
  if (fs::is_directory(path, ec)) {
    dir = path;
  } else {
    dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    stem = path.filename().string();
    // A rank file given directly ("trace.0.et"): its prefix.
    for (const char* ext : {".et", ".json"}) {
      const std::string e(ext);
      if (stem.size() > e.size() && stem.ends_with(e)) {
        const std::string base = stem.substr(0, stem.size() - e.size());
        const auto dot = base.rfind('.');
        if (dot != std::string::npos && dot + 1 < base.size() &&
            std::all_of(base.begin() + static_cast<std::ptrdiff_t>(dot) + 1, base.end(),
                        [](char c) { return c >= '0' && c <= '9'; })) {
          stem = base.substr(0, dot);
        }
      }
    }
  }
  if (!fs::is_directory(dir, ec)) {
    throw TraceError(given, "", "no such folder or trace prefix");
  }
  // prefix -> extension -> rank -> file
  std::map<std::string, std::map<std::string, std::map<int, fs::path>>> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string file = entry.path().filename().string();
    for (const char* ext : {".et", ".json"}) {
      const std::string e(ext);
      if (file.size() <= e.size() || !file.ends_with(e)) continue;
      const std::string base = file.substr(0, file.size() - e.size());
      const auto dot = base.rfind('.');
      if (dot == std::string::npos || dot == 0) continue;
      const std::string digits = base.substr(dot + 1);
      int rank = -1;
      const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
      if (err != std::errc() || end != digits.data() + digits.size() || digits.empty() ||
          rank < 0 || rank >= kMaxRanks) {
        continue;
      }
      const std::string prefix = base.substr(0, dot);
      if (!stem.empty() && prefix != stem) continue;
      found[prefix][e][rank] = entry.path();
    }
  }
  if (found.empty() && fs::is_regular_file(path, ec)) {
    // One file not named as a rank file: say what it is if it is not a Chakra trace, and how
    // to name it if it is.
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const std::string bytes = text.str();
    const auto first = bytes.find_first_not_of(" \t\r\n");
    const bool json_text =
        first != std::string::npos && (bytes[first] == '{' || bytes[first] == '[');
    decode_rank(bytes, given, json_text,
                {[](const pb::GlobalMetadata&) {}, [](const pb::Node&) {}});
    throw TraceError(given, "",
                     "a Chakra trace is one file per rank named <prefix>.<rank>.et (or .json), "
                     "numbered from 0: name this file " +
                         path.stem().string() + ".0" + (json_text ? ".json" : ".et") +
                         " to replay it as one rank");
  }
  if (found.empty()) {
    throw TraceError(given, "",
                     "no Chakra trace files: expected per-rank files named "
                     "<prefix>.<rank>.et (or .json)" +
                         (stem.empty() ? " in this folder" : " with prefix \"" + stem + "\""));
  }
  if (found.size() > 1) {
    std::string prefixes;
    for (const auto& [p, unused] : found) prefixes += (prefixes.empty() ? "" : ", ") + p;
    throw TraceError(given, "",
                     "the folder holds several traces (prefixes " + prefixes +
                         "); give one as <folder>/<prefix>");
  }
  const std::string prefix = found.begin()->first;
  auto& by_ext = found.begin()->second;
  std::vector<std::string> notes;
  const bool json_form = !by_ext.contains(".et");
  if (by_ext.size() > 1) notes.push_back("both .et and .json files found: the .et files were read");
  const auto& ranks = by_ext[json_form ? ".json" : ".et"];
  const int world = ranks.rbegin()->first + 1;
  const fs::path base = dir / prefix;
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw TraceError(p.string(), "", "cannot be read");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  for (int r = 0; r < world; ++r) {
    if (!ranks.contains(r)) {
      // A file that is not a Chakra trace at all (a PyTorch execution trace named like a rank
      // file) says so before any rank is missed.
      const fs::path& present_file = ranks.begin()->second;
      const std::string bytes = read(present_file);
      decode_rank(bytes, present_file.string(), json_form,
                  {[](const pb::GlobalMetadata&) {}, [](const pb::Node&) {}});
      std::string present;
      for (const auto& [k, unused] : ranks) {
        present += (present.empty() ? "" : ", ") + std::to_string(k);
      }
      throw TraceError(given, "",
                       "rank " + std::to_string(r) + "'s file " +
                           fs::path(rank_file(base.string(), r, json_form)).filename().string() +
                           " is missing (found " + (ranks.size() == 1 ? "only rank " : "ranks ") +
                           present + " of prefix \"" + prefix +
                           "\"): a Chakra trace is one file per rank, " + prefix + ".0" +
                           (json_form ? ".json" : ".et") + " to " + prefix + ".<N-1>" +
                           (json_form ? ".json" : ".et"));
    }
  }
  std::optional<std::string> groups;
  const fs::path groups_file = base.string() + ".comm_groups.json";
  if (fs::exists(groups_file, ec)) groups = read(groups_file);
  // Each rank's file is read when its turn comes, not all at once.
  auto result = import_ranks(
      world,
      [&](int r, std::string& storage) -> const std::string& {
        storage = read(ranks.at(r));
        return storage;
      },
      groups, base.string(), json_form);
  result.notes.insert(result.notes.begin(), notes.begin(), notes.end());
  return result;
}

// ---- Export.

namespace {

void set_string(pb::AttributeProto* a, std::string_view name, std::string value) {
  a->set_name(std::string(name));
  a->set_string_val(std::move(value));
}

void add_int64(pb::Node& n, std::string_view name, std::int64_t v) {
  auto* a = n.add_attr();
  a->set_name(std::string(name));
  a->set_int64_val(v);
}

void add_int32(pb::Node& n, std::string_view name, std::int32_t v) {
  auto* a = n.add_attr();
  a->set_name(std::string(name));
  a->set_int32_val(v);
}

void add_string(pb::Node& n, std::string_view name, std::string v) {
  set_string(n.add_attr(), name, std::move(v));
}

// A kernel's num_ops for ASTRA-sim's roofline (Workload::issue_comp: time = num_ops /
// perf(num_ops / tensor_size)): its matrix FLOPs (strategies::matmul_flops, Megatron's
// convention); for memory-bound kernels, which have none, one operation per element (the
// optimizer step: per parameter; a copy: per byte). Zero there makes the roofline's
// operational intensity 0 and stalls the node; any positive count gives such a kernel
// tensor_size / bandwidth, as the cost model charges it.
double roofline_ops(const st::Kernel& k) {
  const double flops = st::matmul_flops(k).count();
  if (flops > 0) return flops;
  if (const auto* e = std::get_if<st::Elementwise>(&k.work))
    return static_cast<double>(e->elements);
  if (const auto* o = std::get_if<st::OptimizerStep>(&k.work))
    return static_cast<double>(o->params);
  if (const auto* c = std::get_if<st::Copy>(&k.work)) return static_cast<double>(c->bytes.count());
  return 0;
}

void append_delimited(std::string& out, const google::protobuf::Message& m) {
  std::string bytes;
  if (!m.SerializeToString(&bytes)) throw std::runtime_error("Chakra export: serialization failed");
  auto size = static_cast<std::uint64_t>(bytes.size());
  do {
    auto b = static_cast<unsigned char>(size & 0x7F);
    size >>= 7;
    if (size != 0) b |= 0x80;
    out.push_back(static_cast<char>(b));
  } while (size != 0);
  out += bytes;
}

void append_json(std::string& out, const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  std::string text;
  const auto status = google::protobuf::util::MessageToJsonString(m, &text, options);
  if (!status.ok()) {
    throw std::runtime_error("Chakra export: " + std::string(status.message()));
  }
  out += text;
  if (out.empty() || out.back() != '\n') out += '\n';
}

}  // namespace

namespace {

// Rank r's GlobalMetadata: the schema, the groups' names (`group_names`, JSON) and id base, the
// rank's initial memory and the cluster.
pb::GlobalMetadata rank_metadata(const st::Program& program, int r, const std::string& group_names,
                                 const ChakraExportOptions& options) {
  pb::GlobalMetadata meta;
  meta.set_version(kChakraVersion);
  set_string(meta.add_attr(), "schema", "stratasim");
  set_string(meta.add_attr(), kGroupNamesAttr, group_names);
  {
    auto* a = meta.add_attr();
    a->set_name(kGroupIdBaseAttr);
    a->set_int64_val(kExportedGroupIdBase);
  }
  json initial = json::array();
  for (const auto& m : program.initial_memory(r)) {
    initial.push_back(json::array({st::name_of(m.category), st::name_of(m.tier), m.bytes.count()}));
  }
  set_string(meta.add_attr(), kInitialMemoryAttr, initial.dump());
  if (!options.cluster.empty()) set_string(meta.add_attr(), kClusterAttr, options.cluster);
  return meta;
}

// With single_comm_queue: per op of rank r, the previous communication node in simulated start
// order (index within the rank; -1 for the first and for compute).
std::vector<std::int64_t> previous_comm(const st::Program& program, int r, const Timeline* timeline,
                                        bool single_comm_queue) {
  const auto ops = program.ops_of(r);
  std::vector<std::int64_t> previous(ops.size(), -1);
  if (!single_comm_queue) return previous;
  const st::OpId first = program.first_op(r);
  std::vector<std::size_t> comms;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!std::holds_alternative<st::Compute>(ops[i].work)) comms.push_back(i);
  }
  std::sort(comms.begin(), comms.end(), [&](std::size_t a, std::size_t b) {
    const Span& x = timeline->spans[first + a];
    const Span& y = timeline->spans[first + b];
    if (x.start != y.start) return x.start < y.start;
    if (x.end != y.end) return x.end < y.end;
    return a < b;
  });
  for (std::size_t j = 1; j < comms.size(); ++j) {
    previous[comms[j]] = static_cast<std::int64_t>(comms[j - 1]);
  }
  return previous;
}

void add_is_cpu_op(pb::Node& node) {
  auto* cpu = node.add_attr();
  cpu->set_name("is_cpu_op");
  cpu->set_bool_val(false);
}

// A compute op: a COMP_NODE with num_ops and tensor_size for ASTRA-sim's roofline, or a lone
// host <-> device copy as a memory node: ASTRA-sim moves a MEM_LOAD_NODE's or
// MEM_STORE_NODE's tensor_size bytes through its memory model (Workload::issue_remote_mem),
// not the GPU's roofline.
void set_compute(pb::Node& node, const std::vector<st::Kernel>& list) {
  const st::Copy* copy = list.size() == 1 ? std::get_if<st::Copy>(&list[0].work) : nullptr;
  const bool load =
      copy && copy->from == st::MemoryTier::host && copy->to == st::MemoryTier::device;
  const bool store =
      copy && copy->from == st::MemoryTier::device && copy->to == st::MemoryTier::host;
  if (load || store) {
    node.set_type(load ? pb::MEM_LOAD_NODE : pb::MEM_STORE_NODE);
    auto* ts = node.add_attr();
    ts->set_name("tensor_size");
    ts->set_uint64_val(static_cast<std::uint64_t>(copy->bytes.count()));
    add_is_cpu_op(node);
    add_string(node, kKernelsAttr, json::array({kernel_to_json(list[0])}).dump());
    return;
  }
  node.set_type(pb::COMP_NODE);
  double flops = 0;
  std::int64_t bytes = 0;
  json kernels = json::array();
  for (const auto& k : list) {
    flops += roofline_ops(k);
    bytes += st::memory_bytes(k).count();
    kernels.push_back(kernel_to_json(k));
  }
  add_int64(node, "num_ops", static_cast<std::int64_t>(std::llround(flops)));
  auto* ts = node.add_attr();
  ts->set_name("tensor_size");
  ts->set_uint64_val(static_cast<std::uint64_t>(bytes));
  add_is_cpu_op(node);
  add_string(node, kKernelsAttr, kernels.dump());
}

void set_collective(pb::Node& node, const st::Program& program, const st::Collective& w) {
  node.set_type(pb::COMM_COLL_NODE);
  add_is_cpu_op(node);
  add_int64(node, "comm_type", comm_type_of(w.kind));
  const std::size_t ranks =
      w.group < program.groups().size() ? program.groups()[w.group].ranks.size() : 0;
  const std::int64_t comm_size = program_to_chakra_bytes(w.kind, w.bytes.count(), ranks);
  add_int64(node, "comm_size", comm_size);
  if (chakra_to_program_bytes(w.kind, comm_size, ranks) != w.bytes.count()) {
    add_int64(node, kBytesAttr, w.bytes.count());
  }
  add_string(node, "pg_name", std::to_string(w.group + kExportedGroupIdBase));
  add_string(node, kDtypeAttr, std::string(name_of(w.dtype)));
}

// A send or receive of rank r; `tags` numbers the messages of each (src, dst).
template <class W>
void set_transfer(pb::Node& node, int r, const W& w,
                  std::map<std::pair<int, int>, std::int32_t>& tags) {
  constexpr bool send = std::is_same_v<W, st::Send>;
  node.set_type(send ? pb::COMM_SEND_NODE : pb::COMM_RECV_NODE);
  const int src = send ? r : w.peer;
  const int dst = send ? w.peer : r;
  add_is_cpu_op(node);
  add_int32(node, "comm_src", src);
  add_int32(node, "comm_dst", dst);
  add_int64(node, "comm_size", w.bytes.count());
  add_int32(node, "comm_tag", tags[{src, dst}]++);
  if constexpr (send) {
    if (!w.eager) {  // Chakra's sends do not wait: say that this one does
      auto* a = node.add_attr();
      a->set_name(kRendezvousAttr);
      a->set_bool_val(true);
    }
  }
}

// Provenance: stream, phase, microbatch, layers and memory effects.
void set_provenance(pb::Node& node, const st::Program& program, const st::Op& op) {
  add_string(node, kStreamAttr, std::string(st::name_of(op.stream)));
  add_string(node, kPhaseAttr, std::string(st::name_of(op.phase)));
  if (op.microbatch >= 0) add_int64(node, kMicrobatchAttr, op.microbatch);
  if (op.layer_begin >= 0 || op.layer_end >= 0) {
    auto* a = node.add_attr();
    a->set_name(kLayersAttr);
    a->mutable_int64_list()->add_values(op.layer_begin);
    a->mutable_int64_list()->add_values(op.layer_end);
  }
  const auto effects = program.effects_of(op);
  if (!effects.empty()) {
    json e = json::array();
    for (const auto& m : effects) {
      e.push_back(
          json::array({m.delta.count(), st::name_of(m.category), st::name_of(m.tier), m.at_end}));
    }
    add_string(node, kEffectsAttr, e.dump());
  }
}

// Rank r's file, written to `out` node by node (a rank's text at most a block at a time).
void write_rank(std::ostream& out, const st::Program& program, int r,
                const std::string& group_names, const Timeline* timeline,
                const ChakraExportOptions& options) {
  std::string block;
  auto append = [&](const google::protobuf::Message& m) {
    options.json_form ? append_json(block, m) : append_delimited(block, m);
    if (block.size() >= (std::size_t{1} << 20)) {
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
      block.clear();
    }
  };
  append(rank_metadata(program, r, group_names, options));
  const st::OpId first = program.first_op(r);
  const auto ops = program.ops_of(r);
  std::array<std::int64_t, st::kStreamCount> last_on_stream;
  last_on_stream.fill(-1);
  std::map<std::pair<int, int>, std::int32_t> tags;  // (src, dst) -> messages so far
  const std::vector<std::int64_t> previous =
      previous_comm(program, r, timeline, options.single_comm_queue);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const st::Op& op = ops[i];
    pb::Node node;
    node.set_id(i);
    node.set_name(program.label_of(op));
    for (st::OpId d : program.deps_of(op)) node.add_data_deps(d - first);
    auto& last = last_on_stream[static_cast<std::size_t>(op.stream)];
    const std::int64_t last_before = last;
    if (last >= 0) node.add_ctrl_deps(static_cast<std::uint64_t>(last));
    last = static_cast<std::int64_t>(i);
    if (previous[i] >= 0 && previous[i] != last_before) {
      node.add_ctrl_deps(static_cast<std::uint64_t>(previous[i]));
    }
    if (timeline) {
      const Span& s = timeline->spans[first + i];
      // Whole microseconds, rounded to nearest (Chakra's unit).
      auto micros = [](Time t) {
        return static_cast<std::uint64_t>(
            std::max<std::int64_t>(0, (t.picoseconds() + 500'000) / 1'000'000));
      };
      node.set_start_time_micros(micros(s.start));
      node.set_duration_micros(micros(s.end - s.start));
    }
    std::visit(
        [&](const auto& w) {
          using W = std::decay_t<decltype(w)>;
          if constexpr (std::is_same_v<W, st::Compute>) {
            set_compute(node, program.kernels_of(w));
          } else if constexpr (std::is_same_v<W, st::Collective>) {
            set_collective(node, program, w);
          } else {
            set_transfer(node, r, w, tags);
          }
        },
        op.work);
    set_provenance(node, program, op);
    append(node);
  }
  out.write(block.data(), static_cast<std::streamsize>(block.size()));
}

}  // namespace

void write_chakra(const fs::path& prefix, const st::Program& program,
                  const ChakraExportOptions& options) {
  if (program.mirrored()) {
    throw std::invalid_argument(
        "a Program with data-parallel mirroring cannot be exported as a Chakra trace (mirrored "
        "ranks issue no ops of their own); lower it without mirroring");
  }
  const Timeline* timeline = options.timeline;
  if (timeline && timeline->spans.size() != program.op_count()) timeline = nullptr;
  if (options.single_comm_queue && (timeline == nullptr || !timeline->completed)) {
    throw std::invalid_argument(
        "ordering communication for a single queue needs a completed simulation of the program "
        "(its start times)");
  }
  const int world = program.world_size();
  json group_names = json::array();
  for (const auto& group : program.groups()) group_names.push_back(group.name);
  const std::string group_names_text = group_names.dump();
  // ASTRA-sim's comm-group file: {"<pg_name>": [ranks]}, ids from 1 (0 is reserved).
  std::string groups_text = "{";
  for (std::size_t g = 0; g < program.groups().size(); ++g) {
    groups_text += (g == 0 ? "\n  \"" : ",\n  \"") + std::to_string(g + kExportedGroupIdBase) +
                   "\": " + json(program.groups()[g].ranks).dump();
  }
  groups_text += program.groups().empty() ? "}\n" : "\n}\n";

  // Each rank's file is written under a temporary name as it is made (one rank's nodes in
  // memory at a time); all are renamed into place once every one is complete.
  const fs::path parent = prefix.has_parent_path() ? prefix.parent_path() : fs::path(".");
  fs::create_directories(parent);
  files::StagedWrites writes;
  for (int r = 0; r < world; ++r) {
    writes.stage(rank_file(prefix.string(), r, options.json_form), [&](std::ostream& out) {
      write_rank(out, program, r, group_names_text, timeline, options);
    });
  }
  writes.stage(prefix.string() + ".comm_groups.json", groups_text);
  // Rank files of an earlier export to the same prefix (more ranks, or the other form) would
  // be read back with these ones: remove them.
  std::set<std::string> written;  // file names, all in `parent`
  for (const auto& file : writes.targets()) written.insert(file.filename().string());
  const std::string stem = prefix.filename().string() + ".";
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    if (!name.starts_with(stem) || (ext != ".et" && ext != ".json")) continue;
    const std::string middle = name.substr(stem.size(), name.size() - stem.size() - ext.size());
    if (middle.empty() || middle.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!written.contains(name)) stale.push_back(entry.path());
  }
  writes.commit();
  for (const auto& path : stale) fs::remove(path, ec);
}

}  // namespace stratasim::traces
