// The real trainsupd with real worker processes, continued from
// daemon_test.cc (one program, daemon_integration_test): sd_notify,
// concurrent watchers, graceful shutdown, metrics, trainctl, GPU release
// (fake GPUs), the OOM memory budget, socket permissions, health and
// reflection. Each test owns a daemon in its own temporary directory.
// Assertions are about behaviour, never about how fast anything happened.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "contracts/run_layout.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"
#include "trainsup/v1/worker.grpc.pb.h"

namespace trainsup::integration {
namespace {

namespace fs = std::filesystem;
namespace wv1 = ::trainsup::worker::v1;
using ::testing::HasSubstr;
using ::testing::Not;

// --- 12. sd_notify --------------------------------------------------------------------------

// The receiving end of NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    close(fd_);
    unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  // Reads datagrams until one has a line equal to `line`; all of them are
  // appended to `seen`.
  bool WaitFor(const std::string& line, Seconds limit) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      std::string msg(buf, n);
      seen += msg + "|";
      std::stringstream lines(msg);
      std::string l;
      while (std::getline(lines, l)) {
        if (l == line) return true;
      }
    }
    return false;
  }
  std::string seen;

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST(Daemon, NotifiesSystemd) {
  DaemonHarness h;
  NotifySocket notify(h.dir() + "/notify.sock");
  ASSERT_TRUE(notify.bound());
  ASSERT_TRUE(h.Start({"NOTIFY_SOCKET=" + h.dir() + "/notify.sock", "WATCHDOG_USEC=400000"}));
  EXPECT_TRUE(notify.WaitFor("READY=1", Seconds(20))) << notify.seen;
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", Seconds(20))) << notify.seen;
  h.Signal(SIGHUP);
  EXPECT_TRUE(notify.WaitFor("RELOADING=1", Seconds(20))) << notify.seen;
  EXPECT_TRUE(notify.WaitFor("READY=1", Seconds(20))) << notify.seen;
  // Still serving after the reload.
  v1::Node node;
  auto ctx = h.Context(h.viewer_token());
  EXPECT_TRUE(h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node).ok());
  h.Signal(SIGTERM);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", Seconds(20))) << notify.seen;
  std::optional<int> status = h.WaitExit(Seconds(30));
  ASSERT_TRUE(status.has_value()) << "trainsupd did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

// --- 13. many watchers while workers churn ---------------------------------------------------

