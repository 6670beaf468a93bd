// A transport policy per rank (sim::SimOptions::transports, as several jobs merged into one
// Program use them: study/jobs.hpp): finish times worked out by hand in the comments.
#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "sim/helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/transport.hpp"

using namespace stratasim;
using strategies::LinkScheduling;
using strategies::OpId;
using strategies::PriorityPolicy;
using strategies::TransportPolicy;

namespace {

/// Ranks 0 and 1 each send 1e8 B to rank 2 on the other node at once (dp_comm, backward, layer
/// 0 from rank 0 and layer 3 from rank 1); both cross rank 2's NIC (test_cluster: 10 GB/s,
/// 5 us). Rank 2 receives one on dp_comm and one on pp_recv, so that its receives do not wait
/// for each other. `sends`: the two sends' op ids.
strategies::Program two_senders(OpId (&sends)[2]) {
  strategies::Program p(4);
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    for (int sender : {0, 1}) {
      strategies::OpInfo info = testing::gradient_info(sender == 0 ? 0 : 3);
      if (r == sender) {
        sends[sender] = p.add(strategies::Send{2, Bytes(100'000'000)}, info);
      } else if (r == 2) {
        if (sender == 1) info.stream = strategies::Stream::pp_recv;
        p.add(strategies::Recv{sender, Bytes(100'000'000)}, info);
      }
    }
  }
  p.finish();
  return p;
}

hw::ClusterSpec two_nodes() {
  auto c = testing::test_cluster(2, 2);
  c.network_model = hw::NetworkModel::flow;
  return c;
}

/// Two classes; every transfer in class `klass` (a rule with no keys matches all).
TransportPolicy all_in(int klass) {
  TransportPolicy t;
  t.priority = PriorityPolicy::rules;
  t.classes = 2;
  strategies::PriorityRule rule;
  rule.klass = klass;
  t.rules.push_back(rule);
  return t;
}

}  // namespace

TEST_CASE("transports: each rank's transfers take its own policy") {
  // Strict: the class-0 message alone at 10 GB/s ends at 5 us + 1e8 / 1e10 = 10.005 ms; the
  // class-1 message gets nothing until then and ends at 5 us + 2e8 / 1e10 = 20.005 ms.
  OpId sends[2];
  const auto p = two_senders(sends);
  sim::SimOptions options;
  options.transports = {all_in(1), all_in(0)};
  options.transport_of_rank = {0, 1, 1, 1};  // rank 0 yields, the others do not
  auto t = sim::simulate(p, two_nodes(), options);
  REQUIRE(t.completed);
  CHECK(t.spans[sends[0]].end == Time::us(20'005));
  CHECK(t.spans[sends[1]].end == Time::us(10'005));
  options.transport_of_rank = {1, 0, 0, 0};  // rank 1 yields
  t = sim::simulate(p, two_nodes(), options);
  CHECK(t.spans[sends[0]].end == Time::us(10'005));
  CHECK(t.spans[sends[1]].end == Time::us(20'005));
  // A loss bound of 0.5 on rank 1's policy only: its message carries 5e7 B. Both share the
  // NIC at 5 GB/s until rank 1's ends at 5 us + 2 x 5e7 / 1e10 = 10.005 ms; rank 0's has
  // 5e7 B left, alone at 10 GB/s: 5 ms more, 15.005 ms.
  TransportPolicy lossy;
  lossy.loss_bound = 0.5;
  options.transports = {TransportPolicy{}, lossy};
  options.transport_of_rank = {0, 1, 0, 0};
  t = sim::simulate(p, two_nodes(), options);
  CHECK(t.spans[sends[0]].end == Time::us(15'005));
  CHECK(t.spans[sends[1]].end == Time::us(10'005));
}

TEST_CASE("transports: a policy for every rank, agreeing on the links") {
  OpId sends[2];
  const auto p = two_senders(sends);
  sim::SimOptions options;
  options.transports = {all_in(0)};
  options.transport_of_rank = {0, 0, 0};  // 3 of 4 ranks
  CHECK_THROWS_AS(sim::simulate(p, two_nodes(), options), std::invalid_argument);
  options.transport_of_rank = {0, 0, 0, 1};  // no policy 1
  CHECK_THROWS_AS(sim::simulate(p, two_nodes(), options), std::invalid_argument);
  auto weighted = all_in(1);
  weighted.scheduling = LinkScheduling::weighted;
  weighted.weights = {3, 1};
  options.transports = {all_in(0), weighted};
  options.transport_of_rank = {0, 1, 0, 0};
  CHECK_THROWS_AS(sim::simulate(p, two_nodes(), options), std::invalid_argument);
  // Weighted 3:1 in both policies: rank 1's class-1 message gets 1/4 of 10 GB/s while rank 0's
  // class-0 one gets 3/4: 1e8 / 7.5e9 = 13.333 ms; rank 1's 6.667e7 B left then take 6.667 ms
  // alone: 5 us + 20 ms (within the picoseconds completions round up by).
  auto urgent = weighted;
  urgent.rules.front().klass = 0;
  options.transports = {urgent, weighted};
  const auto t = sim::simulate(p, two_nodes(), options);
  REQUIRE(t.completed);
  CHECK(std::llabs(
            (t.spans[sends[0]].end - Time::us(5) - Time::ps(13'333'333'334)).picoseconds()) <= 1);
  CHECK(std::llabs((t.spans[sends[1]].end - Time::us(20'005)).picoseconds()) <= 2);
}
