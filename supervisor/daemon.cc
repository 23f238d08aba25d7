#include "supervisor/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_system.h"
#include "checkpoint/store.h"
#include "proto/exit_file.h"
#include "proto/spec.h"
#include "supervisor/gpu_monitor.h"
#include "supervisor/metrics.h"
#include "supervisor/outbox.h"
#include "supervisor/process.h"
#include "supervisor/progress_timeout.h"
#include "supervisor/restart_policy.h"
#include "supervisor/scheduler.h"
#include "supervisor/state_store.h"
#include "trainsup/v1/supervisor.grpc.pb.h"
#include "trainsup/v1/worker.grpc.pb.h"

#ifndef TRAINSUP_VERSION
#define TRAINSUP_VERSION "unknown"
#endif

namespace trainsup::supervisor {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
namespace wv1 = ::trainsup::worker::v1;

// How long a watcher may fall behind before its stream is closed.
constexpr size_t kMaxQueuedEvents = 20000;
// Progress is streamed live on every heartbeat but stored at most this often.
constexpr double kProgressPersistS = 30;
// Liveness and slot-release checks run this often: detection within a
// quarter second of a deadline, at a few wake-ups a second when idle.
constexpr double kTickS = 0.25;
// The least time an adopted worker has to reconnect after a daemon restart.
constexpr double kAdoptReconnectS = 10;

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool IsTerminal(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED ||
         s == v1::RUN_STATE_CANCELLED;
}

std::string StateName(v1::RunState s) {
  std::string name = v1::RunState_Name(s);
  return name.substr(std::string("RUN_STATE_").size());
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string RandomHex(std::mt19937_64& rng, int bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rng() & 0xff;
    out += kHex[v >> 4];
    out += kHex[v & 15];
  }
  return out;
}

// A TCP port nobody listens on right now, for the run's c10d rendezvous.
int FreeTcpPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Through the checkpoint library's FileSystem (the same fsync, rename and
// directory sync its commits use): the file is complete or absent.
absl::Status WriteFileAtomically(const std::string& path, const std::string& data) {
  ckpt::FileSystem* fs = ckpt::FileSystem::Default();
  const std::string tmp = path + ".tmp";
  absl::StatusOr<std::unique_ptr<ckpt::WritableFile>> file = fs->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  absl::Status s = (*file)->Append(data);
  if (s.ok()) s = (*file)->Sync();
  absl::Status closed = (*file)->Close();
  if (s.ok()) s = closed;
  if (s.ok()) s = fs->Rename(tmp, path);
  if (s.ok()) s = fs->SyncDir(fs::path(path).parent_path().string());
  return s;
}

RestartPolicy PolicyFrom(const RestartSection& r) {
  RestartPolicy p;
  p.initial_backoff_s = r.initial_backoff_s;
  p.max_backoff_s = r.max_backoff_s;
  p.multiplier = r.multiplier;
  p.jitter = r.jitter;
  p.max_restarts = static_cast<int>(r.max_restarts);
  p.restart_window_s = r.restart_window_s;
  p.max_oom_restarts = static_cast<int>(r.max_oom_restarts);
  p.crash_loop_attempts = static_cast<int>(r.crash_loop_attempts);
  return p;
}

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

class WorkerStream;
class Watcher;

// One rank of a run's current attempt.
struct Worker {
  int rank = 0;
  int slot = -1;
  std::string gpu;  // CUDA_VISIBLE_DEVICES
  int pid = 0;
  int pgid = 0;
  uint64_t start_ticks = 0;
  std::string token;
  bool own_child = false;  // we can waitpid() it (not adopted)
  bool alive = false;
  std::unique_ptr<asio::posix::stream_descriptor> pidfd;
  double launched_s = 0;
  double last_heartbeat_s = 0;  // 0: not heard yet this daemon life
  double last_progress_s = 0;
  bool heard = false;
  bool progressed = false;  // the loop advanced during this attempt
  uint64_t progress_counter = 0;
  double steps_per_s = 0;  // between the last two advances of the counter
  WorkerPhase phase = WorkerPhase::kLoading;
  std::shared_ptr<WorkerStream> stream;
  std::optional<ExitClass> forced;  // why we are killing it
  std::string forced_reason;
  bool stopping = false;
  std::unique_ptr<asio::steady_timer> kill_timer;
  std::optional<ExitFile> exit_report;
  v1::RankStatus status;
  double last_persist_s = 0;
};

struct RunRec {
  v1::Run run;  // attempts are kept in `attempt` and the store
  RunSpec spec;
  int64_t seq = 0;
  v1::Attempt attempt;  // the current (or last) attempt, ranks not filled
  std::vector<Worker> workers;
  std::vector<AttemptEnd> history;
  ProgressLearning learning;
  double learning_saved_s = 0;
  std::unique_ptr<asio::steady_timer> restart_timer;
  double not_before_s = 0;
  bool preparing = false;  // choosing the checkpoint before a launch
  bool cancel = false;
  std::string cancel_reason;
  bool shutdown_stop = false;
  int oom_exits = 0;
  double last_progress_persist_s = 0;
  int64_t last_checkpoint_ms = 0;
  std::vector<std::shared_ptr<Watcher>> watchers;
};

enum class SlotState { kFree, kBusy, kReleasing, kStranded };

struct SlotRec {
  int index = 0;
  int gpu_index = -1;  // -1: a CPU slot
  std::string gpu_uuid;
  SlotState state = SlotState::kFree;
  std::string run_id;
  int rank = -1;
  int pgid = 0;  // the last worker's group, for the release check
  double release_deadline_s = 0;
  std::string reason;
};

v1::SlotState ToProto(SlotState s) {
  switch (s) {
    case SlotState::kFree: return v1::SLOT_STATE_FREE;
    case SlotState::kBusy: return v1::SLOT_STATE_BUSY;
    case SlotState::kReleasing: return v1::SLOT_STATE_RELEASING;
    case SlotState::kStranded: return v1::SLOT_STATE_STRANDED;
  }
  return v1::SLOT_STATE_UNSPECIFIED;
}

// A WatchRun stream. The loop pushes events; the reactor writes them.
class Watcher : public grpc::ServerWriteReactor<v1::RunEvent> {
 public:
  Watcher()
      : outbox_([this](const v1::RunEvent* e) { StartWrite(e); },
                [this](const grpc::Status& s) { Finish(s); }, kMaxQueuedEvents) {}
  void OnWriteDone(bool ok) override { outbox_.OnWriteDone(ok); }
  void OnCancel() override { outbox_.Finish(grpc::Status::CANCELLED); }
  void OnDone() override {
    outbox_.Detach();
    self_.reset();  // may delete this
  }
  Outbox<v1::RunEvent>& outbox() { return outbox_; }
  // The reactor owns itself until OnDone; the loop holds shared_ptrs too.
  void Own(std::shared_ptr<Watcher> self) { self_ = std::move(self); }

 private:
  Outbox<v1::RunEvent> outbox_;
  std::shared_ptr<Watcher> self_;
};

// The daemon side of one worker's heartbeat stream.
class WorkerStream : public grpc::ServerBidiReactor<wv1::WorkerMessage, wv1::SupervisorCommand> {
 public:
  using Handler = std::function<void(std::shared_ptr<WorkerStream>, wv1::WorkerMessage)>;
  using CloseHandler = std::function<void(std::shared_ptr<WorkerStream>)>;

  WorkerStream(Handler on_message, CloseHandler on_close)
      : on_message_(std::move(on_message)), on_close_(std::move(on_close)),
        outbox_([this](const wv1::SupervisorCommand* c) { StartWrite(c); },
                [this](const grpc::Status& s) { Finish(s); }, 1000) {}

  void Begin(std::shared_ptr<WorkerStream> self) {
    self_ = self;
    weak_ = self;
    StartRead(&incoming_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      outbox_.Finish(grpc::Status::OK);
      return;
    }
    if (auto self = weak_.lock()) on_message_(self, incoming_);
    StartRead(&incoming_);
  }
  void OnWriteDone(bool ok) override { outbox_.OnWriteDone(ok); }
  void OnCancel() override { outbox_.Finish(grpc::Status::CANCELLED); }
  void OnDone() override {
    outbox_.Detach();
    if (auto self = weak_.lock()) on_close_(self);
    self_.reset();
  }
  void Send(wv1::SupervisorCommand command) { outbox_.Push(std::move(command)); }
  void Close(const grpc::Status& status) { outbox_.Finish(status); }

  // Set by the loop once the Hello was accepted.
  std::string run_id;
  int attempt = 0;
  int rank = -1;

 private:
  Handler on_message_;
  CloseHandler on_close_;
  wv1::WorkerMessage incoming_;
  Outbox<wv1::SupervisorCommand> outbox_;
  std::shared_ptr<WorkerStream> self_;
  std::weak_ptr<WorkerStream> weak_;
};

class DaemonImpl;

class SupervisorService final : public v1::Supervisor::CallbackService {
 public:
  explicit SupervisorService(DaemonImpl* d) : d_(d) {}
  grpc::ServerUnaryReactor* SubmitRun(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitRunRequest* req,
                                      v1::SubmitRunResponse* resp) override;
  grpc::ServerUnaryReactor* GetRun(grpc::CallbackServerContext* ctx, const v1::GetRunRequest* req,
                                   v1::Run* resp) override;
  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx,
                                     const v1::ListRunsRequest* req,
                                     v1::ListRunsResponse* resp) override;
  grpc::ServerWriteReactor<v1::RunEvent>* WatchRun(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchRunRequest* req) override;
  grpc::ServerUnaryReactor* CancelRun(grpc::CallbackServerContext* ctx,
                                      const v1::CancelRunRequest* req, v1::Run* resp) override;
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* ctx,
                                    const v1::GetNodeRequest* req, v1::Node* resp) override;

 private:
  DaemonImpl* d_;
};

class WorkerChannelService final : public wv1::WorkerChannel::CallbackService {
 public:
  explicit WorkerChannelService(DaemonImpl* d) : d_(d) {}
  grpc::ServerBidiReactor<wv1::WorkerMessage, wv1::SupervisorCommand>* Connect(
      grpc::CallbackServerContext* ctx) override;

 private:
  DaemonImpl* d_;
};

class DaemonImpl final : public Daemon {
 public:
  DaemonImpl(DaemonConfig config, std::string config_path, std::shared_ptr<spdlog::logger> log)
      : config_(std::move(config)), config_path_(std::move(config_path)), log_(std::move(log)),
        signals_(io_, SIGTERM, SIGINT, SIGHUP), tick_(io_), slow_tick_(io_), watchdog_(io_),
        rng_(std::random_device{}()) {}

  absl::Status Init();
  int Run() override;

  // --- called from gRPC threads -------------------------------------------
  // Authenticates the call's bearer token and checks its role.
  grpc::Status Authorize(grpc::CallbackServerContext* ctx, TokenRole needed,
                         const char* method) const;
  // Runs `fn` on the loop; `fn` finishes the reactor.
  template <class Fn>
  void OnLoop(Fn fn) {
    asio::post(io_, std::move(fn));
  }
  const DaemonConfig& config() const { return config_; }
  int total_slots() const { return static_cast<int>(slots_.size()); }
  Metrics* metrics() { return metrics_.get(); }