TEST(Daemon, ConcurrentWatchersSeeTheSameGapFreeHistory) {
  DaemonHarness h;
  h.Set("slots.cpu_slots", "4");
  h.Set("restart.initial_backoff_s", "0.3");
  h.Set("restart.max_restarts", "3");
  h.Set("restart.crash_loop_attempts", "10");
  ASSERT_TRUE(h.Start());
  const std::vector<std::string> ids = {
      // Fails every attempt: 4 attempts, then the budget ends it.
      h.Submit(Spec("churn", 10, 20, 2, "exit_at_step = 1\nexit_code = 3")),
      h.Submit(Spec("crash", 15, 30, 2, "exit_at_step = 4\nexit_code = 3\nonly_attempt = 1")),
      // SIGTERM from inside: checkpoint, exit 143 unasked, restart.
      h.Submit(Spec("term", 15, 30, 2, "signal_at_step = 3\nsignal = 15")),
      h.Submit(Spec("abort", 15, 30, 2, "crash_at_step = 5\nonly_attempt = 1")),
  };
  for (const std::string& id : ids) ASSERT_FALSE(id.empty());

  constexpr int kWatchers = 32;
  struct Stream {
    std::vector<v1::RunEvent> events;
    grpc::Status status;
  };
  std::vector<Stream> streams(kWatchers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWatchers; ++i) {
    threads.emplace_back([&, i] {
      v1::WatchRunRequest req;
      req.set_run_id(ids[i % ids.size()]);
      req.set_include_history(true);
      auto ctx = h.Context(i % 2 ? h.viewer_token() : h.operator_token(), kRunLimit);
      auto reader = h.stub().WatchRun(ctx.get(), req);
      v1::RunEvent e;
      while (reader->Read(&e)) streams[i].events.push_back(e);
      streams[i].status = reader->Finish();
    });
  }
  for (std::thread& t : threads) t.join();

  std::vector<std::vector<v1::RunEvent>> histories;
  for (const std::string& id : ids) {
    v1::Run run;
    ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
    EXPECT_GE(run.attempts_size(), 2) << Describe(run);
    histories.push_back(h.History(id));
    const std::vector<v1::RunEvent>& history = histories.back();
    ASSERT_FALSE(history.empty());
    for (size_t k = 0; k < history.size(); ++k) {
      ASSERT_EQ(history[k].seq(), static_cast<int64_t>(k + 1)) << Describe(history);
    }
    EXPECT_EQ(history.back().kind(), v1::EVENT_KIND_STATE);
    EXPECT_TRUE(IsTerminal(history.back().state())) << Describe(history);
  }
  EXPECT_EQ(h.GetRun(ids[0]).state(), v1::RUN_STATE_FAILED);
  EXPECT_EQ(h.GetRun(ids[0]).attempts_size(), 4);

  for (int i = 0; i < kWatchers; ++i) {
    SCOPED_TRACE("watcher " + std::to_string(i));
    const Stream& s = streams[i];
    EXPECT_TRUE(s.status.ok()) << s.status.error_code() << " " << s.status.error_message();
    ASSERT_FALSE(s.events.empty());
    EXPECT_EQ(s.events.back().kind(), v1::EVENT_KIND_STATE);
    EXPECT_TRUE(IsTerminal(s.events.back().state()));
    std::vector<v1::RunEvent> stored;
    for (const v1::RunEvent& e : s.events) {
      if (e.seq() > 0) stored.push_back(e);
    }
    const std::vector<v1::RunEvent>& history = histories[i % ids.size()];
    ASSERT_EQ(stored.size(), history.size()) << "stream:\n"
                                             << Describe(stored) << "history:\n"
                                             << Describe(history);
    for (size_t k = 0; k < stored.size(); ++k) {
      EXPECT_EQ(stored[k].seq(), history[k].seq());
      EXPECT_EQ(stored[k].kind(), history[k].kind());
      EXPECT_EQ(stored[k].attempt(), history[k].attempt());
      EXPECT_EQ(stored[k].reason(), history[k].reason());
    }
  }
}

// --- 14. graceful shutdown ------------------------------------------------------------------

TEST(Daemon, GracefulShutdownStopsWorkersAndTheNextDaemonResumes) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("graceful", 40, 100, 100));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 3;
      },
      kRunLimit, &run));
  const int pid = run.attempts(0).ranks(0).pid();
  h.Signal(SIGTERM);
  std::optional<int> status = h.WaitExit(Seconds(60));
  ASSERT_TRUE(status.has_value()) << "trainsupd did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  EXPECT_FALSE(ProcessAlive(pid)) << "the worker outlived the daemon's shutdown";

  ASSERT_TRUE(h.Start());
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  const v1::RankStatus& stopped = run.attempts(0).ranks(0);
  EXPECT_EQ(stopped.exit_code(), 143) << Describe(run);
  EXPECT_EQ(stopped.exit_class(), v1::EXIT_CLASS_STOPPED) << Describe(run);
  EXPECT_GE(run.attempts(1).resumed_from_step(), 3) << Describe(run);
  EXPECT_EQ(run.restarts(), 0);
  std::vector<v1::RunEvent> events = h.History(id);
  bool pending = false;
  for (const v1::RunEvent& e : EventsOfKind(events, v1::EVENT_KIND_STATE)) {
    if (e.state() == v1::RUN_STATE_PENDING && e.attempt() == 1) pending = true;
  }
  EXPECT_TRUE(pending) << Describe(events);
}

