// The defects of the supervisor issue (#15), each against the real trainsupd
// with real workers, sockets and files: secrets from the kernel's CSPRNG, the
// hello deadline, the worker channel off the public port, the pidfd fallback,
// paged history for watchers, a locked store, process-group identity, a
// worker that exits 0 without ever saying hello, the [testing] table, the
// stop of a graceful restart, and the reload that names what needs a
// restart. Every test here failed on the daemon before the fix (see
// docs/supervisor.md, "Hardening").
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/prctl.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "supervisor/store/state_store.h"
#include "tests/common/small_fs.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"
#include "trainsup/v1/worker.grpc.pb.h"

namespace trainsup::integration {
namespace {

namespace fs = std::filesystem;
namespace wv1 = ::trainsup::worker::v1;
using ::testing::HasSubstr;
using ::testing::Not;

// GetNode answers within `limit`: the daemon's loop is not blocked.
bool LoopAnswers(DaemonHarness& h, Seconds limit) {
  v1::Node node;
  auto ctx = h.Context(h.viewer_token(), limit);
  return h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node).ok();
}

// The environment of process `pid` as NAME -> value.
std::map<std::string, std::string> EnvironmentOf(int pid) {
  std::map<std::string, std::string> env;
  std::string raw = ReadFileText("/proc/" + std::to_string(pid) + "/environ");
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    std::string kv = raw.substr(start, end - start);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    start = end + 1;
  }
  return env;
}

// Starts `argv` as a process whose pid is `pid` (through
// /proc/sys/kernel/ns_last_pid), leading its own process group; -1 when the
// pid could not be had (other processes kept taking it first).
int SpawnWithPid(int pid, const std::vector<std::string>& argv, const std::string& log) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    // Another process that got the pid first (a compiler, another test's
    // worker) usually ends soon. The pid's old holder may also be our own
    // zombie still (an orphan handed to this subreaper after the caller's
    // last wait): reap it.
    Eventually(
        [&] {
          waitpid(pid, nullptr, WNOHANG);
          return kill(pid, 0) != 0 && errno == ESRCH;
        },
        Seconds(10));
    if (kill(pid, 0) == 0 || errno != ESRCH) return -1;
    {
      std::ofstream last("/proc/sys/kernel/ns_last_pid");
      last << (pid - 1);
      if (!last) return -1;
    }
    int got = SpawnProcess(argv, TestEnvironment({}), log, log);
    if (got == pid) return got;
    if (got > 0) {
      kill(got, SIGKILL);
      waitpid(got, nullptr, 0);
    }
  }
  return -1;
}

// The pid of rank 0 of the run's newest attempt once it is running.
int RunningWorkerPid(DaemonHarness& h, const std::string& id, int attempts) {
  v1::Run run;
  if (!h.WaitFor(
          id,
          [&](const v1::Run& r) {
            return r.state() == v1::RUN_STATE_RUNNING && r.attempts_size() == attempts &&
                   r.attempts(attempts - 1).ranks_size() == 1 && r.progress().step() >= 1;
          },
          kRunLimit, &run)) {
    return -1;
  }
  return run.attempts(attempts - 1).ranks(0).pid();
}

void WaitGone(int pid) {
  Eventually([&] { return !ProcessAlive(pid); }, Seconds(20));
}

// --- #2: secrets from the kernel's CSPRNG ----------------------------------------------------

// With getrandom(2) replaced by a fixed pattern (the shim), the worker's
// token and the run id's suffix are that pattern: they come straight from
// the kernel's CSPRNG, not from a generator whose state outputs reveal.
TEST(Hardening, WorkerTokensAndRunIdsComeStraightFromTheKernelsCsprng) {
  DaemonHarness h;
  // A first start without the shim makes the operator and viewer tokens
  // (themselves secrets from getrandom, so the shim would make them equal).
  ASSERT_TRUE(h.Start());
  h.Signal(SIGTERM);
  ASSERT_TRUE(h.WaitExit(Seconds(30)).has_value());
  ASSERT_TRUE(h.Start({std::string("LD_PRELOAD=") + FIXED_GETRANDOM_SHIM}));
  const std::string id = h.Submit(Spec("csprng", 200, 50, 50));
  const int pid = RunningWorkerPid(h, id, 1);
  ASSERT_GT(pid, 0);
  const std::string token = EnvironmentOf(pid)["TRAINSUP_TOKEN"];
  ASSERT_GE(token.size(), 32u) << "a token of at least 128 bits";
  std::string pattern;
  for (size_t i = 0; i < token.size() / 2; ++i) {
    char byte[3];
    snprintf(byte, sizeof(byte), "%02x", static_cast<unsigned>(0xA5 ^ (i & 0xff)));
    pattern += byte;
  }
  EXPECT_EQ(token, pattern) << "the worker token is not getrandom's output";
  const std::string suffix = id.substr(id.rfind('-') + 1);
  EXPECT_EQ(suffix, pattern.substr(0, suffix.size())) << id;
}

