// strategies::Matching on hand-built programs: the expected pairings are written out by hand
// from the rule of strategies/program.hpp.
#include <doctest/doctest.h>

#include <vector>

#include "strategies/matching.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

OpInfo on(Stream s) {
  OpInfo i;
  i.stream = s;
  return i;
}

Collective all_reduce(std::uint32_t group, std::int64_t bytes, DType dtype = DType::bf16) {
  return Collective{CollectiveKind::all_reduce, dtype, group, Bytes(bytes)};
}

std::vector<OpId> ops_at(const Matching& m, std::uint32_t rv) {
  const auto ops = m.ops_of(rv);
  return {ops.begin(), ops.end()};
}

}  // namespace

TEST_CASE("matching: collectives are numbered per group, whatever the interleaving and streams") {
  // Groups A = {0, 1}, B = {1, 2}, W = {0, 1, 2}; each rank interleaves them differently.
  Program p(3);
  const auto a = p.add_group({0, 1}, "A");
  const auto b = p.add_group({2, 1}, "B");  // members in any order
  const auto w = p.add_group({0, 1, 2}, "W");
  p.begin_rank(0);
  p.add(all_reduce(a, 10), on(Stream::tp_comm));  // op 0: A #0
  p.add(all_reduce(w, 20), on(Stream::dp_comm));  // op 1: W #0
  p.add(all_reduce(a, 30), on(Stream::dp_comm));  // op 2: A #1
  p.begin_rank(1);
  p.add(all_reduce(w, 20), on(Stream::dp_comm));  // op 3: W #0
  p.add(all_reduce(b, 40), on(Stream::tp_comm));  // op 4: B #0
  p.add(all_reduce(a, 10), on(Stream::tp_comm));  // op 5: A #0
  p.add(all_reduce(a, 30), on(Stream::tp_comm));  // op 6: A #1
  p.begin_rank(2);
  p.add(all_reduce(b, 40), on(Stream::copy));     // op 7: B #0
  p.add(all_reduce(w, 20), on(Stream::dp_comm));  // op 8: W #0
  p.finish();
  const Matching m(p);

  // Dense ids: A's two rendezvous, then B's, then W's; no channels.
  CHECK(m.rendezvous_count() == 4);
  CHECK(m.collective_rendezvous() == 4);
  CHECK(m.channels().empty());
  CHECK(m.collectives_on(a) == 2);
  CHECK(m.collectives_on(b) == 1);
  CHECK(m.collectives_on(w) == 1);
  CHECK(m.rendezvous(a, 0) == 0);
  CHECK(m.rendezvous(a, 1) == 1);
  CHECK(m.rendezvous(b, 0) == 2);
  CHECK(m.rendezvous(w, 0) == 3);
  CHECK(ops_at(m, 0) == std::vector<OpId>{0, 5});
  CHECK(ops_at(m, 1) == std::vector<OpId>{2, 6});
  CHECK(ops_at(m, 2) == std::vector<OpId>{4, 7});
  CHECK(ops_at(m, 3) == std::vector<OpId>{1, 3, 8});
  const std::uint32_t expected_rv[] = {0, 3, 1, 3, 2, 0, 1, 2, 3};
  const std::uint32_t expected_k[] = {0, 0, 1, 0, 0, 0, 1, 0, 0};
  for (OpId id = 0; id < 9; ++id) {
    CAPTURE(id);
    CHECK(m.rendezvous_of(id) == expected_rv[id]);
    CHECK(m.sequence(id) == expected_k[id]);
  }
  for (std::uint32_t rv = 0; rv < 4; ++rv) {
    CHECK(m.is_collective(rv));
    CHECK(m.complete(rv));
  }
  CHECK(m.group_of(2) == b);
  CHECK(m.sequence_of(1) == 1);
  CHECK(m.expected(3) == 3);
  const auto members_b = m.issuing_members(b);
  CHECK(std::vector<std::int32_t>(members_b.begin(), members_b.end()) ==
        std::vector<std::int32_t>{1, 2});
  CHECK(m.issued(a, 0) == 2);
  CHECK(m.issued(a, 1) == 2);
  CHECK(m.issued(a, 2) == 0);
  CHECK(m.issued(w, 2) == 1);
  CHECK_FALSE(first_mismatch(p, m).has_value());
  CHECK_NOTHROW(validate(p, m));
}

