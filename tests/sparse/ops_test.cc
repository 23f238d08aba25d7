// Feature ops (BatchNorm, global pooling, concatenation, activations) and
// deterministic mode across a small U-Net-shaped network.
#include "sparse/ops.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sparse/determinism.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::GradCheck;
using testing::MakeRandomInput;

TEST(BatchNorm, MatchesLibTorchAndUpdatesRunningStatistics) {
  auto in = MakeRandomInput(2, 6, 0.4, 5, at::kDouble, 3);
  SparseTensor x(in.features, in.coordinates);
  at::Tensor w = at::randn({5}, at::kDouble), b = at::randn({5}, at::kDouble);
  at::Tensor rm = at::zeros({5}, at::kDouble), rv = at::ones({5}, at::kDouble);
  at::Tensor rm2 = rm.clone(), rv2 = rv.clone();
  SparseTensor y = BatchNorm(x, w, b, rm, rv, true, 0.1, 1e-5);
  at::Tensor want = at::batch_norm(in.features, w, b, rm2, rv2, true, 0.1, 1e-5, false);
  EXPECT_TRUE(at::allclose(y.F(), want));
  EXPECT_TRUE(at::allclose(rm, rm2));
  EXPECT_TRUE(at::allclose(rv, rv2));
  EXPECT_FALSE(at::allclose(rm, at::zeros({5}, at::kDouble)));
  SparseTensor e = BatchNorm(x, w, b, rm, rv, false, 0.1, 1e-5);
  EXPECT_TRUE(
      at::allclose(e.F(), at::batch_norm(in.features, w, b, rm, rv, false, 0.1, 1e-5, false)));
  auto bn = [&](const std::vector<at::Tensor>& t) {
    return BatchNorm(x.WithFeatures(t[0]), t[1], t[2], {}, {}, true, 0.1, 1e-5).F();
  };
  EXPECT_LT(GradCheck(bn, {in.features.slice(1, 0, 2), w.slice(0, 0, 2), b.slice(0, 0, 2)}), 1e-5);
}

// Training-mode BatchNorm (with and without the fused ReLU) against
// at::batch_norm followed by at::relu: outputs, running statistics and the
// gradients of input, weight and bias, for several momenta and without
// running statistics or affine parameters.
TEST(BatchNorm, TrainingMatchesLibTorchWithAndWithoutFusedRelu) {
  auto in = MakeRandomInput(2, 9, 0.4, 7, at::kDouble, 21);
  const int64_t c = 7;
  for (bool relu : {false, true})
    for (double momentum : {0.1, 1.0})
      for (bool stats : {true, false})
        for (bool affine : {true, false}) {
          SCOPED_TRACE(std::string(relu ? "relu" : "no relu") + " momentum " +
                       std::to_string(momentum) + (stats ? " running stats" : " no running stats") +
                       (affine ? " affine" : " no affine"));
          at::Tensor f = (in.features * 3 + 1).requires_grad_(true);
          at::Tensor fd = f.detach().clone().requires_grad_(true);
          at::Tensor w, b, wd, bd;
          if (affine) {
            w = at::randn({c}, at::kDouble).requires_grad_(true);
            b = at::randn({c}, at::kDouble).requires_grad_(true);
            wd = w.detach().clone().requires_grad_(true);
            bd = b.detach().clone().requires_grad_(true);
          }
          at::Tensor rm, rv, rm2, rv2;
          if (stats) {
            rm = at::randn({c}, at::kDouble), rv = at::rand({c}, at::kDouble) + 0.5;
            rm2 = rm.clone(), rv2 = rv.clone();
          }
          SparseTensor y =
              BatchNorm(SparseTensor(f, in.coordinates), w, b, rm, rv, true, momentum, 1e-5, relu);
          at::Tensor want = at::batch_norm(fd, wd, bd, rm2, rv2, true, momentum, 1e-5, false);
          if (relu) want = at::relu(want);
          EXPECT_TRUE(at::allclose(y.F(), want, 1e-9, 1e-9));
          if (stats) {
            EXPECT_TRUE(at::allclose(rm, rm2, 1e-9, 1e-9));
            EXPECT_TRUE(at::allclose(rv, rv2, 1e-9, 1e-9));
          }
          at::Tensor r = at::randn(want.sizes(), at::kDouble);
          (y.F() * r).sum().backward();
          (want * r).sum().backward();
          EXPECT_TRUE(at::allclose(f.grad(), fd.grad(), 1e-9, 1e-9));
          if (affine) {
            EXPECT_TRUE(at::allclose(w.grad(), wd.grad(), 1e-9, 1e-9));
            EXPECT_TRUE(at::allclose(b.grad(), bd.grad(), 1e-9, 1e-9));
          }
        }
}

