// Ops on features alone: global pooling, concatenation, BatchNorm and
// activations.
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "sparse/backend.h"
#include "sparse/canonical_order.h"
#include "sparse/determinism.h"
#include "sparse/ops.h"

namespace trainsup::sparse {

at::Tensor GlobalPool(const SparseTensor& x, PoolMode mode) {
  TORCH_CHECK(x.defined(), "GlobalPool: undefined SparseTensor");
  const int64_t batch = x.batch_size();
  const at::Tensor& f = x.F();
  const at::TensorOptions index = f.options().dtype(at::kLong).requires_grad(false);
  at::Tensor order = at::arange(x.size(), index);
  if (IsDeterministic()) {
    const at::Tensor& key_order = x.manager()->OnDevice(x.set_id(), f.device()).order;
    if (key_order.defined()) order = key_order;
  }
  at::Tensor batch_of_row = x.C().select(1, 0).to(f.device()).index_select(0, order);
  std::vector<at::Tensor> rows;
  rows.reserve(batch);
  for (int64_t b = 0; b < batch; ++b) {
    at::Tensor idx = order.masked_select(batch_of_row == b);
    if (idx.numel() == 0) {
      rows.push_back(at::zeros({f.size(1)}, f.options()));
      continue;
    }
    at::Tensor part = f.index_select(0, idx);
    switch (mode) {
      case PoolMode::kMax:
        rows.push_back(std::get<0>(part.max(0)));
        break;
      case PoolMode::kAverage:
        rows.push_back(part.mean(0));
        break;
      case PoolMode::kSum:
        rows.push_back(part.sum(0));
        break;
    }
  }
  if (rows.empty()) return at::zeros({0, f.size(1)}, f.options());
  return at::stack(rows, 0);
}

SparseTensor Cat(const std::vector<SparseTensor>& xs) {
  TORCH_CHECK(!xs.empty(), "Cat: no tensors given");
  RECORD_USER_SCOPE("cat");
  std::vector<at::Tensor> features;
  features.reserve(xs.size());
  for (const auto& x : xs) {
    CheckSameCoordinates(xs[0], x, "Cat");
    TORCH_CHECK(x.F().scalar_type() == xs[0].F().scalar_type(), "Cat: dtype ", x.F().scalar_type(),
                " differs from ", xs[0].F().scalar_type());
    features.push_back(x.F());
  }
  return xs[0].WithFeatures(at::cat(features, 1));
}

SparseTensor BatchNorm(const SparseTensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                       double momentum, double eps, bool relu) {
  TORCH_CHECK(x.defined(), "BatchNorm: undefined SparseTensor");
  RECORD_USER_SCOPE("batch norm");
  const int64_t c = x.F().size(1);
  for (const at::Tensor* t : {&weight, &bias, &running_mean, &running_var}) {
    if (t->defined()) {
      TORCH_CHECK(t->dim() == 1 && t->size(0) == c, "BatchNorm: parameters must have ", c,
                  " entries (one per channel), got shape ", t->sizes());
    }
  }
  TORCH_CHECK(running_mean.defined() == running_var.defined(),
              "BatchNorm: give both running_mean and running_var, or neither");
  TORCH_CHECK(training || running_mean.defined(), "BatchNorm: evaluation needs running statistics");
  TORCH_CHECK(!training || x.size() > 1 || !running_mean.defined() || x.size() == 0,
              "BatchNorm: training needs more than one row per channel, got ", x.size());
  if (x.size() == 0) return x;
  return x.WithFeatures(InCanonicalOrder(x, [&](const at::Tensor& f) {
    if (training) {
      return BackendFor(f.device())
          .batch_norm_training(f, weight, bias, running_mean, running_var, momentum, eps, relu);
    }
    at::Tensor y = at::batch_norm(f, weight, bias, running_mean, running_var, training, momentum,
                                  eps, /*cudnn_enabled=*/false);
    return relu ? y.relu_() : y;
  }));
}

SparseTensor Relu(const SparseTensor& x) { return x.WithFeatures(at::relu(x.F())); }
SparseTensor ReluInPlace(const SparseTensor& x) {
  at::Tensor f = x.F();
  return x.WithFeatures(at::relu_(f));
}
SparseTensor LeakyRelu(const SparseTensor& x, double negative_slope) {
  return x.WithFeatures(at::leaky_relu(x.F(), negative_slope));
}
SparseTensor Elu(const SparseTensor& x, double alpha) {
  return x.WithFeatures(at::elu(x.F(), alpha));
}
SparseTensor Sigmoid(const SparseTensor& x) { return x.WithFeatures(at::sigmoid(x.F())); }
SparseTensor Tanh(const SparseTensor& x) { return x.WithFeatures(at::tanh(x.F())); }

}  // namespace trainsup::sparse
