// Fused gather-GEMM-scatter for float on AVX-512 CPUs.
//
// out[oidx[p]] += in[aidx[p]] @ W for a run of pairs, with the product of
// MR pairs and NV 16-float column vectors held in registers across the
// whole reduction: the input rows are read where they lie (no gathered
// copy), the result is added where it belongs (no scatter buffer), and W
// is read in place (no packing). Per reduction step it loads NV vectors of
// W and broadcasts MR inputs for MR x NV fused multiply-adds, so it is
// bound by the FMA units, not by loads.
//
// The AVX2 tiles (kernels_avx2.cc) are the same loops with 8-float vectors;
// the driver that calls either is in kernels.cc.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "sparse/cpu/kernels_fused.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace trainsup::sparse::cpu::fused {

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

#define TRAINSUP_AVX512 __attribute__((target("avx512f")))

// o[0, 16 NV) += acc, the last vector masked by tail.
template <int NV>
TRAINSUP_AVX512 inline void AddVectors(float* o, const __m512* acc, __mmask16 tail) {
#pragma GCC unroll 16
  for (int j = 0; j < NV; ++j) {
    const __mmask16 m = j == NV - 1 ? tail : static_cast<__mmask16>(0xFFFF);
    _mm512_mask_storeu_ps(o + 16 * j, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, o + 16 * j), acc[j]));
  }
}

// The micro-kernel: `rows` (<= MR) pairs, NV column vectors starting at
// w / out (already offset to the column block). The last vector is
// masked by `tail` (all ones when the block is whole).
template <int MR, int NV>
TRAINSUP_AVX512 void FusedTile(const float* a, int64_t acols, const int32_t* aidx, int64_t kdim,
                               const float* w, int64_t wcols, __mmask16 tail, float* out,
                               int64_t ocols, const int32_t* oidx, int rows) {
  __m512 acc[MR][NV];
  const float* arow[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    // Rows past the end repeat the last pair's input; their sums are not stored.
    arow[r] = a + static_cast<int64_t>(aidx[r < rows ? r : rows - 1]) * acols;
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < kdim; ++c) {
    __m512 wv[NV];
    const float* wr = w + c * wcols;
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) {
      wv[j] = j == NV - 1 ? _mm512_maskz_loadu_ps(tail, wr + 16 * j) : _mm512_loadu_ps(wr + 16 * j);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(arow[r][c]);
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(av, wv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    AddVectors<NV>(out + static_cast<int64_t>(oidx[r]) * ocols, acc[r], tail);
  }
}

// Rows per tile for NV column vectors: MR x NV accumulators, NV weight
// vectors and a broadcast fit the 32 vector registers.
template <int NV>
constexpr int TileRows() {
  static_assert(NV >= 1 && NV <= 6, "column blocks are at most 6 vectors (ColumnBlock)");
  return NV <= 2 ? 12 : NV == 3 ? 8 : NV == 4 ? 6 : 4;
}

// Column vectors per block: at most 6 (4 rows x 6 vectors is the widest
// tile that still does 24 multiply-adds per 10 loads), in equal blocks.
inline int64_t ColumnBlock(int64_t vectors) {
  const int64_t blocks = (vectors + 5) / 6;
  return (vectors + blocks - 1) / blocks;
}

// Calls fn(std::integral_constant<int, NV>(), v0, tail) for each block of
// NV column vectors starting at vector v0 that covers `cols` columns; tail
// masks the block's last vector.
template <typename Fn>
void ForEachColumnBlock(int64_t cols, const Fn& fn) {
  const int64_t vectors = (cols + 15) / 16;
  const int64_t block = ColumnBlock(vectors);
  for (int64_t v0 = 0; v0 < vectors; v0 += block) {
    const int64_t nv = std::min<int64_t>(block, vectors - v0);
    const int64_t last_cols = cols - 16 * (v0 + nv - 1);
    const __mmask16 tail = last_cols >= 16 ? static_cast<__mmask16>(0xFFFF)
                                           : static_cast<__mmask16>((1u << last_cols) - 1);
    switch (nv) {
#define TRAINSUP_CASE(NV)                            \
  case NV:                                           \
    fn(std::integral_constant<int, NV>(), v0, tail); \
    break;
      TRAINSUP_CASE(1)
      TRAINSUP_CASE(2)
      TRAINSUP_CASE(3)
      TRAINSUP_CASE(4)
      TRAINSUP_CASE(5)
      TRAINSUP_CASE(6)
#undef TRAINSUP_CASE
    }
  }
}

// All pairs [0, n) against one column block of NV vectors.
template <int NV>
TRAINSUP_AVX512 void FusedBlock(const float* a, int64_t acols, const int32_t* aidx, int64_t kdim,
                                const float* w, int64_t wcols, __mmask16 tail, float* out,
                                int64_t ocols, const int32_t* oidx, int64_t n) {
  constexpr int MR = TileRows<NV>();
  for (int64_t p = 0; p < n; p += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, n - p));
    FusedTile<MR, NV>(a, acols, aidx + p, kdim, w, wcols, tail, out, ocols, oidx + p, rows);
  }
}