TEST_CASE("matching: messages are numbered per direction of a pair, across streams") {
  // Three messages 0 -> 1 on three streams, one 1 -> 0 in between; rank 1 receives them on
  // other streams. Each direction counts apart.
  Program p(2);
  p.begin_rank(0);
  p.add(Send{1, Bytes(100)}, on(Stream::pp_send));  // op 0: 0->1 #0
  p.add(Recv{1, Bytes(7)}, on(Stream::pp_recv));    // op 1: 1->0 #0
  p.add(Send{1, Bytes(200)}, on(Stream::copy));     // op 2: 0->1 #1
  p.add(Send{1, Bytes(300)}, on(Stream::pp_send));  // op 3: 0->1 #2
  p.begin_rank(1);
  p.add(Recv{0, Bytes(100)}, on(Stream::host));     // op 4: 0->1 #0
  p.add(Send{0, Bytes(7)}, on(Stream::pp_send));    // op 5: 1->0 #0
  p.add(Recv{0, Bytes(200)}, on(Stream::pp_recv));  // op 6: 0->1 #1
  p.add(Recv{0, Bytes(300)}, on(Stream::host));     // op 7: 0->1 #2
  p.finish();
  const Matching m(p);

  CHECK(m.collective_rendezvous() == 0);
  REQUIRE(m.channels().size() == 2);
  const auto& c01 = m.channels()[0];
  const auto& c10 = m.channels()[1];
  CHECK(c01.src == 0);
  CHECK(c01.dst == 1);
  CHECK(c01.sends == 3);
  CHECK(c01.recvs == 3);
  CHECK(c01.first == 0);
  CHECK(c10.src == 1);
  CHECK(c10.dst == 0);
  CHECK(c10.sends == 1);
  CHECK(c10.recvs == 1);
  CHECK(c10.first == 3);
  CHECK(m.rendezvous_count() == 4);
  CHECK(ops_at(m, 0) == std::vector<OpId>{0, 4});
  CHECK(ops_at(m, 1) == std::vector<OpId>{2, 6});
  CHECK(ops_at(m, 2) == std::vector<OpId>{3, 7});
  CHECK(ops_at(m, 3) == std::vector<OpId>{1, 5});
  const std::uint32_t expected_k[] = {0, 0, 1, 2, 0, 0, 1, 2};
  for (OpId id = 0; id < 8; ++id) {
    CAPTURE(id);
    CHECK(m.sequence(id) == expected_k[id]);
  }
  CHECK(&m.channel_of(3) == &c10);
  CHECK(m.expected(2) == 2);
  CHECK(m.find_channel(1, 0) == &c10);
  CHECK(m.find_channel(0, 0) == nullptr);
  CHECK_FALSE(first_mismatch(p, m).has_value());
}

TEST_CASE("matching: mirrored ranks are stood for by their representatives") {
  // Ranks 2 and 3 mirror ranks 0 and 1 (data-parallel replicas); dp groups {0, 2} and {1, 3},
  // tp groups {0, 1} and {2, 3}.
  Program p(4);
  const auto dp0 = p.add_group({0, 2}, "dp 0");
  const auto dp1 = p.add_group({1, 3}, "dp 1");
  const auto tp0 = p.add_group({0, 1}, "tp 0");
  const auto tp1 = p.add_group({2, 3}, "tp 1");
  p.set_replica(2, 0);
  p.set_replica(3, 1);
  p.begin_rank(0);
  p.add(all_reduce(tp0, 8), on(Stream::tp_comm));   // op 0
  p.add(all_reduce(dp0, 16), on(Stream::dp_comm));  // op 1
  p.begin_rank(1);
  p.add(all_reduce(dp1, 16), on(Stream::dp_comm));  // op 2
  p.add(all_reduce(tp0, 8), on(Stream::tp_comm));   // op 3
  p.finish();
  const Matching m(p);

  // A dp collective expects its one issuing member; the mirrors' tp group has no rendezvous.
  CHECK(m.issuing_members(dp0).size() == 1);
  CHECK(m.issuing_members(tp1).empty());
  CHECK(m.collectives_on(tp1) == 0);
  CHECK(ops_at(m, m.rendezvous(dp0, 0)) == std::vector<OpId>{1});
  CHECK(ops_at(m, m.rendezvous(dp1, 0)) == std::vector<OpId>{2});
  CHECK(ops_at(m, m.rendezvous(tp0, 0)) == std::vector<OpId>{0, 3});
  CHECK(m.expected(m.rendezvous(dp0, 0)) == 1);
  CHECK(m.complete(m.rendezvous(dp0, 0)));
  CHECK_FALSE(first_mismatch(p, m).has_value());
  CHECK_NOTHROW(validate(p));
}

