// Convolution, transposed convolution and pooling against LibTorch's dense
// ops, forward and gradients, plus gradcheck in float64.
#include <gtest/gtest.h>

#include <string>

#include "sparse/determinism.h"
#include "sparse/ops.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::DenseConvTransposeWeight;
using testing::DenseConvWeight;
using testing::Densify;
using testing::Extract;
using testing::GradCheck;
using testing::KernelExtent;
using testing::MakeRandomInput;

struct ConvCase {
  int64_t kernel, stride, dilation, cin, cout, batch;
  int64_t origin;
};

std::string Describe(const ConvCase& c) {
  return "kernel " + std::to_string(c.kernel) + " stride " + std::to_string(c.stride) +
         " dilation " + std::to_string(c.dilation) + " channels " + std::to_string(c.cin) + "->" +
         std::to_string(c.cout) + " batch " + std::to_string(c.batch) + " origin " +
         std::to_string(c.origin);
}

const ConvCase kConvCases[] = {
    {3, 1, 1, 3, 5, 1, 0},  {3, 1, 1, 8, 4, 2, -8}, {1, 1, 1, 4, 6, 2, 0},  {5, 1, 1, 2, 3, 1, -4},
    {3, 1, 2, 4, 4, 2, 0},  {2, 1, 1, 3, 2, 1, 0},  {3, 2, 1, 4, 5, 2, -8}, {2, 2, 1, 6, 3, 2, 0},
    {3, 2, 2, 3, 3, 1, -4}, {5, 2, 1, 2, 4, 1, 0},  {1, 2, 1, 3, 3, 2, -2},
};

void ExpectClose(const at::Tensor& got, const at::Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double err = (got - want).abs().max().item<double>();
  EXPECT_LE(err, tol) << what << ": max abs error " << err;
}

// Sorted inputs take the row-range kernels, shuffled ones the per-offset
// kernels: both against the dense reference.
TEST(Conv, MatchesDenseConv3dForwardAndGradients) {
  for (const ConvCase& c : kConvCases)
    for (bool shuffle : {true, false}) {
      SCOPED_TRACE(Describe(c) + (shuffle ? " shuffled rows" : " sorted rows"));
      const int64_t grid = 8;
      auto in = MakeRandomInput(c.batch, grid, 0.3, c.cin, at::kDouble, 7 + c.kernel * 3 + c.stride,
                                c.origin, shuffle);
      const int64_t volume = c.kernel * c.kernel * c.kernel;
      at::Tensor w = at::randn({volume, c.cin, c.cout}, at::kDouble).requires_grad_(true);
      at::Tensor b = at::randn({c.cout}, at::kDouble).requires_grad_(true);
      at::Tensor f = in.features.clone().requires_grad_(true);
      SparseTensor x(f, in.coordinates);
      ConvOptions opt{static_cast<int32_t>(c.kernel), static_cast<int32_t>(c.stride),
                      static_cast<int32_t>(c.dilation)};
      SparseTensor y = Conv(x, w, b, opt);
      ASSERT_EQ(y.stride(), c.stride);

      at::Tensor fd = in.features.clone().requires_grad_(true);
      at::Tensor wd = w.detach().clone().requires_grad_(true);
      at::Tensor bd = b.detach().clone().requires_grad_(true);
      auto [lo, hi] = KernelExtent(c.kernel);
      at::Tensor dense = Densify(in.coordinates, fd, c.batch, in.origin, grid);
      dense = at::constant_pad_nd(dense, {lo * c.dilation, hi * c.dilation, lo * c.dilation,
                                          hi * c.dilation, lo * c.dilation, hi * c.dilation});
      at::Tensor dense_out =
          at::conv3d(dense, DenseConvWeight(wd, c.kernel), bd, at::IntArrayRef{c.stride},
                     at::IntArrayRef{0}, at::IntArrayRef{c.dilation});
      at::Tensor want = Extract(dense_out, y.C(), in.origin, c.stride);
      ExpectClose(y.F(), want, 1e-9, "forward");

      at::Tensor r = at::randn(want.sizes(), at::kDouble);
      (y.F() * r).sum().backward();
      (want * r).sum().backward();
      ExpectClose(f.grad(), fd.grad(), 1e-9, "grad features");
      ExpectClose(w.grad(), wd.grad(), 1e-9, "grad weight");
      ExpectClose(b.grad(), bd.grad(), 1e-9, "grad bias");
    }
}

