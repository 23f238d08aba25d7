// bfloat16 convolution tiles on AMX (Intel Sapphire Rapids on): the
// Bf16TileKernels entries of kernels_fused.h on tile registers.
//
// Every tile used is 16 rows of 64 bytes: a C tile holds 16 x 16 float32
// sums, an A tile 16 rows of 32 bf16 values of the reduction, a B tile 16
// pair rows of 16 columns (the pair-packed layout of kernels_fused.h is
// AMX's B layout). One TDPBF16PS adds A . B to C: 16 x 16 x 32
// multiply-adds. A pass keeps up to four C tiles (64 output columns) in
// registers over the whole reduction, with one A tile and two B tiles in
// turn: tiles 0-3 are C, 4 is A, 5 and 6 are B.
//
// The drivers are templates over the tile operations, instantiated twice:
// on the hardware (HardwareTiles: inline assembly, so the file needs no
// AMX compiler flags and runs its checks on any CPU) and on an emulation
// of each instruction in C++ (EmulatedTiles), which the tests run on every
// machine. No machine these kernels were written on had AMX: the hardware
// instantiation has been compiled and assembled, not run (docs/engine.md).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "c10/util/Exception.h"
#include "sparse/cpu/kernels_fused.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TRAINSUP_HAVE_AMX_ASM 1
#endif

