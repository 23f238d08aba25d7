// Internal to the CPU kernels: the two inner loops of the fused
// gather-GEMM-scatter convolutions, one table per instruction set.
// kernels.cc runs the row ranges, the row groups of the weight gradient
// and the fixed-order reductions around them, the same for every set; each
// set's file provides the register tiles. A set's functions may be called
// only where the CPU supports it (Avx2Supported() etc.): they are compiled
// with a target attribute, so the rest of the build stays baseline x86-64.
#ifndef TRAINSUP_SPARSE_CPU_KERNELS_FUSED_H_
#define TRAINSUP_SPARSE_CPU_KERNELS_FUSED_H_

#include <algorithm>
#include <chrono>
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

// bfloat16 tiles for AVX-512 BF16 CPUs (kernels_avx512.cc): bf16 operands
// as raw 16-bit patterns, products summed in float32 by VDPBF16PS, two
// reduction steps per instruction. Each product of two bf16 values is
// exact in float32; the sums are float32 additions in a fixed order, so
// results depend on the operands alone.
//
// A "pair-packed" matrix, for a reduction over rows of W [rows x cols]:
// P[r2][j][h] = W[2 r2 + h][j] for r2 in [0, ceil(rows / 2)), j in [0,
// Cols16(cols)) and h in {0, 1}, zero past `rows` or `cols`: 2 * Cols16
// values per r2 (PackPairs, kernels.cc).
inline int64_t Cols16(int64_t cols) { return (cols + 15) / 16 * 16; }

// W [rows x cols] (with `transpose`, W^T of a [cols x rows] W) written
// pair-packed into `packed`, whose other values (the padding) the caller
// has zeroed.
inline void PackPairsInto(const uint16_t* w, int64_t rows, int64_t cols, bool transpose,
                          uint16_t* packed) {
  const int64_t stride = 2 * Cols16(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      packed[(r / 2) * stride + 2 * j + r % 2] = transpose ? w[j * rows + r] : w[r * cols + j];
    }
  }
}

struct Bf16TileKernels {
  // What the precision line calls them ("AVX512_BF16", "AMX_BF16").
  const char* name;
  // The pair-packed weights they read have their rows (the reduction)
  // zero-padded to a multiple of this: 2 for AVX-512 BF16, 32 for AMX,
  // whose tiles reduce over 32 values at a time (PackedSize, kernels.cc).
  int64_t row_multiple;
  // out[oidx[p], :] += a[aidx[p], :] @ W for p in [0, n): a is acols wide
  // (bf16), wp is W [acols x ocols] pair-packed, out is float32, ocols
  // wide. Within the call every oidx is unique.
  void (*gather_gemm_scatter)(const uint16_t* a, int64_t acols, const int32_t* aidx,
                              const uint16_t* wp, float* out, int64_t ocols, const int32_t* oidx,
                              int64_t n);
  // dw[acols x gcols] (float32) += a[aidx]^T @ g[gidx] over pairs [0, n),
  // a and g bf16, the pairs summed two at a time in order, in fixed blocks.
  void (*gather_outer)(const uint16_t* a, int64_t acols, const int32_t* aidx, const uint16_t* g,
                       int64_t gcols, const int32_t* gidx, int64_t n, float* dw);
  // dst[i] = src[i] rounded to bf16 (to nearest, ties to even; NaN stays
  // NaN), i in [0, n).
  void (*to_bf16)(const float* src, uint16_t* dst, int64_t n);
};

