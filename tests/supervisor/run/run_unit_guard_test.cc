// The run unit's side of the training guard (run_unit_guard.cc): which
// step a diverged attempt rolls back before, the window of data the next
// attempts skip, the learning rate they train at, and the budget's end.
#include "tests/supervisor/run/run_unit_fakes.h"

namespace trainsup::supervisor {
namespace {

RunSpec GuardSpec(int world_size) {
  RunSpec spec;
  spec.world_size = world_size;
  spec.guard.skip_batches = 5;
  spec.guard.max_rollbacks = 2;
  spec.guard.lr_factor_on_rollback = 0.5;
  return spec;
}

// Rank 1 of a gang diverges: its first bad step was 12, and it went on to
// step 20 (bad steps within the guard's window are skipped, not applied).
// Rank 0 is stopped with the gang. The rollback goes before the first bad
// step, the window runs from it to past the last step reached (longer than
// skip_batches), and the next attempt is told both, with the learning rate
// halved.
TEST_F(RunUnitTest, ARollbackGoesBeforeTheFirstBadStepAndSkipsPastTheLastStepReached) {
  auto u = NewUnit(GuardSpec(2));
  std::vector<int> pids = StartAndLaunch(*u);
  Hello(*u, 0);
  Hello(*u, 1);
  const RunLayout layout(dir_.path());
  env_.exit_files[layout.ExitFilePath(1, 1)] =
      ExitFile{79, "diverged", "loss not finite", 20, 0, 12};
  env_.Exit(*u, 1, pids[1], true, 79);
  env_.Settle();
  ASSERT_EQ(env_.signals.size(), 1u) << "rank 0 is stopped with the gang";
  env_.Exit(*u, 0, pids[0], false, SIGTERM);
  env_.Settle();
  ASSERT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(u->run().rollbacks(), 1);
  EXPECT_EQ(u->run().restarts(), 0) << "a rollback counts against its own budget only";
  ASSERT_EQ(u->run().skip_windows_size(), 1);
  const v1::SkipWindow& w = u->run().skip_windows(0);
  EXPECT_EQ(w.first_step(), 12);
  EXPECT_EQ(w.last_step(), 21) << "past step 20, longer than skip_batches";
  EXPECT_EQ(w.attempt(), 1);
  EXPECT_EQ(w.reason(), "loss not finite");
  EXPECT_EQ(env_.rollbacks, 1);
  const std::vector<v1::RunEvent> guard = env_.Stored(v1::EVENT_KIND_GUARD);
  ASSERT_EQ(guard.size(), 1u);
  EXPECT_EQ(guard[0].reason(),
            "rollback 1 of 2: the next attempt resumes from the newest checkpoint before step 12 "
            "and skips the batches of steps 12 to 21, learning rate x0.5");

  env_.Advance(1.1);  // the backoff
  StartAndLaunch(*u);
  ASSERT_EQ(env_.launches.size(), 4u);
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(env_.launches[i].env.at("TRAINSUP_SKIP_WINDOWS"), "12-21");
    EXPECT_EQ(env_.launches[i].env.at("TRAINSUP_LR_FACTOR"), "0.5");
  }
}

// Without an exit file a diverged end rolls back past the last step the
// rank reported (never to step 1, which would send the run to scratch), and
// a window shorter than skip_batches is widened to it.
TEST_F(RunUnitTest, ADivergedEndWithoutAnExitFileRollsBackPastItsLastProgress) {
  auto u = NewUnit(GuardSpec(1));
  std::vector<int> pids = StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  wv1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_progress_counter(9);
  hb.mutable_heartbeat()->mutable_progress()->set_step(9);
  u->OnWorkerMessage(1, 0, link.get(), hb);
  env_.Exit(*u, 0, pids[0], true, 79);
  env_.Settle();
  ASSERT_EQ(u->run().skip_windows_size(), 1);
  EXPECT_EQ(u->run().skip_windows(0).first_step(), 10);
  EXPECT_EQ(u->run().skip_windows(0).last_step(), 14);
  EXPECT_EQ(u->run().skip_windows(0).reason(), "exit 79 without an exit file");
}

// Past guard.max_rollbacks the run fails, naming the first bad step and
// the budget; the windows of both rollbacks reach the second attempt's
// worker, the learning rate halved once per rollback.
TEST_F(RunUnitTest, DivergingPastTheRollbackBudgetFailsTheRun) {
  auto u = NewUnit(GuardSpec(1));
  const RunLayout layout(dir_.path());
  for (int attempt = 1; attempt <= 3; ++attempt) {
    std::vector<int> pids = StartAndLaunch(*u);
    ASSERT_EQ(u->attempt_number(), attempt);
    Hello(*u, 0);
    const int64_t bad = 10 * attempt;
    env_.exit_files[layout.ExitFilePath(attempt, 0)] =
        ExitFile{79, "diverged", "grad not finite", bad, 0, bad};
    env_.Exit(*u, 0, pids[0], true, 79);
    env_.Settle();
    if (attempt < 3) {
      ASSERT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING) << attempt;
      env_.Advance(1.1);
    }
  }
  EXPECT_EQ(env_.launches[2].env.at("TRAINSUP_SKIP_WINDOWS"), "10-14,20-24");
  EXPECT_EQ(env_.launches[2].env.at("TRAINSUP_LR_FACTOR"), "0.25");
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(u->run().reason(), HasSubstr("diverged at step 30 after 2 rollbacks (max 2)"));
  EXPECT_EQ(u->run().rollbacks(), 2);
}

