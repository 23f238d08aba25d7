// A real trainsupd for integration tests: DaemonHarness makes a temporary
// directory, writes a configuration with fast timings (overridable key by
// key), starts the daemon binary as a child process, waits until its socket
// answers, and talks to it through the public gRPC API with the generated
// operator and viewer tokens. Its destructor kills the daemon and every
// process whose command line names the temporary directory (workers and
// their leftovers), prints the daemon's log when the test failed, and
// removes the directory.
//
// TRAINSUPD_BIN and TRAINSUP_TEST_WORKER are compile definitions (paths of
// the built binaries). Nothing here sleeps for a fixed long time: waits poll
// with deadlines, and no assertion is about how fast anything happened.
#ifndef TRAINSUP_TESTS_INTEGRATION_DAEMON_HARNESS_H_
#define TRAINSUP_TESTS_INTEGRATION_DAEMON_HARNESS_H_

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/common/http_get.h"
#include "trainsup/v1/supervisor.grpc.pb.h"

extern char** environ;

namespace trainsup::integration {

namespace v1 = ::trainsup::v1;
using Clock = std::chrono::steady_clock;
using ::trainsup::testing::HttpGet;
using Seconds = std::chrono::duration<double>;

// The whole file, or "" when it cannot be read.
inline std::string ReadFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFileText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string Trim(std::string s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// Polls `done` every `every` until it holds (true) or `limit` passes (false).
inline bool Eventually(const std::function<bool()>& done, Seconds limit,
                       std::chrono::milliseconds every = std::chrono::milliseconds(20)) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
  for (;;) {
    if (done()) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(every);
  }
}

// The state letter of /proc/PID/stat ('R', 'S', 'Z', ...), or 0 when there
// is no such process.
inline char ProcessState(int pid) {
  std::string stat = ReadFileText("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

// Alive: it exists and is neither a zombie nor dead.
inline bool ProcessAlive(int pid) {
  char s = ProcessState(pid);
  return s != 0 && s != 'Z' && s != 'X' && s != 'x';
}

// Pids (other than ours) whose command line contains `needle`.
inline std::vector<int> ProcessesMentioning(const std::string& needle) {
  std::vector<int> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != 0 || pid == getpid()) continue;
    std::string cmdline = ReadFileText(std::string("/proc/") + e->d_name + "/cmdline");
    for (char& c : cmdline) {
      if (c == 0) c = ' ';
    }
    if (cmdline.find(needle) != std::string::npos) out.push_back(static_cast<int>(pid));
  }
  closedir(proc);
  return out;
}

// A TCP port on 127.0.0.1 that nobody listens on right now.
inline int FreeLoopbackPort();

// One line per attempt and rank: for assertion messages.
inline std::string Describe(const v1::Run& run) {
  std::ostringstream out;
  out << "run " << run.run_id() << " " << v1::RunState_Name(run.state()) << " (" << run.reason()
      << "), restarts " << run.restarts() << ", oom_restarts " << run.oom_restarts() << "\n";
  for (const v1::Attempt& a : run.attempts()) {
    out << "  attempt " << a.number() << " resumed_from_step " << a.resumed_from_step() << " "
        << v1::ExitClass_Name(a.exit_class()) << " (" << a.exit_reason() << ")\n";
    for (const v1::RankStatus& r : a.ranks()) {
      out << "    rank " << r.rank() << " pid " << r.pid() << (r.alive() ? " alive" : " ended")
          << " code " << r.exit_code() << " signal " << r.signal() << " "
          << v1::ExitClass_Name(r.exit_class()) << " (" << r.exit_reason() << ") step "
          << r.progress().step() << "\n";
    }
  }
  return out.str();
}

inline std::string Describe(const std::vector<v1::RunEvent>& events) {
  std::ostringstream out;
  for (const v1::RunEvent& e : events) {
    out << "  #" << e.seq() << " " << v1::EventKind_Name(e.kind()) << " attempt " << e.attempt()
        << " rank " << e.rank() << " " << v1::RunState_Name(e.state()) << " "
        << v1::ExitClass_Name(e.exit_class()) << " delay " << e.delay_s() << " t " << e.time_ms()
        << ": " << e.reason() << "\n";
  }
  return out.str();
}

// A run spec for the test worker: `steps` steps of `step_ms` ms, a
// checkpoint every `checkpoint_every` steps, and `testing` (lines of the
// [testing] table, e.g. "exit_at_step = 3\nexit_code = 64").
inline std::string Spec(const std::string& name, int steps, int step_ms, int checkpoint_every,
                        const std::string& testing = "", int world_size = 1) {
  std::ostringstream out;
  out << "name = \"" << name << "\"\nworld_size = " << world_size << "\n[train]\nsteps = " << steps
      << "\ncheckpoint_every_steps = " << checkpoint_every << "\n[testing]\nstep_ms = " << step_ms
      << "\n"
      << testing << "\n";
  return out.str();
}

// Starts `argv` (argv[0] a path) with stdout appended to `out_path` and
// stderr to `err_path` (may be the same file), in its own process group,
// killed (SIGKILL) if this process dies, with core dumps off. `env` is the
// full environment. Returns the pid, or -1.
inline int SpawnProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const std::string& out_path, const std::string& err_path);

