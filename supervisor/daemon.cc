// The daemon's loop (after systemd's manager.c): start-up, signals, ticks,
// the watchdog, reload and graceful shutdown, scheduling, and the glue
// between the gRPC services and the run units. What happens to a run is
// run_unit.cc's; how a call is checked is api_service.cc's; the slots are
// slots.cc's. This file only routes and owns.
#include "supervisor/daemon.h"

#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_system.h"
#include "checkpoint/store.h"
#include "contracts/free_port.h"
#include "contracts/run_layout.h"
#include "contracts/version.h"
#include "supervisor/api/api_service.h"
#include "supervisor/api/servers.h"
#include "supervisor/api/watch_hub.h"
#include "supervisor/api/worker_channel.h"
#include "supervisor/cluster/cluster.h"
#include "supervisor/cluster/etcd_client.h"
#include "supervisor/daemon_impl.h"
#include "supervisor/metrics.h"
#include "supervisor/policy/elastic_growth.h"
#include "supervisor/policy/from_config.h"
#include "supervisor/policy/launch_plan.h"
#include "supervisor/policy/reload.h"
#include "supervisor/run/loop_env.h"
#include "supervisor/run/run_unit.h"
#include "supervisor/store/store_thread.h"
#include "supervisor/sys/exit_watcher.h"
#include "supervisor/sys/slots.h"

