// The fused convolution kernels (float, sorted pair lists), each set the
// CPU supports (AVX-512, AVX2 + FMA), against a float64 reference and
// against the gather-BLAS-scatter path, over shapes that reach every
// register tile of both sets, masked and whole column tails, several column
// blocks and both convolution directions; their results bit for bit
// independent of the thread count and the same in both sets; and the
// choice of the set.
#include "sparse/cpu/kernels.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparse/ops.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::MakeRandomInput;

struct Shape {
  int64_t cin, cout;
  int32_t kernel, stride;
  bool transposed;
};

std::string Describe(const Shape& s) {
  return std::to_string(s.cin) + "->" + std::to_string(s.cout) + " kernel " +
         std::to_string(s.kernel) + " stride " + std::to_string(s.stride) +
         (s.transposed ? " transposed" : "");
}

// Output and input channel counts of 1 to 13 vectors of 16 (1 to 25 of
// 8), with and without a partial last vector; the stem's 3 inputs and
// 5x5x5 window. AVX2 column blocks of 1 (8 and 3 columns), 2 (16, 12) and 3
// vectors (24, 20), masked and whole, several blocks of unequal width (40:
// 3 + 2, 130: five of 3 and one of 2 with 2 lanes); tile rows of 8, 6 and
// 4 with partial tiles (pairs, and input channels in the weight gradient).
const Shape kShapes[] = {
    {3, 32, 5, 1, false},   {16, 20, 3, 1, false},  {32, 32, 3, 2, false}, {64, 96, 3, 1, false},
    {40, 130, 3, 1, false}, {130, 40, 3, 1, false}, {96, 20, 1, 1, false}, {48, 200, 2, 2, false},
    {24, 16, 2, 2, true},   {17, 33, 3, 2, true},   {8, 12, 3, 1, false},  {12, 24, 3, 1, true},
};

struct Result {
  at::Tensor out, grad_features, grad_weight;
};

// One convolution, forward and backward, on rows in key order (sorted pair
// lists), in the features' dtype.
Result ConvForwardBackward(const Shape& s, const at::Tensor& features,
                           const at::Tensor& coordinates, const at::Tensor& weight,
                           const at::Tensor& grad_out_seed) {
  at::Tensor f = features.clone().requires_grad_(true);
  at::Tensor w = weight.clone().requires_grad_(true);
  SparseTensor x(f, coordinates);
  const ConvOptions opt{s.kernel, s.stride, 1};
  SparseTensor y;
  bool sorted = false;
  if (s.transposed) {
    // Down first (no gradient), then the transposed convolution under test.
    SparseTensor coarse =
        Pool(x.WithFeatures(f.detach()), PoolMode::kAverage, {s.stride, s.stride, 1});
    at::Tensor cf = coarse.F().clone().requires_grad_(true);
    f = cf;
    y = ConvTranspose(coarse.WithFeatures(cf), w, at::Tensor(), opt);
    sorted = x.manager()->GetKernelMap(y.set_id(), coarse.set_id(), s.kernel, 1)->rows_sorted;
  } else {
    y = Conv(x, w, at::Tensor(), opt);
    sorted = x.manager()->GetKernelMap(x.set_id(), y.set_id(), s.kernel, 1)->rows_sorted;
  }
  // Only sorted pair lists take the fused kernels.
  EXPECT_TRUE(sorted) << "the map's rows are not in key order";
  at::Tensor g =
      grad_out_seed.slice(0, 0, y.F().size(0)).slice(1, 0, s.cout).to(y.F().scalar_type());
  (y.F() * g).sum().backward();
  return {y.F().detach(), f.grad(), w.grad()};
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(at::kDouble) - want).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// The fused sets this CPU runs: parameterised over these alone, so none is
// skipped for lack of an instruction set (on an AVX2-only CPU the AVX2 set
// runs every test; on AVX-512 CPUs both do).
std::vector<cpu::KernelSet> FusedSets() {
  std::vector<cpu::KernelSet> sets;
  for (cpu::KernelSet s : {cpu::KernelSet::kAvx512, cpu::KernelSet::kAvx2}) {
    if (cpu::KernelSetSupported(s)) sets.push_back(s);
  }
  return sets;
}

class FusedKernels : public ::testing::TestWithParam<cpu::KernelSet> {
 protected:
  void SetUp() override { previous_ = cpu::SetKernelSet(GetParam()); }
  void TearDown() override { cpu::SetKernelSet(previous_); }
  cpu::KernelSet previous_ = cpu::KernelSet::kBlas;
};

