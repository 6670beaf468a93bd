// DLRM lowering: one training iteration of hybrid parallelism (strategies/dlrm.hpp), as TorchRec
// and Colossal-AI run it. docs/recommendation.md gives every formula used here.
//
// Per rank and microbatch of m samples (N GPUs, the global microbatch N m):
//   forward   embedding lookup of the rank's shards (one fused kernel, FBGEMM's TBE), the
//             pooled embeddings' exchange (tp_comm stream), bottom MLP, interaction, top MLP, loss;
//   backward  top MLP, interaction, the gradients' exchange back, bottom MLP (overlapping it),
//             the embedding backward (scatter of the pooled gradients into row gradients) and the
//             sparse update of the rows touched;
// then the MLPs' gradients all-reduced in buckets (dp_comm, overlapped with the last backward
// as DDP does) and the dense optimizer step. With an embedding cache, each microbatch's missed
// rows are copied host -> device on the copy stream (evicted rows device -> host first) after the
// previous microbatch's lookup, and its lookup waits for them: the copies of microbatch i + 1
// overlap the compute of microbatch i (Colossal-AI's prefetch of the next batch); the first
// microbatch's copies run at the iteration's start, once the previous iteration's updates are
// done (Colossal-AI's cache update before the forward), so with one microbatch they are exposed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "strategies/dlrm.hpp"
#include "strategies/embedding_cache.hpp"
#include "strategies/optimizer.hpp"

