// Import of stratasim's own timeline.json: a hand-made trace with a hand-calculated replay,
// exact replays of simulated experiments, data-parallel re-targeting against direct
// simulation, malformed traces, and the streamed reading (the same Program and the same errors
// as reading the whole document, nesting bounded as configs are).
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "experiment_helpers.hpp"
#include "hw_models/config_reader.hpp"
#include "hw_models/json_depth.hpp"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/retarget.hpp"
#include "study/partition.hpp"
#include "study/study.hpp"
#include "traces/context.hpp"
#include "traces/export.hpp"
#include "traces/helpers.hpp"
#include "traces/report.hpp"
#include "traces/same_program.hpp"
#include "traces/timeline_import.hpp"

namespace {

using namespace stratasim;
namespace st = strategies;
using testing::approx;

// Rank 0: op 0 compute (kernel list 0: 10 us measured) on the compute stream, then op 1 sends
// 3 MB to rank 1 on pp-send after it (deps [0]). Rank 1: op 2 receives them, op 3 computes for
// the recorded 5 us (no kernel list: the span is the work) after the receive, allocating 1000 B
// of activations at its end.
// Replay on 2 devices of one node (intra-node link 300 GB/s, 2 us latency, protocol efficiency
// 1): 10 us compute, then the transfer 2 us + 3e6 B / 300e9 B/s = 2 + 10 = 12 us, then 5 us of
// compute: the iteration ends at 10 + 12 + 5 = 27 us.
const char* kTwoRanks = R"json({"displayTimeUnit":"ns","traceEvents":[
{"name":"fwd","cat":"forward","ph":"X","pid":0,"tid":0,"ts":0.0,"dur":10.0,"args":{"op":0,"microbatch":0,"layers":"0-3","kernels":0}},
{"name":"send","cat":"forward","ph":"X","pid":0,"tid":3,"ts":10.0,"dur":12.0,"args":{"op":1,"kind":"send","bytes":3000000,"peer":1,"deps":[0]}},
{"name":"recv act","cat":"forward","ph":"X","pid":1,"tid":4,"ts":10.0,"dur":12.0,"args":{"op":2,"kind":"recv","bytes":3000000,"peer":0}},
{"name":"fwd","cat":"forward","ph":"X","pid":1,"tid":0,"ts":22.0,"dur":5.0,"args":{"op":3,"deps":[2],"mem":[[1000,"activations","device",1]]}},
{"name":"memory (device)","ph":"C","pid":1,"ts":27.0,"args":{"bytes":1000}}
],
"stratasim":{"format":1,"world_size":2,"completed":true,"op_counts":[2,2],"groups":[],
"kernel_lists":[[{"name":"fwd","measured_ps":10000000}]],
"initial_memory":[[[500,"parameters","device"]],[]],"cluster":"test-2"}})json";

hw::ClusterSpec two_devices() {
  return testing::test_cluster(1, 2);
}

double replay_time(const st::Program& program, const hw::ClusterSpec& cluster) {
  const auto timeline = sim::simulate(program, cluster);
  REQUIRE(timeline.completed);
  return traces::make_report(program, timeline, traces::ReportContext{}).iteration_time_s;
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

std::string error_of(const std::string& text) {
  try {
    traces::import_timeline_text(text, "t.json");
  } catch (const traces::TraceError& e) {
    CHECK(e.file() == "t.json");
    return e.what();
  }
  FAIL("no TraceError");
  return {};
}

// An experiment of the catalog, simulated (mirrored, as the CLI does on the analytical
// network), exported with its context, imported and replayed on the same cluster.
struct RoundTrip {
  double original = 0, replayed = 0;
  std::size_t ops = 0, imported_ops = 0;
};

RoundTrip round_trip(const std::string& name, std::vector<st::Override> overrides, bool mirror) {
  const auto e =
      st::load_experiment(testing::configs_dir() / "experiments" / (name + ".json"), overrides);
  const auto program = study::lower(e, {.mirror_data_parallel = mirror});
  const auto timeline = sim::simulate(program, e.cluster);
  REQUIRE(timeline.completed);
  const auto context = traces::report_context(e);
  RoundTrip r;
  r.original = traces::make_report(program, timeline, context).iteration_time_s;
  std::ostringstream text;
  traces::ExportOptions options;
  options.context = &context;
  traces::write_chrome_trace(text, program, timeline, options);
  const auto imported = traces::import_timeline_text(text.str(), name + "/timeline.json");
  CHECK(imported.trace.cluster == e.cluster.name);
  REQUIRE(imported.context.has_value());
  CHECK(imported.context->tokens_per_iteration == context.tokens_per_iteration);
  const auto replay = sim::simulate(imported.trace.program, e.cluster);
  REQUIRE(replay.completed);
  r.replayed =
      traces::make_report(imported.trace.program, replay, *imported.context).iteration_time_s;
  r.ops = program.op_count();
  r.imported_ops = imported.trace.program.op_count();
  CHECK(imported.trace.program.mirrored() == program.mirrored());
  return r;
}

st::Override set(const std::string& path, nlohmann::json value) {
  return {path, std::move(value), "test"};
}

}  // namespace