// --- 15. metrics ----------------------------------------------------------------------------

TEST(Daemon, ServesPrometheusMetrics) {
  DaemonHarness h;
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  h.Set("daemon.metrics_address", "\"127.0.0.1:" + std::to_string(port) + "\"");
  ASSERT_TRUE(h.Start());
  std::string body;
  EXPECT_TRUE(Eventually(
      [&] {
        body = HttpGet(port, "/metrics");
        return body.find("trainsup_runs") != std::string::npos;
      },
      Seconds(20), std::chrono::milliseconds(100)))
      << body;
  const std::string id =
      h.Submit(Spec("metrics", 8, 20, 2, "exit_at_step = 3\nexit_code = 3\nonly_attempt = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.restarts(), 1) << Describe(run);
  body = HttpGet(port, "/metrics");
  bool restart_counted = false;
  std::stringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("trainsup_restarts_total{", 0) == 0 &&
        line.find("\"crash\"") != std::string::npos) {
      restart_counted = std::atof(line.substr(line.rfind(' ') + 1).c_str()) >= 1;
    }
  }
  EXPECT_TRUE(restart_counted) << body;
  EXPECT_THAT(body, HasSubstr("trainsup_runs{"));
}

// --- 16. trainctl ---------------------------------------------------------------------------

TEST(Daemon, TrainctlSubmitsWatchesAndLists) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string good = h.dir() + "/good.toml";
  const std::string bad = h.dir() + "/bad.toml";
  WriteFileText(good, Spec("ctlok", 6, 20, 2));
  WriteFileText(bad, Spec("ctlbad", 6, 20, 2, "exit_at_step = 2\nexit_code = 64"));
  const std::vector<std::string> base = {TRAINCTL_BIN, "--socket", h.socket_path(), "--token-file",
                                         h.operator_token_path()};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  };
  CommandResult ok = RunCommand(with({"submit", good, "--watch"}), kRunLimit, h.dir() + "/ctl-ok");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  CommandResult failed =
      RunCommand(with({"submit", bad, "--watch"}), kRunLimit, h.dir() + "/ctl-bad");
  EXPECT_EQ(failed.code, 1) << failed.out << failed.err;

  CommandResult ls = RunCommand(with({"ls", "-o", "json"}), Seconds(30), h.dir() + "/ctl-ls");
  ASSERT_EQ(ls.code, 0) << ls.out << ls.err;
  nlohmann::json parsed = nlohmann::json::parse(ls.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << ls.out;
  const std::string dump = parsed.dump();
  EXPECT_THAT(dump, HasSubstr("ctlok-"));
  EXPECT_THAT(dump, HasSubstr("ctlbad-"));
}

