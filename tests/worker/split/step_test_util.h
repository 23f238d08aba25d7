// Helpers of the tests that run ForwardBackward (worker/split/step.h) on
// the synthetic rooms: a batch of scenes, copies and errors of tensors.
#ifndef TRAINSUP_TESTS_WORKER_SPLIT_STEP_TEST_UTIL_H_
#define TRAINSUP_TESTS_WORKER_SPLIT_STEP_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sparse/minkunet.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"

namespace trainsup::worker {

inline constexpr int kChannels = 3;  // the synthetic rooms' rgb
inline constexpr int kClasses = 4;   // sparse::kNumSceneClasses

// Scenes [0, n) of the synthetic "small" rooms, voxelized without
// augmentation at `voxel_size`, as one batch.
inline Batch SyntheticBatch(int n, double voxel_size, const std::string& distribution = "uniform") {
  DataSpec data;
  data.format = "synthetic";
  data.scenes = n;
  data.scene_size = "small";
  data.size_distribution = distribution;
  data.val_fraction = 0;
  ModelSpec model;
  model.voxel_size = voxel_size;
  absl::StatusOr<std::unique_ptr<Dataset>> dataset = OpenDataset(data, model, 7, Split::kTrain);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  Batch batch;
  if (!dataset.ok()) return batch;
  LoaderOptions lo;
  lo.voxel_size = voxel_size;
  lo.augment = false;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<VoxelScene> scene = PrepareScene(**dataset, i, 0, lo);
    EXPECT_TRUE(scene.ok()) << scene.status();
    if (scene.ok()) batch.scenes.push_back(std::move(*scene));
  }
  batch.cursor_end = n;
  return batch;
}

// The batch of scene `k` of `batch` alone.
inline Batch OneScene(const Batch& batch, size_t k) {
  Batch one;
  one.scenes.push_back(batch.scenes[k]);
  one.cursor_end = 1;
  return one;
}

inline std::vector<at::Tensor> ZerosLike(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) out.push_back(torch::zeros_like(p));
  return out;
}

inline std::vector<at::Tensor> Clones(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(t.detach().clone());
  return out;
}

// max |a - b| / max |a| (0 when both are 0).
inline double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  double diff = (a - b).abs().max().item<double>();
  double scale = a.abs().max().item<double>();
  if (scale == 0) return diff == 0 ? 0 : 1;
  return diff / scale;
}

// MinkUNet14's layout at a quarter of its widths, seeded, in float64: small
// weights, so the voxels' activations dominate the peak, and quick steps.
inline sparse::MinkUNet QuarterMinkUNet14Float64() {
  sparse::MinkUNetConfig plan = sparse::MinkUNetPlan(14, kChannels, kClasses);
  for (int64_t& planes : plan.planes) planes /= 4;
  plan.init_dim /= 4;
  torch::manual_seed(3);
  sparse::MinkUNet model(plan);
  model->to(torch::kFloat64);
  return model;
}

}  // namespace trainsup::worker

#endif  // TRAINSUP_TESTS_WORKER_SPLIT_STEP_TEST_UTIL_H_