// --- #2: a stream that never says hello ------------------------------------------------------

TEST(Hardening, WorkerStreamWithoutHelloIsClosedAtTheHelloDeadline) {
  DaemonHarness h;
  h.Set("workers.hello_timeout_s", "1");
  ASSERT_TRUE(h.Start());
  auto channel = grpc::CreateChannel("unix:" + h.socket_path(), grpc::InsecureChannelCredentials());
  auto stub = wv1::WorkerChannel::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Connect(&ctx);
  wv1::SupervisorCommand command;
  // Nothing is sent; the daemon ends the stream on its own.
  EXPECT_FALSE(stream->Read(&command));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("hello")) << s.error_message();
}

// --- #2: the worker channel is not on the public TCP port ----------------------------------

TEST(Hardening, WorkerChannelIsNotServedOnTheTcpPort) {
  DaemonHarness h;
  const std::string cert = h.dir() + "/cert.pem", key = h.dir() + "/key.pem";
  CommandResult made = RunCommand(
      {"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out",
       cert, "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"},
      Seconds(60), h.dir() + "/openssl");
  ASSERT_EQ(made.code, 0) << made.err;
  const int port = FreeLoopbackPort();
  h.Set("daemon.tcp_address", "\"127.0.0.1:" + std::to_string(port) + "\"");
  h.Set("daemon.tls_cert", "\"" + cert + "\"");
  h.Set("daemon.tls_key", "\"" + key + "\"");
  ASSERT_TRUE(h.Start());
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFileText(cert);
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::SslCredentials(ssl), args);
  // The public API answers on the port...
  {
    auto api = v1::Supervisor::NewStub(channel);
    v1::Node node;
    auto ctx = h.Context(h.viewer_token(), Seconds(20));
    grpc::Status s = api->GetNode(ctx.get(), v1::GetNodeRequest(), &node);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // ...the worker channel does not exist there.
  auto stub = wv1::WorkerChannel::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Connect(&ctx);
  wv1::WorkerMessage hello;
  hello.mutable_hello()->set_run_id("x");
  stream->Write(hello);
  stream->WritesDone();
  wv1::SupervisorCommand command;
  while (stream->Read(&command)) {
  }
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
}

// --- #3: no pidfd_open ---------------------------------------------------------------------

