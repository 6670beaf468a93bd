// Import of stratasim's timeline.json; the format is described at the top of traces/export.cpp.
//
// Every value is checked before use (range, type, which rank an op id belongs to) and the
// Program is validated at the end (cycles, unmatched collectives and transfers), so malformed
// input gives a TraceError, never a crash, a huge allocation or a hang.
//
// The text is streamed (traces/json_stream.hpp), never held as one JSON document: a timeline
// of every rank of a large run is hundreds of MB, and its DOM ten times that. Two passes:
// the first checks that the text parses (the same errors, at the same bytes, as parsing it
// whole) and keeps the "stratasim" object, which the exporter writes after traceEvents; the
// second hands the events over one at a time, each read into a compact pending op (its
// provenance, work, and its dependencies and memory effects in shared arrays) and freed. The
// Program is then built in op id order (rank by rank) from the pending ops. Checks run in the
// order the whole-document reader ran them: the events' op ids as they stream by; an op's
// own errors are kept (the first by build order) and thrown when the build reaches that op, so
// a malformed trace reports the same error as before. Memory: the pending ops (80 bytes each,
// plus dependencies and effects) and the Program, about 180 bytes per op in all whatever the
// text's size (bench/trace_io_bench.cpp: 249 MiB for 1.38 M ops, 1.9 GB for 11 M).
#include "traces/timeline_import.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <istream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/config_reader.hpp"
#include "hw_models/json_depth.hpp"
#include "strategies/optimizer.hpp"
#include "traces/json_stream.hpp"

namespace stratasim::traces {

namespace {

namespace fs = std::filesystem;
namespace st = strategies;
using nlohmann::json;

constexpr std::int64_t kMaxWorld = kMaxTraceRanks;

template <class E, int N>
std::optional<E> enum_from_name(std::string_view name) {
  for (int i = 0; i < N; ++i) {
    if (st::name_of(static_cast<E>(i)) == name) return static_cast<E>(i);
  }
  return std::nullopt;
}

// Typed access to JSON values with errors that name the file and the JSON path.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw TraceError(source_, where, what);
  }
  const json& member(const json& object, const std::string& where, const char* key) const {
    auto it = object.find(key);
    if (it == object.end()) fail(where, std::string("expected a member \"") + key + "\"");
    return *it;
  }
  const json& object(const json& j, const std::string& where) const {
    if (!j.is_object()) fail(where, "expected an object, got " + std::string(j.type_name()));
    return j;
  }
  const json& array(const json& j, const std::string& where) const {
    if (!j.is_array()) fail(where, "expected an array, got " + std::string(j.type_name()));
    return j;
  }
  const std::string& string(const json& j, const std::string& where) const {
    if (!j.is_string()) fail(where, "expected a string, got " + std::string(j.type_name()));
    return j.get_ref<const std::string&>();
  }
  bool boolean(const json& j, const std::string& where) const {
    if (j.is_boolean()) return j.get<bool>();
    if (j.is_number_integer() && (j == 0 || j == 1)) return j == 1;
    fail(where, "expected true or false, got " + std::string(j.type_name()));
  }
  std::int64_t integer(const json& j, const std::string& where, std::int64_t lo,
                       std::int64_t hi) const {
    std::int64_t v = 0;
    if (j.is_number_unsigned()) {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(where, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
      }
      v = static_cast<std::int64_t>(u);
    } else if (j.is_number_integer()) {
      v = j.get<std::int64_t>();
    } else {
      fail(where, "expected an integer, got " + std::string(j.type_name()));
    }
    if (v < lo || v > hi) {
      fail(where, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                      ", got " + std::to_string(v));
    }
    return v;
  }
  double number(const json& j, const std::string& where) const {
    if (!j.is_number()) fail(where, "expected a number, got " + std::string(j.type_name()));
    const double v = j.get<double>();
    if (!std::isfinite(v)) fail(where, "expected a finite number");
    return v;
  }
  /// A Chrome-trace time in microseconds, as exact picoseconds.
  Time micros(const json& j, const std::string& where) const {
    const double us = number(j, where);
    if (us < 0 || us > 9.0e12) fail(where, "expected a time from 0 to 9e12 microseconds");
    return Time::ps(std::llround(us * 1e6));
  }
  DType dtype(const json& j, const std::string& where) const {
    const auto t = dtype_from_name(string(j, where));
    if (!t)
      fail(where, "expected a dtype (fp32, tf32, fp16, bf16, fp8, fp4), got \"" + j.dump() + "\"");
    return *t;
  }
  template <class E, int N>
  E enumerated(const json& j, const std::string& where, const char* what) const {
    const auto e = enum_from_name<E, N>(string(j, where));
    if (!e) fail(where, std::string("expected ") + what + ", got " + j.dump());
    return *e;
  }

 private:
  std::string source_;
};

Bytes bytes_of(const Reader& rd, const json& j, const std::string& where) {
  return Bytes(rd.integer(j, where, 0, kMaxTraceBytes));
}

// Kernel sizes: dimensions, elements and bytes (the shared importer bound on one of them).
constexpr std::int64_t kMaxCount = kMaxTraceBytes;

