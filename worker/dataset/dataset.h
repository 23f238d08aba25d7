// The run's dataset as the run spec's [data] table describes it: synthetic
// rooms, one point-cloud file cut into tiles, or a directory of files, split
// into a training and a validation part. Torch-free: the loader reads from
// it on a background thread.
#ifndef TRAINSUP_WORKER_DATASET_DATASET_H_
#define TRAINSUP_WORKER_DATASET_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "contracts/spec.h"
#include "worker/data/point_cloud.h"

namespace trainsup::worker {

// Which part of the data a Dataset serves.
enum class Split { kTrain, kVal };

// "train", "val".
std::string ToString(Split split);
// The inverse of ToString; InvalidArgument otherwise.
absl::StatusOr<Split> SplitFromString(const std::string& name);

// One scene of a dataset with its index there (the loader's unit of work).
struct Sample {
  PointCloud cloud;
  int64_t index = 0;
};

// A fixed, ordered list of scenes. Every scene it returns:
// - has coordinates shifted so that its minimum is 0 on every axis (small,
//   positive values; PointCloud::origin keeps the absolute position);
// - has feature_channels() features per point (a cloud without features
//   gets one constant channel of 1.0);
// - has one label per point, each -1 (unlabelled, or the spec's
//   ignore_label) or in [0, num_classes()).
// Implementations are immutable after opening: Get is safe to call from
// several threads at once. Not copyable.
class Dataset {
 public:
  virtual ~Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  // Number of scenes, >= 0 (a validation split may be empty).
  virtual int64_t size() const = 0;

  // Scene `index`, in [0, size()): the same cloud every time. Errors: the
  // reader's (InvalidArgument, DataLoss, NotFound; the message names the
  // file), InvalidArgument for a label >= num_classes() or a feature count
  // that differs from feature_channels() (naming the file), OutOfRange for
  // a bad index.
  virtual absl::StatusOr<PointCloud> Get(int64_t index) const = 0;

  // Number of classes the model predicts: model.num_classes when set, else
  // the largest label of the whole dataset (both splits) plus one.
  virtual int num_classes() const = 0;

  // Feature channels of every scene (3 for rgb, 1 for SemanticKITTI's
  // remission or for clouds without features).
  virtual int feature_channels() const = 0;

  // For logs: what this is, e.g. "synthetic: 8 small rooms (heavy_tailed),
  // train: 6 rooms".
  virtual std::string name() const = 0;

 protected:
  Dataset() = default;
};

// Opens the `split` part of the dataset `data` describes. The split is a
// function of `seed` (the run's train.seed) and the data: the two splits of
// one (data, seed) are disjoint and together cover every scene. When
// data.val_fraction > 0 and there are at least two scenes, the validation
// split has at least one scene and the training split keeps at least one.
//
// data.format:
// - "synthetic": data.scenes rooms; room i is sparse::GenerateScene of
//   ScenePreset(data.scene_size, MixSeed(seed, i)). With size_distribution
//   "heavy_tailed", a seeded ~10% of the rooms (at least one when there are
//   two or more) are ten times larger: ten times the points, boxes and
//   cylinders, floor sides times sqrt(10). Features rgb (3), labels the
//   SceneClass (4 classes; one equal to data.ignore_label becomes -1).
// - "ply", "las", "semantickitti", "s3dis": data.path is
//   - one file (for s3dis also one room folder with an Annotations/
//     subfolder): it is read once at open and cut into square xy tiles, the
//     side chosen so that there are about 8-32 non-empty tiles; empty tiles
//     are dropped; the tiles are the scenes.
//   - a directory: every file below it with the format's extension (.ply,
//     .las, .bin; case-insensitive), in sorted path order, is a scene; for
//     s3dis every room folder with an Annotations/ subfolder, or, when there
//     is none, every .txt file. data.label_file must then be empty.
//   Files must be labelled (ReadOptions::require_labels); labels equal to
//   data.ignore_label become -1. When model.num_classes is 0, every file is
//   read once at open to find the largest label.
//
// `data_roots` set (the supervisor's TRAINSUP_DATA_ROOTS,
// contracts/data_roots.h): data.path and data.label_file must resolve inside
// them (PermissionDenied "data.path: ... outside the data roots"), and every
// file and folder read, now or by Get later, is confined to them as it is
// opened (ReadOptions::data_roots): a file inside a data directory that is
// a link out of the roots fails with PermissionDenied naming it. Unset: no
// confinement.
//
// Errors: InvalidArgument naming the spec field for bad values
// ("data.format", "data.scene_size", "data.path: no .ply files under ...",
// "model.in_channels: ..." when the data's feature channels differ,
// "model.num_classes: ..." when a label does not fit, or the data has no
// labelled point); NotFound when data.path does not exist; the readers'
// errors, which name the file, for a file that cannot be read. Pieces of
// file content in messages are marked (ViewerMessage withholds them).
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const DataSpec& data, const ModelSpec& model, uint64_t seed, Split split,
    const std::optional<std::vector<std::string>>& data_roots = std::nullopt);

// The same for a whole run spec: spec.data, spec.model and spec.train.seed.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const RunSpec& spec, Split split,
    const std::optional<std::vector<std::string>>& data_roots = std::nullopt);

// The number of validation scenes out of `n` for `val_fraction`:
// round(n * val_fraction), at least 1 when val_fraction > 0 and n >= 2, and
// at most n - 1 (at least one training scene) when n >= 1.
int64_t ValidationCount(int64_t n, double val_fraction);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATASET_DATASET_H_
