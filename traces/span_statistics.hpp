// What a report (traces/report.hpp) takes from a timeline's spans, gathered one span at a time,
// so that a simulation computes it while it runs instead of keeping a span per op (issue 19's
// lean exact mode: study/ attaches it to the simulator as an observer and records spans only
// for the traced ranks). make_report(program, timeline, context) gathers the same statistics
// from timeline.spans: one implementation for both ways.
//
// Semantics: add() takes spans in any order (a measured timeline's may be out of order, and may
// overlap on one stream); the result depends only on the set of spans added. Each figure is the
// one traces/report.cpp's header defines; exact integer picoseconds throughout, so the report
// is bit-identical whichever way the spans arrive.
//
// Memory: a few scalars per rank plus, per rank, the union of its communication spans, of its
// compute spans and of its forward/backward/recompute compute spans as sorted disjoint
// intervals (16 B each): one interval per stretch of back-to-back spans, not one per span.
// Spans that arrive in order of their end (a simulation's) extend or append at the end of each
// union; others are merged where they fall.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "strategies/program.hpp"
#include "traces/timeline.hpp"

namespace stratasim::traces {

/// A union of half-open intervals [start, end) of picoseconds, as sorted disjoint intervals
/// (touching ones joined).
class IntervalUnion {
 public:
  using Interval = std::pair<std::int64_t, std::int64_t>;
  /// Adds [start, end) (nothing when end <= start). When `overlap` is given, the parts of
  /// [start, end) the union already covered are appended to it (disjoint, increasing).
  void add(std::int64_t start, std::int64_t end, std::vector<Interval>* overlap = nullptr);
  /// The union's intervals, in increasing order.
  std::vector<Interval> intervals() const;
  /// The measure of the union within [from, to).
  std::int64_t measure_within(std::int64_t from, std::int64_t to) const;

 private:
  // The union is closed_ and then last_, its latest interval, kept apart so that a span that
  // extends it (the usual case: back-to-back spans in order of their end) touches no vector.
  void add_anywhere(std::int64_t start, std::int64_t end, std::vector<Interval>* overlap);
  std::vector<Interval> closed_;
  Interval last_{0, 0};
  // closed_.back().second (or the lowest time when closed_ is empty): the fast path reads no
  // vector.
  std::int64_t closed_end_ = INT64_MIN;
  bool empty_ = true;
};

/// Measure of a minus b (both unions), in picoseconds.
std::int64_t measure_minus(const IntervalUnion& a, const IntervalUnion& b);

class SpanStatistics {
 public:
  explicit SpanStatistics(const strategies::Program& program);

  /// Adds one span; std::invalid_argument naming the span (its position among those added) when
  /// its rank or op is outside the program.
  void add(const Span& span);

  /// How many spans were added.
  std::size_t spans() const { return spans_; }
  /// Earliest start and latest end over the spans added (0 when none).
  Time first_start() const;
  Time last_end() const;

  // The figures traces/report.cpp defines, for its fill steps.
  struct RankFigures {
    std::int64_t optimizer_ps = 0;
    // Overlapping iterations: the busy window (first compute start to last end) and the
    // forward/backward/recompute compute window.
    std::int64_t first = kNoTime, last = kNoEnd, fb_first = kNoTime, fb_last = kNoEnd;
    IntervalUnion compute;  // compute stream
    IntervalUnion comm;     // tp_comm, dp_comm, pp_send, pp_recv
    IntervalUnion copy;     // copy stream (offload, an embedding cache's misses)
    IntervalUnion fb;       // compute stream, phase forward, backward or recompute
    std::vector<IntervalUnion::Interval> fb_extra;  // fb spans' overlaps with earlier fb spans
  };
  static constexpr std::int64_t kNoTime = INT64_MAX;
  static constexpr std::int64_t kNoEnd = INT64_MIN;

  std::int64_t first_start_ps() const { return first_start_; }
  std::int64_t last_end_ps() const { return last_end_; }
  std::int64_t forward_start_ps() const { return forward_start_; }
  /// Per iteration of the Program (strategies::Program::iterations), the latest end of its
  /// spans (kNoEnd for an iteration without spans).
  const std::vector<std::int64_t>& iteration_end_ps() const { return iteration_end_; }
  std::int64_t backward_end_ps() const { return backward_end_; }
  const std::vector<RankFigures>& ranks() const { return ranks_; }
  /// Compute-stream forward/backward/recompute time of `rank` within [from, to): the sum over
  /// its spans of their parts within the window.
  std::int64_t busy_within(std::size_t rank, std::int64_t from, std::int64_t to) const;
  /// Time with data moving of the communication ops of `rank` by (stream or cp, kind) slot
  /// (report.cpp's numbering), or 0 for a rank with no communication spans.
  std::int64_t comm_time(std::size_t rank, std::size_t slot) const;
  /// The slot report.cpp tallies `op` under: (stream, or cp) * kinds + kind; -1 when it is not
  /// a collective or a send.
  int comm_slot(const strategies::Op& op) const;
  static constexpr int kCommKinds = 7;                               // collective kinds, send
  static constexpr int kCommStreams = strategies::kStreamCount + 1;  // streams, then cp
  static constexpr int kCommSlots = kCommKinds * kCommStreams;

 private:
  const strategies::Program& program_;
  // Context parallelism's transfers (report.cpp's "cp" stream): per group, per label.
  std::vector<char> cp_group_, cp_label_;
  std::size_t spans_ = 0;
  std::int64_t first_start_ = kNoTime, last_end_ = kNoEnd;
  std::int64_t forward_start_ = kNoTime, backward_end_ = kNoEnd;
  std::vector<std::int64_t> iteration_end_;
  std::vector<RankFigures> ranks_;
  // Per rank with communication spans: kCommSlots times, indexed by comm_index_.
  std::vector<std::uint32_t> comm_index_;
  std::vector<std::int64_t> comm_time_;
};

}  // namespace stratasim::traces
