// The evaluation's confusion matrix on hand-counted cases.
#include "worker/train/metrics.h"

#include <gtest/gtest.h>

namespace trainsup::worker {
namespace {

at::Tensor Longs(std::vector<int64_t> v) { return at::tensor(at::ArrayRef<int64_t>(v), at::kLong); }

TEST(Confusion, AccuracyAndMeanIoUCountLabelledVoxelsOnly) {
  // Counted: (0,0) (0,1) (1,1) (1,1) (2,2: prediction 5 is clamped); the
  // unlabelled voxel (-1) is skipped.
  Confusion c(3);
  c.Add(Longs({0, 1, 1, 1, 5, 0}), Longs({0, 0, 1, 1, 2, -1}));
  EXPECT_DOUBLE_EQ(c.Accuracy(), 4.0 / 5.0);
  // IoU: class 0 1/2, class 1 2/3, class 2 1.
  EXPECT_DOUBLE_EQ(c.MeanIoU(), (0.5 + 2.0 / 3.0 + 1.0) / 3.0);
}

TEST(Confusion, ClassesNeitherLabelledNorPredictedDoNotCount) {
  Confusion c(5);
  c.Add(Longs({0, 1, 1, 1, 2}), Longs({0, 0, 1, 1, 2}));
  EXPECT_DOUBLE_EQ(c.MeanIoU(), (0.5 + 2.0 / 3.0 + 1.0) / 3.0);
}

TEST(Confusion, NothingCountedIsZero) {
  Confusion c(2);
  EXPECT_EQ(c.Accuracy(), 0);
  EXPECT_EQ(c.MeanIoU(), 0);
  c.Add(Longs({1, 0}), Longs({-1, -1}));
  EXPECT_EQ(c.Accuracy(), 0);
  EXPECT_EQ(c.MeanIoU(), 0);
}

}  // namespace
}  // namespace trainsup::worker
