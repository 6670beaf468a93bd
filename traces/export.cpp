// Writers of a run's files.
//
// Chrome trace (timeline.json), streamed through a buffer rather than built as one JSON value:
//   {"displayTimeUnit":"ns","traceEvents":[ ...metadata, X events, C events... ]}
// - metadata: per rank, process_name "rank R" and process_sort_index R; per (rank, stream)
//   that has spans, thread_name = name_of(stream) and thread_sort_index = stream index;
// - one "X" event per span, in timeline order: pid = rank, tid = stream index, ts and dur in
//   microseconds printed exactly from the integer picoseconds with 6 decimals; name = the op's
//   label (or the kind of work when it has none), cat = the phase, args = {op, microbatch (when
//   >= 0), layers "first-last" (inclusive, when layer_begin >= 0), bytes (collectives, sends,
//   receives), kind (collectives: all-reduce, ...; "send", "recv") and group (collectives),
//   peer (sends, receives), interference_us (the time the op lost to compute-communication
//   interference, when it lost any)};
// - one "C" event per memory sample: pid = rank, name "memory (<tier>)", args {bytes: total}.
// What a replay needs besides (traces/timeline_import.hpp, docs/replay.md):
// - in the X events' args: deps (op ids, when the op has any), kernels (a compute op's index
//   into the kernel lists), dtype and group_index (collectives), mem (memory effects, each
//   [bytes, category, tier, at_end 0/1]);
// - after traceEvents, "otherData" (a few readable facts that Perfetto shows) and "stratasim":
//   {format, world_size, completed, op_counts (per rank), replica_of (when mirrored),
//   event_driven (the event-driven ranks, when any: strategies::Program::event_driven),
//   overlapping_iterations, groups [{name, ranks}], kernel_lists (null for lists no exported op
//   uses), initial_memory (every rank's: [bytes, category, tier]), cluster, context}.
// The output depends only on its inputs, so equal inputs give byte-identical files.
//
// memory.csv: "rank,tier,time_s,total_bytes,op,label", one row per sample in timeline order,
// time_s exact from the picoseconds with 12 decimals, label quoted when it needs to be.
//
// write_outputs: stages the three files in `dir` (files::StagedWrites: temporaries beside
// their targets), then renames them into place; on any failure removes what it made (the
// temporaries, and `dir` and its parents if it made them) and rethrows.
#include "traces/export.hpp"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/files.hpp"

namespace stratasim::traces {

namespace {

namespace fs = std::filesystem;
using strategies::Collective;
using strategies::Compute;
using strategies::Op;
using strategies::Recv;
using strategies::Send;

// Appends to a fixed buffer and hands it to the stream in large blocks (10 million events are
// formatted in about a second).
class Writer {
 public:
  explicit Writer(std::ostream& out) : out_(out), buf_(kSize) {}
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer() { flush(); }

  Writer& operator<<(std::string_view s) {
    if (s.size() > kSize - pos_) {
      flush();
      if (s.size() > kSize) {
        out_.write(s.data(), static_cast<std::streamsize>(s.size()));
        return *this;
      }
    }
    std::memcpy(buf_.data() + pos_, s.data(), s.size());
    pos_ += s.size();
    return *this;
  }
  Writer& operator<<(char c) {
    reserve(1);
    buf_[pos_++] = c;
    return *this;
  }
  Writer& integer(std::int64_t v) {
    reserve(24);
    auto result = std::to_chars(buf_.data() + pos_, buf_.data() + kSize, v);
    pos_ = static_cast<std::size_t>(result.ptr - buf_.data());
    return *this;
  }
  /// `value / 10^Decimals` printed exactly with `Decimals` digits after the point.
  template <int Decimals>
  Writer& fixed(std::int64_t value) {
    static_assert(Decimals > 0 && Decimals < 19);
    constexpr std::uint64_t kScale = [] {
      std::uint64_t s = 1;
      for (int i = 0; i < Decimals; ++i) s *= 10;
      return s;
    }();
    reserve(48);
    char* p = buf_.data() + pos_;
    const std::uint64_t magnitude =
        value < 0 ? 0 - static_cast<std::uint64_t>(value) : static_cast<std::uint64_t>(value);
    if (value < 0) *p++ = '-';
    p = std::to_chars(p, buf_.data() + kSize, magnitude / kScale).ptr;
    *p++ = '.';
    std::uint64_t frac = magnitude % kScale;
    for (int i = Decimals - 1; i >= 0; --i) {
      p[i] = static_cast<char>('0' + frac % 10);
      frac /= 10;
    }
    pos_ = static_cast<std::size_t>(p + Decimals - buf_.data());
    return *this;
  }
  void flush() {
    if (pos_ > 0) out_.write(buf_.data(), static_cast<std::streamsize>(pos_));
    pos_ = 0;
  }