// pidfd_open fails with ENOSYS (the shim): exits are still noticed without
// blocking the loop (SIGCHLD and waitpid(WNOHANG) for our children), and an
// adopted worker is watched through /proc instead of being declared LOST.
TEST(Hardening, WithoutPidfdExitsAreNoticedWithoutBlockingAndAdoptedWorkersLive) {
  DaemonHarness h;
  const std::string preload = std::string("LD_PRELOAD=") + NO_PIDFD_SHIM;
  ASSERT_TRUE(h.Start({preload}));
  // A crash is classified as before.
  const std::string crash = h.Submit(
      Spec("nopidfd-crash", 6, 20, 2, "exit_at_step = 2\nexit_code = 3\nonly_attempt = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(crash, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_CRASH) << Describe(run);
  EXPECT_THAT(run.attempts(0).exit_reason(), HasSubstr("exit 3")) << Describe(run);

  // While a worker runs, the loop answers.
  const std::string id = h.Submit(Spec("nopidfd", 120, 50, 10));
  const int pid = RunningWorkerPid(h, id, 1);
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(LoopAnswers(h, Seconds(3))) << "GetNode did not answer: the loop is blocked";
  }
  // Killed and restarted, the daemon adopts the worker it cannot pidfd.
  h.Kill();
  ASSERT_TRUE(ProcessAlive(pid));
  ASSERT_TRUE(h.Start({preload}));
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  EXPECT_EQ(run.attempts_size(), 1) << Describe(run);
}

// --- #6: long histories ------------------------------------------------------------------------

constexpr int kManyEvents = 100000;

// A finished run with kManyEvents stored events, written into the store
// before the daemon starts.
std::string StoreRunWithManyEvents(DaemonHarness& h) {
  fs::create_directories(h.state_dir());
  auto store = supervisor::StateStore::Open(h.state_dir() + "/trainsupd.db");
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return "";
  v1::Run run;
  run.set_run_id("long-history");
  run.set_name("long-history");
  run.set_state(v1::RUN_STATE_SUCCEEDED);
  run.set_world_size(1);
  run.set_created_ms(1);
  run.set_ended_ms(2);
  run.set_spec_toml("name = \"long-history\"\n");
  run.set_run_dir(h.state_dir() + "/runs/long-history");
  EXPECT_TRUE((*store)->CreateRun(run, "").ok());
  absl::Status s = (*store)->Transaction([&]() -> absl::Status {
    for (int i = 0; i < kManyEvents; ++i) {
      v1::RunEvent e;
      e.set_run_id("long-history");
      e.set_kind(v1::EVENT_KIND_PROGRESS);
      e.set_time_ms(1000 + i);
      e.set_rank(0);
      e.mutable_progress()->set_step(i);
      absl::StatusOr<int64_t> seq = (*store)->AppendEvent(&e);
      if (!seq.ok()) return seq.status();
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return "long-history";
}

TEST(Hardening, WatchStreamsAHundredThousandStoredEventsInOrder) {
  DaemonHarness h;
  const std::string id = StoreRunWithManyEvents(h);
  ASSERT_TRUE(h.Start());
  // Several watchers at once, each reading the whole history, while the
  // loop keeps answering.
  constexpr int kWatchers = 4;
  std::vector<std::thread> threads;
  std::vector<int64_t> counts(kWatchers, 0);
  std::vector<bool> in_order(kWatchers, true);
  std::vector<grpc::Status> ends(kWatchers);
  std::atomic<int> done{0};
  for (int w = 0; w < kWatchers; ++w) {
    threads.emplace_back([&, w] {
      v1::WatchRunRequest req;
      req.set_run_id(id);
      req.set_include_history(true);
      auto ctx = h.Context(h.viewer_token(), Seconds(120));
      auto reader = h.stub().WatchRun(ctx.get(), req);
      v1::RunEvent e;
      int64_t last = 0;
      while (reader->Read(&e)) {
        if (e.seq() != last + 1) in_order[w] = false;
        last = e.seq();
        ++counts[w];
      }
      ends[w] = reader->Finish();
      ++done;
    });
  }
  int answered = 0, asked = 0;
  while (done.load() < kWatchers && asked < 200) {
    ++asked;
    if (LoopAnswers(h, Seconds(5))) ++answered;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(answered, asked) << "GetNode timed out while watchers read the history";
  for (int w = 0; w < kWatchers; ++w) {
    EXPECT_TRUE(ends[w].ok()) << "watcher " << w << ": " << ends[w].error_code() << " "
                              << ends[w].error_message();
    EXPECT_EQ(counts[w], kManyEvents) << "watcher " << w;
    EXPECT_TRUE(in_order[w]) << "watcher " << w << " saw a gap or a repeat";
  }
}

// One client may hold only so many watch streams (daemon.max_watchers_per_client,
// 16 by default); the one past the cap is refused, the others keep working.
TEST(Hardening, WatchersPerClientAreCapped) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("watchcap", 400, 50, 50));
  ASSERT_GT(RunningWorkerPid(h, id, 1), 0);
  constexpr int kCap = 16;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::RunEvent>>> readers;
  v1::WatchRunRequest req;
  req.set_run_id(id);
  for (int i = 0; i < kCap; ++i) {
    contexts.push_back(h.Context(h.viewer_token(), Seconds(60)));
    readers.push_back(h.stub().WatchRun(contexts.back().get(), req));
    v1::RunEvent e;
    ASSERT_TRUE(readers.back()->Read(&e)) << "watcher " << i << " got nothing";
  }
  auto ctx = h.Context(h.viewer_token(), Seconds(20));
  auto extra = h.stub().WatchRun(ctx.get(), req);
  v1::RunEvent e;
  while (extra->Read(&e)) {
  }
  grpc::Status s = extra->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("watch")) << s.error_message();
  // The first ones still stream.
  EXPECT_TRUE(readers[0]->Read(&e));
  for (auto& c : contexts) c->TryCancel();
  for (auto& r : readers) r->Finish();
}

// --- #7: a locked store ----------------------------------------------------------------------

// Another connection holds the store's write lock for several seconds while a
// worker crashes: the loop keeps answering (no 5 s stall per call), and the
// run does not move on (no new attempt) before the crash is stored; once the
// lock goes, it does, and completes.
TEST(Hardening, LockedStoreNeitherStallsTheLoopNorAdvancesTheRunUnstored) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(Spec("locked", 60, 50, 5, "exit_at_step = 25\nexit_code = 3\nonly_attempt = 1"));
  const int pid = RunningWorkerPid(h, id, 1);
  ASSERT_GT(pid, 0);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((h.state_dir() + "/trainsupd.db").c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);  // the daemon may be writing right now
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, &err), SQLITE_OK)
      << (err ? err : "");
  WaitGone(pid);
  // This run's attempt-2 worker, by its command line.
  const std::string second =
      h.state_dir() + "/runs/" + id + " --rank 0 --world-size 1 --attempt 2 ";
  const auto until = Clock::now() + std::chrono::seconds(8);
  int asked = 0, answered = 0;
  bool second_attempt_started = false;
  while (Clock::now() < until) {
    ++asked;
    if (LoopAnswers(h, Seconds(2))) ++answered;
    if (!ProcessesMentioning(second).empty()) second_attempt_started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(answered, asked) << "GetNode timed out while the store was locked";
  EXPECT_FALSE(second_attempt_started) << "attempt 2 started before attempt 1's end was stored";
  ASSERT_EQ(sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, &err), SQLITE_OK);
  sqlite3_close(db);
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  EXPECT_EQ(run.attempts_size(), 2) << Describe(run);
}