// trainctl checkpoint (issue 43): a run's workers checkpoint at their next
// step and the command prints the committed step; --all does it for every
// running run; a run that ended, or no run named, is refused.
TEST(Daemon, TrainctlCheckpointReturnsTheStepOnceCommitted) {
  DaemonHarness h;
  h.Set("slots.cpu_slots", "2");
  ASSERT_TRUE(h.Start());
  // No periodic checkpoint within the test: only the requested ones.
  const std::string ended = h.Submit(Spec("ckptend", 3, 10, 1));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(ended, kRunLimit, &run));
  const std::string a = h.Submit(Spec("ckpta", 2000, 20, 100000));
  const std::string b = h.Submit(Spec("ckptb", 2000, 20, 100000));
  for (const std::string& id : {a, b}) {
    ASSERT_TRUE(h.WaitFor(
        id,
        [](const v1::Run& r) {
          return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 3;
        },
        kRunLimit, &run))
        << Describe(run);
  }
  const std::vector<std::string> base = {TRAINCTL_BIN, "--socket", h.socket_path(), "--token-file",
                                         h.operator_token_path()};
  auto ctl = [&](std::vector<std::string> more, const std::string& log) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), more.begin(), more.end());
    return RunCommand(argv, Seconds(120), h.dir() + "/" + log);
  };
  run = h.GetRun(a);
  const int64_t before = run.progress().step();
  CommandResult one = ctl({"checkpoint", a}, "ctl-checkpoint");
  ASSERT_EQ(one.code, 0) << one.out << one.err;
  ASSERT_THAT(one.out, ::testing::StartsWith(a + " step "));
  const int64_t step = std::stoll(one.out.substr(a.size() + 6));
  EXPECT_GE(step, before) << one.out;
  EXPECT_TRUE(
      fs::is_directory(RunLayout(run.run_dir()).CheckpointsDir() + "/step-" + std::to_string(step)))
      << one.out;
  run = h.GetRun(a);
  EXPECT_GE(run.progress().last_checkpoint_step(), step);

  CommandResult all = ctl({"checkpoint", "--all"}, "ctl-checkpoint-all");
  ASSERT_EQ(all.code, 0) << all.out << all.err;
  EXPECT_THAT(all.out, ::testing::HasSubstr(a + " step "));
  EXPECT_THAT(all.out, ::testing::HasSubstr(b + " step "));
  EXPECT_THAT(all.out, ::testing::Not(::testing::HasSubstr(ended)));

  CommandResult gone = ctl({"checkpoint", ended}, "ctl-checkpoint-ended");
  EXPECT_NE(gone.code, 0);
  EXPECT_THAT(gone.err, ::testing::HasSubstr("already ended"));
  CommandResult neither = ctl({"checkpoint"}, "ctl-checkpoint-usage");
  EXPECT_EQ(neither.code, 2) << neither.err;
}

// --- 17. GPU release (fake GPUs) -------------------------------------------------------------

