#include "worker/split/step.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "worker/gang/distributed.h"

namespace trainsup::worker {

GroupTensors Assemble(const Batch& batch, const Group& group, int channels, at::ScalarType dtype,
                      double height, c10::Device device) {
  const int data_channels = channels - (height > 0 ? 1 : 0);
  int64_t rows = GroupVoxels(group);
  at::Tensor coords = at::empty({rows, 4}, at::kInt);
  at::Tensor feats = at::empty({rows, channels}, at::kFloat);
  at::Tensor labels = at::empty({rows}, at::kLong);
  int32_t* c = coords.data_ptr<int32_t>();
  float* f = feats.data_ptr<float>();
  int64_t* l = labels.data_ptr<int64_t>();
  int64_t out = 0;
  int64_t labelled = 0;
  for (size_t k = 0; k < group.size(); ++k) {
    const Piece& p = group[k];
    const VoxelScene& s = batch.scenes[p.scene];
    int64_t n = p.all ? static_cast<int64_t>(s.labels.size()) : static_cast<int64_t>(p.rows.size());
    for (int64_t i = 0; i < n; ++i) {
      int64_t r = p.all ? i : p.rows[i];
      c[out * 4] = static_cast<int32_t>(k);
      c[out * 4 + 1] = s.xyz[r * 3];
      c[out * 4 + 2] = s.xyz[r * 3 + 1];
      c[out * 4 + 3] = s.xyz[r * 3 + 2];
      for (int ch = 0; ch < data_channels; ++ch) {
        f[out * channels + ch] = ch < s.channels ? s.features[r * s.channels + ch] : 1.0f;
      }
      if (height > 0)
        f[out * channels + data_channels] = static_cast<float>(s.xyz[r * 3 + 2] * height);
      l[out] = s.labels[r];
      labelled += s.labels[r] >= 0;
      ++out;
    }
  }
  if (dtype != at::kFloat) feats = feats.to(dtype);
  // Coordinates stay on the host (the coordinate manager's); features and
  // labels go where the model is.
  return {sparse::SparseTensor(feats.to(device), coords), labels.to(device), labelled};
}

namespace {

// The splitter's view of a batch's scenes.
std::vector<SceneView> SceneViews(const Batch& batch) {
  std::vector<SceneView> views;
  for (const VoxelScene& s : batch.scenes) {
    views.push_back({s.xyz.data(), static_cast<int64_t>(s.labels.size()), s.labelled.data()});
  }
  return views;
}

// The model's device (where its parameters are).
c10::Device ParamsDevice(const std::vector<at::Tensor>& params) {
  return params.empty() ? c10::Device(c10::DeviceType::CPU) : params.front().device();
}

// Forward and backward on one group: `weight` times the gradient of its
// mean loss is added to `accum` only when the whole group succeeded, so an
// OOM half-way leaves no trace; the loss, hits and labelled voxels are
// added to `outcome`. The gradients come from torch::autograd::grad, so
// no parameter's .grad is written; a data-parallel reducer's hooks on the
// parameters see each gradient as backward makes it (LibTorch 1.13 fired
// no leaf hook under autograd::grad, and this step wrote .grad through
// backward() instead; 2.x fires them): when the group completes the rank's batch
// (`remaining_labelled`, the labelled voxels not trained yet, equals the
// group's), `reducer` takes the gradients (sealing them) and launches their
// allreduce during backward; sealed gradients are never added again.
// Returns the absolute peak bytes (the allocator's memory statistics), or
// ResourceExhausted on c10::OutOfMemoryError.
absl::StatusOr<int64_t> RunGroupOnce(sparse::MinkUNetImpl& model, const Batch& batch,
                                     const Group& group, int channels,
                                     const std::vector<at::Tensor>& params,
                                     std::vector<at::Tensor>& accum, double weight,
                                     at::ScalarType dtype, double height, c10::Device device,
                                     StepOutcome* outcome, GradientReducer* reducer = nullptr,
                                     int64_t remaining_labelled = -1,
                                     const StepFaults& faults = {}) {
  struct DisarmAtExit {
    GradientReducer* reducer;
    ~DisarmAtExit() {
      if (reducer != nullptr) reducer->Disarm();
    }
  } disarm{reducer};
  try {
    sparse::ResetPeakMemory(device);
    GroupTensors t = Assemble(batch, group, channels, dtype, height, device);
    sparse::SparseTensor out = model.forward(t.input);
    at::Tensor logits = out.features();
    at::Tensor loss = t.labelled > 0 ? torch::nll_loss(torch::log_softmax(logits, 1), t.labels, {},
                                                       at::Reduction::Mean, -1)
                                     : logits.sum() * 0.0;
    at::Tensor scaled = loss * (weight * faults.loss_scale);
    if (faults.nan_loss) scaled = scaled + std::nan("");
    if (faults.nan_grad && !params.empty()) {
      // 0 * sqrt(p - p) is 0 forward; backward, sqrt's 1 / (2 sqrt(0)) meets
      // the 0: NaN in every element of the first parameter's gradient.
      const at::Tensor& p = params.front();
      scaled = scaled + at::sqrt((p - p.detach()).sum()) * 0.0;
    }
    // A batch without any labelled voxel arms too (each of its groups: the
    // first seals every gradient, as zeros): every rank must launch its
    // buckets from the same hooks, between the same SyncBN backward
    // allreduces, or Gloo pairs a bucket with BatchNorm statistics.
    const bool completes_batch =
        t.labelled == remaining_labelled && (t.labelled > 0 || outcome->labelled == 0);
    if (reducer != nullptr && completes_batch) {
      reducer->ArmFinalBackward();
    }
    const std::vector<at::Tensor> grads = torch::autograd::grad(
        {scaled}, params, /*grad_outputs=*/{}, /*retain_graph=*/false, /*create_graph=*/false,
        /*allow_unused=*/true);
    if (reducer != nullptr) reducer->Disarm();
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& g = grads[i];
        if (g.defined() && (reducer == nullptr || !reducer->Sealed(i))) accum[i].add_(g);
      }
    }
    outcome->loss += scaled.item<double>();
    at::Tensor pred = logits.argmax(1);
    at::Tensor mask = t.labels >= 0;
    outcome->hits += (pred.eq(t.labels) & mask).sum().item<int64_t>();
    outcome->labelled += t.labelled;
    return sparse::GetMemoryStats(device).peak_bytes;
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(e.what());
  }
}

}  // namespace

