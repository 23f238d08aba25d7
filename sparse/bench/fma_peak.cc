// The machine's float32 fused-multiply-add ceiling: every thread runs 12
// independent chains of vector FMAs in registers (no memory, no
// dependencies between the chains, so the FMA units are the only limit),
// for the AVX2 set (8 floats per vector) and, where the CPU has it,
// AVX-512F (16); and the same for AVX512_BF16's dot products (VDPBF16PS, 32
// bf16 multiply-adds into 16 float32 lanes), the ceiling of the bf16 tiles.
// A convolution cannot run faster than this, so it bounds what any kernel
// set can reach (docs/benchmarks.md, issue 11's targets). The AVX-512
// probes are the engine's (kernels_fused.h), which also time them to
// choose the bf16 tiles (docs/engine.md, "Mixed precision").
//
//   fma_peak [--threads N] [--repeats N] [--json]
//
// Prints the median and the range over the repeats, in GFLOP/s (an FMA is
// two floating-point operations), for each set the CPU supports; --json
// prints one JSON object instead ({"threads": N, "avx2_gflops": ...}).
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sparse/bench/bench_util.h"
#include "sparse/cpu/kernels_fused.h"

namespace {

constexpr int kChains = trainsup::sparse::cpu::fused::kProbeChains;
constexpr long kIterations = 100'000'000;

__attribute__((target("avx2,fma"))) float ChainsAvx2(long iterations) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + i * 1e-7f);
  const __m256 m = _mm256_set1_ps(0.9999999f), a = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  return lanes[0];
}

// GFLOP/s of `threads` threads each running fn(kIterations).
double Rate(float (*fn)(long), int lanes, int threads) {
  std::vector<float> sink(threads);
  const double t0 = trainsup::bench::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back([&, t] { sink[t] = fn(kIterations); });
  for (std::thread& w : workers) w.join();
  const double seconds = trainsup::bench::Now() - t0;
  volatile float keep = sink[0];
  (void)keep;
  return 2.0 * lanes * kChains * kIterations * threads / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 5;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--threads" || a == "--repeats") {
      char* end = nullptr;
      const long v = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
      if (i + 1 >= argc || *end != '\0' || v < 1 || v > 1024) {
        std::fprintf(stderr, "fma_peak: %s needs a whole number from 1 to 1024\n", a.c_str());
        return 2;
      }
      ++i;
      (a == "--threads" ? threads : repeats) = static_cast<int>(v);
    } else {
      std::fprintf(stderr,
                   "fma_peak: unknown argument %s\n"
                   "usage: fma_peak [--threads N] [--repeats N] [--json]\n",
                   a.c_str());
      return 2;
    }
  }
  struct Set {
    const char* name;
    bool supported;
    float (*fn)(long);
    int lanes;
  };
  const Set sets[] = {
      {"avx2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), &ChainsAvx2, 8},
      {"avx512", static_cast<bool>(__builtin_cpu_supports("avx512f")),
       &trainsup::sparse::cpu::fused::Avx512FmaChains, 16},
      // A bf16 dot product does 2 multiply-adds per float32 lane.
      {"avx512_bf16", trainsup::sparse::cpu::fused::Avx512Bf16Supported(),
       &trainsup::sparse::cpu::fused::Avx512Bf16DotChains, 32},
  };
  if (!json) {
    std::printf(
        "fma_peak: %d threads (std::thread), %d chains of float32 vector FMAs per thread, "
        "median of %d\n",
        threads, kChains, repeats);
  }
  std::string js = "{\"threads\": " + std::to_string(threads);
  for (const Set& s : sets) {
    if (!s.supported) {
      if (!json) std::printf("%-11s not supported by this CPU\n", s.name);
      continue;
    }
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) rates.push_back(Rate(s.fn, s.lanes, threads));
    const double median = trainsup::bench::Median(rates);
    const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
    js += ", \"" + std::string(s.name) + "_gflops\": " + std::to_string(median);
    if (!json) {
      std::printf("%-11s %7.1f GFLOP/s (%.1f-%.1f), %.1f per thread\n", s.name, median, *lo, *hi,
                  median / threads);
    }
  }
  if (json) std::printf("%s}\n", js.c_str());
  return 0;
}
