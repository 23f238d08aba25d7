// The real trainsup-worker as a process: what it may read (confinement to
// the data roots the supervisor passes in TRAINSUP_DATA_ROOTS, every file
// as it is opened), what its exit file, which viewers of the run see, may
// say about the data, and what it does when the checkpoints' disk is full.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "contracts/exit_file.h"
#include "tests/common/small_fs.h"
#include "tests/worker/worker_process.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;
using testing::Launch;
using testing::LogPath;
using testing::ReadFile;
using testing::WaitStatus;

constexpr char kSecret[] = "hunter2-secret";

std::string Valid(const std::string& relative) {
  return std::string(TRAINSUP_TEST_DATA_DIR) + "/valid/" + relative;
}

// A scratch tree: TOP/roots/data is the one data root, TOP/outside is not
// in it, TOP/run is the run directory.
class WorkerProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    top_ = fs::path(::testing::TempDir()) /
           ("worker_main_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(top_);
    root_ = (top_ / "roots" / "data").string();
    outside_ = (top_ / "outside").string();
    run_ = (top_ / "run").string();
    for (const std::string& d : {root_, outside_, run_}) fs::create_directories(d);
    // Something an attacker would like to read, outside the roots.
    std::ofstream(outside_ + "/secret.txt") << kSecret << "\n";
  }
  void TearDown() override { fs::remove_all(top_); }

  void WriteSpec(const std::string& format, const std::string& data_lines, int in_channels) {
    std::ofstream(run_ + "/spec.toml")
        << "name = \"confined\"\n"
        << "[model]\nin_channels = " << in_channels << "\nvoxel_size = 0.1\n"
        << "[data]\nformat = \"" << format << "\"\n"
        << data_lines << "val_fraction = 0\n"
        << "[train]\nsteps = 1\ncheckpoint_every_steps = 0\n";
  }

  // Runs attempt 1 confined to the data root; returns its exit status.
  int RunConfined() {
    return WaitStatus(Launch(run_, 1, "none", {{"TRAINSUP_DATA_ROOTS", root_}}));
  }

  ExitFile Exit() {
    absl::StatusOr<ExitFile> f = ReadExitFile(ExitFilePath(run_, 1, 0));
    EXPECT_TRUE(f.ok()) << f.status() << "\n" << Log();
    return f.ok() ? *f : ExitFile{};
  }

  std::string Log() { return ReadFile(LogPath(run_, 1)); }

  fs::path top_;
  std::string root_, outside_, run_;
};

// A file inside a data directory that is a link out of the roots: the
// spec's data.path passed the submit check, the file does not.
TEST_F(WorkerProcess, DataFileLinkedOutOfTheRootsIsNotRead) {
  fs::create_directories(root_ + "/scenes");
  fs::copy_file(Valid("ply/points_le.ply"), root_ + "/scenes/a.ply");
  fs::copy_file(Valid("ply/points_le.ply"), outside_ + "/b.ply");
  fs::create_symlink(outside_ + "/b.ply", root_ + "/scenes/b.ply");
  WriteSpec("ply", "path = \"" + root_ + "/scenes\"\n", 3);
  const int status = RunConfined();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 65) << status << "\n" << Log();
  const ExitFile e = Exit();
  EXPECT_EQ(e.reason, "data");
  EXPECT_NE(e.message.find(root_ + "/scenes/b.ply: leads to " + outside_ + "/b.ply"),
            std::string::npos)
      << e.message;
  EXPECT_NE(e.message.find("outside the data roots (" + root_ + ")"), std::string::npos)
      << e.message;
}

// SemanticKITTI's labels/ sibling, found next to velodyne/, is a link out.
TEST_F(WorkerProcess, KittiLabelsSiblingLinkedOutIsNotRead) {
  const std::string seq = root_ + "/sequences/00";
  fs::create_directories(seq + "/velodyne");
  fs::copy_file(Valid("semantickitti/sequences/00/velodyne/000000.bin"),
                seq + "/velodyne/000000.bin");
  fs::create_directories(outside_ + "/labels");
  fs::copy_file(Valid("semantickitti/sequences/00/labels/000000.label"),
                outside_ + "/labels/000000.label");
  fs::create_directory_symlink(outside_ + "/labels", seq + "/labels");
  WriteSpec("semantickitti", "path = \"" + seq + "/velodyne/000000.bin\"\n", 1);
  const int status = RunConfined();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 65) << status << "\n" << Log();
  const ExitFile e = Exit();
  EXPECT_NE(e.message.find(seq + "/labels/000000.label: leads to " + outside_ +
                           "/labels/000000.label, outside the data roots"),
            std::string::npos)
      << e.message;
}

