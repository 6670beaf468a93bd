// Chakra ET in and out: round trips of lowered experiments (protobuf and JSON forms), the sample
// trace made by protoc independently of our exporter, and malformed traces.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/cluster.hpp"
#include "sim/simulator.hpp"
#include "strategies/experiment.hpp"
#include "strategies/lowering.hpp"
#include "traces/chakra.hpp"
#include "traces/helpers.hpp"
#include "traces/same_program.hpp"

namespace fs = std::filesystem;
using namespace stratasim;
namespace st = stratasim::strategies;
using stratasim::testing::check_same_program;
using stratasim::testing::TempDir;

namespace {

const fs::path kSource = STRATASIM_SOURCE_DIR;

Time iteration_time(const traces::Timeline& t) {
  Time end;
  for (const auto& s : t.spans) end = std::max(end, s.end);
  return end;
}

st::Experiment experiment(const std::string& name, std::vector<st::Override> overrides = {}) {
  return st::load_experiment(kSource / "configs" / "experiments" / name, overrides);
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void round_trip(const st::Experiment& e, bool json_form) {
  const st::Program program = st::lower(e, {.mirror_data_parallel = false});
  const TempDir dir("traces");
  const fs::path prefix = dir.path() / "trace";
  traces::write_chakra(prefix, program, {.json_form = json_form});
  const std::string ext = json_form ? ".json" : ".et";
  for (int r = 0; r < program.world_size(); ++r) {
    CHECK(fs::exists(prefix.string() + "." + std::to_string(r) + ext));
  }
  CHECK(fs::exists(prefix.string() + ".comm_groups.json"));
  const auto imported = traces::import_chakra(prefix);
  check_same_program(program, imported.program);
  // Compute ops of a stream whose kernels are the same share one kernel list: no more lists
  // than the original's distinct (stream, list) pairs, no fewer than its distinct (stream,
  // kernels as text) pairs (text_of prints most fields, not all), where one per op was before.
  std::set<std::string> by_list, by_text;
  for (st::OpId id = 0; id < program.op_count(); ++id) {
    const st::Op& op = program.op(id);
    if (const auto* c = std::get_if<st::Compute>(&op.work)) {
      const std::string stream = std::string(name_of(op.stream)) + ":";
      by_list.insert(stream + std::to_string(c->kernels));
      std::string text = stream;
      for (const auto& k : program.kernels_of(*c)) text += testing::text_of(k) + ";";
      by_text.insert(text);
    }
  }
  CHECK(imported.program.kernel_lists().size() <= by_list.size());
  CHECK(imported.program.kernel_lists().size() >= by_text.size());
  // The same program simulates to the same picosecond.
  const auto before = sim::simulate(program, e.cluster);
  const auto after = sim::simulate(imported.program, e.cluster);
  REQUIRE(before.completed);
  REQUIRE(after.completed);
  CHECK(iteration_time(before).picoseconds() == iteration_time(after).picoseconds());
  // A folder holding one trace imports the same way.
  CHECK(traces::import_chakra(dir.path()).program.op_count() == program.op_count());
  // Deterministic: writing again gives the same bytes.
  const TempDir again("traces");
  traces::write_chakra(again.path() / "trace", program, {.json_form = json_form});
  CHECK(read(prefix.string() + ".0" + ext) == read(again.path() / ("trace.0" + ext)));
}

std::vector<std::string> rank_files(const fs::path& prefix, int world) {
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r)
    files.push_back(read(prefix.string() + "." + std::to_string(r) + ".et"));
  return files;
}

}  // namespace

TEST_CASE("chakra: a lowered 3D-parallel experiment round-trips op for op (protobuf)") {
  round_trip(experiment("gpt-tiny-3d-8.json"), false);
}

TEST_CASE("chakra: a lowered experiment round-trips op for op in the JSON form") {
  round_trip(experiment("gpt-tiny-3d-8.json"), true);
}

TEST_CASE("chakra: GPT-3 1.7B with tp 2, pp 2 and with ZeRO-3 round-trips to the picosecond") {
  const std::vector<st::Override> tp_pp = {{"parallelism.tp", 2, "test"},
                                           {"parallelism.pp", 2, "test"},
                                           {"parallelism.dp", nullptr, "test"},
                                           {"training.global_batch", 16, "test"}};
  SUBCASE("tp 2, pp 2") {
    round_trip(experiment("gpt3-1.7b-a100-8.json", tp_pp), false);
  }
  SUBCASE("ZeRO-3") {
    auto o = tp_pp;
    o.push_back({"parallelism.zero", 3, "test"});
    round_trip(experiment("gpt3-1.7b-a100-8.json", o), false);
  }
  // The attention kernels' sliding window (a twelfth value) and chunk (a thirteenth) come back:
  // lost, the replayed attention would cost the whole causal matrix.
  for (const char* key : {"model.sliding_window", "model.attention_chunk"}) {
    CAPTURE(key);
    auto o = tp_pp;
    o.push_back({"training.flash_attention", true, "test"});
    o.push_back({key, 512, "test"});
    o.push_back({"model.global_attention_every", 4, "test"});
    round_trip(experiment("gpt3-1.7b-a100-8.json", o), false);
    round_trip(experiment("gpt3-1.7b-a100-8.json", o), true);
  }
}

TEST_CASE("chakra: export fills durations from a timeline and refuses mirrored programs") {
  const auto e = experiment("gpt-tiny-3d-8.json");
  const auto program = st::lower(e, {.mirror_data_parallel = false});
  const auto timeline = sim::simulate(program, e.cluster);
  const TempDir dir("traces");
  traces::write_chakra(dir.path() / "t", program, {.json_form = true, .timeline = &timeline});
  // The JSON form names the fields as protobuf's JSON mapping does (camelCase, int64 as text).
  const std::string text = read(dir.path() / "t.0.json");
  CHECK(text.find("\"durationMicros\"") != std::string::npos);
  CHECK(text.find("\"COMP_NODE\"") != std::string::npos);
  CHECK(text.find("\"dataDeps\"") != std::string::npos);
  // Our own attributes still win over the durations on import: the program comes back exactly.
  check_same_program(program, traces::import_chakra(dir.path() / "t").program);

  const auto mirrored = st::lower(e, {.mirror_data_parallel = true});
  if (mirrored.mirrored()) {
    CHECK_THROWS_WITH_AS(traces::write_chakra(dir.path() / "m", mirrored),
                         doctest::Contains("mirroring"), std::invalid_argument);
  }
}