// A store the daemon cannot read fails start-up: serving with no runs
// would hide them and leave their workers unwatched.
TEST(Hardening, UnreadableStoreFailsStartUpNamingIt) {
  DaemonHarness h;
  ASSERT_FALSE(StoreRunWithManyEvents(h).empty());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((h.state_dir() + "/trainsupd.db").c_str(), &db), SQLITE_OK);
  // An unfinished run whose stored progress is not a protobuf message.
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE runs SET state = 1, progress = X'0A05FF'"
                         " WHERE run_id = 'long-history'",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  EXPECT_FALSE(h.Start()) << "the daemon served with a store it cannot read";
  EXPECT_THAT(h.DaemonLog(), HasSubstr("cannot read the state store"));
}

// Issue 42, 3: a drain the store holds when the daemon starts (stored by a
// daemon that died before it acted on it) resizes the gang it adopts on
// that slot, as the drain itself would have; no restart is counted.
TEST(Hardening, ADrainInTheStoreAtStartResizesTheGangTheDaemonAdopts) {
  DaemonHarness h;
  h.Set("workers.heartbeat_timeout_s", "8");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(
      "name = \"drained\"\nworld_size = 2\nmin_world_size = 1\n[elastic]\nwait_s = 0\n"
      "[train]\nsteps = 300\ncheckpoint_every_steps = 5\n[testing]\nstep_ms = 50\n");
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 3;
      },
      kRunLimit, &run))
      << Describe(run);
  h.Kill();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((h.state_dir() + "/trainsupd.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "INSERT INTO drains (slot, reason, drained_ms) VALUES"
                         " ('cpu:1', 'fan noise', 1)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  ASSERT_TRUE(h.Start());
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.attempts_size() >= 2 && r.attempts(1).world_size() == 1 &&
               r.state() == v1::RUN_STATE_RUNNING;
      },
      kRunLimit, &run))
      << Describe(run);
  EXPECT_EQ(run.restarts(), 0) << Describe(run);
  EXPECT_EQ(run.attempts(1).ranks_size(), 1);
  EXPECT_EQ(run.attempts(1).ranks(0).slot(), 0) << "nothing on the drained slot";
}

// --- #17: a full disk ----------------------------------------------------------------------

