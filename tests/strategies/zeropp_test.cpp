// ZeRO++ (Wang et al., arXiv:2306.10209) as options of ZeRO-3 (ZeroSettings in
// strategies/lowering/pipeline_spec.hpp): what qwZ, hpZ and qgZ lower to, checked against hand
// formulas, the same Program from a DeepSpeed config as from the typed keys, and the errors of
// settings that cannot work.
//
// The setting: GPT-3 1.7B (24 layers) on two DGX A100 nodes (8 GPUs each), tp 1, dp 16, one
// microbatch. Quantised bytes by hand: int8 is 1 byte per element plus one fp32 scale per block
// of 8,000 elements (DeepSpeed's CUDAQuantizer target_group_size); int4 half a byte.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "strategies/foreign_inputs.hpp"
#include "strategies/lowering.hpp"
#include "strategies/lowering/pipeline_spec.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using stratasim::testing::cli;
using stratasim::testing::configs_dir;

namespace {

const auto kExperiment = configs_dir() / "experiments/gpt3-1.7b-a100-8.json";

std::vector<Override> two_nodes(std::vector<Override> more = {}) {
  std::vector<Override> o = {cli("cluster.nodes", 2), cli("parallelism.dp", 16),
                             cli("parallelism.zero", 3), cli("training.global_batch", 16)};
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

Program lowered(const std::vector<Override>& overrides) {
  return lower(load_experiment(kExperiment, overrides));
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// By hand: ceil(n bits / 8) bytes and 4 bytes per started block of 8,000.
std::int64_t quantized(std::int64_t n, int bits) {
  return (n * bits + 7) / 8 + 4 * ((n + 7999) / 8000);
}

// Every collective of rank 0 whose label starts with `prefix`: label suffix -> op.
std::map<std::string, const Op*> collectives(const Program& p, const std::string& prefix,
                                             Phase phase) {
  std::map<std::string, const Op*> found;
  for (const Op& op : p.ops_of(0)) {
    if (!std::holds_alternative<Collective>(op.work) || op.phase != phase) continue;
    const std::string& label = p.label_of(op);
    // "param all-gather " is not "param all-gather (hpz) ".
    if (starts_with(label, prefix) && label[prefix.size()] != '(') {
      found.emplace(label.substr(prefix.size()), &op);
    }
  }
  return found;
}

std::vector<std::int32_t> group_of(const Program& p, const Op& op) {
  return p.groups()[std::get<Collective>(op.work).group].ranks;
}

Bytes initial(const Program& p, MemoryCategory category) {
  Bytes total(0);
  for (const ResidentMemory& m : p.initial_memory(0)) {
    if (m.category == category && m.tier == MemoryTier::device) total += m.bytes;
  }
  return total;
}

}  // namespace

TEST_CASE("qwZ: parameter all-gathers move int8 weights and scales, between two kernels") {
  const Program plain = lowered(two_nodes());
  const Program qwz = lowered(two_nodes({cli("parallelism.zero_quantized_weights", true)}));
  const auto dense = collectives(plain, "param all-gather ", Phase::forward);
  const auto gathers = collectives(qwz, "param all-gather (int8) ", Phase::forward);
  REQUIRE(dense.size() >= 24);  // the layers, the embedding, the head
  REQUIRE(gathers.size() == dense.size());
  CHECK(collectives(qwz, "param all-gather ", Phase::forward).empty());
  for (const auto& [unit, op] : dense) {
    CAPTURE(unit);
    REQUIRE(gathers.count(unit) == 1);
    const Collective& c = std::get<Collective>(gathers.at(unit)->work);
    // bf16 gathers move 2 bytes per parameter: P from the dense gather.
    const std::int64_t P = std::get<Collective>(op->work).bytes.count() / 2;
    const std::int64_t S = (P + 15) / 16;  // the rank's shard
    CHECK(c.bytes.count() == 16 * quantized(S, 8));
    CHECK(c.dtype == DType::fp8);
    CHECK(group_of(qwz, *gathers.at(unit)).size() == 16);
  }
  // Every gather is preceded by the quantisation of the shard (reads 2 S, writes S + scales)
  // and followed by the dequantisation of the unit (reads the gathered bytes, writes 2 P).
  int quantize = 0, dequantize = 0;
  for (const Op& op : qwz.ops_of(0)) {
    const std::string& label = qwz.label_of(op);
    if (!std::holds_alternative<Compute>(op.work) || op.phase != Phase::forward) continue;
    const bool q = starts_with(label, "param quantize "),
               d = starts_with(label, "param dequantize ");
    if (!q && !d) continue;
    const std::string unit = label.substr(q ? 15 : 17);
    REQUIRE(dense.count(unit) == 1);
    const std::int64_t P = std::get<Collective>(dense.at(unit)->work).bytes.count() / 2;
    const std::int64_t S = (P + 15) / 16;
    const auto& kernels = qwz.kernels_of(std::get<Compute>(op.work));
    REQUIRE(kernels.size() == 1);
    const auto& e = std::get<Elementwise>(kernels[0].work);
    CHECK(op.stream == Stream::dp_comm);
    if (q) {
      ++quantize;
      CHECK(e.bytes_read.count() == 2 * S);
      CHECK(e.bytes_written.count() == quantized(S, 8));
    } else {
      ++dequantize;
      CHECK(e.bytes_read.count() == 16 * quantized(S, 8));
      CHECK(e.bytes_written.count() == 2 * P);
    }
  }
  CHECK(quantize == static_cast<int>(dense.size()));
  CHECK(dequantize == static_cast<int>(dense.size()));
}

TEST_CASE("hpZ: backward gathers within the node's 8 ranks, the secondary partition held") {
  const auto hpz = two_nodes({cli("parallelism.zero_hpz_partition_size", 8)});
  const Program plain = lowered(two_nodes());
  const Program p = lowered(hpz);
  const auto forward = collectives(p, "param all-gather ", Phase::forward);
  const auto backward = collectives(p, "param all-gather (hpz) ", Phase::backward);
  REQUIRE(!forward.empty());
  REQUIRE(backward.size() == forward.size());
  CHECK(collectives(p, "param all-gather ", Phase::backward).empty());
  for (const auto& [unit, op] : backward) {
    CAPTURE(unit);
    // Ranks 0-7: rank 0's node (tp 1, dp index = rank).
    CHECK(group_of(p, *op) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
    CHECK(std::get<Collective>(op->work).bytes ==
          std::get<Collective>(forward.at(unit)->work).bytes);
    CHECK(group_of(p, *forward.at(unit)).size() == 16);
  }
  // The secondary partition: ceil(P / 8) bf16 parameters more from the start, P the rank's
  // stage's parameters.
  const std::int64_t P = pipeline_spec(load_experiment(kExperiment, hpz)).stages[0].parameters;
  CHECK(initial(p, MemoryCategory::parameters) - initial(plain, MemoryCategory::parameters) ==
        Bytes((P + 7) / 8 * 2));
  // With qwZ the secondary copy is int8 and the backward gathers move it quantised.
  auto both = hpz;
  both.push_back(cli("parallelism.zero_quantized_weights", true));
  const Program q = lowered(both);
  CHECK(initial(q, MemoryCategory::parameters) - initial(plain, MemoryCategory::parameters) ==
        Bytes(quantized((P + 7) / 8, 8)));
  const auto dense = collectives(plain, "param all-gather ", Phase::backward);
  const auto int8 = collectives(q, "param all-gather (hpz int8) ", Phase::backward);
  REQUIRE(int8.size() == dense.size());
  for (const auto& [unit, op] : int8) {
    const std::int64_t units = std::get<Collective>(dense.at(unit)->work).bytes.count() / 2;
    CHECK(std::get<Collective>(op->work).bytes.count() == 8 * quantized((units + 7) / 8, 8));
    CHECK(group_of(q, *op).size() == 8);
  }
}

TEST_CASE("qgZ: gradient buckets reduced by int4 all-to-alls within and across nodes") {
  const auto overrides = two_nodes({cli("parallelism.zero_quantized_gradients", true)});
  const Program plain = lowered(two_nodes());
  const Program p = lowered(overrides);
  const std::int64_t g =
      size_of(model_state_format(load_experiment(kExperiment, overrides)).grad_dtype);
  const auto dense = collectives(plain, "grad reduce-scatter bucket ", Phase::other);
  REQUIRE(!dense.empty());
  CHECK(collectives(p, "grad reduce-scatter bucket ", Phase::other).empty());
  const auto intra = collectives(p, "grad intra-node all-to-all (qgZ int4) bucket ", Phase::other);
  const auto inter = collectives(p, "grad inter-node all-to-all (qgZ int4) bucket ", Phase::other);
  // One microbatch: each bucket reduced once.
  REQUIRE(intra.size() == dense.size());
  REQUIRE(inter.size() == dense.size());
  for (const auto& [bucket, op] : dense) {
    CAPTURE(bucket);
    const std::int64_t N = std::get<Collective>(op->work).bytes.count() / g;
    const Collective& a = std::get<Collective>(intra.at(bucket)->work);
    const Collective& b = std::get<Collective>(inter.at(bucket)->work);
    CHECK(a.kind == CollectiveKind::all_to_all);
    CHECK(a.bytes.count() == quantized(N, 4));
    CHECK(b.bytes.count() == quantized((N + 7) / 8, 4));
    CHECK(group_of(p, *intra.at(bucket)) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
    CHECK(group_of(p, *inter.at(bucket)) == std::vector<std::int32_t>{0, 8});
    // int4 against the bf16 gradients: a quarter of the bytes within the node, and across
    // nodes an eighth of that (plus scales, under 0.1%).
    CHECK(a.bytes.count() < N * g / 4 + N * g / 1000);
    CHECK(b.bytes.count() < N * g / 32 + N * g / 1000);
  }
}

TEST_CASE("ZeRO++ from a DeepSpeed config lowers to the Program of the typed keys") {
  const auto ds = deepspeed_from_text(R"({"zero_optimization": {
      "stage": 3, "zero_hpz_partition_size": 8, "zero_quantized_weights": true,
      "zero_quantized_gradients": true}})",
                                      "ds.json");
  std::vector<Override> from_ds = {cli("cluster.nodes", 2), cli("parallelism.dp", 16),
                                   cli("training.global_batch", 16)};
  from_ds.insert(from_ds.begin(), ds.overrides.begin(), ds.overrides.end());
  const auto typed = two_nodes({cli("training.framework", "deepspeed"),
                                cli("parallelism.zero_hpz_partition_size", 8),
                                cli("parallelism.zero_quantized_weights", true),
                                cli("parallelism.zero_quantized_gradients", true)});
  const Experiment a = load_experiment(kExperiment, from_ds);
  const Experiment b = load_experiment(kExperiment, typed);
  CHECK(a.parallelism.zero_hpz_partition_size == 8);
  CHECK(a.parallelism.zero_quantized_weights);
  CHECK(a.parallelism.zero_quantized_gradients);
  const Program pa = lower(a), pb = lower(b);
  // Every rank's collectives meet their group's (strategies/matching.hpp): throws otherwise.
  CHECK_NOTHROW(validate(pa));
  REQUIRE(pa.op_count() == pb.op_count());
  REQUIRE(pa.op_count() > 0);
  for (OpId i = 0; i < pa.op_count(); ++i) {
    const Op &x = pa.op(i), &y = pb.op(i);
    REQUIRE(pa.label_of(x) == pb.label_of(y));
    CHECK(x.work.index() == y.work.index());
    if (const auto* c = std::get_if<Collective>(&x.work)) {
      const Collective& d = std::get<Collective>(y.work);
      CHECK(c->bytes == d.bytes);
      CHECK(pa.groups()[c->group].ranks == pb.groups()[d.group].ranks);
    }
  }
  CHECK(initial(pa, MemoryCategory::parameters) == initial(pb, MemoryCategory::parameters));
  // No "not modelled" note any more.
  for (const std::string& note : ds.notes) CHECK(note.find("not modelled") == std::string::npos);
}

TEST_CASE("bad ZeRO++ settings are errors at their key, the DeepSpeed key named") {
  auto error = [](const std::vector<Override>& o) {
    return testing::experiment_error(kExperiment, o);
  };
  SUBCASE("hpZ's partition size must divide dp") {
    const auto e = error(two_nodes({cli("parallelism.zero_hpz_partition_size", 3)}));
    CHECK(e.path() == "parallelism.zero_hpz_partition_size");
    CHECK(std::string(e.message()).find("must divide the data-parallel degree") !=
          std::string::npos);
  }
  SUBCASE("ZeRO++ needs stage 3") {
    for (const char* key :
         {"zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients"}) {
      CAPTURE(key);
      const std::string path = std::string("parallelism.") + key;
      const auto e =
          error({cli("parallelism.zero", 2),
                 cli(path, std::string(key) == "zero_hpz_partition_size" ? nlohmann::json(8)
                                                                         : nlohmann::json(true))});
      CHECK(e.path() == path);
      CHECK(std::string(e.message()).find("needs parallelism.zero 3") != std::string::npos);
    }
  }
  SUBCASE("from a DeepSpeed config, the error names the file and its key") {
    const auto ds = deepspeed_from_text(
        R"({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 8}})", "ds.json");
    const auto e = error(ds.overrides);
    CHECK(e.path() == "parallelism.zero_hpz_partition_size");
    CHECK(e.source().find("ds.json (zero_optimization.zero_hpz_partition_size)") !=
          std::string::npos);
    const auto bad = deepspeed_from_text(
        R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}})", "ds.json");
    std::vector<Override> o = {cli("cluster.nodes", 2), cli("parallelism.dp", 16),
                               cli("training.global_batch", 16)};
    o.insert(o.begin(), bad.overrides.begin(), bad.overrides.end());
    CHECK(error(o).source().find("zero_optimization.zero_hpz_partition_size") != std::string::npos);
  }
  SUBCASE("a DeepSpeed value of the wrong type") {
    CHECK_THROWS_AS(
        deepspeed_from_text(R"({"zero_optimization": {"zero_quantized_weights": 2}})", "ds.json"),
        config::ConfigError);
  }
}
