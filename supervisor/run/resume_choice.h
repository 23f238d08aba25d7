// Which checkpoint an attempt resumes from: the newest one of the run's
// store that verifies. A run has one store whatever its world size (rank 0
// writes it after a barrier, contracts/run_layout.h), so every rank of a gang
// resumes from the step chosen here, passed as --resume STEP. Reads and
// hashes the checkpoints, so the daemon runs it off its loop. A checkpoint
// whose content is wrong (size, hash, manifest: DataLoss) is quarantined
// and reported; an I/O error while reading one (EMFILE, EIO, ENOMEM, ...)
// quarantines nothing and fails the choice, so the attempt is retried
// rather than started from scratch over a good checkpoint.
#ifndef TRAINSUP_SUPERVISOR_RUN_RESUME_CHOICE_H_
#define TRAINSUP_SUPERVISOR_RUN_RESUME_CHOICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/store.h"

namespace trainsup::supervisor {

struct ResumeChoice {
  int64_t step = -1;               // -1: from scratch
  std::string dir;                 // the checkpoint's directory
  std::vector<std::string> notes;  // quarantines, for the run's events
  absl::Status error;              // not OK: an I/O error, nothing chosen
  bool fatal = false;              // the error is no I/O error: retrying cannot mend it
  // ChooseResumeShared: every checkpoint that verified, newest first, and
  // whose they are (the directory's owner record; none: no job claimed it).
  std::vector<std::pair<int64_t, std::string>> loadable;
  std::optional<ckpt::StoreOwner> owner;
};

// `before_step` >= 0: the newest that verifies of those below it (a
// rollback past a diverged attempt's first bad step, docs/guard.md).
// Then the quarantine is pruned to `quarantine` (ckpt::PruneQuarantine, at
// the time now), each entry deleted named in the notes.
ResumeChoice ChooseResume(const std::string& run_dir, int64_t before_step = -1,
                          const ckpt::QuarantineRetention& quarantine = {});

// A multi-node run's choice (docs/distributed.md): the run directory's
// checkpoints/ is made a symlink to `shared_dir` (created when missing, but
// only inside a parent that exists: a storage that is not mounted is not
// mistaken for an empty one; FailedPrecondition in `error` then, or when
// checkpoints/ is something else), its owner record is read, and
// every checkpoint there is verified, not only the newest, since the job
// resumes from the newest step that every node verified. `step`/`dir` are
// this node's newest.
ResumeChoice ChooseResumeShared(const std::string& run_dir, const std::string& shared_dir);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_RUN_RESUME_CHOICE_H_