 private:
  void reserve(std::size_t n) {
    if (kSize - pos_ < n) flush();
  }
  static constexpr std::size_t kSize = std::size_t{1} << 20;
  std::ostream& out_;
  std::vector<char> buf_;
  std::size_t pos_ = 0;
};

// A JSON string literal, quotes included.
std::string json_string(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

// A CSV field: quoted (with doubled quotes) when it contains a comma, quote or line break.
std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

[[noreturn]] void bad_op(std::string_view what, std::size_t index, OpId op,
                         const strategies::Program& program) {
  throw std::invalid_argument("timeline " + std::string(what) + " " + std::to_string(index) +
                              " refers to op " + std::to_string(op) + ", but the program has " +
                              std::to_string(program.op_count()) + " ops");
}

std::string_view work_name(const Op& op) {
  if (const auto* c = std::get_if<Collective>(&op.work)) return strategies::name_of(c->kind);
  if (std::holds_alternative<Send>(op.work)) return "send";
  if (std::holds_alternative<Recv>(op.work)) return "recv";
  return "compute";
}

void write_metadata(Writer& w, const strategies::Program& program, const Timeline& timeline,
                    const std::vector<char>& keep, bool& first) {
  const auto world = static_cast<std::size_t>(program.world_size());
  std::vector<std::uint8_t> streams_used(world, 0);  // bit per stream
  for (const Span& span : timeline.spans) {
    if (span.rank >= 0 && static_cast<std::size_t>(span.rank) < world) {
      streams_used[static_cast<std::size_t>(span.rank)] |=
          static_cast<std::uint8_t>(1u << static_cast<unsigned>(span.stream));
    }
  }
  auto separator = [&] {
    if (!first) w << ",\n";
    first = false;
  };
  for (std::size_t r = 0; r < world; ++r) {
    if (!keep[r]) continue;
    const auto rank = static_cast<std::int64_t>(r);
    separator();
    w << R"({"name":"process_name","ph":"M","pid":)";
    w.integer(rank) << R"(,"args":{"name":"rank )";
    w.integer(rank) << "\"}}";
    separator();
    w << R"({"name":"process_sort_index","ph":"M","pid":)";
    w.integer(rank) << R"(,"args":{"sort_index":)";
    w.integer(rank) << "}}";
    for (int s = 0; s < strategies::kStreamCount; ++s) {
      if ((streams_used[r] & (1u << static_cast<unsigned>(s))) == 0) continue;
      separator();
      w << R"({"name":"thread_name","ph":"M","pid":)";
      w.integer(rank) << R"(,"tid":)";
      w.integer(s) << R"(,"args":{"name":)"
                   << json_string(strategies::name_of(static_cast<Stream>(s))) << "}}";
      separator();
      w << R"({"name":"thread_sort_index","ph":"M","pid":)";
      w.integer(rank) << R"(,"tid":)";
      w.integer(s) << R"(,"args":{"sort_index":)";
      w.integer(s) << "}}";
    }
  }
}

// keep[rank] is true for the ranks the options select.
std::vector<char> selected_ranks(const strategies::Program& program, const ExportOptions& options) {
  const auto world = static_cast<std::size_t>(program.world_size());
  std::vector<char> keep(world, options.ranks.empty() ? 1 : 0);
  for (std::int32_t r : options.ranks) {
    if (r < 0 || static_cast<std::size_t>(r) >= world) {
      throw std::invalid_argument("trace rank " + std::to_string(r) +
                                  " is not a rank of the program (0-" + std::to_string(world - 1) +
                                  ")");
    }
    keep[static_cast<std::size_t>(r)] = 1;
  }
  return keep;
}

bool kept(const std::vector<char>& keep, std::int32_t rank) {
  return rank >= 0 && static_cast<std::size_t>(rank) < keep.size() &&
         keep[static_cast<std::size_t>(rank)];
}

// One kernel as the replay reads it back: {"name": ..., "<kind>": [fields]}.
nlohmann::json kernel_json(const strategies::Kernel& k) {
  using nlohmann::json;
  json j = json::object();
  j["name"] = k.name;
  std::visit(
      [&](const auto& w) {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, strategies::Gemm>) {
          j["gemm"] = json::array({w.m, w.n, w.k, w.batch, name_of(w.dtype)});
          // The FP8 scaling, when not the default (tensor): a sixth value.
          if (w.dtype == DType::fp8 && w.scaling != hw::GemmScaling::tensor) {
            j["gemm"].push_back(hw::name_of(w.scaling));
          }
        } else if constexpr (std::is_same_v<W, strategies::Attention>) {
          j["attention"] = json::array({w.batch, w.heads, w.kv_heads, w.seq_q, w.seq_kv, w.head_dim,
                                        w.causal, name_of(w.dtype), w.backward});
          // The fused kernel, when not the default (FlashAttention-2): a tenth value.
          // A sliding window (when set): an eleventh, after the kernel; an attention chunk
          // (when set): a twelfth, after the window.
          if (w.impl != hw::AttentionImpl::flash_attention_2 || w.window > 0 || w.chunk > 0) {
            j["attention"].push_back(hw::name_of(w.impl));
          }
          if (w.window > 0 || w.chunk > 0) j["attention"].push_back(w.window);
          if (w.chunk > 0) j["attention"].push_back(w.chunk);
        } else if constexpr (std::is_same_v<W, strategies::Elementwise>) {
          j["elementwise"] =
              json::array({w.elements, w.bytes_read.count(), w.bytes_written.count()});
        } else if constexpr (std::is_same_v<W, strategies::OptimizerStep>) {
          j["optimizer"] = json::array(
              {w.params, strategies::name_of(w.kind), name_of(w.dtype), w.on_host, w.fp32_grads});
        } else if constexpr (std::is_same_v<W, strategies::Copy>) {
          j["copy"] = json::array(
              {w.bytes.count(), strategies::name_of(w.from), strategies::name_of(w.to)});
        } else if constexpr (std::is_same_v<W, strategies::Measured>) {
          j["measured_ps"] = w.duration.picoseconds();
        } else {
          static_assert(std::is_same_v<W, strategies::RooflineWork>);
          j["roofline"] = json::array({w.flops.count(), w.bytes.count(), name_of(w.dtype)});
        }
      },
      k.work);
  return j;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The cluster's name: the given one, else the start of the context's "cluster" setup line
// ("dgx-a100-1: 1 x 8 A100 ...").
std::string cluster_name(const ExportOptions& options) {
  if (!options.cluster.empty() || options.context == nullptr) return options.cluster;
  for (const auto& [key, value] : options.context->setup) {
    if (key == "cluster") return value.substr(0, value.find(':'));
  }
  return {};
}

// The top-level "otherData" and "stratasim" members (see the top of this file).
void write_replay_info(Writer& w, const strategies::Program& program, const Timeline& timeline,
                       const std::vector<char>& keep, const ExportOptions& options) {
  using nlohmann::json;
  const std::string cluster = cluster_name(options);
  json other = json::object();
  other["generator"] = "stratasim";
  other["stratasim_format"] = 1;
  other["world_size"] = program.world_size();
  if (!cluster.empty()) other["cluster"] = cluster;
  if (options.context != nullptr) other["experiment"] = options.context->experiment;
  w << ",\n\"otherData\":" << dump(other) << ",\n\"stratasim\":{\"format\":1,\"world_size\":";
  w.integer(program.world_size()) << ",\"completed\":" << (timeline.completed ? "true" : "false");
  w << ",\"overlapping_iterations\":" << (program.overlapping_iterations() ? "true" : "false");
  w << ",\n\"op_counts\":[";
  for (int r = 0; r < program.world_size(); ++r) {
    if (r > 0) w << ',';
    w.integer(static_cast<std::int64_t>(program.ops_of(r).size()));
  }
  w << ']';
  if (program.mirrored()) {
    w << ",\n\"replica_of\":[";
    for (int r = 0; r < program.world_size(); ++r) {
      if (r > 0) w << ',';
      w.integer(program.replica_of(r));
    }
    w << ']';
  }
  if (program.has_event_driven()) {  // strategies::Program::event_driven
    w << ",\n\"event_driven\":[";
    bool first = true;
    for (int r = 0; r < program.world_size(); ++r) {
      if (!program.event_driven(r)) continue;
      if (!first) w << ',';
      first = false;
      w.integer(r);
    }
    w << ']';
  }
  w << ",\n\"groups\":[";
  for (std::size_t g = 0; g < program.groups().size(); ++g) {
    const auto& group = program.groups()[g];
    w << (g > 0 ? ",\n" : "\n") << R"({"name":)" << json_string(group.name) << R"(,"ranks":[)";
    for (std::size_t i = 0; i < group.ranks.size(); ++i) {
      if (i > 0) w << ',';
      w.integer(group.ranks[i]);
    }
    w << "]}";
  }
  // Only the kernel lists of exported ops: a trace of a few ranks stays small.
  std::vector<char> used(program.kernel_lists().size(), 0);
  for (const Span& span : timeline.spans) {
    if (!kept(keep, span.rank) || span.op >= program.op_count()) continue;
    if (const auto* c = std::get_if<Compute>(&program.op(span.op).work)) {
      if (c->kernels < used.size()) used[c->kernels] = 1;
    }
  }
  w << "],\n\"kernel_lists\":[";
  for (std::size_t l = 0; l < used.size(); ++l) {
    w << (l > 0 ? ",\n" : "\n");
    if (!used[l]) {
      w << "null";
      continue;
    }
    json list = json::array();
    for (const auto& k : program.kernel_lists()[l]) list.push_back(kernel_json(k));
    w << dump(list);
  }
  w << "],\n\"initial_memory\":[";
  for (int r = 0; r < program.world_size(); ++r) {
    // Every rank's (a few entries each): mirrored ranks hold memory too.
    w << (r > 0 ? ",[" : "[");
    bool first = true;
    for (const auto& m : program.initial_memory(r)) {
      w << (first ? "[" : ",[");
      first = false;
      w.integer(m.bytes.count()) << ",\"" << strategies::name_of(m.category) << "\",\""
                                 << strategies::name_of(m.tier) << "\"]";
    }
    w << ']';
  }
  w << ']';
  if (!cluster.empty()) w << ",\n\"cluster\":" << json_string(cluster);
  if (const ReportContext* c = options.context) {
    json context = json::object();
    context["experiment"] = c->experiment;
    context["samples_per_iteration"] = c->samples_per_iteration;
    context["tokens_per_iteration"] = c->tokens_per_iteration;
    context["device_peak_flops"] = c->device_peak.flops_per_second();
    context["device_capacity_bytes"] = c->device_capacity.count();
    if (c->framework_compute != 1.0) context["framework_compute"] = c->framework_compute;
    if (c->framework_memory_traffic != 1.0) {
      context["framework_memory_traffic"] = c->framework_memory_traffic;
    }
    if (c->framework_attention != 1.0) context["framework_attention"] = c->framework_attention;
    context["stage_of_rank"] = c->stage_of_rank;
    json setup = json::array();
    for (const auto& [key, value] : c->setup) setup.push_back(json::array({key, value}));
    context["setup"] = setup;
    w << ",\n\"context\":" << dump(context);
  }
  w << "}";
}

}  // namespace

void write_chrome_trace(std::ostream& out, const strategies::Program& program,
                        const Timeline& timeline, const ExportOptions& options) {
  const std::vector<char> keep = selected_ranks(program, options);
  // Escaped strings are computed once per label, group, phase, tier and kind, not per event.
  std::vector<std::string> labels;
  labels.reserve(program.labels().size());
  for (const std::string& l : program.labels()) labels.push_back(json_string(l));
  std::vector<std::string> groups;
  groups.reserve(program.groups().size());
  for (const auto& g : program.groups()) groups.push_back(json_string(g.name));
  std::vector<std::string> phases;
  for (int p = 0; p < strategies::kPhaseCount; ++p) {
    phases.push_back(json_string(strategies::name_of(static_cast<strategies::Phase>(p))));
  }
  std::vector<std::string> counters;
  for (int t = 0; t < kMemoryTierCount; ++t) {
    counters.push_back(json_string(
        "memory (" + std::string(strategies::name_of(static_cast<MemoryTier>(t))) + ")"));
  }

  std::vector<std::int64_t> lost_ps;  // per op, when the timeline records interference
  if (!timeline.interference.empty()) {
    lost_ps.assign(program.op_count(), 0);
    for (const auto& loss : timeline.interference) {
      if (loss.op < lost_ps.size()) lost_ps[loss.op] += loss.lost.picoseconds();
    }
  }

  Writer w(out);
  w << R"({"displayTimeUnit":"ns","traceEvents":[)" << '\n';
  bool first = true;
  write_metadata(w, program, timeline, keep, first);

  for (std::size_t i = 0; i < timeline.spans.size(); ++i) {
    const Span& span = timeline.spans[i];
    if (!kept(keep, span.rank)) continue;
    if (span.op >= program.op_count()) bad_op("span", i, span.op, program);
    const Op& op = program.op(span.op);
    if (!first) w << ",\n";
    first = false;
    w << R"({"name":)";
    if (op.label != 0 && op.label < labels.size()) {
      w << labels[op.label];
    } else {
      w << '"' << work_name(op) << '"';
    }
    w << R"(,"cat":)"
      << phases[std::min<std::size_t>(static_cast<std::size_t>(op.phase), phases.size() - 1)]
      << R"(,"ph":"X","pid":)";
    w.integer(span.rank) << R"(,"tid":)";
    w.integer(static_cast<std::int64_t>(span.stream)) << R"(,"ts":)";
    w.fixed<6>(span.start.picoseconds()) << R"(,"dur":)";
    w.fixed<6>((span.end - span.start).picoseconds()) << R"(,"args":{"op":)";
    w.integer(span.op);
    if (op.microbatch >= 0) {
      w << R"(,"microbatch":)";
      w.integer(op.microbatch);
    }
    if (op.layer_begin >= 0) {
      w << R"(,"layers":")";
      w.integer(op.layer_begin) << '-';
      w.integer(op.layer_end > op.layer_begin ? op.layer_end - 1 : op.layer_begin) << '"';
    }
    if (const auto* c = std::get_if<Collective>(&op.work)) {
      w << R"(,"kind":")" << strategies::name_of(c->kind) << R"(","bytes":)";
      w.integer(c->bytes.count()) << R"(,"group":)";
      if (c->group < groups.size()) {
        w << groups[c->group];
      } else {
        w << '"' << "group " << std::to_string(c->group) << '"';
      }
    } else if (const auto* s = std::get_if<Send>(&op.work)) {
      w << R"(,"kind":"send","bytes":)";
      w.integer(s->bytes.count()) << R"(,"peer":)";
      w.integer(s->peer);
      if (s->eager) w << R"(,"eager":true)";        // strategies::Send::eager (Chakra imports)
      if (s->detached) w << R"(,"detached":true)";  // strategies::Send::detached
    } else if (const auto* r = std::get_if<Recv>(&op.work)) {
      w << R"(,"kind":"recv","bytes":)";
      w.integer(r->bytes.count()) << R"(,"peer":)";
      w.integer(r->peer);
    }
    if (!lost_ps.empty() && lost_ps[span.op] > 0) {
      w << R"(,"interference_us":)";
      w.fixed<6>(lost_ps[span.op]);
    }
    // What a replay needs (see the top of this file).
    if (const auto* c = std::get_if<Collective>(&op.work)) {
      w << R"(,"dtype":")" << name_of(c->dtype) << R"(","group_index":)";
      w.integer(c->group);
    } else if (const auto* k = std::get_if<Compute>(&op.work)) {
      w << R"(,"kernels":)";
      w.integer(k->kernels);
    }
    const auto deps = program.deps_of(op);
    if (!deps.empty()) {
      w << R"(,"deps":[)";
      for (std::size_t d = 0; d < deps.size(); ++d) {
        if (d > 0) w << ',';
        w.integer(deps[d]);
      }
      w << ']';
    }
    const auto effects = program.effects_of(op);
    if (!effects.empty()) {
      w << R"(,"mem":[)";
      for (std::size_t e = 0; e < effects.size(); ++e) {
        w << (e > 0 ? ",[" : "[");
        w.integer(effects[e].delta.count()) << ",\"" << strategies::name_of(effects[e].category)
                                            << "\",\"" << strategies::name_of(effects[e].tier)
                                            << "\"," << (effects[e].at_end ? '1' : '0') << ']';
      }
      w << ']';
    }
    w << "}}";
  }