TEST_CASE("timeline import: a hand-made 2-rank trace replays in the hand-calculated time") {
  const auto t = traces::import_timeline_text(kTwoRanks, "two.json");
  const auto& p = t.trace.program;
  REQUIRE(p.world_size() == 2);
  REQUIRE(p.op_count() == 4);
  CHECK(t.trace.cluster == "test-2");
  CHECK_FALSE(t.context.has_value());
  REQUIRE(t.trace.notes.size() == 1);  // op 3 had no kernel list
  CHECK(t.trace.notes[0].find("1 compute ops") != std::string::npos);
  const auto& fwd = p.op(0);
  CHECK(fwd.phase == st::Phase::forward);
  CHECK(fwd.microbatch == 0);
  CHECK(fwd.layer_begin == 0);
  CHECK(fwd.layer_end == 4);  // "0-3" is inclusive
  CHECK(p.label_of(fwd) == "fwd");
  const auto* send = std::get_if<st::Send>(&p.op(1).work);
  REQUIRE(send != nullptr);
  CHECK(send->peer == 1);
  CHECK(send->bytes == Bytes(3000000));
  CHECK(p.label_of(p.op(1)).empty());  // "send" is the exporter's name for an unlabelled send
  REQUIRE(p.deps_of(p.op(1)).size() == 1);
  CHECK(p.deps_of(p.op(1))[0] == 0);
  CHECK(std::holds_alternative<st::Recv>(p.op(2).work));
  CHECK(p.label_of(p.op(2)) == "recv act");
  const auto* last = std::get_if<st::Compute>(&p.op(3).work);
  REQUIRE(last != nullptr);
  const auto& kernels = p.kernels_of(*last);
  REQUIRE(kernels.size() == 1);
  REQUIRE(std::holds_alternative<st::Measured>(kernels[0].work));
  CHECK(std::get<st::Measured>(kernels[0].work).duration == Time::us(5));
  REQUIRE(p.effects_of(p.op(3)).size() == 1);
  CHECK(p.effects_of(p.op(3))[0].delta == Bytes(1000));
  REQUIRE(p.initial_memory(0).size() == 1);
  CHECK(p.initial_memory(0)[0].bytes == Bytes(500));

  CHECK(replay_time(p, two_devices()) == approx(27e-6));
}

TEST_CASE("timeline import: a timeline without the stratasim object replays from time order") {
  // The same events without "stratasim": op 3 (rank 1, compute) starts at 22 us, after the
  // receive ended (22 us), so it waits for it; the first compute becomes 10 us of Measured work.
  std::string text = kTwoRanks;
  text = text.substr(0, text.find(",\n\"stratasim\"")) + "}";
  const auto t = traces::import_timeline_text(text, "old.json");
  REQUIRE(t.trace.program.op_count() == 4);
  REQUIRE(t.trace.notes.size() == 1);
  CHECK(t.trace.notes[0].find("no \"stratasim\" object") != std::string::npos);
  CHECK(replay_time(t.trace.program, two_devices()) == approx(27e-6));
}

