#include "supervisor/sys/gpu_monitor.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMiB = 1 << 20;

class TempDir : public ::trainsup::testing::TempDir {
 public:
  TempDir() : ::trainsup::testing::TempDir("gpu_monitor_test") {}
};

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(NvmlMonitor, MissingLibraryIsUnavailableNotFatal) {
  std::unique_ptr<GpuMonitor> monitor = OpenNvmlMonitor("libtrainsup-no-such-nvml.so.1");
  ASSERT_NE(monitor, nullptr);
  EXPECT_FALSE(monitor->available());
  EXPECT_EQ(monitor->Query().status().code(), absl::StatusCode::kFailedPrecondition);
  // The start-up log says why: the name asked for and the loader's error.
  EXPECT_THAT(
      monitor->Describe(),
      ::testing::AllOf(::testing::HasSubstr("NVML: cannot load libtrainsup-no-such-nvml.so.1"),
                       ::testing::HasSubstr("No such file")));
}

TEST(NvmlMonitor, LibraryWithoutNvmlSymbolsIsUnavailable) {
  std::unique_ptr<GpuMonitor> monitor = OpenNvmlMonitor("libc.so.6");
  EXPECT_FALSE(monitor->available());
  EXPECT_EQ(monitor->Describe(), "NVML from libc.so.6: not initialized");
}

// The real library: on machines without a driver this is the "absent" case;
// with GPUs it must report each one consistently.
TEST(NvmlMonitor, DefaultLibraryEitherWorksOrIsUnavailable) {
  std::unique_ptr<GpuMonitor> monitor = OpenNvmlMonitor();
  ASSERT_NE(monitor, nullptr);
  if (!monitor->available()) {
    EXPECT_FALSE(monitor->Query().ok());
    return;
  }
  // The file the loader chose, by its full path, and the driver.
  EXPECT_THAT(monitor->Describe(), ::testing::MatchesRegex("NVML from /.*, driver [0-9].*"));
  absl::StatusOr<std::vector<GpuInfo>> gpus = monitor->Query();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  for (size_t i = 0; i < gpus->size(); ++i) {
    const GpuInfo& gpu = (*gpus)[i];
    EXPECT_EQ(gpu.index, static_cast<int>(i));
    EXPECT_EQ(gpu.uuid.rfind("GPU-", 0), 0u) << gpu.uuid;
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GT(gpu.memory_total, 0);
    EXPECT_LE(gpu.memory_used, gpu.memory_total);
  }
}

TEST(FakeMonitor, ReadsTheFileOnEveryQuery) {
  TempDir dir;
  const std::string path = dir.path() + "/gpus.json";
  std::unique_ptr<GpuMonitor> monitor = OpenFakeMonitor(path);
  EXPECT_EQ(monitor->Describe(), "the fake GPU file " + path);
  EXPECT_TRUE(monitor->available());
  EXPECT_EQ(monitor->Query().status().code(), absl::StatusCode::kNotFound);

  WriteFile(path, R"({"gpus": [
      {"uuid": "GPU-a", "name": "Fake A", "memory_total": 8589934592, "memory_used": 2147483648,
       "compute_pids": [42, 7]},
      {"uuid": "GPU-b"}]})");
  absl::StatusOr<std::vector<GpuInfo>> gpus = monitor->Query();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].index, 0);
  EXPECT_EQ((*gpus)[0].uuid, "GPU-a");
  EXPECT_EQ((*gpus)[0].name, "Fake A");
  EXPECT_EQ((*gpus)[0].memory_total, int64_t{8} << 30);
  EXPECT_EQ((*gpus)[0].memory_used, int64_t{2} << 30);
  EXPECT_EQ((*gpus)[0].compute_pids, (std::vector<int>{7, 42}));
  EXPECT_EQ((*gpus)[1].index, 1);
  EXPECT_EQ((*gpus)[1].uuid, "GPU-b");
  EXPECT_EQ((*gpus)[1].memory_used, 0);
  EXPECT_TRUE((*gpus)[1].compute_pids.empty());

  // The worker died: the test clears its pid and memory.
  WriteFile(path, R"({"gpus": [{"uuid": "GPU-a", "memory_total": 8589934592, "memory_used": 0}]})");
  gpus = monitor->Query();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_TRUE((*gpus)[0].compute_pids.empty());
  EXPECT_EQ((*gpus)[0].memory_used, 0);
}

TEST(FakeMonitor, MalformedFilesAreInvalidArgument) {
  TempDir dir;
  const std::string path = dir.path() + "/gpus.json";
  std::unique_ptr<GpuMonitor> monitor = OpenFakeMonitor(path);
  for (const char* text : {"{", "[]", R"({"gpus": {}})", R"({"gpus": [{"name": "x"}]})",
                           R"({"gpus": [{"uuid": "u", "memory_used": -1}]})",
                           R"({"gpus": [{"uuid": "u", "compute_pids": ["1"]}]})",
                           R"({"gpus": [{"uuid": "u", "lost": 1}]})",
                           R"({"gpus": [{"uuid": "u", "ecc_uncorrected": -2}]})",
                           R"({"gpus": [{"uuid": "u", "retired_pages_pending": "yes"}]})",
                           R"({"gpus": [{"uuid": "u", "xids": [79, "48"]}]})"}) {
    WriteFile(path, text);
    EXPECT_EQ(monitor->Query().status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

// The health facts of the fake file (docs/distributed.md, "Elastic"), as
// the NVML monitor reports them; a lost GPU stays listed.
TEST(FakeMonitor, ReadsTheHealthFacts) {
  TempDir dir;
  const std::string path = dir.path() + "/gpus.json";
  std::unique_ptr<GpuMonitor> monitor = OpenFakeMonitor(path);
  WriteFile(path, R"({"gpus": [{"uuid": "a"},
                               {"uuid": "b", "lost": true},
                               {"uuid": "c", "ecc_uncorrected": 3, "retired_pages_pending": true,
                                "xids": [13, 79],
                                "health_error": "nvmlDeviceGetTotalEccErrors failed: Unknown Error"}]})");
  absl::StatusOr<std::vector<GpuInfo>> gpus = monitor->Query();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 3u);
  EXPECT_FALSE((*gpus)[0].lost);
  EXPECT_EQ((*gpus)[0].ecc_uncorrected, 0);
  EXPECT_TRUE((*gpus)[1].lost);
  EXPECT_EQ((*gpus)[1].index, 1);
  EXPECT_EQ((*gpus)[2].ecc_uncorrected, 3);
  EXPECT_TRUE((*gpus)[2].retired_pages_pending);
  EXPECT_EQ((*gpus)[2].xids, (std::vector<int>{13, 79}));
  EXPECT_EQ((*gpus)[0].health_error, "");
  EXPECT_EQ((*gpus)[2].health_error, "nvmlDeviceGetTotalEccErrors failed: Unknown Error");
}