  for (const MemorySample& m : timeline.memory) {
    if (!kept(keep, m.rank)) continue;
    if (!first) w << ",\n";
    first = false;
    w << R"({"name":)" << counters[std::min<std::size_t>(static_cast<std::size_t>(m.tier), 2)]
      << R"(,"ph":"C","pid":)";
    w.integer(m.rank) << R"(,"ts":)";
    w.fixed<6>(m.time.picoseconds()) << R"(,"args":{"bytes":)";
    w.integer(m.total.count()) << "}}";
  }
  w << "\n]";
  write_replay_info(w, program, timeline, keep, options);
  w << "}\n";
  w.flush();
}

void write_memory_csv(std::ostream& out, const strategies::Program& program,
                      const Timeline& timeline, const ExportOptions& options) {
  const std::vector<char> keep = selected_ranks(program, options);
  std::vector<std::string> labels;
  labels.reserve(program.labels().size());
  for (const std::string& l : program.labels()) labels.push_back(csv_field(l));

  Writer w(out);
  w << "rank,tier,time_s,total_bytes,op,label\n";
  for (std::size_t i = 0; i < timeline.memory.size(); ++i) {
    const MemorySample& m = timeline.memory[i];
    if (!kept(keep, m.rank)) continue;
    if (m.op >= program.op_count()) bad_op("memory sample", i, m.op, program);
    w.integer(m.rank) << ',' << strategies::name_of(m.tier) << ',';
    w.fixed<12>(m.time.picoseconds()) << ',';
    w.integer(m.total.count()) << ',';
    w.integer(m.op) << ',' << labels[program.op(m.op).label] << '\n';
  }
  w.flush();
}

