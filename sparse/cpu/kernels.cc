#include "sparse/cpu/kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "c10/util/Exception.h"
#include "sparse/cpu/blas.h"
#include "sparse/cpu/kernels_fused.h"

namespace trainsup::sparse::cpu {
namespace {

// Rows per GEMM: a chunk's gathered operands stay in the core's L2 cache.
constexpr int64_t kChunkRows = 1024;
// Chunks per task of the weight-gradient reduction. Fixed, so the partial
// sums (and the result, bit for bit) do not depend on the thread count.
constexpr int64_t kTaskChunks = 8;

template <typename T>
T* ThreadBuffer(int which, int64_t elements) {
  thread_local std::vector<T> buffers[3];
  auto& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < elements) b.resize(elements);
  return b.data();
}

using fused::GatherRows;

// d += s over a row. Cloned for AVX-512 and AVX2 (chosen at load time by
// the CPU), since the base x86-64 build only has SSE2.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void AddRow(T* __restrict d,
                                                                         const T* __restrict s,
                                                                         int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) d[c] += s[c];
}

template <typename T>
void ScatterAddRows(const T* src, int64_t cols, const int32_t* rows, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    AddRow(dst + static_cast<int64_t>(rows[i]) * cols, src + i * cols, cols);
  }
}

int64_t Count(const PairLists& p, int64_t k) { return p.begin[k + 1] - p.begin[k]; }

// Calls fn(src_row, dst_row) for every pair: offsets one after another,
// the pairs of one offset in parallel (their dst rows, and src rows, are
// unique, so fn may write to either row without a race).
template <typename Fn>
void ForEachPair(const PairLists& pairs, const Fn& fn) {
  for (int64_t k = 0; k < pairs.volume; ++k) {
    const int32_t* src = pairs.src + pairs.begin[k];
    const int32_t* dst = pairs.dst + pairs.begin[k];
    at::parallel_for(0, Count(pairs, k), kChunkRows, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p)
        fn(static_cast<int64_t>(src[p]), static_cast<int64_t>(dst[p]));
    });
  }
}

// TRAINSUP_ROW_RANGES=0 turns the sorted path off (for A/B measurements).
bool RowRangesEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TRAINSUP_ROW_RANGES");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

// Row ranges for the sorted path: fixed by the row count alone (not the
// thread count), so sums over them do not depend on the number of threads.
int64_t NumRanges(int64_t rows) { return std::clamp<int64_t>((rows + 4095) / 4096, 1, 512); }
int64_t RangeStart(int64_t r, int64_t ranges, int64_t rows) { return r * rows / ranges; }

// Calls fn(r) for r in [0, ranges), handing ranges to the threads as they
// become free: the pairs per range vary (floors and walls are denser than
// open space), and a static split would leave a thread idle.
template <typename Fn>
void ForEachRange(int64_t ranges, const Fn& fn) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), ranges));
  at::parallel_for(0, workers, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      for (int64_t r = next.fetch_add(1); r < ranges; r = next.fetch_add(1)) fn(r);
    }
  });
}

// The pairs [lo, hi) of one offset whose rows (ascending) lie in [a, b).
std::pair<int64_t, int64_t> PairsInRows(const int32_t* rows, int64_t n, int64_t a, int64_t b) {
  const int64_t lo = std::lower_bound(rows, rows + n, static_cast<int32_t>(a)) - rows;
  const int64_t hi = std::lower_bound(rows + lo, rows + n, static_cast<int32_t>(b)) - rows;
  return {lo, hi};
}

// The per-thread buffers of one chunk of pairs.
template <typename T>
struct ChunkBuffers {
  T* a;  // gathered input rows, kChunkRows x cin
  T* c;  // GEMM result (forward) or gathered output gradients (backward), kChunkRows x cout
  T* d;  // input-gradient rows (backward), kChunkRows x cin
};

template <typename T>
ChunkBuffers<T> Buffers(int64_t cin, int64_t cout) {
  return {ThreadBuffer<T>(0, kChunkRows * cin), ThreadBuffer<T>(1, kChunkRows * cout),
          ThreadBuffer<T>(2, kChunkRows * cin)};
}

// Forward of m pairs of one offset: out[dst] += in[src] @ w.
template <typename T>
void ForwardChunk(const T* in, int64_t cin, const T* w, int64_t cout, const int32_t* src,
                  const int32_t* dst, int64_t m, const ChunkBuffers<T>& buf, T* out) {
  GatherRows(in, cin, src, m, buf.a);
  Gemm<T>(false, false, m, cout, cin, buf.a, cin, w, cout, T(0), buf.c, cout);
  ScatterAddRows(buf.c, cout, dst, m, out);
}