  // --- loop thread ------------------------------------------------------------
  grpc::Status Submit(const v1::SubmitRunRequest& req, const RunSpec& spec,
                      v1::SubmitRunResponse* resp);
  grpc::Status Get(const std::string& run_id, v1::Run* out);
  grpc::Status List(const v1::ListRunsRequest& req, v1::ListRunsResponse* out);
  void Watch(const v1::WatchRunRequest& req, std::shared_ptr<Watcher> watcher);
  grpc::Status Cancel(const v1::CancelRunRequest& req, v1::Run* out);
  void Node(v1::Node* out);
  void OnWorkerMessage(const std::shared_ptr<WorkerStream>& stream, const wv1::WorkerMessage& m);
  void OnWorkerStreamClosed(const std::shared_ptr<WorkerStream>& stream);

 private:
  // Start-up.
  absl::Status OpenSocketDir();
  absl::Status StartServer();
  void DiscoverSlots();
  void LoadRuns();
  void AdoptAttempt(RunRec& r, const v1::Run& stored);

  // Runs.
  RunRec* Find(const std::string& run_id) {
    auto it = runs_.find(run_id);
    return it == runs_.end() ? nullptr : it->second.get();
  }
  void Emit(RunRec& r, v1::RunEvent ev, bool persist = true);
  void SetState(RunRec& r, v1::RunState state, const std::string& reason);
  void PersistRun(RunRec& r);
  void PersistRank(RunRec& r, Worker& w);
  void Schedule();
  void PrepareAttempt(RunRec& r, std::vector<int> slots);
  void LaunchAttempt(const std::string& run_id, std::vector<int> slots, int64_t resume_step,
                     std::string resume_dir, std::vector<std::string> notes);
  void WatchExit(RunRec& r, Worker& w);
  void OnExit(const std::string& run_id, int attempt, int rank);
  void EndAttempt(RunRec& r);
  void StopWorker(RunRec& r, Worker& w, ExitClass why, const std::string& reason,
                  bool graceful);
  void EscalateKill(const std::string& run_id, int attempt, int rank, int step);
  void CheckLivenessAll();
  void CaptureAndKill(RunRec& r, Worker& w, ExitClass cls, const std::string& reason);
  void ReleaseSlot(int slot, int pgid);
  void CheckReleases();
  std::string RunDir(const std::string& run_id) const {
    return (fs::path(config_.daemon.state_dir) / "runs" / run_id).string();
  }
  std::vector<v1::Checkpoint> ListCheckpoints(const std::string& run_dir,
                                              int world_size);
  void FillLive(const RunRec& r, v1::Run* out);

  // Daemon life.
  void OnSignal(int sig);
  void Reload();
  void BeginShutdown();
  void Tick();
  void SlowTick();
  void Watchdog();
  void UpdateMetrics();
  void FinishRun(const std::string& run_id);

  DaemonConfig config_;
  std::string config_path_;
  std::shared_ptr<spdlog::logger> log_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::steady_timer tick_, slow_tick_, watchdog_;
  asio::thread_pool blocking_{2};
  std::mt19937_64 rng_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<GpuMonitor> gpus_;
  std::unique_ptr<Metrics> metrics_;
  mutable std::mutex tokens_mu_;
  std::vector<Token> tokens_;
  std::map<std::string, std::unique_ptr<RunRec>> runs_;  // unfinished runs
  std::vector<SlotRec> slots_;
  std::unique_ptr<SupervisorService> api_service_;
  std::unique_ptr<WorkerChannelService> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string socket_path_;
  std::string worker_binary_;
  std::string hostname_;
  int64_t started_ms_ = 0;
  bool shutting_down_ = false;
  double shutdown_deadline_s_ = 0;
  uint64_t watchdog_usec_ = 0;
  std::map<v1::RunState, int> terminal_counts_;
  int exit_code_ = 0;
};

// --- start-up ------------------------------------------------------------------

absl::Status DaemonImpl::Init() {
  started_ms_ = WallMs();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  hostname_ = host;
  std::error_code ec;
  fs::create_directories(fs::path(config_.daemon.state_dir) / "runs", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create state directory ", config_.daemon.state_dir, ": ", ec.message()));
  }
  chmod(config_.daemon.state_dir.c_str(), 0750);
  absl::StatusOr<std::unique_ptr<StateStore>> store =
      StateStore::Open((fs::path(config_.daemon.state_dir) / "trainsupd.db").string());
  if (!store.ok()) return store.status();
  store_ = std::move(*store);

  absl::StatusOr<std::vector<Token>> tokens = LoadTokens(config_);
  if (!tokens.ok()) return tokens.status();
  tokens_ = std::move(*tokens);

  worker_binary_ = config_.daemon.worker_binary;
  if (worker_binary_.empty()) {
    worker_binary_ = (fs::read_symlink("/proc/self/exe", ec).parent_path() / "trainsup-worker").string();
  }
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create(config_.daemon.metrics_address, config_.daemon.metrics_allow_remote);
  if (!metrics.ok()) return metrics.status();
  metrics_ = std::move(*metrics);
  metrics_->SetDaemonInfo(TRAINSUP_VERSION, started_ms_ / 1000.0);

  DiscoverSlots();
  LoadRuns();
  absl::Status s = StartServer();
  if (!s.ok()) return s;
  return absl::OkStatus();
}

void DaemonImpl::DiscoverSlots() {
  if (!config_.testing.fake_gpu_file.empty()) {
    gpus_ = OpenFakeMonitor(config_.testing.fake_gpu_file);
  } else if (config_.slots.use_gpus) {
    gpus_ = OpenNvmlMonitor();
  }
  slots_.clear();
  if (gpus_ && gpus_->available()) {
    absl::StatusOr<std::vector<GpuInfo>> gpus = gpus_->Query();
    if (gpus.ok()) {
      for (const GpuInfo& g : *gpus) {
        SlotRec s;
        s.index = static_cast<int>(slots_.size());
        s.gpu_index = g.index;
        s.gpu_uuid = g.uuid;
        slots_.push_back(s);
      }
    } else {
      log_->warn("GPU query failed, using CPU slots: {}", std::string(gpus.status().message()));
    }
  }
  if (slots_.empty()) {
    for (int i = 0; i < config_.slots.cpu_slots; ++i) {
      SlotRec s;
      s.index = i;
      slots_.push_back(s);
    }
  }
  log_->info("{} slots ({})", slots_.size(),
             !slots_.empty() && slots_[0].gpu_index >= 0 ? "GPU" : "CPU");
}

// Rebuilds the in-memory runs from the store. Workers of an attempt that was
// running when the previous daemon stopped are adopted when their process is
// still the one we started (pid and start time), else classified from their
// exit files.
void DaemonImpl::LoadRuns() {
  std::string token;
  for (;;) {
    absl::StatusOr<RunPage> page = store_->ListRuns({}, StateStore::kMaxPageSize, token);
    if (!page.ok()) break;
    for (const v1::Run& run : page->runs) {
      if (IsTerminal(run.state())) terminal_counts_[run.state()]++;
    }
    if (page->next_page_token.empty()) break;
    token = page->next_page_token;
  }
  absl::StatusOr<std::vector<v1::Run>> runs = store_->LoadUnfinishedRuns();
  if (!runs.ok()) {
    log_->error("cannot load runs: {}", std::string(runs.status().message()));
    return;
  }
  for (const v1::Run& stored : *runs) {
    auto r = std::make_unique<RunRec>();
    r->run = stored;
    r->run.clear_attempts();
    absl::StatusOr<RunSpec> spec = ParseRunSpec(stored.spec_toml());
    if (!spec.ok()) {
      log_->error("run={} stored spec no longer parses: {}", stored.run_id(),
                  std::string(spec.status().message()));
    } else {
      r->spec = *spec;
    }
    absl::StatusOr<RunLearning> learning = store_->GetLearning(stored.run_id());
    if (learning.ok()) {
      r->learning.slowest_step_s = learning->slowest_step_s;
      r->learning.steps_observed = learning->steps_observed;
    }
    for (const v1::Attempt& a : stored.attempts()) {
      if (a.ended_ms() == 0) continue;
      AttemptEnd end;
      end.end_s = a.ended_ms() / 1000.0;
      end.cls = ExitClassFromProto(a.exit_class()).value_or(ExitClass::kCrash);
      for (const v1::RankStatus& rs : a.ranks()) {
        if (rs.progress().step() > std::max<int64_t>(a.resumed_from_step(), 0)) end.made_progress = true;
      }
      end.stop_requested = end.cls == ExitClass::kCancelled;
      end.detail = a.exit_reason();
      r->history.push_back(end);
      if (end.cls == ExitClass::kOom) r->oom_exits++;
    }
    std::string id = stored.run_id();
    RunRec& rr = *r;
    runs_[id] = std::move(r);
    switch (stored.state()) {
      case v1::RUN_STATE_STARTING:
      case v1::RUN_STATE_RUNNING:
        if (stored.attempts_size() > 0 && stored.attempts().rbegin()->ended_ms() == 0) {
          AdoptAttempt(rr, stored);
        } else {
          SetState(rr, v1::RUN_STATE_PENDING, "daemon restarted before the attempt started");
        }
        break;
      case v1::RUN_STATE_RESTARTING: {
        double delay = std::max<double>(0, (stored.next_restart_ms() - WallMs()) / 1000.0);
        rr.not_before_s = NowS() + delay;
        if (stored.attempts_size() > 0) rr.attempt = *stored.attempts().rbegin();
        rr.attempt.clear_ranks();
        break;
      }
      default:
        if (stored.attempts_size() > 0) rr.attempt = *stored.attempts().rbegin();
        rr.attempt.clear_ranks();
        break;
    }
  }
  log_->info("loaded {} unfinished runs", runs_.size());
}