// Float sums over fixed blocks of rows: the same bits at any thread count.
TEST(BatchNorm, TrainingResultsDoNotDependOnTheThreadCountBitForBit) {
  const int threads = at::get_num_threads();
  at::Tensor x = at::randn({3000, 40}) * 2 + 0.5;
  at::Tensor coords = at::zeros({3000, 4}, at::kInt);
  coords.select(1, 1).copy_(at::arange(3000, at::kInt));
  std::vector<at::Tensor> first;
  for (int n : {1, 2, 3}) {
    at::set_num_threads(n);
    at::Tensor f = x.clone().requires_grad_(true);
    at::Tensor w = at::ones({40}).requires_grad_(true), b = at::zeros({40}).requires_grad_(true);
    at::Tensor rm = at::zeros({40}), rv = at::ones({40});
    SparseTensor y = BatchNorm(SparseTensor(f, coords), w, b, rm, rv, true, 0.1, 1e-5, true);
    (y.F() * at::linspace(-1, 1, 3000 * 40).view({3000, 40})).sum().backward();
    std::vector<at::Tensor> got = {y.F().detach(), f.grad(), w.grad(), b.grad(), rm, rv};
    if (first.empty()) {
      first = got;
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(at::equal(got[i], first[i])) << n << " threads, result " << i;
  }
  at::set_num_threads(threads);
}

TEST(BatchNorm, RejectsParametersOfTheWrongSize) {
  auto in = MakeRandomInput(1, 5, 0.4, 3, at::kFloat, 3);
  SparseTensor x(in.features, in.coordinates);
  EXPECT_THROW(BatchNorm(x, at::ones({4}), at::zeros({3}), {}, {}, true, 0.1, 1e-5), c10::Error);
  EXPECT_THROW(BatchNorm(x, at::ones({3}), at::zeros({3}), {}, {}, false, 0.1, 1e-5), c10::Error);
}

TEST(GlobalPool, PoolsEachBatchItem) {
  auto in = MakeRandomInput(3, 5, 0.3, 4, at::kDouble, 8);
  SparseTensor x(in.features, in.coordinates);
  at::Tensor batch = in.coordinates.select(1, 0);
  for (PoolMode mode : {PoolMode::kMax, PoolMode::kAverage, PoolMode::kSum}) {
    at::Tensor got = GlobalPool(x, mode);
    ASSERT_EQ(got.sizes(), (at::IntArrayRef{3, 4}));
    for (int64_t b = 0; b < 3; ++b) {
      at::Tensor rows = in.features.index({batch == b});
      at::Tensor want = mode == PoolMode::kMax       ? std::get<0>(rows.max(0))
                        : mode == PoolMode::kAverage ? rows.mean(0)
                                                     : rows.sum(0);
      EXPECT_TRUE(at::allclose(got[b], want)) << ToString(mode) << " batch " << b;
    }
    auto pool = [&](const std::vector<at::Tensor>& t) {
      return GlobalPool(x.WithFeatures(t[0]), mode);
    };
    EXPECT_LT(GradCheck(pool, {in.features}), 1e-6) << ToString(mode);
  }
}

TEST(GlobalPool, EmptyBatchItemGetsZeros) {
  at::Tensor c = at::tensor({0, 0, 0, 0, 2, 1, 1, 1}, at::kInt).view({2, 4});
  SparseTensor x(at::ones({2, 2}), c);
  at::Tensor got = GlobalPool(x, PoolMode::kAverage);
  ASSERT_EQ(got.size(0), 3);
  EXPECT_TRUE(at::equal(got[1], at::zeros({2})));
}

TEST(Cat, ConcatenatesOnTheSameCoordinatesOnly) {
  auto in = MakeRandomInput(1, 6, 0.3, 3, at::kFloat, 4);
  SparseTensor x(in.features, in.coordinates);
  SparseTensor y = Relu(x);
  SparseTensor z = Cat({x, y});
  EXPECT_EQ(z.channels(), 6);
  EXPECT_EQ(z.set_id(), x.set_id());
  EXPECT_TRUE(at::equal(z.F().slice(1, 3, 6), at::relu(in.features)));
  SparseTensor other(in.features, in.coordinates);
  EXPECT_THROW(Cat({x, other}), c10::Error);
  SparseTensor down = Conv(x, at::randn({8, 3, 3}), {}, {2, 2, 1});
  EXPECT_THROW(Cat({x, down}), c10::Error);
}

TEST(Activations, ApplyToFeatures) {
  auto in = MakeRandomInput(1, 5, 0.4, 3, at::kFloat, 6);
  SparseTensor x(in.features, in.coordinates);
  EXPECT_TRUE(at::equal(LeakyRelu(x, 0.2).F(), at::leaky_relu(in.features, 0.2)));
  EXPECT_TRUE(at::equal(Sigmoid(x).F(), at::sigmoid(in.features)));
  EXPECT_TRUE(at::equal(Tanh(x).F(), at::tanh(in.features)));
  EXPECT_TRUE(at::equal(Elu(x).F(), at::elu(in.features)));
  EXPECT_EQ(Relu(x).set_id(), x.set_id());
}

// A small U-Net: conv, BN, ReLU, strided conv, pooling, transposed conv,
// skip concatenation, global pooling. Returns the output features (rows in
// the order of the input) and the global pool.
struct NetOutput {
  at::Tensor features, pooled;
};

NetOutput RunNet(const SparseTensor& x, const std::vector<at::Tensor>& p) {
  SparseTensor a =
      Relu(BatchNorm(Conv(x, p[0], p[1], {3, 1, 1}), p[2], p[3], {}, {}, true, 0.1, 1e-5));
  SparseTensor d = Conv(a, p[4], {}, {2, 2, 1});
  SparseTensor m = Pool(d, PoolMode::kMax, {3, 1, 1});
  SparseTensor u = ConvTranspose(m, p[5], p[6], {2, 2, 1}, &a);
  SparseTensor s = Cat({a, u});
  SparseTensor o = Conv(s, p[7], {}, {3, 1, 1});
  return {o.F(), GlobalPool(o, PoolMode::kAverage)};
}

TEST(Deterministic, ResultsDoNotDependOnRowOrderBitForBit) {
  DeterministicGuard deterministic(true);
  auto in = MakeRandomInput(2, 12, 0.3, 8, at::kFloat, 17, -6);
  const int64_t n = in.coordinates.size(0);
  at::Tensor perm = at::randperm(n, at::TensorOptions().dtype(at::kLong));
  std::vector<at::Tensor> params = {at::randn({27, 8, 16}) / 10,
                                    at::randn({16}),
                                    at::rand({16}) + 0.5,
                                    at::randn({16}),
                                    at::randn({8, 16, 16}) / 10,
                                    at::randn({8, 16, 16}) / 10,
                                    at::randn({16}),
                                    at::randn({27, 32, 4}) / 10};
  auto run = [&](const at::Tensor& coords, const at::Tensor& feats) {
    std::vector<at::Tensor> p;
    for (auto& t : params) p.push_back(t.clone().requires_grad_(true));
    at::Tensor f = feats.clone().requires_grad_(true);
    NetOutput out = RunNet(SparseTensor(f, coords), p);
    (out.features.square().sum() + out.pooled.sum()).backward();
    std::vector<at::Tensor> grads;
    for (auto& t : p) grads.push_back(t.grad());
    return std::make_tuple(out, f.grad(), grads);
  };
  auto [out_a, gf_a, gp_a] = run(in.coordinates, in.features);
  auto [out_b, gf_b, gp_b] =
      run(in.coordinates.index_select(0, perm), in.features.index_select(0, perm));
  EXPECT_TRUE(at::equal(out_a.features.index_select(0, perm), out_b.features));
  EXPECT_TRUE(at::equal(out_a.pooled, out_b.pooled));
  EXPECT_TRUE(at::equal(gf_a.index_select(0, perm), gf_b));
  for (size_t i = 0; i < gp_a.size(); ++i) {
    EXPECT_TRUE(at::equal(gp_a[i], gp_b[i])) << "parameter " << i;
  }
}

TEST(Deterministic, RepeatedRunsAreIdentical) {
  DeterministicGuard deterministic(true);
  auto in = MakeRandomInput(1, 10, 0.3, 4, at::kFloat, 5);
  at::Tensor w = at::randn({27, 4, 4}).requires_grad_(true);
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 2; ++i) {
    w.mutable_grad() = at::Tensor();
    Conv(SparseTensor(in.features, in.coordinates), w, {}, {3, 1, 1}).F().square().sum().backward();
    grads.push_back(w.grad().clone());
  }
  EXPECT_TRUE(at::equal(grads[0], grads[1]));
}

}  // namespace
}  // namespace trainsup::sparse