int64_t BatchLabelled(const Batch& batch) { return BatchLabelled(SceneViews(batch)); }

int64_t OptimizerStateBytes(const OptimizerSpec& optimizer, const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;
  for (const at::Tensor& p : params) bytes += static_cast<int64_t>(p.nbytes());
  if (optimizer.kind == "adamw") return 2 * bytes;  // exp_avg, exp_avg_sq
  return optimizer.momentum != 0 ? bytes : 0;       // SGD: the momentum buffers
}

absl::StatusOr<CalibrationStats> CalibrateMemory(
    sparse::MinkUNetImpl& model, const Dataset& dataset, const LoaderOptions& loader,
    int64_t scenes, int channels, const std::vector<at::Tensor>& params,
    std::vector<at::Tensor>& accum, const SplitOptions& options, MemoryModel* predictor,
    int64_t budget_bytes, int64_t extra_bytes, double height) {
  if (budget_bytes <= 0 || predictor == nullptr) return CalibrationStats{};
  Batch batch;
  LoaderOptions lo = loader;
  lo.augment = false;
  for (int64_t i = 0; i < std::min(scenes, dataset.size()); ++i) {
    absl::StatusOr<VoxelScene> scene = PrepareScene(dataset, i, 0, lo);
    if (!scene.ok()) return scene.status();
    batch.scenes.push_back(std::move(*scene));
  }
  const std::vector<SceneView> views = SceneViews(batch);
  // The probes leave nothing behind: BatchNorm statistics (buffers) are put
  // back, the gradients are scaled by 0 and the accumulators zeroed.
  std::vector<at::Tensor> buffers = model.buffers();
  std::vector<at::Tensor> saved;
  for (const at::Tensor& b : buffers) saved.push_back(b.clone());
  const c10::Device device = ParamsDevice(params);
  ProbeRun probe = [&](const Group& group) -> absl::StatusOr<int64_t> {
    StepOutcome ignored;
    return RunGroupOnce(model, batch, group, channels, params, accum, 0.0, at::kFloat, height,
                        device, &ignored);
  };
  CalibrationOptions calibration;
  calibration.extra_bytes = extra_bytes;
  absl::StatusOr<CalibrationStats> stats = CalibrateMemoryModel(
      views, options, budget_bytes, calibration, probe,
      [device] { sparse::ReleaseCachedMemory(device); }, predictor);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
    for (at::Tensor& a : accum) a.zero_();
  }
  return stats;
}

