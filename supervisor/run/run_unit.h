// One run's life in the daemon: its state, its attempts and their ranks, and
// every transition (launch, exit, gang stop, restart decision, cancel,
// graceful shutdown, hang detection, adoption after a daemon restart), with
// all effects going through UnitEnv (unit_env.h). After systemd's units: the
// unit decides from data (exit_classify.h, restart_policy.h, stop_stage.h,
// launch_plan.h) and acts through thin adapters.
//
// Persist, then act. Every transition is written to the store as one
// StoreBatch before its effects happen: a new attempt's processes are
// started only once the attempt is stored, a restart is scheduled only once
// the ending attempt is, and events reach watchers with their stored seq
// numbers. The unit's writes are queued in order, one in flight; a write
// that fails is reported to the host and retried with backoff, and the run
// does not move on (Schedulable() is false) until it is stored.
//
// Loop-thread only. Callbacks hold a weak guard, so a unit may be destroyed
// with timers, writes or off-loop work still pending.
#ifndef TRAINSUP_SUPERVISOR_RUN_RUN_UNIT_H_
#define TRAINSUP_SUPERVISOR_RUN_RUN_UNIT_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "contracts/spec.h"
#include "supervisor/policy/command_policy.h"
#include "supervisor/policy/exit_classify.h"
#include "supervisor/policy/group_identity.h"
#include "supervisor/policy/launch_plan.h"
#include "supervisor/policy/progress_timeout.h"
#include "supervisor/policy/restart_policy.h"
#include "supervisor/policy/scheduler.h"
#include "supervisor/policy/stop_stage.h"
#include "supervisor/policy/straggler.h"
#include "supervisor/run/resume_choice.h"
#include "supervisor/run/unit_env.h"

namespace trainsup::supervisor {

bool IsTerminal(v1::RunState state);
// "PENDING", "RUNNING", ...
std::string StateName(v1::RunState state);
// The trainsup.v1.ExitClass of `cls`.
v1::ExitClass ExitClassProto(ExitClass cls);
// TrainingTally between the contract's struct and the API's message.
v1::TrainingTally TallyToProto(const TrainingTally& t);
TrainingTally TallyFromProto(const v1::TrainingTally& t);

// One rank of the current (or last) attempt.
struct RankState {
  int rank = 0;
  int slot = -1;
  std::string gpu;  // CUDA_VISIBLE_DEVICES
  int pid = 0;
  GroupIdentity group;
  std::string token;
  bool own_child = false;  // started by this daemon: reaped with waitpid
  bool alive = false;
  double launched_s = 0;
  double last_heartbeat_s = 0;
  double last_progress_s = 0;
  bool heard = false;       // said Hello (this attempt, or before adoption)
  bool progressed = false;  // the training loop advanced during the attempt
  uint64_t progress_counter = 0;
  double steps_per_s = 0;
  WorkerPhase phase = WorkerPhase::kLoading;
  std::shared_ptr<WorkerLink> link;
  std::optional<ExitClass> forced;  // why we are stopping it
  std::string forced_reason;
  StopStage stop_stage = StopStage::kNone;
  UnitTimers::TimerId stop_timer = 0;
  std::optional<ExitFile> exit_report;  // sent on the stream
  std::optional<ExitFile> end_report;   // the account its end was classified by
  // Found dead at adoption: it died while no daemon watched, so its group
  // was last known alive at its last heartbeat, not when we noticed.
  bool died_unwatched = false;
  // RankOutcome::end_order: set when the rank's end (or our frozen or hung
  // verdict) is seen; -1 until then.
  int end_order = -1;
  v1::RankStatus status;
  double last_persist_s = 0;
};

class RunUnit {
 public:
  // A new run, just stored (PENDING).
  RunUnit(v1::Run run, RunSpec spec, int64_t seq, UnitEnv env);
  ~RunUnit();
  RunUnit(const RunUnit&) = delete;
  RunUnit& operator=(const RunUnit&) = delete;

  // A run the store holds unfinished, after a daemon restart: its history
  // rebuilt, an attempt that was running adopted (workers that still are the
  // processes we started are watched again; dead ones are classified from
  // their exit files), a RESTARTING run given its remaining backoff.
  // `privs[i]` belongs to rank i of the newest attempt.
  static std::unique_ptr<RunUnit> Restore(const v1::Run& stored, RunSpec spec, int64_t seq,
                                          const std::vector<RankPrivate>& privs,
                                          const RunLearning& learning, UnitEnv env);