TEST_CASE("chakra: the protoc-encoded sample imports and simulates as calculated by hand") {
  const fs::path sample = kSource / "tests" / "data" / "traces" / "chakra" / "sample";
  const auto imported = traces::import_chakra(sample);
  const auto& p = imported.program;
  REQUIRE(p.world_size() == 2);
  // The METADATA node is skipped: 4 ops per rank, and rank 1's out-of-order file is sorted.
  REQUIRE(p.ops_of(0).size() == 4);
  REQUIRE(p.ops_of(1).size() == 4);
  for (int r = 0; r < 2; ++r) {
    const auto ops = p.ops_of(r);
    CHECK(p.label_of(ops[0]) == "aten::mm (forward)");
    CHECK(p.label_of(ops[1]) == "aten::mm (backward)");
    CHECK(std::holds_alternative<st::Collective>(ops[2].work));
    CHECK(p.label_of(ops[3]) == "optimizer.step");
    const auto& c = std::get<st::Collective>(ops[2].work);
    CHECK(c.kind == st::CollectiveKind::all_reduce);
    CHECK(c.bytes == Bytes(1048576));
    CHECK(p.groups()[c.group].ranks == std::vector<std::int32_t>{0, 1});
  }
  const auto cluster =
      hw::load_cluster(kSource / "configs" / "hardware" / "clusters" / "dgx-a100-1.json");
  const auto t = sim::simulate(p, cluster);
  REQUIRE(t.completed);
  // Compute is measured: forward 100 us then backward 200 us end at 300 us on both ranks.
  const st::OpId bwd = p.first_op(0) + 1;
  CHECK(t.spans[bwd].end == Time::us(300));
  // The all-reduce alone, in a Program built by hand, takes T; the iteration is 300 + T + 50 us.
  st::Program alone(2);
  const auto g = alone.add_group({0, 1}, "dp");
  for (int r = 0; r < 2; ++r) {
    alone.begin_rank(r);
    st::OpInfo info;
    info.stream = st::Stream::dp_comm;
    alone.add(st::Collective{st::CollectiveKind::all_reduce, DType::bf16, g, Bytes(1048576)}, info);
  }
  alone.finish();
  const Time all_reduce = iteration_time(sim::simulate(alone, cluster));
  CHECK(all_reduce > Time::zero());
  CHECK(iteration_time(t) == Time::us(350) + all_reduce);
}

TEST_CASE("chakra: malformed traces give errors naming the file, the place and the problem") {
  const auto e = experiment("gpt-tiny-3d-8.json");
  const auto program = st::lower(e, {.mirror_data_parallel = false});
  const TempDir dir("traces");
  const fs::path prefix = dir.path() / "t";
  traces::write_chakra(prefix, program);
  const auto files = rank_files(prefix, program.world_size());
  const std::string groups = read(prefix.string() + ".comm_groups.json");

  SUBCASE("truncated protobuf") {
    auto cut = files;
    cut[3].resize(cut[3].size() - 7);
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers(cut, groups, "t", false),
                         doctest::Contains("t.3.et: byte "), traces::TraceError);
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers(cut, groups, "t", false),
                         doctest::Contains("runs past the end of the file"), traces::TraceError);
  }
  SUBCASE("an empty rank file") {
    auto empty = files;
    empty[1].clear();
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers(empty, groups, "t", false),
                         doctest::Contains("t.1.et: byte 0"), traces::TraceError);
  }
  SUBCASE("a missing rank file") {
    fs::remove(prefix.string() + ".2.et");
    CHECK_THROWS_WITH_AS(traces::import_chakra(prefix),
                         doctest::Contains("rank 2's file t.2.et is missing"), traces::TraceError);
  }
  SUBCASE("an unknown pg_name") {
    CHECK_THROWS_WITH_AS(
        traces::import_chakra_buffers(files, std::string("{\"0\": [0, 1]}"), "t", false),
        doctest::Contains("is not a process group of the comm-group file"), traces::TraceError);
  }
  SUBCASE("a comm group naming a rank that does not exist") {
    CHECK_THROWS_WITH_AS(
        traces::import_chakra_buffers(files, std::string("{\"0\": [0, 99]}"), "t", false),
        doctest::Contains("t.comm_groups.json: 0[1]: expected a rank from 0 to 7"),
        traces::TraceError);
  }
}

namespace {

// A tiny hand-made trace in the JSON form: text per rank.
std::string json_node(int id, const std::string& type, const std::string& rest) {
  return "{\"id\": \"" + std::to_string(id) + "\", \"name\": \"n" + std::to_string(id) +
         "\", \"type\": \"" + type + "\"" + rest + "}\n";
}
const std::string kMeta = "{\"version\": \"0.0.4\"}\n";
std::string comp(int id, const std::string& deps = "") {
  return json_node(id, "COMP_NODE", ", \"durationMicros\": \"10\"" + deps);
}
std::string all_reduce(int id, const std::string& deps = "") {
  return json_node(id, "COMM_COLL_NODE",
                   deps +
                       ", \"attr\": [{\"name\": \"comm_type\", \"int64Val\": \"0\"}, "
                       "{\"name\": \"comm_size\", \"int64Val\": \"1024\"}]");
}

}  // namespace

