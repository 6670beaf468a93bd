#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "strategies/schedule.hpp"

using namespace stratasim::strategies;

namespace {

// Largest number of microbatches whose forward has run and backward has not, on one stage.
int peak_in_flight(const std::vector<Pass>& passes) {
  int in_flight = 0, peak = 0;
  for (const auto& p : passes) {
    in_flight += p.kind == PassKind::forward ? 1 : -1;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

// The same, counting only F and B passes (W and R hold no microbatch of their own).
int peak_in_flight_b(const std::vector<Pass>& passes) {
  int in_flight = 0, peak = 0;
  for (const auto& p : passes) {
    if (p.kind == PassKind::forward) ++in_flight;
    if (p.kind == PassKind::backward) --in_flight;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

}  // namespace

TEST_CASE("1F1B on 4 stages and 8 microbatches follows PipeDream-Flush") {
  auto plan = pipeline_schedule(ScheduleKind::one_f_one_b, 4, 8);
  REQUIRE(plan.size() == 4);
  // Stage 0: 3 warm-up forwards, then F3 B0 F4 B1 ... F7 B4, then B5 B6 B7.
  std::vector<Pass> expected = {
      {PassKind::forward, 0}, {PassKind::forward, 1}, {PassKind::forward, 2}};
  for (int i = 0; i < 5; ++i) {
    expected.push_back({PassKind::forward, 3 + i});
    expected.push_back({PassKind::backward, i});
  }
  for (int mb = 5; mb < 8; ++mb) expected.push_back({PassKind::backward, mb});
  CHECK(plan[0] == expected);
  // The last stage alternates from the start.
  CHECK(plan[3][0] == Pass{PassKind::forward, 0, 3});  // chunk 3: the last stage's
  CHECK(plan[3][1] == Pass{PassKind::backward, 0, 3});
}

TEST_CASE("every schedule runs each microbatch's forward once before its backward") {
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
    for (int p : {1, 2, 3, 4, 8, 16}) {
      for (int m : {1, p, 2 * p, 4 * p + 1}) {
        auto plan = pipeline_schedule(kind, p, m);
        for (int s = 0; s < p; ++s) {
          const auto& passes = plan[static_cast<std::size_t>(s)];
          CHECK(passes.size() == 2 * static_cast<std::size_t>(m));
          std::vector<int> state(static_cast<std::size_t>(m), 0);
          for (const auto& pass : passes) {
            auto& st = state[static_cast<std::size_t>(pass.microbatch)];
            CHECK(st == (pass.kind == PassKind::forward ? 0 : 1));
            ++st;
          }
          // In flight: GPipe holds all m; 1F1B at most p - s (Megatron-LM Sec. 2.2.1).
          int expected = kind == ScheduleKind::gpipe ? m : std::min(p - s, m);
          CHECK(peak_in_flight(passes) == expected);
        }
      }
    }
  }
}

namespace {

Pass F(int unit, int chunk = 0) {
  return Pass{PassKind::forward, unit, static_cast<std::int16_t>(chunk)};
}
Pass B(int unit, int chunk = 0) {
  return Pass{PassKind::backward, unit, static_cast<std::int16_t>(chunk)};
}
Pass W(int unit, int chunk = 0) {
  return Pass{PassKind::weight, unit, static_cast<std::int16_t>(chunk)};
}
Pass R(int unit, int chunk = 0) {
  return Pass{PassKind::recompute, unit, static_cast<std::int16_t>(chunk)};
}

// Largest number of a device's forwards still holding activations: until their backward, or
// with a split backward until their weight pass.
int peak_holding(const std::vector<Pass>& passes, bool split) {
  int held = 0, peak = 0;
  for (const auto& x : passes) {
    if (x.kind == PassKind::forward) ++held;
    if (x.kind == (split ? PassKind::weight : PassKind::backward)) --held;
    peak = std::max(peak, held);
  }
  return peak;
}

}  // namespace

TEST_CASE("ZB-H1 on 2 stages and 3 microbatches: 1F1B's order with stage s keeping s W pending") {
  auto s = make_schedule(ScheduleKind::zb_h1, 2, 3);
  CHECK(s.split_backward);
  CHECK_FALSE(s.overlapping_iterations);
  // Stage 0 (no W pending): 1 warm-up forward, then F B W; stage 1 defers each W by one B.
  CHECK(s.passes[0] == std::vector<Pass>{F(0), F(1), B(0), W(0), F(2), B(1), W(1), B(2), W(2)});
  CHECK(s.passes[1] == std::vector<Pass>{F(0, 1), B(0, 1), F(1, 1), B(1, 1), W(0, 1), F(2, 1),
                                         B(2, 1), W(1, 1), W(2, 1)});
}

TEST_CASE("ZB-H2 on 2 stages and 4 microbatches: 2(p - 1 - s) + 1 warm-up forwards, B first") {
  auto s = make_schedule(ScheduleKind::zb_h2, 2, 4);
  CHECK(s.split_backward);
  CHECK(s.overlapping_iterations);
  // Stage 0: 3 warm-up forwards, then B (and its W at once) before each further forward.
  CHECK(s.passes[0] ==
        std::vector<Pass>{F(0), F(1), F(2), B(0), W(0), F(3), B(1), W(1), B(2), W(2), B(3), W(3)});
  // Stage 1: 1 warm-up forward, W issued once more than 2 are pending.
  CHECK(s.passes[1] == std::vector<Pass>{F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 1), B(2, 1),
                                         W(0, 1), F(3, 1), B(3, 1), W(1, 1), W(2, 1), W(3, 1)});
}

TEST_CASE("Zero Bubble's in-flight activations: ZB-H1 p - s, ZB-H2 2p - 2s - 1 before B") {
  // Forwards awaiting their B (M_B each) and backwards awaiting their W (M_W each).
  for (int p : {2, 3, 4, 8}) {
    const int m = 4 * p;
    auto h1 = pipeline_schedule(ScheduleKind::zb_h1, p, m);
    auto h2 = pipeline_schedule(ScheduleKind::zb_h2, p, m);
    for (int s = 0; s < p; ++s) {
      CAPTURE(p);
      CAPTURE(s);
      CHECK(peak_in_flight_b(h1[static_cast<std::size_t>(s)]) == p - s);
      CHECK(peak_in_flight_b(h2[static_cast<std::size_t>(s)]) == 2 * p - 2 * s - 1);
      CHECK(peak_holding(h1[static_cast<std::size_t>(s)], true) == p);
      CHECK(peak_holding(h2[static_cast<std::size_t>(s)], true) == 2 * p - 1);
    }
  }
}

TEST_CASE("PipeDream-2BW on 2 stages and 3 microbatches: no flush, carried backwards") {
  auto s = make_schedule(ScheduleKind::pipedream_2bw, 2, 3);
  CHECK(s.overlapping_iterations);
  CHECK(s.weight_versions == 2);
  CHECK(s.carried_backwards == std::vector<int>{1, 0});
  // Stage 0 runs F(k) then the backward of k - 1: the first is the previous iteration's last.
  CHECK(s.passes[0] == std::vector<Pass>{F(0), B(2), F(1), B(0), F(2), B(1)});
  CHECK(s.passes[1] == std::vector<Pass>{F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 1), B(2, 1)});
}

TEST_CASE("Merak SCP: 1F1B with each recomputation issued right after the pass before its B") {
  auto s = make_schedule(ScheduleKind::merak_scp, 2, 3);
  CHECK(s.passes[0] == std::vector<Pass>{F(0), F(1), R(0), B(0), F(2), R(1), B(1), R(2), B(2)});
  CHECK(s.passes[1] == std::vector<Pass>{F(0, 1), R(0, 1), B(0, 1), F(1, 1), R(1, 1), B(1, 1),
                                         F(2, 1), R(2, 1), B(2, 1)});
  // Without the R passes it is 1F1B.
  auto plain = make_schedule(ScheduleKind::one_f_one_b, 2, 3);
  for (int d = 0; d < 2; ++d) {
    std::vector<Pass> without;
    for (const Pass& x : s.passes[static_cast<std::size_t>(d)]) {
      if (x.kind != PassKind::recompute) without.push_back(x);
    }
    CHECK(without == plain.passes[static_cast<std::size_t>(d)]);
  }
}

TEST_CASE("interleaved on 2 stages, 4 microbatches, 2 chunks: Megatron's virtual order") {
  auto s = make_schedule(ScheduleKind::interleaved, 2, 4, {2, 1});
  CHECK(s.parts == 4);
  CHECK(s.chunks == 4);
  CHECK(s.device_of_chunk == std::vector<int>{0, 1, 0, 1});  // chunk c on device c mod p
  // Device 0: (p - 1) * 2 + (v - 1) * p = 4 warm-up forwards, microbatches in groups of p per
  // chunk; backwards from the last chunk down.
  CHECK(s.passes[0] == std::vector<Pass>{F(0, 0), F(1, 0), F(0, 2), F(1, 2), F(2, 0), B(0, 2),
                                         F(3, 0), B(1, 2), F(2, 2), B(0, 0), F(3, 2), B(1, 0),
                                         B(2, 2), B(3, 2), B(2, 0), B(3, 0)});
  // Device 1: (v - 1) * p = 2 warm-up forwards.
  CHECK(s.passes[1] == std::vector<Pass>{F(0, 1), F(1, 1), F(0, 3), B(0, 3), F(1, 3), B(1, 3),
                                         F(2, 1), B(0, 1), F(3, 1), B(1, 1), F(2, 3), B(2, 3),
                                         F(3, 3), B(3, 3), B(2, 1), B(3, 1)});
  // In flight, in chunk passes: min(2 (p - s - 1) + (v - 1) p + 1, v m).
  for (int p : {2, 4, 8}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p, 4 * p}) {
        auto plan = pipeline_schedule(ScheduleKind::interleaved, p, m, {v, 1});
        for (int d = 0; d < p; ++d) {
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(m);
          CAPTURE(d);
          CHECK(peak_in_flight_b(plan[static_cast<std::size_t>(d)]) ==
                std::min(2 * (p - d - 1) + (v - 1) * p + 1, v * m));
        }
      }
    }
  }
}