TEST(Daemon, GpuHeldByAForeignProcessIsStrandedUntilReleased) {
  DaemonHarness h;
  const std::string gpu_file = h.dir() + "/gpus.json";
  UseFakeGpus(h, gpu_file, kGpuUuids, "1.5");
  ASSERT_TRUE(h.Start());

  v1::Node node = GetNode(h);
  ASSERT_EQ(node.slots_size(), 2) << node.DebugString();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(node.slots(i).gpu());
    EXPECT_EQ(node.slots(i).gpu_index(), i);
    EXPECT_EQ(node.slots(i).state(), v1::SLOT_STATE_FREE);
  }
  ASSERT_EQ(node.gpus_size(), 2) << node.DebugString();
  EXPECT_EQ(node.gpus(0).uuid(), kGpuUuids[0]);
  EXPECT_EQ(node.gpus(1).uuid(), kGpuUuids[1]);
  EXPECT_TRUE(node.gpus(0).healthy());

  ForeignProcess stranger(h.dir() + "/stranger.log");
  ASSERT_GT(stranger.pid(), 1);
  const std::string id = h.Submit(
      Spec("gpustrand", 300, 100, 2, "exit_at_step = 10\nexit_code = 3\nonly_attempt = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.attempts_size() == 1 &&
               r.progress().step() >= 1;
      },
      kRunLimit, &run));
  ASSERT_EQ(run.attempts(0).ranks_size(), 1);
  const v1::RankStatus first = run.attempts(0).ranks(0);
  EXPECT_EQ(first.slot(), 0) << Describe(run);
  EXPECT_EQ(first.gpu(), kGpuUuids[0]) << Describe(run);
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("CUDA_VISIBLE_DEVICES=" + kGpuUuids[0] + "\n"));

  // While the worker lives, GPU 0 fills up and gains a compute process that
  // is not in the worker's process group.
  WriteFakeGpus(gpu_file, {{kGpuUuids[0], 4096, {stranger.pid()}}, {kGpuUuids[1], 10, {}}});
  ASSERT_TRUE(ProcessAlive(first.pid()))
      << "attempt 1 ended before GPU 0 was taken: raise its exit_at_step";

  // The worker exits at step 10; GPU 0 is not released in time.
  ASSERT_TRUE(Eventually([&] { return SlotIn(h, 0, v1::SLOT_STATE_STRANDED, &node); }, Seconds(30),
                         std::chrono::milliseconds(50)))
      << node.DebugString();
  EXPECT_THAT(node.slots(0).reason(), HasSubstr("GPU memory not released"));
  EXPECT_THAT(node.slots(0).reason(), HasSubstr(std::to_string(stranger.pid())));
  ASSERT_EQ(node.gpus_size(), 2);
  EXPECT_FALSE(node.gpus(0).healthy()) << node.DebugString();
  EXPECT_TRUE(node.gpus(1).healthy()) << node.DebugString();
  EXPECT_TRUE(ProcessAlive(stranger.pid()))
      << "a process outside the worker's group must never be killed";

  // The restart went to the other GPU.
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.attempts_size() == 2 &&
               r.attempts(1).ranks_size() == 1;
      },
      kRunLimit, &run));
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_CRASH) << Describe(run);
  const v1::RankStatus& second = run.attempts(1).ranks(0);
  EXPECT_EQ(second.slot(), 1) << Describe(run);
  EXPECT_EQ(second.gpu(), kGpuUuids[1]) << Describe(run);
  EXPECT_THAT(RankLog(run, 2, 0), HasSubstr("CUDA_VISIBLE_DEVICES=" + kGpuUuids[1] + "\n"));

  {
    v1::CancelRunRequest req;
    req.set_run_id(id);
    v1::Run out;
    auto ctx = h.Context(h.operator_token());
    grpc::Status s = h.stub().CancelRun(ctx.get(), req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_CANCELLED, kRunLimit, &run));
  std::vector<v1::RunEvent> events = h.History(id);
  std::vector<v1::RunEvent> gpu_events = EventsOfKind(events, v1::EVENT_KIND_GPU);
  ASSERT_EQ(gpu_events.size(), 1u) << Describe(events);
  EXPECT_EQ(gpu_events[0].rank(), 0);
  EXPECT_THAT(gpu_events[0].reason(), HasSubstr("slot 0 stranded"));
  EXPECT_THAT(gpu_events[0].reason(), HasSubstr(kGpuUuids[0]));

  // Slot 1's GPU was idle after the cancel; slot 0's still is not.
  EXPECT_TRUE(Eventually([&] { return SlotIn(h, 1, v1::SLOT_STATE_FREE, &node); }, Seconds(20)))
      << node.DebugString();
  EXPECT_EQ(node.slots(0).state(), v1::SLOT_STATE_STRANDED) << node.DebugString();

  // The stranger lets go: the slot recovers.
  stranger.Stop();
  WriteFakeGpus(gpu_file, {{kGpuUuids[0], 10, {}}, {kGpuUuids[1], 10, {}}});
  ASSERT_TRUE(Eventually([&] { return SlotIn(h, 0, v1::SLOT_STATE_FREE, &node); }, Seconds(10)))
      << node.DebugString();
  EXPECT_EQ(node.slots(0).reason(), "");
  ASSERT_EQ(node.gpus_size(), 2);
  EXPECT_TRUE(node.gpus(0).healthy()) << node.DebugString();
}

