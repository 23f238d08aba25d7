// The real trainsupd with the real trainsup-worker, as a user runs them:
// data-parallel gangs over Gloo on loopback under fault injection.
//
//  - Chaos, world size 1 and 2: a 200-step deterministic run during which
//    the test SIGKILLs workers at seeded random moments (at least 10 kills,
//    some while rank 0 is writing a checkpoint) and SIGKILLs trainsupd
//    twice, restarting it each time. The run ends SUCCEEDED, its final model
//    and optimizer files are byte for byte those of the same run never
//    interrupted, and no worker process is left.
//  - A rank stopped with SIGSTOP inside the gradient allreduce: its peer
//    times out (distributed.timeout_s), exits 76 naming the stopped rank and
//    the collective, the daemon stops the gang and restarts it, and nothing
//    is left running.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "contracts/exit_file.h"
#include "contracts/run_layout.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = 200;
constexpr int kCheckpointEvery = 7;

std::string GangSpec(const std::string& name, int world, int steps, int checkpoint_every,
                     const std::string& extra = "") {
  std::ostringstream s;
  s << "name = \"" << name << "\"\n"
    << "world_size = " << world << "\n"
    << "[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = 0.1\n"
    << "[data]\nformat = \"synthetic\"\nscenes = 10\nscene_size = \"small\"\n"
    << "[train]\nbatch_size = 1\nsteps = " << steps
    << "\ncheckpoint_every_steps = " << checkpoint_every
    << "\nkeep_checkpoints = 3\ndeterministic = true\nthreads = 1\n"
    << extra;
  return s.str();
}

// A step-N.tmp (a checkpoint being written, not a deletion or a
// replacement) made after `since`: a crash's leftover is older.
bool CheckpointBeingWritten(const std::string& run_dir, fs::file_time_type since) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(RunLayout(run_dir).CheckpointsDir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() > 4 &&
        name.compare(name.size() - 4, 4, ".tmp") == 0 && name.find('.') == name.rfind('.')) {
      std::error_code tec;
      const fs::file_time_type t = fs::last_write_time(e.path(), tec);
      if (!tec && t >= since) return true;
    }
  }
  return false;
}

// The newest attempt, running with every rank alive and a pid for each.
bool AttemptRunning(const v1::Run& r, int world) {
  if (r.state() != v1::RUN_STATE_RUNNING || r.attempts_size() == 0) return false;
  const v1::Attempt& a = r.attempts(r.attempts_size() - 1);
  if (a.ranks_size() != world || a.ended_ms() != 0) return false;
  for (const v1::RankStatus& rank : a.ranks()) {
    if (!rank.alive() || rank.pid() <= 1) return false;
  }
  return true;
}

