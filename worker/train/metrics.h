// The evaluation's metrics: a confusion matrix over labelled voxels, its
// accuracy and its mean IoU (what the worker reports as val_miou and
// baseline_miou).
#ifndef TRAINSUP_WORKER_TRAIN_METRICS_H_
#define TRAINSUP_WORKER_TRAIN_METRICS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace trainsup::worker {

class Confusion {
 public:
  // For labels 0..k-1; k >= 1.
  explicit Confusion(int k) : k_(k), m_(static_cast<size_t>(k) * k, 0) {}

  // Counts each voxel with a label in [0, k) (others, -1 for unlabelled,
  // are skipped); a prediction outside [0, k) counts as the nearest class.
  // Both int64 CPU tensors of the same length.
  void Add(const at::Tensor& pred, const at::Tensor& labels);

  // Right predictions over counted voxels; 0 when none were counted.
  double Accuracy() const;
  // Mean IoU over the classes present in the labels or the predictions; 0
  // when none is.
  double MeanIoU() const;

 private:
  int64_t At(int label, int pred) const { return m_[static_cast<size_t>(label) * k_ + pred]; }

  int k_;
  std::vector<int64_t> m_;  // m_[label * k + prediction]
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_TRAIN_METRICS_H_
