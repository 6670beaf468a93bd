#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "strategies/lowering.hpp"
#include "strategies/partition.hpp"

using namespace stratasim;
using namespace stratasim::strategies;

namespace {

LayerCost layer(std::int64_t compute_ps, std::int64_t state = 0, std::int64_t activations = 0,
                std::int64_t output = 0) {
  return {Time::ps(compute_ps), Bytes(state), Bytes(activations), Bytes(output)};
}

std::vector<LayerCost> uniform(int n, std::int64_t compute_ps, std::int64_t state = 0,
                               std::int64_t activations = 0) {
  return std::vector<LayerCost>(static_cast<std::size_t>(n), layer(compute_ps, state, activations));
}

std::vector<Time> times(std::initializer_list<std::int64_t> ps) {
  std::vector<Time> t;
  for (auto v : ps) t.push_back(Time::ps(v));
  return t;
}

std::vector<Bytes> bytes(std::initializer_list<std::int64_t> b) {
  std::vector<Bytes> v;
  for (auto x : b) v.push_back(Bytes(x));
  return v;
}

// 1 byte per picosecond, so that p2p times are easy to work by hand.
constexpr Bandwidth kBytePerPs(1e12);

std::string error_of(const PartitionProblem& p) {
  try {
    balanced_partition(p);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("uniform layers split evenly") {
  // 8 layers of 10 ps into 4 parts: 2 + 2 + 2 + 2, every part 20 ps.
  PartitionProblem p;
  p.layers = uniform(8, 10);
  p.parts = 4;
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{2, 2, 2, 2});
  CHECK(plan.part_time == times({20, 20, 20, 20}));
  CHECK(plan.bottleneck == Time::ps(20));
  CHECK(plan == evaluate_partition(p, even_partition(8, 4)));
}

TEST_CASE("one part takes every layer and both extras") {
  PartitionProblem p;
  p.layers = uniform(3, 10, 5, 2);
  p.first_extra = layer(7, 100, 1);
  p.last_extra = layer(9, 50, 3);
  p.in_flight = {4};
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{3});
  CHECK(plan.part_time == times({30 + 7 + 9}));
  // state 15 + 100 + 50, activations 4 * (6 + 1 + 3)
  CHECK(plan.part_memory == bytes({165 + 40}));
}

TEST_CASE("a heavier first part (embedding) shifts layers to later parts") {
  // 7 layers of 10 ps, embedding 20 ps, 3 parts: 90 ps in all, so 30 ps per part at best:
  // part 0 = embedding + 1 layer, parts 1 and 2 = 3 layers each. The even split 3 + 2 + 2
  // would make part 0 take 50 ps.
  PartitionProblem p;
  p.layers = uniform(7, 10);
  p.parts = 3;
  p.first_extra = layer(20);
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{1, 3, 3});
  CHECK(plan.part_time == times({30, 30, 30}));
  CHECK(evaluate_partition(p, even_partition(7, 3)).part_time == times({50, 20, 20}));
}

TEST_CASE("the LM head takes layers off the last part") {
  // Mirror image: 7 layers of 10 ps, head 20 ps on the last part -> 3 + 3 + 1.
  PartitionProblem p;
  p.layers = uniform(7, 10);
  p.parts = 3;
  p.last_extra = layer(20);
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{3, 3, 1});
  CHECK(plan.part_time == times({30, 30, 30}));
}

TEST_CASE("ties: smaller sum of squares first, then the earliest split") {
  // 8 layers of 10 ps, embedding 15 ps, 4 parts. The bottleneck is 30 ps (part 0 cannot take
  // 2 layers: 35 ps), so part 0 = 1 layer (25 ps) and 7 layers are left for 3 parts of at
  // most 3 layers: {3,2,2} in any order (sum of squares 625 + 900 + 400 + 400) beats
  // {3,3,1} (625 + 900 + 900 + 100); of 2+2+3, 2+3+2 and 3+2+2 the earliest is 2+2+3.
  PartitionProblem p;
  p.layers = uniform(8, 10);
  p.parts = 4;
  p.first_extra = layer(15);
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{1, 2, 2, 3});
  CHECK(plan.part_time == times({25, 20, 20, 30}));
  CHECK(plan.bottleneck == Time::ps(30));
}

