// Placing queued runs on slots: order, priorities, head-of-line blocking,
// backoff and gangs; multi-node jobs in job order, and which waiting runs
// give their slots back to the queue's head (YieldsFor).
#include "supervisor/policy/scheduler.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace trainsup::supervisor {
namespace {

std::vector<SlotView> Slots(const std::vector<bool>& free) {
  std::vector<SlotView> slots;
  for (size_t i = 0; i < free.size(); ++i) slots.push_back({static_cast<int>(i), free[i]});
  return slots;
}

QueuedRun Queued(std::string id, int priority, int64_t seq, int world_size = 1,
                 double not_before_s = 0) {
  return QueuedRun{std::move(id), priority, seq, world_size, not_before_s};
}

// A multi-node run of `job`.
QueuedRun OfJob(std::string id, std::string job, int64_t seq, int priority = 0,
                int world_size = 1) {
  QueuedRun q = Queued(std::move(id), priority, seq, world_size);
  q.job = std::move(job);
  return q;
}

std::vector<std::string> Ids(const std::vector<Placement>& placements) {
  std::vector<std::string> ids;
  for (const Placement& p : placements) ids.push_back(p.run_id);
  return ids;
}

TEST(Schedule, EmptyQueueOrNoSlots) {
  EXPECT_TRUE(Schedule({}, Slots({true, true}), 0).empty());
  EXPECT_TRUE(Schedule({Queued("a", 0, 1)}, Slots({false, false}), 0).empty());
}

TEST(Schedule, FifoWithinAPriorityOnLowestSlots) {
  std::vector<Placement> p = Schedule({Queued("c", 0, 3), Queued("a", 0, 1), Queued("b", 0, 2)},
                                      Slots({false, true, true}), 0);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].run_id, "a");
  EXPECT_EQ(p[0].slots, std::vector<int>{1});
  EXPECT_EQ(p[1].run_id, "b");
  EXPECT_EQ(p[1].slots, std::vector<int>{2});
}

TEST(Schedule, HigherPriorityFirst) {
  std::vector<Placement> p = Schedule(
      {Queued("low", 0, 1), Queued("high", 5, 9), Queued("mid", 2, 4)}, Slots({true, true}), 0);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"high", "mid"}));
}

TEST(Schedule, HeadOfLineBlocksLowerAndEqualPriority) {
  // The 3-rank gang at the head does not fit on 2 free slots; the small runs
  // behind it must wait rather than starve it.
  std::vector<Placement> p =
      Schedule({Queued("big", 1, 1, 3), Queued("small", 1, 2), Queued("tiny", 0, 3)},
               Slots({true, true, false}), 0);
  EXPECT_TRUE(p.empty());
  // A higher-priority run ahead of the blocked one is still placed.
  p = Schedule({Queued("big", 1, 1, 3), Queued("urgent", 2, 5)}, Slots({true, true, false}), 0);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"urgent"}));
}

TEST(Schedule, BackoffSkipsWithoutBlocking) {
  std::vector<Placement> p =
      Schedule({Queued("waiting", 1, 1, 2, /*not_before_s=*/50), Queued("next", 0, 2)},
               Slots({true, true}), /*now_s=*/10);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].run_id, "next");
  EXPECT_EQ(p[0].slots, std::vector<int>{0});
  // Once the backoff has passed it goes first again.
  p = Schedule({Queued("waiting", 1, 1, 2, 50), Queued("next", 0, 2)}, Slots({true, true}), 50);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"waiting"}));
}

TEST(Schedule, MultiSlotGangsGetDistinctLowestSlots) {
  std::vector<Placement> p =
      Schedule({Queued("g1", 0, 1, 2), Queued("g2", 0, 2, 3), Queued("one", 0, 3)},
               Slots({true, false, true, true, true, true, true}), 0);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].slots, (std::vector<int>{0, 2}));
  EXPECT_EQ(p[1].slots, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(p[2].slots, std::vector<int>{6});
}

// Issue 12: a gang of W gets W slots in one placement or none at all,
// whatever number of slots is free, and while it waits it holds back runs
// of its priority or lower but not higher ones.
TEST(Schedule, AGangGetsAllItsSlotsAtOnceOrWaits) {
  for (int world = 2; world <= 4; ++world) {
    for (int free = 0; free <= 5; ++free) {
      std::vector<bool> mask(5, false);
      for (int i = 0; i < free; ++i) mask[i] = true;
      std::vector<Placement> p =
          Schedule({Queued("gang", 1, 1, world), Queued("same", 1, 2), Queued("lower", 0, 3)},
                   Slots(mask), 0);
      if (free < world) {
        EXPECT_TRUE(p.empty()) << "world " << world << ", free " << free;
        p = Schedule({Queued("gang", 1, 1, world), Queued("higher", 2, 2)}, Slots(mask), 0);
        EXPECT_EQ(Ids(p),
                  free > 0 ? std::vector<std::string>{"higher"} : std::vector<std::string>{})
            << "world " << world << ", free " << free;
        continue;
      }
      ASSERT_FALSE(p.empty()) << "world " << world << ", free " << free;
      EXPECT_EQ(p[0].run_id, "gang");
      EXPECT_EQ(p[0].slots.size(), static_cast<size_t>(world));
    }
  }
}

