// The max-min fair solver: rates and completion times worked out by hand in the comments.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "sim/max_min.hpp"

using namespace stratasim;

namespace {

constexpr double kGB = 1e9;

struct Done {
  int flow;
  Time at;
  std::uint64_t tag;
};

/// Runs the solver to the end from `now`, returning completions in order.
std::vector<Done> run(sim::MaxMinSolver& s, Time now) {
  std::vector<Done> out;
  for (;;) {
    const Time next = s.next_completion(now);
    if (next == Time::infinity()) break;
    now = next;
    s.take_completions(now, [&](int flow, std::span<const int>, double, Time, std::uint64_t tag) {
      out.push_back(Done{flow, now, tag});
    });
  }
  return out;
}

}  // namespace

TEST_CASE("max-min: one link, two equal flows share it equally") {
  sim::MaxMinSolver s;
  const int link = s.add_link(1 * kGB);
  const std::vector<int> route{link};
  const int a = s.start_flow(route, 1e9, Time::zero(), 10);
  const int b = s.start_flow(route, 1e9, Time::zero(), 11);
  s.settle(Time::zero());
  // Each gets half of 1 GB/s: 1e9 B / 0.5e9 B/s = 2 s, exactly, for both.
  CHECK(s.rate(a) == 0.5e9);
  CHECK(s.rate(b) == 0.5e9);
  CHECK(s.completion(a) == Time::ms(2000));
  CHECK(s.completion(b) == Time::ms(2000));
  const auto done = run(s, Time::zero());
  REQUIRE(done.size() == 2);
  // Same picosecond: in start order.
  CHECK(done[0].tag == 10);
  CHECK(done[1].tag == 11);
  CHECK(done[0].at == Time::ms(2000));
  CHECK(done[1].at == Time::ms(2000));
  CHECK(s.active_flows() == 0);
}

TEST_CASE("max-min: the parking lot") {
  // Three links in a row; flow A crosses all three, B, C and D one link each.
  SUBCASE("equal links: everyone gets half") {
    // Every link has two flows: the fair share is 1/2 on each, and A is limited to 1/2 by all
    // three at once.
    sim::MaxMinSolver s;
    const int l1 = s.add_link(1 * kGB), l2 = s.add_link(1 * kGB), l3 = s.add_link(1 * kGB);
    const int a = s.start_flow(std::vector<int>{l1, l2, l3}, 1e9, Time::zero());
    const int b = s.start_flow(std::vector<int>{l1}, 1e9, Time::zero());
    const int c = s.start_flow(std::vector<int>{l2}, 1e9, Time::zero());
    const int d = s.start_flow(std::vector<int>{l3}, 1e9, Time::zero());
    s.settle(Time::zero());
    for (int f : {a, b, c, d}) CHECK(s.rate(f) == 0.5e9);
  }
  SUBCASE("links of 1, 2 and 3 GB/s") {
    // Shares: l1 1/2, l2 2/2, l3 3/2 GB/s. l1 saturates first: A = B = 0.5 GB/s. Then l2 has
    // 2 - 0.5 = 1.5 left for C alone, l3 has 3 - 0.5 = 2.5 for D alone.
    sim::MaxMinSolver s;
    const int l1 = s.add_link(1 * kGB), l2 = s.add_link(2 * kGB), l3 = s.add_link(3 * kGB);
    const int a = s.start_flow(std::vector<int>{l1, l2, l3}, 1e9, Time::zero());
    const int b = s.start_flow(std::vector<int>{l1}, 1e9, Time::zero());
    const int c = s.start_flow(std::vector<int>{l2}, 3e9, Time::zero());
    const int d = s.start_flow(std::vector<int>{l3}, 5e9, Time::zero());
    s.settle(Time::zero());
    CHECK(s.rate(a) == 0.5e9);
    CHECK(s.rate(b) == 0.5e9);
    CHECK(s.rate(c) == 1.5e9);
    CHECK(s.rate(d) == 2.5e9);
    // A and B: 1e9 / 0.5e9 = 2 s. C: 3e9 / 1.5e9 = 2 s. D: 5e9 / 2.5e9 = 2 s. All end together,
    // in start order.
    const auto done = run(s, Time::zero());
    REQUIRE(done.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(done[i].flow == std::vector<int>{a, b, c, d}[i]);
      CHECK(done[i].at == Time::ms(2000));
    }
  }
}

