#include "sim/max_min.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace stratasim::sim {

int MaxMinSolver::add_link(double capacity) {
  if (!(capacity > 0) || !std::isfinite(capacity)) {
    throw std::invalid_argument("max-min solver: link capacity must be positive and finite, got " +
                                std::to_string(capacity));
  }
  Link l;
  l.capacity = capacity;
  links_.push_back(std::move(l));
  return static_cast<int>(links_.size()) - 1;
}

void MaxMinSolver::reserve(std::size_t flows) {
  flows_.reserve(flows);
  heap_.reserve(2 * flows);
}

int MaxMinSolver::start_flow(std::span<const int> route, double bytes, Time now, std::uint64_t tag,
                             std::span<const int> weights, FlowClass cls) {
  if (cls.level < 0 || !(cls.weight > 0) || !std::isfinite(cls.weight)) {
    throw std::invalid_argument(
        "max-min solver: a flow's level must be >= 0 and its weight "
        "positive and finite, got level " +
        std::to_string(cls.level) + ", weight " + std::to_string(cls.weight));
  }
  for (int l : route) {
    if (l < 0 || l >= link_count()) {
      throw std::out_of_range("max-min solver: route names link " + std::to_string(l) + " of " +
                              std::to_string(link_count()));
    }
  }
  if (!weights.empty() && weights.size() != route.size()) {
    throw std::invalid_argument("max-min solver: " + std::to_string(weights.size()) +
                                " weights for a route of " + std::to_string(route.size()) +
                                " links");
  }
  for (int w : weights) {
    if (w < 1) {
      throw std::invalid_argument("max-min solver: a weight must be at least 1, got " +
                                  std::to_string(w));
    }
  }
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<int>(flows_.size());
    flows_.emplace_back();
  }
  Flow& f = flows_[static_cast<std::size_t>(id)];
  f.route.assign(route.begin(), route.end());
  f.slot.resize(route.size());
  f.weight.assign(weights.begin(), weights.end());
  f.bytes = bytes > 0 ? bytes : 0;
  f.remaining = f.bytes;
  f.rate = 0;
  f.cap = 0;
  f.level = cls.level;
  f.share = cls.weight;
  if (cls.level != 0 || cls.weight != 1) classed_ = true;
  f.updated = now;
  f.start = now;
  f.completion = Time::infinity();
  f.sequence = sequence_++;
  f.tag = tag;
  f.active = true;
  f.frozen = false;
  ++active_;
  if (f.bytes <= 0 || route.empty()) {
    // Nothing to carry, or nothing to cross: done at once.
    f.dirty = false;
    f.route.clear();
    f.slot.clear();
    f.weight.clear();
    f.completion = now;
    push_completion(id);
    return id;
  }
  f.dirty = true;
  for (std::size_t i = 0; i < f.route.size(); ++i) {
    Link& l = links_[static_cast<std::size_t>(f.route[i])];
    const int w = f.weight.empty() ? 1 : f.weight[i];
    f.slot[i] = static_cast<int>(l.flows.size());
    l.flows.push_back(LinkEntry{id, static_cast<int>(i), w});
    l.weight += w;
  }
  dirty_flows_.push_back(id);
  return id;
}

void MaxMinSolver::finish_flow(int id, Time at) {
  Flow& f = flows_[static_cast<std::size_t>(id)];
  (void)at;
  for (std::size_t i = 0; i < f.route.size(); ++i) {
    const int link = f.route[i];
    Link& l = links_[static_cast<std::size_t>(link)];
    const int at_slot = f.slot[i];
    l.weight -= l.flows[static_cast<std::size_t>(at_slot)].weight;
    const LinkEntry moved = l.flows.back();
    l.flows[static_cast<std::size_t>(at_slot)] = moved;
    l.flows.pop_back();
    if (moved.flow != id || moved.index != static_cast<int>(i)) {
      flows_[static_cast<std::size_t>(moved.flow)].slot[static_cast<std::size_t>(moved.index)] =
          at_slot;
    }
    dirty_links_.push_back(link);
  }
  f.active = false;
  f.dirty = false;
  ++f.version;
  --active_;
  free_.push_back(id);
}

void MaxMinSolver::set_rate_factor(int id, double factor) {
  Flow& f = flows_[static_cast<std::size_t>(id)];
  if (!f.active || f.route.empty()) return;
  double cap = 0;
  if (factor < 1) {
    double bottleneck = links_[static_cast<std::size_t>(f.route.front())].capacity;
    for (int link : f.route) {
      bottleneck = std::min(bottleneck, links_[static_cast<std::size_t>(link)].capacity);
    }
    cap = std::max(factor, 1e-9) * bottleneck;
  }
  if (cap == f.cap) return;
  f.cap = cap;
  dirty_links_.push_back(f.route.front());  // its component is refilled at the next settle
}

void MaxMinSolver::pop_heap_entry() {
  std::pop_heap(heap_.begin(), heap_.end(), Later{});
  heap_.pop_back();
}

