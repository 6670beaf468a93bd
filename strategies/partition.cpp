#include "strategies/partition.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace stratasim::strategies {

namespace {

// Sums of squared part times in picoseconds exceed 64 bits (one second is 1e12 ps).
__extension__ typedef unsigned __int128 Square;
constexpr Square kSquareMax = ~Square(0);

Square square(std::int64_t t) {
  return static_cast<Square>(t) * static_cast<Square>(t);
}
Square add(Square a, Square b) {
  return a > kSquareMax - b ? kSquareMax : a + b;
}

std::int64_t checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw std::invalid_argument("partition: costs too large (64-bit overflow)");
  }
  return r;
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw std::invalid_argument("partition: costs too large (64-bit overflow)");
  }
  return r;
}

void check_cost(const LayerCost& c, const std::string& what) {
  if (c.compute < Time::zero() || c.state < Bytes(0) || c.activations < Bytes(0) ||
      c.output < Bytes(0)) {
    throw std::invalid_argument("partition: " + what + " has a negative cost");
  }
}

/// The cost model shared by the partitioner and the evaluation: prefix sums over the layers,
/// so that any part's time and memory are O(1).
class CostModel {
 public:
  explicit CostModel(const PartitionProblem& p)
      : p_(p), layers_(static_cast<int>(p.layers.size())), parts_(p.parts) {
    if (layers_ < 1) throw std::invalid_argument("partition: the model has no layers");
    if (parts_ < 1 || parts_ > layers_) {
      throw std::invalid_argument("partition: cannot split " + std::to_string(layers_) +
                                  " layers into " + std::to_string(parts_) + " non-empty parts");
    }
    const auto parts = static_cast<std::size_t>(parts_);
    if (!p.in_flight.empty() && p.in_flight.size() != parts) {
      throw std::invalid_argument("partition: in_flight has " + std::to_string(p.in_flight.size()) +
                                  " entries for " + std::to_string(parts_) + " parts");
    }
    if (!p.capacity.empty() && p.capacity.size() != parts) {
      throw std::invalid_argument("partition: capacity has " + std::to_string(p.capacity.size()) +
                                  " entries for " + std::to_string(parts_) + " parts");
    }
    const double bw = p.p2p.bytes_per_second();
    if (!(bw >= 0) || !std::isfinite(bw)) {
      throw std::invalid_argument("partition: p2p bandwidth must be finite and non-negative");
    }
    if (p.p2p_latency < Time::zero()) {
      throw std::invalid_argument("partition: p2p latency is negative");
    }
    check_cost(p.first_extra, "first_extra");
    check_cost(p.last_extra, "last_extra");

    compute_.assign(static_cast<std::size_t>(layers_) + 1, 0);
    state_.assign(compute_.size(), 0);
    activations_.assign(compute_.size(), 0);
    hop_.assign(static_cast<std::size_t>(layers_), 0);
    for (int l = 0; l < layers_; ++l) {
      const LayerCost& c = p.layers[static_cast<std::size_t>(l)];
      check_cost(c, "layer " + std::to_string(l));
      const auto u = static_cast<std::size_t>(l);
      compute_[u + 1] = checked_add(compute_[u], c.compute.picoseconds());
      state_[u + 1] = checked_add(state_[u], c.state.count());
      activations_[u + 1] = checked_add(activations_[u], c.activations.count());
      const Time bytes = bw > 0 ? transfer_time(c.output, p.p2p) : Time::zero();
      hop_[u] = checked_add(bytes.picoseconds(), p.p2p_latency.picoseconds());
    }
    if (!p.compute_by_part.empty()) {
      if (p.compute_by_part.size() != parts) {
        throw std::invalid_argument("partition: compute_by_part has " +
                                    std::to_string(p.compute_by_part.size()) + " entries for " +
                                    std::to_string(parts_) + " parts");
      }
      by_part_.assign(parts, std::vector<std::int64_t>(compute_.size(), 0));
      for (std::size_t k = 0; k < parts; ++k) {
        const auto& times = p.compute_by_part[k];
        if (times.size() != p.layers.size()) {
          throw std::invalid_argument("partition: compute_by_part of part " + std::to_string(k) +
                                      " has " + std::to_string(times.size()) + " layers, not " +
                                      std::to_string(layers_));
        }
        for (std::size_t l = 0; l < times.size(); ++l) {
          if (times[l] < Time::zero()) {
            throw std::invalid_argument("partition: compute_by_part of part " + std::to_string(k) +
                                        " is negative at layer " + std::to_string(l));
          }
          by_part_[k][l + 1] = checked_add(by_part_[k][l], times[l].picoseconds());
        }
      }
    }
    for (std::size_t k = 0; k < parts; ++k) {
      const int f = p.in_flight.empty() ? 1 : p.in_flight[k];
      if (f < 0)
        throw std::invalid_argument("partition: in_flight of part " + std::to_string(k) +
                                    " is negative");
      const Bytes cap = p.capacity.empty() ? Bytes(0) : p.capacity[k];
      if (cap < Bytes(0))
        throw std::invalid_argument("partition: capacity of part " + std::to_string(k) +
                                    " is negative");
    }
  }

