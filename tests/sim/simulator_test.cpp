#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/helpers.hpp"
#include "sim/simulator.hpp"

using namespace stratasim;
using strategies::Collective;
using strategies::CollectiveKind;
using strategies::MemoryCategory;
using strategies::MemoryEffect;
using strategies::MemoryTier;
using strategies::OpId;
using strategies::OpInfo;
using strategies::Program;
using strategies::Recv;
using strategies::Send;
using strategies::Stream;
using testing::measured;

// The test cluster: one node of 8 devices, intra-node 100 GB/s and 1 us per message, 1000 bytes
// of device memory.

namespace {

void check_span(const traces::Timeline& t, OpId op, Time start, Time end) {
  INFO("op " << op);
  REQUIRE(op < t.spans.size());
  CHECK(t.spans[op].op == op);
  CHECK(t.spans[op].start == start);
  CHECK(t.spans[op].end == end);
}

OpInfo on(Stream s, std::string_view label = {}) {
  OpInfo info;
  info.stream = s;
  info.label = label;
  return info;
}

struct Recorder : sim::Observer {
  std::vector<traces::Span> spans;
  std::vector<traces::MemorySample> samples;
  void on_span(const traces::Span& s) override { spans.push_back(s); }
  void on_memory(const traces::MemorySample& m) override { samples.push_back(m); }
};

bool same(const traces::Span& a, const traces::Span& b) {
  return a.rank == b.rank && a.stream == b.stream && a.op == b.op && a.start == b.start &&
         a.end == b.end;
}

bool same(const traces::MemorySample& a, const traces::MemorySample& b) {
  return a.rank == b.rank && a.tier == b.tier && a.time == b.time && a.total == b.total &&
         a.op == b.op;
}

}  // namespace

TEST_CASE("simulator: compute, all-reduce and a dependent compute on two ranks") {
  Program p(2);
  auto g = p.add_group({0, 1}, "tp 0");
  const Collective ar{CollectiveKind::all_reduce, DType::bf16, g, Bytes(100'000'000)};
  OpId ids[2][3];
  for (int r = 0; r < 2; ++r) {
    p.begin_rank(r);
    OpId a = p.add(measured(p, Time::us(r == 0 ? 10 : 30)), on(Stream::compute, "a"));
    OpId c = p.add(ar, on(Stream::tp_comm, "ar"), std::vector<OpId>{a});
    OpId b = p.add(measured(p, Time::us(5)), on(Stream::compute, "b"), std::vector<OpId>{c});
    ids[r][0] = a;
    ids[r][1] = c;
    ids[r][2] = b;
  }
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster());
  REQUIRE(t.completed);
  CHECK(t.problem.empty());
  CHECK(t.world_size == 2);
  REQUIRE(t.spans.size() == 6);
  // Rank 0 reaches the all-reduce at 10 us, rank 1 at 30 us: data moves from 30 us for
  // 2*1/2 * 1e8 B / 1e11 B/s = 1 ms plus 2 * 1 us, until 1032 us; then b runs 5 us on each.
  check_span(t, ids[0][0], Time::zero(), Time::us(10));
  check_span(t, ids[1][0], Time::zero(), Time::us(30));
  for (int r = 0; r < 2; ++r) {
    check_span(t, ids[r][1], Time::us(30), Time::us(1032));
    check_span(t, ids[r][2], Time::us(1032), Time::us(1037));
    const traces::Span& transfer = t.spans[ids[r][1]];  // const: rank and stream are bit-fields
    CHECK(transfer.rank == r);
    CHECK(transfer.stream == Stream::tp_comm);
  }
  // 4 compute ends and one network completion.
  CHECK(t.events == 5);
  CHECK(t.out_of_memory.empty());
}

TEST_CASE("simulator: send and recv rendezvous") {
  Program p(2);
  p.begin_rank(0);
  OpId c0 = p.add(measured(p, Time::us(50)), on(Stream::compute));
  OpId send = p.add(Send{1, Bytes(1'000'000)}, on(Stream::pp_send), std::vector<OpId>{c0});
  p.begin_rank(1);
  OpId recv = p.add(Recv{0, Bytes(1'000'000)}, on(Stream::pp_recv));
  OpId d = p.add(measured(p, Time::us(7)), on(Stream::compute), std::vector<OpId>{recv});
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster());
  REQUIRE(t.completed);
  // The recv is posted at 0 but waits for the send at 50 us; the message takes
  // 1 us + 1e6 B / 1e11 B/s = 11 us.
  check_span(t, c0, Time::zero(), Time::us(50));
  check_span(t, send, Time::us(50), Time::us(61));
  check_span(t, recv, Time::us(50), Time::us(61));
  check_span(t, d, Time::us(61), Time::us(68));
}

