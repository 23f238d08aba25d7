// Starting an attempt: slots handed over, the checkpoint to resume chosen
// off the loop (resume_choice.h), the command checked, the ranks launched.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "supervisor/policy/command_policy.h"
#include "supervisor/policy/launch_plan.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {

void RunUnit::Start(const std::vector<int>& slots, const std::vector<std::string>& gpus) {
  slots_ = slots;
  gpus_ = gpus;
  preparing_ = true;
  const std::string dir = run_.run_dir();
  const bool shared = Clustered();
  const std::string shared_dir = spec_.cluster.checkpoint_dir;
  const int64_t before = RollbackBefore();
  const ckpt::QuarantineRetention quarantine{static_cast<int>(cfg().checkpoints.quarantine_keep),
                                             cfg().checkpoints.quarantine_min_age_s};
  auto done = Guarded([this, before](ResumeChoice c) {
    NoteRollbackResume(before, c.step);
    OnPrepared(std::move(c));
  });
  env_.timers->OffLoop(
      [dir, shared, shared_dir, before, quarantine, done]() mutable -> std::function<void()> {
        ResumeChoice c =
            shared ? ChooseResumeShared(dir, shared_dir) : ChooseResume(dir, before, quarantine);
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
  if (!resize_before_start_.empty() && !Clustered()) {
    // A slot of this placement was drained while the attempt was prepared:
    // placed again on what is usable, nothing started on the drained one.
    ReleaseSlots();
    resize_reason_ = std::exchange(resize_before_start_, "");
    RequeueNow({}, absl::StrCat("resizing the gang before it started: ", resize_reason_));
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
    r.status.set_exit_class(ExitClassProto(*r.forced));
    r.status.set_exit_reason(cancel_        ? "not started: " + cancel_reason_
                             : resize_stop_ ? "not started: resizing the gang: " + resize_reason_
                                            : "not started: daemon shutting down");
  } else {
    r.status.set_exit_class(ExitClassProto(ExitClass::kCrash));
    r.status.set_exit_reason(!failure.empty() ? failure
                                              : "not started: another rank failed to start");
  }
}

// Checked again at launch: a reload may have taken the program off the
// allowlist, or a variable off commands.allow_env, since the submit.
absl::StatusOr<CheckedProgram> RunUnit::AllowedCommand() const {
  const std::string& argv0 = spec_.command.argv[0];
  absl::StatusOr<CheckedProgram> program = AllowedProgram(argv0, cfg().commands);
  absl::Status s =
      program.ok() ? CheckCommandEnv(spec_.command.env, cfg().commands) : program.status();
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat("cannot start ", argv0, ": ", s.message()));
  return program;
}

WorkerLaunch RunUnit::RankLaunch(const RankState& r, size_t local, int port, int64_t budget,
                                 const std::string& binary, const std::string& argv0,
                                 const std::map<std::string, std::string>& daemon_env) const {
  WorkerLaunch w;
  w.binary = binary;
  w.run_id = id();
  w.run_dir = run_.run_dir();
  w.attempt = attempt_.number();
  w.rank = r.rank;
  w.world_size = attempt_.world_size() > 0 ? attempt_.world_size() : run_.world_size();
  w.local_rank = static_cast<int>(local);
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
  w.cuda_alloc_conf = spec_.train.cuda_alloc_conf;
  if (spec_.has_command) {
    w.command = &spec_.command;
    w.program = binary;
    w.program_argv0 = argv0;
    w.resume_dir = attempt_.resumed_from();
  }
  return w;
}

void RunUnit::LaunchRanks() {
  launching_ = false;
  const int number = attempt_.number();
  // A drain told while the attempt was stored or agreed (a multi-node run
  // in its rendezvous): nothing starts; the attempt ends as a resize.
  const bool resize = !cancel_ && !env_.host->shutting_down() && !resize_before_start_.empty();
  const bool stop = cancel_ || env_.host->shutting_down() || resize;
  if (resize) {
    resize_stop_ = true;
    resize_reason_ = std::exchange(resize_before_start_, "");
  } else if (stop) {
    shutdown_stop_ = shutdown_stop_ || !cancel_;
  }
  const int port = Clustered() ? master_port_ : env_.host->FreePort();
  const int64_t budget = LoweredMemoryBudgetMb(spec_.train.memory_budget_mb, oom_exits_,
                                               cfg().restart.oom_budget_factor);
  const std::map<std::string, std::string> daemon_env = env_.host->DaemonEnvironment();
  std::string binary = env_.host->WorkerBinary();
  std::string argv0;
  bool failed = false;
  size_t failed_rank = 0;
  std::string failure;
  if (spec_.has_command) {
    absl::StatusOr<CheckedProgram> program = AllowedCommand();
    if (program.ok()) {
      binary = program->exec_path;
      argv0 = program->argv0;
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
    const WorkerLaunch w = RankLaunch(r, i, port, budget, binary, argv0, daemon_env);
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

}  // namespace trainsup::supervisor