void DaemonImpl::AdoptAttempt(RunRec& r, const v1::Run& stored) {
  const v1::Attempt& a = *stored.attempts().rbegin();
  r.attempt = a;
  r.attempt.clear_ranks();
  int adopted = 0;
  double now = NowS();
  for (const v1::RankStatus& rs : a.ranks()) {
    Worker w;
    w.rank = rs.rank();
    w.slot = rs.slot();
    w.gpu = rs.gpu();
    w.pid = rs.pid();
    w.status = rs;
    w.launched_s = now;
    absl::StatusOr<RankPrivate> priv = store_->GetRankPrivate(r.run.run_id(), a.number(), rs.rank());
    if (priv.ok()) {
      w.pgid = priv->pgid;
      w.start_ticks = priv->start_ticks;
      w.token = priv->token;
    }
    if (w.slot >= 0 && w.slot < static_cast<int>(slots_.size())) {
      slots_[w.slot].state = SlotState::kBusy;
      slots_[w.slot].run_id = r.run.run_id();
      slots_[w.slot].rank = w.rank;
      slots_[w.slot].pgid = w.pgid;
    }
    w.alive = rs.alive() && w.pid > 0 && IsSameProcess(w.pid, w.start_ticks);
    w.own_child = false;
    // An adopted worker gets a fresh heartbeat timeout to reconnect in, and
    // at least kAdoptReconnectS: its reconnect backoff grows to 5 s while
    // no daemon answers.
    w.last_heartbeat_s = now + std::max(0.0, kAdoptReconnectS - config_.workers.heartbeat_timeout_s);
    w.last_progress_s = now;
    w.heard = true;
    w.progressed = true;
    r.workers.push_back(std::move(w));
    if (r.workers.back().alive) adopted++;
  }
  Emit(r, [&] {
    v1::RunEvent e;
    e.set_kind(v1::EVENT_KIND_LOG);
    e.set_rank(-1);
    e.set_reason(absl::StrCat("daemon restarted: adopted ", adopted, " of ", a.ranks_size(),
                              " workers of attempt ", a.number()));
    return e;
  }());
  log_->info("run={} attempt={} adopted {} of {} workers", r.run.run_id(), a.number(), adopted,
             a.ranks_size());
  for (Worker& w : r.workers) {
    if (w.alive) {
      WatchExit(r, w);
    } else if (w.status.alive()) {
      // Died while no daemon was watching: classified from its exit file.
      w.alive = true;
      asio::post(io_, [this, id = r.run.run_id(), n = a.number(), rank = w.rank] {
        OnExit(id, n, rank);
      });
    }
  }
  bool any_alive = false;
  for (const Worker& w : r.workers) any_alive = any_alive || w.alive;
  if (!any_alive) {
    asio::post(io_, [this, id = r.run.run_id()] {
      if (RunRec* rr = Find(id)) EndAttempt(*rr);
    });
  }
}

absl::Status DaemonImpl::OpenSocketDir() {
  socket_path_ = config_.daemon.socket_path;
  if (socket_path_.empty()) {
    socket_path_ = (fs::path(config_.daemon.state_dir) / "run" / "trainsupd.sock").string();
  }
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("daemon.socket_path: longer than ", sizeof(sockaddr_un::sun_path) - 1,
                     " bytes: ", socket_path_));
  }
  std::error_code ec;
  fs::path dir = fs::path(socket_path_).parent_path();
  if (!fs::exists(dir)) {
    fs::create_directories(dir, ec);
    if (ec) return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
    chmod(dir.c_str(), 0750);
  }
  if (fs::exists(socket_path_)) {
    // A socket someone answers on belongs to a live daemon: never steal it.
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
    bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (live) {
      return absl::FailedPreconditionError(
          absl::StrCat("another trainsupd is serving ", socket_path_));
    }
    fs::remove(socket_path_, ec);
  }
  return absl::OkStatus();
}

