// Data-parallel scaling (issue 12, "Measured"): MinkUNet14 trained by the
// real trainsup-worker processes on the CPU, one thread per rank, the same
// per-rank batch (so on this 2-core machine world size 1 and 2 do the same
// work per core), Gloo on loopback:
//   (a) world size 1;
//   (b) world size 2, gradient buckets launched during backward (the
//       product's default);
//   (c) world size 2 with distributed.overlap_backward = false (every bucket
//       launched after backward), to show what the overlap hides.
// Per mode: the median iteration time over the measured steps (data,
// agreement collective, forward, backward, allreduce, optimizer step), and
// for (b) and (c) the median time each rank was blocked in collectives and
// the buckets' time in flight, from the workers' own step lines. The modes
// run one after the other, `--rounds` times in turn (medians over all).
//   distributed_bench [--steps N] [--warmup W] [--rounds R] [--batch B]
//                     [--voxel V] [--json]
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "contracts/free_port.h"

namespace {

namespace fs = std::filesystem;

struct Options {
  int steps = 12;
  int warmup = 2;
  int rounds = 2;
  int batch = 2;
  double voxel = 0.05;
  bool json = false;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Figures {
  std::vector<double> iteration_ms, blocked_ms, flight_ms, in_backward, buckets;
};

// Writes the spec of a run of `world` ranks into `dir`.
void WriteSpec(const Options& o, int world, bool overlap, const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Enough scenes that every rank has `steps` batches in one epoch.
  const int scenes = (o.steps + o.warmup) * o.batch * world * 5 / 4 + 4;
  std::ofstream(fs::path(dir) / "spec.toml")
      << "name = \"bench\"\nworld_size = " << world << "\n"
      << "[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = " << o.voxel << "\n"
      << "[data]\nformat = \"synthetic\"\nscenes = " << scenes
      << "\nscene_size = \"small\"\naugment = false\nval_fraction = 0.2\n"
      << "[train]\nbatch_size = " << o.batch << "\nsteps = " << o.steps + o.warmup
      << "\ncheckpoint_every_steps = 0\neval_every_steps = 0\nthreads = 1\ndeterministic = true\n"
      << "[distributed]\noverlap_backward = " << (overlap ? "true" : "false") << "\n";
}

// Runs `world` workers to the end: one gang, or with `independent` that
// many runs of world size 1 at once (the same load on the cores, no
// collectives). Adds their measured steps.
bool RunGang(const Options& o, int world, bool overlap, bool independent, const std::string& dir,
             Figures* f) {
  std::vector<std::string> dirs;
  for (int r = 0; r < world; ++r) {
    dirs.push_back(independent ? dir + "/run-" + std::to_string(r) : dir);
  }
  fs::remove_all(dir);
  for (int r = 0; r < world; ++r) {
    if (independent || r == 0) WriteSpec(o, independent ? 1 : world, overlap, dirs[r]);
  }
  const int port = trainsup::FreeLoopbackPort();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const int rank = independent ? 0 : r;
    const int size = independent ? 1 : world;
    const std::string& run_dir = dirs[r];
    pid_t pid = fork();
    if (pid == 0) {
      const std::string log = dir + "/rank-" + std::to_string(r) + ".log";
      freopen(log.c_str(), "w", stdout);
      freopen(log.c_str(), "a", stderr);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execl(TRAINSUP_WORKER_BIN, TRAINSUP_WORKER_BIN, "--run-dir", run_dir.c_str(), "--rank",
            std::to_string(rank).c_str(), "--world-size", std::to_string(size).c_str(), "--attempt",
            "1", static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  static const std::regex kStep(
      "^step ([0-9]+)/[0-9]+ .*; iteration ([0-9.]+) ms(, collectives ([0-9.]+) ms blocked, "
      "([0-9]+)/([0-9]+) buckets launched during backward, ([0-9.]+) ms in flight)?$");
  for (int r = 0; r < world; ++r) {
    const std::string log = ReadAll(dir + "/rank-" + std::to_string(r) + ".log");
    if (!ok) std::fprintf(stderr, "rank %d of %d failed:\n%s\n", r, world, log.c_str());
    std::istringstream lines(log);
    std::string line;
    while (std::getline(lines, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, kStep)) continue;
      if (std::stoi(m[1]) <= o.warmup) continue;
      f->iteration_ms.push_back(std::stod(m[2]));
      if (m[3].matched) {
        f->blocked_ms.push_back(std::stod(m[4]));
        f->in_backward.push_back(std::stod(m[5]));
        f->buckets.push_back(std::stod(m[6]));
        f->flight_ms.push_back(std::stod(m[7]));
      }
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--steps")
      o.steps = std::stoi(next());
    else if (a == "--warmup")
      o.warmup = std::stoi(next());
    else if (a == "--rounds")
      o.rounds = std::stoi(next());
    else if (a == "--batch")
      o.batch = std::stoi(next());
    else if (a == "--voxel")
      o.voxel = std::stod(next());
    else if (a == "--json")
      o.json = true;
    else {
      std::fprintf(stderr, "distributed_bench: unknown option %s\n", a.c_str());
      return 64;
    }
  }
  const std::string dir =
      (fs::temp_directory_path() / ("distributed_bench_" + std::to_string(getpid()))).string();
  struct Mode {
    const char* name;
    int world;
    bool overlap;
    bool independent;
    Figures f;
  };
  // "2 x world 1": two runs of world size 1 at once, the cores as loaded
  // as by a gang of 2 (both busy, each run's loader thread competing), so
  // the gang's difference from it is what the collectives cost.
  std::vector<Mode> modes = {{"world 1", 1, true, false, {}},
                             {"2 x world 1 at once", 2, true, true, {}},
                             {"world 2, overlap", 2, true, false, {}},
                             {"world 2, no overlap", 2, false, false, {}}};
  for (int round = 0; round < o.rounds; ++round) {
    for (Mode& m : modes) {
      if (!RunGang(o, m.world, m.overlap, m.independent, dir, &m.f)) return 1;
    }
  }
  fs::remove_all(dir);
  const double base = Median(modes[0].f.iteration_ms);
  const double loaded = Median(modes[1].f.iteration_ms);
  if (o.json) {
    std::printf(
        "{\"threads_per_rank\": 1, \"batch_per_rank\": %d, \"voxel_size\": %g, \"modes\": [",
        o.batch, o.voxel);
  } else {
    std::printf(
        "MinkUNet14, synthetic small rooms at %g m, batch %d per rank, 1 thread per rank, "
        "Gloo on loopback; medians of %d measured steps x %d rounds x ranks\n",
        o.voxel, o.batch, o.steps, o.rounds);
    std::printf("%-22s %12s %8s %10s %12s %10s %14s %16s\n", "mode", "iteration ms", "vs w1",
                "vs 2 x w1", "blocked ms", "blocked %", "in flight ms", "during backward");
  }
  for (size_t k = 0; k < modes.size(); ++k) {
    const Figures& f = modes[k].f;
    const double it = Median(f.iteration_ms);
    const double blocked = Median(f.blocked_ms);
    const double flight = Median(f.flight_ms);
    const double during = Median(f.in_backward), buckets = Median(f.buckets);
    if (o.json) {
      std::printf(
          "%s{\"mode\": \"%s\", \"iteration_ms\": %.2f, \"ratio_vs_world1\": %.4f, "
          "\"ratio_vs_two_world1\": %.4f, \"blocked_ms\": %.2f, \"blocked_fraction\": "
          "%.4f, \"flight_ms\": %.2f, \"buckets_during_backward\": %.1f, \"buckets\": "
          "%.1f}",
          k ? ", " : "", modes[k].name, it, it / base, it / loaded, blocked,
          it > 0 ? blocked / it : 0, flight, during, buckets);
    } else if (modes[k].f.blocked_ms.empty()) {
      std::printf("%-22s %12.1f %8.3f %10.3f %12s %10s %14s %16s\n", modes[k].name, it, it / base,
                  it / loaded, "-", "-", "-", "-");
    } else {
      std::printf("%-22s %12.1f %8.3f %10.3f %12.1f %9.1f%% %14.1f %10.0f of %.0f\n", modes[k].name,
                  it, it / base, it / loaded, blocked, 100 * blocked / it, flight, during, buckets);
    }
  }
  if (o.json) std::printf("]}\n");
  return 0;
}