// out[oidx[p], :] += a[aidx[p], :] @ w for p in [0, n); a is acols wide,
// w is acols x ocols, out is ocols wide.
// Pairs are taken in blocks so their input rows stay in L1 across the
// column blocks of a wide output.
TRAINSUP_AVX512 void FusedGatherGemmScatter(const float* a, int64_t acols, const int32_t* aidx,
                                            const float* w, float* out, int64_t ocols,
                                            const int32_t* oidx, int64_t n) {
  constexpr int64_t kPairBlock = 96;
  for (int64_t p0 = 0; p0 < n; p0 += kPairBlock) {
    const int64_t m = std::min(kPairBlock, n - p0);
    ForEachColumnBlock(ocols, [&](auto nv, int64_t v0, __mmask16 tail) {
      FusedBlock<nv()>(a, acols, aidx + p0, acols, w + 16 * v0, ocols, tail, out + 16 * v0, ocols,
                       oidx + p0, m);
    });
  }
}

// The weight gradient of a block of pairs: dw[i, o] += sum_p a[aidx[p], i] *
// g[gidx[p], o] for p in [0, n), i in [i0, i0 + rows), o in NV column
// vectors (dw and g already offset to the column block). The reduction
// over pairs runs in registers, in pair order.
template <int MR, int NV>
TRAINSUP_AVX512 void FusedOuterTile(const float* a, int64_t acols, const int32_t* aidx, int64_t i0,
                                    int rows, const float* g, int64_t gcols, const int32_t* gidx,
                                    int64_t n, __mmask16 tail, float* dw, int64_t dwcols) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  // Columns past the block repeat its last one; their sums are not stored.
  int64_t col[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) col[r] = i0 + (r < rows ? r : rows - 1);
  for (int64_t p = 0; p < n; ++p) {
    const float* ar = a + static_cast<int64_t>(aidx[p]) * acols;
    const float* gr = g + static_cast<int64_t>(gidx[p]) * gcols;
    __m512 gv[NV];
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) {
      gv[j] = j == NV - 1 ? _mm512_maskz_loadu_ps(tail, gr + 16 * j) : _mm512_loadu_ps(gr + 16 * j);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(ar[col[r]]);
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(av, gv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    AddVectors<NV>(dw + (i0 + r) * dwcols, acc[r], tail);
  }
}

template <int NV>
TRAINSUP_AVX512 void FusedOuterBlock(const float* a, int64_t acols, const int32_t* aidx,
                                     const float* g, int64_t gcols, const int32_t* gidx, int64_t n,
                                     __mmask16 tail, float* dw, int64_t dwcols) {
  constexpr int MR = TileRows<NV>();
  for (int64_t i0 = 0; i0 < acols; i0 += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, acols - i0));
    FusedOuterTile<MR, NV>(a, acols, aidx, i0, rows, g, gcols, gidx, n, tail, dw, dwcols);
  }
}