void Chaos(int world) {
  DaemonHarness h;
  UseRealWorker(h, world);
  ASSERT_TRUE(h.Start());

  // The same run, never interrupted.
  const std::string ref_id = h.Submit(GangSpec("reference", world, kSteps, kCheckpointEvery));
  v1::Run ref;
  ASSERT_TRUE(h.WaitForEnd(ref_id, Seconds(400), &ref));
  ASSERT_EQ(ref.state(), v1::RUN_STATE_SUCCEEDED) << Describe(ref);
  ASSERT_EQ(ref.attempts_size(), 1) << Describe(ref);

  const std::string id = h.Submit(GangSpec("chaos", world, kSteps, kCheckpointEvery));
  std::mt19937 rng(20261201 + world);
  int kills = 0, checkpoint_kills = 0, daemon_kills = 0;
  std::string run_dir;
  v1::Run run;
  while (kills < 10 || daemon_kills < 2) {
    // Wait for a running attempt that got past a checkpoint newer than the
    // one it resumed from (so every kill leaves the run further on), plus
    // a seeded few steps.
    const int extra = std::uniform_int_distribution<int>(0, kCheckpointEvery - 1)(rng);
    ASSERT_TRUE(h.WaitFor(
        id,
        [&](const v1::Run& r) {
          if (IsTerminal(r.state())) return true;
          if (!AttemptRunning(r, world)) return false;
          const v1::Attempt& a = r.attempts(r.attempts_size() - 1);
          const int64_t from = std::max<int64_t>(a.resumed_from_step(), 0);
          return r.progress().last_checkpoint_step() > from &&
                 r.progress().step() >= r.progress().last_checkpoint_step() + extra;
        },
        Seconds(300), &run));
    ASSERT_FALSE(IsTerminal(run.state())) << "the run ended after " << kills << " worker kills and "
                                          << daemon_kills << " daemon kills:\n"
                                          << Describe(run);
    run_dir = run.run_dir();
    const int attempt = run.attempts_size();
    if ((kills == 3 && daemon_kills == 0) || (kills == 7 && daemon_kills == 1)) {
      h.Kill();
      ++daemon_kills;
      const int down_ms = std::uniform_int_distribution<int>(0, 1500)(rng);
      std::this_thread::sleep_for(std::chrono::milliseconds(down_ms));
      std::printf("world %d: trainsupd SIGKILLed at step %lld, restarted %d ms later\n", world,
                  static_cast<long long>(run.progress().step()), down_ms);
      ASSERT_TRUE(h.Start());
      continue;
    }
    const v1::Attempt& a = run.attempts(attempt - 1);
    if (kills % 3 == 1) {
      // While rank 0 writes a checkpoint: the moment its step-N.tmp appears.
      bool writing = false;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      const fs::file_time_type since = fs::file_time_type::clock::now() - std::chrono::seconds(1);
      while (!writing && std::chrono::steady_clock::now() < until) {
        writing = CheckpointBeingWritten(run_dir, since);
        if (!writing) std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      ASSERT_TRUE(writing) << "no checkpoint was written within 60 s";
      ASSERT_EQ(kill(a.ranks(0).pid(), SIGKILL), 0);
      const bool hit = CheckpointBeingWritten(run_dir, since);
      checkpoint_kills += hit;
      std::printf("world %d: kill %d: rank 0 SIGKILLed while writing a checkpoint (%s)\n", world,
                  kills + 1, hit ? "its .tmp was still there" : "it had just committed");
    } else {
      const int delay_ms = std::uniform_int_distribution<int>(0, 300)(rng);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      const int rank = std::uniform_int_distribution<int>(0, world - 1)(rng);
      ASSERT_EQ(kill(a.ranks(rank).pid(), SIGKILL), 0);
      std::printf("world %d: kill %d: rank %d SIGKILLed near step %lld\n", world, kills + 1, rank,
                  static_cast<long long>(run.progress().step()));
    }
    ++kills;
    // The daemon notices and starts the next attempt.
    ASSERT_TRUE(h.WaitFor(
        id, [&](const v1::Run& r) { return IsTerminal(r.state()) || r.attempts_size() > attempt; },
        Seconds(120), &run));
  }
  ASSERT_TRUE(h.WaitForEnd(id, Seconds(400), &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  std::printf(
      "world %d: %d worker kills (%d during a checkpoint write), %d daemon kills, %d "
      "attempts\n",
      world, kills, checkpoint_kills, daemon_kills, run.attempts_size());
  EXPECT_GE(kills, 10);
  EXPECT_GE(checkpoint_kills, 1) << "no kill landed while a checkpoint was being written";
  EXPECT_GT(run.attempts_size(), 10) << Describe(run);

  const std::string last = "step-" + std::to_string(kSteps);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string a =
        ReadFileText(fs::path(RunLayout(ref.run_dir()).CheckpointsDir()) / last / file);
    const std::string b =
        ReadFileText(fs::path(RunLayout(run.run_dir()).CheckpointsDir()) / last / file);
    ASSERT_GT(a.size(), 1000u) << file;
    EXPECT_TRUE(a == b) << file << " differs from the uninterrupted run's";
    std::printf("world %d: %s: %zu bytes, %s\n", world, file, a.size(),
                a == b ? "identical" : "DIFFERENT");
  }
  // Nothing left behind.
  EXPECT_TRUE(Eventually([&] { return ProcessesMentioning(run.run_dir()).empty(); }, Seconds(10)))
      << "left running: " << ProcessesMentioning(run.run_dir()).size() << " processes";
  EXPECT_TRUE(ProcessesMentioning(ref.run_dir()).empty());

  if (world > 1) {
    // Some attempt's surviving rank lost its peer: its exit file names the
    // collective and the peer, and the restart names who died first.
    int peer_lost = 0;
    for (int k = 1; k <= run.attempts_size(); ++k) {
      for (int r = 0; r < world; ++r) {
        absl::StatusOr<ExitFile> f = ReadExitFile(ExitFilePath(run.run_dir(), k, r));
        if (!f.ok() || f->reason != "peer_lost") continue;
        ++peer_lost;
        EXPECT_THAT(f->message, HasSubstr("collective #")) << "attempt " << k << " rank " << r;
        EXPECT_THAT(f->message, HasSubstr("rank " + std::to_string(1 - r)))
            << "attempt " << k << " rank " << r;
      }
    }
    EXPECT_GT(peer_lost, 0);
    std::vector<v1::RunEvent> events = h.History(id);
    EXPECT_TRUE(HasEvent(events, v1::EVENT_KIND_ATTEMPT_ENDED, "died first")) << Describe(events);
  }
}

TEST(Gang, ChaosWorldSizeOneEndsByteIdenticalToAnUninterruptedRun) { Chaos(1); }

TEST(Gang, ChaosWorldSizeTwoEndsByteIdenticalToAnUninterruptedRun) { Chaos(2); }

TEST(Gang, RankStoppedInsideACollectiveTimesOutItsPeerAndTheGangRestarts) {
  DaemonHarness h;
  UseRealWorker(h, 2);
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(
      GangSpec("stopped", 2, 12, 4,
               "[distributed]\ntimeout_s = 3\n"
               "[testing]\nstop_in_collective_at_step = 6\nonly_rank = 1\nonly_attempt = 1\n"));
  v1::Run run;
  // Rank 1 stops itself; note its pid while it is there.
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return AttemptRunning(r, 2); }, kRunLimit, &run));
  const int stopped_pid = run.attempts(0).ranks(1).pid();
  ASSERT_TRUE(h.WaitForEnd(id, Seconds(300), &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_GE(run.attempts_size(), 2) << Describe(run);
  const v1::Attempt& first = run.attempts(0);
  ASSERT_EQ(first.ranks_size(), 2);
  EXPECT_EQ(first.ranks(0).exit_class(), v1::EXIT_CLASS_PEER_LOST) << Describe(run);
  EXPECT_EQ(first.ranks(0).exit_code(), 76) << Describe(run);
  absl::StatusOr<ExitFile> f = ReadExitFile(ExitFilePath(run.run_dir(), 1, 0));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->reason, "peer_lost");
  EXPECT_THAT(f->message, HasSubstr("rank 1"));
  EXPECT_THAT(f->message, HasSubstr("step 6"));
  std::printf("rank 0's exit: %s\n", f->message.c_str());
  EXPECT_THAT(RankLog(run, 1, 1), HasSubstr("injected SIGSTOP inside the gradient allreduce"));
  // The stopped rank was killed (a stopped process ignores SIGTERM).
  EXPECT_FALSE(ProcessAlive(stopped_pid));
  EXPECT_EQ(first.ranks(1).signal(), SIGKILL) << Describe(run);
  for (const v1::RankStatus& r : run.attempts(run.attempts_size() - 1).ranks()) {
    EXPECT_EQ(r.exit_class(), v1::EXIT_CLASS_SUCCESS);
  }
  // Both ranks evaluate the same model (rank 0's running statistics) and
  // the same majority-class baseline (the gang's class counts).
  std::vector<std::string> evaluations;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<ExitFile> last =
        ReadExitFile(ExitFilePath(run.run_dir(), run.attempts_size(), r));
    ASSERT_TRUE(last.ok()) << last.status();
    const size_t at = last->message.find("val mIoU");
    ASSERT_NE(at, std::string::npos) << last->message;
    evaluations.push_back(last->message.substr(at));
  }
  EXPECT_EQ(evaluations[0], evaluations[1]);
  std::printf("rank 0: %s\nrank 1: %s\n", evaluations[0].c_str(), evaluations[1].c_str());
  EXPECT_TRUE(Eventually([&] { return ProcessesMentioning(run.run_dir()).empty(); }, Seconds(10)));
}

