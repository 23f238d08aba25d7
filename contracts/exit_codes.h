// The worker exit codes of the worker contract (docs/design.md), defined once for the
// worker, the test worker, trainsupd and trainctl. A worker that exits on
// purpose uses one of these (and writes its exit file first); anything else,
// or a signal, is a crash.
#ifndef TRAINSUP_CONTRACTS_EXIT_CODES_H_
#define TRAINSUP_CONTRACTS_EXIT_CODES_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace trainsup {

enum class WorkerExit : int {
  kCompleted = 0,  // run complete, final checkpoint written
  kUsage = 64,     // EX_USAGE: bad spec or arguments; not restarted
  kData = 65,      // EX_DATAERR: data unreadable; not restarted
  // EX_IOERR, used for one case only: the run directory's file system is
  // full (ENOSPC, EDQUOT) and the worker could not go on. The supervisor
  // waits for space instead of counting it against the restart budget.
  kNoSpace = 74,
  kOom = 75,  // EX_TEMPFAIL: hard out-of-memory; restarted from a checkpoint
  // EX_PROTOCOL: a peer rank of the gang died or stopped answering inside a
  // collective (the exit file's message names the peer and the collective).
  // The gang is restarted from the newest checkpoint, counted against the
  // restart budget like a crash.
  kPeerLost = 76,
  // Outside sysexits' 64..78: training diverged. The loss or the gradient
  // was not finite, or the loss spiked, on guard.max_bad_steps steps within
  // guard.bad_window (the exit file's first_bad_step names the first). The
  // supervisor rolls back to a checkpoint older than that step and skips a
  // window of data (docs/guard.md), within guard.max_rollbacks.
  kDiverged = 79,
  kStopped = 143,  // 128 + SIGTERM: stopped on request after a checkpoint
};

// The process exit status of `code`.
constexpr int ExitStatus(WorkerExit code) { return static_cast<int>(code); }

// The contract code with exit status `status`; nullopt for any other status
// (a crash).
std::optional<WorkerExit> WorkerExitFromStatus(int status);

// "completed", "usage", "data", "no_space", "oom", "peer_lost", "diverged", "stopped": also the
// `reason` word of an exit file written with that code.
std::string ToString(WorkerExit code);
// The inverse of ToString; nullopt for any other word.
std::optional<WorkerExit> WorkerExitFromString(absl::string_view name);

// What the code means, for people: "bad spec or arguments".
std::string Describe(WorkerExit code);

// Why a worker that ends as a crash on purpose (exit 1, not a contract
// code: the supervisor restarts it like any crash) did: the `reason` word of
// its exit file.
enum class CrashReason {
  // A checkpoint that had to be written (the final one, a stop's) failed for
  // a reason other than a full disk (that one is exit 74).
  kCheckpointFailed,
  // The checkpoint to resume from could not be read (EIO, EMFILE, ENOMEM):
  // nothing is quarantined and the attempt is retried.
  kCheckpointIo,
  // The checkpoint to resume from does not verify: quarantined (or left to
  // the supervisor's next choice), and an older one is chosen.
  kCheckpointCorrupt,
  // Any other error the training loop cannot go on from.
  kError,
};

// "checkpoint_failed", "checkpoint_io", "checkpoint_corrupt", "error".
std::string ToString(CrashReason reason);
// The inverse of ToString; nullopt for any other word.
std::optional<CrashReason> CrashReasonFromString(absl::string_view name);

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_EXIT_CODES_H_