namespace trainsup::sparse::cpu::fused {
namespace {

constexpr int kTileRows = 16;
constexpr int64_t kTileK = 32;  // bf16 values of the reduction per A row
constexpr int kTileCols = 16;   // float32 sums per C row
constexpr int kGroup = 4;       // C tiles per pass
constexpr int kTileBytes = 64;

// The 64-byte operand of LDTILECFG (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// Tiles 0-6, each 16 rows of 64 bytes.
const TileConfig& Config() {
  static const TileConfig config = [] {
    TileConfig c;
    for (int t = 0; t < 7; ++t) {
      c.rows[t] = kTileRows;
      c.colsb[t] = kTileBytes;
    }
    return c;
  }();
  return config;
}

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// ---- the tile operations ----

#if TRAINSUP_HAVE_AMX_ASM
// The instructions themselves, as inline assembly (AT&T operand order:
// sources first). The loads and stores clobber memory, so the compiler
// keeps the buffers they read written and reads what they wrote.
struct HardwareTiles {
  static void Configure(const TileConfig& config) { asm volatile("ldtilecfg %0" ::"m"(config)); }
  static void Release() { asm volatile("tilerelease" ::: "memory"); }
  template <int T>
  static void Zero() {
    asm volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  template <int T>
  static void Load(const void* base, int64_t stride) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  static void Store(void* base, int64_t stride) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  // C += A . B
  template <int C, int A, int B>
  static void Dot() {
    asm volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(B), "i"(A), "i"(C));
  }
};
#endif

float Bf16ToFloatDaz(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;  // denormal: zero of its sign
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

float FlushDenormal(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Each instruction after Intel's definition, on tiles in thread-local
// memory; a use the hardware would fault on (no configuration, shapes
// that do not chain) throws instead.
struct EmulatedTiles {
  struct State {
    TileConfig config;
    bool configured = false;
    uint8_t data[8][kTileRows][kTileBytes] = {};
  };
  static State& Checked(int t) {
    static thread_local State state;
    TORCH_CHECK(t < 8 && (state.configured || t < 0), "emulated AMX: tile ", t,
                " used without a tile configuration");
    TORCH_CHECK(t < 0 || (state.config.rows[t] > 0 && state.config.colsb[t] > 0),
                "emulated AMX: tile ", t, " is not configured");
    return state;
  }
  static void Configure(const TileConfig& config) {
    State& s = Checked(-1);
    s.config = config;
    s.configured = true;
    std::memset(s.data, 0, sizeof s.data);
  }
  static void Release() { Checked(-1).configured = false; }
  template <int T>
  static void Zero() {
    std::memset(Checked(T).data[T], 0, sizeof(State::data[T]));
  }
  template <int T>
  static void Load(const void* base, int64_t stride) {
    State& s = Checked(T);
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(s.data[T][r], static_cast<const uint8_t*>(base) + r * stride, s.config.colsb[T]);
    }
  }
  template <int T>
  static void Store(void* base, int64_t stride) {
    State& s = Checked(T);
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, s.data[T][r], s.config.colsb[T]);
    }
  }
  // TDPBF16PS as the SDM defines it: for each row m of C and column n,
  // two float32 sums from zero, one over the pairs' first products
  // A[m][2k] B[k][2n] and one over their second, each step a fused
  // multiply-add, then C[m][n] += (first + second). Denormal inputs read
  // as zero, denormal results flushed, round to nearest even throughout.
  template <int C, int A, int B>
  static void Dot() {
    State& s = Checked(C);
    Checked(A);
    Checked(B);
    const TileConfig& c = s.config;
    TORCH_CHECK(c.rows[C] == c.rows[A] && c.colsb[A] == 4 * c.rows[B] && c.colsb[C] == c.colsb[B],
                "emulated AMX: TDPBF16PS on tiles whose shapes do not chain");
    for (int m = 0; m < c.rows[C]; ++m) {
      float first[kTileCols] = {}, second[kTileCols] = {}, sum[kTileCols];
      std::memcpy(sum, s.data[C][m], c.colsb[C]);
      for (int k = 0; k < c.colsb[A] / 4; ++k) {
        uint16_t a[2];
        std::memcpy(a, s.data[A][m] + 4 * k, sizeof a);
        for (int n = 0; n < c.colsb[C] / 4; ++n) {
          uint16_t b[2];
          std::memcpy(b, s.data[B][k] + 4 * n, sizeof b);
          first[n] = FlushDenormal(std::fmaf(Bf16ToFloatDaz(a[0]), Bf16ToFloatDaz(b[0]), first[n]));
          second[n] =
              FlushDenormal(std::fmaf(Bf16ToFloatDaz(a[1]), Bf16ToFloatDaz(b[1]), second[n]));
        }
      }
      for (int n = 0; n < c.colsb[C] / 4; ++n) {
        sum[n] = FlushDenormal(sum[n] + FlushDenormal(first[n] + second[n]));
      }
      std::memcpy(s.data[C][m], sum, c.colsb[C]);
    }
  }
};

// ---- the drivers ----

// C tiles 0..NB-1 = A rows . the packed matrix's NB column blocks, over
// the reduction [0, kpad) in steps of 32: A from `a` (16 rows, `astride`
// bytes apart), B from `b` (pair rows `bstride` bytes apart). With `c`
// set, the C tiles start from it and go back there (`cstride` bytes per
// row); otherwise they start from zero and go to `out`.
template <class Ops, int NB>
void Pass(const uint16_t* a, int64_t astride, const uint16_t* b, int64_t bstride, int64_t kpad,
          bool from_out, float* out, int64_t ostride) {
  auto for_tiles = [&](auto&& f) {
    f(std::integral_constant<int, 0>());
    if constexpr (NB > 1) f(std::integral_constant<int, 1>());
    if constexpr (NB > 2) f(std::integral_constant<int, 2>());
    if constexpr (NB > 3) f(std::integral_constant<int, 3>());
  };
  for_tiles([&](auto j) {
    constexpr int kC = decltype(j)::value;
    if (from_out) {
      Ops::template Load<kC>(out + kTileCols * kC, ostride);
    } else {
      Ops::template Zero<kC>();
    }
  });
  const int64_t pair_row = bstride / static_cast<int64_t>(sizeof(uint16_t));
  for (int64_t k0 = 0; k0 < kpad; k0 += kTileK) {
    Ops::template Load<4>(a + k0, astride);
    const uint16_t* bk = b + (k0 / 2) * pair_row;
    for_tiles([&](auto j) {
      constexpr int kC = decltype(j)::value, kB = 5 + kC % 2;
      Ops::template Load<kB>(bk + 2 * kTileCols * kC, bstride);
      Ops::template Dot<kC, 4, kB>();
    });
  }
  for_tiles([&](auto j) {
    constexpr int kC = decltype(j)::value;
    Ops::template Store<kC>(out + kTileCols * kC, ostride);
  });
}

template <class Ops>
void PassOf(int nb, const uint16_t* a, int64_t astride, const uint16_t* b, int64_t bstride,
            int64_t kpad, bool from_out, float* out, int64_t ostride) {
  switch (nb) {
    case 1:
      return Pass<Ops, 1>(a, astride, b, bstride, kpad, from_out, out, ostride);
    case 2:
      return Pass<Ops, 2>(a, astride, b, bstride, kpad, from_out, out, ostride);
    case 3:
      return Pass<Ops, 3>(a, astride, b, bstride, kpad, from_out, out, ostride);
    default:
      return Pass<Ops, 4>(a, astride, b, bstride, kpad, from_out, out, ostride);
  }
}

// Bf16TileKernels::gather_gemm_scatter: 16 pairs at a time, their input
// rows gathered into a block zero-padded to a multiple of 32 columns (the
// packed weight's rows are padded alike: row_multiple 32), each group of
// up to 64 output columns one pass, whose sums are added to the output
// rows.
template <class Ops>
void GatherGemmScatter(const uint16_t* a, int64_t acols, const int32_t* aidx, const uint16_t* wp,
                       float* out, int64_t ocols, const int32_t* oidx, int64_t n) {
  const int64_t kpad = RoundUp(acols, kTileK);
  const int64_t blocks = Cols16(ocols) / kTileCols;
  const int64_t bstride = 2 * Cols16(ocols) * static_cast<int64_t>(sizeof(uint16_t));
  static thread_local std::vector<uint16_t> rows_storage;
  rows_storage.assign(static_cast<size_t>(kTileRows * kpad), uint16_t{0});
  uint16_t* rows = rows_storage.data();
  alignas(64) float sums[kTileRows][kGroup * kTileCols];
  Ops::Configure(Config());
  for (int64_t p0 = 0; p0 < n; p0 += kTileRows) {
    const int m = static_cast<int>(std::min<int64_t>(kTileRows, n - p0));
    // Rows past m keep an earlier block's values: their sums are dropped.
    for (int r = 0; r < m; ++r) {
      std::memcpy(rows + r * kpad, a + static_cast<int64_t>(aidx[p0 + r]) * acols,
                  static_cast<size_t>(acols) * sizeof(uint16_t));
    }
    for (int64_t v0 = 0; v0 < blocks; v0 += kGroup) {
      const int nb = static_cast<int>(std::min<int64_t>(kGroup, blocks - v0));
      PassOf<Ops>(nb, rows, kpad * static_cast<int64_t>(sizeof(uint16_t)), wp + 2 * kTileCols * v0,
                  bstride, kpad, false, &sums[0][0], sizeof sums[0]);
      const int64_t c0 = kTileCols * v0;
      const int64_t width = std::min<int64_t>(ocols - c0, int64_t{kTileCols} * nb);
      for (int r = 0; r < m; ++r) {
        float* o = out + static_cast<int64_t>(oidx[p0 + r]) * ocols + c0;
        for (int64_t j = 0; j < width; ++j) o[j] += sums[r][j];
      }
    }
  }
  Ops::Release();
}

// Bf16TileKernels::gather_outer: blocks of 256 pairs; each block's input
// values transposed (a row per input column, the pairs along it, zero past
// the block's pairs, rows padded to 16) and its output gradients
// pair-packed (the pairs as the reduction); every 16 x 64 tile group of
// the padded float32 sums passes over the block. The sums go to dw at the
// end.
template <class Ops>
void GatherOuter(const uint16_t* a, int64_t acols, const int32_t* aidx, const uint16_t* g,
                 int64_t gcols, const int32_t* gidx, int64_t n, float* dw) {
  constexpr int64_t kPairBlock = 256;
  const int64_t mpad = RoundUp(acols, kTileRows);
  const int64_t gpad = Cols16(gcols);
  const int64_t blocks = gpad / kTileCols;
  static thread_local std::vector<uint16_t> at_storage, gp_storage;
  static thread_local std::vector<float> sums_storage;
  at_storage.assign(static_cast<size_t>(mpad * kPairBlock), uint16_t{0});
  gp_storage.assign(static_cast<size_t>(kPairBlock * gpad), uint16_t{0});
  sums_storage.assign(static_cast<size_t>(mpad * gpad), 0.0f);
  uint16_t* at = at_storage.data();
  uint16_t* gp = gp_storage.data();
  float* sums = sums_storage.data();
  Ops::Configure(Config());
  for (int64_t p0 = 0; p0 < n; p0 += kPairBlock) {
    const int64_t m = std::min(kPairBlock, n - p0), steps = RoundUp(m, kTileK);
    for (int64_t q = 0; q < steps; ++q) {
      uint16_t* grow = gp + (q / 2) * 2 * gpad + q % 2;
      if (q < m) {
        const uint16_t* ar = a + static_cast<int64_t>(aidx[p0 + q]) * acols;
        const uint16_t* gr = g + static_cast<int64_t>(gidx[p0 + q]) * gcols;
        for (int64_t i = 0; i < acols; ++i) at[i * kPairBlock + q] = ar[i];
        for (int64_t j = 0; j < gcols; ++j) grow[2 * j] = gr[j];
      } else {  // past the pairs: zero in both operands
        for (int64_t i = 0; i < acols; ++i) at[i * kPairBlock + q] = 0;
        for (int64_t j = 0; j < gcols; ++j) grow[2 * j] = 0;
      }
    }
    for (int64_t i0 = 0; i0 < mpad; i0 += kTileRows) {
      for (int64_t v0 = 0; v0 < blocks; v0 += kGroup) {
        const int nb = static_cast<int>(std::min<int64_t>(kGroup, blocks - v0));
        PassOf<Ops>(nb, at + i0 * kPairBlock, kPairBlock * static_cast<int64_t>(sizeof(uint16_t)),
                    gp + 2 * kTileCols * v0, 2 * gpad * static_cast<int64_t>(sizeof(uint16_t)),
                    steps, true, sums + i0 * gpad + kTileCols * v0,
                    gpad * static_cast<int64_t>(sizeof(float)));
      }
    }
  }
  Ops::Release();
  for (int64_t i = 0; i < acols; ++i) {
    for (int64_t j = 0; j < gcols; ++j) dw[i * gcols + j] += sums[i * gpad + j];
  }
}

// Round to nearest, ties to even, a NaN quiet and a denormal input zero,
// as VCVTNEPS2BF16.
void ToBf16Scalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
      continue;
    }
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    u += 0x7fffu + ((u >> 16) & 1u);
    dst[i] = static_cast<uint16_t>(u >> 16);
  }
}

}  // namespace

