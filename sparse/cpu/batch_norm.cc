#include "sparse/cpu/batch_norm.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "sparse/backend.h"

namespace trainsup::sparse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per block of the reductions. Fixed (not per thread): the blocks and
// the order they are combined in depend on the row count alone.
constexpr int64_t kBlockRows = 256;

int64_t Blocks(int64_t rows) { return (rows + kBlockRows - 1) / kBlockRows; }

// Mean and sum of squared deviations of the rows [r0, r1) per channel:
// the block is read twice while it sits in L2, memory once.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void BlockMoments(
    const T* __restrict x, int64_t r0, int64_t r1, int64_t c, T* __restrict mean,
    T* __restrict m2) {
  std::fill(mean, mean + c, T(0));
  std::fill(m2, m2 + c, T(0));
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * c;
    for (int64_t j = 0; j < c; ++j) mean[j] += row[j];
  }
  const T inv = T(1) / static_cast<T>(r1 - r0);
  for (int64_t j = 0; j < c; ++j) mean[j] *= inv;
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const T d = row[j] - mean[j];
      m2[j] += d * d;
    }
  }
}

// y = x * scale + shift, then max(y, 0) if relu; rows [r0, r1).
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void BlockAffine(
    const T* __restrict x, int64_t r0, int64_t r1, int64_t c, const T* __restrict scale,
    const T* __restrict shift, bool relu, T* __restrict y) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * c;
    T* out = y + r * c;
    if (relu) {
      for (int64_t j = 0; j < c; ++j) out[j] = std::max(row[j] * scale[j] + shift[j], T(0));
    } else {
      for (int64_t j = 0; j < c; ++j) out[j] = row[j] * scale[j] + shift[j];
    }
  }
}

// Backward sums over rows [r0, r1): sum_g += g, sum_gx += g (x - mean),
// where g is the output gradient, zero where the ReLU cut (its input
// x * scale + shift, recomputed from x by the same expression as forward,
// was not positive; the compiler may contract either into a fused
// multiply-add, so within a rounding step of 0 the two can disagree).
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void BlockGradSums(
    const T* __restrict x, const T* __restrict dy, int64_t r0, int64_t r1, int64_t c,
    const T* __restrict mean, const T* __restrict scale, const T* __restrict shift, bool relu,
    T* __restrict sum_g, T* __restrict sum_gx) {
  std::fill(sum_g, sum_g + c, T(0));
  std::fill(sum_gx, sum_gx + c, T(0));
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * c;
    const T* grow = dy + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const T g = relu && !(row[j] * scale[j] + shift[j] > T(0)) ? T(0) : grow[j];
      sum_g[j] += g;
      sum_gx[j] += g * (row[j] - mean[j]);
    }
  }
}

// dx = a (g - k1 - (x - mean) k2) over rows [r0, r1).
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void BlockInputGrad(
    const T* __restrict x, const T* __restrict dy, int64_t r0, int64_t r1, int64_t c,
    const T* __restrict mean, const T* __restrict scale, const T* __restrict shift, bool relu,
    const T* __restrict a, const T* __restrict k1, const T* __restrict k2, T* __restrict dx) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * c;
    const T* grow = dy + r * c;
    T* out = dx + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const T g = relu && !(row[j] * scale[j] + shift[j] > T(0)) ? T(0) : grow[j];
      out[j] = a[j] * (g - k1[j] - (row[j] - mean[j]) * k2[j]);
    }
  }
}

// Runs fn(block, r0, r1) for every block of rows, blocks in parallel.
template <typename Fn>
void ForEachBlock(int64_t rows, const Fn& fn) {
  at::parallel_for(0, Blocks(rows), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b, b * kBlockRows, std::min(rows, (b + 1) * kBlockRows));
  });
}

struct Moments {
  std::vector<double> mean, var;  // biased variance
};

