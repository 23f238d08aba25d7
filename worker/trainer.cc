#include "worker/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "checkpoint/state.h"
#include "checkpoint/store.h"
#include "nlohmann/json.hpp"
#include "proto/exit_codes.h"
#include "proto/run_layout.h"
#include "sparse/determinism.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "sparse/nn.h"
#include "worker/dataset.h"
#include "worker/loader.h"
#include "worker/metrics.h"
#include "worker/split.h"
#include "worker/step.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = ExitStatus(WorkerExit::kCompleted);
constexpr int kExitUsage = ExitStatus(WorkerExit::kUsage);
constexpr int kExitData = ExitStatus(WorkerExit::kData);
constexpr int kExitOom = ExitStatus(WorkerExit::kOom);
constexpr int kExitStopped = ExitStatus(WorkerExit::kStopped);
// Not a contract code: the supervisor restarts the attempt like a crash.
constexpr int kExitCheckpointIo = 1;

// Counters kept across the whole run (checkpointed with the trainer state).
struct Counters {
  int64_t splits = 0;
  int64_t predicted_splits = 0;
  int64_t retries = 0;
  int64_t oom_events = 0;
  int64_t wasted_forwards = 0;
  int64_t dropped_pieces = 0;
  int64_t dropped_voxels = 0;
  int64_t skipped_steps = 0;

  void Add(const SplitStats& s) {
    splits += s.splits;
    predicted_splits += s.predicted_splits;
    retries += s.retries;
    oom_events += s.oom_events;
    wasted_forwards += s.wasted_forwards;
    dropped_pieces += s.dropped_pieces;
    dropped_voxels += s.dropped_voxels;
  }
  nlohmann::json ToJson() const {
    return {{"splits", splits},
            {"predicted_splits", predicted_splits},
            {"retries", retries},
            {"oom_events", oom_events},
            {"wasted_forwards", wasted_forwards},
            {"dropped_pieces", dropped_pieces},
            {"dropped_voxels", dropped_voxels},
            {"skipped_steps", skipped_steps}};
  }
  void FromJson(const nlohmann::json& j) {
    splits = j.value("splits", int64_t{0});
    predicted_splits = j.value("predicted_splits", int64_t{0});
    retries = j.value("retries", int64_t{0});
    oom_events = j.value("oom_events", int64_t{0});
    wasted_forwards = j.value("wasted_forwards", int64_t{0});
    dropped_pieces = j.value("dropped_pieces", int64_t{0});
    dropped_voxels = j.value("dropped_voxels", int64_t{0});
    skipped_steps = j.value("skipped_steps", int64_t{0});
  }
};

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

class Trainer {
 public:
  Trainer(const RunSpec& spec, const TrainerOptions& options, const TrainerHooks& hooks)
      : spec_(spec),
        options_(options),
        hooks_(hooks),
        store_(RunLayout(options.run_dir).CheckpointRoot(options.rank, options.world_size),
               options.file_system != nullptr ? options.file_system : ckpt::FileSystem::Default(),
               ckpt::StoreOptions{static_cast<int>(spec.train.keep_checkpoints), 0}) {}

  TrainerResult Run();

