// training.step_overhead adds to the iteration time: the host op precedes every op of every
// rank (strategies/lowering/techniques.hpp, HostOverhead).
#include <doctest/doctest.h>

#include <algorithm>

#include "sim/helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/lowering.hpp"

using namespace stratasim;

namespace {

Time iteration_time(const traces::Timeline& t) {
  Time end;
  for (const auto& s : t.spans) end = std::max(end, s.end);
  return end;
}

}  // namespace

TEST_CASE("a step overhead of 40 ms makes the iteration exactly 40 ms longer") {
  strategies::Experiment e;
  e.name = "test";
  e.model.name = "gpt";
  e.model.layers = 2;
  e.model.hidden = 256;
  e.model.heads = 4;
  e.model.kv_heads = 4;
  e.model.ffn_hidden = 1024;
  e.model.vocab = 1000;
  e.model.max_seq_len = 128;
  e.cluster = testing::test_cluster(1, 2, Bytes(int64_t{1} << 40));
  e.parallelism.pp = 2;
  e.parallelism.dp = 1;
  e.training.global_batch = 4;
  e.training.seq_len = 128;
  const Time base = iteration_time(sim::simulate(strategies::lower(e), e.cluster));
  e.training.step_overhead = Time::ms(40);
  const Time with = iteration_time(sim::simulate(strategies::lower(e), e.cluster));
  CHECK(with - base == Time::ms(40));
}
