// SupervisorLink against an in-process WorkerChannel server on a unix
// socket; the exit file; and the test worker (trainsup-test-worker) run as a
// real process, standalone and against the in-process server.
#include "worker/link.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/store.h"
#include "contracts/exit_file.h"
#include "contracts/version.h"
#include "tests/common/fault_open.h"
#include "tests/common/small_fs.h"

extern char** environ;

namespace trainsup::worker {
namespace {

using trainsup::worker::v1::SupervisorCommand;
using trainsup::worker::v1::WorkerMessage;
namespace fs = std::filesystem;

constexpr auto kWait = std::chrono::seconds(10);

std::string MakeTempDir() {
  std::string tmpl = (fs::temp_directory_path() / "trainsup-link-XXXXXX").string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// Polls `done` until it holds or the deadline passes.
bool Eventually(const std::function<bool()>& done, std::chrono::seconds limit = kWait) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Records every message of every stream; answers each Hello with a Welcome.
class FakeSupervisor final : public trainsup::worker::v1::WorkerChannel::Service {
 public:
  explicit FakeSupervisor(int welcome_interval_ms) : welcome_interval_ms_(welcome_interval_ms) {}

  // Every Hello is answered with `status` instead of a Welcome (as trainsupd
  // answers a version it cannot serve, or a wrong token).
  void RefuseWith(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = std::move(status);
  }

  grpc::Status Connect(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<SupervisorCommand, WorkerMessage>* stream) override {
    WorkerMessage message;
    while (stream->Read(&message)) {
      std::lock_guard<std::mutex> lock(mu_);
      messages_.push_back(message);
      if (message.has_hello() && !refusal_.ok()) return refusal_;
      if (message.has_hello()) {
        stream_ = stream;
        SupervisorCommand welcome;
        welcome.mutable_welcome()->set_heartbeat_interval_ms(welcome_interval_ms_);
        stream->Write(welcome);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == stream) stream_ = nullptr;
    return grpc::Status::OK;
  }

  bool Send(const SupervisorCommand& command) {
    std::lock_guard<std::mutex> lock(mu_);
    return stream_ != nullptr && stream_->Write(command);
  }

  std::vector<WorkerMessage> Messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }

  std::vector<WorkerMessage> Of(WorkerMessage::BodyCase kind) {
    std::vector<WorkerMessage> out;
    for (auto& m : Messages()) {
      if (m.body_case() == kind) out.push_back(m);
    }
    return out;
  }

  size_t Count(WorkerMessage::BodyCase kind) { return Of(kind).size(); }

 private:
  const int welcome_interval_ms_;
  std::mutex mu_;
  grpc::Status refusal_ = grpc::Status::OK;
  std::vector<WorkerMessage> messages_;
  grpc::ServerReaderWriter<SupervisorCommand, WorkerMessage>* stream_ = nullptr;
};

class TestServer {
 public:
  TestServer(const std::string& address, int welcome_interval_ms = 20)
      : service_(welcome_interval_ms) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~TestServer() { Shutdown(); }

  bool started() const { return server_ != nullptr; }
  FakeSupervisor& service() { return service_; }

  void Shutdown() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }

 private:
  FakeSupervisor service_;
  std::unique_ptr<grpc::Server> server_;
};

class LinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    address_ = "unix:" + dir_ + "/worker.sock";
  }
  void TearDown() override { fs::remove_all(dir_); }

  LinkOptions Options() const {
    LinkOptions o;
    o.endpoint = address_;
    o.run_id = "run-7";
    o.rank = 1;
    o.attempt = 3;
    o.world_size = 2;
    o.token = "s3cret";
    o.heartbeat_interval_s = 30;  // the Welcome's 20 ms must win
    o.reconnect_initial_s = 0.02;
    o.reconnect_max_s = 0.2;
    return o;
  }

  static trainsup::worker::v1::WorkerEvent Event(int i) {
    trainsup::worker::v1::WorkerEvent e;
    e.set_kind(trainsup::v1::EVENT_KIND_LOG);
    e.set_step(i);
    e.set_message("event " + std::to_string(i));
    return e;
  }

  std::string dir_;
  std::string address_;
};