TEST_CASE("chakra: dependency errors in the JSON form") {
  SUBCASE("a cycle is reported with its nodes, not looped on") {
    // Of data dependencies: one that only ctrl_deps close is resolved by dropping them (the
    // "ctrl_deps ... dropped" test below).
    const std::string r0 = kMeta + comp(1, ", \"dataDeps\": [\"3\"]") +
                           comp(2, ", \"dataDeps\": [\"1\"]") + comp(3, ", \"dataDeps\": [\"2\"]");
    CHECK_THROWS_WITH_AS(
        traces::import_chakra_buffers({r0}, std::nullopt, "c", true),
        doctest::Contains("c.0.json: node 1: dependency cycle: node 1 -> 3 -> 2 -> 1"),
        traces::TraceError);
  }
  SUBCASE("a dependency on a missing node") {
    const std::string r0 = kMeta + comp(1) + comp(2, ", \"dataDeps\": [\"99\"]");
    CHECK_THROWS_WITH_AS(
        traces::import_chakra_buffers({r0}, std::nullopt, "m", true),
        doctest::Contains(
            "m.0.json: node 2: data_deps names node 99, which the trace does not have"),
        traces::TraceError);
  }
  SUBCASE("an unmatched collective names the group, ranks and counts") {
    const std::string r0 = kMeta + comp(1) + all_reduce(2, ", \"dataDeps\": [\"1\"]") +
                           all_reduce(3, ", \"dataDeps\": [\"2\"]");
    const std::string r1 = kMeta + comp(1) + all_reduce(2, ", \"dataDeps\": [\"1\"]");
    CHECK_THROWS_WITH_AS(
        traces::import_chakra_buffers({r0, r1}, std::nullopt, "u", true),
        doctest::Contains("unmatched collective on group 'world' (ranks 0, 1): rank 0 issues 2 "
                          "collectives on it, rank 1 issues 1; the 2nd on rank 0"),
        traces::TraceError);
  }
  SUBCASE("bad JSON types name the object") {
    const std::string r0 = kMeta + "{\"id\": \"1\", \"type\": 12.5}\n";
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({r0}, std::nullopt, "b", true),
                         doctest::Contains("b.0.json: JSON object 1 (byte 21): not a Chakra Node"),
                         traces::TraceError);
  }
  SUBCASE("an attribute of the wrong type") {
    const std::string r0 =
        kMeta + json_node(1, "COMM_COLL_NODE",
                          ", \"attr\": [{\"name\": \"comm_type\", \"stringVal\": \"ALL_REDUCE\"}]");
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({r0}, std::nullopt, "a", true),
                         doctest::Contains("node 1: attribute comm_type: expected an integer"),
                         traces::TraceError);
  }
  SUBCASE("an unsupported collective") {
    const std::string r0 =
        kMeta + json_node(1, "COMM_COLL_NODE",
                          ", \"attr\": [{\"name\": \"comm_type\", \"int64Val\": \"3\"}, "
                          "{\"name\": \"comm_size\", \"int64Val\": \"8\"}]");
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({r0}, std::nullopt, "g", true),
                         doctest::Contains("comm_type 3 (GATHER) is not supported"),
                         traces::TraceError);
  }
  SUBCASE("without a comm-group file, a pg is taken as the world, with a note") {
    const std::string r =
        kMeta + json_node(1, "COMM_COLL_NODE",
                          ", \"attr\": [{\"name\": \"comm_type\", \"int64Val\": \"0\"}, "
                          "{\"name\": \"comm_size\", \"int64Val\": \"8\"}, "
                          "{\"name\": \"pg_name\", \"stringVal\": \"7\"}]");
    const auto t = traces::import_chakra_buffers({r, r}, std::nullopt, "w", true);
    REQUIRE(t.program.groups().size() == 1);
    CHECK(t.program.groups()[0].ranks == std::vector<std::int32_t>{0, 1});
    REQUIRE(!t.notes.empty());
    CHECK(t.notes[0].find("spanning all 2 ranks") != std::string::npos);
  }
}

TEST_CASE("chakra: exported communicator group ids start at 1 because ASTRA-sim reserves 0") {
  // ASTRA-sim reserves communicator group id 0 (no group: all ranks): its
  // CommunicatorGroupManager numbers groups from 1, and Workload::issue_pytorch_pg_metadata adds
  // 1 to PyTorch's pg names "to ensure pgName > 0". So the comm-group file's keys are 1..G for
  // the Program's G groups, and every collective's pg_name is one of them.
  const auto program = st::lower(experiment("gpt-tiny-3d-8.json"), {.mirror_data_parallel = false});
  REQUIRE(!program.groups().empty());
  const TempDir dir("traces");
  const fs::path prefix = dir.path() / "t";
  traces::write_chakra(prefix, program, {.json_form = true});
  const auto groups = nlohmann::ordered_json::parse(read(prefix.string() + ".comm_groups.json"));
  std::vector<std::string> keys;
  for (const auto& [key, unused] : groups.items()) keys.push_back(key);
  std::vector<std::string> expected;
  for (std::size_t g = 1; g <= program.groups().size(); ++g) expected.push_back(std::to_string(g));
  CHECK(keys == expected);
  std::size_t collectives = 0;
  const std::regex pg(R"re("pg_name",\s*"stringVal":\s*"([0-9]+)")re");
  for (int r = 0; r < program.world_size(); ++r) {
    const std::string text = read(prefix.string() + "." + std::to_string(r) + ".json");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), pg); it != std::sregex_iterator();
         ++it) {
      ++collectives;
      const std::string id = (*it)[1].str();
      CHECK(id != "0");
      CHECK(groups.contains(id));
    }
  }
  CHECK(collectives > 0);
  // The import maps the ids back: same groups, same names, same program.
  check_same_program(program, traces::import_chakra(prefix).program);

  // A foreign trace may use ASTRA-sim's group 0 without listing it: all ranks.
  const std::string r =
      kMeta + json_node(1, "COMM_COLL_NODE",
                        ", \"attr\": [{\"name\": \"comm_type\", \"int64Val\": \"0\"}, "
                        "{\"name\": \"comm_size\", \"int64Val\": \"8\"}, "
                        "{\"name\": \"pg_name\", \"stringVal\": \"0\"}]");
  const auto t = traces::import_chakra_buffers({r, r}, std::string("{\"1\": [0]}"), "z", true);
  const auto& c = std::get<st::Collective>(t.program.ops_of(0)[0].work);
  CHECK(t.program.groups()[c.group].ranks == std::vector<std::int32_t>{0, 1});
}

