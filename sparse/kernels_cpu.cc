#include "sparse/kernels_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>
#include <vector>

#include "sparse/blas.h"

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

template <typename T>
void GatherRows(const T* src, int64_t cols, const int32_t* rows, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * cols, src + static_cast<int64_t>(rows[i]) * cols, cols * sizeof(T));
  }
}

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
      for (int64_t p = b; p < e; ++p) fn(static_cast<int64_t>(src[p]), static_cast<int64_t>(dst[p]));
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
    Gemm<T>(true, false, cin, cout, m, in + b * cin, cin, grad_out + b * cout, cout, T(1), dw, cout);
  }
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

template <typename T>
void ConvForward(const T* in, int64_t num_in, int64_t cin, const T* weight, int64_t cout,
                 const PairLists& pairs, T* out, int64_t num_out) {
  (void)num_in;
  BlasSingleThreadGuard single_threaded_blas;
  if (pairs.sorted && RowRangesEnabled()) {
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
void WindowSumForward(const T* in, int64_t c, const PairLists& pairs, const T* inv_divisor,
                      T* out, int64_t num_out) {
  std::fill(out, out + num_out * c, T(0));
  ForEachPair(pairs, [&](int64_t src, int64_t dst) { AddRow(out + dst * c, in + src * c, c); });
  at::parallel_for(0, num_out, kChunkRows, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t j = 0; j < c; ++j) out[i * c + j] *= inv_divisor[i];
    }
  });
}

template <typename T>
void WindowSumBackward(const T* grad_out, int64_t c, const PairLists& pairs,
                       const T* inv_divisor, T* grad_in, int64_t num_in) {
  std::fill(grad_in, grad_in + num_in * c, T(0));
  ForEachPair(pairs, [&](int64_t src, int64_t dst) {
    const T* g = grad_out + dst * c;
    T* d = grad_in + src * c;
    const T scale = inv_divisor[dst];
    for (int64_t j = 0; j < c; ++j) d[j] += g[j] * scale;
  });
}

#define TRAINSUP_INSTANTIATE(T)                                                                 \
  template void ConvForward<T>(const T*, int64_t, int64_t, const T*, int64_t, const PairLists&, \
                               T*, int64_t);                                                    \
  template void ConvBackward<T>(const T*, int64_t, int64_t, const T*, int64_t,                  \
                                const PairLists&, const T*, int64_t, T*, T*);                   \
  template void MaxPoolForward<T>(const T*, int64_t, const PairLists&, T*, int32_t*, int64_t);  \
  template void MaxPoolBackward<T>(const T*, const int32_t*, int64_t, int64_t, const int64_t*, \
                                   T*);             \
  template void WindowSumForward<T>(const T*, int64_t, const PairLists&, const T*, T*,          \
                                    int64_t);                                                   \
  template void WindowSumBackward<T>(const T*, int64_t, const PairLists&, const T*, T*, int64_t);

TRAINSUP_INSTANTIATE(float)
TRAINSUP_INSTANTIATE(double)
#undef TRAINSUP_INSTANTIATE

}  // namespace trainsup::sparse::cpu