st::Kernel parse_kernel(const Reader& rd, const json& k, const std::string& where) {
  rd.object(k, where);
  st::Kernel kernel;
  if (auto it = k.find("name"); it != k.end()) kernel.name = rd.string(*it, where + ".name");
  auto field = [&](const char* key, std::size_t size) -> const json* {
    auto it = k.find(key);
    if (it == k.end()) return nullptr;
    const std::string at = where + "." + key;
    rd.array(*it, at);
    if (it->size() != size) {
      rd.fail(at,
              "expected " + std::to_string(size) + " values, got " + std::to_string(it->size()));
    }
    return &*it;
  };
  auto at = [&](const char* key, std::size_t i) {
    return where + "." + key + "[" + std::to_string(i) + "]";
  };
  auto count = [&](const json& a, const char* key, std::size_t i) {
    return rd.integer(a[i], at(key, i), 0, kMaxCount);
  };
  // Arrays that grew a trailing value later (written only when not the default) take both sizes.
  auto size_of_field = [&](const char* key, std::size_t base) {
    const auto it = k.find(key);
    return it != k.end() && it->is_array() && it->size() == base + 1 ? base + 1 : base;
  };
  // The attention array grew three: the fused kernel (a tenth value), then a sliding window,
  // then an attention chunk.
  auto attention_size = [&] {
    const auto it = k.find("attention");
    return it != k.end() && it->is_array() && (it->size() >= 10 && it->size() <= 12)
               ? it->size()
               : std::size_t{9};
  };
  if (const json* a = field("gemm", size_of_field("gemm", 5))) {
    st::Gemm g{count(*a, "gemm", 0), count(*a, "gemm", 1), count(*a, "gemm", 2),
               count(*a, "gemm", 3), rd.dtype((*a)[4], at("gemm", 4))};
    if (a->size() == 6) {
      const std::string scaling = rd.string((*a)[5], at("gemm", 5));
      const auto parsed = hw::gemm_scaling_from_name(scaling);
      if (!parsed) rd.fail(at("gemm", 5), "expected an FP8 scaling: tensor, block or mx");
      g.scaling = *parsed;
    }
    kernel.work = g;
  } else if (const json* b = field("attention", attention_size())) {
    st::Attention w;
    w.batch = count(*b, "attention", 0);
    w.heads = count(*b, "attention", 1);
    w.kv_heads = count(*b, "attention", 2);
    w.seq_q = count(*b, "attention", 3);
    w.seq_kv = count(*b, "attention", 4);
    w.head_dim = count(*b, "attention", 5);
    w.causal = rd.boolean((*b)[6], at("attention", 6));
    w.dtype = rd.dtype((*b)[7], at("attention", 7));
    w.backward = rd.boolean((*b)[8], at("attention", 8));
    if (b->size() >= 10) {
      const auto impl = hw::attention_impl_from_name(rd.string((*b)[9], at("attention", 9)));
      if (!impl) {
        rd.fail(at("attention", 9),
                "expected a fused attention kernel (flash-attention, flash-attention-2, "
                "flash-attention-3, cudnn, flash-attention-triton)");
      }
      w.impl = *impl;
    }
    if (b->size() >= 11) w.window = count(*b, "attention", 10);
    if (b->size() == 12) w.chunk = count(*b, "attention", 11);
    kernel.work = w;
  } else if (const json* c = field("elementwise", 3)) {
    kernel.work = st::Elementwise{count(*c, "elementwise", 0), Bytes(count(*c, "elementwise", 1)),
                                  Bytes(count(*c, "elementwise", 2))};
  } else if (const json* o =
                 field("optimizer", k.contains("optimizer") && k["optimizer"].is_array() &&
                                            k["optimizer"].size() == 5
                                        ? 5
                                        : 4)) {
    // [params, kind, dtype, on_host] and, since fp32 gradient buffers, fp32_grads.
    const auto kind = st::optimizer_from_name(rd.string((*o)[1], at("optimizer", 1)));
    if (!kind) {
      rd.fail(at("optimizer", 1),
              "expected an optimizer (adam, adamw, sgd, sgd_momentum, "
              "rmsprop, adagrad, adafactor, lion, adam8bit)");
    }
    kernel.work =
        st::OptimizerStep{count(*o, "optimizer", 0), *kind, rd.dtype((*o)[2], at("optimizer", 2)),
                          rd.boolean((*o)[3], at("optimizer", 3)),
                          o->size() == 5 && rd.boolean((*o)[4], at("optimizer", 4))};
  } else if (const json* p = field("copy", 3)) {
    kernel.work = st::Copy{
        Bytes(count(*p, "copy", 0)),
        rd.enumerated<st::MemoryTier, st::kMemoryTierCount>((*p)[1], at("copy", 1), "a tier"),
        rd.enumerated<st::MemoryTier, st::kMemoryTierCount>((*p)[2], at("copy", 2), "a tier")};
  } else if (auto m = k.find("measured_ps"); m != k.end()) {
    kernel.work =
        st::Measured{Time::ps(rd.integer(*m, where + ".measured_ps", 0, kMaxTraceDurationPs))};
  } else if (const json* r = field("roofline", 3)) {
    const double flops = rd.number((*r)[0], at("roofline", 0));
    if (flops < 0) rd.fail(at("roofline", 0), "expected FLOPs >= 0");
    kernel.work = st::RooflineWork{Flops(flops), Bytes(count(*r, "roofline", 1)),
                                   rd.dtype((*r)[2], at("roofline", 2))};
  } else {
    rd.fail(where,
            "expected one of gemm, attention, elementwise, optimizer, copy, measured_ps or "
            "roofline");
  }
  return kernel;
}

std::vector<st::MemoryEffect> parse_effects(const Reader& rd, const json& mem,
                                            const std::string& where) {
  rd.array(mem, where);
  std::vector<st::MemoryEffect> effects;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json& e = rd.array(mem[i], at);
    if (e.size() != 4) rd.fail(at, "expected [bytes, category, tier, at_end]");
    st::MemoryEffect effect;
    effect.delta = Bytes(rd.integer(e[0], at + "[0]", -kMaxCount, kMaxCount));
    effect.category = rd.enumerated<st::MemoryCategory, st::kMemoryCategoryCount>(
        e[1], at + "[1]", "a memory category");
    effect.tier =
        rd.enumerated<st::MemoryTier, st::kMemoryTierCount>(e[2], at + "[2]", "a memory tier");
    effect.at_end = rd.boolean(e[3], at + "[3]");
    effects.push_back(effect);
  }
  return effects;
}

// "3-7" (inclusive, as the exporter writes them) -> [3, 8).
std::pair<std::int16_t, std::int16_t> parse_layers(const Reader& rd, const json& j,
                                                   const std::string& where) {
  const std::string& text = rd.string(j, where);
  const auto dash = text.find('-');
  int first = -1, last = -1;
  try {
    std::size_t used = 0;
    if (dash == std::string::npos) throw std::invalid_argument("no dash");
    first = std::stoi(text.substr(0, dash), &used);
    if (used != dash) throw std::invalid_argument("junk");
    last = std::stoi(text.substr(dash + 1), &used);
    if (used != text.size() - dash - 1) throw std::invalid_argument("junk");
  } catch (const std::exception&) {
    rd.fail(where, "expected layers as \"first-last\", got \"" + text + "\"");
  }
  if (first < 0 || last < first || last >= 32767) {
    rd.fail(where, "expected layers 0 <= first <= last < 32767, got \"" + text + "\"");
  }
  return {static_cast<std::int16_t>(first), static_cast<std::int16_t>(last + 1)};
}

std::string_view work_name(const st::Work& w) {
  if (const auto* c = std::get_if<st::Collective>(&w)) return st::name_of(c->kind);
  if (std::holds_alternative<st::Send>(w)) return "send";
  if (std::holds_alternative<st::Recv>(w)) return "recv";
  return "compute";
}

// Provenance common to both paths: stream (tid), phase (cat), label (name), microbatch, layers.
st::OpInfo parse_info(const Reader& rd, const json& e, const json& args, const std::string& where,
                      std::string& label) {
  st::OpInfo info;
  info.stream = static_cast<st::Stream>(
      rd.integer(rd.member(e, where, "tid"), where + ".tid", 0, st::kStreamCount - 1));
  info.phase = st::Phase::other;
  if (auto cat = e.find("cat"); cat != e.end()) {
    info.phase =
        rd.enumerated<st::Phase, st::kPhaseCount>(*cat, where + ".cat", "a phase (forward, ...)");
  }
  if (auto mb = args.find("microbatch"); mb != args.end()) {
    info.microbatch = static_cast<std::int32_t>(
        rd.integer(*mb, where + ".args.microbatch", -1, std::numeric_limits<std::int32_t>::max()));
  }
  if (auto layers = args.find("layers"); layers != args.end()) {
    std::tie(info.layer_begin, info.layer_end) = parse_layers(rd, *layers, where + ".args.layers");
  }
  if (auto name = e.find("name"); name != e.end()) label = rd.string(*name, where + ".name");
  return info;
}