// dw[acols x gcols] += a[aidx]^T @ g[gidx] over pairs [0, n), in blocks
// of pairs whose rows stay in L1 while every tile of dw passes over them.
TRAINSUP_AVX512 void FusedGatherOuter(const float* a, int64_t acols, const int32_t* aidx,
                                      const float* g, int64_t gcols, const int32_t* gidx, int64_t n,
                                      float* dw) {
  constexpr int64_t kPairBlock = 64;
  // The block's input rows are copied together first: the tiles then read
  // each row a few columns at a time from L1, where reading them in place
  // would miss the cache at every new line of every row.
  static thread_local std::vector<float> rows_storage;
  rows_storage.resize(static_cast<size_t>(kPairBlock * acols));
  float* rows = rows_storage.data();
  int32_t local[kPairBlock];
  for (int64_t p = 0; p < kPairBlock; ++p) local[p] = static_cast<int32_t>(p);
  for (int64_t p0 = 0; p0 < n; p0 += kPairBlock) {
    const int64_t m = std::min(kPairBlock, n - p0);
    GatherRows(a, acols, aidx + p0, m, rows);
    ForEachColumnBlock(gcols, [&](auto nv, int64_t v0, __mmask16 tail) {
      FusedOuterBlock<nv()>(rows, acols, local, g + 16 * v0, gcols, gidx + p0, m, tail,
                            dw + 16 * v0, gcols);
    });
  }
}

// ---- bfloat16 (AVX512_BF16) ----
//
// The same tiles with bf16 operands: VDPBF16PS multiplies 16 pairs of bf16
// values and adds both products of each pair to a float32 lane, so one
// instruction does two reduction steps of a 16-column vector. The weight
// comes pair-packed (kernels_fused.h), so each 32-value load holds two
// rows of 16 columns; an input row's two values of the same step are one
// 32-bit broadcast. Column blocks are whole vectors of the packed weight
// (zero-padded), and only the stores are masked.

#define TRAINSUP_AVX512_BF16 __attribute__((target("avx512f,avx512bf16")))

// One reduction step of the tile: acc[r] += the step's two values of row
// r (`pair(r)`, one 32-bit broadcast) . the step's NV packed vectors.
template <int MR, int NV, typename Pair>
TRAINSUP_AVX512_BF16 __attribute__((always_inline)) inline void Bf16Step(__m512 (&acc)[MR][NV],
                                                                         const uint16_t* wr,
                                                                         const Pair& pair) {
  __m512bh wv[NV];
#pragma GCC unroll 16
  for (int j = 0; j < NV; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(wr + 32 * j);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    const __m512bh av = (__m512bh)_mm512_set1_epi32(pair(r));
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, wv[j]);
  }
}