TEST_CASE("matching: a message to a mirrored rank never meets its partner") {
  Program p(2);
  p.set_replica(1, 0);
  p.begin_rank(0);
  p.add(Send{1, Bytes(8)}, on(Stream::pp_send));
  p.finish();
  const Matching m(p);
  REQUIRE(m.channels().size() == 1);
  CHECK_FALSE(m.complete(0));
  const auto x = first_mismatch(p, m);
  REQUIRE(x.has_value());
  CHECK(x->kind == Mismatch::Kind::message_count);
  CHECK(x->op_a == 0);
  CHECK(x->op_b == Mismatch::kNoOp);
}

TEST_CASE("matching: ops that can never meet get no rendezvous") {
  // A collective by a non-member, one on a group out of range, a send to no rank.
  Program p(3);
  const auto g = p.add_group({0, 1}, "pair");
  p.begin_rank(2);
  p.add(all_reduce(g, 8), on(Stream::tp_comm));
  p.add(all_reduce(7, 8), on(Stream::tp_comm));
  p.add(Send{5, Bytes(8)}, on(Stream::pp_send));
  p.add(Recv{-1, Bytes(8)}, on(Stream::pp_recv));
  p.add(Compute{0}, on(Stream::compute));
  p.finish();
  const Matching m(p);
  for (OpId id = 0; id < 5; ++id) {
    CAPTURE(id);
    CHECK(m.rendezvous_of(id) == Matching::kNone);
    CHECK(m.sequence(id) == Matching::kNone);
  }
  CHECK(m.rendezvous_count() == 0);
  CHECK(m.channels().empty());
}

TEST_CASE("matching: first_mismatch names the first place the ops disagree") {
  using Kind = Mismatch::Kind;
  SUBCASE("the reference (lowest issuing member) issues fewer collectives") {
    Program p(3);
    const auto g = p.add_group({2, 0, 1}, "g");
    p.begin_rank(0);
    p.add(all_reduce(g, 8), on(Stream::tp_comm));  // op 0
    p.begin_rank(1);
    p.add(all_reduce(g, 8), on(Stream::tp_comm));  // op 1
    p.add(all_reduce(g, 8), on(Stream::tp_comm));  // op 2
    p.begin_rank(2);
    p.add(all_reduce(g, 8), on(Stream::tp_comm));  // op 3
    p.add(all_reduce(g, 8), on(Stream::tp_comm));  // op 4
    p.finish();
    const auto x = first_mismatch(p, Matching(p));
    REQUIRE(x.has_value());
    CHECK(x->kind == Kind::collective_count);
    CHECK(x->k == 1);
    CHECK(x->rank_a == 0);
    CHECK(x->count_a == 1);
    CHECK(x->rank_b == 1);  // the lowest that issues more
    CHECK(x->count_b == 2);
    CHECK(x->op_a == Mismatch::kNoOp);
    CHECK(x->op_b == 2);
    CHECK_THROWS_WITH_AS(validate(p),
                         "collectives on group 'g' disagree: rank 1 issues more than the 1 of "
                         "rank 0; unmatched: rank 1 op 1 (all-reduce on g, 8 B on tp-comm)",
                         ProgramError);
  }
  SUBCASE("another member issues fewer collectives") {
    Program p(3);
    const auto g = p.add_group({0, 1, 2}, "g");
    for (int r = 0; r < 3; ++r) {
      p.begin_rank(r);
      for (int k = 0; k < (r == 2 ? 1 : 3); ++k) p.add(all_reduce(g, 8), on(Stream::tp_comm));
    }
    p.finish();
    const auto x = first_mismatch(p, Matching(p));
    REQUIRE(x.has_value());
    CHECK(x->kind == Kind::collective_count);
    CHECK(x->k == 1);
    CHECK(x->rank_a == 0);
    CHECK(x->count_a == 3);
    CHECK(x->rank_b == 2);
    CHECK(x->count_b == 1);
    CHECK(x->op_a == 1);
    CHECK(x->op_b == Mismatch::kNoOp);
    CHECK_THROWS_WITH_AS(validate(p),
                         "collectives on group 'g' disagree: rank 2 issues 1 but rank 0 issues "
                         "3; unmatched: rank 0 op 1 (all-reduce on g, 8 B on tp-comm)",
                         ProgramError);
  }
  SUBCASE("collectives that differ only in data type, after matching ones") {
    Program p(2);
    const auto g = p.add_group({0, 1}, "g");
    for (int r = 0; r < 2; ++r) {
      p.begin_rank(r);
      p.add(all_reduce(g, 8), on(Stream::tp_comm));
      p.add(all_reduce(g, 8, r == 0 ? DType::bf16 : DType::fp32), on(Stream::tp_comm));
    }
    p.finish();
    const auto x = first_mismatch(p, Matching(p));
    REQUIRE(x.has_value());
    CHECK(x->kind == Kind::collective_differs);
    CHECK(x->k == 1);
    CHECK(x->op_a == 1);
    CHECK(x->op_b == 3);
    CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("disagree: the 2nd is rank 0 op 1"),
                         ProgramError);
  }
  SUBCASE("the k-th message of a channel has different sizes on its two ends") {
    Program p(2);
    p.begin_rank(0);
    p.add(Send{1, Bytes(8)}, on(Stream::pp_send));   // op 0
    p.add(Send{1, Bytes(16)}, on(Stream::pp_send));  // op 1
    p.begin_rank(1);
    p.add(Recv{0, Bytes(8)}, on(Stream::pp_recv));   // op 2
    p.add(Recv{0, Bytes(32)}, on(Stream::pp_recv));  // op 3
    p.finish();
    const auto x = first_mismatch(p, Matching(p));
    REQUIRE(x.has_value());
    CHECK(x->kind == Kind::message_size);
    CHECK(x->k == 1);
    CHECK(x->rank_a == 0);
    CHECK(x->rank_b == 1);
    CHECK(x->op_a == 1);
    CHECK(x->op_b == 3);
    CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("the 2nd message from rank 0 to rank 1"),
                         ProgramError);
  }
  SUBCASE("more receives than sends") {
    Program p(2);
    p.begin_rank(0);
    p.add(Send{1, Bytes(8)}, on(Stream::pp_send));  // op 0
    p.begin_rank(1);
    p.add(Recv{0, Bytes(8)}, on(Stream::pp_recv));  // op 1
    p.add(Recv{0, Bytes(8)}, on(Stream::pp_recv));  // op 2
    p.finish();
    const auto x = first_mismatch(p, Matching(p));
    REQUIRE(x.has_value());
    CHECK(x->kind == Kind::message_count);
    CHECK(x->k == 1);
    CHECK(x->count_a == 1);
    CHECK(x->count_b == 2);
    CHECK(x->op_a == Mismatch::kNoOp);
    CHECK(x->op_b == 2);
    CHECK_THROWS_WITH_AS(validate(p),
                         "rank 1 op 1 (recv from rank 0, 8 B on pp-recv) has no matching send: "
                         "rank 0 sends 1 messages to rank 1, which receives 2",
                         ProgramError);
  }
}

