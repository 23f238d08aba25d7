// The run units' effects on the real world (unit_env.h) for the daemon's
// event loop: Boost.Asio timers and a thread pool, the store threads, the
// exit watcher, Boost.Process launches and /proc. Thin by design: every
// decision lives in the unit.
#ifndef TRAINSUP_SUPERVISOR_RUN_LOOP_ENV_H_
#define TRAINSUP_SUPERVISOR_RUN_LOOP_ENV_H_

#include <boost/asio.hpp>
#include <map>
#include <memory>

#include "supervisor/run/unit_env.h"
#include "supervisor/store/store_thread.h"
#include "supervisor/sys/exit_watcher.h"

namespace trainsup::supervisor {

class LoopEnv final : public UnitClock,
                      public UnitTimers,
                      public UnitStore,
                      public UnitLauncher,
                      public UnitSignaller {
 public:
  LoopEnv(boost::asio::io_context& io, boost::asio::thread_pool& pool, StoreThreads* store,
          ExitWatcher* exits)
      : io_(io), pool_(pool), store_(store), exits_(exits) {}
  ~LoopEnv() override;

  // UnitClock.
  double NowS() override;
  int64_t WallMs() override;
  uint64_t BootTicks() override;
  uint64_t BootTicksAt(int64_t wall_ms) override;
  // UnitTimers.
  TimerId Start(double delay_s, std::function<void()> fn) override;
  void Cancel(TimerId id) override;
  void OffLoop(std::function<std::function<void()>()> work) override;
  void Post(std::function<void()> fn) override;
  // UnitStore.
  void Write(const std::string& run_id, StoreBatch batch,
             std::function<void(absl::Status, StoreBatch)> done) override;
  // UnitLauncher.
  absl::StatusOr<LaunchedProcess> Launch(const LaunchSpec& spec) override;
  void WatchExit(const std::string& run_id, int attempt, int rank, int pid, uint64_t start_ticks,
                 bool own_child) override;
  void UnwatchExit(const std::string& run_id, int attempt, int rank) override;
  ReapResult Reap(int pid) override;
  bool IsSameProcess(int pid, uint64_t start_ticks) override;
  std::optional<ExitFile> ReadExitFile(const std::string& path) override;
  FileTail ReadTail(const std::string& path, int64_t offset, int64_t max_bytes) override;
  void CaptureStacks(int pid, const std::string& log_path,
                     std::function<void(absl::StatusOr<std::string>)> done) override;
  // UnitSignaller.
  absl::Status SignalGroup(const GroupIdentity& group, int sig) override;
  absl::Status SignalLeader(const GroupIdentity& group, int sig) override;

  UnitEnv env(UnitHost* host) { return UnitEnv{this, this, this, this, this, host}; }

 private:
  boost::asio::io_context& io_;
  boost::asio::thread_pool& pool_;
  StoreThreads* store_;
  ExitWatcher* exits_;
  TimerId next_timer_ = 1;
  std::map<TimerId, std::unique_ptr<boost::asio::steady_timer>> timers_;
};

// The loop's timers, with off-loop work on a pool of its own: the cluster
// members' etcd calls, which must not queue behind the daemon's other
// off-loop work (a stack capture may take 20 s) while a lease runs out.
class PoolTimers final : public UnitTimers {
 public:
  PoolTimers(UnitTimers& loop, boost::asio::io_context& io, boost::asio::thread_pool& pool)
      : loop_(loop), io_(io), pool_(pool) {}
  TimerId Start(double delay_s, std::function<void()> fn) override {
    return loop_.Start(delay_s, std::move(fn));
  }
  void Cancel(TimerId id) override { loop_.Cancel(id); }
  void OffLoop(std::function<std::function<void()>()> work) override;
  void Post(std::function<void()> fn) override { loop_.Post(std::move(fn)); }

 private:
  UnitTimers& loop_;
  boost::asio::io_context& io_;
  boost::asio::thread_pool& pool_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_RUN_LOOP_ENV_H_
