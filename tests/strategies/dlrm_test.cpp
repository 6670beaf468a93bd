// DLRM (strategies/dlrm.hpp, docs/recommendation.md): the shipped models' sizes against their
// published table cardinalities, the pooled embeddings' exchange per sharding against its closed
// form, the sparse update's bytes against the rows a batch touches, and bad settings refused at
// their keys.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiment_helpers.hpp"
#include "strategies/dlrm.hpp"
#include "strategies/optimizer.hpp"
#include "temp_dir.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::testing;

namespace {

// The published cardinalities (configs/models/*.json cite them): Criteo Kaggle's 26 features
// (facebookresearch/dlrm data_utils.py), Criteo Terabyte's under max_ind_range 40,000,000
// (facebookresearch/dlrm, MLPerf DLRM), and MLPerf DLRM-DCNv2's num_embeddings_per_feature
// (mlcommons/training recommendation_v2/torchrec_dlrm).
const std::vector<std::int64_t> kKaggle = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};
const std::vector<std::int64_t> kTerabyte = {
    39884406, 39043,    17289,    7420,     20263,  3,     7120, 1543, 63,
    38532951, 2953546,  403346,   10,       2208,   11938, 155,  4,    976,
    14,       39979771, 25641295, 39664984, 585935, 12972, 108,  36};
const std::vector<std::int64_t> kDcnv2 = {
    40000000, 39060,    17295,    7424,     20265,  3,     7122, 1543, 63,
    40000000, 3067956,  405282,   10,       2209,   11938, 155,  4,    976,
    14,       40000000, 40000000, 40000000, 590152, 12973, 108,  36};

DlrmModel shipped(const std::string& name) {
  auto doc = config::Document::load(configs_dir() / "models" / (name + ".json"));
  return read_dlrm_model(doc, "");
}

std::int64_t sum(const std::vector<std::int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::int64_t{0});
}

// An MLP's parameters: sum over layers of in x out + out.
std::int64_t mlp(std::int64_t in, const std::vector<std::int64_t>& widths) {
  std::int64_t p = 0;
  for (std::int64_t w : widths) {
    p += in * w + w;
    in = w;
  }
  return p;
}

// A small DLRM: `tables` tables of rows 1000 (t + 1), dim 16, pooling 2; bottom 4-32-16, top
// MLP 32-1 on the dot interaction.
nlohmann::json small_model(int tables) {
  nlohmann::json rows = nlohmann::json::array();
  for (int t = 0; t < tables; ++t) rows.push_back(1000 * (t + 1));
  return {{"type", "dlrm"},         {"name", "small"},    {"dense_features", 4},
          {"bottom_mlp", {32, 16}}, {"table_rows", rows}, {"embedding_dim", 16},
          {"pooling", 2},           {"top_mlp", {32, 1}}};
}

// An experiment file in `dir` with `model` on `gpus` GPUs of one DGX A100 node, micro-batch
// 32 per GPU and one microbatch.
std::filesystem::path write_experiment(const TempDir& dir, const nlohmann::json& model, int gpus,
                                       const std::string& sharding, const std::string& optimizer,
                                       nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json e = {
      {"name", "dlrm-test"},
      {"model", model},
      {"cluster", (configs_dir() / "hardware/clusters/dgx-a100-1.json").string()},
      {"parallelism", {{"micro_batch", 32}, {"embedding_sharding", sharding}}},
      {"training", {{"global_batch", 32 * gpus}, {"dtype", "fp32"}, {"optimizer", optimizer}}}};
  for (auto& [k, v] : extra.items()) e[k] = v;
  const auto path = dir.path() / "experiment.json";
  std::ofstream(path) << e.dump(2);
  return path;
}

Experiment load(const std::filesystem::path& file, int gpus) {
  return load_experiment(file, {cli("cluster.devices_per_node", gpus)});
}

struct Exchange {
  CollectiveKind kind;
  std::int64_t bytes = 0;
  int count = 0;
};