 private:
  void Log(const std::string& line) {
    if (hooks_.log) hooks_.log(line);
  }
  void Event(v1::EventKind kind, int64_t checkpoint_step, const std::string& message) {
    if (hooks_.event) hooks_.event(kind, step_, checkpoint_step, message);
  }
  void Report(v1::Phase phase) {
    if (!hooks_.progress) return;
    v1::Progress p;
    p.set_step(step_);
    p.set_total_steps(total_steps_);
    p.set_epoch(epoch_);
    p.set_phase(phase);
    p.set_loss(last_loss_);
    p.set_samples_per_sec(samples_per_sec_);
    sparse::MemoryStats m = sparse::GetMemoryStats(device_);
    p.set_memory_current_bytes(m.current_bytes);
    p.set_memory_peak_bytes(run_peak_);
    p.set_memory_budget_bytes(budget_);
    p.set_last_checkpoint_step(last_checkpoint_);
    p.set_splits(counters_.splits);
    p.set_oom_retries(counters_.retries);
    p.set_dropped_pieces(counters_.dropped_pieces);
    p.set_wasted_forwards(counters_.wasted_forwards);
    p.set_accuracy(last_accuracy_);
    p.set_val_miou(val_miou_);
    p.set_baseline_miou(baseline_miou_);
    p.set_checkpoint_failures(checkpoint_failures_);
    p.set_last_checkpoint_error(last_checkpoint_error_);
    hooks_.progress(p);
  }
  // A data error's message for the exit file and the supervisor, which
  // viewers see: the file's content withheld (ViewerMessage). The rank's
  // log gets all of it.
  std::string DataMessage(const absl::Status& s) {
    const std::string viewer = ViewerMessage(s);
    if (viewer != s.message()) Log(absl::StrCat("data error: ", s.message()));
    return viewer;
  }
  TrainerResult Fail(int code, const std::string& reason, const std::string& message) {
    TrainerResult r;
    r.exit_code = code;
    r.reason = reason;
    r.message = message;
    r.last_step = step_;
    return r;
  }
  // Saves the current step. A failure is counted and reported (log,
  // checkpoint_failed, the heartbeat) and returned; the checkpoints
  // committed before are untouched.
  absl::Status Checkpoint();
  // The end of an attempt whose checkpoint had to be written (`when`: at
  // the end, before a requested stop) but failed with `s`: exit 74 when the
  // file system is full (ResourceExhausted: ENOSPC, EDQUOT), else 1.
  TrainerResult CheckpointFailed(const absl::Status& s, const std::string& when);
  absl::Status Resume();
  SplitOptions Splitting() const;
  // Calibrates the memory model before the first step (CalibrateMemory)
  // when it plans (predictive splitting under a budget) and is not ready.
  absl::Status Calibrate(const LoaderOptions& loader);
  // One optimizer step over `batch`; ResourceExhausted = hard OOM.
  absl::Status Step(const Batch& batch);
  void Evaluate(TrainerResult* result);

  RunSpec spec_;
  TrainerOptions options_;
  TrainerHooks hooks_;
  ckpt::CheckpointStore store_;
  std::unique_ptr<Dataset> train_, val_;
  std::unique_ptr<Loader> loader_;
  sparse::MinkUNet model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> accum_;
  MemoryModel memory_model_;
  Counters counters_;
  int num_classes_ = 0;
  int channels_ = 0;   // model input channels (the data's, plus the height)
  double height_ = 0;  // > 0: the height channel's scale (the voxel size)
  int64_t budget_ = 0;
  c10::Device device_{c10::DeviceType::CPU};
  int64_t run_peak_ = 0;
  int64_t step_ = 0;  // the next step to run (== steps done)
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
  int64_t total_steps_ = 0;
  int64_t last_checkpoint_ = -1;
  int64_t checkpoint_failures_ = 0;    // failed saves in this attempt
  std::string last_checkpoint_error_;  // the newest save's error; "" once one succeeds
  double last_loss_ = 0;
  double last_accuracy_ = 0;
  double samples_per_sec_ = 0;
  int64_t majority_class_ = 0;
  double val_miou_ = -1;
  double baseline_miou_ = -1;
  std::vector<int64_t> class_counts_;  // labelled training voxels seen, per class
};

absl::Status Trainer::Checkpoint() {
  Report(v1::PHASE_CHECKPOINTING);
  ckpt::TrainerState state;
  state.step = step_;
  state.epoch = epoch_;
  state.cursor = cursor_;
  nlohmann::json extra = {{"memory_model", memory_model_.Serialize()},
                          {"counters", counters_.ToJson()},
                          {"num_classes", num_classes_},
                          {"last_loss", last_loss_},
                          {"class_counts", class_counts_}};
  state.extra_json = extra.dump();
  absl::Status s = ckpt::SaveState(store_, *model_, *optimizer_, state);
  if (s.ok()) {
    last_checkpoint_ = step_;
    last_checkpoint_error_.clear();
    Event(v1::EVENT_KIND_CHECKPOINT, step_, absl::StrCat("checkpoint step-", step_));
    Log(absl::StrCat("checkpoint step-", step_));
  } else {
    ++checkpoint_failures_;
    last_checkpoint_error_ = std::string(s.message());
    Log(absl::StrCat("checkpoint step-", step_, " failed (", checkpoint_failures_,
                     " failed so far; newest checkpoint ",
                     last_checkpoint_ >= 0 ? absl::StrCat("step-", last_checkpoint_) : "none",
                     "): ", s.message()));
    if (hooks_.checkpoint_failed)
      hooks_.checkpoint_failed(step_, last_checkpoint_, last_checkpoint_error_);
  }
  Report(v1::PHASE_TRAINING);
  return s;
}

