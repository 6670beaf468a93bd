// PyTorch profiler (Kineto) Chrome traces -> Program (traces/kineto.hpp has the semantics).
//
// Device activity becomes ops: GPU kernels, memcpys and memsets keep their measured durations;
// NCCL kernels become collectives (or sends/receives) whose time the simulator computes again,
// unless the peers are absent or the size unknown (then they keep their measured durations).
// The time of the replayed step in which no GPU work runs becomes measured ops on the host
// stream. CPU operators are not replayed one by one. The trace has no dependency edges, so they
// are reconstructed: each stream (the host's included) runs in order, and an op waits, on every
// other stream of its rank, for the last op that had finished (with all ops before it) when the
// op started in the trace. That keeps what the recorded run proves (gradients computed before
// their all-reduce started, the GPU idle while the host loaded the next batch) without
// inventing anything it does not. Collectives match across ranks by issue order per group.
#include "traces/kineto.hpp"
#include "hw_models/json_depth.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "strategies/retarget.hpp"
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

// The words of a process group's name or description, lower case ("DATA_PARALLEL_GROUP": data,
// parallel, group).
std::vector<std::string> words_of(std::string_view text) {
  std::vector<std::string> words(1);
  for (const char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      words.back() += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!words.back().empty()) {
      words.emplace_back();
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

// The importer's rule for a data-parallel process group (without --dp-groups), from its
// "Process Group Name" and "Process Group Description" and its size:
//  - a word naming data parallelism (dp, dp0, ddp, fsdp, data, zero: Megatron's
//    DATA_PARALLEL_GROUP, DATA_PARALLEL_GROUP_WITH_CP, a user's "dp_group") makes it data parallel;
//  - else a word naming another parallelism (tp, pp, cp, ep, tensor, pipeline, context, expert,
//    moe, sequence, embedding) makes it not;
//  - else a group of the whole world with PyTorch's default description ("default_pg"), none
//    (before PyTorch 2.3) or "undefined" is data parallel: DistributedDataParallel and FSDP
//    reduce gradients on the default group unless given another one.
bool data_parallel_by_rule(const std::string& pg_name, const std::string& pg_desc,
                           std::size_t members, int world) {
  static const std::set<std::string, std::less<>> kData = {"ddp", "fsdp", "data", "zero"};
  static const std::set<std::string, std::less<>> kOther = {
      "tp",      "pp",     "cp",  "ep",       "tensor",   "pipeline",
      "context", "expert", "moe", "sequence", "embedding"};
  bool other = false;
  for (const std::string* text : {&pg_desc, &pg_name}) {
    for (const auto& w : words_of(*text)) {
      const bool dp_word = w.size() >= 2 && w.compare(0, 2, "dp") == 0 &&
                           std::all_of(w.begin() + 2, w.end(), [](char c) {
                             return std::isdigit(static_cast<unsigned char>(c));
                           });
      if (dp_word || kData.count(w) > 0) return true;
      other = other || kOther.count(w) > 0;
    }
  }
  if (other) return false;
  const std::string d = lower(pg_desc);
  return static_cast<int>(members) == world && (d.empty() || d == "default_pg" || d == "undefined");
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

// A host ProfilerStep#N span.
struct Step {
  std::int64_t number = 0;
  double ts = 0, dur = 0;
};

struct ParsedFile {
  int rank = -1;
  std::optional<int> world;
  json doc;
  const json* events = nullptr;
  std::string base;         // the JSON path of the events array ("traceEvents", or "")
  std::vector<Step> steps;  // by start
};

constexpr std::string_view kStepPrefix = "ProfilerStep#";
// Shorter stretches without GPU work are rounding (timestamps are microseconds since the epoch,
// held in doubles: about 0.2 ns apart near 2^50 ns).
constexpr double kMinHostMicros = 1e-3;

std::string category_of(const Reader& in, const json& e) {
  const json* cat = in.field(e, "cat");
  return cat && cat->is_string() ? lower(cat->get<std::string>()) : "";
}

bool is_gpu_category(const std::string& c) {
  return c == "kernel" || c == "gpu_memcpy" || c == "gpu_memset" || c == "memcpy" || c == "memset";
}

// The host calls that launch GPU work; their "correlation" names the GPU event.
bool is_launch_category(const std::string& c) {
  return c == "cuda_runtime" || c == "cuda_driver" || c == "hip_runtime" || c == "hip_driver" ||
         c == "runtime";
}

// The events array and the host ProfilerStep spans of a parsed file.
void read_steps(ParsedFile& p, const Reader& in) {
  if (p.doc.is_object()) {
    p.events = in.field(p.doc, "traceEvents");
    if (!p.events || !p.events->is_array()) in.fail("traceEvents", "an array of trace events");
    p.base = "traceEvents";
  } else if (p.doc.is_array()) {
    p.events = &p.doc;
  } else {
    in.fail("", "a Chrome trace: an object with \"traceEvents\"");
  }
  for (std::size_t i = 0; i < p.events->size(); ++i) {
    const json& e = (*p.events)[i];
    const std::string path = p.base + "[" + std::to_string(i) + "]";
    if (!e.is_object()) in.fail(path, "an object (a trace event)");
    const json* ph = in.field(e, "ph");
    const json* name = in.field(e, "name");
    if (!ph || !ph->is_string() || ph->get_ref<const std::string&>() != "X" || !name ||
        !name->is_string() || !name->get_ref<const std::string&>().starts_with(kStepPrefix)) {
      continue;
    }
    // The same span on the GPU's timeline (gpu_user_annotation) is not the host step.
    if (category_of(in, e).starts_with("gpu_")) continue;
    const std::string& n = name->get_ref<const std::string&>();
    std::int64_t number = 0;
    std::size_t digits = 0;
    for (std::size_t k = kStepPrefix.size(); k < n.size(); ++k) {
      if (!std::isdigit(static_cast<unsigned char>(n[k])) || digits == 15) {
        digits = 0;
        break;
      }
      number = number * 10 + (n[k] - '0');
      ++digits;
    }
    if (digits == 0) in.fail(path + ".name", "ProfilerStep#<step number>, found \"" + n + "\"");
    Step step;
    step.number = number;
    step.ts = in.number(e, "ts", path, -kMaxTimestamp, kMaxTimestamp);
    step.dur = in.number(e, "dur", path, 0, kMaxMicros);
    p.steps.push_back(step);
  }
  std::stable_sort(p.steps.begin(), p.steps.end(),
                   [](const Step& a, const Step& b) { return a.ts < b.ts; });
}

std::string micros_text(double us) {
  return to_string(Time::ps(std::llround(us * 1e6)));
}

// What is replayed of one file: every GPU event (no steps); or, for steps first..last (one, or
// all of them), the time [from, until) and every GPU event that started in it, whichever step
// launched it. A step's time ends at the later of its span's end and the end of the last GPU
// event launched in it (within [begin, end], its span); it begins where the previous step's
// ended (the first step: at its span's start). Steps' times so follow one another without gap
// or overlap: in a GPU-bound run, where the host runs ahead, a step's time is the period of its
// GPU work, not its host span.
struct Window {
  bool whole = true;
  std::size_t first = 0, last = 0;  // indices into ParsedFile::steps
  double begin = 0, end = 0, from = 0, until = 0;
};

// The launch calls' start times by correlation id.
std::unordered_map<std::int64_t, double> launch_times(const json& events, const Reader& in) {
  std::unordered_map<std::int64_t, double> launched;
  for (const json& e : events) {
    const json* args = in.field(e, "args");
    if (!args || !args->is_object() || !is_launch_category(category_of(in, e))) continue;
    const json* corr = in.field(*args, "correlation");
    const json* ts = in.field(e, "ts");
    if (corr && corr->is_number_integer() && ts && ts->is_number()) {
      launched.emplace(corr->get<std::int64_t>(), ts->get<double>());
    }
  }
  return launched;
}

// When a GPU event with args `args` (may be null) that started at `ts` was launched: its
// launch call's start, else `ts`.
double launch_time(const Reader& in, const json* args, double ts,
                   const std::unordered_map<std::int64_t, double>& launched) {
  const json* corr = args && args->is_object() ? in.field(*args, "correlation") : nullptr;
  if (corr && corr->is_number_integer()) {
    if (auto it = launched.find(corr->get<std::int64_t>()); it != launched.end()) {
      return it->second;
    }
  }
  return ts;
}

// The steps of `p` in which some GPU work was launched. The last ProfilerStep span of a trace is
// often the one cut short when profiling stopped, with none.
std::set<std::int64_t> steps_with_gpu_work(const ParsedFile& p, const Reader& in) {
  std::set<std::int64_t> with;
  const auto launched = launch_times(*p.events, in);
  for (const json& e : *p.events) {
    if (!e.is_object() || !is_gpu_category(category_of(in, e))) continue;
    const json* ts = in.field(e, "ts");
    if (!ts || !ts->is_number()) continue;
    const double at = launch_time(in, in.field(e, "args"), ts->get<double>(), launched);
    for (const Step& s : p.steps) {
      if (at >= s.ts && at <= s.ts + s.dur) with.insert(s.number);
    }
  }
  return with;
}

// The step to replay, by number: the one asked for, else the lower median by duration of
// `reference`'s steps with GPU work (the faster of the two middle ones: steady state rather than
// warm-up).
std::optional<std::int64_t> chosen_step(const ParsedFile& reference, const Reader& in,
                                        const KinetoOptions& options) {
  if (options.all_steps) return std::nullopt;
  if (options.step) return options.step;
  if (reference.steps.empty()) return std::nullopt;
  const auto with_work = steps_with_gpu_work(reference, in);
  std::vector<Step> by_duration;
  for (const Step& s : reference.steps) {
    if (with_work.count(s.number) > 0) by_duration.push_back(s);
  }
  // The first step has no previous one to begin where it ended, and is often warm-up: left
  // out when there are others enough to take a median of.
  if (by_duration.size() >= 3 && by_duration.front().number == reference.steps.front().number) {
    by_duration.erase(by_duration.begin());
  }
  if (by_duration.empty()) by_duration = reference.steps;
  std::stable_sort(by_duration.begin(), by_duration.end(),
                   [](const Step& a, const Step& b) { return a.dur < b.dur; });
  return by_duration[(by_duration.size() - 1) / 2].number;
}

Window window_of(const ParsedFile& p, const std::string& file, std::optional<std::int64_t> step,
                 const KinetoOptions& options) {
  Window w;
  if (p.steps.empty()) {
    if (options.step) {
      throw TraceError(file, "traceEvents",
                       "--step " + std::to_string(*options.step) +
                           ": the trace has no ProfilerStep#N spans (record it with "
                           "torch.profiler.profile(schedule=...) and prof.step())");
    }
    return w;
  }
  if (!step && !options.all_steps) return w;  // the lowest rank has no steps: whole traces
  w.whole = false;
  if (options.all_steps) {
    w.last = p.steps.size() - 1;
    w.begin = p.steps.front().ts;
    for (const Step& s : p.steps) w.end = std::max(w.end, s.ts + s.dur);
    return w;
  }
  for (std::size_t k = 0; k < p.steps.size(); ++k) {
    const Step& s = p.steps[k];
    if (s.number == *step) {
      w.first = w.last = k;
      w.begin = s.ts;
      w.end = s.ts + s.dur;
      return w;
    }
  }
  std::string have;
  for (const Step& s : p.steps) {
    if (have.size() > 60) {
      have += ", ...";
      break;
    }
    have += (have.empty() ? "#" : ", #") + std::to_string(s.number);
  }
  throw TraceError(file, "traceEvents",
                   "ProfilerStep#" + std::to_string(*step) + " is not in the trace (it has " +
                       have + ")" + (options.step ? "" : "; choose one with --step N"));
}

// The report's lines about the recorded steps of `p` (rank 0's file) and the one replayed.
void describe_steps(const ParsedFile& p, std::optional<std::int64_t> step,
                    const KinetoOptions& options, ImportedTrace& result) {
  if (p.steps.empty()) {
    result.setup.emplace_back("recorded steps",
                              "none (no ProfilerStep#N spans): the whole trace is one iteration");
    return;
  }
  std::vector<double> durations;
  std::string list;
  for (std::size_t k = 0; k < p.steps.size(); ++k) {
    durations.push_back(p.steps[k].dur);
    if (k < 12) {
      list +=
          (k ? ", #" : "#") + std::to_string(p.steps[k].number) + " " + micros_text(p.steps[k].dur);
    } else if (k == 12) {
      list += ", ...";
    }
  }
  std::vector<double> sorted = durations;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  result.setup.emplace_back("recorded steps", std::to_string(n) + " ProfilerStep spans (" + list +
                                                  "); median " + micros_text(median));
  if (options.all_steps) {
    double sum = 0;
    for (double d : durations) sum += d;
    result.setup.emplace_back("replayed steps", "all " + std::to_string(n) + " back to back (" +
                                                    micros_text(sum) +
                                                    " measured in all): the iteration time "
                                                    "below is their sum");
    return;
  }
  double measured = 0;
  for (const Step& s : p.steps) {
    if (s.number == *step) measured = s.dur;
  }
  result.setup.emplace_back(
      "replayed step", "ProfilerStep#" + std::to_string(*step) + ", " + micros_text(measured) +
                           " measured (" +
                           (options.step ? std::string("--step") : std::string("the median step")) +
                           "; --step N or --step all for others)");
  const Step& first = p.steps.front();
  if (n >= 2 && first.number != *step && first.dur > 1.1 * median) {
    result.notes.push_back("ProfilerStep#" + std::to_string(first.number) +
                           ", the first step, took " + micros_text(first.dur) +
                           " against a median of " + micros_text(median) +
                           ": early steps are warm-up (allocator, autotuning, NCCL setup); "
                           "ProfilerStep#" +
                           std::to_string(*step) + " is replayed");
  }
}

// The process group of an NCCL kernel's args for the collective in `a`.
struct PgArgs {
  std::string name, desc;
};
PgArgs pg_args_of(const Reader& in, const json& a) {
  PgArgs pg;
  if (const json* n = in.field(a, "Process Group Name"); n && n->is_string()) {
    pg.name = n->get<std::string>();
  }
  if (const json* d = in.field(a, "Process Group Description"); d && d->is_string()) {
    pg.desc = d->get<std::string>();
  }
  return pg;
}

std::string group_label(const PgArgs& pg) {
  std::string label = pg.name.empty() ? "pg" : "pg " + pg.name;
  if (!pg.desc.empty()) label += " (" + pg.desc + ")";
  return label;
}

// Whether a group is data parallel: the user's pattern over its label when given, else the
// importer's rule.
bool data_parallel(const PgArgs& pg, std::size_t members, int world, const KinetoOptions& options) {
  if (options.dp_groups.empty()) return data_parallel_by_rule(pg.name, pg.desc, members, world);
  try {
    return st::matches_data_parallel(group_label(pg), options.dp_groups);
  } catch (const st::RetargetError& e) {
    throw TraceError("--dp-groups", "", e.what());
  }
}

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

// The request itself: some files, not too many, and not both --step N and --step all.
void check_request(const std::vector<KinetoFile>& files, const KinetoOptions& options) {
  if (files.empty()) throw TraceError("kineto", "", "no trace files");
  if (files.size() > static_cast<std::size_t>(kMaxRanks)) {
    throw TraceError(files[0].name, "", "more than " + std::to_string(kMaxRanks) + " files");
  }
  if (options.step && options.all_steps) {
    throw TraceError("--step", "", "give a step number or all, not both");
  }
}

// A file's JSON into p.doc, and the rank and world size its distributedInfo gives (p.rank stays
// -1 where it gives none).
void parse_document(const KinetoFile& file, ParsedFile& p) {
  try {
    p.doc = config::parse_json_depth_bounded(file.text, file.name);
  } catch (const config::ConfigError& e) {  // nested deeper than config::kMaxJsonDepth
    throw TraceError(file.name, "", e.message());
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
      p.rank = static_cast<int>(in.integer(info["rank"], "distributedInfo.rank", 0, kMaxRanks - 1));
    }
    if (info.contains("world_size")) {
      p.world = static_cast<int>(
          in.integer(info["world_size"], "distributedInfo.world_size", 1, kMaxRanks));
    }
  }
}

// The rank of a file whose distributedInfo gives none: the number in its name, else 0 when it
// is the only file.
int rank_without_info(const KinetoFile& file, std::size_t file_count) {
  if (const auto r = rank_from_name(file.name)) return *r;
  if (file_count == 1) return 0;
  throw TraceError(file.name, "distributedInfo.rank",
                   "cannot tell which rank this file is: it has no distributedInfo.rank "
                   "and its name has no rank number (\"...rank3...\")");
}

// The files parsed, each with its rank and steps (in the order given), and the job's world size
// as the files declare it (distributedInfo.world_size), checked against each other.
struct ParsedFiles {
  std::vector<ParsedFile> files;
  std::optional<int> declared;
};

ParsedFiles parse_files(const std::vector<KinetoFile>& files) {
  const int given = static_cast<int>(files.size());
  ParsedFiles out;
  out.files.resize(files.size());
  std::size_t declared_by = 0;  // the file that declared the world size first
  for (std::size_t f = 0; f < files.size(); ++f) {
    const auto& file = files[f];
    ParsedFile& p = out.files[f];
    parse_document(file, p);
    if (p.rank < 0) p.rank = rank_without_info(file, files.size());
    if (p.world) {
      if (out.declared && *out.declared != *p.world) {
        throw TraceError(file.name, "distributedInfo.world_size",
                         std::to_string(*out.declared) + " (the world size " +
                             files[declared_by].name + " gives), found " +
                             std::to_string(*p.world));
      }
      if (!out.declared) declared_by = f;
      out.declared = p.world;
      if (*p.world < given) {
        throw TraceError(file.name, "distributedInfo.world_size",
                         "the trace is of " + std::to_string(*p.world) + " ranks, but " +
                             std::to_string(given) + " files were given (one per rank at most)");
      }
      if (p.rank >= *p.world) {
        throw TraceError(file.name, "distributedInfo.rank",
                         "rank " + std::to_string(p.rank) + " is outside the world of " +
                             std::to_string(*p.world) + " ranks");
      }
    }
    read_steps(p, Reader{file.name});
  }
  return out;
}

// The job the files are of: program rank -> file (by trace rank, each rank once), its world
// size, and whether the files are only some of its ranks.
struct RankOrder {
  std::vector<std::size_t> file_of_rank;
  int world = 0;
  bool partial = false;
};

RankOrder order_ranks(const std::vector<KinetoFile>& files, const ParsedFiles& parsed) {
  const int given = static_cast<int>(files.size());
  // Some ranks of a larger job: replayed alone, with their communication as measured. Without
  // a world size, a rank number beyond the files given says so too (the world is then at least
  // one more than the highest rank).
  int highest = 0;
  for (const ParsedFile& p : parsed.files) highest = std::max(highest, p.rank);
  RankOrder order;
  order.partial = parsed.declared ? *parsed.declared > given : highest >= given;
  order.world = parsed.declared ? *parsed.declared : std::max(given, highest + 1);
  auto& file_of_rank = order.file_of_rank;
  file_of_rank.resize(files.size());
  for (std::size_t f = 0; f < files.size(); ++f) file_of_rank[f] = f;
  std::stable_sort(file_of_rank.begin(), file_of_rank.end(), [&](std::size_t a, std::size_t b) {
    return parsed.files[a].rank < parsed.files[b].rank;
  });
  for (std::size_t k = 1; k < file_of_rank.size(); ++k) {
    const ParsedFile& p = parsed.files[file_of_rank[k]];
    if (parsed.files[file_of_rank[k - 1]].rank == p.rank) {
      throw TraceError(files[file_of_rank[k]].name, "distributedInfo.rank",
                       "rank " + std::to_string(p.rank) + " is also the rank of " +
                           files[file_of_rank[k - 1]].name);
    }
  }
  return order;
}

// What the import counts over all ranks, for the report's notes.
struct ImportCounts {
  std::int64_t cpu_events = 0, comm_kernels = 0, measured_comm = 0, without_metadata = 0;
  std::int64_t outside = 0;
  std::set<int> ranks_with_several_compute_streams, ranks_with_several_devices;
};

// What the ranks' imports share: the request, the job, the program input and its groups so far.
struct JobImport {
  JobImport(const KinetoOptions& request, std::optional<std::int64_t> replayed,
            const RankOrder& order)
      : options(request), step(replayed), world(order.world), partial(order.partial) {}

  const KinetoOptions& options;
  std::optional<std::int64_t> step;  // the replayed step; none: all steps, or whole traces
  int world = 0;
  bool partial = false;
  TraceInput input;
  std::map<std::pair<std::string, std::vector<std::int32_t>>, std::uint32_t> group_index;
  ImportCounts counts;

  // The index in input.groups of the group `pg` of `members`, added at its first use.
  std::uint32_t group_of(const PgArgs& pg, const std::vector<std::int32_t>& members, bool dp);
};

std::uint32_t JobImport::group_of(const PgArgs& pg, const std::vector<std::int32_t>& members,
                                  bool dp) {
  auto key = std::make_pair(pg.name, members);
  auto it = group_index.find(key);
  if (it == group_index.end()) {
    // A group the rule finds data parallel is named so ("dp pg 0 (default_pg)"), for
    // re-targeting (strategies::RetargetOptions::dp_groups); with --dp-groups the user's pattern
    // finds it by its own name.
    const std::string label = (dp && options.dp_groups.empty() ? "dp " : "") + group_label(pg);
    input.groups.push_back({members, label});
    it = group_index.emplace(key, static_cast<std::uint32_t>(input.groups.size() - 1)).first;
  }
  return it->second;
}

// `op` as a measured kernel of `micros`.
void set_measured(TraceOp& op, double micros, const std::string& name) {
  op.work = st::Compute{};
  op.kernels.push_back({st::Measured{Time::ps(std::llround(micros * 1e6))}, name});
}

// Dependencies from stream order and timestamps (the file's header comment): `ops` (with
// `events`, their times and streams, index for index) sorted into issue order, each after the
// previous op of its stream and after the last op of every other stream that had finished (with
// all before it) when it started.
void reconstruct_dependencies(std::vector<TraceOp>& ops, const std::vector<Event>& events) {
  // Issue order: by start time (ties keep the file's order).
  std::vector<std::size_t> order(events.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return events[x].ts < events[y].ts; });
  std::vector<TraceOp> sorted;
  sorted.reserve(order.size());
  // Per stream: its ops so far (end time, id) and how many of them had all finished by the
  // current start; per (stream, other stream): the last dependency given, to skip repeats.
  std::array<std::vector<std::pair<double, std::uint64_t>>, st::kStreamCount> on;
  std::array<std::size_t, st::kStreamCount> done{};
  std::array<std::array<std::int64_t, st::kStreamCount>, st::kStreamCount> given_dep;
  for (auto& row : given_dep) row.fill(-1);
  for (std::size_t k : order) {
    TraceOp op = std::move(ops[k]);
    const Event& ev = events[k];
    const auto s = static_cast<std::size_t>(ev.stream);
    for (std::size_t o = 0; o < st::kStreamCount; ++o) {
      auto& list = on[o];
      while (done[o] < list.size() && list[done[o]].first <= ev.ts) ++done[o];
      if (o == s || done[o] == 0) continue;
      const auto dep = list[done[o] - 1].second;
      if (given_dep[s][o] == static_cast<std::int64_t>(dep)) continue;
      given_dep[s][o] = static_cast<std::int64_t>(dep);
      op.deps.push_back(dep);
    }
    if (!on[s].empty()) op.order_deps.push_back(on[s].back().second);
    on[s].emplace_back(ev.ts + ev.dur, op.id);
    sorted.push_back(std::move(op));
  }
  ops = std::move(sorted);
}

// One rank's import: its file's GPU events in the replayed window become rank.ops (NCCL kernels
// collectives, sends and receives where the job allows), the time between them host ops, all
// with reconstructed dependencies.
struct RankImport {
  RankImport(JobImport& job, const KinetoFile& file, const ParsedFile& parsed, TraceRank& rank);
  // Imports program rank `r`; rank 0 also describes the steps in `result`.
  void run(int r, ImportedTrace& result);

 private:
  void find_window();
  void read_event(std::size_t i);
  void read_comm(TraceOp& op, Event& ev, const std::string& name, const json* args,
                 const std::string& path);
  void read_measured_comm(TraceOp& op, Event& ev, const std::string& name, const json& a,
                          const std::optional<CommSpec>& spec, bool metadata);
  void read_simulated_comm(TraceOp& op, Event& ev, const json& a, const std::string& apath,
                           const std::string& collective_name, const std::optional<CommSpec>& spec);
  st::Collective read_collective(const json& a, const std::string& apath, const CommSpec& spec,
                                 DType dtype, Bytes bytes, bool& dp);
  [[noreturn]] void fail_without_gpu_work() const;
  void add_host_time();

  JobImport& job_;
  const KinetoFile& file_;
  const ParsedFile& parsed_;
  const json& events_;
  const Reader in_;
  TraceRank& rank_;
  Window window_;
  std::unordered_map<std::int64_t, double> launched_;  // by correlation id (steps only)
  std::vector<Event> gpu_;                             // rank_.ops' events, index for index
  std::vector<std::pair<double, double>> busy_;        // every GPU event of the rank: [start, end)
  std::set<std::int64_t> compute_streams_, devices_;
  double host_us_ = 0, window_us_ = 0;
};

RankImport::RankImport(JobImport& job, const KinetoFile& file, const ParsedFile& parsed,
                       TraceRank& rank)
    : job_(job),
      file_(file),
      parsed_(parsed),
      events_(*parsed.events),
      in_{file.name},
      rank_(rank),
      window_(window_of(parsed, file.name, job.step, job.options)) {
  rank_.source = file.name;
}

void RankImport::run(int r, ImportedTrace& result) {
  find_window();
  for (std::size_t i = 0; i < events_.size(); ++i) read_event(i);
  // Nothing to replay: no GPU activity recorded (a CPU-only profile, another accelerator's
  // events), or none in the step.
  if (gpu_.empty()) fail_without_gpu_work();
  if (compute_streams_.size() > 1) job_.counts.ranks_with_several_compute_streams.insert(r);
  if (devices_.size() > 1) job_.counts.ranks_with_several_devices.insert(r);
  add_host_time();
  if (r == 0) {
    describe_steps(parsed_, job_.step, job_.options, result);
    if (window_us_ > 0) {
      result.setup.emplace_back(
          "host-bound time",
          micros_text(host_us_) + " of " + micros_text(window_us_) +
              " with no kernel, copy or set running (rank " + std::to_string(parsed_.rank) +
              "): dataloader, CPU operators, synchronisation, launches; kept as measured");
    }
  }
  reconstruct_dependencies(rank_.ops, gpu_);
}

// The replayed steps' time [from, until) (Window), where a step is replayed.
void RankImport::find_window() {
  if (window_.whole) return;
  launched_ = launch_times(events_, in_);
  // Per step: the end of its last GPU event (read leniently here: read_event reads every GPU
  // event strictly).
  const auto& steps = parsed_.steps;
  std::vector<double> last(steps.size(), -std::numeric_limits<double>::infinity());
  for (const json& e : events_) {
    if (!e.is_object() || !is_gpu_category(category_of(in_, e))) continue;
    const json* ts = in_.field(e, "ts");
    const json* dur = in_.field(e, "dur");
    if (!ts || !ts->is_number() || !dur || !dur->is_number()) continue;
    const double at = launch_time(in_, in_.field(e, "args"), ts->get<double>(), launched_);
    for (std::size_t k = 0; k < steps.size(); ++k) {
      if (at >= steps[k].ts && at <= steps[k].ts + steps[k].dur) {
        last[k] = std::max(last[k], ts->get<double>() + dur->get<double>());
        break;
      }
    }
  }
  auto step_end = [&](std::size_t k) { return std::max(steps[k].ts + steps[k].dur, last[k]); };
  window_.from = steps[window_.first].ts;
  if (window_.first > 0) window_.from = std::max(window_.from, step_end(window_.first - 1));
  window_.until = window_.from;
  for (std::size_t k = window_.first; k <= window_.last; ++k) {
    window_.until = std::max(window_.until, step_end(k));
  }
}

// traceEvents[i]: counted if a CPU event; an op if a GPU event in the window.
void RankImport::read_event(std::size_t i) {
  const json& e = events_[i];
  const std::string path = parsed_.base + "[" + std::to_string(i) + "]";
  const json* ph = in_.field(e, "ph");
  if (!ph || !ph->is_string() || ph->get_ref<const std::string&>() != "X") return;
  const std::string category = category_of(in_, e);
  const bool kernel = category == "kernel";
  const bool memory = is_gpu_category(category) && !kernel;
  if (!kernel && !memory) {
    ++job_.counts.cpu_events;
    return;
  }
  Event ev;
  ev.index = i;
  ev.ts = in_.number(e, "ts", path, -kMaxTimestamp, kMaxTimestamp);
  ev.dur = in_.number(e, "dur", path, 0, kMaxMicros);
  const std::string& name = in_.string(e, "name", path);
  const json* args = in_.field(e, "args");
  if (args && !args->is_object()) in_.fail(path + ".args", "an object");
  busy_.emplace_back(ev.ts, ev.ts + ev.dur);
  if (!window_.whole) {
    // The step it belongs to: where it was launched, else where it started.
    const double at = launch_time(in_, args, ev.ts, launched_);
    if (ev.ts < window_.from || ev.ts >= window_.until) {
      const bool in_a_step =
          std::any_of(parsed_.steps.begin(), parsed_.steps.end(),
                      [&](const Step& s) { return at >= s.ts && at <= s.ts + s.dur; });
      if (!in_a_step) ++job_.counts.outside;
      return;
    }
  }
  std::int64_t cuda_stream = 0;
  if (args && args->contains("stream")) {
    cuda_stream = in_.integer((*args)["stream"], path + ".args.stream", 0,
                              std::numeric_limits<std::int64_t>::max());
  } else if (const json* tid = in_.field(e, "tid"); tid && tid->is_number_integer()) {
    cuda_stream = tid->get<std::int64_t>();
  }
  if (const json* device = args ? in_.field(*args, "device") : nullptr;
      device && device->is_number_integer()) {
    devices_.insert(device->get<std::int64_t>());
  }
  TraceOp op;
  op.id = i;
  op.label = name;
  const bool nccl = name.rfind("ncclKernel", 0) == 0 || name.rfind("ncclDevKernel", 0) == 0 ||
                    (args && args->contains("Collective name"));
  if (memory) {
    ev.stream = st::Stream::copy;
    set_measured(op, ev.dur, name);
  } else if (!nccl) {
    ev.stream = st::Stream::compute;
    compute_streams_.insert(cuda_stream);
    set_measured(op, ev.dur, name);
  } else {
    read_comm(op, ev, name, args, path);
  }
  op.stream = ev.stream;
  rank_.ops.push_back(std::move(op));
  gpu_.push_back(ev);
}

// An NCCL kernel: simulated communication where its peers are present and its size known, else
// measured.
void RankImport::read_comm(TraceOp& op, Event& ev, const std::string& name, const json* args,
                           const std::string& path) {
  ++job_.counts.comm_kernels;
  const std::string apath = path + ".args";
  static const json kEmpty = json::object();
  const json& a = args ? *args : kEmpty;
  std::string collective_name = name;
  if (const json* c = in_.field(a, "Collective name")) {
    if (!c->is_string()) in_.fail(apath + ".Collective name", "a string");
    collective_name = c->get<std::string>();
  }
  const auto spec = comm_of(collective_name);
  // record_param_comms' metadata (PyTorch 2.1 and later); older traces name only the kernel.
  const bool metadata =
      a.contains("Collective name") || a.contains("In msg nelems") || a.contains("dtype");
  if (job_.partial || !metadata) {
    read_measured_comm(op, ev, name, a, spec, metadata);
  } else {
    read_simulated_comm(op, ev, a, apath, collective_name, spec);
  }
}

// Replayed as measured: the peers are absent, or the size is unknown.
void RankImport::read_measured_comm(TraceOp& op, Event& ev, const std::string& name, const json& a,
                                    const std::optional<CommSpec>& spec, bool metadata) {
  ++job_.counts.measured_comm;
  if (!metadata) ++job_.counts.without_metadata;
  set_measured(op, ev.dur, name);
  if (spec && spec->kind == CommKind::send) {
    ev.stream = st::Stream::pp_send;
  } else if (spec && spec->kind == CommKind::recv) {
    ev.stream = st::Stream::pp_recv;
  } else if (!metadata) {
    ev.stream = st::Stream::dp_comm;
  } else {
    std::size_t members = 0;
    if (const json* g = in_.field(a, "Group size"); g && g->is_number_unsigned()) {
      members = g->get<std::size_t>();
    }
    ev.stream = data_parallel(pg_args_of(in_, a), members, job_.world, job_.options)
                    ? st::Stream::dp_comm
                    : st::Stream::tp_comm;
  }
}

// A collective, send or receive from record_param_comms' metadata `a` (at `apath`).
void RankImport::read_simulated_comm(TraceOp& op, Event& ev, const json& a,
                                     const std::string& apath, const std::string& collective_name,
                                     const std::optional<CommSpec>& spec) {
  if (!spec) {
    throw TraceError(file_.name, apath + ".Collective name",
                     "collective \"" + collective_name +
                         "\" is not supported (stratasim simulates all-reduce, "
                         "reduce-scatter, all-gather, broadcast, reduce, all-to-all, "
                         "barrier, send and recv)");
  }
  const std::string& dtype_name = in_.string(a, "dtype", apath);
  const auto element = element_of(dtype_name);
  if (!element) {
    in_.fail(apath + ".dtype",
             "a PyTorch dtype name (Float, Half, BFloat16, Double, Float8_e4m3fn, Int, "
             "Long, ...), found \"" +
                 dtype_name + "\"");
  }
  const auto in_elems = in_.integer(a, "In msg nelems", apath, 0, kMaxElements);
  const auto out_elems = in_.integer(a, "Out msg nelems", apath, 0, kMaxElements);
  // Program::Collective counts the whole buffer: the input of an all-reduce or reduce-scatter,
  // the output of an all-gather; the larger of the two in every case.
  const Bytes bytes(std::max(in_elems, out_elems) * element->first);
  if (spec->kind == CommKind::collective) {
    bool dp = false;
    op.work = read_collective(a, apath, *spec, element->second, bytes, dp);
    ev.stream = dp ? st::Stream::dp_comm : st::Stream::tp_comm;
    return;
  }
  const bool send = spec->kind == CommKind::send;
  const char* key = send ? "Dst Rank" : "Src Rank";
  const auto peer = static_cast<std::int32_t>(in_.integer(a, key, apath, 0, job_.world - 1));
  if (send) {
    op.work = st::Send{peer, bytes};
    ev.stream = st::Stream::pp_send;
  } else {
    op.work = st::Recv{peer, bytes};
    ev.stream = st::Stream::pp_recv;
  }
}

// A collective of `bytes` over its process group (found or added in the job's groups); `dp`:
// whether the group is data parallel.
st::Collective RankImport::read_collective(const json& a, const std::string& apath,
                                           const CommSpec& spec, DType dtype, Bytes bytes,
                                           bool& dp) {
  const int world = job_.world;
  const PgArgs pg = pg_args_of(in_, a);
  std::optional<std::int64_t> group_size;
  if (a.contains("Group size")) {
    group_size = in_.integer(a["Group size"], apath + ".Group size", 1, world);
  }
  std::optional<std::vector<std::int32_t>> members;
  if (const json* g = in_.field(a, "Process Group Ranks")) {
    members = parse_ranks(*g, in_, apath + ".Process Group Ranks", world);
  }
  if (!members) {
    // Absent or truncated: a group of the whole world is the one case we can rebuild.
    if (group_size && *group_size == world) {
      members.emplace();
      for (int k = 0; k < world; ++k) members->push_back(k);
    } else {
      in_.fail(apath + ".Process Group Ranks",
               "the group's ranks (\"[0, 1, ...]\"), or a Group size equal to the world size " +
                   std::to_string(world));
    }
  }
  if (group_size && static_cast<std::size_t>(*group_size) != members->size()) {
    in_.fail(apath + ".Group size",
             std::to_string(members->size()) + " (the number of Process Group Ranks)");
  }
  dp = data_parallel(pg, members->size(), world, job_.options);
  st::Collective c;
  c.kind = spec.collective;
  c.dtype = dtype;
  c.group = job_.group_of(pg, *members, dp);
  c.bytes = bytes;
  return c;
}

void RankImport::fail_without_gpu_work() const {
  if (!busy_.empty() && !window_.whole && !job_.options.all_steps) {
    throw TraceError(file_.name, "traceEvents",
                     "ProfilerStep#" + std::to_string(*job_.step) +
                         " has no GPU kernels, memcpys or memsets to replay; choose another "
                         "with --step N");
  }
  throw TraceError(file_.name, "traceEvents",
                   "no GPU kernels, memcpys or memsets (events of category kernel, "
                   "gpu_memcpy or gpu_memset) to replay: record the trace with "
                   "torch.profiler.ProfilerActivity.CUDA; other accelerators' events (MTIA, "
                   "TPU) are not read");
}

// Host time: the stretches of the window in which no GPU event of the rank (of any step) runs,
// as measured ops on the host stream.
void RankImport::add_host_time() {
  double begin = window_.from, end = window_.until;
  if (window_.whole) {
    begin = gpu_.front().ts;
    end = begin;
  }
  for (const Event& ev : gpu_) {
    if (window_.whole) begin = std::min(begin, ev.ts);
    end = std::max(end, ev.ts + ev.dur);
  }
  window_us_ = end - begin;
  std::sort(busy_.begin(), busy_.end());
  double cursor = begin;
  std::uint64_t next_id = events_.size();
  auto host = [&](double from, double to) {
    if (to - from <= kMinHostMicros) return;
    TraceOp op;
    op.id = next_id;
    op.label = "host time (no GPU work)";
    op.stream = st::Stream::host;
    set_measured(op, to - from, op.label);
    rank_.ops.push_back(std::move(op));
    gpu_.push_back(Event{next_id, from, to - from, st::Stream::host});
    ++next_id;
    host_us_ += to - from;
  };
  for (const auto& [from, to] : busy_) {
    if (to <= cursor) continue;
    if (from >= end) break;
    if (from > cursor) host(cursor, from);
    cursor = std::max(cursor, to);
  }
  if (end > cursor) host(cursor, end);
}

// The note on ranks replayed alone, their communication as measured (RankOrder::partial).
void note_partial(const std::vector<KinetoFile>& files, const ParsedFiles& parsed,
                  const RankOrder& order, std::int64_t measured_comm, ImportedTrace& result) {
  const int given = static_cast<int>(files.size());
  const int world = order.world;
  std::string ranks;
  for (std::size_t k = 0; k < order.file_of_rank.size(); ++k) {
    if (k == 8) {
      ranks += ", ...";
      break;
    }
    ranks += (k ? ", " : "") + std::to_string(parsed.files[order.file_of_rank[k]].rank);
  }
  const std::string of =
      parsed.declared ? std::to_string(world) : "at least " + std::to_string(world);
  result.setup.emplace_back("ranks", (given == 1 ? "rank " : "ranks ") + ranks + " of " + of +
                                         " replayed alone, communication as measured");
  result.notes.push_back(
      "the trace is " + std::string(given == 1 ? "rank " : "ranks ") + ranks + " of a job of " +
      of + " ranks (" +
      (parsed.declared ? "distributedInfo.world_size" : "no world size; the rank numbers say so") +
      "): the other ranks are absent, so " +
      (measured_comm > 0
           ? "its " + std::to_string(measured_comm) + " NCCL kernels keep their measured durations"
           : std::string("its NCCL kernels would keep their measured durations "
                         "(it has none)")) +
      ". Communication is taken as measured, not "
      "simulated: a --cluster or network --set does not change it, it includes any time spent "
      "waiting for slower peers, and there is no contention or what-if on the network for "
      "it; the program ranks are 0 to " +
      std::to_string(given - 1) + " in that order");
}

// The notes on what the import counted (after the note on partial jobs, if any).
void note_counts(const ImportCounts& counts, bool partial, ImportedTrace& result) {
  if (!partial && counts.without_metadata > 0) {
    result.notes.push_back(
        std::to_string(counts.without_metadata) +
        " NCCL kernels carry no record_param_comms metadata (Collective name, In msg nelems, "
        "dtype: PyTorch before 2.1): their size is unknown, so they keep their measured "
        "durations, on the data-parallel stream");
  }
  if (counts.cpu_events > 0) {
    result.notes.push_back(std::to_string(counts.cpu_events) +
                           " CPU-side events (operators, runtime calls, annotations) are read "
                           "only for the steps, the launches and the host time between GPU work; "
                           "they are not replayed one by one");
  }
  if (counts.outside > 0) {
    result.notes.push_back(std::to_string(counts.outside) +
                           " GPU events launched outside every ProfilerStep span left out");
  }
  if (counts.comm_kernels > counts.measured_comm) {
    result.notes.push_back(std::to_string(counts.comm_kernels - counts.measured_comm) +
                           " NCCL kernels became collectives or sends/receives; their recorded "
                           "durations are replaced by simulated communication");
  }
  if (!counts.ranks_with_several_compute_streams.empty()) {
    result.notes.push_back(
        std::to_string(counts.ranks_with_several_compute_streams.size()) +
        " ranks used several CUDA streams for compute kernels: they run on one compute stream, "
        "in start order");
  }
  if (!counts.ranks_with_several_devices.empty()) {
    result.notes.push_back(
        std::to_string(counts.ranks_with_several_devices.size()) +
        " files hold kernels of several GPUs (args.device): each file is replayed as one rank, "
        "its GPUs' kernels on one compute stream");
  }
  result.notes.push_back(
      "dependencies reconstructed from stream order and timestamps (Kineto traces have no "
      "dependency edges)");
}

}  // namespace

