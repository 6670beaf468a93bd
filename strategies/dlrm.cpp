// DLRM: reading the model, checking the experiment, lowering one iteration (strategies/dlrm.hpp;
// docs/recommendation.md has the formulas this file implements).
#include "strategies/dlrm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include "strategies/optimizer.hpp"

namespace stratasim::strategies {

namespace {

std::string number(std::int64_t v) {
  return std::to_string(v);
}

std::string table_path(const std::string& path, std::size_t i) {
  return path + ".tables[" + std::to_string(i) + "]";
}

// ---- Reading.

// A list of positive integers at `key` (MLP widths, table rows).
std::vector<std::int64_t> positive_list(config::ObjectReader& r, std::string_view key,
                                        std::string_view example, bool required = true) {
  if (!r.has(key)) {
    if (required)
      r.fail(key, "missing required key; expected a list such as " + std::string(example));
    return {};
  }
  const nlohmann::json* v = r.document().find(r.path_of(key));
  if (v == nullptr || !v->is_array() || v->empty() ||
      !std::all_of(v->begin(), v->end(), [](const nlohmann::json& x) {
        return x.is_number_integer() && x.get<std::int64_t>() >= 1;
      })) {
    r.fail(key, "expected a non-empty list of positive integers such as " + std::string(example));
  }
  std::vector<std::int64_t> out;
  for (const auto& x : *v) out.push_back(x.get<std::int64_t>());
  return out;
}

std::vector<int> widths(config::ObjectReader& r, std::string_view key, std::string_view example) {
  std::vector<int> out;
  for (std::int64_t w : positive_list(r, key, example)) {
    if (w > (1 << 24)) r.fail(key, "a layer width must be at most 2^24, got " + number(w));
    out.push_back(static_cast<int>(w));
  }
  return out;
}

// `tables`: a list of {rows, dim, pooling} objects, each read from a document of its own whose
// key is "tables[i]" (dotted paths cannot index arrays), its errors raised again at its path.
std::vector<EmbeddingTable> read_table_objects(const config::Document& doc, const std::string& path,
                                               const nlohmann::json& list) {
  std::vector<EmbeddingTable> tables;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string key = "tables[" + std::to_string(i) + "]";
    auto single = config::Document::from_json(nlohmann::json::object({{key, list[i]}}), "table");
    try {
      config::ObjectReader tr(single, key, "an embedding table");
      EmbeddingTable t;
      t.rows = tr.integer_in("rows", 1, std::int64_t{1} << 40);
      t.dim = static_cast<int>(tr.integer_in("dim", 1, 1 << 16));
      t.pooling = static_cast<int>(tr.integer_in_or("pooling", 1, 1 << 20, 1));
      tr.finish();
      tables.push_back(t);
    } catch (const config::ConfigError& e) {
      doc.fail(config::join_path(path, e.path()), e.message());
    }
  }
  return tables;
}

// The compact form: table_rows [...], one embedding_dim, pooling (one number or one per table).
std::vector<EmbeddingTable> read_compact_tables(config::ObjectReader& r) {
  const std::vector<std::int64_t> rows = positive_list(r, "table_rows", "[1460, 583, 10131227]");
  const int dim = static_cast<int>(r.integer_in("embedding_dim", 1, 1 << 16));
  std::vector<std::int64_t> pooling(rows.size(), 1);
  if (r.has("pooling")) {
    const nlohmann::json* v = r.document().find(r.path_of("pooling"));
    if (v != nullptr && v->is_number_integer()) {
      pooling.assign(rows.size(), r.integer_in("pooling", 1, 1 << 20));
    } else {
      pooling = positive_list(r, "pooling", "3 or [3, 2, 1] (one per table)");
      if (pooling.size() != rows.size()) {
        r.fail("pooling", "expected one pooling per table (" +
                              number(static_cast<std::int64_t>(rows.size())) + "), got " +
                              number(static_cast<std::int64_t>(pooling.size())));
      }
    }
  }
  std::vector<EmbeddingTable> tables;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    tables.push_back({rows[i], dim, static_cast<int>(std::min<std::int64_t>(pooling[i], 1 << 20))});
  }
  return tables;
}

