// Several jobs on one cluster: placement, merging Programs, and splitting the run back.
#include <doctest/doctest.h>

#include <stdexcept>

#include "sim/helpers.hpp"
#include "sim/simulator.hpp"
#include "study/jobs.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using stratasim::testing::measured;
using stratasim::testing::test_cluster;

namespace {

// `n` ranks: each computes for `work`, then all-reduce `bytes` over all of them, then a p2p
// from rank 0 to rank n-1.
Program job(int n, Time work, Bytes bytes) {
  Program p(n);
  const auto compute = measured(p, work);
  std::vector<std::int32_t> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(r);
  const auto g = p.add_group(ranks, "dp 0");
  for (int r = 0; r < n; ++r) {
    p.begin_rank(r);
    const auto c = p.add(compute, OpInfo{Stream::compute, Phase::forward, 0, -1, -1, "work"});
    const OpId deps[] = {c};
    p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, bytes},
          OpInfo{Stream::dp_comm, Phase::backward, 0, -1, -1, "sync"}, deps);
    if (r == 0)
      p.add(Send{n - 1, Bytes(1000)}, OpInfo{Stream::pp_send, Phase::forward, 0, -1, -1, "send"});
    if (r == n - 1)
      p.add(Recv{0, Bytes(1000)}, OpInfo{Stream::pp_recv, Phase::forward, 0, -1, -1, "recv"});
  }
  p.finish();
  return p;
}

}  // namespace

TEST_CASE("jobs are placed packed, interleaved by node, or by explicit ranges") {
  const auto cluster = test_cluster(4, 2);  // 8 devices, nodes {0,1} {2,3} {4,5} {6,7}
  const int sizes[] = {4, 2};
  auto packed = study::place_jobs(sizes, "packed", cluster);
  CHECK(packed[0].devices == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(packed[1].devices == std::vector<std::int32_t>{4, 5});
  // Nodes dealt round-robin: job 0 gets nodes 0 and 2, job 1 node 1.
  auto interleaved = study::place_jobs(sizes, "interleaved", cluster);
  CHECK(interleaved[0].devices == std::vector<std::int32_t>{0, 1, 4, 5});
  CHECK(interleaved[1].devices == std::vector<std::int32_t>{2, 3});
  auto ranges = study::place_jobs(sizes, "0,2,4,6;1,7", cluster);
  CHECK(ranges[0].devices == std::vector<std::int32_t>{0, 2, 4, 6});
  CHECK(ranges[1].devices == std::vector<std::int32_t>{1, 7});
}

TEST_CASE("bad placements are clear errors") {
  const auto cluster = test_cluster(4, 2);
  const int sizes[] = {4, 2};
  CHECK_THROWS_AS(study::place_jobs(sizes, "0,2,4,6;2-3", cluster),
                  std::invalid_argument);                                                // overlap
  CHECK_THROWS_AS(study::place_jobs(sizes, "0-3", cluster), std::invalid_argument);      // one list
  CHECK_THROWS_AS(study::place_jobs(sizes, "0-3;4-9", cluster), std::invalid_argument);  // range
  CHECK_THROWS_AS(study::place_jobs(sizes, "0-3;x", cluster), std::invalid_argument);
  CHECK_THROWS_AS(study::place_jobs(sizes, "0-3;4", cluster), std::invalid_argument);  // 1 of 2
  const int too_many[] = {6, 4};
  try {
    study::place_jobs(too_many, "packed", cluster);
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("need 10 devices") != std::string::npos);
  }
}

TEST_CASE("merged jobs run as they do alone where they share nothing, and split back exactly") {
  const auto cluster = test_cluster(2, 4);  // analytical network: no contention
  const Program a = job(4, Time::ms(1), Bytes(1 << 20));
  const Program b = job(2, Time::ms(3), Bytes(1 << 10));
  const int sizes[] = {4, 2};
  const auto placements = study::place_jobs(sizes, "0-3;4-5", cluster);
  const Program* programs[] = {&a, &b};
  const std::string names[] = {"a", "b"};
  const Program merged = study::merge_programs(programs, placements, names, cluster.world_size());
  CHECK(merged.op_count() == a.op_count() + b.op_count());
  CHECK(merged.groups()[1].name == "b: dp 0");
  CHECK(merged.groups()[1].ranks == std::vector<std::int32_t>{4, 5});
  const auto together = sim::simulate(merged, cluster);
  REQUIRE(together.completed);
  // Job a on devices 0-3 and job b on 4-5 each sit on one node of the cluster, as they do when
  // simulated alone on a one-node cluster of their size: the same spans, op by op.
  const auto alone_a = sim::simulate(a, test_cluster(1, 4));
  const auto alone_b = sim::simulate(b, test_cluster(1, 2));
  const auto split_a = study::split_timeline(together, merged, a, placements[0]);
  const auto split_b = study::split_timeline(together, merged, b, placements[1]);
  REQUIRE(split_a.spans.size() == a.op_count());
  REQUIRE(split_b.spans.size() == b.op_count());
  for (OpId id = 0; id < a.op_count(); ++id) {
    CHECK(split_a.spans[id].op == id);
    CHECK(split_a.spans[id].rank == a.op(id).rank);
    CHECK(split_a.spans[id].start == alone_a.spans[id].start);
    CHECK(split_a.spans[id].end == alone_a.spans[id].end);
  }
  for (OpId id = 0; id < b.op_count(); ++id) {
    CHECK(split_b.spans[id].end == alone_b.spans[id].end);
  }
}

TEST_CASE("an event-driven rank (a parameter server) stays event-driven where it is placed") {
  const auto cluster = test_cluster(2, 4);
  Program a = job(2, Time::ms(1), Bytes(1 << 20));
  Program b(2);
  b.begin_rank(0);
  b.begin_rank(1);
  b.finish();
  b.set_event_driven(1);
  const int sizes[] = {2, 2};
  const auto placements = study::place_jobs(sizes, "0-1;5,6", cluster);
  const Program* programs[] = {&a, &b};
  const std::string names[] = {"a", "b"};
  const Program merged = study::merge_programs(programs, placements, names, cluster.world_size());
  for (int d = 0; d < cluster.world_size(); ++d) {
    CAPTURE(d);
    CHECK(merged.event_driven(d) == (d == 6));
  }
}

TEST_CASE("a mirrored program cannot be merged") {
  Program a = job(2, Time::ms(1), Bytes(0));
  Program m(2);
  m.begin_rank(0);
  m.add(measured(m, Time::ms(1)), OpInfo{});
  m.set_replica(1, 0);
  m.finish();
  const auto cluster = test_cluster(1, 4);
  const int sizes[] = {2, 2};
  const auto placements = study::place_jobs(sizes, "packed", cluster);
  const Program* programs[] = {&a, &m};
  const std::string names[] = {"a", "m"};
  CHECK_THROWS_AS(study::merge_programs(programs, placements, names, 4), std::invalid_argument);
}