ImportedTrace import_kineto_texts(const std::vector<KinetoFile>& files,
                                  const KinetoOptions& options) {
  check_request(files, options);
  const ParsedFiles parsed = parse_files(files);
  const RankOrder order = order_ranks(files, parsed);
  const std::size_t lowest = order.file_of_rank[0];
  JobImport job(options, chosen_step(parsed.files[lowest], Reader{files[lowest].name}, options),
                order);
  job.input.ranks.resize(files.size());
  ImportedTrace result;
  for (std::size_t r = 0; r < files.size(); ++r) {
    const std::size_t f = order.file_of_rank[r];
    RankImport(job, files[f], parsed.files[f], job.input.ranks[r]).run(static_cast<int>(r), result);
  }
  result.program = build_program(job.input);
  if (order.partial) {
    result.measured_communication = true;
    note_partial(files, parsed, order, job.counts.measured_comm, result);
  }
  note_counts(job.counts, order.partial, result);
  return result;
}

ImportedTrace import_kineto(const fs::path& path, const KinetoOptions& options) {
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
      bool gzipped = false;
      for (const auto& entry : fs::directory_iterator(path, ec)) {
        gzipped = gzipped || entry.path().string().ends_with(".json.gz");
      }
      throw TraceError(path.string(), "",
                       gzipped ? "the folder holds only compressed (.json.gz) traces, which are "
                                 "not read: gunzip them first"
                               : "the folder holds no .json Kineto trace files");
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
  return import_kineto_texts(files, options);
}

}  // namespace stratasim::traces
