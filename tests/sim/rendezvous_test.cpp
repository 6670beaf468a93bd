// The simulator meets ops where strategies::Matching says: mirrored members are not waited
// for, messages pair by issue order across streams, and ops that can never meet are named.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sim/helpers.hpp"
#include "sim/simulator.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

OpInfo on(Stream s) {
  OpInfo info;
  info.stream = s;
  return info;
}

}  // namespace

TEST_CASE("simulator: a collective waits only for the members that issue ops") {
  // Rank 1 mirrors rank 0: the all-reduce on {0, 1} runs with rank 0's call alone.
  Program p(2);
  const auto g = p.add_group({0, 1}, "dp 0");
  p.set_replica(1, 0);
  p.begin_rank(0);
  p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(1000)}, on(Stream::dp_comm));
  p.finish();
  const auto t = sim::simulate(p, testing::test_cluster(1, 2));
  INFO(t.problem);
  CHECK(t.completed);
  REQUIRE(t.spans.size() == 1);
  CHECK(t.spans[0].end > t.spans[0].start);
}

TEST_CASE("simulator: the k-th send meets the k-th receive across streams") {
  // Sends of 1000 and 3000 bytes on two streams; the receives are issued on two other streams
  // in the same order. Each pair shares one span, and the larger message lasts longer.
  Program p(2);
  p.begin_rank(0);
  const OpId s0 = p.add(Send{1, Bytes(1000)}, on(Stream::pp_send));
  const OpId s1 = p.add(Send{1, Bytes(3000)}, on(Stream::copy));
  p.begin_rank(1);
  const OpId r0 = p.add(Recv{0, Bytes(1000)}, on(Stream::host));
  const OpId r1 = p.add(Recv{0, Bytes(3000)}, on(Stream::pp_recv));
  p.finish();
  const auto t = sim::simulate(p, testing::test_cluster(1, 2));
  REQUIRE(t.completed);
  CHECK(t.spans[s0].start == t.spans[r0].start);
  CHECK(t.spans[s0].end == t.spans[r0].end);
  CHECK(t.spans[s1].start == t.spans[r1].start);
  CHECK(t.spans[s1].end == t.spans[r1].end);
  CHECK(t.spans[s1].end - t.spans[s1].start > t.spans[s0].end - t.spans[s0].start);
}

TEST_CASE("simulator: a message to no rank can never run, and says so") {
  Program p(2);
  p.begin_rank(0);
  const OpId s = p.add(Send{5, Bytes(8)}, on(Stream::pp_send));
  p.finish();
  const auto t = sim::simulate(p, testing::test_cluster(1, 2));
  CHECK_FALSE(t.completed);
  INFO(t.problem);
  CHECK(t.problem.find(p.describe(s) +
                       " can never run: its peer, rank 5, is not a rank of the program") !=
        std::string::npos);
}
