// Validation of a predicted Timeline against a measured one, with hand-made timelines.
#include <doctest/doctest.h>

#include <sstream>

#include "traces/validation.hpp"

using namespace stratasim;
using namespace stratasim::strategies;
using namespace stratasim::traces;

namespace {

// Two ranks (stages 0 and 1): rank 0 runs a compute op with a GEMM and an elementwise kernel,
// then sends to rank 1; rank 1 receives, then all-reduces with rank 0... (rank 0 too).
Program two_ranks() {
  Program p(2);
  const auto g = p.add_group({0, 1}, "dp 0");
  const auto kernels = p.add_kernels({Kernel{Gemm{64, 64, 64, 1, DType::bf16}, "fc1"},
                                      Kernel{Elementwise{64, Bytes(128), Bytes(128)}, "gelu"}});
  OpInfo compute;
  OpInfo send;
  send.stream = Stream::pp_send;
  OpInfo recv;
  recv.stream = Stream::pp_recv;
  OpInfo comm;
  comm.stream = Stream::dp_comm;
  const Collective ar{CollectiveKind::all_reduce, DType::bf16, g, Bytes(1024)};
  p.begin_rank(0);
  p.add(Compute{kernels}, compute);  // op 0
  p.add(Send{1, Bytes(256)}, send);  // op 1
  p.add(ar, comm);                   // op 2
  p.begin_rank(1);
  p.add(Recv{0, Bytes(256)}, recv);  // op 3
  p.add(ar, comm);                   // op 4
  p.finish();
  return p;
}

Timeline timeline_of(const Program& p, const std::vector<std::pair<double, double>>& us) {
  Timeline t;
  t.world_size = p.world_size();
  t.ranks.resize(2);
  for (OpId id = 0; id < p.op_count(); ++id) {
    const Op& op = p.op(id);
    t.spans.push_back({op.rank, op.stream, id, Time::from_seconds(us[id].first * 1e-6),
                       Time::from_seconds(us[id].second * 1e-6)});
  }
  return t;
}

}  // namespace

TEST_CASE("validation: errors per class, stage, iteration and memory by hand") {
  const Program p = two_ranks();
  // Predicted (us): op0 0-10, op1 10-12, op2 12-20; op3 10-12, op4 12-20.
  Timeline predicted = timeline_of(p, {{0, 10}, {10, 12}, {12, 20}, {10, 12}, {12, 20}});
  // Measured (us): op0 0-12, op1 12-15, op2 15-25; op3 12-15, op4 15-25.
  Timeline measured = timeline_of(p, {{0, 12}, {12, 15}, {15, 25}, {12, 15}, {15, 25}});
  predicted.ranks[0].tiers[0].peak = Bytes(900);
  predicted.ranks[1].tiers[0].peak = Bytes(500);
  measured.ranks[0].tiers[0].peak = Bytes(1000);
  measured.ranks[1].tiers[0].peak = Bytes(400);
  // Kernels: gemm predicted 8 us, measured 10 us; gelu predicted 2 us, measured 1 us.
  const std::vector<KernelDuration> pk{{0, 0, Time::us(8)}, {0, 1, Time::us(2)}};
  const std::vector<KernelDuration> mk{{0, 1, Time::us(1)}, {0, 0, Time::us(10)}};
  const Validation v = compare(p, predicted, measured, pk, mk, {0, 1});

  REQUIRE(v.classes.size() == 4);
  // gemm: (8 - 10) / 10 = -20%.
  CHECK(v.classes[0].name == "gemm");
  CHECK(v.classes[0].error == doctest::Approx(-0.2));
  // elementwise: (2 - 1) / 1 = +100%.
  CHECK(v.classes[1].name == "elementwise");
  CHECK(v.classes[1].error == doctest::Approx(1.0));
  // all-reduce: two ops, 8 us each predicted, 10 us each measured: 16 / 20 - 1 = -20%.
  CHECK(v.classes[2].name == "all-reduce");
  CHECK(v.classes[2].count == 2);
  CHECK(v.classes[2].error == doctest::Approx(-0.2));
  CHECK(v.classes[2].mean_abs_error == doctest::Approx(0.2));
  // p2p: send and receive 2 us predicted, 3 us measured: 4 / 6 - 1 = -1/3.
  CHECK(v.classes[3].name == "p2p");
  CHECK(v.classes[3].error == doctest::Approx(-1.0 / 3));
  // Stage 0 (rank 0) spans 0-20 predicted, 0-25 measured: -20%; stage 1 (rank 1) 10-20 against
  // 12-25: 10 / 13 - 1.
  REQUIRE(v.stages.size() == 2);
  CHECK(v.stages[0].error == doctest::Approx(-0.2));
  CHECK(v.stages[1].error == doctest::Approx(10.0 / 13 - 1));
  // Iteration: 20 us against 25 us.
  CHECK(v.iteration.predicted_s == doctest::Approx(20e-6));
  CHECK(v.iteration.measured_s == doctest::Approx(25e-6));
  CHECK(v.iteration.error == doctest::Approx(-0.2));
  // Memory: rank 0 has the largest measured peak; 900 against 1000.
  CHECK(v.memory.rank == 0);
  CHECK(v.memory.error == doctest::Approx(-0.1));
  // Items: 2 kernels and 4 communication ops.
  CHECK(v.items.size() == 6);

  std::ostringstream table, csv;
  print_validation(table, v);
  CHECK(table.str().find("gemm") != std::string::npos);
  CHECK(table.str().find("-20.0%") != std::string::npos);
  write_validation_csv(csv, v);
  CHECK(csv.str().find("0,0,0,gemm,\"fc1\",8e-06,1e-05") != std::string::npos);
  const auto json = to_json(v);
  CHECK(json["iteration"]["error"].get<double>() == doctest::Approx(-0.2));
}
