// The file operations checkpoints need, behind an interface so tests can
// inject faults (short writes, failed fsync, a full disk, a crash before the
// rename). Torch-free.
#ifndef TRAINSUP_CHECKPOINT_FILE_SYSTEM_H_
#define TRAINSUP_CHECKPOINT_FILE_SYSTEM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainsup::ckpt {

// A file being written. Not thread-safe.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all of `data` or returns an error (a short write is an error).
  virtual absl::Status Append(std::string_view data) = 0;
  // Flushes the file's data and metadata to stable storage (fsync).
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The real POSIX file system. Never null, never deleted.
  static FileSystem* Default();

  // Creates or truncates `path` for writing; a new file gets permission
  // bits `mode` (less the umask) before anything is written to it.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                        uint32_t mode) = 0;
  // The same with mode 0644.
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) {
    return NewWritableFile(path, 0644);
  }
  // Calls `sink` with consecutive pieces of the file, in order; stops at the
  // first error `sink` returns.
  virtual absl::Status ReadFile(const std::string& path,
                                const std::function<absl::Status(std::string_view)>& sink) = 0;
  // Reads `size` bytes at `offset` into `out` (NotFound / OutOfRange / IO).
  virtual absl::Status ReadAt(const std::string& path, uint64_t offset, uint64_t size,
                              char* out) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // Creates one directory; OK if it exists.
  virtual absl::Status CreateDir(const std::string& path) = 0;
  // Creates a directory and its missing parents.
  virtual absl::Status CreateDirs(const std::string& path);
  // Names in a directory, without "." and "..", sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual bool IsDir(const std::string& path) = 0;
  // rename(2): atomic replacement within one file system.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Deletes a directory and everything below it.
  virtual absl::Status DeleteTree(const std::string& path) = 0;
  // fsync of a directory, so renames and new entries in it are durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // fsync of a closed file's data and metadata.
  virtual absl::Status SyncFile(const std::string& path) = 0;

  // Reads a whole (small) file.
  absl::StatusOr<std::string> ReadSmallFile(const std::string& path);
  // Writes a whole (small) file and syncs it.
  absl::Status WriteSmallFile(const std::string& path, std::string_view data);
  // Replaces `path` with `data` atomically and durably, LevelDB's
  // SetCurrentFile protocol: writes PATH.tmp (mode `mode`, a stale one
  // removed first), syncs it, renames it over `path` and syncs the parent
  // directory. After a crash at any point `path` holds the old content or
  // the new, never a mix. On an error the temporary file is removed (as far
  // as the error allows) and the error names the step and the path; a
  // failed directory sync is an error even though the rename happened.
  absl::Status WriteFileAtomically(const std::string& path, std::string_view data,
                                   uint32_t mode = 0644);
};

// Joins path components with '/'.
std::string JoinPath(const std::string& a, const std::string& b);

// The status the POSIX FileSystem returns when `what` ("open", "read",
// "stat", ...) of `path` failed with errno `err`: the message is
// "WHAT PATH: <strerror> (ENAME)"; the code is NotFound for ENOENT,
// ResourceExhausted for ENOSPC and EDQUOT, PermissionDenied for EACCES and
// EPERM, Internal otherwise. Fault-injecting file systems use it to fail
// exactly as the real one would.
absl::Status ErrnoStatus(const std::string& what, const std::string& path, int err);

}  // namespace trainsup::ckpt

#endif  // TRAINSUP_CHECKPOINT_FILE_SYSTEM_H_
