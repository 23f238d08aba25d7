// Checkpoints written by the Python client (python/trainsup) are accepted by
// the C++ store the daemon chooses them with: each test runs the python3 of
// the tests' virtual environment, where the client is installed from its
// wheel (python/CMakeLists.txt), to write checkpoints, then verifies them with
// CheckpointStore::Verify and ChooseLatest (checkpoint/store.h).
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"

namespace trainsup::ckpt {
namespace {

using ::testing::HasSubstr;

// Runs `script` with the installed client, in `dir`, outside trainsupd.
int RunPython(const std::string& dir, const std::string& script) {
  const std::string path = dir + "/writer.py";
  std::ofstream(path) << script;
  const std::string command = "cd '" + dir + "' && env -u TRAINSUP_SUPERVISOR -u RANK " +
                              "-u PYTHONPATH " TRAINSUP_CLIENT_PYTHON " writer.py";
  return std::system(command.c_str());
}

std::vector<int64_t> Steps(CheckpointStore& store) {
  auto all = store.List();
  EXPECT_TRUE(all.ok()) << all.status();
  std::vector<int64_t> steps;
  for (const auto& c : *all) steps.push_back(c.step);
  return steps;
}

TEST(PythonCheckpointTest, ContextManagerCheckpointsVerify) {
  testing::TempDir dir("python_ckpt");
  // Files of 0 bytes, a few bytes, and several of the writer's 1 MiB read
  // chunks (the hash is computed across pieces); five steps, three kept.
  ASSERT_EQ(RunPython(dir.path(), R"(
import os, trainsup
for step in range(1, 6):
    with trainsup.checkpoint(step, root="ck", keep_last=3) as d:
        open(os.path.join(d, "empty"), "wb").close()
        open(os.path.join(d, "small.txt"), "w").write("step %d\n" % step)
        open(os.path.join(d, "big.bin"), "wb").write(bytes(range(256)) * (4096 * 3 + 7))
)"),
            0);
  CheckpointStore store(dir.path() + "/ck");
  EXPECT_EQ(Steps(store), (std::vector<int64_t>{3, 4, 5}));
  auto committed = store.List();
  ASSERT_TRUE(committed.ok()) << committed.status();
  for (const auto& c : *committed) {
    EXPECT_TRUE(store.Verify(c).ok()) << c.path << ": " << store.Verify(c);
    auto manifest = store.ReadManifest(c);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->step, c.step);
    ASSERT_EQ(manifest->files.size(), 3u);
    EXPECT_EQ(manifest->files[0].name, "big.bin");
    EXPECT_EQ(manifest->files[0].size, 256u * (4096 * 3 + 7));
  }
  std::vector<QuarantineReport> quarantined;
  auto latest = store.ChooseLatest(&quarantined);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 5);
  EXPECT_TRUE(quarantined.empty());
}

TEST(PythonCheckpointTest, ChangedByteIsCaughtAndTheOlderOneChosen) {
  testing::TempDir dir("python_ckpt");
  ASSERT_EQ(RunPython(dir.path(), R"(
import os, trainsup
for step in (10, 20):
    with trainsup.checkpoint(step, root="ck") as d:
        open(os.path.join(d, "w.bin"), "wb").write(b"abcdefgh" * 1000)
)"),
            0);
  {
    std::fstream f(dir.path() + "/ck/step-20/w.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('X');
  }
  CheckpointStore store(dir.path() + "/ck");
  const absl::Status s = store.Verify(CheckpointInfo{20, dir.path() + "/ck/step-20"});
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("does not match its hash"));
  std::vector<QuarantineReport> quarantined;
  auto latest = store.ChooseLatest(&quarantined);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 10);
  ASSERT_EQ(quarantined.size(), 1u);
  EXPECT_EQ(quarantined[0].step, 20);
}

TEST(PythonCheckpointTest, SaveCheckpointWithTorchAndReplaceAStep) {
  testing::TempDir dir("python_ckpt");
  const int rc = RunPython(dir.path(), R"(
import sys
try:
    import torch
except ImportError:
    sys.exit(3)
import trainsup
trainsup.save_checkpoint(7, {"w": torch.arange(10.0), "step": 7}, root="ck")
# The same step again replaces it (the old copy steps aside first).
trainsup.save_checkpoint(7, {"w": torch.ones(3), "step": 7}, root="ck")
)");
  if (WEXITSTATUS(rc) == 3) GTEST_SKIP() << "python3-torch is not installed for /usr/bin/python3";
  ASSERT_EQ(rc, 0);
  CheckpointStore store(dir.path() + "/ck");
  EXPECT_EQ(Steps(store), (std::vector<int64_t>{7}));
  const CheckpointInfo c{7, dir.path() + "/ck/step-7"};
  EXPECT_TRUE(store.Verify(c).ok()) << store.Verify(c);
  auto manifest = store.ReadManifest(c);
  ASSERT_TRUE(manifest.ok());
  ASSERT_EQ(manifest->files.size(), 1u);
  EXPECT_EQ(manifest->files[0].name, "state.pt");
  // Loaded back through the client from the path trainsupd would pass.
  ASSERT_EQ(RunPython(dir.path(), R"(
import os, torch, trainsup
os.environ["TRAINSUP_RESUME_FROM"] = os.path.abspath("ck/step-7")
assert trainsup.resume_step() == 7
state = trainsup.load_checkpoint()
assert torch.equal(state["w"], torch.ones(3)), state
)"),
            0);
}

TEST(PythonCheckpointTest, PythonAndCppCheckpointsShareAStore) {
  testing::TempDir dir("python_ckpt");
  const std::string root = dir.path() + "/ck";
  {
    CheckpointStore store(root);
    auto pending = store.Begin(3);
    ASSERT_TRUE(pending.ok());
    ASSERT_TRUE((*pending)->WriteFile("trainer.json", "{}").ok());
    ASSERT_TRUE(store.Commit(*std::move(pending)).ok());
  }
  // A leftover of an interrupted C++ save is cleaned up by the Python
  // client's next checkpoint, and its retention counts the C++ one.
  std::filesystem::create_directories(root + "/step-4.tmp");
  ASSERT_EQ(RunPython(dir.path(), R"(
import os, trainsup
with trainsup.checkpoint(5, root="ck", keep_last=1) as d:
    open(os.path.join(d, "x"), "wb").write(b"x")
)"),
            0);
  CheckpointStore store(root);
  EXPECT_EQ(Steps(store), (std::vector<int64_t>{5}));
  EXPECT_FALSE(std::filesystem::exists(root + "/step-4.tmp"));
  EXPECT_TRUE(store.Verify(CheckpointInfo{5, root + "/step-5"}).ok());
}

}  // namespace
}  // namespace trainsup::ckpt