void MaxMinSolver::compact_heap() {
  std::erase_if(heap_, [this](const HeapEntry& e) { return !valid(e); });
  std::make_heap(heap_.begin(), heap_.end(), Later{});
}

void MaxMinSolver::push_completion(int id) {
  Flow& f = flows_[static_cast<std::size_t>(id)];
  ++f.version;
  heap_.push_back(HeapEntry{f.completion, f.sequence, id, f.version});
  std::push_heap(heap_.begin(), heap_.end(), Later{});
  if (heap_.size() > 4 * active_ + 1024) compact_heap();
}

void MaxMinSolver::schedule(int id, Time now) {
  Flow& f = flows_[static_cast<std::size_t>(id)];
  if (f.remaining <= 0) {
    f.completion = now;
  } else {
    // remaining * 1e12 / rate picoseconds, rounded up. The relative slack of 1e-14 absorbs
    // floating-point noise of exact results (it is below a hundredth of a picosecond for a
    // transfer of a second), so that a flow never completes a picosecond late for it either.
    const double q = f.remaining * 1e12 / f.rate;
    const double c = std::ceil(q * (1 - 1e-14));
    constexpr double kMax = 4e18;  // about 46 days: far beyond any iteration
    f.completion = c >= kMax ? Time::infinity() : now + Time::ps(static_cast<std::int64_t>(c));
  }
  push_completion(id);
}

void MaxMinSolver::settle(Time now) {
  if (dirty_links_.empty() && dirty_flows_.empty()) return;
  // 1. The components reachable from dirty links and new flows.
  ++epoch_;
  component_flows_.clear();
  component_links_.clear();
  stack_.clear();
  auto visit_link = [&](int link) {
    Link& l = links_[static_cast<std::size_t>(link)];
    if (l.mark == epoch_) return;
    l.mark = epoch_;
    stack_.push_back(link);
  };
  for (int link : dirty_links_) visit_link(link);
  for (int id : dirty_flows_) {
    const Flow& f = flows_[static_cast<std::size_t>(id)];
    if (!f.active) continue;
    for (int link : f.route) visit_link(link);
  }
  dirty_links_.clear();
  dirty_flows_.clear();
  while (!stack_.empty()) {
    const int link = stack_.back();
    stack_.pop_back();
    component_links_.push_back(link);
    for (const LinkEntry& e : links_[static_cast<std::size_t>(link)].flows) {
      Flow& f = flows_[static_cast<std::size_t>(e.flow)];
      if (f.mark == epoch_) continue;
      f.mark = epoch_;
      f.frozen = false;
      component_flows_.push_back(e.flow);
      for (int other : f.route) visit_link(other);
    }
  }
  if (component_flows_.empty()) return;

  // 2. Progressive filling over those links: level by level when flows have classes.
  for (int link : component_links_) {
    Link& l = links_[static_cast<std::size_t>(link)];
    l.left = l.capacity;
    l.unfrozen = l.weight;
  }
  rate_next_.resize(flows_.size());
  if (!classed_) {
    fill({});
  } else {
    fill_levels();
  }

  // 3. New completion times for the flows whose rate changed.
  for (int id : component_flows_) {
    Flow& f = flows_[static_cast<std::size_t>(id)];
    ++refilled_;
    const double next = rate_next_[static_cast<std::size_t>(id)];
    if (!f.dirty && next == f.rate) continue;
    if (!f.dirty) {
      const auto dt = static_cast<double>((now - f.updated).picoseconds());
      f.remaining = std::max(0.0, f.remaining - f.rate * dt * 1e-12);
    }
    f.updated = now;
    f.rate = next;
    f.dirty = false;
    schedule(id, now);
  }
}

void MaxMinSolver::fill_levels() {
  by_level_.clear();
  for (int id : component_flows_)
    by_level_.emplace_back(flows_[static_cast<std::size_t>(id)].level, id);
  std::sort(by_level_.begin(), by_level_.end());
  for (int link : component_links_) links_[static_cast<std::size_t>(link)].unfrozen = 0;
  for (std::size_t i = 0; i < by_level_.size();) {
    group_.clear();
    std::size_t j = i;
    for (; j < by_level_.size() && by_level_[j].first == by_level_[i].first; ++j) {
      group_.push_back(by_level_[j].second);
    }
    weigh_group(group_);
    fill(group_);
    for (int link : group_links_) links_[static_cast<std::size_t>(link)].unfrozen = 0;
    i = j;
  }
}

void MaxMinSolver::weigh_group(std::span<const int> group) {
  ++group_epoch_;
  group_links_.clear();
  for (int id : group) {
    const Flow& f = flows_[static_cast<std::size_t>(id)];
    for (std::size_t i = 0; i < f.route.size(); ++i) {
      Link& l = links_[static_cast<std::size_t>(f.route[i])];
      if (l.group_mark != group_epoch_) {
        l.group_mark = group_epoch_;
        l.unfrozen = 0;
        group_links_.push_back(f.route[i]);
      }
      l.unfrozen += (f.weight.empty() ? 1 : f.weight[i]) * f.share;
    }
  }
}