  int layers() const { return layers_; }
  int parts() const { return parts_; }
  /// Part k may start at layer first_begin(k) .. last_begin(k) and end (exclusive) at up to
  /// last_end(k), leaving every other part at least one layer.
  int first_begin(int k) const { return k; }
  int last_begin(int k) const { return layers_ - (parts_ - k); }
  int last_end(int k) const { return layers_ - (parts_ - 1 - k); }

  /// Compute + p2p of part k running layers [i, j), in picoseconds.
  std::int64_t time(int k, int i, int j) const {
    const auto& compute = by_part_.empty() ? compute_ : by_part_[static_cast<std::size_t>(k)];
    std::int64_t t = compute[u(j)] - compute[u(i)];
    if (k == 0) t = checked_add(t, p_.first_extra.compute.picoseconds());
    if (k == parts_ - 1) t = checked_add(t, p_.last_extra.compute.picoseconds());
    if (k > 0) t = checked_add(t, hop_[u(i - 1)]);           // backward send of the gradient
    if (k < parts_ - 1) t = checked_add(t, hop_[u(j - 1)]);  // forward send of the output
    return t;
  }

  /// state + in_flight * activations of part k running layers [i, j), in bytes.
  std::int64_t memory(int k, int i, int j) const {
    std::int64_t state = state_[u(j)] - state_[u(i)];
    std::int64_t act = activations_[u(j)] - activations_[u(i)];
    if (k == 0) {
      state = checked_add(state, p_.first_extra.state.count());
      act = checked_add(act, p_.first_extra.activations.count());
    }
    if (k == parts_ - 1) {
      state = checked_add(state, p_.last_extra.state.count());
      act = checked_add(act, p_.last_extra.activations.count());
    }
    return checked_add(state, checked_mul(in_flight(k), act));
  }

  std::int64_t in_flight(int k) const { return p_.in_flight.empty() ? 1 : p_.in_flight[u(k)]; }
  /// 0 = unlimited.
  std::int64_t capacity(int k) const { return p_.capacity.empty() ? 0 : p_.capacity[u(k)].count(); }
  bool fits(int k, int i, int j) const {
    const std::int64_t cap = capacity(k);
    return cap == 0 || memory(k, i, j) <= cap;
  }

 private:
  static std::size_t u(int i) { return static_cast<std::size_t>(i); }

  const PartitionProblem& p_;
  int layers_, parts_;
  std::vector<std::int64_t> compute_, state_, activations_;  // prefix sums, layers + 1 entries
  std::vector<std::vector<std::int64_t>> by_part_;           // per part, when devices differ
  std::vector<std::int64_t> hop_;  // one boundary transfer after layer l (bytes + latency)
};

template <class T>
using Table = std::vector<std::vector<std::optional<T>>>;

template <class T>
Table<T> make_table(const CostModel& m) {
  Table<T> t(static_cast<std::size_t>(m.parts()) + 1,
             std::vector<std::optional<T>>(static_cast<std::size_t>(m.layers()) + 1));
  return t;
}

