// Exact resume of the real trainsup-worker: a run killed with SIGKILL
// several times mid-epoch and resumed from its newest checkpoint each time
// ends with the same weights and optimizer state, bit for bit, as a run
// that was never interrupted. 9 rooms: 7 train (4 batches of 2, 2, 2, 1 per
// epoch) and 2 validation rooms; checkpoints every 3 steps, so most resume
// points lie inside an epoch.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "contracts/exit_file.h"
#include "tests/common/fault_open.h"
#include "tests/worker/worker_process.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;
using testing::Launch;
using testing::LogPath;
using testing::ReadFile;
using testing::WaitStatus;

constexpr int kSteps = 30;

std::string MakeRunDir(const std::string& name, int steps = kSteps) {
  fs::path dir =
      fs::path(::testing::TempDir()) / ("resume_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "spec.toml") << "name = \"resume\"\n"
                                      "[model]\n"
                                      "arch = \"minkunet14\"\n"
                                      "in_channels = 3\n"
                                      "voxel_size = 0.1\n"
                                      "[data]\n"
                                      "format = \"synthetic\"\n"
                                      "scenes = 9\n"
                                      "scene_size = \"small\"\n"
                                      "[train]\n"
                                      "batch_size = 2\n"
                                      "steps = "
                                   << steps
                                   << "\n"
                                      "checkpoint_every_steps = 3\n"
                                      "deterministic = true\n"
                                      "threads = 2\n";
  return dir.string();
}

// The committed checkpoints' steps (step-N directories), ascending.
std::vector<int64_t> CheckpointSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  static const std::regex kName("step-([0-9]+)");
  std::smatch m;
  for (const auto& entry : fs::directory_iterator(fs::path(dir) / "checkpoints", ec)) {
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName)) steps.push_back(std::stoll(m[1]));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

int64_t NewestCheckpoint(const std::string& dir) {
  std::vector<int64_t> steps = CheckpointSteps(dir);
  return steps.empty() ? -1 : steps.back();
}

