// Measures trainsupd against the targets of the supervisor issue, on the
// real daemon with real worker processes (docs/benchmarks.md):
//   1. over N crashes: worker exit -> daemon notices (its log line), and
//      worker exit -> replacement process running main() (backoff 0);
//   2. frozen workers: silence -> declared frozen (heartbeat_timeout 2 s);
//   3. 8 idle workers heartbeating every second: daemon CPU and RSS.
// Usage: supervisor_bench [--crashes N] [--freezes N] [--idle-seconds S]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainsup/v1/supervisor.grpc.pb.h"

namespace fs = std::filesystem;
namespace v1 = trainsup::v1;

namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// "2026-11-29T13:43:38.455123" (local time, as spdlog prints) -> unix us.
long long ParseLogTime(const std::string& stamp) {
  std::tm tm{};
  strptime(stamp.substr(0, 19).c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  tm.tm_isdst = -1;
  long long secs = mktime(&tm);
  long long us = std::stoll(stamp.substr(20, 6));
  return secs * 1000000LL + us;
}

class Daemon {
 public:
  Daemon(const std::string& name, const std::string& extra_config, const std::string& worker) {
    dir_ = fs::temp_directory_path() / ("trainsup-bench-" + name + "-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "trainsupd.toml")
        << "[daemon]\nstate_dir = \"" << (dir_ / "state").string() << "\"\nworker_binary = \""
        << worker << "\"\n"
        << extra_config;
    pid_ = fork();
    if (pid_ == 0) {
      freopen((dir_ / "daemon.log").c_str(), "w", stderr);
      execl(TRAINSUPD_BIN, "trainsupd", "--config", (dir_ / "trainsupd.toml").c_str(), nullptr);
      _exit(127);
    }
    std::string socket = "unix:" + (dir_ / "state/run/trainsupd.sock").string();
    for (int i = 0; i < 200 && !fs::exists(dir_ / "state/auth/operator.token"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    for (int i = 0; i < 200 && !fs::exists(dir_ / "state/run/trainsupd.sock"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    token_ = Read((dir_ / "state/auth/operator.token").string());
    while (!token_.empty() && isspace(token_.back())) token_.pop_back();
    stub_ =
        v1::Supervisor::NewStub(grpc::CreateChannel(socket, grpc::InsecureChannelCredentials()));
  }
  ~Daemon() {
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
    fs::remove_all(dir_);
  }
  std::string Submit(const std::string& spec) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    v1::SubmitRunRequest req;
    req.set_spec_toml(spec);
    v1::SubmitRunResponse resp;
    grpc::Status s = stub_->SubmitRun(&ctx, req, &resp);
    if (!s.ok()) {
      fprintf(stderr, "submit failed: %s\n", s.error_message().c_str());
      exit(1);
    }
    return resp.run_id();
  }
  v1::Run Get(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    v1::GetRunRequest req;
    req.set_run_id(id);
    v1::Run run;
    stub_->GetRun(&ctx, req, &run);
    return run;
  }
  void Cancel(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token_);
    v1::CancelRunRequest req;
    req.set_run_id(id);
    v1::Run run;
    stub_->CancelRun(&ctx, req, &run);
  }
  std::string RunDir(const std::string& id) const { return (dir_ / "state/runs" / id).string(); }
  std::string Log() const { return Read((dir_ / "daemon.log").string()); }
  int pid() const { return pid_; }

 private:
  fs::path dir_;
  int pid_ = 0;
  std::string token_;
  std::unique_ptr<v1::Supervisor::Stub> stub_;
};

const char* kCommon =
    "[workers]\nheartbeat_interval_s = 1\nheartbeat_timeout_s = 2\nterm_grace_s = 1\n"
    "capture_stacks = false\n";

void CrashBench(int crashes) {
  Daemon d("crash",
           std::string(kCommon) +
               "[restart]\ninitial_backoff_s = 0\nmax_backoff_s = 0\njitter = 0\n"
               "max_restarts = 1000000\ncrash_loop_attempts = 1000\n",
           BENCH_CRASH_WORKER);
  std::string id = d.Submit("name = \"crash\"\n");
  std::string times_path = d.RunDir(id) + "/bench-times.txt";
  for (int i = 0; i < 3000; ++i) {
    std::string t = Read(times_path);
    if (std::count(t.begin(), t.end(), 's') >= crashes + 1) break;  // "start" lines
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  d.Cancel(id);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::map<int, long long> start, exit_at, noticed;
  std::istringstream lines(Read(times_path));
  std::string what;
  int attempt;
  long long us;
  while (lines >> what >> attempt >> us) (what == "start" ? start : exit_at)[attempt] = us;
  std::regex ended(R"((\S+) info run=\S+ attempt=(\d+) rank=0 pid \d+ ended)");
  std::string log = d.Log();
  for (auto it = std::sregex_iterator(log.begin(), log.end(), ended); it != std::sregex_iterator();
       ++it) {
    noticed[std::stoi((*it)[2])] = ParseLogTime((*it)[1]);
  }
  std::vector<double> notice_ms, replace_ms;
  for (const auto& [a, t] : exit_at) {
    if (noticed.count(a)) notice_ms.push_back((noticed[a] - t) / 1000.0);
    if (start.count(a + 1)) replace_ms.push_back((start[a + 1] - t) / 1000.0);
  }
  printf(
      "crash -> noticed      : median %.2f ms, p90 %.2f ms over %zu crashes (target: median <= 5 "
      "ms)\n",
      Median(notice_ms), Percentile(notice_ms, 0.9), notice_ms.size());
  printf(
      "crash -> replacement  : median %.2f ms, p90 %.2f ms over %zu crashes, backoff 0 (target: "
      "median <= 20 ms)\n",
      Median(replace_ms), Percentile(replace_ms, 0.9), replace_ms.size());
  printf(
      "  reference, quoted by the issue (not measured here): torchrun 1.13 notices after 2300 ms\n"
      "  (median, 5 s polling); with 0.1 s polling it starts the replacement after 113 ms.\n");
}

void FreezeBench(int freezes) {
  Daemon d(
      "freeze",
      "[workers]\nheartbeat_interval_s = 0.5\nheartbeat_timeout_s = 2\nterm_grace_s = 0.5\n"
      "capture_stacks = false\n[restart]\ninitial_backoff_s = 0\nmax_backoff_s = 0\njitter = 0\n"
      "max_restarts = 1000\ncrash_loop_attempts = 1000\n",
      BENCH_LINK_WORKER);
  std::string id = d.Submit("name = \"freeze\"\n");
  std::regex frozen(R"(no heartbeat for ([0-9.]+) s)");
  std::vector<double> silent_s;
  for (int i = 0; i < 1500; ++i) {
    std::string log = d.Log();
    silent_s.clear();
    for (auto it = std::sregex_iterator(log.begin(), log.end(), frozen);
         it != std::sregex_iterator(); ++it) {
      silent_s.push_back(std::stod((*it)[1]));
    }
    if (static_cast<int>(silent_s.size()) >= freezes * 2) break;  // each is logged twice
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  d.Cancel(id);
  std::vector<double> unique;
  for (size_t i = 0; i < silent_s.size(); i += 2) unique.push_back(silent_s[i]);
  printf(
      "frozen declared after : median %.2f s, max %.2f s of silence over %zu freezes\n"
      "                        (heartbeat_timeout 2 s; target: <= timeout + 1 s)\n",
      Median(unique), unique.empty() ? 0 : *std::max_element(unique.begin(), unique.end()),
      unique.size());
}

long long CpuTicks(int pid) {
  std::string stat = Read("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(stat.substr(stat.rfind(')') + 2));
  std::string f;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    in >> f;
    if (i == 14) utime = std::stoll(f);
    if (i == 15) stime = std::stoll(f);
  }
  return utime + stime;
}

void IdleBench(int seconds) {
  Daemon d("idle", "[slots]\ncpu_slots = 8\n" + std::string(kCommon), BENCH_LINK_WORKER);
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i)
    ids.push_back(d.Submit("name = \"idle-" + std::to_string(i) + "\"\n"));
  for (int i = 0; i < 400; ++i) {
    int running = 0;
    for (const auto& id : ids) running += d.Get(id).state() == v1::RUN_STATE_RUNNING;
    if (running == 8) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  long long t0 = CpuTicks(d.pid());
  auto w0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  long long t1 = CpuTicks(d.pid());
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  double cpu_pct = 100.0 * (t1 - t0) / sysconf(_SC_CLK_TCK) / wall;
  std::string status = Read("/proc/" + std::to_string(d.pid()) + "/status");
  std::smatch m;
  long rss_kb = 0;
  if (std::regex_search(status, m, std::regex(R"(VmRSS:\s+(\d+))"))) rss_kb = std::stol(m[1]);
  printf(
      "idle daemon, 8 workers: %.3f%% of one core over %.0f s, RSS %.1f MiB\n"
      "                        (targets: < 0.5%%, < 30 MiB; torchrun's idle agent: 229 MiB, "
      "quoted)\n",
      cpu_pct, wall, rss_kb / 1024.0);
  for (const auto& id : ids) d.Cancel(id);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

}  // namespace

int main(int argc, char** argv) {
  int crashes = 50, freezes = 5, idle_seconds = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--crashes") crashes = std::atoi(argv[i + 1]);
    if (k == "--freezes") freezes = std::atoi(argv[i + 1]);
    if (k == "--idle-seconds") idle_seconds = std::atoi(argv[i + 1]);
  }
  printf("supervisor_bench: trainsupd %s, %ld CPUs\n", TRAINSUPD_BIN,
         sysconf(_SC_NPROCESSORS_ONLN));
  CrashBench(crashes);
  FreezeBench(freezes);
  IdleBench(idle_seconds);
  return 0;
}
