// Whether a process-group id still names the worker's group (defect 10).
#include "supervisor/policy/group_identity.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

const GroupIdentity kWorker{4242, /*leader_start_ticks=*/1000, /*known_alive_ticks=*/5000};

TEST(JudgeGroup, NoMembersIsGone) { EXPECT_EQ(JudgeGroup(kWorker, {}), GroupOwnership::kGone); }

TEST(JudgeGroup, TheLeaderDecidesByItsStartTime) {
  EXPECT_EQ(JudgeGroup(kWorker, {{4242, 1000}, {4300, 1200}}), GroupOwnership::kOurs);
  // The pid was reused by a process that leads a group of its own.
  EXPECT_EQ(JudgeGroup(kWorker, {{4242, 7000}}), GroupOwnership::kStranger);
}

TEST(JudgeGroup, LeftoversOfADeadLeaderAreOursWhenTheyPredateItsEnd) {
  EXPECT_EQ(JudgeGroup(kWorker, {{4300, 1200}, {4301, 4999}}), GroupOwnership::kOurs);
  // A member that started after the group was last known alive belongs to
  // a group someone made later with the same id.
  EXPECT_EQ(JudgeGroup(kWorker, {{4300, 1200}, {4400, 6000}}), GroupOwnership::kStranger);
  // Older than the worker itself: not its child.
  EXPECT_EQ(JudgeGroup(kWorker, {{4300, 500}}), GroupOwnership::kStranger);
}

TEST(JudgeGroup, NeverKnownAliveOwnsNothingButALiveLeader) {
  GroupIdentity unknown = kWorker;
  unknown.known_alive_ticks = 0;
  EXPECT_EQ(JudgeGroup(unknown, {{4300, 1200}}), GroupOwnership::kStranger);
  EXPECT_EQ(JudgeGroup(unknown, {{4242, 1000}}), GroupOwnership::kOurs);
}

TEST(JudgeGroup, GroupsZeroAndOneAreNeverOurs) {
  EXPECT_EQ(JudgeGroup(GroupIdentity{1, 0, 10}, {{1, 0}}), GroupOwnership::kStranger);
  EXPECT_EQ(JudgeGroup(GroupIdentity{0, 0, 10}, {}), GroupOwnership::kStranger);
  EXPECT_EQ(ToString(GroupOwnership::kStranger), "stranger");
}

}  // namespace
}  // namespace trainsup::supervisor