std::vector<EmbeddingTable> read_tables(config::Document& doc, const std::string& path,
                                        config::ObjectReader& r) {
  const bool objects = r.has("tables"), compact = r.has("table_rows");
  if (objects == compact) {
    r.fail(objects ? "table_rows" : "tables",
           "give the embedding tables either as \"tables\": [{\"rows\", \"dim\", \"pooling\"}, "
           "...] or "
           "as \"table_rows\": [...] with \"embedding_dim\" (and \"pooling\"), exactly one");
  }
  if (compact) return read_compact_tables(r);
  const nlohmann::json& list = *doc.find(r.path_of("tables"));
  if (!list.is_array() || list.empty()) r.fail("tables", "expected a non-empty list of tables");
  return read_table_objects(doc, path, list);
}

void validate_dlrm(const config::Document& doc, const std::string& path, const DlrmModel& m) {
  const int dim = m.bottom_mlp.back();
  if (m.interaction != Interaction::cat) {
    for (std::size_t i = 0; i < m.tables.size(); ++i) {
      if (m.tables[i].dim != dim) {
        doc.fail(table_path(path, i) + ".dim",
                 "the \"dot\" and \"dcn\" interactions need every table's dim equal to the bottom "
                 "MLP's last width (" +
                     number(dim) + "), got " + number(m.tables[i].dim));
      }
    }
  }
  if (m.interaction == Interaction::dcn && m.cross_layers < 1) {
    doc.fail(config::join_path(path, "cross_layers"),
             "the \"dcn\" interaction needs at least one cross layer");
  }
  if (m.interaction != Interaction::dcn && (m.cross_layers != 0 || m.cross_rank != 0)) {
    doc.fail(config::join_path(path, m.cross_layers != 0 ? "cross_layers" : "cross_rank"),
             "applies to the \"dcn\" interaction only");
  }
}

// ---- Sizes.

std::int64_t mlp_parameters(std::int64_t in, const std::vector<int>& layers) {
  std::int64_t params = 0;
  for (int w : layers) {
    params += in * w + w;
    in = w;
  }
  return params;
}

}  // namespace

std::int64_t cross_input_width(const DlrmModel& m) {
  std::int64_t width = m.bottom_mlp.back();
  for (const auto& t : m.tables) width += t.dim;
  return width;
}

std::int64_t embedding_parameters(const DlrmModel& m) {
  std::int64_t params = 0;
  for (const auto& t : m.tables) params += t.rows * t.dim;
  return params;
}

std::int64_t interaction_width(const DlrmModel& m) {
  if (m.interaction == Interaction::dot) {
    const std::int64_t f = static_cast<std::int64_t>(m.tables.size()) + 1;
    return m.bottom_mlp.back() + f * (f - 1) / 2;
  }
  return cross_input_width(m);
}

std::int64_t cross_parameters(const DlrmModel& m) {
  if (m.interaction != Interaction::dcn) return 0;
  const std::int64_t d = cross_input_width(m);
  const std::int64_t per_layer = m.cross_rank > 0 ? 2 * d * m.cross_rank + d : d * d + d;
  return per_layer * m.cross_layers;
}

std::int64_t bottom_mlp_parameters(const DlrmModel& m) {
  return mlp_parameters(m.dense_features, m.bottom_mlp);
}

std::int64_t top_mlp_parameters(const DlrmModel& m) {
  return mlp_parameters(interaction_width(m), m.top_mlp);
}

std::int64_t dense_parameters(const DlrmModel& m) {
  return bottom_mlp_parameters(m) + cross_parameters(m) + top_mlp_parameters(m);
}

std::vector<std::vector<int>> table_wise_placement(const DlrmModel& m, int gpus) {
  std::vector<int> order(m.tables.size());
  std::iota(order.begin(), order.end(), 0);
  auto bytes = [&](int t) {
    return m.tables[static_cast<std::size_t>(t)].rows * m.tables[static_cast<std::size_t>(t)].dim;
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bytes(a) > bytes(b); });
  const std::size_t cap =
      (m.tables.size() + static_cast<std::size_t>(gpus) - 1) / static_cast<std::size_t>(gpus);
  std::vector<std::vector<int>> placement(static_cast<std::size_t>(gpus));
  std::vector<std::int64_t> load(static_cast<std::size_t>(gpus), 0);
  for (int t : order) {
    std::size_t best = placement.size();
    for (std::size_t g = 0; g < placement.size(); ++g) {
      if (placement[g].size() >= cap) continue;
      if (best == placement.size() || load[g] < load[best]) best = g;
    }
    placement[best].push_back(t);
    load[best] += bytes(t);
  }
  for (auto& tables : placement) std::sort(tables.begin(), tables.end());
  return placement;
}