std::optional<st::CollectiveKind> collective_kind(std::string_view name) {
  return enum_from_name<st::CollectiveKind, 6>(name);
}

ReportContext parse_context(const Reader& rd, const json& c, int world) {
  const std::string where = "stratasim.context";
  rd.object(c, where);
  ReportContext context;
  if (auto it = c.find("experiment"); it != c.end()) {
    context.experiment = rd.string(*it, where + ".experiment");
  }
  context.samples_per_iteration = rd.integer(rd.member(c, where, "samples_per_iteration"),
                                             where + ".samples_per_iteration", 0, kMaxCount);
  context.tokens_per_iteration = rd.integer(rd.member(c, where, "tokens_per_iteration"),
                                            where + ".tokens_per_iteration", 0, kMaxCount);
  const double peak =
      rd.number(rd.member(c, where, "device_peak_flops"), where + ".device_peak_flops");
  if (peak < 0) rd.fail(where + ".device_peak_flops", "expected a rate >= 0");
  context.device_peak = FlopRate(peak);
  context.device_capacity =
      bytes_of(rd, rd.member(c, where, "device_capacity_bytes"), where + ".device_capacity_bytes");
  if (auto it = c.find("framework_compute"); it != c.end()) {
    context.framework_compute = rd.number(*it, where + ".framework_compute");
    if (!(context.framework_compute > 0 && context.framework_compute <= 1)) {
      rd.fail(where + ".framework_compute", "expected a share in (0, 1]");
    }
  }
  if (auto it = c.find("framework_memory_traffic"); it != c.end()) {
    context.framework_memory_traffic = rd.number(*it, where + ".framework_memory_traffic");
    if (!(context.framework_memory_traffic >= 1 && context.framework_memory_traffic <= 100)) {
      rd.fail(where + ".framework_memory_traffic", "expected a multiple in [1, 100]");
    }
  }
  if (auto it = c.find("framework_attention"); it != c.end()) {
    context.framework_attention = rd.number(*it, where + ".framework_attention");
    if (!(context.framework_attention >= 0.1 && context.framework_attention <= 10)) {
      rd.fail(where + ".framework_attention", "expected a multiple in [0.1, 10]");
    }
  }
  if (auto it = c.find("stage_of_rank"); it != c.end()) {
    const json& stages = rd.array(*it, where + ".stage_of_rank");
    // Empty: not known (a replay of a Chakra or Kineto trace records none).
    if (!stages.empty() && static_cast<int>(stages.size()) != world) {
      rd.fail(where + ".stage_of_rank",
              "expected " + std::to_string(world) + " stages, one per rank");
    }
    for (std::size_t r = 0; r < stages.size(); ++r) {
      context.stage_of_rank.push_back(static_cast<int>(rd.integer(
          stages[r], where + ".stage_of_rank[" + std::to_string(r) + "]", 0, kMaxWorld)));
    }
  }
  if (auto it = c.find("setup"); it != c.end()) {
    const json& setup = rd.array(*it, where + ".setup");
    for (std::size_t i = 0; i < setup.size(); ++i) {
      const std::string at = where + ".setup[" + std::to_string(i) + "]";
      const json& line = rd.array(setup[i], at);
      if (line.size() != 2) rd.fail(at, "expected [key, text]");
      context.setup.emplace_back(rd.string(line[0], at + "[0]"), rd.string(line[1], at + "[1]"));
    }
  }
  return context;
}

void validate_program(const Reader& rd, const st::Program& program) {
  try {
    st::validate(program);
  } catch (const st::ProgramError& e) {
    rd.fail("", std::string("the trace does not describe a runnable program: ") + e.what());
  }
}

// ---- A timeline with the "stratasim" object: exact.

// Which op ids each rank owns, which event holds each op, and which ranks mirror others.
struct OpLayout {
  int world = 0;
  bool completed = true;
  std::vector<std::int64_t> first;  // rank r owns [first[r], first[r + 1])
  std::vector<std::int32_t> replica_of;
  std::vector<std::int64_t> event_of;  // by op id; -1 until an event holds it

  std::int64_t total() const { return first.back(); }
  std::int64_t begin(int r) const { return first[static_cast<std::size_t>(r)]; }
  std::int64_t end(int r) const { return first[static_cast<std::size_t>(r) + 1]; }
  int rank_of_op(std::int64_t id) const {
    auto it = std::upper_bound(first.begin(), first.end(), id);
    return static_cast<int>(it - first.begin()) - 1;
  }
};

// stratasim.format, .world_size and .completed.
void read_header(const Reader& rd, const json& info, OpLayout& layout) {
  const std::string s = "stratasim";
  rd.object(info, s);
  const auto format = rd.integer(rd.member(info, s, "format"), s + ".format", 0, kMaxCount);
  if (format != 1) {
    rd.fail(s + ".format", "this stratasim reads format 1, the trace has format " +
                               std::to_string(format) + " (written by a newer version?)");
  }
  layout.world = static_cast<int>(
      rd.integer(rd.member(info, s, "world_size"), s + ".world_size", 1, kMaxWorld));
  if (auto it = info.find("completed"); it != info.end()) {
    layout.completed = rd.boolean(*it, s + ".completed");
  }
}

// Op ids: rank r owns [first[r], first[r] + count[r]); the ids must fit the events given.
void read_op_counts(const Reader& rd, const json& info, std::int64_t event_count,
                    OpLayout& layout) {
  const std::string s = "stratasim";
  const int world = layout.world;
  const json& counts = rd.array(rd.member(info, s, "op_counts"), s + ".op_counts");
  if (static_cast<int>(counts.size()) != world) {
    rd.fail(s + ".op_counts", "expected " + std::to_string(world) + " counts, one per rank");
  }
  std::vector<std::int64_t>& first = layout.first;
  first.assign(static_cast<std::size_t>(world) + 1, 0);
  for (int r = 0; r < world; ++r) {
    const auto ru = static_cast<std::size_t>(r);
    first[ru + 1] = first[ru] + rd.integer(counts[ru], s + ".op_counts[" + std::to_string(r) + "]",
                                           0, event_count);
    if (first[ru + 1] > event_count) {
      rd.fail(s + ".op_counts", "counts " + std::to_string(first[ru + 1]) +
                                    " ops, more than the trace's " + std::to_string(event_count) +
                                    " events: it was written for some ranks only; re-run "
                                    "stratasim simulate with --trace-ranks all");
    }
  }
}

