#include "worker/train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/state.h"
#include "checkpoint/store.h"
#include "contracts/exit_codes.h"
#include "contracts/run_layout.h"
#include "nlohmann/json.hpp"
#include "sparse/determinism.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "sparse/nn.h"
#include "sparse/ops.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"
#include "worker/gang/distributed.h"
#include "worker/split/split.h"
#include "worker/split/step.h"
#include "worker/train/metrics.h"
#include "worker/train/trainer_impl.h"

namespace trainsup::worker {
namespace internal {
namespace {

namespace fs = std::filesystem;

int DepthOf(const std::string& arch) {
  if (arch == "minkunet18") return 18;
  if (arch == "minkunet34") return 34;
  if (arch == "minkunet50") return 50;
  return 14;
}

double LearningRate(const OptimizerSpec& o, int64_t step, int64_t total) {
  double lr = o.lr;
  if (o.warmup_steps > 0 && step < o.warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  double t = total > o.warmup_steps ? static_cast<double>(step - o.warmup_steps) /
                                          static_cast<double>(total - o.warmup_steps)
                                    : 0.0;
  t = std::clamp(t, 0.0, 1.0);
  if (o.schedule == "cosine") return lr * 0.5 * (1 + std::cos(M_PI * t));
  if (o.schedule == "poly") return lr * std::pow(1 - t, 0.9);
  if (o.schedule == "step") return lr * (t < 2.0 / 3.0 ? 1.0 : 0.1);
  return lr;
}

[[noreturn]] void SleepForever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

bool Active(const TestingSpec& t, const TrainerOptions& o) {
  return (t.only_attempt == 0 || t.only_attempt == o.attempt) &&
         (t.only_rank < 0 || t.only_rank == o.rank);
}

void CorruptNewest(const std::string& root) {
  ckpt::CheckpointStore store(root);
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = store.List();
  if (!list.ok() || list->empty()) return;
  fs::path file = fs::path(list->back().path) / "model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  auto size = static_cast<int64_t>(f.tellg());
  if (size <= 0) return;
  f.seekg(size / 2);
  char byte = 0;
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x5a);
  f.seekp(size / 2);
  f.write(&byte, 1);
}

}  // namespace

SplitOptions Trainer::Splitting() const {
  SplitOptions split_options;
  split_options.min_piece_voxels = spec_.train.min_piece_points;
  split_options.coarsest_stride = sparse::kMinkUNetCoarsestStride;
  return split_options;
}

absl::Status Trainer::Calibrate(const LoaderOptions& loader) {
  if (!spec_.train.predictive_split || budget_ <= 0 || memory_model_.ready()) {
    return absl::OkStatus();
  }
  // The optimizer's state is made by its first step; a resumed run has it.
  const int64_t extra =
      optimizer_->state().empty() ? OptimizerStateBytes(spec_.optimizer, params_) : 0;
  const int64_t scenes = std::min<int64_t>(8, 2 * spec_.train.batch_size);
  absl::StatusOr<CalibrationStats> c =
      CalibrateMemory(*model_, *train_, loader, scenes, channels_, params_, accum_, Splitting(),
                      &memory_model_, budget_, extra, height_, FeatureType());
  if (!c.ok()) return c.status();
  counters_.oom_events += c->oom_events;
  counters_.wasted_forwards += c->oom_events;
  Log(absl::StrCat("memory model calibrated before the first step: ", c->probes,
                   " probes of the first ", scenes, " scenes, up to ", c->largest_voxels,
                   " voxels (peak ", c->largest_peak >> 20, " MiB with ", extra >> 20,
                   " MiB of optimizer state to come), ", c->oom_events, " out of memory; ",
                   memory_model_.ready() ? "ready" : "not ready yet"));
  return absl::OkStatus();
}

absl::Status Trainer::Step(const Batch& batch, int64_t global_labelled) {
  const bool gang = gang_->world_size() > 1;
  DataParallel parallel{reducer_.get(), global_labelled, sync_batchnorm_, gang_.get()};
  // As DistributedDataParallel's broadcast_buffers: every rank's BatchNorm
  // running statistics are rank 0's, so evaluation and the checkpoint (rank
  // 0's) agree with every rank. With sync_batchnorm they are equal already.
  if (gang && !sync_batchnorm_) {
    BroadcastWeights(/*parameters=*/false,
                     absl::StrCat("running statistics from rank 0 for step ", step_ + 1));
  }
  step_applied_ = true;
  // The forward moves BatchNorm's running statistics; a step the guard
  // does not apply puts them back (after rank 0's broadcast: every rank
  // puts back the same).
  CopyBuffers(buffers_, saved_buffers_);
  reducer_->BeginStep(&accum_, step_);
  StepFaults faults = FaultsAt(step_ + 1);
  if (Scaling()) faults.gradient_scale = scaler_.scale();
  absl::StatusOr<StepOutcome> outcome = ForwardBackward(
      *model_, batch, channels_, params_, accum_, Splitting(),
      spec_.train.predictive_split ? &memory_model_ : nullptr, budget_, FeatureType(), &run_peak_,
      height_, /*baseline=*/false, gang ? &parallel : nullptr, faults);
  if (!outcome.ok()) return outcome.status();
  if (faults.gradient_scale != 1) {
    // The global gradient, unscaled (GradScaler's unscale_); an overflow
    // stays infinite or NaN, on every rank alike (the allreduce summed it).
    at::NoGradGuard no_grad;
    for (at::Tensor& a : accum_) a.div_(faults.gradient_scale);
  }
  const SplitStats* stats = &outcome->stats;
  double loss_sum = outcome->loss;
  int64_t hits = outcome->hits;
  int64_t labelled = outcome->labelled;
  // The forward moved this rank's BatchNorm statistics (without
  // sync_batchnorm, each rank's own): whether they are still finite goes
  // into the sums, so every rank learns of any rank's.
  double stats_bad = spec_.guard.check_finite && !std::isfinite(NormOf(buffers_)) ? 1 : 0;
  if (gang) {
    // The global batch's loss and accuracy; its gradient is in accum_.
    at::Tensor sums =
        at::tensor({loss_sum, static_cast<double>(hits), static_cast<double>(labelled), stats_bad},
                   at::kDouble);
    gang_->AllreduceSum(sums, absl::StrCat("loss and accuracy of step ", step_ + 1));
    loss_sum = sums[0].item<double>();
    hits = static_cast<int64_t>(sums[1].item<double>());
    labelled = static_cast<int64_t>(sums[2].item<double>());
    stats_bad = sums[3].item<double>();
  }
  counters_.Add(*stats);
  if (stats->splits > 0 || stats->oom_events > 0 || stats->dropped_pieces > 0) {
    std::string line = absl::StrCat(
        "step ", step_, ": ", stats->splits, " splits (", stats->predicted_splits, " predicted), ",
        stats->oom_events, " out-of-memory retries, ", stats->dropped_pieces, " pieces dropped");
    Log(line);
    Event(v1::EVENT_KIND_OOM_SPLIT, -1, line);
    for (const std::string& why : stats->drop_reasons) {
      Log("dropped: " + why);
      Event(v1::EVENT_KIND_OOM_SPLIT, -1, "dropped: " + why);
    }
  }
  if (labelled == 0) {
    // labelled is the global batch's: every rank skips the same steps.
    counters_.skipped_steps++;
    // Nothing to judge, but the forward's statistics must not stay.
    if (stats_bad != 0) CopyBuffers(saved_buffers_, buffers_);
    Log(absl::StrCat("step ", step_, ": ",
                     stats->dropped_labelled > 0 ? "no labelled voxel fitted in memory"
                                                 : "the batch has no labelled voxel",
                     "; optimizer step skipped"));
    return absl::OkStatus();
  }
  if (Scaling() && std::isfinite(loss_sum)) {
    // Every rank has the same global gradient and loss: the same verdict.
    if (!std::isfinite(NormOf(accum_))) {
      ScalerSkip(step_ + 1);
      return absl::OkStatus();
    }
    if (scaler_.Good()) Log(absl::StrCat("loss scale grows to ", scaler_.scale()));
  }
  if (!GuardStep(step_ + 1, loss_sum, stats_bad == 0)) return absl::OkStatus();
  // The optimizer step is outside the splittable region: an OOM here is hard.
  try {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = accum_[i].clone();
    double lr = LearningRate(spec_.optimizer, step_, total_steps_) * options_.lr_factor;
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
    last_lr_ = lr;
    for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat("optimizer step: ", e.what()));
  }
  last_loss_ = loss_sum;
  last_accuracy_ = static_cast<double>(hits) / static_cast<double>(labelled);
  return absl::OkStatus();
}

void Trainer::CopyBuffers(const std::vector<at::Tensor>& from, std::vector<at::Tensor>& to) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
}

