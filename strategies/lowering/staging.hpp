// Bounded staging: a fixed pool of equal buffers that transient data passes through on its way
// somewhere else (a gradient bucket on its way to the reduce-scatter and, with ZeRO-Offload, to
// the host). The pool's memory is held for the whole iteration and never grows with the number
// of buckets or microbatches: a new bucket takes a free buffer, and when every buffer is taken
// the op that starts filling it waits for the oldest one to be released.
//
// This is DeepSpeed's rule (deepspeed/runtime/zero/stage_1_and_2.py): with
// contiguous_gradients, each backward allocates `ipg_buffer`, one buffer of reduce_bucket_size
// elements in the training dtype and a second one with overlap_comm ("double buffers to avoid
// data access conflict"); when a bucket is full, average_tensor() makes the compute stream wait
// for the reduction stream (current_stream().wait_stream(reduction_stream)), which also runs the
// bucket's copies to the host's fp32 gradients with cpu_offload, before the next bucket fills the
// other buffer. Stage 3 (stage3.py) keeps one flat buffer and lets at most
// max_param_reduce_events = 2 reductions run behind the backward before the host synchronises;
// modelled with the same pool.
//
// Units: a buffer's bytes; releases are the ops after which a buffer may be reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "strategies/program.hpp"

namespace stratasim::strategies {

/// Bytes a pool of `buffers` buffers of `elements` elements of `element_size` bytes holds.
inline Bytes staging_bytes(std::size_t buffers, std::int64_t elements, std::int64_t element_size) {
  return Bytes(static_cast<std::int64_t>(buffers) * elements * element_size);
}

class StagingPool {
 public:
  /// A pool of `buffers` (at least 1) buffers.
  explicit StagingPool(std::size_t buffers = 1) : buffers_(buffers < 1 ? 1 : buffers) {}

  std::size_t buffers() const { return buffers_; }

  /// Forgets every bucket (a new rank).
  void reset() {
    released_.clear();
    filling_ = 0;
  }

  /// A bucket starts filling a buffer: appends to `deps` the releases it must wait for (the
  /// oldest buckets still holding a buffer while all of them are taken).
  void claim(std::vector<OpId>& deps) {
    while (!released_.empty() && released_.size() + filling_ >= buffers_) {
      deps.push_back(released_.front());
      released_.pop_front();
    }
    ++filling_;
  }

  /// A bucket claimed earlier is issued; its buffer is free once `release` has run.
  void issued(OpId release) {
    if (filling_ > 0) --filling_;
    released_.push_back(release);
  }

 private:
  std::size_t buffers_;
  std::deque<OpId> released_;  // issued buckets, oldest first, not yet waited for
  std::size_t filling_ = 0;    // claimed buckets not issued yet
};

}  // namespace stratasim::strategies
