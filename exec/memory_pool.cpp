#include "exec/memory_pool.hpp"

#include "exec/rank_device.hpp"

namespace stratasim::exec {

using strategies::MemoryCategory;

MemoryPool::MemoryPool(std::string owner, Bytes capacity, Allocate allocate, Release release)
    : owner_(std::move(owner)),
      capacity_(capacity),
      allocate_(std::move(allocate)),
      release_(std::move(release)),
      blocks_(strategies::kMemoryCategoryCount) {
  peak_.capacity = capacity_;
}

MemoryPool::~MemoryPool() {
  reset();
}

void MemoryPool::reset() {
  for (auto& list : blocks_) {
    for (const Block& b : list) {
      if (release_ && b.data) release_(b.data, b.bytes);
    }
    list.clear();
  }
  held_ = {};
  in_use_ = Bytes(0);
  peak_ = {};
  peak_.capacity = capacity_;
  samples_.clear();
}

Bytes MemoryPool::held(MemoryCategory category) const {
  return held_[static_cast<std::size_t>(category)];
}

std::string MemoryPool::held_text() const {
  std::string text;
  for (int c = 0; c < strategies::kMemoryCategoryCount; ++c) {
    if (held_[static_cast<std::size_t>(c)].count() == 0) continue;
    if (!text.empty()) text += ", ";
    text += std::string(name_of(static_cast<MemoryCategory>(c))) + " " +
            to_string(held_[static_cast<std::size_t>(c)]);
  }
  return text.empty() ? "nothing" : text;
}

void MemoryPool::apply(Bytes delta, MemoryCategory category, strategies::OpId op, Time now,
                       const std::string& what) {
  if (delta.count() == 0) return;
  const auto c = static_cast<std::size_t>(category);
  if (delta.count() > 0) {
    if (capacity_.count() > 0 && in_use_ + delta > capacity_) {
      throw OutOfMemoryError(owner_ + ": out of memory at " + what + ": " + to_string(delta) +
                             " more " + std::string(name_of(category)) + " would make " +
                             to_string(in_use_ + delta) + " of " + to_string(capacity_) +
                             "; held: " + held_text());
    }
    void* data = nullptr;
    if (allocate_) {
      data = allocate_(static_cast<std::size_t>(delta.count()));
      if (!data) {
        throw OutOfMemoryError(owner_ + ": the allocator refused " + to_string(delta) + " of " +
                               std::string(name_of(category)) + " at " + what +
                               "; held: " + held_text() + " (" + to_string(in_use_) + " in all)");
      }
    }
    blocks_[c].push_back({data, static_cast<std::size_t>(delta.count())});
  } else {
    auto remaining = static_cast<std::size_t>(-delta.count());
    if (remaining > static_cast<std::size_t>(held_[c].count())) {
      throw ExecError(owner_ + ": " + what + " releases " + to_string(-delta) + " of " +
                      std::string(name_of(category)) + " but only " + to_string(held_[c]) +
                      " is held");
    }
    auto& list = blocks_[c];
    while (remaining > 0) {
      Block b = list.back();
      list.pop_back();
      if (release_ && b.data) release_(b.data, b.bytes);
      if (b.bytes > remaining) {
        // Keep the rest of the block: allocate it again (the release is partial).
        const std::size_t rest = b.bytes - remaining;
        void* data = allocate_ ? allocate_(rest) : nullptr;
        if (allocate_ && !data) {
          throw OutOfMemoryError(owner_ + ": the allocator refused " +
                                 to_string(Bytes(static_cast<std::int64_t>(rest))) +
                                 " while splitting a block at " + what);
        }
        list.push_back({data, rest});
        remaining = 0;
      } else {
        remaining -= b.bytes;
      }
    }
  }
  held_[c] += delta;
  in_use_ += delta;
  samples_.push_back({now, in_use_, op});
  if (in_use_ > peak_.peak) {
    peak_.peak = in_use_;
    peak_.time = now;
    peak_.op = op;
    peak_.breakdown = held_;
  }
}

}  // namespace stratasim::exec