TEST(Conv, Float32MatchesDense) {
  auto in = MakeRandomInput(2, 10, 0.25, 16, at::kFloat, 3, -5);
  at::Tensor w = at::randn({27, 16, 32}) / 10;
  SparseTensor y = Conv(SparseTensor(in.features, in.coordinates), w, at::Tensor(), {3, 1, 1});
  at::Tensor dense = Densify(in.coordinates, in.features, 2, in.origin, 10);
  at::Tensor want =
      Extract(at::conv3d(dense, DenseConvWeight(w, 3), {}, at::IntArrayRef{1}, at::IntArrayRef{1}),
              y.C(), in.origin);
  ExpectClose(y.F(), want, 1e-4, "float32 forward");
}

TEST(ConvTranspose, MatchesDenseConvTranspose3dForwardAndGradients) {
  const ConvCase cases[] = {{3, 2, 1, 4, 3, 2, -8}, {2, 2, 1, 3, 5, 1, 0}, {3, 2, 2, 2, 2, 2, 0},
                            {1, 2, 1, 3, 3, 1, -4}, {3, 1, 1, 3, 4, 1, 0}, {5, 2, 1, 2, 3, 1, 0}};
  for (const ConvCase& c : cases)
    for (bool shuffle : {true, false}) {
      SCOPED_TRACE(Describe(c) + (shuffle ? " shuffled rows" : " sorted rows"));
      const int64_t grid = 8;
      auto in =
          MakeRandomInput(c.batch, grid, 0.3, 1, at::kDouble, 11 + c.kernel, c.origin, shuffle);
      auto manager = std::make_shared<CoordinateManager>();
      SparseTensor fine(in.features, in.coordinates, 1, manager);
      const CoordinateSetId coarse_id = manager->Downsample(fine.set_id(), c.stride);
      const int64_t nc = manager->Set(coarse_id).size();
      at::Tensor f = at::randn({nc, c.cin}, at::kDouble).requires_grad_(true);
      SparseTensor coarse(f, coarse_id, manager);
      const int64_t volume = c.kernel * c.kernel * c.kernel;
      at::Tensor w = at::randn({volume, c.cin, c.cout}, at::kDouble).requires_grad_(true);
      SparseTensor y =
          ConvTranspose(coarse, w, at::Tensor(),
                        {static_cast<int32_t>(c.kernel), static_cast<int32_t>(c.stride),
                         static_cast<int32_t>(c.dilation)},
                        &fine);
      ASSERT_EQ(y.set_id(), fine.set_id());

      at::Tensor fd = f.detach().clone().requires_grad_(true);
      at::Tensor wd = w.detach().clone().requires_grad_(true);
      const int64_t coarse_grid = grid / c.stride;
      at::Tensor dense = Densify(coarse.C(), fd, c.batch, in.origin, coarse_grid, c.stride);
      dense = at::constant_pad_nd(dense, {0, 2, 0, 2, 0, 2});
      at::Tensor dense_out = at::conv_transpose3d(dense, DenseConvTransposeWeight(wd, c.kernel), {},
                                                  {c.stride}, {0}, {0}, 1, {c.dilation});
      auto [lo, hi] = KernelExtent(c.kernel);
      (void)hi;
      at::Tensor want = Extract(dense_out, fine.C(), in.origin, 1, lo * c.dilation);
      ExpectClose(y.F(), want, 1e-9, "forward");
      at::Tensor r = at::randn(want.sizes(), at::kDouble);
      (y.F() * r).sum().backward();
      (want * r).sum().backward();
      ExpectClose(f.grad(), fd.grad(), 1e-9, "grad features");
      ExpectClose(w.grad(), wd.grad(), 1e-9, "grad weight");
    }
}

TEST(ConvTranspose, DefaultsToTheSetItWasDownsampledFrom) {
  auto in = MakeRandomInput(1, 8, 0.3, 2, at::kDouble, 5);
  SparseTensor x(in.features, in.coordinates);
  SparseTensor down = Conv(x, at::randn({8, 2, 3}, at::kDouble), {}, {2, 2, 1});
  SparseTensor up = ConvTranspose(down, at::randn({8, 3, 2}, at::kDouble), {}, {2, 2, 1});
  EXPECT_EQ(up.set_id(), x.set_id());
  EXPECT_EQ(up.size(), x.size());
}

