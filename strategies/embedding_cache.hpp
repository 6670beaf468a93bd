// A frequency-aware GPU software cache for embedding tables (Colossal-AI's CachedEmbeddingBag:
// Fang et al., "Frequency-aware Software Cache for Large Recommendation System Embeddings",
// arXiv:2208.05321). The full tables live in host memory; each GPU keeps `capacity` rows in a
// cache on the device; a lookup of a row that is not cached moves it host -> device over PCIe
// (evicting a cached row, written back device -> host since training changed it).
//
// The hit rate is computed, not assumed: the cache is simulated on sampled id streams
// (seeded, deterministic: the same spec gives the same figures on every machine) drawn from
// the table's id distribution, after a warm-up, by the policy the run names:
// - frequency: Colossal-AI's frequency-aware cache. Warm-up loads the rows the dataset's id
//   statistics rank hottest (the top `capacity` ids of the distribution), and a miss evicts the
//   cached row with the lowest dataset frequency. On a static distribution its steady-state
//   hit rate is the probability mass of the top-capacity ids.
// - lfu: least frequently used by the counts seen so far in the stream (no prior statistics):
//   starts empty, evicts the row with the fewest observed lookups (ties: the least recent).
// - lru: least recently used.
//
// Units: capacity in rows (from a fraction of a table's rows or bytes at the row size); rates
// in [0, 1]; traffic in rows per batch (the lowering multiplies by the row's bytes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "hw_models/config_reader.hpp"
#include "hw_models/units.hpp"

namespace stratasim::strategies {

/// How ids of one table are drawn, the hottest id first (id k, 0-based, is the k-th most
/// frequent): uniform over the rows; Zipf, P(k) proportional to 1 / (k + 1)^exponent,
/// exponent > 0; or a measured histogram, relative frequencies of the hottest ids (the ids
/// past its end share what the histogram's last bin has, each, as a flat tail).
enum class IdDistributionKind : std::uint8_t { uniform, zipf, histogram };

struct IdDistribution {
  IdDistributionKind kind = IdDistributionKind::uniform;
  double exponent = 1.0;        // zipf only, > 0
  std::vector<double> weights;  // histogram only: non-negative, not all zero, hottest first
  std::filesystem::path file;   // histogram only: where the weights were read from (reports)
};

enum class CachePolicy : std::uint8_t { frequency, lfu, lru };
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
  /// empty: the default).
  IdDistribution distribution;
  std::vector<std::optional<IdDistribution>> per_table;
  /// The simulated stream: `warmup_batches` batches not counted, then `measure_batches`
  /// batches counted; each batch draws the table's lookups of one iteration on one GPU (capped
  /// at `max_lookups_per_batch`, the stream then being a uniform subsample: the rates hold).
  std::int64_t warmup_batches = 8;
  std::int64_t measure_batches = 32;
  std::int64_t max_lookups_per_batch = 65536;
  std::uint64_t seed = 1;
};

/// The simulated cache of one table on one GPU.
struct CacheStats {
  std::int64_t capacity_rows = 0;
  double hit_rate = 0;             // hits / lookups over the measured batches
  double misses_per_batch = 0;     // rows moved host -> device per batch (unique per batch)
  double evictions_per_batch = 0;  // rows written back device -> host per batch
};

/// Simulates a cache of `capacity_rows` rows over a table of `rows` rows, `lookups_per_batch`
/// ids a batch drawn from `dist` (spec gives the policy, batches, cap and seed; `table` salts
/// the seed so that tables draw different streams). capacity_rows >= rows: every lookup hits.
CacheStats simulate_cache(std::int64_t rows, std::int64_t capacity_rows,
                          std::int64_t lookups_per_batch, const IdDistribution& dist,
                          const EmbeddingCacheSpec& spec, int table = 0);

/// The probability mass of the `k` hottest of `rows` ids under `dist`: the steady-state hit
/// rate of a cache that holds exactly those (the frequency policy on a static distribution).
double top_mass(std::int64_t rows, std::int64_t k, const IdDistribution& dist);

/// Reads the `embedding_cache` section (capacity "1.5%" or a fraction or "4 GiB"; policy;
/// distribution {"type": "uniform" | "zipf" (exponent) | "histogram" (file, relative to the
/// experiment file)}; per_table; warmup_batches, measure_batches, max_lookups_per_batch, seed).
/// Errors name the path and what was expected (config::ConfigError).
EmbeddingCacheSpec read_embedding_cache(config::ObjectReader r);

}  // namespace stratasim::strategies