double Trainer::NormOf(const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  norms.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    if (!t.is_floating_point()) continue;  // num_batches_tracked
    // In the tensor's own type: a float64 norm would allocate a float64
    // copy of every gradient under the memory budget. A float32 norm
    // overflows only past 1.8e19, which is a diverged gradient anyway.
    norms.push_back(at::linalg_vector_norm(t, 2));
  }
  return norms.empty() ? 0.0
                       : at::linalg_vector_norm(at::stack(norms).to(at::kDouble), 2).item<double>();
}

TrainerResult Trainer::Run() {
  TrainerResult result;
  try {
    result = RunLoop();
  } catch (const CollectiveError& e) {
    // A peer died, stopped, or never came: this rank cannot go on alone.
    // The supervisor restarts the gang from the newest checkpoint.
    Log(absl::StrCat("peer lost: ", e.what()));
    result = Fail(WorkerExit::kPeerLost, e.what());
  }
  FinishWrites();
  return result;
}

TrainerResult Trainer::RunLoop() {
  // Everything LibTorch allocates from here on counts against the budget.
  sparse::InstallCountingAllocator();
  Report(v1::PHASE_LOADING);
  if (std::optional<TrainerResult> failed = SetUp()) return *failed;
  Report(v1::PHASE_TRAINING);
  TrainerResult result;
  last_checkpoint_time_ = Clock::now();
  while (step_ < total_steps_) {
    if (std::optional<TrainerResult> ended = InjectFaults(step_ + 1)) return *ended;
    if (std::optional<TrainerResult> ended = TrainOneStep(&result)) return *ended;
  }
  if (std::optional<TrainerResult> failed = CheckpointOrExit("at the end of the run")) {
    return *failed;
  }
  Evaluate(&result);
  return Completed(std::move(result));
}