TEST_CASE("TeraPipe: GPipe over slices, a microbatch's slices backwards in reverse") {
  auto s = make_schedule(ScheduleKind::terapipe, 2, 2, {1, 2});
  CHECK(s.slices == 2);
  CHECK(s.units() == 4);  // unit = microbatch * slices + slice
  for (int d = 0; d < 2; ++d) {
    CHECK(s.passes[static_cast<std::size_t>(d)] == std::vector<Pass>{F(0, d), F(1, d), F(2, d),
                                                                     F(3, d), B(1, d), B(0, d),
                                                                     B(3, d), B(2, d)});
  }
}

TEST_CASE("ZB-V's chunks form a V, Chimera's two pipelines run in opposite directions") {
  SUBCASE("zb-v") {
    auto s = make_schedule(ScheduleKind::zb_v, 4, 8);
    CHECK(s.parts == 8);
    CHECK(s.chunks == 8);
    CHECK(schedule_parts(ScheduleKind::zb_v, 4) == 8);
    CHECK(s.device_of_chunk == std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0});
    CHECK(s.chunks_of(0) == std::vector<int>{0, 7});  // the first and the last chunk
    CHECK(s.chunks_of(3) == std::vector<int>{3, 4});
    CHECK(s.split_backward);
    CHECK(s.first_chunk.empty());
    for (int d = 0; d < 4; ++d) {
      CHECK(peak_holding(s.passes[static_cast<std::size_t>(d)], true) <= 2 * 4);
    }
  }
  SUBCASE("chimera") {
    auto s = make_schedule(ScheduleKind::chimera, 4, 8);
    CHECK(s.parts == 4);
    CHECK(s.chunks == 8);
    CHECK(s.device_of_chunk == std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0});
    CHECK(s.part_of_chunk == std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3});
    CHECK(s.next_chunk == std::vector<int>{1, 2, 3, -1, 5, 6, 7, -1});
    CHECK(s.prev_chunk == std::vector<int>{-1, 0, 1, 2, -1, 4, 5, 6});
    CHECK(s.first_chunk == std::vector<int>{0, 4, 0, 4, 0, 4, 0, 4});  // even down, odd up
    CHECK(s.replica_device == std::vector<int>{3, 2, 1, 0});
    CHECK_FALSE(s.split_backward);
    for (int d = 0; d < 4; ++d) {
      CHECK(peak_holding(s.passes[static_cast<std::size_t>(d)], false) <= 2 * 4);
    }
  }
}