// Backward of m pairs of one offset: grad_in[src] += grad_out[dst] @ w^T
// (if grad_in), dw += in[src]^T grad_out[dst] (if dw).
template <typename T>
void BackwardChunk(const T* in, int64_t cin, const T* w, int64_t cout, const T* grad_out,
                   const int32_t* src, const int32_t* dst, int64_t m, const ChunkBuffers<T>& buf,
                   T* grad_in, T* dw) {
  GatherRows(grad_out, cout, dst, m, buf.c);
  if (grad_in != nullptr) {
    Gemm<T>(false, true, m, cin, cout, buf.c, cout, w, cout, T(0), buf.d, cin);
    ScatterAddRows(buf.d, cin, src, m, grad_in);
  }
  if (dw != nullptr) {
    GatherRows(in, cin, src, m, buf.a);
    Gemm<T>(true, false, cin, cout, m, buf.a, cin, buf.c, cout, T(1), dw, cout);
  }
}

// The identity offset on rows [b, b + m), which map to themselves: no
// gather or scatter. grad_in rows are overwritten (it is the first
// contribution), dw accumulates.
template <typename T>
void BackwardIdentityRows(const T* in, int64_t cin, const T* w, int64_t cout, const T* grad_out,
                          int64_t b, int64_t m, T* grad_in, T* dw) {
  if (grad_in != nullptr) {
    Gemm<T>(false, true, m, cin, cout, grad_out + b * cout, cout, w, cout, T(0), grad_in + b * cin,
            cin);
  }
  if (dw != nullptr) {
    Gemm<T>(true, false, cin, cout, m, in + b * cin, cin, grad_out + b * cout, cout, T(1), dw,
            cout);
  }
}

// Row ranges of the fused path. Its weight gradients need no per-range
// partial sums, so ranges can be short: 256 rows keep both threads busy on
// the coarse levels (a few thousand rows) too.
int64_t FusedRanges(int64_t rows) { return std::clamp<int64_t>((rows + 255) / 256, 1, 4096); }

// 0, 1, ..., n - 1: the pair list of the identity offset.
const int32_t* Iota(std::vector<int32_t>& storage, int64_t n) {
  storage.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) storage[i] = static_cast<int32_t>(i);
  return storage.data();
}

// The pairs of offset k, with the identity offset's implicit list.
std::pair<const int32_t*, const int32_t*> OffsetPairs(const PairLists& pairs, int64_t k,
                                                      const int32_t* iota) {
  if (k == pairs.identity_offset) return {iota, iota};
  return {pairs.src + pairs.begin[k], pairs.dst + pairs.begin[k]};
}

// out = sum_k (offset k's products) scattered to out[to_k], where (from,
// to) is (src, dst) or, with `to_src`, (dst, src); `to` ascends within
// every offset. Each task owns a range of out's rows (float32, ocols
// wide), zeroes it, adds every offset's products into it, offsets in
// order (tile(k, from, to, n) adds n pairs of offset k), then calls
// finish(row0, row1) on it.
template <typename Tile, typename Finish>
void AccumulateByRows(const PairLists& pairs, const int32_t* iota, bool to_src, float* out,
                      int64_t ocols, int64_t num_out, const Tile& tile, const Finish& finish) {
  const int64_t ranges = FusedRanges(num_out);
  ForEachRange(ranges, [&](int64_t r) {
    const int64_t row0 = RangeStart(r, ranges, num_out);
    const int64_t row1 = RangeStart(r + 1, ranges, num_out);
    std::fill(out + row0 * ocols, out + row1 * ocols, 0.0f);
    for (int64_t k = 0; k < pairs.volume; ++k) {
      auto [from, to] = OffsetPairs(pairs, k, iota);
      if (to_src) std::swap(from, to);
      const int64_t n = k == pairs.identity_offset ? num_out : Count(pairs, k);
      const auto [lo, hi] = PairsInRows(to, n, row0, row1);
      tile(k, from + lo, to + lo, hi - lo);
    }
    finish(row0, row1);
  });
}