DlrmModel read_dlrm_model(config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a DLRM model");
  DlrmModel m;
  r.choice("type", {"dlrm"});
  m.name = r.string("name");
  m.source = r.string_or("source", "");
  m.dense_features = static_cast<int>(r.integer_in("dense_features", 1, 1 << 24));
  m.bottom_mlp = widths(r, "bottom_mlp", "[512, 256, 64, 16]");
  m.tables = read_tables(doc, path, r);
  const std::string interaction = r.choice_or("interaction", {"dot", "cat", "dcn"}, "dot");
  m.interaction = interaction == "dot"   ? Interaction::dot
                  : interaction == "cat" ? Interaction::cat
                                         : Interaction::dcn;
  m.cross_layers = static_cast<int>(r.integer_in_or("cross_layers", 1, 1000, 0));
  m.cross_rank = static_cast<int>(r.integer_in_or("cross_rank", 1, 1 << 20, 0));
  m.top_mlp = widths(r, "top_mlp", "[512, 256, 1]");
  m.embedding_dtype =
      *dtype_from_name(r.choice_or("embedding_dtype", {"fp32", "fp16", "bf16"}, "fp32"));
  r.finish();
  validate_dlrm(doc, path, m);
  return m;
}

namespace {

// Settings of the transformer's strategies that a DLRM does not have: named at their key.
void refuse_transformer_settings(const config::Document& doc, const Experiment& e) {
  const auto& p = e.parallelism;
  const std::string why =
      "does not apply to a DLRM model: its MLPs are data parallel over every "
      "GPU and its tables sharded by parallelism.embedding_sharding";
  auto refuse = [&](bool set, const char* key) {
    if (set) doc.fail(key, why);
  };
  refuse(p.tp > 1, "parallelism.tp");
  refuse(p.pp > 1, "parallelism.pp");
  refuse(p.cp > 1, "parallelism.cp");
  refuse(p.ep > 1 || p.etp > 1, "parallelism.ep");
  refuse(p.zero > 0, "parallelism.zero");
  refuse(p.recompute != RecomputeKind::none, "parallelism.recompute");
  refuse(p.offload.any(), "parallelism.offload");
  refuse(p.schedule != ScheduleKind::one_f_one_b || p.virtual_stages > 1, "parallelism.schedule");
  refuse(p.sequence_parallel, "parallelism.sequence_parallel");
  refuse(e.training.fsdp.has_value(), "training.fsdp");
  refuse(e.training.low_precision.has_value(), "training.dtype");
  refuse(distributed_optimizer(e), "training.distributed_optimizer");
  const OptimizerKind k = e.training.optimizer;
  if (k == OptimizerKind::adafactor || k == OptimizerKind::adam8bit) {
    doc.fail("training.optimizer",
             "updates the embedding rows a batch touches, element-wise: sgd, sgd_momentum, "
             "adagrad, rmsprop, adam, adamw or lion, got " +
                 std::string(traits_of(k).name));
  }
}

// A table split over more GPUs than it has rows (row-wise) or columns (column-wise: each GPU
// takes dim / gpus columns, so the dim must be a multiple of the GPU count).
void check_sharding(const config::Document& doc, const Experiment& e,
                    std::vector<std::string>& notes) {
  const DlrmModel& m = *e.dlrm;
  const int gpus = e.parallelism.dp;
  for (std::size_t i = 0; i < m.tables.size(); ++i) {
    const EmbeddingTable& t = m.tables[i];
    const std::string table = "table " + number(static_cast<std::int64_t>(i));
    if (e.parallelism.embedding_sharding == EmbeddingSharding::row && t.rows < gpus) {
      doc.fail("parallelism.embedding_sharding",
               "\"row\" splits every table's rows over the " + number(gpus) + " GPUs, but " +
                   table + " has " + number(t.rows) +
                   " rows; use \"table\" or \"column\" sharding, or fewer GPUs");
    }
    if (e.parallelism.embedding_sharding == EmbeddingSharding::column && t.dim % gpus != 0) {
      doc.fail("parallelism.embedding_sharding",
               "\"column\" splits every table's dim over the " + number(gpus) + " GPUs, but " +
                   table + " has dim " + number(t.dim) + ", not a multiple of " + number(gpus) +
                   "; use \"table\" or \"row\" sharding");
    }
  }
  if (e.parallelism.embedding_sharding == EmbeddingSharding::table &&
      static_cast<std::int64_t>(m.tables.size()) < gpus) {
    notes.push_back(
        "table-wise sharding places " + number(static_cast<std::int64_t>(m.tables.size())) +
        " tables on " + number(gpus) +
        " GPUs: " + number(gpus - static_cast<std::int64_t>(m.tables.size())) + " GPUs hold none");
  }
}

// Bytes of embedding weights on the GPU holding the most (the per-GPU share of the tables).
Bytes largest_shard_bytes(const Experiment& e) {
  const DlrmModel& m = *e.dlrm;
  const int gpus = e.parallelism.dp;
  const std::int64_t elem = size_of(m.embedding_dtype);
  std::int64_t largest = 0;
  if (e.parallelism.embedding_sharding == EmbeddingSharding::table) {
    for (const auto& tables : table_wise_placement(m, gpus)) {
      std::int64_t bytes = 0;
      for (int t : tables)
        bytes += m.tables[static_cast<std::size_t>(t)].rows *
                 m.tables[static_cast<std::size_t>(t)].dim * elem;
      largest = std::max(largest, bytes);
    }
  } else {
    // Row-wise: ceil(rows / gpus) rows on GPU 0; column-wise: dim / gpus columns of every row.
    for (const auto& t : m.tables) {
      largest += e.parallelism.embedding_sharding == EmbeddingSharding::row
                     ? (t.rows + gpus - 1) / gpus * t.dim * elem
                     : t.rows * (t.dim / gpus) * elem;
    }
  }
  return Bytes(largest);
}

void check_cache(const config::Document& doc, const Experiment& e) {
  if (!e.embedding_cache) return;
  const EmbeddingCacheSpec& c = *e.embedding_cache;
  if (!e.cluster.host) {
    doc.fail("embedding_cache",
             "keeps the full tables in host memory and moves rows over PCIe: cluster " +
                 e.cluster.name + " needs a \"host\" section (memory, pcie)");
  }
  const std::int64_t tables = static_cast<std::int64_t>(e.dlrm->tables.size());
  if (static_cast<std::int64_t>(c.per_table.size()) > tables) {
    doc.fail("embedding_cache.per_table",
             "names " + number(static_cast<std::int64_t>(c.per_table.size())) +
                 " tables, but the model has " + number(tables));
  }
  if (c.bytes) {
    const Bytes share = largest_shard_bytes(e);
    if (*c.bytes > share) {
      doc.fail(
          "embedding_cache.capacity",
          "a cache of " + to_string(*c.bytes) +
              " per GPU is larger than the embedding tables a GPU "
              "holds (at most " +
              to_string(share) + " with " +
              std::string(e.parallelism.embedding_sharding == EmbeddingSharding::table ? "table"
                          : e.parallelism.embedding_sharding == EmbeddingSharding::row ? "row"
                                                                                       : "column") +
              "-wise sharding over " + number(e.parallelism.dp) +
              " GPUs); give at most that, or a fraction such as \"1.5%\"");
    }
  }
}

}  // namespace

void check_dlrm_experiment(const config::Document& doc, Experiment& e,
                           std::vector<std::string>& notes) {
  refuse_transformer_settings(doc, e);
  // Without parallelism.micro_batch (nor gradient_accumulation_steps), one microbatch: the GPU's
  // whole share of the batch, as DLRM trains (resolve_batch checked that dp divides it).
  const nlohmann::json* micro = doc.find("parallelism.micro_batch");
  const nlohmann::json* steps = doc.find("training.gradient_accumulation_steps");
  if ((micro == nullptr || micro->is_null()) && (steps == nullptr || steps->is_null())) {
    e.parallelism.micro_batch = static_cast<int>(
        std::min<std::int64_t>(e.training.global_batch / e.parallelism.dp, 1 << 30));
  }
  check_sharding(doc, e, notes);
  check_cache(doc, e);
}

}  // namespace stratasim::strategies
