// The effects a run unit (run_unit.h) has on the world, behind small
// interfaces so that its tests can fake every one of them: a clock, timers
// and off-loop work, the store, a launcher (processes and their exits), a
// signaller, and the host (the daemon: configuration, watchers, slots,
// scheduling, metrics, secrets). Every method is called on the event loop's
// thread (UnitTimers::Post excepted), and every callback it takes is run
// there. The cluster member (supervisor/cluster/cluster.h) runs on the clock
// and timers too.
#ifndef TRAINSUP_SUPERVISOR_RUN_UNIT_ENV_H_
#define TRAINSUP_SUPERVISOR_RUN_UNIT_ENV_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/store.h"
#include "contracts/daemon_config.h"
#include "contracts/exit_file.h"
#include "contracts/spec.h"
#include "supervisor/policy/cluster_protocol.h"
#include "supervisor/policy/group_identity.h"
#include "supervisor/policy/restart_policy.h"
#include "supervisor/store/store_thread.h"
#include "supervisor/sys/process.h"
#include "trainsup/v1/supervisor.pb.h"
#include "trainsup/v1/worker.pb.h"

namespace trainsup::supervisor {

class UnitClock {
 public:
  virtual ~UnitClock() = default;
  virtual double NowS() = 0;         // monotonic seconds
  virtual int64_t WallMs() = 0;      // unix milliseconds
  virtual uint64_t BootTicks() = 0;  // clock ticks since boot (/proc's clock)
  // The boot-clock ticks of unix time `wall_ms` (0 if before boot).
  virtual uint64_t BootTicksAt(int64_t wall_ms) = 0;
};

class UnitTimers {
 public:
  using TimerId = uint64_t;
  virtual ~UnitTimers() = default;
  // Runs `fn` after `delay_s` (0: as soon as the loop gets to it). Never 0.
  virtual TimerId Start(double delay_s, std::function<void()> fn) = 0;
  // Cancels a timer that has not fired; unknown or fired ids are ignored.
  virtual void Cancel(TimerId id) = 0;
  // Runs `work` on a background thread; what it returns runs on the loop.
  // Calls are not ordered: work posted later may run first, or alongside.
  virtual void OffLoop(std::function<std::function<void()>()> work) = 0;
  // Runs `fn` on the loop soon. The one method safe from any thread (an
  // etcd watch's, say): the rest are called on the loop's thread.
  virtual void Post(std::function<void()> fn) = 0;
};

class UnitStore {
 public:
  virtual ~UnitStore() = default;
  // Applies `batch` to run `run_id` (ApplyBatch) off the loop, in the order
  // of the calls; `done` gets the status and the batch with its events'
  // seq numbers filled in.
  virtual void Write(const std::string& run_id, StoreBatch batch,
                     std::function<void(absl::Status, StoreBatch)> done) = 0;
};

class UnitLauncher {
 public:
  virtual ~UnitLauncher() = default;
  virtual absl::StatusOr<LaunchedProcess> Launch(const LaunchSpec& spec) = 0;
  // Calls the host's OnProcessExit(run_id, attempt, rank) once `pid` has
  // exited: through a pidfd when there is one, else SIGCHLD (own children)
  // or polling /proc (adopted workers, `start_ticks` telling pid reuse).
  virtual void WatchExit(const std::string& run_id, int attempt, int rank, int pid,
                         uint64_t start_ticks, bool own_child) = 0;
  virtual void UnwatchExit(const std::string& run_id, int attempt, int rank) = 0;
  // waitpid(WNOHANG) of an own child.
  virtual ReapResult Reap(int pid) = 0;
  // Whether `pid` is alive and still the process that started at `start_ticks`.
  virtual bool IsSameProcess(int pid, uint64_t start_ticks) = 0;
  // The rank's exit file, when there is a readable one.
  virtual std::optional<ExitFile> ReadExitFile(const std::string& path) = 0;
  // What the file at `path` holds from byte `offset` on, at most
  // `max_bytes` of it, and its size now: a rank log read while a Python
  // script dumps its stacks into it. Size -1 when there is no such file.
  struct FileTail {
    int64_t size = -1;
    std::string bytes;
  };
  virtual FileTail ReadTail(const std::string& path, int64_t offset, int64_t max_bytes) = 0;
  // Appends the stacks of `pid` to `log_path` (off the loop); `done` runs on
  // the loop with the tool used or the error.
  virtual void CaptureStacks(int pid, const std::string& log_path,
                             std::function<void(absl::StatusOr<std::string>)> done) = 0;
};

class UnitSignaller {
 public:
  virtual ~UnitSignaller() = default;
  // Signals the worker's process group if it still is the worker's
  // (SignalWorkerGroup).
  virtual absl::Status SignalGroup(const GroupIdentity& group, int sig) = 0;
  // Signals only the group's leader (the process the daemon started) if it
  // still is that process.
  virtual absl::Status SignalLeader(const GroupIdentity& group, int sig) = 0;
};

// A worker's stream, from the daemon's side.
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  virtual void Send(const worker::v1::SupervisorCommand& command) = 0;
  // Ends the stream with `status` (its code and message go to the worker).
  virtual void Close(const absl::Status& status) = 0;
};