TEST_CASE("matching: the builder, given only the communication ops, numbers them alike") {
  // Rank 0: compute, send to 1, all-reduce on the pair, a send to no rank; rank 1: all-reduce,
  // compute, receive from 0.
  Program p(2);
  const auto g = p.add_group({0, 1}, "pair");
  const auto k = p.add_kernels({Kernel{Measured{Time::us(1)}, "w"}});
  p.begin_rank(0);
  p.add(Compute{k}, on(Stream::compute));         // op 0
  p.add(Send{1, Bytes(8)}, on(Stream::pp_send));  // op 1
  p.add(all_reduce(g, 16), on(Stream::tp_comm));  // op 2
  p.add(Send{9, Bytes(8)}, on(Stream::pp_send));  // op 3: can never meet
  p.begin_rank(1);
  p.add(all_reduce(g, 16), on(Stream::tp_comm));  // op 4
  p.add(Compute{k}, on(Stream::compute));         // op 5
  p.add(Recv{0, Bytes(8)}, on(Stream::pp_recv));  // op 6
  p.finish();
  Matching::Builder builder(p);
  std::vector<bool> added;
  for (int r = 0; r < 2; ++r) {
    builder.begin_rank(r);
    for (OpId id = p.first_op(r); id < p.first_op(r + 1); ++id) {
      if (!std::holds_alternative<Compute>(p.op(id).work))
        added.push_back(builder.add(id, p.op(id)));
    }
    builder.end_rank();
  }
  CHECK(added == std::vector<bool>{true, true, false, true, true});
  const Matching built = builder.finish();
  const Matching whole(p);
  for (OpId id = 0; id < p.op_count(); ++id) {
    CAPTURE(id);
    CHECK(built.rendezvous_of(id) == whole.rendezvous_of(id));
  }
  // The collective first, then the channel 0 -> 1.
  CHECK(ops_at(built, 0) == std::vector<OpId>{2, 4});
  CHECK(ops_at(built, 1) == std::vector<OpId>{1, 6});
  CHECK(built.rendezvous_of(3) == Matching::kNone);
}
