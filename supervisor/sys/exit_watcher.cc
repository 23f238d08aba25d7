#include "supervisor/sys/exit_watcher.h"

#include <signal.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "supervisor/sys/process.h"

namespace trainsup::supervisor {

namespace asio = boost::asio;

ExitWatcher::ExitWatcher(asio::io_context& io, Callback on_exit, LogFn warn)
    : io_(io), on_exit_(std::move(on_exit)), warn_(std::move(warn)), sigchld_(io) {}

ExitWatcher::~ExitWatcher() {
  boost::system::error_code ec;
  sigchld_.cancel(ec);
  for (auto& [key, e] : entries_) {
    if (e.pidfd) e.pidfd->close(ec);
  }
}

void ExitWatcher::Start() {
  boost::system::error_code ec;
  sigchld_.add(SIGCHLD, ec);
  if (ec) warn_(absl::StrCat("cannot handle SIGCHLD: ", ec.message()));
  sigchld_.async_wait([this](const boost::system::error_code& e, int) {
    if (!e) OnSigchld();
  });
}

void ExitWatcher::OnSigchld() {
  std::vector<Key> own;
  for (const auto& [key, e] : entries_) {
    if (e.own_child && !e.pidfd) own.push_back(key);
  }
  for (const Key& key : own) Fire(key);
  sigchld_.async_wait([this](const boost::system::error_code& e, int) {
    if (!e) OnSigchld();
  });
}

void ExitWatcher::Fire(const Key& key) {
  // The callback may Unwatch (and so erase) the entry.
  on_exit_(std::get<0>(key), std::get<1>(key), std::get<2>(key));
}

void ExitWatcher::Watch(const std::string& run_id, int attempt, int rank, int pid,
                        uint64_t start_ticks, bool own_child) {
  const Key key{run_id, attempt, rank};
  Entry& e = entries_[key];
  e.pid = pid;
  e.start_ticks = start_ticks;
  e.own_child = own_child;
  e.pidfd.reset();
  absl::StatusOr<int> fd = PidfdOpen(pid);
  if (fd.ok()) {
    e.pidfd = std::make_unique<asio::posix::stream_descriptor>(io_, *fd);
    e.pidfd->async_wait(asio::posix::stream_descriptor::wait_read,
                        [this, key](const boost::system::error_code& ec) {
                          if (ec == asio::error::operation_aborted) return;
                          Fire(key);
                        });
    return;
  }
  if (fd.status().code() == absl::StatusCode::kNotFound) {
    // Already gone: handle it now.
    asio::post(io_, [this, key] { Fire(key); });
    return;
  }
  if (!warned_) {
    warned_ = true;
    warn_(absl::StrCat("no pidfd for pid ", pid, " (", fd.status().message(),
                       "): watching exits through SIGCHLD and /proc instead"));
  }
  // A child that ended before SIGCHLD was handled for it is caught here.
  asio::post(io_, [this, key] {
    if (entries_.count(key) != 0) Fire(key);
  });
}

void ExitWatcher::Unwatch(const std::string& run_id, int attempt, int rank) {
  auto it = entries_.find(Key{run_id, attempt, rank});
  if (it == entries_.end()) return;
  if (it->second.pidfd) {
    boost::system::error_code ec;
    it->second.pidfd->close(ec);
  }
  entries_.erase(it);
}

void ExitWatcher::Poll() {
  std::vector<Key> due;
  for (const auto& [key, e] : entries_) {
    if (e.pidfd) continue;
    if (e.own_child || !IsSameProcess(e.pid, e.start_ticks)) due.push_back(key);
  }
  for (const Key& key : due) {
    if (entries_.count(key) != 0) Fire(key);
  }
}

int ExitWatcher::without_pidfd() const {
  int n = 0;
  for (const auto& [key, e] : entries_) n += e.pidfd ? 0 : 1;
  return n;
}

}  // namespace trainsup::supervisor