TEST_F(LinkTest, HelloCarriesIdentityAndToken) {
  TestServer server(address_);
  ASSERT_TRUE(server.started());
  SupervisorLink link(Options());
  link.Start();
  ASSERT_TRUE(Eventually([&] { return link.connects() == 1 && link.connected(); }));
  auto hellos = server.service().Of(WorkerMessage::kHello);
  ASSERT_EQ(hellos.size(), 1u);
  const auto& hello = hellos[0].hello();
  EXPECT_EQ(hello.token(), "s3cret");
  EXPECT_EQ(hello.run_id(), "run-7");
  EXPECT_EQ(hello.rank(), 1);
  EXPECT_EQ(hello.attempt(), 3);
  EXPECT_EQ(hello.world_size(), 2);
  EXPECT_EQ(hello.pid(), ::getpid());
  EXPECT_EQ(hello.version(), std::string(Version()));
  EXPECT_EQ(server.service().Messages().front().body_case(), WorkerMessage::kHello);
}

TEST_F(LinkTest, AVersionRefusalEndsTheLinkAndReachesTheWorker) {
  TestServer server(address_);
  server.service().RefuseWith(
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "worker version 9.1.0 cannot be served"));
  LinkOptions options = Options();
  options.version = "9.1.0";
  std::mutex mu;
  std::vector<std::string> refusals;
  options.on_refused = [&](const std::string& message) {
    std::lock_guard<std::mutex> lock(mu);
    refusals.push_back(message);
  };
  SupervisorLink link(options);
  link.Start();
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !refusals.empty();
  }));
  // No reconnect mends a refusal: the link stops after one Hello, which
  // carried the version it was given.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto hellos = server.service().Of(WorkerMessage::kHello);
  ASSERT_EQ(hellos.size(), 1u);
  EXPECT_EQ(hellos[0].hello().version(), "9.1.0");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(refusals, std::vector<std::string>{"worker version 9.1.0 cannot be served"});
  EXPECT_EQ(link.connects(), 0);
}

TEST_F(LinkTest, AWrongTokenIsRetriedNotTakenForARefusal) {
  // UNAUTHENTICATED (a daemon that restarted and does not know the attempt
  // yet, say) is retried with backoff as before.
  TestServer server(address_);
  server.service().RefuseWith(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong token"));
  LinkOptions options = Options();
  std::atomic<int> refused{0};
  options.on_refused = [&](const std::string&) { refused.fetch_add(1); };
  SupervisorLink link(options);
  link.Start();
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kHello) >= 3; }));
  EXPECT_EQ(refused.load(), 0);
}

TEST_F(LinkTest, HeartbeatsFollowWelcomeIntervalWithIncreasingSeq) {
  TestServer server(address_);
  SupervisorLink link(Options());
  trainsup::v1::Progress progress;
  progress.set_step(12);
  progress.set_phase(trainsup::v1::PHASE_TRAINING);
  link.UpdateProgress(progress);
  link.Start();
  // With the options' 30 s interval only one heartbeat would come.
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kHeartbeat) >= 4; }));
  int64_t last_seq = 0;
  for (const auto& m : server.service().Of(WorkerMessage::kHeartbeat)) {
    EXPECT_GT(m.heartbeat().seq(), last_seq);
    last_seq = m.heartbeat().seq();
    EXPECT_EQ(m.heartbeat().progress().step(), 12);
    EXPECT_EQ(m.heartbeat().progress().phase(), trainsup::v1::PHASE_TRAINING);
    EXPECT_GT(m.heartbeat().progress().time_ms(), 0);
  }
}

TEST_F(LinkTest, ProgressCounterMovesOnlyWithAdvance) {
  TestServer server(address_);
  SupervisorLink link(Options());
  link.Start();
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kHeartbeat) >= 3; }));
  for (const auto& m : server.service().Of(WorkerMessage::kHeartbeat)) {
    EXPECT_EQ(m.heartbeat().progress_counter(), 0u);
  }
  link.AdvanceProgress();
  link.AdvanceProgress();
  ASSERT_TRUE(Eventually([&] {
    auto beats = server.service().Of(WorkerMessage::kHeartbeat);
    return beats.back().heartbeat().progress_counter() == 2;
  }));
  const size_t seen = server.service().Count(WorkerMessage::kHeartbeat);
  ASSERT_TRUE(
      Eventually([&] { return server.service().Count(WorkerMessage::kHeartbeat) >= seen + 3; }));
  uint64_t previous = 0;
  for (const auto& m : server.service().Of(WorkerMessage::kHeartbeat)) {
    EXPECT_GE(m.heartbeat().progress_counter(), previous);
    EXPECT_LE(m.heartbeat().progress_counter(), 2u);
    previous = m.heartbeat().progress_counter();
  }
  EXPECT_EQ(previous, 2u);
}

