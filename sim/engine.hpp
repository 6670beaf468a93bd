// The discrete-event engine: one clock and one queue of events ordered by (time, sequence
// number), so that equal inputs give identical outputs. Events are small PODs in a binary
// heap: nothing is allocated per event once the heap has grown.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

#include "hw_models/units.hpp"

namespace stratasim::sim {

struct Event {
  Time time;
  std::uint64_t sequence = 0;  // order of scheduling: breaks ties deterministically
  std::uint32_t kind = 0;      // meaning chosen by the handler
  std::uint32_t target = 0;    // e.g. an op or transfer id
};

class Engine {
 public:
  Time now() const { return now_; }
  bool empty() const { return queue_.empty(); }
  std::size_t pending() const { return queue_.size(); }
  std::uint64_t processed() const { return processed_; }
  /// Time of the next event, or Time::infinity() when none is pending.
  Time next_time() const { return queue_.empty() ? Time::infinity() : queue_.top().time; }

  /// Schedules an event at `at` (never earlier than now()).
  void schedule(Time at, std::uint32_t kind, std::uint32_t target) {
    queue_.push(Event{at < now_ ? now_ : at, next_sequence_++, kind, target});
  }

  /// Moves the clock forward to `t` (used when a resource, not an event, is next).
  void advance_to(Time t) {
    if (t > now_) now_ = t;
  }

  /// Removes the next event and moves the clock to its time.
  Event pop() {
    Event e = queue_.top();
    queue_.pop();
    now_ = e.time;
    ++processed_;
    return e;
  }

  void reserve(std::size_t events) {
    std::vector<Event> storage;
    storage.reserve(events);
    queue_ = Queue(Later{}, std::move(storage));
  }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      if (a.time != b.time) return a.time > b.time;
      return a.sequence > b.sequence;
    }
  };
  using Queue = std::priority_queue<Event, std::vector<Event>, Later>;
  Queue queue_;
  Time now_;
  std::uint64_t next_sequence_ = 0;
  std::uint64_t processed_ = 0;
};

}  // namespace stratasim::sim
