// Max-min fair sharing of link bandwidth between flows (the flow-level network's solver).
//
// Links have capacities (bytes/s); a flow crosses a route of links and carries some bytes. The
// rates are max-min fair: no flow's rate can grow without lowering the rate of a flow that has
// no more. Progressive filling (water-filling) finds them: every unfrozen flow's rate grows
// together; the link whose remaining capacity divided by its unfrozen flows is smallest
// saturates first and freezes its flows at that share; repeat until every flow is frozen.
//
// Incremental: a flow that starts or ends changes the rates only of the flows connected to it
// through shared links (transitively: its connected component in the flow-link graph), since
// max-min fairness decomposes over components. Starts and ends mark their links dirty; the
// next settle() (or next_completion()) walks the components reachable from dirty links and
// refills only those. Flows whose rate comes out unchanged keep their completion time.
//
// Rate caps: a flow may be held to a share of the rate it would get alone (set_rate_factor:
// factor x the smallest capacity on its route), as a transfer is when the device memory it streams
// through is shared with kernels beside it (hw_models/interference.hpp). A capped flow is a
// flow with a private link of that capacity: water-filling freezes it at its cap when the
// filling level reaches it, and what it leaves goes to the other flows on its links.
//
// Weights (multiplicities): a flow may stand for several identical copies of itself, each at its
// rate (the flow network's symmetry reduction, sim/flow_network.hpp): start_flow's `weights`
// say, per route entry, how many of the copies cross that link, so the link carries weight x
// rate for it and water-filling divides a link's capacity among the unfrozen weights instead of
// the unfrozen flows (a link's fill level = left / sum of unfrozen weights). Rates are per copy.
// With every weight 1 (or none given) the arithmetic is the unweighted one, bit for bit
// (share x 1 is share). The weighted solution is the unweighted solution of the system with the
// copies spelled out, whenever the copies get equal rates there (max-min fairness is unique).
//
// Classes (FlowClass): a flow has a level and a share weight. Levels are strict priorities
// (the per-layer gradient priorities of DLCP, Wang et al., "Domain-specific Communication
// Optimization for Distributed DNN Training", arXiv 2020, as strict-priority switch queues
// serve them): water-filling runs level by level, level 0 first, each level
// filling only the capacity the more urgent levels left (priority-aware max-min: a level-1 flow
// gets bandwidth on a link only after every level-0 flow there is frozen at its max-min rate).
// Within a level, weights give weighted max-min fairness (Bertsekas & Gallager, Data Networks,
// 6.5.2): a flow of weight w gets w times the fill level of its bottleneck, so on one link
// flows of weights 3 and 1 get 3/4 and 1/4 of it. Every flow at level 0 and weight 1 (the
// default, and all that existed before classes) gives the unclassed arithmetic, bit for bit.
//
// Time is integer picoseconds. A flow's remaining bytes are tracked lazily (as of its last rate
// change, plus rate times elapsed time); its completion is the current time plus remaining /
// rate rounded up to a whole picosecond (never early), kept in a heap with lazy invalidation.
// Flows completing at the same picosecond come out in the order they were started (sequence
// number). Everything is deterministic: equal inputs give equal outputs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hw_models/units.hpp"

namespace stratasim::sim {

/// A flow's class: its strict-priority level (0 most urgent) and its share weight (> 0) among
/// the flows of its level.
struct FlowClass {
  std::int64_t level = 0;
  double weight = 1;
};

class MaxMinSolver {
 public:
  /// Adds a link of `capacity` bytes per second (> 0); returns its id (0, 1, ...).
  int add_link(double capacity);
  int link_count() const { return static_cast<int>(links_.size()); }
  double capacity(int link) const { return links_[static_cast<std::size_t>(link)].capacity; }

  /// Starts a flow of `bytes` over `route` (link ids; may be empty: infinitely fast) at `now`,
  /// which must not be before the last time given to the solver. `tag` is the caller's, handed
  /// back on completion. Returns the flow's id (ids are reused after completion). A flow of no
  /// bytes or an empty route completes at `now`. `weights` (empty: all 1) gives each route
  /// entry's multiplicity (>= 1): how many copies of the flow cross that link; `bytes` and the
  /// rate are per copy. `cls`: the flow's level and weight (see the header comment).
  int start_flow(std::span<const int> route, double bytes, Time now, std::uint64_t tag = 0,
                 std::span<const int> weights = {}, FlowClass cls = {});

  /// Caps an active flow's rate at `factor` x the smallest capacity on its route from the next
  /// settle on (which must be at the time the cap takes effect); factor >= 1 removes the cap.
  /// Its component is refilled at that settle.
  void set_rate_factor(int flow, double factor);
  /// The start order of a flow (unique over the solver's life, unlike flow ids): to tell a
  /// flow from a later one that reuses its id.
  std::uint64_t sequence(int flow) const { return flows_[static_cast<std::size_t>(flow)].sequence; }
  bool active(int flow) const { return flows_[static_cast<std::size_t>(flow)].active; }

  /// Recomputes the rates of the components touched since the last settle, at time `now`.
  void settle(Time now);

  /// When the earliest active flow completes (Time::infinity() when none); settles first.
  Time next_completion(Time now);