TEST_CASE("max-min: a flow that ends frees bandwidth for the others") {
  SUBCASE("two flows on one link") {
    // A (1e9 B) and B (3e9 B) share 1 GB/s: 0.5 GB/s each. A ends at 1e9 / 0.5e9 = 2 s; B has
    // carried 1e9 by then, 2e9 left at the full 1 GB/s: 2 s more, it ends at 4 s.
    sim::MaxMinSolver s;
    const int link = s.add_link(1 * kGB);
    s.start_flow(std::vector<int>{link}, 1e9, Time::zero(), 1);
    s.start_flow(std::vector<int>{link}, 3e9, Time::zero(), 2);
    const auto done = run(s, Time::zero());
    REQUIRE(done.size() == 2);
    CHECK(done[0].tag == 1);
    CHECK(done[0].at == Time::ms(2000));
    CHECK(done[1].tag == 2);
    CHECK(done[1].at == Time::ms(4000));
  }
  SUBCASE("the parking lot's long flow ends first") {
    // Links of 1, 2, 3 GB/s. A (l1, l2, l3) 0.5e9 B; B (l1) 2e9 B; C (l2) 4.5e9 B; D (l3)
    // 7.5e9 B. Rates 0.5, 0.5, 1.5, 2.5 GB/s (as above). A ends at 0.5e9 / 0.5e9 = 1 s.
    // Then B has 1.5e9 left at 1 GB/s: ends at 2.5 s. C has 4.5e9 - 1.5e9 = 3e9 left at
    // 2 GB/s: ends at 2.5 s. D has 7.5e9 - 2.5e9 = 5e9 at 3 GB/s: 5/3 s more, ends at
    // 1 s + 1.666666666667 s, rounded up to the picosecond: 2 666 666 666 667 ps.
    sim::MaxMinSolver s;
    const int l1 = s.add_link(1 * kGB), l2 = s.add_link(2 * kGB), l3 = s.add_link(3 * kGB);
    s.start_flow(std::vector<int>{l1, l2, l3}, 0.5e9, Time::zero(), 'A');
    s.start_flow(std::vector<int>{l1}, 2e9, Time::zero(), 'B');
    s.start_flow(std::vector<int>{l2}, 4.5e9, Time::zero(), 'C');
    s.start_flow(std::vector<int>{l3}, 7.5e9, Time::zero(), 'D');
    const auto done = run(s, Time::zero());
    REQUIRE(done.size() == 4);
    CHECK(done[0].tag == 'A');
    CHECK(done[0].at == Time::ms(1000));
    CHECK(done[1].tag == 'B');
    CHECK(done[1].at == Time::ms(2500));
    CHECK(done[2].tag == 'C');
    CHECK(done[2].at == Time::ms(2500));
    CHECK(done[3].tag == 'D');
    CHECK(done[3].at == Time::ps(2'666'666'666'667));
  }
  SUBCASE("a flow that starts later") {
    // A (2e9 B) alone at 1 GB/s for 1 s carries 1e9; B (1e9 B) starts at 1 s and both get
    // 0.5 GB/s: B needs 2 s and ends at 3 s, when A's last 1e9 is done too.
    sim::MaxMinSolver s;
    const int link = s.add_link(1 * kGB);
    s.start_flow(std::vector<int>{link}, 2e9, Time::zero(), 'A');
    CHECK(s.next_completion(Time::zero()) == Time::ms(2000));
    s.start_flow(std::vector<int>{link}, 1e9, Time::ms(1000), 'B');
    const auto done = run(s, Time::ms(1000));
    REQUIRE(done.size() == 2);
    CHECK(done[0].tag == 'A');
    CHECK(done[1].tag == 'B');
    CHECK(done[0].at == Time::ms(3000));
    CHECK(done[1].at == Time::ms(3000));
  }
}

TEST_CASE("max-min: completion times round up to the picosecond") {
  // 10 B at 3e12 B/s take 3.33 ps: the flow ends at 4 ps, never at 3.
  sim::MaxMinSolver s;
  const int link = s.add_link(3e12);
  const int f = s.start_flow(std::vector<int>{link}, 10, Time::ps(100));
  CHECK(s.next_completion(Time::ps(100)) == Time::ps(104));
  CHECK(s.completion(f) == Time::ps(104));
  // Nothing to carry, or no link to cross: done at once.
  sim::MaxMinSolver t;
  const int l = t.add_link(1e9);
  t.start_flow(std::vector<int>{l}, 0, Time::ps(7));
  t.start_flow(std::vector<int>{}, 100, Time::ps(7));
  CHECK(t.next_completion(Time::ps(7)) == Time::ps(7));
  CHECK(run(t, Time::ps(7)).size() == 2);
}

