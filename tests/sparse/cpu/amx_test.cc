// The AMX-BF16 tiles of the cpu backend (sparse/cpu/kernels_amx.cc): one
// call of each driver on the emulated tile instructions against a scalar
// reference on every machine, and on the hardware where the CPU has AMX;
// the start-up agreement check; the measured choice and the precision
// line. The convolution-level bf16 tests, which run on the emulated tiles
// too, are in kernels_test.cc.
#include <c10/core/Device.h>
#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sparse/cpu/kernels.h"
#include "sparse/cpu/kernels_fused.h"
#include "sparse/ops.h"

namespace trainsup::sparse {
namespace {

// ---- the AMX drivers, call by call ----
//
// One call of gather_gemm_scatter and of gather_outer against a scalar
// reference, over reduction widths, output widths and pair counts around
// the tiles' 16 rows, 32-value reduction steps, 16-column blocks, 4-block
// passes and the weight gradient's 256-pair blocks. The emulated tiles add
// the same products in the same order as the reference (AddInTileOrder:
// the reduction from zero in the instruction's order, then once into the
// output), so they must match it bit for bit: that holds the gathers, the zero padding, the packing
// and the scatters exactly. The hardware tiles (on an AMX machine) are held to the float32-sum
// bound, since how the hardware rounds inside an instruction is its own.
struct TileCase {
  int64_t acols, ocols, n;
};
const TileCase kTileCases[] = {{3, 5, 1},    {17, 16, 15},  {32, 20, 16},  {33, 64, 17},
                               {70, 65, 40}, {8, 130, 300}, {64, 33, 513}, {96, 256, 64}};

float Bf16Value(uint16_t bits) {
  c10::BFloat16 b;
  b.x = bits;
  return static_cast<float>(b);
}

std::vector<uint16_t> RandomBf16(int64_t count, std::mt19937* rng) {
  std::normal_distribution<float> normal;
  std::vector<uint16_t> v(static_cast<size_t>(count));
  for (uint16_t& x : v) x = c10::BFloat16(normal(*rng)).x;
  return v;
}

// `count` distinct rows of [0, rows) in random order (rows >= count).
std::vector<int32_t> DistinctRows(int64_t count, int64_t rows, std::mt19937* rng) {
  std::vector<int32_t> all(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) all[i] = static_cast<int32_t>(i);
  std::shuffle(all.begin(), all.end(), *rng);
  all.resize(static_cast<size_t>(count));
  return all;
}

// W [rows x cols] pair-packed (kernels_fused.h), rows padded to `multiple`.
std::vector<uint16_t> PackForTiles(const std::vector<uint16_t>& w, int64_t rows, int64_t cols,
                                   int64_t multiple) {
  const int64_t padded = (rows + multiple - 1) / multiple * multiple;
  std::vector<uint16_t> p(static_cast<size_t>(padded * cpu::fused::Cols16(cols)), 0);
  cpu::fused::PackPairsInto(w.data(), rows, cols, false, p.data());
  return p;
}

// What a call should leave in a float32 array: each element's start plus
// its terms summed in the tiles' order in float32 (`in_order`), the same
// sum in float64 (`exact`), and the sum of the absolute terms and the
// result (`abs`, for the bound).
struct Expected {
  std::vector<float> in_order;
  std::vector<double> exact, abs;
};

Expected StartingFrom(const std::vector<float>& start) {
  return {start, std::vector<double>(start.begin(), start.end()),
          std::vector<double>(start.size(), 0.0)};
}

// Adds term(t), t in [0, count), to element e, in the order the emulated
// tiles add them: from zero, in steps of 32 terms (one TDPBF16PS), each
// step's even and odd terms summed apart, then their sum added. The terms
// are products of bf16 values, exact in float32.
template <typename Term>
void AddInTileOrder(int64_t e, int64_t count, const Term& term, Expected* x) {
  float sum = 0.0f;
  double sum64 = 0.0, abs_sum = 0.0;
  for (int64_t t0 = 0; t0 < count; t0 += 32) {
    float even = 0.0f, odd = 0.0f;
    for (int64_t t = t0; t < std::min(count, t0 + 32); ++t) {
      const float v = term(t);
      (t % 2 == 0 ? even : odd) += v;
      sum64 += v;
      abs_sum += std::abs(v);
    }
    sum += even + odd;
  }
  x->in_order[e] += sum;
  x->exact[e] += sum64;
  x->abs[e] = abs_sum + std::abs(x->exact[e]);
}

// Checks `got` bit for bit against the in-order sums when `exact`, else
// against the float64 sums within (terms + 2) * 2^-24 times `abs`.
void ExpectSums(const std::vector<float>& got, const Expected& want, double terms, bool exact,
                const char* what) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = exact ? std::memcmp(&got[i], &want.in_order[i], sizeof(float)) == 0
                          : std::abs(got[i] - want.exact[i]) <=
                                (terms + 2) * std::ldexp(1.0, -24) * want.abs[i] + 1e-30;
    if (!ok && ++bad <= 3) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want "
                    << want.in_order[i] << " (float64 " << want.exact[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

void CheckTileCalls(const cpu::fused::Bf16TileKernels& tiles, bool exact) {
  std::mt19937 rng(7);
  for (const TileCase& c : kTileCases) {
    SCOPED_TRACE("acols " + std::to_string(c.acols) + ", ocols " + std::to_string(c.ocols) +
                 ", n " + std::to_string(c.n));
    const int64_t arows = c.n + 5, orows = c.n + 3;
    const std::vector<uint16_t> a = RandomBf16(arows * c.acols, &rng);
    const std::vector<uint16_t> w = RandomBf16(c.acols * c.ocols, &rng);
    const std::vector<uint16_t> g = RandomBf16(orows * c.ocols, &rng);
    std::vector<int32_t> aidx(static_cast<size_t>(c.n));
    std::uniform_int_distribution<int32_t> any_row(0, static_cast<int32_t>(arows - 1));
    for (int32_t& r : aidx) r = any_row(rng);  // inputs may repeat
    const std::vector<int32_t> oidx = DistinctRows(c.n, orows, &rng);

    // Forward: out[oidx[p]] += a[aidx[p]] @ W, onto nonzero output.
    std::vector<float> out(static_cast<size_t>(orows * c.ocols));
    for (size_t i = 0; i < out.size(); ++i) out[i] = 0.25f * static_cast<float>(i % 7);
    Expected want = StartingFrom(out);
    for (int64_t p = 0; p < c.n; ++p) {
      for (int64_t j = 0; j < c.ocols; ++j) {
        AddInTileOrder(
            oidx[p] * c.ocols + j, c.acols,
            [&](int64_t r) {
              return Bf16Value(a[aidx[p] * c.acols + r]) * Bf16Value(w[r * c.ocols + j]);
            },
            &want);
      }
    }
    const std::vector<uint16_t> wp = PackForTiles(w, c.acols, c.ocols, tiles.row_multiple);
    tiles.gather_gemm_scatter(a.data(), c.acols, aidx.data(), wp.data(), out.data(), c.ocols,
                              oidx.data(), c.n);
    ExpectSums(out, want, static_cast<double>(c.acols + 1), exact, "gather_gemm_scatter");

    // Weight gradient: dw += a[aidx]^T @ g[oidx], onto nonzero dw.
    std::vector<float> dw(static_cast<size_t>(c.acols * c.ocols));
    for (size_t i = 0; i < dw.size(); ++i) dw[i] = -0.5f * static_cast<float>(i % 5);
    Expected dwant = StartingFrom(dw);
    for (int64_t i = 0; i < c.acols; ++i) {
      for (int64_t j = 0; j < c.ocols; ++j) {
        AddInTileOrder(
            i * c.ocols + j, c.n,
            [&](int64_t p) {
              return Bf16Value(a[aidx[p] * c.acols + i]) * Bf16Value(g[oidx[p] * c.ocols + j]);
            },
            &dwant);
      }
    }
    tiles.gather_outer(a.data(), c.acols, aidx.data(), g.data(), c.ocols, oidx.data(), c.n,
                       dw.data());
    ExpectSums(dw, dwant, static_cast<double>(c.n + 1), exact, "gather_outer");
  }
}

TEST(AmxTileCalls, EmulatedMatchTheTileOrderSumsBitForBit) {
  CheckTileCalls(cpu::fused::EmulatedAmxBf16TileKernels(), /*exact=*/true);
}

TEST(AmxTileCalls, HardwareMatchFloat64WithinAFloat32Sum) {
  if (!cpu::fused::AmxBf16Supported()) {
    EXPECT_FALSE(cpu::fused::AmxAgreesWithEmulation());
    GTEST_SKIP() << "this CPU has no AMX-BF16 (or Linux did not grant this process its use)";
  }
  CheckTileCalls(cpu::fused::AmxBf16TileKernels(), /*exact=*/false);
  EXPECT_TRUE(cpu::fused::AmxAgreesWithEmulation());
}

// The start-up check that keeps unverified hardware tiles out of use: two
// independent implementations (the AVX-512 BF16 tiles and the emulated AMX
// ones) agree, and tables that drop a pair do not.
TEST(AmxTileCalls, TheAgreementCheckPassesGoodTilesAndFailsBrokenOnes) {
  const cpu::fused::Bf16TileKernels& emulated = cpu::fused::EmulatedAmxBf16TileKernels();
  EXPECT_TRUE(cpu::fused::Bf16TilesAgree(emulated, emulated));
  if (cpu::Bf16KernelsSupported()) {
    EXPECT_TRUE(cpu::fused::Bf16TilesAgree(cpu::fused::Avx512Bf16TileKernels(), emulated));
  }
  cpu::fused::Bf16TileKernels short_outer = emulated;
  short_outer.gather_outer = [](const uint16_t* a, int64_t acols, const int32_t* aidx,
                                const uint16_t* g, int64_t gcols, const int32_t* gidx, int64_t n,
                                float* dw) {
    cpu::fused::EmulatedAmxBf16TileKernels().gather_outer(a, acols, aidx, g, gcols, gidx, n - 1,
                                                          dw);
  };
  EXPECT_FALSE(cpu::fused::Bf16TilesAgree(short_outer, emulated));
  cpu::fused::Bf16TileKernels short_forward = emulated;
  short_forward.gather_gemm_scatter = [](const uint16_t* a, int64_t acols, const int32_t* aidx,
                                         const uint16_t* wp, float* out, int64_t ocols,
                                         const int32_t* oidx, int64_t n) {
    cpu::fused::EmulatedAmxBf16TileKernels().gather_gemm_scatter(a, acols, aidx, wp, out, ocols,
                                                                 oidx, n - 1);
  };
  EXPECT_FALSE(cpu::fused::Bf16TilesAgree(short_forward, emulated));
}

// The conversion of the emulated tiles rounds as VCVTNEPS2BF16 does: to
// nearest with ties to even, NaN stays NaN.
TEST(AmxTileCalls, EmulatedConversionRoundsToNearestEven) {
  const float in[] = {1.0f,
                      1.00390625f,
                      1.01171875f,
                      -2.5f,
                      3.0e38f,
                      std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()};
  // 1 + 2^-8 is a tie (to 1.0, even); 1 + 3 * 2^-8 a tie up to 1 + 2^-6.
  const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0xc020, 0x7f62, 0x7f80};
  uint16_t got[7];
  cpu::fused::EmulatedAmxBf16TileKernels().to_bf16(in, got, 7);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], want[i]) << in[i];
  EXPECT_TRUE(std::isnan(Bf16Value(got[6])));
  if (cpu::Bf16KernelsSupported()) {
    uint16_t hw[7];
    cpu::fused::Avx512Bf16TileKernels().to_bf16(in, hw, 7);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(hw[i], want[i]) << in[i];
  }
}