TEST_CASE("schedules that do not apply throw the constraint's message") {
  const auto expect = [](ScheduleKind kind, int p, int m, ScheduleOptions o,
                         const std::string& fragment) {
    CAPTURE(name_of(kind));
    const auto problem = schedule_constraint(kind, p, m, o);
    REQUIRE(problem.has_value());
    CHECK(problem->find(fragment) != std::string::npos);
    CHECK_THROWS_WITH_AS(make_schedule(kind, p, m, o), problem->c_str(), std::invalid_argument);
  };
  expect(ScheduleKind::interleaved, 4, 6, {2, 1}, "multiple");
  expect(ScheduleKind::pipedream_2bw, 4, 3, {}, "at least as many microbatches");
  expect(ScheduleKind::chimera, 3, 4, {}, "even");
  expect(ScheduleKind::chimera, 4, 5, {}, "even");
  expect(ScheduleKind::one_f_one_b, 4, 8, {2, 1}, "virtual_stages");
  expect(ScheduleKind::gpipe, 4, 8, {1, 2}, "sequence_slices");
  CHECK_FALSE(schedule_constraint(ScheduleKind::interleaved, 4, 8, {2, 1}).has_value());
  CHECK_FALSE(schedule_constraint(ScheduleKind::terapipe, 4, 3, {1, 4}).has_value());
  CHECK(schedule_parts(ScheduleKind::interleaved, 4, {3, 1}) == 12);
  CHECK(schedule_parts(ScheduleKind::chimera, 4) == 4);
}