TEST(Schedule, NoSlotAssignedTwice) {
  std::vector<QueuedRun> queue;
  for (int i = 0; i < 20; ++i)
    queue.push_back(Queued("r" + std::to_string(i), i % 3, i, 1 + i % 2));
  // Slot indices need not be dense or sorted.
  std::vector<SlotView> slots = {{7, true}, {3, true}, {5, false}, {1, true}, {9, true}, {2, true}};
  std::vector<Placement> p = Schedule(queue, slots, 0);
  std::set<int> used;
  size_t total = 0;
  for (const Placement& pl : p) {
    for (int s : pl.slots) {
      EXPECT_NE(s, 5) << "busy slot given out";
      used.insert(s);
      ++total;
    }
  }
  EXPECT_EQ(used.size(), total);
  EXPECT_EQ(total, 4u);  // 1, {2, 3}, 7; then a 2-rank gang does not fit on slot 9 and blocks
}

TEST(Schedule, RunsThatCanNeverFitDoNotBlock) {
  std::vector<Placement> p =
      Schedule({Queued("huge", 9, 1, 4), Queued("zero", 9, 2, 0), Queued("ok", 0, 3)},
               Slots({true, true}), 0);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"ok"}));
}

// --- elastic gangs (docs/distributed.md, "Elastic") -----------------------------------------

QueuedRun Elastic(std::string id, int world, int min_world, double shrink_at_s, int64_t seq = 1) {
  QueuedRun q = Queued(std::move(id), 0, seq, world);
  q.min_world_size = min_world;
  q.shrink_at_s = shrink_at_s;
  return q;
}

// Slots: 'F' free, 'B' busy, 'D' drained (free or not: never handed out).
std::vector<SlotView> Table(const std::string& states) {
  std::vector<SlotView> slots;
  for (size_t i = 0; i < states.size(); ++i) {
    slots.push_back({static_cast<int>(i), states[i] == 'F', states[i] != 'D'});
  }
  return slots;
}

TEST(Schedule, DrainedSlotsAreNeverHandedOut) {
  std::vector<Placement> p = Schedule({Queued("a", 0, 1), Queued("b", 0, 2)}, Table("DFD"), 0);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].slots, std::vector<int>{1});
}

TEST(Schedule, AnElasticGangTakesEveryUsableSlotAtOnceWhenDrainsLeaveFewerThanItWants) {
  // 4 wanted, 1 drained: 3 usable and free, so it starts with 3 now, long
  // before its wait for busy slots would end.
  std::vector<Placement> p = Schedule({Elastic("e", 4, 2, 1000)}, Table("FFDF"), 0);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].slots, (std::vector<int>{0, 1, 3}));
  // One of the 3 usable slots still releasing: it waits for it (blocking
  // the runs behind it) rather than start with 2.
  p = Schedule({Elastic("e", 4, 2, 1000), Queued("behind", 0, 2)}, Table("FBDF"), 0);
  EXPECT_TRUE(p.empty());
}

TEST(Schedule, AnElasticGangWaitsForBusySlotsUntilItsShrinkTime) {
  // 4 usable, 2 busy with another run: before shrink_at_s it waits, then it
  // starts with the 2 free (min 2), but never with fewer than its minimum.
  EXPECT_TRUE(Schedule({Elastic("e", 4, 2, 60)}, Table("FBBF"), 59.9).empty());
  std::vector<Placement> p = Schedule({Elastic("e", 4, 2, 60)}, Table("FBBF"), 60);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].slots, (std::vector<int>{0, 3}));
  EXPECT_TRUE(Schedule({Elastic("e", 4, 3, 60)}, Table("FBBF"), 600).empty());
  // All four free: all four, whatever the time.
  p = Schedule({Elastic("e", 4, 2, 60)}, Table("FFFF"), 0);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].slots.size(), 4u);
}

TEST(Schedule, AGangWhoseSmallestSizeExceedsTheUsableSlotsWaitsWithoutBlocking) {
  // Not elastic (min = world = 3) with one of 3 slots drained; and an
  // elastic one whose minimum is 3: both wait, the run behind starts.
  for (const QueuedRun& gang : {Queued("fixed", 5, 1, 3), Elastic("min3", 3, 3, 0)}) {
    std::vector<Placement> p = Schedule({gang, Queued("behind", 0, 2)}, Table("FFD"), 1000);
    EXPECT_EQ(Ids(p), std::vector<std::string>{"behind"}) << gang.run_id;
  }
}

// --- multi-node jobs -------------------------------------------------------------------------