namespace stratasim::strategies {

namespace {

// ---- The plan: what each rank holds and moves.

// One rank's part of one table.
struct Shard {
  int table = 0;
  std::int64_t rows = 0;      // rows held
  int dim = 0;                // columns held
  std::int64_t lookups = 0;   // ids looked up per microbatch
  std::int64_t outputs = 0;   // pooled vectors written per microbatch
  std::int64_t touched = 0;   // distinct rows updated per microbatch
  std::int64_t capacity = 0;  // rows on the device (rows, unless cached)
  bool cached = false;
  CacheStats cache;
};

struct Plan {
  int gpus = 1;
  std::int64_t micro = 1;         // samples per microbatch per GPU
  std::int64_t microbatches = 1;  // per iteration
  std::int64_t emb_bytes = 4;     // embedding element size
  std::int64_t state_bytes = 0;   // sparse optimizer state bytes per element
  std::vector<std::vector<Shard>> ranks;
  CollectiveKind forward_kind = CollectiveKind::all_to_all;
  CollectiveKind backward_kind = CollectiveKind::all_to_all;
  Bytes exchange;  // bytes of each pooled-embedding exchange (forward and backward)
};

// Expected distinct rows among n ids drawn uniformly from r rows: r (1 - (1 - 1/r)^n).
std::int64_t expected_distinct(std::int64_t r, std::int64_t n) {
  if (r <= 1 || n == 0) return std::min(r, n);
  const double d = static_cast<double>(r) *
                   -std::expm1(static_cast<double>(n) * std::log1p(-1.0 / static_cast<double>(r)));
  return std::min<std::int64_t>(std::llround(d), std::min(r, n));
}

Shard make_shard(int table, std::int64_t rows, int dim, std::int64_t lookups,
                 std::int64_t outputs) {
  Shard s;
  s.table = table;
  s.rows = rows;
  s.dim = dim;
  s.lookups = lookups;
  s.outputs = outputs;
  s.touched = expected_distinct(rows, lookups);
  s.capacity = rows;
  return s;
}

// Table-wise: a GPU looks its tables up for the whole global microbatch (N m samples). Row-wise:
// GPU g holds rows / N rows (one more for g < rows mod N) of every table and, ids hashed evenly
// over the shards, gets m x pooling of the global microbatch's ids, writing partial sums for all
// N m samples. Column-wise: dim / N columns of every row of every table, all N m samples' ids.
std::vector<Shard> shards_of(const DlrmModel& m, EmbeddingSharding sharding, int gpus, int rank,
                             std::int64_t micro, const std::vector<std::vector<int>>& placement) {
  std::vector<Shard> shards;
  const std::int64_t samples = micro * gpus;
  for (std::size_t i = 0; i < m.tables.size(); ++i) {
    const EmbeddingTable& t = m.tables[i];
    const int ti = static_cast<int>(i);
    if (sharding == EmbeddingSharding::table) {
      const auto& mine = placement[static_cast<std::size_t>(rank)];
      if (std::find(mine.begin(), mine.end(), ti) == mine.end()) continue;
      shards.push_back(make_shard(ti, t.rows, t.dim, samples * t.pooling, samples));
    } else if (sharding == EmbeddingSharding::row) {
      const std::int64_t rows = t.rows / gpus + (rank < t.rows % gpus ? 1 : 0);
      shards.push_back(make_shard(ti, rows, t.dim, micro * t.pooling, samples));
    } else {
      shards.push_back(make_shard(ti, t.rows, t.dim / gpus, samples * t.pooling, samples));
    }
  }
  return shards;
}

// The pooled embeddings' exchange per microbatch (bytes as nccl-tests counts them, e the
// embedding element size, d_t the tables' dims):
//   table-wise  all-to-all, slice to each peer m sum_{t on g} d_t e, padded to the largest GPU's
//               (a synchronous all-to-all lasts as its largest slice): N m max_g sum d_t e;
//   row-wise    reduce-scatter of the partial sums of all N m samples: N m sum_t d_t e (its
//               backward an all-gather of the same size);
//   column-wise all-to-all of column slices: N m sum_t (d_t / N) e = m sum_t d_t e.
Bytes exchange_bytes(const DlrmModel& m, const Plan& plan, EmbeddingSharding sharding,
                     const std::vector<std::vector<int>>& placement) {
  std::int64_t dims = 0;
  for (const auto& t : m.tables) dims += t.dim;
  const std::int64_t n = plan.gpus, mb = plan.micro, e = plan.emb_bytes;
  if (sharding == EmbeddingSharding::row) return Bytes(n * mb * dims * e);
  if (sharding == EmbeddingSharding::column) return Bytes(mb * dims * e);
  std::int64_t widest = 0;
  for (const auto& tables : placement) {
    std::int64_t w = 0;
    for (int t : tables) w += m.tables[static_cast<std::size_t>(t)].dim;
    widest = std::max(widest, w);
  }
  return Bytes(n * mb * widest * e);
}

// The text of everything simulate_cache's result depends on: the spec's stream and policy, the
// distribution (a histogram by its length and weights' bits) and the shard.
std::string cache_key(const EmbeddingCacheSpec& spec, const IdDistribution& d, const Shard& s) {
  std::string key = std::to_string(static_cast<int>(spec.policy)) + "/" +
                    std::to_string(spec.warmup_batches) + "/" +
                    std::to_string(spec.measure_batches) + "/" +
                    std::to_string(spec.max_lookups_per_batch) + "/" + std::to_string(spec.seed) +
                    "/" + std::to_string(static_cast<int>(d.kind)) + "/";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%a/", d.exponent);
  key += buf;
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the weights' bits
  for (double w : d.weights) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &w, sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  return key + std::to_string(d.weights.size()) + "/" + std::to_string(h) + "/" +
         std::to_string(s.table) + "/" + std::to_string(s.rows) + "/" + std::to_string(s.capacity) +
         "/" + std::to_string(s.lookups);
}

// simulate_cache, remembered for the process: the report's setup lines and the lowering (and a
// sweep's points, and the ranks of a row- or column-wise table) ask for the same shards. The
// result depends only on the key, so remembering it changes no figure.
CacheStats simulated(const EmbeddingCacheSpec& spec, const IdDistribution& d, const Shard& s) {
  static std::mutex mutex;
  static std::map<std::string, CacheStats> done;
  const std::string key = cache_key(spec, d, s);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto it = done.find(key); it != done.end()) return it->second;
  }
  const CacheStats stats = simulate_cache(s.rows, s.capacity, s.lookups, d, spec, s.table);
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.size() >= 65536) done.clear();  // bounded: a long sweep starts over
  done.emplace(key, stats);
  return stats;
}