TEST_CASE("timeline import: replaying an exported simulation reproduces its iteration time") {
  // The issue's bar is 0.1%; the import restores the Program exactly, so the times are equal.
  const std::vector<st::Override> small = {set("parallelism.tp", 2), set("parallelism.pp", 2),
                                           set("parallelism.dp", nullptr),
                                           set("training.global_batch", 16)};
  SUBCASE("gpt3-1.7b tp 2 pp 2 dp 2, mirrored") {
    const auto r = round_trip("gpt3-1.7b-a100-8", small, true);
    CHECK(r.imported_ops == r.ops);
    CHECK(r.replayed == approx(r.original));
  }
  SUBCASE("... every replica simulated") {
    const auto r = round_trip("gpt3-1.7b-a100-8", small, false);
    CHECK(r.replayed == approx(r.original));
  }
  SUBCASE("... ZeRO 1") {
    auto o = small;
    o.push_back(set("parallelism.zero", 1));
    const auto r = round_trip("gpt3-1.7b-a100-8", o, true);
    CHECK(r.replayed == approx(r.original));
  }
  SUBCASE("... full recomputation") {
    auto o = small;
    o.push_back(set("parallelism.recompute", "full"));
    const auto r = round_trip("gpt3-1.7b-a100-8", o, true);
    CHECK(r.replayed == approx(r.original));
  }
  SUBCASE("... FlashAttention in Triton, FSDP's efficiency") {
    // The kernel lists carry the attention kernel (not the default FlashAttention-2) and the
    // context the framework's factors: costed otherwise, the replay would differ.
    auto o = small;
    o.push_back(set("training.flash_attention", true));
    o.push_back(set("training.attention_kernel", "flash-attention-triton"));
    o.push_back(set("training.framework", "fsdp"));
    const auto r = round_trip("gpt3-1.7b-a100-8", o, true);
    CHECK(r.replayed == approx(r.original));
    auto plain = small;
    plain.push_back(set("training.flash_attention", true));
    CHECK(round_trip("gpt3-1.7b-a100-8", plain, true).original != approx(r.original));
  }
  SUBCASE("... sliding windows and attention chunks") {
    // The kernel lists carry the window and the chunk (an eleventh and a twelfth value).
    auto plain = small;
    plain.push_back(set("training.flash_attention", true));
    const double full = round_trip("gpt3-1.7b-a100-8", plain, true).original;
    for (const char* key : {"model.sliding_window", "model.attention_chunk"}) {
      CAPTURE(key);
      auto o = plain;
      o.push_back(set(key, 512));
      o.push_back(set("model.global_attention_every", 4));
      const auto r = round_trip("gpt3-1.7b-a100-8", o, true);
      CHECK(r.replayed == approx(r.original));
      CHECK(r.original < full);
    }
  }
  SUBCASE("parameter servers (event-driven ranks), whole layers and slices") {
    // The servers' ranks are event-driven (st::Program::event_driven): the import must say so,
    // or their receives would wait in stream order and the replay would differ.
    for (const std::int64_t slice : {0, 1'000'000}) {
      CAPTURE(slice);
      const auto r = round_trip(
          "resnet50-ps-v100-10",
          {set("parallelism.slice_parameters", slice), set("transport.priority", "none")}, false);
      CHECK(r.imported_ops == r.ops);
      CHECK(r.replayed == approx(r.original));
    }
  }
  SUBCASE("gpt-tiny-3d-8") {
    const auto r = round_trip("gpt-tiny-3d-8", {}, true);
    CHECK(r.replayed == approx(r.original));
  }
  SUBCASE("within 0.1% (the issue's bar)") {
    const auto r = round_trip("gpt3-1.7b-a100-8", small, true);
    CHECK(std::abs(r.replayed / r.original - 1) < 1e-3);
  }
}

TEST_CASE("timeline import: re-targeted replay at 2x and 4x dp equals a direct simulation") {
  // gpt3-1.7b, tp 2 pp 2 dp 2 on 8 A100s, global batch 16, replayed at 16 and 32 ranks
  // against direct simulations with dp 4 / dp 8 and global batch 32 / 64 (same microbatches
  // per pipeline) on 2 / 4 DGX A100 nodes. The issue's bar is 2%.
  const auto base_e =
      st::load_experiment(testing::configs_dir() / "experiments/gpt3-1.7b-a100-8.json",
                          {set("parallelism.tp", 2), set("parallelism.pp", 2),
                           set("parallelism.dp", nullptr), set("training.global_batch", 16)});
  const auto base = study::lower(base_e, {.mirror_data_parallel = true});
  const auto base_timeline = sim::simulate(base, base_e.cluster);
  const auto context = traces::report_context(base_e);
  std::ostringstream text;
  traces::ExportOptions options;
  options.context = &context;
  traces::write_chrome_trace(text, base, base_timeline, options);
  const auto imported = traces::import_timeline_text(text.str(), "base/timeline.json");
  for (int k : {2, 4}) {
    CAPTURE(k);
    const auto direct_e = st::load_experiment(
        testing::configs_dir() / "experiments/gpt3-1.7b-a100-8.json",
        {set("cluster.nodes", k), set("parallelism.tp", 2), set("parallelism.pp", 2),
         set("parallelism.dp", 2 * k), set("training.global_batch", 16 * k)});
    const auto direct = study::lower(direct_e, {.mirror_data_parallel = true});
    const double direct_time = replay_time(direct, direct_e.cluster);
    for (bool mirror : {true, false}) {
      CAPTURE(mirror);
      const auto wide =
          st::retarget_data_parallel(imported.trace.program, 8 * k, {.mirror = mirror});
      CHECK(wide.world_size() == 8 * k);
      const double replayed = replay_time(wide, direct_e.cluster);
      CHECK(std::abs(replayed / direct_time - 1) < 0.02);
      CHECK(replayed == approx(direct_time));  // and in fact equal: same ops, same groups
    }
  }
}

