// A divergence that comes back right after its window lowers the learning
// rate (issue 46).
#include "supervisor/policy/rollback.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

TEST(DivergesAgainAfterItsWindow, FromTheWindowsStartToSkipBatchesPastItsEnd) {
  // The run: window 3..22, diverged again at 23.
  EXPECT_TRUE(DivergesAgainAfterItsWindow(3, 22, 23, 20));
  EXPECT_TRUE(DivergesAgainAfterItsWindow(3, 22, 42, 20));
  EXPECT_FALSE(DivergesAgainAfterItsWindow(3, 22, 43, 20)) << "well past: new data, new trouble";
  EXPECT_FALSE(DivergesAgainAfterItsWindow(30, 49, 12, 20)) << "before the window";
  EXPECT_TRUE(DivergesAgainAfterItsWindow(3, 22, 23, 0)) << "at least the next step";
}

TEST(RollbackLrFactor, HalvedPerRecurrenceOnTopOfTheSpecsFactor) {
  EXPECT_DOUBLE_EQ(RollbackLrFactor(1, 2, 0), 1);
  EXPECT_DOUBLE_EQ(RollbackLrFactor(1, 2, 1), 0.5);
  EXPECT_DOUBLE_EQ(RollbackLrFactor(0.5, 2, 2), 0.0625);
  EXPECT_DOUBLE_EQ(RollbackLrFactor(1e-6, 5, 0), 1e-12) << "never 0";
}

}  // namespace
}  // namespace trainsup::supervisor