std::optional<TrainerResult> Trainer::SetUp() {
  const TestingSpec& faults = spec_.testing;
  inject_ = Active(faults, options_);
  if (inject_ && faults.corrupt_checkpoint && options_.rank == 0) CorruptNewest(store_.root());
  if (std::optional<TrainerResult> failed = OpenData()) return failed;
  if (std::optional<TrainerResult> failed = JoinGang()) return failed;
  BuildModel();
  std::string memory_settings;
  if (std::optional<TrainerResult> failed = ApplyBudget(&memory_settings)) return failed;
  if (std::optional<TrainerResult> failed = ResumeOrFail()) return failed;
  at_start_ = counters_;
  if (std::optional<TrainerResult> failed = PrepareLoader()) return failed;
  if (!skip_windows_.empty() || options_.lr_factor != 1) {
    Log(absl::StrCat(
        "skip windows: ", skip_windows_.empty() ? "none" : FormatStepWindows(skip_windows_),
        " (steps whose batches are not trained on); learning rate x", options_.lr_factor));
  }
  Log(absl::StrCat(
      "training ", spec_.model.arch, " (", model_->NumParameters(), " parameters, ", num_classes_,
      " classes, ", channels_, " input channels) on ", train_->size(), " training and ",
      val_ ? val_->size() : 0, " validation scenes, ", total_steps_, " steps, ", memory_settings,
      ", ", at::get_num_threads(), " threads, on ", device_.str(), ", precision ",
      spec_.train.precision, ": ", sparse::DescribePrecision(FeatureType(), device_),
      options_.world_size > 1
          ? absl::StrCat(", rank ", options_.rank, " of ", options_.world_size, " (global batch ",
                         GlobalBatch(spec_), ", this rank's share ",
                         RankShare(GlobalBatch(spec_), options_.rank, options_.world_size).size(),
                         ", ", reducer_->num_buckets(), " gradient buckets)")
          : absl::StrCat(", global batch ", GlobalBatch(spec_))));
  return std::nullopt;
}

// A spec field that does not fit the data is a usage error (64); a file
// that cannot be read is a data error (65).
TrainerResult Trainer::DataFailure(const absl::Status& s) {
  const std::string m(s.message());
  const bool field = m.rfind("data.", 0) == 0 || m.rfind("model.", 0) == 0;
  return Fail(field ? WorkerExit::kUsage : WorkerExit::kData, DataMessage(s));
}