std::size_t at(int i) {
  return static_cast<std::size_t>(i);
}

std::string join_split(const std::vector<int>& split) {
  std::string s;
  for (std::size_t k = 0; k < split.size(); ++k) {
    if (k > 0) s += "+";
    s += std::to_string(split[k]);
  }
  return s;
}

/// Thrown when no split fits: names a part that cannot fit even with one layer, or else the
/// split minimising the largest overflow (memory - capacity) and its worst part.
[[noreturn]] void throw_infeasible(const PartitionProblem& problem, const CostModel& m) {
  const int L = m.layers(), P = m.parts();
  const std::string head = "no partition of " + std::to_string(L) + " layers into " +
                           std::to_string(P) + " parts fits: ";
  // A part that overflows wherever its single smallest layer lies.
  for (int k = 0; k < P; ++k) {
    if (m.capacity(k) == 0) continue;
    std::int64_t least = std::numeric_limits<std::int64_t>::max();
    for (int i = m.first_begin(k); i <= m.last_begin(k); ++i) {
      least = std::min(least, m.memory(k, i, i + 1));
    }
    if (least > m.capacity(k)) {
      throw std::invalid_argument(head + "part " + std::to_string(k) + " needs at least " +
                                  to_string(Bytes(least)) + " of " +
                                  to_string(Bytes(m.capacity(k))) + ", even with a single layer");
    }
  }
  // Min-max overflow over all splits (unlimited parts never overflow), earliest split on ties.
  constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::min();
  auto overflow = [&](int k, int i, int j) {
    return m.capacity(k) == 0 ? kNever : m.memory(k, i, j) - m.capacity(k);
  };
  Table<std::int64_t> best = make_table<std::int64_t>(m);
  best[at(P)][at(L)] = kNever;
  for (int k = P - 1; k >= 0; --k) {
    for (int i = m.first_begin(k); i <= m.last_begin(k); ++i) {
      std::optional<std::int64_t> b;
      for (int j = i + 1; j <= m.last_end(k); ++j) {
        const auto& rest = best[at(k + 1)][at(j)];
        if (!rest) continue;
        const std::int64_t v = std::max(overflow(k, i, j), *rest);
        if (!b || v < *b) b = v;
      }
      best[at(k)][at(i)] = b;
    }
  }
  std::vector<int> split;
  for (int k = 0, i = 0; k < P; ++k) {
    const std::int64_t target = *best[at(k)][at(i)];
    for (int j = i + 1; j <= m.last_end(k); ++j) {
      const auto& rest = best[at(k + 1)][at(j)];
      if (rest && std::max(overflow(k, i, j), *rest) == target) {
        split.push_back(j - i);
        i = j;
        break;
      }
    }
  }
  const PartitionPlan closest = evaluate_partition(problem, split);
  int worst = 0;
  std::int64_t worst_overflow = kNever;
  for (int k = 0; k < P; ++k) {
    if (m.capacity(k) == 0) continue;
    const std::int64_t o = closest.part_memory[at(k)].count() - m.capacity(k);
    if (o > worst_overflow) {
      worst_overflow = o;
      worst = k;
    }
  }
  throw std::invalid_argument(head + "part " + std::to_string(worst) + " needs " +
                              to_string(closest.part_memory[at(worst)]) + " of " +
                              to_string(Bytes(m.capacity(worst))) + " in the closest split (" +
                              join_split(split) + " layers); every split overflows some part by " +
                              "at least " + to_string(Bytes(worst_overflow)));
}

}  // namespace

std::vector<int> even_partition(int layers, int parts) {
  if (parts < 1 || parts > layers) {
    throw std::invalid_argument("even_partition: cannot split " + std::to_string(layers) +
                                " layers into " + std::to_string(parts) + " non-empty parts");
  }
  std::vector<int> split(static_cast<std::size_t>(parts), layers / parts);
  for (int k = 0; k < layers % parts; ++k) ++split[at(k)];
  return split;
}