TEST_F(LinkTest, EventsArriveInOrder) {
  TestServer server(address_);
  SupervisorLink link(Options());
  link.Start();
  for (int i = 0; i < 50; ++i) link.SendEvent(Event(i));
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kEvent) == 50; }));
  auto events = server.service().Of(WorkerMessage::kEvent);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(events[i].event().step(), i);
    EXPECT_EQ(events[i].event().message(), "event " + std::to_string(i));
  }
}

TEST_F(LinkTest, CheckpointNowAndStopReachTheWorker) {
  TestServer server(address_);
  SupervisorLink link(Options());
  link.Start();
  ASSERT_TRUE(Eventually([&] { return link.connected(); }));
  EXPECT_FALSE(link.TakeCheckpointRequest());
  EXPECT_FALSE(link.stop_requested());
  SupervisorCommand checkpoint;
  checkpoint.mutable_checkpoint_now();
  ASSERT_TRUE(server.service().Send(checkpoint));
  ASSERT_TRUE(Eventually([&] { return link.TakeCheckpointRequest(); }));
  EXPECT_FALSE(link.TakeCheckpointRequest());  // once per command
  SupervisorCommand stop;
  stop.mutable_stop()->set_deadline_s(7);
  stop.mutable_stop()->set_reason("cancelled");
  ASSERT_TRUE(server.service().Send(stop));
  ASSERT_TRUE(Eventually([&] { return link.stop_requested(); }));
  EXPECT_EQ(link.stop_deadline_s(), 7);
}

TEST_F(LinkTest, ReconnectsAfterServerRestartAndDeliversQueuedEvents) {
  auto first = std::make_unique<TestServer>(address_);
  SupervisorLink link(Options());
  link.Start();
  ASSERT_TRUE(Eventually([&] { return link.connects() == 1; }));
  first->Shutdown();
  ASSERT_TRUE(Eventually([&] { return !link.connected(); }));
  for (int i = 0; i < 5; ++i) link.SendEvent(Event(i));
  TestServer second(address_);
  ASSERT_TRUE(second.started());
  ASSERT_TRUE(Eventually([&] { return link.connects() == 2 && link.connected(); }));
  ASSERT_TRUE(Eventually([&] { return second.service().Count(WorkerMessage::kEvent) == 5; }));
  auto events = second.service().Of(WorkerMessage::kEvent);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(events[i].event().step(), i);
  EXPECT_EQ(second.service().Count(WorkerMessage::kHello), 1u);
  EXPECT_EQ(second.service().Messages().front().body_case(), WorkerMessage::kHello);
  ASSERT_TRUE(Eventually([&] { return second.service().Count(WorkerMessage::kHeartbeat) >= 2; }));
}

TEST_F(LinkTest, PausedHeartbeatsStopArriving) {
  TestServer server(address_);
  SupervisorLink link(Options());
  link.Start();
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kHeartbeat) >= 2; }));
  link.SetHeartbeatsPaused(true);
  // The stream is ordered: once this marker arrives, no heartbeat written
  // before the pause is still on its way.
  link.SendEvent(Event(1));
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kEvent) == 1; }));
  const size_t beats = server.service().Count(WorkerMessage::kHeartbeat);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // ten intervals
  link.SendEvent(Event(2));
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kEvent) == 2; }));
  EXPECT_EQ(server.service().Count(WorkerMessage::kHeartbeat), beats);
  link.SetHeartbeatsPaused(false);
  ASSERT_TRUE(
      Eventually([&] { return server.service().Count(WorkerMessage::kHeartbeat) > beats; }));
}

