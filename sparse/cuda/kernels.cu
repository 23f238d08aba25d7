#include <cuda_runtime.h>

#include "sparse/cuda/kernels.h"

namespace trainsup::sparse::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops over at most this many blocks: enough to fill any GPU,
// and far below the launch limit whatever the element count.
constexpr int64_t kMaxBlocks = 65535;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ inline int64_t Stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
__device__ inline int64_t First() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// The first position in keys[0, n) whose key is >= t.
__device__ int64_t LowerBound(const int64_t* keys, int64_t n, int64_t t) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < t) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__global__ void KernelMapSearchKernel(const int64_t* in_keys, int64_t n_in, const int64_t* out_keys,
                                      int64_t n_out, const int64_t* fields, const int64_t* delta,
                                      int field_bits, int64_t lookups, int64_t volume, bool mirror,
                                      int32_t* match) {
  const int64_t mask = (int64_t{1} << field_bits) - 1;
  const int64_t center = volume / 2;
  for (int64_t i = First(); i < lookups * n_out; i += Stride()) {
    const int64_t k = i / n_out, p = i % n_out;
    const int64_t key = out_keys[p];
    // The unbiased key's fields: flipping the top bit back, then masking.
    const uint64_t raw = static_cast<uint64_t>(key) ^ (uint64_t{1} << 63);
    bool valid = true;
    for (int a = 0; a < 3; ++a) {
      const int64_t f = static_cast<int64_t>((raw >> ((2 - a) * field_bits)) & mask);
      const int64_t moved = f + fields[3 * k + a];
      valid = valid && moved >= 0 && moved <= mask;
    }
    if (!valid) continue;
    const int64_t t = key + delta[k];
    const int64_t j = LowerBound(in_keys, n_in, t);
    if (j >= n_in || in_keys[j] != t) continue;
    match[k * n_out + p] = static_cast<int32_t>(j);
    if (mirror && k != center) match[(volume - 1 - k) * n_out + j] = static_cast<int32_t>(p);
  }
}

__global__ void InvertPairsKernel(const int32_t* row, const int64_t* begin, int64_t volume,
                                  int64_t pairs, int64_t rows, int32_t* inverse) {
  for (int64_t p = First(); p < pairs; p += Stride()) {
    // The offset of pair p: the last k with begin[k] <= p.
    int64_t lo = 0, hi = volume;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (begin[mid] <= p) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    inverse[lo * rows + row[p]] = static_cast<int32_t>(p);
  }
}

template <typename T>
__global__ void GatherRowsKernel(const T* src, int64_t cols, const int32_t* rows, int64_t n,
                                 T* dst) {
  for (int64_t i = First(); i < n * cols; i += Stride()) {
    const int64_t r = i / cols, c = i % cols;
    dst[i] = src[static_cast<int64_t>(rows[r]) * cols + c];
  }
}

template <typename T>
__global__ void ScatterSumKernel(const T* buffer, int64_t cols, const int32_t* inverse,
                                 int64_t rows, int64_t k0, int64_t k1, int64_t skip, int64_t base,
                                 T* out) {
  for (int64_t i = First(); i < rows * cols; i += Stride()) {
    const int64_t r = i / cols, c = i % cols;
    T acc = out[i];
    for (int64_t k = k0; k < k1; ++k) {
      if (k == skip) continue;
      const int32_t p = inverse[k * rows + r];
      if (p >= 0) acc += buffer[(static_cast<int64_t>(p) - base) * cols + c];
    }
    out[i] = acc;
  }
}

}  // namespace

cudaError_t KernelMapSearch(const int64_t* in_keys, int64_t n_in, const int64_t* out_keys,
                            int64_t n_out, const int64_t* fields, const int64_t* delta,
                            int field_bits, int64_t lookups, int64_t volume, bool mirror,
                            int32_t* match, cudaStream_t stream) {
  if (n_in == 0 || n_out == 0 || lookups == 0) return cudaSuccess;
  KernelMapSearchKernel<<<Blocks(lookups * n_out), kThreads, 0, stream>>>(
      in_keys, n_in, out_keys, n_out, fields, delta, field_bits, lookups, volume, mirror, match);
  return cudaGetLastError();
}

cudaError_t InvertPairs(const int32_t* row, const int64_t* begin, int64_t volume, int64_t pairs,
                        int64_t rows, int32_t* inverse, cudaStream_t stream) {
  if (pairs == 0) return cudaSuccess;
  InvertPairsKernel<<<Blocks(pairs), kThreads, 0, stream>>>(row, begin, volume, pairs, rows,
                                                            inverse);
  return cudaGetLastError();
}

template <typename T>
cudaError_t GatherRows(const T* src, int64_t cols, const int32_t* rows, int64_t n, T* dst,
                       cudaStream_t stream) {
  if (n == 0 || cols == 0) return cudaSuccess;
  GatherRowsKernel<T><<<Blocks(n * cols), kThreads, 0, stream>>>(src, cols, rows, n, dst);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ScatterSum(const T* buffer, int64_t cols, const int32_t* inverse, int64_t rows,
                       int64_t k0, int64_t k1, int64_t skip, int64_t base, T* out,
                       cudaStream_t stream) {
  if (rows == 0 || cols == 0 || k0 >= k1) return cudaSuccess;
  ScatterSumKernel<T><<<Blocks(rows * cols), kThreads, 0, stream>>>(buffer, cols, inverse, rows, k0,
                                                                    k1, skip, base, out);
  return cudaGetLastError();
}

template cudaError_t GatherRows<float>(const float*, int64_t, const int32_t*, int64_t, float*,
                                       cudaStream_t);
template cudaError_t GatherRows<double>(const double*, int64_t, const int32_t*, int64_t, double*,
                                        cudaStream_t);
template cudaError_t ScatterSum<float>(const float*, int64_t, const int32_t*, int64_t, int64_t,
                                       int64_t, int64_t, int64_t, float*, cudaStream_t);
template cudaError_t ScatterSum<double>(const double*, int64_t, const int32_t*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t, double*, cudaStream_t);

}  // namespace trainsup::sparse::cuda