TEST(Resume, SigkilledThreeTimesEndsBitIdenticalToAnUninterruptedRun) {
  const std::string a = MakeRunDir("a"), b = MakeRunDir("b");

  // A: uninterrupted.
  int status = WaitStatus(Launch(a, 1));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ":\n"
                                                             << ReadFile(LogPath(a, 1));
  absl::StatusOr<ExitFile> a_exit = ReadExitFile(ExitFilePath(a, 1, 0));
  ASSERT_TRUE(a_exit.ok()) << a_exit.status();
  EXPECT_EQ(a_exit->code, 0);
  EXPECT_EQ(a_exit->last_step, kSteps);

  // B: killed three times, each a seeded few milliseconds after the first or
  // second new checkpoint appeared, and resumed.
  std::mt19937 rng(20240611);
  std::vector<int64_t> resumed_from;  // the newest checkpoint when attempt k was killed
  int attempt = 1;
  for (int kill_no = 0; kill_no < 3; ++kill_no, ++attempt) {
    const int64_t seen = NewestCheckpoint(b);
    pid_t pid = Launch(b, attempt);
    bool exited = false;
    const int64_t wait_for =
        std::max<int64_t>(seen, 0) + 3 * std::uniform_int_distribution<int>(1, 2)(rng);
    while (NewestCheckpoint(b) < wait_for) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        exited = true;
        ADD_FAILURE() << "attempt " << attempt << " exited (status " << st
                      << ") before it could be killed:\n"
                      << ReadFile(LogPath(b, attempt));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (exited) return;
    const int64_t appeared = NewestCheckpoint(b);
    const int delay_ms = std::uniform_int_distribution<int>(0, 400)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    status = WaitStatus(pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "attempt " << attempt << " status " << status << ":\n"
        << ReadFile(LogPath(b, attempt));
    resumed_from.push_back(NewestCheckpoint(b));
    std::printf(
        "attempt %d: SIGKILL %d ms after checkpoint step-%lld appeared; newest then "
        "step-%lld\n",
        attempt, delay_ms, static_cast<long long>(appeared),
        static_cast<long long>(resumed_from.back()));
    // Killed, so it wrote no exit file.
    EXPECT_FALSE(fs::exists(ExitFilePath(b, attempt, 0))) << "attempt " << attempt;
  }
  status = WaitStatus(Launch(b, attempt));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ":\n"
                                                             << ReadFile(LogPath(b, attempt));
  absl::StatusOr<ExitFile> b_exit = ReadExitFile(ExitFilePath(b, attempt, 0));
  ASSERT_TRUE(b_exit.ok()) << b_exit.status();
  EXPECT_EQ(b_exit->code, 0);
  EXPECT_EQ(b_exit->reason, "completed");
  EXPECT_EQ(b_exit->last_step, kSteps);

  // Every resumed attempt started from the newest checkpoint its
  // predecessor left, and went on with the next step; at least one resumed
  // inside an epoch.
  static const std::regex kResumed(
      "resumed from step ([0-9]+) \\(epoch ([0-9]+), cursor ([0-9]+)\\)");
  int mid_epoch = 0;
  for (int k = 2; k <= attempt; ++k) {
    const int64_t from = resumed_from[k - 2];
    std::string log = ReadFile(LogPath(b, k));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, kResumed)) << "attempt " << k << ":\n" << log;
    EXPECT_EQ(std::stoll(m[1]), from) << "attempt " << k << ":\n" << log;
    mid_epoch += std::stoll(m[3]) != 0;
    std::printf("attempt %d resumed from step %s (epoch %s, cursor %s)\n", k, m[1].str().c_str(),
                m[2].str().c_str(), m[3].str().c_str());
    EXPECT_NE(log.find("\nstep " + std::to_string(from + 1) + "/" + std::to_string(kSteps) + " "),
              std::string::npos)
        << "attempt " << k << ":\n"
        << log;
    EXPECT_EQ(log.find("\nstep " + std::to_string(from) + "/"), std::string::npos)
        << "attempt " << k << " redid step " << from << ":\n"
        << log;
  }
  EXPECT_GT(mid_epoch, 0) << "every resume point was an epoch boundary";
  ASSERT_GT(resumed_from.back(), resumed_from.front()) << "the kills did not advance the run";

  const std::string last = "checkpoints/step-" + std::to_string(kSteps);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    std::string in_a = ReadFile(fs::path(a) / last / file);
    std::string in_b = ReadFile(fs::path(b) / last / file);
    ASSERT_FALSE(in_a.empty()) << file;
    EXPECT_EQ(in_a.size(), in_b.size()) << file;
    EXPECT_TRUE(in_a == in_b) << file << " differs between the uninterrupted and the resumed run";
    std::printf("%s: %zu bytes, %s\n", file, in_a.size(), in_a == in_b ? "identical" : "DIFFERENT");
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

