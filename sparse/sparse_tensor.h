// SparseTensor: features on a set of integer coordinates.
#ifndef TRAINSUP_SPARSE_SPARSE_TENSOR_H_
#define TRAINSUP_SPARSE_SPARSE_TENSOR_H_

#include <ATen/Tensor.h>

#include <memory>

#include "sparse/coordinate_manager.h"

namespace trainsup::sparse {

// bfloat16 or float16: the half-precision features of mixed precision
// (docs/engine.md, "Mixed precision"), which the engine accumulates in
// float32, with float32 weights.
inline bool IsHalf(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }
// The type that sums of `t` are accumulated in: float32 for the half
// types, else `t` itself.
inline at::ScalarType AccumulateType(at::ScalarType t) { return IsHalf(t) ? at::kFloat : t; }

// Row i of features() belongs to row i of coordinates(). Tensors derived
// from one another share a coordinate manager, which caches the kernel maps
// between their coordinate sets. Copies share features (like at::Tensor).
class SparseTensor {
 public:
  SparseTensor() = default;

  // Registers `coordinates` (N x 4 int32/int64: batch, x, y, z) with a new
  // coordinate manager at tensor stride `stride`. `features` is N x C,
  // float32 or float64, or bfloat16 or float16 (mixed precision, with
  // float32 weights: docs/engine.md), on the CPU or a CUDA device. Throws c10::Error on bad shapes,
  // dtypes, out-of-range or duplicate coordinates.
  SparseTensor(const at::Tensor& features, const at::Tensor& coordinates, int32_t stride = 1);

  // Same, registering the coordinates with an existing manager (so several
  // inputs share kernel maps).
  SparseTensor(const at::Tensor& features, const at::Tensor& coordinates, int32_t stride,
               std::shared_ptr<CoordinateManager> manager);

  // Features on a coordinate set that `manager` already holds.
  SparseTensor(const at::Tensor& features, CoordinateSetId set,
               std::shared_ptr<CoordinateManager> manager);

  const at::Tensor& features() const { return features_; }
  const at::Tensor& F() const { return features_; }
  // N x 4 int32 (batch, x, y, z); shared with the manager, do not modify.
  const at::Tensor& coordinates() const;
  const at::Tensor& C() const { return coordinates(); }
  int32_t stride() const;
  CoordinateSetId set_id() const { return set_; }
  const std::shared_ptr<CoordinateManager>& manager() const { return manager_; }
  int64_t size() const { return features_.defined() ? features_.size(0) : 0; }
  int64_t channels() const { return features_.size(1); }
  int32_t batch_size() const;
  bool defined() const { return manager_ != nullptr; }

  // A tensor on the same coordinates with other features (same rows).
  SparseTensor WithFeatures(const at::Tensor& features) const;

 private:
  at::Tensor features_;
  CoordinateSetId set_ = -1;
  std::shared_ptr<CoordinateManager> manager_;
};

// Throws c10::Error unless `a` and `b` share manager and coordinate set;
// `what` names the operation in the message.
void CheckSameCoordinates(const SparseTensor& a, const SparseTensor& b, const char* what);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_SPARSE_TENSOR_H_
