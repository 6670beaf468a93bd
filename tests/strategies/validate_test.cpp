#include <doctest/doctest.h>

#include <array>

#include "strategies/program.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

OpInfo on(Stream s, std::string_view label = {}) {
  OpInfo i;
  i.stream = s;
  i.label = label;
  return i;
}

}  // namespace

TEST_CASE("a well-formed program validates") {
  Program p(2);
  auto g = p.add_group({0, 1}, "pair");
  auto k = p.add_kernels({Kernel{Measured{Time::us(1)}, "work"}});
  for (int r = 0; r < 2; ++r) {
    p.begin_rank(r);
    auto c = p.add(Compute{k}, on(Stream::compute));
    std::array<OpId, 1> dep = {c};
    p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(1024)}, on(Stream::tp_comm),
          dep);
    if (r == 0) p.add(Send{1, Bytes(8)}, on(Stream::pp_send));
    if (r == 1) p.add(Recv{0, Bytes(8)}, on(Stream::pp_recv));
  }
  p.finish();
  CHECK_NOTHROW(validate(p));
}

TEST_CASE("a send without its receive is named") {
  Program p(2);
  p.begin_rank(0);
  p.add(Send{1, Bytes(8)}, on(Stream::pp_send, "send activation"));
  p.add(Send{1, Bytes(8)}, on(Stream::pp_send, "send activation"));
  p.begin_rank(1);
  p.add(Recv{0, Bytes(8)}, on(Stream::pp_recv));
  p.finish();
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("rank 0 op 1 (send to rank 1"), ProgramError);
}

TEST_CASE("messages of different sizes are named") {
  Program p(2);
  p.begin_rank(0);
  p.add(Send{1, Bytes(8)}, on(Stream::pp_send));
  p.begin_rank(1);
  p.add(Recv{0, Bytes(16)}, on(Stream::pp_recv));
  p.finish();
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("different sizes"), ProgramError);
}

TEST_CASE("collectives that disagree in kind, size or count are named") {
  for (int variant = 0; variant < 3; ++variant) {
    CAPTURE(variant);
    Program p(2);
    auto g = p.add_group({0, 1}, "tp 0");
    p.begin_rank(0);
    p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(64)}, on(Stream::tp_comm));
    p.begin_rank(1);
    if (variant == 0)
      p.add(Collective{CollectiveKind::all_gather, DType::bf16, g, Bytes(64)}, on(Stream::tp_comm));
    if (variant == 1)
      p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(32)}, on(Stream::tp_comm));
    p.finish();
    CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("collectives on group 'tp 0' disagree"),
                         ProgramError);
  }
}

TEST_CASE("a collective on a group the rank is not in, or out-of-range ranks, are errors") {
  Program p(3);
  auto g = p.add_group({0, 1}, "pair");
  p.begin_rank(2);
  p.add(Collective{CollectiveKind::all_reduce, DType::bf16, g, Bytes(64)}, on(Stream::tp_comm));
  p.finish();
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("not a member"), ProgramError);

  Program q(2);
  q.add_group({0, 5}, "bad");
  q.finish();
  CHECK_THROWS_WITH_AS(validate(q), doctest::Contains("names rank 5"), ProgramError);
}

TEST_CASE("a dependency cycle through stream order is found") {
  // op 0 (compute) waits for op 1 (tp-comm), which waits for op 2 (compute), which the compute
  // stream orders after op 0.
  Program p(1);
  auto k = p.add_kernels({Kernel{Measured{Time::us(1)}, "w"}});
  p.begin_rank(0);
  std::array<OpId, 1> on1 = {1}, on2 = {2};
  p.add(Compute{k}, on(Stream::compute, "first"), on1);
  p.add(Collective{CollectiveKind::all_reduce, DType::bf16, p.add_group({0}, "solo"), Bytes(1)},
        on(Stream::tp_comm), on2);
  p.add(Compute{k}, on(Stream::compute, "second"));
  p.finish();
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("form a cycle"), ProgramError);
}

TEST_CASE("dependencies across ranks are rejected") {
  Program p(2);
  auto k = p.add_kernels({Kernel{Measured{Time::us(1)}, "w"}});
  p.begin_rank(0);
  p.add(Compute{k}, on(Stream::compute));
  p.begin_rank(1);
  std::array<OpId, 1> dep = {0};
  p.add(Compute{k}, on(Stream::compute), dep);
  p.finish();
  CHECK_THROWS_WITH_AS(validate(p), doctest::Contains("must be ops of the same rank"),
                       ProgramError);
}
