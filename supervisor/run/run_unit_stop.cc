// The run unit's stops: a rank's stop stages (SIGTERM, stack capture,
// SIGKILL), cancel and the daemon's shutdown.
#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {
namespace {

namespace wv1 = ::trainsup::worker::v1;

}  // namespace

void RunUnit::StopRank(RankState& r, ExitClass why, const std::string& reason, bool graceful) {
  if (!r.alive || r.stop_stage != StopStage::kNone) return;
  if (!r.forced) {
    r.forced = why;
    r.forced_reason = reason;
  }
  EnterStopStage(r.rank, FirstStopStage(graceful, r.link != nullptr));
}

void RunUnit::EnterStopStage(int rank, StopStage stage) {
  RankState* found = At(rank);
  if (found == nullptr) return;
  RankState& r = *found;
  if (!r.alive || stage == StopStage::kNone) return;
  const StopStage previous = r.stop_stage;
  r.stop_stage = stage;
  const StopTimeouts timeouts{cfg().workers.stop_deadline_s, cfg().workers.term_grace_s};
  const int attempt = attempt_.number();
  switch (stage) {
    case StopStage::kStopCommand: {
      wv1::SupervisorCommand c;
      c.mutable_stop()->set_deadline_s(static_cast<int>(timeouts.stop_deadline_s));
      c.mutable_stop()->set_reason(r.forced_reason);
      if (r.link) r.link->Send(c);
      break;
    }
    case StopStage::kSigterm: {
      if (previous == StopStage::kStopCommand) {
        Log(LogLevel::kWarn, absl::StrCat("attempt=", attempt, " rank=", rank,
                                          " did not stop within the deadline: SIGTERM"));
      }
      absl::Status s = env_.signaller->SignalGroup(r.group, SIGTERM);
      if (!s.ok()) Log(LogLevel::kWarn, absl::StrCat("rank=", rank, " SIGTERM: ", s.message()));
      break;
    }
    case StopStage::kSigkill: {
      Log(LogLevel::kWarn,
          absl::StrCat("attempt=", attempt, " rank=", rank, " pid ", r.pid,
                       " ignored SIGTERM: SIGKILL to process group ", r.group.pgid));
      StoreBatch b;
      b.what = "sigkill";
      b.events.push_back(Event(v1::EVENT_KIND_LOG, rank,
                               absl::StrCat("rank ", rank, " still alive ", timeouts.term_grace_s,
                                            " s after SIGTERM: SIGKILL to its process group")));
      Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
      absl::Status s = env_.signaller->SignalGroup(r.group, SIGKILL);
      if (!s.ok()) Log(LogLevel::kWarn, absl::StrCat("rank=", rank, " SIGKILL: ", s.message()));
      return;
    }
    case StopStage::kNone:
      return;
  }
  r.stop_timer =
      env_.timers->Start(StopStageTimeout(stage, timeouts), Guarded([this, attempt, rank, stage] {
                           if (attempt != attempt_.number() || At(rank) == nullptr) return;
                           At(rank)->stop_timer = 0;
                           EnterStopStage(rank, NextStopStage(stage));
                         }));
}

