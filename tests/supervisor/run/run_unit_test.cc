// The run unit's transitions with every effect faked (unit_env.h): what it
// stores and when, what it launches, signals, publishes and schedules. No
// processes, sockets or clocks: time moves only when a test says so.
#include "supervisor/run/run_unit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <deque>
#include <map>
#include <set>

#include "contracts/run_layout.h"
#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

namespace wv1 = ::trainsup::worker::v1;
using ::testing::HasSubstr;

class FakeLink final : public WorkerLink {
 public:
  void Send(const wv1::SupervisorCommand& c) override { sent.push_back(c); }
  void Close(const absl::Status& s) override { closed = s; }
  std::vector<wv1::SupervisorCommand> sent;
  std::optional<absl::Status> closed;
};

class FakeEnv final : public UnitClock,
                      public UnitTimers,
                      public UnitStore,
                      public UnitLauncher,
                      public UnitSignaller,
                      public UnitHost {
 public:
  FakeEnv() {
    config_ = DefaultConfig();
    config_.restart.jitter = 0;
    config_.workers.capture_stacks = false;
  }
  UnitEnv env() { return UnitEnv{this, this, this, this, this, this}; }

  // Clock.
  double NowS() override { return now_; }
  int64_t WallMs() override { return 1'700'000'000'000 + static_cast<int64_t>(now_ * 1000); }
  uint64_t BootTicks() override { return 100000 + static_cast<uint64_t>(now_ * 100); }
  uint64_t BootTicksAt(int64_t wall_ms) override {
    return 100000 + static_cast<uint64_t>((wall_ms - 1'700'000'000'000) / 10);
  }
  // Runs the timers due by now + dt, in order, and what they post.
  void Advance(double dt) {
    const double until = now_ + dt;
    for (;;) {
      auto next = timers_.end();
      for (auto it = timers_.begin(); it != timers_.end(); ++it) {
        if (it->second.due <= until &&
            (next == timers_.end() || it->second.due < next->second.due)) {
          next = it;
        }
      }
      if (next == timers_.end()) break;
      now_ = std::max(now_, next->second.due);
      auto fn = std::move(next->second.fn);
      timers_.erase(next);
      fn();
    }
    now_ = until;
  }

  // Timers.
  TimerId Start(double delay_s, std::function<void()> fn) override {
    const TimerId id = next_timer_++;
    timers_[id] = {now_ + delay_s, std::move(fn)};
    return id;
  }
  void Cancel(TimerId id) override { timers_.erase(id); }
  void OffLoop(std::function<std::function<void()>()> work) override {
    std::function<void()> then = work();
    if (then) Start(0, std::move(then));
  }

  // Store: writes wait in `pending` until Complete().
  void Write(const std::string& run_id, StoreBatch batch,
             std::function<void(absl::Status, StoreBatch)> done) override {
    pending.push_back({run_id, std::move(batch), std::move(done)});
  }
  // Completes the oldest pending write (OK unless fail_writes > 0).
  bool Complete() {
    if (pending.empty()) return false;
    Pending p = std::move(pending.front());
    pending.pop_front();
    if (fail_writes > 0) {
      --fail_writes;
      p.done(absl::UnavailableError("database is locked"), std::move(p.batch));
      return true;
    }
    for (v1::RunEvent& e : p.batch.events) e.set_seq(++seq_);
    stored.push_back(p.batch);
    p.done(absl::OkStatus(), std::move(p.batch));
    return true;
  }
  void CompleteAll() {
    while (Complete()) {
    }
  }
  // Completes writes and runs due timers until nothing is left to do now.
  void Settle() {
    for (int i = 0; i < 100; ++i) {
      const bool wrote = Complete();
      const size_t before = timers_.size();
      Advance(0);
      if (!wrote && timers_.size() == before && pending.empty()) return;
    }
  }

  // Launcher.
  absl::StatusOr<LaunchedProcess> Launch(const LaunchSpec& spec) override {
    if (fail_launch) return absl::NotFoundError("no such binary");
    launches.push_back(spec);
    LaunchedProcess p;
    p.pid = next_pid_++;
    p.pgid = p.pid;
    p.start_ticks = BootTicks();
    alive.insert(p.pid);
    return p;
  }
  void WatchExit(const std::string&, int, int rank, int pid, uint64_t, bool own_child) override {
    watched[pid] = own_child;
    (void)rank;
  }
  void UnwatchExit(const std::string&, int, int) override { ++unwatched; }
  ReapResult Reap(int pid) override {
    ReapResult r;
    auto it = exits.find(pid);
    if (it == exits.end()) return r;
    r.state = ReapResult::kReaped;
    r.exited = it->second.first;
    r.code_or_signal = it->second.second;
    return r;
  }
  bool IsSameProcess(int pid, uint64_t) override { return alive.count(pid) != 0; }
  std::optional<ExitFile> ReadExitFile(const std::string& path) override {
    auto it = exit_files.find(path);
    if (it == exit_files.end()) return std::nullopt;
    return it->second;
  }
  void CaptureStacks(int, const std::string&,
                     std::function<void(absl::StatusOr<std::string>)> done) override {
    Start(0, [done] { done(std::string("fake")); });
  }
  // A process of ours ends (reaped with `code`, or by `signal`).
  void Exit(RunUnit& unit, int rank, int pid, bool exited, int code) {
    alive.erase(pid);
    exits[pid] = {exited, code};
    unit.OnProcessExit(unit.attempt_number(), rank);
  }

  // Signaller.
  absl::Status SignalGroup(const GroupIdentity& g, int sig) override {
    signals.push_back({g.pgid, sig});
    return absl::OkStatus();
  }
  absl::Status SignalLeader(const GroupIdentity& g, int sig) override {
    leader_signals.push_back({g.pgid, sig});
    return absl::OkStatus();
  }

  // Host.
  const DaemonConfig& config() override { return config_; }
  bool shutting_down() override { return shutting_down_; }
  void Log(LogLevel, const std::string& line) override { logs.push_back(line); }
  void Publish(const v1::RunEvent& e) override { published.push_back(e); }
  void ReleaseSlot(int slot, const GroupIdentity& g) override { released.push_back({slot, g}); }
  void Reschedule() override { ++reschedules; }
  void Finished(const std::string& id) override { finished.push_back(id); }
  void StoreFailed(const std::string&, const std::string& what, const absl::Status&) override {
    store_failures.push_back(what);
  }
  std::string WorkerBinary() override { return "/bin/trainsup-worker"; }
  std::string SupervisorEndpoint() override { return "unix:/s.sock"; }
  std::map<std::string, std::string> DaemonEnvironment() override { return {{"PATH", "/bin"}}; }
  // A new port on every call, as the real one may give.
  int FreePort() override { return next_port_++; }
  std::string NewSecret(int bytes) override {
    return std::string(static_cast<size_t>(bytes) * 2, static_cast<char>('a' + (secrets_++ % 26)));
  }
  double JitterUnit() override { return 0.5; }
  void MeasureSpace(const std::string&,
                    std::function<void(absl::StatusOr<int64_t>, int64_t)> done) override {
    ++space_checks;
    Start(0, [this, done] { done(free_bytes, checkpoint_bytes); });
  }
  void CountWorkerExit(const std::string& cls) override { exit_counts[cls]++; }
  void CountRestart(const std::string&) override {}
  void RemoveWorkerMetrics(const std::string&, int) override {}
  void CountCheckpointFailures(const std::string&, int64_t n) override { checkpoint_failures += n; }
  absl::StatusOr<std::unique_ptr<UnitCluster>> JoinCluster(const v1::Run&, const RunSpec&,
                                                           ClusterEvents events) override {
    if (!make_cluster) return absl::UnimplementedError("no cluster in this test");
    return make_cluster(std::move(events));
  }
  std::function<std::unique_ptr<UnitCluster>(ClusterEvents)> make_cluster;

  // Every stored event of `kind`.
  std::vector<v1::RunEvent> Stored(v1::EventKind kind) const {
    std::vector<v1::RunEvent> out;
    for (const StoreBatch& b : stored) {
      for (const v1::RunEvent& e : b.events) {
        if (e.kind() == kind) out.push_back(e);
      }
    }
    return out;
  }
  // The states stored, in order.
  std::vector<v1::RunState> StoredStates() const {
    std::vector<v1::RunState> out;
    for (const v1::RunEvent& e : Stored(v1::EVENT_KIND_STATE)) out.push_back(e.state());
    return out;
  }

  struct Pending {
    std::string run_id;
    StoreBatch batch;
    std::function<void(absl::Status, StoreBatch)> done;
  };
  DaemonConfig config_;
  bool shutting_down_ = false;
  std::deque<Pending> pending;
  std::vector<StoreBatch> stored;
  int fail_writes = 0;
  bool fail_launch = false;
  std::vector<LaunchSpec> launches;
  std::map<int, bool> watched;
  int unwatched = 0;
  std::set<int> alive;
  std::map<int, std::pair<bool, int>> exits;
  std::map<std::string, ExitFile> exit_files;
  std::vector<std::pair<int, int>> signals;
  std::vector<std::pair<int, int>> leader_signals;  // SignalLeader
  std::vector<std::string> logs;
  std::vector<v1::RunEvent> published;
  std::vector<std::pair<int, GroupIdentity>> released;
  int reschedules = 0;
  std::vector<std::string> finished;
  std::vector<std::string> store_failures;
  std::map<std::string, int> exit_counts;
  absl::StatusOr<int64_t> free_bytes = int64_t{1} << 40;
  int64_t checkpoint_bytes = 0;
  int space_checks = 0;
  int64_t checkpoint_failures = 0;

 private:
  struct Timer {
    double due;
    std::function<void()> fn;
  };
  double now_ = 100;
  TimerId next_timer_ = 1;
  std::map<TimerId, Timer> timers_;
  int next_pid_ = 4000;
  int next_port_ = 29555;
  int64_t seq_ = 1;  // the submit event
  int secrets_ = 0;
};