TEST_CASE("max-min: only the touched component is refilled") {
  // Links 0 and 1 carry unrelated flows. A new flow on link 0 refills link 0's two flows and
  // leaves link 1's flow (and its completion time) alone.
  sim::MaxMinSolver s;
  const int l0 = s.add_link(1 * kGB), l1 = s.add_link(1 * kGB);
  const int x = s.start_flow(std::vector<int>{l0}, 1e9, Time::zero());
  const int y = s.start_flow(std::vector<int>{l1}, 1e9, Time::zero());
  s.settle(Time::zero());
  CHECK(s.refilled_flows() == 2);
  CHECK(s.completion(y) == Time::ms(1000));
  const int z = s.start_flow(std::vector<int>{l0}, 1e9, Time::ms(500));
  s.settle(Time::ms(500));
  CHECK(s.refilled_flows() == 4);  // x and z, not y
  CHECK(s.rate(x) == 0.5e9);
  CHECK(s.rate(z) == 0.5e9);
  CHECK(s.rate(y) == 1e9);
  // x carried 0.5e9 alone, then 0.5e9 at 0.5 GB/s: ends at 1.5 s.
  CHECK(s.completion(x) == Time::ms(1500));
  CHECK(s.remaining(z, Time::ms(1000)) == doctest::Approx(0.75e9));
  // A flow joining through a shared link connects the two components.
  const int w = s.start_flow(std::vector<int>{l0, l1}, 1e9, Time::ms(500));
  s.settle(Time::ms(500));
  CHECK(s.refilled_flows() == 8);  // x, y, z, w
  // l0 has three flows: 1/3 GB/s each; y then gets 1 - 1/3 = 2/3 of l1.
  CHECK(s.rate(w) == doctest::Approx(1e9 / 3));
  CHECK(s.rate(y) == doctest::Approx(2e9 / 3));
}

TEST_CASE("max-min: deterministic") {
  auto once = [] {
    sim::MaxMinSolver s;
    std::vector<int> links;
    for (int i = 0; i < 6; ++i) links.push_back(s.add_link((i + 1) * kGB));
    for (int i = 0; i < 40; ++i) {
      const std::vector<int> route{links[static_cast<std::size_t>(i % 6)],
                                   links[static_cast<std::size_t>((i * 7 + 1) % 6)]};
      s.start_flow(route, 1e8 * (1 + i % 5), Time::zero(), static_cast<std::uint64_t>(i));
    }
    std::vector<std::pair<std::uint64_t, std::int64_t>> out;
    for (const auto& d : run(s, Time::zero())) out.emplace_back(d.tag, d.at.picoseconds());
    return out;
  };
  const auto a = once();
  CHECK(a.size() == 40);
  CHECK(a == once());
}

TEST_CASE("max-min: a capped flow leaves the rest of its link to the others") {
  sim::MaxMinSolver s;
  const int link = s.add_link(1 * kGB);
  const int narrow = s.add_link(0.5 * kGB);
  const std::vector<int> wide_route{link};
  const std::vector<int> both{link, narrow};
  const int a = s.start_flow(wide_route, 1e9, Time::zero(), 1);
  const int b = s.start_flow(both, 1e9, Time::zero(), 2);
  // b alone would get its bottleneck, 0.5 GB/s; capped at 0.25 of it: 0.125 GB/s. a takes the
  // rest of the 1 GB/s link: 0.875 GB/s (uncapped, the two would share it 0.5 / 0.5).
  s.set_rate_factor(b, 0.25);
  s.settle(Time::zero());
  CHECK(s.rate(b) == doctest::Approx(0.125e9));
  CHECK(s.rate(a) == doctest::Approx(0.875e9));
  // Factor 0.9: a cap of 0.45 GB/s, under b's fair share of 0.5 GB/s (a and b split the 1 GB/s
  // link): b is held at 0.45 and a gets 0.55. At 1 s, a has carried 0.875e9 B, b 0.125e9 B.
  s.set_rate_factor(b, 0.9);
  s.settle(Time::ms(1000));
  CHECK(s.rate(b) == doctest::Approx(0.45e9));
  CHECK(s.rate(a) == doctest::Approx(0.55e9));
  CHECK(s.remaining(a, Time::ms(1000)) == doctest::Approx(0.125e9));
  // Removing the cap (factor 1) gives back the fair shares exactly.
  s.set_rate_factor(b, 1.0);
  s.settle(Time::ms(1000));
  CHECK(s.rate(a) == 0.5e9);
  CHECK(s.rate(b) == 0.5e9);
  // a: 0.125e9 B at 0.5 GB/s = 0.25 s more; b then alone on its 0.5 GB/s bottleneck: at 1.25 s
  // it has 0.875e9 - 0.125e9 = 0.75e9 B left, 1.5 s more: 2.75 s.
  const auto done = run(s, Time::ms(1000));
  REQUIRE(done.size() == 2);
  CHECK(done[0].tag == 1);
  CHECK(done[0].at == Time::ms(1250));
  CHECK(done[1].tag == 2);
  CHECK(done[1].at == Time::ms(2750));
}