TEST_F(LinkTest, ReportExitIsDeliveredAfterQueuedEvents) {
  TestServer server(address_);
  SupervisorLink link(Options());
  link.Start();
  link.SendEvent(Event(1));
  trainsup::worker::v1::ExitReport report;
  report.set_code(143);
  report.set_reason("stopped");
  report.set_last_step(42);
  ASSERT_TRUE(link.ReportExit(report, 10));
  ASSERT_TRUE(Eventually([&] { return server.service().Count(WorkerMessage::kExit) == 1; }));
  auto messages = server.service().Messages();
  size_t event_at = 0, exit_at = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].has_event()) event_at = i;
    if (messages[i].has_exit()) exit_at = i;
  }
  EXPECT_LT(event_at, exit_at);
  EXPECT_EQ(messages[exit_at].exit().code(), 143);
  EXPECT_EQ(messages[exit_at].exit().reason(), "stopped");
  EXPECT_EQ(messages[exit_at].exit().last_step(), 42);
  link.Stop();
  EXPECT_FALSE(link.ReportExit(report, 1));
}

TEST_F(LinkTest, ReportExitTimesOutWithoutSupervisor) {
  SupervisorLink link(Options());  // nothing listens
  link.Start();
  trainsup::worker::v1::ExitReport report;
  report.set_code(0);
  EXPECT_FALSE(link.ReportExit(report, 0.1));
  EXPECT_EQ(link.connects(), 0);
}

TEST_F(LinkTest, QueueDropsOldestBeyondLimit) {
  SupervisorLink link(Options());
  const int extra = 5;
  for (int i = 0; i < static_cast<int>(SupervisorLink::kMaxQueuedEvents) + extra; ++i) {
    link.SendEvent(Event(i));
  }
  EXPECT_EQ(link.dropped_events(), extra);
  TestServer server(address_);
  link.Start();
  ASSERT_TRUE(Eventually([&] {
    return server.service().Count(WorkerMessage::kEvent) == SupervisorLink::kMaxQueuedEvents;
  }));
  auto events = server.service().Of(WorkerMessage::kEvent);
  EXPECT_EQ(events.front().event().step(), extra);
  EXPECT_EQ(events.back().event().step(),
            static_cast<int>(SupervisorLink::kMaxQueuedEvents) + extra - 1);
}

TEST_F(LinkTest, EmptyEndpointIsANoOp) {
  LinkOptions options = Options();
  options.endpoint.clear();
  SupervisorLink link(options);
  link.Start();
  link.AdvanceProgress();
  link.SendEvent(Event(1));
  trainsup::worker::v1::ExitReport report;
  EXPECT_FALSE(link.ReportExit(report, 5));
  EXPECT_FALSE(link.connected());
  EXPECT_EQ(link.connects(), 0);
  EXPECT_EQ(link.progress_counter(), 1u);
  link.Stop();
}

// -- exit file -----------------------------------------------------------------

class ExitFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { fs::remove_all(dir_); }
  void WriteRaw(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
  }
  std::string dir_;
};

TEST_F(ExitFileTest, PathFollowsTheContract) {
  EXPECT_EQ(ExitFilePath("/runs/r1", 3, 2), "/runs/r1/attempts/3/rank-2.exit.json");
}

TEST_F(ExitFileTest, RoundTripCreatesDirectories) {
  ExitFile in{143, "stopped", "stopped by \"SIGTERM\"\n", 41, 1700000000123};
  ASSERT_TRUE(WriteExitFile(dir_, 2, 1, in).ok());
  const std::string path = ExitFilePath(dir_, 2, 1);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto out = ReadExitFile(path);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->code, 143);
  EXPECT_EQ(out->reason, "stopped");
  EXPECT_EQ(out->message, "stopped by \"SIGTERM\"\n");
  EXPECT_EQ(out->last_step, 41);
  EXPECT_EQ(out->time_ms, 1700000000123);
  in.code = 0;
  ASSERT_TRUE(WriteExitFile(dir_, 2, 1, in).ok());  // replaces
  EXPECT_EQ(ReadExitFile(path)->code, 0);
}

TEST_F(ExitFileTest, AbsentIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(ReadExitFile(ExitFilePath(dir_, 1, 0)).status()));
}

TEST_F(ExitFileTest, MalformedIsDataLossNamingTheProblem) {
  const std::string path = ExitFilePath(dir_, 1, 0);
  WriteRaw(path, "{\"code\": 1, \"reason\": ");
  auto s = ReadExitFile(path).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(std::string(s.message()).find("not a JSON object"), std::string::npos) << s;
  WriteRaw(path, "{\"reason\": \"x\"}");
  s = ReadExitFile(path).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(std::string(s.message()).find("\"code\" is missing"), std::string::npos) << s;
  WriteRaw(path, "{\"code\": 0, \"last_step\": \"12\"}");
  s = ReadExitFile(path).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(std::string(s.message()).find("last_step"), std::string::npos) << s;
  WriteRaw(path, "{\"code\": 0}");
  auto minimal = ReadExitFile(path);
  ASSERT_TRUE(minimal.ok()) << minimal.status();
  EXPECT_EQ(minimal->last_step, -1);
}

