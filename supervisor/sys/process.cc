#include "supervisor/sys/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
// glibc 2.36's <sys/pidfd.h> lacks its extern "C" block.
extern "C" {
#include <sys/pidfd.h>
}
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/env.hpp>
#include <boost/process/environment.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/extend.hpp>
#include <boost/process/io.hpp>
#include <boost/process/search_path.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainsup::supervisor {
namespace {

namespace bp = boost::process;
namespace fs = std::filesystem;

std::string ErrnoText(int err) { return std::strerror(err); }

// Reads a small file; nullopt if it cannot be read.
std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The fields of /proc/<pid>/stat from field 3 (state) on: the command name
// (field 2) may contain spaces and parentheses, so parsing starts after the
// last ')'.
std::optional<std::vector<std::string>> StatFields(const std::string& stat_path) {
  std::optional<std::string> text = ReadText(stat_path);
  if (!text) return std::nullopt;
  const size_t close = text->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> fields =
      absl::StrSplit(text->substr(close + 1), ' ', absl::SkipWhitespace());
  if (fields.size() < 20) return std::nullopt;
  return fields;
}

// Index into StatFields() of stat field `n` (1-based, n >= 3).
constexpr size_t Field(int n) { return static_cast<size_t>(n - 3); }

bool IsZombie(const std::vector<std::string>& fields) {
  return fields[Field(3)] == "Z" || fields[Field(3)] == "X";
}

// Finds `name` in the daemon's PATH; "" if absent.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string Now() {
  char buf[64];
  const time_t t = time(nullptr);
  struct tm tm;
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", localtime_r(&t, &tm));
  return buf;
}

absl::Status AppendToFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", ErrnoText(errno)));
  const ssize_t n = write(fd, text.data(), text.size());
  const int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

// One line per thread: id, name, state and kernel wait channel.
std::string ProcThreadSummary(int pid) {
  std::vector<int> tids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    int tid;
    if (absl::SimpleAtoi(entry.path().filename().string(), &tid)) tids.push_back(tid);
  }
  std::sort(tids.begin(), tids.end());
  std::string out;
  for (int tid : tids) {
    const std::string dir = absl::StrCat("/proc/", pid, "/task/", tid);
    std::string comm = ReadText(dir + "/comm").value_or("?");
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    std::optional<std::vector<std::string>> fields = StatFields(dir + "/stat");
    const std::string state = fields ? (*fields)[Field(3)] : "?";
    std::string wchan = ReadText(dir + "/wchan").value_or("?");
    if (wchan.empty() || wchan == "0") wchan = "-";
    absl::StrAppend(&out, "thread ", tid, " (", comm, ") state ", state, " wchan ", wchan, "\n");
  }
  return out;
}

// Last non-empty line of `text`, for error messages.
std::string LastLine(const std::string& text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  return lines.empty() ? "no output" : std::string(lines.back());
}

}  // namespace

absl::StatusOr<LaunchedProcess> Launch(const LaunchSpec& spec) {
  std::string exe = spec.binary;
  if (exe.empty()) return absl::InvalidArgumentError("no binary to launch");
  if (exe.find('/') == std::string::npos) {
    exe = bp::search_path(spec.binary).string();
    if (exe.empty()) return absl::NotFoundError(absl::StrCat("'", spec.binary, "' is not on PATH"));
  }
  if (!spec.working_dir.empty() && access(spec.working_dir.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("working directory ", spec.working_dir, ": ", ErrnoText(errno)));
  }
  std::string log_path = spec.log_path.empty() ? "/dev/null" : spec.log_path;
  if (!spec.log_path.empty()) {
    std::error_code ec;
    fs::create_directories(fs::path(log_path).parent_path(), ec);
  }
  // Close-on-exec here; the child's dup2 copies on 1 and 2 are not.
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open log ", log_path, ": ", ErrnoText(errno)));
  }
  bp::environment env;
  for (const auto& [key, value] : spec.env) env[key] = value;
  const std::string dir = spec.working_dir;

  std::error_code ec;
  // Runs in the child between fork and exec: async-signal-safe calls only.
  const std::string argv0 = spec.argv0;
  auto setup = [log_fd, &dir, &argv0](auto& executor) {
    // The argv array was built before the fork: only its first pointer
    // changes, to a string that lives in this copy of the parent's memory.
    if (!argv0.empty()) const_cast<char**>(executor.cmd_line)[0] = const_cast<char*>(argv0.c_str());
    setpgid(0, 0);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    if (!dir.empty() && chdir(dir.c_str()) != 0) _exit(127);
  };
  // Boost.Process reaps a child whose exec failed only with WNOHANG; the
  // child may not have exited yet, so reap it for certain.
  auto on_error = [](auto& executor, const std::error_code&) {
    if (executor.pid > 0) waitpid(executor.pid, nullptr, 0);
  };
  bp::child child(bp::exe = exe, bp::args = spec.args, env, bp::std_in < bp::null,
                  bp::extend::on_exec_setup = setup, bp::extend::on_error = on_error, ec);
  close(log_fd);
  if (ec) {
    const std::string what = absl::StrCat("cannot execute ", exe, ": ", ec.message());
    return ec.value() == ENOENT ? absl::NotFoundError(what) : absl::InvalidArgumentError(what);
  }
  LaunchedProcess launched;
  launched.pid = child.id();
  launched.pgid = launched.pid;
  child.detach();
  // A child that already exited is a zombie until reaped; its stat remains.
  absl::StatusOr<uint64_t> ticks = ProcessStartTicks(launched.pid);
  if (ticks.ok()) launched.start_ticks = *ticks;
  return launched;
}