absl::Status DaemonImpl::StartServer() {
  absl::Status s = OpenSocketDir();
  if (!s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // The socket is created 0660 (umask while binding): never briefly wider.
  mode_t old_umask = umask(0117);
  builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
  if (!config_.daemon.tcp_address.empty()) {
    auto read = [](const std::string& path) {
      std::ifstream in(path);
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    };
    grpc::SslServerCredentialsOptions ssl(
        config_.daemon.tls_client_ca.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_key_cert_pairs.push_back({read(config_.daemon.tls_key), read(config_.daemon.tls_cert)});
    if (!config_.daemon.tls_client_ca.empty()) ssl.pem_root_certs = read(config_.daemon.tls_client_ca);
    builder.AddListeningPort(config_.daemon.tcp_address, grpc::SslServerCredentials(ssl));
  }
  api_service_ = std::make_unique<SupervisorService>(this);
  worker_service_ = std::make_unique<WorkerChannelService>(this);
  builder.RegisterService(api_service_.get());
  builder.RegisterService(worker_service_.get());
  server_ = builder.BuildAndStart();
  umask(old_umask);
  if (!server_) {
    return absl::UnavailableError(absl::StrCat("cannot listen on unix:", socket_path_,
                                               config_.daemon.tcp_address.empty() ? "" : " or ",
                                               config_.daemon.tcp_address));
  }
  chmod(socket_path_.c_str(), 0660);
  if (!config_.daemon.socket_group.empty()) {
    if (group* g = getgrnam(config_.daemon.socket_group.c_str())) {
      if (chown(socket_path_.c_str(), -1, g->gr_gid) != 0) {
        log_->warn("cannot chgrp {} to {}: {}", socket_path_, config_.daemon.socket_group, strerror(errno));
      }
    } else {
      log_->warn("daemon.socket_group {} does not exist", config_.daemon.socket_group);
    }
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  log_->info("serving on unix:{}{}", socket_path_,
             config_.daemon.tcp_address.empty() ? "" : " and " + config_.daemon.tcp_address + " (TLS)");
  return absl::OkStatus();
}

// --- events and state ------------------------------------------------------------

void DaemonImpl::Emit(RunRec& r, v1::RunEvent ev, bool persist) {
  ev.set_run_id(r.run.run_id());
  if (ev.time_ms() == 0) ev.set_time_ms(WallMs());
  if (ev.attempt() == 0) ev.set_attempt(r.attempt.number());
  if (ev.state() == v1::RUN_STATE_UNSPECIFIED) ev.set_state(r.run.state());
  if (persist) {
    absl::StatusOr<int64_t> seq = store_->AppendEvent(&ev);
    if (!seq.ok()) log_->error("run={} cannot store event: {}", r.run.run_id(), std::string(seq.status().message()));
  }
  for (auto it = r.watchers.begin(); it != r.watchers.end();) {
    if ((*it)->outbox().finished() || !(*it)->outbox().Push(ev)) {
      it = r.watchers.erase(it);
    } else {
      ++it;
    }
  }
}

void DaemonImpl::PersistRun(RunRec& r) {
  r.run.set_updated_ms(WallMs());
  absl::Status s = store_->UpdateRun(r.run);
  if (!s.ok()) log_->error("run={} cannot store run: {}", r.run.run_id(), std::string(s.message()));
}

void DaemonImpl::PersistRank(RunRec& r, Worker& w) {
  RankPrivate priv{w.pgid, w.start_ticks, w.token};
  w.status.set_rank(w.rank);
  w.status.set_pid(w.pid);
  w.status.set_slot(w.slot);
  w.status.set_gpu(w.gpu);
  absl::Status s = store_->UpsertRank(r.run.run_id(), r.attempt.number(), w.status, priv);
  if (!s.ok()) log_->error("run={} rank={} cannot store rank: {}", r.run.run_id(), w.rank, std::string(s.message()));
  w.last_persist_s = NowS();
}

void DaemonImpl::SetState(RunRec& r, v1::RunState state, const std::string& reason) {
  v1::RunState old = r.run.state();
  r.run.set_state(state);
  r.run.set_reason(reason);
  if (IsTerminal(state)) r.run.set_ended_ms(WallMs());
  v1::RunEvent ev;
  ev.set_run_id(r.run.run_id());
  ev.set_time_ms(WallMs());
  ev.set_attempt(r.attempt.number());
  ev.set_kind(v1::EVENT_KIND_STATE);
  ev.set_state(state);
  ev.set_rank(-1);
  ev.set_reason(reason);
  absl::Status s = store_->Transaction([&]() -> absl::Status {
    r.run.set_updated_ms(WallMs());
    absl::Status u = store_->UpdateRun(r.run);
    if (!u.ok()) return u;
    return store_->AppendEvent(&ev).status();
  });
  if (!s.ok()) log_->error("run={} cannot store state {}: {}", r.run.run_id(), StateName(state), std::string(s.message()));
  log_->info("run={} {} -> {}: {}", r.run.run_id(), StateName(old), StateName(state), reason);
  Emit(r, ev, /*persist=*/false);
  if (IsTerminal(state)) {
    terminal_counts_[state]++;
    for (auto& w : r.watchers) w->outbox().Finish(grpc::Status::OK);
    r.watchers.clear();
    asio::post(io_, [this, id = r.run.run_id()] { FinishRun(id); });
  }
}

void DaemonImpl::FinishRun(const std::string& run_id) {
  auto it = runs_.find(run_id);
  if (it == runs_.end() || !IsTerminal(it->second->run.state())) return;
  for (const Worker& w : it->second->workers) {
    if (w.alive) return;  // still being stopped; removed after its exit
    metrics_->RemoveWorker(run_id, w.rank);
  }
  metrics_->RemoveRun(run_id);
  runs_.erase(it);
}

// --- submit, get, list, watch, cancel, node ------------------------------------------

grpc::Status DaemonImpl::Submit(const v1::SubmitRunRequest& req, const RunSpec& spec,
                                v1::SubmitRunResponse* resp) {
  if (shutting_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "trainsupd is shutting down");
  if (!req.request_id().empty()) {
    absl::StatusOr<std::string> existing = store_->FindRunByRequestId(req.request_id());
    if (existing.ok()) {
      resp->set_run_id(*existing);
      return grpc::Status::OK;
    }
  }
  std::string run_id;
  for (int i = 0; i < 100; ++i) {
    run_id = absl::StrCat(spec.name.substr(0, 40), "-", RandomHex(rng_, 4));
    if (!store_->GetRun(run_id).ok()) break;
  }
  std::string dir = RunDir(run_id);
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "attempts", ec);
  if (ec) return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot create ", dir, ": ", ec.message()));
  absl::Status w = WriteFileAtomically((fs::path(dir) / "spec.toml").string(), req.spec_toml());
  auto undo = [&] { fs::remove_all(dir, ec); };
  if (!w.ok()) {
    undo();
    return ToGrpc(w);
  }
  auto r = std::make_unique<RunRec>();
  r->spec = spec;
  v1::Run& run = r->run;
  run.set_run_id(run_id);
  run.set_name(spec.name);
  run.set_state(v1::RUN_STATE_PENDING);
  run.set_priority(static_cast<int>(spec.priority));
  run.set_world_size(static_cast<int>(spec.world_size));
  run.set_created_ms(WallMs());
  run.set_updated_ms(run.created_ms());
  run.set_spec_toml(req.spec_toml());
  run.set_reason("submitted");
  run.set_run_dir(dir);
  v1::RunEvent ev;
  ev.set_kind(v1::EVENT_KIND_STATE);
  ev.set_run_id(run_id);
  ev.set_time_ms(run.created_ms());
  ev.set_state(v1::RUN_STATE_PENDING);
  ev.set_rank(-1);
  ev.set_reason("submitted");
  absl::Status s = store_->Transaction([&]() -> absl::Status {
    absl::Status c = store_->CreateRun(run, req.request_id());
    if (!c.ok()) return c;
    return store_->AppendEvent(&ev).status();
  });
  if (!s.ok()) {
    undo();
    return ToGrpc(s);
  }
  log_->info("run={} submitted: {} world_size={} priority={}", run_id, spec.name, spec.world_size, spec.priority);
  absl::StatusOr<int64_t> seq = store_->NextRunSeq();
  r->seq = seq.ok() ? *seq - 1 : 0;
  runs_[run_id] = std::move(r);
  resp->set_run_id(run_id);
  asio::post(io_, [this] { Schedule(); });
  return grpc::Status::OK;
}

std::vector<v1::Checkpoint> DaemonImpl::ListCheckpoints(const std::string& run_dir,
                                                        int world_size) {
  std::vector<v1::Checkpoint> out;
  fs::path root = fs::path(run_dir) / "checkpoints";
  if (world_size > 1) root /= "rank-0";
  if (!fs::exists(root)) return out;
  ckpt::CheckpointStore store(root.string());
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = store.List();
  if (!list.ok()) return out;
  for (const ckpt::CheckpointInfo& info : *list) {
    v1::Checkpoint c;
    c.set_step(info.step);
    c.set_path(info.path);
    std::error_code ec;
    auto t = fs::last_write_time(info.path, ec);
    if (!ec) {
      auto sys = std::chrono::time_point_cast<std::chrono::milliseconds>(
          t - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
      c.set_created_ms(sys.time_since_epoch().count());
    }
    int64_t bytes = 0;
    for (const auto& e : fs::directory_iterator(info.path, ec)) {
      if (e.is_regular_file(ec)) bytes += static_cast<int64_t>(e.file_size(ec));
    }
    c.set_bytes(bytes);
    out.push_back(c);
  }
  return out;
}

// Overlays what only the loop knows (live ranks, heartbeats) on a stored run.
void DaemonImpl::FillLive(const RunRec& r, v1::Run* out) {
  *out->mutable_progress() = r.run.progress();
  for (v1::Attempt& a : *out->mutable_attempts()) {
    if (a.number() != r.attempt.number()) continue;
    a.clear_ranks();
    for (const Worker& w : r.workers) {
      v1::RankStatus rs = w.status;
      rs.set_rank(w.rank);
      rs.set_pid(w.pid);
      rs.set_slot(w.slot);
      rs.set_gpu(w.gpu);
      rs.set_alive(w.alive);
      *a.add_ranks() = rs;
    }
  }
}

grpc::Status DaemonImpl::Get(const std::string& run_id, v1::Run* out) {
  absl::StatusOr<v1::Run> run = store_->GetRun(run_id);
  if (!run.ok()) {
    if (run.status().code() == absl::StatusCode::kNotFound) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no run ", run_id));
    }
    return ToGrpc(run.status());
  }
  *out = *run;
  if (const RunRec* r = Find(run_id)) FillLive(*r, out);
  for (const v1::Checkpoint& c : ListCheckpoints(out->run_dir(), out->world_size())) {
    *out->add_checkpoints() = c;
  }
  return grpc::Status::OK;
}

grpc::Status DaemonImpl::List(const v1::ListRunsRequest& req, v1::ListRunsResponse* out) {
  std::vector<v1::RunState> states;
  for (int s : req.states()) states.push_back(static_cast<v1::RunState>(s));
  absl::StatusOr<RunPage> page = store_->ListRuns(states, req.page_size(), req.page_token());
  if (!page.ok()) return ToGrpc(page.status());
  for (v1::Run& run : page->runs) {
    if (const RunRec* r = Find(run.run_id())) *run.mutable_progress() = r->run.progress();
    *out->add_runs() = std::move(run);
  }
  out->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

void DaemonImpl::Watch(const v1::WatchRunRequest& req, std::shared_ptr<Watcher> watcher) {
  absl::StatusOr<v1::Run> run = store_->GetRun(req.run_id());
  if (!run.ok()) {
    watcher->outbox().Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no run ", req.run_id())));
    return;
  }
  if (req.include_history()) {
    absl::StatusOr<std::vector<v1::RunEvent>> events = store_->ListEvents(req.run_id(), 0, 0);
    if (events.ok()) {
      for (v1::RunEvent& e : *events) watcher->outbox().Push(std::move(e));
    }
  }
  RunRec* r = Find(req.run_id());
  if (r == nullptr || IsTerminal(run->state())) {
    if (!req.include_history()) {
      // Still tell the client how the run ended.
      v1::RunEvent e;
      e.set_run_id(req.run_id());
      e.set_kind(v1::EVENT_KIND_STATE);
      e.set_state(run->state());
      e.set_reason(run->reason());
      e.set_time_ms(run->ended_ms());
      e.set_rank(-1);
      watcher->outbox().Push(e);
    }
    watcher->outbox().Finish(grpc::Status::OK);
    return;
  }
  r->watchers.push_back(std::move(watcher));
}

grpc::Status DaemonImpl::Cancel(const v1::CancelRunRequest& req, v1::Run* out) {
  RunRec* r = Find(req.run_id());
  if (r == nullptr) {
    grpc::Status s = Get(req.run_id(), out);
    if (!s.ok()) return s;
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("run ", req.run_id(), " already ended: ", StateName(out->state())));
  }
  std::string reason = req.reason().empty() ? "cancelled" : absl::StrCat("cancelled: ", req.reason());
  if (!r->cancel) {
    r->cancel = true;
    r->cancel_reason = reason;
    bool any_alive = false;
    for (Worker& w : r->workers) {
      if (w.alive) {
        any_alive = true;
        StopWorker(*r, w, ExitClass::kCancelled, reason, /*graceful=*/true);
      }
    }
    if (!any_alive && !r->preparing) {
      if (r->restart_timer) r->restart_timer->cancel();
      SetState(*r, v1::RUN_STATE_CANCELLED, reason);
    }
  }
  return Get(req.run_id(), out);
}

void DaemonImpl::Node(v1::Node* out) {
  out->set_hostname(hostname_);
  out->set_version(TRAINSUP_VERSION);
  out->set_started_ms(started_ms_);
  out->set_uptime_s((WallMs() - started_ms_) / 1000);
  out->set_nvml(gpus_ && gpus_->available());
  for (const SlotRec& s : slots_) {
    v1::Slot* slot = out->add_slots();
    slot->set_index(s.index);
    slot->set_gpu(s.gpu_index >= 0);
    slot->set_gpu_index(s.gpu_index);
    slot->set_state(ToProto(s.state));
    slot->set_run_id(s.run_id);
    slot->set_rank(s.rank);
    slot->set_reason(s.reason);
  }
  if (gpus_ && gpus_->available()) {
    absl::StatusOr<std::vector<GpuInfo>> gpus = gpus_->Query();
    if (gpus.ok()) {
      for (const GpuInfo& g : *gpus) {
        v1::Gpu* gpu = out->add_gpus();
        gpu->set_index(g.index);
        gpu->set_uuid(g.uuid);
        gpu->set_name(g.name);
        gpu->set_memory_total_bytes(g.memory_total);
        gpu->set_memory_used_bytes(g.memory_used);
        bool stranded = false;
        for (const SlotRec& s : slots_) {
          if (s.gpu_index == g.index && s.state == SlotState::kStranded) {
            stranded = true;
            gpu->set_reason(s.reason);
          }
        }
        gpu->set_healthy(!stranded);
      }
    }
  }
  int pending = 0, active = 0;
  for (const auto& [id, r] : runs_) {
    if (r->run.state() == v1::RUN_STATE_PENDING) pending++;
    else if (!IsTerminal(r->run.state())) active++;
  }
  out->set_runs_pending(pending);
  out->set_runs_active(active);
}

// --- scheduling and launching -------------------------------------------------------

void DaemonImpl::Schedule() {
  if (shutting_down_) return;
  std::vector<QueuedRun> queue;
  for (const auto& [id, r] : runs_) {
    v1::RunState s = r->run.state();
    if ((s == v1::RUN_STATE_PENDING || s == v1::RUN_STATE_RESTARTING) && !r->preparing &&
        !r->cancel) {
      queue.push_back({id, r->run.priority(), r->seq, r->run.world_size(), r->not_before_s});
    }
  }
  if (queue.empty()) return;
  std::vector<SlotView> views;
  for (const SlotRec& s : slots_) views.push_back({s.index, s.state == SlotState::kFree});
  for (const Placement& p : supervisor::Schedule(queue, views, NowS())) {
    if (RunRec* r = Find(p.run_id)) PrepareAttempt(*r, p.slots);
  }
}

// Chooses the checkpoint to resume from (verifying it: hashing can take a
// while, so off the loop), then launches every rank.
void DaemonImpl::PrepareAttempt(RunRec& r, std::vector<int> slots) {
  r.preparing = true;
  for (size_t i = 0; i < slots.size(); ++i) {
    SlotRec& s = slots_[slots[i]];
    s.state = SlotState::kBusy;
    s.run_id = r.run.run_id();
    s.rank = static_cast<int>(i);
    s.reason.clear();
  }
  std::string run_dir = r.run.run_dir();
  int world = r.run.world_size();
  asio::post(blocking_, [this, id = r.run.run_id(), run_dir, world, slots]() mutable {
    std::vector<std::string> notes;
    int64_t step = -1;
    std::string dir;
    fs::path root = fs::path(run_dir) / "checkpoints";
    if (world == 1) {
      if (fs::exists(root)) {
        ckpt::CheckpointStore store(root.string());
        std::vector<ckpt::QuarantineReport> quarantined;
        absl::StatusOr<ckpt::CheckpointInfo> latest = store.ChooseLatest(&quarantined);
        for (const auto& q : quarantined) {
          notes.push_back(absl::StrCat("checkpoint step ", q.step, " quarantined: ", q.reason));
        }
        if (latest.ok()) {
          step = latest->step;
          dir = latest->path;
        }
      }
    } else {
      // The newest step that every rank committed and that verifies on all.
      std::vector<std::unique_ptr<ckpt::CheckpointStore>> stores;
      std::map<int64_t, int> count;
      for (int rank = 0; rank < world; ++rank) {
        fs::path rr = root / absl::StrCat("rank-", rank);
        stores.push_back(std::make_unique<ckpt::CheckpointStore>(rr.string()));
        if (!fs::exists(rr)) continue;
        absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = stores.back()->List();
        if (!list.ok()) continue;
        for (const auto& info : *list) count[info.step]++;
      }
      for (auto it = count.rbegin(); it != count.rend() && step < 0; ++it) {
        if (it->second != world) continue;
        bool all_good = true;
        for (int rank = 0; rank < world && all_good; ++rank) {
          absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = stores[rank]->List();
          if (!list.ok()) { all_good = false; break; }
          for (const auto& info : *list) {
            if (info.step != it->first) continue;
            absl::Status v = stores[rank]->Verify(info);
            if (!v.ok()) {
              all_good = false;
              auto q = stores[rank]->Quarantine(info, std::string(v.message()));
              notes.push_back(absl::StrCat("rank ", rank, " checkpoint step ", info.step,
                                           " quarantined: ", std::string(v.message())));
            }
          }
        }
        if (all_good) {
          step = it->first;
          dir = (root / "rank-0" / absl::StrCat("step-", step)).string();
        }
      }
    }
    asio::post(io_, [this, id, slots, step, dir, notes] { LaunchAttempt(id, slots, step, dir, notes); });
  });
}

void DaemonImpl::LaunchAttempt(const std::string& run_id, std::vector<int> slots,
                               int64_t resume_step, std::string resume_dir,
                               std::vector<std::string> notes) {
  RunRec* rp = Find(run_id);
  if (rp == nullptr) return;
  RunRec& r = *rp;
  r.preparing = false;
  if (r.cancel || shutting_down_) {
    for (int s : slots) slots_[s] = SlotRec{slots_[s].index, slots_[s].gpu_index, slots_[s].gpu_uuid};
    if (r.cancel) SetState(r, v1::RUN_STATE_CANCELLED, r.cancel_reason);
    return;
  }
  for (const std::string& note : notes) {
    v1::RunEvent e;
    e.set_kind(v1::EVENT_KIND_CHECKPOINT);
    e.set_rank(-1);
    e.set_reason(note);
    Emit(r, e);
  }
  int number = r.attempt.number() + 1;
  r.attempt = v1::Attempt();
  r.attempt.set_number(number);
  r.attempt.set_started_ms(WallMs());
  r.attempt.set_resumed_from_step(resume_step);
  r.attempt.set_resumed_from(resume_dir);
  r.workers.clear();
  absl::Status s = store_->UpsertAttempt(run_id, r.attempt);
  if (!s.ok()) log_->error("run={} cannot store attempt: {}", run_id, std::string(s.message()));
  SetState(r, v1::RUN_STATE_STARTING,
           resume_step >= 0 ? absl::StrCat("attempt ", number, " resuming from step ", resume_step)
                            : absl::StrCat("attempt ", number, " starting from scratch"));
  {
    v1::RunEvent e;
    e.set_kind(v1::EVENT_KIND_ATTEMPT_STARTED);
    e.set_rank(-1);
    e.set_checkpoint_step(resume_step);
    e.set_reason(resume_step >= 0 ? absl::StrCat("resumed from ", resume_dir) : "from scratch");
    Emit(r, e);
  }
  int port = FreeTcpPort();
  std::string budget_env;
  if (r.spec.train.memory_budget_mb > 0 && r.oom_exits > 0 && config_.restart.oom_budget_factor < 1.0) {
    double mb = r.spec.train.memory_budget_mb * std::pow(config_.restart.oom_budget_factor, r.oom_exits);
    budget_env = std::to_string(std::max<int64_t>(1, static_cast<int64_t>(mb)));
  }
  bool launch_failed = false;
  std::string failure;
  for (size_t i = 0; i < slots.size(); ++i) {
    Worker w;
    w.rank = static_cast<int>(i);
    w.slot = slots[i];
    const SlotRec& slot = slots_[w.slot];
    w.gpu = slot.gpu_index >= 0 ? (slot.gpu_uuid.empty() ? std::to_string(slot.gpu_index) : slot.gpu_uuid) : "";
    w.token = RandomHex(rng_, 32);
    LaunchSpec spec;
    spec.binary = worker_binary_;
    spec.args = {"--run-dir", r.run.run_dir(), "--rank", std::to_string(w.rank),
                 "--world-size", std::to_string(r.run.world_size()), "--attempt",
                 std::to_string(number), "--supervisor", "unix:" + socket_path_,
                 "--resume", resume_step >= 0 ? std::to_string(resume_step) : "none"};
    for (const char* name : {"PATH", "HOME", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH",
                             "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
      if (const char* v = getenv(name)) spec.env[name] = v;
    }
    if (spec.env.count("PATH") == 0) spec.env["PATH"] = "/usr/local/bin:/usr/bin:/bin";
    spec.env["TRAINSUP_TOKEN"] = w.token;
    spec.env["TRAINSUP_RUN_ID"] = run_id;
    spec.env["TRAINSUP_ATTEMPT"] = std::to_string(number);
    spec.env["CUDA_VISIBLE_DEVICES"] = w.gpu;
    spec.env["RANK"] = std::to_string(w.rank);
    spec.env["LOCAL_RANK"] = std::to_string(w.rank);
    spec.env["WORLD_SIZE"] = std::to_string(r.run.world_size());
    spec.env["MASTER_ADDR"] = "127.0.0.1";
    spec.env["MASTER_PORT"] = std::to_string(port);
    if (!budget_env.empty()) spec.env["TRAINSUP_MEMORY_BUDGET_MB"] = budget_env;
    spec.working_dir = r.run.run_dir();
    spec.log_path = (fs::path(r.run.run_dir()) / "attempts" / std::to_string(number) /
                     absl::StrCat("rank-", w.rank, ".log"))
                        .string();
    w.status.set_log_path(spec.log_path);
    w.status.set_exit_code(-1);
    w.launched_s = NowS();
    w.last_progress_s = w.launched_s;
    if (!launch_failed) {
      absl::StatusOr<LaunchedProcess> p = Launch(spec);
      if (p.ok()) {
        w.pid = p->pid;
        w.pgid = p->pgid;
        w.start_ticks = p->start_ticks;
        w.own_child = true;
        w.alive = true;
        w.status.set_alive(true);
        slots_[w.slot].pgid = w.pgid;
        log_->info("run={} attempt={} rank={} started pid {} on slot {}{}", run_id, number, w.rank,
                   w.pid, w.slot, resume_step >= 0 ? absl::StrCat(" from step ", resume_step) : "");
      } else {
        launch_failed = true;
        failure = absl::StrCat("cannot start ", worker_binary_, ": ", std::string(p.status().message()));
      }
    }
    if (!w.alive) {
      w.status.set_exit_class(static_cast<v1::ExitClass>(ToProto(ExitClass::kCrash)));
      w.status.set_exit_reason(launch_failed ? failure : "not started: another rank failed to start");
    }
    r.workers.push_back(std::move(w));
    PersistRank(r, r.workers.back());
  }
  if (launch_failed) {
    log_->error("run={} attempt={} {}", run_id, number, failure);
    for (Worker& w : r.workers) {
      if (w.alive) StopWorker(r, w, ExitClass::kGang, failure, /*graceful=*/false);
    }
  }
  for (Worker& w : r.workers) {
    if (w.alive) WatchExit(r, w);
  }
  bool any_alive = false;
  for (const Worker& w : r.workers) any_alive = any_alive || w.alive;
  if (!any_alive) {
    for (int s : slots) ReleaseSlot(s, 0);
    EndAttempt(r);
  }
}

void DaemonImpl::WatchExit(RunRec& r, Worker& w) {
  absl::StatusOr<int> fd = PidfdOpen(w.pid);
  std::string id = r.run.run_id();
  int attempt = r.attempt.number();
  int rank = w.rank;
  if (!fd.ok()) {
    // Already gone (or no pidfd): handle the exit now.
    asio::post(io_, [this, id, attempt, rank] { OnExit(id, attempt, rank); });
    return;
  }
  w.pidfd = std::make_unique<asio::posix::stream_descriptor>(io_, *fd);
  w.pidfd->async_wait(asio::posix::stream_descriptor::wait_read,
                      [this, id, attempt, rank](const boost::system::error_code& ec) {
                        if (ec == asio::error::operation_aborted) return;
                        OnExit(id, attempt, rank);
                      });
}

// A worker process ended: reap it, classify it, release its slot, stop the
// rest of the gang on a failure, and end the attempt once no rank is left.
void DaemonImpl::OnExit(const std::string& run_id, int attempt, int rank) {
  RunRec* rp = Find(run_id);
  if (rp == nullptr || rp->attempt.number() != attempt) return;
  RunRec& r = *rp;
  if (rank < 0 || rank >= static_cast<int>(r.workers.size())) return;
  Worker& w = r.workers[rank];
  if (!w.alive) return;
  bool exited = true;
  int code = -1;
  bool known = false;
  if (w.own_child) {
    int status = 0;
    pid_t got;
    do {
      got = waitpid(w.pid, &status, 0);
    } while (got < 0 && errno == EINTR);
    if (got == w.pid) {
      known = true;
      if (WIFEXITED(status)) {
        code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        exited = false;
        code = WTERMSIG(status);
      }
    }
  }
  absl::StatusOr<ExitFile> file = ReadExitFile(ExitFilePath(r.run.run_dir(), attempt, rank));
  if (file.ok()) {
    w.exit_report = *file;
    if (!known) {
      known = true;
      code = file->code;
    }
  }
  ExitClass cls;
  std::string reason;
  if (w.forced) {
    cls = *w.forced;
    reason = absl::StrCat(w.forced_reason, known ? absl::StrCat(" (then ", DescribeExit(exited, code), ")") : "");
  } else if (!known) {
    cls = ExitClass::kLost;
    reason = "ended while no daemon was watching, without an exit file";
  } else {
    cls = ClassifyExit(exited, code);
    reason = DescribeExit(exited, code);
    if (w.exit_report && !w.exit_report->message.empty()) {
      reason = absl::StrCat(reason, ": ", w.exit_report->message);
    }
  }
  if (w.forced && known && exited && code == 0) cls = ExitClass::kSuccess;
  w.alive = false;
  if (w.pidfd) {
    w.pidfd->close();
    w.pidfd.reset();
  }
  if (w.kill_timer) w.kill_timer->cancel();
  w.status.set_alive(false);
  w.status.set_exit_code(exited ? code : -1);
  w.status.set_signal(exited ? 0 : code);
  w.status.set_exit_class(static_cast<v1::ExitClass>(ToProto(cls)));
  w.status.set_exit_reason(reason);
  PersistRank(r, w);
  metrics_->CountWorkerExit(ToString(cls));
  metrics_->RemoveWorker(run_id, rank);
  log_->info("run={} attempt={} rank={} pid {} ended: {}", run_id, attempt, rank, w.pid, reason);
  {
    v1::RunEvent e;
    e.set_kind(v1::EVENT_KIND_WORKER_EXIT);
    e.set_rank(rank);
    e.set_exit_class(static_cast<v1::ExitClass>(ToProto(cls)));
    e.set_reason(reason);
    e.mutable_progress()->CopyFrom(w.status.progress());
    Emit(r, e);
  }
  if (w.stream) w.stream->Close(grpc::Status::OK);
  w.stream.reset();
  ReleaseSlot(w.slot, w.pgid);
  if (cls != ExitClass::kSuccess) {
    for (Worker& other : r.workers) {
      if (other.alive && !other.stopping) {
        StopWorker(r, other, ExitClass::kGang,
                   absl::StrCat("stopped because rank ", rank, " ended: ", reason), /*graceful=*/false);
      }
    }
  }
  for (const Worker& other : r.workers) {
    if (other.alive) return;
  }
  EndAttempt(r);
}

void DaemonImpl::EndAttempt(RunRec& r) {
  // The class of the attempt: the first rank that failed on its own, else
  // success when every rank succeeded.
  ExitClass cls = ExitClass::kSuccess;
  std::string detail;
  bool any_progress = false;
  for (const Worker& w : r.workers) {
    any_progress = any_progress || w.progressed;
    ExitClass c = ExitClassFromProto(w.status.exit_class()).value_or(ExitClass::kCrash);
    if (c == ExitClass::kSuccess) continue;
    if (cls == ExitClass::kSuccess || (cls == ExitClass::kGang && c != ExitClass::kGang)) {
      cls = c;
      detail = absl::StrCat("rank ", w.rank, ": ", w.status.exit_reason());
    }
  }
  if (cls == ExitClass::kSuccess) detail = "every rank completed";
  r.attempt.set_ended_ms(WallMs());
  r.attempt.set_exit_class(static_cast<v1::ExitClass>(ToProto(cls)));
  r.attempt.set_exit_reason(detail);
  absl::Status s = store_->UpsertAttempt(r.run.run_id(), r.attempt);
  if (!s.ok()) log_->error("run={} cannot store attempt end: {}", r.run.run_id(), std::string(s.message()));
  store_->SetLearning(r.run.run_id(), {r.learning.slowest_step_s, r.learning.steps_observed}).IgnoreError();
  {
    v1::RunEvent e;
    e.set_kind(v1::EVENT_KIND_ATTEMPT_ENDED);
    e.set_rank(-1);
    e.set_exit_class(static_cast<v1::ExitClass>(ToProto(cls)));
    e.set_reason(detail);
    Emit(r, e);
  }
  AttemptEnd end;
  end.end_s = WallMs() / 1000.0;
  end.cls = cls;
  end.made_progress = any_progress;
  end.stop_requested = r.cancel || r.shutdown_stop;
  end.detail = detail;
  r.history.push_back(end);
  if (cls == ExitClass::kOom) r.oom_exits++;

  if (r.cancel) {
    SetState(r, v1::RUN_STATE_CANCELLED, r.cancel_reason);
    return;
  }
  if (r.shutdown_stop && cls != ExitClass::kSuccess) {
    // Resumed from its checkpoint when the daemon starts again.
    r.attempt.clear_ranks();
    SetState(r, v1::RUN_STATE_PENDING, "daemon shut down; the run resumes when it starts again");
    return;
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  RestartDecision d = DecideRestart(PolicyFrom(config_.restart), r.history, unit(rng_));
  switch (d.action) {
    case Action::kSucceed:
      SetState(r, v1::RUN_STATE_SUCCEEDED, "every rank completed");
      break;
    case Action::kFail:
      SetState(r, v1::RUN_STATE_FAILED, d.reason);
      break;
    case Action::kStop:
      SetState(r, v1::RUN_STATE_PENDING, d.reason);
      asio::post(io_, [this] { Schedule(); });
      break;
    case Action::kRestart: {
      r.run.set_restarts(r.run.restarts() + 1);
      if (d.oom) r.run.set_oom_restarts(r.run.oom_restarts() + 1);
      r.not_before_s = NowS() + d.delay_s;
      r.run.set_next_restart_ms(WallMs() + static_cast<int64_t>(d.delay_s * 1000));
      metrics_->CountRestart(ToString(cls));
      v1::RunEvent e;
      e.set_kind(v1::EVENT_KIND_RESTART);
      e.set_rank(-1);
      e.set_exit_class(static_cast<v1::ExitClass>(ToProto(cls)));
      e.set_reason(d.reason);
      e.set_delay_s(d.delay_s);
      Emit(r, e);
      SetState(r, v1::RUN_STATE_RESTARTING, d.reason);
      r.restart_timer = std::make_unique<asio::steady_timer>(io_);
      r.restart_timer->expires_after(std::chrono::microseconds(static_cast<int64_t>(d.delay_s * 1e6)));
      r.restart_timer->async_wait([this](const boost::system::error_code& ec) {
        if (!ec) Schedule();
      });
      Schedule();
      break;
    }
  }
}

// Asks a worker to stop: gracefully (a Stop command, then SIGTERM after the
// stop deadline) or at once (SIGTERM); SIGKILL of the whole process group
// after the grace period either way.
void DaemonImpl::StopWorker(RunRec& r, Worker& w, ExitClass why, const std::string& reason,
                            bool graceful) {
  if (!w.alive || w.stopping) return;
  w.stopping = true;
  if (!w.forced) {
    w.forced = why;
    w.forced_reason = reason;
  }
  double first_delay = 0;
  if (graceful && w.stream) {
    wv1::SupervisorCommand c;
    c.mutable_stop()->set_deadline_s(static_cast<int>(config_.workers.stop_deadline_s));
    c.mutable_stop()->set_reason(reason);
    w.stream->Send(c);
    first_delay = config_.workers.stop_deadline_s;
  } else {
    SignalProcessGroup(w.pgid, SIGTERM).IgnoreError();
  }
  w.kill_timer = std::make_unique<asio::steady_timer>(io_);
  w.kill_timer->expires_after(std::chrono::microseconds(
      static_cast<int64_t>((first_delay > 0 ? first_delay : config_.workers.term_grace_s) * 1e6)));
  w.kill_timer->async_wait([this, id = r.run.run_id(), a = r.attempt.number(), rank = w.rank,
                            step = first_delay > 0 ? 1 : 2](const boost::system::error_code& ec) {
    if (!ec) EscalateKill(id, a, rank, step);
  });
}

void DaemonImpl::EscalateKill(const std::string& run_id, int attempt, int rank, int step) {
  RunRec* r = Find(run_id);
  if (r == nullptr || r->attempt.number() != attempt || rank >= static_cast<int>(r->workers.size())) return;
  Worker& w = r->workers[rank];
  if (!w.alive) return;
  if (step == 1) {
    log_->warn("run={} attempt={} rank={} did not stop within the deadline: SIGTERM", run_id, attempt, rank);
    SignalProcessGroup(w.pgid, SIGTERM).IgnoreError();
    w.kill_timer->expires_after(std::chrono::microseconds(static_cast<int64_t>(config_.workers.term_grace_s * 1e6)));
    w.kill_timer->async_wait([this, run_id, attempt, rank](const boost::system::error_code& ec) {
      if (!ec) EscalateKill(run_id, attempt, rank, 2);
    });
    return;
  }
  log_->warn("run={} attempt={} rank={} pid {} ignored SIGTERM: SIGKILL to process group {}", run_id,
             attempt, rank, w.pid, w.pgid);
  v1::RunEvent e;
  e.set_kind(v1::EVENT_KIND_LOG);
  e.set_rank(rank);
  e.set_reason(absl::StrCat("rank ", rank, " still alive ", config_.workers.term_grace_s,
                            " s after SIGTERM: SIGKILL to its process group"));
  Emit(*r, e);
  SignalProcessGroup(w.pgid, SIGKILL).IgnoreError();
}

void DaemonImpl::CheckLivenessAll() {
  double now = NowS();
  ProgressTimeoutConfig tcfg = TimeoutFrom(config_.progress);
  for (auto& [id, rp] : runs_) {
    RunRec& r = *rp;
    for (Worker& w : r.workers) {
      if (!w.alive || w.stopping) continue;
      double hb_timeout = config_.workers.heartbeat_timeout_s;
      double last_hb = w.last_heartbeat_s;
      if (!w.heard) {
        // Before its first heartbeat a worker is still starting up.
        hb_timeout = std::max(hb_timeout, config_.progress.startup_grace_s);
        last_hb = w.launched_s;
      }
      double progress_timeout = ProgressTimeoutSeconds(tcfg, r.learning, w.phase, w.progressed);
      Liveness l = CheckLiveness(now, last_hb, w.last_progress_s, hb_timeout, progress_timeout);
      if (l.verdict == Liveness::kAlive) continue;
      ExitClass cls = l.verdict == Liveness::kFrozen ? ExitClass::kFrozen : ExitClass::kHung;
      CaptureAndKill(r, w, cls, absl::StrCat("rank ", w.rank, " ", l.reason));
    }
  }
}

void DaemonImpl::CaptureAndKill(RunRec& r, Worker& w, ExitClass cls, const std::string& reason) {
  w.stopping = true;
  w.forced = cls;
  w.forced_reason = reason;
  log_->warn("run={} attempt={} rank={} pid {}: {}", r.run.run_id(), r.attempt.number(), w.rank, w.pid, reason);
  v1::RunEvent e;
  e.set_kind(v1::EVENT_KIND_HANG);
  e.set_rank(w.rank);
  e.set_exit_class(static_cast<v1::ExitClass>(ToProto(cls)));
  e.set_reason(reason);
  Emit(r, e);
  auto kill = [this, id = r.run.run_id(), a = r.attempt.number(), rank = w.rank] {
    RunRec* rr = Find(id);
    if (rr == nullptr || rr->attempt.number() != a) return;
    Worker& ww = rr->workers[rank];
    if (!ww.alive) return;
    SignalProcessGroup(ww.pgid, SIGTERM).IgnoreError();
    ww.kill_timer = std::make_unique<asio::steady_timer>(io_);
    ww.kill_timer->expires_after(std::chrono::microseconds(static_cast<int64_t>(config_.workers.term_grace_s * 1e6)));
    ww.kill_timer->async_wait([this, id, a, rank](const boost::system::error_code& ec) {
      if (!ec) EscalateKill(id, a, rank, 2);
    });
  };
  if (!config_.workers.capture_stacks) {
    kill();
    return;
  }
  asio::post(blocking_, [this, pid = w.pid, log = w.status.log_path(), kill, id = r.run.run_id(), rank = w.rank] {
    absl::StatusOr<std::string> how = CaptureStacks(pid, log, 20);
    if (how.ok()) {
      log_->info("run={} rank={} stacks of pid {} captured with {} into {}", id, rank, pid, *how, log);
    } else {
      log_->warn("run={} rank={} stack capture of pid {}: {}", id, rank, pid, std::string(how.status().message()));
    }
    asio::post(io_, kill);
  });
}

// A slot whose worker ended is reused only once its process group is empty
// and, for a GPU, its memory is released (DESIGN.md, Slots).
void DaemonImpl::ReleaseSlot(int slot, int pgid) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) return;
  SlotRec& s = slots_[slot];
  s.state = SlotState::kReleasing;
  s.pgid = pgid;
  s.release_deadline_s = NowS() + config_.slots.gpu_release_timeout_s;
  if (pgid > 1 && ProcessGroupAlive(pgid)) SignalProcessGroup(pgid, SIGKILL).IgnoreError();
  CheckReleases();
}

void DaemonImpl::CheckReleases() {
  std::optional<std::vector<GpuInfo>> gpus;
  bool changed = false;
  for (SlotRec& s : slots_) {
    if (s.state != SlotState::kReleasing && s.state != SlotState::kStranded) continue;
    bool group_empty = s.pgid <= 1 || !ProcessGroupAlive(s.pgid);
    if (!group_empty) SignalProcessGroup(s.pgid, SIGKILL).IgnoreError();
    bool gpu_released = true;
    std::string why;
    if (s.gpu_index >= 0 && gpus_ && gpus_->available()) {
      std::string query_error;
      if (!gpus) {
        absl::StatusOr<std::vector<GpuInfo>> q = gpus_->Query();
        if (q.ok()) {
          gpus = *q;
        } else {
          gpus = std::vector<GpuInfo>{};
          query_error = std::string(q.status().message());
        }
      }
      // A GPU we cannot see is not known to be released: no new work on it.
      gpu_released = false;
      why = query_error.empty() ? absl::StrCat("GPU ", s.gpu_index, " missing from the GPU query")
                                : absl::StrCat("GPU query failed: ", query_error);
      for (const GpuInfo& g : *gpus) {
        if (g.index != s.gpu_index) continue;
        ReleaseCheck c = CheckReleased(g, config_.slots.gpu_idle_memory_mb << 20);
        gpu_released = c.released;
        why = c.reason;
        // Holders in the worker's group are ours to kill; others are not.
        std::vector<int> ours = s.pgid > 1 ? ProcessGroupMembers(s.pgid) : std::vector<int>{};
        for (int pid : c.holders) {
          if (std::find(ours.begin(), ours.end(), pid) != ours.end()) kill(pid, SIGKILL);
        }
      }
    }
    if (group_empty && gpu_released) {
      if (s.state == SlotState::kStranded) {
        log_->info("slot {} recovered", s.index);
        metrics_->SetSlot(s.index, s.gpu_uuid, "FREE");
      }
      s = SlotRec{s.index, s.gpu_index, s.gpu_uuid};
      changed = true;
    } else if (s.state == SlotState::kReleasing && NowS() > s.release_deadline_s) {
      s.state = SlotState::kStranded;
      s.reason = group_empty ? absl::StrCat("GPU memory not released: ", why)
                             : absl::StrCat("process group ", s.pgid, " survives SIGKILL");
      log_->error("slot {} STRANDED: {}", s.index, s.reason);
      metrics_->CountGpuStranded(s.gpu_uuid.empty() ? std::to_string(s.index) : s.gpu_uuid);
      v1::RunEvent e;
      e.set_kind(v1::EVENT_KIND_GPU);
      e.set_rank(s.rank);
      e.set_reason(absl::StrCat("slot ", s.index, " stranded: ", s.reason));
      if (RunRec* r = Find(s.run_id)) {
        Emit(*r, e);
      } else if (!s.run_id.empty()) {
        // The run already ended: its history still records the stranding.
        e.set_run_id(s.run_id);
        e.set_time_ms(WallMs());
        absl::StatusOr<int64_t> seq = store_->AppendEvent(&e);
        if (!seq.ok()) log_->error("run={} cannot store event: {}", s.run_id, std::string(seq.status().message()));
      }
    }
  }
  if (changed) asio::post(io_, [this] { Schedule(); });
}

// --- the worker channel --------------------------------------------------------------

void DaemonImpl::OnWorkerMessage(const std::shared_ptr<WorkerStream>& stream,
                                 const wv1::WorkerMessage& m) {
  double now = NowS();
  if (m.has_hello()) {
    const wv1::Hello& h = m.hello();
    RunRec* r = Find(h.run_id());
    Worker* w = nullptr;
    if (r != nullptr && h.attempt() == r->attempt.number() && h.rank() >= 0 &&
        h.rank() < static_cast<int>(r->workers.size())) {
      w = &r->workers[h.rank()];
    }
    if (w == nullptr || !w->alive || !ConstantTimeEquals(w->token, h.token())) {
      log_->warn("rejected worker hello: run={} attempt={} rank={} pid={}", h.run_id(), h.attempt(), h.rank(), h.pid());
      stream->Close(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                 "unknown run, attempt or rank, or wrong token"));
      return;
    }
    stream->run_id = h.run_id();
    stream->attempt = h.attempt();
    stream->rank = h.rank();
    if (w->stream && w->stream != stream) w->stream->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a new stream"));
    w->stream = stream;
    w->last_heartbeat_s = now;
    bool first = !w->heard;
    w->heard = true;
    wv1::SupervisorCommand welcome;
    welcome.mutable_welcome()->set_heartbeat_interval_ms(
        static_cast<int>(config_.workers.heartbeat_interval_s * 1000));
    stream->Send(welcome);
    if (w->stopping && w->forced && (*w->forced == ExitClass::kCancelled)) {
      wv1::SupervisorCommand c;
      c.mutable_stop()->set_deadline_s(static_cast<int>(config_.workers.stop_deadline_s));
      c.mutable_stop()->set_reason(w->forced_reason);
      stream->Send(c);
    }
    log_->info("run={} attempt={} rank={} connected (pid {})", h.run_id(), h.attempt(), h.rank(), h.pid());
    if (first && r->run.state() == v1::RUN_STATE_STARTING) {
      bool all = true;
      for (const Worker& o : r->workers) all = all && o.heard;
      if (all) SetState(*r, v1::RUN_STATE_RUNNING, absl::StrCat("attempt ", r->attempt.number(), " running"));
    }
    return;
  }
  RunRec* r = Find(stream->run_id);
  if (stream->rank < 0 || r == nullptr || r->attempt.number() != stream->attempt) {
    stream->Close(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "send a hello first"));
    return;
  }
  Worker& w = r->workers[stream->rank];
  if (w.stream != stream) return;
  if (m.has_heartbeat()) {
    const wv1::Heartbeat& hb = m.heartbeat();
    w.last_heartbeat_s = now;
    if (hb.progress_counter() > w.progress_counter) {
      if (w.progressed) {
        double per_step = (now - w.last_progress_s) / static_cast<double>(hb.progress_counter() - w.progress_counter);
        ObserveStep(r->learning, per_step);
        w.steps_per_s = per_step > 0 ? 1.0 / per_step : 0;
      }
      w.progress_counter = hb.progress_counter();
      w.last_progress_s = now;
      w.progressed = true;
    }
    w.phase = WorkerPhaseFromProto(hb.progress().phase()).value_or(WorkerPhase::kTraining);
    *w.status.mutable_progress() = hb.progress();
    w.status.set_last_heartbeat_ms(WallMs());
    if (w.rank == 0) {
      *r->run.mutable_progress() = hb.progress();
      v1::RunEvent e;
      e.set_kind(v1::EVENT_KIND_PROGRESS);
      e.set_rank(0);
      *e.mutable_progress() = hb.progress();
      bool persist = now - r->last_progress_persist_s >= kProgressPersistS;
      if (persist) {
        r->last_progress_persist_s = now;
        PersistRun(*r);
      }
      Emit(*r, e, persist);
    }
    if (now - w.last_persist_s >= kProgressPersistS) PersistRank(*r, w);
    if (now - r->learning_saved_s >= 30) {
      r->learning_saved_s = now;
      store_->SetLearning(r->run.run_id(), {r->learning.slowest_step_s, r->learning.steps_observed}).IgnoreError();
    }
    return;
  }
  if (m.has_event()) {
    const wv1::WorkerEvent& we = m.event();
    v1::RunEvent e;
    e.set_kind(we.kind() == v1::EVENT_KIND_UNSPECIFIED ? v1::EVENT_KIND_LOG : we.kind());
    e.set_rank(w.rank);
    e.set_checkpoint_step(we.checkpoint_step());
    e.set_reason(we.message());
    if (we.kind() == v1::EVENT_KIND_CHECKPOINT) {
      r->last_checkpoint_ms = WallMs();
      r->run.mutable_progress()->set_last_checkpoint_step(we.checkpoint_step());
    }
    Emit(*r, e);
    return;
  }
  if (m.has_exit()) {
    ExitFile f;
    f.code = m.exit().code();
    f.reason = m.exit().reason();
    f.message = m.exit().message();
    f.last_step = m.exit().last_step();
    w.exit_report = f;
  }
}