TEST(Daemon, GpuHeldByTheWorkersOwnGroupIsReclaimed) {
  DaemonHarness h;
  const std::string gpu_file = h.dir() + "/gpus.json";
  UseFakeGpus(h, gpu_file, kGpuUuids, "5");
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(Spec("gpureclaim", 30, 100, 2,
                    "exit_at_step = 10\nexit_code = 3\nonly_attempt = 1\nspawn_grandchild = true"));
  const std::string log_path = h.state_dir() + "/runs/" + id + "/attempts/1/rank-0.log";
  int grandchild = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        const std::string log = ReadFileText(log_path);
        const size_t at = log.find("grandchild pid ");
        if (at == std::string::npos || log.find('\n', at) == std::string::npos) return false;
        grandchild = std::atoi(log.c_str() + at + strlen("grandchild pid "));
        return true;
      },
      Seconds(60)))
      << ReadFileText(log_path);
  ASSERT_GT(grandchild, 1);
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) { return r.attempts_size() == 1 && r.attempts(0).ranks_size() == 1; },
      kRunLimit, &run));
  const int worker = run.attempts(0).ranks(0).pid();
  ASSERT_EQ(run.attempts(0).ranks(0).slot(), 0) << Describe(run);
  ASSERT_EQ(getpgid(grandchild), worker) << "the grandchild is in the worker's group";

  // The grandchild holds GPU 0 while the worker lives.
  WriteFakeGpus(gpu_file, {{kGpuUuids[0], 4096, {grandchild}}, {kGpuUuids[1], 10, {}}});
  ASSERT_TRUE(ProcessAlive(worker)) << "attempt 1 ended before GPU 0 was taken";

  // The worker exits at step 10; the daemon kills the holder, and the GPU
  // (as NVML would report it) has its memory back.
  ASSERT_TRUE(Eventually([&] { return !ProcessAlive(grandchild); }, Seconds(30)))
      << "the daemon did not kill grandchild " << grandchild;
  WriteFakeGpus(gpu_file, {{kGpuUuids[0], 10, {}}, {kGpuUuids[1], 10, {}}});
  v1::Node node;
  bool stranded = false;
  ASSERT_TRUE(Eventually(
      [&] {
        bool free = SlotIn(h, 0, v1::SLOT_STATE_FREE, &node);
        stranded =
            stranded || (node.slots_size() > 0 && node.slots(0).state() == v1::SLOT_STATE_STRANDED);
        return free;
      },
      Seconds(20)))
      << node.DebugString();
  EXPECT_FALSE(stranded);

  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_CRASH);
  std::vector<v1::RunEvent> events = h.History(id);
  EXPECT_THAT(EventsOfKind(events, v1::EVENT_KIND_GPU), ::testing::IsEmpty()) << Describe(events);
  EXPECT_THAT(h.DaemonLog(), ::testing::Not(HasSubstr("STRANDED")));
  // How long the GPU took to come back, for the operator (and the GPU
  // box's e2e script): the freed slot is logged with its time and reading.
  EXPECT_THAT(h.DaemonLog(), ::testing::ContainsRegex(
                                 "slot gpu:0 free [0-9]+\\.[0-9]{3} s after its worker ended: "
                                 "GPU 0 \\([^)]*\\) released: 10 MiB used"));
}

// --- 18. OOM lowers the memory budget ---------------------------------------------------------

TEST(Daemon, OomExitLowersTheMemoryBudgetOfTheNextAttempt) {
  DaemonHarness h;
  h.Set("restart.oom_budget_factor", "0.5");
  ASSERT_TRUE(h.Start());
  const std::string spec =
      "name = \"oombudget\"\nworld_size = 1\n"
      "[train]\nsteps = 6\ncheckpoint_every_steps = 1\nmemory_budget_mb = 1000\n"
      "[testing]\nstep_ms = 20\nexit_at_step = 2\nexit_code = 75\nonly_attempt = 1\n";
  const std::string id = h.Submit(spec);
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_OOM);
  EXPECT_EQ(run.oom_restarts(), 1);
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("TRAINSUP_MEMORY_BUDGET_MB=unset\n"));
  EXPECT_THAT(RankLog(run, 2, 0), HasSubstr("TRAINSUP_MEMORY_BUDGET_MB=500\n"));
}

// --- 19. socket permissions -------------------------------------------------------------------

