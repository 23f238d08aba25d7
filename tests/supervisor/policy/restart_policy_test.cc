// The restart decision: backoff, budgets, crash loops and
// requested stops, all from plain histories.
#include "supervisor/policy/restart_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace trainsup::supervisor {
namespace {

constexpr ExitClass kAllClasses[] = {
    ExitClass::kSuccess, ExitClass::kUsage,    ExitClass::kData,      ExitClass::kOom,
    ExitClass::kStopped, ExitClass::kCrash,    ExitClass::kSignal,    ExitClass::kFrozen,
    ExitClass::kHung,    ExitClass::kGang,     ExitClass::kCancelled, ExitClass::kLost,
    ExitClass::kNoSpace, ExitClass::kPeerLost, ExitClass::kDiverged,
};

AttemptEnd End(double t, ExitClass cls, bool progress = false, bool stop = false,
               std::string detail = "") {
  return AttemptEnd{t, cls, progress, stop, std::move(detail)};
}

// Jitter off, so delays are exact.
RestartPolicy NoJitter() {
  RestartPolicy p;
  p.jitter = 0;
  return p;
}

TEST(Action, StringRoundTrip) {
  for (Action a : {Action::kSucceed, Action::kFail, Action::kRestart, Action::kStop}) {
    EXPECT_EQ(ActionFromString(ToString(a)), a);
  }
  EXPECT_FALSE(ActionFromString("retry").has_value());
}

TEST(DecideRestart, NoSpaceWaitsForSpaceAndCountsAgainstNoBudget) {
  RestartPolicy p = NoJitter();
  p.max_restarts = 1;
  p.crash_loop_attempts = 2;
  std::vector<AttemptEnd> h;
  for (int i = 0; i < 6; ++i) h.push_back(End(10 + i, ExitClass::kNoSpace, false, false, "ENOSPC"));
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_TRUE(d.wait_for_space);
  EXPECT_EQ(d.consecutive_failures, 6);
  EXPECT_DOUBLE_EQ(d.delay_s, 32.0);  // 1 s doubling over the no-space streak
  EXPECT_NE(d.reason.find("exit 74: no space left for checkpoints: ENOSPC"), std::string::npos)
      << d.reason;
  // A crash after them is the first failure of its own streak and budget.
  h.push_back(End(20, ExitClass::kCrash));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_FALSE(d.wait_for_space);
  EXPECT_EQ(d.consecutive_failures, 1);
  EXPECT_DOUBLE_EQ(d.delay_s, 1.0);
  // No-space ends do not break a crash loop either.
  h.push_back(End(21, ExitClass::kNoSpace));
  h.push_back(End(22, ExitClass::kCrash));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kFail) << d.reason;
  EXPECT_NE(d.reason.find("crash loop"), std::string::npos) << d.reason;
}

TEST(RestartPolicy, ValidateNamesTheField) {
  EXPECT_TRUE(Validate(RestartPolicy{}).ok());
  RestartPolicy p;
  p.max_backoff_s = 0.5;
  absl::Status s = Validate(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("max_backoff_s"), std::string::npos) << s;
  p = RestartPolicy{};
  p.multiplier = 0.5;
  EXPECT_NE(std::string(Validate(p).message()).find("multiplier"), std::string::npos);
  p = RestartPolicy{};
  p.jitter = 1.5;
  EXPECT_NE(std::string(Validate(p).message()).find("jitter"), std::string::npos);
  p = RestartPolicy{};
  p.max_restarts = -1;
  EXPECT_NE(std::string(Validate(p).message()).find("max_restarts"), std::string::npos);
  p = RestartPolicy{};
  p.restart_window_s = 0;
  EXPECT_NE(std::string(Validate(p).message()).find("restart_window_s"), std::string::npos);
  p = RestartPolicy{};
  p.initial_backoff_s = std::nan("");
  EXPECT_NE(std::string(Validate(p).message()).find("initial_backoff_s"), std::string::npos);
}

