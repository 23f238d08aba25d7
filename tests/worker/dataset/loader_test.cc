// The loader: epoch orders, batches that never span epochs, exact resume
// from (epoch, cursor), errors surfacing from Next(), clean shutdown.
#include "worker/dataset/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/dataset/random.h"

namespace trainsup::worker {
namespace {

// A small in-memory dataset: scene i has 40 + 10 i points in a 1 m cube,
// rgb, labels 0..2 and some -1. Get(fail_at) fails (or throws) when set.
class FakeDataset final : public Dataset {
 public:
  explicit FakeDataset(int64_t n, int64_t fail_at = -1, bool throw_instead = false)
      : n_(n), fail_at_(fail_at), throw_(throw_instead) {}

  int64_t size() const override { return n_; }
  absl::StatusOr<PointCloud> Get(int64_t index) const override {
    if (index == fail_at_) {
      if (throw_) throw std::runtime_error("disk on fire");
      return absl::DataLossError("scene" + std::to_string(index) + ".ply: truncated body");
    }
    PointCloud c;
    c.feature_channels = 3;
    c.source = "fake " + std::to_string(index);
    Rng rng(1000 + index);
    for (int64_t i = 0; i < 40 + 10 * index; ++i) {
      for (int a = 0; a < 3; ++a) c.xyz.push_back(static_cast<float>(rng.Uniform()));
      for (int a = 0; a < 3; ++a) c.features.push_back(static_cast<float>(rng.Uniform()));
      c.labels.push_back(static_cast<int32_t>(rng.Below(4)) - 1);
    }
    return c;
  }
  int num_classes() const override { return 3; }
  int feature_channels() const override { return 3; }
  std::string name() const override { return "fake"; }

 private:
  const int64_t n_, fail_at_;
  const bool throw_;
};

LoaderOptions Options(int64_t batch_size) {
  LoaderOptions o;
  o.batch_size = batch_size;
  o.seed = 17;
  o.voxel_size = 0.25;
  o.augment = true;
  return o;
}

std::vector<Batch> Take(Loader& loader, int count) {
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<Batch> b = loader.Next();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) break;
    out.push_back(std::move(*b));
  }
  return out;
}

TEST(EpochOrder, IsASeededPermutationThatChangesEveryEpoch) {
  const std::vector<int64_t> e0 = EpochOrder(50, 3, 0), e1 = EpochOrder(50, 3, 1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, EpochOrder(50, 3, 0));
  EXPECT_NE(e0, EpochOrder(50, 4, 0));
  EXPECT_TRUE(EpochOrder(0, 3, 0).empty());
  EXPECT_EQ(EpochOrder(1, 3, 5), std::vector<int64_t>{0});
}

TEST(BatchesPerEpoch, RoundsUp) {
  EXPECT_EQ(BatchesPerEpoch(7, 3), 3);
  EXPECT_EQ(BatchesPerEpoch(6, 3), 2);
  EXPECT_EQ(BatchesPerEpoch(0, 3), 0);
}

TEST(VoxelizeSample, MergesPointsWithMeanFeaturesAndMajorityLabels) {
  Sample s;
  s.index = 4;
  s.cloud.feature_channels = 1;
  s.cloud.xyz = {0.01f, 0.01f, 0.01f, 0.02f, 0.02f, 0.02f, 0.03f, 0.0f, 0.0f, 0.5f, 0.0f, 0.0f};
  s.cloud.features = {1, 2, 6, 7};
  s.cloud.labels = {2, 1, 1, -1};
  absl::StatusOr<VoxelScene> v = VoxelizeSample(s, 0.1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->xyz, (std::vector<int32_t>{0, 0, 0, 5, 0, 0}));
  EXPECT_EQ(v->features, (std::vector<float>{3, 7}));
  EXPECT_EQ(v->labels, (std::vector<int32_t>{1, -1}));
  EXPECT_EQ(v->labelled, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(v->index, 4);
  EXPECT_EQ(v->points, 4);
  EXPECT_EQ(v->voxels(), 2);
  // A point too far away for the voxel grid is an error naming the scene.
  s.cloud.source = "far.ply";
  s.cloud.xyz[9] = 1e6f;
  const absl::Status far = VoxelizeSample(s, 0.1).status();
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(far.message()).find("far.ply"), std::string::npos) << far;
}