// The weight gradient of the fused paths, float32 [volume x cin x cout]:
// outer(k, src, dst, n, sum) adds n pairs of offset k into `sum`.
//
// Input rows are cut into groups of kGroupRows (src ascends within an
// offset). A task sums the pairs of one offset whose input rows lie in
// one group, into that group's partial sum; the rows it reads (inputs of
// the group and the output rows next to them) stay in L2 across the
// group's offsets. Going offset by offset over all rows instead streams
// every row from memory once per offset. Groups run in waves of kWave, and
// each wave's partial sums are added into grad_weight in group order: the
// partition depends on the map alone. Each task zeroes its own partial sum
// and the first wave's first partial is copied rather than added to zeros
// (the same bits), so no serial pass over the partials or the gradient
// keeps the other threads waiting.
template <typename Outer>
void FusedWeightGradient(const PairLists& pairs, const int32_t* iota, int64_t num_in, int64_t cin,
                         int64_t cout, const Outer& outer, float* grad_weight) {
  constexpr int64_t kGroupRows = 2048;
  constexpr int64_t kWave = 8;
  auto count = [&](int64_t k) { return k == pairs.identity_offset ? num_in : Count(pairs, k); };
  const int64_t groups = (num_in + kGroupRows - 1) / kGroupRows;
  const int64_t wk = cin * cout;
  const int64_t wsize = pairs.volume * wk;
  if (groups == 0) std::fill(grad_weight, grad_weight + wsize, 0.0f);  // no input rows
  std::unique_ptr<float[]> partial(new float[static_cast<size_t>(std::min(kWave, groups) * wsize)]);
  for (int64_t g0 = 0; g0 < groups; g0 += kWave) {
    const int64_t waves = std::min(kWave, groups - g0);
    ForEachRange(waves * pairs.volume, [&](int64_t t) {
      const int64_t g = g0 + t / pairs.volume;
      const int64_t k = t % pairs.volume;
      float* sum = partial.get() + (t / pairs.volume) * wsize + k * wk;
      std::fill(sum, sum + wk, 0.0f);
      const auto [src, dst] = OffsetPairs(pairs, k, iota);
      const auto [lo, hi] =
          PairsInRows(src, count(k), g * kGroupRows, std::min(num_in, (g + 1) * kGroupRows));
      outer(k, src + lo, dst + lo, hi - lo, sum);
    });
    ForEachRange(pairs.volume, [&](int64_t k) {
      float* gw = grad_weight + k * wk;
      const float* first = partial.get() + k * wk;
      if (g0 == 0) std::copy(first, first + wk, gw);
      for (int64_t j = g0 == 0 ? 1 : 0; j < waves; ++j) {
        AddRow(gw, partial.get() + j * wsize + k * wk, wk);
      }
    });
  }
}

// Forward, sorted pairs: out rows by range (dst ascends within an offset).
void FusedConvForward(const fused::TileKernels& tiles, const float* in, int64_t cin,
                      const float* weight, int64_t cout, const PairLists& pairs, float* out,
                      int64_t num_out) {
  std::vector<int32_t> iota_storage;
  const int32_t* iota = pairs.identity_offset >= 0 ? Iota(iota_storage, num_out) : nullptr;
  AccumulateByRows(
      pairs, iota, false, out, cout, num_out,
      [&](int64_t k, const int32_t* from, const int32_t* to, int64_t n) {
        tiles.gather_gemm_scatter(in, cin, from, weight + k * cin * cout, out, cout, to, n);
      },
      [](int64_t, int64_t) {});
}

// Backward, sorted pairs. Input gradients: grad_in rows by range (src
// ascends within an offset), the sum of grad_out[dst] @ W_k^T. Weight
// gradients: by groups of input rows (FusedWeightGradient). Every sum has
// one fixed order, whatever the thread count.
void FusedConvBackward(const fused::TileKernels& tiles, const float* in, int64_t num_in,
                       int64_t cin, const float* weight, int64_t cout, const PairLists& pairs,
                       const float* grad_out, float* grad_in, float* grad_weight) {
  std::vector<int32_t> iota_storage;
  const int32_t* iota = pairs.identity_offset >= 0 ? Iota(iota_storage, num_in) : nullptr;
  if (grad_in != nullptr) {
    // W_k^T, cout x cin, so the input gradient is the forward kernel again.
    // Offsets in parallel: a 384 x 256 layer's 10 MB would otherwise keep
    // the other threads waiting.
    std::unique_ptr<float[]> weight_t(new float[static_cast<size_t>(pairs.volume * cin * cout)]);
    at::parallel_for(0, pairs.volume, 1, [&](int64_t kb, int64_t ke) {
      for (int64_t k = kb; k < ke; ++k) {
        const float* w = weight + k * cin * cout;
        float* wt = weight_t.get() + k * cin * cout;
        for (int64_t i = 0; i < cin; ++i) {
          for (int64_t o = 0; o < cout; ++o) wt[o * cin + i] = w[i * cout + o];
        }
      }
    });
    AccumulateByRows(
        pairs, iota, true, grad_in, cin, num_in,
        [&](int64_t k, const int32_t* from, const int32_t* to, int64_t n) {
          tiles.gather_gemm_scatter(grad_out, cout, from, weight_t.get() + k * cin * cout, grad_in,
                                    cin, to, n);
        },
        [](int64_t, int64_t) {});
  }
  if (grad_weight == nullptr) return;
  FusedWeightGradient(
      pairs, iota, num_in, cin, cout,
      [&](int64_t, const int32_t* src, const int32_t* dst, int64_t n, float* sum) {
        tiles.gather_outer(in, cin, src, grad_out, cout, dst, n, sum);
      },
      grad_weight);
}