TEST_CASE("p2p: the partitioner cuts where the output is small (VGG-like)") {
  // 4 layers of 50 ps whose outputs shrink: 1024, 100, 10, 1 bytes; 1 byte/ps and 5 ps
  // latency; 2 parts. A boundary after layer l costs output[l] + 5 on each side (forward on
  // the sender, gradient back on the receiver):
  //   1 + 3: 50 + 1029 = 1079 | 150 + 1029 = 1179  -> 1179
  //   2 + 2: 100 + 105 = 205  | 100 + 105 = 205    -> 205  (the even split)
  //   3 + 1: 150 + 15 = 165   | 50 + 15 = 65       -> 165
  PartitionProblem p;
  p.layers = {layer(50, 0, 0, 1024), layer(50, 0, 0, 100), layer(50, 0, 0, 10), layer(50, 0, 0, 1)};
  p.parts = 2;
  p.p2p = kBytePerPs;
  p.p2p_latency = Time::ps(5);
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{3, 1});
  CHECK(plan.part_time == times({165, 65}));
  CHECK(evaluate_partition(p, {2, 2}).part_time == times({205, 205}));
  CHECK(evaluate_partition(p, {1, 3}).part_time == times({1079, 1179}));

  SUBCASE("a middle part pays for both of its boundaries") {
    // 1 + 1 + 2 has boundaries after layers 0 and 1: part 1 runs 50 ps, sends the gradient
    // of its input back (1024 + 5) and its output forward (100 + 5).
    p.parts = 3;
    const PartitionPlan even = evaluate_partition(p, {1, 1, 2});
    CHECK(even.part_time == times({50 + 1029, 50 + 1029 + 105, 100 + 105}));
  }
  SUBCASE("zero bandwidth makes the bytes free, the latency still counts") {
    p.p2p = Bandwidth(0);
    const PartitionPlan plan0 = balanced_partition(p);
    CHECK(plan0.layers_per_part == std::vector<int>{2, 2});
    CHECK(plan0.part_time == times({105, 105}));
  }
}

TEST_CASE("capacity forces a slower split") {
  // 4 layers of 10 ps, 100 B of state and 10 B of activations each, 2 parts, 1F1B in-flight
  // {2, 1}. Unconstrained: 2 + 2 (20 ps each), part 0 holding 200 + 2 * 20 = 240 B. With
  // 150 B on part 0 only one layer fits (100 + 2 * 10 = 120 B): 1 + 3, bottleneck 30 ps; part
  // 1 (unlimited) holds 300 + 30 = 330 B.
  PartitionProblem p;
  p.layers = uniform(4, 10, 100, 10);
  p.parts = 2;
  p.in_flight = {2, 1};
  const PartitionPlan free_plan = balanced_partition(p);
  CHECK(free_plan.layers_per_part == std::vector<int>{2, 2});
  CHECK(free_plan.part_memory == bytes({240, 220}));

  p.capacity = bytes({150, 0});
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{1, 3});
  CHECK(plan.part_time == times({10, 30}));
  CHECK(plan.part_memory == bytes({120, 330}));
  CHECK(plan.bottleneck == Time::ps(30));

  SUBCASE("exactly full fits") {
    p.capacity = bytes({240, 220});
    CHECK(balanced_partition(p).layers_per_part == std::vector<int>{2, 2});
  }
}

