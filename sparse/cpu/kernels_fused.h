// Internal to the CPU kernels: the two inner loops of the fused
// gather-GEMM-scatter convolutions, one table per instruction set.
// kernels.cc runs the row ranges, the row groups of the weight gradient
// and the fixed-order reductions around them, the same for every set; each
// set's file provides the register tiles. A set's functions may be called
// only where the CPU supports it (Avx2Supported() etc.): they are compiled
// with a target attribute, so the rest of the build stays baseline x86-64.
#ifndef TRAINSUP_SPARSE_CPU_KERNELS_FUSED_H_
#define TRAINSUP_SPARSE_CPU_KERNELS_FUSED_H_

#include <cstdint>
#include <cstring>

namespace trainsup::sparse::cpu::fused {

struct TileKernels {
  // out[oidx[p], :] += a[aidx[p], :] @ w for p in [0, n): a is acols wide,
  // w is acols x ocols (row-major), out is ocols wide. Within the call every
  // oidx is unique. The sum over a's columns runs in column order, so the
  // result depends on the operands alone.
  void (*gather_gemm_scatter)(const float* a, int64_t acols, const int32_t* aidx, const float* w,
                              float* out, int64_t ocols, const int32_t* oidx, int64_t n);
  // dw[acols x gcols] += a[aidx]^T @ g[gidx] over pairs [0, n), the pairs
  // summed in order in fixed blocks.
  void (*gather_outer)(const float* a, int64_t acols, const int32_t* aidx, const float* g,
                       int64_t gcols, const int32_t* gidx, int64_t n, float* dw);
};

// AVX-512F (kernels_avx512.cc): 16-float vectors, 32 registers.
bool Avx512Supported();
const TileKernels& Avx512TileKernels();

// AVX2 + FMA (kernels_avx2.cc): 8-float vectors, 16 registers.
bool Avx2Supported();
const TileKernels& Avx2TileKernels();

// dst[i, :] = src[rows[i], :] for i in [0, n).
template <typename T>
void GatherRows(const T* src, int64_t cols, const int32_t* rows, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * cols, src + static_cast<int64_t>(rows[i]) * cols, cols * sizeof(T));
  }
}

}  // namespace trainsup::sparse::cpu::fused

#endif  // TRAINSUP_SPARSE_CPU_KERNELS_FUSED_H_
