// The embedding cache's simulation (strategies/embedding_cache.hpp): hit rates against
// independent computations (the direct sum of a Zipf distribution's top-k mass, the uniform
// distribution's C/N, Che's approximation for LRU), the sampler's frequencies, determinism, and
// the errors of the `embedding_cache` section.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>

#include "strategies/embedding_cache.hpp"
#include "temp_dir.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

IdDistribution zipf(double s) {
  IdDistribution d;
  d.kind = IdDistributionKind::zipf;
  d.exponent = s;
  return d;
}

// sum_{k=a}^{b} k^-s by direct summation (small terms first), independent of the library's
// Euler-Maclaurin sums.
double direct_zipf_sum(std::int64_t a, std::int64_t b, double s) {
  double sum = 0;
  for (std::int64_t k = b; k >= a; --k) sum += std::pow(static_cast<double>(k), -s);
  return sum;
}

// The exact top-k mass of Zipf(s) over n ids: sum_{k<=c} k^-s / sum_{k<=n} k^-s.
double direct_top_mass(std::int64_t n, std::int64_t c, double s) {
  return direct_zipf_sum(1, c, s) / direct_zipf_sum(1, n, s);
}

EmbeddingCacheSpec spec_of(CachePolicy policy, std::int64_t warmup, std::int64_t measure) {
  EmbeddingCacheSpec s;
  s.fraction = 0.01;
  s.policy = policy;
  s.warmup_batches = warmup;
  s.measure_batches = measure;
  return s;
}

}  // namespace

