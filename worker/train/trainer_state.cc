// Checkpoints, resume and every rank's own state (trainer_impl.h).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/state.h"
#include "worker/train/trainer_impl.h"

namespace trainsup::worker::internal {

// What a rank sends rank 0 for the checkpoint (GangState merges them).
nlohmann::json Trainer::RankState() const {
  return {{"rank", options_.rank},           {"precision", spec_.train.precision},
          {"loss_scaler", scaler_.ToJson()}, {"memory_model", memory_model_.Serialize()},
          {"counters", counters_.ToJson()},  {"last_loss", last_loss_},
          {"guard", guard_.ToJson()},        {"class_counts", class_counts_}};
}

absl::StatusOr<nlohmann::json> Trainer::ResumableGangState(const nlohmann::json& extra) {
  if (!extra.is_object()) return absl::DataLossError("trainer.json's extra is not a JSON object");
  if (extra.value("format", std::string()) == kGangStateFormat) {
    const int64_t written = extra.value("global_batch", int64_t{0});
    if (written != GlobalBatch(spec_)) {
      return absl::InvalidArgumentError(absl::StrCat("written with a global batch of ", written,
                                                     " scenes; this run's is ", GlobalBatch(spec_),
                                                     " (world_size x train.batch_size)"));
    }
    return extra;
  }
  // Before elastic gangs (issue 26): the cursor counted within a rank's
  // shard of n / W scenes, W = the gang that wrote it, which is the spec's
  // world_size. Its global batches were the same as now (W times the
  // per-rank batch), so position cursor of every shard is position
  // cursor * W of the epoch's order.
  std::vector<nlohmann::json> ranks;
  int64_t written_by = 1;
  if (extra.contains("ranks")) {
    written_by = extra.value("world_size", int64_t{1});
    for (const nlohmann::json& r : extra["ranks"]) ranks.push_back(r);
  } else {
    ranks.push_back(extra);
  }
  if (written_by != spec_.world_size || static_cast<int64_t>(ranks.size()) != written_by) {
    return absl::InvalidArgumentError(
        absl::StrCat("written by a gang of ", written_by, " rank", written_by == 1 ? "" : "s",
                     " before elastic gangs, with ", ranks.size(),
                     " rank states; this run's world_size is ", spec_.world_size));
  }
  for (const nlohmann::json& r : ranks) {
    if (!r.is_object() || !r.contains("counters") || !r.contains("class_counts")) {
      return absl::DataLossError("a rank's state lacks its counters or class counts");
    }
  }
  const int64_t shard = train_->size() / written_by;
  if (cursor_ >= shard) {
    ++epoch_;
    cursor_ = 0;
  }
  cursor_ *= written_by;
  Log(absl::StrCat("checkpoint of a gang of ", written_by,
                   " from before elastic gangs: its position is epoch ", epoch_, ", scene ",
                   cursor_, " of the epoch's order"));
  return GangState(ranks);
}

absl::Status Trainer::ApplyGangState(const nlohmann::json& g) {
  // The precision the checkpoint was written at (fp32 before there was a
  // choice).
  const std::string learnt_at = g.value("memory_model_precision", std::string("fp32"));
  // fp16's scale and its counts, as every rank had them (a run resumed at
  // fp16 from another precision starts at loss_scale_init).
  if (Scaling() && learnt_at == "fp16") {
    scaler_.FromJson(g.value("loss_scaler", nlohmann::json::object()));
    Log(absl::StrCat("loss scale ", scaler_.scale(), " (", scaler_.good_steps(),
                     " finite steps since it last changed)"));
  }
  // A memory model learnt at another precision predicts other bytes per
  // voxel: this run learns its own (calibration, then its steps).
  if (learnt_at != spec_.train.precision) {
    Log(absl::StrCat("the checkpoint's memory model was learnt at ", learnt_at,
                     "; this run trains at ", spec_.train.precision, " and learns its own"));
  } else if (g.contains("memory_model") && g["memory_model"].is_string()) {
    absl::StatusOr<MemoryModel> m = MemoryModel::Deserialize(g["memory_model"].get<std::string>());
    if (m.ok()) memory_model_ = *m;
  }
  // The gang's totals stay with rank 0, so that the next checkpoint's sums
  // count them once; the others start from the counters every rank shares.
  Counters counters;
  if (g.contains("counters")) counters.FromJson(g["counters"]);
  if (options_.rank == 0) {
    counters_ = counters;
  } else {
    counters_ = Counters();
    counters_.CopyGangCounters(counters);
  }
  last_loss_ = g.value("last_loss", 0.0);
  if (g.contains("guard")) {
    if (absl::Status s = guard_.FromJson(g["guard"]); !s.ok()) return s;
  }
  if (g.contains("class_counts") && options_.rank == 0) {
    std::vector<int64_t> counts = g["class_counts"].get<std::vector<int64_t>>();
    if (counts.size() == class_counts_.size()) class_counts_ = counts;
  }
  return absl::OkStatus();
}

// The checkpoint's "extra" object, from every rank's RankState (in rank
// order), in a form that does not depend on the gang's size
// (docs/checkpoints.md, "Training state"): the global batch and the gang's
// totals (class counts and the split counters summed over the ranks; the
// guard's counters, the loss and the guard as every rank has them, rank
// 0's), rank 0's memory model, and the size of the gang that wrote it
// (informational). The position in the data (epoch, cursor) is the
// trainer state's own and global.
nlohmann::json Trainer::GangState(const std::vector<nlohmann::json>& ranks) const {
  Counters total;
  std::vector<int64_t> class_counts(class_counts_.size(), 0);
  for (const nlohmann::json& r : ranks) {
    Counters c;
    c.FromJson(r["counters"]);
    total.AddRankCounters(c);
    const std::vector<int64_t> counts = r["class_counts"].get<std::vector<int64_t>>();
    for (size_t k = 0; k < counts.size() && k < class_counts.size(); ++k) {
      class_counts[k] += counts[k];
    }
  }
  Counters gang;
  gang.FromJson(ranks[0]["counters"]);
  total.CopyGangCounters(gang);
  return {{"format", kGangStateFormat},
          {"num_classes", num_classes_},
          {"global_batch", GlobalBatch(spec_)},
          {"world_size", static_cast<int64_t>(ranks.size())},
          {"memory_model", ranks[0]["memory_model"]},
          {"memory_model_precision", ranks[0].value("precision", std::string("fp32"))},
          {"loss_scaler", ranks[0].value("loss_scaler", nlohmann::json::object())},
          {"counters", total.ToJson()},
          {"last_loss", ranks[0]["last_loss"]},
          {"guard", ranks[0]["guard"]},
          {"class_counts", class_counts}};
}

namespace {

// A write's outcome as the gang shares it (a step's control collective,
// or rank 0's broadcast): [step + 1 (0: no write), code] per write.
enum WriteCode : int64_t { kWritten = 0, kOutOfSpace = 1, kRefused = 2, kFailed = 3 };

int64_t CodeOf(const absl::Status& s) {
  if (s.ok()) return kWritten;
  if (absl::IsResourceExhausted(s)) return kOutOfSpace;
  if (absl::IsFailedPrecondition(s)) return kRefused;
  return kFailed;
}

// What a rank other than rank 0 knows of a write that failed.
absl::Status StatusOf(int64_t code, int64_t step) {
  const std::string why =
      absl::StrCat("rank 0 could not write checkpoint step-", step, " (its log says why)");
  switch (code) {
    case kWritten:
      return absl::OkStatus();
    case kOutOfSpace:
      return absl::ResourceExhaustedError(why);
    case kRefused:
      return absl::FailedPreconditionError(why);
    default:
      return absl::UnavailableError(why);
  }
}

}  // namespace

std::vector<ckpt::WriteResult> Trainer::TakeWrites(bool wait) {
  if (writer_ != nullptr) {
    std::optional<ckpt::WriteResult> r = wait ? writer_->Wait() : writer_->Poll();
    if (r.has_value()) unshared_.push_back(std::move(*r));
  }
  const size_t n = std::min<size_t>(unshared_.size(), kWriteSlots);
  std::vector<ckpt::WriteResult> out(std::make_move_iterator(unshared_.begin()),
                                     std::make_move_iterator(unshared_.begin() + n));
  unshared_.erase(unshared_.begin(), unshared_.begin() + n);
  return out;
}

void Trainer::PutWrites(const std::vector<ckpt::WriteResult>& writes, at::Tensor& t,
                        int64_t offset) {
  for (size_t i = 0; i < writes.size(); ++i) {
    t[offset + 2 * i] = writes[i].step + 1;
    t[offset + 2 * i + 1] = CodeOf(writes[i].status);
  }
}

std::optional<absl::Status> Trainer::SettleWrites(const at::Tensor& t, int64_t offset,
                                                  const std::vector<ckpt::WriteResult>& own) {
  std::optional<absl::Status> current;
  for (int64_t i = 0; i < kWriteSlots; ++i) {
    const int64_t step = t[offset + 2 * i].item<int64_t>() - 1;
    if (step < 0) continue;
    const bool mine = options_.rank == 0 && static_cast<size_t>(i) < own.size();
    const absl::Status s =
        mine ? own[i].status : StatusOf(t[offset + 2 * i + 1].item<int64_t>(), step);
    Settle(step, s, mine ? own[i].seconds : -1);
    if (step == step_) current = s;
  }
  return current;
}

void Trainer::Settle(int64_t step, const absl::Status& s, double seconds) {
  const std::string name = absl::StrCat("checkpoint step-", step);
  if (s.ok()) {
    last_checkpoint_ = std::max(last_checkpoint_, step);
    last_checkpoint_error_.clear();
    if (options_.rank == 0) Event(v1::EVENT_KIND_CHECKPOINT, step, name);
    if (options_.rank != 0) {
      Log(absl::StrCat(name, " (written by rank 0)"));
    } else if (seconds >= 0) {
      Log(absl::StrFormat("%s (written in %.3f s)", name, seconds));
    } else {
      Log(name);
    }
    return;
  }
  ++checkpoint_failures_;
  last_failed_checkpoint_ = std::max(last_failed_checkpoint_, step);
  last_checkpoint_error_ = std::string(s.message());
  Log(absl::StrCat(name, " failed (", checkpoint_failures_, " failed so far; newest checkpoint ",
                   last_checkpoint_ >= 0 ? absl::StrCat("step-", last_checkpoint_) : "none",
                   "): ", s.message()));
  if (hooks_.checkpoint_failed && options_.rank == 0) {
    hooks_.checkpoint_failed(step, last_checkpoint_, last_checkpoint_error_);
  }
}

absl::Status Trainer::Checkpoint(bool background) {
  Report(v1::PHASE_CHECKPOINTING);
  // A rollback's target outlives keep_checkpoints while the guard counts a
  // bad step (docs/guard.md).
  // So does the checkpoint before an fp16 overflow streak, which may end
  // as divergence from its first step.
  int64_t keep_before = guard_.oldest_bad_step();
  if (Scaling() && scaler_.streak_first() >= 0) {
    keep_before =
        keep_before < 0 ? scaler_.streak_first() : std::min(keep_before, scaler_.streak_first());
  }
  store_.set_keep_before(keep_before);
  const int world = gang_->world_size();
  const std::string name = absl::StrCat("checkpoint step-", step_);
  // Every rank has finished the step (in a gang this gather is the
  // barrier); rank 0 writes the one checkpoint, in a form any gang size
  // resumes from (GangState).
  std::vector<std::string> ranks = {RankState().dump()};
  if (world > 1) ranks = gang_->AllGather(ranks[0], name + ": rank states");
  ckpt::TrainerState state;
  state.step = step_;
  state.epoch = epoch_;
  state.cursor = cursor_;
  if (options_.rank == 0) {
    std::vector<nlohmann::json> all;
    for (const std::string& r : ranks) all.push_back(nlohmann::json::parse(r));
    state.extra_json = GangState(all).dump();
  }
  checkpoint_started_ = step_;
  absl::Status s = absl::OkStatus();
  if (background) {
    // At most one write in flight: rank 0 waits for the previous one, and
    // the others with it, under checkpoint_timeout_s (ShareWrites).
    ShareWrites(/*wait=*/true);
    s = StartBackgroundWrite(std::move(state));
  } else {
    s = WriteNow(std::move(state));
  }
  Report(v1::PHASE_TRAINING);
  return s;
}

// Rank 0 snapshots to host memory and hands the write to writer_ (after
// the write in flight, if any); the outcome reaches every rank with a
// later step's control collective (TrainOneStep) or the next checkpoint
// written now. The other ranks do not wait.
absl::Status Trainer::StartBackgroundWrite(ckpt::TrainerState state) {
  if (options_.rank != 0) return absl::OkStatus();
  if (writer_ == nullptr) {
    // testing.checkpoint_delay_ms: the write is slow, as on busy shared
    // storage; it delays the writer thread, not training.
    const int64_t delay_ms = inject_ ? spec_.testing.checkpoint_delay_ms : 0;
    writer_ = std::make_unique<ckpt::AsyncCheckpointer>(&store_, [delay_ms] {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    });
  }
  const auto t0 = Clock::now();
  absl::StatusOr<ckpt::StateSnapshot> snapshot = absl::UnknownError("");
  try {
    snapshot = ckpt::Snapshot(*model_, *optimizer_, std::move(state), /*copy=*/true);
  } catch (const std::bad_alloc&) {
    // Host memory for the copy: a failed periodic checkpoint, not a crash.
    snapshot = absl::ResourceExhaustedError(
        "no host memory for the checkpoint's snapshot (train.background_checkpoints = false "
        "writes without a copy)");
  }
  if (!snapshot.ok()) {
    unshared_.push_back({step_, snapshot.status(), 0});
    return snapshot.status();
  }
  const uint64_t bytes = snapshot->bytes();
  // ShareWrites took the write in flight: this never waits.
  if (std::optional<ckpt::WriteResult> r = writer_->Save(std::move(*snapshot))) {
    unshared_.push_back(std::move(*r));
  }
  const double blocked = std::chrono::duration<double>(Clock::now() - t0).count();
  Log(absl::StrFormat(
      "checkpoint step-%d: %.1f MiB snapshotted in %.3f s, written in the background", step_,
      bytes / double(1 << 20), blocked));
  return absl::OkStatus();
}

std::optional<absl::Status> Trainer::ShareWrites(bool wait) {
  const int world = gang_->world_size();
  std::optional<absl::Status> current;
  while (true) {
    at::Tensor t = at::zeros({1 + 2 * kWriteSlots}, at::kLong);  // [more follow, writes]
    std::vector<ckpt::WriteResult> own;
    if (options_.rank == 0) {
      own = TakeWrites(wait);
      wait = false;
      PutWrites(own, t, 1);
      t[0] = unshared_.empty() ? 0 : 1;
    }
    if (world > 1) {
      gang_->Broadcast(t, 0, absl::StrCat("checkpoint writes before step ", step_ + 1),
                       spec_.distributed.checkpoint_timeout_s);
    }
    if (std::optional<absl::Status> s = SettleWrites(t, 1, own)) current = s;
    if (t[0].item<int64_t>() == 0) return current;
  }
}

// The write in flight finishes and every finished write is shared (one
// wait under checkpoint_timeout_s); then, unless that committed the
// current step already, rank 0 writes it and shares how it went (another).
absl::Status Trainer::WriteNow(ckpt::TrainerState state) {
  std::optional<absl::Status> current = ShareWrites(/*wait=*/true);
  if (last_checkpoint_ == step_) return absl::OkStatus();
  if (options_.rank == 0) {
    if (inject_ && spec_.testing.checkpoint_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(spec_.testing.checkpoint_delay_ms));
    }
    const auto t0 = Clock::now();
    absl::Status s = ckpt::SaveState(store_, *model_, *optimizer_, state);
    unshared_.push_back({step_, s, std::chrono::duration<double>(Clock::now() - t0).count()});
  }
  if (std::optional<absl::Status> s = ShareWrites(/*wait=*/false)) current = s;
  if (last_checkpoint_ == step_) return absl::OkStatus();
  return current.value_or(
      absl::InternalError(absl::StrCat("checkpoint step-", step_, " was not written")));
}

