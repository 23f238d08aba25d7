// CUDA kernels of the engine: raw device pointers, launched on a given
// stream, no LibTorch. Internal to sparse/; sparse/cuda/backend.cc calls
// them with tensors' pointers and LibTorch's current stream. Each launcher
// returns the launch's error (cudaSuccess, or the error of an invalid
// launch); errors of the kernel itself surface at the next synchronising
// call, as with any CUDA launch.
//
// NONE OF THIS HAS RUN ON A GPU: it is compiled with nvcc by a test on a
// machine without one (tests/sparse/CMakeLists.txt, cuda_kernels_compile)
// and waits for tests/gpu/run.sh.
//
// Determinism: no kernel here uses atomics. Every output element is
// written by one thread, and the sums a thread forms run in a fixed order
// (offset order), so results do not depend on scheduling.
#ifndef TRAINSUP_SPARSE_CUDA_KERNELS_H_
#define TRAINSUP_SPARSE_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trainsup::sparse::cuda {

// Kernel-map search over sorted keys. Keys are int64 with the top bit
// flipped (kDeviceKeyBias in coordinate_manager.h), ascending. For lookup
// offset k in [0, lookups) and output position p in [0, n_out): the target
// is out_keys[p] + delta[k] when every field of the key stays in
// [0, 2^field_bits) after adding fields[3k..3k+2] (else no target); a
// binary search over in_keys finds it or not. Writes match[k * n_out + p]
// = its position in in_keys, and, when `mirror` (one set, odd kernel) and
// k != volume / 2, match[(volume - 1 - k) * n_out + j] = p for the found
// position j (offset -k from v finds u). `match` ([volume, n_out] int32)
// must be -1 on entry; entries without a pair stay -1. fields: int64
// [3 * volume] per-axis shifts, delta: int64 [volume] packed shifts.
cudaError_t KernelMapSearch(const int64_t* in_keys, int64_t n_in, const int64_t* out_keys,
                            int64_t n_out, const int64_t* fields, const int64_t* delta,
                            int field_bits, int64_t lookups, int64_t volume, bool mirror,
                            int32_t* match, cudaStream_t stream);

// inverse[k * rows + row[p]] = p for every pair p of every offset k, where
// offset k's pairs are [begin[k], begin[k + 1]) (begin: int64 [volume + 1]
// on the device). Rows are unique within an offset. `inverse` ([volume,
// rows] int32) must be -1 on entry.
cudaError_t InvertPairs(const int32_t* row, const int64_t* begin, int64_t volume, int64_t pairs,
                        int64_t rows, int32_t* inverse, cudaStream_t stream);

// dst[i, :] = src[rows[i], :] for i in [0, n); rows of `cols` values.
template <typename T>
cudaError_t GatherRows(const T* src, int64_t cols, const int32_t* rows, int64_t n, T* dst,
                       cudaStream_t stream);

// For every output row r and column c: out[r, c] += sum over offsets k in
// [k0, k1), k != skip, in increasing k, of buffer[p - base, c] with p =
// inverse[k * rows + r] (offsets without a pair for r add nothing). The
// sum runs in one thread per element, left to right: the result is the
// offsets' products added to `out` one offset after another.
template <typename T>
cudaError_t ScatterSum(const T* buffer, int64_t cols, const int32_t* inverse, int64_t rows,
                       int64_t k0, int64_t k1, int64_t skip, int64_t base, T* out,
                       cudaStream_t stream);

}  // namespace trainsup::sparse::cuda

#endif  // TRAINSUP_SPARSE_CUDA_KERNELS_H_