void write_outputs(const fs::path& dir, const strategies::Program& program,
                   const Timeline& timeline, const Report& report, const ReportContext& context,
                   const ExportOptions& options) {
  // "out/", "." and ".." name a folder too: work with its normal, named form.
  fs::path target = dir.lexically_normal();
  if (target.empty() || target.filename() == "." || target.filename() == "..") {
    target = fs::absolute(target).lexically_normal();
  }
  if (!target.has_filename()) target = target.parent_path();
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";

  bool made_target = false;
  std::vector<fs::path> made_parents;  // deepest first
  auto clean_up = [&] {
    std::error_code ignored;
    if (made_target) fs::remove_all(target, ignored);
    for (const fs::path& p : made_parents) fs::remove(p, ignored);  // only if still empty
  };
  try {
    try {
      for (fs::path p = parent; !p.empty() && !fs::exists(p); p = p.parent_path()) {
        made_parents.push_back(p);
        if (p == p.parent_path()) break;
      }
      fs::create_directories(parent);
      if (!fs::exists(target)) made_target = fs::create_directories(target);
      files::StagedWrites writes;
      writes.stage(target / "report.json", [&](std::ostream& out) {
        out << to_json(report, context)
                   .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
            << '\n';
      });
      ExportOptions trace_options = options;
      if (trace_options.context == nullptr) trace_options.context = &context;
      writes.stage(target / "timeline.json", [&](std::ostream& out) {
        write_chrome_trace(out, program, timeline, trace_options);
      });
      writes.stage(target / "memory.csv",
                   [&](std::ostream& out) { write_memory_csv(out, program, timeline, options); });
      writes.commit();
      made_target = false;  // complete: keep it
    } catch (const fs::filesystem_error& e) {
      throw std::runtime_error("cannot write the outputs to " + target.string() + ": " + e.what());
    }
  } catch (...) {
    clean_up();
    throw;
  }
}

}  // namespace stratasim::traces
