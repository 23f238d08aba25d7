// The exit file: DIR/attempts/A/rank-R.exit.json, written by a worker just
// before it exits on purpose (docs/design.md, worker contract), so the daemon can
// classify an exit even of a process it did not start (adoption). Both ends
// use these functions, so the format has one definition:
//
//   {"code": 143, "reason": "stopped", "message": "...", "last_step": 12,
//    "time_ms": 1700000000000, "first_bad_step": -1}
#ifndef TRAINSUP_CONTRACTS_EXIT_FILE_H_
#define TRAINSUP_CONTRACTS_EXIT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainsup {
namespace ckpt {
class FileSystem;
}

// What a run trained, as its rank 0 reports it on exit (docs/guard.md,
// "SUCCEEDED means trained"); -1: not said. Steps are the run's, on the
// lineage of the final model (a rolled-back timeline does not count).
struct TrainingTally {
  int64_t steps = -1;           // the steps the run went through (its last step)
  int64_t applied = -1;         // optimizer steps applied
  int64_t skipped_window = -1;  // steps in skip windows: their batches not trained on
  int64_t skipped_guard = -1;   // not applied by the guard (non-finite, spike)
  int64_t skipped_scaler = -1;  // skipped by fp16's loss scaler on an overflow
  double final_metric = -1;     // the final model on the validation split (mIoU)
  double baseline_metric = -1;  // the majority-class baseline on the same split
  bool present() const { return steps >= 0; }
};

struct ExitFile {
  int code = 0;            // the process's exit status, 0..255
  std::string reason;      // a short machine word: "completed", "stopped", "usage", ...
  std::string message;     // for people
  int64_t last_step = -1;  // the last completed step; -1 when none
  int64_t time_ms = 0;     // when it was written (unix ms)
  // A diverged exit (79): the first bad step of the window that ended the
  // attempt, which the supervisor rolls back past; -1 otherwise.
  int64_t first_bad_step = -1;
  // Exit 0 of rank 0: what the run trained (JSON key "tally").
  TrainingTally tally;
};

// DIR/attempts/A/rank-R.exit.json.
std::string ExitFilePath(const std::string& run_dir, int attempt, int rank);

// Writes the exit file atomically: a temporary file in the same directory,
// fsynced, renamed over the final name, the directory fsynced. Creates the
// missing directories. A crash leaves either the old file or the new one.
absl::Status WriteExitFile(const std::string& run_dir, int attempt, int rank,
                           const ExitFile& exit_file);
// The same through `fs` (tests inject faults), with
// FileSystem::WriteFileAtomically.
absl::Status WriteExitFile(ckpt::FileSystem* fs, const std::string& run_dir, int attempt, int rank,
                           const ExitFile& exit_file);

// Reads an exit file. NotFound when it does not exist; DataLoss when it is
// not a regular file (a FIFO is refused without blocking) or is larger than
// 1 MiB, and naming the problem and the field when it is not valid JSON, "code" is missing, a
// field has the wrong type, or a number is outside its field's range (code
// 0..255, last_step and first_bad_step -1..2^63-1, time_ms 0..2^63-1; never narrowed). Fields
// other than "code" are optional.
absl::StatusOr<ExitFile> ReadExitFile(const std::string& path);

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_EXIT_FILE_H_