// The test's environment without systemd's and trainctl's variables, plus
// `extra` ("NAME=value").
inline std::vector<std::string> TestEnvironment(const std::vector<std::string>& extra);

struct CommandResult {
  int code = -1;  // exit code; 128 + signal when killed
  std::string out;
  std::string err;
};

// Runs `argv` to completion (SIGKILLed after `limit`), its output in files
// named `log_prefix`.out and .err.
inline CommandResult RunCommand(const std::vector<std::string>& argv, Seconds limit,
                                const std::string& log_prefix);

class DaemonHarness {
 public:
  // Makes the temporary directory (with data/ for daemon.data_roots) and
  // the default configuration; starts nothing.
  DaemonHarness();
  // Kills the daemon and every process mentioning the directory, prints the
  // daemon's log when the test failed, removes the directory (kept when
  // TRAINSUP_KEEP_TEST_DIRS is set).
  ~DaemonHarness();
  DaemonHarness(const DaemonHarness&) = delete;
  DaemonHarness& operator=(const DaemonHarness&) = delete;

  // Sets configuration key "section.key" to a TOML literal ("2", "0.5",
  // "\"text\"", "true"), replacing the default. Takes effect at Start, or
  // at the next reload after WriteConfig.
  void Set(const std::string& key, const std::string& toml_value);
  // Starts the daemon inside network namespace `ns` (`ip netns exec`, which
  // execs it in place: the pid is the daemon's) from the next Start.
  void set_netns(const std::string& ns) { launcher_ = {"/usr/sbin/ip", "netns", "exec", ns}; }
  // Starts the daemon through `argv` (the daemon's own argv appended; it
  // must exec it in place) from the next Start; {} for none.
  void set_launcher(std::vector<std::string> argv) { launcher_ = std::move(argv); }
  // Removes "section.key" from the configuration (the daemon's default then).
  void Unset(const std::string& key);
  // Writes the configuration file now (for a reload with SIGHUP).
  void WriteConfig() const;

