// A frequency-aware GPU software cache for embedding tables (Colossal-AI's CachedEmbeddingBag:
// Fang et al., "Frequency-aware Software Cache for Large Recommendation System Embeddings",
// arXiv:2208.05321). The full tables live in host memory; each GPU keeps `capacity` rows in a
// cache on the device; a lookup of a row that is not cached moves it host -> device over PCIe
// (evicting a cached row, written back device -> host since training changed it).
//
// The hit rate is computed, not assumed: the cache is simulated on sampled id streams
// (seeded, deterministic: the same spec gives the same figures on every machine) drawn from
// the table's id distribution, after a warm-up, by the policy the run names.
//
// A batch is handled as the implementation handles it: its unique ids are found; the ids not
// cached are loaded, each once (host -> device), evicting cached rows the batch does not use,
// the policy's least valued first; then every lookup of the batch reads the cache. A lookup
// hits when its row was cached when the batch began. Should a batch use more rows than the
// cache holds (Colossal-AI refuses such a batch; CacheStats::batches_over_capacity counts
// them), the batch's rows still all pass through the cache, and those the policy values least
// leave again after use (write-backs). Policies, by what they evict:
// - frequency: Colossal-AI's frequency-aware cache. Warm-up loads the rows the dataset's id
//   statistics rank hottest (ids 0 .. capacity-1), and a miss evicts the cached row with the
//   lowest dataset frequency (the highest id). On a static distribution its hit rate is the
//   probability mass of the top-capacity ids (top_mass) less what the rows of a batch's cold
//   misses displace for one batch: at most the mass of ids capacity-m .. capacity-1, m the
//   batch's cold misses.
// - lfu: least frequently used (Colossal-AI's LFU): starts empty; a cached row counts its
//   lookups since it was loaded (the count leaves with the row); evicts the fewest, ties the
//   least recently used.
// - lru: least recently used (by the position of a row's last lookup in the stream).
//
// Sampling (O(1) memory per table, whatever its rows): Zipf ids by rejection-inversion
// (Hörmann & Derflinger, "Rejection-inversion to generate variates from monotone discrete
// distributions", ACM TOMACS 6(3), 1996); uniform ids by Lemire's multiply-shift with
// rejection; histogram ids by a binary search in the cumulative weights of the histogram's ids
// and a uniform id of the flat tail. The generator is xoshiro256** (Blackman & Vigna) seeded
// by splitmix64 from `seed` and the table's index; no std:: distribution is used (their
// output differs between standard libraries), so figures depend only on the spec (and on the
// C library's exp, log and pow: identical wherever the same libm runs).
//
// Cost: the frequency policy keeps a bitset of the hottest `capacity` ids and a hash map of
// the colder cached ones (capacity / 8 bytes); lfu and lru a hash map and a 4-ary heap of the
// cached rows (O(capacity), bounded by the ids their warm-up draws). A 40M-row table at 1.5%
// with the default stream: 0.15-0.35 s of CPU (frequency) and 0.4-0.75 s (lfu, lru), Zipf 1.05
// to 0.8 (bench/embedding_cache_bench.cpp).
//
// Units: capacity in rows (from a fraction of a table's rows or bytes at the row size); rates
// in [0, 1]; traffic in rows per batch (the lowering multiplies by the row's bytes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "hw_models/units.hpp"

namespace stratasim::strategies {

/// How ids of one table are drawn, the hottest id first (id k, 0-based, is the k-th most
/// frequent): uniform over the rows; Zipf, P(k) proportional to 1 / (k + 1)^exponent,
/// exponent > 0; or a measured histogram: `weights[k]` is the relative frequency of id k
/// (sorted hottest first when read), and every id past its end weighs what its last
/// (smallest) weight does, as a flat tail (a histogram ending in 0: ids past it never occur).
/// A histogram longer than a table is cut to the table's rows.
enum class IdDistributionKind : std::uint8_t { uniform, zipf, histogram };

struct IdDistribution {
  IdDistributionKind kind = IdDistributionKind::uniform;
  double exponent = 1.0;        // zipf only, > 0
  std::vector<double> weights;  // histogram only: finite, >= 0, not all 0, non-increasing
  std::filesystem::path file;   // histogram only: where the weights were read from (reports)
};

enum class CachePolicy : std::uint8_t { frequency, lfu, lru };
/// "frequency", "lfu", "lru" (as configs write them).
std::string_view name_of(CachePolicy p);

/// The experiment's `embedding_cache` section.
struct EmbeddingCacheSpec {
  /// Rows each table keeps on the device: `fraction` of its rows (in (0, 1]), or what
  /// `bytes` of cache per GPU holds, split over the GPU's tables in proportion to their rows.
  /// Exactly one is set.
  std::optional<double> fraction;
  std::optional<Bytes> bytes;
  CachePolicy policy = CachePolicy::frequency;
  /// The id distribution of every table, unless `per_table` names one for it (per_table[t]
  /// empty, or t past its end: the default). The reader sizes per_table to the highest table
  /// index given + 1; that the index names a table of the model is the DLRM reader's check.
  IdDistribution distribution;
  std::vector<std::optional<IdDistribution>> per_table;
  /// The simulated stream: `warmup_batches` batches not counted (and, for lfu and lru, which
  /// start empty, more until the cache is full, at most kMaxExtraWarmupDraws more ids), then
  /// `measure_batches` batches counted; each batch draws the table's lookups of one iteration on
  /// one GPU, capped at `max_lookups_per_batch`. A capped batch is a uniform subsample of the real
  /// one: its hit rate stands for the real batch's, and its unique missed rows are scaled to the
  /// real batch's size by their expected multiplicity (see simulate_cache).
  std::int64_t warmup_batches = 8;
  std::int64_t measure_batches = 32;
  std::int64_t max_lookups_per_batch = 65536;
  std::uint64_t seed = 1;

