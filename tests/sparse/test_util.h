// Helpers for the engine's tests: random sparse inputs, dense references
// (densify, run LibTorch's dense op, read back at the sparse coordinates),
// and a finite-difference gradient check.
#ifndef TRAINSUP_TESTS_SPARSE_TEST_UTIL_H_
#define TRAINSUP_TESTS_SPARSE_TEST_UTIL_H_

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace trainsup::sparse::testing {

// A random sparse input on a cube [origin, origin + grid)^3 per batch item.
struct RandomInput {
  at::Tensor coordinates;  // N x 4 int32
  at::Tensor features;     // N x C
  int64_t batch = 1;
  int64_t origin = 0;
  int64_t grid = 8;
};

// Rows are shuffled unless `shuffle` is false (then they are in key order,
// as Quantize and Downsample produce them).
inline RandomInput MakeRandomInput(int64_t batch, int64_t grid, double density, int64_t channels,
                                   at::ScalarType dtype, uint64_t seed, int64_t origin = 0,
                                   bool shuffle = true) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int32_t> c;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t x = 0; x < grid; ++x) {
      for (int64_t y = 0; y < grid; ++y) {
        for (int64_t z = 0; z < grid; ++z) {
          if (u(rng) < density) {
            c.insert(c.end(), {static_cast<int32_t>(b), static_cast<int32_t>(origin + x),
                               static_cast<int32_t>(origin + y), static_cast<int32_t>(origin + z)});
          }
        }
      }
    }
  }
  RandomInput in;
  const int64_t n = static_cast<int64_t>(c.size() / 4);
  in.coordinates = at::from_blob(c.data(), {n, 4}, at::kInt).clone();
  // Shuffle rows so nothing relies on sorted input.
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor perm = shuffle ? at::randperm(n, gen, at::TensorOptions().dtype(at::kLong))
                            : at::arange(n, at::kLong);
  in.coordinates = in.coordinates.index_select(0, perm).contiguous();
  in.features = at::randn({n, channels}, gen, at::TensorOptions().dtype(dtype));
  in.batch = batch;
  in.origin = origin;
  in.grid = grid;
  return in;
}

// Dense tensor B x C x G x G x G (differentiable in `features`); empty sites
// hold `fill`. Coordinates are divided by `stride` after removing origin.
inline at::Tensor Densify(const at::Tensor& coordinates, const at::Tensor& features, int64_t batch,
                          int64_t origin, int64_t grid, int64_t stride = 1, double fill = 0.0) {
  at::Tensor c = coordinates.to(at::kLong);
  at::Tensor dense =
      at::full({batch, grid, grid, grid, features.size(1)}, fill, features.options());
  std::vector<at::Tensor> idx = {c.select(1, 0), (c.select(1, 1) - origin).div(stride, "floor"),
                                 (c.select(1, 2) - origin).div(stride, "floor"),
                                 (c.select(1, 3) - origin).div(stride, "floor")};
  c10::List<c10::optional<at::Tensor>> indices;
  for (auto& t : idx) indices.push_back(t);
  dense = at::index_put(dense, indices, features);
  return dense.permute({0, 4, 1, 2, 3});
}

// Rows of a dense B x C x X x Y x Z tensor at dense indices (coordinates -
// origin + shift) / stride.
inline at::Tensor Extract(const at::Tensor& dense, const at::Tensor& coordinates, int64_t origin,
                          int64_t stride = 1, int64_t shift = 0) {
  at::Tensor c = coordinates.to(at::kLong);
  at::Tensor d = dense.permute({0, 2, 3, 4, 1});
  c10::List<c10::optional<at::Tensor>> indices;
  indices.push_back(c.select(1, 0));
  for (int a = 1; a < 4; ++a) {
    indices.push_back((c.select(1, a) - origin + shift).div(stride, "floor"));
  }
  return at::index(d, indices);
}

// Our [K^3, Cin, Cout] weight as a dense conv3d weight [Cout, Cin, K, K, K].
inline at::Tensor DenseConvWeight(const at::Tensor& w, int64_t k) {
  return w.view({k, k, k, w.size(1), w.size(2)}).permute({4, 3, 0, 1, 2});
}
// ... and as a conv_transpose3d weight [Cin, Cout, K, K, K].
inline at::Tensor DenseConvTransposeWeight(const at::Tensor& w, int64_t k) {
  return w.view({k, k, k, w.size(1), w.size(2)}).permute({3, 4, 0, 1, 2});
}

// Low and high extents of a kernel's offsets (KernelOffsets): odd sizes are
// centred, even sizes run [0, k-1].
inline std::pair<int64_t, int64_t> KernelExtent(int64_t k) {
  const int64_t lo = (k % 2 == 1) ? (k - 1) / 2 : 0;
  return {lo, k - 1 - lo};
}

// Checks autograd against central differences along random projections:
// for every input element i, d(v . f)/dx_i from autograd must match
// (v . f(x + eps e_i) - v . f(x - eps e_i)) / 2 eps. float64 inputs.
// Returns the largest absolute error found.
inline double GradCheck(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                        std::vector<at::Tensor> inputs, double eps = 1e-6) {
  for (auto& t : inputs) t = t.detach().clone().requires_grad_(true);
  at::Tensor out = f(inputs);
  at::Tensor v = at::randn(out.sizes(), out.options());
  auto grads = torch::autograd::grad({(out * v).sum()}, inputs, {}, false, false, true);
  double worst = 0;
  torch::NoGradGuard no_grad;
  for (size_t t = 0; t < inputs.size(); ++t) {
    at::Tensor flat = inputs[t].view({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double orig = flat[i].item<double>();
      flat[i] = orig + eps;
      const double plus = (f(inputs) * v).sum().item<double>();
      flat[i] = orig - eps;
      const double minus = (f(inputs) * v).sum().item<double>();
      flat[i] = orig;
      const double numeric = (plus - minus) / (2 * eps);
      const double analytic = grads[t].defined() ? grads[t].view({-1})[i].item<double>() : 0.0;
      worst = std::max(worst, std::abs(numeric - analytic) / (1.0 + std::abs(numeric)));
    }
  }
  return worst;
}

// The message of the c10::Error that fn throws, or "no error".
inline std::string ErrorMessage(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

}  // namespace trainsup::sparse::testing

#endif  // TRAINSUP_TESTS_SPARSE_TEST_UTIL_H_
