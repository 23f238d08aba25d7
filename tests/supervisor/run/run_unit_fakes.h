// The run unit's every effect faked (unit_env.h), for run_unit_test.cc and
// run_unit_command_test.cc: a recording environment where time moves only
// when a test says so, a fake cluster, and the fixture that drives a unit.
#ifndef TRAINSUP_TESTS_SUPERVISOR_RUN_RUN_UNIT_FAKES_H_
#define TRAINSUP_TESTS_SUPERVISOR_RUN_RUN_UNIT_FAKES_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <deque>
#include <map>
#include <set>

#include "contracts/run_layout.h"
#include "contracts/version.h"
#include "supervisor/run/run_unit.h"
#include "tests/common/temp_dir.h"
#include "tests/supervisor/fake_loop.h"

namespace trainsup::supervisor {

namespace wv1 = ::trainsup::worker::v1;
using ::testing::HasSubstr;

class FakeLink final : public WorkerLink {
 public:
  void Send(const wv1::SupervisorCommand& c) override { sent.push_back(c); }
  void Close(const absl::Status& s) override { closed = s; }
  std::vector<wv1::SupervisorCommand> sent;
  std::optional<absl::Status> closed;
};

class FakeEnv final : public FakeLoop,
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
      const size_t before = timers_pending();
      Advance(0);
      if (!wrote && timers_pending() == before && pending.empty()) return;
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
  FileTail ReadTail(const std::string& path, int64_t offset, int64_t max_bytes) override {
    FileTail t;
    auto it = files.find(path);
    if (it == files.end()) return t;
    t.size = static_cast<int64_t>(it->second.size());
    if (offset < t.size) t.bytes = it->second.substr(offset, max_bytes);
    return t;
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
  void CountGuardSteps(const std::string&, int64_t nonfinite, int64_t spikes) override {
    guard_nonfinite += nonfinite;
    guard_spikes += spikes;
  }
  void CountRollback(const std::string&) override { ++rollbacks; }
  void CountResize(const std::string&, const std::string& direction) override {
    resizes[direction]++;
  }
  std::map<std::string, int> resizes;
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
  std::map<std::string, std::string> files;  // what ReadTail reads (rank logs)
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
  int64_t guard_nonfinite = 0;
  int64_t guard_spikes = 0;
  int rollbacks = 0;

 private:
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
    int withdraws = 0;
    std::function<void(bool)> withdraw_done;
    int reports = 0;
    ClusterEvents events;
  };
  explicit FakeCluster(std::shared_ptr<Calls> calls) : calls_(std::move(calls)) {}
  void Join(int, std::vector<int64_t> steps, std::optional<ckpt::StoreOwner>, int,
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
  void Withdraw(std::function<void(bool)> done) override {
    calls_->withdraws++;
    calls_->withdraw_done = std::move(done);
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
  // The unit's cluster is a FakeCluster recording into the calls returned.
  std::shared_ptr<FakeCluster::Calls> UseFakeCluster() {
    auto calls = std::make_shared<FakeCluster::Calls>();
    env_.make_cluster = [calls](ClusterEvents events) {
      calls->events = std::move(events);
      return std::make_unique<FakeCluster>(calls);
    };
    return calls;
  }
  // The spec of job "j": `nodes` x `ranks_per_node`, going on with
  // `min_nodes` (0: all of them).
  RunSpec ClusterRunSpec(int64_t nodes, int64_t ranks_per_node, int64_t min_nodes = 0) {
    RunSpec spec;
    spec.cluster.present = true;
    spec.cluster.job = "j";
    spec.cluster.nodes = nodes;
    spec.cluster.min_nodes = min_nodes > 0 ? min_nodes : nodes;
    spec.cluster.ranks_per_node = ranks_per_node;
    spec.cluster.checkpoint_dir = dir_.path() + "/shared";
    spec.world_size = nodes * ranks_per_node;
    spec.min_world_size = spec.cluster.min_nodes * ranks_per_node;
    return spec;
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
    h.set_version(std::string(Version()));
    EXPECT_TRUE(u.OnHello(h, link).ok());
    env_.Settle();
    return link;
  }

  trainsup::testing::TempDir dir_{"run_unit_test"};
  FakeEnv env_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_TESTS_SUPERVISOR_RUN_RUN_UNIT_FAKES_H_
