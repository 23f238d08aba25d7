// The trainer's class, shared by the files that implement it:
// trainer.cc (the set-up and the loop, one step, the memory calibration),
// trainer_state.cc (checkpoints, resume, every rank's own state, rank 0's
// weights broadcast) and trainer_eval.cc (the evaluation). Internal to
// trainsup_worker_trainer; the interface is worker/train/trainer.h.
#ifndef TRAINSUP_WORKER_TRAIN_TRAINER_IMPL_H_
#define TRAINSUP_WORKER_TRAIN_TRAINER_IMPL_H_

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/state.h"
#include "checkpoint/store.h"
#include "contracts/exit_codes.h"
#include "contracts/run_layout.h"
#include "nlohmann/json.hpp"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"
#include "worker/gang/distributed.h"
#include "worker/split/split.h"
#include "worker/split/step.h"
#include "worker/train/guard.h"
#include "worker/train/loss_scaler.h"
#include "worker/train/trainer.h"

namespace trainsup::worker::internal {

using Clock = std::chrono::steady_clock;

// Counters kept across the whole run (checkpointed with the trainer state).
struct Counters {
  int64_t splits = 0;
  int64_t predicted_splits = 0;
  int64_t retries = 0;
  int64_t oom_events = 0;
  int64_t wasted_forwards = 0;
  double wasted_seconds = 0;  // of those forwards (and their backwards), measured
  int64_t dropped_pieces = 0;
  int64_t dropped_voxels = 0;
  int64_t skipped_steps = 0;
  // The guard's (docs/guard.md): steps not applied, and steps of a skip window.
  int64_t nonfinite_steps = 0;
  int64_t spike_steps = 0;
  int64_t window_skipped_steps = 0;
  int64_t scaler_skipped_steps = 0;  // fp16: overflows the loss scaler skipped

  // The counters each rank keeps of its own batches (the splits), added up
  // over a gang; and the ones every rank of a gang has the same, copied.
  void AddRankCounters(const Counters& c) {
    splits += c.splits;
    predicted_splits += c.predicted_splits;
    retries += c.retries;
    oom_events += c.oom_events;
    wasted_forwards += c.wasted_forwards;
    wasted_seconds += c.wasted_seconds;
    dropped_pieces += c.dropped_pieces;
    dropped_voxels += c.dropped_voxels;
  }
  void CopyGangCounters(const Counters& c) {
    skipped_steps = c.skipped_steps;
    nonfinite_steps = c.nonfinite_steps;
    spike_steps = c.spike_steps;
    window_skipped_steps = c.window_skipped_steps;
    scaler_skipped_steps = c.scaler_skipped_steps;
  }
  void Add(const SplitStats& s) {
    splits += s.splits;
    predicted_splits += s.predicted_splits;
    retries += s.retries;
    oom_events += s.oom_events;
    wasted_forwards += s.wasted_forwards;
    wasted_seconds += s.wasted_seconds;
    dropped_pieces += s.dropped_pieces;
    dropped_voxels += s.dropped_voxels;
  }
  nlohmann::json ToJson() const {
    return {{"splits", splits},
            {"predicted_splits", predicted_splits},
            {"retries", retries},
            {"oom_events", oom_events},
            {"wasted_forwards", wasted_forwards},
            {"wasted_seconds", wasted_seconds},
            {"dropped_pieces", dropped_pieces},
            {"dropped_voxels", dropped_voxels},
            {"skipped_steps", skipped_steps},
            {"nonfinite_steps", nonfinite_steps},
            {"spike_steps", spike_steps},
            {"window_skipped_steps", window_skipped_steps},
            {"scaler_skipped_steps", scaler_skipped_steps}};
  }
  void FromJson(const nlohmann::json& j) {
    splits = j.value("splits", int64_t{0});
    predicted_splits = j.value("predicted_splits", int64_t{0});
    retries = j.value("retries", int64_t{0});
    oom_events = j.value("oom_events", int64_t{0});
    wasted_forwards = j.value("wasted_forwards", int64_t{0});
    wasted_seconds = j.value("wasted_seconds", 0.0);
    dropped_pieces = j.value("dropped_pieces", int64_t{0});
    dropped_voxels = j.value("dropped_voxels", int64_t{0});
    skipped_steps = j.value("skipped_steps", int64_t{0});
    nonfinite_steps = j.value("nonfinite_steps", int64_t{0});
    spike_steps = j.value("spike_steps", int64_t{0});
    window_skipped_steps = j.value("window_skipped_steps", int64_t{0});
    scaler_skipped_steps = j.value("scaler_skipped_steps", int64_t{0});
  }
};

// The "format" of a checkpoint's "extra" object that any gang size
// resumes from (GangState).
inline constexpr char kGangStateFormat[] = "trainsup-gang-state-1";

class Trainer {
 public:
  Trainer(const RunSpec& spec, const TrainerOptions& options, const TrainerHooks& hooks)
      : spec_(spec),
        options_(options),
        hooks_(hooks),
        store_(RunLayout(options.run_dir).CheckpointRoot(options.rank, options.world_size),
               options.file_system != nullptr ? options.file_system : ckpt::FileSystem::Default(),
               ckpt::StoreOptions{static_cast<int>(spec.train.keep_checkpoints), 0}),
        guard_(spec.guard),
        scaler_(LossScalerOptions{spec.train.loss_scale_init, spec.train.loss_scale_growth_interval,
                                  spec.guard.max_overflow_streak, spec.guard.min_loss_scale}) {
    skip_windows_ = spec.data.skip_windows;
    skip_windows_.insert(skip_windows_.end(), options.skip_windows.begin(),
                         options.skip_windows.end());
  }

