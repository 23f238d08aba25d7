// When an elastic gang grows back, and who hears of a slot offered again:
// plain views of the runs, the free slots and the time.
#include "supervisor/policy/elastic_growth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

using ::testing::ElementsAre;

GangView Gang(std::string id, GangPhase phase, int running, int world, double grow_after_s = 10) {
  GangView g;
  g.run_id = std::move(id);
  g.phase = phase;
  g.running_ranks = running;
  g.world_size = world;
  g.grow_after_s = grow_after_s;
  return g;
}

TEST(RunsShort, SomeRanksRunningFewerThanTheWorldSize) {
  EXPECT_TRUE(RunsShort(Gang("a", GangPhase::kRunning, 2, 3)));
  EXPECT_FALSE(RunsShort(Gang("a", GangPhase::kRunning, 3, 3)));
  EXPECT_FALSE(RunsShort(Gang("a", GangPhase::kRunning, 0, 3)));  // none: not running short
}

TEST(RunsThatMayTakeASlot, WaitingRunsAndShortGangsInOrder) {
  const std::vector<GangView> gangs = {
      Gang("full", GangPhase::kRunning, 2, 2), Gang("short", GangPhase::kRunning, 1, 2),
      Gang("waiting", GangPhase::kWaiting, 0, 4), Gang("ending", GangPhase::kOther, 0, 1)};
  EXPECT_THAT(RunsThatMayTakeASlot(gangs), ElementsAre("short", "waiting"));
}

TEST(DecideGrowth, GrowsAfterGrowAfterSWithTheFreeSlotsNamed) {
  std::map<std::string, double> since;
  const std::vector<GangView> gangs = {Gang("r", GangPhase::kRunning, 2, 3, 10)};
  EXPECT_FALSE(DecideGrowth(gangs, {"cpu:2"}, 4, 100, since));
  EXPECT_EQ(since.at("r"), 100);
  EXPECT_FALSE(DecideGrowth(gangs, {"cpu:2"}, 4, 109.9, since));
  EXPECT_EQ(since.at("r"), 100);  // kept, not restarted
  std::optional<Growth> g = DecideGrowth(gangs, {"cpu:2"}, 4, 110, since);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->run_id, "r");
  EXPECT_EQ(g->reason, "slot cpu:2 is free again");
  EXPECT_FALSE(since.count("r"));
  since.clear();
  EXPECT_FALSE(DecideGrowth(gangs, {"gpu:1", "gpu:3"}, 4, 0, since));
  g = DecideGrowth(gangs, {"gpu:1", "gpu:3"}, 4, 10, since);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->reason, "slots gpu:1, gpu:3 are free again");
}

TEST(DecideGrowth, AnythingThatStopsGrowthClearsTheClock) {
  const GangView ok = Gang("r", GangPhase::kRunning, 1, 2, 5);
  GangView multi = ok;
  multi.multi_node = true;
  const GangView waiting = Gang("w", GangPhase::kWaiting, 0, 1);
  const struct {
    const char* what;
    std::vector<GangView> gangs;
    std::vector<std::string> free;
  } cases[] = {
      {"a run waits for slots", {ok, waiting}, {"cpu:1"}},
      {"no free slot", {ok}, {}},
      {"a multi-node job", {multi}, {"cpu:1"}},
      {"not running", {Gang("r", GangPhase::kWaiting, 1, 2, 5)}, {"cpu:1"}},
      {"full", {Gang("r", GangPhase::kRunning, 2, 2, 5)}, {"cpu:1"}},
      {"no rank alive", {Gang("r", GangPhase::kRunning, 0, 2, 5)}, {"cpu:1"}},
  };
  for (const auto& c : cases) {
    std::map<std::string, double> since = {{"r", 0}};
    EXPECT_FALSE(DecideGrowth(c.gangs, c.free, 4, 100, since)) << c.what;
    EXPECT_FALSE(since.count("r")) << c.what;
  }
}

TEST(DecideGrowth, OneGangAtATimeInTheOrderGiven) {
  std::map<std::string, double> since = {{"a", 0}, {"b", 0}};
  const std::vector<GangView> gangs = {Gang("a", GangPhase::kRunning, 1, 2, 5),
                                       Gang("b", GangPhase::kRunning, 1, 2, 5)};
  std::optional<Growth> g = DecideGrowth(gangs, {"cpu:3"}, 4, 50, since);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->run_id, "a");
  EXPECT_EQ(since.count("b"), 1u);  // not looked at: still waiting its turn
  g = DecideGrowth({gangs[1]}, {"cpu:3"}, 4, 51, since);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->run_id, "b");
}

// Issue 42, 4: every run that waits for slots holds growth back, not only
// one due in the queue now: in a restart's backoff, waiting for disk space,
// preparing its start (all GangPhase::kWaiting). A run of lower priority
// does not, nor one that cannot start until drained slots come back.
TEST(DecideGrowth, AWaitingRunOfTheGangsPriorityOrHigherHoldsItBack) {
  GangView gang = Gang("g", GangPhase::kRunning, 1, 3, 0);
  gang.priority = 5;
  GangView waiting = Gang("w", GangPhase::kWaiting, 0, 2);
  waiting.smallest_gang = 2;
  for (int priority : {5, 9}) {
    waiting.priority = priority;
    std::map<std::string, double> since;
    EXPECT_TRUE(GrowthHeldBack(gang, {gang, waiting}, 4)) << priority;
    EXPECT_FALSE(DecideGrowth({gang, waiting}, {"cpu:3"}, 4, 100, since)) << priority;
  }
  waiting.priority = 4;
  std::map<std::string, double> since;
  EXPECT_FALSE(GrowthHeldBack(gang, {gang, waiting}, 4));
  EXPECT_TRUE(DecideGrowth({gang, waiting}, {"cpu:3"}, 4, 100, since));
  waiting.priority = 9;
  waiting.smallest_gang = 5;  // more than the 4 usable slots: waits for undrains
  EXPECT_FALSE(GrowthHeldBack(gang, {gang, waiting}, 4));
  since.clear();
  EXPECT_TRUE(DecideGrowth({gang, waiting}, {"cpu:3"}, 4, 100, since));
}

}  // namespace
}  // namespace trainsup::supervisor