void DaemonImpl::OnWorkerStreamClosed(const std::shared_ptr<WorkerStream>& stream) {
  RunRec* r = Find(stream->run_id);
  if (r == nullptr || stream->rank < 0 || r->attempt.number() != stream->attempt) return;
  Worker& w = r->workers[stream->rank];
  if (w.stream == stream) w.stream.reset();
}

// --- daemon life -----------------------------------------------------------------------

void DaemonImpl::Tick() {
  CheckLivenessAll();
  CheckReleases();
  tick_.expires_after(std::chrono::milliseconds(static_cast<int>(kTickS * 1000)));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void DaemonImpl::SlowTick() {
  for (auto& [id, r] : runs_) {
    for (Worker& w : r->workers) {
      if (!w.alive) continue;
      absl::StatusOr<bool> rotated = RotateLogIfLarger(w.status.log_path(), config_.workers.log_max_bytes,
                                                       static_cast<int>(config_.workers.log_keep));
      if (!rotated.ok()) log_->warn("run={} rank={} log rotation: {}", id, w.rank, std::string(rotated.status().message()));
    }
  }
  UpdateMetrics();
  Schedule();
  slow_tick_.expires_after(std::chrono::seconds(1));
  slow_tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) SlowTick();
  });
}

void DaemonImpl::UpdateMetrics() {
  std::map<std::string, int> counts;
  for (int s = v1::RUN_STATE_PENDING; s <= v1::RUN_STATE_CANCELLED; ++s) {
    counts[StateName(static_cast<v1::RunState>(s))] = 0;
  }
  for (const auto& [state, n] : terminal_counts_) counts[StateName(state)] += n;
  double now = NowS();
  int64_t wall = WallMs();
  for (const auto& [id, r] : runs_) {
    counts[StateName(r->run.state())]++;
    for (const Worker& w : r->workers) {
      if (!w.alive) continue;
      Metrics::WorkerSample sample{};
      sample.heartbeat_age_s = w.heard ? now - w.last_heartbeat_s : now - w.launched_s;
      const v1::Progress& p = w.status.progress();
      sample.samples_per_s = p.samples_per_sec();
      sample.steps_per_s = w.steps_per_s;
      sample.memory_current = static_cast<double>(p.memory_current_bytes());
      sample.memory_peak = static_cast<double>(p.memory_peak_bytes());
      sample.memory_budget = static_cast<double>(p.memory_budget_bytes());
      sample.step = static_cast<double>(p.step());
      metrics_->SetWorker(id, w.rank, sample);
    }
    if (r->last_checkpoint_ms > 0) metrics_->SetCheckpointAge(id, (wall - r->last_checkpoint_ms) / 1000.0);
  }
  metrics_->SetRunsByState(counts);
  for (const SlotRec& s : slots_) {
    const char* names[] = {"FREE", "BUSY", "RELEASING", "STRANDED"};
    metrics_->SetSlot(s.index, s.gpu_uuid, names[static_cast<int>(s.state)]);
  }
}