TEST_CASE("no split fits: the error names the part and the bytes") {
  PartitionProblem p;
  p.layers = uniform(4, 10, 100, 10);
  p.parts = 2;
  p.in_flight = {2, 1};

  SUBCASE("a part that cannot fit even one layer") {
    // Part 0 needs at least 100 + 2 * 10 = 120 B.
    p.capacity = bytes({100, 0});
    const std::string e = error_of(p);
    CHECK(e.find("no partition of 4 layers into 2 parts fits") != std::string::npos);
    CHECK(e.find("part 0 needs at least 120 B of 100 B") != std::string::npos);
  }
  SUBCASE("every part fits alone but not together") {
    // State only (no activations): part 0 takes at most 2 layers (250 B), part 1 at most 1
    // (150 B). Overflows: 1+3 -> 150 B on part 1, 2+2 -> 50 B on part 1, 3+1 -> 50 B on
    // part 0; the closest, earliest, is 2+2.
    p.layers = uniform(4, 10, 100, 0);
    p.capacity = bytes({250, 150});
    const std::string e = error_of(p);
    CHECK(e.find("no partition of 4 layers into 2 parts fits") != std::string::npos);
    CHECK(e.find("part 1 needs 200 B of 150 B") != std::string::npos);
    CHECK(e.find("(2+2 layers)") != std::string::npos);
    CHECK(e.find("at least 50 B") != std::string::npos);
  }
  SUBCASE("GiB-sized memory prints readable units") {
    const std::int64_t gib = std::int64_t{1} << 30;
    p.layers = uniform(48, 10, gib, 0);
    p.parts = 4;
    p.in_flight = {};
    p.first_extra = layer(0, 70 * gib + gib / 5);  // 70.2 GiB of embedding + 1 layer = 71.2
    p.capacity = bytes({70 * gib, 80 * gib, 80 * gib, 80 * gib});
    const std::string e = error_of(p);
    CHECK(e.find("no partition of 48 layers into 4 parts fits: part 0 needs at least 71.2 GiB "
                 "of 70 GiB") != std::string::npos);
  }
}

TEST_CASE("malformed problems are rejected") {
  PartitionProblem p;
  p.layers = uniform(3, 10);
  p.parts = 4;
  CHECK_THROWS_AS(balanced_partition(p), std::invalid_argument);
  p.parts = 0;
  CHECK_THROWS_AS(balanced_partition(p), std::invalid_argument);
  p.parts = 2;
  p.in_flight = {1};
  CHECK_THROWS_AS(balanced_partition(p), std::invalid_argument);
  p.in_flight = {};
  p.capacity = bytes({1, 2, 3});
  CHECK_THROWS_AS(balanced_partition(p), std::invalid_argument);
  p.capacity = {};
  p.layers[1].compute = Time::ps(-1);
  CHECK_THROWS_AS(balanced_partition(p), std::invalid_argument);
  p.layers = {};
  CHECK_THROWS_AS(balanced_partition(p), std::invalid_argument);

  PartitionProblem q;
  q.layers = uniform(5, 10);
  q.parts = 2;
  CHECK_THROWS_AS(evaluate_partition(q, {5}), std::invalid_argument);
  CHECK_THROWS_AS(evaluate_partition(q, {5, 0}), std::invalid_argument);
  CHECK_THROWS_AS(evaluate_partition(q, {2, 2}), std::invalid_argument);
  CHECK_THROWS_AS(evaluate_partition(q, {4, 2}), std::invalid_argument);
  CHECK_NOTHROW(evaluate_partition(q, {4, 1}));
}

