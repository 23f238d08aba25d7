// FileSystem::WriteFileAtomically: the one atomic small-file write of the
// project (spec.toml, exit files, token files), under injected faults.
#include "checkpoint/file_system.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "tests/checkpoint/fault_injection_fs.h"
#include "tests/common/temp_dir.h"

namespace trainsup::ckpt {
namespace {

using testing::FaultInjectionFileSystem;

std::string Read(const std::string& path) {
  absl::StatusOr<std::string> text = FileSystem::Default()->ReadSmallFile(path);
  return text.ok() ? *text : "<" + std::string(text.status().message()) + ">";
}

// Counts SyncDir calls on the way to the base file system.
class CountingFileSystem final : public FileSystem {
 public:
  using FileSystem::NewWritableFile;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                uint32_t mode) override {
    return base_->NewWritableFile(path, mode);
  }
  absl::Status ReadFile(const std::string& p,
                        const std::function<absl::Status(std::string_view)>& sink) override {
    return base_->ReadFile(p, sink);
  }
  absl::Status ReadAt(const std::string& p, uint64_t o, uint64_t n, char* out) override {
    return base_->ReadAt(p, o, n, out);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& p) override { return base_->FileSize(p); }
  bool Exists(const std::string& p) override { return base_->Exists(p); }
  absl::Status CreateDir(const std::string& p) override { return base_->CreateDir(p); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& p) override {
    return base_->ListDir(p);
  }
  bool IsDir(const std::string& p) override { return base_->IsDir(p); }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    return base_->Rename(a, b);
  }
  absl::Status DeleteFile(const std::string& p) override { return base_->DeleteFile(p); }
  absl::Status DeleteTree(const std::string& p) override { return base_->DeleteTree(p); }
  absl::Status SyncDir(const std::string& p) override {
    synced_dirs.push_back(p);
    return base_->SyncDir(p);
  }
  absl::Status SyncFile(const std::string& p) override { return base_->SyncFile(p); }

  std::vector<std::string> synced_dirs;

 private:
  FileSystem* base_ = FileSystem::Default();
};

TEST(WriteFileAtomically, ReplacesTheFileAndSyncsItsDirectory) {
  trainsup::testing::TempDir dir;
  const std::string path = dir.path() + "/spec.toml";
  CountingFileSystem fs;
  ASSERT_TRUE(fs.WriteFileAtomically(path, "old").ok());
  ASSERT_TRUE(fs.WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(Read(path), "new");
  EXPECT_FALSE(fs.Exists(path + ".tmp"));
  ASSERT_EQ(fs.synced_dirs.size(), 2u);
  EXPECT_EQ(fs.synced_dirs[0], dir.path());
}

TEST(WriteFileAtomically, DiskFullKeepsTheOldContentAndLeavesNoTemporary) {
  trainsup::testing::TempDir dir;
  const std::string path = dir.path() + "/f";
  ASSERT_TRUE(FileSystem::Default()->WriteFileAtomically(path, "old").ok());
  FaultInjectionFileSystem fs;
  fs.space_left = 2;
  absl::Status s = fs.WriteFileAtomically(path, "a longer new content");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(Read(path), "old");
  EXPECT_FALSE(fs.Exists(path + ".tmp"));
}

TEST(WriteFileAtomically, FsyncFailureIsAnErrorAndKeepsTheOldContent) {
  trainsup::testing::TempDir dir;
  const std::string path = dir.path() + "/f";
  ASSERT_TRUE(FileSystem::Default()->WriteFileAtomically(path, "old").ok());
  FaultInjectionFileSystem fs;
  fs.fail_sync_at = 1;
  EXPECT_FALSE(fs.WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(Read(path), "old");
}

TEST(WriteFileAtomically, CrashBeforeTheRenameKeepsTheOldContent) {
  trainsup::testing::TempDir dir;
  const std::string path = dir.path() + "/f";
  ASSERT_TRUE(FileSystem::Default()->WriteFileAtomically(path, "old").ok());
  FaultInjectionFileSystem fs;
  fs.crash_before_rename = true;
  EXPECT_FALSE(fs.WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(Read(path), "old");
}

TEST(WriteFileAtomically, AFailedDirectorySyncIsReported) {
  trainsup::testing::TempDir dir;
  FaultInjectionFileSystem fs;
  fs.fail_sync_at = 2;  // the file's fsync passes, the directory's fails
  absl::Status s = fs.WriteFileAtomically(dir.path() + "/f", "data");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(Read(dir.path() + "/f"), "data");
}

TEST(WriteFileAtomically, GivesTheModeEvenOverAStaleTemporary) {
  trainsup::testing::TempDir dir;
  const std::string path = dir.path() + "/operator.token";
  // A crash left a world-readable temporary behind.
  ASSERT_TRUE(FileSystem::Default()->WriteSmallFile(path + ".tmp", "stale").ok());
  ASSERT_EQ(chmod((path + ".tmp").c_str(), 0644), 0);
  ASSERT_TRUE(FileSystem::Default()->WriteFileAtomically(path, "secret\n", 0600).ok());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Read(path), "secret\n");
}

}  // namespace
}  // namespace trainsup::ckpt