namespace trainsup::supervisor {
namespace {

namespace fs = std::filesystem;

// Liveness, exit-fallback and slot checks run this often: detection within
// a quarter second of a deadline, at a few wake-ups a second when idle.
constexpr double kTickS = 0.25;

}  // namespace

namespace internal {

int DaemonImpl::FreePort() { return FreeLoopbackPort(); }

absl::StatusOr<std::unique_ptr<UnitCluster>> DaemonImpl::JoinCluster(const v1::Run& run,
                                                                     const RunSpec& spec,
                                                                     ClusterEvents events) {
  // The deadline bounds every etcd call; a lease renewal must fit well
  // inside the lease.
  const double deadline_s = std::min(2.0, spec.cluster.lease_ttl_s / 3);
  // Checked at submit too; again here for a run restored after a restart
  // with another configuration. The certificates are read at every join,
  // so renewed files take effect without a restart.
  const ClusterSection& c = config_.cluster;
  if (absl::Status s = CheckEtcdTransport(c, spec.cluster.etcd_endpoints); !s.ok()) return s;
  absl::StatusOr<EtcdTls> tls = ReadEtcdTls(c.etcd_ca, c.etcd_cert, c.etcd_key);
  if (!tls.ok()) return tls.status();
  absl::StatusOr<std::unique_ptr<EtcdClient>> client =
      MakeEtcdClient(absl::StrJoin(spec.cluster.etcd_endpoints, ","), deadline_s, *tls);
  if (!client.ok()) return client.status();
  ClusterMember::Options o;
  o.spec = spec.cluster;
  o.node = config_.cluster.node_name.empty() ? hostname_ : config_.cluster.node_name;
  o.address = config_.cluster.advertise_addr.empty() ? hostname_ : config_.cluster.advertise_addr;
  o.run_id = run.run_id();
  o.spec_hash = SpecHash(run.spec_toml());
  o.submission = run.cluster_submission();
  o.fresh_submission = SecureRandomHex(8);
  // No jitter to draw: every node reads the one delay the deciding node
  // wrote (NextGeneration).
  o.policy = RestartPolicyFor(config_, spec);
  o.elastic_wait_s = spec.elastic.wait_s;
  return std::unique_ptr<UnitCluster>(std::make_unique<ClusterMember>(
      env_.get(), etcd_timers_.get(), std::shared_ptr<EtcdClient>(std::move(*client)), std::move(o),
      std::move(events)));
}

// --- start-up --------------------------------------------------------------------------------

absl::Status DaemonImpl::Init() {
  const StateLayout state(config_.daemon.state_dir);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  hostname_ = host;
  std::error_code ec;
  fs::create_directories(state.RunsDir(), ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create state directory ", state.dir(), ": ", ec.message()));
  }
  chmod(state.dir().c_str(), 0750);
  chmod(state.RunsDir().c_str(), 0750);
  absl::StatusOr<std::unique_ptr<StoreThreads>> store = StoreThreads::Open(state.StorePath());
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  absl::StatusOr<std::vector<Token>> tokens = LoadTokens(config_);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create(config_.daemon.metrics_address, config_.daemon.metrics_allow_remote);
  if (!metrics.ok()) return metrics.status();
  metrics_ = std::move(*metrics);
  started_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  metrics_->SetDaemonInfo(std::string(trainsup::Version()),
                          static_cast<double>(started_ms_) / 1000.0);
  env_ = std::make_unique<LoopEnv>(io_, pool_, store_.get(), &exits_);
  etcd_timers_ = std::make_unique<PoolTimers>(*env_, io_, etcd_pool_);
  std::unique_ptr<GpuMonitor> gpus;
  if (!config_.testing.fake_gpu_file.empty()) {
    gpus = OpenFakeMonitor(config_.testing.fake_gpu_file);
  } else if (config_.slots.use_gpus) {
    gpus = OpenNvmlMonitor();
  }
  if (gpus) log_->info("GPUs: {}", gpus->Describe());
  SlotTable::Hooks hooks;
  hooks.now = [this] { return env_->NowS(); };
  hooks.off_loop = [this](std::function<void()> work) { asio::post(pool_, std::move(work)); };
  hooks.post = [this](std::function<void()> fn) { asio::post(io_, std::move(fn)); };
  hooks.freed = [this] { Reschedule(); };
  hooks.log = [this](const std::string& line) { log_->info("{}", line); };
  hooks.stranded = [this](const Slot& s) {
    log_->error("slot {} STRANDED: {}", s.index, s.reason);
    metrics_->CountGpuStranded(s.gpu_uuid.empty() ? std::to_string(s.index) : s.gpu_uuid);
    // Stored even when the run has ended: its history records the stranding.
    if (!s.run_id.empty()) {
      StoreRunEvent(s.run_id, v1::EVENT_KIND_GPU, s.rank,
                    absl::StrCat("slot ", s.index, " stranded: ", s.reason));
    }
  };
  hooks.wall_ms = [this] { return env_->WallMs(); };
  hooks.drained = [this](const Slot& s) { OnSlotDrained(s); };
  hooks.undrained = [this](const Slot& s, const std::string& why) { OnSlotUndrained(s, why); };
  slots_ = std::make_unique<SlotTable>(std::move(gpus), static_cast<int>(config_.slots.cpu_slots),
                                       std::move(hooks));
  slots_->set_drain_stranded_after_s(config_.slots.drain_stranded_after_s);
  log_->info("{} slots ({})", slots_->slots().size(), slots_->gpu_slots() ? "GPU" : "CPU");
  PublishPolicy(*tokens);
  unix_api_ = std::make_unique<SupervisorService>(
      this, [this] { return policy(); }, ParseRunSpec, &watcher_counts_);
  tcp_api_ = std::make_unique<SupervisorService>(
      this, [this] { return policy(); }, ParseRunSpec, &watcher_counts_);
  unix_worker_ = std::make_unique<WorkerChannelService>(this);
  tcp_worker_ = std::make_unique<WorkerChannelService>(this);
  if (absl::Status s = LoadRuns(); !s.ok()) return s;
  absl::Status s = servers_.Start(
      config_, {unix_api_.get(), unix_worker_.get(), tcp_api_.get(), tcp_worker_.get()},
      [this](const std::string& line) { log_->warn("{}", line); });
  if (!s.ok()) return s;
  log_->info("serving on unix:{}{}", servers_.socket_path(),
             config_.daemon.tcp_address.empty()
                 ? ""
                 : absl::StrCat(" and ", config_.daemon.tcp_address, " (TLS)"));
  return absl::OkStatus();
}

// Rebuilds the unfinished runs from the store, synchronously (before the
// daemon serves). A store that cannot be read fails start-up: serving with
// no runs would hide them and leave their workers unwatched.
absl::Status DaemonImpl::LoadRuns() {
  StateStore& store = store_->startup();
  auto unreadable = [](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("cannot read the state store: ", s.message()));
  };
  std::string token;
  for (;;) {
    absl::StatusOr<RunPage> page = store.ListRuns({}, StateStore::kMaxPageSize, token);
    if (!page.ok()) return unreadable(page.status());
    for (const v1::Run& run : page->runs) {
      if (IsTerminal(run.state())) terminal_counts_[run.state()]++;
    }
    if (page->next_page_token.empty()) break;
    token = page->next_page_token;
  }
  if (absl::Status s = LoadDrains(store); !s.ok()) return unreadable(s);
  absl::StatusOr<std::vector<v1::Run>> runs = store.LoadUnfinishedRuns();
  if (!runs.ok()) return unreadable(runs.status());
  struct Loaded {
    v1::Run run;
    std::vector<RankPrivate> privs;
    RunLearning learning;
  };
  std::vector<Loaded> loaded;
  for (const v1::Run& stored : *runs) {
    Loaded l;
    l.run = stored;
    absl::StatusOr<RunLearning> learning = store.GetLearning(stored.run_id());
    if (!learning.ok()) return unreadable(learning.status());
    l.learning = *learning;
    if (stored.attempts_size() > 0) {
      const v1::Attempt& a = *stored.attempts().rbegin();
      for (const v1::RankStatus& rs : a.ranks()) {
        absl::StatusOr<RankPrivate> p =
            store.GetRankPrivate(stored.run_id(), a.number(), rs.rank());
        if (!p.ok() && p.status().code() != absl::StatusCode::kNotFound) {
          return unreadable(p.status());
        }
        l.privs.push_back(p.ok() ? *p : RankPrivate{});
      }
    }
    loaded.push_back(std::move(l));
  }
  store_->Start();  // from here on the store is the threads'
  int64_t seq = 0;
  for (Loaded& l : loaded) {
    absl::StatusOr<RunSpec> spec = ParseRunSpec(l.run.spec_toml());
    if (!spec.ok()) {
      log_->error("run={} stored spec no longer parses: {}", l.run.run_id(),
                  std::string(spec.status().message()));
    }
    const std::string id = l.run.run_id();
    // Loaded in submit order: their order among themselves is kept, and
    // new runs (seq from the store) come after.
    std::unique_ptr<RunUnit> unit =
        RunUnit::Restore(l.run, spec.ok() ? *spec : RunSpec{}, -1000000000 + seq++, l.privs,
                         l.learning, env_->env(this));
    for (const RankState& r : unit->ranks()) {
      if (r.alive && r.slot >= 0 && r.slot < static_cast<int>(slots_->slots().size())) {
        slots_->Assign(r.slot, id, r.rank);
      }
    }
    units_[id] = std::move(unit);
  }
  log_->info("loaded {} unfinished runs", units_.size());
  // A drain stored before the restart holds for the gang adopted on its
  // slot: that gang resizes, as it would have on the drain itself.
  for (const Slot& s : slots_->slots()) {
    if (s.drain && s.state == SlotState::kBusy && !s.run_id.empty()) OnSlotDrained(s);
  }
  return absl::OkStatus();
}

void DaemonImpl::PublishPolicy(const std::vector<Token>& tokens) {
  auto p = std::make_shared<ApiPolicy>();
  p->tokens = tokens;
  p->data_roots = config_.daemon.data_roots;
  p->total_slots = slots_ ? static_cast<int>(slots_->slots().size()) : 0;
  p->allow_fault_injection = config_.testing.allow_fault_injection;
  p->max_watchers_per_client = static_cast<int>(config_.daemon.max_watchers_per_client);
  p->commands = config_.commands;
  p->cluster = config_.cluster;
  std::lock_guard<std::mutex> lock(policy_mu_);
  policy_ = std::move(p);
}

// --- UnitHost ------------------------------------------------------------------------------

void DaemonImpl::Log(LogLevel level, const std::string& line) {
  switch (level) {
    case LogLevel::kInfo:
      log_->info("{}", line);
      break;
    case LogLevel::kWarn:
      log_->warn("{}", line);
      break;
    case LogLevel::kError:
      log_->error("{}", line);
      break;
  }
}

void DaemonImpl::Reschedule() {
  if (schedule_posted_) return;
  schedule_posted_ = true;
  asio::post(io_, [this] {
    schedule_posted_ = false;
    Schedule();
  });
}

void DaemonImpl::Finished(const std::string& run_id) {
  asio::post(io_, [this, run_id] {
    auto it = units_.find(run_id);
    if (it == units_.end()) return;
    RunUnit& u = *it->second;
    if (!IsTerminal(u.run().state()) || u.AnyAlive() || !u.idle()) return;
    terminal_counts_[u.run().state()]++;
    for (const RankState& r : u.ranks()) metrics_->RemoveWorker(run_id, r.rank);
    metrics_->RemoveRun(run_id);
    units_.erase(it);
  });
}

void DaemonImpl::StoreFailed(const std::string& run_id, const std::string& what,
                             const absl::Status& status) {
  ++store_failures_;
  store_error_ = absl::StrCat(what, ": ", status.message());
  metrics_->CountStoreWriteFailure(what);
  log_->error("run={} cannot store {} (retrying; the run waits for it): {}", run_id, what,
              std::string(status.message()));
}

std::string DaemonImpl::WorkerBinary() {
  std::error_code ec;
  return WorkerBinaryPath(config_.daemon, fs::read_symlink("/proc/self/exe", ec).string());
}

std::map<std::string, std::string> DaemonImpl::DaemonEnvironment() {
  std::map<std::string, std::string> env;
  for (const char* name : kPassedThrough) {
    if (const char* v = getenv(name)) env[name] = v;
  }
  return env;
}

void DaemonImpl::MeasureSpace(const std::string& run_dir,
                              std::function<void(absl::StatusOr<int64_t>, int64_t)> done) {
  asio::post(pool_, [this, run_dir, done] {
    absl::StatusOr<int64_t> free_bytes;
    struct statvfs st {};
    if (statvfs(run_dir.c_str(), &st) == 0) {
      free_bytes = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
    } else {
      free_bytes = absl::InternalError(absl::StrCat("statvfs ", run_dir, ": ", strerror(errno)));
    }
    int64_t newest = 0;
    ckpt::CheckpointStore store(RunLayout(run_dir).CheckpointsDir());
    absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = store.List();
    if (list.ok() && !list->empty()) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(list->back().path, ec)) {
        if (e.is_regular_file(ec)) newest += static_cast<int64_t>(e.file_size(ec));
      }
    }
    asio::post(io_, [done, free_bytes, newest] { done(free_bytes, newest); });
  });
}