TEST_CASE("simulator: streams run in order, dependencies cross streams") {
  Program p(1);
  p.begin_rank(0);
  OpId x = p.add(measured(p, Time::us(20)), on(Stream::compute, "x"));
  OpId w = p.add(measured(p, Time::us(7)), on(Stream::compute, "w"));
  OpId y = p.add(measured(p, Time::us(5)), on(Stream::copy, "y"), std::vector<OpId>{x});
  OpId z = p.add(measured(p, Time::us(3)), on(Stream::copy, "z"));
  OpId v = p.add(measured(p, Time::us(4)), on(Stream::host, "v"));
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster());
  REQUIRE(t.completed);
  check_span(t, x, Time::zero(), Time::us(20));
  check_span(t, w, Time::us(20), Time::us(27));  // after x on the same stream
  check_span(t, y, Time::us(20), Time::us(25));  // waits for x on another stream
  check_span(t, z, Time::us(25), Time::us(28));  // after y on its stream
  check_span(t, v, Time::zero(), Time::us(4));   // independent
}

TEST_CASE("simulator: a single-rank collective takes no time") {
  Program p(2);
  auto g = p.add_group({1}, "solo");
  p.begin_rank(1);
  OpId a = p.add(measured(p, Time::us(3)), on(Stream::compute));
  OpId c = p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(1 << 20)},
                 on(Stream::compute));
  OpId b = p.add(measured(p, Time::us(2)), on(Stream::compute));
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster());
  REQUIRE(t.completed);
  check_span(t, a, Time::zero(), Time::us(3));
  check_span(t, c, Time::us(3), Time::us(3));
  check_span(t, b, Time::us(3), Time::us(5));
}