absl::StatusOr<uint64_t> ProcessStartTicks(int pid) {
  std::optional<std::vector<std::string>> fields = StatFields(absl::StrCat("/proc/", pid, "/stat"));
  uint64_t ticks;
  if (!fields || !absl::SimpleAtoi((*fields)[Field(22)], &ticks)) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  return ticks;
}

bool IsSameProcess(int pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  std::optional<std::vector<std::string>> fields = StatFields(absl::StrCat("/proc/", pid, "/stat"));
  uint64_t ticks;
  return fields && !IsZombie(*fields) && absl::SimpleAtoi((*fields)[Field(22)], &ticks) &&
         ticks == start_ticks;
}

absl::StatusOr<int> PidfdOpen(int pid) {
  const int fd = pidfd_open(pid, 0);
  if (fd >= 0) return fd;  // the kernel sets close-on-exec on pidfds
  const int err = errno;
  if (err == ESRCH) return absl::NotFoundError(absl::StrCat("no process ", pid));
  if (err == ENOSYS || err == EPERM) {
    return absl::UnimplementedError(absl::StrCat("pidfd_open: ", ErrnoText(err)));
  }
  if (err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(absl::StrCat("pidfd_open: ", ErrnoText(err)));
  }
  return absl::InternalError(absl::StrCat("pidfd_open(", pid, "): ", ErrnoText(err)));
}

ReapResult ReapIfExited(int pid) {
  ReapResult r;
  int status = 0;
  pid_t got;
  do {
    got = waitpid(pid, &status, WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got == 0) return r;
  if (got < 0) {
    r.state = ReapResult::kNotOurs;
    return r;
  }
  r.state = ReapResult::kReaped;
  if (WIFEXITED(status)) {
    r.exited = true;
    r.code_or_signal = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.code_or_signal = WTERMSIG(status);
  }
  return r;
}

uint64_t BootTicksNow() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  const long hz = sysconf(_SC_CLK_TCK);
  return static_cast<uint64_t>(ts.tv_sec) * static_cast<uint64_t>(hz) +
         static_cast<uint64_t>(ts.tv_nsec) * static_cast<uint64_t>(hz) / 1000000000ull;
}

uint64_t WallMsToBootTicks(int64_t wall_ms) {
  timespec boot{}, real{};
  clock_gettime(CLOCK_BOOTTIME, &boot);
  clock_gettime(CLOCK_REALTIME, &real);
  const double boot_wall_s = static_cast<double>(real.tv_sec) + real.tv_nsec / 1e9 -
                             (static_cast<double>(boot.tv_sec) + boot.tv_nsec / 1e9);
  const double since_boot = static_cast<double>(wall_ms) / 1000.0 - boot_wall_s;
  if (since_boot <= 0) return 0;
  return static_cast<uint64_t>(since_boot * static_cast<double>(sysconf(_SC_CLK_TCK)));
}

std::vector<GroupMember> ReadGroupMembers(int pgid) {
  std::vector<GroupMember> members;
  if (pgid <= 1) return members;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return members;
  while (dirent* entry = readdir(proc)) {
    int pid;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::optional<std::vector<std::string>> fields =
        StatFields(absl::StrCat("/proc/", pid, "/stat"));
    int group;
    uint64_t start;
    if (fields && !IsZombie(*fields) && absl::SimpleAtoi((*fields)[Field(5)], &group) &&
        group == pgid && absl::SimpleAtoi((*fields)[Field(22)], &start)) {
      members.push_back({pid, start});
    }
  }
  closedir(proc);
  std::sort(members.begin(), members.end(),
            [](const GroupMember& a, const GroupMember& b) { return a.pid < b.pid; });
  return members;
}

GroupOwnership CheckGroup(const GroupIdentity& identity) {
  if (identity.pgid <= 1) return GroupOwnership::kStranger;
  // Cheap first: no process in the group at all.
  if (kill(-identity.pgid, 0) != 0 && errno == ESRCH) return GroupOwnership::kGone;
  return JudgeGroup(identity, ReadGroupMembers(identity.pgid));
}

absl::Status SignalWorkerGroup(const GroupIdentity& identity, int sig) {
  switch (CheckGroup(identity)) {
    case GroupOwnership::kGone:
      return absl::OkStatus();
    case GroupOwnership::kStranger:
      return absl::FailedPreconditionError(
          absl::StrCat("process group ", identity.pgid,
                       " is no longer the worker's (its id was reused); not signalled"));
    case GroupOwnership::kOurs:
      return SignalProcessGroup(identity.pgid, sig);
  }
  return absl::OkStatus();
}

