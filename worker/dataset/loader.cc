#include "worker/dataset/loader.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <new>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sparse/voxel_grid.h"
#include "worker/dataset/random.h"

namespace trainsup::worker {
namespace {

constexpr uint64_t kOrderTag = 0x6f72646572ull;  // "order"

}  // namespace

std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch) {
  return SeededPermutation(n, MixSeed(seed, kOrderTag, static_cast<uint64_t>(epoch)));
}

int64_t BatchesPerEpoch(int64_t n, int64_t batch_size) {
  if (n <= 0 || batch_size <= 0) return 0;
  return (n + batch_size - 1) / batch_size;
}

BatchShare RankShare(int64_t count, int rank, int world_size) {
  if (count <= 0 || world_size < 1 || rank < 0 || rank >= world_size) return {};
  const int64_t base = count / world_size;
  const int64_t extra = count % world_size;
  BatchShare share;
  share.begin = rank * base + std::min<int64_t>(rank, extra);
  share.end = share.begin + base + (rank < extra ? 1 : 0);
  return share;
}

std::vector<int64_t> VisitOrder(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  if (shuffle) return EpochOrder(n, seed, epoch);
  std::vector<int64_t> order(std::max<int64_t>(n, 0));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  return order;
}

bool operator==(const VoxelScene& a, const VoxelScene& b) {
  return a.xyz == b.xyz && a.features == b.features && a.channels == b.channels &&
         a.labels == b.labels && a.labelled == b.labelled && a.index == b.index &&
         a.points == b.points;
}

bool operator==(const Batch& a, const Batch& b) {
  return a.epoch == b.epoch && a.cursor_begin == b.cursor_begin && a.cursor_end == b.cursor_end &&
         a.samples == b.samples && a.scenes == b.scenes;
}

absl::StatusOr<VoxelScene> VoxelizeSample(const Sample& sample, double voxel_size) {
  const PointCloud& cloud = sample.cloud;
  const int64_t n = static_cast<int64_t>(cloud.size());
  if (cloud.features.size() != static_cast<size_t>(n) * cloud.feature_channels ||
      (!cloud.labels.empty() && cloud.labels.size() != static_cast<size_t>(n))) {
    return absl::InvalidArgumentError(absl::StrCat(
        cloud.source, ": ", cloud.features.size(), " feature values and ", cloud.labels.size(),
        " labels for ", n, " points of ", cloud.feature_channels, " channels"));
  }
  VoxelScene scene;
  scene.index = sample.index;
  scene.points = n;
  scene.channels = cloud.feature_channels;
  try {
    sparse::VoxelGrid grid = sparse::VoxelizePoints(cloud.xyz.data(), n, voxel_size);
    scene.xyz = std::move(grid.coordinates);
    if (cloud.feature_channels > 0) {
      scene.features = sparse::MeanFeatures(grid, cloud.features.data(), cloud.feature_channels);
    }
    if (cloud.labels.empty()) {
      scene.labels.assign(grid.size(), -1);
    } else {
      scene.labels = sparse::MajorityLabels(grid, cloud.labels.data(), -1);
    }
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(cloud.source, " (scene ", sample.index, "): ", e.what()));
  }
  scene.labelled.resize(scene.labels.size());
  for (size_t v = 0; v < scene.labels.size(); ++v) scene.labelled[v] = scene.labels[v] >= 0;
  return scene;
}

absl::StatusOr<VoxelScene> PrepareScene(const Dataset& dataset, int64_t index, int64_t epoch,
                                        const LoaderOptions& options) {
  absl::StatusOr<PointCloud> cloud = dataset.Get(index);
  if (!cloud.ok()) return cloud.status();
  Sample sample;
  sample.index = index;
  sample.cloud = options.augment
                     ? Augment(std::move(*cloud), AugmentSeed(options.seed, epoch, index),
                               options.augment_options)
                     : std::move(*cloud);
  return VoxelizeSample(sample, options.voxel_size);
}