std::optional<TrainerResult> Trainer::OpenData() {
  absl::StatusOr<std::unique_ptr<Dataset>> train =
      OpenDataset(spec_, Split::kTrain, options_.data_roots);
  if (!train.ok()) return DataFailure(train.status());
  train_ = std::move(*train);
  if (spec_.data.val_fraction > 0) {
    absl::StatusOr<std::unique_ptr<Dataset>> val =
        OpenDataset(spec_, Split::kVal, options_.data_roots);
    if (!val.ok()) return DataFailure(val.status());
    val_ = std::move(*val);
  }
  if (train_->size() == 0) return Fail(WorkerExit::kData, "the training split is empty");
  num_classes_ = spec_.model.num_classes > 0 ? static_cast<int>(spec_.model.num_classes)
                                             : train_->num_classes();
  if (num_classes_ < 2) {
    return Fail(WorkerExit::kData, absl::StrCat("the data has ", num_classes_,
                                                " labelled classes; training needs at least 2"));
  }
  channels_ = std::max(1, train_->feature_channels()) + (spec_.model.height_feature ? 1 : 0);
  height_ = spec_.model.height_feature ? spec_.model.voxel_size : 0;
  if (spec_.model.in_channels != channels_) {
    return Fail(WorkerExit::kUsage, absl::StrCat("model.in_channels: ", spec_.model.in_channels,
                                                 ", but the data gives ", channels_,
                                                 " input channel", channels_ == 1 ? "" : "s"));
  }
  class_counts_.assign(num_classes_, 0);
  return std::nullopt;
}

std::optional<TrainerResult> Trainer::JoinGang() {
  absl::StatusOr<c10::Device> device =
      TrainingDevice(spec_.train.device, sparse::CudaDeviceAvailable());
  if (!device.ok()) return Fail(WorkerExit::kUsage, std::string(device.status().message()));
  device_ = *device;
  sparse::SetTf32(device_.is_cuda() && spec_.train.tf32);
  GangOptions gang_options;
  gang_options.rank = options_.rank;
  gang_options.world_size = options_.world_size;
  gang_options.master_addr = options_.master_addr;
  gang_options.master_port = options_.master_port;
  gang_options.node_addr = options_.node_addr;
  gang_options.gloo_ifname = options_.gloo_ifname;
  gang_options.timeout_s = spec_.distributed.timeout_s;
  gang_options.connect_timeout_s = spec_.distributed.connect_timeout_s;
  gang_options.backend = spec_.distributed.backend;
  gang_options.device = device_;
  absl::StatusOr<std::unique_ptr<Gang>> gang = Gang::Join(gang_options);
  if (!gang.ok()) {
    return Fail(absl::IsInvalidArgument(gang.status()) ? WorkerExit::kUsage : WorkerExit::kPeerLost,
                std::string(gang.status().message()));
  }
  gang_ = std::move(*gang);
  if (options_.world_size > 1) {
    Log(absl::StrCat("joined the gang as rank ", options_.rank, " of ", options_.world_size, " (",
                     gang_->backend(), ", rendezvous ", options_.master_addr, ":",
                     options_.master_port, ", collective timeout ", spec_.distributed.timeout_s,
                     " s)"));
  }
  return std::nullopt;
}

void Trainer::BuildModel() {
  sparse::SetDeterministic(spec_.train.deterministic);
  torch::manual_seed(static_cast<uint64_t>(spec_.train.seed));
  model_ =
      sparse::MinkUNet(sparse::MinkUNetPlan(DepthOf(spec_.model.arch), channels_, num_classes_));
  model_->to(device_);
  if (spec_.model.gradient_checkpointing) sparse::EnableGradientCheckpointing(*model_);
  model_->train();
  params_ = model_->parameters();
  for (const at::Tensor& p : params_) accum_.push_back(torch::zeros_like(p));
  buffers_ = model_->buffers();
  for (const at::Tensor& b : buffers_) saved_buffers_.push_back(b.clone());
  // Every rank starts from rank 0's weights (the same seed makes the same
  // ones, but a rank must never rely on that).
  BroadcastWeights(/*parameters=*/true, "initial weights from rank 0");
  reducer_ = std::make_unique<GradientReducer>(
      gang_.get(), params_, static_cast<int64_t>(spec_.distributed.bucket_mb * (1 << 20)),
      spec_.distributed.overlap_backward);
  if (spec_.optimizer.kind == "adamw") {
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        params_,
        torch::optim::AdamWOptions(spec_.optimizer.lr).weight_decay(spec_.optimizer.weight_decay));
  } else {
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params_, torch::optim::SGDOptions(spec_.optimizer.lr)
                     .momentum(spec_.optimizer.momentum)
                     .weight_decay(spec_.optimizer.weight_decay));
  }
}

