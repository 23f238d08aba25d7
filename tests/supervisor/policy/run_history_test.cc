// A run's history as the restart policy sees it, rebuilt from a stored run.
#include "supervisor/policy/run_history.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

v1::Attempt Ended(int n, v1::ExitClass cls, int64_t resumed, int64_t step, bool stop = false) {
  v1::Attempt a;
  a.set_number(n);
  a.set_ended_ms(1000 * n);
  a.set_exit_class(cls);
  a.set_exit_reason("rank 0: detail " + std::to_string(n));
  a.set_resumed_from_step(resumed);
  a.set_stop_requested(stop);
  a.add_ranks()->mutable_progress()->set_step(step);
  return a;
}

TEST(RebuildHistory, EveryEndedAttemptInOrderWithProgressAndStops) {
  v1::Run run;
  *run.add_attempts() = Ended(1, v1::EXIT_CLASS_CRASH, -1, 0);
  *run.add_attempts() = Ended(2, v1::EXIT_CLASS_OOM, -1, 5);
  *run.add_attempts() = Ended(3, v1::EXIT_CLASS_STOPPED, 5, 5, /*stop=*/true);
  *run.add_attempts() = Ended(4, v1::EXIT_CLASS_CANCELLED, 5, 9);
  v1::Attempt open;
  open.set_number(5);
  *run.add_attempts() = open;  // running: not an end
  RunHistory h = RebuildHistory(run);
  ASSERT_EQ(h.ends.size(), 4u);
  EXPECT_EQ(h.oom_exits, 1);
  EXPECT_EQ(h.ends[0].cls, ExitClass::kCrash);
  EXPECT_FALSE(h.ends[0].made_progress);
  EXPECT_DOUBLE_EQ(h.ends[0].end_s, 1.0);
  EXPECT_TRUE(h.ends[1].made_progress);
  // Resumed from step 5 and still at 5: no progress in that attempt.
  EXPECT_FALSE(h.ends[2].made_progress);
  EXPECT_TRUE(h.ends[2].stop_requested) << "defect 15: a graceful stop is stored";
  EXPECT_TRUE(h.ends[3].stop_requested) << "a cancel is always our stop";
  EXPECT_EQ(h.ends[3].detail, "rank 0: detail 4");
}

TEST(RebuildHistory, UnknownClassIsACrash) {
  v1::Run run;
  *run.add_attempts() = Ended(1, static_cast<v1::ExitClass>(99), -1, 0);
  RunHistory h = RebuildHistory(run);
  ASSERT_EQ(h.ends.size(), 1u);
  EXPECT_EQ(h.ends[0].cls, ExitClass::kCrash);
}

}  // namespace
}  // namespace trainsup::supervisor