// --- drains (docs/distributed.md, "Elastic") -----------------------------------------------

absl::Status DaemonImpl::LoadDrains(StateStore& store) {
  absl::StatusOr<std::vector<StoredDrain>> drains = store.ListDrains();
  if (!drains.ok()) return drains.status();
  for (const StoredDrain& d : *drains) {
    bool found = false;
    for (const Slot& s : slots_->slots()) {
      if (slots_->DrainKey(s.index) != d.slot) continue;
      slots_->Drain(s.index, SlotDrain{d.reason, kDrainOperator, d.drained_ms});
      log_->info("slot {} drained by an operator: {}", s.name, d.reason);
      found = true;
    }
    if (!found) {
      log_->warn(
          "a drain of {} is stored, but no slot of this node is {} (kept: trainctl undrain "
          "cannot reach it; it applies again if the slot comes back)",
          d.slot, d.slot);
    }
  }
  return absl::OkStatus();
}

void DaemonImpl::StoreRunEvent(const std::string& run_id, v1::EventKind kind, int rank,
                               const std::string& reason) {
  v1::RunEvent e;
  e.set_run_id(run_id);
  e.set_kind(kind);
  e.set_rank(rank);
  e.set_time_ms(env_->WallMs());
  e.set_reason(reason);
  StoreBatch b;
  b.events.push_back(e);
  env_->Write(run_id, std::move(b), [this, run_id](absl::Status st, StoreBatch done) {
    if (!st.ok()) {
      log_->error("run={} cannot store event: {}", run_id, std::string(st.message()));
      return;
    }
    for (const v1::RunEvent& ev : done.events) hub_.Publish(ev);
  });
}

