#include "strategies/schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace stratasim::strategies {

std::vector<std::vector<Pass>> pipeline_schedule(ScheduleKind kind, int stages, int microbatches) {
  if (stages < 1 || microbatches < 1) {
    throw std::invalid_argument("a pipeline schedule needs at least one stage and one microbatch");
  }
  std::vector<std::vector<Pass>> plan(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& passes = plan[static_cast<std::size_t>(s)];
    passes.reserve(2 * static_cast<std::size_t>(microbatches));
    auto forward = [&](int mb) { passes.push_back({PassKind::forward, mb}); };
    auto backward = [&](int mb) { passes.push_back({PassKind::backward, mb}); };
    switch (kind) {
      case ScheduleKind::gpipe:
        for (int mb = 0; mb < microbatches; ++mb) forward(mb);
        for (int mb = 0; mb < microbatches; ++mb) backward(mb);
        break;
      case ScheduleKind::one_f_one_b: {
        const int warmup = std::min(stages - s - 1, microbatches);
        const int steady = microbatches - warmup;
        for (int mb = 0; mb < warmup; ++mb) forward(mb);
        for (int i = 0; i < steady; ++i) {
          forward(warmup + i);
          backward(i);
        }
        for (int mb = steady; mb < microbatches; ++mb) backward(mb);
        break;
      }
      default:
        throw std::invalid_argument("schedule not implemented yet");
    }
  }
  return plan;
}

}  // namespace stratasim::strategies