// The embedding group's collectives of `rank` in `phase`.
Exchange exchange_of(const Program& p, int rank, Phase phase) {
  Exchange x{CollectiveKind::broadcast};
  for (const Op& op : p.ops_of(rank)) {
    const auto* c = std::get_if<Collective>(&op.work);
    if (c == nullptr || op.phase != phase || p.groups()[c->group].name != "embedding 0") continue;
    x.kind = c->kind;
    x.bytes += c->bytes.count();
    ++x.count;
  }
  return x;
}

const Kernel* kernel_named(const Program& p, int rank, const std::string& name) {
  for (const Op& op : p.ops_of(rank)) {
    const auto* c = std::get_if<Compute>(&op.work);
    if (c == nullptr) continue;
    for (const Kernel& k : p.kernels_of(*c)) {
      if (k.name == name) return &k;
    }
  }
  return nullptr;
}

}  // namespace

TEST_CASE("dlrm: the shipped models' parameters and bytes follow the published cardinalities") {
  // Embedding parameters = sum(rows) x dim; bytes = parameters x 4 (fp32 tables). Dense
  // parameters: the MLPs' in x out + out per layer (bottom from the 13 dense features; top from
  // the interaction: dot, dim + F (F - 1) / 2 with F = 27 features; DCNv2, 27 x 128 = 3456) and
  // DCNv2's 3 low-rank cross layers of 2 x 3456 x 512 + 3456 each.
  struct Case {
    std::string name;
    const std::vector<std::int64_t>* rows;
    std::int64_t published_sum, dim, dense;
  };
  const std::vector<Case> cases = {
      {"dlrm-criteo-kaggle", &kKaggle, 33'762'577, 16,
       mlp(13, {512, 256, 64, 16}) + mlp(16 + 27 * 26 / 2, {512, 256, 1})},
      {"dlrm-criteo-terabyte", &kTerabyte, 187'767'399, 128,
       mlp(13, {512, 256, 128}) + mlp(128 + 27 * 26 / 2, {1024, 1024, 512, 256, 1})},
      {"dlrm-dcnv2-criteo-multihot", &kDcnv2, 204'184'588, 128,
       mlp(13, {512, 256, 128}) + 3 * (2 * 3456 * 512 + 3456) +
           mlp(3456, {1024, 1024, 512, 256, 1})}};
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const DlrmModel m = shipped(c.name);
    REQUIRE(m.tables.size() == 26);
    CHECK(sum(*c.rows) == c.published_sum);
    for (std::size_t t = 0; t < 26; ++t) CHECK(m.tables[t].rows == (*c.rows)[t]);
    CHECK(embedding_parameters(m) == c.published_sum * c.dim);
    CHECK(embedding_parameters(m) * size_of(m.embedding_dtype) == c.published_sum * c.dim * 4);
    CHECK(dense_parameters(m) == c.dense);
  }
  // By hand: Kaggle 540,201,232 embedding parameters (2,160,804,928 bytes), 475,985 dense;
  // Terabyte 24,034,227,072 (96,136,908,288 bytes), 2,368,897 dense; DCNv2 26,135,627,264,
  // 16,044,545 dense.
  CHECK(embedding_parameters(shipped("dlrm-criteo-kaggle")) == 540'201'232);
  CHECK(dense_parameters(shipped("dlrm-criteo-kaggle")) == 475'985);
  CHECK(embedding_parameters(shipped("dlrm-criteo-terabyte")) * 4 == 96'136'908'288);
  CHECK(dense_parameters(shipped("dlrm-criteo-terabyte")) == 2'368'897);
  CHECK(dense_parameters(shipped("dlrm-dcnv2-criteo-multihot")) == 16'044'545);
  // DCNv2's multi-hot pooling, per table.
  const DlrmModel dcn = shipped("dlrm-dcnv2-criteo-multihot");
  CHECK(dcn.tables[20].pooling == 100);
  CHECK(dcn.tables[0].pooling == 3);
}

TEST_CASE("dlrm: the pooled embeddings' exchange per rank equals its closed form per sharding") {
  // N GPUs, m = 32 samples per GPU, T tables of dim d = 16, e = 4 bytes (fp32), one microbatch;
  // sizes as nccl-tests counts them (the whole buffer a member sends or reduces):
  //   table-wise   all-to-all, each GPU sends every peer the pooled vectors of its own tables for
  //                the peer's m samples, padded to the GPU with the most tables (T_max =
  //                ceil(T / N)): N m T_max d e, forward and backward;
  //   row-wise     reduce-scatter of the partial sums of every table for all N m samples:
  //                N m T d e; backward an all-gather of the same size;
  //   column-wise  all-to-all of each GPU's d / N columns for the peers' samples:
  //                N m T (d / N) e = m T d e, forward and backward.
  TempDir dir("dlrm-exchange");
  const std::int64_t m = 32, d = 16, e = 4;
  struct Case {
    std::string sharding;
    int gpus, tables;
    CollectiveKind fwd, bwd;
    std::int64_t bytes;
  };
  const std::vector<Case> cases = {
      {"table", 4, 8, CollectiveKind::all_to_all, CollectiveKind::all_to_all, 4 * m * 2 * d * e},
      {"table", 4, 7, CollectiveKind::all_to_all, CollectiveKind::all_to_all, 4 * m * 2 * d * e},
      {"table", 8, 3, CollectiveKind::all_to_all, CollectiveKind::all_to_all, 8 * m * 1 * d * e},
      {"row", 4, 8, CollectiveKind::reduce_scatter, CollectiveKind::all_gather, 4 * m * 8 * d * e},
      {"column", 4, 8, CollectiveKind::all_to_all, CollectiveKind::all_to_all, m * 8 * d * e},
      {"column", 8, 5, CollectiveKind::all_to_all, CollectiveKind::all_to_all, m * 5 * d * e}};
  for (const auto& c : cases) {
    CAPTURE(c.sharding);
    CAPTURE(c.gpus);
    CAPTURE(c.tables);
    const Experiment x =
        load(write_experiment(dir, small_model(c.tables), c.gpus, c.sharding, "sgd"), c.gpus);
    const Program p = lower_dlrm(x);
    validate(p);
    for (int r = 0; r < c.gpus; ++r) {
      const Exchange fwd = exchange_of(p, r, Phase::forward),
                     bwd = exchange_of(p, r, Phase::backward);
      CHECK(fwd.count == 1);
      CHECK(bwd.count == 1);
      CHECK(fwd.kind == c.fwd);
      CHECK(bwd.kind == c.bwd);
      CHECK(fwd.bytes == c.bytes);
      CHECK(bwd.bytes == c.bytes);
    }
  }
}

TEST_CASE("dlrm: the sparse update moves the rows a batch touches, by the optimizer's states") {
  // Table-wise on 4 GPUs, 8 tables of R = 1000 (t + 1) rows, pooling 2: GPU g's table t is looked
  // up n = N m x 2 = 256 times a microbatch; the rows touched are the expected distinct ids of n
  // uniform draws, R (1 - (1 - 1/R)^n), rounded. The update reads the fp32 row gradient, the
  // weight and the states and writes the weight and the states: per element 4 + 4 + 4 s read and
  // 4 + 4 s written, s the optimizer's fp32 states (sgd 0, adagrad 1, adam 2): 12, 20, 28 bytes.
  TempDir dir("dlrm-sparse");
  const std::vector<std::pair<std::string, std::int64_t>> optimizers = {
      {"sgd", 12}, {"adagrad", 20}, {"adam", 28}};
  for (const auto& [name, per_element] : optimizers) {
    CAPTURE(name);
    const Experiment x = load(write_experiment(dir, small_model(8), 4, "table", name), 4);
    const Program p = lower_dlrm(x);
    const auto placement = table_wise_placement(*x.dlrm, 4);
    for (int r = 0; r < 4; ++r) {
      double touched = 0;
      for (int t : placement[static_cast<std::size_t>(r)]) {
        const double rows = 1000.0 * (t + 1), n = 4 * 32 * 2;
        touched += std::round(rows * (1 - std::pow(1 - 1 / rows, n))) * 16;
      }
      const Kernel* k = kernel_named(p, r, "embedding.update");
      REQUIRE(k != nullptr);
      const auto& step = std::get<OptimizerStep>(k->work);
      CHECK(static_cast<double>(step.params) == touched);
      CHECK(static_cast<double>(optimizer_update_bytes(step).total().count()) ==
            touched * static_cast<double>(per_element));
    }
  }
}

TEST_CASE("dlrm: the data-parallel all-reduces carry every MLP gradient once") {
  // Dense parameters of the small model: bottom 4-32-16 (4 x 32 + 32 + 32 x 16 + 16 = 688),
  // top from 16 + 9 x 8 / 2 = 52: 52 x 32 + 32 + 32 + 1 = 1729; 2417 in all, fp32 gradients.
  TempDir dir("dlrm-dp");
  const Experiment x = load(write_experiment(dir, small_model(8), 4, "table", "sgd"), 4);
  CHECK(dense_parameters(*x.dlrm) == 2417);
  const Program p = lower_dlrm(x);
  for (int r = 0; r < 4; ++r) {
    std::int64_t bytes = 0;
    for (const Op& op : p.ops_of(r)) {
      const auto* c = std::get_if<Collective>(&op.work);
      if (c != nullptr && c->kind == CollectiveKind::all_reduce) {
        CHECK(op.stream == Stream::dp_comm);
        bytes += c->bytes.count();
      }
    }
    CHECK(bytes == 2417 * 4);
  }
}

TEST_CASE("dlrm: a cache of every row lowers to the program without a cache") {
  TempDir dir("dlrm-cache");
  const nlohmann::json full = {{"embedding_cache", {{"capacity", 1.0}}}};
  const nlohmann::json some = {{"embedding_cache", {{"capacity", "5%"}}}};
  const Program none =
      lower_dlrm(load(write_experiment(dir, small_model(8), 4, "table", "sgd"), 4));
  const Program all =
      lower_dlrm(load(write_experiment(dir, small_model(8), 4, "table", "sgd", full), 4));
  const Program part =
      lower_dlrm(load(write_experiment(dir, small_model(8), 4, "table", "sgd", some), 4));
  REQUIRE(none.op_count() == all.op_count());
  for (int r = 0; r < 4; ++r) {
    CHECK(none.initial_memory(r).size() == all.initial_memory(r).size());
    for (std::size_t i = 0; i < none.initial_memory(r).size(); ++i) {
      CHECK(none.initial_memory(r)[i].bytes == all.initial_memory(r)[i].bytes);
      CHECK(none.initial_memory(r)[i].tier == all.initial_memory(r)[i].tier);
    }
  }
  for (std::size_t i = 0; i < none.op_count(); ++i) {
    CHECK(none.label_of(none.ops()[i]) == all.label_of(all.ops()[i]));
  }
  // 5%: copies on the copy stream, the lookup waiting for its fetch, the tables on the host.
  bool fetch = false, host = false;
  for (const Op& op : part.ops_of(0)) {
    if (op.stream == Stream::copy) fetch = true;
  }
  for (const auto& m : part.initial_memory(0)) host = host || m.tier == MemoryTier::host;
  CHECK(fetch);
  CHECK(host);
  CHECK(part.op_count() > none.op_count());
}

TEST_CASE("dlrm: settings that do not apply and impossible shardings are refused at their keys") {
  const auto terabyte = configs_dir() / "experiments/dlrm-criteo-terabyte-a100-8.json";
  auto error = [&](std::vector<Override> o) { return experiment_error(terabyte, o); };
  // Criteo's table 5 has 3 rows: it cannot be split row-wise over 8 GPUs.
  auto rows = error({cli("parallelism.embedding_sharding", "row")});
  CHECK(rows.path() == "parallelism.embedding_sharding");
  CHECK(rows.message().find("3 rows") != std::string::npos);
  // dim 16 does not split over 32 GPUs (the Kaggle model on 32 of them).
  TempDir dir("dlrm-errors");
  std::ifstream kaggle(configs_dir() / "models/dlrm-criteo-kaggle.json");
  const auto file = write_experiment(dir, nlohmann::json::parse(kaggle), 32, "column", "sgd");
  auto columns = experiment_error(file, {cli("cluster.devices_per_node", 32)});
  CHECK(columns.path() == "parallelism.embedding_sharding");
  CHECK(columns.message().find("dim 16") != std::string::npos);
  CHECK(error({cli("parallelism.tp", 2)}).path() == "parallelism.tp");
  CHECK(error({cli("parallelism.zero", 1)}).path() == "parallelism.zero");
  CHECK(error({cli("training.optimizer", "adafactor")}).path() == "training.optimizer");
  // A cache larger than the tables a GPU holds (the largest GPU's share is about 20.4 GB).
  auto cache = error({cli("embedding_cache", nlohmann::json{{"capacity", "64 GiB"}})});
  CHECK(cache.path() == "embedding_cache.capacity");
}

TEST_CASE("dlrm: without micro_batch a GPU trains its whole share of the batch at once") {
  TempDir dir("dlrm-micro");
  nlohmann::json e = {{"name", "dlrm-test"},
                      {"model", small_model(8)},
                      {"cluster", (configs_dir() / "hardware/clusters/dgx-a100-1.json").string()},
                      {"parallelism", nlohmann::json::object()},
                      {"training", {{"global_batch", 4096}, {"optimizer", "sgd"}}}};
  const auto path = dir.path() / "experiment.json";
  std::ofstream(path) << e.dump(2);
  const Experiment x = load(path, 8);
  CHECK(x.parallelism.micro_batch == 4096 / 8);
  CHECK(x.microbatches() == 1);
}

TEST_CASE(
    "dlrm cache: a microbatch's lookup waits for its fetch, which follows the previous lookup") {
  // Two microbatches on 4 GPUs with a 5% cache: on the copy stream, microbatch 0's eviction and
  // fetch start the iteration; microbatch 1's wait for microbatch 0's lookup (so they overlap
  // its exchange, MLPs and backward); each lookup depends on its own microbatch's fetch.
  TempDir dir("dlrm-overlap");
  const nlohmann::json cache = {{"embedding_cache", {{"capacity", "5%"}}}};
  auto file = write_experiment(dir, small_model(8), 4, "table", "sgd", cache);
  const Experiment x = load_experiment(
      file, {cli("cluster.devices_per_node", 4), cli("training.global_batch", 256)});
  REQUIRE(x.microbatches() == 2);
  const Program p = lower_dlrm(x);
  for (int r = 0; r < 4; ++r) {
    OpId fetch[2] = {0, 0}, lookup[2] = {0, 0};
    int fetches = 0, lookups = 0;
    const OpId first = p.first_op(r);
    const auto ops = p.ops_of(r);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const std::string& label = p.label_of(ops[i]);
      if (label == "cache fetch") fetch[fetches++] = first + static_cast<OpId>(i);
      if (label == "embedding lookup") lookup[lookups++] = first + static_cast<OpId>(i);
    }
    REQUIRE(fetches == 2);
    REQUIRE(lookups == 2);
    for (int mb = 0; mb < 2; ++mb) {
      const auto deps = p.deps_of(p.op(lookup[mb]));
      CHECK(std::find(deps.begin(), deps.end(), fetch[mb]) != deps.end());
      CHECK(p.op(fetch[mb]).stream == Stream::copy);
      CHECK(p.op(fetch[mb]).microbatch == mb);
    }
    // Microbatch 1's copies (its eviction first, then its fetch) wait for lookup 0.
    const auto evict_deps = p.deps_of(p.op(fetch[1] - 1));
    CHECK(p.label_of(p.op(fetch[1] - 1)) == "cache evict");
    CHECK(std::find(evict_deps.begin(), evict_deps.end(), lookup[0]) != evict_deps.end());
    CHECK(p.deps_of(p.op(fetch[0] - 1)).empty());
  }
}
