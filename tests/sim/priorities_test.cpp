// Priority classes, bounded loss and per-packet spraying on the flow-level network
// (docs/priorities.md): finish times worked out by hand in the comments.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "hw_models/topology.hpp"
#include "sim/flow_network.hpp"
#include "sim/helpers.hpp"
#include "sim/max_min.hpp"
#include "sim/network.hpp"
#include "sim/simulator.hpp"
#include "strategies/transport.hpp"

using namespace stratasim;
using strategies::LinkScheduling;
using strategies::PriorityPolicy;
using testing::drive;

namespace {

sim::TransferRequest message(std::int32_t src, std::int32_t dst, Bytes bytes, int priority = 0,
                             double droppable = 0) {
  sim::TransferRequest r;
  r.collective = false;
  r.src = src;
  r.dst = dst;
  r.bytes = bytes;
  r.priority = priority;
  r.droppable = droppable;
  return r;
}

strategies::TransportPolicy policy(LinkScheduling scheduling, std::vector<double> weights = {}) {
  strategies::TransportPolicy p;
  p.priority = PriorityPolicy::layer;
  p.classes = 2;
  p.scheduling = scheduling;
  p.weights = std::move(weights);
  return p;
}

/// Two nodes of two devices (test_cluster: 10 GB/s and 5 us between nodes), flow-level.
hw::ClusterSpec two_nodes() {
  auto c = testing::test_cluster(2, 2);
  c.network_model = hw::NetworkModel::flow;
  return c;
}

/// Two messages of 1e8 B from rank 0 to rank 2 (the same NIC path, 10 GB/s, 5 us), started
/// together, of classes 0 and `second` under `p`; their completion times.
std::map<sim::TransferId, Time> two_messages(const strategies::TransportPolicy& p, int second = 1) {
  const auto cluster = two_nodes();
  strategies::Program program(4);
  auto net = sim::make_network(cluster, program);
  net->set_transport(p);
  net->start(0, message(0, 2, Bytes(100'000'000), 0), Time::zero());
  net->start(1, message(0, 2, Bytes(100'000'000), second), Time::zero());
  return drive(*net);
}

/// 4 nodes x 2 devices on a fat-tree of 2 nodes per rack and 2 spines (test_cluster's links),
/// flow-level.
hw::ClusterSpec fat_tree_4x2() {
  auto cluster = testing::test_cluster(4, 2);
  hw::TopologySpec t;
  t.kind = hw::TopologyKind::fat_tree;
  t.nodes_per_rack = 2;
  t.spines = 2;
  cluster.topology = t;
  cluster.network_model = hw::NetworkModel::flow;
  return cluster;
}

/// Simulates `p` on two_nodes() under `transport`; the run must complete.
traces::Timeline simulate_with(const strategies::Program& p,
                               const strategies::TransportPolicy& transport) {
  sim::SimOptions options;
  options.transport = transport;
  auto timeline = sim::simulate(p, two_nodes(), options);
  REQUIRE(timeline.completed);
  return timeline;
}

}  // namespace

TEST_CASE("max-min: a strict level gets what the more urgent level leaves (work-conserving)") {
  // Link A (1 GB/s) carries X (level 0) and Y (level 1); X also crosses link B (0.25 GB/s).
  // Level 0 alone: X's bottleneck is B, X = 0.25 GB/s. Level 1 then fills A's residual:
  // Y = 1 - 0.25 = 0.75 GB/s. Unclassed max-min gives the same here (X is limited by B); with
  // B at 10 GB/s, X takes all of A (1 GB/s) and Y waits: Y = 0 until X is done.
  sim::MaxMinSolver s;
  const int a = s.add_link(1e9);
  const int b = s.add_link(0.25e9);
  const std::vector<int> xr{a, b}, yr{a};
  const int x = s.start_flow(xr, 1e9, Time::zero(), 0, {}, {0, 1});
  const int y = s.start_flow(yr, 1e9, Time::zero(), 1, {}, {1, 1});
  s.settle(Time::zero());
  CHECK(s.rate(x) == doctest::Approx(0.25e9));
  CHECK(s.rate(y) == doctest::Approx(0.75e9));

  sim::MaxMinSolver t;
  const int a2 = t.add_link(1e9);
  const int b2 = t.add_link(10e9);
  const std::vector<int> xr2{a2, b2}, yr2{a2};
  const int x2 = t.start_flow(xr2, 1e9, Time::zero(), 0, {}, {0, 1});
  const int y2 = t.start_flow(yr2, 1e9, Time::zero(), 1, {}, {1, 1});
  t.settle(Time::zero());
  CHECK(t.rate(x2) == doctest::Approx(1e9));
  CHECK(t.rate(y2) == 0);
}