TEST_CASE("embedding cache: top_mass equals the direct sum of k^-s") {
  constexpr std::int64_t n = 1'000'000;
  for (double s : {0.5, 0.8, 1.0, 1.05, 2.0}) {
    const double total = direct_zipf_sum(1, n, s);
    for (std::int64_t k : {1, 10, 1999, 2000, 2001, 10'000, 100'000, 999'999}) {
      CAPTURE(s);
      CAPTURE(k);
      CHECK(top_mass(n, k, zipf(s)) ==
            doctest::Approx(direct_zipf_sum(1, k, s) / total).epsilon(1e-10));
    }
    CHECK(top_mass(n, 0, zipf(s)) == 0.0);
    CHECK(top_mass(n, n, zipf(s)) == 1.0);
    CHECK(top_mass(n, 2 * n, zipf(s)) == 1.0);
  }
  IdDistribution uniform;
  CHECK(top_mass(1000, 15, uniform) == doctest::Approx(0.015));
  // Histogram {4, 3, 2, 1} sorted hottest first over 10 rows: ids 4..9 weigh 1 each (the flat
  // tail), total 4+3+2+1+6 = 16; the top 2 hold 7/16, the top 6 hold (10 + 2)/16.
  IdDistribution h;
  h.kind = IdDistributionKind::histogram;
  h.weights = {4, 3, 2, 1};
  CHECK(top_mass(10, 2, h) == doctest::Approx(7.0 / 16));
  CHECK(top_mass(10, 6, h) == doctest::Approx(12.0 / 16));
  // Longer than the table: cut to its 3 rows, total 9, top 1 = 4/9.
  CHECK(top_mass(3, 1, h) == doctest::Approx(4.0 / 9));
}

TEST_CASE("embedding cache: the Zipf sampler's frequencies of the hottest ids are k^-s / H") {
  // n draws; the count of id k is binomial(n, p_k): within 5 standard deviations
  // sqrt(n p (1-p)) (a false failure has probability below 1e-6 per id).
  constexpr std::int64_t draws = 2'000'000;
  for (auto [rows, s] : {std::pair<std::int64_t, double>{1'000'000, 1.05},
                         {1'000'000, 0.8},
                         {40'000'000, 1.05},
                         {100, 2.0}}) {
    CAPTURE(rows);
    CAPTURE(s);
    const auto ids = sample_ids(rows, zipf(s), draws, 7);
    std::map<std::int64_t, std::int64_t> counts;
    std::int64_t outside = 0;
    for (auto id : ids) {
      if (id < 0 || id >= rows) ++outside;
      if (id >= 0 && id < 5) ++counts[id];
    }
    CHECK(outside == 0);
    const double h = direct_zipf_sum(1, rows, s);
    for (std::int64_t k = 0; k < 5; ++k) {
      const double p = std::pow(static_cast<double>(k + 1), -s) / h;
      const double mean = draws * p, sd = std::sqrt(draws * p * (1 - p));
      CAPTURE(k);
      CHECK(std::abs(static_cast<double>(counts[k]) - mean) < 5 * sd);
    }
  }
}

TEST_CASE("embedding cache: histogram and uniform samplers follow their weights") {
  // Histogram {6, 3, 1} over 8 rows: ids 3..7 weigh 1 each (flat tail); total 15.
  IdDistribution h;
  h.kind = IdDistributionKind::histogram;
  h.weights = {6, 3, 1};
  constexpr std::int64_t draws = 300'000;
  const auto ids = sample_ids(8, h, draws, 3);
  std::vector<std::int64_t> counts(8);
  for (auto id : ids) ++counts.at(static_cast<std::size_t>(id));
  const std::vector<double> weights = {6, 3, 1, 1, 1, 1, 1, 1};
  for (std::size_t k = 0; k < 8; ++k) {
    const double p = weights[k] / 15, sd = std::sqrt(draws * p * (1 - p));
    CAPTURE(k);
    CHECK(std::abs(static_cast<double>(counts[k]) - draws * p) < 5 * sd);
  }
  // Uniform over 10 rows: each id 1/10.
  const auto u = sample_ids(10, IdDistribution{}, draws, 3);
  std::vector<std::int64_t> ucounts(10);
  for (auto id : u) ++ucounts.at(static_cast<std::size_t>(id));
  for (auto c : ucounts)
    CHECK(std::abs(static_cast<double>(c) - draws / 10.0) < 5 * std::sqrt(draws * 0.09));
}

TEST_CASE("embedding cache: the frequency policy's hit rate on a Zipf stream is the top-k mass") {
  // Expected (independent of the library): the direct sum sum_{k<=C} k^-s / sum_{k<=N} k^-s.
  // The cache holds C rows when a batch starts, so no more than the top-C mass can hit; a batch
  // of L lookups displaces at most L of the hottest rows (its cold misses stay until the next
  // batch), so no less than the top-(C-L) mass hits. With L = 512 and 256 measured batches
  // (131072 lookups), the sampling standard deviation is at most sqrt(0.25 / 131072) = 0.0014.
  // The bound [top(C-L) - 4 sd, top(C) + 4 sd] lies within 1% of top(C) for these cases.
  constexpr std::int64_t n = 1'000'000;
  auto spec = spec_of(CachePolicy::frequency, 8, 256);
  const double sd = std::sqrt(0.25 / (256 * 512));
  for (double s : {1.05, 0.8}) {
    for (std::int64_t c : {n / 100, n / 10}) {
      CAPTURE(s);
      CAPTURE(c);
      const double exact = direct_top_mass(n, c, s);
      const double lower = direct_top_mass(n, c - 512, s);
      const CacheStats st = simulate_cache(n, c, 512, zipf(s), spec);
      CHECK(st.capacity_rows == c);
      CHECK(std::abs(st.hit_rate - exact) < 0.01);
      CHECK(st.hit_rate <= exact + 4 * sd);
      CHECK(st.hit_rate >= lower - 4 * sd);
      // Every miss is loaded and, the cache being full, evicts one row.
      CHECK(st.evictions_per_batch == doctest::Approx(st.misses_per_batch));
      CHECK(st.batches_over_capacity == 0);
    }
  }
}

TEST_CASE("embedding cache: LFU approaches the top-k mass, LRU stays below it (Che)") {
  // A static (independent-reference) Zipf stream: LFU's counts rank rows by their frequency,
  // so its cache tends to the top-C rows, the set of C rows of highest mass; LRU keeps the
  // recently used instead, a set of lower mass: its hit rate is given by Che's approximation
  // (Che et al., IEEE JSAC 20(7), 2002): h = sum_i p_i (1 - e^{-p_i T}) with T solving
  // sum_i (1 - e^{-p_i T}) = C, computed here by bisection. Batches of 64 lookups keep the
  // batch-wise handling close to a per-lookup cache.
  constexpr std::int64_t n = 100'000, c = 1'000;
  constexpr double s = 1.05;
  const double exact = direct_top_mass(n, c, s);
  const auto run = [&](CachePolicy p) {
    return simulate_cache(n, c, 64, zipf(s), spec_of(p, 2000, 2000)).hit_rate;
  };
  const double lfu = run(CachePolicy::lfu), lru = run(CachePolicy::lru);
  const double freq = run(CachePolicy::frequency);
  CHECK(std::abs(lfu - exact) < 0.02);
  CHECK(std::abs(freq - exact) < 0.01);

  std::vector<double> p(n);
  const double h = direct_zipf_sum(1, n, s);
  for (std::int64_t k = 0; k < n; ++k) p[k] = std::pow(static_cast<double>(k + 1), -s) / h;
  double lo = 0, hi = 1e9;
  for (int i = 0; i < 200; ++i) {
    const double t = (lo + hi) / 2;
    double filled = 0;
    for (double pk : p) filled += -std::expm1(-pk * t);
    (filled < c ? lo : hi) = t;
  }
  double che = 0;
  for (double pk : p) che += pk * -std::expm1(-pk * lo);
  CAPTURE(che);
  CAPTURE(lru);
  CHECK(std::abs(lru - che) < 0.02);
  CHECK(lru < lfu - 0.03);
  CHECK(lru < freq - 0.03);
}

TEST_CASE("embedding cache: a uniform stream hits C/N with any policy") {
  // Once full, any cache holds C of N equally likely rows: each lookup hits with probability
  // C/N, independently: hits are binomial(lookups, C/N), within 4 standard deviations. A batch
  // of L lookups misses, in expectation, (N - C)(1 - (1 - 1/N)^L) unique rows, and evicts as
  // many (the cache stays full). The warm-up (40 x 256 draws of 10000 rows: about 6400 distinct)
  // fills the 1000-row cache.
  constexpr std::int64_t n = 10'000, c = 1'000, l = 256, batches = 200;
  const double lookups = static_cast<double>(l * batches);
  const double q = static_cast<double>(c) / n;
  const double expected_misses = (n - c) * -std::expm1(l * std::log1p(-1.0 / n));
  for (CachePolicy p : {CachePolicy::frequency, CachePolicy::lfu, CachePolicy::lru}) {
    CAPTURE(name_of(p));
    const CacheStats st = simulate_cache(n, c, l, IdDistribution{}, spec_of(p, 40, batches));
    CHECK(std::abs(st.hit_rate - q) < 4 * std::sqrt(q * (1 - q) / lookups));
    // The unique misses of one batch vary by about sqrt(L) around the mean: over 200
    // batches the mean's error is below 4 sqrt(256 / 200) = 4.5 rows.
    CHECK(std::abs(st.misses_per_batch - expected_misses) < 4.5);
    CHECK(st.evictions_per_batch == doctest::Approx(st.misses_per_batch));
  }
}

TEST_CASE("embedding cache: LFU and LRU are measured once their cache is full") {
  // One warm-up batch of 1024 draws cannot fill 100000 rows; the warm-up goes on until the
  // cache is full, so that every measured miss evicts a row (a cache still filling would
  // report misses without evictions, and the hit rate of a cold cache).
  constexpr std::int64_t n = 1'000'000, c = 100'000;
  for (CachePolicy p : {CachePolicy::lfu, CachePolicy::lru}) {
    CAPTURE(name_of(p));
    const CacheStats st = simulate_cache(n, c, 1024, zipf(0.8), spec_of(p, 1, 16));
    CHECK(st.filled);
    CHECK(st.misses_per_batch > 0);
    CHECK(st.evictions_per_batch == doctest::Approx(st.misses_per_batch));
  }
  // A histogram of 500 ids over 10^6 rows (a zero tail): at most 500 distinct ids, never
  // 1000: the warm-up gives up after kMaxExtraWarmupDraws draws and says so; nothing is
  // evicted; every id is cached after the warm-up, so every lookup hits.
  IdDistribution h;
  h.kind = IdDistributionKind::histogram;
  h.weights.assign(500, 1.0);
  h.weights.push_back(0.0);
  const CacheStats partial = simulate_cache(n, 1000, 4096, h, spec_of(CachePolicy::lru, 1, 4));
  CHECK_FALSE(partial.filled);
  CHECK(partial.evictions_per_batch == 0.0);
  CHECK(partial.hit_rate == 1.0);
  CHECK(simulate_cache(n, 1000, 4096, h, spec_of(CachePolicy::frequency, 1, 4)).filled);
}

TEST_CASE("embedding cache: a cache as large as the table hits always and moves nothing") {
  const auto spec = spec_of(CachePolicy::lru, 2, 4);
  for (std::int64_t c : {1000, 5000}) {
    const CacheStats st = simulate_cache(1000, c, 4096, zipf(1.05), spec);
    CHECK(st.capacity_rows == 1000);
    CHECK(st.hit_rate == 1.0);
    CHECK(st.misses_per_batch == 0.0);
    CHECK(st.evictions_per_batch == 0.0);
  }
  // No lookups: nothing to miss.
  const CacheStats none = simulate_cache(1000, 10, 0, zipf(1.05), spec);
  CHECK(none.hit_rate == 1.0);
  CHECK(none.misses_per_batch == 0.0);
  // No cache: every lookup misses, every row of a batch passes through and leaves.
  const CacheStats empty = simulate_cache(1000, 0, 64, zipf(1.05), spec);
  CHECK(empty.capacity_rows == 0);
  CHECK(empty.hit_rate == 0.0);
  CHECK(empty.misses_per_batch > 0);
  CHECK(empty.evictions_per_batch == empty.misses_per_batch);
  CHECK(empty.batches_over_capacity == 4);
}

TEST_CASE("embedding cache: programming errors are std::invalid_argument") {
  const EmbeddingCacheSpec spec;
  CHECK_THROWS_AS(simulate_cache(0, 10, 64, zipf(1.0), spec), std::invalid_argument);
  CHECK_THROWS_AS(simulate_cache(100, 10, -1, zipf(1.0), spec), std::invalid_argument);
  CHECK_THROWS_AS(simulate_cache(100, 10, 64, zipf(0.0), spec), std::invalid_argument);
  IdDistribution h;
  h.kind = IdDistributionKind::histogram;
  h.weights = {1, 2};  // not hottest first
  CHECK_THROWS_AS(simulate_cache(100, 10, 64, h, spec), std::invalid_argument);
  h.weights = {};
  CHECK_THROWS_AS(simulate_cache(100, 10, 64, h, spec), std::invalid_argument);
  EmbeddingCacheSpec none = spec;
  none.measure_batches = 0;
  CHECK_THROWS_AS(simulate_cache(100, 10, 64, zipf(1.0), none), std::invalid_argument);
}

TEST_CASE("embedding cache: the same spec gives the same figures, another seed another stream") {
  auto spec = spec_of(CachePolicy::lfu, 4, 8);
  const auto a = simulate_cache(1'000'000, 10'000, 4096, zipf(0.9), spec);
  const auto b = simulate_cache(1'000'000, 10'000, 4096, zipf(0.9), spec);
  CHECK(a.hit_rate == b.hit_rate);
  CHECK(a.misses_per_batch == b.misses_per_batch);
  CHECK(a.evictions_per_batch == b.evictions_per_batch);
  CHECK(sample_ids(1000, zipf(0.9), 100, 1) == sample_ids(1000, zipf(0.9), 100, 1));
  CHECK(sample_ids(1000, zipf(0.9), 100, 1) != sample_ids(1000, zipf(0.9), 100, 2));
  CHECK(sample_ids(1000, zipf(0.9), 100, 1, 0) != sample_ids(1000, zipf(0.9), 100, 1, 1));
  spec.seed = 2;
  const auto c = simulate_cache(1'000'000, 10'000, 4096, zipf(0.9), spec);
  CHECK(c.misses_per_batch != a.misses_per_batch);
}

TEST_CASE("embedding cache: a capped batch scales its unique misses by their multiplicity") {
  // Uniform over N: the real batch of B lookups misses (N - C)(1 - (1 - 1/N)^B) unique rows in
  // expectation; simulating only L = B / 8 of them must estimate the same (within 3%).
  constexpr std::int64_t n = 100'000, c = 10'000, b = 8192;
  auto spec = spec_of(CachePolicy::frequency, 2, 64);
  spec.max_lookups_per_batch = b / 8;
  const CacheStats st = simulate_cache(n, c, b, IdDistribution{}, spec);
  const double expected = (n - c) * -std::expm1(b * std::log1p(-1.0 / n));
  CHECK(st.misses_per_batch == doctest::Approx(expected).epsilon(0.03));
  CHECK(st.hit_rate == doctest::Approx(0.1).epsilon(0.05));
  // Zipf: the estimate against the same formula summed over the ids the frequency cache lacks,
  // ids C..N-1 (its cache, with L = 1024 and C = 10000, holds the top C less at most L).
  const CacheStats z = simulate_cache(n, c, b, zipf(1.05), spec);
  const double h = direct_zipf_sum(1, n, 1.05);
  double zexpected = 0;
  for (std::int64_t k = c; k < n; ++k) {
    const double p = std::pow(static_cast<double>(k + 1), -1.05) / h;
    zexpected += -std::expm1(b * std::log1p(-p));
  }
  CHECK(z.misses_per_batch == doctest::Approx(zexpected).epsilon(0.03));
  // The same stream simulated whole (no cap): the capped simulation's cache sees fewer cold
  // rows a batch, so it holds slightly more of the hottest; both agree within 5% on the rows
  // moved and 0.01 on the hit rate.
  auto whole = spec;
  whole.max_lookups_per_batch = b;
  const CacheStats w = simulate_cache(n, c, b, zipf(1.05), whole);
  CHECK(z.misses_per_batch == doctest::Approx(w.misses_per_batch).epsilon(0.05));
  CHECK(std::abs(z.hit_rate - w.hit_rate) < 0.01);
}

TEST_CASE("embedding cache: the frequency policy on a histogram holds its top-k mass") {
  // Weights 1/(k+1) for ids 0..999 of 100000 rows; the 99000 ids past them weigh 1/1000 each
  // (the flat tail: the histogram's last weight). A 2000-row cache holds ids 0..1999:
  // mass (H_1000 + 1000/1000) / (H_1000 + 99000/1000), H_1000 = sum_{k<=1000} 1/k. Batches of
  // 256 lookups displace at most 256 rows of the tail (1/1000 each, of total weight
  // H_1000 + 99): under 0.25% of the mass; 256 batches: sd below 0.002.
  IdDistribution h;
  h.kind = IdDistributionKind::histogram;
  double h1000 = 0;
  for (int k = 1; k <= 1000; ++k) {
    h.weights.push_back(1.0 / k);
    h1000 += 1.0 / k;
  }
  const double expected = (h1000 + 1.0) / (h1000 + 99.0);
  const CacheStats st =
      simulate_cache(100'000, 2000, 256, h, spec_of(CachePolicy::frequency, 8, 256));
  CHECK(std::abs(st.hit_rate - expected) < 0.01);
  CHECK(top_mass(100'000, 2000, h) == doctest::Approx(expected).epsilon(1e-12));
}

TEST_CASE("embedding cache: cache rows per table from a fraction or bytes") {
  EmbeddingCacheSpec f;
  f.fraction = 0.015;
  // round(0.015 x 40e6) = 600000; round(0.015 x 10) = round(0.15) = 0; 100 rows: 1.5 -> 2.
  CHECK(cache_rows(f, {40'000'000, 10, 100}, {512, 512, 512}) ==
        std::vector<std::int64_t>{600'000, 0, 2});
  f.fraction = 1.0;
  CHECK(cache_rows(f, {7, 9}, {4, 4}) == std::vector<std::int64_t>{7, 9});
  // 1000 and 3000 rows of 128 and 64 bytes: 128000 + 192000 = 320000 bytes; a budget of 32000
  // bytes is f = 0.1 of each table's rows: 100 and 300 rows (12800 + 19200 = 32000 bytes).
  EmbeddingCacheSpec b;
  b.bytes = Bytes(32'000);
  CHECK(cache_rows(b, {1000, 3000}, {128, 64}) == std::vector<std::int64_t>{100, 300});
  // 31999 bytes: f just below 0.1, rounded down: 99 and 299 rows (within the budget).
  b.bytes = Bytes(31'999);
  CHECK(cache_rows(b, {1000, 3000}, {128, 64}) == std::vector<std::int64_t>{99, 299});
  // More bytes than the tables: all rows.
  b.bytes = Bytes(1'000'000);
  CHECK(cache_rows(b, {1000, 3000}, {128, 64}) == std::vector<std::int64_t>{1000, 3000});
  CHECK_THROWS_AS(cache_rows(b, {1}, {}), std::invalid_argument);
  CHECK_THROWS_AS(cache_rows(b, {1}, {0}), std::invalid_argument);
}

TEST_CASE("embedding cache: reading the section") {
  testing::TempDir dir("embedding-cache");
  const auto read = [&](const nlohmann::json& section) {
    const auto file = dir.write("exp.json", nlohmann::json{{"embedding_cache", section}}.dump());
    const auto doc = config::Document::load(file);
    return read_embedding_cache(config::ObjectReader(doc, "embedding_cache"));
  };
  const auto a = read({{"capacity", "1.5%"}});
  CHECK(*a.fraction == doctest::Approx(0.015));
  CHECK_FALSE(a.bytes);
  CHECK(a.policy == CachePolicy::frequency);
  CHECK(a.distribution.kind == IdDistributionKind::uniform);
  const auto b = read({{"capacity", "4 GiB"},
                       {"policy", "lru"},
                       {"distribution", {{"type", "zipf"}, {"exponent", 1.05}}},
                       {"per_table", {{"2", {{"type", "uniform"}}}}},
                       {"seed", 9},
                       {"measure_batches", 5}});
  CHECK(b.bytes->count() == 4LL << 30);
  CHECK(b.policy == CachePolicy::lru);
  CHECK(b.distribution.exponent == 1.05);
  REQUIRE(b.per_table.size() == 3);
  CHECK_FALSE(b.per_table[0]);
  CHECK(b.distribution_of(0).kind == IdDistributionKind::zipf);
  CHECK(b.distribution_of(2).kind == IdDistributionKind::uniform);
  CHECK(b.distribution_of(7).kind == IdDistributionKind::zipf);
  CHECK(b.seed == 9);
  CHECK(b.measure_batches == 5);
  CHECK(*read({{"capacity", 0.25}}).fraction == 0.25);
  // Histograms: a JSON array, or one number per line, relative to the experiment file, sorted.
  dir.write("h.json", "[1, 5, 2]");
  dir.write("sub/h.txt", "# counts\n3\n\n7.5\n");
  const auto hj =
      read({{"capacity", 0.1}, {"distribution", {{"type", "histogram"}, {"file", "h.json"}}}});
  CHECK(hj.distribution.weights == std::vector<double>{5, 2, 1});
  CHECK(hj.distribution.file == dir / "h.json");
  const auto ht =
      read({{"capacity", 0.1}, {"distribution", {{"type", "histogram"}, {"file", "sub/h.txt"}}}});
  CHECK(ht.distribution.weights == std::vector<double>{7.5, 3});
  CHECK(name_of(CachePolicy::lfu) == "lfu");
}

TEST_CASE("embedding cache: bad sections are errors naming the path") {
  testing::TempDir dir("embedding-cache-bad");
  const auto error = [&](const nlohmann::json& section) {
    const auto file = dir.write("exp.json", nlohmann::json{{"embedding_cache", section}}.dump());
    const auto doc = config::Document::load(file);
    try {
      read_embedding_cache(config::ObjectReader(doc, "embedding_cache"));
    } catch (const config::ConfigError& e) {
      CHECK(e.source() == file.string());
      return e;
    }
    FAIL("no ConfigError");
    return config::ConfigError("", "", "");
  };
  SUBCASE("a Zipf exponent <= 0") {
    for (double s : {0.0, -1.0}) {
      const auto e =
          error({{"capacity", 0.1}, {"distribution", {{"type", "zipf"}, {"exponent", s}}}});
      CHECK(e.path() == "embedding_cache.distribution.exponent");
      CHECK(contains(e.message(), "> 0"));
    }
    const auto e =
        error({{"capacity", 0.1}, {"per_table", {{"1", {{"type", "zipf"}, {"exponent", -2}}}}}});
    CHECK(e.path() == "embedding_cache.per_table.1.exponent");
  }
  SUBCASE("no capacity") {
    const auto e = error({{"policy", "lru"}});
    CHECK(e.path() == "embedding_cache.capacity");
    CHECK(contains(e.message(), "missing"));
  }
  SUBCASE("a fraction and bytes at once: a number past 1 without a unit") {
    const auto e = error({{"capacity", 4e9}});
    CHECK(e.path() == "embedding_cache.capacity");
    CHECK(contains(e.message(), "bytes take a unit"));
  }
  SUBCASE("bad capacities") {
    for (const nlohmann::json& v :
         {nlohmann::json("150%"), nlohmann::json("x%"), nlohmann::json("4 parsecs"),
          nlohmann::json(0.0), nlohmann::json("0 GiB"), nlohmann::json::array()}) {
      CAPTURE(v.dump());
      const auto e = error({{"capacity", v}});
      CHECK(e.path() == "embedding_cache.capacity");
    }
  }
  SUBCASE("an unknown key, with a hint") {
    const auto e = error({{"capacity", 0.1}, {"polcy", "lru"}});
    CHECK(e.path() == "embedding_cache.polcy");
    CHECK(contains(e.message(), "policy"));
  }
  SUBCASE("an unknown policy or distribution type") {
    CHECK(error({{"capacity", 0.1}, {"policy", "fifo"}}).path() == "embedding_cache.policy");
    CHECK(error({{"capacity", 0.1}, {"distribution", {{"type", "normal"}}}}).path() ==
          "embedding_cache.distribution.type");
  }
  SUBCASE("a bad per_table key") {
    const auto e = error({{"capacity", 0.1}, {"per_table", {{"first", {{"type", "uniform"}}}}}});
    CHECK(e.path() == "embedding_cache.per_table.first");
  }
  SUBCASE("histogram files that cannot be used") {
    const auto hist = [](const std::string& f) {
      return nlohmann::json{{"capacity", 0.1},
                            {"distribution", {{"type", "histogram"}, {"file", f}}}};
    };
    auto e = error(hist("missing.txt"));
    CHECK(e.path() == "embedding_cache.distribution.file");
    CHECK(contains(e.message(), (dir / "missing.txt").string()));
    dir.write("bad.txt", "1\n2\nthree\n");
    e = error(hist("bad.txt"));
    CHECK(e.path() == "embedding_cache.distribution.file");
    CHECK(contains(e.message(), (dir / "bad.txt").string() + ":3"));
    CHECK(contains(e.message(), "three"));
    dir.write("neg.json", "[1, -2]");
    e = error(hist("neg.json"));
    CHECK(contains(e.message(), "element 1"));
    dir.write("zero.txt", "0\n0\n");
    e = error(hist("zero.txt"));
    CHECK(contains(e.message(), "not all 0"));
    dir.write("broken.json", "[1, 2");
    e = error(hist("broken.json"));
    CHECK(contains(e.message(), "JSON array"));
  }
}
