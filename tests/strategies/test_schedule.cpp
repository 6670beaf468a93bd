#include <doctest/doctest.h>

#include <algorithm>

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