  const v1::Run& run() const { return run_; }
  const RunSpec& spec() const { return spec_; }
  const std::string& id() const { return run_.run_id(); }
  const std::vector<RankState>& ranks() const { return ranks_; }
  int attempt_number() const { return attempt_.number(); }
  int64_t last_checkpoint_ms() const { return last_checkpoint_ms_; }
  bool waiting_for_space() const { return waiting_for_space_; }
  bool AnyAlive() const;
  // Every write of the unit is stored.
  bool idle() const { return !write_in_flight_ && writes_.empty(); }

  // The run as the scheduler sees it, when it may be placed now: PENDING or
  // RESTARTING, nothing in preparation or unstored, not cancelled, not
  // waiting for disk space.
  std::optional<QueuedRun> Queued() const;
  // A multi-node run that holds its slots while it waits in its job's
  // rendezvous (yielding: giving them back already).
  std::optional<JoiningRun> Joining() const;
  // Gives a waiting run's slots back for job `to_job` (YieldsFor,
  // scheduler.h): it leaves the rendezvous, unless that completed
  // meanwhile (then it simply starts), and is queued again.
  void YieldSlots(const std::string& to_job);

  // An elastic gang changes size (docs/distributed.md, "Elastic"): a slot
  // it runs on was drained, or slots came back for it to grow into. Its
  // ranks checkpoint and stop, and the run is queued again at once (no
  // restart counted, no backoff) for the scheduler to place at the size
  // the slots allow; the next attempt's RESIZE event says `reason`. A run
  // that is not running (or is stopping already) only keeps the reason.
  void Resize(const std::string& reason);
  // The ranks of the current attempt's gang while it runs (0 when none
  // runs): below the spec's world_size when an elastic gang runs smaller.
  int running_world_size() const;
  // A queued run that cannot be placed says why (its reason, with a STATE
  // event when it changes).
  void NoteWaiting(const std::string& why);
  // The scheduler's view of a queued run: `why` it cannot be placed while
  // drained slots leave fewer usable than its smallest gang ("" when it can).
  // A BLOCKED event when that starts and when it ends, the reason shown
  // meanwhile, and the wait bounded by elastic.max_blocked_s (CheckBlocked).
  void NoteBlocked(const std::string& why);
  // Fails the run once it has been blocked longer than elastic.max_blocked_s
  // (> 0). Called on every tick.
  void CheckBlocked();
  // Seconds blocked so far (0 when not blocked).
  double blocked_s() const;

  // Placed on `slots` (rank i on slots[i], already marked busy; gpus[i] its
  // CUDA_VISIBLE_DEVICES): chooses the checkpoint (off the loop), stores the
  // new attempt, then launches every rank.
  void Start(const std::vector<int>& slots, const std::vector<std::string>& gpus);

  // A watched process exited (or may have: a spurious call is ignored).
  void OnProcessExit(int attempt, int rank);

  // Worker channel. OK, or Unauthenticated when the hello does not name a
  // live rank of the current attempt with its token, or FailedPrecondition
  // when it does but its version is one this daemon cannot serve
  // (contracts/version.h).
  absl::Status OnHello(const worker::v1::Hello& hello, std::shared_ptr<WorkerLink> link);
  void OnWorkerMessage(int attempt, int rank, const WorkerLink* link,
                       const worker::v1::WorkerMessage& message);
  void OnLinkClosed(int attempt, int rank, const WorkerLink* link);

  // Cancels the run: live workers are stopped gracefully (checkpoint, exit)
  // and the run ends CANCELLED once they are gone; a run without workers
  // ends CANCELLED at once. `done` runs when the request is taken (OK) or
  // refused (FailedPrecondition: the run already ended).
  void Cancel(const std::string& reason, std::function<void(absl::Status)> done);

  // The daemon is stopping: live workers are asked to checkpoint and stop;
  // the run goes back to PENDING and resumes with the next daemon.
  void Shutdown();

  // Frozen (no heartbeat) and hung (no progress) detection; requests for a
  // checkpoint that waited too long are answered.
  void CheckLiveness();