// Unlike NVML's events, the file's Xids are its GPU's state: reported at
// every query until the file drops them.
TEST(FakeMonitor, XidsAreReportedWhileTheFileListsThem) {
  TempDir dir;
  const std::string path = dir.path() + "/gpus.json";
  std::unique_ptr<GpuMonitor> monitor = OpenFakeMonitor(path);
  WriteFile(path, R"({"gpus": [{"uuid": "a", "xids": [79]}]})");
  for (int query = 0; query < 2; ++query) {
    absl::StatusOr<std::vector<GpuInfo>> gpus = monitor->Query();
    ASSERT_TRUE(gpus.ok()) << gpus.status();
    EXPECT_EQ((*gpus)[0].xids, std::vector<int>{79}) << "query " << query;
  }
  WriteFile(path, R"({"gpus": [{"uuid": "a"}]})");
  absl::StatusOr<std::vector<GpuInfo>> gpus = monitor->Query();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_TRUE((*gpus)[0].xids.empty());
}

TEST(FakeMonitor, AMalformedHealthKeyNamesTheGpuAndTheKey) {
  TempDir dir;
  const std::string path = dir.path() + "/gpus.json";
  std::unique_ptr<GpuMonitor> monitor = OpenFakeMonitor(path);
  const std::pair<const char*, const char*> cases[] = {
      {R"({"gpus": [{"uuid": "a"}, {"uuid": "b", "lost": "yes"}]})", "gpus[1].lost"},
      {R"({"gpus": [{"uuid": "a", "health_error": 3}]})", "gpus[0].health_error"},
      {R"({"gpus": [{"uuid": "a", "ecc_uncorrected": "3"}]})", "gpus[0].ecc_uncorrected"},
      {R"({"gpus": [{"uuid": "a", "ecc_uncorrected": 1.5}]})", "gpus[0].ecc_uncorrected"},
      {R"({"gpus": [{"uuid": "a", "retired_pages_pending": 1}]})", "gpus[0].retired_pages_pending"},
      {R"({"gpus": [{"uuid": "a"}, {"uuid": "b"}, {"uuid": "c", "xids": 79}]})", "gpus[2].xids"},
      {R"({"gpus": [{"uuid": "a", "xids": [79.5]}]})", "gpus[0].xids"},
      {R"({"gpus": [{"uuid": "a", "name": 5}]})", "gpus[0].name"},
  };
  for (const auto& [text, where] : cases) {
    WriteFile(path, text);
    const absl::Status status = monitor->Query().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(std::string(status.message()).find(where), std::string::npos)
        << text << " -> " << status;
  }
}

GpuInfo Gpu(int64_t used, std::vector<int> pids) {
  GpuInfo gpu;
  gpu.index = 3;
  gpu.uuid = "GPU-x";
  gpu.memory_total = 80 * 1024 * kMiB;
  gpu.memory_used = used;
  gpu.compute_pids = std::move(pids);
  return gpu;
}

TEST(CheckReleased, IdleGpuIsReleased) {
  const ReleaseCheck check = CheckReleased(Gpu(500 * kMiB, {}), 1024 * kMiB);
  EXPECT_TRUE(check.released);
  EXPECT_TRUE(check.holders.empty());
  EXPECT_NE(check.reason.find("released"), std::string::npos);
}

TEST(CheckReleased, MemoryAtTheIdleLevelCountsAsReleased) {
  EXPECT_TRUE(CheckReleased(Gpu(1024 * kMiB, {}), 1024 * kMiB).released);
  EXPECT_FALSE(CheckReleased(Gpu(1024 * kMiB + 1, {}), 1024 * kMiB).released);
}

TEST(CheckReleased, RemainingComputeProcessesAreHolders) {
  const ReleaseCheck check = CheckReleased(Gpu(0, {1234, 5678}), 1024 * kMiB);
  EXPECT_FALSE(check.released);
  EXPECT_EQ(check.holders, (std::vector<int>{1234, 5678}));
  EXPECT_NE(check.reason.find("1234, 5678"), std::string::npos) << check.reason;
  EXPECT_NE(check.reason.find("GPU-x"), std::string::npos) << check.reason;
}

TEST(CheckReleased, MemoryHeldWithoutAProcessIsNotReleased) {
  const ReleaseCheck check = CheckReleased(Gpu(30 * 1024 * kMiB, {}), 1024 * kMiB);
  EXPECT_FALSE(check.released);
  EXPECT_TRUE(check.holders.empty());
  EXPECT_NE(check.reason.find("30720 MiB"), std::string::npos) << check.reason;
}

}  // namespace
}  // namespace trainsup::supervisor