// Rank 0 writes its checkpoints to slow storage (4 s each, twice
// distributed.timeout_s): rank 1 waits for it under
// distributed.checkpoint_timeout_s, so nobody times out and the gang runs
// through in one attempt.
TEST(Gang, ACheckpointSlowerThanTheCollectiveTimeoutDoesNotRestartTheGang) {
  DaemonHarness h;
  UseRealWorker(h, 2);
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(GangSpec("slow-storage", 2, 6, 3,
                        "[distributed]\ntimeout_s = 2\ncheckpoint_timeout_s = 60\n"
                        "[testing]\ncheckpoint_delay_ms = 4000\nonly_rank = 0\n"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, Seconds(300), &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  EXPECT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_THAT(RankLog(run, 1, 1), HasSubstr("checkpoint step-3 (written by rank 0)"));
  EXPECT_THAT(RankLog(run, 1, 1), HasSubstr("checkpoint step-6 (written by rank 0)"));
}

// Background checkpoints in a gang: rank 0's slow write of step-3 (4 s)
// goes on while both ranks train steps 4 and 5; rank 1 learns that it was
// committed from a later step's control collective, not by waiting for
// it; the final checkpoint waits for the write in flight.
TEST(Gang, RanksTrainOnWhileRankZeroWritesACheckpoint) {
  DaemonHarness h;
  UseRealWorker(h, 2);
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(GangSpec(
      "background-ckpt", 2, 8, 3, "[testing]\ncheckpoint_delay_ms = 4000\nonly_rank = 0\n"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, Seconds(300), &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  for (int rank : {0, 1}) {
    const std::string log = RankLog(run, 1, rank);
    const size_t committed = log.find(rank == 0 ? "checkpoint step-3 (written in "
                                                : "checkpoint step-3 (written by rank 0)");
    const size_t step5 = log.find("\nstep 5/8 ");
    ASSERT_NE(committed, std::string::npos) << "rank " << rank << ":\n" << log;
    ASSERT_NE(step5, std::string::npos) << "rank " << rank << ":\n" << log;
    EXPECT_LT(step5, committed) << "rank " << rank << " waited for the write:\n" << log;
    EXPECT_THAT(log, HasSubstr("checkpoint step-6 ")) << "rank " << rank;
    EXPECT_THAT(log, HasSubstr("checkpoint step-8 ")) << "rank " << rank;
  }
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("checkpoint step-3: "));  // the snapshot
}

// Cancel (the daemon's Stop command to every rank, then SIGTERM): the stop
// requests reach the ranks at different moments, but the ranks agree on
// it in the next step's control collective, so both stop after the same
// step, rank 0 writes that step's checkpoint once, and both exit 143.
TEST(Gang, CancelStopsEveryRankAfterTheSameStepWithOneCheckpoint) {
  DaemonHarness h;
  UseRealWorker(h, 2);
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(GangSpec("cancelled", 2, 1000, 0));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return AttemptRunning(r, 2) && r.progress().step() >= 3; },
      Seconds(120), &run));
  v1::CancelRunRequest req;
  req.set_run_id(id);
  req.set_reason("enough");
  auto ctx = h.Context(h.operator_token());
  grpc::Status s = h.stub().CancelRun(ctx.get(), req, &run);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_CANCELLED, Seconds(120), &run));
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  int64_t stopped_at = -1;
  for (int r = 0; r < 2; ++r) {
    const v1::RankStatus& rank = run.attempts(0).ranks(r);
    EXPECT_EQ(rank.exit_code(), 143) << "rank " << r << ": " << Describe(run);
    absl::StatusOr<ExitFile> f = ReadExitFile(ExitFilePath(run.run_dir(), 1, r));
    ASSERT_TRUE(f.ok()) << "rank " << r << ": " << f.status();
    EXPECT_EQ(f->reason, "stopped") << "rank " << r;
    if (r == 0) stopped_at = f->last_step;
    EXPECT_EQ(f->last_step, stopped_at) << "the ranks stopped after different steps";
  }
  ASSERT_GE(stopped_at, 3);
  // One store, one checkpoint: the step both stopped after.
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(RunLayout(run.run_dir()).CheckpointsDir())) {
    steps.push_back(e.path().filename().string());
  }
  EXPECT_EQ(steps, std::vector<std::string>{"step-" + std::to_string(stopped_at)});
  EXPECT_THAT(RankLog(run, 1, 1),
              HasSubstr("checkpoint step-" + std::to_string(stopped_at) + " (written by rank 0)"));
  EXPECT_TRUE(Eventually([&] { return ProcessesMentioning(run.run_dir()).empty(); }, Seconds(10)));
}