// -- the test worker as a process ---------------------------------------------

class TestWorkerProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    run_dir_ = dir_ + "/run-1";
    fs::create_directories(run_dir_);
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  void WriteSpec(const std::string& extra) {
    std::ofstream(run_dir_ + "/spec.toml") << "[train]\nsteps = 5\ncheckpoint_every_steps = 2\n"
                                           << extra;
  }

  void Spawn(std::vector<std::string> args, const std::string& endpoint = "",
             const std::vector<std::string>& extra_env = {}) {
    std::vector<std::string> argv = {
        TRAINSUP_TEST_WORKER, "--run-dir", run_dir_,       "--rank", "0",
        "--world-size",       "1",         "--supervisor", endpoint};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<std::string> env = {"TRAINSUP_TOKEN=tok-1"};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> cenv;
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, (dir_ + "/out.log").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(
        ::posix_spawn(&pid_, TRAINSUP_TEST_WORKER, &actions, nullptr, cargv.data(), cenv.data()),
        0);
    posix_spawn_file_actions_destroy(&actions);
  }

  // The exit status, or -1 if the process did not end in time.
  int Wait() {
    int status = 0;
    const bool ended = Eventually([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; });
    if (!ended) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string Output() {
    std::stringstream s;
    s << std::ifstream(dir_ + "/out.log").rdbuf();
    return s.str();
  }

  std::string dir_;
  std::string run_dir_;
  pid_t pid_ = -1;
};

TEST_F(TestWorkerProcess, RunsToCompletionStandalone) {
  WriteSpec("");
  Spawn({"--attempt", "1"});
  ASSERT_EQ(Wait(), 0) << Output();
  EXPECT_NE(Output().find("step 5/5 loss"), std::string::npos) << Output();
  for (int step : {2, 4, 5}) {
    EXPECT_TRUE(fs::exists(run_dir_ + "/checkpoints/step-" + std::to_string(step) + "/state.json"));
  }
  auto exit_file = ReadExitFile(ExitFilePath(run_dir_, 1, 0));
  ASSERT_TRUE(exit_file.ok()) << exit_file.status();
  EXPECT_EQ(exit_file->code, 0);
  EXPECT_EQ(exit_file->reason, "completed");
  EXPECT_EQ(exit_file->last_step, 5);
}

TEST_F(TestWorkerProcess, InjectedExitThenResumeFromLatest) {
  WriteSpec("[testing]\nexit_at_step = 4\nexit_code = 3\nonly_attempt = 1\n");
  Spawn({"--attempt", "1"});
  ASSERT_EQ(Wait(), 3) << Output();
  auto first = ReadExitFile(ExitFilePath(run_dir_, 1, 0));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->code, 3);
  EXPECT_EQ(first->last_step, 3);
  Spawn({"--attempt", "2"});
  ASSERT_EQ(Wait(), 0) << Output();
  EXPECT_NE(Output().find("resumed from step 2"), std::string::npos) << Output();
  EXPECT_EQ(Output().find("step 2/5 loss"), std::string::npos) << Output();
}

TEST_F(TestWorkerProcess, CorruptCheckpointIsQuarantined) {
  WriteSpec("");
  Spawn({"--attempt", "1"});
  ASSERT_EQ(Wait(), 0) << Output();
  WriteSpec("[testing]\ncorrupt_checkpoint = true\n");
  Spawn({"--attempt", "2"});
  ASSERT_EQ(Wait(), 0) << Output();
  EXPECT_NE(Output().find("checkpoint step-5 quarantined"), std::string::npos) << Output();
  EXPECT_NE(Output().find("resumed from step 4"), std::string::npos) << Output();
  EXPECT_TRUE(fs::exists(run_dir_ + "/checkpoints/quarantine"));
}