TEST_CASE("max-min: weights 3 and 1 on one link share it 3/4 and 1/4") {
  sim::MaxMinSolver s;
  const int l = s.add_link(1e9);
  const std::vector<int> r{l};
  const int x = s.start_flow(r, 1e9, Time::zero(), 0, {}, {0, 3});
  const int y = s.start_flow(r, 1e9, Time::zero(), 1, {}, {0, 1});
  s.settle(Time::zero());
  CHECK(s.rate(x) == doctest::Approx(0.75e9));
  CHECK(s.rate(y) == doctest::Approx(0.25e9));
}

TEST_CASE("priorities: strict classes on one link") {
  // Each message: 5 us of latency, then 1e8 B over the 10 GB/s NIC path (10 ms alone).
  // Strict: class 0 alone at 10 GB/s ends at 5 us + 1e8 / 1e10 = 10.005 ms; class 1 gets
  // nothing until then and ends at 5 us + (1e8 + 1e8) / 1e10 = 20.005 ms.
  const auto strict = two_messages(policy(LinkScheduling::strict));
  CHECK(strict.at(0) == Time::us(10'005));
  CHECK(strict.at(1) == Time::us(20'005));
  // One class (max-min fair): 5 GB/s each, both end at 20.005 ms.
  const auto fair = two_messages(policy(LinkScheduling::strict), 0);
  CHECK(fair.at(0) == Time::us(20'005));
  CHECK(fair.at(1) == Time::us(20'005));
}

TEST_CASE("priorities: weighted 3:1 classes on one link") {
  // Class 0 at weight 3 gets 3/4 of 10 GB/s = 7.5 GB/s, class 1 2.5 GB/s. Class 0's 1e8 B take
  // 1e8 / 7.5e9 = 13.333... ms: it ends at 5 us + 13.3333 ms. Class 1 has carried 2.5e9 x
  // 13.333 ms = 3.333e7 B by then; its 6.667e7 B left take 6.667 ms alone: it ends at
  // 5 us + 20 ms (the sum of the bytes over the bandwidth). Completions round up to the
  // picosecond at each rate change: within 2 ps.
  const auto weighted = two_messages(policy(LinkScheduling::weighted, {3, 1}));
  const Time urgent = Time::us(5) + Time::ps(13'333'333'334);
  CHECK(std::llabs((weighted.at(0) - urgent).picoseconds()) <= 1);
  CHECK(std::llabs((weighted.at(1) - Time::us(20'005)).picoseconds()) <= 2);
}

TEST_CASE("bounded loss: a lone message is shorter by exactly e of its serialisation time") {
  // 1e8 B over 10 GB/s: 10 ms of serialisation after 5 us of latency. e = 0.25: 2.5e7 B are
  // dropped, 7.5e7 B take 7.5 ms: 5 us + 7.5 ms. e = 0: exactly the lossless time. The same on
  // the analytical network (bounded loss is not a link effect).
  for (const bool flow : {true, false}) {
    CAPTURE(flow);
    auto cluster = two_nodes();
    if (!flow) cluster.network_model = hw::NetworkModel::analytical;
    strategies::Program program(4);
    auto net = sim::make_network(cluster, program);
    const auto lossy = message(0, 2, Bytes(100'000'000), 0, 0.25);
    CHECK(lossy.dropped() == Bytes(25'000'000));
    net->start(0, lossy, Time::zero());
    net->start(1, message(0, 3, Bytes(100'000'000), 0, 0.0), Time::ms(100));
    net->start(2, message(0, 3, Bytes(100'000'000)), Time::ms(200));
    const auto done = drive(*net);
    CHECK(done.at(0) == Time::us(7'505));
    CHECK(done.at(1) - Time::ms(100) == Time::us(10'005));
    CHECK(done.at(1) - Time::ms(100) == done.at(2) - Time::ms(200));
  }
}

TEST_CASE("spraying: two messages that ECMP puts on one spine, split over both") {
  // A fat-tree of 4 nodes x 2 devices, 2 nodes per rack, 2 spines: rail 0's leaves are
  // rack0.rail0 (ranks 0, 2) and rack1.rail0 (ranks 4, 6); each leaf has one uplink to each
  // spine of 2 x 10 GB/s / 2 = 10 GB/s. Messages 0 -> 4 and 2 -> 6 of 1e9 B each (5 us of
  // latency). ECMP hashes each onto one spine: on different spines each runs at its NIC's
  // 10 GB/s, 100 ms; on the same spine they share its 10 GB/s uplink, 5 GB/s each, 200 ms.
  // Spray splits each into 2 sub-flows of 5e8 B, one per spine: every uplink carries one
  // sub-flow of each message, 5 GB/s each, and every NIC its message's two: 100 ms always.
  auto cluster = fat_tree_4x2();
  strategies::Program program(8);
  const Time apart = Time::us(5) + Time::ms(100);
  const Time collide = Time::us(5) + Time::ms(200);
  auto run = [&](hw::LoadBalancing balancing, sim::TransferId second) {
    cluster.load_balancing = balancing;
    sim::FlowNetwork net(cluster, hw::build_topology(cluster), program);
    net.start(0, message(0, 4, Bytes(1'000'000'000)), Time::zero());
    net.start(second, message(2, 6, Bytes(1'000'000'000)), Time::zero());
    const auto done = drive(net);
    return std::pair{done.at(0), done.at(second)};
  };
  int collisions = 0;
  for (sim::TransferId second = 1; second <= 16; ++second) {
    CAPTURE(second);
    const auto [a, b] = run(hw::LoadBalancing::ecmp, second);
    CHECK(a == b);
    CHECK((a == apart || a == collide));
    if (a == collide) ++collisions;
    const auto [sa, sb] = run(hw::LoadBalancing::spray, second);
    CHECK(sa == apart);
    CHECK(sb == apart);
  }
  CHECK(collisions > 0);   // ECMP collides for some keys ...
  CHECK(collisions < 16);  // ... and not for others
}

TEST_CASE("priorities: the program simulator derives classes and loss from the ops") {
  // Ranks 0 and 1 each send 1e8 B to rank 2 on the other node at once, on dp_comm in the
  // backward: the gradients of layer 0 (rank 0) and of layer 3 (rank 1), in a program of 4
  // layers. Both cross rank 2's NIC (10 GB/s) after 5 us of latency. Policy "layer" with 2
  // classes: layer 0 -> class floor(0 x 2 / 4) = 0, layer 3 -> floor(3 x 2 / 4) = 1. Strict:
  // 10.005 ms and 20.005 ms (as above); without a policy both 20.005 ms. (Rank 2 receives one
  // on dp_comm and one on pp_recv, so that its receives do not wait for each other.)
  using strategies::OpId;
  strategies::Program p(4);
  OpId early = 0, late = 0;
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    for (int layer : {0, 3}) {
      strategies::OpInfo info = testing::gradient_info(layer);
      const int sender = layer == 0 ? 0 : 1;
      if (r == sender) {
        (layer == 0 ? early : late) = p.add(strategies::Send{2, Bytes(100'000'000)}, info);
      } else if (r == 2) {
        if (layer == 3) info.stream = strategies::Stream::pp_recv;
        p.add(strategies::Recv{sender, Bytes(100'000'000)}, info);
      }
    }
  }
  p.finish();
  auto run = [&](const strategies::TransportPolicy& transport) {
    return simulate_with(p, transport);
  };
  const auto plain = run({});
  CHECK(plain.spans[early].end == Time::us(20'005));
  CHECK(plain.spans[late].end == Time::us(20'005));
  const auto layered = run(policy(LinkScheduling::strict));
  CHECK(layered.spans[early].end == Time::us(10'005));
  CHECK(layered.spans[late].end == Time::us(20'005));
  // A rule that puts layer 3 first reverses them.
  auto rules = policy(LinkScheduling::strict);
  rules.priority = PriorityPolicy::rules;
  rules.rules.push_back({strategies::Stream::dp_comm, std::nullopt, std::pair{3, 3}, 0});
  const auto ruled = run(rules);
  CHECK(ruled.spans[late].end == Time::us(10'005));
  CHECK(ruled.spans[early].end == Time::us(20'005));
  // Bounded loss e = 0.5 on these gradient sends: each carries 5e7 B, sharing 10 GB/s:
  // 5 us + 1e8 / 1e10 = 10.005 ms both. e = 0: the lossless timeline, span for span.
  strategies::TransportPolicy lossy;
  lossy.loss_bound = 0.5;
  const auto halved = run(lossy);
  CHECK(halved.spans[early].end == Time::us(10'005));
  CHECK(halved.spans[late].end == Time::us(10'005));
  strategies::TransportPolicy zero;
  zero.loss_bound = 0.0;
  const auto same = run(zero);
  REQUIRE(same.spans.size() == plain.spans.size());
  for (std::size_t i = 0; i < same.spans.size(); ++i) {
    CHECK(same.spans[i].start == plain.spans[i].start);
    CHECK(same.spans[i].end == plain.spans[i].end);
  }
}

TEST_CASE("transport: which ops are gradient messages, and classes by layer") {
  strategies::Op op;
  op.stream = strategies::Stream::dp_comm;
  op.work =
      strategies::Collective{strategies::CollectiveKind::all_reduce, DType::bf16, 0, Bytes(8)};
  CHECK(strategies::is_gradient_message(op));
  op.work =
      strategies::Collective{strategies::CollectiveKind::all_gather, DType::bf16, 0, Bytes(8)};
  CHECK_FALSE(strategies::is_gradient_message(op));  // parameters
  op.work = strategies::Send{1, Bytes(8)};
  op.phase = strategies::Phase::backward;
  CHECK(strategies::is_gradient_message(op));  // a parameter server's push
  op.phase = strategies::Phase::forward;
  CHECK_FALSE(strategies::is_gradient_message(op));  // a pull ahead of the forward
  op.stream = strategies::Stream::pp_send;
  op.phase = strategies::Phase::backward;
  CHECK_FALSE(strategies::is_gradient_message(op));
  // 24 layers in 4 classes: layers 0-5 class 0, 6-11 class 1, ..., 18-23 class 3; none: 3.
  strategies::TransportPolicy p;
  p.priority = PriorityPolicy::layer;
  p.classes = 4;
  const std::pair<int, int> expected[] = {{0, 0}, {5, 0}, {6, 1}, {17, 2}, {23, 3}, {-1, 3}};
  for (const auto& [layer, klass] : expected) {
    op.layer_begin = static_cast<std::int16_t>(layer);
    CHECK(p.class_of(op, 24) == klass);
  }
}

TEST_CASE("spraying: the replica symmetry is refused, saying why") {
  // Two data-parallel replicas on a two-rack fat-tree: with ECMP the symmetry holds; spraying
  // splits flows over paths the symmetry does not follow, so it is refused.
  auto cluster = fat_tree_4x2();
  sim::ReplicaMap m;
  m.replicas = 2;
  for (int r = 0; r < 8; ++r) {
    m.replica.push_back(r / 4);
    m.next.push_back((r + 4) % 8);
  }
  const auto topology = hw::build_topology(cluster);
  std::string why;
  CHECK(sim::flow_symmetry(cluster, topology, m, sim::FlowSymmetry::Mode::reduce, why));
  cluster.load_balancing = hw::LoadBalancing::spray;
  CHECK_FALSE(sim::flow_symmetry(cluster, topology, m, sim::FlowSymmetry::Mode::reduce, why));
  CHECK(why.find("load_balancing spray") != std::string::npos);
}

TEST_CASE(
    "priorities: fifo serves the message started first; layer lets a later, earlier layer pass") {
  // Rank 1 sends layer 3's gradient (1e8 B) to rank 2 at once; rank 0 sends layer 0's (1e8 B)
  // after a measured 1 ms kernel. Both cross rank 2's NIC (10 GB/s, 5 us latency).
  // fifo: layer 3's message started first and gets the whole link: 5 us + 1e8 / 1e10 =
  //   10.005 ms; layer 0's waits for it, then takes 10 ms: 20.005 ms (work-conserving).
  // layer (2 classes, strict): layer 0's message (class 0) takes the link from its start s:
  //   s + 10.005 ms; layer 3's (class 1) gets what is left, 2e8 B in all: 20.005 ms.
  using strategies::OpId;
  strategies::Program p(4);
  OpId early = 0, late = 0;
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    for (int layer : {3, 0}) {
      strategies::OpInfo info = testing::gradient_info(layer);
      const int sender = layer == 0 ? 0 : 1;
      if (r == sender) {
        std::vector<strategies::OpId> after;
        if (layer == 0) {
          strategies::OpInfo wait;
          const auto kernels =
              p.add_kernels({strategies::Kernel{strategies::Measured{Time::ms(1)}, "wait"}});
          after.push_back(p.add(strategies::Compute{kernels}, wait));
        }
        (layer == 0 ? early : late) = p.add(strategies::Send{2, Bytes(100'000'000)}, info, after);
      } else if (r == 2) {
        if (layer == 0) info.stream = strategies::Stream::pp_recv;
        p.add(strategies::Recv{sender, Bytes(100'000'000)}, info);
      }
    }
  }
  p.finish();
  auto run = [&](const strategies::TransportPolicy& transport) {
    return simulate_with(p, transport);
  };
  strategies::TransportPolicy fifo;
  fifo.priority = PriorityPolicy::fifo;
  const auto first_in = run(fifo);
  CHECK(first_in.spans[late].end == Time::us(10'005));
  CHECK(first_in.spans[early].end == Time::us(20'005));
  const auto layered = run(policy(LinkScheduling::strict));
  CHECK(layered.spans[early].end - layered.spans[early].start == Time::us(10'005));
  CHECK(layered.spans[early].start > Time::ms(1) - Time::us(1));
  CHECK(layered.spans[late].end == Time::us(20'005));
}

TEST_CASE("detached sends: one rank's messages in flight together, ordered by the policy") {
  // Rank 0 sends layer 3's gradient, then layer 0's (1e8 B each) to rank 2 as detached sends
  // on its one dp_comm stream: both end at once (0 s) and both transfers run together through
  // rank 2's NIC (10 GB/s, 5 us latency); rank 2 receives them on two streams.
  // none: they share the link: both arrive at 5 us + 2e8 / 1e10 = 20.005 ms.
  // layer (2 classes, strict): layer 0 first: 10.005 ms, then layer 3: 20.005 ms.
  // fifo: layer 3's started first: 10.005 ms, then layer 0's: 20.005 ms.
  using strategies::OpId;
  strategies::Program p(4);
  std::array<OpId, 2> sends{}, receives{};
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    for (int k = 0; k < 2; ++k) {
      const int layer = k == 0 ? 3 : 0;
      strategies::OpInfo info = testing::gradient_info(layer);
      if (r == 0) {
        const strategies::Send send = testing::detached_send(2, Bytes(100'000'000));
        sends[static_cast<std::size_t>(k)] = p.add(send, info);
      } else if (r == 2) {
        if (k == 1) info.stream = strategies::Stream::pp_recv;
        receives[static_cast<std::size_t>(k)] =
            p.add(strategies::Recv{0, Bytes(100'000'000)}, info);
      }
    }
  }
  p.finish();
  auto run = [&](const strategies::TransportPolicy& transport) {
    auto timeline = simulate_with(p, transport);
    for (OpId s : sends) CHECK(timeline.spans[s].end == Time::zero());
    return timeline;
  };
  const auto shared = run({});
  CHECK(shared.spans[receives[0]].end == Time::us(20'005));
  CHECK(shared.spans[receives[1]].end == Time::us(20'005));
  const auto layered = run(policy(LinkScheduling::strict));
  CHECK(layered.spans[receives[1]].end == Time::us(10'005));
  CHECK(layered.spans[receives[0]].end == Time::us(20'005));
  strategies::TransportPolicy fifo;
  fifo.priority = PriorityPolicy::fifo;
  const auto first_in = run(fifo);
  CHECK(first_in.spans[receives[0]].end == Time::us(10'005));
  CHECK(first_in.spans[receives[1]].end == Time::us(20'005));
}

namespace {

/// Rank 2 of two_nodes() as an event-driven rank (strategies::Program::event_driven) or not:
/// rank 0 sends it 1e8 B and rank 1 sends it 1e7 B (detached, at 0 s); rank 2 receives them in
/// that order on its pp-recv stream, and after each receive runs a compute of `work` (`work_a`
/// after A, `work_b` after B) on its compute stream. Returns the spans of rank 2's ops:
/// receive A, receive B, compute A, compute B.
std::array<traces::Span, 4> receive_and_compute(bool event_driven, Time work_a, Time work_b) {
  using strategies::OpId;
  strategies::Program p(4);
  std::array<OpId, 4> ids{};
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    strategies::OpInfo info;
    info.stream = strategies::Stream::dp_comm;
    if (r < 2) {
      const strategies::Send send =
          testing::detached_send(2, Bytes(r == 0 ? 100'000'000 : 10'000'000));
      p.add(send, info);
    } else if (r == 2) {
      if (event_driven) p.set_event_driven(2);
      info.stream = strategies::Stream::pp_recv;
      ids[0] = p.add(strategies::Recv{0, Bytes(100'000'000)}, info);
      ids[1] = p.add(strategies::Recv{1, Bytes(10'000'000)}, info);
      info.stream = strategies::Stream::compute;
      const std::array<OpId, 1> after_a = {ids[0]}, after_b = {ids[1]};
      ids[2] = p.add(testing::measured(p, work_a), info, after_a);
      ids[3] = p.add(testing::measured(p, work_b), info, after_b);
    }
  }
  p.finish();
  strategies::validate(p);
  const auto timeline = simulate_with(p, {});
  std::array<traces::Span, 4> out;
  for (std::size_t k = 0; k < 4; ++k) out[k] = timeline.spans[ids[k]];
  return out;
}

}  // namespace

TEST_CASE("event-driven ranks: no stream order, and a stream's computes one at a time") {
  // Both messages cross rank 2's NIC (10 GB/s, 5 us latency) together, sharing it: B (1e7 B)
  // arrives at 5 us + 2e7 / 1e10 s = 2.005 ms; A (1e8 B) gets the whole link after that and
  // arrives at 5 us + 1.1e8 / 1e10 s = 11.005 ms.
  SUBCASE("event-driven: B's receive and compute do not wait for A's") {
    // Receive B ends when its data is in (2.005 ms); compute B (20 ms) runs 2.005 - 22.005 ms.
    // Compute A is ready at 11.005 ms but its stream is busy with B: 22.005 - 23.005 ms.
    const auto s = receive_and_compute(true, Time::ms(1), Time::ms(20));
    CHECK(s[1].end == Time::us(2'005));
    CHECK(s[0].end == Time::us(11'005));
    CHECK(s[3].start == Time::us(2'005));
    CHECK(s[3].end == Time::us(22'005));
    CHECK(s[2].start == Time::us(22'005));
    CHECK(s[2].end == Time::us(23'005));
  }
  SUBCASE("event-driven: computes run in the order they become ready") {
    // Compute B (1 ms) runs 2.005 - 3.005 ms; compute A (1 ms) at 11.005 - 12.005 ms.
    const auto s = receive_and_compute(true, Time::ms(1), Time::ms(1));
    CHECK(s[3].start == Time::us(2'005));
    CHECK(s[2].start == Time::us(11'005));
    CHECK(s[2].end == Time::us(12'005));
  }
  SUBCASE("in stream order (the default): B waits behind A") {
    // Receive B starts when receive A ends (11.005 ms; its data is in: it ends then too);
    // compute A runs 11.005 - 12.005 ms, compute B after it, 12.005 - 32.005 ms.
    const auto s = receive_and_compute(false, Time::ms(1), Time::ms(20));
    CHECK(s[0].end == Time::us(11'005));
    CHECK(s[1].end == Time::us(11'005));
    CHECK(s[2].start == Time::us(11'005));
    CHECK(s[3].start == Time::us(12'005));
    CHECK(s[3].end == Time::us(32'005));
  }
}

TEST_CASE("priorities: FIFO within a class orders one class's transfers by start") {
  // Rank 0 sends three detached 1e8 B messages to rank 2 at 0 s, in this order: layer 3's,
  // layer 0's, layer 1's (4 layers, 2 classes: layers 0-1 class 0, layers 2-3 class 1). Rank 2
  // is event-driven, so its three receives are all posted at 0 s. Each message alone takes
  // 1e8 / 1e10 s = 10 ms through rank 2's NIC, plus 5 us.
  // fair within a class: layers 0 and 1 share the link and arrive together at 20.005 ms; then
  //   layer 3 alone: 30.005 ms.
  // fifo within a class: layer 0 (started before layer 1) at 10.005 ms, layer 1 at 20.005 ms,
  //   layer 3 at 30.005 ms.
  using strategies::OpId;
  strategies::Program p(4);
  std::array<OpId, 3> receives{};
  const std::array<int, 3> layers = {3, 0, 1};
  for (int r = 0; r < 4; ++r) {
    p.begin_rank(r);
    if (r == 2) p.set_event_driven(2);
    for (std::size_t k = 0; k < 3; ++k) {
      strategies::OpInfo info = testing::gradient_info(layers[k]);
      if (r == 0) {
        const strategies::Send send = testing::detached_send(2, Bytes(100'000'000));
        p.add(send, info);
      } else if (r == 2) {
        info.stream = strategies::Stream::pp_recv;
        receives[k] = p.add(strategies::Recv{0, Bytes(100'000'000)}, info);
      }
    }
  }
  p.finish();
  auto layered = policy(LinkScheduling::strict);
  const auto fair = simulate_with(p, layered);
  CHECK(fair.spans[receives[1]].end == Time::us(20'005));
  CHECK(fair.spans[receives[2]].end == Time::us(20'005));
  CHECK(fair.spans[receives[0]].end == Time::us(30'005));
  layered.within_class = strategies::ClassOrder::fifo;
  const auto ordered = simulate_with(p, layered);
  CHECK(ordered.spans[receives[1]].end == Time::us(10'005));
  CHECK(ordered.spans[receives[2]].end == Time::us(20'005));
  CHECK(ordered.spans[receives[0]].end == Time::us(30'005));
}

TEST_CASE("transport: within_class \"fifo\" needs a class policy and strict scheduling") {
  strategies::TransportPolicy t;
  t.within_class = strategies::ClassOrder::fifo;
  auto path_of_error = [&]() -> std::string {
    try {
      t.validate();
    } catch (const config::ValidationError& e) {
      return e.path();
    }
    return "";
  };
  for (auto p : {PriorityPolicy::none, PriorityPolicy::fifo}) {
    t.priority = p;
    CHECK(path_of_error() == "within_class");
  }
  t.priority = PriorityPolicy::layer;
  CHECK(path_of_error().empty());
  t.scheduling = LinkScheduling::weighted;
  t.weights.assign(static_cast<std::size_t>(t.classes), 1.0);
  CHECK(path_of_error() == "within_class");
}