// Per-block moments combined in block order (Chan et al.'s update).
template <typename T>
Moments RowMoments(const T* x, int64_t rows, int64_t c) {
  const int64_t blocks = Blocks(rows);
  std::vector<T> bmean(static_cast<size_t>(blocks * c)), bm2(static_cast<size_t>(blocks * c));
  ForEachBlock(rows, [&](int64_t b, int64_t r0, int64_t r1) {
    BlockMoments(x, r0, r1, c, bmean.data() + b * c, bm2.data() + b * c);
  });
  Moments m{std::vector<double>(c, 0.0), std::vector<double>(c, 0.0)};
  std::vector<double> m2(c, 0.0);
  double n = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const double nb = static_cast<double>(std::min(rows, (b + 1) * kBlockRows) - b * kBlockRows);
    const double total = n + nb;
    for (int64_t j = 0; j < c; ++j) {
      const double delta = static_cast<double>(bmean[b * c + j]) - m.mean[j];
      m.mean[j] += delta * nb / total;
      m2[j] += static_cast<double>(bm2[b * c + j]) + delta * delta * n * nb / total;
    }
    n = total;
  }
  for (int64_t j = 0; j < c; ++j) m.var[j] = m2[j] / n;
  return m;
}

struct RunningStats {
  at::Tensor mean, var;  // both undefined, or both updated in place
};