TEST_CASE("simulator: memory peaks by category and out of memory") {
  Program p(2);
  const MemoryEffect alloc_act{Bytes(500), MemoryCategory::activations, MemoryTier::device, false};
  const MemoryEffect host_buf{Bytes(123), MemoryCategory::comm_buffers, MemoryTier::host, true};
  const MemoryEffect alloc_ws{Bytes(300), MemoryCategory::workspace, MemoryTier::device, false};
  const MemoryEffect free_ws{Bytes(-300), MemoryCategory::workspace, MemoryTier::device, true};
  const MemoryEffect free_act{Bytes(-500), MemoryCategory::activations, MemoryTier::device, true};
  for (int r = 0; r < 2; ++r) {
    p.add_initial_memory(r, {MemoryCategory::parameters, MemoryTier::device, Bytes(300)});
  }
  p.begin_rank(0);
  std::vector<MemoryEffect> a_effects{alloc_act, host_buf};
  std::vector<MemoryEffect> b_effects{alloc_ws, free_ws};
  std::vector<MemoryEffect> c_effects{free_act};
  OpId a = p.add(measured(p, Time::us(5)), on(Stream::compute, "a"), {}, a_effects);
  OpId b = p.add(measured(p, Time::us(5)), on(Stream::compute, "b"), {}, b_effects);
  OpId c = p.add(measured(p, Time::us(5)), on(Stream::compute, "c"), {}, c_effects);
  p.begin_rank(1);
  std::vector<MemoryEffect> d_effects{
      MemoryEffect{Bytes(100), MemoryCategory::activations, MemoryTier::device, false}};
  OpId d = p.add(measured(p, Time::us(5)), on(Stream::compute, "d"), {}, d_effects);
  p.finish();

  auto t = sim::simulate(p, testing::test_cluster());
  REQUIRE(t.completed);
  // Rank 0: 300 at start; a allocates 500 at 0 (800); a's end adds 123 on the host at 5 us;
  // b allocates 300 at 5 us (1100, over the 1000 bytes); b frees 300 at 10 us (800); c frees
  // 500 at 15 us (300). Rank 1: 300 at start; d allocates 100 at 0 (400).
  struct Expected {
    std::int32_t rank;
    MemoryTier tier;
    Time time;
    std::int64_t total;
    OpId op;
  };
  const std::vector<Expected> expected{
      {0, MemoryTier::device, Time::zero(), 300, a}, {1, MemoryTier::device, Time::zero(), 300, d},
      {0, MemoryTier::device, Time::zero(), 800, a}, {1, MemoryTier::device, Time::zero(), 400, d},
      {0, MemoryTier::host, Time::us(5), 123, a},    {0, MemoryTier::device, Time::us(5), 1100, b},
      {0, MemoryTier::device, Time::us(10), 800, b}, {0, MemoryTier::device, Time::us(15), 300, c},
  };
  REQUIRE(t.memory.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("sample " << i);
    CHECK(t.memory[i].rank == expected[i].rank);
    CHECK(t.memory[i].tier == expected[i].tier);
    CHECK(t.memory[i].time == expected[i].time);
    CHECK(t.memory[i].total == Bytes(expected[i].total));
    CHECK(t.memory[i].op == expected[i].op);
  }

  REQUIRE(t.ranks.size() == 2);
  const auto& dev0 = t.ranks[0].tiers[static_cast<std::size_t>(MemoryTier::device)];
  CHECK(dev0.capacity == Bytes(1000));
  CHECK(dev0.peak == Bytes(1100));
  CHECK(dev0.time == Time::us(5));
  CHECK(dev0.op == b);
  CHECK(dev0.breakdown[static_cast<std::size_t>(MemoryCategory::parameters)] == Bytes(300));
  CHECK(dev0.breakdown[static_cast<std::size_t>(MemoryCategory::activations)] == Bytes(500));
  CHECK(dev0.breakdown[static_cast<std::size_t>(MemoryCategory::workspace)] == Bytes(300));
  CHECK(dev0.breakdown[static_cast<std::size_t>(MemoryCategory::gradients)] == Bytes(0));
  const auto& host0 = t.ranks[0].tiers[static_cast<std::size_t>(MemoryTier::host)];
  CHECK(host0.capacity == Bytes(0));
  CHECK(host0.peak == Bytes(123));
  const auto& dev1 = t.ranks[1].tiers[static_cast<std::size_t>(MemoryTier::device)];
  CHECK(dev1.peak == Bytes(400));
  CHECK(dev1.time == Time::zero());
  CHECK(dev1.op == d);

  // Only rank 0's device runs out, first at b; the host tier is not modelled.
  REQUIRE(t.out_of_memory.size() == 1);
  CHECK(t.out_of_memory[0].rank == 0);
  CHECK(t.out_of_memory[0].tier == MemoryTier::device);
  CHECK(t.out_of_memory[0].capacity == Bytes(1000));
  CHECK(t.out_of_memory[0].peak == Bytes(1100));
  CHECK(t.out_of_memory[0].first_op == b);
  CHECK(t.out_of_memory[0].time == Time::us(5));
}

TEST_CASE("simulator: a planted send/recv deadlock is reported, not hung") {
  Program p(2);
  p.begin_rank(0);
  OpId r0 = p.add(Recv{1, Bytes(64)}, on(Stream::compute));
  p.add(Send{1, Bytes(64)}, on(Stream::compute));
  p.begin_rank(1);
  OpId r1 = p.add(Recv{0, Bytes(64)}, on(Stream::compute));
  p.add(Send{0, Bytes(64)}, on(Stream::compute));
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster());
  CHECK_FALSE(t.completed);
  CHECK(t.spans.empty());
  INFO(t.problem);
  CHECK(t.problem.find("deadlock: 4 ops never ran; waiting:") == 0);
  CHECK(t.problem.find(p.describe(r0) + " waits for rank 1 to post the matching send") !=
        std::string::npos);
  CHECK(t.problem.find(p.describe(r1) + " waits for rank 0 to post the matching send") !=
        std::string::npos);
  CHECK(t.problem.find(p.describe(r0)) < t.problem.find(p.describe(r1)));
}

