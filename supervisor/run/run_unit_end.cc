// The exit-to-restart path: a rank's exit classified (exit_classify.h),
// the attempt's end decided once every rank is down (restart_policy.h), and
// the decision applied: succeed, fail, stop, or restart after a backoff or
// once there is disk space.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "contracts/run_layout.h"
#include "supervisor/policy/training_outcome.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {

void RunUnit::OnProcessExit(int attempt, int rank) {
  if (attempt != attempt_.number() || At(rank) == nullptr) return;
  RankState& r = *At(rank);
  if (!r.alive) return;
  RankEndFacts f;
  if (r.own_child) {
    const ReapResult reaped = env_.launcher->Reap(r.pid);
    if (reaped.state == ReapResult::kRunning) return;  // not yet: a spurious wake-up
    if (reaped.state == ReapResult::kReaped) {
      f.reaped = true;
      f.exited = reaped.exited;
      f.code_or_signal = reaped.code_or_signal;
    }
  } else if (!r.died_unwatched && env_.launcher->IsSameProcess(r.pid, r.group.leader_start_ticks)) {
    return;  // still alive
  }
  f.report = env_.launcher->ReadExitFile(RunLayout(run_.run_dir()).ExitFilePath(attempt, rank));
  if (!f.report) f.report = r.exit_report;
  f.said_hello = r.heard;
  f.expects_hello = Heartbeats();
  f.forced = r.forced;
  f.forced_reason = r.forced_reason;
  const RankEnd end = ClassifyRankEnd(f);
  r.end_report = f.report;
  if (end.cls == ExitClass::kDiverged) NoteDiverged(r, f.report);
  if (r.end_order < 0) r.end_order = r.died_unwatched ? 0 : ++ends_seen_;
  // The exit report is newer than any heartbeat (a short run may never have
  // sent one): what clients read ends at the step the worker reached.
  if (f.report && f.report->last_step > r.status.progress().step()) {
    r.status.mutable_progress()->set_step(f.report->last_step);
    if (rank == rank_base_) run_.mutable_progress()->set_step(f.report->last_step);
  }
  // An attempt too short for a heartbeat leaves the step target unknown
  // ("step 30/?"): the spec's, when it says.
  if (rank == rank_base_ && run_.progress().total_steps() <= 0) {
    const int64_t total = spec_.has_command         ? spec_.command.total_steps
                          : spec_.train.epochs == 0 ? spec_.train.steps
                                                    : 0;
    if (total > 0) run_.mutable_progress()->set_total_steps(total);
  }
  r.alive = false;
  if (r.stop_timer != 0) env_.timers->Cancel(r.stop_timer);
  r.stop_timer = 0;
  if (!r.died_unwatched) env_.launcher->UnwatchExit(id(), attempt, rank);
  r.status.set_exit_code(end.exited ? end.code : -1);
  r.status.set_signal(end.signal);
  r.status.set_exit_class(ExitClassProto(end.cls));
  r.status.set_exit_reason(end.reason);
  env_.host->CountWorkerExit(ToString(end.cls));
  env_.host->RemoveWorkerMetrics(id(), rank);
  Log(LogLevel::kInfo,
      absl::StrCat("attempt=", attempt, " rank=", rank, " pid ", r.pid, " ended: ", end.reason));
  v1::RunEvent e = Event(v1::EVENT_KIND_WORKER_EXIT, rank, end.reason);
  e.set_exit_class(ExitClassProto(end.cls));
  *e.mutable_progress() = r.status.progress();
  StoreBatch b;
  b.what = absl::StrCat("rank ", rank, " ended");
  b.ranks.push_back(RankRow(r));
  b.events.push_back(e);
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
  if (r.link) {
    r.link->Close(absl::OkStatus());
    r.link.reset();
  }
  GroupIdentity group = r.group;
  if (!r.died_unwatched) group.known_alive_ticks = env_.clock->BootTicks();
  env_.host->ReleaseSlot(r.slot, group);
  if (end.cls != ExitClass::kSuccess) {
    for (RankState& other : ranks_) {
      if (other.alive && other.stop_stage == StopStage::kNone) {
        StopRank(other, ExitClass::kGang,
                 absl::StrCat("stopped because rank ", rank, " ended: ", end.reason),
                 /*graceful=*/false);
      }
    }
    if (cluster_ && !cancel_ && !shutdown_stop_) {
      AttemptEnd e;
      e.end_s = static_cast<double>(env_.clock->WallMs()) / 1000.0;
      e.cls = end.cls;
      e.made_progress = r.progressed;
      // Stopped at a checkpoint to take a node in (OnClusterGrow) or for a
      // drained slot (Resize): the job moves on, named by the resize's
      // reason, rather than restarts.
      e.detail = resize_stop_ && end.cls == ExitClass::kStopped
                     ? resize_reason_
                     : absl::StrCat("rank ", rank, " ended: ", end.reason);
      // Only the exit a resize asked for (143 after its checkpoint) moves
      // the job on as a resize; any other end is a failure of the job.
      e.stop_requested = resize_stop_ && end.cls == ExitClass::kStopped;
      if (end.cls == ExitClass::kDiverged) e.first_bad_step = diverged_at_;
      cluster_->Broken(attempt_.generation(), e);
    }
  }
  ReportToCluster();
  if (!AnyAlive()) EndAttempt();
}

