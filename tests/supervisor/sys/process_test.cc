#include "supervisor/sys/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

namespace fs = std::filesystem;

class TempDir : public ::trainsup::testing::TempDir {
 public:
  TempDir() : ::trainsup::testing::TempDir("process_test") {}
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Reaps `pid` and returns its wait status.
int Reap(int pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Waits for a condition that other processes make true; false if it never
// does (a generous cap, so a slow machine only makes the test slower).
bool Eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 3000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

const std::map<std::string, std::string> kPath = {{"PATH", "/usr/bin:/bin"}};

LaunchedProcess LaunchOrDie(const std::vector<std::string>& args, const std::string& log = "") {
  absl::StatusOr<LaunchedProcess> launched = Launch({"/bin/sh", args, kPath, "", log});
  EXPECT_TRUE(launched.ok()) << launched.status();
  return launched.ok() ? *launched : LaunchedProcess{};
}

TEST(Launch, ChildLeadsItsOwnProcessGroup) {
  const LaunchedProcess child = LaunchOrDie({"-c", "exec sleep 30"});
  ASSERT_GT(child.pid, 0);
  EXPECT_EQ(child.pgid, child.pid);
  EXPECT_EQ(getpgid(child.pid), child.pid);
  EXPECT_NE(getpgid(child.pid), getpgrp());
  kill(child.pid, SIGKILL);
  const int status = Reap(child.pid);
  EXPECT_TRUE(WIFSIGNALED(status));
}

TEST(Launch, EnvironmentIsExactlyTheGivenOne) {
  TempDir dir;
  const std::string log = dir.path() + "/env.log";
  absl::StatusOr<LaunchedProcess> child = Launch({"/usr/bin/env", {}, {{"FOO", "bar"}}, "", log});
  ASSERT_TRUE(child.ok()) << child.status();
  const int status = Reap(child->pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(ReadFile(log), "FOO=bar\n");
}

// Issue 42, 8: a command run executes the real path it checked, under the
// name it was given as argv[0].
TEST(Launch, Argv0CanNameTheProgramOtherThanItsPath) {
  TempDir dir;
  const std::string log = dir.path() + "/argv0.log";
  LaunchSpec spec{"/bin/sh", {"-c", "tr '\\0' ' ' < /proc/$$/cmdline"}, {}, "", log};
  spec.argv0 = "/opt/venv/bin/sh";
  absl::StatusOr<LaunchedProcess> child = Launch(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(WEXITSTATUS(Reap(child->pid)), 0);
  EXPECT_EQ(ReadFile(log).rfind("/opt/venv/bin/sh -c ", 0), 0u) << ReadFile(log);
}

TEST(Launch, OutputIsAppendedToTheLogAndStdinIsDevNull) {
  TempDir dir;
  const std::string log = dir.path() + "/a/b/worker.log";
  fs::create_directories(dir.path() + "/a/b");
  WriteFile(log, "earlier\n");
  const LaunchedProcess child = LaunchOrDie(
      {"-c", "echo out; echo err >&2; readlink /proc/self/fd/0; pwd", "ignored-arg0"}, log);
  EXPECT_EQ(WEXITSTATUS(Reap(child.pid)), 0);
  EXPECT_EQ(ReadFile(log), "earlier\nout\nerr\n/dev/null\n" + fs::current_path().string() + "\n");
}

TEST(Launch, CreatesTheLogPrivatelyAndHonoursWorkingDir) {
  TempDir dir;
  const std::string log = dir.path() + "/new/dir/worker.log";
  absl::StatusOr<LaunchedProcess> child =
      Launch({"/bin/sh", {"-c", "pwd"}, kPath, dir.path(), log});
  ASSERT_TRUE(child.ok()) << child.status();
  Reap(child->pid);
  EXPECT_EQ(ReadFile(log), fs::canonical(dir.path()).string() + "\n");
  struct stat st;
  ASSERT_EQ(stat(log.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0007, 0u);  // never readable by others

  absl::StatusOr<LaunchedProcess> bad_dir =
      Launch({"/bin/sh", {"-c", "true"}, kPath, dir.path() + "/missing", log});
  EXPECT_EQ(bad_dir.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Launch, ExecFailureNamesTheBinaryAndLeavesNoZombie) {
  TempDir dir;
  absl::StatusOr<LaunchedProcess> missing =
      Launch({dir.path() + "/no-such-worker", {}, {}, "", ""});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no-such-worker"), absl::string_view::npos);

  const std::string not_executable = dir.path() + "/data.txt";
  WriteFile(not_executable, "not a program");
  absl::StatusOr<LaunchedProcess> denied = Launch({not_executable, {}, {}, "", ""});
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(denied.status().message().find(not_executable), absl::string_view::npos);

  absl::StatusOr<LaunchedProcess> not_on_path = Launch({"trainsup-no-such-tool", {}, {}, "", ""});
  EXPECT_EQ(not_on_path.status().code(), absl::StatusCode::kNotFound);

  // Every forked child was reaped: this process has no children left.
  const int reaped = waitpid(-1, nullptr, WNOHANG);
  const int err = errno;
  EXPECT_EQ(reaped, -1);
  EXPECT_EQ(err, ECHILD);
}

TEST(ProcessIdentity, StartTicksTellProcessesApart) {
  const LaunchedProcess child = LaunchOrDie({"-c", "exec sleep 30"});
  absl::StatusOr<uint64_t> ticks = ProcessStartTicks(child.pid);
  ASSERT_TRUE(ticks.ok()) << ticks.status();
  EXPECT_EQ(*ticks, child.start_ticks);
  EXPECT_TRUE(IsSameProcess(child.pid, child.start_ticks));
  EXPECT_FALSE(IsSameProcess(child.pid, child.start_ticks + 1));  // a reused pid

  kill(child.pid, SIGKILL);
  absl::StatusOr<int> pidfd = PidfdOpen(child.pid);
  ASSERT_TRUE(pidfd.ok()) << pidfd.status();
  pollfd pfd{*pidfd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, -1), 1);
  close(*pidfd);
  // A zombie still has its stat but is not alive.
  EXPECT_TRUE(ProcessStartTicks(child.pid).ok());
  EXPECT_FALSE(IsSameProcess(child.pid, child.start_ticks));
  Reap(child.pid);
  EXPECT_EQ(ProcessStartTicks(child.pid).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(IsSameProcess(child.pid, child.start_ticks));
}

TEST(Pidfd, BecomesReadableWhenTheProcessExits) {
  const LaunchedProcess child = LaunchOrDie({"-c", "exec sleep 30"});
  absl::StatusOr<int> pidfd = PidfdOpen(child.pid);
  ASSERT_TRUE(pidfd.ok()) << pidfd.status();
  pollfd pfd{*pidfd, POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 0), 0);  // running: not readable
  kill(child.pid, SIGTERM);
  ASSERT_EQ(poll(&pfd, 1, -1), 1);
  EXPECT_TRUE(pfd.revents & POLLIN);
  close(*pidfd);
  EXPECT_TRUE(WIFSIGNALED(Reap(child.pid)));
  EXPECT_EQ(PidfdOpen(child.pid).status().code(), absl::StatusCode::kNotFound);
}

TEST(ProcessGroup, MembersIncludeGrandchildrenAndAllDieTogether) {
  const LaunchedProcess child = LaunchOrDie({"-c", "sleep 30 & sleep 30; wait"});
  // sh, the background sleep and the foreground sleep.
  ASSERT_TRUE(Eventually([&] { return ProcessGroupMembers(child.pgid).size() == 3; }))
      << ProcessGroupMembers(child.pgid).size();
  const std::vector<int> members = ProcessGroupMembers(child.pgid);
  EXPECT_NE(std::find(members.begin(), members.end(), child.pid), members.end());
  EXPECT_TRUE(std::is_sorted(members.begin(), members.end()));
  EXPECT_TRUE(ProcessGroupAlive(child.pgid));
  EXPECT_TRUE(ProcessGroupMembers(getpgrp()).size() >= 1);

  ASSERT_TRUE(SignalProcessGroup(child.pgid, SIGKILL).ok());
  EXPECT_TRUE(WIFSIGNALED(Reap(child.pid)));
  // The grandchildren were killed too (init reaps them; zombies do not count).
  EXPECT_TRUE(Eventually([&] { return !ProcessGroupAlive(child.pgid); }));
  EXPECT_TRUE(ProcessGroupMembers(child.pgid).empty());
  EXPECT_TRUE(SignalProcessGroup(child.pgid, SIGKILL).ok());  // gone: ESRCH is fine
}

TEST(ProcessGroup, RefusesToSignalSpecialGroups) {
  for (int pgid : {-7, 0, 1}) {
    EXPECT_EQ(SignalProcessGroup(pgid, 0).code(), absl::StatusCode::kInvalidArgument) << pgid;
  }
  EXPECT_FALSE(ProcessGroupAlive(0));
}

TEST(CaptureStacks, WritesTheStacksOfASleepingProcess) {
  TempDir dir;
  const std::string log = dir.path() + "/worker.log";
  const LaunchedProcess child = LaunchOrDie({"-c", "exec sleep 30"});
  // Launch returns once the shell runs; the stacks are those of sleep.
  ASSERT_TRUE(Eventually(
      [&] { return ReadFile("/proc/" + std::to_string(child.pid) + "/comm") == "sleep\n"; }));
  absl::StatusOr<std::string> used = CaptureStacks(child.pid, log, 60);
  const std::string text = ReadFile(log);
  kill(child.pid, SIGKILL);
  Reap(child.pid);
  if (used.status().code() == absl::StatusCode::kPermissionDenied) {
    // The fallback summary is still written.
    EXPECT_NE(text.find("thread " + std::to_string(child.pid) + " (sleep)"), std::string::npos)
        << text;
    GTEST_SKIP() << "ptrace not permitted here: " << used.status();
  }
  ASSERT_TRUE(used.ok()) << used.status() << "\n" << text;
  EXPECT_NE(text.find("=== stacks of pid " + std::to_string(child.pid) + " by " + *used),
            std::string::npos)
      << text;
  if (*used == "proc") {
    EXPECT_NE(text.find("thread " + std::to_string(child.pid) + " (sleep)"), std::string::npos)
        << text;
  } else {
    EXPECT_NE(text.find("#0 "), std::string::npos) << text;  // at least one frame
  }
  EXPECT_FALSE(fs::exists(log + ".stacks-" + std::to_string(child.pid) + ".tmp"));
}

TEST(CaptureStacks, MissingProcessIsNotFound) {
  TempDir dir;
  const LaunchedProcess child = LaunchOrDie({"-c", "exit 0"});
  Reap(child.pid);
  EXPECT_EQ(CaptureStacks(child.pid, dir.path() + "/log", 5).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RotateLog, KeepsTheNewestCopies) {
  TempDir dir;
  const std::string log = dir.path() + "/w.log";
  absl::StatusOr<bool> rotated = RotateLogIfLarger(log, 10, 2);
  ASSERT_TRUE(rotated.ok());
  EXPECT_FALSE(*rotated);  // no file yet

  WriteFile(log, "0123456789");
  rotated = RotateLogIfLarger(log, 10, 2);
  ASSERT_TRUE(rotated.ok());
  EXPECT_FALSE(*rotated);  // not larger than the limit

  for (const std::string content : {"AAAAAAAAAAAA", "BBBBBBBBBBBB", "CCCCCCCCCCCC"}) {
    WriteFile(log, content);
    rotated = RotateLogIfLarger(log, 10, 2);
    ASSERT_TRUE(rotated.ok()) << rotated.status();
    EXPECT_TRUE(*rotated);
    EXPECT_EQ(ReadFile(log), "");
    EXPECT_EQ(ReadFile(log + ".1"), content);
  }
  EXPECT_EQ(ReadFile(log + ".2"), "BBBBBBBBBBBB");
  EXPECT_FALSE(fs::exists(log + ".3"));
}

TEST(RotateLog, WriterKeepsAppendingAfterTruncation) {
  TempDir dir;
  const std::string log = dir.path() + "/w.log";
  const int fd = open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0640);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "first line\n", 11), 11);
  absl::StatusOr<bool> rotated = RotateLogIfLarger(log, 4, 1);
  ASSERT_TRUE(rotated.ok() && *rotated);
  ASSERT_EQ(write(fd, "next\n", 5), 5);
  close(fd);
  EXPECT_EQ(ReadFile(log), "next\n");  // at offset 0, no hole
  EXPECT_EQ(ReadFile(log + ".1"), "first line\n");
}

TEST(RotateLog, KeepZeroOnlyTruncates) {
  TempDir dir;
  const std::string log = dir.path() + "/w.log";
  WriteFile(log, "0123456789");
  absl::StatusOr<bool> rotated = RotateLogIfLarger(log, 5, 0);
  ASSERT_TRUE(rotated.ok() && *rotated);
  EXPECT_EQ(fs::file_size(log), 0u);
  EXPECT_FALSE(fs::exists(log + ".1"));
}

}  // namespace
}  // namespace trainsup::supervisor