const Bf16TileKernels& EmulatedAmxBf16TileKernels() {
  static const Bf16TileKernels kernels{"AMX_BF16 (emulated)", kTileK,
                                       GatherGemmScatter<EmulatedTiles>, GatherOuter<EmulatedTiles>,
                                       ToBf16Scalar};
  return kernels;
}

bool Bf16TilesAgree(const Bf16TileKernels& tiles, const Bf16TileKernels& reference) {
  // Fixed pseudo-random bf16 values in [-2, 2), normal (no denormals).
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    const float f = static_cast<float>(state >> 8) / 4194304.0f - 2.0f;  // [-2, 2)
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return static_cast<uint16_t>((u >> 16) | 0x0080u);  // nonzero exponent
  };
  constexpr int64_t kIn = 40, kOut = 40, kN = 37, kOuterN = 300, kRowsIn = 50, kRowsOut = 300;
  std::vector<uint16_t> a(kRowsIn * kIn), g(kRowsOut * kOut), w(kIn * kOut);
  for (uint16_t& v : a) v = next();
  for (uint16_t& v : g) v = next();
  for (uint16_t& v : w) v = next();
  std::vector<int32_t> aidx(kOuterN), oidx(kOuterN);
  for (int64_t p = 0; p < kOuterN; ++p) {
    aidx[p] = static_cast<int32_t>((p * 7) % kRowsIn);
    oidx[p] = static_cast<int32_t>((p * 11) % kRowsOut);  // distinct: 11 and 300 coprime
  }
  // W pair-packed, rows padded for both.
  const int64_t rows = RoundUp(kIn, std::max(tiles.row_multiple, reference.row_multiple));
  std::vector<uint16_t> wp(rows * Cols16(kOut), 0);
  PackPairsInto(w.data(), kIn, kOut, false, wp.data());
  auto strip_signs = [](std::vector<uint16_t> v) {
    for (uint16_t& x : v) x &= 0x7fffu;
    return v;
  };
  const std::vector<uint16_t> abs_a = strip_signs(a), abs_g = strip_signs(g),
                              abs_wp = strip_signs(wp);
  const Bf16TileKernels& hw = tiles;
  const Bf16TileKernels& em = reference;
  // Within (terms + 2) 2^-24 of the sums of absolute terms (the emulation's
  // on absolute values), as float32 sums of the same terms must be.
  auto agree = [](const std::vector<float>& x, const std::vector<float>& y,
                  const std::vector<float>& bound, int64_t terms) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double tolerance = static_cast<double>(terms + 2) * 0x1p-24 * bound[i] + 1e-30;
      if (!(std::abs(static_cast<double>(x[i]) - y[i]) <= tolerance)) return false;
    }
    return true;
  };
  std::vector<float> out_hw(kRowsOut * kOut, 0.0f), out_em = out_hw, out_abs = out_hw;
  hw.gather_gemm_scatter(a.data(), kIn, aidx.data(), wp.data(), out_hw.data(), kOut, oidx.data(),
                         kN);
  em.gather_gemm_scatter(a.data(), kIn, aidx.data(), wp.data(), out_em.data(), kOut, oidx.data(),
                         kN);
  em.gather_gemm_scatter(abs_a.data(), kIn, aidx.data(), abs_wp.data(), out_abs.data(), kOut,
                         oidx.data(), kN);
  std::vector<float> dw_hw(kIn * kOut, 0.0f), dw_em = dw_hw, dw_abs = dw_hw;
  hw.gather_outer(a.data(), kIn, aidx.data(), g.data(), kOut, oidx.data(), kOuterN, dw_hw.data());
  em.gather_outer(a.data(), kIn, aidx.data(), g.data(), kOut, oidx.data(), kOuterN, dw_em.data());
  em.gather_outer(abs_a.data(), kIn, aidx.data(), abs_g.data(), kOut, oidx.data(), kOuterN,
                  dw_abs.data());
  return agree(out_hw, out_em, out_abs, kIn) && agree(dw_hw, dw_em, dw_abs, kOuterN);
}

