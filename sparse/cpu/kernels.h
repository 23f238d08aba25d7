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

// bfloat16 convolutions on AVX-512 BF16 (VDPBF16PS) tiles: the operands
// bf16 (raw 16-bit patterns), each product exact in float32, the sums over
// channels and kernel offsets float32 in a fixed order (independent of the
// thread count), each result rounded to bf16 once. Sorted pair lists only.
// Whether this CPU has them (AVX-512F and AVX512_BF16):
bool Bf16KernelsSupported();
// When they are used: kOn and kOff as said; kMeasured (the default) where
// their dot products are at least kBf16MinSpeed times as fast as float32
// FMAs, measured once per process at the first use
// (fused::MeasureBf16DotOverFma). Where they are not, the float32 tiles on
// converted copies are faster, however much conversion they cost.
enum class Bf16Mode { kMeasured, kOn, kOff };
constexpr double kBf16MinSpeed = 0.9;
// The start-up mode: `variable` (TRAINSUP_BF16_KERNELS, TRAINSUP_AMX) =
// 1 (kOn), 0 (kOff), auto or unset (kMeasured); another value throws
// c10::Error naming the variable and the choices.
Bf16Mode Bf16ModeFromString(const char* value, const char* variable = "TRAINSUP_BF16_KERNELS");
// Sets the mode (benchmarks' A/B runs, tests); returns the previous one.
Bf16Mode SetBf16Mode(Bf16Mode mode);
// The measured speed of the bf16 dot products over float32 FMAs (0
// without AVX512_BF16), measured at the first call.
double Bf16DotSpeed();
// On CPUs with AMX-BF16 (Intel Sapphire Rapids on), the bf16 kernels run
// on AMX tiles (fused::AmxBf16TileKernels) instead of AVX512_BF16 ones when
// the AMX mode says so: TRAINSUP_AMX = 1, 0 or auto (the default: where
// their convolution entry measures at least kBf16MinSpeed times as fast
// as the float32 tiles', AmxSpeed()). In the measured bf16 mode the AMX
// tiles count as fast enough on their own, whatever the AVX512_BF16 dot
// products measure. Either way they run only where they agree with the
// emulated instructions (fused::AmxAgreesWithEmulation, checked once);
// with 0 no AMX instruction runs at all.
Bf16Mode SetAmxMode(Bf16Mode mode);
// Measured at the first call; 0 without usable AMX-BF16.
double AmxSpeed();
// Whether the AMX tiles are the bf16 tiles in use when Bf16KernelsActive().
bool AmxTilesActive();
// Whether bf16 convolutions run on them now: supported, the avx512 set
// active, and the mode says so. Otherwise bf16 takes the convert-to-fp32
// path (float32 kernels on converted copies).
bool Bf16KernelsActive();
// For the precision line: " with AVX512_BF16" or " with AMX_BF16" where
// they run, why not where the CPU has them (e.g. " (AVX512_BF16 unused:
// its dot products run at 0.49x the float32 FMA rate here)"), "" where it
// does not.
std::string DescribeBf16Kernels();
// ConvForward and ConvBackward below, in bf16; callable when
// Bf16KernelsActive() and pairs.sorted (else c10::Error).
// ConvForwardBf16 adds `bias` (float32 [cout], or null) to each sum before
// its rounding.
void ConvForwardBf16(const uint16_t* in, int64_t cin, const uint16_t* weight, int64_t cout,
                     const PairLists& pairs, uint16_t* out, int64_t num_out,
                     const float* bias = nullptr);
void ConvBackwardBf16(const uint16_t* in, int64_t num_in, int64_t cin, const uint16_t* weight,
                      int64_t cout, const PairLists& pairs, const uint16_t* grad_out,
                      uint16_t* grad_in, uint16_t* grad_weight);

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