// Issue 46: a divergence that comes back right after the window the last
// rollback skipped is not the data's fault. The next rollback halves the
// learning rate even with lr_factor_on_rollback = 1, and a run out of
// rollbacks says that skipping the data did not help.
TEST_F(RunUnitTest, DivergingAgainRightAfterTheWindowHalvesTheLearningRateThenFails) {
  RunSpec spec = GuardSpec(1);
  spec.guard.lr_factor_on_rollback = 1;
  auto u = NewUnit(spec);
  const RunLayout layout(dir_.path());
  const int64_t bad[] = {3, 8, 13};  // windows 3..7, then 8..12: each right after the last
  for (int attempt = 1; attempt <= 3; ++attempt) {
    std::vector<int> pids = StartAndLaunch(*u);
    Hello(*u, 0);
    const int64_t first = bad[attempt - 1];
    env_.exit_files[layout.ExitFilePath(attempt, 0)] =
        ExitFile{79, "diverged", "loss not finite", first, 0, first};
    env_.Exit(*u, 0, pids[0], true, 79);
    env_.Settle();
    if (attempt < 3) env_.Advance(1.1);
  }
  EXPECT_EQ(env_.launches[1].env.count("TRAINSUP_LR_FACTOR"), 0u) << "the first rollback: data";
  EXPECT_EQ(env_.launches[2].env.at("TRAINSUP_LR_FACTOR"), "0.5");
  ASSERT_EQ(u->run().skip_windows_size(), 2);
  EXPECT_FALSE(u->run().skip_windows(0).lr_halved());
  EXPECT_TRUE(u->run().skip_windows(1).lr_halved());
  const std::vector<v1::RunEvent> guard = env_.Stored(v1::EVENT_KIND_GUARD);
  ASSERT_EQ(guard.size(), 2u);
  EXPECT_THAT(guard[1].reason(),
              HasSubstr("learning rate x0.5 (halved: diverged again at step 8, right after the "
                        "window of steps 3 to 7: the learning rate or the model, not the data)"));
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(u->run().reason(),
              HasSubstr("diverges again after skipping its data: the learning rate or the model, "
                        "not the data; diverged at step 13 after 2 rollbacks (max 2)"));
}

// A rollback window that runs past the run's last step says so.
TEST_F(RunUnitTest, AWindowPastTheLastStepSaysSo) {
  RunSpec spec = GuardSpec(1);
  spec.guard.skip_batches = 20;
  auto u = NewUnit(spec);
  std::vector<int> pids = StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  wv1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_progress_counter(2);
  hb.mutable_heartbeat()->mutable_progress()->set_step(22);
  hb.mutable_heartbeat()->mutable_progress()->set_total_steps(30);
  u->OnWorkerMessage(1, 0, link.get(), hb);
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] =
      ExitFile{79, "diverged", "loss not finite", 23, 0, 23};
  env_.Exit(*u, 0, pids[0], true, 79);
  env_.Settle();
  const std::vector<v1::RunEvent> guard = env_.Stored(v1::EVENT_KIND_GUARD);
  ASSERT_EQ(guard.size(), 1u);
  EXPECT_THAT(guard[0].reason(),
              HasSubstr("skips the batches of steps 23 to 42, past the run's last step 30: its "
                        "remaining 8 steps are all skipped"));
}

// Issue 46: exit 0 with rank 0's tally is judged. A model below the
// majority-class baseline fails (guard.fail_below_baseline, the default);
// with the switch off it succeeds with a GUARD event saying so; a good one
// succeeds with what it trained in its reason.
TEST_F(RunUnitTest, ACompletedRunIsJudgedByWhatItTrained) {
  for (int variant = 0; variant < 3; ++variant) {
    FakeEnv env;
    RunSpec spec;
    spec.guard.fail_below_baseline = variant != 1;
    v1::Run run;
    run.set_run_id("r");
    run.set_state(v1::RUN_STATE_PENDING);
    run.set_world_size(1);
    run.set_run_dir(dir_.path());
    RunUnit u(run, spec, 1, env.env());
    u.Start({0}, {""});
    env.Settle();
    ExitFile done{0, "completed", "completed 30 steps", 30, 0};
    done.tally.steps = 30;
    done.tally.applied = 30;
    done.tally.skipped_window = 0;
    done.tally.skipped_guard = 0;
    done.tally.skipped_scaler = 0;
    done.tally.final_metric = variant == 2 ? 0.41 : 0.0065;
    done.tally.baseline_metric = 0.27;
    env.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] = done;
    env.Exit(u, 0, u.ranks()[0].pid, true, 0);
    env.Settle();
    if (variant == 0) {
      EXPECT_EQ(u.run().state(), v1::RUN_STATE_FAILED);
      EXPECT_THAT(u.run().reason(), HasSubstr("below the majority-class baseline"));
    } else {
      EXPECT_EQ(u.run().state(), v1::RUN_STATE_SUCCEEDED) << variant;
      EXPECT_THAT(u.run().reason(),
                  HasSubstr("every rank completed; trained 30 of 30 steps (0 skipped"));
      EXPECT_EQ(env.Stored(v1::EVENT_KIND_GUARD).size(), variant == 1 ? 1u : 0u);
    }
    EXPECT_EQ(u.run().progress().tally().final_metric(), done.tally.final_metric);
    // No heartbeat came (a short attempt): the step target is the spec's,
    // not "step 30/?".
    EXPECT_EQ(u.run().progress().step(), 30);
    EXPECT_EQ(u.run().progress().total_steps(), spec.train.steps);
  }
}

}  // namespace
}  // namespace trainsup::supervisor