void RunUnit::CaptureAndKill(RankState& r, ExitClass cls, const std::string& reason) {
  r.forced = cls;
  r.forced_reason = reason;
  // The rank failed when we found it frozen or hung, not when the kill
  // took: a peer that times out on it meanwhile ended after it.
  r.end_order = ++ends_seen_;
  // Marked as stopping at once, so the detector does not fire again while
  // the stacks are being captured.
  r.stop_stage = StopStage::kStopCommand;
  Log(LogLevel::kWarn,
      absl::StrCat("attempt=", attempt_.number(), " rank=", r.rank, " pid ", r.pid, ": ", reason));
  v1::RunEvent e = Event(v1::EVENT_KIND_HANG, r.rank, reason);
  e.set_exit_class(ExitClassProto(cls));
  StoreBatch b;
  b.what = "hang";
  b.events.push_back(e);
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
  const int attempt = attempt_.number();
  const int rank = r.rank;
  if (spec_.has_command) {
    // The Python client registers faulthandler on SIGUSR1: every thread's
    // Python stack goes to stderr (the rank log), which gdb cannot show.
    // The leader only: a child that did not register it would die of it.
    const std::string log_path = r.status.log_path();
    const int64_t from = std::max<int64_t>(env_.launcher->ReadTail(log_path, 0, 0).size, 0);
    absl::Status s = env_.signaller->SignalLeader(r.group, SIGUSR1);
    if (!s.ok()) Log(LogLevel::kWarn, absl::StrCat("rank=", rank, " SIGUSR1: ", s.message()));
    WaitForPythonStacks(attempt, rank, log_path, from, -1,
                        env_.clock->NowS() + cfg().workers.python_stack_wait_s);
    return;
  }
  CaptureThenTerm(attempt, rank);
}

// Until the Python stacks are in the rank log: the log holds faulthandler's
// "(most recent call first)" past `from` and has not grown since the last
// look, or `deadline_s` passed. A SIGTERM sent while the SIGUSR1 is still
// pending would kill the script before it dumps (a loaded machine may not
// run it for a while), so the wait is for the dump itself; the cap is
// workers.python_stack_wait_s.
void RunUnit::WaitForPythonStacks(int attempt, int rank, const std::string& log_path, int64_t from,
                                  int64_t last_size, double deadline_s) {
  constexpr double kPollS = 0.05;
  constexpr int64_t kMaxDumpBytes = 1 << 20;
  const UnitLauncher::FileTail t = env_.launcher->ReadTail(log_path, from, kMaxDumpBytes);
  if (t.size >= 0 && t.size < from) from = 0;  // the log was rotated meanwhile
  const bool dumped = t.size > from && t.size == last_size &&
                      t.bytes.find("(most recent call first)") != std::string::npos;
  const double left_s = deadline_s - env_.clock->NowS();
  if (dumped || left_s <= 1e-9) {
    CaptureThenTerm(attempt, rank);
    return;
  }
  env_.timers->Start(std::min(kPollS, left_s),
                     Guarded([this, attempt, rank, log_path, from, size = t.size, deadline_s] {
                       if (attempt != attempt_.number()) return;
                       WaitForPythonStacks(attempt, rank, log_path, from, size, deadline_s);
                     }));
}

void RunUnit::CaptureThenTerm(int attempt, int rank) {
  RankState* found = At(rank);
  if (found == nullptr) return;
  RankState& r = *found;
  if (!r.alive) return;
  if (!cfg().workers.capture_stacks) {
    EnterStopStage(rank, StopStage::kSigterm);
    return;
  }
  const int pid = r.pid;
  const std::string log_path = r.status.log_path();
  env_.launcher->CaptureStacks(
      pid, log_path, Guarded([this, attempt, rank, pid, log_path](absl::StatusOr<std::string> how) {
        if (how.ok()) {
          Log(LogLevel::kInfo, absl::StrCat("rank=", rank, " stacks of pid ", pid,
                                            " captured with ", *how, " into ", log_path));
        } else {
          Log(LogLevel::kWarn, absl::StrCat("rank=", rank, " stack capture of pid ", pid, ": ",
                                            how.status().message()));
        }
        if (attempt != attempt_.number()) return;
        EnterStopStage(rank, StopStage::kSigterm);
      }));
}