// Simulates every cached shard's cache, its rows on the GPU by cache_rows (a fraction of each
// shard's rows, or the GPU's byte budget as one share of all its shards).
void apply_cache(const EmbeddingCacheSpec& spec, Plan& plan) {
  for (auto& shards : plan.ranks) {
    std::vector<std::int64_t> rows, row_bytes;
    for (const auto& s : shards) {
      rows.push_back(s.rows);
      row_bytes.push_back(s.dim * plan.emb_bytes);
    }
    const std::vector<std::int64_t> capacity = cache_rows(spec, rows, row_bytes);
    for (std::size_t i = 0; i < shards.size(); ++i) {
      Shard& s = shards[i];
      s.capacity = capacity[i];
      s.cached = s.capacity < s.rows;
      if (s.cached) s.cache = simulated(spec, spec.distribution_of(s.table), s);
    }
  }
}

Plan make_plan(const Experiment& e) {
  const DlrmModel& m = *e.dlrm;
  Plan plan;
  plan.gpus = e.parallelism.dp;
  plan.micro = e.parallelism.micro_batch;
  plan.microbatches = e.microbatches();
  plan.emb_bytes = size_of(m.embedding_dtype);
  const OptimizerTraits& opt = traits_of(e.training.optimizer);
  plan.state_bytes = std::int64_t{opt.state_tensors} * opt.state_element_bytes;
  const EmbeddingSharding sharding = e.parallelism.embedding_sharding;
  const auto placement = sharding == EmbeddingSharding::table ? table_wise_placement(m, plan.gpus)
                                                              : std::vector<std::vector<int>>{};
  for (int r = 0; r < plan.gpus; ++r) {
    plan.ranks.push_back(shards_of(m, sharding, plan.gpus, r, plan.micro, placement));
  }
  if (sharding == EmbeddingSharding::row) {
    plan.forward_kind = CollectiveKind::reduce_scatter;
    plan.backward_kind = CollectiveKind::all_gather;
  }
  plan.exchange = exchange_bytes(m, plan, sharding, placement);
  if (e.embedding_cache) apply_cache(*e.embedding_cache, plan);
  return plan;
}

// Bytes one cached row moves over PCIe: its weights and its optimizer states.
std::int64_t row_transfer_bytes(const Plan& plan, const Shard& s) {
  return std::int64_t{s.dim} * (plan.emb_bytes + plan.state_bytes);
}

struct CopyBytes {
  Bytes to_device, to_host;
};

// Per microbatch on one rank: misses host -> device, evictions device -> host.
CopyBytes copy_bytes(const Plan& plan, const std::vector<Shard>& shards) {
  double in = 0, out = 0;
  for (const auto& s : shards) {
    if (!s.cached) continue;
    in += s.cache.misses_per_batch * static_cast<double>(row_transfer_bytes(plan, s));
    out += s.cache.evictions_per_batch * static_cast<double>(row_transfer_bytes(plan, s));
  }
  return {Bytes(std::llround(in)), Bytes(std::llround(out))};
}

// ---- Kernels.

void linear_forward(std::vector<Kernel>& k, std::int64_t rows, std::int64_t in, std::int64_t out,
                    DType dt, const std::string& name) {
  k.push_back({Gemm{rows, out, in, 1, dt}, name});
}

// dgrad (rows x in from rows x out) unless the layer's input needs no gradient, and wgrad.
void linear_backward(std::vector<Kernel>& k, std::int64_t rows, std::int64_t in, std::int64_t out,
                     DType dt, const std::string& name, bool dgrad) {
  if (dgrad) k.push_back({Gemm{rows, in, out, 1, dt}, name + ".dgrad"});
  k.push_back({Gemm{in, out, rows, 1, dt}, name + ".wgrad"});
}

Elementwise elementwise(std::int64_t elements, std::int64_t read, std::int64_t written) {
  return Elementwise{elements, Bytes(read), Bytes(written)};
}

std::vector<Kernel> mlp(std::int64_t rows, std::int64_t in, const std::vector<int>& layers,
                        DType dt, const std::string& name, bool backward, bool first_dgrad) {
  std::vector<Kernel> k;
  std::vector<std::int64_t> inputs;
  for (int w : layers) {
    inputs.push_back(in);
    in = w;
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::size_t l = backward ? layers.size() - 1 - i : i;
    const std::string layer = name + "." + std::to_string(l);
    if (backward) {
      linear_backward(k, rows, inputs[l], layers[l], dt, layer, l > 0 || first_dgrad);
    } else {
      linear_forward(k, rows, inputs[l], layers[l], dt, layer);
    }
  }
  return k;
}