void DaemonImpl::OnSlotDrained(const Slot& s) {
  const std::string line =
      absl::StrCat("slot ", s.name, " drained (", s.drain ? s.drain->reason : "", ")");
  log_->warn("{}", line);
  if (s.run_id.empty() || s.state != SlotState::kBusy) return;
  RunUnit* u = Find(s.run_id);
  if (u == nullptr) return;
  StoreRunEvent(s.run_id, s.gpu_index >= 0 ? v1::EVENT_KIND_GPU : v1::EVENT_KIND_LOG, s.rank,
                absl::StrCat(line, ": its rank is stopped after a checkpoint"));
  u->Resize(line);
}

void DaemonImpl::OnSlotUndrained(const Slot& s, const std::string& why) {
  const std::string line = absl::StrCat("slot ", s.name, " offered again: ", why);
  log_->info("{}", line);
  for (const std::string& id : RunsThatMayTakeASlot(GangViews())) {
    StoreRunEvent(id, s.gpu_index >= 0 ? v1::EVENT_KIND_GPU : v1::EVENT_KIND_LOG, -1, line);
  }
  Reschedule();
}

std::vector<GangView> DaemonImpl::GangViews() const {
  std::vector<GangView> out;
  for (const auto& [id, u] : units_) {
    GangView g;
    g.run_id = id;
    const v1::RunState st = u->run().state();
    g.phase = st == v1::RUN_STATE_PENDING || st == v1::RUN_STATE_RESTARTING ? GangPhase::kWaiting
              : st == v1::RUN_STATE_RUNNING                                 ? GangPhase::kRunning
                                                                            : GangPhase::kOther;
    g.multi_node = u->spec().cluster.present;
    g.running_ranks = u->running_world_size();
    g.world_size = u->run().world_size();
    g.grow_after_s = u->spec().elastic.grow_after_s;
    g.priority = u->run().priority();
    const RunSpec& spec = u->spec();
    g.smallest_gang = static_cast<int>(spec.cluster.present      ? spec.cluster.ranks_per_node
                                       : spec.min_world_size > 0 ? spec.min_world_size
                                                                 : spec.world_size);
    out.push_back(std::move(g));
  }
  return out;
}