// stratasim.replica_of: each rank mirrors itself unless listed otherwise.
void read_replicas(const Reader& rd, const json& info, OpLayout& layout) {
  const std::string s = "stratasim";
  const int world = layout.world;
  std::vector<std::int32_t>& replica_of = layout.replica_of;
  replica_of.assign(static_cast<std::size_t>(world), 0);
  for (int r = 0; r < world; ++r) replica_of[static_cast<std::size_t>(r)] = r;
  auto it = info.find("replica_of");
  if (it == info.end()) return;
  const json& list = rd.array(*it, s + ".replica_of");
  if (static_cast<int>(list.size()) != world) {
    rd.fail(s + ".replica_of", "expected " + std::to_string(world) + " ranks, one per rank");
  }
  for (int r = 0; r < world; ++r) {
    const auto ru = static_cast<std::size_t>(r);
    const std::string at = s + ".replica_of[" + std::to_string(r) + "]";
    replica_of[ru] = static_cast<std::int32_t>(rd.integer(list[ru], at, 0, r));
    const auto rep = static_cast<std::size_t>(replica_of[ru]);
    if (replica_of[ru] != r &&
        (replica_of[rep] != replica_of[ru] || layout.end(r) != layout.begin(r))) {
      rd.fail(at, "rank " + std::to_string(r) + " cannot mirror rank " +
                      std::to_string(replica_of[ru]) +
                      " (a mirror issues no ops and mirrors a rank that does)");
    }
  }
}

// Which op event `e` (traceEvents[index]) holds, or -1 when it is not an op (not "ph": "X").
std::int64_t map_event(const Reader& rd, const json& e, std::size_t index, OpLayout& layout) {
  const std::string where = "traceEvents[" + std::to_string(index) + "]";
  rd.object(e, where);
  auto ph = e.find("ph");
  if (ph == e.end() || !ph->is_string() || *ph != "X") return -1;
  const json& args = rd.object(rd.member(e, where, "args"), where + ".args");
  const std::int64_t total = layout.total();
  const std::int64_t id =
      rd.integer(rd.member(args, where + ".args", "op"), where + ".args.op", 0, kMaxCount);
  if (id >= total) {
    rd.fail(where + ".args.op", "op " + std::to_string(id) + " is beyond the " +
                                    std::to_string(total) + " ops that stratasim.op_counts lists");
  }
  auto& slot = layout.event_of[static_cast<std::size_t>(id)];
  if (slot >= 0) {
    rd.fail(where + ".args.op", "op " + std::to_string(id) +
                                    " appears twice (also in traceEvents[" + std::to_string(slot) +
                                    "])");
  }
  slot = static_cast<std::int64_t>(index);
  return id;
}

// Every rank's ops must all be in the trace.
void require_every_op(const Reader& rd, const OpLayout& layout) {
  for (int r = 0; r < layout.world; ++r) {
    std::int64_t missing = 0, example = -1;
    for (std::int64_t id = layout.begin(r); id < layout.end(r); ++id) {
      if (layout.event_of[static_cast<std::size_t>(id)] < 0) {
        ++missing;
        if (example < 0) example = id;
      }
    }
    if (missing == 0) continue;
    const std::int64_t count = layout.end(r) - layout.begin(r);
    if (!layout.completed) {
      rd.fail("stratasim.completed",
              "the simulation that wrote this trace did not complete: " + std::to_string(missing) +
                  " of rank " + std::to_string(r) + "'s " + std::to_string(count) +
                  " ops never ran (op " + std::to_string(example) +
                  " first); a replay needs every op");
    }
    if (missing == count) {
      rd.fail("traceEvents", "the trace does not cover rank " + std::to_string(r) + " (its " +
                                 std::to_string(count) +
                                 " ops are missing): it was written for some ranks only; re-run "
                                 "stratasim simulate with --trace-ranks all");
    }
    rd.fail("traceEvents", std::to_string(missing) + " of rank " + std::to_string(r) + "'s " +
                               std::to_string(count) + " ops are missing (op " +
                               std::to_string(example) + " first)");
  }
}

void read_groups(const Reader& rd, const json& info, int world, st::Program& program) {
  const std::string s = "stratasim";
  const json& groups = rd.array(rd.member(info, s, "groups"), s + ".groups");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string at = s + ".groups[" + std::to_string(g) + "]";
    rd.object(groups[g], at);
    const std::string& name = rd.string(rd.member(groups[g], at, "name"), at + ".name");
    const json& ranks = rd.array(rd.member(groups[g], at, "ranks"), at + ".ranks");
    std::vector<std::int32_t> members;
    for (std::size_t m = 0; m < ranks.size(); ++m) {
      members.push_back(static_cast<std::int32_t>(
          rd.integer(ranks[m], at + ".ranks[" + std::to_string(m) + "]", 0, world - 1)));
    }
    program.add_group(std::move(members), name);
  }
}

// stratasim.kernel_lists into the program.
void read_kernel_lists(const Reader& rd, const json& info, st::Program& program) {
  const std::string s = "stratasim";
  auto it = info.find("kernel_lists");
  if (it == info.end()) return;
  const json& lists = rd.array(*it, s + ".kernel_lists");
  for (std::size_t l = 0; l < lists.size(); ++l) {
    const std::string at = s + ".kernel_lists[" + std::to_string(l) + "]";
    std::vector<st::Kernel> kernels;
    if (!lists[l].is_null()) {
      rd.array(lists[l], at);
      for (std::size_t k = 0; k < lists[l].size(); ++k) {
        kernels.push_back(parse_kernel(rd, lists[l][k], at + "[" + std::to_string(k) + "]"));
      }
    }
    program.add_kernels(std::move(kernels));
  }
}

// Which of stratasim.kernel_lists are known (not null). Read before read_kernel_lists checks
// them: an op that names a list is read as its event streams by.
std::vector<char> known_kernel_lists(const json& info) {
  std::vector<char> known;
  if (auto it = info.find("kernel_lists"); it != info.end() && it->is_array()) {
    for (const json& list : *it) known.push_back(list.is_null() ? 0 : 1);
  }
  return known;
}

// stratasim.initial_memory (one list per rank), or null when absent.
const json* initial_memory_lists(const Reader& rd, const json& info, int world) {
  const std::string s = "stratasim";
  auto it = info.find("initial_memory");
  if (it == info.end()) return nullptr;
  const json* initial = &rd.array(*it, s + ".initial_memory");
  if (static_cast<int>(initial->size()) != world) {
    rd.fail(s + ".initial_memory", "expected " + std::to_string(world) + " lists, one per rank");
  }
  return initial;
}

