// Notices that worker processes ended, on the event loop, without ever
// blocking it. Each process gets a pidfd where the kernel allows one
// (readable once it exits). Where pidfd_open fails (kernels before 5.3,
// seccomp profiles, EMFILE) it falls back: the daemon's own children are
// checked on every SIGCHLD and every tick (the callback reaps them with
// waitpid(WNOHANG) and ignores those still running); adopted workers, which
// are not our children, are checked on every tick by pid and start time.
// The callback may be called for a process that has not ended; it must
// check (RunUnit::OnProcessExit does).
#ifndef TRAINSUP_SUPERVISOR_SYS_EXIT_WATCHER_H_
#define TRAINSUP_SUPERVISOR_SYS_EXIT_WATCHER_H_

#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace trainsup::supervisor {

class ExitWatcher {
 public:
  using Callback = std::function<void(const std::string& run_id, int attempt, int rank)>;
  using LogFn = std::function<void(const std::string&)>;
  ExitWatcher(boost::asio::io_context& io, Callback on_exit, LogFn warn);
  ~ExitWatcher();
  ExitWatcher(const ExitWatcher&) = delete;
  ExitWatcher& operator=(const ExitWatcher&) = delete;

  // Starts SIGCHLD handling; call before the first child is launched.
  void Start();
  void Watch(const std::string& run_id, int attempt, int rank, int pid, uint64_t start_ticks,
             bool own_child);
  void Unwatch(const std::string& run_id, int attempt, int rank);
  // The fallback checks; the daemon calls it on every tick.
  void Poll();
  // How many watched processes have no pidfd.
  int without_pidfd() const;

 private:
  using Key = std::tuple<std::string, int, int>;
  struct Entry {
    int pid = 0;
    uint64_t start_ticks = 0;
    bool own_child = false;
    std::unique_ptr<boost::asio::posix::stream_descriptor> pidfd;
  };
  void OnSigchld();
  void Fire(const Key& key);

  boost::asio::io_context& io_;
  Callback on_exit_;
  LogFn warn_;
  boost::asio::signal_set sigchld_;
  std::map<Key, Entry> entries_;
  bool warned_ = false;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_SYS_EXIT_WATCHER_H_