TEST(Daemon, SocketIsForOwnerAndGroupOnlyWhateverTheUmask) {
  DaemonHarness h;
  // The daemon must not rely on the umask it inherits.
  const mode_t old_umask = umask(0);
  ::testing::AssertionResult started = h.Start();
  umask(old_umask);
  ASSERT_TRUE(started);
  struct stat st {};
  ASSERT_EQ(stat(h.socket_path().c_str(), &st), 0) << strerror(errno);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u) << std::oct << (st.st_mode & 07777);
  const std::string dir = fs::path(h.socket_path()).parent_path().string();
  ASSERT_EQ(stat(dir.c_str(), &st), 0) << strerror(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u) << std::oct << (st.st_mode & 07777);
  ASSERT_EQ(stat(h.state_dir().c_str(), &st), 0) << strerror(errno);
  EXPECT_EQ(st.st_mode & 07777, 0750u) << std::oct << (st.st_mode & 07777);
}

// Issue 42, 6: the trainsup group, which is how users reach the socket,
// may read a run's logs (trainctl logs) but neither its frozen spec (the
// command.env values the API redacts for viewers) nor its checkpoints.
TEST(Daemon, ARunsSpecAndCheckpointsAreTheDaemonsAloneWhateverTheUmask) {
  DaemonHarness h;
  const mode_t old_umask = umask(0);
  ::testing::AssertionResult started = h.Start();
  umask(old_umask);
  ASSERT_TRUE(started);
  const std::string id = h.Submit(Spec("modes", 3, 10, 1));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  const RunLayout layout(run.run_dir());
  auto mode = [](const std::string& path) -> unsigned {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return 07777;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode(h.state_dir() + "/runs"), 0750u);
  EXPECT_EQ(mode(run.run_dir()), 0710u) << "the group passes through, lists nothing";
  EXPECT_EQ(mode(layout.SpecPath()), 0600u);
  EXPECT_EQ(mode(layout.CheckpointsDir()), 0700u);
  EXPECT_EQ(mode(layout.AttemptsDir()), 0750u);
  EXPECT_EQ(mode(layout.LogPath(1, 0)) & 0740, 0640u) << "trainctl logs reads it";
}

// --- 20. health and reflection ----------------------------------------------------------------

