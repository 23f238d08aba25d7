// Batches for the training loop, prepared ahead on a background thread
// (read, augment, voxelize) while the current batch trains. The data order
// of an epoch is a pure function of (seed, epoch) and a batch is a pure
// function of (dataset, options, epoch, cursor), so a loader started at a
// checkpointed (epoch, cursor) yields exactly the batches an uninterrupted
// one would. Torch-free: the prepared voxels live in plain vectors, outside
// the training step's memory budget (sparse/voxel_grid.h).
#ifndef TRAINSUP_WORKER_DATASET_LOADER_H_
#define TRAINSUP_WORKER_DATASET_LOADER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/dataset/augment.h"
#include "worker/dataset/dataset.h"

namespace trainsup::worker {

// The order in which epoch `epoch` visits the `n` samples: a permutation of
// [0, n) that depends only on (n, seed, epoch), different from epoch to
// epoch (for n > 2, with overwhelming probability).
std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch);

// Batches of `batch_size` in an epoch of `n` samples: ceil(n / batch_size).
int64_t BatchesPerEpoch(int64_t n, int64_t batch_size);

// Rank `rank`'s share of a global batch of `count` samples over
// `world_size` ranks: offsets [begin, end) into the batch. Contiguous, in
// rank order, as even as the count allows (the first count % world_size
// ranks take one more); a rank gets none when count < world_size and its
// rank is count or more.
struct BatchShare {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
BatchShare RankShare(int64_t count, int rank, int world_size);

// The samples of epoch `epoch`, in the order it visits them: EpochOrder,
// or 0..n-1 without `shuffle` (validation).
std::vector<int64_t> VisitOrder(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// The data of a gang does not depend on its size (docs/distributed.md,
// "Data"): global batch k of an epoch is entries [k*G, min((k+1)*G, n)) of
// the epoch's order, every sample once per epoch (the last batch is
// smaller when G does not divide n), and each of the W ranks trains its
// RankShare of it. Which samples a step trains, and how each is augmented
// (AugmentSeed(seed, epoch, sample)), is the same at every W.
struct LoaderOptions {
  // The global batch G: samples per step over all ranks, >= 1.
  int64_t batch_size = 2;
  uint64_t seed = 0;         // the run's train.seed
  double voxel_size = 0.05;  // metres, > 0 (model.voxel_size)
  bool augment = true;       // data.augment
  // false: every epoch visits 0, 1, ..., n-1 (validation).
  bool shuffle = true;
  // Batches prepared ahead of the one Next() returns, >= 1.
  int prefetch = 2;
  // This loader yields rank `rank`'s share (RankShare) of every global
  // batch; cursors count positions in the epoch's order, the same on every
  // rank and at every world size. 0 <= rank < world_size.
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

// The global batch at positions [cursor_begin, cursor_end) of epoch
// `epoch`'s order: `samples` all of it (dataset indices), `scenes` this
// rank's share of it, prepared. After training it, checkpoint (epoch,
// cursor_end): a loader constructed there, at any world size, continues
// with the next global batch (cursor_end == n means the next epoch).
struct Batch {
  int64_t epoch = 0;
  int64_t cursor_begin = 0;
  int64_t cursor_end = 0;
  std::vector<int64_t> samples;
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

// Yields this rank's share of the global batches in order, starting at
// (epoch, cursor): global batches of batch_size scenes of the epoch's
// order (VisitOrder), the last of an epoch smaller when batch_size does
// not divide the dataset's size; batches never span epochs, and after an
// epoch's last batch the next epoch begins. A rank whose share of a (last,
// small) batch is empty gets a Batch without scenes. A background thread
// keeps up to `prefetch` batches ready. Not thread-safe: call Next() from
// one thread.
class Loader {
 public:
  // `dataset` must outlive the loader. `cursor` in [0, dataset size];
  // cursor == size means (epoch + 1, 0). Bad options, an empty dataset or
  // a cursor out of range are reported by Next().
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

  // Global batches per epoch: BatchesPerEpoch(dataset size, batch_size).
  int64_t batches_per_epoch() const;

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

#endif  // TRAINSUP_WORKER_DATASET_LOADER_H_
