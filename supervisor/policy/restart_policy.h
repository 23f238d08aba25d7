// The restart decision as a pure function of data, after systemd's
// service_shall_restart(): the policy is a plain struct, the history of a
// run's attempt ends goes in, and one call says whether to succeed, fail,
// restart (after how long) or stop, and why. No processes, clocks or logging:
// the caller supplies times and the random draw for jitter.
#ifndef TRAINSUP_SUPERVISOR_POLICY_RESTART_POLICY_H_
#define TRAINSUP_SUPERVISOR_POLICY_RESTART_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "supervisor/policy/exit_classify.h"

namespace trainsup::supervisor {

struct RestartPolicy {
  double initial_backoff_s = 1;  // delay before the first restart of a streak
  double max_backoff_s = 60;     // cap on the delay before jitter
  double multiplier = 2;         // growth per consecutive failure (>= 1)
  double jitter = 0.1;           // the delay varies by up to ± this fraction
  int max_restarts = 10;         // non-OOM restarts allowed per window
  double restart_window_s = 3600;
  int max_oom_restarts = 5;     // OOM restarts allowed per window
  int crash_loop_attempts = 3;  // non-OOM failures in a row without progress (0: off)
  // Rollbacks after diverged ends over the whole run (the run spec's
  // guard.max_rollbacks; docs/guard.md); counted apart from every budget.
  int max_rollbacks = 3;
};

// OK, or InvalidArgument naming the first field out of range (non-finite,
// negative, max_backoff_s < initial_backoff_s, multiplier < 1, jitter > 1,
// restart_window_s <= 0).
absl::Status Validate(const RestartPolicy& policy);

struct AttemptEnd {
  double end_s = 0;  // when it ended, on any clock consistent across the run
  ExitClass cls = ExitClass::kCrash;
  bool made_progress = false;   // the training loop advanced during the attempt
  bool stop_requested = false;  // we had asked the run to stop (cancel, shutdown)
  std::string detail;           // what happened, e.g. DescribeExit(); may be empty
  int64_t first_bad_step = -1;  // diverged: the first bad step its exit file names
};

enum class Action {
  kSucceed,  // the run is complete
  kFail,     // the run ends FAILED with the reason
  kRestart,  // relaunch after delay_s
  kStop,     // ended by our own request; the caller decides the run's state
};
// "succeed", "fail", "restart", "stop".
std::string ToString(Action action);
std::optional<Action> ActionFromString(absl::string_view name);

struct RestartDecision {
  Action action = Action::kFail;
  double delay_s = 0;  // > 0 only for kRestart
  std::string reason;  // for people: what happened and why this action
  bool oom = false;    // the deciding attempt ended in OOM
  // kRestart only: relaunch once the run directory's file system has room
  // again (the deciding attempt ended no_space), not merely after delay_s.
  bool wait_for_space = false;
  int consecutive_failures = 0;  // the backoff streak, the deciding attempt included
  // kRestart after a diverged end: the caller resumes from the newest
  // checkpoint before the first bad step and skips a window of data.
  bool rollback = false;
  int rollbacks = 0;  // diverged ends of the run, the deciding one included
};

// Decides what follows the last element of `history` (every attempt end of
// the run so far, oldest first; must not be empty). `jitter_unit` in [0, 1)
// is drawn by the caller.
//
// Let `what` be "<detail> (<class>)", or "<class>" without detail. Rules, in order:
//  1. success → kSucceed.
//  2. usage → kFail "exit 64: bad spec or arguments[: detail]"; data → kFail
//     "exit 65: data unreadable[: detail]". Neither is restarted.
//  3. cancelled → kStop (always ours). Any other class with stop_requested →
//     kStop: a stop was asked for, so how the process went down on the way
//     (143, gang, a crash in the SIGTERM handler, SIGKILL after the grace)
//     does not turn into a restart.
//  4. no_space (exit 74) → kRestart with wait_for_space, reason "exit 74:
//     no space left for checkpoints[: detail]; restart once there is space,
//     backoff 4.0 s". A full disk is not the run's fault: no_space ends count
//     against no budget and in no crash-loop or backoff streak of the other
//     classes; their own backoff grows over consecutive no_space ends.
//  4a. diverged (exit 79) → kRestart with rollback, delay initial_backoff_s,
//     reason "<what>; rollback 1 of 3", while the run's diverged ends number
//     at most max_rollbacks; past it kFail "diverged at step 37 after 3
//     rollbacks (max 3): <detail>". Diverged ends count against no other
//     budget and in no crash-loop or backoff streak.
//  4b. Everything else is a failure: crash, signal, frozen, hung, lost, gang,
//     peer_lost (exit 76: restarted like a crash, same budget and crash-loop
//     count, named as itself), and stopped (143) that we did not ask for
//     (someone else SIGTERMed it).
//  5. Crash loop (non-OOM failure only): the last `crash_loop_attempts`
//     non-OOM failures, counted back from this one up to the newest attempt
//     that made progress, all made none → kFail "crash loop: 3 attempts
//     failed without progress". OOM attempts neither count nor break the
//     streak (the OOM budget governs them); requested stops are skipped too.
//  6. Budgets, over failures that ended less than restart_window_s before
//     this one (this one included): OOM failures count only against
//     max_oom_restarts, others only against max_restarts. More than the max →
//     kFail "restart budget exhausted: 11 failures in 3600 s (max 10)" (or
//     "OOM budget exhausted: 6 OOM exits in 3600 s (max 5)").
//  7. Otherwise kRestart, reason "<what>; restart 3 of 10 in window, backoff
//     4.0 s" ("OOM restart 2 of 5 ..." for OOM). The delay is
//     min(initial * multiplier^(n-1), max_backoff_s) * (1 + jitter*(2u-1)),
//     where n = consecutive_failures: failures of any class counted back from
//     this one, up to and including the newest attempt that made progress
//     (so an attempt that made progress restarts the exponent at 0).
RestartDecision DecideRestart(const RestartPolicy& policy, const std::vector<AttemptEnd>& history,
                              double jitter_unit);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_RESTART_POLICY_H_