TEST(DecideRestart, EveryExitClassWithoutStopRequest) {
  const RestartPolicy p = NoJitter();
  const struct {
    ExitClass cls;
    Action action;
  } cases[] = {
      {ExitClass::kSuccess, Action::kSucceed},  {ExitClass::kUsage, Action::kFail},
      {ExitClass::kData, Action::kFail},        {ExitClass::kOom, Action::kRestart},
      {ExitClass::kStopped, Action::kRestart},  {ExitClass::kCrash, Action::kRestart},
      {ExitClass::kSignal, Action::kRestart},   {ExitClass::kFrozen, Action::kRestart},
      {ExitClass::kHung, Action::kRestart},     {ExitClass::kGang, Action::kRestart},
      {ExitClass::kCancelled, Action::kStop},   {ExitClass::kLost, Action::kRestart},
      {ExitClass::kNoSpace, Action::kRestart},  {ExitClass::kPeerLost, Action::kRestart},
      {ExitClass::kDiverged, Action::kRestart},
  };
  for (const auto& c : cases) {
    RestartDecision d = DecideRestart(p, {End(10, c.cls)}, 0.5);
    EXPECT_EQ(d.action, c.action) << ToString(c.cls) << ": " << d.reason;
    EXPECT_EQ(d.oom, c.cls == ExitClass::kOom) << ToString(c.cls);
    if (c.action == Action::kRestart) {
      EXPECT_DOUBLE_EQ(d.delay_s, 1.0) << ToString(c.cls);
    } else {
      EXPECT_EQ(d.delay_s, 0) << ToString(c.cls);
    }
  }
}

AttemptEnd Diverged(double t, int64_t first_bad_step) {
  AttemptEnd e = End(t, ExitClass::kDiverged, /*progress=*/true, false,
                     "rank 0 exited 79: diverged at step " + std::to_string(first_bad_step));
  e.first_bad_step = first_bad_step;
  return e;
}

// Exit 79: a rollback while the run has had at most max_rollbacks diverged
// ends, then FAILED naming the step and the rollbacks; diverged ends count
// in no other budget, crash loop or backoff streak.
TEST(DecideRestart, DivergedRollsBackWithinItsOwnBudgetThenFails) {
  RestartPolicy p = NoJitter();
  p.max_rollbacks = 2;
  p.max_restarts = 1;
  p.crash_loop_attempts = 2;
  std::vector<AttemptEnd> h = {Diverged(10, 37)};
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_TRUE(d.rollback);
  EXPECT_EQ(d.rollbacks, 1);
  EXPECT_DOUBLE_EQ(d.delay_s, 1.0);
  EXPECT_EQ(d.reason, "rank 0 exited 79: diverged at step 37 (diverged); rollback 1 of 2");
  // A crash between them: its own budget (1) holds, and the diverged ends
  // before it are no failures of the crash loop.
  h.push_back(End(20, ExitClass::kCrash));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_FALSE(d.rollback);
  EXPECT_EQ(d.consecutive_failures, 1);
  h.push_back(Diverged(30, 45));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_EQ(d.rollbacks, 2);
  h.push_back(Diverged(40, 52));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason,
            "diverged at step 52 after 2 rollbacks (max 2): rank 0 exited 79: diverged at step 52");
  p.max_rollbacks = 0;
  d = DecideRestart(p, {Diverged(10, 5)}, 0.5);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason,
            "diverged at step 5 after 0 rollbacks (max 0): rank 0 exited 79: diverged at step 5");
  // A stop we asked for is a stop, whatever the code.
  AttemptEnd stopped = Diverged(10, 5);
  stopped.stop_requested = true;
  EXPECT_EQ(DecideRestart(p, {stopped}, 0.5).action, Action::kStop);
}

// Exit 76: restarted like a crash, against the same budget and crash-loop
// count, and named as what it is.
TEST(DecideRestart, APeerLostIsRestartedLikeACrashAndSaysPeerLost) {
  RestartPolicy p = NoJitter();
  p.max_restarts = 2;
  p.crash_loop_attempts = 0;
  const std::string detail = "rank 0 died first: exit 76: rank 1 gone in allreduce";
  std::vector<AttemptEnd> h = {End(1, ExitClass::kCrash, true),
                               End(2, ExitClass::kPeerLost, true, false, detail)};
  RestartDecision d = DecideRestart(p, h, 0);
  EXPECT_EQ(d.action, Action::kRestart);
  EXPECT_FALSE(d.oom);
  EXPECT_EQ(d.reason, detail + " (peer_lost); restart 2 of 2 in window, backoff 1.0 s");
  h.push_back(End(3, ExitClass::kPeerLost, true, false, detail));
  d = DecideRestart(p, h, 0);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason, "restart budget exhausted: 3 failures in 3600 s (max 2); last " + detail +
                          " (peer_lost)");
  p.crash_loop_attempts = 2;
  d = DecideRestart(p, {End(1, ExitClass::kCrash), End(2, ExitClass::kPeerLost)}, 0);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason, "crash loop: 2 attempts failed without progress; last peer_lost");
}