// The interaction's kernels for `rows` samples, forward or backward (docs/recommendation.md).
std::vector<Kernel> interaction(const DlrmModel& m, std::int64_t rows, DType dt, bool backward) {
  const std::int64_t e = size_of(dt), d = m.bottom_mlp.back();
  const std::int64_t f = static_cast<std::int64_t>(m.tables.size()) + 1;
  const std::int64_t width = interaction_width(m);
  std::vector<Kernel> k;
  if (m.interaction == Interaction::dot) {
    // Z = X X^T per sample (F x F from F x d); backward dX = (G + G^T) X.
    const Elementwise gather = elementwise(rows * width, rows * f * f * e, rows * width * e);
    if (backward) {
      k.push_back(
          {elementwise(rows * f * f, rows * width * e, rows * f * f * e), "interaction.scatter"});
      k.push_back({Gemm{f, d, f, rows, dt}, "interaction.bmm.dgrad"});
    } else {
      k.push_back({Gemm{f, f, d, rows, dt}, "interaction.bmm"});
      k.push_back({gather, "interaction.tril"});
    }
    return k;
  }
  const std::int64_t x0 = cross_input_width(m);
  k.push_back({elementwise(rows * x0, rows * x0 * e, rows * x0 * e),
               backward ? "interaction.split" : "interaction.cat"});
  for (int l = 0; l < m.cross_layers && m.interaction == Interaction::dcn; ++l) {
    const std::string name = "cross." + std::to_string(l);
    const Elementwise combine = backward
                                    ? elementwise(rows * x0, 3 * rows * x0 * e, 2 * rows * x0 * e)
                                    : elementwise(rows * x0, 3 * rows * x0 * e, rows * x0 * e);
    if (m.cross_rank > 0) {
      if (backward) {
        linear_backward(k, rows, m.cross_rank, x0, dt, name + ".u", true);
        linear_backward(k, rows, x0, m.cross_rank, dt, name + ".v", true);
      } else {
        linear_forward(k, rows, x0, m.cross_rank, dt, name + ".v");
        linear_forward(k, rows, m.cross_rank, x0, dt, name + ".u");
      }
    } else if (backward) {
      linear_backward(k, rows, x0, x0, dt, name + ".w", true);
    } else {
      linear_forward(k, rows, x0, x0, dt, name + ".w");
    }
    k.push_back({combine, name + ".combine"});
  }
  return k;
}

// ---- Emission.

// Activation bytes one microbatch keeps from its forward to its backward on a rank: the lookup's
// pooled outputs, the exchanged embeddings, every MLP layer's and the interaction's outputs.
std::int64_t activation_bytes(const DlrmModel& m, const Plan& plan,
                              const std::vector<Shard>& shards, std::int64_t e) {
  std::int64_t bytes = 0, dims = 0;
  for (const auto& s : shards) bytes += s.outputs * s.dim * plan.emb_bytes;
  for (const auto& t : m.tables) dims += t.dim;
  bytes += plan.micro * dims * plan.emb_bytes;
  std::int64_t widths = m.dense_features + interaction_width(m);
  for (int w : m.bottom_mlp) widths += w;
  for (int w : m.top_mlp) widths += w;
  if (m.interaction == Interaction::dot) {
    const std::int64_t f = static_cast<std::int64_t>(m.tables.size()) + 1;
    widths += f * f;
  }
  if (m.interaction == Interaction::dcn)
    widths += m.cross_layers * (cross_input_width(m) + m.cross_rank);
  return bytes + plan.micro * widths * e;
}

class DlrmEmitter {
 public:
  DlrmEmitter(const Experiment& e, const Plan& plan, Program& program)
      : e_(e),
        m_(*e.dlrm),
        plan_(plan),
        p_(program),
        dt_(e.training.dtype),
        format_(model_state_format(e)) {
    std::vector<std::int32_t> all(static_cast<std::size_t>(plan.gpus));
    for (int r = 0; r < plan.gpus; ++r) all[static_cast<std::size_t>(r)] = r;
    if (plan.gpus > 1) {
      embedding_group_ = p_.add_group(all, "embedding 0");
      dp_group_ = p_.add_group(all, "dp 0");
    }
  }