TEST_CASE("timeline import: malformed traces give errors naming the file and the place") {
  SUBCASE("truncated JSON") {
    const std::string text = std::string(kTwoRanks).substr(0, 300);
    const auto message = error_of(text);
    CHECK(message.find("t.json: byte ") == 0);
    CHECK(message.find("not valid JSON") != std::string::npos);
  }
  SUBCASE("cyclic dependencies name the ops") {
    // Op 0 waits for op 1, which waits for op 0.
    auto text =
        replace(kTwoRanks, R"("op":0,"microbatch":0,)", R"("op":0,"deps":[1],"microbatch":0,)");
    const auto message = error_of(text);
    CHECK(message.find("form a cycle through rank 0 op") != std::string::npos);
  }
  SUBCASE("an unmatched collective") {
    // Rank 0 all-reduces on a group of both ranks; rank 1 never does.
    auto text = replace(kTwoRanks, R"("groups":[])", R"("groups":[{"name":"dp 0","ranks":[0,1]}])");
    text = replace(text, R"("kind":"send","bytes":3000000,"peer":1)",
                   R"("kind":"all-reduce","bytes":3000000,"group_index":0)");
    text = replace(text, R"("op":2,"kind":"recv","bytes":3000000,"peer":0)",
                   R"("op":2,"kind":"all-gather","bytes":3000000,"group_index":0)");
    const auto message = error_of(text);
    CHECK(message.find("collectives on group 'dp 0' disagree") != std::string::npos);
  }
  SUBCASE("a send without its receive") {
    auto text = replace(kTwoRanks, R"("op":2,"kind":"recv","bytes":3000000,"peer":0)",
                        R"("op":2,"kind":"send","bytes":3000000,"peer":0)");
    CHECK(error_of(text).find("no matching receive") != std::string::npos);
  }
  SUBCASE("a trace of some ranks only") {
    // What --trace-ranks 0 writes: rank 1's events are missing.
    auto text = replace(kTwoRanks, R"({"name":"recv act","cat":"forward","ph":"X","pid":1,)",
                        R"({"name":"recv act","cat":"forward","ph":"M","pid":1,)");
    text = replace(text, R"({"name":"fwd","cat":"forward","ph":"X","pid":1,)",
                   R"({"name":"fwd","cat":"forward","ph":"M","pid":1,)");
    const auto message = error_of(text);
    CHECK(message.find("does not cover rank 1") != std::string::npos);
    CHECK(message.find("--trace-ranks all") != std::string::npos);
  }
  SUBCASE("a dependency on another rank's op") {
    auto text = replace(kTwoRanks, R"("deps":[2])", R"("deps":[1])");
    const auto message = error_of(text);
    CHECK(message.find("traceEvents[3].args.deps[0]") != std::string::npos);
    CHECK(message.find("an op of rank 0") != std::string::npos);
  }
  SUBCASE("a wrong type names the JSON path") {
    auto text = replace(kTwoRanks, R"("bytes":3000000,"peer":1)", R"("bytes":"3 MB","peer":1)");
    const auto message = error_of(text);
    CHECK(message.find("traceEvents[1].args.bytes: expected an integer") != std::string::npos);
  }
  SUBCASE("an op twice") {
    auto text = replace(kTwoRanks, R"("op":3,)", R"("op":2,)");
    CHECK(error_of(text).find("appears twice") != std::string::npos);
  }
  SUBCASE("a kernel's trailing value that names nothing") {
    auto text =
        replace(kTwoRanks, R"([[{"name":"fwd","measured_ps":10000000}]])",
                R"([[{"name":"qk","attention":[1,8,8,512,512,64,true,"bf16",false,"flash-4"]}]])");
    auto message = error_of(text);
    CHECK(message.find("attention[9]") != std::string::npos);
    CHECK(message.find("flash-attention-triton") != std::string::npos);
    text = replace(kTwoRanks, R"([[{"name":"fwd","measured_ps":10000000}]])",
                   R"([[{"name":"mm","gemm":[64,7168,2048,1,"fp8","rows"]}]])");
    message = error_of(text);
    CHECK(message.find("gemm[5]") != std::string::npos);
    CHECK(message.find("tensor, block or mx") != std::string::npos);
  }
  SUBCASE("an unknown format version") {
    auto text = replace(kTwoRanks, R"("format":1)", R"("format":7)");
    CHECK(error_of(text).find("stratasim.format") != std::string::npos);
  }
  SUBCASE("a missing file") {
    CHECK_THROWS_AS(traces::import_timeline("/nonexistent/timeline.json"), traces::TraceError);
  }
}

