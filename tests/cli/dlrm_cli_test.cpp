// DLRM experiments through the stratasim executable (docs/recommendation.md): the shipped ones
// run and report their embedding lines; bad settings are exit 2 naming their key.
#include <doctest/doctest.h>

#include <string>

#include "cli/helpers.hpp"
#include "test_paths.hpp"

using namespace stratasim::testing::cli;

namespace {

std::string shipped(const std::string& name) {
  return (stratasim::testing::configs_dir() / "experiments" / (name + ".json")).string();
}

}  // namespace

TEST_CASE("dlrm: the shipped experiments simulate and report the tables and the cache") {
  const auto plain = run("simulate " + shipped("dlrm-criteo-terabyte-a100-8"));
  CAPTURE(plain.output);
  CHECK(plain.status == 0);
  CHECK(plain.output.find("26 tables") != std::string::npos);
  CHECK(plain.output.find("table-wise over 8 GPUs") != std::string::npos);
  const auto cached = run("simulate " + shipped("dlrm-criteo-terabyte-cache-a100-8"));
  CAPTURE(cached.output);
  CHECK(cached.status == 0);
  CHECK(cached.output.find("embedding cache") != std::string::npos);
  CHECK(cached.output.find("hit rate") != std::string::npos);
  CHECK(cached.output.find("policy frequency") != std::string::npos);
}

TEST_CASE("dlrm: a cache larger than the tables is exit 2 naming embedding_cache.capacity") {
  check_bad_input("simulate " + shipped("dlrm-criteo-terabyte-cache-a100-8") +
                      " --set embedding_cache.capacity=\"64 GiB\"",
                  {"embedding_cache.capacity", "larger than the embedding tables a GPU holds"});
}

TEST_CASE("dlrm: a Zipf exponent of 0 or below is exit 2 naming the exponent") {
  for (const char* exponent : {"0", "-1"}) {
    check_bad_input("simulate " + shipped("dlrm-criteo-terabyte-cache-a100-8") +
                        " --set embedding_cache.distribution.exponent=" + exponent,
                    {"embedding_cache.distribution.exponent"});
  }
}

TEST_CASE("dlrm: a table sharded over more GPUs than it has rows is exit 2 naming the sharding") {
  // Criteo Terabyte's table 5 has 3 rows; row-wise over 8 GPUs cannot split it.
  check_bad_input("simulate " + shipped("dlrm-criteo-terabyte-a100-8") +
                      " --set parallelism.embedding_sharding=row",
                  {"parallelism.embedding_sharding", "table 5 has 3 rows"});
  // Its dim 128 does not split over 3 GPUs column-wise.
  check_bad_input(
      "simulate " + shipped("dlrm-criteo-terabyte-a100-8") +
          " --set parallelism.embedding_sharding=column --set cluster.devices_per_node=3"
          " --set training.global_batch=24576",
      {"parallelism.embedding_sharding", "dim 128, not a multiple of 3"});
}

TEST_CASE("dlrm: transformer settings are exit 2 naming their key") {
  check_bad_input("simulate " + shipped("dlrm-criteo-terabyte-a100-8") + " --set parallelism.pp=2",
                  {"parallelism.pp"});
  check_bad_input(
      "simulate " + shipped("dlrm-criteo-terabyte-a100-8") + " --set parallelism.recompute=full",
      {"parallelism.recompute", "does not apply to a DLRM model"});
}