TEST_P(FusedKernels, MatchFloat64AndTheBlasPath) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    auto in =
        MakeRandomInput(2, 10, 0.3, s.cin, at::kFloat, 11 + s.cin + s.cout, -5, /*shuffle=*/false);
    const int64_t volume = static_cast<int64_t>(s.kernel) * s.kernel * s.kernel;
    at::Tensor w = at::randn({volume, s.cin, s.cout}) / 8;
    at::Tensor seed = at::randn({in.features.size(0), s.cout});

    ASSERT_EQ(cpu::ActiveKernelSet(), GetParam());
    const Result fused = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
    cpu::SetKernelSet(cpu::KernelSet::kBlas);
    const Result blas = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
    cpu::SetKernelSet(GetParam());
    // float64 takes the BLAS path: the exact reference for both.
    const Result ref = ConvForwardBackward(s, in.features.to(at::kDouble), in.coordinates,
                                           w.to(at::kDouble), seed);

    ASSERT_GT(ref.out.size(0), 0);
    for (const Result* r : {&fused, &blas}) {
      const char* which = r == &fused ? "fused" : "BLAS";
      EXPECT_LT(RelativeError(r->out, ref.out), 1e-5) << which << " forward";
      EXPECT_LT(RelativeError(r->grad_features, ref.grad_features), 1e-5)
          << which << " input gradient";
      EXPECT_LT(RelativeError(r->grad_weight, ref.grad_weight), 1e-5)
          << which << " weight gradient";
    }
    // The two float paths sum in different orders: close, not equal.
    EXPECT_LT(RelativeError(fused.out, blas.out.to(at::kDouble)), 1e-5);
  }
}

TEST_P(FusedKernels, ResultsDoNotDependOnTheThreadCountBitForBit) {
  const int threads = at::get_num_threads();
  for (const Shape& s : {kShapes[3], kShapes[5], kShapes[9], kShapes[10]}) {
    SCOPED_TRACE(Describe(s));
    auto in = MakeRandomInput(2, 12, 0.3, s.cin, at::kFloat, 5, 0, /*shuffle=*/false);
    const int64_t volume = static_cast<int64_t>(s.kernel) * s.kernel * s.kernel;
    at::Tensor w = at::randn({volume, s.cin, s.cout}) / 8;
    at::Tensor seed = at::randn({in.features.size(0), s.cout});
    at::set_num_threads(1);
    const Result one = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
    for (int n : {2, 3}) {
      at::set_num_threads(n);
      const Result many = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
      EXPECT_TRUE(at::equal(one.out, many.out)) << n << " threads, forward";
      EXPECT_TRUE(at::equal(one.grad_features, many.grad_features))
          << n << " threads, input gradient";
      EXPECT_TRUE(at::equal(one.grad_weight, many.grad_weight)) << n << " threads, weight gradient";
    }
  }
  at::set_num_threads(threads);
}

// No channels in or out: empty results, no crash (the column blocking
// would divide by zero).
TEST_P(FusedKernels, ZeroChannelsGiveEmptyResults) {
  auto in = MakeRandomInput(1, 8, 0.3, 4, at::kFloat, 2, 0, /*shuffle=*/false);
  for (auto [cin, cout] : {std::pair<int64_t, int64_t>{4, 0}, {0, 4}}) {
    at::Tensor f = in.features.slice(1, 0, cin).clone().requires_grad_(true);
    at::Tensor w = at::randn({27, cin, cout}).requires_grad_(true);
    SparseTensor y = Conv(SparseTensor(f, in.coordinates), w, at::Tensor(), {3, 1, 1});
    EXPECT_EQ(y.F().size(1), cout);
    EXPECT_EQ(y.F().abs().sum().item<double>(), 0.0);  // a sum over no input channels is 0
    (y.F().sum() + w.sum() * 0).backward();
    EXPECT_EQ(f.grad().sizes(), f.sizes());
    EXPECT_EQ(w.grad().sizes(), w.sizes());
  }
}

TEST_P(FusedKernels, TheSwitchSelectsThePath) {
  // The two paths round differently; if the switch did nothing, a large
  // sum would come out bit-identical.
  const Shape s{64, 96, 3, 1, false};
  auto in = MakeRandomInput(1, 14, 0.4, s.cin, at::kFloat, 9, 0, /*shuffle=*/false);
  at::Tensor w = at::randn({27, s.cin, s.cout});
  at::Tensor seed = at::randn({in.features.size(0), s.cout});
  cpu::SetKernelSet(cpu::KernelSet::kBlas);
  EXPECT_FALSE(cpu::FusedKernelsEnabled());
  const Result blas = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
  cpu::SetKernelSet(GetParam());
  EXPECT_TRUE(cpu::FusedKernelsEnabled());
  const Result fused = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
  EXPECT_FALSE(at::equal(blas.grad_weight, fused.grad_weight));
}

INSTANTIATE_TEST_SUITE_P(SupportedSets, FusedKernels, ::testing::ValuesIn(FusedSets()),
                         [](const ::testing::TestParamInfo<cpu::KernelSet>& info) {
                           return cpu::ToString(info.param);
                         });
// A CPU with neither AVX-512F nor AVX2 has no fused set to test.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FusedKernels);