void read_initial_memory(const Reader& rd, const json& initial, int r, st::Program& program) {
  const std::string at = "stratasim.initial_memory[" + std::to_string(r) + "]";
  const json& list = rd.array(initial[static_cast<std::size_t>(r)], at);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string item = at + "[" + std::to_string(i) + "]";
    const json& m = rd.array(list[i], item);
    if (m.size() != 3) rd.fail(item, "expected [bytes, category, tier]");
    program.add_initial_memory(
        r, st::ResidentMemory{
               st::MemoryCategory(rd.enumerated<st::MemoryCategory, st::kMemoryCategoryCount>(
                   m[1], item + "[1]", "a memory category")),
               rd.enumerated<st::MemoryTier, st::kMemoryTierCount>(m[2], item + "[2]",
                                                                   "a memory tier"),
               bytes_of(rd, m[0], item + "[0]")});
  }
}

// Labels as read, each kept once; ops refer to them by index.
class Labels {
 public:
  std::uint32_t intern(const std::string& label) {
    const auto [it, added] = ids_.try_emplace(label, static_cast<std::uint32_t>(names_.size()));
    if (added) names_.push_back(label);
    return it->second;
  }
  const std::string& operator[](std::uint32_t id) const { return names_[id]; }

 private:
  std::vector<std::string> names_;
  std::unordered_map<std::string, std::uint32_t> ids_;
};

// The first error of reading ops, by the order in which the Program takes them (`Key`): events
// come in time order, but an exact import builds rank by rank in op id order and an older
// timeline's import in (rank, start) order, so an op's error is kept until the build gets there.
template <class Key>
class FirstError {
 public:
  void offer(const Key& key, std::exception_ptr error) {
    if (!error_ || key < key_) {
      key_ = key;
      error_ = std::move(error);
    }
  }
  /// Throws the error kept for `key`, if that is the key of the first one.
  void throw_if_at(const Key& key) const {
    if (error_ && !(key_ < key) && !(key < key_)) std::rethrow_exception(error_);
  }

 private:
  Key key_{};
  std::exception_ptr error_;
};

// The provenance of an op (OpInfo without its label), as kept until the op is built.
struct Provenance {
  st::Stream stream = st::Stream::compute;
  st::Phase phase = st::Phase::other;
  std::int32_t microbatch = -1;
  std::int16_t layer_begin = -1, layer_end = -1;

  static Provenance of(const st::OpInfo& info) {
    return {info.stream, info.phase, info.microbatch, info.layer_begin, info.layer_end};
  }
  st::OpInfo info(std::string_view label) const {
    st::OpInfo info;
    info.stream = stream;
    info.phase = phase;
    info.microbatch = microbatch;
    info.layer_begin = layer_begin;
    info.layer_end = layer_end;
    info.label = label;
    return info;
  }
};

// An op as read from its event, until the build takes it (op id order).
struct PendingOp {
  st::Work work = st::Compute{};
  std::int64_t measured_ps = -1;  // >= 0: no kernel list; this much Measured work
  std::uint64_t deps_begin = 0, effects_begin = 0;
  std::uint32_t label = 0;  // into ExactOps::labels
  std::uint16_t deps_count = 0, effects_count = 0;
  bool unlabelled = false;  // the label is the exporter's name for the work: the op has none
  Provenance provenance;
};

// The ops of the events as they stream by, read against the "stratasim" object.
struct ExactOps {
  ExactOps(const Reader& reader, OpLayout& op_layout) : rd(reader), layout(op_layout) {}
  const Reader& rd;
  OpLayout& layout;
  std::size_t group_count = 0;   // stratasim.groups (checked later by read_groups)
  std::vector<char> list_known;  // known_kernel_lists
  Labels labels;
  std::vector<PendingOp> ops;  // by op id
  std::vector<st::OpId> deps;  // PendingOp::deps_begin, deps_count
  std::vector<st::MemoryEffect> effects;
  FirstError<std::int64_t> error;  // by op id
};

// args.kind: a send, recv or collective.
st::Work parse_communication(const ExactOps& x, const json& args, const std::string& where,
                             const std::string& k) {
  const Reader& rd = x.rd;
  const int world = x.layout.world;
  const auto bytes = bytes_of(rd, rd.member(args, where + ".args", "bytes"), where + ".args.bytes");
  if (k == "send" || k == "recv") {
    const auto peer = static_cast<std::int32_t>(
        rd.integer(rd.member(args, where + ".args", "peer"), where + ".args.peer", 0, world - 1));
    if (k == "recv") return st::Recv{peer, bytes};
    st::Send send{peer, bytes};
    if (const auto e = args.find("eager"); e != args.end()) {
      send.eager = rd.boolean(*e, where + ".args.eager");
    }
    if (const auto d = args.find("detached"); d != args.end()) {
      send.detached = rd.boolean(*d, where + ".args.detached");
    }
    return send;
  }
  if (const auto ck = collective_kind(k)) {
    const auto group = static_cast<std::uint32_t>(
        rd.integer(rd.member(args, where + ".args", "group_index"), where + ".args.group_index", 0,
                   static_cast<std::int64_t>(x.group_count) - 1));
    DType dtype = DType::bf16;
    if (auto d = args.find("dtype"); d != args.end()) dtype = rd.dtype(*d, where + ".args.dtype");
    return st::Collective{*ck, dtype, group, bytes};
  }
  rd.fail(where + ".args.kind",
          "expected a collective (all-reduce, reduce-scatter, all-gather, broadcast, "
          "reduce, all-to-all), send or recv, got \"" +
              k + "\"");
}

// An op's work: a communication (args.kind), a kernel list (args.kernels), else its duration
// (op.measured_ps).
st::Work parse_work(const ExactOps& x, const json& e, const json& args, const std::string& where,
                    PendingOp& op) {
  const Reader& rd = x.rd;
  if (auto kind = args.find("kind"); kind != args.end()) {
    return parse_communication(x, args, where, rd.string(*kind, where + ".args.kind"));
  }
  if (auto k = args.find("kernels"); k != args.end()) {
    const auto list = rd.integer(*k, where + ".args.kernels", 0,
                                 static_cast<std::int64_t>(x.list_known.size()) - 1);
    if (!x.list_known[static_cast<std::size_t>(list)]) {
      rd.fail(where + ".args.kernels",
              "kernel list " + std::to_string(list) + " is null in stratasim.kernel_lists");
    }
    return st::Compute{static_cast<std::uint32_t>(list)};
  }
  // No kernels recorded: the span's duration is the work.
  op.measured_ps = rd.micros(rd.member(e, where, "dur"), where + ".dur").picoseconds();
  return st::Compute{};
}