// A job's coordination as the unit sees it: records the calls, answers
// when the test says.
class FakeCluster final : public UnitCluster {
 public:
  struct Calls {
    std::vector<std::vector<int64_t>> joins;
    std::function<void(absl::StatusOr<Agreement>)> join_done;
    std::vector<std::pair<int64_t, AttemptEnd>> broken;
    std::vector<int64_t> verdicts;
    std::function<void(ClusterVerdict)> verdict_done;
    std::vector<std::string> cancels;
    int reports = 0;
    ClusterEvents events;
  };
  explicit FakeCluster(std::shared_ptr<Calls> calls) : calls_(std::move(calls)) {}
  void Join(int, std::vector<int64_t> steps, int,
            std::function<void(absl::StatusOr<Agreement>)> done) override {
    calls_->joins.push_back(std::move(steps));
    calls_->join_done = std::move(done);
  }
  void Broken(int64_t generation, const AttemptEnd& end) override {
    calls_->broken.emplace_back(generation, end);
  }
  void Verdict(int64_t generation, const AttemptEnd&,
               std::function<void(ClusterVerdict)> done) override {
    calls_->verdicts.push_back(generation);
    calls_->verdict_done = std::move(done);
  }
  void Cancel(const std::string& reason) override { calls_->cancels.push_back(reason); }
  void Report(const v1::ClusterNode&, bool) override { calls_->reports++; }
  void Fill(v1::ClusterStatus* out) const override { out->set_job("fake"); }

