// The embedding cache through the simulator (docs/recommendation.md): Criteo Terabyte on one
// DGX A100 with the frequency-aware cache on Zipf ids. The iteration time falls as the cached
// fraction grows (fewer misses, less PCIe traffic to hide), and a cache of every row is the run
// without a cache, to the picosecond. (The cache's stream is cut to 8,192 ids a batch, a
// uniform subsample, to keep the test short; the shipped experiment simulates 65,536.)
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "experiment_helpers.hpp"
#include "study/study.hpp"

using namespace stratasim;
using stratasim::testing::cli;

namespace {

const auto kCached = testing::configs_dir() / "experiments/dlrm-criteo-terabyte-cache-a100-8.json";
const auto kPlain = testing::configs_dir() / "experiments/dlrm-criteo-terabyte-a100-8.json";

study::Result run(const std::filesystem::path& file, std::vector<strategies::Override> o = {}) {
  return study::simulate(strategies::load_experiment(file, o));
}

}  // namespace

TEST_CASE("dlrm cache: iteration time falls as the cached fraction grows, 100% is no cache") {
  const study::Result plain = run(kPlain);
  REQUIRE(plain.report.completed);
  const std::vector<double> fractions = {0.001, 0.005, 0.01, 0.015, 0.05, 0.1, 1.0};
  std::vector<double> times;
  for (double f : fractions) {
    CAPTURE(f);
    const study::Result r = run(kCached, {cli("embedding_cache.capacity", f),
                                          cli("embedding_cache.max_lookups_per_batch", 8192)});
    REQUIRE(r.report.completed);
    times.push_back(r.report.iteration_time_s);
  }
  for (std::size_t i = 1; i < times.size(); ++i) {
    CAPTURE(fractions[i]);
    CHECK(times[i] <= times[i - 1]);
  }
  // The copies show: a 0.1% cache is slower than the tables on the GPUs.
  CHECK(times.front() > plain.report.iteration_time_s);
  CHECK(times.back() == plain.report.iteration_time_s);
  CHECK(run(kCached, {cli("embedding_cache.capacity", 1.0)}).report.peak_memory ==
        plain.report.peak_memory);
}