// Each offset's W_k [rows x cols] (or, with `transpose`, W_k^T of a [cols
// x rows] W_k) pair-packed (kernels_fused.h) for the bf16 tiles, its rows
// zero-padded to a multiple of `row_multiple` (even); `volume` matrices,
// PackedSize(rows, cols, row_multiple) values each.
int64_t PackedSize(int64_t rows, int64_t cols, int64_t row_multiple) {
  return (rows + row_multiple - 1) / row_multiple * row_multiple * fused::Cols16(cols);
}
std::vector<uint16_t> PackPairs(const uint16_t* w, int64_t volume, int64_t rows, int64_t cols,
                                bool transpose, int64_t row_multiple) {
  const int64_t size = PackedSize(rows, cols, row_multiple);
  std::vector<uint16_t> packed(static_cast<size_t>(volume * size), 0);
  at::parallel_for(0, volume, 1, [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      fused::PackPairsInto(w + k * rows * cols, rows, cols, transpose, packed.data() + k * size);
    }
  });
  return packed;
}

// The fastest supported set at or below `wanted` (BLAS is always there).
KernelSet Supported(KernelSet wanted) {
  if (wanted == KernelSet::kAvx512 && !fused::Avx512Supported()) wanted = KernelSet::kAvx2;
  if (wanted == KernelSet::kAvx2 && !fused::Avx2Supported()) wanted = KernelSet::kBlas;
  return wanted;
}

// The process's set, chosen from the environment at the first use;
// SetKernelSet overrides it (benchmarks' A/B runs, tests of every set).
std::atomic<KernelSet>& KernelSetFlag() {
  static std::atomic<KernelSet> flag{
      ChooseKernelSet(std::getenv("TRAINSUP_KERNELS"), std::getenv("TRAINSUP_FUSED"))};
  return flag;
}

// The tiles of the active set; null for BLAS.
const fused::TileKernels* ActiveTiles() {
  switch (KernelSetFlag().load(std::memory_order_relaxed)) {
    case KernelSet::kAvx512:
      return &fused::Avx512TileKernels();
    case KernelSet::kAvx2:
      return &fused::Avx2TileKernels();
    case KernelSet::kBlas:
      break;
  }
  return nullptr;
}

// A 1x1x1 convolution on one set: plain matrix products on contiguous rows,
// where BLAS beats the fused kernels (conv_bench: 0.9x fused).
bool IdentityOnly(const PairLists& pairs) {
  return pairs.volume == 1 && pairs.identity_offset == 0;
}

// Sorted path of ConvForward: each task owns a range of output rows and
// runs every offset's pairs into it.
template <typename T>
void ConvForwardByRows(const T* in, int64_t cin, const T* weight, int64_t cout,
                       const PairLists& pairs, T* out, int64_t num_out) {
  const int64_t ranges = NumRanges(num_out);
  ForEachRange(ranges, [&](int64_t r) {
    const ChunkBuffers<T> buf = Buffers<T>(cin, cout);
    const int64_t row0 = RangeStart(r, ranges, num_out);
    const int64_t row1 = RangeStart(r + 1, ranges, num_out);
    if (pairs.identity_offset >= 0) {
      const T* w = weight + pairs.identity_offset * cin * cout;
      for (int64_t b = row0; b < row1; b += kChunkRows) {
        const int64_t m = std::min(kChunkRows, row1 - b);
        Gemm<T>(false, false, m, cout, cin, in + b * cin, cin, w, cout, T(0), out + b * cout, cout);
      }
    } else {
      std::fill(out + row0 * cout, out + row1 * cout, T(0));
    }
    for (int64_t k = 0; k < pairs.volume; ++k) {
      if (k == pairs.identity_offset) continue;
      const int32_t* src = pairs.src + pairs.begin[k];
      const int32_t* dst = pairs.dst + pairs.begin[k];
      const auto [lo, hi] = PairsInRows(dst, Count(pairs, k), row0, row1);
      for (int64_t p0 = lo; p0 < hi; p0 += kChunkRows) {
        ForwardChunk(in, cin, weight + k * cin * cout, cout, src + p0, dst + p0,
                     std::min(kChunkRows, hi - p0), buf, out);
      }
    }
  });
}