void DaemonImpl::Watchdog() {
  // Fed from the loop: a stuck loop stops the pings and systemd restarts us.
  sd_notify(0, "WATCHDOG=1");
  watchdog_.expires_after(std::chrono::microseconds(watchdog_usec_ / 2));
  watchdog_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Watchdog();
  });
}

void DaemonImpl::OnSignal(int sig) {
  if (sig == SIGHUP) {
    Reload();
  } else {
    log_->info("signal {}: shutting down", sig);
    BeginShutdown();
  }
  if (!shutting_down_ || sig == SIGHUP) {
    signals_.async_wait([this](const boost::system::error_code& ec, int s) {
      if (!ec) OnSignal(s);
    });
  }
}

// Applies the knobs that are safe to change under running workers; the
// others (state_dir, sockets, slots, metrics address) need a restart.
void DaemonImpl::Reload() {
  sd_notify(0, "RELOADING=1");
  absl::StatusOr<DaemonConfig> next = config_path_.empty() ? absl::StatusOr<DaemonConfig>(config_)
                                                           : LoadConfig(config_path_);
  if (!next.ok()) {
    log_->error("reload failed, keeping the running configuration: {}", std::string(next.status().message()));
  } else {
    std::vector<std::string> ignored;
    const DaemonSection& a = config_.daemon;
    const DaemonSection& b = next->daemon;
    if (a.state_dir != b.state_dir) ignored.push_back("daemon.state_dir");
    if (a.socket_path != b.socket_path) ignored.push_back("daemon.socket_path");
    if (a.tcp_address != b.tcp_address) ignored.push_back("daemon.tcp_address");
    if (a.metrics_address != b.metrics_address) ignored.push_back("daemon.metrics_address");
    if (config_.slots.cpu_slots != next->slots.cpu_slots) ignored.push_back("slots.cpu_slots");
    absl::StatusOr<std::vector<Token>> tokens = LoadTokens(*next);
    if (!tokens.ok()) {
      log_->error("reload: tokens: {}; keeping the old ones", std::string(tokens.status().message()));
    } else {
      std::lock_guard<std::mutex> lock(tokens_mu_);
      tokens_ = *tokens;
    }
    DaemonSection keep = config_.daemon;
    SlotsSection slots = config_.slots;
    config_ = *next;
    config_.daemon = keep;
    config_.daemon.data_roots = next->daemon.data_roots;
    config_.daemon.worker_binary = next->daemon.worker_binary.empty() ? keep.worker_binary : next->daemon.worker_binary;
    if (!next->daemon.worker_binary.empty()) worker_binary_ = next->daemon.worker_binary;
    config_.slots = slots;
    config_.slots.gpu_release_timeout_s = next->slots.gpu_release_timeout_s;
    config_.slots.gpu_idle_memory_mb = next->slots.gpu_idle_memory_mb;
    log_->info("configuration reloaded{}", ignored.empty() ? "" : absl::StrCat(" (restart needed for ", absl::StrJoin(ignored, ", "), ")"));
  }
  sd_notify(0, "READY=1");
}