  /// The distribution of table `t`.
  const IdDistribution& distribution_of(int t) const;
};

/// The simulated cache of one table on one GPU.
struct CacheStats {
  std::int64_t capacity_rows = 0;          // after clamping to [0, rows]
  double hit_rate = 0;                     // hit lookups / lookups over the measured batches
  double misses_per_batch = 0;             // rows moved host -> device per batch (unique per batch)
  double evictions_per_batch = 0;          // rows written back device -> host per batch
  std::int64_t batches_over_capacity = 0;  // measured batches using more rows than the cache
  /// Whether the cache was full when the measured batches began. Always for frequency (its
  /// warm-up loads it); lfu and lru start empty, and a cache that kMaxExtraWarmupDraws more
  /// draws past the warm-up batches could not fill (a large cache, or a distribution of fewer
  /// ids) is measured while filling: fewer evictions, a lower hit rate than its steady state.
  bool filled = true;
};

/// The most ids drawn past `warmup_batches` to fill an lfu or lru cache.
inline constexpr std::int64_t kMaxExtraWarmupDraws = std::int64_t{1} << 22;

/// The cache rows of each of one GPU's tables (`rows[t]` rows of `row_bytes[t]` bytes each):
/// with `fraction`, round(fraction x rows[t]); with `bytes`, the same share f of every table's
/// rows, f = bytes / sum_t rows[t] x row_bytes[t], rounded down (floor(f x rows[t]): the cache
/// stays within its bytes); clamped to [0, rows[t]]. A byte budget above the tables' bytes
/// gives every table all its rows (refusing it is the caller's check).
/// Throws std::invalid_argument when the sizes differ, a row count is negative or a row size is
/// not positive.
std::vector<std::int64_t> cache_rows(const EmbeddingCacheSpec& spec,
                                     const std::vector<std::int64_t>& rows,
                                     const std::vector<std::int64_t>& row_bytes);

/// Simulates a cache of `capacity_rows` rows (clamped to [0, rows]) over a table of `rows`
/// rows, `lookups_per_batch` ids a batch drawn from `dist` (spec gives the policy, batches, cap
/// and seed; `table` salts the seed so that tables draw different streams). A pure function:
/// calls may run in parallel.
/// capacity_rows >= rows: the table is on the device, every lookup hits, no traffic.
/// lookups_per_batch 0: nothing is looked up: hit rate 1, no traffic.
/// When lookups_per_batch B exceeds spec.max_lookups_per_batch L, each simulated batch draws L
/// ids; a missed lookup of id k then stands for (B / L) (1 - (1 - p_k)^B) / (B p_k) unique
/// rows of the real batch (p_k: the probability of id k; an unbiased estimate of the real
/// batch's unique misses given the cache), and evictions are scaled by the same ratio.
/// Throws std::invalid_argument for rows <= 0, negative lookups, a Zipf exponent <= 0, histogram
/// weights not hottest first (or negative, or all 0) or a spec whose counts are out of range
/// (read_embedding_cache never gives one).
CacheStats simulate_cache(std::int64_t rows, std::int64_t capacity_rows,
                          std::int64_t lookups_per_batch, const IdDistribution& dist,
                          const EmbeddingCacheSpec& spec, int table = 0);

/// The first `count` ids the simulation of table `table` draws from `dist` over `rows` rows
/// with `seed` (the stream simulate_cache consumes, batch after batch): for tests and for
/// inspecting a distribution.
std::vector<std::int64_t> sample_ids(std::int64_t rows, const IdDistribution& dist,
                                     std::int64_t count, std::uint64_t seed, int table = 0);

/// The probability mass of the `k` hottest of `rows` ids under `dist` (k clamped to
/// [0, rows]): the hit rate of a cache that holds exactly those. Zipf sums are exact up to
/// 2000 terms and use the Euler-Maclaurin formula (to the fifth derivative) past them.
double top_mass(std::int64_t rows, std::int64_t k, const IdDistribution& dist);

/// Reads the `embedding_cache` section:
///   "capacity": 0.015 (a fraction in (0, 1]) | "1.5%" (a percentage in (0, 100]) | "4 GiB"
///               (bytes per GPU, > 0);
///   "policy": "frequency" (default) | "lfu" | "lru";
///   "distribution": {"type": "uniform"} | {"type": "zipf", "exponent": > 0} |
///                   {"type": "histogram", "file": path relative to the file that names it};
///                   default uniform;
///   "per_table": {"<table index>": a distribution, ...};
///   "warmup_batches" (>= 0, default 8), "measure_batches" (>= 1, default 32),
///   "max_lookups_per_batch" (>= 1, default 65536), "seed" (>= 0, default 1).
/// A histogram file is a JSON array of numbers (when its first non-blank character is '[') or
/// text with one number per line (blank lines and lines starting with '#' skipped); numbers
/// finite and >= 0, not all 0. Errors name the JSON path, the file (and line) and what was
/// expected (config::ConfigError).
EmbeddingCacheSpec read_embedding_cache(config::ObjectReader r);

}  // namespace stratasim::strategies