// Sorted path of ConvBackward: each task owns a range of input rows (the
// rows grad_in is scattered into); weight gradients are summed per range,
// then over the ranges in order.
template <typename T>
void ConvBackwardByRows(const T* in, int64_t num_in, int64_t cin, const T* weight, int64_t cout,
                        const PairLists& pairs, const T* grad_out, T* grad_in, T* grad_weight) {
  const int64_t ranges = NumRanges(num_in);
  const int64_t wsize = pairs.volume * cin * cout;
  std::vector<T> partial(grad_weight != nullptr ? static_cast<size_t>(ranges * wsize) : 0, T(0));
  ForEachRange(ranges, [&](int64_t r) {
    const ChunkBuffers<T> buf = Buffers<T>(cin, cout);
    const int64_t row0 = RangeStart(r, ranges, num_in);
    const int64_t row1 = RangeStart(r + 1, ranges, num_in);
    T* pw = grad_weight != nullptr ? partial.data() + r * wsize : nullptr;
    if (pairs.identity_offset >= 0) {
      const int64_t k = pairs.identity_offset;
      for (int64_t b = row0; b < row1; b += kChunkRows) {
        BackwardIdentityRows(in, cin, weight + k * cin * cout, cout, grad_out, b,
                             std::min(kChunkRows, row1 - b), grad_in,
                             pw != nullptr ? pw + k * cin * cout : nullptr);
      }
    } else if (grad_in != nullptr) {
      std::fill(grad_in + row0 * cin, grad_in + row1 * cin, T(0));
    }
    for (int64_t k = 0; k < pairs.volume; ++k) {
      if (k == pairs.identity_offset) continue;
      const int32_t* src = pairs.src + pairs.begin[k];
      const int32_t* dst = pairs.dst + pairs.begin[k];
      const auto [lo, hi] = PairsInRows(src, Count(pairs, k), row0, row1);
      for (int64_t p0 = lo; p0 < hi; p0 += kChunkRows) {
        BackwardChunk(in, cin, weight + k * cin * cout, cout, grad_out, src + p0, dst + p0,
                      std::min(kChunkRows, hi - p0), buf, grad_in,
                      pw != nullptr ? pw + k * cin * cout : nullptr);
      }
    }
  });
  if (grad_weight != nullptr) {
    std::fill(grad_weight, grad_weight + wsize, T(0));
    for (int64_t r = 0; r < ranges; ++r) AddRow(grad_weight, partial.data() + r * wsize, wsize);
  }
}

}  // namespace

std::string ToString(KernelSet set) {
  switch (set) {
    case KernelSet::kBlas:
      return "blas";
    case KernelSet::kAvx2:
      return "avx2";
    case KernelSet::kAvx512:
      return "avx512";
  }
  return "unknown";
}

KernelSet KernelSetFromString(const std::string& name, const std::string& what) {
  if (name == "blas") return KernelSet::kBlas;
  if (name == "avx2") return KernelSet::kAvx2;
  if (name == "avx512") return KernelSet::kAvx512;
  TORCH_CHECK(false, what, ": unknown kernel set '", name, "' (expected avx512, avx2 or blas)");
}

bool KernelSetSupported(KernelSet set) { return Supported(set) == set; }

KernelSet ChooseKernelSet(const char* trainsup_kernels, const char* trainsup_fused) {
  if (trainsup_kernels != nullptr && *trainsup_kernels != '\0') {
    return Supported(KernelSetFromString(trainsup_kernels, "TRAINSUP_KERNELS"));
  }
  if (trainsup_fused != nullptr && std::string(trainsup_fused) == "0") return KernelSet::kBlas;
  return BestKernelSet();
}

KernelSet BestKernelSet() { return Supported(KernelSet::kAvx512); }

KernelSet ActiveKernelSet() { return KernelSetFlag().load(std::memory_order_relaxed); }

KernelSet SetKernelSet(KernelSet set) {
  TORCH_CHECK(KernelSetSupported(set), "SetKernelSet: this CPU cannot run the ", ToString(set),
              " kernels (it has ", ToString(BestKernelSet()), " at best)");
  return KernelSetFlag().exchange(set);
}

bool FusedKernelsEnabled() { return ActiveKernelSet() != KernelSet::kBlas; }

bool SetFusedKernelsEnabled(bool on) {
  return KernelSetFlag().exchange(on ? BestKernelSet() : KernelSet::kBlas) != KernelSet::kBlas;
}

