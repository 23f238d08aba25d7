// The training guard in the real trainsup-worker process (docs/guard.md),
// with the spec's fault injection ([testing] nan_loss_at_step,
// nan_grad_at_step, loss_spike_at_step) and one real divergence:
//  - a step whose loss or gradient is not finite, or whose loss spikes, is
//    not applied: the run ends byte for byte equal to one that skipped those
//    steps' batches (data.skip_windows);
//  - a diverged attempt (exit 79) resumed from the checkpoint before its
//    first bad step, with the rollback's window (TRAINSUP_SKIP_WINDOWS),
//    ends byte for byte equal to a run that skipped the window from the
//    start;
//  - lr = 1e4 is caught within a few steps and no checkpoint ever holds a
//    non-finite value;
//  - a NaN inside a split batch is neither split further nor counted as an
//    out-of-memory;
//  - in a gang of two, a NaN on one rank is skipped by both, whose weights
//    stay identical.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/safetensors.h"
#include "contracts/exit_file.h"
#include "contracts/free_port.h"
#include "nlohmann/json.hpp"
#include "tests/worker/worker_process.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;
using testing::Launch;
using testing::LogPath;
using testing::ReadFile;
using testing::WaitStatus;

// A run directory with the resume test's small deterministic spec plus
// `extra` TOML (whole tables: [guard], [testing], or lines of [data] and
// [optimizer], which come after their table headers).
std::string MakeRun(const std::string& name, int steps, int checkpoint_every,
                    const std::string& data = "", const std::string& tables = "",
                    const std::string& optimizer = "", int threads = 2) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("guard_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "spec.toml") << "name = \"" << name << "\"\n"
                                   << "[model]\narch = \"minkunet14\"\nin_channels = 3\n"
                                   << "voxel_size = 0.1\n"
                                   << "[data]\nformat = \"synthetic\"\nscenes = 9\n"
                                   << "scene_size = \"small\"\n"
                                   << data << "[optimizer]\n"
                                   << optimizer << "[train]\nbatch_size = 2\nsteps = " << steps
                                   << "\ncheckpoint_every_steps = " << checkpoint_every
                                   << "\ndeterministic = true\nthreads = " << threads << "\n"
                                   << tables;
  return dir.string();
}

struct Ended {
  int status = -1;
  std::string log;
  ExitFile exit;
};

Ended RunWorker(const std::string& dir, int attempt, const std::string& resume = "latest",
                const std::vector<std::pair<std::string, std::string>>& env = {}) {
  Ended e;
  e.status = WaitStatus(Launch(dir, attempt, resume, env));
  e.log = ReadFile(LogPath(dir, attempt));
  absl::StatusOr<ExitFile> f = ReadExitFile(ExitFilePath(dir, attempt, 0));
  if (f.ok()) e.exit = *f;
  return e;
}

int ExitCode(const Ended& e) { return WIFEXITED(e.status) ? WEXITSTATUS(e.status) : -1; }

std::string Checkpoint(const std::string& dir, int step, const char* file) {
  return ReadFile(fs::path(dir) / "checkpoints" / ("step-" + std::to_string(step)) / file);
}

// The two runs' checkpoints of `step` hold the same bytes: weights, BatchNorm
// statistics and optimizer state.
void ExpectSameState(const std::string& a, const std::string& b, int step) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string in_a = Checkpoint(a, step, file), in_b = Checkpoint(b, step, file);
    ASSERT_FALSE(in_a.empty()) << a << " step " << step << " " << file;
    EXPECT_TRUE(in_a == in_b) << file << " of step " << step << " differs";
  }
}

nlohmann::json Counters(const std::string& dir, int step) {
  return nlohmann::json::parse(Checkpoint(dir, step, "trainer.json"))["extra"]["counters"];
}