// The run directories sit on a small file system the test fills. The worker
// trains on past failed saves, exits 74 when even its final checkpoint does
// not fit; the daemon waits for space (no new attempt into the full disk,
// no restart budget: max_restarts = 0 would fail any crash) and resumes the
// run once space is back.
TEST(Hardening, AFullDiskWaitsForSpaceAndResumesWithoutTheRestartBudget) {
  DaemonHarness h;
  trainsup::testing::SmallFileSystem small(h.state_dir() + "/runs", 16 << 20);
  if (!small.mounted()) GTEST_SKIP() << small.error();
  h.Set("restart.max_restarts", "0");
  h.Set("restart.max_backoff_s", "1");
  h.Set("restart.min_free_space_mb", "1");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("diskfull", 40, 50, 5));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return r.progress().last_checkpoint_step() >= 5; }, kRunLimit,
      &run))
      << Describe(run);
  ASSERT_TRUE(small.Fill());
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.attempts_size() == 1 && r.attempts(0).exit_class() == v1::EXIT_CLASS_NO_SPACE;
      },
      kRunLimit, &run))
      << Describe(run);
  EXPECT_EQ(run.state(), v1::RUN_STATE_RESTARTING) << Describe(run);
  EXPECT_THAT(run.attempts(0).exit_reason(), HasSubstr("no space")) << Describe(run);
  // No attempt into the full disk.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  run = h.GetRun(id);
  EXPECT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_EQ(run.state(), v1::RUN_STATE_RESTARTING) << Describe(run);
  small.Free();
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_GE(run.attempts(1).resumed_from_step(), 5) << Describe(run);
  const std::vector<v1::RunEvent> events = h.History(id);
  EXPECT_TRUE(HasEvent(events, v1::EVENT_KIND_LOG, "waiting for disk space")) << Describe(events);
  EXPECT_TRUE(HasEvent(events, v1::EVENT_KIND_LOG, "disk space is back")) << Describe(events);
}

// --- #10: process-group identity -------------------------------------------------------------

// A stranded slot must never signal a process group whose id was reused by
// a stranger after the worker's group was gone.
TEST(Hardening, StrandedSlotNeverSignalsAReusedGroupId) {
  DaemonHarness h;
  const std::string gpu_file = h.dir() + "/gpus.json";
  UseFakeGpus(h, gpu_file, kGpuUuids, "1.0");
  ASSERT_TRUE(h.Start());
  ForeignProcess holder(h.dir() + "/holder.log");
  const std::string id =
      h.Submit(Spec("reused", 400, 50, 50, "exit_at_step = 40\nexit_code = 3\nonly_attempt = 1"));
  const int pid = RunningWorkerPid(h, id, 1);
  ASSERT_GT(pid, 0);
  WriteFakeGpus(gpu_file, {{kGpuUuids[0], 4096, {holder.pid()}}, {kGpuUuids[1], 10, {}}});
  v1::Node node;
  ASSERT_TRUE(Eventually([&] { return SlotIn(h, 0, v1::SLOT_STATE_STRANDED, &node); }, Seconds(30),
                         std::chrono::milliseconds(50)))
      << node.DebugString();
  ASSERT_FALSE(ProcessAlive(pid));
  const int stranger = SpawnWithPid(pid, {"/bin/sleep", "60"}, h.dir() + "/stranger.log");
  if (stranger < 0) GTEST_SKIP() << "pid " << pid << " was taken by another process";
  // The daemon retries the stranded slot's release every quarter second.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(ProcessAlive(stranger)) << "a stranger holding the dead worker's group id was killed";
  kill(stranger, SIGKILL);
  waitpid(stranger, nullptr, 0);
}

// A worker that died while the daemon was down must not have its old group
// id signalled when a stranger has it now.
TEST(Hardening, AdoptedDeadWorkersReusedGroupIdIsNotSignalled) {
  // Orphans of the killed daemon come to us, so we can reap the worker and
  // free its pid.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("adoptreuse", 400, 50, 50));
  const int pid = RunningWorkerPid(h, id, 1);
  ASSERT_GT(pid, 0);
  h.Kill();
  kill(pid, SIGKILL);
  Eventually([&] { return waitpid(pid, nullptr, WNOHANG) == pid || !ProcessAlive(pid); },
             Seconds(20));
  waitpid(pid, nullptr, WNOHANG);
  const int stranger = SpawnWithPid(pid, {"/bin/sleep", "60"}, h.dir() + "/stranger.log");
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  if (stranger < 0) GTEST_SKIP() << "pid " << pid << " was taken by another process";
  ASSERT_TRUE(h.Start());
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return r.attempts_size() >= 2; }, kRunLimit, &run));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_TRUE(ProcessAlive(stranger)) << "a stranger holding the dead worker's group id was killed";
  kill(stranger, SIGKILL);
  waitpid(stranger, nullptr, 0);
}