namespace trainsup::sparse {
namespace {

TEST(Deterministic, MaxPoolGradientOfASharedMaximumIgnoresRowOrder) {
  // Five voxels in a row, the peak at x = 2: the stride-1 windows at x = 1,
  // 2 and 3 share it, and their gradients (1e8, 1, -1e8) in float32 sum to
  // 0 in key order but to 1 in the order x = 3, 1, 2.
  DeterministicGuard deterministic(true);
  auto grad_at_peak = [](const std::vector<int32_t>& xs) {
    std::vector<int32_t> c;
    std::vector<float> f, g;
    for (int32_t x : xs) {
      c.insert(c.end(), {0, x, 0, 0});
      f.push_back(x == 2 ? 10.0f : static_cast<float>(x));
      g.push_back(x == 1 ? 1e8f : x == 2 ? 1.0f : x == 3 ? -1e8f : 0.0f);
    }
    const int64_t n = static_cast<int64_t>(xs.size());
    at::Tensor feats = at::from_blob(f.data(), {n, 1}, at::kFloat).clone().requires_grad_(true);
    SparseTensor x(feats, at::from_blob(c.data(), {n, 4}, at::kInt));
    SparseTensor y = Pool(x, PoolMode::kMax, {3, 1, 1});
    y.F().backward(at::from_blob(g.data(), {n, 1}, at::kFloat).clone());
    for (int64_t i = 0; i < n; ++i) {
      if (xs[i] == 2) return feats.grad()[i][0].item<float>();
    }
    return -1.0f;
  };
  EXPECT_EQ(grad_at_peak({0, 1, 2, 3, 4}), 0.0f);
  EXPECT_EQ(grad_at_peak({3, 1, 2, 0, 4}), 0.0f);
}

TEST(Conv, ZeroInputChannelsGiveZeros) {
  auto in = MakeRandomInput(1, 5, 0.4, 0, at::kFloat, 2);
  SparseTensor x(in.features, in.coordinates);
  for (int stride : {1, 2}) {
    SparseTensor y = Conv(x, at::randn({27, 0, 8}), {}, {3, stride, 1});
    EXPECT_TRUE(at::equal(y.F(), at::zeros({y.size(), 8}))) << "stride " << stride;
  }
}

TEST(SparseTensor, KeepsItsOwnCopyOfTheCoordinates) {
  at::Tensor c = at::tensor({0, 1, 2, 3, 0, 4, 5, 6}, at::kInt).view({2, 4});
  SparseTensor x(at::zeros({2, 1}), c);
  c.fill_(0);
  EXPECT_TRUE(at::equal(x.C(), at::tensor({0, 1, 2, 3, 0, 4, 5, 6}, at::kInt).view({2, 4})));
}

}  // namespace
}  // namespace trainsup::sparse