TEST(DecideRestart, UsageAndDataSayWhy) {
  RestartDecision d = DecideRestart(NoJitter(), {End(1, ExitClass::kUsage)}, 0);
  EXPECT_EQ(d.reason, "exit 64: bad spec or arguments");
  d = DecideRestart(NoJitter(), {End(1, ExitClass::kData, false, false, "no such file x.bin")}, 0);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason, "exit 65: data unreadable: no such file x.bin");
}

TEST(DecideRestart, StopRequestedVariants) {
  const RestartPolicy p = NoJitter();
  for (ExitClass c : {ExitClass::kStopped, ExitClass::kCancelled, ExitClass::kGang,
                      ExitClass::kCrash, ExitClass::kSignal, ExitClass::kOom}) {
    RestartDecision d = DecideRestart(p, {End(1, c, false, /*stop=*/true)}, 0);
    EXPECT_EQ(d.action, Action::kStop) << ToString(c) << ": " << d.reason;
  }
  // A stop does not hide a real outcome.
  EXPECT_EQ(DecideRestart(p, {End(1, ExitClass::kSuccess, true, true)}, 0).action,
            Action::kSucceed);
  EXPECT_EQ(DecideRestart(p, {End(1, ExitClass::kUsage, false, true)}, 0).action, Action::kFail);
  // 143 we did not ask for is someone else's SIGTERM: a failure, restarted.
  RestartDecision d = DecideRestart(p, {End(1, ExitClass::kStopped, false, false, "exit 143")}, 0);
  EXPECT_EQ(d.action, Action::kRestart);
  EXPECT_EQ(d.reason, "exit 143 (stopped); restart 1 of 10 in window, backoff 1.0 s");
}

TEST(DecideRestart, ReasonSaysWhatAndWhy) {
  RestartPolicy p = NoJitter();
  std::vector<AttemptEnd> h = {End(1, ExitClass::kCrash, true), End(2, ExitClass::kCrash),
                               End(3, ExitClass::kCrash, false, false, "exit 1")};
  p.crash_loop_attempts = 0;
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart);
  EXPECT_EQ(d.consecutive_failures, 3);
  EXPECT_EQ(d.reason, "exit 1 (crash); restart 3 of 10 in window, backoff 4.0 s");
}

TEST(DecideRestart, BackoffDoublesToTheCap) {
  RestartPolicy p = NoJitter();
  p.crash_loop_attempts = 0;
  p.max_restarts = 100;
  const double expected[] = {1, 2, 4, 8, 16, 32, 60, 60, 60};
  std::vector<AttemptEnd> h;
  for (double want : expected) {
    h.push_back(End(h.size(), ExitClass::kCrash));
    RestartDecision d = DecideRestart(p, h, 0.5);
    ASSERT_EQ(d.action, Action::kRestart) << d.reason;
    EXPECT_DOUBLE_EQ(d.delay_s, want) << "failure " << h.size();
    EXPECT_EQ(d.consecutive_failures, static_cast<int>(h.size()));
  }
}

TEST(DecideRestart, JitterBounds) {
  RestartPolicy p;  // jitter 0.1
  p.crash_loop_attempts = 0;
  std::vector<AttemptEnd> h = {End(1, ExitClass::kCrash), End(2, ExitClass::kCrash),
                               End(3, ExitClass::kCrash)};  // base 4 s
  EXPECT_DOUBLE_EQ(DecideRestart(p, h, 0.0).delay_s, 3.6);
  EXPECT_DOUBLE_EQ(DecideRestart(p, h, 0.5).delay_s, 4.0);
  const double high = DecideRestart(p, h, 0.999999).delay_s;
  EXPECT_LT(high, 4.4);
  EXPECT_GT(high, 4.39);
  // Jitter applies after the cap.
  p.max_backoff_s = 2;
  EXPECT_DOUBLE_EQ(DecideRestart(p, h, 0.0).delay_s, 1.8);
}

TEST(DecideRestart, ProgressResetsTheExponent) {
  RestartPolicy p = NoJitter();
  std::vector<AttemptEnd> h = {End(1, ExitClass::kCrash), End(2, ExitClass::kCrash)};
  EXPECT_DOUBLE_EQ(DecideRestart(p, h, 0.5).delay_s, 2.0);
  h.push_back(End(100, ExitClass::kCrash, /*progress=*/true));
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.consecutive_failures, 1);
  EXPECT_DOUBLE_EQ(d.delay_s, 1.0);
  h.push_back(End(101, ExitClass::kHung));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.consecutive_failures, 2);
  EXPECT_DOUBLE_EQ(d.delay_s, 2.0);
}

