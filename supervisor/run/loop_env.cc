#include "supervisor/run/loop_env.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "contracts/exit_file.h"

namespace trainsup::supervisor {

namespace asio = boost::asio;

namespace {

// `work` on `pool`; what it returns, on the loop.
void RunOffLoop(asio::thread_pool& pool, asio::io_context& io,
                std::function<std::function<void()>()> work) {
  asio::post(pool, [&io, work = std::move(work)] {
    std::function<void()> then = work();
    if (then) asio::post(io, std::move(then));
  });
}

}  // namespace

LoopEnv::~LoopEnv() {
  for (auto& [id, t] : timers_) t->cancel();
}

double LoopEnv::NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t LoopEnv::WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t LoopEnv::BootTicks() { return BootTicksNow(); }
uint64_t LoopEnv::BootTicksAt(int64_t wall_ms) { return WallMsToBootTicks(wall_ms); }

UnitTimers::TimerId LoopEnv::Start(double delay_s, std::function<void()> fn) {
  const TimerId id = next_timer_++;
  auto timer = std::make_unique<asio::steady_timer>(io_);
  timer->expires_after(
      std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, delay_s) * 1e6)));
  timer->async_wait([this, id, fn = std::move(fn)](const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    timers_.erase(id);
    fn();
  });
  timers_[id] = std::move(timer);
  return id;
}

void LoopEnv::Cancel(TimerId id) {
  auto it = timers_.find(id);
  if (it == timers_.end()) return;
  it->second->cancel();
  timers_.erase(it);
}

void LoopEnv::OffLoop(std::function<std::function<void()>()> work) {
  RunOffLoop(pool_, io_, std::move(work));
}

void PoolTimers::OffLoop(std::function<std::function<void()>()> work) {
  RunOffLoop(pool_, io_, std::move(work));
}

void LoopEnv::Post(std::function<void()> fn) { asio::post(io_, std::move(fn)); }

void LoopEnv::Write(const std::string& run_id, StoreBatch batch,
                    std::function<void(absl::Status, StoreBatch)> done) {
  auto shared = std::make_shared<StoreBatch>(std::move(batch));
  store_->Write([this, run_id, shared, done = std::move(done)](StateStore& store) {
    // The status moves to the loop: its error payload is reference-counted,
    // and one owner at a time keeps the two threads off the count.
    asio::post(io_, [s = ApplyBatch(store, run_id, shared.get()), shared, done]() mutable {
      done(std::move(s), std::move(*shared));
    });
  });
}

absl::StatusOr<LaunchedProcess> LoopEnv::Launch(const LaunchSpec& spec) {
  return supervisor::Launch(spec);
}

void LoopEnv::WatchExit(const std::string& run_id, int attempt, int rank, int pid,
                        uint64_t start_ticks, bool own_child) {
  exits_->Watch(run_id, attempt, rank, pid, start_ticks, own_child);
}

void LoopEnv::UnwatchExit(const std::string& run_id, int attempt, int rank) {
  exits_->Unwatch(run_id, attempt, rank);
}

ReapResult LoopEnv::Reap(int pid) { return ReapIfExited(pid); }

bool LoopEnv::IsSameProcess(int pid, uint64_t start_ticks) {
  return supervisor::IsSameProcess(pid, start_ticks);
}

std::optional<ExitFile> LoopEnv::ReadExitFile(const std::string& path) {
  absl::StatusOr<ExitFile> f = trainsup::ReadExitFile(path);
  if (!f.ok()) return std::nullopt;
  return *f;
}

UnitLauncher::FileTail LoopEnv::ReadTail(const std::string& path, int64_t offset,
                                         int64_t max_bytes) {
  FileTail t;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return t;
  struct stat st {};
  if (fstat(fd, &st) == 0) {
    t.size = st.st_size;
    const int64_t n = std::min<int64_t>(std::max<int64_t>(t.size - offset, 0), max_bytes);
    t.bytes.resize(static_cast<size_t>(n));
    const ssize_t got = n > 0 ? pread(fd, t.bytes.data(), static_cast<size_t>(n), offset) : 0;
    t.bytes.resize(got > 0 ? static_cast<size_t>(got) : 0);
  }
  close(fd);
  return t;
}

void LoopEnv::CaptureStacks(int pid, const std::string& log_path,
                            std::function<void(absl::StatusOr<std::string>)> done) {
  asio::post(pool_, [this, pid, log_path, done = std::move(done)] {
    absl::StatusOr<std::string> how = supervisor::CaptureStacks(pid, log_path, 20);
    asio::post(io_, [how, done] { done(how); });
  });
}

absl::Status LoopEnv::SignalGroup(const GroupIdentity& group, int sig) {
  return SignalWorkerGroup(group, sig);
}

absl::Status LoopEnv::SignalLeader(const GroupIdentity& group, int sig) {
  if (group.pgid <= 1 || !IsSameProcess(group.pgid, group.leader_start_ticks)) {
    return absl::OkStatus();  // gone, or its pid reused: nothing of ours to signal
  }
  if (kill(group.pgid, sig) == 0 || errno == ESRCH) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("kill(", group.pgid, ", ", sig, "): ", strerror(errno)));
}

}  // namespace trainsup::supervisor
