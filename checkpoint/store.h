// The on-disk checkpoint layout and its life cycle: atomic commit,
// verification, choosing the newest good checkpoint, quarantine and
// retention. Torch-free: the supervisor links it to list and choose
// checkpoints; the worker writes through it.
//
//   <root>/step-N/             a committed checkpoint: its files and MANIFEST.json
//   <root>/step-N.tmp/         being written (or left by a crash; cleaned up)
//   <root>/quarantine/step-N.<unix time>/   a checkpoint that failed
//                              verification, with QUARANTINE.txt saying why
//
// Commit: every file written under step-N.tmp and fsynced, MANIFEST.json
// written and fsynced, the directory fsynced, renamed to step-N, the root
// fsynced. A checkpoint is therefore either complete or invisible.
#ifndef TRAINSUP_CHECKPOINT_STORE_H_
#define TRAINSUP_CHECKPOINT_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"
#include "checkpoint/manifest.h"

namespace trainsup::ckpt {

struct StoreOptions {
  int keep_last = 3;       // newest committed checkpoints kept (>= 1)
  int64_t keep_every = 0;  // also keep every step that is a multiple (0: none)
};

struct CheckpointInfo {
  int64_t step = 0;
  std::string path;
};

// How long quarantined checkpoints are kept (docs/checkpoints.md,
// "Quarantine"): the newest `keep`, and every one younger than `min_age_s`
// however many there are; the rest are deleted.
struct QuarantineRetention {
  int keep = 3;
  int64_t min_age_s = 86400;
};

struct QuarantineReport {
  int64_t step = 0;
  std::string reason;
  std::string moved_to;
};

// Receives the bytes of one file, in order.
using ByteSink = std::function<absl::Status(std::string_view)>;

// A checkpoint being written. Made by CheckpointStore::Begin; finished by
// Commit or Abort. Not thread-safe.
class PendingCheckpoint {
 public:
  int64_t step() const { return step_; }
  const std::string& dir() const { return dir_; }

  // Writes file `name` with the bytes `producer` passes to its sink; sizes
  // and hashes them on the way, then fsyncs and closes the file.
  absl::Status WriteFile(const std::string& name,
                         const std::function<absl::Status(const ByteSink&)>& producer);
  absl::Status WriteFile(const std::string& name, std::string_view data);

 private:
  friend class CheckpointStore;
  PendingCheckpoint(FileSystem* fs, int64_t step, std::string dir)
      : fs_(fs), step_(step), dir_(std::move(dir)) {}
  FileSystem* fs_;
  int64_t step_;
  std::string dir_;
  std::vector<ManifestEntry> files_;
  bool failed_ = false;
};

class CheckpointStore {
 public:
  // `root` is the run's checkpoints directory (created on first Begin).
  explicit CheckpointStore(std::string root, FileSystem* fs = FileSystem::Default(),
                           StoreOptions options = {});
  // Waits for checkpoints being deleted in the background.
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  const std::string& root() const { return root_; }
  FileSystem* fs() const { return fs_; }

  // Starts checkpoint `step`: removes leftovers of interrupted saves and
  // creates step-N.tmp.
  absl::StatusOr<std::unique_ptr<PendingCheckpoint>> Begin(int64_t step);
  // Makes the checkpoint durable and visible, then applies retention.
  // FailedPrecondition if a file write had failed. On error nothing that
  // was committed before is touched and the .tmp directory is removed when
  // possible (else the next Begin removes it).
  absl::Status Commit(std::unique_ptr<PendingCheckpoint> pending);
  // Drops an unfinished checkpoint.
  void Abort(std::unique_ptr<PendingCheckpoint> pending);

  // Committed checkpoints, oldest first (unverified). Empty when the root
  // does not exist; an error when it cannot be listed.
  absl::StatusOr<std::vector<CheckpointInfo>> List();