TEST_CASE("evaluate_partition reports the plan balanced_partition returns") {
  PartitionProblem p;
  p.layers = {layer(30, 7, 3, 40), layer(10, 1, 1, 5),  layer(25, 4, 2, 12),
              layer(5, 9, 8, 2),   layer(40, 2, 6, 30), layer(15, 3, 3, 7)};
  p.parts = 3;
  p.first_extra = layer(12, 50, 4);
  p.last_extra = layer(20, 60, 5);
  p.in_flight = {3, 2, 1};
  p.p2p = kBytePerPs;
  p.p2p_latency = Time::ps(2);
  const PartitionPlan plan = balanced_partition(p);
  CHECK(plan == evaluate_partition(p, plan.layers_per_part));

  // A hand-worked evaluation of 2 + 2 + 2: boundaries after layer 1 (5 B) and layer 3 (2 B),
  // each 7 ps and 4 ps with latency.
  const PartitionPlan e = evaluate_partition(p, {2, 2, 2});
  CHECK(e.part_time == times({12 + 40 + 7, 30 + 7 + 4, 20 + 55 + 4}));
  // memory: state + in_flight * activations, extras on the ends.
  CHECK(e.part_memory == bytes({50 + 8 + 3 * (4 + 4), 13 + 2 * 10, 60 + 5 + 1 * (5 + 9)}));
  CHECK(e.bottleneck == Time::ps(79));
  CHECK(plan.bottleneck <= e.bottleneck);
}

TEST_CASE("even_partition matches stage_layers") {
  for (int layers = 1; layers <= 30; ++layers) {
    for (int parts = 1; parts <= layers; ++parts) {
      const std::vector<int> split = even_partition(layers, parts);
      REQUIRE(split.size() == static_cast<std::size_t>(parts));
      for (int s = 0; s < parts; ++s) {
        auto [begin, end] = stage_layers(layers, parts, s);
        CHECK(split[static_cast<std::size_t>(s)] == end - begin);
      }
    }
  }
  CHECK(even_partition(10, 4) == std::vector<int>{3, 3, 2, 2});
  CHECK_THROWS_AS(even_partition(3, 4), std::invalid_argument);
  CHECK_THROWS_AS(even_partition(3, 0), std::invalid_argument);
}

TEST_CASE("balanced_partition agrees with brute force on random small problems") {
  // Every composition of L <= 10 layers into parts <= 4 is evaluated; the best is the
  // smallest (bottleneck, sum of squared part times, layers_per_part) among those that fit.
  std::mt19937_64 rng(20240611);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 600; ++trial) {
    PartitionProblem p;
    const int L = static_cast<int>(pick(1, 10));
    p.parts = static_cast<int>(pick(1, std::min<std::int64_t>(4, L)));
    // Narrow ranges on some trials to make ties common.
    const std::int64_t span = trial % 3 == 0 ? 3 : 60;
    for (int l = 0; l < L; ++l) {
      p.layers.push_back(layer(pick(0, span), pick(0, 20), pick(0, 10), pick(0, span)));
    }
    p.first_extra = layer(pick(0, span), pick(0, 30), pick(0, 10));
    p.last_extra = layer(pick(0, span), pick(0, 30), pick(0, 10));
    if (trial % 2 == 0) {
      p.p2p = kBytePerPs;
      p.p2p_latency = Time::ps(pick(0, 5));
    }
    for (int k = 0; k < p.parts; ++k) p.in_flight.push_back(static_cast<int>(p.parts - k));
    if (trial % 4 != 3) {
      for (int k = 0; k < p.parts; ++k) {
        p.capacity.push_back(Bytes(pick(0, 4) == 0 ? 0 : pick(20, 200)));
      }
    }

    std::optional<PartitionPlan> best;
    std::int64_t best_squares = 0;
    // The smallest, over all splits, of the largest overflow (memory - capacity).
    std::optional<std::int64_t> least_overflow;
    std::vector<int> split;
    std::function<void(int)> enumerate = [&](int left) {
      if (static_cast<int>(split.size()) == p.parts - 1) {
        split.push_back(left);
        const PartitionPlan plan = evaluate_partition(p, split);
        bool fits = true;
        std::int64_t squares = 0;
        std::optional<std::int64_t> overflow;
        for (std::size_t k = 0; k < split.size(); ++k) {
          if (!p.capacity.empty() && p.capacity[k] > Bytes(0)) {
            const std::int64_t o = (plan.part_memory[k] - p.capacity[k]).count();
            if (o > 0) fits = false;
            if (!overflow || o > *overflow) overflow = o;
          }
          squares += plan.part_time[k].picoseconds() * plan.part_time[k].picoseconds();
        }
        if (overflow && (!least_overflow || *overflow < *least_overflow)) {
          least_overflow = overflow;
        }
        // Compositions come in lexicographic order, so only strictly better replaces.
        if (fits && (!best || plan.bottleneck < best->bottleneck ||
                     (plan.bottleneck == best->bottleneck && squares < best_squares))) {
          best = plan;
          best_squares = squares;
        }
        split.pop_back();
        return;
      }
      const int others = p.parts - 1 - static_cast<int>(split.size());
      for (int n = 1; n <= left - others; ++n) {
        split.push_back(n);
        enumerate(left - n);
        split.pop_back();
      }
    };
    enumerate(L);

    CAPTURE(trial);
    if (best) {
      ++feasible;
      const PartitionPlan plan = balanced_partition(p);
      CHECK(plan.bottleneck == best->bottleneck);
      CHECK(plan == *best);
    } else {
      ++infeasible;
      // Either a part too big even for one layer, or the least possible largest overflow.
      const std::string e = error_of(p);
      REQUIRE(least_overflow.has_value());
      CHECK((e.find("even with a single layer") != std::string::npos ||
             e.find("at least " + to_string(Bytes(*least_overflow))) != std::string::npos));
    }
  }
  // Both kinds of instance are exercised.
  CHECK(feasible > 100);
  CHECK(infeasible > 20);
}

