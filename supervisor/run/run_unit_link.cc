// The run unit's side of the worker channel (Hello, heartbeats, exit
// reports, the stream's end) and the liveness checks on what it hears.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "contracts/version.h"
#include "supervisor/policy/auth.h"
#include "supervisor/policy/from_config.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {
namespace {

namespace wv1 = ::trainsup::worker::v1;

// Progress is streamed live on every heartbeat but stored at most this often.
constexpr double kProgressPersistS = 30;

}  // namespace

void RunUnit::RequestCheckpoint(double timeout_s, CheckpointDone done) {
  if (run_.state() != v1::RUN_STATE_RUNNING) {
    return done(-1, absl::StrCat("the run is ", StateName(run_.state()),
                                 ": no worker to write a checkpoint"));
  }
  wv1::SupervisorCommand c;
  c.mutable_checkpoint_now();
  int sent = 0;
  int64_t after = 0;
  for (RankState& r : ranks_) {
    if (!r.alive || !r.link) continue;
    r.link->Send(c);
    ++sent;
    after = std::max(after, r.status.progress().step());
  }
  if (sent == 0) {
    return done(-1, "no worker of the run is connected to the daemon yet (it is starting)");
  }
  checkpoint_requests_.push_back({std::move(done), after, env_.clock->NowS() + timeout_s});
}

void RunUnit::AnswerCheckpointRequests(const std::function<bool(const CheckpointRequest&)>& pick,
                                       int64_t step, const std::string& error) {
  std::vector<CheckpointRequest> waiting;
  std::vector<CheckpointRequest> answered;
  for (CheckpointRequest& q : checkpoint_requests_) {
    (pick(q) ? answered : waiting).push_back(std::move(q));
  }
  checkpoint_requests_ = std::move(waiting);
  for (CheckpointRequest& q : answered) q.done(step, error);
}

void RunUnit::CheckpointCommitted(int64_t last_checkpoint_step) {
  AnswerCheckpointRequests(
      [&](const CheckpointRequest& q) { return last_checkpoint_step >= q.after_step; },
      last_checkpoint_step, "");
}

void RunUnit::FailCheckpointRequests(int64_t step, const std::string& error) {
  AnswerCheckpointRequests([](const CheckpointRequest&) { return true; }, step, error);
}

void RunUnit::CheckLiveness() {
  const double now = env_.clock->NowS();
  AnswerCheckpointRequests([now](const CheckpointRequest& q) { return now >= q.deadline_s; }, -1,
                           "no checkpoint committed within the request's timeout");
  JudgeStragglers(now);
  ReportToCluster();
  // Judged by their exit codes only.
  if (!Heartbeats()) return;
  const ProgressTimeoutConfig tcfg = ProgressTimeoutFrom(cfg().progress);
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
      ObserveStepCompute(rank, now, hb.progress().step_compute_seconds());
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
    if (!checkpoint_requests_.empty() && hb.progress().last_checkpoint_step() >= 0) {
      CheckpointCommitted(hb.progress().last_checkpoint_step());
    }
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
  if (m.has_event()) return OnWorkerEvent(rank, m.event());
  if (m.has_exit()) {
    ExitFile f;
    f.code = m.exit().code();
    f.reason = m.exit().reason();
    f.message = m.exit().message();
    f.last_step = m.exit().last_step();
    f.first_bad_step = m.exit().first_bad_step();
    if (m.exit().has_tally()) f.tally = TallyFromProto(m.exit().tally());
    r.exit_report = f;
  }
}

void RunUnit::OnWorkerEvent(int rank, const wv1::WorkerEvent& we) {
  v1::RunEvent e = Event(we.kind() == v1::EVENT_KIND_UNSPECIFIED ? v1::EVENT_KIND_LOG : we.kind(),
                         rank, we.message());
  e.set_checkpoint_step(we.checkpoint_step());
  // A CHECKPOINT event with an error reports a failed save (the worker
  // trains on); its step is the newest good checkpoint, unchanged.
  if (we.kind() == v1::EVENT_KIND_CHECKPOINT && we.checkpoint_step() > 0 && we.error().empty()) {
    last_checkpoint_ms_ = env_.clock->WallMs();
    run_.mutable_progress()->set_last_checkpoint_step(we.checkpoint_step());
    CheckpointCommitted(we.checkpoint_step());
  } else if (we.kind() == v1::EVENT_KIND_CHECKPOINT && !we.error().empty()) {
    FailCheckpointRequests(we.checkpoint_step(), absl::StrCat("the save of checkpoint step-",
                                                              we.step(), " failed: ", we.error()));
  }
  StoreBatch b;
  b.what = "worker event";
  b.events.push_back(e);
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
}

void RunUnit::ObserveStepCompute(int rank, double now_s, double compute_s) {
  const DistributedSpec& d = spec_.distributed;
  if (d.straggler_factor <= 0 || ranks_.size() < 2 || compute_s <= 0) return;
  if (!stragglers_) {
    stragglers_ = std::make_unique<StragglerDetector>(d.straggler_factor, d.straggler_window_s);
  }
  stragglers_->Observe(rank, now_s, compute_s);
}

void RunUnit::JudgeStragglers(double now_s) {
  if (!stragglers_) return;
  for (const StragglerDetector::Change& c : stragglers_->Judge(now_s)) {
    const RankState* r = At(c.rank);
    if (r == nullptr) continue;
    const std::string where =
        absl::StrCat("rank ", c.rank, " on slot ", r->slot, r->gpu.empty() ? "" : " (GPU ", r->gpu,
                     r->gpu.empty() ? "" : ")");
    const std::string line =
        c.straggler ? absl::StrFormat(
                          "%s is a straggler: step compute %.3g s, %.2g times the other "
                          "ranks' median (%.3g s) over %g s",
                          where, c.median_s, c.median_s / c.others_s, c.others_s,
                          spec_.distributed.straggler_window_s)
                    : absl::StrFormat(
                          "%s is no longer a straggler: step compute %.3g s against the "
                          "other ranks' %.3g s",
                          where, c.median_s, c.others_s);
    Log(c.straggler ? LogLevel::kWarn : LogLevel::kInfo, line);
    StoreBatch b;
    b.what = "straggler";
    b.events.push_back(Event(v1::EVENT_KIND_STRAGGLER, c.rank, line));
    Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
  }
  for (RankState& r : ranks_) {
    r.status.set_window_compute_seconds(stragglers_->median_s(r.rank));
    r.status.set_straggler_ratio(stragglers_->ratio(r.rank));
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
