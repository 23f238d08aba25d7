// The exit file's writer goes through the checkpoint core's atomic write.
#include "contracts/exit_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

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

// A diverged exit names its first bad step; older files without the field
// read as -1.
TEST(ExitFile, FirstBadStepRoundTripsAndDefaultsToNone) {
  trainsup::testing::TempDir dir;
  ExitFile f;
  f.code = 79;
  f.reason = "diverged";
  f.first_bad_step = 37;
  ASSERT_TRUE(WriteExitFile(dir.path(), 2, 1, f).ok());
  absl::StatusOr<ExitFile> back = ReadExitFile(ExitFilePath(dir.path(), 2, 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->first_bad_step, 37);
  const std::string path = dir.path() + "/old.json";
  ASSERT_TRUE(FileSystem::Default()->WriteSmallFile(path, R"({"code": 1})").ok());
  EXPECT_EQ(ReadExitFile(path)->first_bad_step, -1);
}

// The content of a fresh exit file `json`, read back.
absl::StatusOr<ExitFile> ReadBack(const std::string& json) {
  trainsup::testing::TempDir dir;
  const std::string path = dir.path() + "/rank-0.exit.json";
  EXPECT_TRUE(FileSystem::Default()->WriteSmallFile(path, json).ok());
  return ReadExitFile(path);
}

// A number that does not fit its field is damage, not a value to narrow:
// 4294967439 must not read as 143 (2^32 + 143), nor 2^64 - 1 as -1.
TEST(ReadExitFile, NumbersOutsideTheirRangeAreDataLossNamingTheField) {
  const std::pair<const char*, const char*> bad[] = {
      {R"({"code": 4294967439})", "\"code\""},
      {R"({"code": 256})", "\"code\""},
      {R"({"code": -1})", "\"code\""},
      {R"({"code": 18446744073709551615})", "\"code\""},
      {R"({"code": 0, "last_step": 18446744073709551615})", "\"last_step\""},
      {R"({"code": 0, "last_step": -2})", "\"last_step\""},
      {R"({"code": 0, "time_ms": 9223372036854775808})", "\"time_ms\""},
      {R"({"code": 0, "time_ms": -5})", "\"time_ms\""},
      {R"({"code": 79, "first_bad_step": -2})", "\"first_bad_step\""},
      {R"({"code": 79, "first_bad_step": "5"})", "\"first_bad_step\""},
  };
  for (const auto& [json, field] : bad) {
    absl::StatusOr<ExitFile> f = ReadBack(json);
    ASSERT_FALSE(f.ok()) << json << " read as code " << f->code << " last_step " << f->last_step
                         << " time_ms " << f->time_ms;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_NE(f.status().message().find(field), absl::string_view::npos)
        << json << ": " << f.status();
  }
  absl::StatusOr<ExitFile> edge = ReadBack(
      R"({"code": 255, "last_step": 9223372036854775807, "time_ms": 9223372036854775807})");
  ASSERT_TRUE(edge.ok()) << edge.status();
  EXPECT_EQ(edge->code, 255);
  EXPECT_EQ(edge->last_step, INT64_MAX);
  absl::StatusOr<ExitFile> none = ReadBack(R"({"code": 0, "last_step": -1, "time_ms": 0})");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->last_step, -1);
}

// The run directory is the worker's: a FIFO (or a directory) where the exit
// file should be must not block the daemon, and a huge file is not read.
TEST(ReadExitFile, RefusesWhatIsNotASmallRegularFile) {
  trainsup::testing::TempDir dir;
  const std::string fifo = dir.path() + "/rank-0.exit.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Shared: on the old code the thread stays blocked after the test ends.
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  std::thread([done, fifo] { done->set_value(ReadExitFile(fifo).status()); }).detach();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "ReadExitFile blocked on a FIFO";
  const absl::Status s = result.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("not a regular file"), absl::string_view::npos) << s;

  EXPECT_EQ(ReadExitFile(dir.path()).status().code(), absl::StatusCode::kDataLoss);

  const std::string big = dir.path() + "/big.exit.json";
  ASSERT_TRUE(
      FileSystem::Default()
          ->WriteSmallFile(big, R"({"code": 0, "message": ")" + std::string(2 << 20, 'x') + "\"}")
          .ok());
  absl::StatusOr<ExitFile> f = ReadExitFile(big);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss) << f.status();
}

}  // namespace
}  // namespace trainsup
