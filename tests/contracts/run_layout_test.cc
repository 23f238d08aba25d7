#include "contracts/run_layout.h"

#include <gtest/gtest.h>

#include "contracts/exit_codes.h"

namespace trainsup {
namespace {

TEST(RunLayout, NamesEveryFileOfTheContract) {
  const RunLayout run("/var/lib/trainsup/runs/r-1");
  EXPECT_EQ(run.SpecPath(), "/var/lib/trainsup/runs/r-1/spec.toml");
  EXPECT_EQ(run.AttemptsDir(), "/var/lib/trainsup/runs/r-1/attempts");
  EXPECT_EQ(run.AttemptDir(3), "/var/lib/trainsup/runs/r-1/attempts/3");
  EXPECT_EQ(run.LogPath(3, 1), "/var/lib/trainsup/runs/r-1/attempts/3/rank-1.log");
  EXPECT_EQ(run.ExitFilePath(3, 1), "/var/lib/trainsup/runs/r-1/attempts/3/rank-1.exit.json");
  EXPECT_EQ(run.CheckpointsDir(), "/var/lib/trainsup/runs/r-1/checkpoints");
}

// One store per run whatever the world size: rank 0 writes it, every rank
// resumes from it (issue 12).
TEST(RunLayout, EveryRankOfEveryWorldSizeSharesTheRunsOneCheckpointStore) {
  const RunLayout run("/r");
  EXPECT_EQ(run.CheckpointRoot(0, 1), "/r/checkpoints");
  EXPECT_EQ(run.CheckpointRoot(0, 2), "/r/checkpoints");
  EXPECT_EQ(run.CheckpointRoot(1, 2), "/r/checkpoints");
  EXPECT_EQ(run.CheckpointRoot(7, 8), "/r/checkpoints");
}

TEST(StateLayout, NamesTheDaemonsFiles) {
  const StateLayout state("/var/lib/trainsup");
  EXPECT_EQ(state.StorePath(), "/var/lib/trainsup/trainsupd.db");
  EXPECT_EQ(state.DefaultSocketPath(), "/var/lib/trainsup/run/trainsupd.sock");
  EXPECT_EQ(state.TokenPath("operator"), "/var/lib/trainsup/auth/operator.token");
  EXPECT_EQ(state.RunDir("r-1"), "/var/lib/trainsup/runs/r-1");
}

TEST(StateLayout, RootAndTrailingSlashesGiveOneSlash) {
  EXPECT_EQ(StateLayout("/").DefaultSocketPath(), "/run/trainsupd.sock");
  EXPECT_EQ(StateLayout("/").RunDir("a"), "/runs/a");
  EXPECT_EQ(StateLayout("/srv/state/").StorePath(), "/srv/state/trainsupd.db");
  EXPECT_EQ(RunLayout("/").SpecPath(), "/spec.toml");
  EXPECT_EQ(JoinPaths("a/", "/b"), "a/b");
  EXPECT_EQ(JoinPaths("", "b"), "b");
  EXPECT_EQ(JoinPaths("a", ""), "a");
}

TEST(ExitCodes, AreTheContractsAndRoundTrip) {
  EXPECT_EQ(ExitStatus(WorkerExit::kCompleted), 0);
  EXPECT_EQ(ExitStatus(WorkerExit::kUsage), 64);
  EXPECT_EQ(ExitStatus(WorkerExit::kData), 65);
  EXPECT_EQ(ExitStatus(WorkerExit::kNoSpace), 74);
  EXPECT_EQ(ExitStatus(WorkerExit::kOom), 75);
  EXPECT_EQ(ExitStatus(WorkerExit::kPeerLost), 76);
  EXPECT_EQ(ExitStatus(WorkerExit::kStopped), 143);
  for (WorkerExit code :
       {WorkerExit::kCompleted, WorkerExit::kUsage, WorkerExit::kData, WorkerExit::kNoSpace,
        WorkerExit::kOom, WorkerExit::kPeerLost, WorkerExit::kStopped}) {
    EXPECT_EQ(WorkerExitFromStatus(ExitStatus(code)), code);
    EXPECT_EQ(WorkerExitFromString(ToString(code)), code);
    EXPECT_NE(Describe(code), "unknown exit code");
  }
  EXPECT_EQ(ToString(WorkerExit::kNoSpace), "no_space");
  EXPECT_EQ(ToString(WorkerExit::kPeerLost), "peer_lost");
  EXPECT_EQ(Describe(WorkerExit::kPeerLost),
            "a peer rank died or stopped answering inside a collective");
  EXPECT_EQ(WorkerExitFromStatus(76), WorkerExit::kPeerLost);
  EXPECT_FALSE(WorkerExitFromStatus(1).has_value());
  EXPECT_FALSE(WorkerExitFromStatus(255).has_value());
  EXPECT_FALSE(WorkerExitFromString("crash").has_value());
}

TEST(CrashReason, WordsRoundTripAndNoOtherIsOne) {
  for (CrashReason r : {CrashReason::kCheckpointFailed, CrashReason::kCheckpointIo,
                        CrashReason::kCheckpointCorrupt, CrashReason::kError}) {
    EXPECT_EQ(CrashReasonFromString(ToString(r)), r) << ToString(r);
    // A crash reason is never a contract code's word, so an exit file's
    // reason reads one way only.
    EXPECT_FALSE(WorkerExitFromString(ToString(r)).has_value()) << ToString(r);
  }
  EXPECT_EQ(ToString(CrashReason::kCheckpointIo), "checkpoint_io");
  EXPECT_EQ(ToString(CrashReason::kCheckpointCorrupt), "checkpoint_corrupt");
  EXPECT_EQ(ToString(CrashReason::kCheckpointFailed), "checkpoint_failed");
  EXPECT_EQ(ToString(CrashReason::kError), "error");
  EXPECT_FALSE(CrashReasonFromString("oom").has_value());
}

}  // namespace
}  // namespace trainsup