template <int MR, int NV>
TRAINSUP_AVX512_BF16 void Bf16Tile(const uint16_t* a, int64_t acols, const int32_t* aidx,
                                   const uint16_t* wp, int64_t wstride, __mmask16 tail, float* out,
                                   int64_t ocols, const int32_t* oidx, int rows) {
  __m512 acc[MR][NV];
  const uint16_t* arow[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    // Rows past the end repeat the last pair's input; their sums are not stored.
    arow[r] = a + static_cast<int64_t>(aidx[r < rows ? r : rows - 1]) * acols;
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  // Whole steps read a row's two values as one 32-bit word; an odd width's
  // last step has one value, the upper half zero.
  const int64_t whole = acols / 2;
  for (int64_t c2 = 0; c2 < whole; ++c2) {
    Bf16Step<MR, NV>(acc, wp + c2 * wstride, [&](int r) {
      int v;
      std::memcpy(&v, arow[r] + 2 * c2, sizeof v);
      return v;
    });
  }
  if (acols % 2 != 0) {
    Bf16Step<MR, NV>(acc, wp + whole * wstride,
                     [&](int r) { return static_cast<int>(arow[r][acols - 1]); });
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    AddVectors<NV>(out + static_cast<int64_t>(oidx[r]) * ocols, acc[r], tail);
  }
}

TRAINSUP_AVX512_BF16 void Bf16GatherGemmScatter(const uint16_t* a, int64_t acols,
                                                const int32_t* aidx, const uint16_t* wp, float* out,
                                                int64_t ocols, const int32_t* oidx, int64_t n) {
  constexpr int64_t kPairBlock = 96;
  const int64_t wstride = 2 * Cols16(ocols);
  for (int64_t p0 = 0; p0 < n; p0 += kPairBlock) {
    const int64_t m = std::min(kPairBlock, n - p0);
    ForEachColumnBlock(ocols, [&](auto nv, int64_t v0, __mmask16 tail) {
      constexpr int MR = TileRows<nv()>();
      for (int64_t p = 0; p < m; p += MR) {
        const int rows = static_cast<int>(std::min<int64_t>(MR, m - p));
        Bf16Tile<MR, nv()>(a, acols, aidx + p0 + p, wp + 32 * v0, wstride, tail, out + 16 * v0,
                           ocols, oidx + p0 + p, rows);
      }
    });
  }
}

// dw[i0 + r, 16 NV columns] += sum over pair steps s of at[(i0 + r) * steps
// + s] (two pairs' values of input column i0 + r) . gp[s] (the same two
// pairs' output-gradient rows, pair-packed).
template <int MR, int NV>
TRAINSUP_AVX512_BF16 void Bf16OuterTile(const uint32_t* at, int64_t steps, int64_t i0, int rows,
                                        const uint16_t* gp, int64_t gstride, __mmask16 tail,
                                        float* dw, int64_t dwcols) {
  __m512 acc[MR][NV];
  const uint32_t* arow[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    arow[r] = at + (i0 + (r < rows ? r : rows - 1)) * steps;
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (int64_t s = 0; s < steps; ++s) {
    Bf16Step<MR, NV>(acc, gp + s * gstride, [&](int r) { return static_cast<int>(arow[r][s]); });
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    AddVectors<NV>(dw + (i0 + r) * dwcols, acc[r], tail);
  }
}

// dw += a[aidx]^T @ g[gidx] in blocks of 64 pairs: each block's input
// values are packed by column (two pairs per 32-bit word) and its output
// gradients pair-packed, then every tile of dw passes over them in L1.
TRAINSUP_AVX512_BF16 void Bf16GatherOuter(const uint16_t* a, int64_t acols, const int32_t* aidx,
                                          const uint16_t* g, int64_t gcols, const int32_t* gidx,
                                          int64_t n, float* dw) {
  constexpr int64_t kPairBlock = 64;
  const int64_t gstride = 2 * Cols16(gcols);
  static thread_local std::vector<uint32_t> at_storage;
  static thread_local std::vector<uint16_t> gp_storage;
  at_storage.resize(static_cast<size_t>(kPairBlock / 2 * acols));
  gp_storage.resize(static_cast<size_t>(kPairBlock / 2 * gstride));
  uint32_t* at = at_storage.data();
  uint16_t* gp = gp_storage.data();
  for (int64_t p0 = 0; p0 < n; p0 += kPairBlock) {
    const int64_t m = std::min(kPairBlock, n - p0), steps = (m + 1) / 2;
    std::fill(gp, gp + steps * gstride, uint16_t{0});
    for (int64_t s = 0; s < steps; ++s) {
      const uint16_t* a0 = a + static_cast<int64_t>(aidx[p0 + 2 * s]) * acols;
      const uint16_t* g0 = g + static_cast<int64_t>(gidx[p0 + 2 * s]) * gcols;
      const bool both = 2 * s + 1 < m;
      const uint16_t* a1 = both ? a + static_cast<int64_t>(aidx[p0 + 2 * s + 1]) * acols : a0;
      const uint16_t* g1 = both ? g + static_cast<int64_t>(gidx[p0 + 2 * s + 1]) * gcols : g0;
      const uint32_t hi = both ? 0xFFFFu : 0u;
      for (int64_t i = 0; i < acols; ++i) {
        at[i * steps + s] = a0[i] | ((a1[i] & hi) << 16);
      }
      uint16_t* row = gp + s * gstride;
      for (int64_t o = 0; o < gcols; ++o) {
        row[2 * o] = g0[o];
        row[2 * o + 1] = both ? g1[o] : uint16_t{0};
      }
    }
    ForEachColumnBlock(gcols, [&](auto nv, int64_t v0, __mmask16 tail) {
      constexpr int MR = TileRows<nv()>();
      for (int64_t i0 = 0; i0 < acols; i0 += MR) {
        const int rows = static_cast<int>(std::min<int64_t>(MR, acols - i0));
        Bf16OuterTile<MR, nv()>(at, steps, i0, rows, gp + 32 * v0, gstride, tail, dw + 16 * v0,
                                gcols);
      }
    });
  }
}

TRAINSUP_AVX512_BF16 void ToBf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)v);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    alignas(32) uint16_t last[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(last), (__m256i)v);
    std::memcpy(dst + i, last, static_cast<size_t>(n - i) * sizeof(uint16_t));
  }
}

}  // namespace

