#include "worker/train/metrics.h"

#include <algorithm>

namespace trainsup::worker {

void Confusion::Add(const at::Tensor& pred, const at::Tensor& labels) {
  const int64_t* p = pred.data_ptr<int64_t>();
  const int64_t* l = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i) {
    if (l[i] < 0 || l[i] >= k_) continue;
    m_[l[i] * k_ + std::clamp<int64_t>(p[i], 0, k_ - 1)]++;
  }
}

double Confusion::Accuracy() const {
  int64_t hit = 0, all = 0;
  for (int i = 0; i < k_; ++i) {
    for (int j = 0; j < k_; ++j) {
      all += At(i, j);
      if (i == j) hit += At(i, j);
    }
  }
  return all ? static_cast<double>(hit) / all : 0;
}

double Confusion::MeanIoU() const {
  double sum = 0;
  int present = 0;
  for (int c = 0; c < k_; ++c) {
    int64_t tp = At(c, c), fn = 0, fp = 0;
    for (int j = 0; j < k_; ++j) {
      if (j != c) fn += At(c, j), fp += At(j, c);
    }
    if (tp + fn + fp == 0) continue;
    sum += static_cast<double>(tp) / static_cast<double>(tp + fn + fp);
    present++;
  }
  return present ? sum / present : 0;
}

}  // namespace trainsup::worker