TEST(Loader, BatchesCoverEachEpochAndNeverSpanTwo) {
  FakeDataset data(7);
  Loader loader(&data, Options(3), 0, 0);
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  const std::vector<Batch> batches = Take(loader, 9);
  ASSERT_EQ(batches.size(), 9u);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<int64_t> order = EpochOrder(7, 17, epoch);
    std::vector<int64_t> seen;
    const int64_t sizes[3] = {3, 3, 1};
    for (int k = 0; k < 3; ++k) {
      const Batch& b = batches[3 * epoch + k];
      EXPECT_EQ(b.epoch, epoch);
      EXPECT_EQ(b.cursor_begin, 3 * k);
      EXPECT_EQ(b.cursor_end, 3 * k + sizes[k]);
      ASSERT_EQ(static_cast<int64_t>(b.scenes.size()), sizes[k]);
      for (const VoxelScene& s : b.scenes) {
        seen.push_back(s.index);
        EXPECT_EQ(s.points, 40 + 10 * s.index);
        EXPECT_GT(s.voxels(), 0);
        EXPECT_EQ(s.channels, 3);
        EXPECT_EQ(s.xyz.size(), 3 * s.labels.size());
      }
    }
    EXPECT_EQ(seen, order);
  }
  // Augmentation differs between epochs: scene 0 is voxelized differently.
  auto scene_of = [&](int64_t epoch, int64_t index) {
    for (int k = 0; k < 3; ++k) {
      for (const VoxelScene& s : batches[3 * epoch + k].scenes) {
        if (s.index == index) return s;
      }
    }
    return VoxelScene();
  };
  EXPECT_FALSE(scene_of(0, 0) == scene_of(1, 0));
}

TEST(Loader, ResumingAtAnyCheckpointYieldsTheUninterruptedBatches) {
  FakeDataset data(5);
  Loader uninterrupted(&data, Options(2), 0, 0);
  const std::vector<Batch> want = Take(uninterrupted, 9);  // 3 epochs of 3 batches
  ASSERT_EQ(want.size(), 9u);
  for (size_t j = 0; j < want.size(); ++j) {
    // Resume where batch j begins, as from a checkpoint written after j-1.
    Loader resumed(&data, Options(2), want[j].epoch, want[j].cursor_begin);
    const std::vector<Batch> got = Take(resumed, static_cast<int>(std::min<size_t>(4, 9 - j)));
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(got[k] == want[j + k]) << "resumed at batch " << j << ", batch " << k;
    }
  }
  // The checkpoint after an epoch's last batch holds cursor_end == size.
  const Batch& last = want[2];
  ASSERT_EQ(last.cursor_end, 5);
  Loader at_end(&data, Options(2), last.epoch, last.cursor_end);
  absl::StatusOr<Batch> next = at_end.Next();
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(*next == want[3]);
}

// Issue 26, "an epoch at any W": the gang's size changes between steps
// (a loader per step, as a restart at a new size builds one at the
// checkpoint's cursor) and still every sample is trained exactly once per
// epoch, each voxelized (augmented) exactly as a one-rank run does it, and
// the ranks' shares of every step together are that step's global batch.
TEST(Loader, EverySampleOnceAnEpochWithTheSameAugmentationWhateverTheWorldSizeDoes) {
  FakeDataset data(11);
  const int64_t global_batch = 4;  // 3 steps an epoch: 4, 4, 3 samples
  Loader one_rank(&data, Options(global_batch), 0, 0);
  const std::vector<Batch> want = Take(one_rank, 9);  // 3 epochs
  ASSERT_EQ(want.size(), 9u);
  const int worlds[] = {3, 2, 4, 1, 4, 3, 2, 2, 5};
  int64_t epoch = 0, cursor = 0;
  std::vector<int64_t> seen_this_epoch;
  for (size_t step = 0; step < want.size(); ++step) {
    const int world = worlds[step];
    std::vector<VoxelScene> gathered;
    std::vector<int64_t> samples;
    int64_t cursor_end = -1;
    for (int rank = 0; rank < world; ++rank) {
      LoaderOptions o = Options(global_batch);
      o.rank = rank;
      o.world_size = world;
      Loader loader(&data, o, epoch, cursor);
      absl::StatusOr<Batch> b = loader.Next();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->epoch, want[step].epoch) << "step " << step << " rank " << rank;
      EXPECT_EQ(b->samples, want[step].samples) << "step " << step << " rank " << rank;
      const BatchShare share = RankShare(static_cast<int64_t>(b->samples.size()), rank, world);
      EXPECT_EQ(static_cast<int64_t>(b->scenes.size()), share.size());
      for (const VoxelScene& s : b->scenes) gathered.push_back(s);
      cursor_end = b->cursor_end;
    }
    // The shares, in rank order, are the one-rank batch, scene for scene
    // (the same sample, the same augmentation).
    ASSERT_EQ(gathered.size(), want[step].scenes.size()) << "step " << step << " at W=" << world;
    for (size_t k = 0; k < gathered.size(); ++k) {
      EXPECT_TRUE(gathered[k] == want[step].scenes[k]) << "step " << step << " scene " << k;
      samples.push_back(gathered[k].index);
    }
    seen_this_epoch.insert(seen_this_epoch.end(), samples.begin(), samples.end());
    // The checkpoint after this step: a global position, whatever W.
    cursor = cursor_end;
    if (cursor == data.size()) {
      std::vector<int64_t> sorted = seen_this_epoch;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> all(11);
      for (int64_t i = 0; i < 11; ++i) all[i] = i;
      EXPECT_EQ(sorted, all) << "epoch " << epoch << " did not train every sample once";
      seen_this_epoch.clear();
      epoch++;
      cursor = 0;
    }
  }
  EXPECT_EQ(epoch, 3);
}