double Bf16TilesOverFloat32Tiles(const Bf16TileKernels& bf16, const TileKernels& fp32) {
  // A 64 -> 64 layer's 4,096 pairs over 8,192 rows, every 2nd row.
  constexpr int64_t kChannels = 64, kPairs = 4096, kRows = 2 * kPairs;
  std::vector<float> a(kRows * kChannels), w(kChannels * kChannels), out(kRows * kChannels);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  std::vector<uint16_t> a16(a.size()), w16(w.size()),
      wp(RoundUp(kChannels, bf16.row_multiple) * Cols16(kChannels), 0);
  ToBf16Scalar(a.data(), a16.data(), static_cast<int64_t>(a.size()));
  ToBf16Scalar(w.data(), w16.data(), static_cast<int64_t>(w.size()));
  PackPairsInto(w16.data(), kChannels, kChannels, false, wp.data());
  std::vector<int32_t> rows(kPairs);
  for (int64_t p = 0; p < kPairs; ++p) rows[p] = static_cast<int32_t>(2 * p);
  // The forward entry, then the weight gradient's (the output's rows as
  // the output gradient), as a training step runs both.
  std::vector<float> dw(kChannels * kChannels);
  auto warm_then_fastest = [](const auto& run) {
    run();
    return FastestOfFive(run);
  };
  const double t32 = warm_then_fastest([&] {
    fp32.gather_gemm_scatter(a.data(), kChannels, rows.data(), w.data(), out.data(), kChannels,
                             rows.data(), kPairs);
    fp32.gather_outer(a.data(), kChannels, rows.data(), a.data(), kChannels, rows.data(), kPairs,
                      dw.data());
  });
  const double t16 = warm_then_fastest([&] {
    bf16.gather_gemm_scatter(a16.data(), kChannels, rows.data(), wp.data(), out.data(), kChannels,
                             rows.data(), kPairs);
    bf16.gather_outer(a16.data(), kChannels, rows.data(), a16.data(), kChannels, rows.data(),
                      kPairs, dw.data());
  });
  return t32 / t16;
}

