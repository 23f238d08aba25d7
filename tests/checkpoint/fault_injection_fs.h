// A FileSystem over the real one that fails on command: disk full after a
// byte budget, short writes, fsync failures, a crash before a rename, and
// read errors (EMFILE, EIO, ENOMEM, ...) on chosen paths.
#ifndef TRAINSUP_TESTS_CHECKPOINT_FAULT_INJECTION_FS_H_
#define TRAINSUP_TESTS_CHECKPOINT_FAULT_INJECTION_FS_H_

#include <errno.h>

#include <memory>
#include <string>

#include "checkpoint/file_system.h"

namespace trainsup::ckpt::testing {

class FaultInjectionFileSystem final : public FileSystem {
 public:
  explicit FaultInjectionFileSystem(FileSystem* base = FileSystem::Default()) : base_(base) {}

  // Writes past this many bytes (from now) fail with ENOSPC; -1: no limit.
  int64_t space_left = -1;
  // The n-th Append from now writes half its data and reports ENOSPC (0: off).
  int short_write_at = 0;
  // Sync() fails from the n-th call on (0: off).
  int fail_sync_at = 0;
  // Renames into a name without ".tmp" fail as if the process died there.
  bool crash_before_rename = false;

  // Read faults: while read_errno != 0, the operations in read_fault_ops on
  // a path that ends with read_fault_path (any path when it is empty) fail
  // the way the POSIX file system reports errno read_errno (ErrnoStatus),
  // at most read_faults_left times (-1: every time).
  enum ReadOp { kReadFile = 1, kReadAt = 2, kFileSize = 4, kListDir = 8 };
  int read_errno = 0;
  std::string read_fault_path;
  int read_fault_ops = kReadFile | kReadAt | kFileSize | kListDir;
  int read_faults_left = -1;

  int syncs = 0, appends = 0;
  int read_faults = 0;  // read faults injected so far

  using FileSystem::NewWritableFile;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                uint32_t mode) override {
    auto f = base_->NewWritableFile(path, mode);
    if (!f.ok()) return f.status();
    return std::unique_ptr<WritableFile>(new File(this, std::move(*f)));
  }
  absl::Status ReadFile(const std::string& path,
                        const std::function<absl::Status(std::string_view)>& sink) override {
    // Running out of descriptors fails the open; the others the read.
    const bool at_open = read_errno == EMFILE || read_errno == ENFILE;
    if (ReadFault(kReadFile, path)) return ErrnoStatus(at_open ? "open" : "read", path, read_errno);
    return base_->ReadFile(path, sink);
  }
  absl::Status ReadAt(const std::string& path, uint64_t offset, uint64_t size, char* out) override {
    if (ReadFault(kReadAt, path)) return ErrnoStatus("read", path, read_errno);
    return base_->ReadAt(path, offset, size, out);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    if (ReadFault(kFileSize, path)) return ErrnoStatus("stat", path, read_errno);
    return base_->FileSize(path);
  }
  bool Exists(const std::string& path) override { return base_->Exists(path); }
  absl::Status CreateDir(const std::string& path) override { return base_->CreateDir(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    if (ReadFault(kListDir, path)) return ErrnoStatus("opendir", path, read_errno);
    return base_->ListDir(path);
  }
  bool IsDir(const std::string& path) override { return base_->IsDir(path); }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (crash_before_rename && to.find(".tmp") == std::string::npos) {
      return absl::AbortedError("injected crash before rename");
    }
    return base_->Rename(from, to);
  }
  absl::Status DeleteFile(const std::string& path) override { return base_->DeleteFile(path); }
  absl::Status DeleteTree(const std::string& path) override {
    // A crashed process cleans nothing up.
    if (crash_before_rename) return absl::AbortedError("injected crash");
    return base_->DeleteTree(path);
  }
  absl::Status SyncFile(const std::string& path) override {
    if (fail_sync_at > 0 && ++syncs >= fail_sync_at) {
      return absl::InternalError("injected fsync failure: Input/output error");
    }
    return base_->SyncFile(path);
  }
  absl::Status SyncDir(const std::string& path) override {
    if (fail_sync_at > 0 && ++syncs >= fail_sync_at)
      return absl::InternalError("injected fsync failure");
    return base_->SyncDir(path);
  }

 private:
  // Whether operation `op` on `path` fails now (and counts it).
  bool ReadFault(ReadOp op, const std::string& path) {
    if (read_errno == 0 || (read_fault_ops & op) == 0 || read_faults_left == 0) return false;
    const std::string& suffix = read_fault_path;
    if (path.size() < suffix.size() ||
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return false;
    }
    if (read_faults_left > 0) --read_faults_left;
    ++read_faults;
    return true;
  }

  class File final : public WritableFile {
   public:
    File(FaultInjectionFileSystem* fs, std::unique_ptr<WritableFile> base)
        : fs_(fs), base_(std::move(base)) {}
    absl::Status Append(std::string_view data) override {
      ++fs_->appends;
      if (fs_->short_write_at > 0 && fs_->appends == fs_->short_write_at) {
        absl::Status s = base_->Append(data.substr(0, data.size() / 2));
        if (!s.ok()) return s;
        return absl::ResourceExhaustedError("injected short write: No space left on device");
      }
      if (fs_->space_left >= 0) {
        if (static_cast<int64_t>(data.size()) > fs_->space_left) {
          absl::Status s = base_->Append(data.substr(0, fs_->space_left));
          fs_->space_left = 0;
          if (!s.ok()) return s;
          return absl::ResourceExhaustedError("injected: No space left on device");
        }
        fs_->space_left -= static_cast<int64_t>(data.size());
      }
      return base_->Append(data);
    }
    absl::Status Sync() override {
      if (fs_->fail_sync_at > 0 && ++fs_->syncs >= fs_->fail_sync_at) {
        return absl::InternalError("injected fsync failure: Input/output error");
      }
      return base_->Sync();
    }
    absl::Status Close() override { return base_->Close(); }

   private:
    FaultInjectionFileSystem* fs_;
    std::unique_ptr<WritableFile> base_;
  };

  FileSystem* base_;
};

}  // namespace trainsup::ckpt::testing

#endif  // TRAINSUP_TESTS_CHECKPOINT_FAULT_INJECTION_FS_H_
