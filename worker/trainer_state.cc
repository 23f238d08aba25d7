// Checkpoints, resume and every rank's own state (trainer_impl.h).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/state.h"
#include "worker/trainer_impl.h"

namespace trainsup::worker::internal {

nlohmann::json Trainer::RankState() const {
  return {{"rank", options_.rank},
          {"epoch", epoch_},
          {"cursor", cursor_},
          {"memory_model", memory_model_.Serialize()},
          {"counters", counters_.ToJson()},
          {"last_loss", last_loss_},
          {"guard", guard_.ToJson()},
          {"class_counts", class_counts_},
          {"cpu_rng_state", ckpt::ToHex(ckpt::CpuGeneratorState())}};
}

absl::Status Trainer::ApplyRankState(const nlohmann::json& r, bool restore_rng) {
  if (!r.is_object()) return absl::DataLossError("a rank's state is not a JSON object");
  if (r.contains("epoch")) epoch_ = r["epoch"].get<int64_t>();
  if (r.contains("cursor")) cursor_ = r["cursor"].get<int64_t>();
  if (r.contains("memory_model")) {
    absl::StatusOr<MemoryModel> m = MemoryModel::Deserialize(r["memory_model"].get<std::string>());
    if (m.ok()) memory_model_ = *m;
  }
  if (r.contains("counters")) counters_.FromJson(r["counters"]);
  last_loss_ = r.value("last_loss", 0.0);
  if (r.contains("guard")) {
    if (absl::Status s = guard_.FromJson(r["guard"]); !s.ok()) return s;
  }
  if (r.contains("class_counts")) {
    std::vector<int64_t> counts = r["class_counts"].get<std::vector<int64_t>>();
    if (counts.size() == class_counts_.size()) class_counts_ = counts;
  }
  if (restore_rng && r.contains("cpu_rng_state")) {
    std::string bytes;
    if (!ckpt::FromHex(r["cpu_rng_state"].get<std::string>(), &bytes)) {
      return absl::DataLossError(
          absl::StrCat("rank ", options_.rank, "'s CPU generator state is not hex"));
    }
    absl::Status set = ckpt::SetCpuGeneratorState(bytes);
    if (!set.ok()) {
      return absl::DataLossError(absl::StrCat("rank ", options_.rank, ": ", set.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::Checkpoint() {
  Report(v1::PHASE_CHECKPOINTING);
  // A rollback's target outlives keep_checkpoints while the guard counts a
  // bad step (docs/guard.md).
  store_.set_keep_before(guard_.oldest_bad_step());
  const int world = gang_->world_size();
  const std::string name = absl::StrCat("checkpoint step-", step_);
  ckpt::TrainerState state;
  state.step = step_;
  state.epoch = epoch_;
  state.cursor = cursor_;
  nlohmann::json extra = RankState();
  extra["num_classes"] = num_classes_;
  absl::Status s;
  // testing.checkpoint_delay_ms: the write is slow, as on busy shared storage.
  auto slow_storage = [this] {
    if (inject_ && spec_.testing.checkpoint_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(spec_.testing.checkpoint_delay_ms));
    }
  };
  if (world == 1) {
    state.extra_json = extra.dump();
    slow_storage();
    s = ckpt::SaveState(store_, *model_, *optimizer_, state);
  } else {
    // Every rank has finished the step (this gather is the barrier); rank 0
    // writes the one checkpoint, with every rank's state in it, and tells
    // the others how it went.
    std::vector<std::string> ranks = gang_->AllGather(RankState().dump(), name + ": rank states");
    at::Tensor result = at::zeros({3}, at::kLong);  // [written, out of space, refused]
    if (options_.rank == 0) {
      nlohmann::json all = nlohmann::json::array();
      for (const std::string& r : ranks) all.push_back(nlohmann::json::parse(r));
      nlohmann::json gang_extra = {
          {"num_classes", num_classes_}, {"world_size", world}, {"ranks", all}};
      state.extra_json = gang_extra.dump();
      slow_storage();
      s = ckpt::SaveState(store_, *model_, *optimizer_, state);
      result[0] = s.ok() ? 1 : 0;
      result[1] = absl::IsResourceExhausted(s) ? 1 : 0;
      result[2] = absl::IsFailedPrecondition(s) ? 1 : 0;
    }
    // The others wait while rank 0 writes to what may be slow shared
    // storage: distributed.checkpoint_timeout_s, not the collective timeout.
    gang_->Broadcast(result, 0, name + ": written", spec_.distributed.checkpoint_timeout_s);
    if (options_.rank != 0) {
      if (result[0].item<int64_t>() == 1) {
        s = absl::OkStatus();
      } else {
        const std::string why =
            absl::StrCat("rank 0 could not write ", name, " (its log says why)");
        s = result[1].item<int64_t>() == 1   ? absl::ResourceExhaustedError(why)
            : result[2].item<int64_t>() == 1 ? absl::FailedPreconditionError(why)
                                             : absl::UnavailableError(why);
      }
    }
  }
  if (s.ok()) {
    last_checkpoint_ = step_;
    last_checkpoint_error_.clear();
    if (options_.rank == 0) Event(v1::EVENT_KIND_CHECKPOINT, step_, name);
    Log(world == 1 || options_.rank == 0 ? name : absl::StrCat(name, " (written by rank 0)"));
  } else {
    ++checkpoint_failures_;
    last_checkpoint_error_ = std::string(s.message());
    Log(absl::StrCat(name, " failed (", checkpoint_failures_, " failed so far; newest checkpoint ",
                     last_checkpoint_ >= 0 ? absl::StrCat("step-", last_checkpoint_) : "none",
                     "): ", s.message()));
    if (hooks_.checkpoint_failed && options_.rank == 0)
      hooks_.checkpoint_failed(step_, last_checkpoint_, last_checkpoint_error_);
  }
  Report(v1::PHASE_TRAINING);
  return s;
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
    return Crash("checkpoint_failed", std::string(s.message()));
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
  nlohmann::json extra = nlohmann::json::parse(state.extra_json, nullptr, false);
  const int world = options_.world_size;
  const int64_t written_by =
      extra.is_object() && extra.contains("world_size") ? extra["world_size"].get<int64_t>() : 1;
  if (written_by != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step-", chosen->step, " was written by a gang of ", written_by,
                     " rank", written_by == 1 ? "" : "s", "; this run has world_size = ", world,
                     " (a run resumes with the world size it was written with)"));
  }
  if (extra.is_object()) {
    // One rank: its state is the extra object itself; a gang: each rank's
    // own entry (rank 0's RNG was restored by LoadState already).
    const bool gang = extra.contains("ranks");
    const nlohmann::json& mine = gang ? extra["ranks"][options_.rank] : extra;
    absl::Status applied = ApplyRankState(mine, gang && options_.rank != 0);
    if (!applied.ok()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint step-", chosen->step, ": ", applied.message()));
    }
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