std::optional<TrainerResult> Trainer::ApplyBudget(std::string* memory_settings) {
  const int64_t budget_mb = options_.memory_budget_mb_override > 0
                                ? options_.memory_budget_mb_override
                                : spec_.train.memory_budget_mb;
  budget_ = budget_mb << 20;
  // On the CPU, the allocator settings minkunet_bench measures: the block
  // cache sized against the budget and counted in it (sparse/memory.h). On
  // a GPU the budget becomes the caching allocator's memory fraction.
  if (device_.is_cpu()) {
    const sparse::AllocatorSettings allocator = sparse::TrainingAllocatorSettings(budget_);
    sparse::ApplyAllocatorSettings(allocator);
    *memory_settings = sparse::ToString(allocator);
  } else {
    sparse::SetMemoryBudget(device_, budget_);
    *memory_settings =
        budget_ > 0 ? absl::StrCat("budget ", budget_mb, " MiB (the caching allocator's fraction)")
                    : std::string("no budget");
  }
  if (budget_ > 0 && sparse::GetMemoryStats(device_).current_bytes > budget_) {
    return Fail(WorkerExit::kOom, absl::StrCat("the model and optimizer alone need ",
                                               sparse::GetMemoryStats(device_).current_bytes,
                                               " bytes, more than the budget of ", budget_));
  }
  return std::nullopt;
}

std::optional<TrainerResult> Trainer::ResumeOrFail() {
  absl::Status resumed = Resume();
  if (resumed.ok()) return std::nullopt;
  if (resumed.code() == absl::StatusCode::kInvalidArgument) {
    return Fail(WorkerExit::kUsage, std::string(resumed.message()));
  }
  // An I/O error says nothing about the checkpoint: nothing was
  // quarantined, and starting from scratch or from an older step would
  // throw work away. The attempt fails (a crash exit) and is retried.
  if (absl::IsUnavailable(resumed)) {
    return Crash(CrashReason::kCheckpointIo,
                 absl::StrCat("cannot resume (nothing quarantined; the attempt is retried): ",
                              resumed.message()));
  }
  return Crash(CrashReason::kCheckpointCorrupt, std::string(resumed.message()));
}

std::optional<TrainerResult> Trainer::PrepareLoader() {
  // Nothing about the data depends on the gang's size: the global batches
  // are the same at every world size, each rank trains its share.
  train_size_ = train_->size();
  if (train_size_ == 0) return Fail(WorkerExit::kData, "the training split has no scenes");
  const int64_t global_batch = GlobalBatch(spec_);
  total_steps_ = TotalSteps(spec_, BatchesPerEpoch(train_size_, global_batch));
  if (cursor_ >= train_size_) {
    epoch_++;
    cursor_ = 0;
  }
  LoaderOptions lo;
  lo.batch_size = global_batch;
  lo.seed = static_cast<uint64_t>(spec_.train.seed);
  lo.voxel_size = spec_.model.voxel_size;
  lo.augment = spec_.data.augment;
  lo.rank = options_.rank;
  lo.world_size = options_.world_size;
  loader_ = std::make_unique<Loader>(train_.get(), lo, epoch_, cursor_);
  absl::Status calibrated = Calibrate(lo);
  if (!calibrated.ok()) return DataFailure(calibrated);
  // After the calibration, whose probes differ from rank to rank and so
  // must not be collectives.
  if (spec_.model.sync_batchnorm && options_.world_size > 1) {
    sync_batchnorm_ = true;
    Gang* g = gang_.get();
    const int64_t* step = &step_;
    const int64_t layers = sparse::SetBatchNormAllreduce(*model_, [g, step](at::Tensor& t) {
      g->AllreduceSum(t, absl::StrCat("sync BatchNorm statistics of step ", *step + 1));
    });
    Log(absl::StrCat("sync_batchnorm: the statistics of ", layers,
                     " BatchNorm layers are allreduced over ", options_.world_size,
                     " ranks; a step's groups are planned up front and agreed by the gang"));
  }
  if (inject_ && spec_.testing.stop_in_collective_at_step > 0) {
    reducer_->StopInCollectiveAt(spec_.testing.stop_in_collective_at_step);
  }
  return std::nullopt;
}