  void rank(int r) {
    rank_ = r;
    shards_ = &plan_.ranks[static_cast<std::size_t>(r)];
    p_.begin_rank(r);
    initial_memory();
    std::optional<OpId> previous_lookup;
    for (std::int64_t mb = 0; mb < plan_.microbatches; ++mb) {
      const int b = static_cast<int>(mb);
      previous_lookup = forward(b, cache_copies(b, previous_lookup));
      backward(b, mb + 1 == plan_.microbatches);
    }
    dense_step();
  }

 private:
  OpId compute(std::vector<Kernel> kernels, Phase phase, int mb, std::string_view label,
               std::span<const OpId> deps = {}, std::span<const MemoryEffect> effects = {}) {
    OpInfo info{Stream::compute, phase, mb, -1, -1, label};
    return p_.add(Compute{p_.add_kernels(std::move(kernels))}, info, deps, effects);
  }

  OpId exchange(CollectiveKind kind, Phase phase, int mb, std::string_view label, OpId after) {
    OpInfo info{Stream::tp_comm, phase, mb, -1, -1, label};
    const OpId deps[] = {after};
    return p_.add(Collective{kind, m_.embedding_dtype, embedding_group_, plan_.exchange}, info,
                  deps);
  }

  void initial_memory() {
    const std::int64_t dense = dense_parameters(m_);
    const StateBytes sb = state_bytes_per_parameter(format_);
    std::int64_t device_rows = 0, host_rows = 0;  // elements: rows x dim
    for (const auto& s : *shards_) {
      device_rows += s.capacity * s.dim;
      if (s.cached) host_rows += s.rows * s.dim;
    }
    auto add = [&](MemoryCategory c, MemoryTier t, std::int64_t bytes) {
      if (bytes > 0) p_.add_initial_memory(rank_, {c, t, Bytes(bytes)});
    };
    using C = MemoryCategory;
    add(C::parameters, MemoryTier::device, dense * sb.parameters + device_rows * plan_.emb_bytes);
    add(C::gradients, MemoryTier::device, dense * sb.gradients);
    add(C::optimizer_states, MemoryTier::device,
        optimizer_state_bytes(format_, dense).count() + device_rows * plan_.state_bytes);
    add(C::parameters, MemoryTier::host, host_rows * plan_.emb_bytes);
    add(C::optimizer_states, MemoryTier::host, host_rows * plan_.state_bytes);
  }

  // Evictions then misses of microbatch `mb` on the copy stream, after `after` (the previous
  // microbatch's lookup; the first microbatch's at the iteration's start). Returns the host ->
  // device copy, if any.
  std::optional<OpId> cache_copies(int mb, std::optional<OpId> after) {
    const CopyBytes bytes = copy_bytes(plan_, *shards_);
    std::vector<OpId> deps;
    if (after) deps.push_back(*after);
    if (bytes.to_host.count() > 0) {
      deps = {
          copy(Copy{bytes.to_host, MemoryTier::device, MemoryTier::host}, mb, "cache evict", deps)};
    }
    if (bytes.to_device.count() == 0) return std::nullopt;
    return copy(Copy{bytes.to_device, MemoryTier::host, MemoryTier::device}, mb, "cache fetch",
                deps);
  }

  OpId copy(Copy c, int mb, const std::string& label, std::span<const OpId> deps) {
    OpInfo info{Stream::copy, Phase::other, mb, -1, -1, label};
    const std::string kernel = c.to == MemoryTier::host ? "cache.evict" : "cache.fetch";
    return p_.add(Compute{p_.add_kernels({{c, kernel}})}, info, deps);
  }

  std::vector<Kernel> lookup_kernels() const {
    std::int64_t elements = 0, read = 0, written = 0;
    for (const auto& s : *shards_) {
      elements += s.lookups * s.dim;
      read += s.lookups * s.dim * plan_.emb_bytes;
      written += s.outputs * s.dim * plan_.emb_bytes;
    }
    if (elements == 0) return {};
    return {{elementwise(elements, read, written), "embedding.lookup"}};
  }