  // Checkpoint on demand (CheckpointRun): every live rank is sent
  // CheckpointNow, and `done` gets the step of the first checkpoint
  // committed at or after the last step a rank had reported finished
  // (a CHECKPOINT event or any rank's heartbeat, so a multi-node run's
  // daemons all learn it), or an error: the save failed, the attempt
  // ended first, `timeout_s` passed, or the run is not running.
  using CheckpointDone = std::function<void(int64_t step, const std::string& error)>;
  void RequestCheckpoint(double timeout_s, CheckpointDone done);

  // Overlays what only the loop knows (live ranks, progress) on a stored run.
  void FillLive(v1::Run* out) const;
  // A multi-node run: its job as last seen (true); false for a local run.
  bool FillCluster(v1::ClusterStatus* out) const;

 private:
  explicit RunUnit(UnitEnv env);
  // `fn` wrapped so that it does nothing once the unit is gone.
  template <class Fn>
  auto Guarded(Fn fn) {
    std::weak_ptr<int> life = life_;
    return [life, fn = std::move(fn)](auto&&... args) mutable {
      if (life.expired()) return;
      fn(std::forward<decltype(args)>(args)...);
    };
  }
  const DaemonConfig& cfg() const { return env_.host->config(); }
  // The rank `rank` (global: a multi-node run's ranks on this node are
  // rank_base_ ...) of the current attempt, or nullptr.
  RankState* At(int rank) {
    const int i = rank - rank_base_;
    return i >= 0 && i < static_cast<int>(ranks_.size()) ? &ranks_[i] : nullptr;
  }
  // Multi-node (spec.cluster): this node runs ranks_per_node of the ranks.
  bool Clustered() const { return spec_.cluster.present; }
  int LocalRanks() const {
    return Clustered() ? static_cast<int>(spec_.cluster.ranks_per_node) : run_.world_size();
  }
  // Creates cluster_ when missing; false when the host cannot, the run
  // failing with the reason (or, !fail_run, the reason only logged).
  bool EnsureCluster(bool fail_run = true);
  void OnClusterMoved(int64_t generation, const std::string& reason, bool grow);
  void OnClusterGrow(int64_t generation, const std::string& reason);
  // A grow told before this attempt's ranks ran: applied now they do.
  void ApplyPendingGrow();
  // RESTARTING and queued again at once (a resize): no restart counted,
  // no backoff.
  void RequeueNow(StoreBatch b, const std::string& reason);
  // A rank of this attempt that was not started (`stop`: the run was being
  // stopped; else `failure`, its own failed launch, or "" when another
  // rank's kept it from starting): its end, as seen now.
  void NotStarted(RankState& r, bool stop, const std::string& failure);
  // The job's decision on this node's ended attempt (its ranks' `end`).
  void FollowClusterVerdict(StoreBatch b, const AttemptEnd& end, ExitClass cls);
  void OnClusterNote(LogLevel level, const std::string& line);
  void OnClusterSubmission(const std::string& id, const std::string& replaced);
  void OnAgreement(ResumeChoice c, absl::StatusOr<Agreement> a);
  void ReportToCluster(bool final = false);
  // The end of EndAttempt once the decision is known.
  // `restarts` >= 0: the job's count (a multi-node run), not one more.
  void ApplyDecision(StoreBatch b, ExitClass cls, const RestartDecision& d, int64_t restarts = -1);
  // The run's processes speak to the daemon (our worker, or a command run
  // with heartbeats): they say Hello, and frozen and hung detection apply.
  bool Heartbeats() const { return !spec_.has_command || spec_.command.heartbeats; }
  void Log(LogLevel level, const std::string& line);
  v1::RunEvent Event(v1::EventKind kind, int rank, const std::string& reason) const;

  // Persistence: `batch` is stored (retried until it is), then `then` runs.
  void Persist(StoreBatch batch, std::function<void(const StoreBatch&)> then);
  void PumpWrites();
  // Stores the run's new state with its STATE event (plus `extra` rows), then
  // publishes every event of the batch and runs `then`.
  void SetState(v1::RunState state, const std::string& reason, StoreBatch extra,
                std::function<void()> then = nullptr);
  void PublishAll(const StoreBatch& batch);
  StoreBatch::Rank RankRow(RankState& r);

