// CPU kernels of the engine: raw-pointer functions over a kernel map's pair
// lists. Internal to sparse/; the autograd functions call them. A CUDA
// backend provides the same functions over device pointers.
#ifndef TRAINSUP_SPARSE_CPU_KERNELS_H_
#define TRAINSUP_SPARSE_CPU_KERNELS_H_

#include <cstdint>
#include <string>

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

// The kernels float convolutions over sorted pair lists run: fused
// gather-GEMM-scatter tiles (gather, product and scatter in one pass, no
// BLAS call) for AVX-512F or for AVX2 + FMA, or gather -> BLAS -> scatter.
// Double, 1x1x1 convolutions, zero channels and unsorted pair lists always
// take the BLAS path. The sets give the same sums up to rounding, and each
// is independent of the thread count.
enum class KernelSet { kBlas, kAvx2, kAvx512 };
// "blas", "avx2", "avx512".
std::string ToString(KernelSet set);
// The inverse of ToString; another name throws c10::Error naming `what`
// (e.g. the environment variable it came from) and the expected names.
KernelSet KernelSetFromString(const std::string& name,
                              const std::string& what = "KernelSetFromString");
// Whether this CPU can run `set` (BLAS: always).
bool KernelSetSupported(KernelSet set);
// The fastest set this CPU supports: AVX-512, then AVX2, then BLAS.
KernelSet BestKernelSet();
// The set in use. At start-up: TRAINSUP_KERNELS=avx512|avx2|blas if set
// (a set the CPU lacks gives the fastest one below it; another name throws
// at the first convolution), else BLAS if TRAINSUP_FUSED=0, else
// BestKernelSet().
KernelSet ActiveKernelSet();
// Selects the set for the process (benchmarks' A/B runs, tests of every
// set); a set the CPU cannot run throws c10::Error. Returns the previous.
KernelSet SetKernelSet(KernelSet set);

// The start-up choice as a function of the two variables' values (null:
// unset): what ActiveKernelSet() starts with. Throws for an unknown name.
KernelSet ChooseKernelSet(const char* trainsup_kernels, const char* trainsup_fused);

// Whether a fused set is in use.
bool FusedKernelsEnabled();
// true: BestKernelSet() (BLAS where the CPU has neither AVX-512F nor AVX2);
// false: BLAS. Returns whether a fused set was in use.
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
void WindowSumForward(const T* in, int64_t c, const PairLists& pairs, const T* inv_divisor, T* out,
                      int64_t num_out);
template <typename T>
void WindowSumBackward(const T* grad_out, int64_t c, const PairLists& pairs, const T* inv_divisor,
                       T* grad_in, int64_t num_in);

}  // namespace trainsup::sparse::cpu

#endif  // TRAINSUP_SPARSE_CPU_KERNELS_H_