// args.deps: op ids of the same rank `r`, onto x.deps.
void parse_deps(ExactOps& x, const json& args, const std::string& where, std::int64_t id, int r,
                PendingOp& op) {
  const Reader& rd = x.rd;
  auto d = args.find("deps");
  if (d == args.end()) return;
  const json& list = rd.array(*d, where + ".args.deps");
  if (list.size() > 0xFFFF) rd.fail(where + ".args.deps", "more than 65535 dependencies");
  op.deps_begin = x.deps.size();
  for (std::size_t k = 0; k < list.size(); ++k) {
    const std::string at = where + ".args.deps[" + std::to_string(k) + "]";
    const auto dep = rd.integer(list[k], at, 0, kMaxCount);
    if (dep < x.layout.begin(r) || dep >= x.layout.end(r)) {
      rd.fail(at, "op " + std::to_string(id) + " depends on op " + std::to_string(dep) +
                      (dep < x.layout.total()
                           ? ", an op of rank " + std::to_string(x.layout.rank_of_op(dep))
                           : ", which the trace does not have") +
                      "; dependencies stay within a rank (" + std::to_string(r) + ")");
    }
    x.deps.push_back(static_cast<st::OpId>(dep));
  }
  op.deps_count = static_cast<std::uint16_t>(list.size());
}

// Op `id` from its event `e` (traceEvents[index]) into x.ops.
void read_op(ExactOps& x, const json& e, std::size_t index, std::int64_t id) {
  const Reader& rd = x.rd;
  const std::string where = "traceEvents[" + std::to_string(index) + "]";
  const int r = x.layout.rank_of_op(id);
  const json& args = e["args"];
  const auto pid = rd.integer(rd.member(e, where, "pid"), where + ".pid", 0, x.layout.world - 1);
  if (pid != r) {
    rd.fail(where + ".pid", "op " + std::to_string(id) + " belongs to rank " + std::to_string(r) +
                                " by stratasim.op_counts, but pid is " + std::to_string(pid));
  }
  std::string label;
  PendingOp op;
  op.provenance = Provenance::of(parse_info(rd, e, args, where, label));
  op.work = parse_work(x, e, args, where, op);
  op.label = x.labels.intern(label);
  op.unlabelled = label == work_name(op.work);  // the exporter's name for unlabelled ops
  parse_deps(x, args, where, id, r, op);
  if (auto m = args.find("mem"); m != args.end()) {
    const auto effects = parse_effects(rd, *m, where + ".args.mem");
    if (effects.size() > 0xFFFF) rd.fail(where + ".args.mem", "more than 65535 effects");
    op.effects_begin = x.effects.size();
    op.effects_count = static_cast<std::uint16_t>(effects.size());
    x.effects.insert(x.effects.end(), effects.begin(), effects.end());
  }
  x.ops[static_cast<std::size_t>(id)] = op;
}

// Op `id` into the program, or the error its event gave.
void add_op(const ExactOps& x, std::int64_t id, st::Program& program) {
  x.error.throw_if_at(id);
  const PendingOp& op = x.ops[static_cast<std::size_t>(id)];
  const std::string& label = x.labels[op.label];
  st::Work work = op.work;
  if (op.measured_ps >= 0) {
    work = st::Compute{
        program.add_kernels({st::Kernel{st::Measured{Time::ps(op.measured_ps)}, label}})};
  }
  program.add(
      work, op.provenance.info(op.unlabelled ? std::string_view() : label),
      std::span<const st::OpId>(x.deps).subspan(op.deps_begin, op.deps_count),
      std::span<const st::MemoryEffect>(x.effects).subspan(op.effects_begin, op.effects_count));
}

// Mirrors, overlapping iterations and validation, once every op is in.
void finish_program(const Reader& rd, const json& info, const OpLayout& layout,
                    st::Program& program) {
  program.finish();
  for (int r = 0; r < layout.world; ++r) {
    if (layout.replica_of[static_cast<std::size_t>(r)] != r) {
      program.set_replica(r, layout.replica_of[static_cast<std::size_t>(r)]);
    }
  }
  if (auto it = info.find("overlapping_iterations"); it != info.end()) {
    program.set_overlapping_iterations(rd.boolean(*it, "stratasim.overlapping_iterations"));
  }
  if (auto it = info.find("event_driven"); it != info.end()) {  // st::Program::event_driven
    const json& ranks = rd.array(*it, "stratasim.event_driven");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      program.set_event_driven(static_cast<int>(rd.integer(
          ranks[i], "stratasim.event_driven[" + std::to_string(i) + "]", 0, layout.world - 1)));
    }
  }
  validate_program(rd, program);
}

// The groups, kernel lists, initial memory and the ops of every rank, in op id order, into
// `program`; how many replay their duration.
std::int64_t build_ops(const Reader& rd, const json& info, const ExactOps& x,
                       st::Program& program) {
  const OpLayout& layout = x.layout;
  read_groups(rd, info, layout.world, program);
  read_kernel_lists(rd, info, program);
  const json* initial = initial_memory_lists(rd, info, layout.world);
  program.reserve(static_cast<std::size_t>(layout.total()), x.deps.size(), x.effects.size());
  std::int64_t measured_ops = 0;
  for (int r = 0; r < layout.world; ++r) {
    program.begin_rank(r);
    if (initial != nullptr) read_initial_memory(rd, *initial, r, program);
    for (std::int64_t id = layout.begin(r); id < layout.end(r); ++id) {
      add_op(x, id, program);
      if (x.ops[static_cast<std::size_t>(id)].measured_ps >= 0) ++measured_ops;
    }
  }
  return measured_ops;
}

// The timeline's text, read once per pass: in memory, or a stream read again from where it
// began. The first pass (scan) finds what JSON is malformed; the second streams the events.
class TimelineText {
 public:
  TimelineText(JsonText text, const Reader& rd) : text_(text), rd_(rd) {
    if (auto* in = std::get_if<std::istream*>(&text_)) start_ = (*in)->tellg();
  }

  /// The root's shape and the "stratasim" object (events counted, not kept).
  JsonStreamResult scan() const {
    try {
      return read({.array = "traceEvents", .keep = {"stratasim"}, .on_element = {}});
    } catch (const config::ConfigError& e) {  // nested deeper than config::kMaxJsonDepth
      rd_.fail("", e.message());
    } catch (const json::parse_error& e) {
      rd_.fail("byte " + std::to_string(e.byte), std::string("not valid JSON: ") + e.what());
    } catch (const json::exception& e) {
      // A number too large for a double ("2e1507") and the like.
      rd_.fail("", std::string("not valid JSON: ") + e.what());
    }
  }

  JsonStreamResult read(const JsonStreamRequest& request) const {
    std::istream* const* in = std::get_if<std::istream*>(&text_);
    if (in != nullptr) {
      (*in)->clear();
      (*in)->seekg(start_);
    }
    JsonStreamResult result = stream_json(text_, request, rd_.source());
    if (in != nullptr && (*in)->bad()) rd_.fail("", "cannot read the file");
    return result;
  }