// An S3DIS room whose Annotations/ folder is a link out: not even listed.
TEST_F(WorkerProcess, S3disAnnotationsLinkedOutAreNotRead) {
  fs::create_directories(root_ + "/office_1");
  fs::copy(Valid("s3dis/Area_1/office_1/Annotations"), outside_ + "/Annotations");
  fs::create_directory_symlink(outside_ + "/Annotations", root_ + "/office_1/Annotations");
  WriteSpec("s3dis", "path = \"" + root_ + "/office_1\"\n", 3);
  const int status = RunConfined();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 65) << status << "\n" << Log();
  const ExitFile e = Exit();
  EXPECT_NE(e.message.find(root_ + "/office_1/Annotations: leads to " + outside_ +
                           "/Annotations, outside the data roots"),
            std::string::npos)
      << e.message;
}

// data.label_file itself is re-checked at the attempt: a link out of the
// roots (made after the submit check) is refused before it is opened, and
// the secret it points at appears nowhere.
TEST_F(WorkerProcess, LabelFileLinkedOutIsRefusedAndNothingOfItShown) {
  fs::copy_file(Valid("ply/side_labels.ply"), root_ + "/room.ply");
  fs::create_symlink(outside_ + "/secret.txt", root_ + "/labels.txt");
  WriteSpec("ply", "path = \"" + root_ + "/room.ply\"\nlabel_file = \"" + root_ + "/labels.txt\"\n",
            3);
  const int status = RunConfined();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 64) << status << "\n" << Log();
  const ExitFile e = Exit();
  EXPECT_NE(
      e.message.find("data.label_file: " + root_ + "/labels.txt resolves outside the data roots"),
      std::string::npos)
      << e.message;
  EXPECT_EQ(e.message.find(kSecret), std::string::npos) << e.message;
  EXPECT_EQ(Log().find(kSecret), std::string::npos) << Log();
}

// A bad label file inside the roots: the exit file (shown to every viewer
// of the run) says where and what is wrong but withholds what the file
// says; the rank's log has all of it.
TEST_F(WorkerProcess, ExitFileWithholdsTheDataFilesContent) {
  fs::copy_file(Valid("ply/side_labels.ply"), root_ + "/room.ply");
  std::ofstream(root_ + "/labels.txt") << kSecret << "\n1\n2\n-1\n";
  WriteSpec("ply", "path = \"" + root_ + "/room.ply\"\nlabel_file = \"" + root_ + "/labels.txt\"\n",
            3);
  const int status = RunConfined();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 65) << status << "\n" << Log();
  const ExitFile e = Exit();
  EXPECT_NE(e.message.find(root_ + "/labels.txt: line 1: '<withheld>' is not a label"),
            std::string::npos)
      << e.message;
  EXPECT_EQ(e.message.find(kSecret), std::string::npos) << e.message;
  EXPECT_NE(Log().find(std::string("line 1: '") + kSecret + "' is not a label"), std::string::npos)
      << Log();
}

// A data file far larger than data.max_file_mb (a sparse 1 TiB file) is
// refused before anything is allocated for it: exit 65 naming the file,
// not a bad_alloc abort that the supervisor would restart forever.
TEST_F(WorkerProcess, HugeDataFileExits65NamingIt) {
  const std::string huge = root_ + "/huge.ply";
  std::ofstream(huge) << "ply\n";
  fs::resize_file(huge, uint64_t{1} << 40);
  WriteSpec("ply", "path = \"" + huge + "\"\n", 3);
  const int status = RunConfined();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 65) << status << "\n" << Log();
  const ExitFile e = Exit();
  EXPECT_EQ(e.reason, "data");
  EXPECT_NE(e.message.find(huge + ": 1048576 MiB (1099511627776 bytes) is more than "
                                  "data.max_file_mb (4096 MiB)"),
            std::string::npos)
      << e.message;
}