TEST_CASE("chakra: all-gather comm_size is one rank's input as Chakra and ASTRA-sim count it") {
  // ASTRA-sim's collectives (Ring, HalvingDoubling) take an all-gather's data_size as one rank's
  // input (final_data_size = data_size * nodes_in_ring) and a reduce-scatter's as the whole
  // input (final_data_size = data_size / nodes_in_ring); Chakra's PyTorch converter writes the
  // same. The Program counts an all-gather's whole output (nccl-tests' convention), so a 4-rank
  // all-gather of 4096 bytes is comm_size 4096 / 4 = 1024; a reduce-scatter of 4096 stays 4096.
  st::Program p(4);
  const auto g = p.add_group({0, 1, 2, 3}, "dp");
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    st::OpInfo info;
    info.stream = st::Stream::dp_comm;
    p.add(st::Collective{st::CollectiveKind::all_gather, DType::bf16, g, Bytes(4096)}, info);
    p.add(st::Collective{st::CollectiveKind::reduce_scatter, DType::bf16, g, Bytes(4096)}, info);
    // 4099 bytes do not divide among 4 ranks: the exact count travels beside comm_size.
    p.add(st::Collective{st::CollectiveKind::all_gather, DType::bf16, g, Bytes(4099)}, info);
  }
  p.finish();
  const TempDir dir("traces");
  traces::write_chakra(dir.path() / "t", p, {.json_form = true});
  const std::string text = read(dir.path() / "t.0.json");
  const std::regex size(R"re("comm_size",\s*"int64Val":\s*"([0-9]+)")re");
  std::vector<std::string> sizes;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), size); it != std::sregex_iterator();
       ++it) {
    sizes.push_back((*it)[1].str());
  }
  CHECK(sizes == std::vector<std::string>{"1024", "4096", "1024"});
  // Export then import keeps the Program's bytes.
  check_same_program(p, traces::import_chakra(dir.path() / "t").program);

  // A foreign 2-rank trace: ALL_GATHER (2) of comm_size 1024 is 2048 bytes of output;
  // REDUCE_SCATTER (7) of 1024 is 1024.
  auto coll = [](int id, int type) {
    return json_node(id, "COMM_COLL_NODE",
                     ", \"attr\": [{\"name\": \"comm_type\", \"int64Val\": \"" +
                         std::to_string(type) +
                         "\"}, {\"name\": \"comm_size\", \"int64Val\": \"1024\"}]");
  };
  const std::string r = kMeta + coll(1, 2) + coll(2, 7);
  const auto t = traces::import_chakra_buffers({r, r}, std::nullopt, "f", true);
  const auto ops = t.program.ops_of(0);
  REQUIRE(ops.size() == 2);
  CHECK(std::get<st::Collective>(ops[0].work).kind == st::CollectiveKind::all_gather);
  CHECK(std::get<st::Collective>(ops[0].work).bytes == Bytes(2048));
  CHECK(std::get<st::Collective>(ops[1].work).bytes == Bytes(1024));
}

namespace {

// The values of attribute `name` (type field `field`: int64Val, uint64Val) in a JSON-form file,
// in node order.
std::vector<std::string> attr_values(const std::string& text, const std::string& name,
                                     const std::string& field) {
  const std::regex re("\"" + name + "\",\\s*\"" + field + "\":\\s*\"([0-9]+)\"");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back((*it)[1].str());
  }
  return out;
}

// One rank, one compute op per kernel list, in order.
st::Program one_rank_program(const std::vector<std::vector<st::Kernel>>& lists) {
  st::Program p(1);
  p.begin_rank(0);
  for (const auto& list : lists) {
    st::OpInfo info;
    const auto* copy = std::get_if<st::Copy>(&list[0].work);
    info.stream = copy && copy->from != copy->to ? st::Stream::copy : st::Stream::compute;
    p.add(st::Compute{p.add_kernels(list)}, info);
  }
  p.finish();
  return p;
}

}  // namespace

TEST_CASE("chakra: memory-bound nodes get num_ops and tensor_size from their kernels") {
  // ASTRA-sim's roofline (Workload::issue_comp) runs a COMP_NODE for num_ops / perf(num_ops /
  // tensor_size) and skips one whose tensor_size is 0; num_ops 0 gives intensity 0 and stalls.
  // Hand-calculated:
  // - GEMM 128 x 256 x 64 bf16: 2 m n k = 4,194,304 FLOPs; A, B and C once:
  //   (128*64 + 64*256 + 128*256) * 2 bytes = 114,688.
  // - elementwise of 1000 elements reading and writing 2000 bytes each: 1000 ops, 4000 bytes.
  // - Adam step of 1000 bf16 parameters with fp32 gradients: one op per parameter; reads the
  //   fp32 gradient, master, m and v (16 bytes) and writes master, m, v and the bf16 weights
  //   (14): 30 bytes a parameter (strategies/optimizer.hpp's table), 30,000 bytes.
  st::OptimizerStep adam;
  adam.params = 1000;
  adam.fp32_grads = true;
  const auto p = one_rank_program({
      {{st::Gemm{128, 256, 64, 1, DType::bf16}, "fc"}},
      {{st::Elementwise{1000, Bytes(2000), Bytes(2000)}, "gelu"}},
      {{adam, "adam"}},
  });
  const TempDir dir("traces");
  traces::write_chakra(dir.path() / "t", p, {.json_form = true});
  const std::string text = read(dir.path() / "t.0.json");
  CHECK(attr_values(text, "num_ops", "int64Val") ==
        std::vector<std::string>{"4194304", "1000", "1000"});
  CHECK(attr_values(text, "tensor_size", "uint64Val") ==
        std::vector<std::string>{"114688", "4000", "30000"});
  check_same_program(p, traces::import_chakra(dir.path() / "t").program);
}

TEST_CASE("chakra: host and PCIe copies are exported as memory load and store nodes") {
  // ASTRA-sim moves a MEM_LOAD_NODE's / MEM_STORE_NODE's tensor_size bytes through its memory
  // model (Workload::issue_remote_mem); a COMP_NODE would run on the GPU's roofline. Host to
  // device is a load, device to host a store; a copy within the device stays a COMP_NODE.
  const auto p = one_rank_program({
      {{st::Copy{Bytes(1 << 20), st::MemoryTier::host, st::MemoryTier::device}, "prefetch"}},
      {{st::Copy{Bytes(1 << 19), st::MemoryTier::device, st::MemoryTier::host}, "offload"}},
      {{st::Copy{Bytes(1 << 18), st::MemoryTier::device, st::MemoryTier::device}, "move"}},
  });
  const TempDir dir("traces");
  traces::write_chakra(dir.path() / "t", p, {.json_form = true});
  const std::string text = read(dir.path() / "t.0.json");
  const auto load = text.find("\"MEM_LOAD_NODE\"");
  const auto store = text.find("\"MEM_STORE_NODE\"");
  const auto comp = text.find("\"COMP_NODE\"");
  REQUIRE(load != std::string::npos);
  REQUIRE(store != std::string::npos);
  REQUIRE(comp != std::string::npos);
  CHECK(load < store);
  CHECK(store < comp);
  // tensor_size: the bytes copied (within the device: read and written, 2 x 262,144).
  CHECK(attr_values(text, "tensor_size", "uint64Val") ==
        std::vector<std::string>{"1048576", "524288", "524288"});
  check_same_program(p, traces::import_chakra(dir.path() / "t").program);
  // Without our kernel attribute (another tool's trace) the nodes still read as the copies.
  std::string foreign = read(dir.path() / "t.0.json");
  for (std::size_t at; (at = foreign.find("stratasim.kernels")) != std::string::npos;) {
    foreign.replace(at, 17, "other.kernels____");
  }
  const auto t = traces::import_chakra_buffers({foreign}, std::nullopt, "f", true);
  const auto ops = t.program.ops_of(0);
  REQUIRE(ops.size() == 3);
  const auto& k0 = t.program.kernels_of(std::get<st::Compute>(ops[0].work));
  const auto& k1 = t.program.kernels_of(std::get<st::Compute>(ops[1].work));
  CHECK(std::get<st::Copy>(k0[0].work).bytes == Bytes(1 << 20));
  CHECK(std::get<st::Copy>(k0[0].work).to == st::MemoryTier::device);
  CHECK(std::get<st::Copy>(k1[0].work).bytes == Bytes(1 << 19));
  CHECK(std::get<st::Copy>(k1[0].work).to == st::MemoryTier::host);
}