  /// Removes every flow that completes at `at` (which must be next_completion()), in start
  /// order, calling done(flow id, route, bytes, start, tag) for each before its id is reused.
  /// The rates of the others are recomputed at the next settle.
  template <class Done>
  void take_completions(Time at, Done&& done) {
    while (!heap_.empty()) {
      const HeapEntry top = heap_.front();
      if (!valid(top)) {
        pop_heap_entry();
        continue;
      }
      if (top.at != at) break;
      pop_heap_entry();
      Flow& f = flows_[static_cast<std::size_t>(top.flow)];
      done(top.flow, std::span<const int>(f.route), f.bytes, f.start, f.tag);
      finish_flow(top.flow, at);
    }
  }

  /// The weights an active flow was started with (empty: all 1).
  std::span<const int> weights(int flow) const {
    return flows_[static_cast<std::size_t>(flow)].weight;
  }
  /// Rate of an active flow in bytes per second (as of the last settle).
  double rate(int flow) const;
  /// Bytes an active flow still has to carry at `now` (>= the last settle).
  double remaining(int flow, Time now) const;
  /// Completion time of an active flow (as of the last settle).
  Time completion(int flow) const;
  std::size_t active_flows() const { return active_; }
  /// Flows whose rates were computed by water-filling so far (a measure of the work done).
  std::uint64_t refilled_flows() const { return refilled_; }

  void reserve(std::size_t flows);

 private:
  struct Flow {
    std::vector<int> route;   // link ids
    std::vector<int> slot;    // per route entry: index in that link's flow list
    std::vector<int> weight;  // per route entry: its multiplicity; empty: all 1
    double bytes = 0;         // total
    double remaining = 0;     // as of `updated`
    double rate = 0;          // bytes per second
    double cap = 0;           // rate cap in bytes per second; 0: none (set_rate_factor)
    std::int64_t level = 0;   // FlowClass
    double share = 1;         // FlowClass::weight
    Time updated;             // when `remaining` was last brought up to date
    Time start;               // when the flow started
    Time completion = Time::infinity();
    std::uint64_t sequence = 0;  // start order: breaks ties
    std::uint64_t tag = 0;
    std::uint32_t version = 0;  // bumps on each reschedule: older heap entries are stale
    std::uint32_t mark = 0;     // component walk epoch
    bool active = false;
    bool frozen = false;  // water-filling scratch
    bool dirty = false;   // started since the last settle: no rate yet
  };
  struct LinkEntry {
    int flow;
    int index;   // position of this link in the flow's route
    int weight;  // the entry's multiplicity (1 unless the flow stands for copies)
  };
  struct Link {
    double capacity = 0;
    std::vector<LinkEntry> flows;
    int weight = 0;          // sum of its entries' weights
    std::uint32_t mark = 0;  // component walk epoch
    // Water-filling scratch.
    double left = 0;
    double unfrozen = 0;  // weight of the unfrozen entries (times their flows' share weights)
    std::uint32_t touch = 0;
    std::uint32_t group_mark = 0;  // weigh_group's epoch
  };
  struct HeapEntry {
    Time at;
    std::uint64_t sequence;
    int flow;
    std::uint32_t version;
  };
  struct Later {
    bool operator()(const HeapEntry& a, const HeapEntry& b) const {
      return a.at != b.at ? a.at > b.at : a.sequence > b.sequence;
    }
  };
  struct Share {
    double share;
    int link;
  };
  struct ShareLater {
    bool operator()(const Share& a, const Share& b) const {
      return a.share != b.share ? a.share > b.share : a.link > b.link;
    }
  };

  bool valid(const HeapEntry& e) const {
    const Flow& f = flows_[static_cast<std::size_t>(e.flow)];
    return f.active && f.version == e.version;
  }
  void pop_heap_entry();
  void push_completion(int flow);
  void schedule(int flow, Time now);
  void finish_flow(int flow, Time at);
  void compact_heap();
  /// Water-fills unfrozen flows into what their links have left: every flow of the component
  /// (group empty), or the flows of one level (`group`, ids of that level; their links' unfrozen
  /// weights set by weigh_group).
  void fill(std::span<const int> group);
  /// The component's levels one after another, most urgent first (classed flows).
  void fill_levels();
  /// Sets the unfrozen weight of the links `group`'s flows cross to theirs (group_links_).
  void weigh_group(std::span<const int> group);

  std::vector<Link> links_;
  std::vector<Flow> flows_;
  std::vector<int> free_;             // reusable flow ids
  std::vector<HeapEntry> heap_;       // completions, binary heap by Later
  std::vector<int> dirty_links_;      // seeds of the next settle
  std::vector<int> dirty_flows_;      // started since the last settle
  std::vector<int> component_flows_;  // scratch
  std::vector<int> component_links_;  // scratch
  std::vector<int> stack_;            // scratch
  std::vector<Share> shares_;         // scratch heap
  std::vector<int> touched_;          // scratch
  std::vector<double> rate_next_;     // scratch: per flow id, its rate being computed
  std::uint32_t epoch_ = 0;
  std::uint32_t touch_epoch_ = 0;
  std::uint64_t sequence_ = 0;
  std::uint64_t refilled_ = 0;
  std::size_t active_ = 0;
  bool classed_ = false;  // some flow was started with a level or weight of its own
  std::vector<std::pair<std::int64_t, int>> by_level_;  // scratch: (level, flow) sorted
  std::vector<int> group_;                              // scratch: one level's flows
  std::vector<int> group_links_;                        // scratch: the links they cross
  std::uint32_t group_epoch_ = 0;
};

}  // namespace stratasim::sim
