// CPU kernels of the engine: raw-pointer functions over a kernel map's pair
// lists. Internal to sparse/; the autograd functions call them. A CUDA
// backend provides the same functions over device pointers.
#ifndef TRAINSUP_SPARSE_CPU_KERNELS_H_
#define TRAINSUP_SPARSE_CPU_KERNELS_H_

#include <cstdint>

namespace trainsup::sparse::cpu {

// Pairs per kernel offset k: [begin[k], begin[k+1]) of src/dst. Within one
// offset dst rows are unique (scatters never collide) and so are src rows.
struct PairLists {
  const int32_t* src = nullptr;
  const int32_t* dst = nullptr;
  const int64_t* begin = nullptr;
  int64_t volume = 0;
  // Offset `identity_offset` maps row p to row p for every p (the centre of
  // an odd stride-1 kernel in build order); -1 if none. Lets that offset run
  // as one GEMM without gather or scatter.
  int64_t identity_offset = -1;
  // src and dst rows ascend within every offset (both coordinate sets in
  // key order). Then the kernels give each task a range of rows and all
  // offsets at once: one parallel region per call instead of one per
  // offset, and no task writes another's rows.
  bool sorted = false;
};

// Float convolutions over sorted pair lists run fused AVX-512 kernels
// (gather, product and scatter in one pass, no BLAS call) where the CPU
// has AVX-512F, unless TRAINSUP_FUSED=0; otherwise, and for double, they
// gather chunks, call BLAS and scatter. Both give the same sums up to
// rounding, and each is independent of the thread count.
bool FusedKernelsEnabled();
// Overrides the choice for the process (benchmarks' A/B runs, tests of
// both paths); turning it on where the CPU lacks AVX-512F keeps it off.
// Returns the previous setting.
bool SetFusedKernelsEnabled(bool on);

// out[num_out x cout] = sum_k scatter_dst(gather_src(in) @ W_k).
// weight: [volume, cin, cout]. `out` need not be initialised.
template <typename T>
void ConvForward(const T* in, int64_t num_in, int64_t cin, const T* weight, int64_t cout,
                 const PairLists& pairs, T* out, int64_t num_out);

// grad_in (may be null) = sum_k scatter_src(gather_dst(grad_out) @ W_k^T);
// grad_weight (may be null)[k] = gather_src(in)^T @ gather_dst(grad_out).
// Reductions run over fixed blocks of pairs in a fixed order: the result
// does not depend on the number of threads.
template <typename T>
void ConvBackward(const T* in, int64_t num_in, int64_t cin, const T* weight, int64_t cout,
                  const PairLists& pairs, const T* grad_out, int64_t num_out, T* grad_in,
                  T* grad_weight);

// Max pooling: out[num_out x c], argmax[num_out x c] (input row, -1 where
// the window is empty; then out is 0). Ties go to the first offset.
template <typename T>
void MaxPoolForward(const T* in, int64_t c, const PairLists& pairs, T* out, int32_t* argmax,
                    int64_t num_out);
// Adds grad_out into grad_in at the argmax rows, visiting output rows in
// `order` (num_out rows; null: row order), so a shared maximum sums its
// windows' gradients in one fixed order.
template <typename T>
void MaxPoolBackward(const T* grad_out, const int32_t* argmax, int64_t num_out, int64_t c,
                     const int64_t* order, T* grad_in);

// Sum over the window divided by divisor[dst] (1 for sum pooling, the
// window's count for average pooling; 0 counts give 0).
template <typename T>
void WindowSumForward(const T* in, int64_t c, const PairLists& pairs, const T* inv_divisor,
                      T* out, int64_t num_out);
template <typename T>
void WindowSumBackward(const T* grad_out, int64_t c, const PairLists& pairs,
                       const T* inv_divisor, T* grad_in, int64_t num_in);

}  // namespace trainsup::sparse::cpu

#endif  // TRAINSUP_SPARSE_CPU_KERNELS_H_