// Calls by method name with hand-serialized messages: Debian ships neither
// the health nor the reflection stubs.
grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::string& request, std::string* response) {
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::ByteBuffer reply;
  grpc::Status status(grpc::StatusCode::INTERNAL, "no completion");
  {
    auto call = stub.PrepareUnaryCall(&ctx, method, ToBuffer(request), &cq);
    call->StartCall();
    call->Finish(&reply, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    cq.Next(&tag, &ok);
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  if (status.ok()) *response = FromBuffer(reply);
  return status;
}

// A bidi call that writes `requests`, half-closes, and reads every response.
grpc::Status RawBidiCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                         const std::vector<std::string>& requests,
                         std::vector<std::string>* responses) {
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status status(grpc::StatusCode::INTERNAL, "no completion");
  {
    auto call = stub.PrepareCall(&ctx, method, &cq);
    // One operation at a time: each waits for its own completion.
    auto step = [&](const std::function<void(void*)>& start) {
      void* tag = nullptr;
      bool ok = false;
      start(reinterpret_cast<void*>(1));
      return cq.Next(&tag, &ok) && ok;
    };
    if (step([&](void* t) { call->StartCall(t); })) {
      for (const std::string& r : requests) {
        if (!step([&](void* t) { call->Write(ToBuffer(r), t); })) break;
      }
      step([&](void* t) { call->WritesDone(t); });
      for (;;) {
        grpc::ByteBuffer buffer;
        if (!step([&](void* t) { call->Read(&buffer, t); })) break;
        responses->push_back(FromBuffer(buffer));
      }
    }
    step([&](void* t) { call->Finish(&status, t); });
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// The length-delimited fields numbered `field` of a serialized message
// (enough of the wire format for the reflection answer).
std::vector<std::string> BytesFields(const std::string& msg, int field) {
  std::vector<std::string> out;
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; i < msg.size() && shift < 64; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(msg[i++]);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  while (i < msg.size()) {
    uint64_t key = 0, value = 0;
    if (!varint(&key)) break;
    const int number = static_cast<int>(key >> 3);
    switch (key & 7) {
      case 0:
        if (!varint(&value)) return out;
        break;
      case 1:
        i += 8;
        break;
      case 5:
        i += 4;
        break;
      case 2:
        if (!varint(&value) || value > msg.size() - i) return out;
        if (number == field) out.push_back(msg.substr(i, value));
        i += value;
        break;
      default:
        return out;
    }
  }
  return out;
}

const char kHealthCheck[] = "/grpc.health.v1.Health/Check";
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

TEST(Daemon, HealthAndReflectionAnswerWithoutAToken) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  auto channel = grpc::CreateChannel("unix:" + h.socket_path(), grpc::InsecureChannelCredentials());

  // HealthCheckRequest{service: ""} serializes to nothing.
  std::string reply;
  grpc::Status s = RawUnaryCall(channel, kHealthCheck, "", &reply);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_EQ(reply, kServing);

  // ServerReflectionRequest{list_services: ""}: field 7, empty string.
  std::vector<std::string> responses;
  s = RawBidiCall(channel, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                  {std::string("\x3a\x00", 2)}, &responses);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  ASSERT_EQ(responses.size(), 1u);
  // ServerReflectionResponse.list_services_response (6) > service (1) > name (1).
  std::vector<std::string> names;
  for (const std::string& list : BytesFields(responses[0], 6)) {
    for (const std::string& service : BytesFields(list, 1)) {
      for (const std::string& name : BytesFields(service, 1)) names.push_back(name);
    }
  }
  EXPECT_THAT(names, ::testing::IsSupersetOf({std::string("trainsup.v1.Supervisor"),
                                              std::string("trainsup.worker.v1.WorkerChannel")}));
}

TEST(Daemon, HealthIsNotServingWhileShuttingDown) {
  DaemonHarness h;
  // The worker is held stopped (SIGSTOP) through the shutdown, so the daemon
  // keeps serving until it is let go.
  h.Set("workers.stop_deadline_s", "60");
  h.Set("workers.heartbeat_timeout_s", "60");
  ASSERT_TRUE(h.Start());
  auto channel = grpc::CreateChannel("unix:" + h.socket_path(), grpc::InsecureChannelCredentials());
  const std::string id = h.Submit(Spec("healthstop", 400, 50, 100));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 1;
      },
      kRunLimit, &run));
  const int worker = run.attempts(0).ranks(0).pid();
  std::string reply;
  grpc::Status s = RawUnaryCall(channel, kHealthCheck, "", &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply, kServing);

  ASSERT_EQ(kill(worker, SIGSTOP), 0) << strerror(errno);
  ASSERT_TRUE(Eventually([&] { return ProcessState(worker) == 'T'; }, Seconds(10)));
  h.Signal(SIGTERM);
  std::string last;
  EXPECT_TRUE(Eventually(
      [&] {
        reply.clear();
        grpc::Status st = RawUnaryCall(channel, kHealthCheck, "", &reply);
        last = st.ok() ? "reply of " + std::to_string(reply.size()) + " bytes"
                       : "error " + st.error_message();
        return st.ok() && reply == kNotServing;
      },
      Seconds(30), std::chrono::milliseconds(50)))
      << last;
  kill(worker, SIGCONT);
  std::optional<int> status = h.WaitExit(Seconds(30));
  ASSERT_TRUE(status.has_value()) << "trainsupd did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  s = RawUnaryCall(channel, kHealthCheck, "", &reply);
  EXPECT_FALSE(s.ok()) << "a health check answered after the daemon exited";
}

}  // namespace
}  // namespace trainsup::integration
