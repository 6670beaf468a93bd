// The project's one pseudorandom generator, for everything that draws from a seed: the
// embedding cache's id streams (strategies/embedding_cache.hpp), and the cluster simulator's
// ONES policy and trace generator (cluster/ones.hpp, cluster/workload.hpp).
//
// xoshiro256** (Blackman and Vigna, "Scrambled Linear Pseudorandom Number Generators", ACM TOMS
// 2021; the reference C at prng.di.unimi.it), its state filled by splitmix64 (Steele et al.,
// "Fast splittable pseudorandom number generators", OOPSLA 2014), as its authors advise. No
// std:: distributions: their outputs differ between standard libraries, and a seed must give
// the same results everywhere.
#pragma once

#include <bit>
#include <cstdint>

namespace stratasim::strategies {

/// splitmix64: the next output from `state` (advances it).
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class Xoshiro256 {
 public:
  /// The state is four splitmix64 outputs from `seed`.
  explicit Xoshiro256(std::uint64_t seed) {
    for (std::uint64_t& word : s_) word = splitmix64(seed);
  }
  std::uint64_t next() {
    const std::uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, 1): the top 53 bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform in [0, n), n >= 1, unbiased: Lemire's multiply-shift, rejecting the biased low
  /// products ("Fast random integer generation in an interval", ACM TOMACS 29(1), 2019).
  std::uint64_t below(std::uint64_t n) {
    __extension__ using Uint128 = unsigned __int128;  // GCC and Clang
    Uint128 m = static_cast<Uint128>(next()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<Uint128>(next()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }
  /// Uniform in [0, n) for 1 <= n < 2^53 from one draw: floor(unit() x n) (a bias below
  /// n / 2^53; what the cluster simulator's policies and generator use).
  std::uint64_t below_by_scaling(std::uint64_t n) {
    const auto k = static_cast<std::uint64_t>(unit() * static_cast<double>(n));
    return k < n ? k : n - 1;
  }

 private:
  std::uint64_t s_[4];
};

}  // namespace stratasim::strategies
