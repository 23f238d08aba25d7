// The training guard's judgement (worker/train/guard.h), torch-free: non-finite
// values, spikes against the median of applied steps, divergence within a
// window, and the state a resumed attempt carries on with.
#include "worker/train/guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace trainsup::worker {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

GuardSpec Spec() {
  GuardSpec g;
  g.spike_factor = 4;
  g.spike_window = 5;
  g.spike_warmup = 5;
  g.max_bad_steps = 3;
  g.bad_window = 10;
  return g;
}

TEST(StepGuard, NonFiniteLossOrGradientIsNotAppliedAndSaysWhatItSaw) {
  StepGuard guard(Spec());
  EXPECT_EQ(guard.Judge(1, 2.0, 1.0).verdict, StepVerdict::kApply);
  GuardDecision d = guard.Judge(2, kNan, 1.0);
  EXPECT_EQ(d.verdict, StepVerdict::kNonFinite);
  EXPECT_EQ(d.seen, "loss nan");
  d = guard.Judge(3, 2.0, kInf);
  EXPECT_EQ(d.verdict, StepVerdict::kNonFinite);
  EXPECT_EQ(d.seen, "gradient norm inf (loss 2)");
  EXPECT_FALSE(d.diverged);
  EXPECT_EQ(guard.Judge(4, -kInf, 1.0).verdict, StepVerdict::kNonFinite);
  d = guard.Judge(5, 2.0, 1.0, /*stats_finite=*/false);
  EXPECT_EQ(d.verdict, StepVerdict::kNonFinite);
  EXPECT_EQ(d.seen, "BatchNorm running statistics not finite (loss 2)");
  EXPECT_EQ(guard.Judge(6, 2.0, -kNan).seen, "gradient norm nan (loss 2)");
}

TEST(StepGuard, ASpikeIsJudgedAgainstTheMedianOfAppliedStepsAfterTheWarmUp) {
  StepGuard guard(Spec());
  // During the warm-up (5 applied steps) nothing is a spike.
  const double losses[] = {2.0, 100.0, 2.2, 1.8, 2.0};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(guard.Judge(i + 1, losses[i], 1.0).verdict, StepVerdict::kApply) << i;
  }
  EXPECT_EQ(guard.Median(), 2.0);
  EXPECT_EQ(guard.Judge(6, 7.9, 1.0).verdict, StepVerdict::kApply);  // under 4 x 2.0
  // The window is now {100, 2.2, 1.8, 2.0, 7.9}: median 2.2.
  EXPECT_DOUBLE_EQ(guard.Median(), 2.2);
  GuardDecision d = guard.Judge(7, 9.0, 1.0);
  EXPECT_EQ(d.verdict, StepVerdict::kSpike);
  EXPECT_EQ(d.seen, "loss 9 is 4.1 times the median 2.2 of the last 5 steps");
  // A spike is not applied: the window is unchanged.
  EXPECT_DOUBLE_EQ(guard.Median(), 2.2);
}

TEST(StepGuard, SpikesOffWithFactorZeroAndFiniteChecksOffWithCheckFinite) {
  GuardSpec g = Spec();
  g.spike_factor = 0;
  g.check_finite = false;
  StepGuard guard(g);
  for (int i = 1; i <= 6; ++i) guard.Judge(i, 1.0, 1.0);
  EXPECT_EQ(guard.Judge(7, 1e9, 1.0).verdict, StepVerdict::kApply);
  EXPECT_EQ(guard.Judge(8, 1.0, kNan).verdict, StepVerdict::kApply);
  // An applied NaN never enters the loss window: the median stays a
  // number, and the state round-trips (JSON has no NaN).
  EXPECT_EQ(guard.Judge(9, kNan, 1.0).verdict, StepVerdict::kApply);
  EXPECT_EQ(guard.Median(), 1.0);
  StepGuard back(g);
  EXPECT_TRUE(back.FromJson(nlohmann::json::parse(guard.ToJson().dump())).ok());
}

TEST(StepGuard, MaxBadStepsWithinTheWindowDivergeNamingTheFirst) {
  StepGuard guard(Spec());
  for (int i = 1; i <= 5; ++i) guard.Judge(i, 1.0, 1.0);
  EXPECT_EQ(guard.oldest_bad_step(), -1);
  EXPECT_FALSE(guard.Judge(6, kNan, 1.0).diverged);
  EXPECT_EQ(guard.oldest_bad_step(), 6);
  // Step 6 falls out of the 10-step window at step 16.
  for (int i = 7; i <= 15; ++i) guard.Judge(i, 1.0, 1.0);
  EXPECT_FALSE(guard.Judge(16, kNan, 1.0).diverged);
  EXPECT_FALSE(guard.Judge(17, 1.0, kNan).diverged);
  GuardDecision d = guard.Judge(18, 50.0, 1.0);  // a spike: 50 > 4 x 1
  EXPECT_EQ(d.verdict, StepVerdict::kSpike);
  ASSERT_TRUE(d.diverged);
  EXPECT_EQ(d.first_bad_step, 16);
  EXPECT_EQ(guard.oldest_bad_step(), 16);
  EXPECT_EQ(d.diverged_message,
            "diverged at step 16: 3 bad steps within 10 (step 16: loss nan; step 17: gradient "
            "norm nan (loss 1); step 18: loss 50 is 50.0 times the median 1 of the last 5 steps)");
}

TEST(StepGuard, OneBadStepDivergesWithMaxBadStepsOne) {
  GuardSpec g = Spec();
  g.max_bad_steps = 1;
  StepGuard guard(g);
  GuardDecision d = guard.Judge(1, kNan, kNan);
  EXPECT_TRUE(d.diverged);
  EXPECT_EQ(d.first_bad_step, 1);
}

TEST(StepGuard, StateRoundTripsSoAResumedAttemptJudgesAlike) {
  StepGuard a(Spec());
  for (int i = 1; i <= 7; ++i) a.Judge(i, 1.0 + i, 1.0);
  a.Judge(8, kNan, 1.0);
  StepGuard b(Spec());
  ASSERT_TRUE(b.FromJson(nlohmann::json::parse(a.ToJson().dump())).ok());
  EXPECT_EQ(b.Median(), a.Median());
  GuardDecision da = a.Judge(9, kNan, 1.0), db = b.Judge(9, kNan, 1.0);
  EXPECT_EQ(da.diverged, db.diverged);
  GuardDecision ea = a.Judge(10, 100.0, 1.0), eb = b.Judge(10, 100.0, 1.0);
  EXPECT_EQ(ea.verdict, StepVerdict::kSpike);
  EXPECT_EQ(eb.verdict, StepVerdict::kSpike);
  EXPECT_TRUE(ea.diverged);
  EXPECT_EQ(ea.diverged_message, eb.diverged_message);
  EXPECT_FALSE(b.FromJson(nlohmann::json{{"losses", "x"}}).ok());
}

}  // namespace
}  // namespace trainsup::worker
