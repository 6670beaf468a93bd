// The record of one run of a Program, predicted (sim/) or measured (exec/): when each op ran,
// and how each rank's memory changed. Reports and exporters read only this and the Program.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strategies/program.hpp"

namespace stratasim::traces {

using strategies::kMemoryCategoryCount;
using strategies::kMemoryTierCount;
using strategies::MemoryCategory;
using strategies::MemoryTier;
using strategies::OpId;
using strategies::Stream;

/// When one op ran. For collectives and transfers `start` is when data began to move (all
/// members present), so waiting for peers is not counted as communication.
/// 24 bytes: the rank and the stream share one 4-byte word (ranks below 2^23). They are
/// bit-fields: read them by value (a non-const reference cannot bind to them; doctest's CHECK on
/// a non-const Span needs `const Span&`).
struct Span {
  std::int32_t rank : 24 = 0;
  Stream stream : 8 = Stream::compute;
  OpId op = 0;
  Time start;
  Time end;
};
static_assert(sizeof(Span) == 24, "Span: rank and stream in one word, then op, start, end");
/// The most ranks a Span can name (its 24-bit rank field).
inline constexpr std::int32_t kMaxSpanRanks = std::int32_t{1} << 23;

/// A rank's allocation on one tier right after it changed.
struct MemorySample {
  std::int32_t rank = 0;
  MemoryTier tier = MemoryTier::device;
  Time time;
  Bytes total;  // all categories
  OpId op = 0;  // the op whose effect this was (for the initial state: the rank's first op)
};

using MemoryBreakdown = std::array<Bytes, kMemoryCategoryCount>;

struct TierPeak {
  Bytes capacity;               // 0 when the tier is not modelled
  Bytes peak;                   // largest total over the run
  Time time;                    // when the peak was first reached
  OpId op = 0;                  // the op whose effect reached it
  MemoryBreakdown breakdown{};  // by category at the peak
};

struct RankMemory {
  std::array<TierPeak, kMemoryTierCount> tiers{};
};

/// A rank whose allocation on a tier exceeded its capacity: the first op that did it and by how
/// much the peak exceeds the capacity.
struct OutOfMemory {
  std::int32_t rank = 0;
  MemoryTier tier = MemoryTier::device;
  Bytes capacity;
  Bytes peak;
  OpId first_op = 0;  // op whose effect first exceeded the capacity
  Time time;          // when
};

/// Time an op lost to interference (hw_models/interference.hpp): how much longer it took than it
/// would have alone. Only ops that lost time are listed.
struct InterferenceLoss {
  OpId op = 0;
  Time lost;
};

struct Timeline {
  int world_size = 0;
  /// One span per op that ran, indexed by op id (spans[id].op == id) when the run completed.
  std::vector<Span> spans;
  /// Every change of a rank's allocation, in time order.
  std::vector<MemorySample> memory;
  std::vector<RankMemory> ranks;  // per rank
  std::vector<OutOfMemory> out_of_memory;
  /// Ops slowed by interference, in the order they finished (simulated timelines only).
  std::vector<InterferenceLoss> interference;
  /// False when the run stopped before every op finished (deadlock); `problem` says why and
  /// which ops were waiting.
  bool completed = true;
  std::string problem;
  /// The run was ended on purpose at the first out-of-memory (not a deadlock).
  bool stopped_on_oom = false;
  /// Simulation statistics (zero for measured timelines).
  std::uint64_t events = 0;
};

}  // namespace stratasim::traces
