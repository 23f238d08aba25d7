#include "sparse/voxel_grid.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "sparse/coordinates.h"

namespace trainsup::sparse {
namespace {

template <typename T>
std::string PointString(const T* p) {
  std::ostringstream s;
  s << "(" << static_cast<double>(p[0]) << ", " << static_cast<double>(p[1]) << ", "
    << static_cast<double>(p[2]) << ")";
  return s.str();
}

template <typename T>
VoxelGrid Voxelize(const T* points, int64_t n, double voxel_size) {
  if (!std::isfinite(voxel_size) || !(voxel_size > 0)) {
    std::ostringstream s;
    s << "voxel_size must be a positive number, got " << voxel_size;
    throw std::invalid_argument(s.str());
  }
  if (n < 0 || (n > 0 && points == nullptr)) throw std::invalid_argument("no points given");
  VoxelGrid grid;
  grid.inverse.resize(n);
  // First pass: every point's key; inverse[i] holds the voxel's
  // first-occurrence id until the ids are replaced by sorted ranks below.
  CoordinateHashMap seen(n);
  std::vector<uint64_t> unique;
  for (int64_t i = 0; i < n; ++i) {
    const T* p = points + 3 * i;
    int32_t v[3];
    for (int a = 0; a < 3; ++a) {
      const double q = std::floor(static_cast<double>(p[a]) / voxel_size);
      if (!std::isfinite(q) || q < kMinCoordinate || q > kMaxCoordinate) {
        std::ostringstream s;
        if (!std::isfinite(p[0]) || !std::isfinite(p[1]) || !std::isfinite(p[2])) {
          s << "point " << i << " is not finite: " << PointString(p);
        } else {
          s << "point " << i << " " << PointString(p)
            << " lies outside the representable voxel range at voxel size " << voxel_size
            << " (indices must be within [" << kMinCoordinate << ", " << kMaxCoordinate << "])";
        }
        throw std::invalid_argument(s.str());
      }
      v[a] = static_cast<int32_t>(q);
    }
    const uint64_t key = PackKey(0, v[0], v[1], v[2]);
    const int32_t id = static_cast<int32_t>(unique.size());
    const int32_t found = seen.Insert(key, id);
    if (found < 0) {
      unique.push_back(key);
      grid.inverse[i] = id;
    } else {
      grid.inverse[i] = found;
    }
  }
  // Keys are distinct, so sorting (key, id) pairs orders rows by (x, y, z).
  const int64_t v = static_cast<int64_t>(unique.size());
  std::vector<std::pair<uint64_t, int32_t>> order(v);
  for (int64_t r = 0; r < v; ++r) order[r] = {unique[r], static_cast<int32_t>(r)};
  std::sort(order.begin(), order.end());
  std::vector<int64_t> rank(v);
  grid.coordinates.resize(3 * v);
  for (int64_t r = 0; r < v; ++r) {
    rank[order[r].second] = r;
    int32_t full[4];
    UnpackKey(order[r].first, full);
    std::copy(full + 1, full + 4, grid.coordinates.begin() + 3 * r);
  }
  grid.counts.assign(v, 0);
  for (int64_t i = 0; i < n; ++i) {
    grid.inverse[i] = rank[grid.inverse[i]];
    ++grid.counts[grid.inverse[i]];
  }
  return grid;
}

template <typename T>
std::vector<T> Mean(const VoxelGrid& grid, const T* features, int64_t channels) {
  const int64_t n = static_cast<int64_t>(grid.inverse.size());
  if (channels < 0 || (n > 0 && channels > 0 && features == nullptr)) {
    throw std::invalid_argument("features must be N x C with C >= 0");
  }
  std::vector<T> out(grid.size() * channels, T(0));
  for (int64_t i = 0; i < n; ++i) {
    T* o = out.data() + grid.inverse[i] * channels;
    const T* f = features + i * channels;
    for (int64_t c = 0; c < channels; ++c) o[c] += f[c];
  }
  for (int64_t r = 0; r < grid.size(); ++r) {
    const T count = static_cast<T>(grid.counts[r]);
    for (int64_t c = 0; c < channels; ++c) out[r * channels + c] /= count;
  }
  return out;
}

template <typename L>
std::vector<L> Majority(const VoxelGrid& grid, const L* labels, L ignore_label) {
  const int64_t n = static_cast<int64_t>(grid.inverse.size());
  if (n > 0 && labels == nullptr) throw std::invalid_argument("no labels given");
  int64_t num_classes = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] == ignore_label) continue;
    if (labels[i] < 0) {
      std::ostringstream s;
      s << "label " << static_cast<int64_t>(labels[i]) << " of point " << i
        << " is negative and not the ignore label " << static_cast<int64_t>(ignore_label);
      throw std::invalid_argument(s.str());
    }
    num_classes = std::max(num_classes, static_cast<int64_t>(labels[i]) + 1);
  }
  if (num_classes > kMaxVoxelLabel + 1) {
    std::ostringstream s;
    s << "label " << num_classes - 1 << " is too large (labels must be at most " << kMaxVoxelLabel
      << ")";
    throw std::invalid_argument(s.str());
  }
  // Sorted (voxel, label) pairs: each voxel's longest run wins; runs come in
  // label order and only a strictly longer run replaces the best, so ties go
  // to the smaller label.
  std::vector<uint64_t> votes;
  votes.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] != ignore_label) {
      votes.push_back(static_cast<uint64_t>(grid.inverse[i]) << 16 |
                      static_cast<uint64_t>(labels[i]));
    }
  }
  std::sort(votes.begin(), votes.end());
  std::vector<L> out(grid.size(), ignore_label);
  std::vector<int64_t> best(grid.size(), 0);
  for (size_t i = 0; i < votes.size();) {
    size_t j = i;
    while (j < votes.size() && votes[j] == votes[i]) ++j;
    const int64_t row = static_cast<int64_t>(votes[i] >> 16);
    const int64_t run = static_cast<int64_t>(j - i);
    if (run > best[row]) {
      best[row] = run;
      out[row] = static_cast<L>(votes[i] & 0xFFFF);
    }
    i = j;
  }
  return out;
}

}  // namespace

VoxelGrid VoxelizePoints(const float* points, int64_t n, double voxel_size) {
  return Voxelize(points, n, voxel_size);
}

VoxelGrid VoxelizePoints(const double* points, int64_t n, double voxel_size) {
  return Voxelize(points, n, voxel_size);
}

std::vector<float> MeanFeatures(const VoxelGrid& grid, const float* features, int64_t channels) {
  return Mean(grid, features, channels);
}

std::vector<double> MeanFeatures(const VoxelGrid& grid, const double* features, int64_t channels) {
  return Mean(grid, features, channels);
}

std::vector<int32_t> MajorityLabels(const VoxelGrid& grid, const int32_t* labels,
                                    int32_t ignore_label) {
  return Majority(grid, labels, ignore_label);
}

std::vector<int64_t> MajorityLabels(const VoxelGrid& grid, const int64_t* labels,
                                    int64_t ignore_label) {
  return Majority(grid, labels, ignore_label);
}

}  // namespace trainsup::sparse