TEST_CASE("large problems stay exact and fast") {
  // 200 layers of about a second each (1e12 ps): squared part times exceed 64 bits.
  PartitionProblem p;
  for (int l = 0; l < 200; ++l) {
    p.layers.push_back(layer(1'000'000'000'000 + l * 1'000'003, 1 << 20, 1 << 18, 1 << 24));
  }
  p.parts = 16;
  p.first_extra = layer(3'000'000'000'000);
  p.last_extra = layer(5'000'000'000'000);
  p.p2p = Bandwidth(50e9);
  p.p2p_latency = Time::us(5);
  const PartitionPlan plan = balanced_partition(p);
  int sum = 0;
  for (int n : plan.layers_per_part) sum += n;
  CHECK(sum == 200);
  CHECK(plan == evaluate_partition(p, plan.layers_per_part));
  CHECK(plan.bottleneck <= evaluate_partition(p, even_partition(200, 16)).bottleneck);
  CHECK(plan.layers_per_part.front() < plan.layers_per_part[1]);
  CHECK(plan.layers_per_part.back() < plan.layers_per_part[1]);
}

TEST_CASE("partition: parts on slower devices take fewer layers (compute_by_part)") {
  PartitionProblem p;
  p.layers = uniform(4, 1000);  // 1 ns per layer on the base device
  p.parts = 2;
  CHECK(balanced_partition(p).layers_per_part == std::vector<int>{2, 2});
  // Part 1's device is twice as slow: splits 1+3 (max(1, 6) = 6), 2+2 (max(2, 4) = 4) and
  // 3+1 (max(3, 2) = 3) ns: 3+1 wins.
  p.compute_by_part = {std::vector<Time>(4, Time::ps(1000)), std::vector<Time>(4, Time::ps(2000))};
  const auto plan = balanced_partition(p);
  CHECK(plan.layers_per_part == std::vector<int>{3, 1});
  CHECK(plan.part_time == times({3000, 2000}));
  CHECK(evaluate_partition(p, {2, 2}).bottleneck == Time::ps(4000));
  p.compute_by_part.pop_back();
  CHECK_THROWS_AS(balanced_partition(p), std::invalid_argument);  // one entry per part
}