void Trainer::FinishWrites() {
  if (options_.rank != 0) return;
  // Nothing is shared any more: rank 0 reports what it knows.
  while (writer_ != nullptr || !unshared_.empty()) {
    std::vector<ckpt::WriteResult> writes = TakeWrites(/*wait=*/true);
    if (writes.empty()) break;
    for (const ckpt::WriteResult& w : writes) Settle(w.step, w.status, w.seconds);
  }
}

TrainerResult Trainer::CheckpointFailed(const absl::Status& s, const std::string& when) {
  if (absl::IsFailedPrecondition(s)) {
    // Refused: the weights or the optimizer state are not finite. The
    // steps were judged finite, so the last applied step's update made
    // them: that step is the first bad one.
    TrainerResult r =
        Fail(WorkerExit::kDiverged, absl::StrCat("diverged at step ", step_, ": checkpoint step-",
                                                 step_, " ", when, " refused: ", s.message()));
    r.first_bad_step = step_;
    return r;
  }
  if (!absl::IsResourceExhausted(s)) {
    return Crash(CrashReason::kCheckpointFailed, std::string(s.message()));
  }
  return Fail(
      WorkerExit::kNoSpace,
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
      // A content error, left where it is: the supervisor chose the step,
      // and only the daemon that owns the store quarantines in it (a shared
      // store of a multi-node job: nobody does; every node leaves it out).
      // Its next choice verifies again and skips it.
      return absl::DataLossError(absl::StrCat("checkpoint step-", want, ": ", v.message(),
                                              " (not quarantined: the supervisor's next choice "
                                              "leaves it out)"));
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
  checkpoint_started_ = state.step;
  nlohmann::json extra = nlohmann::json::parse(state.extra_json, nullptr, false);
  absl::StatusOr<nlohmann::json> gang = ResumableGangState(extra);
  if (!gang.ok()) {
    return absl::Status(gang.status().code(), absl::StrCat("checkpoint step-", chosen->step, ": ",
                                                           gang.status().message()));
  }
  absl::Status applied = ApplyGangState(*gang);
  if (!applied.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint step-", chosen->step, ": ", applied.message()));
  }
  Log(absl::StrCat("resumed from step ", step_, " (epoch ", epoch_, ", cursor ", cursor_, ")"));
  Event(v1::EVENT_KIND_LOG, -1, absl::StrCat("resumed from step ", step_));
  return absl::OkStatus();
}

void Trainer::BroadcastWeights(bool parameters, const std::string& what) {
  if (gang_->world_size() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  if (parameters) tensors = model_->parameters();
  for (const at::Tensor& b : model_->buffers()) tensors.push_back(b);
  // One collective per dtype: the float tensors flattened into one, the
  // counters (num_batches_tracked) into another.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const at::Tensor& t : tensors) by_type[t.scalar_type()].push_back(t);
  for (auto& [type, list] : by_type) {
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : list) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    gang_->Broadcast(flat, 0, absl::StrCat(what, " (", c10::toString(type), ")"));
    int64_t offset = 0;
    for (at::Tensor& t : list) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace trainsup::worker::internal