TEST_CASE("DualPipe on 4 stages and 8 microbatches: the reference step() order, F&B pairs") {
  // Hand-expanded from deepseek-ai/DualPipe's DualPipe.step() for num_ranks 4, num_chunks 8
  // (half_num_chunks 4): device 0 (half_rank 0, not a middle rank) runs phase 0 on the down
  // chunk 0 (even units) and phase 1 on the up chunk 7 (odd units):
  //   step 1: 2 F0; step 2: F0 F1; step 3: B1 (zero bubble) W F1; step 4 (1 round): F0&B1,
  //   F1&B0; step 5: B1, F1&B0; step 6: B1, B0 (split from here); step 7: W B0 (split);
  //   step 8: W. A backward not split is followed by its own W.
  const Schedule s = make_schedule(ScheduleKind::dualpipe, 4, 8);
  const auto F = PassKind::forward, B = PassKind::backward, W = PassKind::weight;
  const std::vector<Pass> device0 = {
      {F, 0, 0}, {F, 2, 0}, {F, 4, 0}, {F, 1, 7}, {B, 1, 7}, {W, 1, 7}, {F, 3, 7},
      {F, 6, 0}, {B, 3, 7}, {W, 3, 7}, {F, 5, 7}, {B, 0, 0}, {W, 0, 0},  // step 4
      {B, 5, 7}, {W, 5, 7}, {F, 7, 7}, {B, 2, 0}, {W, 2, 0},             // step 5
      {B, 7, 7}, {W, 7, 7}, {B, 4, 0},                                   // step 6
      {W, 4, 0}, {B, 6, 0},                                              // step 7
      {W, 6, 0}};                                                        // step 8
  CHECK(s.passes[0] == device0);
  // The pairs: F6&B3, F5&B0 (step 4) and F7&B2 (step 5).
  std::vector<std::size_t> pairs;
  for (std::size_t i = 0; i < s.overlap_next[0].size(); ++i) {
    if (s.overlap_next[0][i]) pairs.push_back(i);
  }
  CHECK(pairs == std::vector<std::size_t>{7, 10, 15});
  // Device 1 (half_rank 1, a middle rank): phase 0 down chunk 1, phase 1 up chunk 6. Step 2
  // twice; step 4 twice, its first F0 and B1 not overlapped; step 6 splits its second round.
  const std::vector<Pass> device1 = {
      {F, 0, 1}, {F, 1, 6}, {F, 2, 1}, {F, 3, 6},                        // step 2
      {F, 4, 1}, {B, 1, 6}, {W, 1, 6}, {F, 5, 6}, {B, 0, 1}, {W, 0, 1},  // step 4, round 1
      {F, 6, 1}, {B, 3, 6}, {W, 3, 6}, {F, 7, 6}, {B, 2, 1}, {W, 2, 1},  // step 4, round 2
      {B, 5, 6}, {W, 5, 6}, {B, 4, 1}, {W, 4, 1}, {B, 7, 6}, {B, 6, 1},  // step 6
      {W, 7, 6}, {W, 6, 1}};                                             // step 8
  CHECK(s.passes[1] == device1);
  pairs.clear();
  for (std::size_t i = 0; i < s.overlap_next[1].size(); ++i) {
    if (s.overlap_next[1][i]) pairs.push_back(i);
  }
  CHECK(pairs == std::vector<std::size_t>{7, 10, 13});
  // Chimera's chunk map: device d holds parts d and p - 1 - d, parameters summed with p - 1 - d.
  CHECK(s.chunks_of(0) == std::vector<int>{0, 7});
  CHECK(s.part_of_chunk[7] == 3);
  CHECK(s.replica_device == std::vector<int>{3, 2, 1, 0});
  CHECK(s.split_backward);
  // Without the overlap the order is the same, with no pairs.
  const Schedule serial = make_schedule(ScheduleKind::dualpipe, 4, 8, {1, 1, false, false});
  CHECK(serial.passes == s.passes);
  CHECK(serial.overlap_next.empty());
  // The constraints: p even, m even, m >= 2p.
  CHECK_THROWS_AS(make_schedule(ScheduleKind::dualpipe, 4, 6), std::invalid_argument);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::dualpipe, 3, 12), std::invalid_argument);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::dualpipe, 4, 9), std::invalid_argument);
}
