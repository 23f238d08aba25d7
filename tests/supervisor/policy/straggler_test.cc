// Straggler detection as a function of samples and times: a rank slower by
// more than the factor over the whole window is named, the others are not;
// a rank is judged only after a whole window, compares to the others'
// median (so a gang of two works), and recovers when it speeds up.
#include "supervisor/policy/straggler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace trainsup::supervisor {
namespace {

// `ranks` ranks report one sample each second from t = 0 to `until`;
// rank `slow` takes `slow_s`, the others 0.1 s (plus a little noise).
void Feed(StragglerDetector& d, int ranks, int slow, double slow_s, double from, double until) {
  for (double t = from; t <= until; t += 1) {
    for (int r = 0; r < ranks; ++r) {
      const double jitter = 0.01 * ((static_cast<int>(t) + r) % 3);
      d.Observe(r, t, r == slow ? slow_s : 0.1 + jitter);
    }
  }
}

TEST(StragglerDetector, NamesTheSlowRankAfterAWholeWindowAndOnlyIt) {
  StragglerDetector d(2.0, 10);
  Feed(d, 4, 2, 0.5, 0, 5);
  EXPECT_TRUE(d.Judge(5).empty()) << "half a window: no verdict yet";
  Feed(d, 4, 2, 0.5, 6, 12);
  std::vector<StragglerDetector::Change> changes = d.Judge(12);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 2);
  EXPECT_TRUE(changes[0].straggler);
  EXPECT_DOUBLE_EQ(changes[0].median_s, 0.5);
  EXPECT_NEAR(changes[0].others_s, 0.11, 0.011);
  EXPECT_TRUE(d.straggler(2));
  EXPECT_GT(d.ratio(2), 4);
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(d.straggler(r)) << r;
    EXPECT_EQ(d.ratio(r), 0) << r;
  }
  EXPECT_TRUE(d.Judge(12).empty()) << "no change, no event";
  // It speeds up: once its window holds only fast samples, it recovers.
  Feed(d, 4, -1, 0, 13, 24);
  changes = d.Judge(24);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 2);
  EXPECT_FALSE(changes[0].straggler);
}

TEST(StragglerDetector, BelowTheFactorIsNotAStraggler) {
  StragglerDetector d(2.0, 10);
  Feed(d, 3, 1, 0.19, 0, 20);  // 1.7 to 1.9 times the others
  EXPECT_TRUE(d.Judge(20).empty());
  EXPECT_FALSE(d.straggler(1));
}

TEST(StragglerDetector, AGangOfTwoComparesWithTheOtherRank) {
  // The gang's own median of two would be the mean: 3 times the other rank
  // would be 1.5 times it, never above a factor of 2.
  StragglerDetector d(2.0, 5);
  Feed(d, 2, 0, 0.3, 0, 10);
  std::vector<StragglerDetector::Change> changes = d.Judge(10);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 0);
  EXPECT_FALSE(d.straggler(1));
}

TEST(StragglerDetector, AOneRankGangAndBadSamplesJudgeNothing) {
  StragglerDetector d(2.0, 5);
  Feed(d, 1, 0, 5.0, 0, 10);
  EXPECT_TRUE(d.Judge(10).empty());
  d.Observe(1, 10, -1);
  d.Observe(1, 10, std::nan(""));
  EXPECT_EQ(d.median_s(1), 0);
  EXPECT_TRUE(d.Judge(10).empty());
}

TEST(StragglerDetector, AForgottenRankLeavesNoVerdict) {
  StragglerDetector d(2.0, 5);
  Feed(d, 3, 1, 1.0, 0, 10);
  ASSERT_EQ(d.Judge(10).size(), 1u);
  d.Forget(1);
  EXPECT_FALSE(d.straggler(1));
  EXPECT_EQ(d.median_s(1), 0);
  EXPECT_TRUE(d.Judge(10).empty());
}

}  // namespace
}  // namespace trainsup::supervisor