TEST(Pool, MatchesDenseMaxAndAveragePooling) {
  const ConvCase cases[] = {
      {2, 2, 1, 3, 3, 2, 0}, {3, 2, 1, 4, 4, 1, -8}, {3, 1, 1, 2, 2, 2, 0}, {3, 2, 2, 2, 2, 1, 0}};
  for (const ConvCase& c : cases) {
    for (PoolMode mode : {PoolMode::kMax, PoolMode::kAverage, PoolMode::kSum}) {
      SCOPED_TRACE(Describe(c) + " " + ToString(mode));
      const int64_t grid = 8;
      auto in = MakeRandomInput(c.batch, grid, 0.3, c.cin, at::kDouble, 21 + c.kernel, c.origin);
      at::Tensor f = in.features.clone().requires_grad_(true);
      ConvOptions opt{static_cast<int32_t>(c.kernel), static_cast<int32_t>(c.stride),
                      static_cast<int32_t>(c.dilation)};
      SparseTensor y = Pool(SparseTensor(f, in.coordinates), mode, opt);

      at::Tensor fd = in.features.clone().requires_grad_(true);
      auto [lo, hi] = KernelExtent(c.kernel);
      std::vector<int64_t> pad = {lo * c.dilation, hi * c.dilation, lo * c.dilation,
                                  hi * c.dilation, lo * c.dilation, hi * c.dilation};
      at::Tensor want;
      if (mode == PoolMode::kMax) {
        const double inf = std::numeric_limits<double>::infinity();
        at::Tensor dense = Densify(in.coordinates, fd, c.batch, in.origin, grid, 1, -inf);
        dense = at::constant_pad_nd(dense, pad, -inf);
        want = Extract(at::max_pool3d(dense, {c.kernel}, {c.stride}, {0}, {c.dilation}), y.C(),
                       in.origin, c.stride);
      } else {
        // Window sums (empty sites are zeros); the average divides by the
        // number of existing sites in the window.
        at::Tensor dense =
            at::constant_pad_nd(Densify(in.coordinates, fd, c.batch, in.origin, grid), pad);
        // avg_pool3d has no dilation: dilated windows sum through a ones
        // kernel per channel instead.
        at::Tensor ones = at::ones({c.cin, 1, c.kernel, c.kernel, c.kernel}, at::kDouble);
        at::Tensor sums =
            c.dilation == 1
                ? at::avg_pool3d(dense, {c.kernel}, {c.stride}, {0}, false, true, /*divisor=*/1)
                : at::conv3d(dense, ones, {}, at::IntArrayRef{c.stride}, at::IntArrayRef{0},
                             at::IntArrayRef{c.dilation}, c.cin);
        want = Extract(sums, y.C(), in.origin, c.stride);
        if (mode == PoolMode::kAverage) {
          at::Tensor mask = at::constant_pad_nd(
              Densify(in.coordinates, at::ones({in.coordinates.size(0), 1}, at::kDouble), c.batch,
                      in.origin, grid),
              pad);
          at::Tensor counts = at::conv3d(mask, ones.slice(0, 0, 1), {}, at::IntArrayRef{c.stride},
                                         at::IntArrayRef{0}, at::IntArrayRef{c.dilation});
          want = want / Extract(counts, y.C(), in.origin, c.stride).clamp_min(1);
        }
      }
      ExpectClose(y.F(), want, 1e-9, "forward");
      at::Tensor r = at::randn(want.sizes(), at::kDouble);
      (y.F() * r).sum().backward();
      (want * r).sum().backward();
      ExpectClose(f.grad(), fd.grad(), 1e-9, "grad features");
    }
  }
}