TEST_CASE(
    "chakra: order simulated chains each rank's communication for one queue and records "
    "the cluster") {
  // ASTRA-sim's HardwareResource runs one communication node at a time per rank; with only
  // each stream's order, tensor-, data- and pipeline-parallel communication interleave and can
  // deadlock there. single_comm_queue chains each rank's communication nodes (ctrl_deps) in the
  // order the simulation started them, so on import every communication op depends on the one
  // that started before it on its rank.
  const auto e = experiment("gpt-tiny-3d-8.json");
  const auto program = st::lower(e, {.mirror_data_parallel = false});
  const auto timeline = sim::simulate(program, e.cluster);
  REQUIRE(timeline.completed);
  const TempDir dir("traces");
  CHECK_THROWS_AS(traces::write_chakra(dir.path() / "x", program, {.single_comm_queue = true}),
                  std::invalid_argument);
  traces::write_chakra(dir.path() / "t", program,
                       {.timeline = &timeline, .single_comm_queue = true, .cluster = "dgx-a100-1"});
  const auto imported = traces::import_chakra(dir.path() / "t");
  REQUIRE(imported.program.op_count() == program.op_count());
  // The cluster comes back, so a replay needs no --cluster.
  CHECK(imported.cluster == std::optional<std::string>("dgx-a100-1"));
  // Replayed, no two communication ops of a rank overlap: one queue. (Exported by stream
  // order alone, data-parallel and tensor-parallel communication run side by side.)
  const auto replayed = sim::simulate(imported.program, e.cluster);
  REQUIRE(replayed.completed);
  auto overlaps = [](const st::Program& p, const traces::Timeline& t) {
    std::size_t n = 0;
    for (int r = 0; r < p.world_size(); ++r) {
      std::vector<std::pair<Time, Time>> comms;
      const st::OpId first = p.first_op(r);
      for (st::OpId id = first; id < first + p.ops_of(r).size(); ++id) {
        if (!std::holds_alternative<st::Compute>(p.op(id).work)) {
          comms.emplace_back(t.spans[id].start, t.spans[id].end);
        }
      }
      std::sort(comms.begin(), comms.end());
      for (std::size_t j = 1; j < comms.size(); ++j) {
        if (comms[j].first < comms[j - 1].second) ++n;
      }
    }
    return n;
  };
  CHECK(overlaps(program, timeline) > 0);  // the test would see an interleaving
  CHECK(overlaps(imported.program, replayed) == 0);
}