  const std::string& dir() const { return dir_; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string data_dir() const { return dir_ + "/data"; }
  std::string socket_path() const { return state_dir() + "/run/trainsupd.sock"; }
  std::string config_path() const { return dir_ + "/trainsupd.toml"; }
  std::string operator_token_path() const { return state_dir() + "/auth/operator.token"; }
  std::string viewer_token_path() const { return state_dir() + "/auth/viewer.token"; }
  const std::string& operator_token() const { return operator_token_; }
  const std::string& viewer_token() const { return viewer_token_; }
  int daemon_pid() const { return pid_; }

  // Writes the configuration and starts trainsupd with the test's
  // environment minus systemd's variables, plus `extra_env` ("NAME=value").
  // Succeeds once GetNode answers with the operator token.
  ::testing::AssertionResult Start(const std::vector<std::string>& extra_env = {});
  // Sends `sig` to the daemon.
  void Signal(int sig);
  // Waits for the daemon to exit; its wait status, or nullopt after `limit`.
  std::optional<int> WaitExit(Seconds limit);
  // SIGKILL, then reap.
  void Kill();
  // Everything the daemons of this harness wrote to stderr.
  std::string DaemonLog() const;

  v1::Supervisor::Stub& stub() { return *stub_; }
  // A client context carrying `authorization: Bearer <token>` (none when
  // `token` is empty), with a deadline `limit` from now.
  std::unique_ptr<grpc::ClientContext> Context(const std::string& token,
                                               Seconds limit = Seconds(10)) const;

  // SubmitRun with the operator token; the run id, or "" (and a failure).
  std::string Submit(const std::string& spec_toml);
  grpc::Status TrySubmit(const std::string& spec_toml, const std::string& token,
                         std::string* run_id);
  // GetRun with the operator token.
  grpc::Status TryGetRun(const std::string& run_id, v1::Run* out);
  v1::Run GetRun(const std::string& run_id);
  // DrainSlot (the operator token unless `token`) and UndrainSlot.
  grpc::Status Drain(const std::string& slot, const std::string& reason, v1::Slot* out,
                     const std::string& token = "");
  grpc::Status Undrain(const std::string& slot, v1::Slot* out);

  // Polls GetRun every 50 ms until `pred` holds; `*out` gets the last run.
  ::testing::AssertionResult WaitFor(const std::string& run_id,
                                     const std::function<bool(const v1::Run&)>& pred, Seconds limit,
                                     v1::Run* out = nullptr);
  ::testing::AssertionResult WaitForState(const std::string& run_id, v1::RunState state,
                                          Seconds limit, v1::Run* out = nullptr);
  // Until the run is SUCCEEDED, FAILED or CANCELLED.
  ::testing::AssertionResult WaitForEnd(const std::string& run_id, Seconds limit,
                                        v1::Run* out = nullptr);

  // The stored events (seq > 0) of a run that has ended, through
  // WatchRun{include_history}, checked to end with OK.
  std::vector<v1::RunEvent> History(const std::string& run_id);

 private:
  std::string dir_;
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> config_;
  int pid_ = -1;
  std::vector<std::string> launcher_;
  int starts_ = 0;
  std::string operator_token_;
  std::string viewer_token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Supervisor::Stub> stub_;
};

#ifdef TRAINSUP_WORKER
// The configuration for runs of the real trainsup-worker (TRAINSUP_WORKER,
// the built binary): `slots` CPU slots, timeouts that fit its start-up
// (LibTorch, Gloo) and its reconnect backoff of up to 5 s after a daemon
// restart, room for many restarts.
inline void UseRealWorker(DaemonHarness& h, int slots) {
  h.Set("daemon.worker_binary", std::string("\"") + TRAINSUP_WORKER + "\"");
  h.Set("slots.cpu_slots", std::to_string(slots));
  h.Set("workers.heartbeat_timeout_s", "10");
  h.Set("progress.startup_grace_s", "60");
  h.Set("progress.min_timeout_s", "30");
  h.Set("restart.max_restarts", "100");
}
#endif

// --- implementation -------------------------------------------------------------------

inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

inline int SpawnProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const std::string& out_path, const std::string& err_path) {
  // Everything the child touches is prepared before fork: between fork and
  // exec only async-signal-safe calls.
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  int err = err_path == out_path
                ? out
                : open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (out < 0 || err < 0) {
    if (out >= 0) close(out);
    if (err >= 0) close(err);
    return -1;
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    dup2(out, 1);
    dup2(err, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(out);
  if (err != out) close(err);
  return pid;
}

inline std::vector<std::string> TestEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    if (name == "NOTIFY_SOCKET" || name == "WATCHDOG_USEC" || name == "WATCHDOG_PID" ||
        name == "LISTEN_FDS" || name == "LISTEN_PID" || name == "JOURNAL_STREAM" ||
        name == "TRAINSUP_SOCKET" || name == "TRAINCTL_TOKEN" || name == "TRAINCTL_TOKEN_FILE") {
      continue;
    }
    env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

inline CommandResult RunCommand(const std::vector<std::string>& argv, Seconds limit,
                                const std::string& log_prefix) {
  CommandResult result;
  const std::string out = log_prefix + ".out", err = log_prefix + ".err";
  unlink(out.c_str());
  unlink(err.c_str());
  int pid = SpawnProcess(argv, TestEnvironment({}), out, err);
  if (pid < 0) return result;
  int status = 0;
  bool done = Eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, limit);
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  result.out = ReadFileText(out);
  result.err = ReadFileText(err);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

inline DaemonHarness::DaemonHarness() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "trainsupd-it-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << strerror(errno);
  }
  dir_ = tmpl;
  std::filesystem::create_directories(data_dir());
  const std::string q = "\"";
  config_ = {
      {"daemon",
       {{"state_dir", q + state_dir() + q},
        {"worker_binary", q + TRAINSUP_TEST_WORKER + q},
        {"data_roots", "[" + q + data_dir() + q + "]"}}},
      {"slots", {{"cpu_slots", "2"}, {"use_gpus", "false"}}},
      // Generous timeouts by default (the box may be busy); the tests of
      // frozen and hung workers shorten the one they exercise.
      {"workers",
       {{"heartbeat_interval_s", "0.2"},
        {"heartbeat_timeout_s", "5"},
        {"term_grace_s", "1"},
        {"stop_deadline_s", "3"},
        {"capture_stacks", "false"}}},
      {"progress", {{"startup_grace_s", "10"}, {"min_timeout_s", "5"}}},
      {"restart", {{"initial_backoff_s", "0.1"}, {"jitter", "0"}}},
      // The tests drive the test worker through the specs' [testing] table.
      {"testing", {{"allow_fault_injection", "true"}}},
  };
}

