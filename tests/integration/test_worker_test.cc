// The test worker (trainsup-test-worker) run as a real process, standalone
// and against the in-process WorkerChannel server of link_test_util.h.
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
#include "worker/link/link.h"

extern char** environ;

namespace trainsup::worker {
namespace {

using trainsup::worker::v1::SupervisorCommand;
using trainsup::worker::v1::WorkerMessage;
namespace fs = std::filesystem;

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