 private:
  std::shared_ptr<Calls> calls_;
};

class RunUnitTest : public ::testing::Test {
 protected:
  std::unique_ptr<RunUnit> NewUnit(int world_size = 1) {
    RunSpec spec;
    spec.world_size = world_size;
    return NewUnit(spec);
  }
  std::unique_ptr<RunUnit> NewUnit(const RunSpec& spec) {
    v1::Run run;
    run.set_run_id("r-1");
    run.set_name("r");
    run.set_state(v1::RUN_STATE_PENDING);
    run.set_world_size(static_cast<int>(spec.world_size));
    run.set_run_dir(dir_.path());
    return std::make_unique<RunUnit>(run, spec, 1, env_.env());
  }
  // A command run of /bin/sh, which the daemon's configuration allows.
  std::unique_ptr<RunUnit> NewCommandUnit(bool heartbeats) {
    env_.config_.commands.allowed_programs = {"/bin/sh"};
    RunSpec spec;
    spec.has_command = true;
    spec.command.argv = {"/bin/sh", "-c", "exit 0"};
    spec.command.heartbeats = heartbeats;
    spec.command.total_steps = 500;
    return NewUnit(spec);
  }
  // Places the unit, stores its attempt and launches it; the pids.
  std::vector<int> StartAndLaunch(RunUnit& u) {
    std::vector<int> slots, pids;
    std::vector<std::string> gpus;
    for (int i = 0; i < u.run().world_size(); ++i) {
      slots.push_back(i);
      gpus.push_back("");
    }
    u.Start(slots, gpus);
    env_.Settle();
    for (const RankState& r : u.ranks()) pids.push_back(r.pid);
    return pids;
  }
  // A Hello with the rank's token on a new link.
  std::shared_ptr<FakeLink> Hello(RunUnit& u, int rank) {
    auto link = std::make_shared<FakeLink>();
    wv1::Hello h;
    h.set_run_id(u.id());
    h.set_attempt(u.attempt_number());
    h.set_rank(rank);
    h.set_token(u.ranks()[rank].token);
    EXPECT_TRUE(u.OnHello(h, link).ok());
    env_.Settle();
    return link;
  }

