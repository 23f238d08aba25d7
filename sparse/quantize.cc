#include "sparse/quantize.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "sparse/coordinates.h"

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
  at::Tensor p = points.to(at::kDouble).contiguous();
  const double* pd = p.data_ptr<double>();
  std::vector<uint64_t> keys(n);
  std::atomic<int64_t> bad_row{n};
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int32_t v[3];
      bool ok = true;
      for (int a = 0; a < 3; ++a) {
        const double q = std::floor(pd[3 * i + a] / voxel_size);
        if (!std::isfinite(q) || q < kMinCoordinate || q > kMaxCoordinate) {
          ok = false;
          break;
        }
        v[a] = static_cast<int32_t>(q);
      }
      if (!ok) {
        int64_t cur = bad_row.load();
        while (i < cur && !bad_row.compare_exchange_weak(cur, i)) {
        }
        continue;
      }
      keys[i] = PackKey(0, v[0], v[1], v[2]);
    }
  });
  if (bad_row.load() < n) {
    const int64_t r = bad_row.load();
    const double* q = pd + 3 * r;
    if (!std::isfinite(q[0]) || !std::isfinite(q[1]) || !std::isfinite(q[2])) {
      TORCH_CHECK(false, "Quantize: point ", r, " is not finite: (", q[0], ", ", q[1], ", ", q[2],
                  ")");
    }
    TORCH_CHECK(false, "Quantize: point ", r, " (", q[0], ", ", q[1], ", ", q[2],
                ") lies outside the representable voxel range at voxel size ", voxel_size,
                " (indices must be within [", kMinCoordinate, ", ", kMaxCoordinate, "])");
  }
  // Unique keys in sorted order, then every point's voxel row.
  CoordinateHashMap seen(n);
  std::vector<uint64_t> unique;
  for (int64_t i = 0; i < n; ++i) {
    if (seen.Insert(keys[i], 0) < 0) unique.push_back(keys[i]);
  }
  std::sort(unique.begin(), unique.end());
  const int64_t v = static_cast<int64_t>(unique.size());
  CoordinateHashMap rows(v);
  for (int64_t r = 0; r < v; ++r) rows.Insert(unique[r], static_cast<int32_t>(r));

  Quantized out;
  out.coordinates = at::empty({v, 3}, at::kInt);
  int32_t* c = out.coordinates.data_ptr<int32_t>();
  for (int64_t r = 0; r < v; ++r) {
    int32_t full[4];
    UnpackKey(unique[r], full);
    std::copy(full + 1, full + 4, c + 3 * r);
  }
  out.inverse = at::empty({n}, at::kLong);
  int64_t* inv = out.inverse.data_ptr<int64_t>();
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) inv[i] = rows.Find(keys[i]);
  });
  out.counts = at::zeros({v}, at::kLong);
  out.counts.index_add_(0, out.inverse, at::ones({n}, at::kLong));
  if (features.defined()) {
    at::Tensor sum = at::zeros({v, features.size(1)}, features.options());
    sum.index_add_(0, out.inverse, features);
    out.features = sum / out.counts.unsqueeze(1).to(features.scalar_type());
  }
  if (labels.defined()) {
    at::Tensor l = labels.to(at::kLong).contiguous();
    const int64_t* ld = l.data_ptr<int64_t>();
    int64_t num_classes = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (ld[i] == ignore_label) continue;
      TORCH_CHECK(ld[i] >= 0, "Quantize: label ", ld[i], " of point ", i,
                  " is negative and not the ignore label ", ignore_label);
      num_classes = std::max(num_classes, ld[i] + 1);
    }
    TORCH_CHECK(num_classes <= 65536, "Quantize: label ", num_classes - 1,
                " is too large (labels must be at most 65535)");
    // Sort (voxel, label) pairs and take each voxel's longest run; runs are
    // in label order, so ties go to the smaller label.
    std::vector<uint64_t> votes;
    votes.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      if (ld[i] != ignore_label) votes.push_back(static_cast<uint64_t>(inv[i]) << 16 | ld[i]);
    }
    std::sort(votes.begin(), votes.end());
    out.labels = at::full({v}, ignore_label, at::kLong);
    int64_t* ol = out.labels.data_ptr<int64_t>();
    std::vector<int64_t> best(v, 0);
    for (size_t i = 0; i < votes.size();) {
      size_t j = i;
      while (j < votes.size() && votes[j] == votes[i]) ++j;
      const int64_t row = static_cast<int64_t>(votes[i] >> 16);
      const int64_t run = static_cast<int64_t>(j - i);
      if (run > best[row]) {
        best[row] = run;
        ol[row] = static_cast<int64_t>(votes[i] & 0xFFFF);
      }
      i = j;
    }
  }
  return out;
}

Collated Collate(const std::vector<at::Tensor>& coordinates, const std::vector<at::Tensor>& features,
                 const std::vector<at::Tensor>& labels) {
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
      TORCH_CHECK(features[i].dim() == 2 && features[i].size(0) == c.size(0), "Collate: scene ",
                  i, " has ", c.size(0), " coordinates but features of shape ",
                  features[i].sizes());
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