// Whether the CPU has AVX-512F and AVX512_BF16 (Intel Cooper Lake and
// Sapphire Rapids on, AMD Zen 4 on).
bool Avx512Bf16Supported();
const Bf16TileKernels& Avx512Bf16TileKernels();
// AMX (kernels_amx.cc): the same entries on AMX-BF16 tiles. Each call
// gathers 16 input rows into a tile-shaped block, multiplies it by the
// packed weight 32 values of the reduction at a time (TDPBF16PS, 16 x 16
// float32 sums per instruction), and adds the sums to the output rows;
// the weight gradient likewise with the pairs as the reduction. The sums
// are float32 in an order fixed by the instruction and the blocking, so
// the results depend on the operands alone, not on the threads.
//
// Whether the CPU has AMX-TILE and AMX-BF16 and the OS has enabled their
// state (CPUID and XCR0 only: no request to the kernel), and the AVX-512
// BF16 tiles (their conversions) are there too.
bool CpuHasAmxBf16();
// CpuHasAmxBf16() and Linux has granted this process AMX's state
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked for at the first call).
bool AmxBf16Supported();
// Callable where AmxBf16Supported().
const Bf16TileKernels& AmxBf16TileKernels();
// The same drivers with each tile instruction carried out by C++ that
// follows the definition in Intel's SDM (TDPBF16PS: per output element,
// the first and the second products of the pairs summed apart by fused
// multiply-adds from zero, then their sum added to the element; denormal
// inputs read as zero, denormal results flushed), and the scalar
// conversion: runs on any CPU. The tests hold the drivers' gathers,
// padding and scatters to a reference through it on every machine; on an
// AMX machine they run the hardware tables as well.
const Bf16TileKernels& EmulatedAmxBf16TileKernels();
// Whether the hardware tiles agree with the emulated ones, within the
// bound on float32 sums of the same terms, on one small call of each
// entry (fixed operands, a few microseconds). The AMX tiles are used only
// where it holds (kernels_bf16.cc), so that a defect in a path no machine
// here could run shows as unused tiles, not as wrong sums. False where
// !AmxBf16Supported().
bool AmxAgreesWithEmulation();
// The check itself, of `tiles` against `reference` (tests hold it to the
// AVX-512 BF16 tiles and to broken tables on any CPU).
bool Bf16TilesAgree(const Bf16TileKernels& tiles, const Bf16TileKernels& reference);
// How much faster the AMX tiles' entries run than the AVX-512 float32
// tiles' on the same layer (64 -> 64 channels, 4,096 pairs; the forward
// and the weight gradient): whole calls, gathers, transposes and scatters
// included, since on AMX those, not the products, may set the time. One
// thread, fastest of five, a few ms; 0 where !AmxBf16Supported().
double MeasureAmxOverFloat32Tiles();
// The measurement for any bf16 and float32 tables (tests run it here).
double Bf16TilesOverFloat32Tiles(const Bf16TileKernels& bf16, const TileKernels& fp32);

// Tests: makes `tiles` the bf16 tiles the cpu backend runs, active on any
// CPU whatever the modes and the kernel set (nullptr: back to the CPU's
// own choice). Returns the previous override.
const Bf16TileKernels* SetBf16TilesOverride(const Bf16TileKernels* tiles);
// The tiles bf16 convolutions run on while Bf16KernelsActive() (kernels.h):
// the override, else AMX where chosen, else AVX-512 BF16.
const Bf16TileKernels& ActiveBf16Tiles();

// The rate of AVX512_BF16 dot products (VDPBF16PS) over that of AVX-512
// float32 FMAs, in flops, on one core, measured now (a few milliseconds;
// the fastest of five runs of each); 0 without AVX512_BF16. Where it is
// under 1 the bf16 tiles are slower than the float32 ones: an Intel Xeon
// (Sapphire Rapids generation) measured 0.49.
double MeasureBf16DotOverFma();
// The probes it times, also fma_peak's: kProbeChains independent chains of
// one instruction (a float32 FMA; a bf16 dot product) in registers, n
// rounds, so the execution units are the only limit. The result depends
// on every chain. Callable where the CPU has the instructions.
constexpr int kProbeChains = 12;
float Avx512FmaChains(long n);
float Avx512Bf16DotChains(long n);
// Seconds of the fastest of five calls of run() (the probes' timing).
template <typename Run>
double FastestOfFive(const Run& run) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// dst[i, :] = src[rows[i], :] for i in [0, n).
template <typename T>
void GatherRows(const T* src, int64_t cols, const int32_t* rows, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * cols, src + static_cast<int64_t>(rows[i]) * cols, cols * sizeof(T));
  }
}

}  // namespace trainsup::sparse::cpu::fused

#endif  // TRAINSUP_SPARSE_CPU_KERNELS_FUSED_H_