// A read error on the checkpoint to resume from (an LD_PRELOAD shim fails
// chosen opens with EIO or EMFILE) is not corruption: the attempt exits 1
// with reason checkpoint_io naming the file and the errno, quarantines
// nothing and trains neither from scratch nor from an older checkpoint.
// Without the error the next attempt resumes from the newest checkpoint.
TEST(Resume, ReadErrorFailsTheAttemptAndQuarantinesNothing) {
  const std::string dir = MakeRunDir("io", 4);  // checkpoints step-3 and step-4
  int status = WaitStatus(Launch(dir, 1));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ":\n"
                                                             << ReadFile(LogPath(dir, 1));
  ASSERT_EQ(CheckpointSteps(dir), (std::vector<int64_t>{3, 4}));
  const trainsup::testing::OpenFault faults[] = {
      {"EIO", "step-4/model.safetensors", "0", "latest"},     // verifying
      {"EMFILE", "step-4/model.safetensors", "1", "latest"},  // loading, after it verified
      {"EIO", "step-3/trainer.json", "0", "3"},               // --resume STEP
  };
  int attempt = 2;
  for (const auto& f : faults) {
    SCOPED_TRACE(std::string(f.errno_name) + " on " + f.file + ", --resume " + f.resume);
    const std::string path = dir + "/checkpoints/" + f.file;
    status = WaitStatus(Launch(dir, attempt, f.resume,
                               trainsup::testing::FaultOpenEnv(TRAINSUP_FAULT_OPEN_SHIM, path, f)));
    const std::string log = ReadFile(LogPath(dir, attempt));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << ":\n"
                                                               << log;
    absl::StatusOr<ExitFile> exit_file = ReadExitFile(ExitFilePath(dir, attempt, 0));
    ASSERT_TRUE(exit_file.ok()) << exit_file.status() << "\n" << log;
    EXPECT_EQ(exit_file->code, 1);
    EXPECT_EQ(exit_file->reason, "checkpoint_io");
    EXPECT_NE(exit_file->message.find(path), std::string::npos) << exit_file->message;
    EXPECT_NE(exit_file->message.find(std::string("(") + f.errno_name + ")"), std::string::npos)
        << exit_file->message;
    EXPECT_EQ(log.find("resumed from"), std::string::npos) << log;
    EXPECT_EQ(log.find("\nstep 1/"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoints" / "quarantine")) << log;
    EXPECT_EQ(CheckpointSteps(dir), (std::vector<int64_t>{3, 4})) << log;
    ++attempt;
  }
  status = WaitStatus(Launch(dir, attempt));
  const std::string log = ReadFile(LogPath(dir, attempt));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ":\n" << log;
  EXPECT_NE(log.find("resumed from step 4"), std::string::npos) << log;
  fs::remove_all(dir);
}

// A checkpoint the supervisor chose (--resume STEP) that turns out damaged
// when the rank verifies it: the attempt fails (checkpoint_corrupt) and the
// checkpoint stays where it is. Only the daemon that owns a store may
// quarantine in it, never a rank: the store may be a multi-node job's,
// shared with other nodes.
TEST(Resume, ARankNeverQuarantinesTheCheckpointItWasGiven) {
  const std::string dir = MakeRunDir("given", 4);  // checkpoints step-3 and step-4
  int status = WaitStatus(Launch(dir, 1));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(LogPath(dir, 1));
  ASSERT_EQ(CheckpointSteps(dir), (std::vector<int64_t>{3, 4}));
  const fs::path model = fs::path(dir) / "checkpoints" / "step-4" / "model.safetensors";
  std::string bytes = ReadFile(model);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 1] ^= 0x5a;
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;

  status = WaitStatus(Launch(dir, 2, "4"));
  const std::string log = ReadFile(LogPath(dir, 2));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << ":\n" << log;
  absl::StatusOr<ExitFile> exit_file = ReadExitFile(ExitFilePath(dir, 2, 0));
  ASSERT_TRUE(exit_file.ok()) << exit_file.status() << "\n" << log;
  EXPECT_EQ(exit_file->reason, "checkpoint_corrupt");
  EXPECT_NE(exit_file->message.find("not quarantined"), std::string::npos) << exit_file->message;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoints" / "quarantine")) << log;
  EXPECT_EQ(CheckpointSteps(dir), (std::vector<int64_t>{3, 4})) << log;
  fs::remove_all(dir);
}

// SIGTERM (what the supervisor sends to stop a run) finishes the step,
// checkpoints and exits 143, whatever thread of the worker the kernel
// delivers it to: every thread, including those the BLAS library and
// LibTorch start before the worker sets up its signals, has SIGTERM
// blocked for the worker's sigwait thread.
TEST(Resume, SigtermStopsAfterACheckpointAndExits143) {
  const std::string dir = MakeRunDir("term", 300);
  pid_t pid = Launch(dir, 1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (ReadFile(LogPath(dir, 1)).find("\nstep 2/") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(ReadFile(LogPath(dir, 1)).find("\nstep 2/"), std::string::npos)
      << ReadFile(LogPath(dir, 1));
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = WaitStatus(pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ":\n"
                                 << ReadFile(LogPath(dir, 1));
  EXPECT_EQ(WEXITSTATUS(status), 143);
  absl::StatusOr<ExitFile> exit = ReadExitFile(ExitFilePath(dir, 1, 0));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->reason, "stopped");
  EXPECT_GE(exit->last_step, 2);
  EXPECT_EQ(NewestCheckpoint(dir), exit->last_step);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainsup::worker