class BatchNormFunction : public torch::autograd::Function<BatchNormFunction> {
 public:
  // Running statistics come by pointer: autograd takes every tensor
  // argument for an input, and they may be undefined.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const RunningStats* running, double momentum,
                            double eps, bool relu) {
    const at::Tensor& running_mean = running->mean;
    const at::Tensor& running_var = running->var;
    // Half features: the arithmetic in float32 on a copy, and backward
    // keeps the half input (Backend::batch_norm_training).
    const at::Tensor kept = input.contiguous();
    at::Tensor x = kept.to(AccumulateType(kept.scalar_type()));
    const int64_t rows = x.size(0), c = x.size(1);
    at::Tensor y = at::empty_like(x);
    // Per channel, in the features' dtype: mean, scale = w / std, shift.
    at::Tensor stats = at::empty({3, c}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sparse_batch_norm_forward", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const Moments m = RowMoments(xp, rows, c);
      scalar_t* mean = stats[0].data_ptr<scalar_t>();
      scalar_t* scale = stats[1].data_ptr<scalar_t>();
      scalar_t* shift = stats[2].data_ptr<scalar_t>();
      const at::Tensor w = weight.to(at::kDouble).contiguous();
      const at::Tensor b = bias.to(at::kDouble).contiguous();
      for (int64_t j = 0; j < c; ++j) {
        const double invstd = 1.0 / std::sqrt(m.var[j] + eps);
        const double wj = w.data_ptr<double>()[j];
        const double bj = b.data_ptr<double>()[j];
        mean[j] = static_cast<scalar_t>(m.mean[j]);
        scale[j] = static_cast<scalar_t>(wj * invstd);
        shift[j] = static_cast<scalar_t>(bj - m.mean[j] * wj * invstd);
      }
      ForEachBlock(rows, [&](int64_t, int64_t r0, int64_t r1) {
        BlockAffine(xp, r0, r1, c, scale, shift, relu, y.data_ptr<scalar_t>());
      });
      if (running_mean.defined()) {
        at::NoGradGuard no_grad;
        const double unbias =
            rows > 1 ? static_cast<double>(rows) / static_cast<double>(rows - 1) : 1.0;
        at::Tensor mean_t = at::tensor(m.mean, at::kDouble).to(running_mean.scalar_type());
        at::Tensor var_t = (at::tensor(m.var, at::kDouble) * unbias).to(running_var.scalar_type());
        running_mean.mul_(1.0 - momentum).add_(mean_t, momentum);
        running_var.mul_(1.0 - momentum).add_(var_t, momentum);
      }
      std::vector<double> invstd(c);
      for (int64_t j = 0; j < c; ++j) invstd[j] = 1.0 / std::sqrt(m.var[j] + eps);
      ctx->saved_data["invstd"] = c10::List<double>(invstd);
    });
    ctx->save_for_backward({kept, weight, stats});
    ctx->saved_data["relu"] = relu;
    return y.to(kept.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The forward's scope is BatchNorm's in functional.cc, for every backend.
    RECORD_USER_SCOPE("batch norm backward");
    auto saved = ctx->get_saved_variables();
    const at::ScalarType type = saved[0].scalar_type();
    const at::Tensor x = saved[0].to(AccumulateType(type));
    const at::Tensor& weight = saved[1];
    const at::Tensor& stats = saved[2];
    const bool relu = ctx->saved_data["relu"].toBool();
    const c10::List<double> invstd = ctx->saved_data["invstd"].toDoubleList();
    at::Tensor dy = grad_outputs[0].to(AccumulateType(type)).contiguous();
    const int64_t rows = x.size(0), c = x.size(1);
    at::Tensor dx = at::empty_like(x);
    std::vector<double> sum_g(c, 0.0), sum_gx(c, 0.0);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sparse_batch_norm_backward", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* gp = dy.data_ptr<scalar_t>();
      const scalar_t* mean = stats[0].data_ptr<scalar_t>();
      const scalar_t* scale = stats[1].data_ptr<scalar_t>();
      const scalar_t* shift = stats[2].data_ptr<scalar_t>();
      const int64_t blocks = Blocks(rows);
      std::vector<scalar_t> bg(static_cast<size_t>(blocks * c)),
          bgx(static_cast<size_t>(blocks * c));
      ForEachBlock(rows, [&](int64_t b, int64_t r0, int64_t r1) {
        BlockGradSums(xp, gp, r0, r1, c, mean, scale, shift, relu, bg.data() + b * c,
                      bgx.data() + b * c);
      });
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t j = 0; j < c; ++j) {
          sum_g[j] += static_cast<double>(bg[b * c + j]);
          sum_gx[j] += static_cast<double>(bgx[b * c + j]);
        }
      }
      const at::Tensor w = weight.to(at::kDouble).contiguous();
      std::vector<scalar_t> a(c), k1(c), k2(c);
      const double n = static_cast<double>(rows);
      for (int64_t j = 0; j < c; ++j) {
        const double wj = w.data_ptr<double>()[j];
        a[j] = static_cast<scalar_t>(wj * invstd[j]);
        k1[j] = static_cast<scalar_t>(sum_g[j] / n);
        k2[j] = static_cast<scalar_t>(invstd[j] * invstd[j] * sum_gx[j] / n);
      }
      ForEachBlock(rows, [&](int64_t, int64_t r0, int64_t r1) {
        BlockInputGrad(xp, gp, r0, r1, c, mean, scale, shift, relu, a.data(), k1.data(), k2.data(),
                       dx.data_ptr<scalar_t>());
      });
    });
    std::vector<double> gw(c);
    for (int64_t j = 0; j < c; ++j) gw[j] = sum_gx[j] * invstd[j];
    at::Tensor grad_w = at::tensor(gw, at::kDouble).to(weight.scalar_type());
    at::Tensor grad_b = at::tensor(sum_g, at::kDouble).to(weight.scalar_type());
    return {dx.to(type), grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor BatchNormTrainingRows(const at::Tensor& features, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& running_mean,
                                 const at::Tensor& running_var, double momentum, double eps,
                                 bool relu) {
  TORCH_CHECK(features.dim() == 2, "BatchNorm: features must be [N, C], got shape ",
              features.sizes());
  // Without affine parameters: weight 1 and bias 0 that need no gradient.
  const int64_t c = features.size(1);
  const at::TensorOptions params =
      features.options().dtype(AccumulateType(features.scalar_type())).requires_grad(false);
  const at::Tensor w = weight.defined() ? weight : at::ones({c}, params);
  const at::Tensor b = bias.defined() ? bias : at::zeros({c}, params);
  const RunningStats running{running_mean, running_var};
  return BatchNormFunction::apply(features, w, b, &running, momentum, eps, relu);
}

}  // namespace trainsup::sparse