void RunUnit::Cancel(const std::string& reason, std::function<void(absl::Status)> done) {
  if (IsTerminal(run_.state())) {
    done(absl::FailedPreconditionError(
        absl::StrCat("run ", id(), " already ended: ", StateName(run_.state()))));
    return;
  }
  if (cancel_) {
    done(absl::OkStatus());
    return;
  }
  cancel_ = true;
  cancel_reason_ = reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", reason);
  // The whole job: every node's run ends CANCELLED, also when this node's
  // run has not joined yet (queued for its slots, or restored after a
  // daemon restart): the member is made for the cancel.
  if (Clustered() && EnsureCluster(/*fail_run=*/false)) {
    cluster_->Cancel(reason.empty() ? "cancelled" : reason);
  }
  if (AnyAlive() || preparing_ || launching_) {
    // Answered once stored: a daemon killed after the OK still cancels
    // (HonourStoredStop, Restore).
    RequestStop(v1::StopRequest::KIND_CANCEL, cancel_reason_, ExitClass::kCancelled, cancel_reason_,
                [done] { done(absl::OkStatus()); });
    return;
  }
  if (joining_) {
    // No rank started yet, and the rendezvous may wait on an etcd that is
    // down: the run ends now, the job's other nodes learn of the cancel
    // when etcd answers (ClusterMember::Cancel), and the agreement, should
    // it come, is ignored (OnAgreement).
    joining_ = false;
    ReleaseSlots();
  }
  if (restart_timer_ != 0) env_.timers->Cancel(restart_timer_);
  restart_timer_ = 0;
  waiting_for_space_ = false;
  SetState(v1::RUN_STATE_CANCELLED, cancel_reason_, {}, [this, done] {
    done(absl::OkStatus());
    MaybeFinished();
  });
}

void RunUnit::Shutdown() {
  if (restart_timer_ != 0) env_.timers->Cancel(restart_timer_);
  restart_timer_ = 0;
  if (!AnyAlive() || cancel_ || shutdown_stop_) return;
  shutdown_stop_ = true;
  RequestStop(v1::StopRequest::KIND_SHUTDOWN, "daemon shutting down", ExitClass::kStopped,
              "daemon shutting down", nullptr);
}

void RunUnit::RequestStop(v1::StopRequest::Kind kind, const std::string& reason, ExitClass cls,
                          const std::string& rank_reason, std::function<void()> then) {
  v1::StopRequest* s = run_.mutable_stop_request();
  s->set_kind(kind);
  s->set_reason(reason);
  s->set_attempt(attempt_.number());
  StoreBatch b;
  b.what = "stop request";
  b.run = run_;
  const int attempt = attempt_.number();
  Persist(std::move(b), [this, attempt, cls, rank_reason, then](const StoreBatch&) {
    if (attempt == attempt_.number()) {
      for (RankState& r : ranks_) {
        if (r.alive) StopRank(r, cls, rank_reason, /*graceful=*/true);
      }
    }
    if (then) then();
  });
}

void RunUnit::HonourStoredStop(int attempt) {
  if (!run_.has_stop_request()) return;
  const v1::StopRequest s = run_.stop_request();
  if (s.attempt() != attempt) {
    run_.clear_stop_request();  // an older attempt's: stored with the next write
    return;
  }
  ExitClass cls = ExitClass::kStopped;
  std::string why = s.reason();
  switch (s.kind()) {
    case v1::StopRequest::KIND_CANCEL:
      cancel_ = true;
      cancel_reason_ = s.reason();
      cls = ExitClass::kCancelled;
      break;
    case v1::StopRequest::KIND_RESIZE:
      resize_stop_ = true;
      resize_reason_ = s.reason();
      why = absl::StrCat("resizing the gang: ", s.reason());
      break;
    case v1::StopRequest::KIND_SHUTDOWN:
      shutdown_stop_ = true;
      break;
    default:
      run_.clear_stop_request();
      return;
  }
  Log(LogLevel::kInfo, absl::StrCat("attempt=", attempt,
                                    " the stop asked before the daemon restarted holds: ", why));
  for (RankState& r : ranks_) {
    if (!r.alive) continue;
    if (r.died_unwatched) {
      r.forced = cls;
      r.forced_reason = why;
    } else {
      StopRank(r, cls, why, /*graceful=*/true);
    }
  }
}

}  // namespace trainsup::supervisor