TEST_CASE("simulator: missing collective members and cyclic dependencies are named") {
  Program p(3);
  auto g = p.add_group({0, 1, 2}, "dp 0");
  const Collective ar{CollectiveKind::all_reduce, DType::bf16, g, Bytes(1024)};
  p.begin_rank(0);
  OpId c0 = p.add(ar, on(Stream::dp_comm));
  p.begin_rank(1);
  // x waits for y, y waits for x: neither runs, so rank 1 never reaches the collective.
  OpId x = p.add(measured(p, Time::us(1)), on(Stream::compute, "x"), std::vector<OpId>{2});
  OpId y = p.add(measured(p, Time::us(1)), on(Stream::copy, "y"), std::vector<OpId>{x});
  REQUIRE(y == 2);
  p.add(ar, on(Stream::dp_comm), std::vector<OpId>{y});
  p.begin_rank(2);
  OpId ok = p.add(measured(p, Time::us(2)), on(Stream::compute, "fine"));
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster());
  CHECK_FALSE(t.completed);
  INFO(t.problem);
  CHECK(t.problem.find("deadlock: 4 ops never ran; waiting:") == 0);
  CHECK(t.problem.find(p.describe(c0) + " waits for ranks 1, 2 to reach this collective") !=
        std::string::npos);
  CHECK(t.problem.find(p.describe(x) + " waits for " + p.describe(y) + " (dependency)") !=
        std::string::npos);
  CHECK(t.problem.find(p.describe(y) + " waits for " + p.describe(x) + " (dependency)") !=
        std::string::npos);
  // What could run did, and is recorded.
  REQUIRE(t.spans.size() == 1);
  CHECK(t.spans[0].op == ok);
  CHECK(t.spans[0].end == Time::us(2));
}

TEST_CASE("simulator: a long deadlock report is cut after 12 lines") {
  Program p(20);
  for (int r = 0; r < 20; ++r) {
    p.begin_rank(r);
    p.add(Recv{(r + 1) % 20, Bytes(8)}, on(Stream::pp_recv));
  }
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster(3, 8));
  CHECK_FALSE(t.completed);
  INFO(t.problem);
  CHECK(t.problem.find("deadlock: 20 ops never ran; waiting:") == 0);
  CHECK(t.problem.find("... and 8 more") != std::string::npos);
  CHECK(t.problem.find(p.describe(11)) != std::string::npos);
  CHECK(t.problem.find(p.describe(12)) == std::string::npos);
}

namespace {

/// A pseudo-random program: per rank a few rounds of compute, a tensor-parallel all-reduce,
/// a pipeline send or recv, and memory effects.
Program random_program(int ranks, int rounds) {
  Program p(ranks);
  std::vector<std::uint32_t> tp;
  for (int r = 0; r < ranks; r += 2) tp.push_back(p.add_group({r, r + 1}, "tp"));
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int64_t>(state >> 33);
  };
  std::vector<std::uint32_t> lists;
  for (int i = 0; i < 16; ++i) {
    lists.push_back(p.add_kernels(
        {strategies::Kernel{strategies::Measured{Time::ns(100 + next() % 5000)}, "k"}}));
  }
  for (int r = 0; r < ranks; ++r) {
    p.begin_rank(r);
    const auto group = tp[static_cast<std::size_t>(r / 2)];
    for (int i = 0; i < rounds; ++i) {
      const MemoryEffect act{Bytes(1 + next() % 100), MemoryCategory::activations,
                             MemoryTier::device, false};
      OpId c = p.add(strategies::Compute{lists[static_cast<std::size_t>(next() % 16)]},
                     on(Stream::compute), {}, std::vector<MemoryEffect>{act});
      p.add(Collective{CollectiveKind::all_reduce, DType::bf16, group, Bytes(1 + next() % 100000)},
            on(Stream::tp_comm), std::vector<OpId>{c});
      // Pairs of pairs exchange: even stages send forward, odd ones receive.
      const int stage = r / 2;
      const int peer = (stage % 2 == 0 ? r + 2 : r - 2);
      if (peer >= 0 && peer < ranks) {
        if (stage % 2 == 0) {
          p.add(Send{peer, Bytes(1000 * (i + 1))}, on(Stream::pp_send), std::vector<OpId>{c});
        } else {
          p.add(Recv{peer, Bytes(1000 * (i + 1))}, on(Stream::pp_recv));
        }
      }
    }
  }
  p.finish();
  return p;
}

}  // namespace

