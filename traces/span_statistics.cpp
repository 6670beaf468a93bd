#include "traces/span_statistics.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>

namespace stratasim::traces {

namespace {

using strategies::Phase;

constexpr std::uint32_t kNoBlock = 0xFFFFFFFFu;

[[noreturn]] void bad_span(std::size_t index, const Span& span, std::string_view why) {
  throw std::invalid_argument("timeline span " + std::to_string(index) + " (rank " +
                              std::to_string(span.rank) + ", op " + std::to_string(span.op) +
                              "): " + std::string(why));
}

bool communication_stream(Stream s) {
  return s == Stream::tp_comm || s == Stream::dp_comm || s == Stream::pp_send ||
         s == Stream::pp_recv;
}

}  // namespace

// ---- IntervalUnion.

void IntervalUnion::add(std::int64_t start, std::int64_t end, std::vector<Interval>* overlap) {
  if (end <= start) return;
  if (empty_) {
    last_ = {start, end};
    empty_ = false;
    return;
  }
  const bool clear_of_closed = start > closed_end_;
  if (clear_of_closed && start > last_.second) {  // after the latest interval: a new one
    closed_.push_back(last_);
    closed_end_ = last_.second;
    last_ = {start, end};
    return;
  }
  if (clear_of_closed && end >= last_.first) {  // touches the latest interval only
    if (overlap != nullptr) {
      const std::int64_t s = std::max(start, last_.first), e = std::min(end, last_.second);
      if (e > s) overlap->emplace_back(s, e);
    }
    last_ = {std::min(start, last_.first), std::max(end, last_.second)};
    return;
  }
  closed_.push_back(last_);
  add_anywhere(start, end, overlap);
  last_ = closed_.back();
  closed_.pop_back();
  closed_end_ = closed_.empty() ? INT64_MIN : closed_.back().second;
}

void IntervalUnion::add_anywhere(std::int64_t start, std::int64_t end,
                                 std::vector<Interval>* overlap) {
  // The intervals [first, last) are those that [start, end] touches (end >= their start and
  // start <= their end); they are merged with it. Spans that arrive in order of their end touch
  // only the last intervals: search from the back.
  auto last = closed_.end();
  while (last != closed_.begin() && std::prev(last)->first > end) --last;
  auto first = last;
  while (first != closed_.begin() && std::prev(first)->second >= start) --first;
  if (first == last) {
    closed_.insert(first, {start, end});
    return;
  }
  if (overlap != nullptr) {
    for (auto it = first; it != last; ++it) {
      const std::int64_t s = std::max(start, it->first), e = std::min(end, it->second);
      if (e > s) overlap->emplace_back(s, e);
    }
  }
  first->first = std::min(first->first, start);
  first->second = std::max(std::prev(last)->second, end);
  closed_.erase(std::next(first), last);
}

std::vector<IntervalUnion::Interval> IntervalUnion::intervals() const {
  std::vector<Interval> all = closed_;
  if (!empty_) all.push_back(last_);
  return all;
}

std::int64_t IntervalUnion::measure_within(std::int64_t from, std::int64_t to) const {
  std::int64_t total = 0;
  auto part = [&](const Interval& i) {
    const std::int64_t a = std::max(i.first, from), b = std::min(i.second, to);
    if (b > a) total += b - a;
  };
  for (const auto& i : closed_) part(i);
  if (!empty_) part(last_);
  return total;
}

std::int64_t measure_minus(const IntervalUnion& a, const IntervalUnion& b) {
  std::int64_t result = 0;
  const auto cut = b.intervals();
  std::size_t j = 0;
  for (const auto& [s, e] : a.intervals()) {
    std::int64_t covered = 0;
    // b's intervals are disjoint and increasing; those ending before s are done with.
    while (j < cut.size() && cut[j].second <= s) ++j;
    for (std::size_t k = j; k < cut.size() && cut[k].first < e; ++k) {
      covered += std::min(cut[k].second, e) - std::max(cut[k].first, s);
    }
    result += (e - s) - covered;
  }
  return result;
}

// ---- SpanStatistics.

// Context parallelism's transfers run on the tp-comm stream beside the tensor-parallel ones; the
// report lists them as "cp": collectives on a cp group (strategies/lowering/communicators.cpp
// names them "cp s<stage> d<replica> t<tp>") and the ring's sends (strategies/context_parallel.cpp
// labels them "... cp ring ...").
SpanStatistics::SpanStatistics(const strategies::Program& program)
    : program_(program),
      iteration_end_(static_cast<std::size_t>(program.iterations()), kNoEnd),
      ranks_(static_cast<std::size_t>(program.world_size())),
      comm_index_(static_cast<std::size_t>(program.world_size()), kNoBlock) {
  for (const auto& group : program.groups()) cp_group_.push_back(group.name.rfind("cp ", 0) == 0);
  for (const auto& label : program.labels()) {
    cp_label_.push_back(label.find(" cp ring ") != std::string::npos);
  }
}

int SpanStatistics::comm_slot(const strategies::Op& op) const {
  int kind = -1;
  bool cp = false;
  if (const auto* c = std::get_if<strategies::Collective>(&op.work)) {
    kind = static_cast<int>(c->kind);
    const std::uint32_t group = c->group;
    cp = group < cp_group_.size() && cp_group_[group];
  } else if (std::holds_alternative<strategies::Send>(op.work)) {
    kind = kCommKinds - 1;
    cp = op.label < cp_label_.size() && cp_label_[op.label];
  } else {
    return -1;
  }
  const int stream = cp ? strategies::kStreamCount : static_cast<int>(op.stream);
  return stream * kCommKinds + kind;
}

void SpanStatistics::add(const Span& span) {
  const std::size_t index = spans_++;
  if (span.rank < 0 || span.rank >= program_.world_size()) {
    bad_span(index, span, "rank outside the program's world");
  }
  if (span.op >= program_.op_count()) bad_span(index, span, "op outside the program");
  const std::int64_t s = span.start.picoseconds();
  const std::int64_t e = span.end.picoseconds();
  first_start_ = std::min(first_start_, s);
  last_end_ = std::max(last_end_, e);
  const strategies::Op& op = program_.op(span.op);
  if (iteration_end_.size() > 1) {
    std::int64_t& end = iteration_end_[static_cast<std::size_t>(program_.iteration_of(span.op))];
    end = std::max(end, e);
  }
  const Phase phase = op.phase;
  if (phase == Phase::forward) forward_start_ = std::min(forward_start_, s);
  if (phase == Phase::backward) backward_end_ = std::max(backward_end_, e);
  const auto rank = static_cast<std::size_t>(span.rank);
  RankFigures& r = ranks_[rank];
  r.last = std::max(r.last, e);
  const Stream stream = span.stream;
  const bool fb = phase == Phase::forward || phase == Phase::backward || phase == Phase::recompute;
  if (stream == Stream::compute) {
    r.first = std::min(r.first, s);
    if (fb) {
      r.fb_first = std::min(r.fb_first, s);
      r.fb_last = std::max(r.fb_last, e);
      r.fb.add(s, e, &r.fb_extra);
    }
    r.compute.add(s, e);
  } else if (communication_stream(stream)) {
    r.comm.add(s, e);
  } else if (stream == Stream::copy) {
    r.copy.add(s, e);
  }
  // The step runs on the device, or on the host when the optimizer is offloaded.
  if ((stream == Stream::compute || stream == Stream::host) && phase == Phase::optimizer) {
    r.optimizer_ps += e - s;
  }
  const int slot = comm_slot(op);
  if (slot < 0) return;
  // Keyed by the op's rank, as report.cpp tallies calls and bytes.
  const auto op_rank = static_cast<std::size_t>(op.rank);
  if (comm_index_[op_rank] == kNoBlock) {
    comm_index_[op_rank] = static_cast<std::uint32_t>(comm_time_.size() / kCommSlots);
    comm_time_.resize(comm_time_.size() + kCommSlots, 0);
  }
  comm_time_[comm_index_[op_rank] * std::size_t{kCommSlots} + static_cast<std::size_t>(slot)] +=
      e - s;
}

Time SpanStatistics::first_start() const {
  return spans_ == 0 ? Time() : Time::ps(first_start_);
}

Time SpanStatistics::last_end() const {
  return spans_ == 0 ? Time() : Time::ps(last_end_);
}

std::int64_t SpanStatistics::busy_within(std::size_t rank, std::int64_t from,
                                         std::int64_t to) const {
  const RankFigures& r = ranks_[rank];
  // Sum over spans of their parts in the window = the union's part + the parts that earlier
  // spans already covered (fb_extra), each counted once more.
  std::int64_t busy = r.fb.measure_within(from, to);
  for (const auto& [s, e] : r.fb_extra) {
    const std::int64_t a = std::max(s, from), b = std::min(e, to);
    if (b > a) busy += b - a;
  }
  return busy;
}

std::int64_t SpanStatistics::comm_time(std::size_t rank, std::size_t slot) const {
  const std::uint32_t block = comm_index_[rank];
  return block == kNoBlock ? 0 : comm_time_[block * std::size_t{kCommSlots} + slot];
}

}  // namespace stratasim::traces