TrainerResult Trainer::CheckpointFailed(const absl::Status& s, const std::string& when) {
  if (!absl::IsResourceExhausted(s)) {
    return Fail(1, "checkpoint_failed", std::string(s.message()));
  }
  return Fail(
      ExitStatus(WorkerExit::kNoSpace), ToString(WorkerExit::kNoSpace),
      absl::StrCat("no space left in ", store_.root(), " for checkpoint step-", step_, " ", when,
                   ": ", s.message(), "; the newest checkpoint kept is ",
                   last_checkpoint_ >= 0 ? absl::StrCat("step-", last_checkpoint_) : "none"));
}

absl::Status Trainer::Resume() {
  if (options_.resume == "none") return absl::OkStatus();
  absl::StatusOr<ckpt::CheckpointInfo> chosen = absl::NotFoundError("");
  if (options_.resume == "latest") {
    std::vector<ckpt::QuarantineReport> quarantined;
    chosen = store_.ChooseLatest(&quarantined);
    for (const auto& q : quarantined) {
      std::string line = absl::StrCat("checkpoint step-", q.step, " quarantined: ", q.reason);
      Log(line);
      Event(v1::EVENT_KIND_LOG, -1, line);
    }
    if (!chosen.ok()) {
      if (chosen.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
      return chosen.status();
    }
  } else {
    int64_t want = std::stoll(options_.resume);
    absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = store_.List();
    if (!list.ok()) {
      return absl::UnavailableError(
          absl::StrCat("listing ", store_.root(), ": ", list.status().message()));
    }
    for (const auto& info : *list) {
      if (info.step == want) chosen = info;
    }
    if (!chosen.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--resume ", want, ": no such checkpoint"));
    }
    absl::Status v = store_.Verify(*chosen);
    if (absl::IsDataLoss(v)) {
      // A content error: moved aside, so the supervisor's next choice skips it.
      store_.Quarantine(*chosen, std::string(v.message())).IgnoreError();
      return absl::DataLossError(absl::StrCat("checkpoint step-", want, ": ", v.message()));
    }
    if (!v.ok()) return v;  // an I/O error: nothing is known about the checkpoint
  }
  ckpt::TrainerState state;
  absl::Status s = ckpt::LoadState(store_, *chosen, *model_, *optimizer_, &state);
  if (!s.ok()) {
    if (absl::IsUnavailable(s)) return s;
    return absl::Status(s.code(),
                        absl::StrCat("checkpoint step-", chosen->step, ": ", s.message()));
  }
  step_ = state.step;
  epoch_ = state.epoch;
  cursor_ = state.cursor;
  last_checkpoint_ = state.step;
  nlohmann::json extra = nlohmann::json::parse(state.extra_json, nullptr, false);
  if (extra.is_object()) {
    if (extra.contains("memory_model")) {
      absl::StatusOr<MemoryModel> m =
          MemoryModel::Deserialize(extra["memory_model"].get<std::string>());
      if (m.ok()) memory_model_ = *m;
    }
    if (extra.contains("counters")) counters_.FromJson(extra["counters"]);
    last_loss_ = extra.value("last_loss", 0.0);
    if (extra.contains("class_counts")) {
      std::vector<int64_t> counts = extra["class_counts"].get<std::vector<int64_t>>();
      if (counts.size() == class_counts_.size()) class_counts_ = counts;
    }
  }
  Log(absl::StrCat("resumed from step ", step_, " (epoch ", epoch_, ", cursor ", cursor_, ")"));
  Event(v1::EVENT_KIND_LOG, -1, absl::StrCat("resumed from step ", step_));
  return absl::OkStatus();
}

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
                      &memory_model_, budget_, extra, height_);
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

