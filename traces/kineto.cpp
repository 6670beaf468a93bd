// PyTorch profiler (Kineto) Chrome traces -> Program.
//
// Only device activity becomes ops: GPU kernels keep their measured durations; NCCL kernels
// become collectives (or sends/receives) whose time the simulator computes again; CPU ops are
// counted and left out. The trace has no dependency edges, so they are reconstructed: each CUDA
// stream runs in order, and an op waits, on every other stream of its rank, for the last op
// that had finished (with all ops before it) when the op started in the trace. That keeps what
// the recorded run proves (gradients computed before their all-reduce started) without
// inventing anything it does not. Collectives match across ranks by issue order per group.
#include "traces/kineto.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "traces/trace_builder.hpp"

namespace stratasim::traces {

namespace fs = std::filesystem;
namespace st = stratasim::strategies;
using nlohmann::json;

namespace {

constexpr int kMaxRanks = 1 << 20;
constexpr double kMaxMicros = 1e12;     // a duration: 11.6 days
constexpr double kMaxTimestamp = 1e17;  // Kineto's timestamps are microseconds since the epoch
constexpr std::int64_t kMaxElements = std::int64_t{1} << 52;

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

struct Reader {
  const std::string& file;
  [[noreturn]] void fail(const std::string& path, const std::string& expected) const {
    throw TraceError(file, path, "expected " + expected);
  }
  const json* field(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  double number(const json& obj, const char* key, const std::string& path, double lo,
                double hi) const {
    const json* v = field(obj, key);
    if (!v || !v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo ||
        v->get<double>() > hi) {
      fail(path + "." + key, "a number from " + std::to_string(static_cast<std::int64_t>(lo)) +
                                 " to " + std::to_string(static_cast<std::int64_t>(hi)));
    }
    return v->get<double>();
  }
  std::int64_t integer(const json& v, const std::string& path, std::int64_t lo,
                       std::int64_t hi) const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned()) {
        const auto u = v.get<std::uint64_t>();
        if (u <= static_cast<std::uint64_t>(hi)) {
          const auto i = static_cast<std::int64_t>(u);
          if (i >= lo) return i;
        }
      } else if (v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi) {
        return v.get<std::int64_t>();
      }
    }
    fail(path, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  std::int64_t integer(const json& obj, const char* key, const std::string& path, std::int64_t lo,
                       std::int64_t hi) const {
    const json* v = field(obj, key);
    if (!v) fail(path + "." + key, "an integer");
    return integer(*v, path + "." + key, lo, hi);
  }
  const std::string& string(const json& obj, const char* key, const std::string& path) const {
    const json* v = field(obj, key);
    if (!v || !v->is_string()) fail(path + "." + key, "a string");
    return v->get_ref<const std::string&>();
  }
};

// Element sizes of the dtype names record_param_comms writes (c10::ScalarType names).
std::optional<std::pair<std::int64_t, DType>> element_of(std::string_view name) {
  static const std::map<std::string, std::pair<std::int64_t, DType>, std::less<>> sizes = {
      {"Float", {4, DType::fp32}},
      {"Double", {8, DType::fp32}},
      {"Half", {2, DType::fp16}},
      {"BFloat16", {2, DType::bf16}},
      {"Float8_e4m3fn", {1, DType::fp8}},
      {"Float8_e5m2", {1, DType::fp8}},
      {"Float8_e4m3fnuz", {1, DType::fp8}},
      {"Float8_e5m2fnuz", {1, DType::fp8}},
      {"Int", {4, DType::fp32}},
      {"Long", {8, DType::fp32}},
      {"Short", {2, DType::fp16}},
      {"Char", {1, DType::fp8}},
      {"Byte", {1, DType::fp8}},
      {"Bool", {1, DType::fp8}},
      {"ComplexFloat", {8, DType::fp32}},
      {"ComplexDouble", {16, DType::fp32}},
  };
  auto it = sizes.find(name);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

enum class CommKind { collective, send, recv };

struct CommSpec {
  CommKind kind = CommKind::collective;
  st::CollectiveKind collective = st::CollectiveKind::all_reduce;
};

// "allreduce", "_allgather_base", "reduce_scatter_tensor_coalesced", "all_to_allv", ...; or the
// NCCL kernel's own name ("ncclDevKernel_AllGather_RING_LL").
std::optional<CommSpec> comm_of(std::string_view collective_name) {
  std::string n = lower(collective_name);
  n.erase(std::remove(n.begin(), n.end(), '_'), n.end());
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  // A kind's NCCL name in lower case ("allreduce"); reduce last: other names contain it.
  auto named = [&](st::CollectiveKind k) {
    return n.find(lower(st::traits_of(k).nccl_name)) != std::string::npos;
  };
  for (const st::CollectiveKind k :
       {st::CollectiveKind::reduce_scatter, st::CollectiveKind::all_reduce,
        st::CollectiveKind::all_gather, st::CollectiveKind::all_to_all,
        st::CollectiveKind::broadcast}) {
    if (named(k)) return CommSpec{CommKind::collective, k};
  }
  if (has("barrier")) return CommSpec{CommKind::collective, st::CollectiveKind::all_reduce};
  if (has("gather") || has("scatter")) return std::nullopt;
  if (named(st::CollectiveKind::reduce)) {
    return CommSpec{CommKind::collective, st::CollectiveKind::reduce};
  }
  if (has("send") && !has("recv")) return CommSpec{CommKind::send, {}};
  if (has("recv") && !has("send")) return CommSpec{CommKind::recv, {}};
  return std::nullopt;
}

bool looks_data_parallel(std::string_view name) {
  const std::string n = lower(name);
  return n.rfind("dp", 0) == 0 || n.find("data") != std::string::npos ||
         n.find("_dp") != std::string::npos || n.find(" dp") != std::string::npos;
}

// "[0, 1, 2, 3]" (as record_param_comms writes it) or a JSON array. Empty when truncated
// ("[0, 1, ..., 63]").
std::optional<std::vector<std::int32_t>> parse_ranks(const json& v, const Reader& in,
                                                     const std::string& path, int world) {
  std::vector<std::int32_t> ranks;
  if (v.is_array()) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      ranks.push_back(static_cast<std::int32_t>(
          in.integer(v[i], path + "[" + std::to_string(i) + "]", 0, world - 1)));
    }
    return ranks;
  }
  if (!v.is_string()) in.fail(path, "a list of ranks such as \"[0, 1]\"");
  const std::string& s = v.get_ref<const std::string&>();
  if (s.find("...") != std::string::npos) return std::nullopt;
  std::size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '[')) ++i;
  while (i < s.size() && s[i] != ']') {
    std::int64_t value = 0;
    std::size_t digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && digits < 10) {
      value = value * 10 + (s[i] - '0');
      ++i;
      ++digits;
    }
    if (digits == 0 || value >= world) {
      in.fail(path,
              "a list of ranks from 0 to " + std::to_string(world - 1) + " such as \"[0, 1]\"");
    }
    ranks.push_back(static_cast<std::int32_t>(value));
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
  }
  if (i >= s.size() || ranks.empty()) in.fail(path, "a list of ranks such as \"[0, 1]\"");
  return ranks;
}