namespace {

const fs::path kChakraData = kSource / "tests" / "data" / "traces" / "chakra";

const hw::ClusterSpec& dgx_a100() {
  static const auto cluster =
      hw::load_cluster(kSource / "configs" / "hardware" / "clusters" / "dgx-a100-1.json");
  return cluster;
}

bool has_note(const traces::ImportedTrace& t, const std::string& text) {
  return std::any_of(t.notes.begin(), t.notes.end(),
                     [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

// One rank file of the JSON form: the GlobalMetadata, then `nodes`.
std::string json_rank(const std::vector<std::string>& nodes) {
  std::string text = kMeta;
  for (const auto& n : nodes) text += n;
  return text;
}

// PyTorch's "## process_group:init ##" node as Chakra's converter writes it: inputs.values is
// str() of a one-string list holding the JSON of the groups (here in the JSON form's escaping).
// `nested`: "[[" + json.dumps(groups) + "]]", as some tools that write Chakra directly do.
std::string pg_init(int id, const std::string& groups_json, bool nested = false) {
  std::string escaped;
  for (char c : groups_json) escaped += c == '"' ? std::string("\\\"") : std::string(1, c);
  return "{\"id\": \"" + std::to_string(id) +
         "\", \"name\": \"## process_group:init ##\", \"type\": \"METADATA_NODE\", "
         "\"inputs\": {\"values\": \"" +
         (nested ? "[[" + escaped + "]]" : "['" + escaped + "']") + "\"}}\n";
}

std::string all_reduce_on(int id, const std::string& pg, int bytes) {
  return json_node(id, "COMM_COLL_NODE",
                   ", \"attr\": [{\"name\": \"comm_type\", \"int64Val\": \"0\"}, "
                   "{\"name\": \"comm_size\", \"int64Val\": \"" +
                       std::to_string(bytes) + "\"}, {\"name\": \"pg_name\", \"stringVal\": \"" +
                       pg + "\"}, {\"name\": \"is_cpu_op\", \"boolVal\": false}]");
}

// The time of one all-reduce of `bytes` over `ranks` of dgx-a100-1, in a Program built by hand.
Time lone_all_reduce(const std::vector<std::int32_t>& ranks, std::int64_t bytes) {
  st::Program p(static_cast<int>(ranks.size()));
  std::vector<std::int32_t> members(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) members[i] = static_cast<std::int32_t>(i);
  const auto g = p.add_group(members, "g");
  for (int r = 0; r < p.world_size(); ++r) {
    p.begin_rank(r);
    st::OpInfo info;
    info.stream = st::Stream::dp_comm;
    p.add(st::Collective{st::CollectiveKind::all_reduce, DType::bf16, g, Bytes(bytes)}, info);
  }
  p.finish();
  return iteration_time(sim::simulate(p, dgx_a100()));
}

}  // namespace

TEST_CASE(
    "Chakra: an MSCCL-style ring all-reduce of send/recv nodes does not deadlock (sends do not "
    "wait)") {
  // ASTRA-sim's custom_ring_allreduce_8npus_1MB (PROVENANCE.md): on every rank each node has a
  // data dependency on the one before it, so rank r's first receive waits for its own first
  // send. With sends that wait for their receive (rendezvous) every rank waits for its
  // neighbour's receive: exit 3, deadlock.
  const auto imported =
      traces::import_chakra(kChakraData / "custom_ring_allreduce_8npus_1MB" / "custom_allreduce");
  const auto& p = imported.program;
  REQUIRE(p.world_size() == 8);
  std::size_t sends = 0;
  for (const auto& op : p.ops()) {
    if (const auto* s = std::get_if<st::Send>(&op.work)) {
      CHECK(s->eager);
      ++sends;
    }
  }
  CHECK(sends == 8 * 14);
  // The report says which semantics the import assumed.
  CHECK(has_note(imported, "112 sends replayed with Chakra's semantics"));
  CHECK(has_note(imported, "does not wait for its receive"));
  const auto t = sim::simulate(p, dgx_a100());
  CAPTURE(t.problem);
  REQUIRE(t.completed);
  // By hand: all 8 ranks step together. A send ends when its 131072 bytes have arrived (T, the
  // time of 8 such transfers around the ring at once, measured below on a Program built by
  // hand); the receive after it finds its data there. The 7 reduce-scatter steps add a 7 us
  // reduction each, so the iteration is 14 sends after one another plus 7 x 7 us: 14 T + 49 us.
  st::Program ring(8);
  for (int r = 0; r < 8; ++r) {
    ring.begin_rank(r);
    st::OpInfo send_info, recv_info;
    send_info.stream = st::Stream::pp_send;
    recv_info.stream = st::Stream::pp_recv;
    ring.add(st::Send{(r + 1) % 8, Bytes(131072)}, send_info);
    ring.add(st::Recv{(r + 7) % 8, Bytes(131072)}, recv_info);
  }
  ring.finish();
  const Time step = iteration_time(sim::simulate(ring, dgx_a100()));
  REQUIRE(step > Time::zero());
  CHECK(iteration_time(t) == step * 14 + Time::us(49));
}

TEST_CASE(
    "Chakra: an eager send ends when its data arrives, before its receive is posted; a "
    "rendezvous send waits for the receive") {
  // Rank 0 sends 1 MiB to rank 1 at once; rank 1 computes 100 us first, then posts the receive.
  auto program = [](bool eager, bool late_send) {
    st::Program p(2);
    st::OpInfo compute, send, recv;
    compute.stream = st::Stream::compute;
    send.stream = st::Stream::pp_send;
    recv.stream = st::Stream::pp_recv;
    const auto wait = p.add_kernels({{st::Measured{Time::us(100)}, "wait"}});
    p.begin_rank(0);
    if (late_send) {
      const auto w = p.add(st::Compute{wait}, compute);
      p.add(st::Send{1, Bytes(1 << 20), st::kNcclSms, eager}, send,
            std::span<const st::OpId>(&w, 1));
    } else {
      p.add(st::Send{1, Bytes(1 << 20), st::kNcclSms, eager}, send);
    }
    p.begin_rank(1);
    if (late_send) {
      p.add(st::Recv{0, Bytes(1 << 20)}, recv);
    } else {
      const auto w = p.add(st::Compute{wait}, compute);
      p.add(st::Recv{0, Bytes(1 << 20)}, recv, std::span<const st::OpId>(&w, 1));
    }
    p.finish();
    return p;
  };
  // T: the transfer alone (both sides ready at 0).
  st::Program alone(2);
  alone.begin_rank(0);
  st::OpInfo s, v;
  s.stream = st::Stream::pp_send;
  v.stream = st::Stream::pp_recv;
  alone.add(st::Send{1, Bytes(1 << 20)}, s);
  alone.begin_rank(1);
  alone.add(st::Recv{0, Bytes(1 << 20)}, v);
  alone.finish();
  const Time transfer = iteration_time(sim::simulate(alone, dgx_a100()));
  REQUIRE(transfer > Time::zero());
  REQUIRE(transfer < Time::us(100));
  auto span_of = [](const st::Program& p, const traces::Timeline& t, int rank, bool send) {
    for (st::OpId id = p.first_op(rank); id < p.first_op(rank) + p.ops_of(rank).size(); ++id) {
      const bool is_send = std::holds_alternative<st::Send>(p.op(id).work);
      const bool is_recv = std::holds_alternative<st::Recv>(p.op(id).work);
      if ((send && is_send) || (!send && is_recv)) return t.spans[id];
    }
    FAIL("no such op");
    return traces::Span{};
  };
  SUBCASE("eager, the receive posted late: the send ends at T, the receive at once at 100 us") {
    const auto p = program(true, false);
    const auto t = sim::simulate(p, dgx_a100());
    REQUIRE(t.completed);
    CHECK(span_of(p, t, 0, true).end == transfer);
    CHECK(span_of(p, t, 1, false).start == Time::us(100));
    CHECK(span_of(p, t, 1, false).end == Time::us(100));
  }
  SUBCASE("rendezvous, the receive posted late: both run from 100 us to 100 us + T") {
    const auto p = program(false, false);
    const auto t = sim::simulate(p, dgx_a100());
    REQUIRE(t.completed);
    CHECK(span_of(p, t, 0, true).end == Time::us(100) + transfer);
    CHECK(span_of(p, t, 1, false).end == Time::us(100) + transfer);
  }
  SUBCASE("eager, the send late: the posted receive ends when the data arrives") {
    const auto p = program(true, true);
    const auto t = sim::simulate(p, dgx_a100());
    REQUIRE(t.completed);
    CHECK(span_of(p, t, 0, true).end == Time::us(100) + transfer);
    CHECK(span_of(p, t, 1, false).end == Time::us(100) + transfer);
  }
}

TEST_CASE("Chakra: stratasim's own exports keep rendezvous sends (stratasim.rendezvous)") {
  // A lowered pipeline's sends wait for their receives (NCCL); the export says so per send, so
  // the import restores them exactly (the round trips above compare eager too), and a Chakra
  // send without the attribute is eager.
  const auto e = experiment("gpt-tiny-3d-8.json");
  const auto program = st::lower(e, {.mirror_data_parallel = false});
  const TempDir dir("traces");
  traces::write_chakra(dir.path() / "t", program);
  const auto imported = traces::import_chakra(dir.path() / "t");
  CHECK(has_note(imported, "keep stratasim's rendezvous semantics"));
  CHECK_FALSE(has_note(imported, "replayed with Chakra's semantics"));
  for (const auto& op : imported.program.ops()) {
    if (const auto* s = std::get_if<st::Send>(&op.work)) CHECK_FALSE(s->eager);
  }
}

TEST_CASE(
    "Chakra: a PyTorch execution trace, Chakra's JSON workload graph or a trace without nodes "
    "is refused, naming the file and what was expected") {
  SUBCASE("a PyTorch host execution trace (\"schema\", \"nodes\")") {
    const std::string et =
        "{\"schema\": \"1.0.2-chakra.0.0.4\", \"pid\": 788625, \"time\": \"2024-03-21 18:54:23\", "
        "\"start_ts\": 350785410, \"nodes\": [{\"id\": 2, \"name\": "
        "\"[pytorch|profiler|execution_trace|thread]\", \"ctrl_deps\": 1}], \"finish_ts\": 1}";
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({et}, std::nullopt, "host_et", true),
                         doctest::Contains("host_et.0.json: this is a PyTorch execution trace"),
                         traces::TraceError);
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({et}, std::nullopt, "host_et", true),
                         doctest::Contains("convert it with chakra_converter first"),
                         traces::TraceError);
    // The same text in a .et file is not read as protobuf either.
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({et}, std::nullopt, "host_et", false),
                         doctest::Contains("host_et.0.et: this is JSON text"), traces::TraceError);
  }
  SUBCASE("Chakra's JSON workload graph (what its JSONNode feeder reads)") {
    const std::string graph =
        "{\"workload_graph\": [{\"Id\": 216, \"Name\": \"aten::flatten_dense_tensors(0)\", "
        "\"NodeType\": 4, \"ctrlDeps\": [3], \"data_deps\": [], \"runtime\": 318, "
        "\"is_cpu_op\": true}]}";
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({graph}, std::nullopt, "small", true),
                         doctest::Contains("small.0.json: this is a JSON workload graph"),
                         traces::TraceError);
  }
  SUBCASE("another tool's JSON") {
    CHECK_THROWS_WITH_AS(
        traces::import_chakra_buffers({"{\"traceEvents\": []}"}, std::nullopt, "k", true),
        doctest::Contains("has the keys \"traceEvents\", which a GlobalMetadata does not have"),
        traces::TraceError);
  }
  SUBCASE("a trace of GlobalMetadata only") {
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers({kMeta, kMeta}, std::nullopt, "empty", true),
                         doctest::Contains("empty.0.json: the trace has no nodes"),
                         traces::TraceError);
  }
  SUBCASE("one rank's file alone names the given path, the missing file and the rule") {
    const TempDir dir("traces");
    {
      std::ofstream out(dir.path() / "host_et.1.json");
      out << json_rank({comp(1)});
    }
    const auto given = dir.path() / "host_et.1.json";
    CHECK_THROWS_WITH_AS(traces::import_chakra(given),
                         doctest::Contains(doctest::String(
                             (given.string() + ": rank 0's file host_et.0.json is missing (found "
                                               "only rank 1 of prefix \"host_et\")")
                                 .c_str())),
                         traces::TraceError);
    // When the file that is there is not a Chakra trace at all, that is what is said.
    {
      std::ofstream out(dir.path() / "host_et.1.json");
      out << "{\"schema\": \"1.0.3-chakra.0.0.4\", \"nodes\": []}";
    }
    CHECK_THROWS_WITH_AS(traces::import_chakra(given),
                         doctest::Contains("host_et.1.json: this is a PyTorch execution trace"),
                         traces::TraceError);
  }
}

