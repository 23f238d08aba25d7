// From points to voxels: quantization of one scene, and collation of
// several scenes into one batched coordinate set (and back).
#ifndef TRAINSUP_SPARSE_QUANTIZE_H_
#define TRAINSUP_SPARSE_QUANTIZE_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace trainsup::sparse {

inline constexpr int64_t kDefaultIgnoreLabel = -100;

struct Quantized {
  at::Tensor coordinates;  // V x 3 int32 voxel indices, sorted by (x, y, z).
  at::Tensor features;     // V x C: mean of the voxel's point features (if given).
  at::Tensor labels;       // V int64: majority label (if given); ties go to the
                           // smaller label; ignore_label where no point votes.
  at::Tensor inverse;      // N int64: voxel row of every point.
  at::Tensor counts;       // V int64: points per voxel.
};

// points: N x 3 float32/float64, finite. voxel_size > 0. features: N x C
// float (optional). labels: N integer (optional), each >= 0 or ignore_label.
// A point p lands in voxel floor(p / voxel_size). All inputs on the CPU.
// Throws c10::Error naming the first bad row (non-finite point, voxel index
// out of range, negative label) or the mismatched size. The work is done by
// the torch-free voxel_grid.h, which the worker's loader also uses, so both
// give the same voxels.
Quantized Quantize(const at::Tensor& points, double voxel_size,
                   const at::Tensor& features = at::Tensor(),
                   const at::Tensor& labels = at::Tensor(),
                   int64_t ignore_label = kDefaultIgnoreLabel);

struct Collated {
  at::Tensor coordinates;        // N x 4 int32: batch, x, y, z.
  at::Tensor features;           // N x C (if given).
  at::Tensor labels;             // N (if given).
  std::vector<int64_t> offsets;  // B + 1: rows of scene b are [offsets[b], offsets[b+1]).
};

// Stacks scenes (coordinates V_b x 3 integer; features V_b x C; labels V_b)
// into one batch, scene b getting batch index b. features and labels are
// either empty vectors or one tensor per scene.
Collated Collate(const std::vector<at::Tensor>& coordinates,
                 const std::vector<at::Tensor>& features = {},
                 const std::vector<at::Tensor>& labels = {});

// Splits batched rows back per scene: rows of batch index b, in row order.
std::vector<at::Tensor> Decollate(const at::Tensor& batched_rows, const at::Tensor& coordinates,
                                  int64_t batch_size);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_QUANTIZE_H_