std::vector<int> ProcessGroupMembers(int pgid) {
  std::vector<int> pids;
  for (const GroupMember& m : ReadGroupMembers(pgid)) pids.push_back(m.pid);
  return pids;
}

absl::Status SignalProcessGroup(int pgid, int sig) {
  if (pgid <= 1) return absl::InvalidArgumentError(absl::StrCat("refusing to signal group ", pgid));
  if (kill(-pgid, sig) == 0 || errno == ESRCH) return absl::OkStatus();
  if (errno == EPERM) {
    return absl::PermissionDeniedError(absl::StrCat("not allowed to signal group ", pgid));
  }
  return absl::InternalError(absl::StrCat("kill(-", pgid, ", ", sig, "): ", ErrnoText(errno)));
}

bool ProcessGroupAlive(int pgid) {
  if (pgid <= 1) return false;
  if (kill(-pgid, 0) != 0 && errno == ESRCH) return false;
  return !ProcessGroupMembers(pgid).empty();  // the leader may be an unreaped zombie
}

absl::StatusOr<std::string> CaptureStacks(int pid, const std::string& log_path, double timeout_s) {
  if (!ProcessStartTicks(pid).ok()) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::string tool = "gdb";
  std::string binary = FindOnPath("gdb");
  std::vector<std::string> args = {
      "-nx", "-batch", "-p", std::to_string(pid), "-ex", "thread apply all bt"};
  if (binary.empty()) {
    tool = "eu-stack";
    binary = FindOnPath("eu-stack");
    args = {"-p", std::to_string(pid)};
  }
  const std::string header = absl::StrCat("=== stacks of pid ", pid, " by ");
  if (binary.empty()) {
    if (absl::Status s = AppendToFile(
            log_path, absl::StrCat(header, "proc at ", Now(), " ===\n", ProcThreadSummary(pid)));
        !s.ok()) {
      return s;
    }
    return std::string("proc");
  }

  const std::string output_path = absl::StrCat(log_path, ".stacks-", pid, ".tmp");
  unlink(output_path.c_str());
  LaunchSpec spec{binary, args, {{"LC_ALL", "C"}}, "", output_path};
  for (const char* name : {"PATH", "HOME"}) {
    if (const char* value = std::getenv(name)) spec.env[name] = value;
  }
  absl::StatusOr<LaunchedProcess> launched = Launch(spec);
  if (!launched.ok()) return launched.status();
  bool timed_out = false;
  absl::StatusOr<int> pidfd = PidfdOpen(launched->pid);
  if (pidfd.ok()) {
    pollfd pfd{*pidfd, POLLIN, 0};
    const int timeout_ms = static_cast<int>(std::ceil(std::max(0.0, timeout_s) * 1000));
    int ready;
    do {
      ready = poll(&pfd, 1, timeout_ms);
    } while (ready < 0 && errno == EINTR);
    timed_out = ready == 0;
    close(*pidfd);
  }
  if (timed_out) (void)SignalProcessGroup(launched->pgid, SIGKILL);
  while (waitpid(launched->pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  const std::string output = ReadText(output_path).value_or("");
  unlink(output_path.c_str());

  const bool ok = !timed_out && output.find("#0 ") != std::string::npos;
  std::string text = absl::StrCat(header, tool, " at ", Now(), " ===\n", output);
  if (!ok) absl::StrAppend(&text, "=== threads of pid ", pid, " ===\n", ProcThreadSummary(pid));
  if (absl::Status s = AppendToFile(log_path, text); !s.ok()) return s;
  if (ok) return tool;
  const std::string what = absl::StrCat(tool, " on pid ", pid, ": ");
  if (timed_out)
    return absl::DeadlineExceededError(absl::StrCat(what, "timed out after ", timeout_s, " s"));
  if (output.find("Operation not permitted") != std::string::npos) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, "ptrace not permitted: ", LastLine(output)));
  }
  return absl::InternalError(absl::StrCat(what, LastLine(output)));
}

absl::StatusOr<bool> RotateLogIfLarger(const std::string& path, int64_t max_bytes, int keep) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", ErrnoText(errno)));
  }
  if (st.st_size <= max_bytes) return false;
  std::error_code ec;
  if (keep > 0) {
    fs::remove(absl::StrCat(path, ".", keep), ec);
    for (int i = keep - 1; i >= 1; --i) {
      const std::string from = absl::StrCat(path, ".", i);
      if (access(from.c_str(), F_OK) == 0 &&
          rename(from.c_str(), absl::StrCat(path, ".", i + 1).c_str()) != 0) {
        return absl::InternalError(absl::StrCat("cannot rename ", from, ": ", ErrnoText(errno)));
      }
    }
    fs::copy_file(path, path + ".1", fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", path, ": ", ec.message()));
  }
  if (truncate(path.c_str(), 0) != 0) {
    return absl::InternalError(absl::StrCat("cannot truncate ", path, ": ", ErrnoText(errno)));
  }
  return true;
}

}  // namespace trainsup::supervisor