  trainsup::testing::TempDir dir_{"run_unit_test"};
  FakeEnv env_;
};

TEST_F(RunUnitTest, TheAttemptIsStoredBeforeAnyProcessStarts) {
  auto u = NewUnit();
  ASSERT_TRUE(u->Queued().has_value());
  u->Start({0}, {""});
  env_.Advance(0);  // the checkpoint choice comes back
  ASSERT_EQ(env_.pending.size(), 1u);
  EXPECT_EQ(env_.pending.front().batch.what, "attempt 1 started");
  EXPECT_TRUE(env_.launches.empty()) << "launched before the attempt was stored";
  EXPECT_FALSE(u->Queued().has_value());
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 1u);
  EXPECT_EQ(env_.launches[0].env.at("TRAINSUP_ATTEMPT"), "1");
  EXPECT_EQ(env_.watched.size(), 1u);
  EXPECT_EQ(env_.StoredStates(), std::vector<v1::RunState>{v1::RUN_STATE_STARTING});
  // Published only once stored, with the store's seq numbers.
  for (const v1::RunEvent& e : env_.published) EXPECT_GT(e.seq(), 0);
}

// Defect 7: a write that fails stops the transition; it is retried.
TEST_F(RunUnitTest, AFailedWriteHoldsTheRunUntilItIsStored) {
  auto u = NewUnit();
  env_.fail_writes = 2;
  u->Start({0}, {""});
  env_.Advance(0);
  EXPECT_TRUE(env_.Complete());
  EXPECT_EQ(env_.store_failures, std::vector<std::string>{"attempt 1 started"});
  EXPECT_TRUE(env_.launches.empty());
  env_.Advance(0.3);  // the first retry
  EXPECT_TRUE(env_.Complete());
  EXPECT_EQ(env_.store_failures.size(), 2u);
  EXPECT_TRUE(env_.launches.empty());
  env_.Advance(1);
  env_.Settle();
  EXPECT_EQ(env_.launches.size(), 1u);
}

TEST_F(RunUnitTest, HelloWithTheTokenRunsWrongTokenIsRefused) {
  auto u = NewUnit();
  StartAndLaunch(*u);
  auto link = std::make_shared<FakeLink>();
  wv1::Hello h;
  h.set_run_id(u->id());
  h.set_attempt(1);
  h.set_rank(0);
  h.set_token("wrong");
  EXPECT_EQ(u->OnHello(h, link).code(), absl::StatusCode::kUnauthenticated);
  h.set_attempt(2);
  h.set_token(u->ranks()[0].token);
  EXPECT_EQ(u->OnHello(h, link).code(), absl::StatusCode::kUnauthenticated);
  auto good = Hello(*u, 0);
  ASSERT_FALSE(good->sent.empty());
  EXPECT_TRUE(good->sent[0].has_welcome());
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RUNNING);
}

TEST_F(RunUnitTest, ACrashIsRestartedOnlyAfterItsEndIsStored) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  Hello(*u, 0);
  env_.Exit(*u, 0, pids[0], true, 3);
  // The rank's end, then the attempt's end with the decision, in order.
  ASSERT_EQ(env_.pending.size(), 1u);
  EXPECT_EQ(env_.pending.front().batch.what, "rank 0 ended");
  ASSERT_EQ(env_.released.size(), 1u);
  EXPECT_EQ(env_.released[0].second.pgid, pids[0]);
  env_.Complete();
  ASSERT_EQ(env_.pending.size(), 1u);
  const StoreBatch& end = env_.pending.front().batch;
  EXPECT_EQ(end.what, "attempt 1 ended");
  ASSERT_EQ(end.attempts.size(), 1u);
  EXPECT_EQ(end.attempts[0].exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_FALSE(end.attempts[0].stop_requested());
  ASSERT_TRUE(end.run.has_value());
  EXPECT_EQ(end.run->state(), v1::RUN_STATE_RESTARTING);
  EXPECT_FALSE(u->Queued().has_value()) << "schedulable before the end was stored";
  env_.Complete();
  ASSERT_TRUE(u->Queued().has_value());
  EXPECT_DOUBLE_EQ(u->Queued()->not_before_s, env_.NowS() + 1.0) << "backoff 1 s";
  const int before = env_.reschedules;
  env_.Advance(1.1);
  EXPECT_GT(env_.reschedules, before) << "the scheduler is asked again after the backoff";
  EXPECT_EQ(u->run().restarts(), 1);
  EXPECT_EQ(env_.Stored(v1::EVENT_KIND_RESTART).size(), 1u);
}

