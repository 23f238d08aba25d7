// The run unit's side of a multi-node job (spec.cluster): its rendezvous
// before each attempt, stopping its ranks when the job moves on, its status
// for the other nodes. The coordination itself is UnitCluster's
// (cluster.h); docs/distributed.md has the protocol.
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {

bool RunUnit::EnsureCluster(bool fail_run) {
  if (cluster_) return true;
  ClusterEvents events;
  events.moved = Guarded([this](int64_t generation, const std::string& reason, bool grow) {
    OnClusterMoved(generation, reason, grow);
  });
  events.note =
      Guarded([this](LogLevel level, const std::string& line) { OnClusterNote(level, line); });
  events.submission = Guarded([this](const std::string& id, const std::string& replaced) {
    OnClusterSubmission(id, replaced);
  });
  events.grow = Guarded(
      [this](int64_t generation, const std::string& reason) { OnClusterGrow(generation, reason); });
  absl::StatusOr<std::unique_ptr<UnitCluster>> c =
      env_.host->JoinCluster(run_, spec_, std::move(events));
  if (!c.ok()) {
    const std::string why =
        absl::StrCat("cannot coordinate with the job's other nodes: ", c.status().message());
    if (fail_run) {
      SetState(v1::RUN_STATE_FAILED, why, {}, [this] { MaybeFinished(); });
    } else {
      Log(LogLevel::kWarn, why);
    }
    return false;
  }
  cluster_ = std::move(*c);
  return true;
}

void RunUnit::OnClusterNote(LogLevel level, const std::string& line) {
  const std::string text = absl::StrCat("job ", spec_.cluster.job, ": ", line);
  Log(level, text);
  StoreBatch b;
  b.what = "cluster note";
  b.events.push_back(Event(v1::EVENT_KIND_LOG, -1, text));
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
}

void RunUnit::OnClusterSubmission(const std::string& id, const std::string& replaced) {
  if (run_.cluster_submission() == id) return;
  run_.set_cluster_submission(id);
  StoreBatch b;
  b.what = "cluster submission";
  b.run = run_;
  b.events.push_back(
      Event(v1::EVENT_KIND_LOG, -1,
            absl::StrCat("job ", spec_.cluster.job, ": this run belongs to its submission ", id,
                         replaced.empty() ? std::string()
                                          : absl::StrCat(", a new job in place of ", replaced))));
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
}

void RunUnit::OnClusterGrow(int64_t generation, const std::string& reason) {
  if (IsTerminal(run_.state()) || cancel_) return;
  if (!AnyAlive() || attempt_.generation() != generation) {
    // Agreed but not running yet (claiming the store, launching):
    // LaunchRanks stops the ranks of that generation once they run.
    grow_pending_ = {generation, reason};
    return;
  }
  // The gang checkpoints and stops (every node's ranks agree on the
  // step); the verdict on this attempt moves the job on, and the run
  // joins the next generation at once.
  Resize(reason);
}

void RunUnit::ApplyPendingGrow() {
  if (grow_pending_.first == 0) return;
  // Told to take a node in before the ranks of this generation ran.
  auto [generation, reason] = std::exchange(grow_pending_, {0, ""});
  if (generation == attempt_.generation()) Resize(reason);
}

void RunUnit::FollowClusterVerdict(StoreBatch b, const AttemptEnd& end, ExitClass cls) {
  // One decision for the whole job (docs/distributed.md): the node that
  // moved the generation made it; this node follows.
  cluster_->Verdict(
      attempt_.generation(), end, Guarded([this, b, cls](ClusterVerdict v) mutable {
        if (IsTerminal(run_.state())) return;
        if (cancel_ || v.kind == ClusterVerdict::Kind::kCancel) {
          SetState(v1::RUN_STATE_CANCELLED, cancel_ ? cancel_reason_ : v.reason, std::move(b),
                   [this] { MaybeFinished(); });
          return;
        }
        if (v.kind == ClusterVerdict::Kind::kRestart && v.grow) {
          // Taking a rejoining node in: queued again at once, no restart
          // counted, no backoff.
          resize_reason_ = v.reason;
          RequeueNow(std::move(b), absl::StrCat("job generation ", v.generation, ": ", v.reason));
          return;
        }
        RestartDecision d;
        d.action = v.kind == ClusterVerdict::Kind::kRestart ? Action::kRestart : Action::kFail;
        d.delay_s = v.delay_s;
        d.reason = absl::StrCat("job generation ", v.generation, ": ", v.reason);
        d.oom = cls == ExitClass::kOom;
        ApplyDecision(std::move(b), cls, d, v.restarts);
      }));
}

void RunUnit::OnClusterMoved(int64_t generation, const std::string& reason, bool grow) {
  const int64_t mine = attempt_.generation();
  if (mine == 0 || generation <= mine) return;
  if (grow && AnyAlive()) {
    // Another member stopped first and moved the job on to take a node in:
    // this node's ranks stop at the same checkpoint.
    if (!resize_stop_) Resize(reason);
    return;
  }
  bool stopping = false;
  for (RankState& r : ranks_) {
    if (!r.alive || r.stop_stage != StopStage::kNone) continue;
    stopping = true;
    StopRank(r, ExitClass::kGang,
             absl::StrCat("the job moved to generation ", generation, ": ", reason),
             /*graceful=*/false);
  }
  if (stopping) {
    OnClusterNote(LogLevel::kInfo,
                  absl::StrCat("generation ", generation, ": ", reason,
                               "; stopping this node's ranks of generation ", mine));
  }
}

void RunUnit::OnAgreement(ResumeChoice c, absl::StatusOr<Agreement> a) {
  // Cancelled while it waited: the run has ended already (Cancel).
  if (IsTerminal(run_.state())) return;
  joining_ = false;
  if (StoppedBeforeStart()) return;
  if (!a.ok() && a.status().code() == absl::StatusCode::kUnavailable) {
    PrepareAgainLater(std::string(a.status().message()));
    return;
  }
  if (!a.ok() && a.status().code() == absl::StatusCode::kAborted) {
    // The job moved on to take this node in: prepare again at once, so
    // that the join lists the checkpoint the others stopped at.
    ReleaseSlots();
    OnClusterNote(LogLevel::kInfo, std::string(a.status().message()));
    env_.host->Reschedule();
    return;
  }
  if (a.ok()) prepare_failures_ = 0;
  if (a.ok() && a->finished) {
    // Left out of the job's last generation, which its members finished.
    ReleaseSlots();
    SetState(v1::RUN_STATE_SUCCEEDED,
             absl::StrCat("job ", spec_.cluster.job,
                          " finished while this node was left out of "
                          "generation ",
                          a->generation, " (", absl::StrJoin(a->nodes, ", "), " succeeded)"),
             {}, [this] { MaybeFinished(); });
    return;
  }
  if (!a.ok()) {
    ReleaseSlots();
    if (a.status().code() == absl::StatusCode::kCancelled) {
      SetState(v1::RUN_STATE_CANCELLED, std::string(a.status().message()), {},
               [this] { MaybeFinished(); });
    } else {
      SetState(v1::RUN_STATE_FAILED, std::string(a.status().message()), {},
               [this] { MaybeFinished(); });
    }
    return;
  }
  c.step = -1;
  c.dir.clear();
  for (const auto& [step, dir] : c.loadable) {
    if (step == a->resume_step) {
      c.step = step;
      c.dir = dir;
    }
  }
  if (a->resume_step >= 0 && c.step < 0) {
    // Every node verified it, this one included: not listed means the
    // store changed under us. Prepare again.
    ReleaseSlots();
    not_before_s_ = env_.clock->NowS() + 1;
    restart_timer_ = env_.timers->Start(1, Guarded([this] {
                                          restart_timer_ = 0;
                                          env_.host->Reschedule();
                                        }));
    return;
  }
  rank_base_ = a->node_rank * static_cast<int>(spec_.cluster.ranks_per_node);
  cluster_world_ = static_cast<int>(a->nodes.size() * spec_.cluster.ranks_per_node);
  if (!a->resize.empty()) resize_reason_ = a->resize;
  master_addr_ = a->master_addr;
  master_port_ = a->master_port;
  c.notes.push_back(absl::StrCat(
      "job ", spec_.cluster.job, " generation ", a->generation, ": node rank ", a->node_rank,
      " of ", a->nodes.size(), " (", absl::StrJoin(a->nodes, ", "), "), ranks ", rank_base_, "..",
      rank_base_ + spec_.cluster.ranks_per_node - 1, ", MASTER ", master_addr_, ":", master_port_,
      a->resume_step >= 0 ? absl::StrCat(", resuming from step ", a->resume_step)
                          : std::string(", from scratch"),
      cluster_world_ < run_.world_size()
          ? absl::StrCat("; world size ", cluster_world_, " of ", run_.world_size(), " (",
                         a->resize.empty() ? std::string("fewer nodes") : a->resize, ")")
          : std::string()));
  if (!a->claim || a->node_rank != 0) {
    StartAttempt(std::move(c), a->generation);
    return;
  }
  // No node found an owner record: node 0, whose rank 0 writes the
  // checkpoints, claims the store for this submission first.
  preparing_ = true;
  const std::string dir = spec_.cluster.checkpoint_dir;
  const ckpt::StoreOwner owner{spec_.cluster.job, a->submission};
  const int64_t generation = a->generation;
  auto claimed = Guarded([this, c, generation, dir](absl::Status s) mutable {
    preparing_ = false;
    if (StoppedBeforeStart()) return;
    c.notes.push_back(
        s.ok() ? absl::StrCat("claimed ", dir, " for this submission (", ckpt::kOwnerFileName, ")")
               : absl::StrCat("cannot write ", ckpt::kOwnerFileName, " in ", dir, ": ", s.message(),
                              "; starting without it"));
    StartAttempt(std::move(c), generation);
  });
  env_.timers->OffLoop([dir, owner, claimed]() mutable -> std::function<void()> {
    absl::Status s = ckpt::WriteStoreOwner(dir, owner);
    return [claimed, s]() mutable { claimed(s); };
  });
}

std::optional<JoiningRun> RunUnit::Joining() const {
  if (!joining_ || !cluster_) return std::nullopt;
  return JoiningRun{id(),      run_.priority(), spec_.cluster.job, static_cast<int>(slots_.size()),
                    joined_s_, yielding_};
}

void RunUnit::YieldSlots(const std::string& to_job) {
  if (!joining_ || yielding_ || !cluster_) return;
  yielding_ = true;
  const double waited = env_.clock->NowS() - joined_s_;
  cluster_->Withdraw(Guarded([this, to_job, waited](bool out) {
    yielding_ = false;
    // Not out: the rendezvous completed (OnAgreement starts the attempt),
    // or may yet; the scheduler asks again. Cancelled meanwhile: the slots
    // went back with the cancel.
    if (!out || !joining_ || IsTerminal(run_.state())) return;
    joining_ = false;
    ReleaseSlots();
    OnClusterNote(
        LogLevel::kInfo,
        absl::StrCat("gave its slot", slots_.size() == 1 ? "" : "s", " to job ", to_job,
                     ", which orders first and waits for ", slots_.size() == 1 ? "it" : "them",
                     ", after waiting ", absl::StrFormat("%.0f", waited),
                     " s in the rendezvous; queued again (docs/distributed.md, "
                     "\"Competing jobs\")"));
    env_.host->Reschedule();
  }));
}

void RunUnit::ReportToCluster(bool final) {
  if (!cluster_) return;
  v1::ClusterNode n;
  n.set_state(run_.state());
  n.set_reason(run_.reason());
  for (const RankState& r : ranks_) {
    v1::RankStatus rs = r.status;
    rs.set_rank(r.rank);
    rs.set_pid(r.pid);
    rs.set_alive(r.alive);
    rs.clear_log_path();
    *n.add_ranks() = rs;
  }
  cluster_->Report(n, final || IsTerminal(run_.state()));
}

}  // namespace trainsup::supervisor
