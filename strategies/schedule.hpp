// Pipeline schedules as data: a pure function from (stages, microbatches) to the ordered
// passes each stage runs. The lowering turns passes into ops; the simulator never sees a
// schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "strategies/experiment.hpp"

namespace stratasim::strategies {

enum class PassKind : std::uint8_t { forward, backward };

struct Pass {
  PassKind kind = PassKind::forward;
  std::int32_t microbatch = 0;
  bool operator==(const Pass&) const = default;
};

/// Per stage, the passes in the order the stage issues them.
/// - gpipe: all forwards (0..m-1), then all backwards (0..m-1).
/// - 1f1b (PipeDream-Flush, Megatron): stage s runs min(p-s-1, m) warm-up forwards, then
///   alternates one forward and one backward, then drains the remaining backwards; at most
///   p - s microbatches are in flight on stage s.
std::vector<std::vector<Pass>> pipeline_schedule(ScheduleKind kind, int stages, int microbatches);

}  // namespace stratasim::strategies
