// The worker's own small pseudo-random numbers: seed mixing (splitmix64)
// and a generator (xoshiro256**) with uniform and normal draws built from
// integer arithmetic. std::*_distribution are implementation-defined, so
// they could give a resumed run on another standard library different
// data; these give the same numbers for the same seed everywhere (normal
// draws also go through std::log and std::sqrt). Torch-free, header-only.
#ifndef TRAINSUP_WORKER_DATASET_RANDOM_H_
#define TRAINSUP_WORKER_DATASET_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace trainsup::worker {

// The splitmix64 output function of `x + golden ratio`: a bijection of
// 64-bit values whose outputs look independent for neighbouring inputs.
inline uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A seed derived from `a` and `b` (order matters): distinct for all
// practical purposes when either changes. Used as Mix(run seed, epoch,
// sample index) for augmentation and Mix(seed, tag) for independent streams.
inline uint64_t MixSeed(uint64_t a, uint64_t b) { return SplitMix64(a ^ SplitMix64(b)); }
inline uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) { return MixSeed(MixSeed(a, b), c); }

// xoshiro256** seeded through splitmix64. Same seed, same sequence.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) {
      seed += 0x9E3779B97F4A7C15ull;
      s = SplitMix64(seed);
    }
  }

  // The next 64 random bits.
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1), a multiple of 2^-53.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }

  // Uniform integer in [0, n), n > 0, without modulo bias (rejection).
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    while (true) {
      const uint64_t r = Next();
      if (r >= threshold) return r % n;
    }
  }

  // A fair coin.
  bool Bit() { return (Next() >> 63) != 0; }

  // Standard normal (Marsaglia's polar method; the second value of each
  // pair is kept for the next call).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2 * Uniform() - 1;
      v = 2 * Uniform() - 1;
      s = u * u + v * v;
    } while (s >= 1 || s == 0);
    const double f = std::sqrt(-2 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

// A permutation of [0, n) that depends only on (n, seed): Fisher-Yates over
// Rng(seed). Empty when n <= 0.
inline std::vector<int64_t> SeededPermutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(n > 0 ? n : 0);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATASET_RANDOM_H_