// Faults fire just before step `next` runs.
std::optional<TrainerResult> Trainer::InjectFaults(int64_t next) {
  if (!inject_) return std::nullopt;
  const TestingSpec& faults = spec_.testing;
  if (faults.crash_at_step == next) {
    Log(absl::StrCat("injected crash (abort) at step ", next));
    std::abort();
  }
  if (faults.exit_at_step == next) {
    return End(static_cast<int>(faults.exit_code), "injected",
               absl::StrCat("injected exit ", faults.exit_code, " at step ", next));
  }
  if (faults.signal_at_step == next) {
    Log(absl::StrCat("injected signal ", faults.signal, " at step ", next));
    raise(static_cast<int>(faults.signal));
  }
  if (faults.hang_at_step == next) {
    Log(absl::StrCat("injected hang at step ", next, " (heartbeats go on)"));
    SleepForever();
  }
  if (faults.freeze_at_step == next) {
    Log(absl::StrCat("injected freeze at step ", next, " (heartbeats stop)"));
    if (hooks_.pause_heartbeats) hooks_.pause_heartbeats(true);
    SleepForever();
  }
  if (faults.oom_at_step == next) {
    // Outside the splittable region, as an optimizer step would.
    Log(absl::StrCat("injected allocation past the memory budget at step ", next));
    if (budget_ == 0) {
      sparse::SetMemoryBudget(device_, sparse::GetMemoryStats(device_).current_bytes + (1 << 20));
    }
    try {
      at::Tensor big = at::empty({int64_t{1} << 28}, at::TensorOptions(at::kFloat).device(device_));
    } catch (const c10::OutOfMemoryError& e) {
      return Fail(WorkerExit::kOom,
                  absl::StrCat("hard out-of-memory outside the splittable region: ", e.what()));
    }
  }
  return std::nullopt;
}

// The one place a checkpoint is written from the loop. `must` names when a
// checkpoint that has to be written is (written now, after the write in
// flight; its failure ends the attempt, CheckpointFailed); nullptr: a
// periodic one (in the background with train.background_checkpoints),
// whose failure is reported and training goes on. A hard out-of-memory
// while saving ends the attempt either way.
std::optional<TrainerResult> Trainer::CheckpointOrExit(const char* must) {
  try {
    absl::Status c = Checkpoint(must == nullptr && spec_.train.background_checkpoints);
    if (!c.ok() && must != nullptr) return CheckpointFailed(c, must);
  } catch (const c10::OutOfMemoryError& e) {
    return Fail(WorkerExit::kOom,
                absl::StrCat("hard out-of-memory while checkpointing: ", e.what()));
  }
  if (must == nullptr) last_checkpoint_time_ = Clock::now();
  return std::nullopt;
}