TEST_F(RunUnitTest, AFailingRankStopsTheGangWithSigtermThenSigkill) {
  env_.config_.workers.term_grace_s = 2;
  auto u = NewUnit(2);
  std::vector<int> pids = StartAndLaunch(*u);
  ASSERT_EQ(pids.size(), 2u);
  Hello(*u, 0);
  Hello(*u, 1);
  env_.Exit(*u, 1, pids[1], true, 1);
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0], std::make_pair(pids[0], SIGTERM));
  env_.Advance(2.1);
  ASSERT_EQ(env_.signals.size(), 2u);
  EXPECT_EQ(env_.signals[1], std::make_pair(pids[0], SIGKILL));
  env_.Exit(*u, 0, pids[0], false, SIGKILL);
  env_.Settle();
  ASSERT_EQ(u->ranks().size(), 2u);
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_GANG);
  EXPECT_THAT(u->ranks()[0].status.exit_reason(), HasSubstr("stopped because rank 1 ended"));
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
}

// Issue 12: the attempt's end names the rank that failed first in time.
// Rank 1 is declared frozen first; rank 0 then exits 3 on its own while
// rank 1 is being killed (so rank 0 is not a gang stop). In rank order rank
// 0 would be named.
TEST_F(RunUnitTest, TheRestartNamesTheRankThatFailedFirstNotTheLowest) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  env_.config_.workers.term_grace_s = 2;
  auto u = NewUnit(2);
  std::vector<int> pids = StartAndLaunch(*u);
  auto link0 = Hello(*u, 0);
  Hello(*u, 1);
  env_.Advance(4);
  wv1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_progress_counter(1);
  u->OnWorkerMessage(1, 0, link0.get(), hb);
  env_.Advance(2);
  u->CheckLiveness();
  env_.Settle();
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0], std::make_pair(pids[1], SIGTERM)) << "only rank 1 is frozen";
  env_.Exit(*u, 0, pids[0], true, 3);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_CRASH);
  env_.Exit(*u, 1, pids[1], false, SIGTERM);
  env_.Settle();
  EXPECT_EQ(u->ranks()[1].status.exit_class(), v1::EXIT_CLASS_FROZEN);
  ASSERT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  const std::vector<v1::RunEvent> restarts = env_.Stored(v1::EVENT_KIND_RESTART);
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0].exit_class(), v1::EXIT_CLASS_FROZEN);
  EXPECT_THAT(restarts[0].reason(), HasSubstr("rank 1 died first: rank 1 no heartbeat"));
  const std::vector<v1::RunEvent> ended = env_.Stored(v1::EVENT_KIND_ATTEMPT_ENDED);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0].reason(), HasSubstr("rank 1 died first"));
}

// Every attempt of a gang gets one MASTER_PORT for all its ranks, and the
// next attempt a fresh one (the old rendezvous port may still be held).
TEST_F(RunUnitTest, EachAttemptOfAGangGetsOneFreshMasterPort) {
  auto u = NewUnit(2);
  std::vector<int> pids = StartAndLaunch(*u);
  ASSERT_EQ(env_.launches.size(), 2u);
  const std::string first = env_.launches[0].env.at("MASTER_PORT");
  EXPECT_EQ(env_.launches[1].env.at("MASTER_PORT"), first);
  Hello(*u, 0);
  Hello(*u, 1);
  env_.Exit(*u, 1, pids[1], true, 3);
  env_.Exit(*u, 0, pids[0], false, SIGTERM);
  env_.Settle();
  ASSERT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  env_.Advance(1.1);
  StartAndLaunch(*u);
  ASSERT_EQ(u->attempt_number(), 2);
  ASSERT_EQ(env_.launches.size(), 4u);
  EXPECT_EQ(env_.launches[2].env.at("TRAINSUP_ATTEMPT"), "2");
  const std::string second = env_.launches[2].env.at("MASTER_PORT");
  EXPECT_NE(second, first);
  EXPECT_EQ(env_.launches[3].env.at("MASTER_PORT"), second);
}

