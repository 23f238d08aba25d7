// The fused convolution tiles for AVX2 + FMA CPUs (AMD Zen, Intel Haswell
// and later without AVX-512): the same loops as the AVX-512 tiles in
// kernels_avx512.cc with 8-float vectors and 16 registers.
//
// A tile holds the product of MR pairs (forward, input gradient) or MR
// input channels (weight gradient) and NV vectors of columns in MR x NV
// accumulators; per reduction step it loads NV vectors and broadcasts MR
// values for MR x NV fused multiply-adds. With 16 registers the tiles are
// 8 x 1, 6 x 2 and 4 x 3 vectors (accumulators + vectors + one broadcast
// <= 16), so blocks of columns are at most 3 vectors (24 floats) wide.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "sparse/cpu/kernels_fused.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace trainsup::sparse::cpu::fused {

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

#define TRAINSUP_AVX2 __attribute__((target("avx2,fma")))
// A tile inlined into the loop over tiles that calls it (one call per
// block of pairs and column block instead of one per tile).
#define TRAINSUP_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

constexpr int kMaxBlockVectors = 3;

// The first `lanes` lanes set.
TRAINSUP_AVX2 inline __m256i TailMask(int64_t lanes) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Vector j of NV: the last one is masked when kMasked (masked-off lanes
// read as 0 and are not written).
template <int NV, bool kMasked>
TRAINSUP_AVX2 inline __m256 LoadVector(const float* p, int j, __m256i tail) {
  if (kMasked && j == NV - 1) return _mm256_maskload_ps(p, tail);
  return _mm256_loadu_ps(p);
}

// o[0, 8 NV) += acc.
template <int NV, bool kMasked>
TRAINSUP_AVX2 inline void AddVectors(float* o, const __m256* acc, __m256i tail) {
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const __m256 sum = _mm256_add_ps(LoadVector<NV, kMasked>(o + 8 * j, j, tail), acc[j]);
    if (kMasked && j == NV - 1) {
      _mm256_maskstore_ps(o + 8 * j, tail, sum);
    } else {
      _mm256_storeu_ps(o + 8 * j, sum);
    }
  }
}

template <int NV>
constexpr int TileRows() {
  static_assert(NV >= 1 && NV <= kMaxBlockVectors, "column blocks are at most 3 vectors");
  return NV == 1 ? 8 : NV == 2 ? 6 : 4;
}

// out[oidx[r]] += a[aidx[r]] @ w for the tile's `rows` (<= MR) pairs and
// NV column vectors (w and out offset to the column block). Rows past the
// end repeat the last pair's input; their sums are not stored.
template <int MR, int NV, bool kMasked>
TRAINSUP_AVX2_INLINE void ProductTile(const float* a, int64_t acols, const int32_t* aidx,
                                      const float* w, int64_t wcols, int64_t tail_lanes, float* out,
                                      int64_t ocols, const int32_t* oidx, int rows) {
  const __m256i tail = TailMask(tail_lanes);
  __m256 acc[MR][NV];
  const float* arow[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    arow[r] = a + static_cast<int64_t>(aidx[r < rows ? r : rows - 1]) * acols;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm256_setzero_ps();
  }
#pragma GCC unroll 2
  for (int64_t c = 0; c < acols; ++c) {
    __m256 wv[NV];
    const float* wr = w + c * wcols;
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) wv[j] = LoadVector<NV, kMasked>(wr + 8 * j, j, tail);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(arow[r] + c);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm256_fmadd_ps(av, wv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    AddVectors<NV, kMasked>(out + static_cast<int64_t>(oidx[r]) * ocols, acc[r], tail);
  }
}

// dw[i0 + r, :] += sum_p a[p, i0 + r] * g[p, :] for r < rows (<= MR),
// p in [0, n), and NV column vectors (g and dw offset to the column
// block), the pairs summed in order. a and g are the block's rows copied
// together (acols and gcols wide), so both are read by pointer increments.
template <int MR, int NV, bool kMasked>
TRAINSUP_AVX2_INLINE void OuterTile(const float* a, int64_t acols, int64_t i0, int rows,
                                    const float* g, int64_t gcols, int64_t n, int64_t tail_lanes,
                                    float* dw, int64_t dwcols) {
  const __m256i tail = TailMask(tail_lanes);
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  // Columns past the block repeat its last one; their sums are not stored.
  int64_t col[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) col[r] = i0 + (r < rows ? r : rows - 1);
  const float* ar = a;
  const float* gr = g;
  for (int64_t p = 0; p < n; ++p, ar += acols, gr += gcols) {
    __m256 gv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) gv[j] = LoadVector<NV, kMasked>(gr + 8 * j, j, tail);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(ar + col[r]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm256_fmadd_ps(av, gv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (r >= rows) break;
    AddVectors<NV, kMasked>(dw + (i0 + r) * dwcols, acc[r], tail);
  }
}

// ProductTile over the pairs [0, m) in tiles of MR.
template <int NV, bool kMasked>
TRAINSUP_AVX2 void ProductBlock(const float* a, int64_t acols, const int32_t* aidx, const float* w,
                                int64_t wcols, int64_t tail_lanes, float* out, int64_t ocols,
                                const int32_t* oidx, int64_t m) {
  constexpr int MR = TileRows<NV>();
  for (int64_t p = 0; p < m; p += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, m - p));
    ProductTile<MR, NV, kMasked>(a, acols, aidx + p, w, wcols, tail_lanes, out, ocols, oidx + p,
                                 rows);
  }
}

