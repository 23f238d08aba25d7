// One optimizer step's forward and backward passes through the model,
// split when a batch does not fit (worker/split/split.h), and the memory model's
// calibration through the same passes: what the training loop (trainer.h),
// split_bench and the tests run.
#ifndef TRAINSUP_WORKER_SPLIT_STEP_H_
#define TRAINSUP_WORKER_SPLIT_STEP_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "contracts/spec.h"
#include "sparse/sparse_tensor.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"
#include "worker/split/split.h"

namespace trainsup::sparse {
class MinkUNetImpl;
}

namespace trainsup::worker {

class Gang;
class GradientReducer;

// A data-parallel step (worker/gang/distributed.h): this rank's part of a global
// batch of `global_labelled` labelled voxels (all ranks together), its
// gradient summed over the ranks by `reducer`.
struct DataParallel {
  GradientReducer* reducer = nullptr;
  int64_t global_labelled = 0;
  // model.sync_batchnorm: the batch statistics are collectives, so every
  // rank must run the same passes. The groups are planned up front (the
  // memory model under the budget), the gang agrees on the most groups any
  // rank planned (an allreduce through `gang`), and a rank with fewer runs
  // empty ones. An out-of-memory error is not retried, since a reactive
  // cut would desynchronise the collectives: it is hard (ResourceExhausted,
  // exit 75), and the daemon's restart lowers the budget, under which the
  // plan cuts smaller groups.
  bool sync_batchnorm = false;
  Gang* gang = nullptr;
};

// What one step does to its loss, in every group: the guard's fault
// injection (testing.nan_loss_at_step, nan_grad_at_step,
// loss_spike_at_step; docs/guard.md), applied inside the forward and
// backward as a real fault would be: a NaN loss (and so a NaN gradient), a
// NaN gradient of the first parameter under a finite loss, or a loss (and
// gradient) `loss_scale` times larger. And fp16's loss scale
// (`gradient_scale`, LossScaler): backward runs on the loss times it, so
// `accum` receives the gradient times it (the trainer divides it back);
// the reported loss is not scaled.
struct StepFaults {
  bool nan_loss = false;
  bool nan_grad = false;
  double loss_scale = 1;
  double gradient_scale = 1;
};

// The tensors of one group of pieces: scene k of the group is batch index k.
struct GroupTensors {
  sparse::SparseTensor input;
  at::Tensor labels;  // int64, -1 ignored
  int64_t labelled = 0;
};

// `height` > 0: one more channel after the data's, the voxel's z times
// `height` (the voxel size: metres above the scene's lowest point).
GroupTensors Assemble(const Batch& batch, const Group& group, int channels,
                      at::ScalarType dtype = at::kFloat, double height = 0,
                      c10::Device device = c10::Device(c10::DeviceType::CPU));

// The labelled voxels of `batch` (split.h's count over its scene views).
int64_t BatchLabelled(const Batch& batch);

// What one optimizer step's forward and backward passes did.
struct StepOutcome {
  SplitStats stats;
  double loss = 0;       // the batch's mean loss over its labelled voxels
  int64_t hits = 0;      // labelled voxels predicted right
  int64_t labelled = 0;  // labelled voxels that were trained on
};

// Forward and backward over `batch` (scene k of a group is batch index k),
// split when it runs out of memory (RunSplitting): `accum` (one tensor per
// parameter, zeroed first) receives the gradient of the batch's mean loss
// over its labelled voxels; the parameters' own .grad are not touched and
// no optimizer step is taken. BatchNorm's running statistics move once,
// from the combined moments of the groups that completed: a group that
// runs out of memory leaves no trace in them (sparse::BatchNormStepStats).
// Features are converted to `dtype` (float64 for
// tests). `height` > 0 appends the height channel (model.height_feature)
// scaled by it. Only c10::OutOfMemoryError is caught; any other exception
// propagates. ResourceExhausted: a hard out-of-memory.
// `baseline` (benchmarks only): split with RunBaselineSplitting instead,
// the commonly used reactive splitter, with options.min_piece_voxels as its
// floor; `predictor`, when set, still observes but plans nothing.
// `parallel` (world size > 1): each group's weight is its share of the
// labelled voxels of the global batch instead of this rank's, and `accum`
// ends as the sum over the ranks (the global batch's gradient); the last
// group's backward launches the allreduce as its gradients become ready.
// The reducer's collectives run even when this rank's batch has no
// labelled voxel, so every rank makes the same calls.
absl::StatusOr<StepOutcome> ForwardBackward(
    sparse::MinkUNetImpl& model, const Batch& batch, int channels,
    const std::vector<at::Tensor>& params, std::vector<at::Tensor>& accum,
    const SplitOptions& options, MemoryModel* predictor, int64_t budget_bytes,
    at::ScalarType dtype = at::kFloat, int64_t* run_peak = nullptr, double height = 0,
    bool baseline = false, const DataParallel* parallel = nullptr, const StepFaults& faults = {});

// Bytes of optimizer state that its first step allocates for `params`: SGD
// with momentum keeps one buffer per parameter, AdamW two.
int64_t OptimizerStateBytes(const OptimizerSpec& optimizer, const std::vector<at::Tensor>& params);

// Calibrates `predictor` before the first step (CalibrateMemoryModel in
// split.h): probes of growing size, cut from the first `scenes` scenes of
// `dataset` (prepared as the loader does, without augmentation), run
// forward+backward through `model` as ForwardBackward runs a group, peaks
// measured through the allocator's memory statistics (so the same on any
// device whose allocator reports them) plus `extra_bytes` (memory live in
// training but not yet: OptimizerStateBytes before the first step). Leaves
// the model's parameters and buffers (BatchNorm statistics) as they were
// and `accum` zeroed. Nothing is run without a budget. Errors: the data's,
// or an exception other than out-of-memory propagates.
absl::StatusOr<CalibrationStats> CalibrateMemory(
    sparse::MinkUNetImpl& model, const Dataset& dataset, const LoaderOptions& loader,
    int64_t scenes, int channels, const std::vector<at::Tensor>& params,
    std::vector<at::Tensor>& accum, const SplitOptions& options, MemoryModel* predictor,
    int64_t budget_bytes, int64_t extra_bytes, double height = 0,
    at::ScalarType dtype = at::kFloat);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_SPLIT_STEP_H_