// A read error while choosing or loading the checkpoint (made by an
// LD_PRELOAD shim that fails chosen opens) is not corruption: the attempt
// exits 1 with reason checkpoint_io naming the file and the errno, nothing
// is quarantined, and the worker starts neither from scratch nor from an
// older checkpoint. Once the error is gone, the newest checkpoint is used.
TEST_F(TestWorkerProcess, ReadErrorWhileResumingFailsTheAttemptAndQuarantinesNothing) {
  WriteSpec("");
  Spawn({"--attempt", "1"});
  ASSERT_EQ(Wait(), 0) << Output();
  const trainsup::testing::OpenFault faults[] = {
      {"EIO", "step-5/MANIFEST.json", "0", "latest"},  // verifying
      {"EMFILE", "step-5/state.json", "0", "latest"},  // verifying
      {"ENOMEM", "step-5/state.json", "1", "latest"},  // loading, after it verified
      {"EIO", "step-4/state.json", "0", "4"},          // --resume STEP
  };
  int attempt = 2;
  for (const auto& f : faults) {
    SCOPED_TRACE(std::string(f.errno_name) + " on " + f.file + ", --resume " + f.resume);
    const std::string path = run_dir_ + "/checkpoints/" + f.file;
    std::vector<std::string> env;
    for (const auto& [name, value] :
         trainsup::testing::FaultOpenEnv(TRAINSUP_FAULT_OPEN_SHIM, path, f)) {
      env.push_back(name + "=" + value);
    }
    Spawn({"--attempt", std::to_string(attempt), "--resume", f.resume}, "", env);
    EXPECT_EQ(Wait(), 1) << Output();
    auto exit_file = ReadExitFile(ExitFilePath(run_dir_, attempt, 0));
    ASSERT_TRUE(exit_file.ok()) << exit_file.status() << "\n" << Output();
    EXPECT_EQ(exit_file->code, 1);
    EXPECT_EQ(exit_file->reason, "checkpoint_io");
    EXPECT_NE(exit_file->message.find(path), std::string::npos) << exit_file->message;
    EXPECT_NE(exit_file->message.find(std::string("(") + f.errno_name + ")"), std::string::npos)
        << exit_file->message;
    EXPECT_EQ(Output().find("resumed from"), std::string::npos) << Output();
    EXPECT_EQ(Output().find("step 1/5"), std::string::npos) << Output();
    EXPECT_FALSE(fs::exists(run_dir_ + "/checkpoints/quarantine")) << Output();
    for (int step : {4, 5}) {
      EXPECT_TRUE(
          fs::exists(run_dir_ + "/checkpoints/step-" + std::to_string(step) + "/state.json"));
    }
    ++attempt;
  }
  Spawn({"--attempt", std::to_string(attempt)});
  ASSERT_EQ(Wait(), 0) << Output();
  EXPECT_NE(Output().find("resumed from step 5"), std::string::npos) << Output();
}

// -- a full disk under the checkpoints ------------------------------------

// The run's checkpoints on a small tmpfs the test fills; the exit file is
// outside it (RUN_DIR/attempts).
class TestWorkerDiskFull : public TestWorkerProcess {
 protected:
  void SetUp() override {
    TestWorkerProcess::SetUp();
    disk_ =
        std::make_unique<trainsup::testing::SmallFileSystem>(run_dir_ + "/checkpoints", 256 << 10);
    if (!disk_->mounted()) GTEST_SKIP() << disk_->error();
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    disk_.reset();
    TestWorkerProcess::TearDown();
  }

  // Retention never frees space behind the test's back: every checkpoint
  // is kept.
  void WriteSpec(int64_t steps, int64_t step_ms) {
    std::ofstream(run_dir_ + "/spec.toml")
        << "[train]\nsteps = " << steps << "\ncheckpoint_every_steps = 2\nkeep_checkpoints = 1000\n"
        << "[testing]\nstep_ms = " << step_ms << "\n";
  }

  bool HasCheckpoint(int64_t step) {
    return fs::exists(run_dir_ + "/checkpoints/step-" + std::to_string(step) + "/MANIFEST.json");
  }

  // The CHECKPOINT events that report a failed save.
  std::vector<trainsup::worker::v1::WorkerEvent> FailedSaves(FakeSupervisor& service) {
    std::vector<trainsup::worker::v1::WorkerEvent> out;
    for (const auto& m : service.Of(WorkerMessage::kEvent)) {
      if (m.event().kind() == trainsup::v1::EVENT_KIND_CHECKPOINT && !m.event().error().empty()) {
        out.push_back(m.event());
      }
    }
    return out;
  }

