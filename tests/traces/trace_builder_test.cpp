// build_program's matching checks (strategies::Matching, in the trace's words) on hand-built
// traces: messages paired by issue order across streams, and each mismatch naming the file and
// the node.
#include <doctest/doctest.h>

#include <string>

#include "traces/trace_builder.hpp"

using namespace stratasim;
using namespace stratasim::traces;
namespace st = stratasim::strategies;

namespace {

TraceOp op(std::uint64_t id, st::Work work, st::Stream stream) {
  TraceOp o;
  o.id = id;
  o.work = work;
  o.stream = stream;
  return o;
}

// Rank 0 sends rank 1 messages of `sizes0` bytes, alternating two streams; rank 1 receives
// `sizes1`, on two other streams. Node ids are 10 + k on rank 0 and 20 + k on rank 1.
TraceInput messages(const std::vector<std::int64_t>& sizes0,
                    const std::vector<std::int64_t>& sizes1) {
  TraceInput in;
  in.ranks.resize(2);
  in.ranks[0].source = "r0.json";
  in.ranks[1].source = "r1.json";
  for (std::size_t k = 0; k < sizes0.size(); ++k) {
    in.ranks[0].ops.push_back(
        op(10 + k, st::Send{1, Bytes(sizes0[k])}, k % 2 ? st::Stream::host : st::Stream::pp_send));
  }
  for (std::size_t k = 0; k < sizes1.size(); ++k) {
    in.ranks[1].ops.push_back(
        op(20 + k, st::Recv{0, Bytes(sizes1[k])}, k % 2 ? st::Stream::pp_recv : st::Stream::copy));
  }
  return in;
}

TraceError error_of(const TraceInput& in) {
  try {
    build_program(in);
  } catch (const TraceError& e) {
    return e;
  }
  FAIL("no TraceError");
  return TraceError("", "", "");
}

}  // namespace

TEST_CASE("trace builder: the k-th send meets the k-th receive, whatever their streams") {
  const auto p = build_program(messages({100, 200, 300}, {100, 200, 300}));
  CHECK(p.op_count() == 6);
}

TEST_CASE("trace builder: a message whose two ends differ in size names both nodes") {
  const auto e = error_of(messages({100, 200, 300}, {100, 250, 300}));
  CHECK(e.file() == "r1.json");
  CHECK(e.where() == "node 21");
  CHECK(e.message() ==
        "the 2nd message from rank 0 to rank 1 is sent with 200 B (node 11) but "
        "received with 250 B");
}

TEST_CASE("trace builder: unmatched messages list the nodes of both ends") {
  const auto e = error_of(messages({100, 200, 300}, {100, 200}));
  CHECK(e.file() == "r0.json");
  CHECK(e.message() ==
        "unmatched send/receive: rank 0 sends 3 messages to rank 1 (nodes 10, "
        "11, 12) but rank 1 receives 2 from rank 0 (nodes 20, 21)");
}

TEST_CASE("trace builder: collectives that differ only in data type say so") {
  TraceInput in;
  in.groups.push_back(st::Group{{0, 1}, "pg 0"});
  in.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    in.ranks[static_cast<std::size_t>(r)].source = "r" + std::to_string(r) + ".json";
    const st::Collective c{st::CollectiveKind::all_reduce, r == 0 ? DType::bf16 : DType::fp32, 0,
                           Bytes(1024)};
    in.ranks[static_cast<std::size_t>(r)].ops.push_back(op(5, c, st::Stream::dp_comm));
  }
  const auto e = error_of(in);
  CHECK(e.file() == "r1.json");
  CHECK(e.where() == "node 5");
  CHECK(e.message().find("the 1st collective on group 'pg 0' (ranks 0, 1) is all-reduce of") == 0);
  CHECK(e.message().find("in bf16 (node 5) on rank 0 but all-reduce of") != std::string::npos);
  CHECK(e.message().find("in fp32 (node 5) on rank 1") != std::string::npos);
}
