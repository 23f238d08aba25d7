// Process utilities for the daemon: launching a worker in its own process
// group, identifying a process across pid reuse, watching it exit through a
// pidfd, signalling its whole group, capturing its stacks, and rotating its
// log. Linux only (/proc, pidfd_open). The caller owns reaping: nothing here
// waits on a child it did not start itself.
#ifndef TRAINSUP_SUPERVISOR_SYS_PROCESS_H_
#define TRAINSUP_SUPERVISOR_SYS_PROCESS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "supervisor/policy/group_identity.h"
#include "supervisor/policy/launch_spec.h"

namespace trainsup::supervisor {

struct LaunchedProcess {
  int pid = 0;
  int pgid = 0;              // == pid: the child leads a new process group
  uint64_t start_ticks = 0;  // ProcessStartTicks(pid), to recognize it later
};

// Starts the child in a new process group with stdin from /dev/null and
// returns once exec succeeded. NotFound when the binary does not exist,
// InvalidArgument naming it when it cannot be executed, Internal for other
// failures (the log cannot be opened, fork fails). The child is not waited
// on here: the caller must reap it (waitpid) to avoid a zombie.
absl::StatusOr<LaunchedProcess> Launch(const LaunchSpec& spec);

// Field 22 of /proc/PID/stat (start time in clock ticks since boot): with
// the pid it identifies a process uniquely. NotFound if there is no such
// process.
absl::StatusOr<uint64_t> ProcessStartTicks(int pid);

// Whether `pid` is alive (a zombie is not) and is the process that started
// at `start_ticks`, not a later one that reused its pid.
bool IsSameProcess(int pid, uint64_t start_ticks);

// pidfd_open(2): a close-on-exec descriptor that polls readable once the
// process has exited (before it is reaped). NotFound if it does not exist,
// Unimplemented if the kernel lacks pidfd_open (ENOSYS, or a seccomp
// profile that says so), ResourceExhausted for EMFILE/ENFILE, Internal
// otherwise. The caller closes it, and falls back to SIGCHLD and /proc
// polling when it fails.
absl::StatusOr<int> PidfdOpen(int pid);

// waitpid(pid, WNOHANG): never blocks.
struct ReapResult {
  enum State { kRunning, kReaped, kNotOurs };  // kNotOurs: ECHILD
  State state = kRunning;
  bool exited = false;     // WIFEXITED
  int code_or_signal = 0;  // WEXITSTATUS or WTERMSIG
};
ReapResult ReapIfExited(int pid);

// Clock ticks since boot now (the clock of ProcessStartTicks), and a unix
// time in ms on that clock (0 for times before boot).
uint64_t BootTicksNow();
uint64_t WallMsToBootTicks(int64_t wall_ms);

// The live members of process group `pgid` with their start times, from
// /proc (zombies excluded).
std::vector<GroupMember> ReadGroupMembers(int pgid);

// JudgeGroup over ReadGroupMembers: whether the group is still the worker's.
GroupOwnership CheckGroup(const GroupIdentity& identity);

// Signals the worker's group only if it still is the worker's (CheckGroup):
// OK when signalled or already gone, FailedPrecondition naming the stranger
// when the id was reused (nothing is signalled then).
absl::Status SignalWorkerGroup(const GroupIdentity& identity, int sig);

// Pids whose process group is `pgid`, from /proc/*/stat, ascending. Zombies
// are excluded: they hold no memory or GPU and cannot be signalled away.
std::vector<int> ProcessGroupMembers(int pgid);

// kill(-pgid, sig). A group that no longer exists (ESRCH) is OK.
// InvalidArgument for pgid <= 1 (which would signal the caller's own group
// or every process), PermissionDenied for EPERM.
absl::Status SignalProcessGroup(int pgid, int sig);

// Whether any process of the group is alive (zombies do not count).
bool ProcessGroupAlive(int pgid);

// Appends the stacks of all threads of `pid` to `log_path` under a header
// line naming the pid and the tool. Uses `gdb -p PID -batch -ex "thread
// apply all bt"` if gdb is on PATH, else `eu-stack -p PID`, killing the tool
// after `timeout_s`; with neither, writes each thread's id, name, state and
// wchan from /proc/PID/task. Returns the source used: "gdb", "eu-stack" or
// "proc". When the tool fails, the /proc summary is appended anyway and the
// error carries the tool's complaint: PermissionDenied when ptrace is not
// permitted, DeadlineExceeded on timeout, Internal otherwise. NotFound when
// the process does not exist.
absl::StatusOr<std::string> CaptureStacks(int pid, const std::string& log_path, double timeout_s);

// Copy-truncate rotation (logrotate's copytruncate), which keeps the
// writer's O_APPEND descriptor valid: when `path` is larger than
// `max_bytes`, shifts path.1 -> path.2 ... up to path.<keep> (the oldest is
// removed), copies path to path.1, truncates path to 0 and returns true.
// With keep == 0 it only truncates. Lines written between the copy and the
// truncation are lost. A missing file is false, not an error.
absl::StatusOr<bool> RotateLogIfLarger(const std::string& path, int64_t max_bytes, int keep);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_SYS_PROCESS_H_
