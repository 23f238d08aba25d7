#include "worker/split/step.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "sparse/nn.h"
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
  // Coordinates go where the model is, as the features and labels do: where
  // that device's backend builds kernel maps from device keys (cuda), the
  // coordinate manager packs, checks and sorts the keys there and keeps no
  // host copy unless asked (issue 45); elsewhere it packs them on the host.
  return {sparse::SparseTensor(feats.to(device), coords.to(device)), labels.to(device), labelled};
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
// backward() instead; 2.x fires them): when `arm` (the group is the
// rank's last, ArmsReducer), `reducer` takes the gradients (sealing them)
// and launches their allreduce during backward; sealed gradients are never
// added again.
// Returns the absolute peak bytes (the allocator's memory statistics), or
// ResourceExhausted on c10::OutOfMemoryError.
absl::StatusOr<int64_t> RunGroupOnce(sparse::MinkUNetImpl& model, const Batch& batch,
                                     const Group& group, int channels,
                                     const std::vector<at::Tensor>& params,
                                     std::vector<at::Tensor>& accum, double weight,
                                     at::ScalarType dtype, double height, c10::Device device,
                                     StepOutcome* outcome, GradientReducer* reducer = nullptr,
                                     bool arm = false, const StepFaults& faults = {}) {
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
    // Half features (mixed precision): the loss and its reduction in float32.
    at::Tensor logits = out.features().to(sparse::AccumulateType(dtype));
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
    if (reducer != nullptr && arm) reducer->ArmFinalBackward();
    const at::Tensor target = faults.gradient_scale != 1 ? scaled * faults.gradient_scale : scaled;
    const std::vector<at::Tensor> grads = torch::autograd::grad(
        {target}, params, /*grad_outputs=*/{}, /*retain_graph=*/false, /*create_graph=*/false,
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

// Whether `group`, run reactively (RunSplitting), is the last backward of
// the rank's batch: its labelled voxels are all that are left
// (`remaining`). A batch without any labelled voxel arms too (each of its
// groups: the first seals every gradient, as zeros): every rank must
// launch its buckets from the same hooks, between the same SyncBN backward
// allreduces, or Gloo pairs a bucket with BatchNorm statistics.
bool ArmsReducer(const Group& group, int64_t remaining, int64_t trained) {
  const int64_t labelled = GroupLabelled(group);
  return labelled == remaining && (labelled > 0 || trained == 0);
}

// A group with no row (of scene 0, which every batch ForwardBackward runs
// has): what a rank runs when the gang agreed on more groups than it has.
Group EmptyGroup() {
  Piece p;
  p.all = false;
  return {p};
}

// The groups of a sync_batchnorm step (DataParallel): planned up front,
// the gang agrees on the most any rank planned, and this rank pads with
// empty groups; the reducer arms in the last one on every rank. `run`'s
// ResourceExhausted is not retried: it becomes Aborted.
absl::StatusOr<SplitStats> RunAgreedGroups(
    const std::vector<SceneView>& views, const SplitOptions& options, const MemoryModel* predictor,
    int64_t budget_bytes, Gang& gang,
    const std::function<absl::Status(const Group&, double, bool)>& run) {
  SplitStats stats;
  std::vector<Group> groups;
  if (predictor != nullptr && predictor->ready() && budget_bytes > 0) {
    groups = PlanGroups(views, *predictor, budget_bytes, options, &stats);
  } else {
    groups.emplace_back();
    for (size_t i = 0; i < views.size(); ++i) {
      groups.back().push_back(WholeScene(static_cast<int>(i), views[i]));
    }
  }
  at::Tensor counts = at::zeros({gang.world_size()}, at::kDouble);
  counts[gang.rank()] = static_cast<double>(groups.size());
  gang.AllreduceSum(counts, "the number of groups of a sync_batchnorm step");
  const auto agreed = static_cast<size_t>(counts.max().item<double>());
  const int64_t labelled = BatchLabelled(views);
  for (size_t g = 0; g < agreed; ++g) {
    const Group group = g < groups.size() ? groups[g] : EmptyGroup();
    const double weight =
        labelled > 0 ? static_cast<double>(GroupLabelled(group)) / static_cast<double>(labelled)
                     : 0.0;
    ++stats.forwards;
    absl::Status s = run(group, weight, g + 1 == agreed);
    if (absl::IsResourceExhausted(s)) {
      ++stats.oom_events;
      ++stats.wasted_forwards;
      return absl::AbortedError(absl::StrCat("group ", g + 1, " of ", agreed, " (",
                                             GroupVoxels(group), " voxels): ", s.message()));
    }
    if (!s.ok()) return s;
  }
  return stats;
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
    int64_t budget_bytes, int64_t extra_bytes, double height, at::ScalarType dtype) {
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
    return RunGroupOnce(model, batch, group, channels, params, accum, 0.0, dtype, height, device,
                        &ignored);
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
  const bool sync_bn = parallel != nullptr && parallel->sync_batchnorm;
  // A rank without a share of the global batch (the last, small batch of
  // an epoch, over more ranks than scenes) adds nothing, but takes part in
  // every collective: its gradient buckets go out (zeros) in Finish(), and
  // with synchronised BatchNorm it runs the forward and backward of an
  // empty scene, whose statistics count no row, for the layers' allreduces.
  Batch empty_share;
  const Batch& work = batch.scenes.empty() && sync_bn ? empty_share : batch;
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
  // BatchNorm's running statistics move once, at the end, from the moments
  // of the groups that completed (sparse/nn.h).
  sparse::BatchNormStepStats bn_stats(model);
  double wasted_seconds = 0;
  auto run_group = [&](const Group& group, double weight, bool arm) -> absl::Status {
    bn_stats.BeginPiece();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<int64_t> peak =
        RunGroupOnce(model, work, group, channels, params, accum, weight * scale, dtype, height,
                     device, &outcome, reducer, arm, faults);
    if (!peak.ok()) {
      // The pass's work is thrown away; the device has finished it (the
      // error came from an allocation, which waits for nothing, but the
      // next pass starts behind it on the same stream).
      wasted_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return peak.status();
    }
    bn_stats.CommitPiece();
    if (run_peak != nullptr) *run_peak = std::max(*run_peak, *peak);
    if (predictor != nullptr) predictor->Observe(GroupVoxels(group), -1, *peak);
    return absl::OkStatus();
  };
  RunGroup run = [&](const Group& group, double weight) {
    return run_group(group, weight,
                     ArmsReducer(group, local_labelled - outcome.labelled, outcome.labelled));
  };
  // Freed tensors are already back; hand the allocator's cached blocks
  // back too (CUDA: torch.cuda.empty_cache()).
  auto free_memory = [device] { sparse::ReleaseCachedMemory(device); };
  // The memory model learns on every step; it plans only under a budget.
  absl::StatusOr<SplitStats> stats =
      sync_bn ? RunAgreedGroups(views, options, predictor, budget_bytes, *parallel->gang, run_group)
      : baseline ? RunBaselineSplitting(views, run, free_memory, options.min_piece_voxels)
                 : RunSplitting(views, options, run, free_memory,
                                budget_bytes > 0 ? predictor : nullptr, budget_bytes);
  if (!stats.ok()) {
    if (sync_bn && absl::IsAborted(stats.status())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of memory with model.sync_batchnorm, whose groups are planned up front and "
          "not cut further (the restart's lowered budget plans smaller ones): ",
          stats.status().message()));
    }
    return stats.status();
  }
  if (predictor != nullptr && stats->smallest_failed_voxels > 0) {
    predictor->ObserveFailure(stats->smallest_failed_voxels);
  }
  if (reducer != nullptr) reducer->Finish();
  bn_stats.ApplyStep();
  outcome.stats = *stats;
  outcome.stats.wasted_seconds = wasted_seconds;
  return outcome;
}

}  // namespace trainsup::worker