template <typename T>
void ConvForward(const T* in, int64_t num_in, int64_t cin, const T* weight, int64_t cout,
                 const PairLists& pairs, T* out, int64_t num_out) {
  (void)num_in;
  BlasSingleThreadGuard single_threaded_blas;
  if (pairs.sorted && RowRangesEnabled()) {
    if constexpr (std::is_same_v<T, float>) {
      const fused::TileKernels* tiles = ActiveTiles();
      if (tiles != nullptr && !IdentityOnly(pairs) && cin > 0 && cout > 0) {
        FusedConvForward(*tiles, in, cin, weight, cout, pairs, out, num_out);
        return;
      }
    }
    ConvForwardByRows(in, cin, weight, cout, pairs, out, num_out);
    return;
  }
  if (pairs.identity_offset >= 0) {
    // out = in @ W_centre, row blocks in parallel; no gather, no scatter.
    const T* w = weight + pairs.identity_offset * cin * cout;
    at::parallel_for(0, num_out, kChunkRows, [&](int64_t b, int64_t e) {
      Gemm<T>(false, false, e - b, cout, cin, in + b * cin, cin, w, cout, T(0), out + b * cout,
              cout);
    });
  } else {
    at::parallel_for(0, num_out, kChunkRows, [&](int64_t b, int64_t e) {
      std::fill(out + b * cout, out + e * cout, T(0));
    });
  }
  for (int64_t k = 0; k < pairs.volume; ++k) {
    if (k == pairs.identity_offset) continue;
    const int64_t n = Count(pairs, k);
    if (n == 0) continue;
    const int32_t* src = pairs.src + pairs.begin[k];
    const int32_t* dst = pairs.dst + pairs.begin[k];
    const int64_t chunks = (n + kChunkRows - 1) / kChunkRows;
    at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      const ChunkBuffers<T> buf = Buffers<T>(cin, cout);
      for (int64_t ch = cb; ch < ce; ++ch) {
        const int64_t p0 = ch * kChunkRows;
        ForwardChunk(in, cin, weight + k * cin * cout, cout, src + p0, dst + p0,
                     std::min(kChunkRows, n - p0), buf, out);
      }
    });
  }
}

template <typename T>
void ConvBackward(const T* in, int64_t num_in, int64_t cin, const T* weight, int64_t cout,
                  const PairLists& pairs, const T* grad_out, int64_t num_out, T* grad_in,
                  T* grad_weight) {
  (void)num_out;
  BlasSingleThreadGuard single_threaded_blas;
  if (pairs.sorted && RowRangesEnabled()) {
    if constexpr (std::is_same_v<T, float>) {
      const fused::TileKernels* tiles = ActiveTiles();
      if (tiles != nullptr && !IdentityOnly(pairs) && cin > 0 && cout > 0) {
        FusedConvBackward(*tiles, in, num_in, cin, weight, cout, pairs, grad_out, grad_in,
                          grad_weight);
        return;
      }
    }
    ConvBackwardByRows(in, num_in, cin, weight, cout, pairs, grad_out, grad_in, grad_weight);
    return;
  }
  const int64_t task_rows = kChunkRows * kTaskChunks;
  if (grad_weight != nullptr) std::fill(grad_weight, grad_weight + pairs.volume * cin * cout, T(0));
  if (grad_in != nullptr) {
    if (pairs.identity_offset >= 0) {
      const T* w = weight + pairs.identity_offset * cin * cout;
      at::parallel_for(0, num_in, kChunkRows, [&](int64_t b, int64_t e) {
        BackwardIdentityRows<T>(in, cin, w, cout, grad_out, b, e - b, grad_in, nullptr);
      });
    } else {
      at::parallel_for(0, num_in, kChunkRows, [&](int64_t b, int64_t e) {
        std::fill(grad_in + b * cin, grad_in + e * cin, T(0));
      });
    }
  }
  std::vector<T> partial;
  for (int64_t k = 0; k < pairs.volume; ++k) {
    const int64_t n = Count(pairs, k);
    if (n == 0) continue;
    const bool identity = (k == pairs.identity_offset);
    if (identity && grad_weight == nullptr) continue;
    const int32_t* src = pairs.src + pairs.begin[k];
    const int32_t* dst = pairs.dst + pairs.begin[k];
    const T* w = weight + k * cin * cout;
    const int64_t tasks = (n + task_rows - 1) / task_rows;
    if (grad_weight != nullptr) partial.assign(static_cast<size_t>(tasks * cin * cout), T(0));
    at::parallel_for(0, tasks, 1, [&](int64_t tb, int64_t te) {
      const ChunkBuffers<T> buf = Buffers<T>(cin, cout);
      for (int64_t t = tb; t < te; ++t) {
        T* dw = grad_weight != nullptr ? partial.data() + t * cin * cout : nullptr;
        const int64_t t_end = std::min(n, (t + 1) * task_rows);
        for (int64_t p0 = t * task_rows; p0 < t_end; p0 += kChunkRows) {
          const int64_t m = std::min(kChunkRows, t_end - p0);
          if (identity) {
            // grad_in of the identity offset was written above.
            BackwardIdentityRows<T>(in, cin, w, cout, grad_out, p0, m, nullptr, dw);
          } else {
            BackwardChunk(in, cin, w, cout, grad_out, src + p0, dst + p0, m, buf, grad_in, dw);
          }
        }
      }
    });
    if (grad_weight != nullptr) {
      T* gw = grad_weight + k * cin * cout;
      for (int64_t t = 0; t < tasks; ++t) AddRow(gw, partial.data() + t * cin * cout, cin * cout);
    }
  }
}