TEST(Loader, WithoutShuffleVisitsScenesInOrder) {
  FakeDataset data(5);
  LoaderOptions o = Options(2);
  o.shuffle = false;
  o.augment = false;
  Loader loader(&data, o, 3, 0);
  std::vector<int64_t> seen;
  for (const Batch& b : Take(loader, 3)) {
    for (const VoxelScene& s : b.scenes) seen.push_back(s.index);
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // Without augmentation, a scene is the same in every epoch.
  absl::StatusOr<VoxelScene> e0 = PrepareScene(data, 2, 0, o), e9 = PrepareScene(data, 2, 9, o);
  ASSERT_TRUE(e0.ok() && e9.ok());
  EXPECT_TRUE(*e0 == *e9);
}

TEST(Loader, DatasetErrorsSurfaceFromNextAndStay) {
  FakeDataset data(6, /*fail_at=*/4);
  LoaderOptions o = Options(2);
  o.shuffle = false;
  Loader loader(&data, o, 0, 0);
  EXPECT_TRUE(loader.Next().ok());  // scenes 0, 1
  EXPECT_TRUE(loader.Next().ok());  // scenes 2, 3
  for (int i = 0; i < 2; ++i) {
    const absl::Status s = loader.Next().status();  // scene 4 fails
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(std::string(s.message()).find("scene4.ply"), std::string::npos) << s;
  }
}

TEST(Loader, ExceptionsInTheThreadBecomeErrors) {
  FakeDataset data(3, /*fail_at=*/0, /*throw_instead=*/true);
  LoaderOptions o = Options(1);
  o.shuffle = false;
  Loader loader(&data, o, 0, 0);
  const absl::Status s = loader.Next().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(s.message()).find("disk on fire"), std::string::npos) << s;
}

TEST(Loader, BadOptionsAndEmptyDatasetsAreReportedByNext) {
  FakeDataset data(4), empty(0);
  LoaderOptions zero = Options(0);
  EXPECT_EQ(Loader(&data, zero, 0, 0).Next().status().code(), absl::StatusCode::kInvalidArgument);
  LoaderOptions no_voxel = Options(2);
  no_voxel.voxel_size = 0;
  EXPECT_EQ(Loader(&data, no_voxel, 0, 0).Next().status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Loader(&data, Options(2), 0, 5).Next().status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Loader(&data, Options(2), -1, 0).Next().status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Loader(&empty, Options(2), 0, 0).Next().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Loader, ShutsDownWithBatchesStillQueued) {
  FakeDataset data(50);
  LoaderOptions o = Options(4);
  o.prefetch = 3;
  { Loader never_read(&data, o, 0, 0); }
  Loader loader(&data, o, 0, 0);
  EXPECT_TRUE(loader.Next().ok());
  // The destructor stops and joins the thread while it waits for space.
}

}  // namespace
}  // namespace trainsup::worker