Loader::Loader(const Dataset* dataset, LoaderOptions options, int64_t epoch, int64_t cursor)
    : dataset_(dataset), options_(std::move(options)), epoch_(epoch), cursor_(cursor) {
  const int64_t n = dataset_ == nullptr ? 0 : dataset_->size();
  if (dataset_ == nullptr) {
    error_ = absl::InvalidArgumentError("Loader: no dataset");
  } else if (options_.batch_size < 1) {
    error_ = absl::InvalidArgumentError(
        absl::StrCat("Loader: batch_size must be at least 1, got ", options_.batch_size));
  } else if (!std::isfinite(options_.voxel_size) || !(options_.voxel_size > 0)) {
    error_ = absl::InvalidArgumentError(
        absl::StrCat("Loader: voxel_size must be positive, got ", options_.voxel_size));
  } else if (options_.prefetch < 1) {
    error_ = absl::InvalidArgumentError(
        absl::StrCat("Loader: prefetch must be at least 1, got ", options_.prefetch));
  } else if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size) {
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "Loader: rank ", options_.rank, " is outside a world of ", options_.world_size));
  } else if (n == 0) {
    error_ = absl::FailedPreconditionError(
        absl::StrCat("Loader: dataset ", dataset_->name(), " has no scenes"));
  } else if (epoch_ < 0 || cursor_ < 0 || cursor_ > n) {
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "Loader: position (epoch ", epoch_, ", cursor ", cursor_, ") is outside an epoch of ", n));
  }
  if (!error_.ok()) return;
  if (cursor_ == n) {
    ++epoch_;
    cursor_ = 0;
  }
  thread_ = std::thread([this] { Run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  space_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t Loader::batches_per_epoch() const {
  return dataset_ == nullptr ? 0 : BatchesPerEpoch(dataset_->size(), options_.batch_size);
}

absl::StatusOr<Batch> Loader::Next() {
  if (!error_.ok()) return error_;
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait(lock, [this] { return !queue_.empty(); });
  absl::StatusOr<Batch> batch = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  space_.notify_one();
  if (!batch.ok()) error_ = batch.status();
  return batch;
}

void Loader::Run() {
  const int64_t n = dataset_->size();
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      space_.wait(lock, [this] {
        return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch;
      });
      if (stop_) return;
    }
    if (order_epoch != epoch_) {
      order = VisitOrder(n, options_.seed, epoch_, options_.shuffle);
      order_epoch = epoch_;
    }
    absl::StatusOr<Batch> batch = MakeBatch(epoch_, cursor_, order);
    const bool failed = !batch.ok();
    cursor_ = std::min(cursor_ + options_.batch_size, n);
    if (cursor_ == n) {
      ++epoch_;
      cursor_ = 0;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      queue_.push_back(std::move(batch));
    }
    ready_.notify_one();
    // After an error the queue ends with it; Next() repeats it from then on.
    if (failed) return;
  }
}

absl::StatusOr<Batch> Loader::MakeBatch(int64_t epoch, int64_t cursor,
                                        const std::vector<int64_t>& order) {
  const int64_t n = static_cast<int64_t>(order.size());
  Batch batch;
  batch.epoch = epoch;
  batch.cursor_begin = cursor;
  batch.cursor_end = std::min(cursor + options_.batch_size, n);
  batch.samples.assign(order.begin() + batch.cursor_begin, order.begin() + batch.cursor_end);
  const BatchShare share =
      RankShare(batch.cursor_end - batch.cursor_begin, options_.rank, options_.world_size);
  for (int64_t k = batch.cursor_begin + share.begin; k < batch.cursor_begin + share.end; ++k) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return absl::CancelledError("Loader: stopped");
    }
    // An exception must not escape the thread (std::terminate); it becomes
    // the batch's error.
    try {
      absl::StatusOr<VoxelScene> scene = PrepareScene(*dataset_, order[k], epoch, options_);
      if (!scene.ok()) return scene.status();
      batch.scenes.push_back(std::move(*scene));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat("Loader: out of memory preparing scene ",
                                                       order[k], " of ", dataset_->name()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("Loader: preparing scene ", order[k], " of ",
                                              dataset_->name(), ": ", e.what()));
    }
  }
  return batch;
}

}  // namespace trainsup::worker