struct Event {
  std::size_t index;  // in traceEvents: the node id in messages
  double ts = 0, dur = 0;
  st::Stream stream = st::Stream::compute;
};

struct ParsedFile {
  int rank = -1;
  std::optional<int> world;
  json doc;
};

std::optional<int> rank_from_name(std::string_view name) {
  const std::string n = lower(fs::path(std::string(name)).filename().string());
  for (std::size_t pos = n.find("rank"); pos != std::string::npos; pos = n.find("rank", pos + 1)) {
    std::size_t i = pos + 4;
    if (i < n.size() && (n[i] == '_' || n[i] == '-' || n[i] == '.')) ++i;
    std::int64_t value = 0;
    std::size_t digits = 0;
    while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i])) && digits < 8) {
      value = value * 10 + (n[i++] - '0');
      ++digits;
    }
    if (digits > 0) return static_cast<int>(value);
  }
  return std::nullopt;
}

}  // namespace

ImportedTrace import_kineto_texts(const std::vector<KinetoFile>& files) {
  if (files.empty()) throw TraceError("kineto", "", "no trace files");
  if (files.size() > static_cast<std::size_t>(kMaxRanks)) {
    throw TraceError(files[0].name, "", "more than " + std::to_string(kMaxRanks) + " files");
  }
  const int world = static_cast<int>(files.size());
  std::vector<ParsedFile> parsed(files.size());
  std::vector<const KinetoFile*> by_rank(files.size(), nullptr);
  std::vector<std::size_t> file_of_rank(files.size(), 0);
  for (std::size_t f = 0; f < files.size(); ++f) {
    const auto& file = files[f];
    ParsedFile& p = parsed[f];
    try {
      p.doc = json::parse(file.text);
    } catch (const json::parse_error& e) {
      throw TraceError(file.name, "byte " + std::to_string(e.byte),
                       std::string("not valid JSON: ") + e.what());
    } catch (const json::exception& e) {
      throw TraceError(file.name, "", std::string("not valid JSON: ") + e.what());
    }
    const Reader in{file.name};
    if (p.doc.is_object() && p.doc.contains("distributedInfo")) {
      const json& info = p.doc["distributedInfo"];
      if (!info.is_object()) in.fail("distributedInfo", "an object");
      if (info.contains("rank")) {
        p.rank =
            static_cast<int>(in.integer(info["rank"], "distributedInfo.rank", 0, kMaxRanks - 1));
      }
      if (info.contains("world_size")) {
        p.world = static_cast<int>(
            in.integer(info["world_size"], "distributedInfo.world_size", 1, kMaxRanks));
      }
    }
    if (p.rank < 0) {
      if (const auto r = rank_from_name(file.name)) {
        p.rank = *r;
      } else if (files.size() == 1) {
        p.rank = 0;
      } else {
        throw TraceError(file.name, "distributedInfo.rank",
                         "cannot tell which rank this file is: it has no distributedInfo.rank "
                         "and its name has no rank number (\"...rank3...\")");
      }
    }
    if (p.world && *p.world != world) {
      throw TraceError(file.name, "distributedInfo.world_size",
                       "the trace is of " + std::to_string(*p.world) + " ranks, but " +
                           std::to_string(world) + " files were given (one per rank is needed)");
    }
    if (p.rank >= world) {
      throw TraceError(file.name, "distributedInfo.rank",
                       "rank " + std::to_string(p.rank) + " is outside the " +
                           std::to_string(world) + " files given (ranks 0 to " +
                           std::to_string(world - 1) + ")");
    }
    if (by_rank[static_cast<std::size_t>(p.rank)]) {
      throw TraceError(file.name, "distributedInfo.rank",
                       "rank " + std::to_string(p.rank) + " is also the rank of " +
                           by_rank[static_cast<std::size_t>(p.rank)]->name);
    }
    by_rank[static_cast<std::size_t>(p.rank)] = &file;
    file_of_rank[static_cast<std::size_t>(p.rank)] = f;
  }

  TraceInput input;
  input.ranks.resize(files.size());
  std::map<std::pair<std::string, std::vector<std::int32_t>>, std::uint32_t> group_index;
  std::int64_t cpu_ops = 0, comm_kernels = 0;
  std::set<int> ranks_with_several_compute_streams;
  for (int r = 0; r < world; ++r) {
    const std::size_t f = file_of_rank[static_cast<std::size_t>(r)];
    const KinetoFile& file = files[f];
    const json& doc = parsed[f].doc;
    const Reader in{file.name};
    TraceRank& rank = input.ranks[static_cast<std::size_t>(r)];
    rank.source = file.name;
    const json* events = nullptr;
    std::string base = "traceEvents";
    if (doc.is_object()) {
      events = in.field(doc, "traceEvents");
      if (!events || !events->is_array()) in.fail("traceEvents", "an array of trace events");
    } else if (doc.is_array()) {
      events = &doc;
      base = "";
    } else {
      in.fail("", "a Chrome trace: an object with \"traceEvents\"");
    }
    std::vector<Event> gpu;
    std::set<std::int64_t> compute_streams;
    for (std::size_t i = 0; i < events->size(); ++i) {
      const json& e = (*events)[i];
      const std::string path = base + "[" + std::to_string(i) + "]";
      if (!e.is_object()) in.fail(path, "an object (a trace event)");
      const json* ph = in.field(e, "ph");
      if (!ph || !ph->is_string() || ph->get_ref<const std::string&>() != "X") continue;
      const json* cat = in.field(e, "cat");
      const std::string category = cat && cat->is_string() ? lower(cat->get<std::string>()) : "";
      const bool kernel = category == "kernel";
      const bool memory = category == "gpu_memcpy" || category == "gpu_memset" ||
                          category == "memcpy" || category == "memset";
      if (!kernel && !memory) {
        ++cpu_ops;
        continue;
      }
      Event ev;
      ev.index = i;
      ev.ts = in.number(e, "ts", path, -kMaxTimestamp, kMaxTimestamp);
      ev.dur = in.number(e, "dur", path, 0, kMaxMicros);
      const std::string& name = in.string(e, "name", path);
      const json* args = in.field(e, "args");
      if (args && !args->is_object()) in.fail(path + ".args", "an object");
      std::int64_t cuda_stream = 0;
      if (args && args->contains("stream")) {
        cuda_stream = in.integer((*args)["stream"], path + ".args.stream", 0,
                                 std::numeric_limits<std::int64_t>::max());
      } else if (const json* tid = in.field(e, "tid"); tid && tid->is_number_integer()) {
        cuda_stream = tid->get<std::int64_t>();
      }
      TraceOp op;
      op.id = i;
      op.label = name;
      const bool nccl = name.rfind("ncclKernel", 0) == 0 || name.rfind("ncclDevKernel", 0) == 0 ||
                        (args && args->contains("Collective name"));
      if (memory) {
        ev.stream = st::Stream::copy;
        op.work = st::Compute{};
        op.kernels.push_back({st::Measured{Time::ps(std::llround(ev.dur * 1e6))}, name});
      } else if (!nccl) {
        ev.stream = st::Stream::compute;
        compute_streams.insert(cuda_stream);
        op.work = st::Compute{};
        op.kernels.push_back({st::Measured{Time::ps(std::llround(ev.dur * 1e6))}, name});
      } else {
        ++comm_kernels;
        const std::string apath = path + ".args";
        static const json kEmpty = json::object();
        const json& a = args ? *args : kEmpty;
        std::string collective_name = name;
        if (const json* c = in.field(a, "Collective name")) {
          if (!c->is_string()) in.fail(apath + ".Collective name", "a string");
          collective_name = c->get<std::string>();
        }
        const auto spec = comm_of(collective_name);
        if (!spec) {
          throw TraceError(file.name, apath + ".Collective name",
                           "collective \"" + collective_name +
                               "\" is not supported (stratasim simulates all-reduce, "
                               "reduce-scatter, all-gather, broadcast, reduce, all-to-all, "
                               "barrier, send and recv)");
        }
        const std::string& dtype_name = in.string(a, "dtype", apath);
        const auto element = element_of(dtype_name);
        if (!element) {
          in.fail(apath + ".dtype",
                  "a PyTorch dtype name (Float, Half, BFloat16, Double, Float8_e4m3fn, Int, "
                  "Long, ...), found \"" +
                      dtype_name + "\"");
        }
        const auto in_elems = in.integer(a, "In msg nelems", apath, 0, kMaxElements);
        const auto out_elems = in.integer(a, "Out msg nelems", apath, 0, kMaxElements);
        // Program::Collective counts the whole buffer: the input of an all-reduce or
        // reduce-scatter, the output of an all-gather; the larger of the two in every case.
        const Bytes bytes(std::max(in_elems, out_elems) * element->first);
        if (spec->kind == CommKind::collective) {
          std::string pg_name;
          if (const json* n = in.field(a, "Process Group Name"); n && n->is_string()) {
            pg_name = n->get<std::string>();
          }
          std::string pg_desc;
          if (const json* d = in.field(a, "Process Group Description"); d && d->is_string()) {
            pg_desc = d->get<std::string>();
          }
          std::optional<std::int64_t> group_size;
          if (a.contains("Group size")) {
            group_size = in.integer(a["Group size"], apath + ".Group size", 1, world);
          }
          std::optional<std::vector<std::int32_t>> members;
          if (const json* g = in.field(a, "Process Group Ranks")) {
            members = parse_ranks(*g, in, apath + ".Process Group Ranks", world);
          }
          if (!members) {
            // Absent or truncated: a group of the whole world is the one case we can rebuild.
            if (group_size && *group_size == world) {
              members.emplace();
              for (int k = 0; k < world; ++k) members->push_back(k);
            } else {
              in.fail(apath + ".Process Group Ranks",
                      "the group's ranks (\"[0, 1, ...]\"), or a Group size equal to the "
                      "world size " +
                          std::to_string(world));
            }
          }
          if (group_size && static_cast<std::size_t>(*group_size) != members->size()) {
            in.fail(apath + ".Group size",
                    std::to_string(members->size()) + " (the number of Process Group Ranks)");
          }
          auto key = std::make_pair(pg_name, *members);
          auto it = group_index.find(key);
          if (it == group_index.end()) {
            std::string gname = pg_name.empty() ? "pg" : "pg " + pg_name;
            if (!pg_desc.empty()) gname += " (" + pg_desc + ")";
            input.groups.push_back({*members, gname});
            it =
                group_index.emplace(key, static_cast<std::uint32_t>(input.groups.size() - 1)).first;
          }
          st::Collective c;
          c.kind = spec->collective;
          c.dtype = element->second;
          c.group = it->second;
          c.bytes = bytes;
          op.work = c;
          ev.stream = looks_data_parallel(pg_desc) || looks_data_parallel(pg_name)
                          ? st::Stream::dp_comm
                          : st::Stream::tp_comm;
        } else {
          const bool send = spec->kind == CommKind::send;
          const char* key = send ? "Dst Rank" : "Src Rank";
          const auto peer = static_cast<std::int32_t>(in.integer(a, key, apath, 0, world - 1));
          if (send) {
            op.work = st::Send{peer, bytes};
            ev.stream = st::Stream::pp_send;
          } else {
            op.work = st::Recv{peer, bytes};
            ev.stream = st::Stream::pp_recv;
          }
        }
      }
      op.stream = ev.stream;
      rank.ops.push_back(std::move(op));
      gpu.push_back(ev);
    }
    if (compute_streams.size() > 1) ranks_with_several_compute_streams.insert(r);
    // Issue order: by start time (ties keep the file's order).
    std::vector<std::size_t> order(gpu.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return gpu[x].ts < gpu[y].ts; });
    std::vector<TraceOp> sorted;
    sorted.reserve(order.size());
    // Per stream: its ops so far (end time, id) and how many of them had all finished by the
    // current start; per (stream, other stream): the last dependency given, to skip repeats.
    std::array<std::vector<std::pair<double, std::uint64_t>>, st::kStreamCount> on;
    std::array<std::size_t, st::kStreamCount> done{};
    std::array<std::array<std::int64_t, st::kStreamCount>, st::kStreamCount> given;
    for (auto& row : given) row.fill(-1);
    for (std::size_t k : order) {
      TraceOp op = std::move(rank.ops[k]);
      const Event& ev = gpu[k];
      const auto s = static_cast<std::size_t>(ev.stream);
      for (std::size_t o = 0; o < st::kStreamCount; ++o) {
        auto& list = on[o];
        while (done[o] < list.size() && list[done[o]].first <= ev.ts) ++done[o];
        if (o == s || done[o] == 0) continue;
        const auto dep = list[done[o] - 1].second;
        if (given[s][o] == static_cast<std::int64_t>(dep)) continue;
        given[s][o] = static_cast<std::int64_t>(dep);
        op.deps.push_back(dep);
      }
      if (!on[s].empty()) op.order_deps.push_back(on[s].back().second);
      on[s].emplace_back(ev.ts + ev.dur, op.id);
      sorted.push_back(std::move(op));
    }
    rank.ops = std::move(sorted);
  }

  ImportedTrace result{build_program(input), {}, std::nullopt};
  if (cpu_ops > 0) {
    result.notes.push_back(std::to_string(cpu_ops) +
                           " CPU-side events (operators, runtime calls, annotations) ignored: "
                           "only device activity is replayed");
  }
  if (comm_kernels > 0) {
    result.notes.push_back(std::to_string(comm_kernels) +
                           " NCCL kernels became collectives or sends/receives; their recorded "
                           "durations are replaced by simulated communication");
  }
  if (!ranks_with_several_compute_streams.empty()) {
    result.notes.push_back(
        std::to_string(ranks_with_several_compute_streams.size()) +
        " ranks used several CUDA streams for compute kernels: they run on one compute stream, "
        "in start order");
  }
  result.notes.push_back(
      "dependencies reconstructed from stream order and timestamps (Kineto traces have no "
      "dependency edges)");
  return result;
}

ImportedTrace import_kineto(const fs::path& path) {
  std::error_code ec;
  std::vector<fs::path> paths;
  if (fs::is_directory(path, ec)) {
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file(ec) && entry.path().extension() == ".json") {
        paths.push_back(entry.path());
      }
    }
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) {
      throw TraceError(path.string(), "", "the folder holds no .json Kineto trace files");
    }
  } else if (fs::is_regular_file(path, ec)) {
    paths.push_back(path);
  } else {
    throw TraceError(path.string(), "", "no such file or folder");
  }
  std::vector<KinetoFile> files;
  for (const auto& p : paths) {
    if (p.string().ends_with(".gz")) {
      throw TraceError(p.string(), "", "compressed traces are not read: gunzip it first");
    }
    std::ifstream in(p, std::ios::binary);
    if (!in) throw TraceError(p.string(), "", "cannot be read");
    std::ostringstream s;
    s << in.rdbuf();
    files.push_back({p.string(), s.str()});
  }
  return import_kineto_texts(files);
}

}  // namespace stratasim::traces