  int64_t ReportedFailures(FakeSupervisor& service) {
    auto beats = service.Of(WorkerMessage::kHeartbeat);
    return beats.empty() ? 0 : beats.back().heartbeat().progress().checkpoint_failures();
  }

  std::unique_ptr<trainsup::testing::SmallFileSystem> disk_;
};

// A save that fails for want of space does not end the attempt: the worker
// trains on, reports each failure (a CHECKPOINT event with the error, and
// the heartbeat's checkpoint_failures and last_checkpoint_error), tries
// again at the next interval, and saves again once there is space.
TEST_F(TestWorkerDiskFull, FailedSavesAreReportedAndTrainingGoesOn) {
  WriteSpec(60, 30);
  TestServer server("unix:" + dir_ + "/d.sock");
  Spawn({"--attempt", "1"}, "unix:" + dir_ + "/d.sock");
  ASSERT_TRUE(Eventually([&] { return HasCheckpoint(2); })) << Output();
  ASSERT_TRUE(disk_->Fill());
  auto& service = server.service();
  ASSERT_TRUE(Eventually([&] { return ReportedFailures(service) >= 2; }, std::chrono::seconds(30)))
      << Output();
  const auto beats = service.Of(WorkerMessage::kHeartbeat);
  const trainsup::v1::Progress failing = beats.back().heartbeat().progress();
  EXPECT_NE(failing.last_checkpoint_error().find("No space left on device (ENOSPC)"),
            std::string::npos)
      << failing.last_checkpoint_error();
  disk_->Free();
  ASSERT_EQ(Wait(), 0) << Output();

  const auto failed = FailedSaves(service);
  ASSERT_GE(failed.size(), 2u);
  for (const auto& e : failed) {
    EXPECT_NE(e.error().find("No space left on device"), std::string::npos) << e.error();
    EXPECT_NE(e.message().find("checkpoint step-" + std::to_string(e.step()) + " failed"),
              std::string::npos)
        << e.message();
    EXPECT_FALSE(HasCheckpoint(e.step())) << e.step();
    EXPECT_GE(e.checkpoint_step(), 2);  // the newest good one, unchanged
    EXPECT_LT(e.checkpoint_step(), e.step());
  }
  // Trained through it, saved again once there was space, and the newest
  // heartbeat no longer carries an error.
  EXPECT_TRUE(HasCheckpoint(60));
  EXPECT_GT(failed.back().step(), failed.front().step());
  const auto last = service.Of(WorkerMessage::kHeartbeat).back().heartbeat().progress();
  EXPECT_EQ(last.last_checkpoint_error(), "");
  EXPECT_GE(last.checkpoint_failures(), static_cast<int64_t>(failed.size()));
  auto exit_file = ReadExitFile(ExitFilePath(run_dir_, 1, 0));
  ASSERT_TRUE(exit_file.ok()) << exit_file.status();
  EXPECT_EQ(exit_file->reason, "completed");
  EXPECT_EQ(exit_file->last_step, 60);
}

// The final checkpoint cannot be written: exit 74 (no_space), the exit file
// says "no space" and names the directory, and the last good checkpoint is
// kept and verifies.
TEST_F(TestWorkerDiskFull, NoSpaceForTheFinalCheckpointExits74) {
  WriteSpec(20, 20);
  Spawn({"--attempt", "1"});
  ASSERT_TRUE(Eventually([&] { return HasCheckpoint(2); })) << Output();
  ASSERT_TRUE(disk_->Fill());
  ASSERT_EQ(Wait(), 74) << Output();
  EXPECT_NE(Output().find("step 20/20"), std::string::npos) << Output();
  auto exit_file = ReadExitFile(ExitFilePath(run_dir_, 1, 0));
  ASSERT_TRUE(exit_file.ok()) << exit_file.status();
  EXPECT_EQ(exit_file->code, 74);
  EXPECT_EQ(exit_file->reason, "no_space");
  EXPECT_EQ(exit_file->last_step, 20);
  EXPECT_NE(exit_file->message.find("no space left in " + run_dir_ + "/checkpoints"),
            std::string::npos)
      << exit_file->message;
  EXPECT_FALSE(HasCheckpoint(20));
  ckpt::CheckpointStore store(run_dir_ + "/checkpoints");
  auto newest = store.ChooseLatest(nullptr);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_GE(newest->step, 2);
  EXPECT_NE(
      exit_file->message.find("the newest checkpoint kept is step-" + std::to_string(newest->step)),
      std::string::npos)
      << exit_file->message;
}