void DaemonImpl::GrowElasticGangs() {
  std::vector<std::string> free;
  int usable = 0;
  for (const Slot& s : slots_->slots()) {
    if (!s.drain) ++usable;
    if (s.state == SlotState::kFree && !s.drain) free.push_back(s.name);
  }
  const std::optional<Growth> grow =
      DecideGrowth(GangViews(), free, usable, env_->NowS(), grow_since_s_);
  if (!grow) return;
  if (RunUnit* u = Find(grow->run_id)) u->Resize(grow->reason);
}

// --- scheduling ------------------------------------------------------------------------------

void DaemonImpl::Schedule() {
  if (shutting_down_) return;
  std::vector<QueuedRun> queue;
  for (const auto& [id, u] : units_) {
    if (std::optional<QueuedRun> q = u->Queued()) queue.push_back(*q);
  }
  if (queue.empty()) return;
  const std::vector<Placement> placements =
      supervisor::Schedule(queue, slots_->Views(), env_->NowS());
  // A run whose smallest gang needs more slots than are usable (drains)
  // says so in its reason.
  std::vector<std::string> drained;
  for (const Slot& s : slots_->slots()) {
    if (s.drain) drained.push_back(absl::StrCat(s.name, " drained (", s.drain->reason, ")"));
  }
  const int usable = static_cast<int>(slots_->slots().size() - drained.size());
  for (const QueuedRun& q : queue) {
    const int least = SmallestGang(q);
    RunUnit* u = Find(q.run_id);
    if (u == nullptr) continue;
    if (drained.empty() || least <= usable) {
      u->NoteBlocked("");
      continue;
    }
    u->NoteBlocked(absl::StrCat("waiting for ", least, least == 1 ? " slot" : " slots", ": ",
                                usable, " usable; ", absl::StrJoin(drained, ", ")));
  }
  for (const Placement& p : placements) {
    RunUnit* u = Find(p.run_id);
    if (u == nullptr) continue;
    std::vector<std::string> gpus;
    for (size_t i = 0; i < p.slots.size(); ++i) {
      slots_->Assign(p.slots[i], p.run_id, static_cast<int>(i));
      gpus.push_back(slots_->VisibleDevices(p.slots[i]));
    }
    u->Start(p.slots, gpus);
  }
  // Runs that hold slots in a rendezvous may owe them to the queue's head.
  std::vector<QueuedRun> waiting;
  std::vector<JoiningRun> joining;
  for (const auto& [id, u] : units_) {
    if (std::optional<QueuedRun> q = u->Queued()) waiting.push_back(*q);
    if (std::optional<JoiningRun> j = u->Joining()) joining.push_back(*j);
  }
  if (waiting.empty() || joining.empty()) return;
  for (const Yield& y :
       YieldsFor(waiting, joining, slots_->Views(), env_->NowS(), config_.cluster.yield_after_s)) {
    if (RunUnit* u = Find(y.run_id)) u->YieldSlots(y.to_job);
  }
}

