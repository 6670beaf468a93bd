// A memory pool for one tier of one rank: the Program's memory effects become real allocations
// (device memory on a GPU, host memory on the host device) through an allocator the device
// gives, and the pool records the peak with its breakdown by category. A release frees the
// category's most recent blocks first (activations are freed in the reverse order of their
// making, as in training), splitting the last one when the release is smaller than it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "hw_models/units.hpp"
#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::exec {

class MemoryPool {
 public:
  /// Returns the new block, or nullptr when the allocator has no room.
  using Allocate = std::function<void*(std::size_t bytes)>;
  using Release = std::function<void(void* block, std::size_t bytes)>;

  /// `capacity`: the most the pool may hold (0: no limit but the allocator's); `owner` names
  /// the rank and tier in errors ("rank 3 device memory"). Without an allocator the pool only
  /// accounts (a tier the device does not have, such as NVMe).
  MemoryPool(std::string owner, Bytes capacity, Allocate allocate = {}, Release release = {});
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  /// Frees every block and forgets the peak.
  void reset();
  /// Applies one memory effect of `op` at time `now` (relative to the iteration start):
  /// allocates for delta > 0, frees for delta < 0. Throws OutOfMemoryError naming `what` (the
  /// op), the request and what the pool held by category when the allocation fails or the
  /// capacity would be exceeded; ExecError when a release exceeds what the category holds.
  void apply(Bytes delta, strategies::MemoryCategory category, strategies::OpId op, Time now,
             const std::string& what);

  Bytes in_use() const { return in_use_; }
  Bytes held(strategies::MemoryCategory category) const;
  /// Peak so far (capacity filled in).
  const traces::TierPeak& peak() const { return peak_; }
  /// Every change of the total since reset(): (time, total, op).
  struct Sample {
    Time time;
    Bytes total;
    strategies::OpId op;
  };
  const std::vector<Sample>& samples() const { return samples_; }

 private:
  struct Block {
    void* data;
    std::size_t bytes;
  };
  std::string held_text() const;

  std::string owner_;
  Bytes capacity_;
  Allocate allocate_;
  Release release_;
  std::vector<std::vector<Block>> blocks_;  // per category, oldest first
  traces::MemoryBreakdown held_{};
  Bytes in_use_;
  traces::TierPeak peak_{};
  std::vector<Sample> samples_;
};

}  // namespace stratasim::exec
