// Timing helpers shared by the benchmark programs.
#ifndef TRAINSUP_SPARSE_BENCH_BENCH_UTIL_H_
#define TRAINSUP_SPARSE_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace trainsup::bench {

// Seconds on a monotonic clock.
inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The median (the upper one of an even count); `v` must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace trainsup::bench

#endif  // TRAINSUP_SPARSE_BENCH_BENCH_UTIL_H_
