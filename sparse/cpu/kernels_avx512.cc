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
#include <cstdint>
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

}  // namespace

bool Avx512Supported() { return __builtin_cpu_supports("avx512f"); }

const TileKernels& Avx512TileKernels() {
  static const TileKernels kernels{FusedGatherGemmScatter, FusedGatherOuter};
  return kernels;
}
#else
bool Avx512Supported() { return false; }

const TileKernels& Avx512TileKernels() {
  static const TileKernels kernels{nullptr, nullptr};
  return kernels;
}
#endif

}  // namespace trainsup::sparse::cpu::fused
