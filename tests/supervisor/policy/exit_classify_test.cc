// How a rank and an attempt ended, from plain facts.
#include "supervisor/policy/exit_classify.h"

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

// A command run without heartbeats is judged by its exit code alone: it
// never says Hello, and exit 0 is its success.
TEST(ClassifyRankEnd, ACommandWithoutHeartbeatsSucceedsOnExitZero) {
  RankEndFacts f;
  f.reaped = true;
  f.exited = true;
  f.code_or_signal = 0;
  f.expects_hello = false;
  RankEnd e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kSuccess);
  EXPECT_EQ(e.reason, "exit 0");
  f.code_or_signal = 3;
  e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kCrash);
  EXPECT_EQ(e.reason, "exit 3");
  f.code_or_signal = 75;
  e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kOom);
  // Completed while being stopped (a gang stop raced its own exit 0).
  f.code_or_signal = 0;
  f.forced = ExitClass::kGang;
  f.forced_reason = "stopped because rank 1 ended";
  EXPECT_EQ(ClassifyRankEnd(f).cls, ExitClass::kSuccess);
}

TEST(ClassifyAttemptEnd, TheFirstRankThatFailedOnItsOwnDecides) {
  AttemptOutcome o =
      ClassifyAttemptEnd({{0, ExitClass::kGang, "stopped because rank 1 ended", false},
                          {1, ExitClass::kOom, "exit 75", true},
                          {2, ExitClass::kCrash, "exit 1", false}});
  EXPECT_EQ(o.cls, ExitClass::kOom);
  EXPECT_EQ(o.detail, "rank 1 died first: exit 75");
  EXPECT_TRUE(o.made_progress);
  o = ClassifyAttemptEnd({{0, ExitClass::kGang, "g0", false}, {1, ExitClass::kGang, "g1", false}});
  EXPECT_EQ(o.cls, ExitClass::kGang);
  EXPECT_EQ(o.detail, "rank 0: g0");
  o = ClassifyAttemptEnd(
      {{0, ExitClass::kSuccess, "exit 0", true}, {1, ExitClass::kSuccess, "", false}});
  EXPECT_EQ(o.cls, ExitClass::kSuccess);
  EXPECT_EQ(o.detail, "every rank completed");
}

// Issue 12: the rank that ended first in time, not the lowest rank, names
// the attempt's end.
TEST(ClassifyAttemptEnd, TheRankThatEndedFirstInTimeDecidesNotTheLowestRank) {
  AttemptOutcome o =
      ClassifyAttemptEnd({{0, ExitClass::kCrash, "exit 3", false, /*end_order=*/2},
                          {1, ExitClass::kSignal, "signal 9", true, 1},
                          {2, ExitClass::kGang, "stopped because rank 1", false, 3}});
  EXPECT_EQ(o.cls, ExitClass::kSignal);
  EXPECT_EQ(o.detail, "rank 1 died first: signal 9");
  EXPECT_TRUE(o.made_progress);
}

// Found dead together (after a daemon restart): the lower rank.
TEST(ClassifyAttemptEnd, RankOrderBreaksATieInTime) {
  AttemptOutcome o = ClassifyAttemptEnd(
      {{0, ExitClass::kCrash, "exit 3", false, 0}, {1, ExitClass::kSignal, "signal 9", false, 0}});
  EXPECT_EQ(o.cls, ExitClass::kCrash);
  EXPECT_EQ(o.detail, "rank 0 died first: exit 3");
  // A rank whose end was never seen (not started) comes after those seen.
  o = ClassifyAttemptEnd({{0, ExitClass::kCrash, "not started", false, -1},
                          {1, ExitClass::kCrash, "exit 1", false, 4}});
  EXPECT_EQ(o.detail, "rank 1 died first: exit 1");
}

// A peer-lost exit is the consequence of another rank's end: that rank names
// the attempt even when the peer's timeout was noticed first. Alone (the
// dead peer was then stopped by us as part of the gang), it names it.
TEST(ClassifyAttemptEnd, APeerLostExitYieldsToTheRankWhoseEndItReports) {
  AttemptOutcome o =
      ClassifyAttemptEnd({{0, ExitClass::kPeerLost, "exit 76: rank 1 gone in allreduce", false, 1},
                          {1, ExitClass::kSignal, "signal 9", false, 2}});
  EXPECT_EQ(o.cls, ExitClass::kSignal);
  EXPECT_EQ(o.detail, "rank 1 died first: signal 9");
  o = ClassifyAttemptEnd({{0, ExitClass::kPeerLost, "exit 76: rank 1 gone in allreduce", false, 1},
                          {1, ExitClass::kGang, "stopped because rank 0 ended", false, 2}});
  EXPECT_EQ(o.cls, ExitClass::kPeerLost);
  EXPECT_EQ(o.detail, "rank 0 died first: exit 76: rank 1 gone in allreduce");
}

// With one rank there is no "first".
TEST(ClassifyAttemptEnd, AOneRankAttemptNamesItsRankOnly) {
  AttemptOutcome o = ClassifyAttemptEnd({{0, ExitClass::kCrash, "exit 3", false, 1}});
  EXPECT_EQ(o.detail, "rank 0: exit 3");
}

TEST(ClassifyRankEnd, ExitSeventySixIsAPeerLostWithTheExitFilesMessage) {
  RankEndFacts f;
  f.reaped = true;
  f.exited = true;
  f.code_or_signal = 76;
  f.said_hello = true;
  f.report = Report(76, "rank 1 did not answer allreduce within 60 s");
  RankEnd e = ClassifyRankEnd(f);
  EXPECT_EQ(e.cls, ExitClass::kPeerLost);
  EXPECT_EQ(e.reason, "exit 76: rank 1 did not answer allreduce within 60 s");
  // Without a message, the contract's words, not a bare code.
  f.report.reset();
  EXPECT_EQ(ClassifyRankEnd(f).reason,
            "exit 76: a peer rank died or stopped answering inside a collective");
}

}  // namespace
}  // namespace trainsup::supervisor
