// The run unit's stops (stop stages, hang kills, cancel, shutdown), its
// liveness checks and its side of the worker channel; run_unit.cc has the
// rest of its life.
#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "contracts/version.h"
#include "supervisor/policy/auth.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {
namespace {

namespace wv1 = ::trainsup::worker::v1;

// Progress is streamed live on every heartbeat but stored at most this often.
constexpr double kProgressPersistS = 30;

ProgressTimeoutConfig TimeoutFrom(const ProgressSection& p) {
  ProgressTimeoutConfig c;
  c.startup_grace_s = p.startup_grace_s;
  c.safety_factor = p.safety_factor;
  c.min_timeout_s = p.min_timeout_s;
  c.max_timeout_s = p.max_timeout_s;
  c.checkpoint_allowance_s = p.checkpoint_allowance_s;
  c.fixed_timeout_s = p.fixed_timeout_s;
  return c;
}

v1::ExitClass Proto(ExitClass cls) { return static_cast<v1::ExitClass>(ToProto(cls)); }

}  // namespace

// --- stopping ------------------------------------------------------------------------------

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
  e.set_exit_class(Proto(cls));
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
  bool any_alive = false;
  for (RankState& r : ranks_) {
    if (!r.alive) continue;
    any_alive = true;
    StopRank(r, ExitClass::kCancelled, cancel_reason_, /*graceful=*/true);
  }
  if (any_alive || preparing_ || launching_) {
    done(absl::OkStatus());
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
  for (RankState& r : ranks_) {
    if (!r.alive) continue;
    shutdown_stop_ = true;
    StopRank(r, ExitClass::kStopped, "daemon shutting down", /*graceful=*/true);
  }
}

// --- liveness -----------------------------------------------------------------------------

void RunUnit::CheckLiveness() {
  const double now = env_.clock->NowS();
  ReportToCluster();
  // Judged by their exit codes only.
  if (!Heartbeats()) return;
  const ProgressTimeoutConfig tcfg = TimeoutFrom(cfg().progress);
  for (RankState& r : ranks_) {
    if (!r.alive || r.stop_stage != StopStage::kNone || r.died_unwatched) continue;
    double hb_timeout = cfg().workers.heartbeat_timeout_s;
    double last_hb = r.last_heartbeat_s;
    if (!r.heard) {
      // Before its first heartbeat a worker is still starting up.
      hb_timeout = std::max(hb_timeout, cfg().progress.startup_grace_s);
      last_hb = r.launched_s;
    }
    const double progress_timeout = ProgressTimeoutSeconds(tcfg, learning_, r.phase, r.progressed);
    const Liveness l = ::trainsup::supervisor::CheckLiveness(now, last_hb, r.last_progress_s,
                                                             hb_timeout, progress_timeout);
    if (l.verdict == Liveness::kAlive) continue;
    const ExitClass cls = l.verdict == Liveness::kFrozen ? ExitClass::kFrozen : ExitClass::kHung;
    CaptureAndKill(r, cls, absl::StrCat("rank ", r.rank, " ", l.reason));
  }
}

// --- the worker channel ---------------------------------------------------------------------

absl::Status RunUnit::OnHello(const wv1::Hello& h, std::shared_ptr<WorkerLink> link) {
  const absl::Status reject =
      absl::UnauthenticatedError("unknown run, attempt or rank, or wrong token");
  if (h.attempt() != attempt_.number() || At(h.rank()) == nullptr) {
    return reject;
  }
  RankState& r = *At(h.rank());
  if (!r.alive || r.died_unwatched || !ConstantTimeEquals(r.token, h.token())) return reject;
  // After the token: a stranger learns nothing, a rank of the run learns
  // why it is refused (it exits 64 with the message, and the run fails).
  if (absl::Status v = CheckPeerVersion(Version(), h.version()); !v.ok()) return v;
  if (r.link && r.link != link) r.link->Close(absl::AbortedError("replaced by a new stream"));
  r.link = std::move(link);
  r.last_heartbeat_s = env_.clock->NowS();
  const bool first = !r.heard;
  r.heard = true;
  wv1::SupervisorCommand welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_ms(
      static_cast<int>(cfg().workers.heartbeat_interval_s * 1000));
  r.link->Send(welcome);
  if (r.stop_stage == StopStage::kStopCommand && r.forced &&
      (*r.forced == ExitClass::kCancelled || *r.forced == ExitClass::kStopped)) {
    // A graceful stop asked before the stream (re)connected.
    wv1::SupervisorCommand c;
    c.mutable_stop()->set_deadline_s(static_cast<int>(cfg().workers.stop_deadline_s));
    c.mutable_stop()->set_reason(r.forced_reason);
    r.link->Send(c);
  }
  Log(LogLevel::kInfo,
      absl::StrCat("attempt=", h.attempt(), " rank=", h.rank(), " connected (pid ", h.pid(), ")"));
  if (first && run_.state() == v1::RUN_STATE_STARTING) {
    bool all = true;
    for (const RankState& o : ranks_) all = all && (o.heard || !o.alive);
    if (all) {
      SetState(v1::RUN_STATE_RUNNING, absl::StrCat("attempt ", attempt_.number(), " running"), {});
    }
  }
  return absl::OkStatus();
}