  // The forward of microbatch `mb`; returns its first op (the lookup, or the bottom MLP on a
  // rank without tables), which holds the microbatch's activations.
  OpId forward(int mb, std::optional<OpId> copied) {
    const std::int64_t act = activation_bytes(m_, plan_, *shards_, size_of(dt_));
    const MemoryEffect hold[] = {
        {Bytes(act), MemoryCategory::activations, MemoryTier::device, false}};
    std::vector<OpId> deps;
    if (copied) deps.push_back(*copied);
    std::vector<Kernel> lookup = lookup_kernels();
    const bool lookups = !lookup.empty();
    std::vector<Kernel> bottom =
        mlp(plan_.micro, m_.dense_features, m_.bottom_mlp, dt_, "bottom", false, false);
    const OpId first =
        lookups ? compute(std::move(lookup), Phase::forward, mb, "embedding lookup", deps, hold)
                : compute(std::move(bottom), Phase::forward, mb, "bottom mlp", deps, hold);
    std::vector<OpId> exchanged;
    if (plan_.gpus > 1)
      exchanged.push_back(
          exchange(plan_.forward_kind, Phase::forward, mb, "embedding exchange", first));
    if (lookups) compute(std::move(bottom), Phase::forward, mb, "bottom mlp");
    compute(interaction(m_, plan_.micro, dt_, false), Phase::forward, mb, "interaction", exchanged);
    std::vector<Kernel> top =
        mlp(plan_.micro, interaction_width(m_), m_.top_mlp, dt_, "top", false, false);
    top.push_back({elementwise(plan_.micro, plan_.micro * size_of(dt_), plan_.micro * 4), "loss"});
    compute(std::move(top), Phase::forward, mb, "top mlp");
    return first;
  }

  void backward(int mb, bool last) {
    std::vector<Kernel> top =
        mlp(plan_.micro, interaction_width(m_), m_.top_mlp, dt_, "top", true, true);
    gradients_ready(compute(std::move(top), Phase::backward, mb, "top mlp bwd"),
                    top_mlp_parameters(m_), last);
    const OpId inter =
        compute(interaction(m_, plan_.micro, dt_, true), Phase::backward, mb, "interaction bwd");
    gradients_ready(inter, cross_parameters(m_), last);
    std::optional<OpId> a2a;
    if (plan_.gpus > 1)
      a2a = exchange(plan_.backward_kind, Phase::backward, mb, "embedding exchange bwd", inter);
    // A GPU without tables ends the microbatch with the bottom MLP: its activations go there.
    const MemoryEffect free_act[] = {{Bytes(-activation_bytes(m_, plan_, *shards_, size_of(dt_))),
                                      MemoryCategory::activations, MemoryTier::device, true}};
    const OpId bottom =
        compute(mlp(plan_.micro, m_.dense_features, m_.bottom_mlp, dt_, "bottom", true, false),
                Phase::backward, mb, "bottom mlp bwd", {},
                shards_->empty() ? std::span<const MemoryEffect>(free_act)
                                 : std::span<const MemoryEffect>());
    gradients_ready(bottom, bottom_mlp_parameters(m_), last);
    if (last) flush_bucket(bottom);
    sparse_update(mb, a2a);
  }

  // The embedding backward (each lookup's pooled gradient added into its row's fp32 gradient)
  // and the sparse optimizer update of the rows touched; frees the microbatch's activations. A
  // GPU without tables has none.
  void sparse_update(int mb, std::optional<OpId> a2a) {
    std::int64_t lookups = 0, touched = 0;
    for (const auto& s : *shards_) {
      lookups += s.lookups * s.dim;
      touched += s.touched * s.dim;
    }
    const std::int64_t act = activation_bytes(m_, plan_, *shards_, size_of(dt_));
    const Bytes grads(touched * 4);
    std::vector<OpId> deps;
    if (a2a) deps.push_back(*a2a);
    if (shards_->empty()) return;
    const MemoryEffect take[] = {{grads, MemoryCategory::workspace, MemoryTier::device, false}};
    compute({{elementwise(lookups, lookups * plan_.emb_bytes, touched * 4), "embedding.backward"}},
            Phase::backward, mb, "embedding bwd", deps, take);
    const MemoryEffect release[] = {
        {-grads, MemoryCategory::workspace, MemoryTier::device, true},
        {Bytes(-act), MemoryCategory::activations, MemoryTier::device, true}};
    OptimizerStep step{touched, e_.training.optimizer, m_.embedding_dtype, false, true};
    compute({{step, "embedding.update"}}, Phase::backward, mb, "embedding update", {}, release);
  }