std::vector<int64_t> CheckpointSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  static const std::regex kName("step-([0-9]+)");
  std::smatch m;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(dir) / "checkpoints", ec)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName)) steps.push_back(std::stoll(m[1]));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Guard, NonFiniteAndSpikingStepsAreNotAppliedAndEqualARunThatSkippedThem) {
  const std::string guard = "[guard]\nspike_warmup = 5\nmax_bad_steps = 4\n";
  const std::string a = MakeRun("faults", 12, 1, "",
                                guard + "[testing]\nnan_loss_at_step = 3\nnan_grad_at_step = 6\n" +
                                    "loss_spike_at_step = 10\n");
  const std::string b =
      MakeRun("skipped", 12, 1, "skip_windows = [[3, 3], [6, 6], [10, 10]]\n", guard);
  const Ended ea = RunWorker(a, 1);
  ASSERT_EQ(ExitCode(ea), 0) << ea.log;
  const Ended eb = RunWorker(b, 1);
  ASSERT_EQ(ExitCode(eb), 0) << eb.log;
  EXPECT_TRUE(Contains(ea.log, "step 3 not applied (not finite): loss nan;")) << ea.log;
  EXPECT_TRUE(Contains(ea.log, "step 6 not applied (not finite): gradient norm nan (loss "))
      << ea.log;
  EXPECT_TRUE(Contains(ea.log, "step 10 not applied (loss spike): loss ")) << ea.log;
  EXPECT_TRUE(Contains(eb.log, "step 3: a skip window starts")) << eb.log;
  for (int step : {11, 12}) ExpectSameState(a, b, step);
  // Retention (keep_checkpoints = 3) kept step-2 as well, the newest before
  // the oldest bad step the guard still counts (3): a rollback's target.
  EXPECT_EQ(CheckpointSteps(a), (std::vector<int64_t>{2, 10, 11, 12}));
  EXPECT_EQ(CheckpointSteps(b), (std::vector<int64_t>{10, 11, 12}));
  const nlohmann::json ca = Counters(a, 12), cb = Counters(b, 12);
  EXPECT_EQ(ca["nonfinite_steps"], 2);
  EXPECT_EQ(ca["spike_steps"], 1);
  EXPECT_EQ(ca["window_skipped_steps"], 0);
  EXPECT_EQ(cb["window_skipped_steps"], 3);
  EXPECT_EQ(cb["nonfinite_steps"], 0);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Guard, ADivergedAttemptRolledBackWithItsWindowSkippedEqualsARunThatSkippedItFromTheStart) {
  const std::string guard = "[guard]\nmax_bad_steps = 1\n";
  const std::string a =
      MakeRun("diverged", 12, 2, "", guard + "[testing]\nnan_loss_at_step = 6\nonly_attempt = 1\n");
  const std::string b = MakeRun("clean", 12, 2, "skip_windows = [[6, 8]]\n", guard);
  const Ended first = RunWorker(a, 1);
  ASSERT_EQ(ExitCode(first), 79) << first.log;
  EXPECT_EQ(first.exit.reason, "diverged");
  EXPECT_EQ(first.exit.first_bad_step, 6);
  EXPECT_EQ(first.exit.last_step, 5);
  EXPECT_EQ(first.exit.message, "diverged at step 6: 1 bad step within 100 (step 6: loss nan)");
  EXPECT_EQ(CheckpointSteps(a), (std::vector<int64_t>{2, 4}));
  // The daemon's rollback: the newest checkpoint before step 6, steps 6..8
  // skipped.
  const Ended second = RunWorker(a, 2, "4", {{"TRAINSUP_SKIP_WINDOWS", "6-8"}});
  ASSERT_EQ(ExitCode(second), 0) << second.log;
  EXPECT_TRUE(Contains(second.log, "resumed from step 4")) << second.log;
  const Ended clean = RunWorker(b, 1);
  ASSERT_EQ(ExitCode(clean), 0) << clean.log;
  ExpectSameState(a, b, 12);
  // A window that does not parse is refused before anything is trained.
  const Ended bad = RunWorker(a, 3, "4", {{"TRAINSUP_SKIP_WINDOWS", "8-6"}});
  EXPECT_EQ(ExitCode(bad), 64) << bad.log;
  EXPECT_TRUE(Contains(bad.exit.message, "TRAINSUP_SKIP_WINDOWS: skip windows: \"8-6\""))
      << bad.exit.message;
  fs::remove_all(a);
  fs::remove_all(b);
}

