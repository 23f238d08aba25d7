// Batches for the training loop, prepared ahead on a background thread
// (read, augment, voxelize) while the current batch trains. The data order
// of an epoch is a pure function of (seed, epoch) and a batch is a pure
// function of (dataset, options, epoch, cursor), so a loader started at a
// checkpointed (epoch, cursor) yields exactly the batches an uninterrupted
// one would. Torch-free: the prepared voxels live in plain vectors, outside
// the training step's memory budget (sparse/voxel_grid.h).
#ifndef TRAINSUP_WORKER_LOADER_H_
#define TRAINSUP_WORKER_LOADER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/augment.h"
#include "worker/dataset.h"

namespace trainsup::worker {

// The order in which epoch `epoch` visits the `n` samples: a permutation of
// [0, n) that depends only on (n, seed, epoch), different from epoch to
// epoch (for n > 2, with overwhelming probability).
std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch);

// Batches of `batch_size` in an epoch of `n` samples: ceil(n / batch_size).
int64_t BatchesPerEpoch(int64_t n, int64_t batch_size);

// Samples each of `world_size` ranks visits per epoch of `n`: n / world_size
// (PyTorch's DistributedSampler with drop_last: the n % world_size samples
// at the end of the epoch's order are left out, a different few each epoch).
int64_t ShardSize(int64_t n, int world_size);

// What rank `rank` of `world_size` visits in epoch `epoch`, in order:
// entries rank, rank + world_size, ... of the epoch's order (EpochOrder, or
// 0..n-1 without `shuffle`), ShardSize(n, world_size) of them. A pure
// function of its arguments; the shards of one epoch are disjoint, and for
// world_size 1 the shard is the whole order. With batch size B, batch k of
// every rank together are entries [k*B*W, (k+1)*B*W) of the order, the
// batch one rank with batch size B*W trains at step k (when B*W divides
// the shard sizes' total).
std::vector<int64_t> EpochShard(int64_t n, uint64_t seed, int64_t epoch, int rank, int world_size,
                                bool shuffle = true);

struct LoaderOptions {
  int64_t batch_size = 2;    // >= 1
  uint64_t seed = 0;         // the run's train.seed
  double voxel_size = 0.05;  // metres, > 0 (model.voxel_size)
  bool augment = true;       // data.augment
  // false: every epoch visits 0, 1, ..., n-1 (validation).
  bool shuffle = true;
  // Batches prepared ahead of the one Next() returns, >= 1.
  int prefetch = 2;
  // This loader yields rank `rank`'s shard of every epoch (EpochShard);
  // cursors count within the shard. 0 <= rank < world_size.
  int rank = 0;
  int world_size = 1;
  AugmentOptions augment_options;
};

// One voxelized scene: V voxels.
struct VoxelScene {
  std::vector<int32_t> xyz;     // V*3 voxel indices, sorted by (x, y, z)
  std::vector<float> features;  // V*channels: mean of the voxel's points
  int channels = 0;
  std::vector<int32_t> labels;    // V: majority label, -1 ignore
  std::vector<uint8_t> labelled;  // V: 1 where labels >= 0
  int64_t index = 0;              // the scene's index in the dataset
  int64_t points = 0;             // points before voxelization

  int64_t voxels() const { return static_cast<int64_t>(labels.size()); }
};

// Scenes [cursor_begin, cursor_end) of epoch `epoch`'s shard (the whole
// order for world_size 1). After training it, checkpoint (epoch,
// cursor_end): a loader constructed there continues with the next batch
// (cursor_end == the shard size means the next epoch).
struct Batch {
  int64_t epoch = 0;
  int64_t cursor_begin = 0;
  int64_t cursor_end = 0;
  std::vector<VoxelScene> scenes;
};

// Exact, field by field (for tests).
bool operator==(const VoxelScene& a, const VoxelScene& b);
bool operator==(const Batch& a, const Batch& b);

// Voxelizes one scene at `voxel_size` (sparse::VoxelizePoints, mean
// features, majority labels with -1 ignored). InvalidArgument naming the
// scene's source when a point's voxel lies outside the representable range.
absl::StatusOr<VoxelScene> VoxelizeSample(const Sample& sample, double voxel_size);

// Sample `index` of `dataset` as the loader prepares it in `epoch`: read,
// augmented with AugmentSeed(options.seed, epoch, index) when
// options.augment, voxelized.
absl::StatusOr<VoxelScene> PrepareScene(const Dataset& dataset, int64_t index, int64_t epoch,
                                        const LoaderOptions& options);

// Yields batches in order, starting at (epoch, cursor): batch_size scenes
// of the epoch's order (EpochOrder, or 0..n-1 without shuffle), the last
// batch of an epoch smaller when batch_size does not divide the size;
// batches never span epochs, and after an epoch's last batch the next
// epoch begins. A background thread keeps up to `prefetch` batches ready.
// Not thread-safe: call Next() from one thread.
class Loader {
 public:
  // `dataset` must outlive the loader. `cursor` in [0, shard size];
  // cursor == shard size means (epoch + 1, 0). Bad options, an empty dataset
  // (or fewer scenes than ranks) or a cursor out of range are reported by
  // Next().
  Loader(const Dataset* dataset, LoaderOptions options, int64_t epoch, int64_t cursor);
  // Stops the thread (after the scene it is preparing) and joins it.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch, waiting for it if it is not ready yet. Errors: the
  // dataset's (naming the file) or voxelization's for a scene of the batch,
  // ResourceExhausted when preparing it ran out of memory, Internal for
  // another exception; InvalidArgument for bad options,
  // FailedPrecondition for an empty dataset. An error is final: every later
  // call returns it again.
  absl::StatusOr<Batch> Next();

  // Batches per epoch (of this rank's shard).
  int64_t batches_per_epoch() const;
  // Scenes this rank visits per epoch: ShardSize(dataset size, world_size).
  int64_t shard_size() const;

 private:
  void Run();
  absl::StatusOr<Batch> MakeBatch(int64_t epoch, int64_t cursor, const std::vector<int64_t>& order);

  const Dataset* const dataset_;
  const LoaderOptions options_;
  // Where the background thread prepares next; touched by it only.
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;

  std::mutex mu_;
  std::condition_variable ready_;            // a batch or an error was queued
  std::condition_variable space_;            // the queue shrank, or stop
  std::deque<absl::StatusOr<Batch>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  absl::Status error_;  // the final error once Next() returned one; caller's thread only
  std::thread thread_;
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_LOADER_H_