std::optional<TrainerResult> Trainer::TrainOneStep(TrainerResult* result) {
  const int64_t next = step_ + 1;
  const auto iteration_start = Clock::now();
  absl::StatusOr<Batch> batch = loader_->Next();
  if (!batch.ok()) return Fail(WorkerExit::kData, DataMessage(batch.status()));
  if (spec_.data.log_samples && options_.rank == 0) {
    // The whole global batch, with each sample's augmentation seed: the
    // same at every world size (docs/distributed.md, "Elastic").
    std::string line = absl::StrCat("samples of step ", next, " (epoch ", batch->epoch, "):");
    for (int64_t index : batch->samples) {
      absl::StrAppendFormat(
          &line, " %d:%016x", index,
          AugmentSeed(static_cast<uint64_t>(spec_.train.seed), batch->epoch, index));
    }
    Log(line);
  }
  // What the ranks agree on before the step (one collective; with one
  // rank, the local values): the global batch's labelled voxels, whether
  // any rank was asked to stop or to checkpoint (rank 0's clock decides
  // checkpoint_every_seconds), so all take the same decisions, and the
  // background writes rank 0 saw finish, so all count them alike.
  const int64_t local_labelled = BatchLabelled(*batch);
  const bool stop = hooks_.stop_requested && hooks_.stop_requested();
  const bool timed = options_.rank == 0 && spec_.train.checkpoint_every_seconds > 0 &&
                     std::chrono::duration<double>(Clock::now() - last_checkpoint_time_).count() >=
                         spec_.train.checkpoint_every_seconds;
  const bool requested = hooks_.checkpoint_requested && hooks_.checkpoint_requested();
  at::Tensor control = at::zeros({3 + 2 * kWriteSlots}, at::kLong);
  control[0] = local_labelled;
  control[1] = int64_t{stop};
  control[2] = int64_t{timed || requested};
  std::vector<ckpt::WriteResult> written;
  if (options_.rank == 0) written = TakeWrites(/*wait=*/false);
  PutWrites(written, control, 3);
  gang_->AllreduceSum(control, absl::StrCat("control of step ", next));
  SettleWrites(control, 3, written);
  if (control[1].item<int64_t>() > 0) {
    if (std::optional<TrainerResult> failed = CheckpointOrExit("before stopping on request")) {
      return failed;
    }
    return Fail(WorkerExit::kStopped,
                absl::StrCat("stopped on request after checkpoint step-", step_));
  }
  // Not a step whose checkpoint is being written; again after it failed.
  if (control[2].item<int64_t>() > 0 && step_ > last_checkpoint_ &&
      (step_ > checkpoint_started_ || step_ == last_failed_checkpoint_)) {
    if (std::optional<TrainerResult> failed = CheckpointOrExit(nullptr)) return failed;
  }
  const auto t0 = Clock::now();
  // Time blocked in collectives is waiting for the other ranks, not this
  // rank's work: the step's compute time leaves it out (stragglers).
  const double blocked_before = gang_->stats().blocked_s;
  if (inject_ && spec_.testing.slow_step_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(spec_.testing.slow_step_ms));
  }
  bool trained = false;
  if (InStepWindows(skip_windows_, next)) {
    // The same on every rank (the windows are the spec's and the
    // launch's): the batch is drawn, so the data order goes on as it
    // would, and not trained on.
    counters_.window_skipped_steps++;
    if (!InStepWindows(skip_windows_, next - 1)) {
      Log(absl::StrCat("step ", next, ": a skip window starts; its batches are not trained on"));
    }
  } else {
    absl::Status s = Step(*batch, control[0].item<int64_t>());
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        return Fail(WorkerExit::kOom,
                    absl::StrCat("hard out-of-memory at step ", next, ": ", s.message()));
      }
      return Crash(CrashReason::kError, std::string(s.message()));
    }
    if (diverged_) return diverged_;
    trained = step_applied_;
  }
  const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
  step_compute_s_ = std::max(0.0, step_s - (gang_->stats().blocked_s - blocked_before));
  AfterStep(*batch, step_s, next, trained);
  LogStep(iteration_start);
  // The same on every rank (the steps are); the timed and requested ones
  // were agreed on before the step.
  const bool due =
      spec_.train.checkpoint_every_steps > 0 && step_ % spec_.train.checkpoint_every_steps == 0;
  if (due && step_ < total_steps_) {
    // A failed save has been reported; training goes on, and the next
    // save comes a whole interval later.
    if (std::optional<TrainerResult> failed = CheckpointOrExit(nullptr)) return failed;
  }
  if (spec_.train.eval_every_steps > 0 && step_ % spec_.train.eval_every_steps == 0 &&
      step_ < total_steps_) {
    Evaluate(result);
  }
  return std::nullopt;
}

// The bookkeeping of a step that ran: class counts, speed, the position in
// the data, the heartbeat's counter, the cache release.
void Trainer::AfterStep(const Batch& batch, double step_seconds, int64_t next, bool trained) {
  for (const VoxelScene& scene : batch.scenes) {
    if (!trained) break;
    for (int32_t l : scene.labels) {
      if (l >= 0 && l < num_classes_) class_counts_[l]++;
    }
  }
  samples_per_sec_ = step_seconds > 0 ? static_cast<double>(batch.scenes.size()) / step_seconds : 0;
  step_ = next;
  epoch_ = batch.epoch;
  cursor_ = batch.cursor_end;
  if (cursor_ >= train_size_) {
    epoch_++;
    cursor_ = 0;
  }
  if (hooks_.advance) hooks_.advance();
  if (spec_.train.empty_cache_every_steps > 0 && step_ % spec_.train.empty_cache_every_steps == 0) {
    const int64_t cached = sparse::GetMemoryStats(device_).cached_bytes;
    sparse::ReleaseCachedMemory(device_);
    Log(absl::StrCat("step ", step_, ": handed ", cached, " cached bytes back to the system"));
  }
  Report(v1::PHASE_TRAINING);
}

