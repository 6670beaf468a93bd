// Algorithm and bus bandwidth as nccl-tests computes them (the `nccl-busbw-factors` case of
// the published reference, read from ../shared/reference/published.json).
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "test_paths.hpp"
#include "traces/bus_bandwidth.hpp"

using namespace stratasim;
using strategies::CollectiveKind;

namespace {

// Usable in constant expressions.
static_assert(traces::busbw_factor(CollectiveKind::all_reduce, 8) == 1.75);
static_assert(traces::busbw_factor(CollectiveKind::broadcast, 8) == 1.0);
static_assert(traces::algbw(Bytes(1'000'000'000), Time::ms(1000)) == 1e9);

nlohmann::json reference_case(const std::string& id) {
  std::ifstream in(testing::reference_file());
  REQUIRE(in.good());
  const auto doc = nlohmann::json::parse(in);
  for (const auto& c : doc.at("cases")) {
    if (c.at("id") == id) return c;
  }
  FAIL("no reference case " << id);
  return {};
}

}  // namespace

TEST_CASE("bus bandwidth: nccl-tests' factors") {
  const auto ref = reference_case("nccl-busbw-factors");
  const auto& examples = ref.at("expected").at("examples_derived");
  CHECK(traces::busbw_factor(CollectiveKind::all_reduce, 8) ==
        examples.at("allreduce_factor_n8").get<double>());
  CHECK(traces::busbw_factor(CollectiveKind::all_reduce, 64) ==
        examples.at("allreduce_factor_n64").get<double>());
  // (n-1)/n for reduce-scatter, all-gather, all-to-all; 1 for broadcast and reduce.
  CHECK(traces::busbw_factor(CollectiveKind::reduce_scatter, 8) == 0.875);
  CHECK(traces::busbw_factor(CollectiveKind::all_gather, 4) == 0.75);
  CHECK(traces::busbw_factor(CollectiveKind::all_to_all, 2) == 0.5);
  CHECK(traces::busbw_factor(CollectiveKind::broadcast, 64) == 1.0);
  CHECK(traces::busbw_factor(CollectiveKind::reduce, 3) == 1.0);
  // In-network reduction: (n-1)/(n+1), as PERFORMANCE.md lists it.
  CHECK(traces::busbw_factor(CollectiveKind::all_reduce, 8, true) == doctest::Approx(7.0 / 9));
  CHECK(ref.at("expected").at("busbw_factor").at("AllReduce_in_network_reduction") ==
        "(n-1)/(n+1)");
  // One rank: nothing moves.
  CHECK(traces::busbw_factor(CollectiveKind::all_reduce, 1) == 0.0);
}

TEST_CASE("bus bandwidth: algbw and busbw") {
  // nccl-a100-nvlink: 1 GiB all-reduced in 8.17 ms over 8 GPUs: algbw = 2^30 / 8.17e-3 =
  // 131.4 GB/s; busbw = 1.75 x algbw = 230 GB/s.
  const Bytes gib(1LL << 30);
  const Time t = Time::us(8'170);
  CHECK(traces::algbw(gib, t) == doctest::Approx(131.4e9).epsilon(0.001));
  CHECK(traces::busbw(CollectiveKind::all_reduce, 8, gib, t) ==
        doctest::Approx(230e9).epsilon(0.001));
  CHECK(traces::algbw(gib, Time::zero()) == 0.0);
}