inline DaemonHarness::~DaemonHarness() {
  Kill();
  // Workers (and what they left behind) name the directory on their
  // command line (--run-dir): kill their groups, then them.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<int> left = ProcessesMentioning(dir_);
    if (left.empty()) break;
    for (int pid : left) {
      pid_t pgid = getpgid(pid);
      if (pgid > 1 && pgid != getpgrp()) kill(-pgid, SIGKILL);
      kill(pid, SIGKILL);
    }
    Eventually(
        [&] {
          for (int pid : left) {
            if (ProcessAlive(pid)) return false;
          }
          return true;
        },
        Seconds(5));
  }
  if (::testing::Test::HasFailure()) {
    std::string log = DaemonLog();
    const size_t kMax = 24000;
    if (log.size() > kMax) log = "...\n" + log.substr(log.size() - kMax);
    std::cerr << "---- trainsupd log (" << dir_ << ") ----\n" << log << "---- end of log ----\n";
  }
  if (getenv("TRAINSUP_KEEP_TEST_DIRS") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

inline void DaemonHarness::Set(const std::string& key, const std::string& value) {
  const size_t dot = key.find('.');
  const std::string section = key.substr(0, dot);
  const std::string name = key.substr(dot + 1);
  for (auto& [s, entries] : config_) {
    if (s != section) continue;
    for (auto& [k, v] : entries) {
      if (k == name) {
        v = value;
        return;
      }
    }
    entries.emplace_back(name, value);
    return;
  }
  config_.push_back({section, {{name, value}}});
}

inline void DaemonHarness::Unset(const std::string& key) {
  const size_t dot = key.find('.');
  const std::string section = key.substr(0, dot);
  const std::string name = key.substr(dot + 1);
  for (auto& [s, entries] : config_) {
    if (s != section) continue;
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->first == name) {
        entries.erase(it);
        return;
      }
    }
  }
}

inline void DaemonHarness::WriteConfig() const {
  std::ostringstream out;
  for (const auto& [section, entries] : config_) {
    out << "[" << section << "]\n";
    for (const auto& [k, v] : entries) out << k << " = " << v << "\n";
  }
  // Through a rename: a daemon reloading now reads the old file or the new.
  WriteFileText(config_path() + ".tmp", out.str());
  std::rename((config_path() + ".tmp").c_str(), config_path().c_str());
}

