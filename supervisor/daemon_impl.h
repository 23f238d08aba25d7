// The daemon's implementation class, shared by daemon.cc (start-up, the
// loop's life, the units' host) and daemon_api.cc (the API's and the worker
// channel's backends). Internal to trainsupd: nothing outside these two
// files includes it.
#ifndef TRAINSUP_SUPERVISOR_DAEMON_IMPL_H_
#define TRAINSUP_SUPERVISOR_DAEMON_IMPL_H_

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "supervisor/api/api_service.h"
#include "supervisor/api/servers.h"
#include "supervisor/api/watch_hub.h"
#include "supervisor/api/worker_channel.h"
#include "supervisor/daemon.h"
#include "supervisor/metrics.h"
#include "supervisor/policy/auth.h"
#include "supervisor/policy/elastic_growth.h"
#include "supervisor/run/loop_env.h"
#include "supervisor/run/run_unit.h"
#include "supervisor/store/store_thread.h"
#include "supervisor/sys/exit_watcher.h"
#include "supervisor/sys/slots.h"

namespace trainsup::supervisor::internal {

namespace asio = boost::asio;
namespace wv1 = ::trainsup::worker::v1;

class DaemonImpl final : public Daemon,
                         public UnitHost,
                         public ApiBackend,
                         public WorkerChannelBackend {
 public:
  DaemonImpl(DaemonConfig config, std::string config_path, std::shared_ptr<spdlog::logger> log)
      : config_(std::move(config)),
        config_path_(std::move(config_path)),
        log_(std::move(log)),
        signals_(io_, SIGTERM, SIGINT, SIGHUP),
        tick_(io_),
        slow_tick_(io_),
        watchdog_(io_),
        exits_(
            io_, [this](const std::string& id, int a, int r) { OnProcessExit(id, a, r); },
            [this](const std::string& line) { log_->warn("{}", line); }),
        hub_(WatchHub::Backend{
            [this](const std::string& id, int64_t after, int limit,
                   std::function<void(absl::StatusOr<std::vector<v1::RunEvent>>)> done) {
              store_->Read([this, id, after, limit, done](StateStore& s) {
                auto page = s.ListEvents(id, after, limit);
                asio::post(io_, [page, done] { done(page); });
              });
            },
            [this](std::function<void()> fn) { asio::post(io_, std::move(fn)); },
            [this](const std::string& id) {
              const RunUnit* u = Find(id);
              return u != nullptr && !IsTerminal(u->run().state());
            }}),
        jitter_(std::random_device{}()) {}

  absl::Status Init();
  int Run() override;

  // UnitHost.
  const DaemonConfig& config() override { return config_; }
  bool shutting_down() override { return shutting_down_; }
  void Log(LogLevel level, const std::string& line) override;
  void Publish(const v1::RunEvent& event) override { hub_.Publish(event); }
  void ReleaseSlot(int slot, const GroupIdentity& group) override {
    slots_->Release(slot, group, config_.slots.gpu_release_timeout_s,
                    config_.slots.gpu_idle_memory_mb << 20);
  }
  void Reschedule() override;
  void Finished(const std::string& run_id) override;
  void StoreFailed(const std::string& run_id, const std::string& what,
                   const absl::Status& status) override;
  std::string WorkerBinary() override;
  std::string SupervisorEndpoint() override { return "unix:" + servers_.socket_path(); }
  std::map<std::string, std::string> DaemonEnvironment() override;
  int FreePort() override;
  std::string NewSecret(int bytes) override { return SecureRandomHex(bytes); }
  double JitterUnit() override { return std::uniform_real_distribution<double>(0, 1)(jitter_); }
  void MeasureSpace(const std::string& run_dir,
                    std::function<void(absl::StatusOr<int64_t>, int64_t)> done) override;
  void CountWorkerExit(const std::string& cls) override { metrics_->CountWorkerExit(cls); }
  void CountRestart(const std::string& cls) override { metrics_->CountRestart(cls); }
  void RemoveWorkerMetrics(const std::string& id, int rank) override {
    metrics_->RemoveWorker(id, rank);
  }
  void CountGuardSteps(const std::string& id, int64_t nonfinite, int64_t spikes) override {
    metrics_->CountGuardSteps(id, nonfinite, spikes);
  }
  void CountRollback(const std::string& id) override { metrics_->CountRollback(id); }
  void CountResize(const std::string& id, const std::string& direction) override {
    metrics_->CountResize(id, direction);
  }
  void CountCheckpointFailures(const std::string& id, int64_t n) override {
    metrics_->CountCheckpointFailures(id, n);
  }
  absl::StatusOr<std::unique_ptr<UnitCluster>> JoinCluster(const v1::Run& run, const RunSpec& spec,
                                                           ClusterEvents events) override;

  // ApiBackend (gRPC threads: everything goes to the loop).
  void Submit(const v1::SubmitRunRequest& req, RunSpec spec,
              std::function<void(absl::StatusOr<std::string>)> done) override;
  void Get(const std::string& run_id, std::function<void(absl::StatusOr<v1::Run>)> done) override;
  void List(const v1::ListRunsRequest& req,
            std::function<void(absl::StatusOr<v1::ListRunsResponse>)> done) override;
  void Watch(const v1::WatchRunRequest& req, std::shared_ptr<EventSink> sink) override;
  void Cancel(const v1::CancelRunRequest& req,
              std::function<void(absl::StatusOr<v1::Run>)> done) override;
  void Node(std::function<void(v1::Node)> done) override;
  void Drain(const v1::DrainSlotRequest& req,
             std::function<void(absl::StatusOr<v1::Slot>)> done) override;
  void Undrain(const v1::UndrainSlotRequest& req,
               std::function<void(absl::StatusOr<v1::Slot>)> done) override;
  void Checkpoint(const v1::CheckpointRunRequest& req,
                  std::function<void(absl::StatusOr<v1::CheckpointRunResponse>)> done) override;
  void CountApiCall(const std::string& method, int code) override {
    metrics_->CountApiCall(method, std::to_string(code));
  }

  // WorkerChannelBackend (gRPC threads).
  void OnConnected(std::shared_ptr<WorkerStream> stream) override;
  void OnMessage(std::shared_ptr<WorkerStream> stream, wv1::WorkerMessage m) override;
  void OnClosed(std::shared_ptr<WorkerStream> stream) override;

 private:
  RunUnit* Find(const std::string& id) {
    auto it = units_.find(id);
    return it == units_.end() ? nullptr : it->second.get();
  }
  absl::Status LoadRuns();
  // The operators' stored drains, put back on their slots at start-up.
  absl::Status LoadDrains(StateStore& store);
  void FillSlot(const Slot& s, v1::Slot* out) const;
  // The slot named "gpu:N", "cpu:N" or by its index; NotFound listing the
  // node's slots.
  absl::StatusOr<int> FindSlot(const std::string& name) const;
  // A slot was drained (by an operator, its GPU's health, or stranded too
  // long): the rank running there, if any, is stopped and its elastic gang
  // resized; the run hears why. A drain ended: runs waiting for slots hear
  // it, and the scheduler looks again.
  void OnSlotDrained(const Slot& s);
  void OnSlotUndrained(const Slot& s, const std::string& why);
  // Stores and publishes one event of run `run_id` (also a finished run's).
  void StoreRunEvent(const std::string& run_id, v1::EventKind kind, int rank,
                     const std::string& reason);
  // Elastic gangs running smaller than their world_size grow back once
  // free usable slots have stayed free for elastic.grow_after_s and no
  // other run is queued (docs/distributed.md, "Elastic").
  // The runs as elastic growth sees them (policy/elastic_growth.h).
  std::vector<GangView> GangViews() const;
  void GrowElasticGangs();
  void OnProcessExit(const std::string& id, int attempt, int rank) {
    if (RunUnit* u = Find(id)) u->OnProcessExit(attempt, rank);
  }
  void Schedule();
  void Tick();
  void SlowTick();
  void Watchdog();
  void UpdateMetrics();
  void OnSignal(int sig);
  void Reload();
  void BeginShutdown();
  void PublishPolicy(const std::vector<Token>& tokens);
  std::shared_ptr<const ApiPolicy> policy() const {
    std::lock_guard<std::mutex> lock(policy_mu_);
    return policy_;
  }

  DaemonConfig config_;  // loop thread; gRPC threads read policy_
  std::string config_path_;
  std::shared_ptr<spdlog::logger> log_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::steady_timer tick_, slow_tick_, watchdog_;
  asio::thread_pool pool_{2};
  // The cluster members' etcd calls (PoolTimers): each bounded by the
  // client's deadline, at most one in order and one renewal per member.
  asio::thread_pool etcd_pool_{4};
  std::unique_ptr<StoreThreads> store_;
  std::unique_ptr<Metrics> metrics_;
  ExitWatcher exits_;
  std::unique_ptr<LoopEnv> env_;
  std::unique_ptr<PoolTimers> etcd_timers_;
  std::unique_ptr<SlotTable> slots_;
  WatchHub hub_;
  std::map<std::string, std::unique_ptr<RunUnit>> units_;  // unfinished runs
  mutable std::mutex policy_mu_;
  std::shared_ptr<const ApiPolicy> policy_;
  WatcherCounts watcher_counts_;
  std::unique_ptr<SupervisorService> unix_api_, tcp_api_;
  std::unique_ptr<WorkerChannelService> unix_worker_, tcp_worker_;
  Servers servers_;
  std::mt19937_64 jitter_;  // backoff jitter only: never a secret
  std::string hostname_;
  int64_t started_ms_ = 0;
  bool shutting_down_ = false;
  bool schedule_posted_ = false;
  uint64_t watchdog_usec_ = 0;
  std::map<v1::RunState, int> terminal_counts_;
  std::vector<std::string> restart_needed_;
  int64_t store_failures_ = 0;
  std::map<std::string, double> grow_since_s_;  // run -> since when it could grow
  std::string store_error_;
};

}  // namespace trainsup::supervisor::internal

#endif  // TRAINSUP_SUPERVISOR_DAEMON_IMPL_H_