  void Adopt(const v1::Attempt& attempt, const std::vector<RankPrivate>& privs);
  // Cancelled or the daemon stopping while the attempt was prepared: its
  // slots go back (and a cancel ends the run). True when so.
  bool StoppedBeforeStart();
  void OnPrepared(ResumeChoice choice);
  // The checkpoints could not be read (or, for a multi-node run, this node
  // does not see the job's shared store yet): the slots go back and the
  // run prepares again after a backoff, saying `why`.
  void PrepareAgainLater(const std::string& why);
  // The gang's size changed since the last attempt (`previous` ranks, 0:
  // none or unknown, now `world`): a RESIZE event saying why, into `b`.
  void AddResizeEvent(StoreBatch& b, int previous, int world);
  // A multi-node run's attempt belongs to job generation `generation`.
  void StartAttempt(ResumeChoice choice, int64_t generation = 0);
  void LaunchRanks();
  // The launch facts of rank `r`, the `local`-th of this node's ranks.
  WorkerLaunch RankLaunch(const RankState& r, size_t local, int port, int64_t budget,
                          const std::string& binary, const std::string& argv0,
                          const std::map<std::string, std::string>& daemon_env) const;
  absl::StatusOr<CheckedProgram> AllowedCommand() const;
  void EndAttempt();
  // A decision to succeed, checked against what rank 0 says the run trained
  // (policy/training_outcome.h): d.reason becomes the tally's summary, or
  // d turns into a failure with the verdict's reason; events go into `b`.
  void JudgeCompletedRun(StoreBatch& b, RestartDecision& d);
  void AfterDecision(const RestartDecision& d);
  // The training guard's rollbacks (run_unit_guard.cc, docs/guard.md).
  // The restart policy with the spec's guard.max_rollbacks.
  RestartPolicy Policy() const;
  // A rank ended diverged: its exit report's first bad step (or, without
  // one, the step after the last it reached) and what it saw.
  void NoteDiverged(const RankState& r, const std::optional<ExitFile>& report);
  // A rollback was decided: the window from the first bad step goes into
  // the run (stored with `b`), with its event.
  void AddRollbackWindow(StoreBatch& b, const RestartDecision& d);
  // diverged_at_ set: from the ranks' exit files when they ended while no
  // daemon watched, else past rank 0's last step.
  void LocateDivergence();
  // The newest rollback window this divergence came back right after
  // (policy/rollback.h), or nullptr.
  const v1::SkipWindow* WindowDivergedAgainAfter() const;
  // A diverged run out of rollbacks: the reason says when skipping data
  // did not help.
  void NoteDivergenceFailed(RestartDecision& d);
  // The step the next attempt must resume below (the newest window's first
  // step when the attempt that just ended diverged), or -1.
  int64_t RollbackBefore() const;
  // After the choice: the rollback's window names the step resumed from.
  void NoteRollbackResume(int64_t before, int64_t resumed_step);
  // TRAINSUP_SKIP_WINDOWS (the rollbacks' windows; the spec's stay in the
  // spec) and TRAINSUP_LR_FACTOR.
  std::string SkipWindowsText() const;
  double LearningRateFactor() const;
  void WaitForSpace();
  void ReleaseSlots();

  void StopRank(RankState& r, ExitClass why, const std::string& reason, bool graceful);
  // A stop of the current attempt's ranks that must outlive the daemon
  // (a cancel, a resize, the daemon's shutdown): stored in the run
  // (Run.stop_request) first, then every live rank is asked to stop at a
  // checkpoint (forced `cls`, `rank_reason`), then `then` runs.
  void RequestStop(v1::StopRequest::Kind kind, const std::string& reason, ExitClass cls,
                   const std::string& rank_reason, std::function<void()> then);
  // After a daemon restart: the stop the old daemon asked attempt `attempt`
  // for (Run.stop_request) holds for the adopted ranks: a live one is asked
  // again, one that died meanwhile is classified as asked.
  void HonourStoredStop(int attempt);
  void EnterStopStage(int rank, StopStage stage);
  void CaptureAndKill(RankState& r, ExitClass cls, const std::string& reason);
  // CaptureAndKill's stack capture (when configured), then SIGTERM.
  void CaptureThenTerm(int attempt, int rank);
  void WaitForPythonStacks(int attempt, int rank, const std::string& log_path, int64_t from,
                           int64_t last_size, double deadline_s);
  void MaybeFinished();
  // Straggler detection (distributed.straggler_factor > 0): each rank's
  // step compute time from its heartbeats, judged on every tick; a change
  // is a STRAGGLER event and the ranks' status says who is one.
  void ObserveStepCompute(int rank, double now_s, double compute_s);
  void JudgeStragglers(double now_s);
  // A worker's event (CHECKPOINT, OOM_SPLIT, LOG, GUARD ...): stored and
  // published; a checkpoint's commit or failure answers the requests.
  void OnWorkerEvent(int rank, const worker::v1::WorkerEvent& we);
  struct CheckpointRequest;
  // Answers, with (step, error), and drops the requests `pick` selects.
  void AnswerCheckpointRequests(const std::function<bool(const CheckpointRequest&)>& pick,
                                int64_t step, const std::string& error);
  // Answers the checkpoint requests that `last_checkpoint_step` satisfies.
  void CheckpointCommitted(int64_t last_checkpoint_step);
  // Answers every checkpoint request with `error`.
  void FailCheckpointRequests(int64_t step, const std::string& error);

