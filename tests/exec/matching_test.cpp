// One pairing everywhere: a Program that validate() accepts meets in the simulator and on the
// host device exactly as strategies::Matching pairs its ops. Both back ends give every op of a
// rendezvous the same span, so ops that share a span met; the program interleaves groups and
// streams so that a back end numbering by stream, or across groups, would pair other ops (and
// sizes differ per k, so the data the host device verifies and the times the simulator gives
// would differ too).
#include <doctest/doctest.h>

#include <vector>

#include "exec/devices.hpp"
#include "exec/host_device.hpp"
#include "exec/interpreter.hpp"
#include "sim/helpers.hpp"
#include "sim/simulator.hpp"
#include "strategies/matching.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

OpInfo on(Stream s) {
  OpInfo info;
  info.stream = s;
  return info;
}

struct Built {
  Program program{4};
  // Ops whose pairing is written by hand below.
  OpId send[3] = {}, recv[3] = {};
  OpId a1[3] = {};  // the second collective on group A of ranks 0, 1, 2
  OpId w0[4] = {};  // the first collective on group W of ranks 0 to 3
};

// Groups A = {0, 1, 2} (on tp-comm), B = {1, 2, 3} (on dp-comm), W = {0, 1, 2, 3} (on the copy
// stream), each rank interleaving them in its own order; sizes grow with k. Rank 0 sends rank 1
// three messages of 1000, 2000 and 3000 bytes on two streams, received on two others.
Built build() {
  Built b;
  Program& p = b.program;
  const auto a = p.add_group({0, 1, 2}, "A");
  const auto bg = p.add_group({1, 2, 3}, "B");
  const auto w = p.add_group({0, 1, 2, 3}, "W");
  auto reduce_on = [&](std::uint32_t g, int k) {
    return Collective{CollectiveKind::all_reduce, DType::fp32, g, Bytes(48 * (k + 1))};
  };
  auto gather_on_w = [&](int k) {
    return Collective{CollectiveKind::all_gather, DType::fp32, w, Bytes(64 * (k + 1))};
  };
  p.begin_rank(0);
  p.add(reduce_on(a, 0), on(Stream::tp_comm));
  b.send[0] = p.add(Send{1, Bytes(1000)}, on(Stream::pp_send));
  b.w0[0] = p.add(gather_on_w(0), on(Stream::copy));
  b.send[1] = p.add(Send{1, Bytes(2000)}, on(Stream::host));
  b.a1[0] = p.add(reduce_on(a, 1), on(Stream::tp_comm));
  p.add(gather_on_w(1), on(Stream::copy));
  b.send[2] = p.add(Send{1, Bytes(3000)}, on(Stream::pp_send));
  p.begin_rank(1);
  b.w0[1] = p.add(gather_on_w(0), on(Stream::copy));
  p.add(reduce_on(bg, 0), on(Stream::dp_comm));
  b.recv[0] = p.add(Recv{0, Bytes(1000)}, on(Stream::pp_recv));
  p.add(reduce_on(a, 0), on(Stream::tp_comm));
  p.add(reduce_on(bg, 1), on(Stream::dp_comm));
  b.recv[1] = p.add(Recv{0, Bytes(2000)}, on(Stream::compute));
  b.a1[1] = p.add(reduce_on(a, 1), on(Stream::tp_comm));
  p.add(gather_on_w(1), on(Stream::copy));
  b.recv[2] = p.add(Recv{0, Bytes(3000)}, on(Stream::pp_recv));
  p.begin_rank(2);
  p.add(reduce_on(bg, 0), on(Stream::dp_comm));
  p.add(reduce_on(a, 0), on(Stream::tp_comm));
  b.a1[2] = p.add(reduce_on(a, 1), on(Stream::tp_comm));
  b.w0[2] = p.add(gather_on_w(0), on(Stream::copy));
  p.add(reduce_on(bg, 1), on(Stream::dp_comm));
  p.add(gather_on_w(1), on(Stream::copy));
  p.begin_rank(3);
  b.w0[3] = p.add(gather_on_w(0), on(Stream::copy));
  p.add(reduce_on(bg, 0), on(Stream::dp_comm));
  p.add(gather_on_w(1), on(Stream::copy));
  p.add(reduce_on(bg, 1), on(Stream::dp_comm));
  p.finish();
  return b;
}

// Every op of each rendezvous has the same span; `what` names the back end.
void check_met_as_matched(const Matching& m, const traces::Timeline& t, const char* what) {
  CAPTURE(what);
  REQUIRE(t.completed);
  for (std::uint32_t rv = 0; rv < m.rendezvous_count(); ++rv) {
    CAPTURE(rv);
    const auto ops = m.ops_of(rv);
    REQUIRE(ops.size() == m.expected(rv));
    for (OpId id : ops) {
      REQUIRE(id < t.spans.size());
      CHECK(t.spans[id].op == id);
      CHECK(t.spans[id].start == t.spans[ops.front()].start);
      CHECK(t.spans[id].end == t.spans[ops.front()].end);
    }
  }
}

}  // namespace

TEST_CASE("matching: the validator, the simulator and the host device pair ops alike") {
  const Built b = build();
  const Program& p = b.program;
  CHECK_NOTHROW(validate(p));
  const Matching m(p);

  // The pairings, by hand: the k-th send meets the k-th receive whatever their streams, and
  // the k-th collective on a group meets the k-th of every member whatever it issued between.
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(m.rendezvous_of(b.send[k]) == m.rendezvous_of(b.recv[k]));
    CHECK(m.sequence(b.send[k]) == static_cast<std::uint32_t>(k));
    CHECK(m.ops_of(m.rendezvous_of(b.send[k])).size() == 2);
  }
  CHECK(m.ops_of(m.rendezvous_of(b.a1[0])).size() == 3);
  for (OpId id : b.a1) CHECK(m.rendezvous_of(id) == m.rendezvous(0, 1));
  for (OpId id : b.w0) CHECK(m.rendezvous_of(id) == m.rendezvous(2, 0));
  CHECK(m.rendezvous_count() == 2 + 2 + 2 + 3);  // A, B, W, then three messages

  // The simulator: ops meet as matched, and a message lasts longer the larger its k-th size.
  const auto simulated = sim::simulate(p, testing::test_cluster(1, 4));
  check_met_as_matched(m, simulated, "simulator");
  auto length = [&](OpId id) { return simulated.spans[id].end - simulated.spans[id].start; };
  CHECK(length(b.recv[0]) < length(b.recv[1]));
  CHECK(length(b.recv[1]) < length(b.recv[2]));

  // The host device: the same meetings, with every received byte and reduced value verified
  // against what the k-th partner sent.
  exec::ExecPlan plan(p);
  for (OpId id = 0; id < p.op_count(); ++id) {
    const std::uint32_t k = m.sequence(id);
    CHECK(plan.sequence(id) == (k == Matching::kNone ? 0 : k));
  }
  CHECK(plan.transfers(0, 1) == 3);
  CHECK(plan.transfers(1, 0) == 0);
  CHECK(plan.collectives_on(1) == 2);
  exec::WorldOptions options;
  options.device.verify = true;
  auto world = exec::make_world(exec::DeviceKind::host, plan, options);
  exec::RunOptions run_options;
  run_options.warmup_iterations = 0;
  run_options.iterations = 1;
  const auto measured = exec::run(plan, *world, run_options);
  check_met_as_matched(m, measured.timeline, "host device");
}
