// The evaluation on the validation split (trainer_impl.h).
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/split/step.h"
#include "worker/train/metrics.h"
#include "worker/train/trainer_impl.h"

namespace trainsup::worker::internal {

void Trainer::Evaluate(TrainerResult* result) {
  if (!val_ || val_->size() == 0) return;
  Report(v1::PHASE_EVALUATING);
  // In a gang every rank evaluates the same model: rank 0's running
  // statistics (each rank's last training forward moved its own), and the
  // baseline's majority class of the labelled voxels all ranks have seen.
  std::vector<int64_t> seen = class_counts_;
  if (gang_->world_size() > 1) {
    if (!sync_batchnorm_) {
      BroadcastWeights(
          /*parameters=*/false,
          absl::StrCat("running statistics from rank 0 for the evaluation at step ", step_));
    }
    at::Tensor counts = at::tensor(seen, at::kLong);
    gang_->AllreduceSum(counts, absl::StrCat("class counts for the evaluation at step ", step_));
    for (size_t c = 0; c < seen.size(); ++c)
      seen[c] = counts[static_cast<int64_t>(c)].item<int64_t>();
  }
  torch::NoGradGuard no_grad;
  model_->eval();
  Confusion confusion(num_classes_);
  Confusion baseline(num_classes_);
  // The majority class of the training split's labelled voxels seen so far.
  majority_class_ = std::max_element(seen.begin(), seen.end()) - seen.begin();
  LoaderOptions lo;
  lo.batch_size = 1;
  lo.seed = static_cast<uint64_t>(spec_.train.seed);
  lo.voxel_size = spec_.model.voxel_size;
  lo.augment = false;
  lo.shuffle = false;
  lo.prefetch = 1;
  Loader loader(val_.get(), lo, 0, 0);
  for (int64_t i = 0; i < val_->size(); ++i) {
    absl::StatusOr<Batch> batch = loader.Next();
    if (!batch.ok()) break;
    std::vector<SceneView> views;
    for (const VoxelScene& s : batch->scenes) {
      views.push_back({s.xyz.data(), static_cast<int64_t>(s.labels.size()), s.labelled.data()});
    }
    RunGroup run = [&](const Group& group, double) -> absl::Status {
      try {
        GroupTensors t = Assemble(*batch, group, channels_, FeatureType(), height_, device_);
        at::Tensor pred = model_->forward(t.input).features().argmax(1).cpu();
        at::Tensor labels = t.labels.cpu();
        confusion.Add(pred, labels);
        baseline.Add(at::full_like(labels, majority_class_), labels);
        return absl::OkStatus();
      } catch (const c10::OutOfMemoryError& e) {
        return absl::ResourceExhaustedError(e.what());
      }
    };
    SplitOptions o;
    o.min_piece_voxels = spec_.train.min_piece_points;
    RunSplitting(
        views, o, run, [this] { sparse::ReleaseCachedMemory(device_); }, nullptr, budget_)
        .IgnoreError();
  }
  model_->train();
  result->val_miou = confusion.MeanIoU();
  result->val_accuracy = confusion.Accuracy();
  result->baseline_miou = baseline.MeanIoU();
  val_miou_ = result->val_miou;
  baseline_miou_ = result->baseline_miou;
  std::string line =
      absl::StrCat("eval at step ", step_, ": val mIoU ", result->val_miou, ", accuracy ",
                   result->val_accuracy, "; majority-class baseline mIoU ", result->baseline_miou);
  Log(line);
  Event(v1::EVENT_KIND_LOG, -1, line);
  Report(v1::PHASE_TRAINING);
}

}  // namespace trainsup::worker::internal