TEST_F(RunUnitTest, CancelAsksTheWorkerToStopThenEndsCancelled) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  absl::Status answer = absl::UnknownError("not called");
  u->Cancel("by test", [&](absl::Status s) { answer = s; });
  EXPECT_TRUE(answer.ok());
  ASSERT_GE(link->sent.size(), 2u);
  EXPECT_TRUE(link->sent.back().has_stop());
  EXPECT_TRUE(env_.signals.empty()) << "a graceful stop starts with the Stop command";
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] = ExitFile{143, "stopped", "", 5, 0};
  env_.Exit(*u, 0, pids[0], true, 143);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(u->run().reason(), "cancelled: by test");
  EXPECT_EQ(env_.finished, std::vector<std::string>{"r-1"});
  const StoreBatch* ended = nullptr;
  for (const StoreBatch& b : env_.stored) {
    if (!b.attempts.empty() && b.attempts[0].ended_ms() != 0) ended = &b;
  }
  ASSERT_NE(ended, nullptr);
  EXPECT_TRUE(ended->attempts[0].stop_requested());
}

TEST_F(RunUnitTest, GracefulShutdownStoresARequestedStopAndGoesBackToPending) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  env_.shutting_down_ = true;
  u->Shutdown();
  EXPECT_TRUE(link->sent.back().has_stop());
  env_.Exit(*u, 0, pids[0], true, 143);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_PENDING);
  bool stored_stop = false;
  for (const StoreBatch& b : env_.stored) {
    for (const v1::Attempt& a : b.attempts) stored_stop = stored_stop || a.stop_requested();
  }
  EXPECT_TRUE(stored_stop) << "defect 15: the stop must be stored with the attempt";
}

TEST_F(RunUnitTest, NoHeartbeatIsFrozenAndKilled) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  Hello(*u, 0);
  env_.Advance(4);
  u->CheckLiveness();
  EXPECT_TRUE(env_.signals.empty());
  env_.Advance(2);
  u->CheckLiveness();
  env_.Settle();
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0].second, SIGTERM);
  ASSERT_EQ(env_.Stored(v1::EVENT_KIND_HANG).size(), 1u);
  EXPECT_THAT(env_.Stored(v1::EVENT_KIND_HANG)[0].reason(), HasSubstr("no heartbeat"));
  env_.Exit(*u, 0, pids[0], false, SIGTERM);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_FROZEN);
}

TEST_F(RunUnitTest, ExitZeroWithoutHelloIsACrashNotASuccess) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  env_.Exit(*u, 0, pids[0], true, 0);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
}

TEST_F(RunUnitTest, NoSpaceWaitsForSpaceWithoutTheBudget) {
  env_.config_.restart.max_restarts = 0;
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  Hello(*u, 0);
  env_.free_bytes = int64_t{10} << 20;
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] =
      ExitFile{74, "no_space", "no space left on device", 7, 0};
  env_.Exit(*u, 0, pids[0], true, 74);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING) << u->run().reason();
  EXPECT_TRUE(u->waiting_for_space());
  env_.Advance(1.1);
  env_.Settle();
  EXPECT_GE(env_.space_checks, 1);
  EXPECT_FALSE(u->Queued().has_value());
  int waits = 0;
  for (const v1::RunEvent& e : env_.Stored(v1::EVENT_KIND_LOG)) {
    waits += e.reason().find("waiting for disk space") != std::string::npos;
  }
  EXPECT_EQ(waits, 1);
  env_.free_bytes = int64_t{10} << 30;
  env_.Advance(10);
  env_.Settle();
  EXPECT_FALSE(u->waiting_for_space());
  EXPECT_TRUE(u->Queued().has_value());
}