TEST(DecideRestart, BudgetExhaustedInsideWindow) {
  RestartPolicy p = NoJitter();
  std::vector<AttemptEnd> h;
  // Every attempt made progress: no crash loop, backoff stays at 1 s.
  for (int i = 0; i < 10; ++i) h.push_back(End(i * 100, ExitClass::kCrash, true));
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart);
  EXPECT_NE(d.reason.find("restart 10 of 10"), std::string::npos) << d.reason;
  h.push_back(End(1000, ExitClass::kCrash, true, false, "exit 1"));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason.rfind("restart budget exhausted: 11 failures in 3600 s (max 10)", 0), 0u)
      << d.reason;
}

TEST(DecideRestart, BudgetWindowSlides) {
  RestartPolicy p = NoJitter();
  std::vector<AttemptEnd> h;
  for (int i = 0; i < 10; ++i) h.push_back(End(i, ExitClass::kCrash, true));
  // Ten old failures fall out of the window once an hour has passed.
  h.push_back(End(3600 + 0.5, ExitClass::kCrash, true));
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_NE(d.reason.find("restart 10 of 10"), std::string::npos) << d.reason;  // t=1..9 and now
  h.push_back(End(3600 + 0.6, ExitClass::kCrash, true));
  EXPECT_EQ(DecideRestart(p, h, 0.5).action, Action::kFail);
  h.push_back(End(3609.5, ExitClass::kCrash, true));  // window now holds only the last three
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_NE(d.reason.find("restart 3 of 10"), std::string::npos) << d.reason;
}

TEST(DecideRestart, OomCountedApart) {
  RestartPolicy p = NoJitter();
  p.max_restarts = 2;
  std::vector<AttemptEnd> h;
  for (int i = 0; i < 5; ++i) {
    h.push_back(End(i, ExitClass::kOom, true));
    RestartDecision d = DecideRestart(p, h, 0.5);
    EXPECT_EQ(d.action, Action::kRestart) << d.reason;
    EXPECT_TRUE(d.oom);
    EXPECT_NE(d.reason.find("OOM restart " + std::to_string(i + 1) + " of 5"), std::string::npos)
        << d.reason;
  }
  // Five OOMs did not use the general budget of 2.
  h.push_back(End(10, ExitClass::kCrash, true));
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kRestart) << d.reason;
  EXPECT_NE(d.reason.find("restart 1 of 2"), std::string::npos) << d.reason;
  h.push_back(End(11, ExitClass::kOom, true));
  d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason.rfind("OOM budget exhausted: 6 OOM exits in 3600 s (max 5)", 0), 0u)
      << d.reason;
}

TEST(DecideRestart, CrashLoop) {
  RestartPolicy p = NoJitter();
  std::vector<AttemptEnd> h = {End(1, ExitClass::kCrash, true), End(2, ExitClass::kCrash),
                               End(3, ExitClass::kSignal)};
  EXPECT_EQ(DecideRestart(p, h, 0.5).action, Action::kRestart);
  h.push_back(End(4, ExitClass::kLost));
  RestartDecision d = DecideRestart(p, h, 0.5);
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason.rfind("crash loop: 3 attempts failed without progress", 0), 0u) << d.reason;
}

TEST(DecideRestart, CrashLoopIgnoresOomAndStops) {
  RestartPolicy p = NoJitter();
  // OOMs without progress do not make a crash loop by themselves...
  std::vector<AttemptEnd> h = {End(1, ExitClass::kOom), End(2, ExitClass::kOom),
                               End(3, ExitClass::kOom)};
  EXPECT_EQ(DecideRestart(p, h, 0.5).action, Action::kRestart);
  // ...nor break one, and a requested stop in between neither counts nor breaks.
  h = {End(1, ExitClass::kCrash), End(2, ExitClass::kOom), End(3, ExitClass::kStopped, false, true),
       End(4, ExitClass::kCrash)};
  EXPECT_EQ(DecideRestart(p, h, 0.5).action, Action::kRestart);
  h.push_back(End(5, ExitClass::kFrozen));
  EXPECT_EQ(DecideRestart(p, h, 0.5).action, Action::kFail);
  // Disabled with 0.
  p.crash_loop_attempts = 0;
  EXPECT_EQ(DecideRestart(p, h, 0.5).action, Action::kRestart);
}

TEST(DecideRestart, EmptyHistoryFails) {
  EXPECT_EQ(DecideRestart(RestartPolicy{}, {}, 0.5).action, Action::kFail);
}

}  // namespace
}  // namespace trainsup::supervisor
