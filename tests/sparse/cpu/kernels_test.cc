// The fused AVX-512 convolution kernels (float, sorted pair lists) against
// a float64 reference and against the gather-BLAS-scatter path, over
// shapes that reach every register tile, a masked column tail, several
// column blocks and both convolution directions; and their results bit for
// bit independent of the thread count.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <string>

#include "sparse/cpu/kernels.h"
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

// Output and input channel counts of 1 to 13 vectors of 16, with and
// without a partial last vector; the stem's 3 inputs and 5x5x5 window.
const Shape kShapes[] = {
    {3, 32, 5, 1, false},   {16, 20, 3, 1, false},  {32, 32, 3, 2, false}, {64, 96, 3, 1, false},
    {40, 130, 3, 1, false}, {130, 40, 3, 1, false}, {96, 20, 1, 1, false}, {48, 200, 2, 2, false},
    {24, 16, 2, 2, true},   {17, 33, 3, 2, true},
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

class FusedKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = cpu::SetFusedKernelsEnabled(true);
    if (!cpu::FusedKernelsEnabled())
      GTEST_SKIP() << "this CPU has no AVX-512F: the fused kernels cannot run";
  }
  void TearDown() override { cpu::SetFusedKernelsEnabled(previous_); }
  bool previous_ = false;
};

TEST_F(FusedKernels, MatchFloat64AndTheBlasPath) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(Describe(s));
    auto in =
        MakeRandomInput(2, 10, 0.3, s.cin, at::kFloat, 11 + s.cin + s.cout, -5, /*shuffle=*/false);
    const int64_t volume = static_cast<int64_t>(s.kernel) * s.kernel * s.kernel;
    at::Tensor w = at::randn({volume, s.cin, s.cout}) / 8;
    at::Tensor seed = at::randn({in.features.size(0), s.cout});

    cpu::SetFusedKernelsEnabled(true);
    const Result fused = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
    cpu::SetFusedKernelsEnabled(false);
    const Result blas = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
    cpu::SetFusedKernelsEnabled(true);
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

TEST_F(FusedKernels, ResultsDoNotDependOnTheThreadCountBitForBit) {
  const int threads = at::get_num_threads();
  for (const Shape& s : {kShapes[3], kShapes[5], kShapes[9]}) {
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
TEST_F(FusedKernels, ZeroChannelsGiveEmptyResults) {
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

TEST_F(FusedKernels, TheSwitchSelectsThePath) {
  // The two paths round differently; if the switch did nothing, a large
  // sum would come out bit-identical.
  const Shape s{64, 96, 3, 1, false};
  auto in = MakeRandomInput(1, 14, 0.4, s.cin, at::kFloat, 9, 0, /*shuffle=*/false);
  at::Tensor w = at::randn({27, s.cin, s.cout});
  at::Tensor seed = at::randn({in.features.size(0), s.cout});
  cpu::SetFusedKernelsEnabled(false);
  EXPECT_FALSE(cpu::FusedKernelsEnabled());
  const Result blas = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
  cpu::SetFusedKernelsEnabled(true);
  EXPECT_TRUE(cpu::FusedKernelsEnabled());
  const Result fused = ConvForwardBackward(s, in.features, in.coordinates, w, seed);
  EXPECT_FALSE(at::equal(blas.grad_weight, fused.grad_weight));
}

}  // namespace
}  // namespace trainsup::sparse