// ---- Streaming (issue 19): the text is read as a stream, never as one JSON document.

namespace {

// The lowered Program of a catalog experiment, simulated and exported as a timeline of every
// rank with its context.
struct Exported {
  st::Program program;
  std::string text;
};

Exported exported(const std::string& name, bool mirror) {
  const auto e = st::load_experiment(testing::configs_dir() / "experiments" / (name + ".json"));
  Exported out{study::lower(e, {.mirror_data_parallel = mirror}), {}};
  const auto timeline = sim::simulate(out.program, e.cluster);
  REQUIRE(timeline.completed);
  const auto context = traces::report_context(e);
  std::ostringstream text;
  traces::ExportOptions options;
  options.context = &context;
  traces::write_chrome_trace(text, out.program, timeline, options);
  out.text = text.str();
  return out;
}

// The byte at which nlohmann::json::parse of the whole text fails (0: it parses).
std::size_t dom_error_byte(const std::string& text) {
  try {
    const auto parsed = nlohmann::json::parse(text);
    (void)parsed;
  } catch (const nlohmann::json::parse_error& e) {
    return e.byte;
  }
  return 0;
}

// Arrays nested `depth` deep as an extra argument of the first event ("x").
std::string nested_in_event(int depth) {
  return replace(kTwoRanks, R"("args":{"op":0,)",
                 R"("args":{"x":)" + std::string(static_cast<std::size_t>(depth), '[') +
                     std::string(static_cast<std::size_t>(depth), ']') + R"(,"op":0,)");
}

}  // namespace

TEST_CASE("timeline import: the streamed import restores the exported Program exactly") {
  // Compared op by op with the Program that was exported (kernels, work, dependencies, memory
  // effects, provenance), from memory and from a file (read twice, from its start each time).
  using testing::check_same_program;
  testing::TempDir dir("timeline-stream");
  for (bool mirror : {false, true}) {
    CAPTURE(mirror);
    const auto e = exported("gpt-tiny-3d-8", mirror);
    const auto from_text = traces::import_timeline_text(e.text, "t.json");
    check_same_program(e.program, from_text.trace.program);
    CHECK(from_text.trace.program.mirrored() == mirror);
    const auto file = dir.path() / (mirror ? "mirrored.json" : "every.json");
    std::ofstream(file, std::ios::binary) << e.text;
    const auto from_file = traces::import_timeline(file);
    check_same_program(e.program, from_file.trace.program);
    CHECK(from_file.trace.notes == from_text.trace.notes);
  }
}