void MaxMinSolver::fill(std::span<const int> group) {
  // Links whose unfrozen weight is below this hold no unfrozen flow (weights are >= 1 copies
  // times share weights well above it; the margin absorbs the rounding of summed weights).
  constexpr double kEmpty = 1e-9;
  // A level of this many flows or fewer finds a link's flows among its own (a strict level per
  // transfer, as FIFO gives, has one) rather than among every flow on the link.
  constexpr std::size_t kScanGroup = 16;
  const bool all = group.empty();
  const std::int64_t level = all ? 0 : flows_[static_cast<std::size_t>(group.front())].level;
  shares_.clear();
  for (int link :
       all ? std::span<const int>(component_links_) : std::span<const int>(group_links_)) {
    const Link& l = links_[static_cast<std::size_t>(link)];
    if (l.unfrozen > kEmpty) shares_.push_back(Share{std::max(l.left, 0.0) / l.unfrozen, link});
  }
  // A capped flow's cap is a private link of its own: an entry with link -1 - flow, its fill
  // level the cap over the flow's share weight.
  for (int id : all ? std::span<const int>(component_flows_) : group) {
    const Flow& f = flows_[static_cast<std::size_t>(id)];
    if (f.cap > 0) shares_.push_back(Share{f.cap / f.share, -1 - id});
  }
  std::make_heap(shares_.begin(), shares_.end(), ShareLater{});
  double floor = 0;
  auto freeze = [&](int id, double share) {
    Flow& f = flows_[static_cast<std::size_t>(id)];
    f.frozen = true;
    const double rate = share * f.share;
    rate_next_[static_cast<std::size_t>(id)] = rate;
    for (std::size_t i = 0; i < f.route.size(); ++i) {
      const int other = f.route[i];
      Link& m = links_[static_cast<std::size_t>(other)];
      if (f.weight.empty()) {
        m.left -= rate;
        m.unfrozen -= f.share;
      } else {
        const int w = f.weight[i];
        m.left -= rate * w;
        m.unfrozen -= w * f.share;
      }
      if (m.touch != touch_epoch_) {
        m.touch = touch_epoch_;
        touched_.push_back(other);
      }
    }
  };
  while (!shares_.empty()) {
    std::pop_heap(shares_.begin(), shares_.end(), ShareLater{});
    const Share top = shares_.back();
    shares_.pop_back();
    ++touch_epoch_;
    touched_.clear();
    if (top.link < 0) {  // a flow's cap
      const int id = -1 - top.link;
      if (flows_[static_cast<std::size_t>(id)].frozen) continue;
      const double share = std::max(top.share, floor);
      floor = share;
      freeze(id, share);
    } else {
      Link& l = links_[static_cast<std::size_t>(top.link)];
      if (l.unfrozen <= kEmpty) continue;
      const double current = std::max(l.left, 0.0) / l.unfrozen;
      if (current != top.share) continue;  // stale: a newer entry holds the current share
      const double share = std::max(current, floor);
      floor = share;
      if (!all && group.size() <= kScanGroup) {
        for (int id : group) {
          const Flow& f = flows_[static_cast<std::size_t>(id)];
          if (!f.frozen && std::find(f.route.begin(), f.route.end(), top.link) != f.route.end()) {
            freeze(id, share);
          }
        }
      } else {
        for (const LinkEntry& e : l.flows) {
          const Flow& f = flows_[static_cast<std::size_t>(e.flow)];
          if (!f.frozen && (all || f.level == level)) freeze(e.flow, share);
        }
      }
    }
    for (int other : touched_) {
      Link& m = links_[static_cast<std::size_t>(other)];
      if (m.unfrozen <= kEmpty) continue;
      shares_.push_back(Share{std::max(m.left, 0.0) / m.unfrozen, other});
      std::push_heap(shares_.begin(), shares_.end(), ShareLater{});
    }
  }
}

Time MaxMinSolver::next_completion(Time now) {
  settle(now);
  while (!heap_.empty() && !valid(heap_.front())) pop_heap_entry();
  return heap_.empty() ? Time::infinity() : heap_.front().at;
}

double MaxMinSolver::rate(int flow) const {
  return flows_[static_cast<std::size_t>(flow)].rate;
}

double MaxMinSolver::remaining(int flow, Time now) const {
  const Flow& f = flows_[static_cast<std::size_t>(flow)];
  const auto dt = static_cast<double>((now - f.updated).picoseconds());
  return std::max(0.0, f.remaining - f.rate * dt * 1e-12);
}

Time MaxMinSolver::completion(int flow) const {
  return flows_[static_cast<std::size_t>(flow)].completion;
}

}  // namespace stratasim::sim
