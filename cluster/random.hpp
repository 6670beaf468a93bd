// A small deterministic random number generator for stochastic policies (cluster/ones.hpp):
// xoshiro256** (Blackman and Vigna, "Scrambled Linear Pseudorandom Number Generators", ACM TOMS
// 2021; the reference C at prng.di.unimi.it) seeded through splitmix64 (the seeding the same
// authors recommend). No std:: distributions: their outputs differ between standard libraries,
// and a seed must give the same schedule everywhere.
#pragma once

#include <cstdint>

namespace stratasim::cluster {

/// splitmix64: the next state's output (advances `state`).
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Xoshiro256 {
 public:
  explicit Xoshiro256(std::uint64_t seed) {
    for (std::uint64_t& word : s_) word = splitmix64(seed);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, n) for 1 <= n < 2^53: floor(unit() x n) (exact in doubles; a bias below
  /// n / 2^53).
  std::uint64_t below(std::uint64_t n) {
    const auto k = static_cast<std::uint64_t>(unit() * static_cast<double>(n));
    return k < n ? k : n - 1;
  }
  /// Uniform in [0, 1): the top 53 bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace stratasim::cluster