TEST_CASE(
    "Chakra: process groups come from the process_group:init metadata node, so two disjoint "
    "2-rank all-reduces stay two") {
  // PyTorch's groups as its execution trace records them (pg_config_info): the default group
  // (ranks [] = all) and two new_group()s of ranks {0, 1} and {2, 3}. Each rank all-reduces
  // 1 MiB on its pair's group.
  const std::string groups =
      "[{\"pg_name\": \"0\", \"pg_desc\": \"default_pg\", \"backend_config\": \"cuda:nccl\", "
      "\"ranks\": [], \"group_size\": 4, \"group_count\": 3}, {\"pg_name\": \"1\", \"pg_desc\": "
      "\"undefined\", \"backend_config\": \"cuda:nccl\", \"ranks\": [0, 1], \"group_size\": 2, "
      "\"group_count\": 3}, {\"pg_name\": \"2\", \"pg_desc\": \"undefined\", \"backend_config\": "
      "\"cuda:nccl\", \"ranks\": [2, 3], \"group_size\": 2, \"group_count\": 3}]";
  std::vector<std::string> files;
  for (int r = 0; r < 4; ++r) {
    files.push_back(json_rank({pg_init(1, groups), all_reduce_on(2, r < 2 ? "1" : "2", 1 << 20)}));
  }
  const auto imported = traces::import_chakra_buffers(files, std::nullopt, "pairs", true);
  const auto& p = imported.program;
  CHECK(has_note(imported, "process groups read from 4 \"## process_group:init ##\""));
  std::set<std::uint32_t> used;
  for (int r = 0; r < 4; ++r) {
    const auto ops = p.ops_of(r);
    REQUIRE(ops.size() == 1);  // the metadata node is skipped
    const auto& c = std::get<st::Collective>(ops[0].work);
    used.insert(c.group);
    CHECK(p.groups()[c.group].ranks ==
          (r < 2 ? std::vector<std::int32_t>{0, 1} : std::vector<std::int32_t>{2, 3}));
  }
  CHECK(used.size() == 2);
  // Simulated: each pair's all-reduce takes what one 2-rank all-reduce takes alone.
  const auto t = sim::simulate(p, dgx_a100());
  REQUIRE(t.completed);
  CHECK(iteration_time(t) == lone_all_reduce({0, 1}, 1 << 20));

  SUBCASE("the groups as [[<json>]] read the same") {
    std::vector<std::string> nested;
    for (int r = 0; r < 4; ++r) {
      nested.push_back(
          json_rank({pg_init(1, groups, true), all_reduce_on(2, r < 2 ? "1" : "2", 1 << 20)}));
    }
    const auto again = traces::import_chakra_buffers(nested, std::nullopt, "pairs", true);
    const auto& c = std::get<st::Collective>(again.program.ops_of(3)[0].work);
    CHECK(again.program.groups()[c.group].ranks == std::vector<std::int32_t>{2, 3});
  }
  SUBCASE("a comm-group file, when there is one, wins") {
    // Named by the metadata node, the group is "undefined (pg 1)" (its pg_desc); by the file,
    // "pg 1".
    CHECK(p.groups()[std::get<st::Collective>(p.ops_of(0)[0].work).group].name ==
          "undefined (pg 1)");
    const auto with_file = traces::import_chakra_buffers(
        files, std::string("{\"1\": [0, 1], \"2\": [2, 3]}"), "pairs", true);
    const auto& c = std::get<st::Collective>(with_file.program.ops_of(0)[0].work);
    CHECK(with_file.program.groups()[c.group].name == "pg 1");
    CHECK_FALSE(has_note(with_file, "process groups read from"));
  }
  SUBCASE("ranks that disagree about a group are an error naming both files") {
    auto bad = files;
    bad[3] = json_rank(
        {pg_init(1, "[{\"pg_name\": \"1\", \"ranks\": [0, 3]}]"), all_reduce_on(2, "1", 1 << 20)});
    CHECK_THROWS_WITH_AS(
        traces::import_chakra_buffers(bad, std::nullopt, "pairs", true),
        doctest::Contains("pairs.3.json: node 1 (## process_group:init ##): process group \"1\" "
                          "has ranks [0,3] here but [0,1] in pairs.0.json"),
        traces::TraceError);
  }
  SUBCASE("a malformed group list names the node and what was expected") {
    auto bad = files;
    bad[0] = json_rank({pg_init(1, "[{\"pg_name\": \"1\"}]"), all_reduce_on(2, "1", 1 << 20)});
    CHECK_THROWS_WITH_AS(traces::import_chakra_buffers(bad, std::nullopt, "pairs", true),
                         doctest::Contains("inputs.values[0]: expected {\"pg_name\""),
                         traces::TraceError);
  }
}