template <typename T>
void MaxPoolForward(const T* in, int64_t c, const PairLists& pairs, T* out, int32_t* argmax,
                    int64_t num_out) {
  std::fill(out, out + num_out * c, -std::numeric_limits<T>::infinity());
  std::fill(argmax, argmax + num_out * c, -1);
  ForEachPair(pairs, [&](int64_t src, int64_t dst) {
    const T* s = in + src * c;
    T* o = out + dst * c;
    int32_t* am = argmax + dst * c;
    for (int64_t j = 0; j < c; ++j) {
      if (s[j] > o[j] || am[j] < 0) {
        o[j] = s[j];
        am[j] = static_cast<int32_t>(src);
      }
    }
  });
  at::parallel_for(0, num_out * c, kChunkRows * 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (argmax[i] < 0) out[i] = T(0);
    }
  });
}

template <typename T>
void MaxPoolBackward(const T* grad_out, const int32_t* argmax, int64_t num_out, int64_t c,
                     const int64_t* order, T* grad_in) {
  // One input can be the maximum of several windows: split by channel so no
  // two threads add to the same element, and add in the given row order.
  at::parallel_for(0, c, 1, [&](int64_t jb, int64_t je) {
    for (int64_t r = 0; r < num_out; ++r) {
      const int64_t i = order != nullptr ? order[r] : r;
      for (int64_t j = jb; j < je; ++j) {
        const int32_t row = argmax[i * c + j];
        if (row >= 0) grad_in[static_cast<int64_t>(row) * c + j] += grad_out[i * c + j];
      }
    }
  });
}

template <typename T>
void WindowSumForward(const T* in, int64_t c, const PairLists& pairs, const T* inv_divisor, T* out,
                      int64_t num_out) {
  std::fill(out, out + num_out * c, T(0));
  ForEachPair(pairs, [&](int64_t src, int64_t dst) { AddRow(out + dst * c, in + src * c, c); });
  at::parallel_for(0, num_out, kChunkRows, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t j = 0; j < c; ++j) out[i * c + j] *= inv_divisor[i];
    }
  });
}

template <typename T>
void WindowSumBackward(const T* grad_out, int64_t c, const PairLists& pairs, const T* inv_divisor,
                       T* grad_in, int64_t num_in) {
  std::fill(grad_in, grad_in + num_in * c, T(0));
  ForEachPair(pairs, [&](int64_t src, int64_t dst) {
    const T* g = grad_out + dst * c;
    T* d = grad_in + src * c;
    const T scale = inv_divisor[dst];
    for (int64_t j = 0; j < c; ++j) d[j] += g[j] * scale;
  });
}

void ConvForwardBf16(const uint16_t* in, int64_t cin, const uint16_t* weight, int64_t cout,
                     const PairLists& pairs, uint16_t* out, int64_t num_out, const float* bias) {
  TORCH_CHECK(Bf16KernelsActive() && pairs.sorted, "ConvForwardBf16: the bf16 kernels need ",
              "AVX512_BF16 or AMX_BF16, the avx512 set and sorted pairs");
  const fused::Bf16TileKernels& tiles = fused::ActiveBf16Tiles();
  if (cin == 0 || cout == 0) {  // a sum over no input channels is 0, then the bias
    std::vector<uint16_t> row(static_cast<size_t>(cout), 0);  // bf16 0 is all zero bits
    if (bias != nullptr) tiles.to_bf16(bias, row.data(), cout);
    for (int64_t r = 0; r < num_out; ++r) std::copy(row.begin(), row.end(), out + r * cout);
    return;
  }
  std::vector<int32_t> iota_storage;
  const int32_t* iota = pairs.identity_offset >= 0 ? Iota(iota_storage, num_out) : nullptr;
  // Packed for these tiles: the AMX ones read whole 32-row steps.
  const std::vector<uint16_t> wp =
      PackPairs(weight, pairs.volume, cin, cout, false, tiles.row_multiple);
  const int64_t size = PackedSize(cin, cout, tiles.row_multiple);
  std::unique_ptr<float[]> sums(new float[static_cast<size_t>(num_out * cout)]);
  AccumulateByRows(
      pairs, iota, false, sums.get(), cout, num_out,
      [&](int64_t k, const int32_t* from, const int32_t* to, int64_t n) {
        tiles.gather_gemm_scatter(in, cin, from, wp.data() + k * size, sums.get(), cout, to, n);
      },
      [&](int64_t row0, int64_t row1) {
        float* rows = sums.get() + row0 * cout;
        if (bias != nullptr) {
          for (int64_t r = 0; r < row1 - row0; ++r) AddRow(rows + r * cout, bias, cout);
        }
        tiles.to_bf16(rows, out + row0 * cout, (row1 - row0) * cout);
      });
}

