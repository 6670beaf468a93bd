// The embedding cache's simulation speed (issue 20): strategies::simulate_cache on a Criteo
// Terabyte-sized table (40 million rows) with a 1.5% cache (600,000 rows) and the default
// stream (8 + 32 batches of 65,536 lookups), for each policy and Zipf exponents 1.05 and 0.8;
// then a 1M-row table at 10%. Prints the median wall time of R runs and the figures the
// simulation gives (hit rate, against the top-capacity mass; rows moved per batch); the wall
// and the process CPU time (the latter robust to other load). Asserts nothing.
//
//   build/bench/bench_embedding_cache [RUNS]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "strategies/embedding_cache.hpp"

using namespace stratasim::strategies;
using Clock = std::chrono::steady_clock;

namespace {

void row(std::int64_t rows, std::int64_t capacity, double exponent, CachePolicy policy, int runs) {
  IdDistribution d;
  d.kind = IdDistributionKind::zipf;
  d.exponent = exponent;
  EmbeddingCacheSpec spec;
  spec.policy = policy;
  std::vector<double> seconds, cpu;
  CacheStats st;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    const std::clock_t c0 = std::clock();
    st = simulate_cache(rows, capacity, 65536, d, spec);
    cpu.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  std::sort(cpu.begin(), cpu.end());
  std::printf("%10lld %9lld %5.2f %-9s %8.4f %8.4f %10.1f %10.1f %9.3f %9.3f\n",
              static_cast<long long>(rows), static_cast<long long>(capacity), exponent,
              std::string(name_of(policy)).c_str(), st.hit_rate, top_mass(rows, capacity, d),
              st.misses_per_batch, st.evictions_per_batch, seconds[seconds.size() / 2],
              cpu[cpu.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  std::printf("%10s %9s %5s %-9s %8s %8s %10s %10s %9s\n", "rows", "capacity", "s", "policy", "hit",
              "top_mass", "miss/batch", "evict/b", "median_s");
  for (double s : {1.05, 0.8}) {
    for (CachePolicy p : {CachePolicy::frequency, CachePolicy::lfu, CachePolicy::lru}) {
      row(40'000'000, 600'000, s, p, runs);
    }
  }
  for (CachePolicy p : {CachePolicy::frequency, CachePolicy::lfu, CachePolicy::lru}) {
    row(1'000'000, 100'000, 1.05, p, runs);
  }
  return 0;
}
