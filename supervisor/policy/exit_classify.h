// How a rank ended and how an attempt ended, as pure functions of what the
// daemon observed (after systemd's service_sigchld_event: the result is
// decided from the facts, then acted on). No processes, clocks or files:
// the caller reaps, reads the exit file and passes what it found.
#ifndef TRAINSUP_SUPERVISOR_POLICY_EXIT_CLASSIFY_H_
#define TRAINSUP_SUPERVISOR_POLICY_EXIT_CLASSIFY_H_

#include <optional>
#include <string>
#include <vector>

#include "contracts/exit_file.h"
#include "supervisor/policy/restart_policy.h"

namespace trainsup::supervisor {

// What is known about one rank's end.
struct RankEndFacts {
  // The wait status, when the daemon reaped the process itself.
  bool reaped = false;
  bool exited = false;     // WIFEXITED (else killed by a signal)
  int code_or_signal = 0;  // WEXITSTATUS or WTERMSIG
  // The worker's own account: its exit file, or the ExitReport it sent on
  // the stream (the file wins when both exist).
  std::optional<ExitFile> report;
  // The worker said Hello during this attempt (or, adopted, before the
  // daemon restarted).
  bool said_hello = false;
  // The process is meant to say Hello: false for a command run without
  // heartbeats (RunSpec::command), which rule 4 then does not apply to.
  bool expects_hello = true;
  // Why the daemon was killing it, when it was (frozen, hung, gang,
  // cancelled, stopped) and the reason given then.
  std::optional<ExitClass> forced;
  std::string forced_reason;
};

struct RankEnd {
  ExitClass cls = ExitClass::kCrash;
  std::string reason;  // for people; stored and shown
  bool exited = false;
  int code = -1;   // the exit code when known and exited, else -1
  int signal = 0;  // the signal when killed by one, else 0
};

// Rules, in order:
//  1. The exit is known from the wait status, else from the report's code.
//     Neither: kLost, "ended while no daemon was watching, without an exit
//     file".
//  2. Forced by us: that class, reason "<forced_reason> (then exit 143)";
//     except that a worker which completed anyway (exit 0 with a report or
//     a hello) is kSuccess.
//  3. Otherwise ClassifyExit(); reason DescribeExit() plus ": <message>"
//     of the report, or, without one, ": <Describe()>" of a contract code
//     other than 0 ("exit 76: a peer rank died or stopped answering inside
//     a collective").
//  4. Exit 0 from a process that never said Hello and wrote no exit file
//     is not a trainsup worker finishing its run: kCrash, "exit 0 without
//     a hello or an exit file". Not for a process that is not expected to
//     say Hello (expects_hello false): its exit 0 is kSuccess.
RankEnd ClassifyRankEnd(const RankEndFacts& facts);

struct RankOutcome {
  int rank = 0;
  ExitClass cls = ExitClass::kCrash;
  std::string reason;
  bool progressed = false;  // its training loop advanced during the attempt
  // When the daemon saw the rank fail, as a sequence number within the
  // attempt (smaller: earlier): its exit, or our frozen or hung verdict
  // when that came first. Ranks found dead together (after a daemon
  // restart) share a value. -1: never seen to end (not started).
  int end_order = -1;
};

struct AttemptOutcome {
  ExitClass cls = ExitClass::kSuccess;
  std::string detail;
  bool made_progress = false;
};

// The attempt's class and detail are those of one deciding rank: among the
// ranks that did not succeed, the first in this order of kinds, then the
// earliest end_order (-1 after every seen end), then the lowest rank:
//  1. failed on its own (neither gang nor peer_lost);
//  2. peer_lost: a consequence of another rank's end, which names the
//     attempt when it is known, even if the peer's timeout was seen first;
//  3. gang (stopped by us because another rank failed).
// Detail: "rank 1 died first: exit 3" when the attempt has several ranks
// and the deciding one failed (not gang, cancelled or stopped), else
// "rank 1: <reason>"; "every rank completed" on success.
AttemptOutcome ClassifyAttemptEnd(const std::vector<RankOutcome>& ranks);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_EXIT_CLASSIFY_H_
