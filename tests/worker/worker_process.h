// Runs the real trainsup-worker as a process for the worker's process tests
// (resume_test.cc, worker_main_test.cc): standalone (no supervisor), its
// output in DIR/attempt-A.log.
#ifndef TRAINSUP_TESTS_WORKER_WORKER_PROCESS_H_
#define TRAINSUP_TESTS_WORKER_WORKER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace trainsup::worker::testing {

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string LogPath(const std::string& dir, int attempt) {
  return dir + "/attempt-" + std::to_string(attempt) + ".log";
}

// Starts rank `rank` of `world` of the worker on run directory `dir` as
// attempt `attempt`, with `env` (NAME, VALUE) added to its environment and
// its output in `log`.
inline pid_t LaunchRank(const std::string& dir, int attempt, int rank, int world,
                        const std::string& resume,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        const std::string& log) {
  const std::string attempt_arg = std::to_string(attempt), rank_arg = std::to_string(rank),
                    world_arg = std::to_string(world);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    execl(TRAINSUP_WORKER_BIN, TRAINSUP_WORKER_BIN, "--run-dir", dir.c_str(), "--rank",
          rank_arg.c_str(), "--world-size", world_arg.c_str(), "--attempt", attempt_arg.c_str(),
          "--supervisor", "", "--resume", resume.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Rank 0 of 1, its output in LogPath(dir, attempt).
inline pid_t Launch(const std::string& dir, int attempt, const std::string& resume = "latest",
                    const std::vector<std::pair<std::string, std::string>>& env = {}) {
  return LaunchRank(dir, attempt, 0, 1, resume, env, LogPath(dir, attempt));
}

// Waits for `pid`; a worker still running after `limit` is killed (a hang
// guard, not a timing assertion) and reported as -1.
inline int WaitStatus(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(300)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

}  // namespace trainsup::worker::testing

#endif  // TRAINSUP_TESTS_WORKER_WORKER_PROCESS_H_