TEST_CASE("max-min: a weighted flow loads its links as that many copies") {
  // Link X (12 GB/s) carries flow A with weight 3 (three copies) and flow B; link Y (2 GB/s)
  // carries A once. Level by level: Y saturates first at 2 GB/s (2 / 1 < 12 / 4 = 3), freezing
  // A at 2 GB/s; X then has 12 - 3 x 2 = 6 GB/s left for B alone.
  sim::MaxMinSolver s;
  const int x = s.add_link(12 * kGB);
  const int y = s.add_link(2 * kGB);
  const std::vector<int> route_a{x, y}, weights_a{3, 1}, route_b{x};
  const int a = s.start_flow(route_a, 2e9, Time::zero(), 1, weights_a);
  const int b = s.start_flow(route_b, 6e9, Time::zero(), 2);
  s.settle(Time::zero());
  CHECK(s.rate(a) == 2 * kGB);
  CHECK(s.rate(b) == 6 * kGB);
  CHECK(s.weights(a).size() == 2);
  // The same system with A's three copies spelled out (two of them on private links as wide
  // as Y, so that each copy is held to 2 GB/s too) gives the same rates.
  sim::MaxMinSolver full;
  const int fx = full.add_link(12 * kGB);
  std::vector<int> copies;
  for (int c = 0; c < 3; ++c) {
    const int own = full.add_link(2 * kGB);
    const std::vector<int> route{fx, own};
    copies.push_back(full.start_flow(route, 2e9, Time::zero(), 1));
  }
  const std::vector<int> fb{fx};
  const int full_b = full.start_flow(fb, 6e9, Time::zero(), 2);
  full.settle(Time::zero());
  for (int c : copies) CHECK(full.rate(c) == s.rate(a));
  CHECK(full.rate(full_b) == s.rate(b));
  // Both complete after 1 s.
  CHECK(s.completion(a) == Time::ms(1000));
  CHECK(s.completion(b) == Time::ms(1000));
  CHECK_THROWS_AS(s.start_flow(route_a, 1, Time::zero(), 0, std::vector<int>{1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(s.start_flow(route_a, 1, Time::zero(), 0, std::vector<int>{1, 0}),
                  std::invalid_argument);
}

TEST_CASE("max-min: weights of 1 change nothing, bit for bit") {
  // Random-looking flows over a few links, once without weights and once with every weight 1:
  // equal rates and completion times at every step.
  auto build = [](bool weights) {
    sim::MaxMinSolver s;
    for (int l = 0; l < 5; ++l) s.add_link((1.0 + 0.37 * l) * kGB);
    std::uint64_t x = 12345;
    for (int f = 0; f < 40; ++f) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      std::vector<int> route;
      for (int l = 0; l < 5; ++l) {
        if ((x >> (20 + l)) & 1U) route.push_back(l);
      }
      const std::vector<int> ones(route.size(), 1);
      const double bytes = 1e6 * static_cast<double>(1 + (x >> 40) % 1000);
      const Time at = Time::us(static_cast<std::int64_t>(f) * 7);
      if (weights) {
        s.start_flow(route, bytes, at, static_cast<std::uint64_t>(f), ones);
      } else {
        s.start_flow(route, bytes, at, static_cast<std::uint64_t>(f));
      }
    }
    return s;
  };
  auto plain = build(false);
  auto weighted = build(true);
  const auto a = run(plain, Time::us(300));
  const auto b = run(weighted, Time::us(300));
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == 40);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].tag == b[i].tag);
    CHECK(a[i].at == b[i].at);
  }
}