inline ::testing::AssertionResult DaemonHarness::Start(const std::vector<std::string>& extra_env) {
  if (pid_ > 0) return ::testing::AssertionFailure() << "the daemon is already running";
  WriteConfig();
  ++starts_;
  const std::string log = dir_ + "/trainsupd-" + std::to_string(starts_) + ".log";
  // TRAINSUP_TEST_DAEMON runs the tests against another build of the daemon
  // (the ThreadSanitizer one of tests/integration/tsan).
  const char* daemon = getenv("TRAINSUP_TEST_DAEMON");
  std::vector<std::string> argv = launcher_;
  for (const std::string& a :
       {std::string(daemon != nullptr && *daemon != 0 ? daemon : TRAINSUPD_BIN),
        std::string("--config"), config_path()}) {
    argv.push_back(a);
  }
  pid_ = SpawnProcess(argv, TestEnvironment(extra_env), log, log);
  if (pid_ < 0) return ::testing::AssertionFailure() << "cannot start " << TRAINSUPD_BIN;
  std::string why = "no answer";
  bool up = Eventually(
      [&] {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          why = "trainsupd exited with status " + std::to_string(status);
          pid_ = -1;
          return true;
        }
        operator_token_ = Trim(ReadFileText(operator_token_path()));
        viewer_token_ = Trim(ReadFileText(viewer_token_path()));
        if (operator_token_.empty() || access(socket_path().c_str(), F_OK) != 0) return false;
        if (!channel_ || !stub_) {
          // A channel of its own (no subchannel shared with the previous
          // daemon's), made again after every failed call below.
          grpc::ChannelArguments args;
          args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
          channel_ = grpc::CreateCustomChannel("unix:" + socket_path(),
                                               grpc::InsecureChannelCredentials(), args);
          stub_ = v1::Supervisor::NewStub(channel_);
        }
        v1::Node node;
        auto ctx = Context(operator_token_, Seconds(1));
        grpc::Status s = stub_->GetNode(ctx.get(), v1::GetNodeRequest(), &node);
        if (!s.ok()) {
          // A daemon SIGKILLed before leaves its socket file, so the first
          // calls are refused until this one listens there; a channel that
          // failed would then wait out gRPC's reconnect backoff (5 to 10 s
          // after this daemon served, measured), which a user's trainctl,
          // a new channel per command, never waits.
          why = s.error_message();
          stub_.reset();
          channel_.reset();
        }
        return s.ok();
      },
      Seconds(30), std::chrono::milliseconds(50));
  if (!up || pid_ < 0) {
    return ::testing::AssertionFailure() << "trainsupd did not come up: " << why << "\n"
                                         << DaemonLog();
  }
  return ::testing::AssertionSuccess();
}

inline void DaemonHarness::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

inline std::optional<int> DaemonHarness::WaitExit(Seconds limit) {
  if (pid_ <= 0) return std::nullopt;
  int status = 0;
  if (!Eventually([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, limit)) {
    return std::nullopt;
  }
  pid_ = -1;
  stub_.reset();
  channel_.reset();
  return status;
}

inline void DaemonHarness::Kill() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  stub_.reset();
  channel_.reset();
}

inline std::string DaemonHarness::DaemonLog() const {
  std::string all;
  for (int i = 1; i <= starts_; ++i) {
    all += "[trainsupd start " + std::to_string(i) + "]\n";
    all += ReadFileText(dir_ + "/trainsupd-" + std::to_string(i) + ".log");
  }
  return all;
}

inline std::unique_ptr<grpc::ClientContext> DaemonHarness::Context(const std::string& token,
                                                                   Seconds limit) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::milliseconds>(limit));
  return ctx;
}