TEST(GradCheck, ConvolutionFamilyInFloat64) {
  for (bool shuffle : {true, false}) {
    SCOPED_TRACE(shuffle ? "shuffled rows" : "sorted rows");
    auto in = MakeRandomInput(2, 5, 0.25, 2, at::kDouble, 99, -2, shuffle);
    auto manager = std::make_shared<CoordinateManager>();
    SparseTensor x(in.features, in.coordinates, 1, manager);
    auto conv = [&](const std::vector<at::Tensor>& t) {
      return Conv(x.WithFeatures(t[0]), t[1], t[2], {3, 1, 1}).F();
    };
    EXPECT_LT(GradCheck(conv, {in.features, at::randn({27, 2, 2}, at::kDouble),
                               at::randn({2}, at::kDouble)}),
              1e-6);
    auto strided = [&](const std::vector<at::Tensor>& t) {
      return Conv(x.WithFeatures(t[0]), t[1], {}, {3, 2, 1}).F();
    };
    EXPECT_LT(GradCheck(strided, {in.features, at::randn({27, 2, 3}, at::kDouble)}), 1e-6);
    const CoordinateSetId coarse = manager->Downsample(x.set_id(), 2);
    const int64_t nc = manager->Set(coarse).size();
    auto transposed = [&](const std::vector<at::Tensor>& t) {
      return ConvTranspose(SparseTensor(t[0], coarse, manager), t[1], t[2], {2, 2, 1}, &x).F();
    };
    EXPECT_LT(
        GradCheck(transposed, {at::randn({nc, 2}, at::kDouble), at::randn({8, 2, 2}, at::kDouble),
                               at::randn({2}, at::kDouble)}),
        1e-6);
    for (PoolMode mode : {PoolMode::kMax, PoolMode::kAverage, PoolMode::kSum}) {
      SCOPED_TRACE(ToString(mode));
      auto pool = [&](const std::vector<at::Tensor>& t) {
        return Pool(x.WithFeatures(t[0]), mode, {3, 2, 1}).F();
      };
      EXPECT_LT(GradCheck(pool, {in.features}), 1e-6);
    }
  }
}

TEST(Conv, EmptyTensorGivesEmptyOutput) {
  SparseTensor x(at::zeros({0, 3}), at::zeros({0, 4}, at::kInt));
  at::Tensor w = at::randn({27, 3, 4}).requires_grad_(true);
  SparseTensor y = Conv(x, w, at::zeros({4}), {3, 1, 1});
  EXPECT_EQ(y.size(), 0);
  EXPECT_EQ(y.channels(), 4);
  SparseTensor down = Conv(x, w, {}, {3, 2, 1});
  EXPECT_EQ(down.size(), 0);
  y.F().sum().backward();
  EXPECT_TRUE(at::equal(w.grad(), at::zeros_like(w)));
}

TEST(Conv, OnePointSeesOnlyTheCentreWeight) {
  at::Tensor c = at::tensor({0, -3, 7, 11}, at::kInt).view({1, 4});
  at::Tensor f = at::randn({1, 3}, at::kDouble);
  at::Tensor w = at::randn({27, 3, 2}, at::kDouble);
  SparseTensor y = Conv(SparseTensor(f, c), w, {}, {3, 1, 1});
  EXPECT_TRUE(at::allclose(y.F(), f.mm(w[13])));
}

TEST(Conv, CoordinatesFarApartDoNotInteract) {
  // Two points near opposite ends of the representable range, one at the
  // lower limit: each sees only itself, and no packed-key arithmetic wraps.
  at::Tensor c = at::tensor({0, kMinCoordinate, 0, 0, 0, kMaxCoordinate, kMaxCoordinate, 5, 0,
                             kMaxCoordinate - 1, kMaxCoordinate, 5},
                            at::kInt)
                     .view({3, 4});
  at::Tensor f = at::randn({3, 2}, at::kDouble);
  at::Tensor w = at::randn({27, 2, 2}, at::kDouble);
  SparseTensor y = Conv(SparseTensor(f, c), w, {}, {3, 1, 1});
  // Row 1 (x = max) and row 2 (x = max - 1) are neighbours along x.
  at::Tensor want0 = f[0].unsqueeze(0).mm(w[13]);
  EXPECT_TRUE(at::allclose(y.F()[0].unsqueeze(0), want0));
  // Offset index of (dx, dy, dz): (dx + 1) * 9 + (dy + 1) * 3 + (dz + 1).
  at::Tensor want1 = f[1].unsqueeze(0).mm(w[13]) + f[2].unsqueeze(0).mm(w[(0) * 9 + 4]);
  at::Tensor want2 = f[2].unsqueeze(0).mm(w[13]) + f[1].unsqueeze(0).mm(w[2 * 9 + 4]);
  EXPECT_TRUE(at::allclose(y.F()[1].unsqueeze(0), want1));
  EXPECT_TRUE(at::allclose(y.F()[2].unsqueeze(0), want2));
}