TEST(OrderQueue, MultiNodeRunsOfAPriorityFollowTheirJobNamesInTheirOwnPlaces) {
  std::vector<QueuedRun> q = {OfJob("y1", "job-y", 1), Queued("local2", 0, 2),
                              OfJob("x3", "job-x", 3), Queued("local4", 0, 4),
                              OfJob("w5", "job-w", 5, /*priority=*/1)};
  OrderQueue(q);
  std::vector<std::string> ids;
  for (const QueuedRun& r : q) ids.push_back(r.run_id);
  // Priority 1 first; then job-x takes job-y's place, and the local runs
  // keep theirs.
  EXPECT_EQ(ids, (std::vector<std::string>{"w5", "x3", "local2", "y1", "local4"}));
}

TEST(Schedule, TwoJobsOrderAlikeWhateverTheSubmitOrder) {
  // Node A saw job-y first, node B job-x: both place job-x.
  EXPECT_EQ(Ids(Schedule({OfJob("y", "job-y", 1), OfJob("x", "job-x", 2)}, Slots({true}), 0)),
            std::vector<std::string>{"x"});
  EXPECT_EQ(Ids(Schedule({OfJob("x", "job-x", 1), OfJob("y", "job-y", 2)}, Slots({true}), 0)),
            std::vector<std::string>{"x"});
}

JoiningRun Waiting(std::string id, std::string job, double joined_s, int slots = 1,
                   int priority = 0) {
  return JoiningRun{std::move(id), priority, std::move(job), slots, joined_s};
}

TEST(YieldsFor, ARunOfALaterJobThatWaitedLongEnoughYieldsToTheHeadOfLine) {
  // The deadlock: this node gave its one slot to job-y, which waits in its
  // rendezvous; job-x waits here for the slot.
  const std::vector<Yield> y =
      YieldsFor({OfJob("x", "job-x", 2)}, {Waiting("y", "job-y", 0)}, Slots({false}), 10, 5);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].run_id, "y");
  EXPECT_EQ(y[0].to_job, "job-x");
  // Not before it has waited `after_s`.
  EXPECT_TRUE(YieldsFor({OfJob("x", "job-x", 2)}, {Waiting("y", "job-y", 6)}, Slots({false}), 10, 5)
                  .empty());
}

TEST(YieldsFor, AJobThatOrdersFirstNeverYields) {
  // The other node of the deadlock: job-x waits, job-y is queued.
  EXPECT_TRUE(
      YieldsFor({OfJob("y", "job-y", 2)}, {Waiting("x", "job-x", 0)}, Slots({false}), 100, 5)
          .empty());
  // A higher priority orders first whatever the name.
  EXPECT_TRUE(YieldsFor({OfJob("a", "job-a", 2)}, {Waiting("z", "job-z", 0, 1, /*priority=*/1)},
                        Slots({false}), 100, 5)
                  .empty());
  const std::vector<Yield> y = YieldsFor({OfJob("z", "job-z", 2, /*priority=*/1)},
                                         {Waiting("a", "job-a", 0)}, Slots({false}), 100, 5);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].run_id, "a");
}

TEST(YieldsFor, OnlyTheHeadOfLineTakesAndOnlyWhatItNeeds) {
  // A local run at the head: it does not deadlock with anyone, nobody yields.
  EXPECT_TRUE(YieldsFor({Queued("local", 0, 1), OfJob("x", "job-x", 2)}, {Waiting("y", "job-y", 0)},
                        Slots({false}), 100, 5)
                  .empty());
  // Two slots needed, one free: the latest-ordered waiting run yields, not both.
  std::vector<Yield> y = YieldsFor({OfJob("x", "job-x", 1, 0, /*world_size=*/2)},
                                   {Waiting("y", "job-y", 0), Waiting("z", "job-z", 0)},
                                   Slots({true, false, false}), 100, 5);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].run_id, "z");
  // Three needed, and the waiting runs could not make it fit: nobody yields.
  EXPECT_TRUE(YieldsFor({OfJob("x", "job-x", 1, 0, /*world_size=*/3)}, {Waiting("y", "job-y", 0)},
                        Slots({false, false, false}), 100, 5)
                  .empty());
  // A run already giving its slot back counts as free: nobody else yields.
  EXPECT_TRUE(YieldsFor({OfJob("x", "job-x", 1)},
                        {[] {
                           JoiningRun z = Waiting("z", "job-z", 0);
                           z.yielding = true;
                           return z;
                         }(),
                         Waiting("y", "job-y", 0)},
                        Slots({false, false}), 100, 5)
                  .empty());
  // A run that fits is placed by Schedule; the next one is the head.
  y = YieldsFor({Queued("small", 0, 1), OfJob("x", "job-x", 2)}, {Waiting("y", "job-y", 0)},
                Slots({true, false}), 100, 5);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].to_job, "job-x");
}

}  // namespace
}  // namespace trainsup::supervisor