absl::Status Trainer::Step(const Batch& batch) {
  absl::StatusOr<StepOutcome> outcome =
      ForwardBackward(*model_, batch, channels_, params_, accum_, Splitting(),
                      spec_.train.predictive_split ? &memory_model_ : nullptr, budget_, at::kFloat,
                      &run_peak_, height_);
  if (!outcome.ok()) return outcome.status();
  const SplitStats* stats = &outcome->stats;
  double loss_sum = outcome->loss;
  int64_t hits = outcome->hits;
  int64_t labelled = outcome->labelled;
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
    counters_.skipped_steps++;
    Log(absl::StrCat("step ", step_, ": ",
                     stats->dropped_labelled > 0 ? "no labelled voxel fitted in memory"
                                                 : "the batch has no labelled voxel",
                     "; optimizer step skipped"));
    return absl::OkStatus();
  }
  // The optimizer step is outside the splittable region: an OOM here is hard.
  try {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = accum_[i].clone();
    double lr = LearningRate(spec_.optimizer, step_, total_steps_);
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
    for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat("optimizer step: ", e.what()));
  }
  last_loss_ = loss_sum;
  last_accuracy_ = static_cast<double>(hits) / static_cast<double>(labelled);
  return absl::OkStatus();
}

void Trainer::Evaluate(TrainerResult* result) {
  if (!val_ || val_->size() == 0) return;
  Report(v1::PHASE_EVALUATING);
  torch::NoGradGuard no_grad;
  model_->eval();
  Confusion confusion(num_classes_);
  Confusion baseline(num_classes_);
  majority_class_ =
      std::max_element(class_counts_.begin(), class_counts_.end()) - class_counts_.begin();
  // The majority class of the training split's labelled voxels seen so far.
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
        GroupTensors t = Assemble(*batch, group, channels_, at::kFloat, height_, device_);
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

TrainerResult Trainer::Run() {
  // Everything LibTorch allocates from here on counts against the budget.
  sparse::InstallCountingAllocator();
  Report(v1::PHASE_LOADING);
  const TestingSpec& faults = spec_.testing;
  const bool inject = Active(faults, options_);
  if (options_.world_size != 1) {
    return Fail(kExitUsage, "usage",
                "world_size: the worker trains on one rank; the distributed backend (c10d) is not "
                "built yet (docs/worker.md)");
  }
  if (inject && faults.corrupt_checkpoint) CorruptNewest(store_.root());

  uint64_t seed = static_cast<uint64_t>(spec_.train.seed);
  // A spec field that does not fit the data is a usage error (64); a file
  // that cannot be read is a data error (65).
  auto data_failure = [this](const absl::Status& s) {
    std::string m(s.message());
    bool field = m.rfind("data.", 0) == 0 || m.rfind("model.", 0) == 0;
    return field ? Fail(kExitUsage, "usage", DataMessage(s))
                 : Fail(kExitData, "data", DataMessage(s));
  };
  absl::StatusOr<std::unique_ptr<Dataset>> train =
      OpenDataset(spec_, Split::kTrain, options_.data_roots);
  if (!train.ok()) return data_failure(train.status());
  train_ = std::move(*train);
  if (spec_.data.val_fraction > 0) {
    absl::StatusOr<std::unique_ptr<Dataset>> val =
        OpenDataset(spec_, Split::kVal, options_.data_roots);
    if (!val.ok()) return data_failure(val.status());
    val_ = std::move(*val);
  }
  if (train_->size() == 0) return Fail(kExitData, "data", "the training split is empty");
  num_classes_ = spec_.model.num_classes > 0 ? static_cast<int>(spec_.model.num_classes)
                                             : train_->num_classes();
  if (num_classes_ < 2) {
    return Fail(kExitData, "data",
                absl::StrCat("the data has ", num_classes_,
                             " labelled classes; training needs at least 2"));
  }
  channels_ = std::max(1, train_->feature_channels()) + (spec_.model.height_feature ? 1 : 0);
  height_ = spec_.model.height_feature ? spec_.model.voxel_size : 0;
  if (spec_.model.in_channels != channels_) {
    return Fail(
        kExitUsage, "usage",
        absl::StrCat("model.in_channels: ", spec_.model.in_channels, ", but the data gives ",
                     channels_, " input channel", channels_ == 1 ? "" : "s"));
  }
  class_counts_.assign(num_classes_, 0);

  absl::StatusOr<c10::Device> device =
      TrainingDevice(spec_.train.device, sparse::CudaDeviceAvailable());
  if (!device.ok()) return Fail(kExitUsage, "usage", std::string(device.status().message()));
  device_ = *device;

  sparse::SetDeterministic(spec_.train.deterministic);
  torch::manual_seed(seed);
  model_ =
      sparse::MinkUNet(sparse::MinkUNetPlan(DepthOf(spec_.model.arch), channels_, num_classes_));
  model_->to(device_);
  if (spec_.model.gradient_checkpointing) sparse::EnableGradientCheckpointing(*model_);
  model_->train();
  params_ = model_->parameters();
  for (const at::Tensor& p : params_) accum_.push_back(torch::zeros_like(p));
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
  int64_t budget_mb = options_.memory_budget_mb_override > 0 ? options_.memory_budget_mb_override
                                                             : spec_.train.memory_budget_mb;
  budget_ = budget_mb << 20;
  // On the CPU, the allocator settings minkunet_bench measures: the block
  // cache sized against the budget and counted in it (sparse/memory.h). On
  // a GPU the budget becomes the caching allocator's memory fraction.
  std::string memory_settings;
  if (device_.is_cpu()) {
    const sparse::AllocatorSettings allocator = sparse::TrainingAllocatorSettings(budget_);
    sparse::ApplyAllocatorSettings(allocator);
    memory_settings = sparse::ToString(allocator);
  } else {
    sparse::SetMemoryBudget(device_, budget_);
    memory_settings =
        budget_ > 0 ? absl::StrCat("budget ", budget_mb, " MiB (the caching allocator's fraction)")
                    : std::string("no budget");
  }
  if (budget_ > 0 && sparse::GetMemoryStats(device_).current_bytes > budget_) {
    return Fail(kExitOom, "oom",
                absl::StrCat("the model and optimizer alone need ",
                             sparse::GetMemoryStats(device_).current_bytes,
                             " bytes, more than the budget of ", budget_));
  }

  absl::Status resumed = Resume();
  if (!resumed.ok()) {
    if (resumed.code() == absl::StatusCode::kInvalidArgument) {
      return Fail(kExitUsage, "usage", std::string(resumed.message()));
    }
    // An I/O error says nothing about the checkpoint: nothing was
    // quarantined, and starting from scratch or from an older step would
    // throw work away. The attempt fails (a crash exit) and is retried.
    if (absl::IsUnavailable(resumed)) {
      return Fail(kExitCheckpointIo, "checkpoint_io",
                  absl::StrCat("cannot resume (nothing quarantined; the attempt is retried): ",
                               resumed.message()));
    }
    return Fail(1, "checkpoint_corrupt", std::string(resumed.message()));
  }
  int64_t batch_size = spec_.train.batch_size;
  int64_t steps_per_epoch = (train_->size() + batch_size - 1) / batch_size;
  total_steps_ = TotalSteps(spec_, steps_per_epoch);
  if (cursor_ >= train_->size()) {
    epoch_++;
    cursor_ = 0;
  }
  LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.seed = seed;
  lo.voxel_size = spec_.model.voxel_size;
  lo.augment = spec_.data.augment;
  loader_ = std::make_unique<Loader>(train_.get(), lo, epoch_, cursor_);
  absl::Status calibrated = Calibrate(lo);
  if (!calibrated.ok()) return data_failure(calibrated);
  Log(absl::StrCat("training ", spec_.model.arch, " (", model_->NumParameters(), " parameters, ",
                   num_classes_, " classes, ", channels_, " input channels) on ", train_->size(),
                   " training and ", val_ ? val_->size() : 0, " validation scenes, ", total_steps_,
                   " steps, ", memory_settings, ", ", at::get_num_threads(), " threads, on ",
                   device_.str()));
  Report(v1::PHASE_TRAINING);

  TrainerResult result;
  auto last_checkpoint_time = Clock::now();
  while (step_ < total_steps_) {
    if (hooks_.stop_requested && hooks_.stop_requested()) {
      absl::Status c = Checkpoint();
      if (!c.ok()) return CheckpointFailed(c, "before stopping on request");
      return Fail(kExitStopped, "stopped",
                  absl::StrCat("stopped on request after checkpoint step-", step_));
    }
    const int64_t next = step_ + 1;  // faults fire just before step `next` runs
    if (inject) {
      if (faults.crash_at_step == next) {
        Log(absl::StrCat("injected crash (abort) at step ", next));
        std::abort();
      }
      if (faults.exit_at_step == next) {
        return Fail(static_cast<int>(faults.exit_code), "injected",
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
          sparse::SetMemoryBudget(device_,
                                  sparse::GetMemoryStats(device_).current_bytes + (1 << 20));
        }
        try {
          at::Tensor big =
              at::empty({int64_t{1} << 28}, at::TensorOptions(at::kFloat).device(device_));
        } catch (const c10::OutOfMemoryError& e) {
          return Fail(kExitOom, "oom",
                      absl::StrCat("hard out-of-memory outside the splittable region: ", e.what()));
        }
      }
    }
    absl::StatusOr<Batch> batch = loader_->Next();
    if (!batch.ok()) return Fail(kExitData, "data", DataMessage(batch.status()));
    auto t0 = Clock::now();
    absl::Status s = Step(*batch);
    if (!s.ok()) {
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        return Fail(kExitOom, "oom",
                    absl::StrCat("hard out-of-memory at step ", next, ": ", s.message()));
      }
      return Fail(1, "error", std::string(s.message()));
    }
    for (const VoxelScene& scene : batch->scenes) {
      for (int32_t l : scene.labels) {
        if (l >= 0 && l < num_classes_) class_counts_[l]++;
      }
    }
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    samples_per_sec_ = dt > 0 ? static_cast<double>(batch->scenes.size()) / dt : 0;
    step_ = next;
    epoch_ = batch->epoch;
    cursor_ = batch->cursor_end;
    if (cursor_ >= train_->size()) {
      epoch_++;
      cursor_ = 0;
    }
    if (hooks_.advance) hooks_.advance();
    if (spec_.train.empty_cache_every_steps > 0 &&
        step_ % spec_.train.empty_cache_every_steps == 0) {
      const int64_t cached = sparse::GetMemoryStats(device_).cached_bytes;
      sparse::ReleaseCachedMemory(device_);
      Log(absl::StrCat("step ", step_, ": handed ", cached, " cached bytes back to the system"));
    }
    Report(v1::PHASE_TRAINING);
    Log(absl::StrCat("step ", step_, "/", total_steps_, " epoch ", epoch_, " loss ", last_loss_,
                     " acc ", last_accuracy_, " ", samples_per_sec_, " scenes/s peak ",
                     run_peak_ >> 20, " MiB"));
    bool due = (spec_.train.checkpoint_every_steps > 0 &&
                step_ % spec_.train.checkpoint_every_steps == 0) ||
               (spec_.train.checkpoint_every_seconds > 0 &&
                std::chrono::duration<double>(Clock::now() - last_checkpoint_time).count() >=
                    spec_.train.checkpoint_every_seconds) ||
               (hooks_.checkpoint_requested && hooks_.checkpoint_requested());
    if (due && step_ < total_steps_) {
      try {
        // A failed save has been reported; training goes on, and the next
        // save comes a whole interval later.
        Checkpoint().IgnoreError();
      } catch (const c10::OutOfMemoryError& e) {
        return Fail(kExitOom, "oom",
                    absl::StrCat("hard out-of-memory while checkpointing: ", e.what()));
      }
      last_checkpoint_time = Clock::now();
    }
    if (spec_.train.eval_every_steps > 0 && step_ % spec_.train.eval_every_steps == 0 &&
        step_ < total_steps_) {
      Evaluate(&result);
    }
  }
  try {
    absl::Status c = Checkpoint();
    if (!c.ok()) return CheckpointFailed(c, "at the end of the run");
  } catch (const c10::OutOfMemoryError& e) {
    return Fail(kExitOom, "oom",
                absl::StrCat("hard out-of-memory while checkpointing: ", e.what()));
  }
  Evaluate(&result);
  result.exit_code = kExitOk;
  result.reason = "completed";
  result.last_step = step_;
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

}  // namespace

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
  Trainer trainer(spec, options, hooks);
  return trainer.Run();
}

}  // namespace trainsup::worker