enum class LogLevel { kInfo, kWarn, kError };

// A multi-node run's side of its job's coordination (supervisor/cluster/cluster.h
// implements it over etcd; docs/distributed.md has the protocol).
// What follows a failed generation, decided once for the whole job.
struct ClusterVerdict {
  enum class Kind { kRestart, kFail, kCancel };
  Kind kind = Kind::kRestart;
  int64_t generation = 0;  // the generation that follows
  int64_t restarts = 0;    // of the whole job
  double delay_s = 0;
  std::string reason;
  // The generation moved after the ranks stopped at a checkpoint to change
  // the job's size (a rejoining node taken in, a node's drained slot): not
  // a restart (the run queues again at once, nothing counted).
  bool grow = false;
};

struct ClusterEvents {
  // The job's generation moved to `generation` (a node restarted the job,
  // or it failed or was cancelled): ranks of an older one must stop. grow:
  // it moved to change the job's size (ClusterVerdict::grow): they stop
  // gracefully, with a checkpoint.
  std::function<void(int64_t generation, const std::string& reason, bool grow)> moved;
  // A line for the run's events: etcd unreachable or back, a node lost,
  // waiting for nodes to join.
  std::function<void(LogLevel level, const std::string& line)> note;
  // The run belongs to the job's submission `id` (docs/distributed.md,
  // "Job identity"): told once it first reached etcd, and again if it ever
  // changed. `replaced`: the earlier, finished submission this one
  // replaced, and how it ended ("" none).
  std::function<void(const std::string& id, const std::string& replaced)> submission;
  // An elastic job's short generation, which this node runs in, saw a node
  // outside it join (its daemon came back): the ranks checkpoint and stop
  // gracefully, and the verdict on that attempt moves the job on to take
  // the node in (ClusterVerdict::grow).
  std::function<void(int64_t generation, const std::string& reason)> grow;
};

class UnitCluster {
 public:
  virtual ~UnitCluster() = default;
  // Joins the current generation's rendezvous for `attempt`, with the
  // checkpoint steps of the shared store this node verified, the store's
  // owner record as this node reads it, and a free port (MASTER_PORT if
  // this node becomes node 0). `done` runs on the loop
  // once every node has joined, or with FailedPrecondition (the job failed,
  // or this node cannot take part: the message says why), Cancelled, or
  // Unavailable (this node does not see the shared store the others see:
  // read it again later).
  virtual void Join(int attempt, std::vector<int64_t> steps, std::optional<ckpt::StoreOwner> owner,
                    int port, std::function<void(absl::StatusOr<Agreement>)> done) = 0;
  // A rank of this node ended badly in `generation`: the job must restart
  // (the first node to say so moves the generation; the others follow).
  virtual void Broken(int64_t generation, const AttemptEnd& end) = 0;
  // What follows `generation` for the whole job, deciding it with `end` if
  // no node has yet. `done` runs on the loop; it may wait for etcd.
  virtual void Verdict(int64_t generation, const AttemptEnd& end,
                       std::function<void(ClusterVerdict)> done) = 0;
  // Takes this node out of the pending Join's rendezvous, to give its
  // slots to another job, unless the rendezvous may have completed: unless
  // another node put a record since this one's view of it, or all have.
  // `done(true)` on the loop: out, and the Join's `done` is never called;
  // `done(false)`: still in (the agreement may follow); ask again later.
  virtual void Withdraw(std::function<void(bool)> done) = 0;
  // Cancels the whole job (every node's run ends CANCELLED).
  virtual void Cancel(const std::string& reason) = 0;
  // This node's status for the job's other nodes and `describe`; `final`:
  // the run ended, kept after this daemon's lease ends.
  virtual void Report(const v1::ClusterNode& self, bool final) = 0;
  // The whole job as last seen.
  virtual void Fill(v1::ClusterStatus* out) const = 0;
};