// --- daemon life ---------------------------------------------------------------------------------

void DaemonImpl::Tick() {
  for (auto& [id, u] : units_) {
    u->CheckLiveness();
    u->CheckBlocked();
  }
  exits_.Poll();
  slots_->Tick(config_.slots.gpu_idle_memory_mb << 20);
  tick_.expires_after(std::chrono::milliseconds(static_cast<int>(kTickS * 1000)));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void DaemonImpl::SlowTick() {
  // A run's wait in a rendezvous may have passed cluster.yield_after_s.
  for (const auto& [id, u] : units_) {
    if (std::optional<JoiningRun> j = u->Joining(); j && !j->yielding) {
      Reschedule();
      break;
    }
  }
  // Log rotation copies files: on the pool.
  std::vector<std::pair<std::string, std::string>> logs;
  for (const auto& [id, u] : units_) {
    for (const RankState& r : u->ranks()) {
      if (r.alive) logs.emplace_back(id, r.status.log_path());
    }
  }
  if (!logs.empty()) {
    asio::post(pool_, [this, logs, max = config_.workers.log_max_bytes,
                       keep = static_cast<int>(config_.workers.log_keep)] {
      for (const auto& [id, path] : logs) {
        absl::StatusOr<bool> rotated = RotateLogIfLarger(path, max, keep);
        if (!rotated.ok())
          log_->warn("run={} log rotation: {}", id, std::string(rotated.status().message()));
      }
    });
  }
  UpdateMetrics();
  Schedule();
  GrowElasticGangs();
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
  const double now = env_->NowS();
  const int64_t wall = env_->WallMs();
  int waiting = 0;
  for (const auto& [id, u] : units_) {
    counts[StateName(u->run().state())]++;
    waiting += u->waiting_for_space() ? 1 : 0;
    for (const RankState& r : u->ranks()) {
      if (!r.alive) continue;
      Metrics::WorkerSample sample{};
      sample.heartbeat_age_s = r.heard ? now - r.last_heartbeat_s : now - r.launched_s;
      const v1::Progress& p = r.status.progress();
      sample.samples_per_s = p.samples_per_sec();
      sample.steps_per_s = r.steps_per_s;
      sample.memory_current = static_cast<double>(p.memory_current_bytes());
      sample.memory_peak = static_cast<double>(p.memory_peak_bytes());
      sample.memory_budget = static_cast<double>(p.memory_budget_bytes());
      sample.step = static_cast<double>(p.step());
      sample.loss = p.loss();
      sample.learning_rate = p.learning_rate();
      sample.oom_splits = static_cast<double>(p.splits());
      sample.oom_retries = static_cast<double>(p.oom_retries());
      sample.oom_wasted_s = p.oom_wasted_seconds();
      sample.step_compute_s = r.status.window_compute_seconds() > 0
                                  ? r.status.window_compute_seconds()
                                  : p.step_compute_seconds();
      sample.straggler = r.status.straggler_ratio() > 0 ? 1 : 0;
      metrics_->SetWorker(id, r.rank, sample);
    }
    if (u->last_checkpoint_ms() > 0) {
      metrics_->SetCheckpointAge(id, static_cast<double>(wall - u->last_checkpoint_ms()) / 1000.0);
    }
    metrics_->SetRunWorldSize(id, u->running_world_size());
    metrics_->SetRunBlocked(id, u->blocked_s());
    if (u->run().has_progress()) metrics_->SetRunValMiou(id, u->run().progress().val_miou());
    if (const v1::Progress& p = u->run().progress(); p.has_tally() && p.tally().steps() >= 0) {
      const v1::TrainingTally& t = p.tally();
      metrics_->SetRunSteps(id, t.applied(), t.skipped_window(), t.skipped_guard(),
                            t.skipped_scaler());
    }
    if (v1::ClusterStatus c; u->FillCluster(&c)) {
      metrics_->SetCluster(id, c.job(), c.etcd_reachable(), c.generation());
    }
  }
  metrics_->SetRunsByState(counts);
  metrics_->SetRunsWaitingForSpace(waiting);
  for (const Slot& s : slots_->slots()) {
    metrics_->SetSlot(s.index, s.gpu_uuid, s.drain ? "DRAINED" : ToString(s.state));
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

void DaemonImpl::Reload() {
  sd_notify(0, "RELOADING=1");
  absl::StatusOr<DaemonConfig> next =
      config_path_.empty() ? absl::StatusOr<DaemonConfig>(config_) : LoadConfig(config_path_);
  if (!next.ok()) {
    log_->error("reload failed, keeping the running configuration: {}",
                std::string(next.status().message()));
    sd_notify(0, "READY=1");
    return;
  }
  ReloadPlan plan = PlanReload(config_, *next);
  // Tokens against the configuration in force: a state_dir that changed
  // in the file (restart needed) must not make the daemon read or make
  // tokens somewhere else.
  absl::StatusOr<std::vector<Token>> tokens = LoadTokens(plan.effective);
  if (!tokens.ok()) {
    log_->error("reload failed, keeping the running configuration: tokens: {}",
                std::string(tokens.status().message()));
    sd_notify(0, "READY=1");
    return;
  }
  config_ = std::move(plan.effective);
  PublishPolicy(*tokens);
  restart_needed_ = plan.restart_needed;
  log_->info("configuration reloaded; applied: [{}]{}", absl::StrJoin(plan.applied, ", "),
             plan.restart_needed.empty()
                 ? ""
                 : absl::StrCat("; restart needed for: [", absl::StrJoin(plan.restart_needed, ", "),
                                "] (kept at their running values)"));
  sd_notify(0, "READY=1");
}

void DaemonImpl::BeginShutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  sd_notify(0, "STOPPING=1");
  servers_.SetServing(false);
  int stopping = 0;
  for (auto& [id, u] : units_) {
    stopping += u->AnyAlive() ? 1 : 0;
    u->Shutdown();
  }
  log_->info("asked the workers of {} runs to checkpoint and stop", stopping);
  const double deadline =
      env_->NowS() + config_.workers.stop_deadline_s + config_.workers.term_grace_s + 5;
  auto timer = std::make_shared<asio::steady_timer>(io_);
  // Polls until every worker is gone and every write stored (or the
  // deadline), then stops the servers and the loop.
  struct Poller {
    DaemonImpl* d;
    std::shared_ptr<asio::steady_timer> timer;
    double deadline;
    void operator()() const {
      bool busy = false;
      for (auto& [id, u] : d->units_) busy = busy || u->AnyAlive() || !u->idle();
      if (busy && d->env_->NowS() < deadline) {
        timer->expires_after(std::chrono::milliseconds(50));
        Poller next = *this;
        timer->async_wait([next](const boost::system::error_code& ec) {
          if (!ec) next();
        });
        return;
      }
      d->hub_.FinishAll(absl::UnavailableError("trainsupd is shutting down"));
      std::thread([d = d] {
        d->servers_.Shutdown(std::chrono::seconds(2));
        asio::post(d->io_, [d] { d->io_.stop(); });
      }).detach();
    }
  };
  Poller{this, timer, deadline}();
}

int DaemonImpl::Run() {
  signal(SIGPIPE, SIG_IGN);
  signals_.async_wait([this](const boost::system::error_code& ec, int s) {
    if (!ec) OnSignal(s);
  });
  exits_.Start();
  if (sd_watchdog_enabled(0, &watchdog_usec_) > 0 && watchdog_usec_ > 0) Watchdog();
  Tick();
  SlowTick();
  Reschedule();
  sd_notifyf(0, "READY=1\nSTATUS=serving on %s, %zu slots", servers_.socket_path().c_str(),
             slots_->slots().size());
  io_.run();
  pool_.join();
  etcd_pool_.join();
  store_->Stop();
  log_->info("stopped");
  return 0;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonConfig& config,
                                                       const std::string& config_path,
                                                       std::shared_ptr<spdlog::logger> log) {
  auto d = std::make_unique<internal::DaemonImpl>(config, config_path, std::move(log));
  absl::Status s = d->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Daemon>(std::move(d));
}

}  // namespace trainsup::supervisor