 private:
  JsonText text_;
  const Reader& rd_;
  std::streampos start_ = 0;
};

// The events of traceEvents (the last, if the root names it twice), one at a time.
void for_each_event(const TimelineText& text, const JsonStreamResult& doc,
                    const std::function<void(std::size_t, const json&)>& visit) {
  text.read({.array = "traceEvents",
             .keep = {},
             .on_element = [&](std::size_t i, json& e) { visit(i, e); },
             .occurrence = doc.array_occurrences == 0 ? 0 : doc.array_occurrences - 1});
}

TimelineTrace import_exact(const Reader& rd, const TimelineText& text, const JsonStreamResult& doc,
                           const json& info) {
  OpLayout layout;
  read_header(rd, info, layout);
  read_op_counts(rd, info, static_cast<std::int64_t>(doc.array_size), layout);
  read_replicas(rd, info, layout);
  ExactOps x{rd, layout};
  if (auto it = info.find("groups"); it != info.end() && it->is_array()) {
    x.group_count = it->size();
  }
  x.list_known = known_kernel_lists(info);
  layout.event_of.assign(static_cast<std::size_t>(layout.total()), -1);
  x.ops.resize(static_cast<std::size_t>(layout.total()));
  for_each_event(text, doc, [&](std::size_t i, const json& e) {
    const std::int64_t id = map_event(rd, e, i, layout);
    if (id < 0) return;
    try {
      read_op(x, e, i, id);
    } catch (...) {
      x.error.offer(id, std::current_exception());
    }
  });
  require_every_op(rd, layout);
  layout.event_of = {};

  TimelineTrace out;
  st::Program& program = out.trace.program;
  program = st::Program(layout.world);
  const std::int64_t measured_ops = build_ops(rd, info, x, program);
  finish_program(rd, info, layout, program);
  if (measured_ops > 0) {
    out.trace.notes.push_back(std::to_string(measured_ops) +
                              " compute ops without a kernel list replay their recorded duration");
  }
  if (auto it = info.find("cluster"); it != info.end()) {
    out.trace.cluster = rd.string(*it, "stratasim.cluster");
  }
  if (auto it = info.find("context"); it != info.end()) {
    out.context = parse_context(rd, *it, layout.world);
  }
  return out;
}

// ---- An older timeline (no "stratasim" object): approximate, from stream and time order.

// An op of an older timeline as read from its event. Its issue order is (rank, start, order),
// ties by event. What it is (kind, group, bytes, peer) is read as the event streams by; the
// errors that reading finds are kept for the build (FirstError), and the peer, which needs the
// world size (the highest pid), is checked there.
struct LooseOp {
  std::int64_t event = 0;
  int rank = 0;
  Time start, end;
  std::int64_t order = 0;  // args.op when given, else the event index
  st::Work work = st::Compute{};
  std::uint32_t label = 0;         // into labels
  bool unlabelled = false;         // as PendingOp::unlabelled
  bool measured = false;           // compute: its span's duration is the work
  bool error_after_peer = false;   // the op's kept error comes after its peer's check
  std::uint32_t group = kNoGroup;  // a collective's group name, into labels
  json peer;                       // a send's or receive's args.peer
  Provenance provenance;
  static constexpr std::uint32_t kNoGroup = 0xFFFFFFFFu;

  std::tuple<int, Time, std::int64_t, std::int64_t> key() const {
    return {rank, start, order, event};
  }
};

struct LooseOps {
  explicit LooseOps(const Reader& reader) : rd(reader) {}
  const Reader& rd;
  Labels labels;
  std::vector<LooseOp> ops;
  int world = 0;
  FirstError<std::tuple<int, Time, std::int64_t, std::int64_t>> error;  // by LooseOp::key
};

// Where and when an X event's op runs; nullopt for other events.
std::optional<LooseOp> loose_op_of(const Reader& rd, const json& e, std::size_t i) {
  const std::string where = "traceEvents[" + std::to_string(i) + "]";
  rd.object(e, where);
  auto ph = e.find("ph");
  if (ph == e.end() || !ph->is_string() || *ph != "X") return std::nullopt;
  LooseOp op;
  op.event = static_cast<std::int64_t>(i);
  op.rank =
      static_cast<int>(rd.integer(rd.member(e, where, "pid"), where + ".pid", 0, kMaxWorld - 1));
  op.start = rd.micros(rd.member(e, where, "ts"), where + ".ts");
  op.end = op.start + rd.micros(rd.member(e, where, "dur"), where + ".dur");
  op.order = op.event;
  if (auto args = e.find("args"); args != e.end() && args->is_object()) {
    if (auto id = args->find("op"); id != args->end()) {
      op.order = rd.integer(*id, where + ".args.op", 0, kMaxCount);
    }
  }
  return op;
}

// The group a collective names, for its group's members: kept whatever else is wrong with it.
std::optional<std::string> member_group(const json& e) {
  const auto args = e.find("args");
  if (args == e.end() || !args->is_object()) return std::nullopt;
  const auto kind = args->find("kind");
  const auto group = args->find("group");
  if (kind != args->end() && kind->is_string() && collective_kind(kind->get<std::string>()) &&
      group != args->end() && group->is_string()) {
    return group->get<std::string>();
  }
  return std::nullopt;
}

// What the op of event `e` is: its provenance, label and work (the collective's group and the
// peer are resolved by the build). Throws what is wrong, before the peer's check unless
// op.error_after_peer.
void read_loose_op(LooseOps& x, const json& e, LooseOp& op) {
  const Reader& rd = x.rd;
  const std::string where = "traceEvents[" + std::to_string(op.event) + "]";
  static const json kNoArgs = json::object();
  const json& args = e.contains("args") ? rd.object(e["args"], where + ".args") : kNoArgs;
  std::string label;
  op.provenance = Provenance::of(parse_info(rd, e, args, where, label));
  auto kind = args.find("kind");
  const std::string k = kind != args.end() ? rd.string(*kind, where + ".args.kind") : "";
  if (const auto ck = collective_kind(k)) {
    // The group's name is op.group (member_group).
    rd.string(rd.member(args, where + ".args", "group"), where + ".args.group");
    op.work = st::Collective{
        *ck, DType::bf16, 0,
        bytes_of(rd, rd.member(args, where + ".args", "bytes"), where + ".args.bytes")};
  } else if (args.contains("peer")) {
    op.peer = args["peer"];
    const bool recv = k == "recv" || (k.empty() && (op.provenance.stream == st::Stream::pp_recv ||
                                                    label.find("recv") != std::string::npos));
    op.error_after_peer = true;  // args.bytes is read after args.peer
    const Bytes bytes =
        bytes_of(rd, rd.member(args, where + ".args", "bytes"), where + ".args.bytes");
    op.error_after_peer = false;
    op.work = recv ? st::Work(st::Recv{0, bytes}) : st::Work(st::Send{0, bytes});
  } else {
    op.measured = true;
  }
  op.label = x.labels.intern(label);
  op.unlabelled = label == work_name(op.work);
}