  // DDP's buckets: gradients of the last microbatch's backward all-reduced once a bucket fills.
  void gradients_ready(OpId op, std::int64_t params, bool last) {
    if (!last || plan_.gpus == 1) return;
    pending_ += params;
    if (e_.parallelism.dp_overlap &&
        Bytes(pending_ * grad_bytes()) >= e_.parallelism.dp_bucket_size) {
      flush_bucket(op);
    }
  }

  std::int64_t grad_bytes() const { return size_of(format_.grad_dtype); }

  void flush_bucket(OpId after) {
    if (pending_ == 0 || plan_.gpus == 1) return;
    const OpId deps[] = {after};
    OpInfo info{Stream::dp_comm, Phase::backward, -1, -1, -1, "dp gradient all-reduce"};
    reduces_.push_back(p_.add(Collective{CollectiveKind::all_reduce, format_.grad_dtype, dp_group_,
                                         Bytes(pending_ * grad_bytes())},
                              info, deps));
    pending_ = 0;
  }

  void dense_step() {
    const bool fp32_grads = size_of(format_.grad_dtype) == 4 && size_of(dt_) < 4;
    OptimizerStep step{dense_parameters(m_), e_.training.optimizer, dt_, false, fp32_grads};
    compute({{step, "optimizer"}}, Phase::optimizer, -1, "optimizer step", reduces_);
    reduces_.clear();
  }

  const Experiment& e_;
  const DlrmModel& m_;
  const Plan& plan_;
  Program& p_;
  DType dt_;
  ModelStateFormat format_;
  std::uint32_t embedding_group_ = 0, dp_group_ = 0;
  int rank_ = 0;
  const std::vector<Shard>* shards_ = nullptr;
  std::int64_t pending_ = 0;
  std::vector<OpId> reduces_;
};

}  // namespace

Program lower_dlrm(const Experiment& e) {
  const Plan plan = make_plan(e);
  Program program(plan.gpus);
  DlrmEmitter emitter(e, plan, program);
  for (int r = 0; r < plan.gpus; ++r) emitter.rank(r);
  program.finish();
  return program;
}