TEST_CASE(
    "Chakra: host-side communication nodes without comm_type (the CPU wrappers of a collective) "
    "run on the host; their GPU twin is the collective") {
  // Chakra's older PyTorch converter typed the CPU ops c10d::allreduce_ and nccl:all_reduce as
  // COMM_COLL_NODE with is_cpu_op and no comm_type; the ncclKernel under them carries it.
  auto rank = [](bool with_duration) {
    const std::string cpu_attr = ", \"attr\": [{\"name\": \"is_cpu_op\", \"boolVal\": true}]";
    return json_rank({
        "{\"id\": \"1\", \"name\": \"c10d::allreduce_\", \"type\": \"COMM_COLL_NODE\"" +
            std::string(with_duration ? ", \"durationMicros\": \"30\"" : "") + cpu_attr + "}\n",
        "{\"id\": \"2\", \"name\": \"ncclKernel_AllReduce_RING_LL_Sum_float\", \"type\": "
        "\"COMM_COLL_NODE\", \"ctrlDeps\": [\"1\"], \"attr\": [{\"name\": \"comm_type\", "
        "\"int64Val\": \"0\"}, {\"name\": \"comm_size\", \"int64Val\": \"1048576\"}, "
        "{\"name\": \"is_cpu_op\", \"boolVal\": false}]}\n",
        // A GPU NCCL kernel typed as computation keeps its measured time, with a note.
        "{\"id\": \"3\", \"name\": \"ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage)\", "
        "\"type\": \"COMP_NODE\", \"dataDeps\": [\"2\"], \"durationMicros\": \"20\"}\n",
    });
  };
  const auto imported =
      traces::import_chakra_buffers({rank(true), rank(true)}, std::nullopt, "old", true);
  const auto& p = imported.program;
  CHECK(has_note(imported, "2 host-side COMM_COLL_NODEs without comm_type"));
  CHECK(has_note(imported, "2 COMP_NODEs named as NCCL kernels kept as compute"));
  REQUIRE(p.ops_of(0).size() == 3);
  const auto& wrapper = p.ops_of(0)[0];
  CHECK(wrapper.stream == st::Stream::host);
  REQUIRE(std::holds_alternative<st::Compute>(wrapper.work));
  CHECK(std::holds_alternative<st::Collective>(p.ops_of(0)[1].work));
  // 30 us on the host, then the all-reduce, then 20 us of the measured NCCL kernel.
  const auto t = sim::simulate(p, dgx_a100());
  REQUIRE(t.completed);
  CHECK(iteration_time(t) == Time::us(50) + lone_all_reduce({0, 1}, 1048576));

  // Without a duration the wrapper is skipped; the collective still runs.
  const auto bare =
      traces::import_chakra_buffers({rank(false), rank(false)}, std::nullopt, "old", true);
  CHECK(has_note(bare, "2 without a duration skipped"));
  CHECK(iteration_time(sim::simulate(bare.program, dgx_a100())) ==
        Time::us(20) + lone_all_reduce({0, 1}, 1048576));

  // A GPU collective without comm_type is still an error that says what is missing.
  CHECK_THROWS_WITH_AS(
      traces::import_chakra_buffers(
          {json_rank({"{\"id\": \"1\", \"name\": \"x\", \"type\": \"COMM_COLL_NODE\"}\n"})},
          std::nullopt, "gpu", true),
      doctest::Contains("gpu.0.json: node 1: a COMM_COLL_NODE on the GPU"), traces::TraceError);
}

TEST_CASE(
    "Chakra: ctrl_deps on nodes the converter dropped, or that close a cycle, are ignored with "
    "a note (Chakra's feeder orders by data_deps); a data_deps on a missing node stays an "
    "error") {
  // As in Chakra's own feeder test trace (tests/data/feeder_tests_trace.tar.gz): ops whose
  // parent, the profiler's thread node 3, was not converted keep "ctrl_deps: 3".
  const std::string rank =
      json_rank({comp(216, ", \"ctrlDeps\": [\"3\"]"), comp(217,
                                                            ", \"ctrlDeps\": [\"3\"], "
                                                            "\"dataDeps\": [\"216\"]")});
  const auto imported = traces::import_chakra_buffers({rank}, std::nullopt, "feeder", true);
  CHECK(has_note(imported, "2 ctrl_deps on nodes the trace does not have ignored"));
  REQUIRE(imported.program.ops_of(0).size() == 2);
  CHECK(iteration_time(sim::simulate(imported.program, dgx_a100())) == Time::us(20));
  // The same trace's CPU op aten::mul (3317) lists its own GPU kernel (3318), which has a data
  // dependency on it, in ctrl_deps: a cycle for anyone who orders by both. Ignored, noted.
  const std::string inverse = json_rank(
      {comp(3317, ", \"ctrlDeps\": [\"3318\"]"), comp(3318, ", \"dataDeps\": [\"3317\"]")});
  const auto kept = traces::import_chakra_buffers({inverse}, std::nullopt, "feeder", true);
  CHECK(has_note(kept, "1 ctrl_deps that would close a dependency cycle ignored"));
  CHECK(iteration_time(sim::simulate(kept.program, dgx_a100())) == Time::us(20));
  CHECK_THROWS_WITH_AS(
      traces::import_chakra_buffers({json_rank({comp(216, ", \"dataDeps\": [\"3\"]")})},
                                    std::nullopt, "feeder", true),
      doctest::Contains("data_deps names node 3, which the trace does not have"),
      traces::TraceError);
}
