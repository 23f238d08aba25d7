// The exit file's writer goes through the checkpoint core's atomic write.
#include "proto/exit_file.h"

#include <gtest/gtest.h>

#include "checkpoint/file_system.h"
#include "tests/checkpoint/fault_injection_fs.h"
#include "tests/common/temp_dir.h"

namespace trainsup {
namespace {

using ckpt::FileSystem;
using ckpt::testing::FaultInjectionFileSystem;

TEST(WriteExitFile, GoesThroughTheFileSystemItIsGiven) {
  trainsup::testing::TempDir dir;
  FaultInjectionFileSystem fs;
  fs.crash_before_rename = true;
  ExitFile f;
  f.code = 143;
  EXPECT_FALSE(WriteExitFile(&fs, dir.path(), 1, 0, f).ok());
  EXPECT_FALSE(FileSystem::Default()->Exists(ExitFilePath(dir.path(), 1, 0)));
  fs.crash_before_rename = false;
  ASSERT_TRUE(WriteExitFile(&fs, dir.path(), 1, 0, f).ok());
  absl::StatusOr<ExitFile> back = ReadExitFile(ExitFilePath(dir.path(), 1, 0));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->code, 143);
}

}  // namespace
}  // namespace trainsup
