// SupervisorLink against an in-process WorkerChannel server on a unix
// socket, and the exit file. The test worker as a process:
// test_worker_test.cc.
#include "worker/link/link.h"

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
#include "tests/integration/link_test_util.h"

extern char** environ;

namespace trainsup::worker {
namespace {

using trainsup::worker::v1::SupervisorCommand;
using trainsup::worker::v1::WorkerMessage;
namespace fs = std::filesystem;

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

}  // namespace
}  // namespace trainsup::worker