TEST_CASE("simulator: equal inputs give identical spans and samples") {
  const Program p = random_program(8, 50);
  const auto cluster = testing::test_cluster(1, 8, Bytes(1'000'000));
  auto t1 = sim::simulate(p, cluster);
  auto t2 = sim::simulate(p, cluster);
  REQUIRE(t1.completed);
  REQUIRE(t1.spans.size() == p.op_count());
  REQUIRE(t1.spans.size() == t2.spans.size());
  for (std::size_t i = 0; i < t1.spans.size(); ++i) CHECK(same(t1.spans[i], t2.spans[i]));
  REQUIRE(t1.memory.size() == t2.memory.size());
  for (std::size_t i = 0; i < t1.memory.size(); ++i) CHECK(same(t1.memory[i], t2.memory[i]));
  CHECK(t1.events == t2.events);

  // Observers see the same spans and samples when the timeline keeps none.
  Recorder recorder;
  sim::SimOptions quiet;
  quiet.record_spans = false;
  quiet.record_memory = false;
  quiet.observers.push_back(&recorder);
  auto t3 = sim::simulate(p, cluster, quiet);
  CHECK(t3.completed);
  CHECK(t3.spans.empty());
  CHECK(t3.memory.empty());
  REQUIRE(recorder.spans.size() == t1.spans.size());
  for (const auto& s : recorder.spans) CHECK(same(s, t1.spans[s.op]));
  REQUIRE(recorder.samples.size() == t1.memory.size());
  for (std::size_t i = 0; i < t1.memory.size(); ++i) {
    CHECK(same(recorder.samples[i], t1.memory[i]));
  }
  CHECK(t3.ranks[3].tiers[0].peak == t1.ranks[3].tiers[0].peak);
}

TEST_CASE("simulator: an empty program completes at once") {
  Program p(4);
  p.finish();
  auto t = sim::simulate(p, testing::test_cluster());
  CHECK(t.completed);
  CHECK(t.spans.empty());
  CHECK(t.events == 0);
  CHECK(t.ranks.size() == 4);
}

namespace {

/// Every transfer takes 7 us, whatever it carries; remembers what it was asked.
class FixedNetwork final : public sim::Network {
 public:
  std::vector<sim::TransferRequest> requests;
  void start(sim::TransferId id, const sim::TransferRequest& request, Time now) override {
    requests.push_back(request);
    active_.push_back({now + Time::us(7), id});
  }
  Time next_completion() const override {
    Time t = Time::infinity();
    for (const auto& a : active_) t = std::min(t, a.first);
    return t;
  }
  void advance_to(Time t, std::vector<sim::TransferId>& finished) override {
    std::vector<std::pair<Time, sim::TransferId>> keep;
    for (const auto& a : active_) {
      if (a.first <= t) {
        finished.push_back(a.second);
      } else {
        keep.push_back(a);
      }
    }
    active_ = keep;
  }

 private:
  std::vector<std::pair<Time, sim::TransferId>> active_;
};

}  // namespace

TEST_CASE("simulator: a given network model carries the transfers") {
  Program p(2);
  auto g = p.add_group({0, 1}, "dp 0");
  p.begin_rank(0);
  OpId ag = p.add(Collective{CollectiveKind::all_gather, DType::bf16, g, Bytes(4096)},
                  on(Stream::dp_comm));
  OpId send = p.add(Send{1, Bytes(512)}, on(Stream::pp_send), std::vector<OpId>{ag});
  p.begin_rank(1);
  p.add(Collective{CollectiveKind::all_gather, DType::bf16, g, Bytes(4096)}, on(Stream::dp_comm));
  OpId recv = p.add(Recv{0, Bytes(512)}, on(Stream::pp_recv));
  p.finish();
  FixedNetwork net;
  auto t = sim::simulate(p, testing::test_cluster(), net);
  REQUIRE(t.completed);
  // The all-gather takes 7 us from 0; the message, sent after it, 7 us more.
  check_span(t, ag, Time::zero(), Time::us(7));
  check_span(t, send, Time::us(7), Time::us(14));
  check_span(t, recv, Time::us(7), Time::us(14));
  REQUIRE(net.requests.size() == 2);
  CHECK(net.requests[0].collective);
  CHECK(net.requests[0].kind == CollectiveKind::all_gather);
  CHECK(net.requests[0].group == g);
  CHECK(net.requests[0].bytes == Bytes(4096));
  CHECK_FALSE(net.requests[1].collective);
  CHECK(net.requests[1].src == 0);
  CHECK(net.requests[1].dst == 1);
  CHECK(net.requests[1].bytes == Bytes(512));
  CHECK(t.events == 2);
}