void RunUnit::EndAttempt() {
  std::vector<RankOutcome> outcomes;
  for (const RankState& r : ranks_) {
    outcomes.push_back({r.rank,
                        ExitClassFromProto(r.status.exit_class()).value_or(ExitClass::kCrash),
                        r.status.exit_reason(), r.progressed, r.end_order});
  }
  const AttemptOutcome o = ClassifyAttemptEnd(outcomes);
  stragglers_.reset();
  FailCheckpointRequests(-1, absl::StrCat("the attempt ended (", ToString(o.cls), ": ", o.detail,
                                          ") before a checkpoint committed"));
  // A stop we asked for ended the attempt only when the deciding rank
  // answered it (exit 143: stopped or cancelled, ClassifyRankEnd rule 2a);
  // a crash, an out-of-memory or a diverged exit on the way is decided as
  // if no stop had been asked. A cancel still ends the run CANCELLED.
  const bool clean_stop = o.cls == ExitClass::kStopped || o.cls == ExitClass::kCancelled;
  const bool stop_requested = (cancel_ || shutdown_stop_ || resize_stop_) && clean_stop;
  const bool resized = resize_stop_ && clean_stop;
  const bool shut_down = shutdown_stop_ && clean_stop;
  resize_stop_ = false;
  // Restored from a stored request after a daemon restart, or this
  // daemon's own shutdown.
  shutdown_stop_ = env_.host->shutting_down();
  // Answered (or past answering): the next attempt is asked nothing.
  run_.clear_stop_request();
  attempt_.set_ended_ms(env_.clock->WallMs());
  attempt_.set_exit_class(ExitClassProto(o.cls));
  attempt_.set_exit_reason(o.detail);
  attempt_.set_stop_requested(stop_requested);
  AttemptEnd end;
  end.end_s = static_cast<double>(env_.clock->WallMs()) / 1000.0;
  end.cls = o.cls;
  end.made_progress = o.made_progress;
  end.stop_requested = stop_requested;
  end.detail = o.detail;
  end.first_bad_step = o.cls == ExitClass::kDiverged ? diverged_at_ : -1;
  history_.push_back(end);
  if (o.cls == ExitClass::kOom) oom_exits_++;
  StoreBatch b;
  b.what = absl::StrCat("attempt ", attempt_.number(), " ended");
  b.attempts.push_back(attempt_);
  b.learning = RunLearning{learning_.slowest_step_s, learning_.steps_observed};
  v1::RunEvent ended = Event(v1::EVENT_KIND_ATTEMPT_ENDED, -1, o.detail);
  ended.set_exit_class(ExitClassProto(o.cls));
  b.events.push_back(ended);
  if (cancel_) {
    SetState(v1::RUN_STATE_CANCELLED, cancel_reason_, std::move(b), [this] { MaybeFinished(); });
    return;
  }
  if (shut_down) {
    SetState(v1::RUN_STATE_PENDING, "daemon shut down; the run resumes when it starts again",
             std::move(b), [this] {
               if (!env_.host->shutting_down()) env_.host->Reschedule();
             });
    return;
  }
  if (resized && !cluster_) {
    // Queued again at once: no restart counted, no backoff.
    RequeueNow(std::move(b), absl::StrCat("resizing the gang: ", resize_reason_));
    return;
  }
  if (cluster_ && o.cls != ExitClass::kSuccess) {
    AttemptEnd told = end;
    if (resized && o.cls == ExitClass::kStopped) told.detail = resize_reason_;  // as RankEnded does
    FollowClusterVerdict(std::move(b), told, o.cls);
    return;
  }
  RestartDecision d = DecideRestart(Policy(), history_, env_.host->JitterUnit());
  if (d.action == Action::kSucceed) JudgeCompletedRun(b, d);
  if (d.action == Action::kFail && o.cls == ExitClass::kDiverged) NoteDivergenceFailed(d);
  if (d.rollback) AddRollbackWindow(b, d);
  ApplyDecision(std::move(b), o.cls, d);
}