  struct CheckpointRequest {
    CheckpointDone done;
    int64_t after_step = 0;  // a checkpoint at this step or later answers it
    double deadline_s = 0;
  };
  std::vector<CheckpointRequest> checkpoint_requests_;
  std::unique_ptr<StragglerDetector> stragglers_;  // this attempt's; null when off

  UnitEnv env_;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);
  v1::Run run_;  // without attempts
  RunSpec spec_;
  int64_t seq_ = 0;
  v1::Attempt attempt_;  // the current (or last) attempt, ranks not filled
  std::vector<RankState> ranks_;
  std::vector<int> slots_;
  std::vector<std::string> gpus_;
  std::vector<AttemptEnd> history_;
  // Ends seen during the current attempt, for RankState::end_order; ranks
  // that died while no daemon watched all get 0, before any end seen live.
  int ends_seen_ = 0;
  int oom_exits_ = 0;
  // The current attempt's divergence (NoteDiverged): the first bad step,
  // the step it ended on, and what was seen; -1 when none.
  int64_t diverged_at_ = -1;
  int64_t diverged_through_ = -1;
  std::string diverged_seen_;
  ProgressLearning learning_;
  double learning_saved_s_ = 0;
  UnitTimers::TimerId restart_timer_ = 0;
  double not_before_s_ = 0;
  bool preparing_ = false;
  bool launching_ = false;  // the attempt is being stored; ranks start after
  int prepare_failures_ = 0;
  bool cancel_ = false;
  std::string cancel_reason_;
  bool shutdown_stop_ = false;
  // Stopping to change the gang's size (Resize), and why; the reason is
  // kept for the next attempt's RESIZE event.
  bool resize_stop_ = false;
  std::string resize_reason_;
  // A resize (a drained slot) told while the attempt was being prepared,
  // stored or agreed, before any rank ran: applied before they start.
  std::string resize_before_start_;
  // Blocked by drains (NoteBlocked): since when (-1: not), and why.
  double blocked_since_s_ = -1;
  std::string blocked_why_;
  // Since when the run waits in the queue (PENDING or RESTARTING): an
  // elastic gang starts smaller only elastic.wait_s after it.
  double queued_since_s_ = 0;
  bool waiting_for_space_ = false;
  bool space_reported_ = false;
  double space_backoff_s_ = 0;
  double last_progress_persist_s_ = 0;
  int64_t last_checkpoint_ms_ = 0;

  // Multi-node runs (docs/distributed.md).
  std::unique_ptr<UnitCluster> cluster_;
  int rank_base_ = 0;      // node rank x ranks_per_node
  int cluster_world_ = 0;  // the agreed nodes x ranks_per_node (0: none yet)
  // A grow told before the ranks of its generation ran (0: none).
  std::pair<int64_t, std::string> grow_pending_{0, ""};
  std::string master_addr_;  // the generation's node 0 (empty: local)
  int master_port_ = 0;
  bool joining_ = false;   // in the rendezvous
  double joined_s_ = 0;    // since
  bool yielding_ = false;  // leaving it (YieldSlots)

  struct PendingWrite {
    StoreBatch batch;
    std::function<void(const StoreBatch&)> then;
  };
  std::deque<PendingWrite> writes_;
  bool write_in_flight_ = false;
  int write_failures_ = 0;
  bool finished_ = false;  // Finished() was reported
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_RUN_RUN_UNIT_H_