void DaemonImpl::BeginShutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  sd_notify(0, "STOPPING=1");
  server_->GetHealthCheckService()->SetServingStatus(false);
  int stopping = 0;
  for (auto& [id, r] : runs_) {
    if (r->restart_timer) r->restart_timer->cancel();
    for (Worker& w : r->workers) {
      if (!w.alive) continue;
      r->shutdown_stop = true;
      stopping++;
      StopWorker(*r, w, ExitClass::kStopped, "daemon shutting down", /*graceful=*/true);
    }
  }
  log_->info("asked {} workers to checkpoint and stop", stopping);
  shutdown_deadline_s_ = NowS() + config_.workers.stop_deadline_s + config_.workers.term_grace_s + 5;
  auto timer = std::make_shared<asio::steady_timer>(io_);
  // Polls until every worker is gone (or the deadline), then stops the server.
  struct Poller {
    DaemonImpl* d;
    std::shared_ptr<asio::steady_timer> timer;
    void operator()() const {
      bool any = false;
      for (auto& [id, r] : d->runs_) {
        for (Worker& w : r->workers) any = any || w.alive;
      }
      if (any && NowS() < d->shutdown_deadline_s_) {
        timer->expires_after(std::chrono::milliseconds(50));
        Poller next = *this;
        timer->async_wait([next](const boost::system::error_code& ec) {
          if (!ec) next();
        });
        return;
      }
      std::thread([d = d] {
        d->server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
        asio::post(d->io_, [d] { d->io_.stop(); });
      }).detach();
    }
  };
  Poller{this, timer}();
}

