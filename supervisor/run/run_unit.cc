#include "supervisor/run/run_unit.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "contracts/run_layout.h"
#include "supervisor/policy/auth.h"
#include "supervisor/policy/command_policy.h"
#include "supervisor/policy/launch_plan.h"
#include "supervisor/policy/run_history.h"

namespace trainsup::supervisor {
namespace {

namespace wv1 = ::trainsup::worker::v1;

// The least time an adopted worker has to reconnect after a daemon restart:
// its reconnect backoff grows to 5 s while no daemon answers.
constexpr double kAdoptReconnectS = 10;
// A failed store write is retried after 0.25 s, doubling up to this.
constexpr double kMaxStoreRetryS = 30;

v1::ExitClass Proto(ExitClass cls) { return static_cast<v1::ExitClass>(ToProto(cls)); }

}  // namespace

bool IsTerminal(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED;
}

std::string StateName(v1::RunState s) {
  std::string name = v1::RunState_Name(s);
  return name.substr(std::string("RUN_STATE_").size());
}

RunUnit::RunUnit(UnitEnv env) : env_(env) {}

RunUnit::RunUnit(v1::Run run, RunSpec spec, int64_t seq, UnitEnv env)
    : env_(env), run_(std::move(run)), spec_(std::move(spec)), seq_(seq) {
  run_.clear_attempts();
}

RunUnit::~RunUnit() {
  life_.reset();
  if (restart_timer_ != 0) env_.timers->Cancel(restart_timer_);
  for (RankState& r : ranks_) {
    if (r.stop_timer != 0) env_.timers->Cancel(r.stop_timer);
  }
}

void RunUnit::Log(LogLevel level, const std::string& line) {
  env_.host->Log(level, absl::StrCat("run=", id(), " ", line));
}

v1::RunEvent RunUnit::Event(v1::EventKind kind, int rank, const std::string& reason) const {
  v1::RunEvent e;
  e.set_run_id(id());
  e.set_time_ms(env_.clock->WallMs());
  e.set_attempt(attempt_.number());
  e.set_state(run_.state());
  e.set_kind(kind);
  e.set_rank(rank);
  e.set_reason(reason);
  return e;
}

bool RunUnit::AnyAlive() const {
  for (const RankState& r : ranks_) {
    if (r.alive) return true;
  }
  return false;
}

// --- persistence ---------------------------------------------------------------------

void RunUnit::Persist(StoreBatch batch, std::function<void(const StoreBatch&)> then) {
  // A progress snapshot still waiting behind the write in flight is
  // replaced by a newer one.
  if (batch.coalescible && writes_.size() >= 2 && writes_.back().batch.coalescible) {
    writes_.back() = PendingWrite{std::move(batch), std::move(then)};
    return;
  }
  writes_.push_back(PendingWrite{std::move(batch), std::move(then)});
  PumpWrites();
}

void RunUnit::PumpWrites() {
  if (write_in_flight_ || writes_.empty()) return;
  write_in_flight_ = true;
  env_.store->Write(
      id(), writes_.front().batch, Guarded([this](absl::Status status, StoreBatch stored) {
        if (!status.ok()) {
          ++write_failures_;
          env_.host->StoreFailed(id(), writes_.front().batch.what, status);
          const double delay =
              std::min(kMaxStoreRetryS, 0.25 * std::pow(2.0, std::min(write_failures_ - 1, 16)));
          // The queue stays held until the retry.
          env_.timers->Start(delay, Guarded([this] {
                               write_in_flight_ = false;
                               PumpWrites();
                             }));
          return;
        }
        write_in_flight_ = false;
        write_failures_ = 0;
        PendingWrite done = std::move(writes_.front());
        writes_.pop_front();
        if (done.then) done.then(stored);
        PumpWrites();
        MaybeFinished();
        if (writes_.empty()) env_.host->Reschedule();
      }));
}

void RunUnit::PublishAll(const StoreBatch& batch) {
  for (const v1::RunEvent& e : batch.events) env_.host->Publish(e);
}

void RunUnit::SetState(v1::RunState state, const std::string& reason, StoreBatch extra,
                       std::function<void()> then) {
  const v1::RunState old = run_.state();
  run_.set_state(state);
  run_.set_reason(reason);
  run_.set_updated_ms(env_.clock->WallMs());
  if ((state == v1::RUN_STATE_PENDING || state == v1::RUN_STATE_RESTARTING) && state != old) {
    queued_since_s_ = env_.clock->NowS();
  }
  if (IsTerminal(state)) run_.set_ended_ms(env_.clock->WallMs());
  v1::RunEvent ev = Event(v1::EVENT_KIND_STATE, -1, reason);
  extra.events.push_back(ev);
  extra.run = run_;
  if (extra.what.empty()) extra.what = absl::StrCat("state ", StateName(state));
  Log(LogLevel::kInfo, absl::StrCat(StateName(old), " -> ", StateName(state), ": ", reason));
  Persist(std::move(extra), [this, then](const StoreBatch& stored) {
    PublishAll(stored);
    ReportToCluster();
    if (then) then();
  });
}

StoreBatch::Rank RunUnit::RankRow(RankState& r) {
  r.status.set_rank(r.rank);
  r.status.set_pid(r.pid);
  r.status.set_slot(r.slot);
  r.status.set_gpu(r.gpu);
  r.status.set_alive(r.alive);
  r.last_persist_s = env_.clock->NowS();
  StoreBatch::Rank row;
  row.attempt = attempt_.number();
  row.status = r.status;
  row.priv = RankPrivate{r.group.pgid, r.group.leader_start_ticks, r.token};
  return row;
}

void RunUnit::MaybeFinished() {
  if (finished_ || !IsTerminal(run_.state()) || AnyAlive() || write_in_flight_ ||
      !writes_.empty()) {
    return;
  }
  finished_ = true;
  env_.host->Finished(id());
}

// --- restore and adoption ---------------------------------------------------------------

std::unique_ptr<RunUnit> RunUnit::Restore(const v1::Run& stored, RunSpec spec, int64_t seq,
                                          const std::vector<RankPrivate>& privs,
                                          const RunLearning& learning, UnitEnv env) {
  std::unique_ptr<RunUnit> u(new RunUnit(env));
  u->run_ = stored;
  u->run_.clear_attempts();
  u->spec_ = std::move(spec);
  u->seq_ = seq;
  u->learning_.slowest_step_s = learning.slowest_step_s;
  u->learning_.steps_observed = learning.steps_observed;
  RunHistory h = RebuildHistory(stored);
  u->history_ = std::move(h.ends);
  u->oom_exits_ = h.oom_exits;
  if (stored.attempts_size() > 0) {
    u->attempt_ = *stored.attempts().rbegin();
    u->attempt_.clear_ranks();
  }
  switch (stored.state()) {
    case v1::RUN_STATE_STARTING:
    case v1::RUN_STATE_RUNNING:
      if (stored.attempts_size() > 0 && stored.attempts().rbegin()->ended_ms() == 0) {
        u->Adopt(*stored.attempts().rbegin(), privs);
      } else {
        u->SetState(v1::RUN_STATE_PENDING, "daemon restarted before the attempt started", {});
      }
      break;
    case v1::RUN_STATE_RESTARTING: {
      const double delay =
          std::max<double>(0, (stored.next_restart_ms() - env.clock->WallMs()) / 1000.0);
      u->not_before_s_ = env.clock->NowS() + delay;
      RunUnit* raw = u.get();
      if (!u->history_.empty() && u->history_.back().cls == ExitClass::kNoSpace) {
        u->waiting_for_space_ = true;
        u->space_backoff_s_ = std::max(delay, 1.0);
        u->restart_timer_ = env.timers->Start(delay, u->Guarded([raw] {
          raw->restart_timer_ = 0;
          raw->WaitForSpace();
        }));
      } else {
        u->restart_timer_ = env.timers->Start(delay, u->Guarded([raw] {
          raw->restart_timer_ = 0;
          raw->env_.host->Reschedule();
        }));
      }
      break;
    }
    default:
      break;
  }
  return u;
}

void RunUnit::Adopt(const v1::Attempt& a, const std::vector<RankPrivate>& privs) {
  const double now = env_.clock->NowS();
  rank_base_ = a.ranks_size() > 0 ? a.ranks(0).rank() : 0;
  int adopted = 0;
  std::vector<int> died;
  for (int i = 0; i < a.ranks_size(); ++i) {
    const v1::RankStatus& rs = a.ranks(i);
    RankState r;
    r.rank = rs.rank();
    r.slot = rs.slot();
    r.gpu = rs.gpu();
    r.pid = rs.pid();
    r.status = rs;
    r.launched_s = now;
    if (i < static_cast<int>(privs.size())) {
      r.group.pgid = privs[i].pgid;
      r.group.leader_start_ticks = privs[i].start_ticks;
      r.token = privs[i].token;
    }
    r.own_child = false;
    r.alive =
        rs.alive() && r.pid > 0 && env_.launcher->IsSameProcess(r.pid, r.group.leader_start_ticks);
    r.group.known_alive_ticks = env_.clock->BootTicks();
    if (!r.alive && rs.alive()) {
      // Died while no daemon was watching: classified from its exit file.
      r.died_unwatched = true;
      r.group.known_alive_ticks =
          rs.last_heartbeat_ms() > 0 ? env_.clock->BootTicksAt(rs.last_heartbeat_ms()) : 0;
      r.alive = true;
      died.push_back(r.rank);
    } else if (r.alive) {
      adopted++;
    }
    // A fresh heartbeat timeout to reconnect in, at least kAdoptReconnectS.
    r.last_heartbeat_s = now + std::max(0.0, kAdoptReconnectS - cfg().workers.heartbeat_timeout_s);
    r.last_progress_s = now;
    r.heard = true;
    r.progressed = true;
    ranks_.push_back(std::move(r));
    slots_.push_back(ranks_.back().slot);
  }
  const std::string note = absl::StrCat("daemon restarted: adopted ", adopted, " of ",
                                        a.ranks_size(), " workers of attempt ", a.number());
  Log(LogLevel::kInfo, note);
  StoreBatch b;
  b.what = "adoption";
  b.events.push_back(Event(v1::EVENT_KIND_LOG, -1, note));
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
  const int number = a.number();
  for (RankState& r : ranks_) {
    if (r.alive && !r.died_unwatched) {
      env_.launcher->WatchExit(id(), number, r.rank, r.pid, r.group.leader_start_ticks, false);
    }
  }
  for (int rank : died) {
    env_.timers->Start(0, Guarded([this, number, rank] { OnProcessExit(number, rank); }));
  }
  if (Clustered() && EnsureCluster()) {
    // Not adopted: while no daemon held this node's lease the job may have
    // moved on without it, and its peers may be gone. The job restarts
    // together (the generation moves when they end).
    for (RankState& r : ranks_) {
      if (r.alive && !r.died_unwatched) {
        StopRank(r, ExitClass::kGang,
                 "daemon restarted: the ranks of a multi-node attempt are not adopted; the job "
                 "restarts together",
                 /*graceful=*/false);
      }
    }
  }
  if (!AnyAlive()) env_.timers->Start(0, Guarded([this] { EndAttempt(); }));
}

// --- starting an attempt ----------------------------------------------------------------

void RunUnit::Start(const std::vector<int>& slots, const std::vector<std::string>& gpus) {
  slots_ = slots;
  gpus_ = gpus;
  preparing_ = true;
  const std::string dir = run_.run_dir();
  const bool shared = Clustered();
  const std::string shared_dir = spec_.cluster.checkpoint_dir;
  const int64_t before = RollbackBefore();
  auto done = Guarded([this, before](ResumeChoice c) {
    NoteRollbackResume(before, c.step);
    OnPrepared(std::move(c));
  });
  env_.timers->OffLoop([dir, shared, shared_dir, before, done]() mutable -> std::function<void()> {
    ResumeChoice c = shared ? ChooseResumeShared(dir, shared_dir) : ChooseResume(dir, before);
    return [done, c]() mutable { done(std::move(c)); };
  });
}

void RunUnit::ReleaseSlots() {
  for (int slot : slots_) env_.host->ReleaseSlot(slot, GroupIdentity{});
}

bool RunUnit::StoppedBeforeStart() {
  if (cancel_) {
    ReleaseSlots();
    SetState(v1::RUN_STATE_CANCELLED, cancel_reason_, {}, [this] { MaybeFinished(); });
    return true;
  }
  if (env_.host->shutting_down()) {
    ReleaseSlots();
    return true;
  }
  return false;
}

void RunUnit::PrepareAgainLater(const std::string& why) {
  ReleaseSlots();
  ++prepare_failures_;
  const double delay =
      std::min(cfg().restart.max_backoff_s, std::max(1.0, cfg().restart.initial_backoff_s) *
                                                std::pow(2.0, prepare_failures_ - 1));
  const std::string reason = absl::StrCat(why, "; retrying in ", delay, " s");
  Log(LogLevel::kWarn, reason);
  not_before_s_ = env_.clock->NowS() + delay;
  StoreBatch b;
  b.what = "checkpoint choice failed";
  b.events.push_back(Event(v1::EVENT_KIND_CHECKPOINT, -1, reason));
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
  restart_timer_ = env_.timers->Start(delay, Guarded([this] {
                                        restart_timer_ = 0;
                                        env_.host->Reschedule();
                                      }));
}

void RunUnit::OnPrepared(ResumeChoice c) {
  preparing_ = false;
  if (StoppedBeforeStart()) return;
  if (c.fatal) {
    // The shared store's owner record is garbage: no retry mends that.
    ReleaseSlots();
    SetState(v1::RUN_STATE_FAILED, std::string(c.error.message()), {}, [this] { MaybeFinished(); });
    return;
  }
  if (!c.error.ok()) {
    // An I/O error is not a verdict on the checkpoints: no attempt, no
    // quarantine, try again after a backoff.
    PrepareAgainLater(absl::StrCat("cannot read the checkpoints to choose one to resume from: ",
                                   c.error.message()));
    return;
  }
  // A multi-node run's count goes on until it agrees with the job
  // (OnAgreement): a shared store this node does not see is retried with it.
  if (!Clustered()) prepare_failures_ = 0;
  if (Clustered()) {
    if (!EnsureCluster()) {
      ReleaseSlots();
      return;
    }
    std::vector<int64_t> steps;
    for (const auto& [step, dir] : c.loadable) steps.push_back(step);
    joining_ = true;
    joined_s_ = env_.clock->NowS();
    cluster_->Join(
        attempt_.number() + 1, std::move(steps), c.owner, env_.host->FreePort(),
        Guarded([this, c](absl::StatusOr<Agreement> a) { OnAgreement(c, std::move(a)); }));
    return;
  }
  StartAttempt(std::move(c));
}

void RunUnit::StartAttempt(ResumeChoice c, int64_t generation) {
  const int number = attempt_.number() + 1;
  const int previous = attempt_.world_size();  // 0: none, or stored before elastic gangs
  attempt_ = v1::Attempt();
  attempt_.set_number(number);
  attempt_.set_started_ms(env_.clock->WallMs());
  attempt_.set_resumed_from_step(c.step);
  attempt_.set_resumed_from(c.dir);
  attempt_.set_generation(generation);
  if (grow_pending_.first != generation) grow_pending_ = {0, ""};
  const int world = Clustered() ? (cluster_world_ > 0 ? cluster_world_ : run_.world_size())
                                : static_cast<int>(slots_.size());
  attempt_.set_world_size(world);
  ranks_.clear();
  ends_seen_ = 0;
  diverged_at_ = diverged_through_ = -1;
  diverged_seen_.clear();
  StoreBatch b;
  b.what = absl::StrCat("attempt ", number, " started");
  b.attempts.push_back(attempt_);
  for (const std::string& note : c.notes) {
    b.events.push_back(Event(v1::EVENT_KIND_CHECKPOINT, -1, note));
  }
  AddResizeEvent(b, previous, world);
  v1::RunEvent started = Event(v1::EVENT_KIND_ATTEMPT_STARTED, -1,
                               c.step >= 0 ? absl::StrCat("resumed from ", c.dir) : "from scratch");
  started.set_checkpoint_step(c.step);
  b.events.push_back(started);
  launching_ = true;
  SetState(v1::RUN_STATE_STARTING,
           c.step >= 0 ? absl::StrCat("attempt ", number, " resuming from step ", c.step)
                       : absl::StrCat("attempt ", number, " starting from scratch"),
           std::move(b), [this] { LaunchRanks(); });
}

void RunUnit::NotStarted(RankState& r, bool stop, const std::string& failure) {
  // Its end is seen now, the failed launch before the ranks it kept from
  // starting.
  r.end_order = ++ends_seen_;
  if (stop) {
    r.forced = cancel_ ? ExitClass::kCancelled : ExitClass::kStopped;
    r.status.set_exit_class(Proto(*r.forced));
    r.status.set_exit_reason(cancel_ ? "not started: " + cancel_reason_
                                     : "not started: daemon shutting down");
  } else {
    r.status.set_exit_class(Proto(ExitClass::kCrash));
    r.status.set_exit_reason(!failure.empty() ? failure
                                              : "not started: another rank failed to start");
  }
}

// Checked again at launch: a reload may have taken the program off the
// allowlist, or a variable off commands.allow_env, since the submit.
absl::StatusOr<std::string> RunUnit::AllowedCommand() const {
  const std::string& argv0 = spec_.command.argv[0];
  absl::StatusOr<std::string> program = AllowedProgram(argv0, cfg().commands);
  absl::Status s =
      program.ok() ? CheckCommandEnv(spec_.command.env, cfg().commands) : program.status();
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat("cannot start ", argv0, ": ", s.message()));
  return program;
}

