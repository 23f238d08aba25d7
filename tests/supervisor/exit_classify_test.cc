// How a rank and an attempt ended, from plain facts.
#include "supervisor/exit_classify.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

ExitFile Report(int code, const std::string& message = "") {
  ExitFile f;
  f.code = code;
  f.message = message;
  return f;
}

TEST(ClassifyRankEnd, ReapedExitCodesFollowTheContractWithTheReportsMessage) {
  RankEndFacts f;
  f.reaped = true;
  f.exited = true;
  f.code_or_signal = 64;
  f.report = Report(64, "train.batch_size: must be in [1, 4096]");
  f.said_hello = true;
  RankEnd e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kUsage);
  EXPECT_EQ(e.reason, "exit 64: train.batch_size: must be in [1, 4096]");
  EXPECT_EQ(e.code, 64);
  EXPECT_EQ(e.signal, 0);
  f.code_or_signal = 74;
  f.report = Report(74, "no space left on /runs");
  EXPECT_EQ(ClassifyRankEnd(f).cls, ExitClass::kNoSpace);
}

TEST(ClassifyRankEnd, SignalsAreSignalsUnlessWeSentThem) {
  RankEndFacts f;
  f.reaped = true;
  f.exited = false;
  f.code_or_signal = 9;
  f.said_hello = true;
  RankEnd e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kSignal);
  EXPECT_EQ(e.reason, "signal 9");
  EXPECT_EQ(e.code, -1);
  EXPECT_EQ(e.signal, 9);
  f.forced = ExitClass::kHung;
  f.forced_reason = "rank 0 no progress for 700.0 s (timeout 600.0 s)";
  e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kHung);
  EXPECT_EQ(e.reason, "rank 0 no progress for 700.0 s (timeout 600.0 s) (then signal 9)");
}

TEST(ClassifyRankEnd, AWorkerThatCompletedWhileBeingStoppedSucceeded) {
  RankEndFacts f;
  f.reaped = true;
  f.exited = true;
  f.code_or_signal = 0;
  f.said_hello = true;
  f.forced = ExitClass::kGang;
  f.forced_reason = "stopped because rank 1 ended";
  EXPECT_EQ(ClassifyRankEnd(f).cls, ExitClass::kSuccess);
}

TEST(ClassifyRankEnd, UnknownEndWithoutExitFileIsLost) {
  RankEndFacts f;  // adopted, not reaped, no file
  RankEnd e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kLost);
  EXPECT_EQ(e.reason, "ended while no daemon was watching, without an exit file");
  // The exit file tells how an adopted worker ended.
  f.report = Report(143, "stopped on request after checkpoint step-40");
  e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kStopped);
  EXPECT_EQ(e.code, 143);
}

// Defect 13: a process that exits 0 without ever saying Hello and without
// an exit file did not complete a run.
TEST(ClassifyRankEnd, ExitZeroWithoutHelloOrExitFileIsACrash) {
  RankEndFacts f;
  f.reaped = true;
  f.exited = true;
  f.code_or_signal = 0;
  RankEnd e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kCrash);
  EXPECT_NE(e.reason.find("exit 0 without a hello or an exit file"), std::string::npos) << e.reason;
  f.said_hello = true;
  EXPECT_EQ(ClassifyRankEnd(f).cls, ExitClass::kSuccess);
  f.said_hello = false;
  f.report = Report(0, "completed 12 steps");
  EXPECT_EQ(ClassifyRankEnd(f).cls, ExitClass::kSuccess);
  // Forced, exit 0, but never a trainsup worker: still not a success.
  RankEndFacts g;
  g.reaped = true;
  g.exited = true;
  g.forced = ExitClass::kCancelled;
  g.forced_reason = "cancelled";
  EXPECT_EQ(ClassifyRankEnd(g).cls, ExitClass::kCancelled);
}

TEST(ClassifyAttemptEnd, TheFirstRankThatFailedOnItsOwnDecides) {
  AttemptOutcome o =
      ClassifyAttemptEnd({{0, ExitClass::kGang, "stopped because rank 1 ended", false},
                          {1, ExitClass::kOom, "exit 75", true},
                          {2, ExitClass::kCrash, "exit 1", false}});
  EXPECT_EQ(o.cls, ExitClass::kOom);
  EXPECT_EQ(o.detail, "rank 1: exit 75");
  EXPECT_TRUE(o.made_progress);
  o = ClassifyAttemptEnd({{0, ExitClass::kGang, "g0", false}, {1, ExitClass::kGang, "g1", false}});
  EXPECT_EQ(o.cls, ExitClass::kGang);
  EXPECT_EQ(o.detail, "rank 0: g0");
  o = ClassifyAttemptEnd(
      {{0, ExitClass::kSuccess, "exit 0", true}, {1, ExitClass::kSuccess, "", false}});
  EXPECT_EQ(o.cls, ExitClass::kSuccess);
  EXPECT_EQ(o.detail, "every rank completed");
}

}  // namespace
}  // namespace trainsup::supervisor
