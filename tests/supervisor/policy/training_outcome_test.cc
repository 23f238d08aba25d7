// SUCCEEDED means trained (issue 46): the judgement of a completed run from
// its rank 0's tally and the spec's guard.
#include "supervisor/policy/training_outcome.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

TrainingTally Tally(int64_t steps, int64_t window, int64_t guard, double metric = -1,
                    double baseline = -1) {
  TrainingTally t;
  t.steps = steps;
  t.skipped_window = window;
  t.skipped_guard = guard;
  t.skipped_scaler = 0;
  t.applied = steps - window - guard;
  t.final_metric = metric;
  t.baseline_metric = baseline;
  return t;
}

TEST(JudgeTraining, NoTallyIsTrainedWithoutASummary) {
  const TrainingVerdict v = JudgeTraining(TrainingTally{}, GuardSpec{});
  EXPECT_TRUE(v.trained);
  EXPECT_EQ(v.summary, "");
}

// The run the issue found: 30 steps, about 4 applied, val mIoU 0.0065
// against a baseline of 0.27.
TEST(JudgeTraining, MostStepsSkippedIsNotTrained) {
  const TrainingVerdict v = JudgeTraining(Tally(30, 20, 6, 0.0065, 0.27), GuardSpec{});
  EXPECT_FALSE(v.trained);
  EXPECT_EQ(v.reason,
            "trained 4 of 30 steps (26 skipped: 20 in windows, 6 by the guard, 0 by the loss "
            "scaler); val mIoU 0.0065 against the majority-class baseline's 0.27: more than "
            "guard.max_skipped_fraction 0.1 of the steps skipped");
}

TEST(JudgeTraining, TheFractionIsTheSpecs) {
  GuardSpec g;
  EXPECT_TRUE(JudgeTraining(Tally(100, 10, 0), g).trained) << "10% is not more than 10%";
  EXPECT_FALSE(JudgeTraining(Tally(100, 10, 1), g).trained);
  g.max_skipped_fraction = 1;
  EXPECT_TRUE(JudgeTraining(Tally(100, 90, 10), g).trained);
  g.max_skipped_fraction = 0;
  EXPECT_FALSE(JudgeTraining(Tally(100, 0, 1), g).trained);
}

TEST(JudgeTraining, BelowTheBaselineFailsUnlessTheSpecSaysNot) {
  GuardSpec g;
  TrainingVerdict v = JudgeTraining(Tally(100, 2, 0, 0.20, 0.27), g);
  EXPECT_FALSE(v.trained);
  EXPECT_NE(v.reason.find("below the majority-class baseline (guard.fail_below_baseline)"),
            std::string::npos)
      << v.reason;
  g.fail_below_baseline = false;
  v = JudgeTraining(Tally(100, 2, 0, 0.20, 0.27), g);
  EXPECT_TRUE(v.trained);
  EXPECT_NE(v.warning.find("SUCCEEDED: guard.fail_below_baseline is false"), std::string::npos);
  v = JudgeTraining(Tally(100, 2, 0, 0.41, 0.27), GuardSpec{});
  EXPECT_TRUE(v.trained);
  EXPECT_EQ(v.warning, "");
  EXPECT_EQ(v.summary,
            "trained 98 of 100 steps (2 skipped: 2 in windows, 0 by the guard, 0 by the loss "
            "scaler); val mIoU 0.41 against the majority-class baseline's 0.27");
}

}  // namespace
}  // namespace trainsup::supervisor