// The fused sets sum every output element over the same terms in the same
// order (one product per pair, input channels in order, pairs in order
// within fixed blocks), with fused multiply-adds: their results are equal
// bit for bit, so which set a CPU has does not change a training run.
// Parameterised over the supported sets wider than AVX2, each compared
// with AVX2 (none on an AVX2-only CPU, where nothing is to compare).
class FusedSetsAgree : public ::testing::TestWithParam<cpu::KernelSet> {};

TEST_P(FusedSetsAgree, WithAvx2BitForBit) {
  const cpu::KernelSet previous = cpu::ActiveKernelSet();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    auto in = MakeRandomInput(2, 10, 0.3, s.cin, at::kFloat, 3 + s.cin, 0, /*shuffle=*/false);
    const int64_t volume = static_cast<int64_t>(s.kernel) * s.kernel * s.kernel;
    at::Tensor w = at::randn({volume, s.cin, s.cout}) / 8;
    at::Tensor seed = at::randn({in.features.size(0), s.cout});
    cpu::SetKernelSet(GetParam());
    const Result wide = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
    cpu::SetKernelSet(cpu::KernelSet::kAvx2);
    const Result narrow = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
    EXPECT_TRUE(at::equal(wide.out, narrow.out)) << "forward";
    EXPECT_TRUE(at::equal(wide.grad_features, narrow.grad_features)) << "input gradient";
    EXPECT_TRUE(at::equal(wide.grad_weight, narrow.grad_weight)) << "weight gradient";
  }
  cpu::SetKernelSet(previous);
}

std::vector<cpu::KernelSet> SetsWiderThanAvx2() {
  std::vector<cpu::KernelSet> sets;
  if (cpu::KernelSetSupported(cpu::KernelSet::kAvx2) &&
      cpu::KernelSetSupported(cpu::KernelSet::kAvx512)) {
    sets.push_back(cpu::KernelSet::kAvx512);
  }
  return sets;
}

INSTANTIATE_TEST_SUITE_P(SupportedSets, FusedSetsAgree, ::testing::ValuesIn(SetsWiderThanAvx2()),
                         [](const ::testing::TestParamInfo<cpu::KernelSet>& info) {
                           return cpu::ToString(info.param);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FusedSetsAgree);

TEST(FusedKernelSets, NamesRoundTripAndUnknownNamesAreRejected) {
  for (cpu::KernelSet s : {cpu::KernelSet::kBlas, cpu::KernelSet::kAvx2, cpu::KernelSet::kAvx512}) {
    EXPECT_EQ(cpu::KernelSetFromString(cpu::ToString(s)), s);
  }
  try {
    cpu::KernelSetFromString("sse", "TRAINSUP_KERNELS");
    FAIL() << "an unknown name was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("TRAINSUP_KERNELS: unknown kernel set 'sse'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(cpu::KernelSetSupported(cpu::KernelSet::kBlas));
  EXPECT_TRUE(cpu::KernelSetSupported(cpu::BestKernelSet()));
  // BLAS cannot be refused; a set the CPU lacks is.
  const cpu::KernelSet previous = cpu::SetKernelSet(cpu::KernelSet::kBlas);
  EXPECT_EQ(cpu::ActiveKernelSet(), cpu::KernelSet::kBlas);
  if (!cpu::KernelSetSupported(cpu::KernelSet::kAvx512)) {
    EXPECT_THROW(cpu::SetKernelSet(cpu::KernelSet::kAvx512), c10::Error);
  }
  cpu::SetKernelSet(previous);
}

// The start-up choice from TRAINSUP_KERNELS and TRAINSUP_FUSED.
TEST(FusedKernelSets, TheEnvironmentChoosesTheSet) {
  const cpu::KernelSet best = cpu::BestKernelSet();
  EXPECT_EQ(cpu::ChooseKernelSet(nullptr, nullptr), best);
  EXPECT_EQ(cpu::ChooseKernelSet("", nullptr), best);
  EXPECT_EQ(cpu::ChooseKernelSet(nullptr, "1"), best);
  EXPECT_EQ(cpu::ChooseKernelSet(nullptr, "0"), cpu::KernelSet::kBlas);
  EXPECT_EQ(cpu::ChooseKernelSet("blas", nullptr), cpu::KernelSet::kBlas);
  // The named set wins over TRAINSUP_FUSED; one the CPU lacks gives the
  // fastest below it.
  const cpu::KernelSet avx2 = cpu::KernelSetSupported(cpu::KernelSet::kAvx2)
                                  ? cpu::KernelSet::kAvx2
                                  : cpu::KernelSet::kBlas;
  EXPECT_EQ(cpu::ChooseKernelSet("avx2", "0"), avx2);
  EXPECT_EQ(cpu::ChooseKernelSet("avx512", nullptr),
            cpu::KernelSetSupported(cpu::KernelSet::kAvx512) ? cpu::KernelSet::kAvx512 : avx2);
  EXPECT_THROW(cpu::ChooseKernelSet("AVX2", nullptr), c10::Error);
}

}  // namespace
}  // namespace trainsup::sparse