int DaemonImpl::Run() {
  signal(SIGPIPE, SIG_IGN);
  signals_.async_wait([this](const boost::system::error_code& ec, int s) {
    if (!ec) OnSignal(s);
  });
  if (sd_watchdog_enabled(0, &watchdog_usec_) > 0 && watchdog_usec_ > 0) Watchdog();
  Tick();
  SlowTick();
  asio::post(io_, [this] { Schedule(); });
  sd_notifyf(0, "READY=1\nSTATUS=serving on %s, %zu slots", socket_path_.c_str(), slots_.size());
  io_.run();
  blocking_.join();
  log_->info("stopped");
  return exit_code_;
}

grpc::Status DaemonImpl::Authorize(grpc::CallbackServerContext* ctx, TokenRole needed,
                                   const char* method) const {
  std::lock_guard<std::mutex> lock(tokens_mu_);
  if (tokens_.empty()) return grpc::Status::OK;  // no tokens configured: the socket mode guards
  auto it = ctx->client_metadata().find("authorization");
  if (it == ctx->client_metadata().end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing authorization: Bearer <token>");
  }
  std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  if (value.compare(0, prefix.size(), prefix) != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization must be \"Bearer <token>\"");
  }
  std::string secret = value.substr(prefix.size());
  const Token* found = nullptr;
  for (const Token& t : tokens_) {
    if (ConstantTimeEquals(t.secret, secret)) found = &t;
  }
  if (found == nullptr) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown token");
  if (needed == TokenRole::kOperator && found->role != TokenRole::kOperator) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("token \"", found->name, "\" has role ", ToString(found->role),
                                     "; ", method, " needs operator"));
  }
  return grpc::Status::OK;
}

// --- gRPC services: authenticate, validate, then hand over to the loop -----------------

template <class Fn>
grpc::ServerUnaryReactor* Unary(DaemonImpl* d, grpc::CallbackServerContext* ctx, TokenRole role,
                                const char* method, Fn on_loop) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status auth = d->Authorize(ctx, role, method);
  if (!auth.ok()) {
    d->metrics()->CountApiCall(method, std::to_string(auth.error_code()));
    reactor->Finish(auth);
    return reactor;
  }
  d->OnLoop([d, reactor, on_loop, method]() mutable {
    grpc::Status s = on_loop();
    d->metrics()->CountApiCall(method, std::to_string(s.error_code()));
    reactor->Finish(s);
  });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::SubmitRun(grpc::CallbackServerContext* ctx,
                                                       const v1::SubmitRunRequest* req,
                                                       v1::SubmitRunResponse* resp) {
  // Validated before anything is created: a bad spec leaves no trace.
  absl::StatusOr<RunSpec> spec = ParseRunSpec(req->spec_toml());
  absl::Status valid = spec.status();
  if (valid.ok()) valid = CheckSpecPaths(*spec, d_->config().daemon.data_roots);
  if (valid.ok() && spec->world_size > d_->total_slots()) {
    valid = absl::InvalidArgumentError(absl::StrCat("world_size: ", spec->world_size,
                                                    " exceeds the node's ", d_->total_slots(), " slots"));
  }
  if (valid.ok() && req->request_id().size() > 128) {
    valid = absl::InvalidArgumentError("request_id: longer than 128 bytes");
  }
  grpc::Status auth = d_->Authorize(ctx, TokenRole::kOperator, "SubmitRun");
  if (auth.ok() && !valid.ok()) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    d_->metrics()->CountApiCall("SubmitRun", std::to_string(grpc::StatusCode::INVALID_ARGUMENT));
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(valid.message())));
    return reactor;
  }
  RunSpec parsed = spec.ok() ? *spec : RunSpec{};
  return Unary(d_, ctx, TokenRole::kOperator, "SubmitRun",
               [d = d_, req, resp, parsed] { return d->Submit(*req, parsed, resp); });
}

grpc::ServerUnaryReactor* SupervisorService::GetRun(grpc::CallbackServerContext* ctx,
                                                    const v1::GetRunRequest* req, v1::Run* resp) {
  return Unary(d_, ctx, TokenRole::kViewer, "GetRun",
               [d = d_, req, resp] { return d->Get(req->run_id(), resp); });
}

grpc::ServerUnaryReactor* SupervisorService::ListRuns(grpc::CallbackServerContext* ctx,
                                                      const v1::ListRunsRequest* req,
                                                      v1::ListRunsResponse* resp) {
  return Unary(d_, ctx, TokenRole::kViewer, "ListRuns",
               [d = d_, req, resp] { return d->List(*req, resp); });
}

grpc::ServerUnaryReactor* SupervisorService::CancelRun(grpc::CallbackServerContext* ctx,
                                                       const v1::CancelRunRequest* req,
                                                       v1::Run* resp) {
  return Unary(d_, ctx, TokenRole::kOperator, "CancelRun",
               [d = d_, req, resp] { return d->Cancel(*req, resp); });
}

grpc::ServerUnaryReactor* SupervisorService::GetNode(grpc::CallbackServerContext* ctx,
                                                     const v1::GetNodeRequest*, v1::Node* resp) {
  return Unary(d_, ctx, TokenRole::kViewer, "GetNode", [d = d_, resp] {
    d->Node(resp);
    return grpc::Status::OK;
  });
}

grpc::ServerWriteReactor<v1::RunEvent>* SupervisorService::WatchRun(
    grpc::CallbackServerContext* ctx, const v1::WatchRunRequest* req) {
  auto watcher = std::make_shared<Watcher>();
  watcher->Own(watcher);
  grpc::Status auth = d_->Authorize(ctx, TokenRole::kViewer, "WatchRun");
  d_->metrics()->CountApiCall("WatchRun", std::to_string(auth.error_code()));
  if (!auth.ok()) {
    watcher->outbox().Finish(auth);
    return watcher.get();
  }
  v1::WatchRunRequest copy = *req;
  d_->OnLoop([d = d_, copy, watcher] { d->Watch(copy, watcher); });
  return watcher.get();
}

grpc::ServerBidiReactor<wv1::WorkerMessage, wv1::SupervisorCommand>* WorkerChannelService::Connect(
    grpc::CallbackServerContext*) {
  DaemonImpl* d = d_;
  auto stream = std::make_shared<WorkerStream>(
      [d](std::shared_ptr<WorkerStream> s, wv1::WorkerMessage m) {
        d->OnLoop([d, s, m] { d->OnWorkerMessage(s, m); });
      },
      [d](std::shared_ptr<WorkerStream> s) { d->OnLoop([d, s] { d->OnWorkerStreamClosed(s); }); });
  stream->Begin(stream);
  return stream.get();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonConfig& config,
                                                       const std::string& config_path,
                                                       std::shared_ptr<spdlog::logger> log) {
  auto d = std::make_unique<DaemonImpl>(config, config_path, std::move(log));
  absl::Status s = d->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Daemon>(std::move(d));
}

}  // namespace trainsup::supervisor