class UnitHost {
 public:
  virtual ~UnitHost() = default;
  // The configuration in force (replaced by reloads between calls).
  virtual const DaemonConfig& config() = 0;
  virtual bool shutting_down() = 0;
  virtual void Log(LogLevel level, const std::string& line) = 0;
  // A persisted event (seq > 0) or a live-only one (seq 0) for the run's
  // watchers.
  virtual void Publish(const v1::RunEvent& event) = 0;
  // The worker on `slot` ended (or never started): check its release.
  virtual void ReleaseSlot(int slot, const GroupIdentity& group) = 0;
  // Something changed that may let a run be placed.
  virtual void Reschedule() = 0;
  // The run reached a terminal state, none of its workers lives and all its
  // writes are stored: the host drops the unit later (never inside this
  // call).
  virtual void Finished(const std::string& run_id) = 0;
  // A store write failed (it is retried).
  virtual void StoreFailed(const std::string& run_id, const std::string& what,
                           const absl::Status& status) = 0;
  // Facts for the launch.
  virtual std::string WorkerBinary() = 0;
  virtual std::string SupervisorEndpoint() = 0;
  virtual std::map<std::string, std::string> DaemonEnvironment() = 0;
  virtual int FreePort() = 0;
  // `bytes` random bytes from the kernel's CSPRNG, hex-encoded.
  virtual std::string NewSecret(int bytes) = 0;
  virtual double JitterUnit() = 0;  // uniform in [0, 1)
  // Bytes free for unprivileged users on the file system of `run_dir`, and
  // the size of the run's newest checkpoint (off the loop); `done` runs on
  // the loop.
  virtual void MeasureSpace(
      const std::string& run_dir,
      std::function<void(absl::StatusOr<int64_t> free_bytes, int64_t checkpoint_bytes)> done) = 0;
  // Metrics.
  virtual void CountWorkerExit(const std::string& exit_class) = 0;
  virtual void CountRestart(const std::string& exit_class) = 0;
  virtual void RemoveWorkerMetrics(const std::string& run_id, int rank) = 0;
  // `n` more checkpoint saves of the run failed (a worker's heartbeat said).
  virtual void CountCheckpointFailures(const std::string& run_id, int64_t n) = 0;
  // The training guard (docs/guard.md): steps not applied (rank 0's
  // heartbeats said), and a rollback decided.
  virtual void CountGuardSteps(const std::string& run_id, int64_t nonfinite, int64_t spikes) = 0;
  virtual void CountRollback(const std::string& run_id) = 0;
  // An elastic gang's attempt started at another size ("shrink", "grow").
  virtual void CountResize(const std::string& run_id, const std::string& direction) = 0;
  // The coordination of multi-node run `run` (spec.cluster.present), or an
  // error that fails the run (InvalidArgument: etcd endpoints unusable).
  virtual absl::StatusOr<std::unique_ptr<UnitCluster>> JoinCluster(const v1::Run& run,
                                                                   const RunSpec& spec,
                                                                   ClusterEvents events) = 0;
};

struct UnitEnv {
  UnitClock* clock = nullptr;
  UnitTimers* timers = nullptr;
  UnitStore* store = nullptr;
  UnitLauncher* launcher = nullptr;
  UnitSignaller* signaller = nullptr;
  UnitHost* host = nullptr;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_RUN_UNIT_ENV_H_