// Every floating-point tensor of every committed checkpoint is finite.
void ExpectEveryCheckpointFinite(const std::string& dir) {
  for (int64_t step : CheckpointSteps(dir)) {
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      const std::string path =
          (fs::path(dir) / "checkpoints" / ("step-" + std::to_string(step)) / file).string();
      absl::StatusOr<ckpt::SafetensorsFile> st =
          ckpt::ReadSafetensors(ckpt::FileSystem::Default(), path);
      ASSERT_TRUE(st.ok()) << path << ": " << st.status();
      for (const auto& [name, t] : st->tensors) {
        if (!t.is_floating_point()) continue;
        EXPECT_TRUE(at::isfinite(t).all().item<bool>()) << path << ": " << name;
      }
    }
  }
}

TEST(Guard, ARealDivergenceIsCaughtWithinAFewStepsAndNoCheckpointHoldsANonFiniteValue) {
  // SGD at lr 1e4 (no injection): the loss grows by orders of magnitude
  // each step until the BatchNorm statistics overflow.
  const std::string dir = MakeRun("lr1e4", 30, 1, "", "", "lr = 10000\nmomentum = 0.9\n");
  const Ended e = RunWorker(dir, 1);
  ASSERT_EQ(ExitCode(e), 79) << e.log;
  EXPECT_EQ(e.exit.reason, "diverged");
  EXPECT_GE(e.exit.first_bad_step, 2) << e.exit.message;
  EXPECT_LE(e.exit.first_bad_step, 12) << e.exit.message;
  EXPECT_FALSE(Contains(e.log, "out-of-memory")) << e.log;
  ASSERT_FALSE(CheckpointSteps(dir).empty()) << e.log;
  ExpectEveryCheckpointFinite(dir);
  std::printf("lr 1e4: %s\n", e.exit.message.c_str());
  fs::remove_all(dir);
}

// The log line a step's splits produced ("step 3: 2 splits (2 predicted),
// 0 out-of-memory retries, 0 pieces dropped"); "" when it had none.
std::string SplitLine(const std::string& log, int step) {
  const std::string head = "\nstep " + std::to_string(step) + ": ";
  for (size_t at = log.find(head); at != std::string::npos; at = log.find(head, at + 1)) {
    const size_t end = log.find('\n', at + 1);
    const std::string line = log.substr(at + 1, end - at - 1);
    if (Contains(line, " splits (")) return line;
  }
  return "";
}

TEST(Guard, ANanInASplitBatchIsNeitherSplitFurtherNorCountedAsOutOfMemory) {
  // Larger rooms under a budget below their peak: step 1 runs out of memory
  // and is split (the memory model learns), step 2 is split by the memory
  // model's plan. A NaN at step 2 must not change how it is split.
  const std::string a = MakeRun("split_nan", 3, 3, "", "[testing]\nnan_loss_at_step = 2\n");
  const std::string b = MakeRun("split_clean", 3, 3);
  for (const std::string& dir : {a, b}) {
    std::string spec = ReadFile(fs::path(dir) / "spec.toml");
    spec.replace(spec.find("scene_size = \"small\""), 20, "scene_size = \"default\"");
    spec.replace(spec.find("[train]\n"), 8, "[train]\nmemory_budget_mb = 200\n");
    std::ofstream(fs::path(dir) / "spec.toml") << spec;
  }
  const Ended ea = RunWorker(a, 1), eb = RunWorker(b, 1);
  ASSERT_EQ(ExitCode(ea), 0) << ea.log;
  ASSERT_EQ(ExitCode(eb), 0) << eb.log;
  const std::string with_nan = SplitLine(ea.log, 2), clean = SplitLine(eb.log, 2);
  ASSERT_FALSE(clean.empty()) << "step 2 was not split; the budget is too high:\n" << eb.log;
  EXPECT_EQ(with_nan, clean);
  EXPECT_TRUE(Contains(with_nan, " 0 out-of-memory retries")) << with_nan;
  EXPECT_TRUE(Contains(ea.log, "step 2 not applied (not finite): loss nan")) << ea.log;
  EXPECT_EQ(ExitCode(ea), 0);
  std::printf("step 2 with a NaN: %s\n", with_nan.c_str());
  fs::remove_all(a);
  fs::remove_all(b);
}