TEST_CASE("timeline import: errors while streaming name the place a whole-document read named") {
  SUBCASE("JSON cut short anywhere: the byte nlohmann::json::parse names") {
    const std::string text = kTwoRanks;
    for (std::size_t cut = 1; cut < text.size(); cut += 23) {
      CAPTURE(cut);
      const std::string part = text.substr(0, cut);
      const std::size_t byte = dom_error_byte(part);
      REQUIRE(byte > 0);
      CHECK(error_of(part).find("t.json: byte " + std::to_string(byte) + ": not valid JSON") == 0);
    }
  }
  SUBCASE("a syntax error after every event comes before an event's own error") {
    // Event 1's bytes are a string, and the text ends with a stray character: the text does
    // not parse, which a reader must say before it reads any event.
    auto text = replace(kTwoRanks, R"("bytes":3000000,"peer":1)", R"("bytes":"3 MB","peer":1)");
    text += "x";
    CHECK(error_of(text).find("t.json: byte " + std::to_string(text.size()) + ": not valid JSON") ==
          0);
  }
  SUBCASE("ops are checked in op id order, not in the order their events come") {
    // Op 3's event (rank 1) moved first with a stream id out of range (tid 9), and op 1's
    // bytes made a string: the Program is built rank 0 first, so op 1's error, now in
    // traceEvents[2], is the one reported.
    std::string text = kTwoRanks;
    const std::string op3 =
        R"({"name":"fwd","cat":"forward","ph":"X","pid":1,"tid":0,"ts":22.0,"dur":5.0,"args":{"op":3,"deps":[2],"mem":[[1000,"activations","device",1]]}})";
    text = replace(text, ",\n" + op3, "");
    text = replace(text, "\"traceEvents\":[\n",
                   "\"traceEvents\":[\n" + replace(op3, R"("tid":0)", R"("tid":9)") + ",\n");
    text = replace(text, R"("bytes":3000000,"peer":1)", R"("bytes":"3 MB","peer":1)");
    const auto message = error_of(text);
    CHECK(message.find("traceEvents[2].args.bytes: expected an integer") != std::string::npos);
    // With op 1 right, op 3's error (traceEvents[0]) is the first.
    text = replace(text, R"("bytes":"3 MB","peer":1)", R"("bytes":3000000,"peer":1)");
    CHECK(error_of(text).find("traceEvents[0].tid: expected an integer from 0 to") !=
          std::string::npos);
  }
  SUBCASE("the stratasim object's errors come before an op's") {
    // Read as before: groups before any op, although the events come first in the text.
    auto text = replace(kTwoRanks, R"("groups":[])", R"("groups":[{"name":5,"ranks":[0]}])");
    text = replace(text, R"("bytes":3000000,"peer":1)", R"("bytes":"3 MB","peer":1)");
    CHECK(error_of(text).find("stratasim.groups[0].name: expected a string") != std::string::npos);
  }
  SUBCASE("an older timeline's peer is checked against the ranks it has") {
    // Without the stratasim object the world is the highest pid + 1 (2), known only once every
    // event is read: rank 1's receive from rank 7 is refused by name.
    std::string text = kTwoRanks;
    text = text.substr(0, text.find(",\n\"stratasim\"")) + "}";
    text = replace(text, R"("kind":"recv","bytes":3000000,"peer":0)",
                   R"("kind":"recv","bytes":3000000,"peer":7)");
    CHECK(error_of(text).find("traceEvents[2].args.peer: expected an integer from 0 to 1, got 7") !=
          std::string::npos);
  }
  SUBCASE("traceEvents named twice: the last is read, as a JSON parser keeps it") {
    const std::string text =
        replace(kTwoRanks, "\"traceEvents\":[", "\"traceEvents\":[7,8],\"traceEvents\":[");
    const auto t = traces::import_timeline_text(text, "twice.json");
    CHECK(t.trace.program.op_count() == 4);
  }
}

TEST_CASE("timeline import: nesting is bounded where config::parse_json_depth_bounded bounds it") {
  // Arrays nested in an event's args: refused exactly when the config reader refuses the same
  // text (nested deeper than 512 levels), accepted otherwise (the extra argument is ignored).
  int refused = 0, accepted = 0;
  for (int depth = 505; depth <= 512; ++depth) {
    CAPTURE(depth);
    const std::string text = nested_in_event(depth);
    bool config_refuses = false;
    try {
      const auto parsed = config::parse_json_depth_bounded(text, "t.json");
      (void)parsed;
    } catch (const config::ConfigError&) {
      config_refuses = true;
    }
    if (config_refuses) {
      ++refused;
      CHECK(error_of(text) == "t.json: JSON nested deeper than 512 levels");
    } else {
      ++accepted;
      CHECK(traces::import_timeline_text(text, "t.json").trace.program.op_count() == 4);
    }
  }
  CHECK(refused > 0);
  CHECK(accepted > 0);
  // 200,000 levels: refused cleanly (no stack overflow), from memory and from a file.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  CHECK(error_of(deep) == "t.json: JSON nested deeper than 512 levels");
  testing::TempDir dir("timeline-deep");
  std::ofstream(dir.path() / "timeline.json", std::ios::binary) << deep;
  CHECK_THROWS_WITH_AS(traces::import_timeline(dir.path()),
                       doctest::Contains("nested deeper than 512 levels"), traces::TraceError);
}