// The speed probe the choice of the AMX tiles rests on, on tables this
// machine runs: a positive, finite ratio of two timed calls.
TEST(AmxTileSelection, TheSpeedProbeTimesWholeCalls) {
  if (!cpu::Bf16KernelsSupported()) {
    GTEST_SKIP() << "this CPU has no AVX512_BF16 tiles to time the probe on";
  }
  const double ratio = cpu::fused::Bf16TilesOverFloat32Tiles(cpu::fused::Avx512Bf16TileKernels(),
                                                             cpu::fused::Avx512TileKernels());
  EXPECT_GT(ratio, 0.0);
  EXPECT_TRUE(std::isfinite(ratio)) << ratio;
  if (!cpu::fused::CpuHasAmxBf16()) EXPECT_EQ(cpu::fused::MeasureAmxOverFloat32Tiles(), 0.0);
}

// Where the CPU has AMX-BF16, the measured mode takes its tiles when their
// products measure fast enough, and the precision line names them; the
// switch turns them off. Where it has not, no mode turns them on.
TEST(AmxTileSelection, MeasuredWhereTheCpuHasThemAndNamedInThePrecisionLine) {
  const c10::Device host(c10::DeviceType::CPU);
  const cpu::Bf16Mode amx = cpu::SetAmxMode(cpu::Bf16Mode::kOn);
  if (!cpu::fused::AmxBf16Supported()) {
    EXPECT_FALSE(cpu::AmxTilesActive());
    EXPECT_EQ(cpu::AmxSpeed(), 0.0);
    EXPECT_STRNE(cpu::fused::ActiveBf16Tiles().name, "AMX_BF16");
    cpu::SetAmxMode(amx);
    GTEST_SKIP() << "this CPU has no AMX-BF16: checked only that nothing turns its tiles on";
  }
  const cpu::KernelSet set = cpu::SetKernelSet(cpu::KernelSet::kAvx512);
  const cpu::Bf16Mode mode = cpu::SetBf16Mode(cpu::Bf16Mode::kMeasured);
  cpu::SetAmxMode(cpu::Bf16Mode::kMeasured);
  const double speed = cpu::AmxSpeed();
  EXPECT_GT(speed, 0.0);
  EXPECT_EQ(cpu::AmxTilesActive(), speed >= cpu::kBf16MinSpeed) << speed;
  const std::string line = DescribePrecision(at::kBFloat16, host);
  if (cpu::AmxTilesActive()) {
    EXPECT_TRUE(cpu::Bf16KernelsActive());
    EXPECT_NE(line.find("with AMX_BF16"), std::string::npos) << line;
  } else {
    EXPECT_NE(line.find("AMX_BF16 unused: its convolution tiles run at"), std::string::npos)
        << line;
  }
  cpu::SetAmxMode(cpu::Bf16Mode::kOff);
  EXPECT_FALSE(cpu::AmxTilesActive());
  EXPECT_NE(DescribePrecision(at::kBFloat16, host).find("(AMX_BF16 turned off)"),
            std::string::npos);
  cpu::SetAmxMode(amx);
  cpu::SetBf16Mode(mode);
  cpu::SetKernelSet(set);
}

}  // namespace
}  // namespace trainsup::sparse