TEST_F(RunUnitTest, RestoreAdoptsLiveWorkersAndClassifiesDeadOnes) {
  env_.alive.insert(5000);
  v1::Run stored;
  stored.set_run_id("r-2");
  stored.set_state(v1::RUN_STATE_RUNNING);
  stored.set_world_size(2);
  stored.set_run_dir(dir_.path());
  v1::Attempt* a = stored.add_attempts();
  a->set_number(3);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankStatus* rs = a->add_ranks();
    rs->set_rank(rank);
    rs->set_pid(5000 + rank);
    rs->set_alive(true);
    rs->set_slot(rank);
  }
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(3, 1)] = ExitFile{1, "crash", "boom", 2, 0};
  std::vector<RankPrivate> privs = {{5000, 11, "t0"}, {5001, 12, "t1"}};
  auto u = RunUnit::Restore(stored, RunSpec{}, 1, privs, RunLearning{}, env_.env());
  ASSERT_EQ(u->ranks().size(), 2u);
  EXPECT_TRUE(env_.watched.count(5000));
  EXPECT_FALSE(env_.watched.at(5000)) << "an adopted worker is not our child";
  env_.Settle();
  // Rank 1 died while no daemon watched: classified from its exit file,
  // which stops rank 0 (gang).
  EXPECT_FALSE(u->ranks()[1].alive);
  EXPECT_EQ(u->ranks()[1].status.exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_THAT(u->ranks()[1].status.exit_reason(), HasSubstr("boom"));
  ASSERT_FALSE(env_.signals.empty());
  EXPECT_EQ(env_.signals[0], std::make_pair(5000, SIGTERM));
}

TEST_F(RunUnitTest, ALaunchThatFailsEndsTheAttemptAsACrash) {
  env_.fail_launch = true;
  auto u = NewUnit();
  StartAndLaunch(*u);
  env_.Settle();
  ASSERT_EQ(u->ranks().size(), 1u);
  EXPECT_THAT(u->ranks()[0].status.exit_reason(), HasSubstr("cannot start /bin/trainsup-worker"));
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  ASSERT_EQ(env_.released.size(), 1u);
}

TEST_F(RunUnitTest, ACommandWithoutHeartbeatsRunsIsNeverFrozenAndSucceedsOnExitZero) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  auto u = NewCommandUnit(/*heartbeats=*/false);
  std::vector<int> pids = StartAndLaunch(*u);
  ASSERT_EQ(env_.launches.size(), 1u);
  EXPECT_EQ(env_.launches[0].binary, "/bin/sh");
  EXPECT_EQ(env_.launches[0].args, (std::vector<std::string>{"-c", "exit 0"}));
  EXPECT_EQ(env_.launches[0].env.at("TRAINSUP_HEARTBEATS"), "0");
  EXPECT_EQ(env_.launches[0].env.at("TRAINSUP_RESUME_FROM"), "");
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RUNNING) << "no Hello is awaited";
  env_.Advance(100000);
  u->CheckLiveness();
  env_.Settle();
  EXPECT_TRUE(env_.signals.empty());
  EXPECT_TRUE(env_.Stored(v1::EVENT_KIND_HANG).empty());
  env_.Exit(*u, 0, pids[0], true, 0);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_SUCCEEDED);
}

TEST_F(RunUnitTest, ACommandOffTheAllowlistAtLaunchFailsToStart) {
  auto u = NewCommandUnit(/*heartbeats=*/false);
  env_.config_.commands.allowed_programs.clear();  // a reload took it away
  StartAndLaunch(*u);
  EXPECT_TRUE(env_.launches.empty());
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_THAT(u->ranks()[0].status.exit_reason(),
              HasSubstr("cannot start /bin/sh: command.argv[0]: no program is allowed to run"));
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
}

TEST_F(RunUnitTest, AHungCommandGetsSigusr1ThenTheUsualKill) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  env_.config_.workers.python_stack_wait_s = 2;
  auto u = NewCommandUnit(/*heartbeats=*/true);
  std::vector<int> pids = StartAndLaunch(*u);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_STARTING) << "a Hello is awaited";
  auto link = Hello(*u, 0);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RUNNING);
  // A heartbeat without a total: the spec's total_steps stands in.
  wv1::WorkerMessage m;
  m.mutable_heartbeat()->set_progress_counter(1);
  m.mutable_heartbeat()->mutable_progress()->set_step(7);
  u->OnWorkerMessage(u->attempt_number(), 0, link.get(), m);
  env_.Settle();
  EXPECT_EQ(u->run().progress().total_steps(), 500);
  EXPECT_EQ(u->run().progress().step(), 7);
  env_.Advance(6);
  u->CheckLiveness();
  env_.Settle();
  ASSERT_EQ(env_.leader_signals.size(), 1u);
  EXPECT_EQ(env_.leader_signals[0], (std::pair<int, int>{pids[0], SIGUSR1}));
  EXPECT_TRUE(env_.signals.empty()) << "SIGTERM before the Python stacks had their moment";
  env_.Advance(2);
  env_.Settle();
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0].second, SIGTERM);
  env_.Exit(*u, 0, pids[0], false, SIGTERM);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_FROZEN);
}