// SIGTERM while the disk is full: the stop's checkpoint fails, exit 74.
TEST_F(TestWorkerDiskFull, NoSpaceForTheStopCheckpointExits74) {
  WriteSpec(100000, 20);
  Spawn({"--attempt", "1"});
  ASSERT_TRUE(Eventually([&] { return HasCheckpoint(2); })) << Output();
  ASSERT_TRUE(disk_->Fill());
  ASSERT_TRUE(Eventually([&] { return Output().find("failed") != std::string::npos; })) << Output();
  ::kill(pid_, SIGTERM);
  ASSERT_EQ(Wait(), 74) << Output();
  auto exit_file = ReadExitFile(ExitFilePath(run_dir_, 1, 0));
  ASSERT_TRUE(exit_file.ok()) << exit_file.status();
  EXPECT_EQ(exit_file->reason, "no_space");
  EXPECT_NE(exit_file->message.find("before stopping"), std::string::npos) << exit_file->message;
}

TEST_F(TestWorkerProcess, SigtermCheckpointsAndExits143) {
  std::ofstream(run_dir_ + "/spec.toml") << "[train]\nsteps = 100000\ncheckpoint_every_steps = 0\n"
                                         << "[testing]\nstep_ms = 20\n";
  Spawn({"--attempt", "1"});
  ASSERT_TRUE(Eventually([&] { return Output().find("step 3/") != std::string::npos; }));
  ::kill(pid_, SIGTERM);
  ASSERT_EQ(Wait(), 143) << Output();
  auto exit_file = ReadExitFile(ExitFilePath(run_dir_, 1, 0));
  ASSERT_TRUE(exit_file.ok()) << exit_file.status();
  EXPECT_EQ(exit_file->code, 143);
  EXPECT_GE(exit_file->last_step, 3);
  EXPECT_TRUE(fs::exists(run_dir_ + "/checkpoints/step-" + std::to_string(exit_file->last_step)));
}

TEST_F(TestWorkerProcess, BadSpecExits64WithExitFile) {
  std::ofstream(run_dir_ + "/spec.toml") << "[train]\nstepz = 5\n";
  Spawn({"--attempt", "1"});
  ASSERT_EQ(Wait(), 64);
  auto exit_file = ReadExitFile(ExitFilePath(run_dir_, 1, 0));
  ASSERT_TRUE(exit_file.ok()) << exit_file.status();
  EXPECT_EQ(exit_file->code, 64);
  EXPECT_NE(exit_file->message.find("stepz"), std::string::npos) << exit_file->message;
}

TEST_F(TestWorkerProcess, MissingArgumentExits64) {
  WriteSpec("");
  Spawn({});  // no --attempt
  EXPECT_EQ(Wait(), 64);
}

TEST_F(TestWorkerProcess, ReportsToTheSupervisor) {
  WriteSpec("[testing]\nstep_ms = 5\n");
  TestServer server("unix:" + dir_ + "/d.sock");
  Spawn({"--attempt", "1"}, "unix:" + dir_ + "/d.sock");
  ASSERT_EQ(Wait(), 0) << Output();
  auto& service = server.service();
  ASSERT_EQ(service.Count(WorkerMessage::kHello), 1u);
  EXPECT_EQ(service.Of(WorkerMessage::kHello)[0].hello().token(), "tok-1");
  EXPECT_EQ(service.Of(WorkerMessage::kHello)[0].hello().run_id(), "run-1");
  std::vector<int64_t> checkpoints;
  for (const auto& m : service.Of(WorkerMessage::kEvent)) {
    if (m.event().kind() == trainsup::v1::EVENT_KIND_CHECKPOINT) {
      checkpoints.push_back(m.event().checkpoint_step());
    }
  }
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{2, 4, 5}));
  auto exits = service.Of(WorkerMessage::kExit);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit().code(), 0);
  EXPECT_EQ(exits[0].exit().last_step(), 5);
}

}  // namespace
}  // namespace trainsup::worker