// OuterTile over the input columns [0, acols) in tiles of MR.
template <int NV, bool kMasked>
TRAINSUP_AVX2 void OuterBlock(const float* a, int64_t acols, const float* g, int64_t gcols,
                              int64_t n, int64_t tail_lanes, float* dw, int64_t dwcols) {
  constexpr int MR = TileRows<NV>();
  for (int64_t i0 = 0; i0 < acols; i0 += MR) {
    const int r = static_cast<int>(std::min<int64_t>(MR, acols - i0));
    OuterTile<MR, NV, kMasked>(a, acols, i0, r, g, gcols, n, tail_lanes, dw, dwcols);
  }
}

// Calls fn(std::integral_constant<int, NV>(), std::bool_constant<masked>(),
// v0, tail_lanes) for blocks of NV <= 3 vectors covering `cols` columns, starting
// at vector v0. Blocks differ by at most one vector (16 vectors: 3, 3, 3,
// 3, 2, 2, rather than five of 3 and one of 1, whose 8 x 1 tile loads
// more than it multiplies). Only the last block's last vector can be
// partial; it has `tail_lanes` lanes in use. (A lane count, not a mask
// vector, crosses the calls: the lambdas are not compiled for AVX2, and a
// 256-bit argument would change their calling convention.)
template <typename Fn>
void ForEachColumnBlock(int64_t cols, const Fn& fn) {
  const int64_t vectors = (cols + 7) / 8;
  const int64_t blocks = (vectors + kMaxBlockVectors - 1) / kMaxBlockVectors;
  const int64_t tail = cols - 8 * (vectors - 1);
  const bool partial = cols % 8 != 0;
  int64_t v0 = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t nv = vectors / blocks + (b < vectors % blocks ? 1 : 0);
    const bool masked = partial && b == blocks - 1;
    auto call = [&](auto nv_constant) {
      if (masked) {
        fn(nv_constant, std::true_type(), v0, tail);
      } else {
        fn(nv_constant, std::false_type(), v0, tail);
      }
    };
    switch (nv) {
      case 1:
        call(std::integral_constant<int, 1>());
        break;
      case 2:
        call(std::integral_constant<int, 2>());
        break;
      case 3:
        call(std::integral_constant<int, 3>());
        break;
    }
    v0 += nv;
  }
}

// dst[i, :] = src[rows[i], :] for i in [0, n): GatherRows with the row
// copy inline (a libc call per row of a few hundred bytes costs a sixth of
// the weight gradient's time).
TRAINSUP_AVX2 void CopyRows(const float* src, int64_t cols, const int32_t* rows, int64_t n,
                            float* dst) {
  const int64_t whole = cols / 8 * 8;
  const __m256i tail = TailMask(cols - whole);
  for (int64_t i = 0; i < n; ++i, dst += cols) {
    const float* s = src + static_cast<int64_t>(rows[i]) * cols;
    for (int64_t c = 0; c < whole; c += 8) _mm256_storeu_ps(dst + c, _mm256_loadu_ps(s + c));
    if (whole < cols) _mm256_maskstore_ps(dst + whole, tail, _mm256_maskload_ps(s + whole, tail));
  }
}

// Pairs per block of the forward: their input rows stay in L1 across the
// output's column blocks (a multiple of every tile height: 8, 6, 4).
int64_t ProductPairBlock(int64_t acols) {
  const int64_t fit = (16 * 1024 / 4) / std::max<int64_t>(1, acols);
  return std::clamp<int64_t>(fit / 24 * 24, 24, 96);
}

void GatherGemmScatter(const float* a, int64_t acols, const int32_t* aidx, const float* w,
                       float* out, int64_t ocols, const int32_t* oidx, int64_t n) {
  const int64_t pair_block = ProductPairBlock(acols);
  for (int64_t p0 = 0; p0 < n; p0 += pair_block) {
    const int64_t m = std::min(pair_block, n - p0);
    ForEachColumnBlock(ocols, [&](auto nv, auto masked, int64_t v0, int64_t tail) {
      ProductBlock<decltype(nv)::value, decltype(masked)::value>(
          a, acols, aidx + p0, w + 8 * v0, ocols, tail, out + 8 * v0, ocols, oidx + p0, m);
    });
  }
}

void GatherOuter(const float* a, int64_t acols, const int32_t* aidx, const float* g, int64_t gcols,
                 const int32_t* gidx, int64_t n, float* dw) {
  // The block's input and output-gradient rows are copied together first:
  // the tiles then read both by pointer increments from L1, where reading
  // them in place costs an index load and a multiply per row and tile, and
  // a cache miss at every new line of a row read a few columns at a time.
  // Blocks of 64 pairs, as the AVX-512 tiles sum them (the same bits).
  constexpr int64_t pair_block = 64;
  static thread_local std::vector<float> storage;
  storage.resize(static_cast<size_t>(pair_block * (acols + gcols)));
  float* arows = storage.data();
  float* grows = arows + pair_block * acols;
  for (int64_t p0 = 0; p0 < n; p0 += pair_block) {
    const int64_t m = std::min(pair_block, n - p0);
    CopyRows(a, acols, aidx + p0, m, arows);
    CopyRows(g, gcols, gidx + p0, m, grows);
    ForEachColumnBlock(gcols, [&](auto nv, auto masked, int64_t v0, int64_t tail) {
      OuterBlock<decltype(nv)::value, decltype(masked)::value>(arows, acols, grows + 8 * v0, gcols,
                                                               m, tail, dw + 8 * v0, gcols);
    });
  }
}

}  // namespace

bool Avx2Supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

const TileKernels& Avx2TileKernels() {
  static const TileKernels kernels{GatherGemmScatter, GatherOuter};
  return kernels;
}
#else
bool Avx2Supported() { return false; }

const TileKernels& Avx2TileKernels() {
  static const TileKernels kernels{nullptr, nullptr};
  return kernels;
}
#endif

}  // namespace trainsup::sparse::cpu::fused
