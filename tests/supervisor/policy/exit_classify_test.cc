// The kinds of end, and how a rank and an attempt ended, from plain facts.
#include "supervisor/policy/exit_classify.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

constexpr ExitClass kAllClasses[] = {
    ExitClass::kSuccess, ExitClass::kUsage,    ExitClass::kData,      ExitClass::kOom,
    ExitClass::kStopped, ExitClass::kCrash,    ExitClass::kSignal,    ExitClass::kFrozen,
    ExitClass::kHung,    ExitClass::kGang,     ExitClass::kCancelled, ExitClass::kLost,
    ExitClass::kNoSpace, ExitClass::kPeerLost, ExitClass::kDiverged,
};

TEST(ExitClass, StringAndProtoRoundTrip) {
  for (ExitClass c : kAllClasses) {
    EXPECT_EQ(ExitClassFromString(ToString(c)), c) << ToString(c);
    EXPECT_EQ(ExitClassFromProto(ToProto(c)), c) << ToString(c);
  }
  EXPECT_EQ(ToString(ExitClass::kOom), "oom");
  EXPECT_EQ(ToProto(ExitClass::kSuccess), 1);
  EXPECT_EQ(ToProto(ExitClass::kLost), 12);
  EXPECT_FALSE(ExitClassFromString("OOM").has_value());
  EXPECT_FALSE(ExitClassFromProto(0).has_value());
  EXPECT_EQ(ToProto(ExitClass::kNoSpace), 13);
  EXPECT_EQ(ToProto(ExitClass::kPeerLost), 14);
  EXPECT_EQ(ToString(ExitClass::kPeerLost), "peer_lost");
  EXPECT_EQ(ToProto(ExitClass::kDiverged), 15);
  EXPECT_EQ(ToString(ExitClass::kDiverged), "diverged");
  EXPECT_FALSE(ExitClassFromProto(16).has_value());
}

TEST(ClassifyExit, CodesAndSignals) {
  EXPECT_EQ(ClassifyExit(true, 0), ExitClass::kSuccess);
  EXPECT_EQ(ClassifyExit(true, 64), ExitClass::kUsage);
  EXPECT_EQ(ClassifyExit(true, 65), ExitClass::kData);
  EXPECT_EQ(ClassifyExit(true, 75), ExitClass::kOom);
  EXPECT_EQ(ClassifyExit(true, 143), ExitClass::kStopped);
  EXPECT_EQ(ClassifyExit(true, 74), ExitClass::kNoSpace);
  EXPECT_EQ(ClassifyExit(true, 76), ExitClass::kPeerLost);
  EXPECT_EQ(ClassifyExit(true, 79), ExitClass::kDiverged);
  EXPECT_EQ(ClassifyExit(true, 1), ExitClass::kCrash);
  EXPECT_EQ(ClassifyExit(true, 134), ExitClass::kCrash);
  EXPECT_EQ(ClassifyExit(false, 9), ExitClass::kSignal);
  EXPECT_EQ(ClassifyExit(false, 15), ExitClass::kSignal);
  EXPECT_EQ(DescribeExit(true, 1), "exit 1");
  EXPECT_EQ(DescribeExit(false, 9), "signal 9");
}

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
  // Asked to stop, exit 0, but never a trainsup worker: still not a
  // success, nor the stop that was asked for (exit 143).
  RankEndFacts g;
  g.reaped = true;
  g.exited = true;
  g.forced = ExitClass::kCancelled;
  g.forced_reason = "cancelled";
  EXPECT_EQ(ClassifyRankEnd(g).cls, ExitClass::kCrash);
}

// Issue 42, 1: a worker asked to stop (a cancel, a drain or a grow's
// resize, the daemon's shutdown) answers with exit 143 after its stop
// checkpoint; any other end on the way is what it would be without the
// stop: a diverged exit is still a divergence, an out-of-memory exit still
// one, a crash or a signal a failure.
TEST(ClassifyRankEnd, OnlyExit143AnswersAStopRequest) {
  for (ExitClass asked : {ExitClass::kStopped, ExitClass::kCancelled}) {
    RankEndFacts f;
    f.reaped = true;
    f.exited = true;
    f.said_hello = true;
    f.forced = asked;
    f.forced_reason = "resizing the gang: slot cpu:1 drained (bad fan)";
    f.code_or_signal = 143;
    RankEnd e = ClassifyRankEnd(f);
    EXPECT_EQ(e.cls, asked);
    EXPECT_EQ(e.reason, "resizing the gang: slot cpu:1 drained (bad fan) (then exit 143)");
    f.code_or_signal = 0;
    EXPECT_EQ(ClassifyRankEnd(f).cls, ExitClass::kSuccess);
    const struct {
      bool exited;
      int code;
      ExitClass cls;
    } others[] = {{true, 79, ExitClass::kDiverged}, {true, 75, ExitClass::kOom},
                  {true, 3, ExitClass::kCrash},     {true, 74, ExitClass::kNoSpace},
                  {false, 9, ExitClass::kSignal},   {false, 11, ExitClass::kSignal}};
    for (const auto& o : others) {
      f.exited = o.exited;
      f.code_or_signal = o.code;
      e = ClassifyRankEnd(f);
      EXPECT_EQ(e.cls, o.cls) << ToString(asked) << " " << o.code;
      EXPECT_THAT(
          e.reason,
          ::testing::EndsWith("; while stopping: resizing the gang: slot cpu:1 drained (bad fan)"));
    }
    f.exited = true;
    f.code_or_signal = 79;
    f.report = Report(79, "weights not finite: the stop checkpoint was refused");
    e = ClassifyRankEnd(f);
    EXPECT_EQ(e.cls, ExitClass::kDiverged);
    EXPECT_THAT(e.reason, ::testing::HasSubstr("weights not finite"));
    // Gone while no daemon watched, without an exit file: lost, not a stop.
    RankEndFacts lost;
    lost.forced = asked;
    lost.forced_reason = "cancelled";
    EXPECT_EQ(ClassifyRankEnd(lost).cls, ExitClass::kLost);
  }
  // A kill is still ours whatever the exit: frozen, hung, gang.
  RankEndFacts k;
  k.reaped = true;
  k.exited = true;
  k.code_or_signal = 79;
  k.forced = ExitClass::kGang;
  k.forced_reason = "stopped because rank 1 ended";
  EXPECT_EQ(ClassifyRankEnd(k).cls, ExitClass::kGang);
  EXPECT_TRUE(IsStopRequest(ExitClass::kStopped));
  EXPECT_TRUE(IsStopRequest(ExitClass::kCancelled));
  EXPECT_FALSE(IsStopRequest(ExitClass::kGang));
  EXPECT_FALSE(IsStopRequest(ExitClass::kHung));
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