void RunUnit::OnWorkerMessage(int attempt, int rank, const WorkerLink* link,
                              const wv1::WorkerMessage& m) {
  if (attempt != attempt_.number() || At(rank) == nullptr) return;
  RankState& r = *At(rank);
  if (r.link.get() != link || !r.alive) return;
  const double now = env_.clock->NowS();
  if (m.has_heartbeat()) {
    const wv1::Heartbeat& hb = m.heartbeat();
    r.last_heartbeat_s = now;
    if (hb.progress_counter() > r.progress_counter) {
      if (r.progressed) {
        const double per_step = (now - r.last_progress_s) /
                                static_cast<double>(hb.progress_counter() - r.progress_counter);
        ObserveStep(learning_, per_step);
        r.steps_per_s = per_step > 0 ? 1.0 / per_step : 0;
      }
      r.progress_counter = hb.progress_counter();
      r.last_progress_s = now;
      r.progressed = true;
    }
    r.phase = WorkerPhaseFromProto(hb.progress().phase()).value_or(WorkerPhase::kTraining);
    // Failed saves, counted per attempt by the worker.
    const int64_t failed_saves =
        hb.progress().checkpoint_failures() - r.status.progress().checkpoint_failures();
    if (failed_saves > 0) env_.host->CountCheckpointFailures(id(), failed_saves);
    // Steps the guard did not apply, counted per attempt by the worker; one
    // rank's count is the gang's (every rank skips the same steps).
    if (rank == rank_base_) {
      env_.host->CountGuardSteps(
          id(), hb.progress().nonfinite_steps() - r.status.progress().nonfinite_steps(),
          hb.progress().spike_steps() - r.status.progress().spike_steps());
    }
    *r.status.mutable_progress() = hb.progress();
    if (spec_.has_command && hb.progress().total_steps() <= 0) {
      // The program did not say how far it goes: the spec's guess, if any.
      r.status.mutable_progress()->set_total_steps(spec_.command.total_steps);
    }
    r.status.set_last_heartbeat_ms(env_.clock->WallMs());
    StoreBatch b;
    b.what = "progress";
    b.coalescible = true;
    v1::RunEvent progress;
    bool publish_live = false;
    if (rank == rank_base_) {
      *run_.mutable_progress() = r.status.progress();
      progress = Event(v1::EVENT_KIND_PROGRESS, 0, "");
      *progress.mutable_progress() = r.status.progress();
      if (now - last_progress_persist_s_ >= kProgressPersistS) {
        last_progress_persist_s_ = now;
        run_.set_updated_ms(env_.clock->WallMs());
        b.run = run_;
        b.events.push_back(progress);
      } else {
        publish_live = true;
      }
    }
    if (now - r.last_persist_s >= kProgressPersistS) b.ranks.push_back(RankRow(r));
    if (now - learning_saved_s_ >= kProgressPersistS) {
      learning_saved_s_ = now;
      b.learning = RunLearning{learning_.slowest_step_s, learning_.steps_observed};
    }
    if (publish_live) env_.host->Publish(progress);
    if (b.run || !b.ranks.empty() || b.learning) {
      Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
    }
    return;
  }
  if (m.has_event()) {
    const wv1::WorkerEvent& we = m.event();
    v1::RunEvent e = Event(we.kind() == v1::EVENT_KIND_UNSPECIFIED ? v1::EVENT_KIND_LOG : we.kind(),
                           rank, we.message());
    e.set_checkpoint_step(we.checkpoint_step());
    // A CHECKPOINT event with an error reports a failed save (the worker
    // trains on); its step is the newest good checkpoint, unchanged.
    if (we.kind() == v1::EVENT_KIND_CHECKPOINT && we.checkpoint_step() > 0 && we.error().empty()) {
      last_checkpoint_ms_ = env_.clock->WallMs();
      run_.mutable_progress()->set_last_checkpoint_step(we.checkpoint_step());
    }
    StoreBatch b;
    b.what = "worker event";
    b.events.push_back(e);
    Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
    return;
  }
  if (m.has_exit()) {
    ExitFile f;
    f.code = m.exit().code();
    f.reason = m.exit().reason();
    f.message = m.exit().message();
    f.last_step = m.exit().last_step();
    f.first_bad_step = m.exit().first_bad_step();
    r.exit_report = f;
  }
}

void RunUnit::OnLinkClosed(int attempt, int rank, const WorkerLink* link) {
  if (attempt != attempt_.number() || At(rank) == nullptr) return;
  if (At(rank)->link.get() == link) At(rank)->link.reset();
}

bool RunUnit::FillCluster(v1::ClusterStatus* out) const {
  if (!cluster_) return false;
  cluster_->Fill(out);
  return true;
}

void RunUnit::FillLive(v1::Run* out) const {
  if (cluster_) cluster_->Fill(out->mutable_cluster());
  *out->mutable_progress() = run_.progress();
  for (v1::Attempt& a : *out->mutable_attempts()) {
    if (a.number() != attempt_.number()) continue;
    a.clear_ranks();
    for (const RankState& r : ranks_) {
      v1::RankStatus rs = r.status;
      rs.set_rank(r.rank);
      rs.set_pid(r.pid);
      rs.set_slot(r.slot);
      rs.set_gpu(r.gpu);
      rs.set_alive(r.alive);
      *a.add_ranks() = rs;
    }
  }
}

}  // namespace trainsup::supervisor
