#include "sparse/quantize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "sparse/coordinates.h"
#include "sparse/voxel_grid.h"

namespace trainsup::sparse {

Quantized Quantize(const at::Tensor& points, double voxel_size, const at::Tensor& features,
                   const at::Tensor& labels, int64_t ignore_label) {
  TORCH_CHECK(points.defined() && points.dim() == 2 && points.size(1) == 3,
              "Quantize: points must be N x 3, got shape ",
              points.defined() ? points.sizes() : at::IntArrayRef{});
  TORCH_CHECK(points.scalar_type() == at::kFloat || points.scalar_type() == at::kDouble,
              "Quantize: points must be float32 or float64, got ", points.scalar_type());
  TORCH_CHECK(std::isfinite(voxel_size) && voxel_size > 0,
              "Quantize: voxel_size must be a positive number, got ", voxel_size);
  const int64_t n = points.size(0);
  TORCH_CHECK(points.is_cpu() && (!features.defined() || features.is_cpu()) &&
                  (!labels.defined() || labels.is_cpu()),
              "Quantize: points, features and labels must be CPU tensors");
  if (features.defined()) {
    TORCH_CHECK(features.dim() == 2 && features.size(0) == n, "Quantize: features must be ", n,
                " x C to match the points, got shape ", features.sizes());
    TORCH_CHECK(features.is_floating_point(), "Quantize: features must be floating point, got ",
                features.scalar_type());
  }
  if (labels.defined()) {
    TORCH_CHECK(labels.dim() == 1 && labels.size(0) == n, "Quantize: ", labels.numel(),
                " labels for ", n, " points");
    TORCH_CHECK(!labels.is_floating_point(), "Quantize: labels must be integers, got ",
                labels.scalar_type());
  }
  // The work is VoxelizePoints / MeanFeatures / MajorityLabels (voxel_grid.h),
  // shared with the worker's torch-free loader; this wraps it in tensors.
  try {
    at::Tensor p = points.contiguous();
    VoxelGrid grid = p.scalar_type() == at::kFloat
                         ? VoxelizePoints(p.data_ptr<float>(), n, voxel_size)
                         : VoxelizePoints(p.data_ptr<double>(), n, voxel_size);
    const int64_t v = grid.size();
    Quantized out;
    out.coordinates = at::empty({v, 3}, at::kInt);
    std::copy(grid.coordinates.begin(), grid.coordinates.end(),
              out.coordinates.data_ptr<int32_t>());
    out.inverse = at::empty({n}, at::kLong);
    std::copy(grid.inverse.begin(), grid.inverse.end(), out.inverse.data_ptr<int64_t>());
    out.counts = at::empty({v}, at::kLong);
    std::copy(grid.counts.begin(), grid.counts.end(), out.counts.data_ptr<int64_t>());
    if (features.defined()) {
      const int64_t c = features.size(1);
      if (features.scalar_type() == at::kDouble) {
        at::Tensor f = features.contiguous();
        std::vector<double> mean = MeanFeatures(grid, f.data_ptr<double>(), c);
        out.features = at::empty({v, c}, at::kDouble);
        std::copy(mean.begin(), mean.end(), out.features.data_ptr<double>());
      } else {
        // float32, and the narrower types averaged in float32.
        at::Tensor f = features.to(at::kFloat).contiguous();
        std::vector<float> mean = MeanFeatures(grid, f.data_ptr<float>(), c);
        out.features = at::empty({v, c}, at::kFloat);
        std::copy(mean.begin(), mean.end(), out.features.data_ptr<float>());
        out.features = out.features.to(features.scalar_type());
      }
    }
    if (labels.defined()) {
      at::Tensor l = labels.to(at::kLong).contiguous();
      std::vector<int64_t> majority = MajorityLabels(grid, l.data_ptr<int64_t>(), ignore_label);
      out.labels = at::empty({v}, at::kLong);
      std::copy(majority.begin(), majority.end(), out.labels.data_ptr<int64_t>());
    }
    return out;
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "Quantize: ", e.what());
  }
}

Collated Collate(const std::vector<at::Tensor>& coordinates,
                 const std::vector<at::Tensor>& features, const std::vector<at::Tensor>& labels) {
  const size_t b = coordinates.size();
  TORCH_CHECK(features.empty() || features.size() == b, "Collate: ", features.size(),
              " feature tensors for ", b, " scenes");
  TORCH_CHECK(labels.empty() || labels.size() == b, "Collate: ", labels.size(),
              " label tensors for ", b, " scenes");
  TORCH_CHECK(static_cast<int64_t>(b) <= kMaxBatchIndex + 1, "Collate: ", b,
              " scenes exceed the batch limit of ", kMaxBatchIndex + 1);
  Collated out;
  out.offsets.push_back(0);
  std::vector<at::Tensor> coords;
  for (size_t i = 0; i < b; ++i) {
    const at::Tensor& c = coordinates[i];
    TORCH_CHECK(c.dim() == 2 && c.size(1) == 3 && !c.is_floating_point(), "Collate: scene ", i,
                " coordinates must be V x 3 integers, got shape ", c.sizes(), " ", c.scalar_type());
    if (!features.empty()) {
      TORCH_CHECK(features[i].dim() == 2 && features[i].size(0) == c.size(0), "Collate: scene ", i,
                  " has ", c.size(0), " coordinates but features of shape ", features[i].sizes());
    }
    if (!labels.empty()) {
      TORCH_CHECK(labels[i].dim() == 1 && labels[i].size(0) == c.size(0), "Collate: scene ", i,
                  " has ", c.size(0), " coordinates but ", labels[i].numel(), " labels");
    }
    at::Tensor bcol = at::full({c.size(0), 1}, static_cast<int64_t>(i), at::kLong);
    coords.push_back(at::cat({bcol, c.to(at::kLong)}, 1));
    out.offsets.push_back(out.offsets.back() + c.size(0));
  }
  out.coordinates = b == 0 ? at::empty({0, 4}, at::kInt) : at::cat(coords, 0);
  if (b > 0) {
    auto spatial = out.coordinates.slice(1, 1, 4);
    TORCH_CHECK(!(spatial < kMinCoordinate).logical_or(spatial > kMaxCoordinate).any().item<bool>(),
                "Collate: a coordinate lies outside [", kMinCoordinate, ", ", kMaxCoordinate, "]");
    out.coordinates = out.coordinates.to(at::kInt);
  }
  if (!features.empty() && b > 0) out.features = at::cat(features, 0);
  if (!labels.empty() && b > 0) out.labels = at::cat(labels, 0);
  return out;
}

std::vector<at::Tensor> Decollate(const at::Tensor& batched_rows, const at::Tensor& coordinates,
                                  int64_t batch_size) {
  TORCH_CHECK(coordinates.dim() == 2 && coordinates.size(1) == 4,
              "Decollate: coordinates must be N x 4, got shape ", coordinates.sizes());
  TORCH_CHECK(batched_rows.size(0) == coordinates.size(0), "Decollate: ", batched_rows.size(0),
              " rows for ", coordinates.size(0), " coordinates");
  std::vector<at::Tensor> out;
  at::Tensor batch = coordinates.select(1, 0);
  for (int64_t b = 0; b < batch_size; ++b) {
    out.push_back(batched_rows.index_select(0, (batch == b).nonzero().select(1, 0)));
  }
  return out;
}

}  // namespace trainsup::sparse