// A FIFO among the data files (here the label side file) is not opened for
// a blocking read, which would hang the worker until someone wrote to it:
// exit 65 at once.
TEST_F(WorkerProcess, FifoAmongTheDataFilesExits65InsteadOfHanging) {
  fs::copy_file(Valid("ply/side_labels.ply"), root_ + "/room.ply");
  const std::string fifo = root_ + "/labels.txt";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  WriteSpec("ply", "path = \"" + root_ + "/room.ply\"\nlabel_file = \"" + fifo + "\"\n", 3);
  // The limit is a hang guard: a worker blocked in open(2) is killed.
  const int status = WaitStatus(Launch(run_, 1, "none", {{"TRAINSUP_DATA_ROOTS", root_}}),
                                std::chrono::seconds(60));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 65) << status << "\n" << Log();
  EXPECT_NE(Exit().message.find(fifo + ": not a regular file"), std::string::npos)
      << Exit().message;
}

// -- a full disk under the checkpoints ------------------------------------

// The run's checkpoints on a small tmpfs; the exit file is outside it.
class WorkerDiskFull : public WorkerProcess {
 protected:
  void Mount(uint64_t bytes) {
    disk_ = std::make_unique<trainsup::testing::SmallFileSystem>(run_ + "/checkpoints", bytes);
    if (!disk_->mounted()) GTEST_SKIP() << disk_->error();
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    disk_.reset();
    WorkerProcess::TearDown();
  }
  void WriteSyntheticSpec(int steps) {
    std::ofstream(run_ + "/spec.toml")
        << "name = \"full\"\n[model]\nin_channels = 3\nvoxel_size = 0.1\n"
        << "[data]\nformat = \"synthetic\"\nscenes = 4\nval_fraction = 0\n"
        << "[train]\nsteps = " << steps
        << "\ncheckpoint_every_steps = 2\nkeep_checkpoints = 1000\n";
  }
  bool Committed(int step) {
    return fs::exists(run_ + "/checkpoints/step-" + std::to_string(step) + "/MANIFEST.json");
  }
  std::unique_ptr<trainsup::testing::SmallFileSystem> disk_;
  pid_t pid_ = -1;  // a worker the test has not waited for
};

// A checkpoint (89 MB here) that finds the disk full is reported in the log
// and training goes on; once there is space again the next interval's
// checkpoint is written and the run completes.
TEST_F(WorkerDiskFull, TrainingGoesOnThroughAFullDisk) {
  Mount(uint64_t{512} << 20);
  WriteSyntheticSpec(12);
  pid_ = Launch(run_, 1, "none");
  // Polls `done` while the worker runs (a hang guard of 5 minutes).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  int early_status = -1;
  auto wait_for = [&](const std::function<bool()>& done) {
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &early_status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "the worker ended early, status " << early_status;
        return done();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  };
  ASSERT_TRUE(wait_for([&] { return Committed(2); })) << Log();
  ASSERT_TRUE(disk_->Fill());
  ASSERT_TRUE(wait_for([&] { return Log().find(" failed (") != std::string::npos; })) << Log();
  disk_->Free();
  const int status = WaitStatus(pid_);
  pid_ = -1;
  const std::string log = Log();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << log;
  const size_t failed = log.find(" failed (1 failed so far; newest checkpoint step-");
  ASSERT_NE(failed, std::string::npos) << log;
  EXPECT_NE(log.find("No space left on device (ENOSPC)", failed), std::string::npos) << log;
  EXPECT_NE(log.find("\nstep 12/12", failed), std::string::npos) << log;
  EXPECT_TRUE(Committed(12));
  EXPECT_EQ(Exit().reason, "completed");
}

// Not even one checkpoint fits: every save fails, training still runs to
// the end, and the final checkpoint's failure ends the attempt with 74.
TEST_F(WorkerDiskFull, NoSpaceForTheFinalCheckpointExits74) {
  Mount(uint64_t{1} << 20);
  WriteSyntheticSpec(4);
  const int status = WaitStatus(Launch(run_, 1, "none"));
  const std::string log = Log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 74) << status << "\n" << log;
  EXPECT_NE(log.find("checkpoint step-2 failed"), std::string::npos) << log;
  EXPECT_NE(log.find("\nstep 4/4"), std::string::npos) << log;
  const ExitFile e = Exit();
  EXPECT_EQ(e.code, 74);
  EXPECT_EQ(e.reason, "no_space");
  EXPECT_EQ(e.last_step, 4);
  EXPECT_NE(e.message.find("no space left in " + run_ +
                           "/checkpoints for checkpoint step-4 at the end of the run"),
            std::string::npos)
      << e.message;
  EXPECT_NE(e.message.find("No space left on device (ENOSPC)"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("the newest checkpoint kept is none"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace trainsup::worker