// Op `op` into the program: its collective's group, its peer (checked against the world) or
// its Measured work, and its dependencies on the other streams of its rank (`last`: per
// stream, the last op and its end).
struct StreamEnds {
  std::array<std::int64_t, st::kStreamCount> op;
  std::array<Time, st::kStreamCount> end{};
  StreamEnds() { op.fill(-1); }
};

void add_loose_op(const LooseOps& x, const LooseOp& op,
                  const std::map<std::string, std::uint32_t>& group_ids, StreamEnds& last,
                  st::Program& program) {
  const Reader& rd = x.rd;
  if (!op.error_after_peer) x.error.throw_if_at(op.key());
  st::Work work = op.work;
  const std::string& label = x.labels[op.label];
  if (auto* c = std::get_if<st::Collective>(&work)) {
    c->group = group_ids.at(x.labels[op.group]);
  } else if (op.measured) {
    work = st::Compute{program.add_kernels({st::Kernel{st::Measured{op.end - op.start}, label}})};
  } else {
    const auto peer = static_cast<std::int32_t>(rd.integer(
        op.peer, "traceEvents[" + std::to_string(op.event) + "].args.peer", 0, x.world - 1));
    if (auto* s = std::get_if<st::Send>(&work)) s->peer = peer;
    if (auto* r = std::get_if<st::Recv>(&work)) r->peer = peer;
  }
  x.error.throw_if_at(op.key());
  const st::OpInfo info = op.provenance.info(op.unlabelled ? std::string_view() : label);
  // Wait for the last op of every other stream that had ended when this one started.
  std::vector<st::OpId> deps;
  for (int s = 0; s < st::kStreamCount; ++s) {
    const auto su = static_cast<std::size_t>(s);
    if (s != static_cast<int>(info.stream) && last.op[su] >= 0 && last.end[su] <= op.start) {
      deps.push_back(static_cast<st::OpId>(last.op[su]));
    }
  }
  const st::OpId id = program.add(work, info, deps);
  last.op[static_cast<std::size_t>(info.stream)] = id;
  last.end[static_cast<std::size_t>(info.stream)] = op.end;
}

// The ops of the X events, as read (errors kept for the build).
LooseOps read_loose_ops(const Reader& rd, const TimelineText& text, const JsonStreamResult& doc) {
  LooseOps x{rd};
  for_each_event(text, doc, [&](std::size_t i, const json& e) {
    std::optional<LooseOp> op = loose_op_of(rd, e, i);
    if (!op) return;
    x.world = std::max(x.world, op->rank + 1);
    if (const auto group = member_group(e)) op->group = x.labels.intern(*group);
    try {
      read_loose_op(x, e, *op);
    } catch (...) {
      x.error.offer(op->key(), std::current_exception());
    }
    x.ops.push_back(std::move(*op));
  });
  if (x.ops.empty()) {
    rd.fail("traceEvents", "expected complete (\"ph\": \"X\") events: there are none");
  }
  // Issue order: by rank, then by start time (the recorded op id breaks ties).
  std::stable_sort(x.ops.begin(), x.ops.end(), [](const LooseOp& a, const LooseOp& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.start != b.start) return a.start < b.start;
    return a.order < b.order;
  });
  return x;
}

TimelineTrace import_loose(const Reader& rd, const TimelineText& text,
                           const JsonStreamResult& doc) {
  const LooseOps x = read_loose_ops(rd, text, doc);
  // A group's members: the ranks that issue collectives on it, in rank order.
  std::map<std::string, std::vector<std::int32_t>> members;
  for (const LooseOp& op : x.ops) {
    if (op.group == LooseOp::kNoGroup) continue;
    auto& list = members[x.labels[op.group]];
    if (list.empty() || list.back() != op.rank) list.push_back(op.rank);
  }
  TimelineTrace out;
  st::Program& program = out.trace.program;
  program = st::Program(std::max(x.world, 1));
  std::map<std::string, std::uint32_t> group_ids;
  for (auto& [name, ranks] : members) group_ids[name] = program.add_group(ranks, name);

  std::size_t next = 0;
  for (int r = 0; r < x.world; ++r) {
    program.begin_rank(r);
    StreamEnds last;
    for (; next < x.ops.size() && x.ops[next].rank == r; ++next) {
      add_loose_op(x, x.ops[next], group_ids, last, program);
    }
  }
  program.finish();
  validate_program(rd, program);
  out.trace.notes.push_back(
      "the timeline has no \"stratasim\" object (written by an older stratasim or edited): "
      "compute replays its recorded durations, dependencies are rebuilt from stream and time "
      "order, and groups from the ranks that use them; re-run stratasim simulate --out for an "
      "exact replay");
  return out;
}

TimelineTrace import_timeline_from(const TimelineText& text, const Reader& rd) {
  const JsonStreamResult doc = text.scan();
  const bool object = doc.root == json::value_t::object;
  if (object && doc.array_occurrences == 0) rd.fail("", "expected a member \"traceEvents\"");
  const json::value_t events = object ? doc.array_type : doc.root;
  if (events != json::value_t::array) {
    rd.fail(object ? "traceEvents" : "",
            "expected an array, got " + std::string(json(events).type_name()));
  }
  const auto info = doc.kept.find("stratasim");
  try {
    return info != doc.kept.end() ? import_exact(rd, text, doc, info->second)
                                  : import_loose(rd, text, doc);
  } catch (const TraceError&) {
    throw;
  } catch (const std::exception& e) {
    // Program building refuses what the checks above let through (a bug, not the input's):
    // still an error about this file.
    rd.fail("", std::string("cannot build a program from it: ") + e.what());
  }
}

}  // namespace

TimelineTrace import_timeline_text(std::string_view text, const std::string& source) {
  const Reader rd(source);
  return import_timeline_from(TimelineText(text, rd), rd);
}

TimelineTrace import_timeline(const fs::path& path) {
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = path / "timeline.json";
  std::vector<char> buffer(std::size_t{1} << 20);
  std::ifstream in;
  in.rdbuf()->pubsetbuf(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  in.open(file, std::ios::binary);
  if (!in) {
    throw TraceError(file.string(), "",
                     fs::is_directory(path, ec)
                         ? "the folder has no timeline.json (write one with stratasim simulate "
                           "--out DIR)"
                         : "cannot open the file");
  }
  if (!fs::is_regular_file(file, ec)) {
    // A pipe cannot be read twice: its text is read into memory.
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw TraceError(file.string(), "", "cannot read the file");
    return import_timeline_text(text, file.string());
  }
  const Reader rd(file.string());
  return import_timeline_from(TimelineText(static_cast<std::istream*>(&in), rd), rd);
}

}  // namespace stratasim::traces
