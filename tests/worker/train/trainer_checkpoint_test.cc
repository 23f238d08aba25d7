// Checkpoints of the training loop: a save that fails does not end
// training, no space for the final one exits 74, background checkpoints
// let the next steps train while they are written, and a run resumes at
// another precision.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/store.h"
#include "sparse/memory.h"
#include "tests/worker/train/trainer_test_util.h"
#include "worker/train/trainer.h"

namespace trainsup::worker {
namespace {

// A save that fails (a full disk) does not end training: it is reported
// (checkpoint_failed, the heartbeat's checkpoint_failures and
// last_checkpoint_error) and the next interval's save is tried again.
TEST(Train, AFailedCheckpointIsReportedAndTrainingGoesOn) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = SyntheticSpec(4, 0.05, 8);
  spec.train.checkpoint_every_steps = 2;
  spec.train.keep_checkpoints = 10;
  CheckpointFaults t("ckpt_fails_once");
  TrainerResult r = t.Train(spec, /*full_after=*/2, /*failures_until_space=*/1);
  ASSERT_EQ(r.exit_code, 0) << r.reason << ": " << r.message;
  EXPECT_EQ(r.last_step, 8);
  ASSERT_EQ(t.failed.size(), 1u);
  EXPECT_EQ(t.failed[0].step, 4);
  EXPECT_EQ(t.failed[0].last_good, 2);
  EXPECT_NE(t.failed[0].error.find("No space left on device"), std::string::npos)
      << t.failed[0].error;
  EXPECT_TRUE(t.Committed(2));
  EXPECT_FALSE(t.Committed(4));
  EXPECT_TRUE(t.Committed(6));
  EXPECT_TRUE(t.Committed(8));
  bool reported = false;
  for (const v1::Progress& p : t.reports) {
    reported |= p.checkpoint_failures() == 1 &&
                p.last_checkpoint_error().find("No space left") != std::string::npos &&
                p.last_checkpoint_step() == 2;
  }
  EXPECT_TRUE(reported) << "no progress report carried the failure";
  EXPECT_EQ(t.reports.back().checkpoint_failures(), 1);
  EXPECT_EQ(t.reports.back().last_checkpoint_error(), "");
  EXPECT_EQ(t.reports.back().last_checkpoint_step(), 8);
}

// No space for the final checkpoint: exit 74 (no_space) saying so, after
// training every step, with the last good checkpoint kept.
TEST(Train, NoSpaceForTheFinalCheckpointExits74) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = SyntheticSpec(4, 0.05, 6);
  spec.train.checkpoint_every_steps = 2;
  CheckpointFaults t("ckpt_no_space");
  TrainerResult r = t.Train(spec, /*full_after=*/2, /*failures_until_space=*/-1);
  EXPECT_EQ(r.exit_code, 74) << r.message;
  EXPECT_EQ(r.reason, "no_space");
  EXPECT_EQ(r.last_step, 6);
  const std::string root = t.run_dir + "/checkpoints";
  EXPECT_NE(
      r.message.find("no space left in " + root + " for checkpoint step-6 at the end of the run"),
      std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("the newest checkpoint kept is step-2"), std::string::npos) << r.message;
  ASSERT_EQ(t.failed.size(), 2u);  // steps 4 and 6
  EXPECT_EQ(t.failed[1].step, 6);
  ckpt::CheckpointStore store(root);
  EXPECT_TRUE(store.Verify({2, root + "/step-2"}).ok());
}

// Background checkpoints (train.background_checkpoints, the default): a
// slow write (testing.checkpoint_delay_ms on the writer thread) goes on
// while the next steps train; the next periodic checkpoint and the final
// one wait for it; every checkpoint is committed; and the weights end as
// with checkpoints written between steps, where the same slow write holds
// training up.
TEST(Train, CheckpointsAreWrittenWhileTheNextStepsTrain) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = SyntheticSpec(4, 0.05, 8);
  spec.train.checkpoint_every_steps = 3;
  spec.train.keep_checkpoints = 10;
  spec.testing.checkpoint_delay_ms = 2000;
  std::string digest[2];
  for (bool background : {true, false}) {
    spec.train.background_checkpoints = background;
    CheckpointFaults t(background ? "background_ckpt" : "sync_ckpt");
    TrainerResult r = t.Train(spec, /*full_after=*/-1, /*failures_until_space=*/-1);
    ASSERT_EQ(r.exit_code, 0) << r.reason << ": " << r.message;
    const std::vector<std::string>& logs = t.captured.logs;
    std::string all;
    for (const std::string& line : logs) all += line + "\n";
    for (int64_t step : {3, 6, 8}) EXPECT_TRUE(t.Committed(step)) << step << "\n" << all;
    EXPECT_TRUE(t.failed.empty()) << all;
    const int64_t written = FirstLine(logs, "checkpoint step-3 (written in ");
    const int64_t step4 = FirstLine(logs, "step 4/8");
    ASSERT_GE(written, 0) << all;
    ASSERT_GE(step4, 0) << all;
    if (background) {
      EXPECT_GE(FirstLine(logs, "checkpoint step-3: "), 0) << all;  // the snapshot's line
      EXPECT_LT(step4, written) << "step 4 did not train while step-3 was written:\n" << all;
    } else {
      EXPECT_LT(written, step4) << all;
    }
    const int64_t d = FirstLine(logs, "weights digest ");
    ASSERT_GE(d, 0) << all;
    digest[background ? 0 : 1] = logs[d];
  }
  EXPECT_EQ(digest[0], digest[1]);
}

// Checkpoints hold the float32 master weights: a run resumes at another
// precision, in both directions, and learns its own memory model.
TEST(Train, ResumesAtAnotherPrecisionInBothDirections) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  for (const std::string first : {"fp32", "bf16"}) {
    const std::string second = first == "fp32" ? "bf16" : "fp32";
    SCOPED_TRACE(first + " then " + second);
    CheckpointFaults t("precision_" + first);
    RunSpec spec = SyntheticSpec(4, 0.1, 4);
    spec.train.checkpoint_every_steps = 2;
    spec.train.precision = first;
    TrainerResult r = t.Train(spec, -1, -1);
    ASSERT_EQ(r.exit_code, 0) << r.message;
    ASSERT_TRUE(t.Committed(4));
    spec.train.steps = 6;
    spec.train.precision = second;
    TrainerOptions options;
    options.run_dir = t.run_dir;
    options.resume = "latest";
    options.attempt = 2;
    Captured c;
    r = worker::Train(spec, options, c.Hooks());
    sparse::ApplyAllocatorSettings(sparse::AllocatorSettings{});
    std::string all;
    for (const std::string& line : c.logs) all += line + "\n";
    ASSERT_EQ(r.exit_code, 0) << r.message << "\n" << all;
    EXPECT_EQ(r.last_step, 6);
    EXPECT_NE(all.find("resumed from step 4"), std::string::npos) << all;
    EXPECT_NE(all.find("precision " + second + ": "), std::string::npos) << all;
    EXPECT_NE(all.find("memory model was learnt at " + first + "; this run trains at " + second),
              std::string::npos)
        << all;
    EXPECT_TRUE(std::isfinite(r.val_miou) || r.val_miou == -1);
    EXPECT_TRUE(t.Committed(6));
  }
}

}  // namespace
}  // namespace trainsup::worker