  // Run's body; a CollectiveError (a peer lost) becomes exit 76.
  TrainerResult Run();

 private:
  // Set-up, then one training step at a time, then the final checkpoint.
  TrainerResult RunLoop();
  // Each returns the attempt's end when it ends there, else nullopt.
  std::optional<TrainerResult> SetUp();
  std::optional<TrainerResult> OpenData();
  std::optional<TrainerResult> JoinGang();
  void BuildModel();
  std::optional<TrainerResult> ApplyBudget(std::string* memory_settings);
  std::optional<TrainerResult> ResumeOrFail();
  std::optional<TrainerResult> PrepareLoader();
  std::optional<TrainerResult> InjectFaults(int64_t next);
  std::optional<TrainerResult> CheckpointOrExit(const char* must);
  std::optional<TrainerResult> TrainOneStep(TrainerResult* result);
  // `trained`: false for a step the guard did not apply or a skip window's.
  void AfterStep(const Batch& batch, double step_seconds, int64_t next, bool trained);
  void LogStep(Clock::time_point iteration_start);
  TrainerResult Completed(TrainerResult result);
  std::string WeightsDigest() const;
  TrainerResult DataFailure(const absl::Status& s);
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
    p.set_oom_wasted_seconds(counters_.wasted_seconds);
    p.set_learning_rate(last_lr_);
    p.set_step_compute_seconds(step_compute_s_);
    p.set_accuracy(last_accuracy_);
    p.set_val_miou(val_miou_);
    p.set_baseline_miou(baseline_miou_);
    p.set_checkpoint_failures(checkpoint_failures_);
    p.set_last_checkpoint_error(last_checkpoint_error_);
    // In this attempt, as checkpoint_failures: the run's totals are the
    // checkpoint's counters.
    p.set_nonfinite_steps(counters_.nonfinite_steps - at_start_.nonfinite_steps);
    p.set_spike_steps(counters_.spike_steps - at_start_.spike_steps);
    p.set_window_skipped_steps(counters_.window_skipped_steps - at_start_.window_skipped_steps);
    FillTally(Tally(), p.mutable_tally());
    hooks_.progress(p);
  }
  // What the run has trained, on the current model's lineage (the counters
  // are the checkpoint's): docs/guard.md, "SUCCEEDED means trained".
  TrainingTally Tally() const {
    TrainingTally t;
    t.steps = step_;
    t.skipped_window = counters_.window_skipped_steps;
    t.skipped_guard = counters_.nonfinite_steps + counters_.spike_steps;
    t.skipped_scaler = counters_.scaler_skipped_steps;
    t.applied = std::max<int64_t>(
        0, step_ - t.skipped_window - t.skipped_guard - t.skipped_scaler - counters_.skipped_steps);
    t.final_metric = val_miou_;
    t.baseline_metric = baseline_miou_;
    return t;
  }
  // A data error's message for the exit file and the supervisor, which
  // viewers see: the file's content withheld (ViewerMessage). The rank's
  // log gets all of it.
  std::string DataMessage(const absl::Status& s) {
    const std::string viewer = ViewerMessage(s);
    if (viewer != s.message()) Log(absl::StrCat("data error: ", s.message()));
    return viewer;
  }
  // The attempt ends with a contract code (contracts/exit_codes.h); the
  // exit file's reason is the code's name.
  TrainerResult Fail(WorkerExit code, const std::string& message) {
    return End(ExitStatus(code), ToString(code), message);
  }
  // The attempt ends as a crash: exit 1, not a contract code (the
  // supervisor restarts it like any crash); `reason` says which.
  TrainerResult Crash(CrashReason reason, const std::string& message) {
    return End(1, ToString(reason), message);
  }
  TrainerResult End(int status, const std::string& reason, const std::string& message) {
    TrainerResult r;
    r.exit_code = status;
    r.reason = reason;
    r.message = message;
    r.last_step = step_;
    return r;
  }
  // Checkpoints the current step. `background`: rank 0 snapshots the
  // state to host memory and a thread writes it (StartBackgroundWrite),
  // training goes on, and every rank learns the outcome from a later
  // step's control collective; OK means started. Else the write in flight
  // finishes and the step is written now (WriteNow), and the result is
  // the write's. A failure is counted and reported (Settle) wherever it is
  // learnt; the checkpoints committed before are untouched.
  absl::Status Checkpoint(bool background);
  absl::Status StartBackgroundWrite(ckpt::TrainerState state);
  absl::Status WriteNow(ckpt::TrainerState state);
  // Every rank: rank 0's finished writes (with `wait`, after the write in
  // flight) shared by broadcasts under checkpoint_timeout_s and settled;
  // the status of the current step's write, if one was shared.
  std::optional<absl::Status> ShareWrites(bool wait);
  // Rank 0, as the attempt ends however it ends: the write in flight
  // finishes and every write not yet shared is reported (log, event).
  void FinishWrites();
  // Writes shared per collective: at most kWriteSlots, [step + 1, code]
  // each, from offset on (the step's control tensor, WriteNow's).
  static constexpr int64_t kWriteSlots = 4;
  // Rank 0: finished writes not yet shared (with `wait`, after the write
  // in flight), the oldest kWriteSlots of them.
  std::vector<ckpt::WriteResult> TakeWrites(bool wait);
  static void PutWrites(const std::vector<ckpt::WriteResult>& writes, at::Tensor& t,
                        int64_t offset);
  // Every rank: Settle each write in t (rank 0 with its own statuses,
  // `own`, which TakeWrites returned); the status of the current step's
  // write, if t holds one.
  std::optional<absl::Status> SettleWrites(const at::Tensor& t, int64_t offset,
                                           const std::vector<ckpt::WriteResult>& own);
  // A write's outcome, on every rank alike: a commit moves
  // last_checkpoint_ and is an event; a failure is counted and reported
  // (log, checkpoint_failed, the heartbeat). `seconds`: the write's time,
  // on rank 0 (else -1).
  void Settle(int64_t step, const absl::Status& s, double seconds);
  // The end of an attempt whose checkpoint had to be written (`when`: at
  // the end, before a requested stop) but failed with `s`: exit 74 when the
  // file system is full (ResourceExhausted: ENOSPC, EDQUOT), else 1.
  TrainerResult CheckpointFailed(const absl::Status& s, const std::string& when);
  absl::Status Resume();
  // A checkpoint's training state does not depend on the gang's size
  // (docs/checkpoints.md): RankState is what a rank sends rank 0, GangState
  // merges every rank's into the checkpoint's "extra" object.
  nlohmann::json RankState() const;
  nlohmann::json GangState(const std::vector<nlohmann::json>& ranks) const;
  // A checkpoint's "extra" object as GangState writes it: as it is, or
  // converted from the formats of before elastic gangs (which also
  // converts epoch_ and cursor_ to the epoch's order). InvalidArgument for
  // a checkpoint this run cannot resume (another global batch).
  absl::StatusOr<nlohmann::json> ResumableGangState(const nlohmann::json& extra);
  // This rank's state from the gang's: rank 0 takes the totals.
  absl::Status ApplyGangState(const nlohmann::json& gang);
  // Every rank gets rank 0's buffers (BatchNorm running statistics) and,
  // with `parameters`, its parameters; `what` names the collectives.
  void BroadcastWeights(bool parameters, const std::string& what);
  SplitOptions Splitting() const;
  // The features' type: float32, or bfloat16 with train.precision = "bf16".
  at::ScalarType FeatureType() const {
    if (spec_.train.precision == "bf16") return at::kBFloat16;
    return spec_.train.precision == "fp16" ? at::kHalf : at::kFloat;
  }
  // fp16: the loss scaler judges a non-finite gradient under a finite loss
  // first (an overflow: skipped, the scale halved; ScalerSkip), the guard
  // the rest.
  bool Scaling() const { return spec_.train.precision == "fp16"; }
  // Step `next` overflowed: nothing of it is applied, the scale halves, and
  // the streak or the floor may make it divergence (diverged_).
  void ScalerSkip(int64_t next);
  // Calibrates the memory model before the first step (CalibrateMemory)
  // when it plans (predictive splitting under a budget) and is not ready.
  absl::Status Calibrate(const LoaderOptions& loader);
  // One optimizer step over `batch`, part of a global batch of
  // `global_labelled` labelled voxels; ResourceExhausted = hard OOM.
  // Sets step_applied_; a step the guard does not apply leaves weights,
  // optimizer state and BatchNorm statistics as they were, and a diverged
  // one sets diverged_.
  absl::Status Step(const Batch& batch, int64_t global_labelled);
  // The guard's view of step `next` after its forward and backward: judge
  // it, and undo and report it when it is not applied. True: apply it.
  bool GuardStep(int64_t next, double loss, bool stats_finite);
  // The 2-norm of the floating-point tensors of `tensors` together (NaN or
  // infinite when any element is): of accum_, the global gradient (summed
  // over the ranks).
  static double NormOf(const std::vector<at::Tensor>& tensors);
  // BatchNorm statistics into their copy before a step, and back when it
  // is not applied (buffers_ and saved_buffers_, element by element).
  static void CopyBuffers(const std::vector<at::Tensor>& from, std::vector<at::Tensor>& to);
  // The step's faults from [testing] (this attempt's and rank's).
  StepFaults FaultsAt(int64_t next) const;
  void Evaluate(TrainerResult* result);