void ConvBackwardBf16(const uint16_t* in, int64_t num_in, int64_t cin, const uint16_t* weight,
                      int64_t cout, const PairLists& pairs, const uint16_t* grad_out,
                      uint16_t* grad_in, uint16_t* grad_weight) {
  TORCH_CHECK(Bf16KernelsActive() && pairs.sorted, "ConvBackwardBf16: the bf16 kernels need ",
              "AVX512_BF16 or AMX_BF16, the avx512 set and sorted pairs");
  if (cin == 0 || cout == 0) {  // sums over no channels: zero gradients
    if (grad_in != nullptr) std::fill(grad_in, grad_in + num_in * cin, uint16_t{0});
    if (grad_weight != nullptr)
      std::fill(grad_weight, grad_weight + pairs.volume * cin * cout, uint16_t{0});
    return;
  }
  const fused::Bf16TileKernels& tiles = fused::ActiveBf16Tiles();
  std::vector<int32_t> iota_storage;
  const int32_t* iota = pairs.identity_offset >= 0 ? Iota(iota_storage, num_in) : nullptr;
  if (grad_in != nullptr) {
    // W_k^T pair-packed: the input gradient is the forward tile again.
    const std::vector<uint16_t> wpt =
        PackPairs(weight, pairs.volume, cout, cin, true, tiles.row_multiple);
    const int64_t size = PackedSize(cout, cin, tiles.row_multiple);
    std::unique_ptr<float[]> sums(new float[static_cast<size_t>(num_in * cin)]);
    AccumulateByRows(
        pairs, iota, true, sums.get(), cin, num_in,
        [&](int64_t k, const int32_t* from, const int32_t* to, int64_t n) {
          tiles.gather_gemm_scatter(grad_out, cout, from, wpt.data() + k * size, sums.get(), cin,
                                    to, n);
        },
        [&](int64_t row0, int64_t row1) {
          tiles.to_bf16(sums.get() + row0 * cin, grad_in + row0 * cin, (row1 - row0) * cin);
        });
  }
  if (grad_weight == nullptr) return;
  const int64_t wsize = pairs.volume * cin * cout;
  std::unique_ptr<float[]> sums(new float[static_cast<size_t>(wsize)]);
  FusedWeightGradient(
      pairs, iota, num_in, cin, cout,
      [&](int64_t, const int32_t* src, const int32_t* dst, int64_t n, float* sum) {
        tiles.gather_outer(in, cin, src, grad_out, cout, dst, n, sum);
      },
      sums.get());
  tiles.to_bf16(sums.get(), grad_weight, wsize);
}

#define TRAINSUP_INSTANTIATE(T)                                                                  \
  template void ConvForward<T>(const T*, int64_t, int64_t, const T*, int64_t, const PairLists&,  \
                               T*, int64_t);                                                     \
  template void ConvBackward<T>(const T*, int64_t, int64_t, const T*, int64_t, const PairLists&, \
                                const T*, int64_t, T*, T*);                                      \
  template void MaxPoolForward<T>(const T*, int64_t, const PairLists&, T*, int32_t*, int64_t);   \
  template void MaxPoolBackward<T>(const T*, const int32_t*, int64_t, int64_t, const int64_t*,   \
                                   T*);                                                          \
  template void WindowSumForward<T>(const T*, int64_t, const PairLists&, const T*, T*, int64_t); \
  template void WindowSumBackward<T>(const T*, int64_t, const PairLists&, const T*, T*, int64_t);

TRAINSUP_INSTANTIATE(float)
TRAINSUP_INSTANTIATE(double)
#undef TRAINSUP_INSTANTIATE

}  // namespace trainsup::sparse::cpu