void RunUnit::JudgeCompletedRun(StoreBatch& b, RestartDecision& d) {
  // Rank 0 reports what the run trained; on the other nodes of a job there
  // is no rank 0 to judge by, and the job's node 0 judges.
  const RankState* zero = At(0);
  if (zero == nullptr) {
    d.reason.clear();
    return;
  }
  // The exit report's tally, else the last heartbeat's (a script that
  // returns normally writes no exit file; the Python client flushes its
  // progress on the way out).
  TrainingTally tally;
  if (zero->end_report && zero->end_report->tally.present()) {
    tally = zero->end_report->tally;
  } else if (zero->status.progress().has_tally()) {
    tally = TallyFromProto(zero->status.progress().tally());
  }
  if (!tally.present()) {
    d.reason.clear();
    return;
  }
  *run_.mutable_progress()->mutable_tally() = TallyToProto(tally);
  const TrainingVerdict v = JudgeTraining(tally, spec_.guard);
  d.reason = v.summary;
  if (!v.warning.empty()) {
    Log(LogLevel::kWarn, v.warning);
    b.events.push_back(Event(v1::EVENT_KIND_GUARD, -1, v.warning));
  }
  if (v.trained) return;
  Log(LogLevel::kError, v.reason);
  b.events.push_back(Event(v1::EVENT_KIND_GUARD, -1, v.reason));
  d.action = Action::kFail;
  d.reason = v.reason;
}

void RunUnit::ApplyDecision(StoreBatch b, ExitClass cls, const RestartDecision& d,
                            int64_t restarts) {
  switch (d.action) {
    case Action::kSucceed:
      SetState(v1::RUN_STATE_SUCCEEDED,
               d.reason.empty() ? "every rank completed"
                                : absl::StrCat("every rank completed; ", d.reason),
               std::move(b), [this] { MaybeFinished(); });
      return;
    case Action::kFail:
      SetState(v1::RUN_STATE_FAILED, d.reason, std::move(b), [this] { MaybeFinished(); });
      return;
    case Action::kStop:
      SetState(v1::RUN_STATE_PENDING, d.reason, std::move(b), [this] { env_.host->Reschedule(); });
      return;
    case Action::kRestart:
      break;
  }
  // A rollback counts in run_.rollbacks (AddRollbackWindow), not here.
  if (!d.rollback) {
    run_.set_restarts(restarts >= 0 ? static_cast<int32_t>(restarts) : run_.restarts() + 1);
  }
  if (d.oom) run_.set_oom_restarts(run_.oom_restarts() + 1);
  not_before_s_ = env_.clock->NowS() + d.delay_s;
  run_.set_next_restart_ms(env_.clock->WallMs() + static_cast<int64_t>(d.delay_s * 1000));
  env_.host->CountRestart(ToString(cls));
  waiting_for_space_ = d.wait_for_space;
  space_reported_ = false;
  space_backoff_s_ = std::max(d.delay_s, 1.0);
  v1::RunEvent restart = Event(v1::EVENT_KIND_RESTART, -1, d.reason);
  restart.set_exit_class(ExitClassProto(cls));
  restart.set_delay_s(d.delay_s);
  b.events.push_back(restart);
  const double delay = d.delay_s;
  SetState(v1::RUN_STATE_RESTARTING, d.reason, std::move(b), [this, delay] {
    restart_timer_ = env_.timers->Start(delay, Guarded([this] {
                                          restart_timer_ = 0;
                                          if (waiting_for_space_) {
                                            WaitForSpace();
                                          } else {
                                            env_.host->Reschedule();
                                          }
                                        }));
  });
}

void RunUnit::WaitForSpace() {
  env_.host->MeasureSpace(
      run_.run_dir(), Guarded([this](absl::StatusOr<int64_t> free_bytes, int64_t checkpoint_bytes) {
        if (!waiting_for_space_ || cancel_ || IsTerminal(run_.state())) return;
        const int64_t need =
            std::max<int64_t>(cfg().restart.min_free_space_mb << 20, 2 * checkpoint_bytes);
        if (free_bytes.ok() && *free_bytes >= need) {
          waiting_for_space_ = false;
          const std::string note =
              absl::StrCat("disk space is back: ", *free_bytes >> 20, " MiB free (need ",
                           need >> 20, " MiB); restarting");
          Log(LogLevel::kInfo, note);
          StoreBatch b;
          b.what = "space back";
          b.events.push_back(Event(v1::EVENT_KIND_LOG, -1, note));
          Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
          return;
        }
        const std::string why =
            free_bytes.ok()
                ? absl::StrCat("waiting for disk space on ", run_.run_dir(), ": ",
                               *free_bytes >> 20, " MiB free, need ", need >> 20, " MiB")
                : absl::StrCat("waiting for disk space on ", run_.run_dir(),
                               ": cannot measure it: ", free_bytes.status().message());
        Log(LogLevel::kWarn, why);
        if (!space_reported_) {
          space_reported_ = true;
          StoreBatch b;
          b.what = "waiting for space";
          b.events.push_back(Event(v1::EVENT_KIND_LOG, -1, why));
          Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
        }
        space_backoff_s_ = std::min(std::max(space_backoff_s_ * 2, 1.0),
                                    std::max(cfg().restart.max_backoff_s, 1.0));
        restart_timer_ = env_.timers->Start(space_backoff_s_, Guarded([this] {
                                              restart_timer_ = 0;
                                              WaitForSpace();
                                            }));
      }));
}

}  // namespace trainsup::supervisor