// Stragglers (issue 43): in a gang of three, rank 1 computes every step
// 1.5 s longer (testing.slow_step_ms, only_rank = 1). Every rank steps at
// the slow rank's pace, but only rank 1's time outside the collectives is
// long: it is named in a STRAGGLER event with its slot, in the live
// attempt's status (trainctl describe's line) and in /metrics; ranks 0 and
// 2 are not.
TEST(Gang, ASlowedRankIsNamedAStragglerAndTheOthersAreNot) {
  DaemonHarness h;
  UseRealWorker(h, 3);
  const int metrics_port = FreeLoopbackPort();
  h.Set("daemon.metrics_address", "\"127.0.0.1:" + std::to_string(metrics_port) + "\"");
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(GangSpec("straggler", 3, 400, 0,
                        "[distributed]\nstraggler_factor = 2\nstraggler_window_s = 4\n"
                        "[testing]\nslow_step_ms = 1500\nonly_rank = 1\n"));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.attempts_size() > 0 && r.attempts(0).ranks_size() == 3 &&
               r.attempts(0).ranks(1).straggler_ratio() > 0;
      },
      Seconds(180), &run))
      << Describe(run);
  ASSERT_EQ(run.state(), v1::RUN_STATE_RUNNING) << Describe(run);
  const v1::RankStatus& slow = run.attempts(0).ranks(1);
  const std::vector<std::string> base = {TRAINCTL_BIN, "--socket", h.socket_path(), "--token-file",
                                         h.operator_token_path()};
  std::vector<std::string> describe = base;
  describe.insert(describe.end(), {"describe", id});
  CommandResult d = RunCommand(describe, Seconds(30), h.dir() + "/describe");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("rank 1 (slot " + std::to_string(slow.slot()) + "): straggler"));
  for (int other : {0, 2}) {
    EXPECT_THAT(d.out, Not(HasSubstr("rank " + std::to_string(other) + " (slot")));
    EXPECT_EQ(run.attempts(0).ranks(other).straggler_ratio(), 0) << other;
  }
  EXPECT_GT(slow.straggler_ratio(), 2);
  std::string metrics;
  EXPECT_TRUE(Eventually(
      [&] {
        metrics = HttpGet(metrics_port, "/metrics");
        return metrics.find("trainsup_worker_straggler{rank=\"1\",run=\"" + id + "\"} 1") !=
               std::string::npos;
      },
      Seconds(20)))
      << metrics;
  EXPECT_THAT(metrics, HasSubstr("trainsup_worker_straggler{rank=\"0\",run=\"" + id + "\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("trainsup_worker_straggler{rank=\"2\",run=\"" + id + "\"} 0"));
  // The events, once the run has ended (the history stream ends with it).
  v1::CancelRunRequest req;
  req.set_run_id(id);
  req.set_reason("seen");
  auto ctx = h.Context(h.operator_token());
  ASSERT_TRUE(h.stub().CancelRun(ctx.get(), req, &run).ok());
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_CANCELLED, Seconds(120), &run));
  const std::vector<v1::RunEvent> stragglers =
      EventsOfKind(h.History(id), v1::EVENT_KIND_STRAGGLER);
  ASSERT_FALSE(stragglers.empty());
  for (const v1::RunEvent& e : stragglers) {
    EXPECT_EQ(e.rank(), 1) << e.reason();
    std::printf("STRAGGLER event: %s\n", e.reason().c_str());
  }
  EXPECT_THAT(stragglers[0].reason(),
              HasSubstr("rank 1 on slot " + std::to_string(run.attempts(0).ranks(1).slot()) +
                        " is a straggler"));
}

}  // namespace
}  // namespace trainsup::integration
