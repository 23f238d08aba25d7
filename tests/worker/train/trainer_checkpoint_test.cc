// Checkpoints and precision of the training loop: a save that fails does
// not end training, no space for the final one exits 74, background
// checkpoints let the next steps train while they are written, a run
// resumes at another precision, and fp16's loss scaler tells an overflow
// from a bad step and resumes exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
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

// Train() with `spec` in a fresh run directory (removed after), its logs
// joined and the weights digest line.
struct Ran {
  TrainerResult result;
  std::string logs, digest;
};
Ran RunOnce(const RunSpec& spec, const std::string& name, const std::string& dir = "",
            const std::string& resume = "none") {
  Captured c;
  TrainerOptions options;
  options.run_dir = dir.empty() ? RunDir(name) : dir;
  options.resume = resume;
  Ran r;
  r.result = worker::Train(spec, options, c.Hooks());
  sparse::ApplyAllocatorSettings(sparse::AllocatorSettings{});
  for (const std::string& line : c.logs) r.logs += line + "\n";
  const int64_t d = FirstLine(c.logs, "weights digest ");
  if (d >= 0) r.digest = c.logs[d];
  if (dir.empty()) std::filesystem::remove_all(options.run_dir);
  return r;
}

// fp16 on the synthetic rooms for `steps` steps, with the fault that looks
// like an overflow (a NaN gradient under a finite loss) at step 3.
RunSpec Fp16WithAnOverflowAtStep3(int64_t steps) {
  RunSpec spec = SyntheticSpec(4, 0.1, steps);
  spec.testing.nan_grad_at_step = 3;
  spec.train.precision = "fp16";
  return spec;
}

// testing.nan_grad_at_step under fp16 is what an overflow looks like: a
// non-finite gradient under a finite loss. The loss scaler skips the step
// and halves its scale; the run completes with one scaler skip and no bad
// step. Under fp32 the same fault is a bad step for the guard.
TEST(Train, Fp16SkipsAnOverflowWhereFp32JudgesABadStep) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = Fp16WithAnOverflowAtStep3(6);
  const Ran fp16 = RunOnce(spec, "fp16_overflow");
  ASSERT_EQ(fp16.result.exit_code, 0) << fp16.result.message << "\n" << fp16.logs;
  EXPECT_NE(fp16.logs.find("step 3 skipped by the loss scaler: gradient overflow at scale 65536, "
                           "the scale goes to 32768 (not a bad step)"),
            std::string::npos)
      << fp16.logs;
  EXPECT_EQ(fp16.logs.find("not applied"), std::string::npos) << fp16.logs;
  EXPECT_EQ(fp16.result.tally.skipped_scaler, 1);
  EXPECT_EQ(fp16.result.tally.skipped_guard, 0);
  EXPECT_EQ(fp16.result.tally.applied, 5);
  spec.train.precision = "fp32";
  const Ran fp32 = RunOnce(spec, "fp32_bad_step");
  ASSERT_EQ(fp32.result.exit_code, 0) << fp32.result.message;
  EXPECT_NE(fp32.logs.find("step 3 not applied (not finite)"), std::string::npos) << fp32.logs;
  EXPECT_EQ(fp32.result.tally.skipped_scaler, 0);
  EXPECT_EQ(fp32.result.tally.skipped_guard, 1);
}

// An overflow that would halve the scale below guard.min_loss_scale is
// divergence: exit 79 naming the overflow's step, as a bad step's would.
TEST(Train, Fp16OverflowBelowTheScaleFloorDivergesWithExit79) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = Fp16WithAnOverflowAtStep3(6);
  spec.train.loss_scale_init = 1024;
  spec.guard.min_loss_scale = 1024;
  const Ran r = RunOnce(spec, "fp16_floor");
  EXPECT_EQ(r.result.exit_code, 79) << r.result.message << "\n" << r.logs;
  EXPECT_EQ(r.result.first_bad_step, 3);
  EXPECT_NE(r.result.message.find("diverged at step 3: the loss scaler overflowed at every step "
                                  "since (the scale would fall to 512, below "
                                  "guard.min_loss_scale 1024"),
            std::string::npos)
      << r.result.message;
}

// The scaler's state is in the checkpoint: a run stopped after step 4 (its
// scale halved at step 3) and resumed ends with the weights of the run
// that went through, bit for bit.
TEST(Train, Fp16ResumesExactlyWithItsLossScale) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = Fp16WithAnOverflowAtStep3(8);
  spec.train.checkpoint_every_steps = 4;
  const Ran through = RunOnce(spec, "fp16_through");
  ASSERT_EQ(through.result.exit_code, 0) << through.result.message;
  const std::string dir = RunDir("fp16_resumed");
  spec.train.steps = 4;
  const Ran first = RunOnce(spec, "", dir);
  ASSERT_EQ(first.result.exit_code, 0) << first.result.message;
  spec.train.steps = 8;
  const Ran second = RunOnce(spec, "", dir, "latest");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(second.result.exit_code, 0) << second.result.message << "\n" << second.logs;
  EXPECT_NE(second.logs.find("loss scale 32768 (1 finite steps since it last changed)"),
            std::string::npos)
      << second.logs;
  ASSERT_FALSE(through.digest.empty());
  EXPECT_EQ(second.digest, through.digest);
}

}  // namespace
}  // namespace trainsup::worker