// The step's log line: the iteration (data, agreement, step) and, in a
// gang, this rank's time blocked in collectives: what distributed_bench
// reads.
void Trainer::LogStep(Clock::time_point iteration_start) {
  std::string collectives =
      absl::StrFormat("; iteration %.1f ms",
                      1e3 * std::chrono::duration<double>(Clock::now() - iteration_start).count());
  if (gang_->world_size() > 1) {
    const CollectiveStats c = gang_->TakeStats();
    absl::StrAppendFormat(
        &collectives,
        ", collectives %.1f ms blocked, %lld/%lld buckets launched during backward, %.1f ms in "
        "flight",
        1e3 * c.blocked_s, static_cast<long long>(c.buckets_in_backward),
        static_cast<long long>(c.buckets_in_backward + c.buckets_after_backward),
        1e3 * c.bucket_flight_s);
  }
  Log(absl::StrCat("step ", step_, "/", total_steps_, " epoch ", epoch_, " loss ", last_loss_,
                   " acc ", last_accuracy_, " ", samples_per_sec_, " scenes/s peak ",
                   run_peak_ >> 20, " MiB", collectives));
}

// FNV-1a over the bytes of every parameter and buffer, in order: equal on
// every rank of a gang whose weights agree.
std::string Trainer::WeightsDigest() const {
  uint64_t h = 1469598103934665603ull;
  for (const auto* list : {&params_, &buffers_}) {
    for (const at::Tensor& t : *list) {
      const at::Tensor c = t.detach().to(at::kCPU).contiguous();
      const auto* b = static_cast<const unsigned char*>(c.data_ptr());
      for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
    }
  }
  return absl::StrFormat("%016x", h);
}

}  // namespace internal

void FillTally(const TrainingTally& t, ::trainsup::v1::TrainingTally* out) {
  out->set_steps(t.steps);
  out->set_applied(t.applied);
  out->set_skipped_window(t.skipped_window);
  out->set_skipped_guard(t.skipped_guard);
  out->set_skipped_scaler(t.skipped_scaler);
  out->set_final_metric(t.final_metric);
  out->set_baseline_metric(t.baseline_metric);
}

namespace internal {

TrainerResult Trainer::Completed(TrainerResult result) {
  Log(absl::StrCat("weights digest ", WeightsDigest(), " (rank ", options_.rank, ")"));
  result.exit_code = ExitStatus(WorkerExit::kCompleted);
  result.reason = ToString(WorkerExit::kCompleted);
  result.last_step = step_;
  result.tally = Tally();
  result.message = absl::StrCat("completed ", step_, " steps; splits ", counters_.splits, " (",
                                counters_.predicted_splits, " predicted), out-of-memory retries ",
                                counters_.retries, ", wasted forwards ", counters_.wasted_forwards,
                                ", dropped pieces ", counters_.dropped_pieces);
  if (result.val_miou >= 0) {
    absl::StrAppend(&result.message, "; val mIoU ", result.val_miou, " vs majority baseline ",
                    result.baseline_miou);
  }
  return result;
}

}  // namespace internal

absl::StatusOr<c10::Device> TrainingDevice(const std::string& device, bool cuda_available) {
  if (device == "cpu" || (device == "auto" && !cuda_available)) {
    return c10::Device(c10::DeviceType::CPU);
  }
  if (device != "auto" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("train.device: must be one of auto, cpu, cuda; got \"", device, "\""));
  }
  if (!cuda_available) {
    return absl::InvalidArgumentError(
        "train.device: \"cuda\", but this worker has no CUDA device (its LibTorch has no CUDA, or "
        "CUDA_VISIBLE_DEVICES shows none)");
  }
  return c10::Device(c10::DeviceType::CUDA, 0);
}

TrainerResult Train(const RunSpec& spec, const TrainerOptions& options, const TrainerHooks& hooks) {
  internal::Trainer trainer(spec, options, hooks);
  return trainer.Run();
}

}  // namespace trainsup::worker
