#include "sparse/sparse_tensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace trainsup::sparse {
namespace {

void CheckFeatures(const at::Tensor& features, int64_t rows) {
  TORCH_CHECK(features.defined(), "features: undefined tensor");
  TORCH_CHECK(features.dim() == 2, "features must be N x C, got shape ", features.sizes());
  const at::ScalarType t = features.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf,
              "features must be float32, float64, bfloat16 or float16, got ", t);
  TORCH_CHECK(features.device().is_cpu() || features.device().is_cuda(),
              "features must be on the CPU or a CUDA device, got ", features.device());
  TORCH_CHECK(features.size(0) == rows, "features have ", features.size(0), " rows but there are ",
              rows, " coordinates");
}

}  // namespace

SparseTensor::SparseTensor(const at::Tensor& features, const at::Tensor& coordinates,
                           int32_t stride)
    : SparseTensor(features, coordinates, stride, std::make_shared<CoordinateManager>()) {}

SparseTensor::SparseTensor(const at::Tensor& features, const at::Tensor& coordinates,
                           int32_t stride, std::shared_ptr<CoordinateManager> manager)
    : features_(features), manager_(std::move(manager)) {
  TORCH_CHECK(manager_ != nullptr, "SparseTensor: null coordinate manager");
  TORCH_CHECK(features.defined() && features.dim() == 2, "features must be N x C, got shape ",
              features.defined() ? features.sizes() : at::IntArrayRef{});
  TORCH_CHECK(coordinates.dim() == 2 && coordinates.size(0) == features.size(0), "features have ",
              features.size(0), " rows but coordinates have shape ", coordinates.sizes());
  CheckFeatures(features, coordinates.size(0));
  set_ = manager_->AddCoordinates(coordinates, stride);
}

SparseTensor::SparseTensor(const at::Tensor& features, CoordinateSetId set,
                           std::shared_ptr<CoordinateManager> manager)
    : features_(features), set_(set), manager_(std::move(manager)) {
  TORCH_CHECK(manager_ != nullptr, "SparseTensor: null coordinate manager");
  CheckFeatures(features, manager_->Meta(set).size());
}

const at::Tensor& SparseTensor::coordinates() const {
  TORCH_CHECK(defined(), "SparseTensor is empty (default-constructed)");
  return manager_->Set(set_).coordinates;
}

int32_t SparseTensor::stride() const {
  TORCH_CHECK(defined(), "SparseTensor is empty (default-constructed)");
  return manager_->Meta(set_).stride;
}

int32_t SparseTensor::batch_size() const {
  TORCH_CHECK(defined(), "SparseTensor is empty (default-constructed)");
  return manager_->Set(set_).batch_size;
}

SparseTensor SparseTensor::WithFeatures(const at::Tensor& features) const {
  return SparseTensor(features, set_, manager_);
}

void CheckSameCoordinates(const SparseTensor& a, const SparseTensor& b, const char* what) {
  TORCH_CHECK(a.defined() && b.defined(), what, ": undefined SparseTensor");
  TORCH_CHECK(a.manager() == b.manager(), what,
              ": the tensors belong to different coordinate managers");
  TORCH_CHECK(a.set_id() == b.set_id(), what, ": the tensors are on different coordinate sets (",
              "stride ", a.stride(), " with ", a.size(), " rows vs stride ", b.stride(), " with ",
              b.size(), " rows)");
}

}  // namespace trainsup::sparse