  RunSpec spec_;
  TrainerOptions options_;
  TrainerHooks hooks_;
  ckpt::CheckpointStore store_;
  // Rank 0 with train.background_checkpoints, from the first such
  // checkpoint on; declared after store_, so it is destroyed (waiting
  // for the write in flight) before the store.
  std::unique_ptr<ckpt::AsyncCheckpointer> writer_;
  std::vector<ckpt::WriteResult> unshared_;  // rank 0: finished writes the gang has not heard of
  int64_t checkpoint_started_ = -1;          // the newest step whose checkpoint was started
  int64_t last_failed_checkpoint_ = -1;      // the newest step whose checkpoint failed
  std::unique_ptr<Dataset> train_, val_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Gang> gang_;  // world size 1 too: collectives are then the identity
  std::unique_ptr<GradientReducer> reducer_;
  bool sync_batchnorm_ = false;
  int64_t train_size_ = 0;  // scenes of the training split: every epoch visits each once
  sparse::MinkUNet model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> accum_;
  MemoryModel memory_model_;
  Counters counters_;
  Counters at_start_;  // as resumed: the heartbeat reports this attempt's
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
  bool inject_ = false;  // the spec's fault injection applies to this attempt and rank
  StepGuard guard_;
  LossScaler scaler_;                                // fp16 only
  std::vector<StepWindow> skip_windows_;             // the spec's and the rollbacks'
  std::vector<at::Tensor> buffers_, saved_buffers_;  // BatchNorm statistics, and a copy
  bool step_applied_ = true;                         // false: the guard did not apply the last step
  std::optional<TrainerResult> diverged_;
  Clock::time_point last_checkpoint_time_;  // of the last periodic checkpoint
  int64_t last_checkpoint_ = -1;
  int64_t checkpoint_failures_ = 0;    // failed saves in this attempt
  std::string last_checkpoint_error_;  // the newest save's error; "" once one succeeds
  double last_loss_ = 0;
  double last_lr_ = 0;         // of the last step the optimizer took
  double step_compute_s_ = 0;  // the last step's time outside collectives
  double last_accuracy_ = 0;
  double samples_per_sec_ = 0;
  int64_t majority_class_ = 0;
  double val_miou_ = -1;
  double baseline_miou_ = -1;
  std::vector<int64_t> class_counts_;  // labelled training voxels seen, per class
};

}  // namespace trainsup::worker::internal

#endif  // TRAINSUP_WORKER_TRAIN_TRAINER_IMPL_H_