absl::StatusOr<StepOutcome> ForwardBackward(sparse::MinkUNetImpl& model, const Batch& batch,
                                            int channels, const std::vector<at::Tensor>& params,
                                            std::vector<at::Tensor>& accum,
                                            const SplitOptions& options, MemoryModel* predictor,
                                            int64_t budget_bytes, at::ScalarType dtype,
                                            int64_t* run_peak, double height, bool baseline,
                                            const DataParallel* parallel,
                                            const StepFaults& faults) {
  const bool unsplit = parallel != nullptr && parallel->unsplit;
  // A rank without a share of the global batch (the last, small batch of
  // an epoch, over more ranks than scenes) adds nothing, but takes part in
  // every collective: its gradient buckets go out (zeros) in Finish(), and
  // with synchronised BatchNorm it runs the forward and backward of an
  // empty scene, whose statistics count no row, for the layers' allreduces.
  Batch empty_share;
  const Batch& work = batch.scenes.empty() && unsplit ? empty_share : batch;
  if (&work == &empty_share) empty_share.scenes.emplace_back();
  const std::vector<SceneView> views = SceneViews(work);
  for (at::Tensor& a : accum) a.zero_();
  const c10::Device device = ParamsDevice(params);
  const int64_t local_labelled = BatchLabelled(views);
  GradientReducer* reducer = parallel != nullptr ? parallel->reducer : nullptr;
  // The groups' weights are shares of this rank's labelled voxels; scaled
  // by this rank's share of the global batch's they sum, over all ranks, to
  // the gradient of the global batch's mean loss.
  const double scale =
      parallel != nullptr && parallel->global_labelled > 0
          ? static_cast<double>(local_labelled) / static_cast<double>(parallel->global_labelled)
          : 1.0;
  StepOutcome outcome;
  RunGroup run = [&](const Group& group, double weight) -> absl::Status {
    absl::StatusOr<int64_t> peak =
        RunGroupOnce(model, work, group, channels, params, accum, weight * scale, dtype, height,
                     device, &outcome, reducer, local_labelled - outcome.labelled, faults);
    if (!peak.ok()) {
      if (unsplit && absl::IsResourceExhausted(peak.status())) {
        // Not retried: another split would desynchronise the collectives.
        return absl::AbortedError(peak.status().message());
      }
      return peak.status();
    }
    if (run_peak != nullptr) *run_peak = std::max(*run_peak, *peak);
    if (predictor != nullptr) predictor->Observe(GroupVoxels(group), -1, *peak);
    return absl::OkStatus();
  };
  // Freed tensors are already back; hand the allocator's cached blocks
  // back too (CUDA: torch.cuda.empty_cache()).
  auto free_memory = [device] { sparse::ReleaseCachedMemory(device); };
  // The memory model learns on every step; it plans only under a budget.
  absl::StatusOr<SplitStats> stats =
      baseline ? RunBaselineSplitting(views, run, free_memory, options.min_piece_voxels)
               : RunSplitting(views, options, run, free_memory,
                              budget_bytes > 0 && !unsplit ? predictor : nullptr,
                              unsplit ? 0 : budget_bytes);
  if (!stats.ok()) {
    if (unsplit && absl::IsAborted(stats.status())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of memory with model.sync_batchnorm, which trains every rank's batch unsplit: ",
          stats.status().message()));
    }
    return stats.status();
  }
  if (predictor != nullptr && stats->smallest_failed_voxels > 0) {
    predictor->ObserveFailure(stats->smallest_failed_voxels);
  }
  if (reducer != nullptr) reducer->Finish();
  outcome.stats = *stats;
  return outcome;
}

}  // namespace trainsup::worker