// --- #8: SubmitRun while SIGHUP replaces the configuration ------------------------------------

// gRPC threads check every SubmitRun against the configuration while SIGHUP
// replaces it on the loop: with a shared snapshot there is no data race.
// Run against the ThreadSanitizer build of the daemon (ctest -L tsan) a race
// aborts the daemon (halt_on_error) and fails this test.
TEST(Hardening, SubmitsDuringAReloadStormAreAllAnswered) {
  DaemonHarness h;
  h.Set("restart.max_restarts", "3");
  ASSERT_TRUE(h.Start());
  std::atomic<bool> stop{false};
  std::thread reloader([&] {
    int i = 0;
    while (!stop.load()) {
      // A hot knob and the data roots change at every reload.
      h.Set("restart.max_restarts", std::to_string(3 + (i % 2)));
      h.Set("daemon.data_roots",
            i % 2 ? "[\"" + h.data_dir() + "\"]" : "[\"" + h.data_dir() + "\", \"/tmp\"]");
      h.WriteConfig();
      h.Signal(SIGHUP);
      ++i;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  // Every spec names a data file, so every check reads the data roots.
  const std::string scan = h.data_dir() + "/scan.ply";
  WriteFileText(scan, "ply\n");
  int accepted = 0;
  for (int i = 0; i < 40; ++i) {
    std::string id;
    grpc::Status s = h.TrySubmit("name = \"storm-" + std::to_string(i) +
                                     "\"\n[data]\nformat = \"ply\"\npath = \"" + scan +
                                     "\"\n[train]\nsteps = 1\n",
                                 h.operator_token(), &id);
    if (s.ok()) ++accepted;
    EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  }
  stop = true;
  reloader.join();
  EXPECT_EQ(accepted, 40);
  EXPECT_TRUE(LoopAnswers(h, Seconds(10)));
  EXPECT_TRUE(ProcessAlive(h.daemon_pid())) << h.DaemonLog();
}

// Found by the storm above on the old daemon: a reload made it load (and
// generate) tokens under the state_dir of the new file, which only takes
// effect at a restart, so every client's token became unknown. The running
// state directory's tokens stay.
TEST(Hardening, AReloadNamingAnotherStateDirKeepsTheTokensInForce) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  h.Set("daemon.state_dir", "\"" + h.dir() + "/elsewhere\"");
  h.Set("daemon.socket_path", "\"" + h.socket_path() + "\"");
  h.WriteConfig();
  h.Signal(SIGHUP);
  EXPECT_TRUE(
      Eventually([&] { return h.DaemonLog().find("reloaded") != std::string::npos; }, Seconds(20)))
      << h.DaemonLog();
  v1::Node node;
  auto ctx = h.Context(h.viewer_token());
  grpc::Status s = h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node);
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_FALSE(fs::exists(h.dir() + "/elsewhere/auth"))
      << "tokens were made under the new state_dir";
}

// --- #13: exit 0 without a hello -------------------------------------------------------------

TEST(Hardening, ExitZeroWithoutHelloOrExitFileIsNotSuccess) {
  DaemonHarness h;
  h.Set("daemon.worker_binary", "\"/bin/true\"");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit("name = \"true\"\n");
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_FAILED) << Describe(run);
  ASSERT_GE(run.attempts_size(), 1);
  EXPECT_NE(run.attempts(0).exit_class(), v1::EXIT_CLASS_SUCCESS) << Describe(run);
  EXPECT_THAT(run.attempts(0).exit_reason(), HasSubstr("without a hello")) << Describe(run);
}

// --- #9: authorize before parsing -----------------------------------------------------------

// A caller who may not submit learns nothing about the spec: not its parse
// error, not whether its data path resolves. (On the old daemon a viewer got
// INVALID_ARGUMENT naming the parse error, or the data path outside the
// roots: the spec was parsed and resolved before the role was checked.)
TEST(Hardening, SubmitAuthorizesBeforeItReadsTheSpec) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string unparsable = "name = \"x\"\n[train\nsteps = = 3\n";
  const std::string outside = "name = \"x\"\n[data]\nformat = \"ply\"\npath = \"/etc/passwd\"\n";
  for (const std::string& spec : {unparsable, outside}) {
    std::string id;
    grpc::Status s = h.TrySubmit(spec, h.viewer_token(), &id);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), Not(HasSubstr("passwd")));
    s = h.TrySubmit(spec, "", &id);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    // The operator gets the spec's own error.
    s = h.TrySubmit(spec, h.operator_token(), &id);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  EXPECT_TRUE(fs::is_empty(h.state_dir() + "/runs"));
}