inline grpc::Status DaemonHarness::TrySubmit(const std::string& spec_toml, const std::string& token,
                                             std::string* run_id) {
  v1::SubmitRunRequest req;
  req.set_spec_toml(spec_toml);
  v1::SubmitRunResponse resp;
  auto ctx = Context(token);
  grpc::Status s = stub_->SubmitRun(ctx.get(), req, &resp);
  if (run_id != nullptr) *run_id = resp.run_id();
  return s;
}

inline std::string DaemonHarness::Submit(const std::string& spec_toml) {
  std::string id;
  grpc::Status s = TrySubmit(spec_toml, operator_token_, &id);
  if (!s.ok()) {
    ADD_FAILURE() << "SubmitRun: " << s.error_code() << " " << s.error_message() << "\n"
                  << spec_toml;
    return "";
  }
  return id;
}

inline grpc::Status DaemonHarness::TryGetRun(const std::string& run_id, v1::Run* out) {
  v1::GetRunRequest req;
  req.set_run_id(run_id);
  auto ctx = Context(operator_token_);
  return stub_->GetRun(ctx.get(), req, out);
}

inline grpc::Status DaemonHarness::Drain(const std::string& slot, const std::string& reason,
                                         v1::Slot* out, const std::string& token) {
  v1::DrainSlotRequest req;
  req.set_slot(slot);
  req.set_reason(reason);
  auto ctx = Context(token.empty() ? operator_token_ : token);
  return stub_->DrainSlot(ctx.get(), req, out);
}

inline grpc::Status DaemonHarness::Undrain(const std::string& slot, v1::Slot* out) {
  v1::UndrainSlotRequest req;
  req.set_slot(slot);
  auto ctx = Context(operator_token_);
  return stub_->UndrainSlot(ctx.get(), req, out);
}

inline v1::Run DaemonHarness::GetRun(const std::string& run_id) {
  v1::Run run;
  grpc::Status s = TryGetRun(run_id, &run);
  if (!s.ok()) ADD_FAILURE() << "GetRun " << run_id << ": " << s.error_message();
  return run;
}

inline ::testing::AssertionResult DaemonHarness::WaitFor(
    const std::string& run_id, const std::function<bool(const v1::Run&)>& pred, Seconds limit,
    v1::Run* out) {
  v1::Run run;
  grpc::Status last = grpc::Status::OK;
  bool ok = Eventually(
      [&] {
        v1::Run got;
        last = TryGetRun(run_id, &got);
        if (!last.ok()) return false;
        run = got;
        return pred(run);
      },
      limit, std::chrono::milliseconds(50));
  if (out != nullptr) *out = run;
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gave up waiting after " << limit.count()
                                       << " s; last GetRun: " << last.error_message() << "\n"
                                       << Describe(run);
}

inline ::testing::AssertionResult DaemonHarness::WaitForState(const std::string& run_id,
                                                              v1::RunState state, Seconds limit,
                                                              v1::Run* out) {
  return WaitFor(
      run_id, [state](const v1::Run& r) { return r.state() == state; }, limit, out);
}

inline ::testing::AssertionResult DaemonHarness::WaitForEnd(const std::string& run_id,
                                                            Seconds limit, v1::Run* out) {
  return WaitFor(
      run_id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_SUCCEEDED || r.state() == v1::RUN_STATE_FAILED ||
               r.state() == v1::RUN_STATE_CANCELLED;
      },
      limit, out);
}

inline std::vector<v1::RunEvent> DaemonHarness::History(const std::string& run_id) {
  v1::WatchRunRequest req;
  req.set_run_id(run_id);
  req.set_include_history(true);
  auto ctx = Context(viewer_token_, Seconds(20));
  std::unique_ptr<grpc::ClientReader<v1::RunEvent>> reader = stub_->WatchRun(ctx.get(), req);
  std::vector<v1::RunEvent> events;
  v1::RunEvent e;
  while (reader->Read(&e)) {
    if (e.seq() > 0) events.push_back(e);
  }
  grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << "WatchRun(history) of " << run_id << ": " << s.error_message();
  return events;
}

}  // namespace trainsup::integration

#endif  // TRAINSUP_TESTS_INTEGRATION_DAEMON_HARNESS_H_