  // Verification tells two kinds of failure apart, and only the first is a
  // verdict on the checkpoint:
  //  - a content error, DataLoss naming what is wrong: a missing (ENOENT),
  //    extra, truncated or changed file, a manifest that is missing or does
  //    not parse, another format version, the wrong step;
  //  - an I/O error, Unavailable: the file system failed otherwise (EMFILE,
  //    ENFILE, EIO, ENOMEM, EACCES, ...). The message names the file and
  //    the errno ("read DIR/step-12/model.safetensors: Input/output error
  //    (EIO)"). Nothing is known about the content; retry later.
  // OK, DataLoss or Unavailable; nothing else.
  absl::Status Verify(const CheckpointInfo& checkpoint);
  // The newest checkpoint that verifies, walking down from the newest.
  // Each newer one with a content error is quarantined and reported in
  // `quarantined` (which the caller should log and raise as an event).
  // NotFound: none is left that verifies (start from scratch).
  // Unavailable: an I/O error (listing, verifying or quarantining) stopped
  // the walk; the checkpoint it was on is untouched and no older one is
  // chosen in its place, so the caller must not start from scratch or from
  // an older step: fail the attempt and retry it. Never any other code.
  // `before_step` >= 0: only checkpoints of a lower step are candidates
  // (a rollback past a diverged step, docs/guard.md); newer ones are
  // neither verified nor touched.
  absl::StatusOr<CheckpointInfo> ChooseLatest(std::vector<QuarantineReport>* quarantined,
                                              int64_t before_step = -1);
  // Moves a committed checkpoint aside with the reason; never deletes it.
  absl::StatusOr<QuarantineReport> Quarantine(const CheckpointInfo& checkpoint,
                                              const std::string& reason);
  // Deletes quarantined checkpoints beyond the retention: ordered by the
  // time in their name (step-N.<unix time>[.i]), newest first, the first
  // `keep` stay and so does every one quarantined less than `min_age_s`
  // before `now_unix_s`. Names of another form are left alone. Returns the
  // names deleted.
  absl::StatusOr<std::vector<std::string>> PruneQuarantine(const QuarantineRetention& retention,
                                                           int64_t now_unix_s);
  // Removes committed checkpoints beyond the policy (StoreOptions), never
  // `keep_step` (the one just committed): each is renamed to
  // step-N.deleting.tmp at once (so it is no longer listed) and deleted on
  // a background thread, off the save's critical path. A deletion cut
  // short by a crash is finished by the next Begin.
  // Also kept: the newest checkpoint older than keep_before() (a rollback's
  // target, docs/guard.md).
  absl::Status ApplyRetention(int64_t keep_step = -1);
  // Retention keeps the newest checkpoint whose step is below `step` as
  // well (the trainer sets it to the oldest bad step its guard still
  // counts); -1: none. The one setting that may change while another
  // thread writes a checkpoint (AsyncCheckpointer): the others do not.
  void set_keep_before(int64_t step) { keep_before_.store(step); }
  int64_t keep_before() const { return keep_before_.load(); }
  // Waits until background deletions are done.
  void WaitForDeletions();
  // Restores interrupted replacements, then removes step-N.*.tmp leftovers.
  absl::Status CleanLeftovers();

  // Renames step-N.replaced.tmp back to step-N where step-N is missing (a
  // re-save of step N that stopped between its two renames). ChooseLatest
  // and Begin call it.
  absl::Status RestoreInterruptedReplacements();

  // Reads MANIFEST.json of a committed checkpoint: DataLoss when it is
  // missing or does not parse, Unavailable on an I/O error.
  absl::StatusOr<Manifest> ReadManifest(const CheckpointInfo& checkpoint);

 private:
  std::string root_;
  FileSystem* fs_;
  StoreOptions options_;
  std::atomic<int64_t> keep_before_{-1};
  std::thread deleter_;
};

// A failed read of a checkpoint file, classified the way Verify reports
// it: NotFound (the file is missing), OutOfRange (it ends early) and
// DataLoss are content errors, DataLoss(`content_error`); anything else the
// file system reports (EMFILE, EIO, ENOMEM, EACCES, ...) is an I/O error,
// Unavailable with the file system's message, which names the path and the
// errno.
absl::Status CheckpointReadError(const absl::Status& s, const std::string& content_error);

// Parses "step-N" (N decimal, no sign); -1 otherwise.
int64_t ParseStepDirName(std::string_view name);
std::string StepDirName(int64_t step);

// Whose checkpoints a shared checkpoint directory holds (a multi-node job's
// cluster.checkpoint_dir; docs/distributed.md, "Job identity"): the job's
// name and its submission's id, in <root>/trainsup-job.json, next to the
// step-N directories (List and retention ignore it).
struct StoreOwner {
  std::string job;
  std::string submission;
};
inline constexpr char kOwnerFileName[] = "trainsup-job.json";
// nullopt when `root` or the file is absent; DataLoss when the file is not
// an owner record; the I/O error otherwise.
absl::StatusOr<std::optional<StoreOwner>> ReadStoreOwner(const std::string& root,
                                                         FileSystem* fs = FileSystem::Default());
// Replaces the file atomically (temporary file, fsync, rename, fsync of
// `root`, which must exist).
absl::Status WriteStoreOwner(const std::string& root, const StoreOwner& owner,
                             FileSystem* fs = FileSystem::Default());

}  // namespace trainsup::ckpt

#endif  // TRAINSUP_CHECKPOINT_STORE_H_