namespace {

std::string count_text(double v) {
  const char* units[] = {"", " K", " M", " G", " T"};
  int u = 0;
  while (std::abs(v) >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.3g%s", v, units[u]);
  return buf;
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * v);
  return buf;
}

std::string_view sharding_name(EmbeddingSharding s) {
  return s == EmbeddingSharding::table ? "table" : s == EmbeddingSharding::row ? "row" : "column";
}

std::string model_line(const DlrmModel& m) {
  std::int64_t rows = 0;
  for (const auto& t : m.tables) rows += t.rows;
  const std::int64_t emb = embedding_parameters(m), dense = dense_parameters(m);
  return m.name + ": " + std::to_string(m.tables.size()) + " tables, " +
         count_text(static_cast<double>(rows)) + " rows, " +
         count_text(static_cast<double>(emb + dense)) + " parameters (" +
         count_text(static_cast<double>(emb)) + " embedding in " +
         std::string(name_of(m.embedding_dtype)) + ", " +
         to_string(Bytes(emb * size_of(m.embedding_dtype))) + "; " +
         count_text(static_cast<double>(dense)) + " dense), interaction " +
         (m.interaction == Interaction::dot   ? "dot"
          : m.interaction == Interaction::cat ? "cat"
                                              : "dcn");
}

std::string parallelism_line(const Experiment& e, const Plan& plan) {
  std::size_t least = plan.ranks.front().size(), most = least;
  for (const auto& r : plan.ranks) {
    least = std::min(least, r.size());
    most = std::max(most, r.size());
  }
  std::string line = "dp " + std::to_string(plan.gpus) + " (MLPs data parallel), embeddings " +
                     std::string(sharding_name(e.parallelism.embedding_sharding)) + "-wise over " +
                     std::to_string(plan.gpus) + " GPUs";
  if (e.parallelism.embedding_sharding == EmbeddingSharding::table) {
    line += " (" + std::to_string(least) + (least == most ? "" : "-" + std::to_string(most)) +
            " tables per GPU)";
  }
  return line + "; " + std::string(name_of(plan.forward_kind)) + " of " + to_string(plan.exchange) +
         " per microbatch each way";
}

std::string training_line(const Experiment& e, const Plan& plan) {
  return "global batch " + std::to_string(e.training.global_batch) + ", micro batch " +
         std::to_string(plan.micro) + " per GPU, " + std::to_string(plan.microbatches) +
         " microbatch(es); optimizer " + std::string(traits_of(e.training.optimizer).name) +
         " (sparse rows and MLPs), MLPs in " + std::string(name_of(e.training.dtype));
}

std::string distribution_text(const IdDistribution& d) {
  if (d.kind == IdDistributionKind::uniform) return "uniform ids";
  if (d.kind == IdDistributionKind::histogram) return "ids from " + d.file.filename().string();
  char buf[48];
  std::snprintf(buf, sizeof buf, "zipf %.3g ids", d.exponent);
  return buf;
}

EmbeddingCacheFigures cache_figures(const Plan& plan) {
  EmbeddingCacheFigures f;
  double lookups = 0, hits = 0;
  for (const auto& shards : plan.ranks) {
    for (const auto& s : shards) {
      lookups += static_cast<double>(s.lookups);
      hits += static_cast<double>(s.lookups) * (s.cached ? s.cache.hit_rate : 1.0);
      f.rows += s.rows;
      f.cached_rows += s.capacity;
    }
    const CopyBytes b = copy_bytes(plan, shards);
    f.busiest_to_device = std::max(f.busiest_to_device, b.to_device * plan.microbatches);
    f.to_device += b.to_device * plan.microbatches;
    f.to_host += b.to_host * plan.microbatches;
  }
  f.hit_rate = lookups > 0 ? hits / lookups : 1.0;
  return f;
}

std::string cache_line(const Experiment& e, const Plan& plan) {
  const EmbeddingCacheSpec& c = *e.embedding_cache;
  const EmbeddingCacheFigures f = cache_figures(plan);
  const hw::HostSpec* host = e.cluster.host ? &*e.cluster.host : nullptr;
  const Bytes most_in = f.busiest_to_device;
  std::string line =
      "capacity " + (c.fraction ? percent(*c.fraction) : to_string(*c.bytes) + " per GPU") + " (" +
      count_text(static_cast<double>(f.cached_rows)) + " of " +
      count_text(static_cast<double>(f.rows)) + " shard rows cached over the GPUs), policy " +
      std::string(name_of(c.policy)) + ", " + distribution_text(c.distribution) + "; hit rate " +
      percent(f.hit_rate) + "; PCIe per iteration " + to_string(f.to_device) + " host->device, " +
      to_string(f.to_host) + " device->host (all GPUs), " + to_string(most_in) +
      " host->device on the busiest GPU";
  if (host != nullptr && host->pcie.bandwidth.bytes_per_second() > 0) {
    line += " (" + to_string(transfer_time(most_in, host->pcie.bandwidth)) + " at " +
            to_string(host->pcie.bandwidth) + " if not overlapped)";
  }
  return line;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> dlrm_setup(const Experiment& e) {
  const Plan plan = make_plan(e);
  std::vector<std::pair<std::string, std::string>> lines;
  lines.emplace_back("model", model_line(*e.dlrm));
  lines.emplace_back("parallelism", parallelism_line(e, plan));
  lines.emplace_back("training", training_line(e, plan));
  if (e.embedding_cache) lines.emplace_back("embedding cache", cache_line(e, plan));
  return lines;
}

std::optional<EmbeddingCacheFigures> embedding_cache_figures(const Experiment& e) {
  if (!e.dlrm || !e.embedding_cache) return std::nullopt;
  return cache_figures(make_plan(e));
}

}  // namespace stratasim::strategies