PartitionPlan evaluate_partition(const PartitionProblem& problem,
                                 const std::vector<int>& layers_per_part) {
  const CostModel m(problem);
  if (layers_per_part.size() != at(m.parts())) {
    throw std::invalid_argument("evaluate_partition: " + std::to_string(layers_per_part.size()) +
                                " part sizes for " + std::to_string(m.parts()) + " parts");
  }
  PartitionPlan plan;
  plan.layers_per_part = layers_per_part;
  int begin = 0;
  for (int k = 0; k < m.parts(); ++k) {
    const int n = layers_per_part[at(k)];
    if (n < 1 || n > m.layers() - begin) {
      throw std::invalid_argument("evaluate_partition: part sizes " + join_split(layers_per_part) +
                                  " do not split " + std::to_string(m.layers()) +
                                  " layers into non-empty parts");
    }
    const Time t = Time::ps(m.time(k, begin, begin + n));
    plan.part_time.push_back(t);
    plan.part_memory.push_back(Bytes(m.memory(k, begin, begin + n)));
    plan.bottleneck = std::max(plan.bottleneck, t);
    begin += n;
  }
  if (begin != m.layers()) {
    throw std::invalid_argument("evaluate_partition: part sizes " + join_split(layers_per_part) +
                                " sum to " + std::to_string(begin) + ", not " +
                                std::to_string(m.layers()) + " layers");
  }
  return plan;
}

PartitionPlan balanced_partition(const PartitionProblem& problem) {
  const CostModel m(problem);
  const int L = m.layers(), P = m.parts();

  // Pass 1 (suffix DP): bottleneck[k][i] = the smallest max part time of layers [i, L) split
  // into parts k .. P-1, each fitting. Memory grows with j, so the scan stops at the first
  // part that does not fit.
  Table<std::int64_t> bottleneck = make_table<std::int64_t>(m);
  bottleneck[at(P)][at(L)] = 0;
  for (int k = P - 1; k >= 0; --k) {
    for (int i = m.first_begin(k); i <= m.last_begin(k); ++i) {
      std::optional<std::int64_t> b;
      for (int j = i + 1; j <= m.last_end(k); ++j) {
        if (!m.fits(k, i, j)) break;
        const auto& rest = bottleneck[at(k + 1)][at(j)];
        if (!rest) continue;
        const std::int64_t v = std::max(m.time(k, i, j), *rest);
        if (!b || v < *b) b = v;
      }
      bottleneck[at(k)][at(i)] = b;
    }
  }
  if (!bottleneck[0][0]) throw_infeasible(problem, m);
  const std::int64_t limit = *bottleneck[0][0];

  // Pass 2: among the splits whose parts all fit and take at most `limit`, the smallest sum
  // of squared part times (lexicographic (max, sum of squares) does not decompose, so the
  // bottleneck is fixed first).
  Table<Square> squares = make_table<Square>(m);
  squares[at(P)][at(L)] = 0;
  for (int k = P - 1; k >= 0; --k) {
    for (int i = m.first_begin(k); i <= m.last_begin(k); ++i) {
      std::optional<Square> b;
      for (int j = i + 1; j <= m.last_end(k); ++j) {
        if (!m.fits(k, i, j)) break;
        const auto& rest = squares[at(k + 1)][at(j)];
        const std::int64_t t = m.time(k, i, j);
        if (!rest || t > limit) continue;
        const Square v = add(square(t), *rest);
        if (!b || v < *b) b = v;
      }
      squares[at(k)][at(i)] = b;
    }
  }

  // Forward reconstruction taking the smallest optimal end of every part: the earliest split.
  std::vector<int> split;
  for (int k = 0, i = 0; k < P; ++k) {
    const Square target = *squares[at(k)][at(i)];
    for (int j = i + 1; j <= m.last_end(k); ++j) {
      const auto& rest = squares[at(k + 1)][at(j)];
      const std::int64_t t = m.time(k, i, j);
      if (rest && t <= limit && m.fits(k, i, j) && add(square(t), *rest) == target) {
        split.push_back(j - i);
        i = j;
        break;
      }
    }
  }
  return evaluate_partition(problem, split);
}

}  // namespace stratasim::strategies