// --- #14: the [testing] table ------------------------------------------------------------------

TEST(Hardening, TestingTableIsRefusedUnlessTheDaemonAllowsFaultInjection) {
  DaemonHarness h;
  h.Unset("testing.allow_fault_injection");
  ASSERT_TRUE(h.Start());
  std::string id;
  grpc::Status s =
      h.TrySubmit(Spec("faults", 5, 10, 0, "crash_at_step = 2"), h.operator_token(), &id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("[testing]"));
  EXPECT_THAT(s.error_message(), HasSubstr("testing.allow_fault_injection"));
  EXPECT_TRUE(fs::is_empty(h.state_dir() + "/runs")) << "a refused spec left a run directory";
  // Without the table the same run is accepted.
  s = h.TrySubmit("name = \"nofaults\"\n[train]\nsteps = 3\n", h.operator_token(), &id);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// --- #15: a graceful restart is a requested stop -------------------------------------------------

// SIGTERM stops the worker after a checkpoint; the next daemon resumes it.
// That stop must not count as a failure: with max_restarts = 1, one real
// crash afterwards is still restarted.
TEST(Hardening, GracefulDaemonRestartDoesNotCountAgainstTheRestartBudget) {
  DaemonHarness h;
  h.Set("restart.max_restarts", "1");
  h.Set("restart.crash_loop_attempts", "2");
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(Spec("graceful", 60, 50, 5, "exit_at_step = 40\nexit_code = 3\nonly_attempt = 2"));
  ASSERT_GT(RunningWorkerPid(h, id, 1), 0);
  h.Signal(SIGTERM);
  ASSERT_TRUE(h.WaitExit(Seconds(60)).has_value());
  ASSERT_TRUE(h.Start());
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  EXPECT_EQ(run.attempts_size(), 3) << Describe(run);
}

// --- #19, the daemon's side: a finished run's progress -------------------------------------

// A run shorter than one heartbeat interval never reports progress; its
// exit report says the step it reached. What a dashboard reads (GetRun,
// ListRuns) must end there, not at the last heartbeat (0 here).
TEST(Hardening, AFinishedRunsProgressEndsAtTheStepItReached) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("short", 6, 20, 3));
  ASSERT_FALSE(id.empty());
  v1::Run run;
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_SUCCEEDED, kRunLimit, &run));
  EXPECT_EQ(run.progress().step(), 6) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 1);
  EXPECT_EQ(run.attempts(0).ranks(0).progress().step(), 6) << Describe(run);
  v1::ListRunsResponse list;
  auto ctx = h.Context(h.viewer_token());
  ASSERT_TRUE(h.stub().ListRuns(ctx.get(), v1::ListRunsRequest(), &list).ok());
  ASSERT_EQ(list.runs_size(), 1);
  EXPECT_EQ(list.runs(0).progress().step(), 6);
  // And after a daemon restart, from the store.
  h.Kill();
  ASSERT_TRUE(h.Start());
  EXPECT_EQ(h.GetRun(id).progress().step(), 6);
}

// --- #16: a reload says what it did not apply ----------------------------------------------------

TEST(Hardening, ReloadNamesTheKnobsThatNeedARestart) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  h.Set("daemon.socket_group", "\"root\"");
  h.Set("slots.use_gpus", "true");
  h.Set("restart.max_restarts", "7");
  h.WriteConfig();
  h.Signal(SIGHUP);
  std::string log;
  EXPECT_TRUE(Eventually(
      [&] {
        log = h.DaemonLog();
        return log.find("restart needed") != std::string::npos;
      },
      Seconds(20)))
      << log;
  EXPECT_THAT(log, HasSubstr("daemon.socket_group"));
  EXPECT_THAT(log, HasSubstr("slots.use_gpus"));
  // GetNode says so too, and the applied knob is in force.
  v1::Node node = GetNode(h);
  std::vector<std::string> keys(node.restart_needed().begin(), node.restart_needed().end());
  EXPECT_THAT(keys, ::testing::ElementsAre("daemon.socket_group", "slots.use_gpus"));
  EXPECT_THAT(log, HasSubstr("applied: [restart.max_restarts]"));
}

}  // namespace
}  // namespace trainsup::integration