#if TRAINSUP_HAVE_AMX_ASM
bool CpuHasAmxBf16() {
  static const bool has = [] {
    if (!Avx512Bf16Supported()) return false;  // the conversions are AVX-512 BF16's
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((edx & (1u << 22)) == 0 || (edx & (1u << 24)) == 0) return false;  // AMX-BF16, AMX-TILE
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 27)) == 0) return false;
    uint32_t xcr0 = 0, high = 0;
    asm volatile("xgetbv" : "=a"(xcr0), "=d"(high) : "c"(0));
    return (xcr0 & (3u << 17)) == (3u << 17);  // XTILECFG, XTILEDATA enabled
  }();
  return has;
}

bool AmxBf16Supported() {
  static const bool supported = [] {
    if (!CpuHasAmxBf16()) return false;
    // Linux (5.16 on) hands AMX's 8 KiB of state to a process that asks.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return supported;
}

const Bf16TileKernels& AmxBf16TileKernels() {
  static const Bf16TileKernels kernels{"AMX_BF16", kTileK, GatherGemmScatter<HardwareTiles>,
                                       GatherOuter<HardwareTiles>, Avx512Bf16TileKernels().to_bf16};
  return kernels;
}

bool AmxAgreesWithEmulation() {
  return AmxBf16Supported() && Bf16TilesAgree(AmxBf16TileKernels(), EmulatedAmxBf16TileKernels());
}

double MeasureAmxOverFloat32Tiles() {
  return AmxBf16Supported() ? Bf16TilesOverFloat32Tiles(AmxBf16TileKernels(), Avx512TileKernels())
                            : 0.0;
}
#else
bool CpuHasAmxBf16() { return false; }
bool AmxBf16Supported() { return false; }
bool AmxAgreesWithEmulation() { return false; }
double MeasureAmxOverFloat32Tiles() { return 0.0; }
const Bf16TileKernels& AmxBf16TileKernels() {
  static const Bf16TileKernels kernels{"AMX_BF16", kTileK, nullptr, nullptr, nullptr};
  return kernels;
}
#endif

}  // namespace trainsup::sparse::cpu::fused
