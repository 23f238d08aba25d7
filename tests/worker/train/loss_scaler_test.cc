// fp16's loss scaler (worker/train/loss_scaler.h): GradScaler's halving
// and growth, the two rules that make overflows divergence, and its state
// through a checkpoint.
#include "worker/train/loss_scaler.h"

#include <gtest/gtest.h>

namespace trainsup::worker {
namespace {

TEST(LossScaler, HalvesOnAnOverflowAndGrowsAfterTheIntervalOfFiniteSteps) {
  LossScaler s({/*init_scale=*/1024, /*growth_interval=*/3, /*max_overflow_streak=*/5,
                /*min_scale=*/1});
  EXPECT_EQ(s.scale(), 1024);
  LossScaler::Overflow o = s.Overflowed(7);
  EXPECT_FALSE(o.diverged);
  EXPECT_EQ(o.from, 1024);
  EXPECT_EQ(o.to, 512);
  EXPECT_EQ(o.first_step, 7);
  EXPECT_FALSE(s.Good());
  EXPECT_FALSE(s.Good());
  EXPECT_TRUE(s.Good());  // the third finite step in a row
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.good_steps(), 0);
  // An overflow restarts the count towards growth.
  EXPECT_FALSE(s.Good());
  s.Overflowed(20);
  EXPECT_FALSE(s.Good());
  EXPECT_FALSE(s.Good());
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScaler, OverflowsInARowAreDivergenceNamingTheFirst) {
  LossScaler s({65536, 2000, /*max_overflow_streak=*/3, 1});
  EXPECT_FALSE(s.Overflowed(10).diverged);
  s.Good();  // a finite step ends the streak that began at 10
  EXPECT_FALSE(s.Overflowed(12).diverged);
  EXPECT_FALSE(s.Overflowed(13).diverged);
  const LossScaler::Overflow o = s.Overflowed(14);
  EXPECT_TRUE(o.diverged);
  EXPECT_EQ(o.first_step, 12);
  EXPECT_EQ(o.why, "3 overflows in a row (guard.max_overflow_streak)");
}

TEST(LossScaler, AScaleBelowTheFloorIsDivergence) {
  LossScaler s({4, 2000, 20, /*min_scale=*/2});
  EXPECT_FALSE(s.Overflowed(1).diverged);  // 4 -> 2
  const LossScaler::Overflow o = s.Overflowed(2);
  EXPECT_TRUE(o.diverged);
  EXPECT_EQ(o.why, "the scale would fall to 1, below guard.min_loss_scale 2");
  EXPECT_EQ(o.first_step, 1);
}

TEST(LossScaler, ItsStateRoundTripsThroughACheckpoint) {
  LossScaler a({65536, 2000, 20, 1});
  a.Overflowed(3);
  a.Good();
  a.Good();
  LossScaler b({65536, 2000, 20, 1});
  b.FromJson(nlohmann::json::parse(a.ToJson().dump()));
  EXPECT_EQ(b.scale(), 32768);
  EXPECT_EQ(b.good_steps(), 2);
  EXPECT_EQ(b.ToJson(), a.ToJson());
  LossScaler c({65536, 2000, 20, 1});
  c.FromJson(nlohmann::json::parse(R"({"scale": -1})"));  // malformed: kept
  EXPECT_EQ(c.scale(), 65536);
}

}  // namespace
}  // namespace trainsup::worker