TEST_F(RunUnitTest, OurWorkerGetsNoSigusr1) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  auto u = NewUnit();
  StartAndLaunch(*u);
  Hello(*u, 0);
  env_.Advance(6);
  u->CheckLiveness();
  env_.Settle();
  EXPECT_TRUE(env_.leader_signals.empty());
  ASSERT_EQ(env_.signals.size(), 1u);
}

// Node rank 1 of a job of 2 nodes x 2 ranks: it joins before launching,
// starts global ranks 2 and 3 with node 0's MASTER, reports a failure to
// the job, stops its ranks when the job moves on, and takes the job's one
// decision (and restart count) instead of its own.
TEST_F(RunUnitTest, AMultiNodeRunJoinsLaunchesItsGlobalRanksAndFollowsTheJob) {
  auto calls = std::make_shared<FakeCluster::Calls>();
  env_.make_cluster = [calls](ClusterEvents events) {
    calls->events = std::move(events);
    return std::make_unique<FakeCluster>(calls);
  };
  RunSpec spec;
  spec.cluster.present = true;
  spec.cluster.job = "j";
  spec.cluster.nodes = 2;
  spec.cluster.ranks_per_node = 2;
  spec.cluster.checkpoint_dir = dir_.path() + "/shared";
  spec.world_size = 4;
  auto u = NewUnit(spec);
  ASSERT_TRUE(u->Queued().has_value());
  EXPECT_EQ(u->Queued()->world_size, 2) << "this node's slots, not the job's";
  u->Start({0, 1}, {"", ""});
  env_.Settle();
  ASSERT_EQ(calls->joins.size(), 1u);
  EXPECT_TRUE(env_.launches.empty()) << "nothing starts before the rendezvous";
  EXPECT_FALSE(u->Queued().has_value());
  Agreement a;
  a.generation = 1;
  a.node_rank = 1;
  a.nodes = {"a", "b"};
  a.master_addr = "10.0.0.1";
  a.master_port = 29999;
  calls->join_done(a);
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const LaunchSpec& l = env_.launches[i];
    EXPECT_EQ(l.env.at("RANK"), std::to_string(2 + i));
    EXPECT_EQ(l.env.at("LOCAL_RANK"), std::to_string(i));
    EXPECT_EQ(l.env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(l.env.at("MASTER_ADDR"), "10.0.0.1");
    EXPECT_EQ(l.env.at("MASTER_PORT"), "29999");
  }
  ASSERT_EQ(u->ranks().size(), 2u);
  EXPECT_EQ(u->ranks()[0].rank, 2);
  const int pid2 = u->ranks()[0].pid, pid3 = u->ranks()[1].pid;
  env_.Exit(*u, 2, pid2, true, 3);
  env_.Settle();
  ASSERT_EQ(calls->broken.size(), 1u);
  EXPECT_EQ(calls->broken[0].first, 1);
  EXPECT_EQ(calls->broken[0].second.cls, ExitClass::kCrash);
  EXPECT_EQ(calls->broken[0].second.detail.rfind("rank 2 ended: ", 0), 0u)
      << calls->broken[0].second.detail;
  // The job moves on; rank 3 (already being stopped) ends.
  calls->events.moved(2, "node b: rank 2 ended");
  env_.Exit(*u, 3, pid3, false, SIGTERM);
  env_.Settle();
  ASSERT_EQ(calls->verdicts.size(), 1u);
  EXPECT_EQ(calls->verdicts[0], 1);
  EXPECT_NE(u->run().state(), v1::RUN_STATE_RESTARTING) << "waits for the job's decision";
  ClusterVerdict v;
  v.kind = ClusterVerdict::Kind::kRestart;
  v.generation = 2;
  v.restarts = 5;
  v.delay_s = 0;
  v.reason = "node b: rank 2 ended; restart";
  calls->verdict_done(v);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(u->run().restarts(), 5) << "the job's count";
  EXPECT_GT(calls->reports, 0);
  // A cancel here cancels the whole job.
  bool taken = false;
  u->Cancel("enough", [&](absl::Status s) { taken = s.ok(); });
  env_.Settle();
  EXPECT_TRUE(taken);
  ASSERT_EQ(calls->cancels.size(), 1u);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_CANCELLED);
}

}  // namespace
}  // namespace trainsup::supervisor
