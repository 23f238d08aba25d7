// Voxelization on raw arrays, without LibTorch: unique voxels of a point
// set, every point's voxel, mean features and majority labels per voxel.
//
// Why torch-free: the worker's loader voxelizes the next batches on a
// background thread while the current batch trains. Done with plain vectors,
// that memory never goes through LibTorch's allocator, so it is not counted
// against the training step's memory budget (docs/design.md, "Training under a
// memory budget"), and the loader runs without touching LibTorch's state.
// sparse::Quantize (quantize.h) is a thin tensor wrapper over these
// functions, so both paths give the same voxels, bit for bit.
//
// Errors throw std::invalid_argument naming the first bad row (as
// GenerateScene does); Quantize turns them into c10::Error.
#ifndef TRAINSUP_SPARSE_VOXEL_GRID_H_
#define TRAINSUP_SPARSE_VOXEL_GRID_H_

#include <cstdint>
#include <vector>

namespace trainsup::sparse {

// Labels must lie in [0, kMaxVoxelLabel] (or be the ignore label): the
// majority vote packs a label into 16 bits.
inline constexpr int64_t kMaxVoxelLabel = 65535;

// The voxels of N points. Voxel rows are sorted by (x, y, z).
struct VoxelGrid {
  std::vector<int32_t> coordinates;  // V*3: voxel indices x y z of row r at 3r.
  std::vector<int64_t> inverse;      // N: the voxel row of every point.
  std::vector<int64_t> counts;       // V: points per voxel, each >= 1.

  // Number of voxels V.
  int64_t size() const { return static_cast<int64_t>(counts.size()); }
};

// Voxelizes `n` points (points[3i .. 3i+2] = x y z): point p lands in voxel
// floor(p / voxel_size), computed in double. voxel_size must be finite and
// positive; every point must be finite and its voxel indices within
// [kMinCoordinate, kMaxCoordinate] (coordinates.h). Throws
// std::invalid_argument otherwise: "point 7 is not finite: (...)", "point 7
// (...) lies outside the representable voxel range at voxel size ...".
VoxelGrid VoxelizePoints(const float* points, int64_t n, double voxel_size);
VoxelGrid VoxelizePoints(const double* points, int64_t n, double voxel_size);

// The mean of each voxel's point features: features is N*C (row i at C*i),
// the result V*C. Sums are taken in the feature type, in point order, and
// divided by the count converted to that type.
std::vector<float> MeanFeatures(const VoxelGrid& grid, const float* features, int64_t channels);
std::vector<double> MeanFeatures(const VoxelGrid& grid, const double* features, int64_t channels);

// The majority label of each voxel's points (N labels in, V out). Points
// labelled `ignore_label` do not vote; a voxel without votes gets
// ignore_label; ties go to the smaller label. Every other label must be in
// [0, kMaxVoxelLabel]; throws std::invalid_argument otherwise: "label -7 of
// point 1 is negative and not the ignore label -1", "label 70000 is too
// large (labels must be at most 65535)".
std::vector<int32_t> MajorityLabels(const VoxelGrid& grid, const int32_t* labels,
                                    int32_t ignore_label);
std::vector<int64_t> MajorityLabels(const VoxelGrid& grid, const int64_t* labels,
                                    int64_t ignore_label);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_VOXEL_GRID_H_