TEST(Conv, DuplicateCoordinatesAreRejected) {
  at::Tensor c = at::tensor({0, 1, 2, 3, 0, 4, 5, 6, 0, 1, 2, 3}, at::kInt).view({3, 4});
  try {
    SparseTensor x(at::zeros({3, 1}), c);
    FAIL() << "duplicate coordinates accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("duplicate coordinate (0, 1, 2, 3)"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(Conv, BadInputGetsAClearError) {
  auto in = MakeRandomInput(1, 6, 0.3, 4, at::kFloat, 1);
  SparseTensor x(in.features, in.coordinates);
  const auto message = testing::ErrorMessage;
  EXPECT_NE(message([&] {
              Conv(x, at::randn({26, 4, 4}), {}, {3, 1, 1});
            }).find("27"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Conv(x, at::randn({27, 5, 4}), {}, {3, 1, 1});
            }).find("C_in"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Conv(x, at::randn({27, 4, 4}, at::kDouble), {}, {3, 1, 1});
            }).find("dtype"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Conv(x, at::randn({27, 4, 4}), at::randn({5}), {3, 1, 1});
            }).find("bias"),
            std::string::npos);
  // The bias goes to the kernels as memory of the features' device: one
  // elsewhere (here the meta device, which has no memory) is refused.
  EXPECT_EQ(message([&] {
              Conv(x, at::randn({27, 4, 4}), at::empty({4}, at::Device(at::kMeta)), {3, 1, 1});
            }),
            "Conv: bias is on meta, features on cpu");
  EXPECT_NE(message([&] {
              Conv(x, at::randn({27, 4, 4}), {}, {3, 0, 1});
            }).find("stride"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ConvTranspose(x, at::randn({8, 4, 4}), {}, {2, 2, 1});
            }).find("not made by downsampling"),
            std::string::npos);
  SparseTensor other(in.features, in.coordinates);
  SparseTensor down = Conv(x, at::randn({8, 4, 4}), {}, {2, 2, 1});
  EXPECT_NE(message([&] {
              ConvTranspose(down, at::randn({8, 4, 4}), {}, {2, 2, 1}, &other);
            }).find("another coordinate manager"),
            std::string::npos);
  EXPECT_NE(message([&] {
              SparseTensor(at::zeros({2, 3}), at::zeros({3, 4}, at::kInt));
            }).find("rows"),
            std::string::npos);
  EXPECT_NE(message([&] {
              SparseTensor(at::zeros({1, 3}, at::kInt), at::zeros({1, 4}, at::kInt));
            }).find("features must be float32, float64, bfloat16 or float16, got Int"),
            std::string::npos);
  EXPECT_NE(message([&] {
              SparseTensor(at::zeros({1, 3}), at::tensor({0, 1, 2, 3}, at::kInt).view({1, 4}), 2);
            }).find("not a multiple of the tensor stride 2"),
            std::string::npos);
  EXPECT_NE(
      message([&] {
        SparseTensor(
            at::zeros({1, 3}),
            at::tensor(std::vector<int64_t>{0, int64_t{1} << 20, 0, 0}, at::kLong).view({1, 4}));
      }).find("out of the representable range"),
      std::string::npos);
  EXPECT_NE(message([&] {
              SparseTensor(at::zeros({1, 3}), at::tensor({-1, 0, 0, 0}, at::kInt).view({1, 4}));
            }).find("batch index"),
            std::string::npos);
}

TEST(KernelMapCache, SecondLayerWithTheSameKeyReusesTheMap) {
  auto in = MakeRandomInput(2, 8, 0.3, 4, at::kFloat, 2);
  SparseTensor x(in.features, in.coordinates);
  auto stats0 = x.manager()->stats();
  SparseTensor y = Conv(x, at::randn({27, 4, 4}), {}, {3, 1, 1});
  SparseTensor z = Conv(y, at::randn({27, 4, 8}), {}, {3, 1, 1});
  auto stats1 = x.manager()->stats();
  EXPECT_EQ(stats1.kernel_map_builds - stats0.kernel_map_builds, 1);
  EXPECT_EQ(stats1.kernel_map_hits - stats0.kernel_map_hits, 1);
  // Another geometry is another map.
  Conv(z, at::randn({27, 8, 4}), {}, {3, 1, 2});
  EXPECT_EQ(x.manager()->stats().kernel_map_builds - stats0.kernel_map_builds, 2);
  // The transposed convolution back onto x reuses the strided map.
  SparseTensor d = Conv(x, at::randn({8, 4, 4}), {}, {2, 2, 1});
  const int64_t builds = x.manager()->stats().kernel_map_builds;
  ConvTranspose(d, at::randn({8, 4, 4}), {}, {2, 2, 1});
  EXPECT_EQ(x.manager()->stats().kernel_map_builds, builds);
}

}  // namespace
}  // namespace trainsup::sparse