TRAINSUP_AVX512 float Avx512FmaChains(long n) {
  __m512 acc[kProbeChains];
  for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-7f);
  const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < n; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
  }
  for (int i = 1; i < kProbeChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return _mm512_reduce_add_ps(acc[0]);
}

TRAINSUP_AVX512_BF16 float Avx512Bf16DotChains(long n) {
  __m512 acc[kProbeChains];
  for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-7f);
  // bf16 1.0 and about 1e-7, two of each per 32-bit lane.
  const __m512bh m = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  for (long it = 0; it < n; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], m, a);
  }
  for (int i = 1; i < kProbeChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return _mm512_reduce_add_ps(acc[0]);
}

double MeasureBf16DotOverFma() {
  if (!Avx512Bf16Supported()) return 0.0;
  constexpr long kRounds = 200'000;  // about 1 ms of FMAs
  Avx512FmaChains(kRounds / 10);     // wakes the AVX-512 units up
  volatile float sink = 0;           // keeps the chains' results live
  const double fma = FastestOfFive([&] { sink = Avx512FmaChains(kRounds); });
  const double dot = FastestOfFive([&] { sink = Avx512Bf16DotChains(kRounds); });
  // An FMA lane does 2 flops; a dot-product lane, 4 (two products, two adds).
  return (4.0 / dot) / (2.0 / fma);
}

bool Avx512Supported() { return __builtin_cpu_supports("avx512f"); }

const TileKernels& Avx512TileKernels() {
  static const TileKernels kernels{FusedGatherGemmScatter, FusedGatherOuter};
  return kernels;
}

bool Avx512Bf16Supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
}

const Bf16TileKernels& Avx512Bf16TileKernels() {
  static const Bf16TileKernels kernels{"AVX512_BF16", 2, Bf16GatherGemmScatter, Bf16GatherOuter,
                                       ToBf16};
  return kernels;
}
#else
bool Avx512Supported() { return false; }

const TileKernels& Avx512TileKernels() {
  static const TileKernels kernels{nullptr, nullptr};
  return kernels;
}

bool Avx512Bf16Supported() { return false; }

double MeasureBf16DotOverFma() { return 0.0; }
float Avx512FmaChains(long) { return 0.0f; }
float Avx512Bf16DotChains(long) { return 0.0f; }

const Bf16TileKernels& Avx512Bf16TileKernels() {
  static const Bf16TileKernels kernels{"AVX512_BF16", 2, nullptr, nullptr, nullptr};
  return kernels;
}
#endif

}  // namespace trainsup::sparse::cpu::fused
