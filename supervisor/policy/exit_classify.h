// The kinds of end a rank or an attempt can have (ExitClass), and how one
// rank ended and how an attempt ended, as pure functions of what the daemon
// observed (after systemd's service_sigchld_event: the result is decided from
// the facts, then acted on). No processes, clocks or files: the caller reaps,
// reads the exit file and passes what it found.
#ifndef TRAINSUP_SUPERVISOR_POLICY_EXIT_CLASSIFY_H_
#define TRAINSUP_SUPERVISOR_POLICY_EXIT_CLASSIFY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "contracts/exit_file.h"

namespace trainsup::supervisor {

// How an attempt (or one rank of it) ended. The values are those of
// trainsup.v1.ExitClass in proto/trainsup/v1/supervisor.proto, so
// ToProto/ExitClassFromProto are plain conversions.
enum class ExitClass {
  kSuccess = 1,     // exit 0: run complete
  kUsage = 2,       // exit 64: bad spec or arguments
  kData = 3,        // exit 65: data unreadable
  kOom = 4,         // exit 75: hard out-of-memory
  kStopped = 5,     // exit 143: stopped (SIGTERM) after a checkpoint
  kCrash = 6,       // any other exit code
  kSignal = 7,      // killed by a signal we did not send
  kFrozen = 8,      // killed by us: no heartbeat
  kHung = 9,        // killed by us: heartbeats but no progress
  kGang = 10,       // stopped by us because another rank failed
  kCancelled = 11,  // stopped by us because the run was cancelled
  kLost = 12,       // gone while the daemon was down, no exit file
  kNoSpace = 13,    // exit 74: the run directory's file system is full
  kPeerLost = 14,   // exit 76: a peer rank died or stopped answering in a collective
  kDiverged = 15,   // exit 79: training diverged (non-finite or spiking steps; docs/guard.md)
};

// "success", "usage", "data", "oom", "stopped", "crash", "signal", "frozen",
// "hung", "gang", "cancelled", "lost", "no_space", "peer_lost", "diverged".
std::string ToString(ExitClass cls);
// The inverse of ToString; nullopt for any other string.
std::optional<ExitClass> ExitClassFromString(absl::string_view name);
// The trainsup.v1.ExitClass value.
int ToProto(ExitClass cls);
// nullopt for EXIT_CLASS_UNSPECIFIED (0) and unknown values.
std::optional<ExitClass> ExitClassFromProto(int value);

// Classifies a waitpid() result: `exited` (WIFEXITED) with code
// 0/64/65/74/75/76/79/143 (contracts/exit_codes.h) or other, or killed by signal
// `code_or_signal`. Classes that
// depend on why we killed the process (frozen, hung, gang, cancelled) or on
// the daemon having been down (lost) are assigned by the caller instead.
ExitClass ClassifyExit(bool exited, int code_or_signal);
// "exit 1" or "signal 9": the conventional AttemptEnd::detail for an exit.
std::string DescribeExit(bool exited, int code_or_signal);

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
  // Why the daemon was stopping it, when it was, and the reason given then:
  // killed (frozen, hung, gang), or asked to stop at a checkpoint
  // (cancelled, stopped: a cancel, a resize, the daemon's shutdown).
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
//  2. Killed by us (forced frozen, hung or gang): that class, reason
//     "<forced_reason> (then exit 143)"; except that a worker which
//     completed anyway (exit 0 with a report or a hello) is kSuccess.
//  2a. Asked to stop (forced cancelled or stopped): only the exit the stop
//     asks for answers it. Exit 143 is the forced class, reason
//     "<forced_reason> (then exit 143)"; a worker that completed anyway is
//     kSuccess. Any other end (a crash, exit 75 or 79 on the way, a signal,
//     the SIGKILL after the grace, no exit known) is classified by rules 1,
//     3 and 4 as if no stop had been asked, its reason ending "; while
//     stopping: <forced_reason>".
//  3. Otherwise ClassifyExit(); reason DescribeExit() plus ": <message>"
//     of the report, or, without one, ": <Describe()>" of a contract code
//     other than 0 ("exit 76: a peer rank died or stopped answering inside
//     a collective").
//  4. Exit 0 from a process that never said Hello and wrote no exit file
//     is not a trainsup worker finishing its run: kCrash, "exit 0 without
//     a hello or an exit file". Not for a process that is not expected to
//     say Hello (expects_hello false): its exit 0 is kSuccess.
RankEnd ClassifyRankEnd(const RankEndFacts& facts);

// Whether `forced` asked the worker to stop at a checkpoint (cancelled,
// stopped) rather than killed it (rule 2a against rule 2).
bool IsStopRequest(ExitClass forced);

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