// A gang of 2 real workers on a run made by MakeRun(name, 6, 3, "",
// tables): both exit 0; their logs, and whether their weights digests
// agree.
struct GangOfTwo {
  std::string dir, log0, log1;
  bool same_weights = false;
};
GangOfTwo RunGangOfTwo(const std::string& name, const std::string& tables) {
  GangOfTwo g;
  g.dir = MakeRun(name, 6, 3, "", tables, "", 1);
  {
    std::string spec = ReadFile(fs::path(g.dir) / "spec.toml");
    std::ofstream(fs::path(g.dir) / "spec.toml") << "world_size = 2\n" << spec;
  }
  const int port = FreeLoopbackPort();
  const std::vector<std::pair<std::string, std::string>> env = {
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
  const pid_t r0 = testing::LaunchRank(g.dir, 1, 0, 2, "latest", env, g.dir + "/rank-0.log");
  const pid_t r1 = testing::LaunchRank(g.dir, 1, 1, 2, "latest", env, g.dir + "/rank-1.log");
  const int s0 = WaitStatus(r0), s1 = WaitStatus(r1);
  g.log0 = ReadFile(g.dir + "/rank-0.log");
  g.log1 = ReadFile(g.dir + "/rank-1.log");
  EXPECT_TRUE(WIFEXITED(s0) && WEXITSTATUS(s0) == 0) << g.log0;
  EXPECT_TRUE(WIFEXITED(s1) && WEXITSTATUS(s1) == 0) << g.log1;
  static const std::regex kDigest("weights digest ([0-9a-f]{16}) \\(rank ([01])\\)");
  std::smatch m0, m1;
  EXPECT_TRUE(std::regex_search(g.log0, m0, kDigest)) << g.log0;
  EXPECT_TRUE(std::regex_search(g.log1, m1, kDigest)) << g.log1;
  g.same_weights = !m0.empty() && !m1.empty() && m0[1].str() == m1[1].str();
  return g;
}

TEST(Guard, ANanOnOneRankOfAGangIsSkippedByBothAndTheirWeightsStayIdentical) {
  const GangOfTwo g = RunGangOfTwo("gang", "[testing]\nnan_loss_at_step = 3\nonly_rank = 1\n");
  for (const std::string* log : {&g.log0, &g.log1}) {
    EXPECT_TRUE(Contains(*log, "step 3 not applied (not finite): loss nan")) << *log;
    EXPECT_EQ(log->find("not applied ("), log->rfind("not applied (")) << *log;
  }
  EXPECT_TRUE(g.same_weights) << "the ranks' weights differ";
  // The checkpoint holds the gang's state (docs/checkpoints.md): the step
  // both ranks skipped, counted once.
  const nlohmann::json extra = nlohmann::json::parse(Checkpoint(g.dir, 6, "trainer.json"))["extra"];
  EXPECT_EQ(extra["world_size"], 2) << extra.dump();
  EXPECT_EQ(extra["counters"]["nonfinite_steps"], 1) << extra.dump();
  fs::remove_all(g.dir);
}

// fp16: one rank's overflow (a non-finite gradient under a finite loss)
// reaches the other through the gradient allreduce, so both ranks' loss
// scalers skip the step and halve alike, and no rank counts a bad step.
TEST(Guard, Fp16OneRanksOverflowSkipsTheStepOnEveryRank) {
  const GangOfTwo g = RunGangOfTwo(
      "gang_fp16", "precision = \"fp16\"\n[testing]\nnan_grad_at_step = 3\nonly_rank = 1\n");
  for (const std::string* log : {&g.log0, &g.log1}) {
    EXPECT_TRUE(Contains(*log,
                         "step 3 skipped by the loss scaler: gradient overflow at scale "
                         "65536, the scale goes to 32768"))
        << *log;
    EXPECT_FALSE(Contains(*log, "not applied (")) << *log;
  }
  EXPECT_TRUE(g.same_weights) << "the ranks' weights differ";
  const nlohmann::json extra = nlohmann::json::parse(Checkpoint(g.dir, 6, "trainer.json"))["extra"];
  EXPECT_EQ(extra["counters"]["scaler_skipped_steps"], 1) << extra.dump();
  EXPECT_EQ(extra["counters"]["nonfinite_steps"], 0) << extra.dump();
  EXPECT_EQ(extra["loss_scaler"]["scale"], 32768) << extra.dump();
  fs::remove_all(g.dir);
}

}  // namespace
}  // namespace trainsup::worker
