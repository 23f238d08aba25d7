// Stopping a worker as data: where a stop starts, what follows, how long.
#include "supervisor/policy/stop_stage.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

TEST(StopStage, GracefulWithAStreamStartsWithTheStopCommand) {
  EXPECT_EQ(FirstStopStage(true, true), StopStage::kStopCommand);
  EXPECT_EQ(FirstStopStage(true, false), StopStage::kSigterm);
  EXPECT_EQ(FirstStopStage(false, true), StopStage::kSigterm);
}

TEST(StopStage, EachStageHasItsTimeoutAndItsSuccessor) {
  const StopTimeouts t{30, 10};
  EXPECT_EQ(NextStopStage(StopStage::kStopCommand), StopStage::kSigterm);
  EXPECT_EQ(NextStopStage(StopStage::kSigterm), StopStage::kSigkill);
  EXPECT_EQ(NextStopStage(StopStage::kSigkill), StopStage::kNone);
  EXPECT_EQ(NextStopStage(StopStage::kNone), StopStage::kNone);
  EXPECT_DOUBLE_EQ(StopStageTimeout(StopStage::kStopCommand, t), 30);
  EXPECT_DOUBLE_EQ(StopStageTimeout(StopStage::kSigterm, t), 10);
  EXPECT_DOUBLE_EQ(StopStageTimeout(StopStage::kSigkill, t), 0);
}

TEST(StopStage, StringRoundTrip) {
  for (StopStage s :
       {StopStage::kNone, StopStage::kStopCommand, StopStage::kSigterm, StopStage::kSigkill}) {
    EXPECT_EQ(StopStageFromString(ToString(s)), s);
  }
  EXPECT_EQ(ToString(StopStage::kStopCommand), "stop_command");
  EXPECT_FALSE(StopStageFromString("SIGTERM").has_value());
}

}  // namespace
}  // namespace trainsup::supervisor