void RunUnit::LaunchRanks() {
  launching_ = false;
  const int number = attempt_.number();
  const bool stop = cancel_ || env_.host->shutting_down();
  if (stop) shutdown_stop_ = shutdown_stop_ || !cancel_;
  const int port = Clustered() ? master_port_ : env_.host->FreePort();
  const int64_t budget = LoweredMemoryBudgetMb(spec_.train.memory_budget_mb, oom_exits_,
                                               cfg().restart.oom_budget_factor);
  const std::map<std::string, std::string> daemon_env = env_.host->DaemonEnvironment();
  std::string binary = env_.host->WorkerBinary();
  bool failed = false;
  size_t failed_rank = 0;
  std::string failure;
  if (spec_.has_command) {
    absl::StatusOr<std::string> program = AllowedCommand();
    if (program.ok()) {
      binary = *program;
    } else {
      binary = spec_.command.argv[0];
      failed = true;
      failure = std::string(program.status().message());
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    RankState r;
    r.rank = rank_base_ + static_cast<int>(i);
    r.slot = slots_[i];
    r.gpu = i < gpus_.size() ? gpus_[i] : "";
    r.token = env_.host->NewSecret(32);
    WorkerLaunch w;
    w.binary = binary;
    w.run_id = id();
    w.run_dir = run_.run_dir();
    w.attempt = number;
    w.rank = r.rank;
    w.world_size = attempt_.world_size() > 0 ? attempt_.world_size() : run_.world_size();
    w.local_rank = static_cast<int>(i);
    w.local_world_size = static_cast<int>(slots_.size());
    if (!master_addr_.empty()) w.master_addr = master_addr_;
    if (Clustered()) w.node_addr = cfg().cluster.advertise_addr;
    w.supervisor_endpoint = env_.host->SupervisorEndpoint();
    w.resume_step = attempt_.resumed_from_step();
    w.token = r.token;
    w.gpu = r.gpu;
    w.master_port = port;
    w.memory_budget_mb = budget;
    w.skip_windows = SkipWindowsText();
    w.lr_factor = LearningRateFactor();
    w.data_roots = cfg().daemon.data_roots;
    w.daemon_env = daemon_env;
    if (spec_.has_command) {
      w.command = &spec_.command;
      w.program = binary;
      w.resume_dir = attempt_.resumed_from();
    }
    const LaunchSpec spec = BuildWorkerLaunch(w);
    r.status.set_log_path(spec.log_path);
    r.status.set_exit_code(-1);
    r.launched_s = env_.clock->NowS();
    r.last_progress_s = r.launched_s;
    if (!failed && !stop) {
      absl::StatusOr<LaunchedProcess> p = env_.launcher->Launch(spec);
      if (p.ok()) {
        r.pid = p->pid;
        r.group = GroupIdentity{p->pgid, p->start_ticks, env_.clock->BootTicks()};
        r.own_child = true;
        r.alive = true;
        Log(LogLevel::kInfo,
            absl::StrCat("attempt=", number, " rank=", r.rank, " started pid ", r.pid, " on slot ",
                         r.slot,
                         w.resume_step >= 0 ? absl::StrCat(" from step ", w.resume_step) : ""));
      } else {
        failed = true;
        failed_rank = i;
        failure = absl::StrCat("cannot start ", binary, ": ", p.status().message());
      }
    }
    if (!r.alive) NotStarted(r, stop, i == failed_rank ? failure : "");
    ranks_.push_back(std::move(r));
  }
  StoreBatch b;
  b.what = absl::StrCat("attempt ", number, " ranks");
  for (RankState& r : ranks_) b.ranks.push_back(RankRow(r));
  Persist(std::move(b), nullptr);
  for (RankState& r : ranks_) {
    if (r.alive) {
      env_.launcher->WatchExit(id(), number, r.rank, r.pid, r.group.leader_start_ticks, true);
    } else {
      env_.host->ReleaseSlot(r.slot, GroupIdentity{});
    }
  }
  if (failed) {
    Log(LogLevel::kError, absl::StrCat("attempt=", number, " ", failure));
    for (RankState& r : ranks_) {
      if (r.alive) StopRank(r, ExitClass::kGang, failure, /*graceful=*/false);
    }
  }
  if (!AnyAlive()) {
    EndAttempt();
    return;
  }
  ApplyPendingGrow();
  if (!Heartbeats() && !failed && run_.state() == v1::RUN_STATE_STARTING) {
    // No Hello will come: running once its processes are.
    SetState(v1::RUN_STATE_RUNNING, absl::StrCat("attempt ", number, " running"), {});
  }
}

// --- ends ---------------------------------------------------------------------------------

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
  if (end.cls == ExitClass::kDiverged) NoteDiverged(r, f.report);
  if (r.end_order < 0) r.end_order = r.died_unwatched ? 0 : ++ends_seen_;
  // The exit report is newer than any heartbeat (a short run may never have
  // sent one): what clients read ends at the step the worker reached.
  if (f.report && f.report->last_step > r.status.progress().step()) {
    r.status.mutable_progress()->set_step(f.report->last_step);
    if (rank == rank_base_) run_.mutable_progress()->set_step(f.report->last_step);
  }
  r.alive = false;
  if (r.stop_timer != 0) env_.timers->Cancel(r.stop_timer);
  r.stop_timer = 0;
  if (!r.died_unwatched) env_.launcher->UnwatchExit(id(), attempt, rank);
  r.status.set_exit_code(end.exited ? end.code : -1);
  r.status.set_signal(end.signal);
  r.status.set_exit_class(Proto(end.cls));
  r.status.set_exit_reason(end.reason);
  env_.host->CountWorkerExit(ToString(end.cls));
  env_.host->RemoveWorkerMetrics(id(), rank);
  Log(LogLevel::kInfo,
      absl::StrCat("attempt=", attempt, " rank=", rank, " pid ", r.pid, " ended: ", end.reason));
  v1::RunEvent e = Event(v1::EVENT_KIND_WORKER_EXIT, rank, end.reason);
  e.set_exit_class(Proto(end.cls));
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
      e.stop_requested = resize_stop_;
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
  const bool stop_requested = cancel_ || shutdown_stop_ || resize_stop_;
  const bool resized = resize_stop_;
  resize_stop_ = false;
  attempt_.set_ended_ms(env_.clock->WallMs());
  attempt_.set_exit_class(Proto(o.cls));
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
  ended.set_exit_class(Proto(o.cls));
  b.events.push_back(ended);
  if (cancel_) {
    SetState(v1::RUN_STATE_CANCELLED, cancel_reason_, std::move(b), [this] { MaybeFinished(); });
    return;
  }
  if (shutdown_stop_ && o.cls != ExitClass::kSuccess) {
    SetState(v1::RUN_STATE_PENDING, "daemon shut down; the run resumes when it starts again",
             std::move(b));
    return;
  }
  if (resized && o.cls != ExitClass::kSuccess && !cluster_) {
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
  const RestartDecision d = DecideRestart(Policy(), history_, env_.host->JitterUnit());
  if (d.rollback) AddRollbackWindow(b, d);
  ApplyDecision(std::move(b), o.cls, d);
}

void RunUnit::ApplyDecision(StoreBatch b, ExitClass cls, const RestartDecision& d,
                            int64_t restarts) {
  switch (d.action) {
    case Action::kSucceed:
      SetState(v1::RUN_STATE_SUCCEEDED, "every rank completed", std::move(b),
               [this] { MaybeFinished(); });
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
  restart.set_exit_class(Proto(cls));
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
