// trainsup-worker: one training process (DESIGN.md, the worker contract).
//
//   trainsup-worker --run-dir DIR --rank R --world-size W --attempt A
//       --supervisor ENDPOINT [--resume latest|none|STEP]
//
// with TRAINSUP_TOKEN in the environment, and TRAINSUP_DATA_ROOTS when the
// data files must stay inside the supervisor's data roots. Trains from DIR/spec.toml, sends
// heartbeats to the supervisor (when ENDPOINT is not empty), checkpoints
// into DIR/checkpoints, and before any intended exit writes
// DIR/attempts/A/rank-R.exit.json. SIGTERM or a Stop command: finish the
// step, checkpoint, exit 143.
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "contracts/data_roots.h"
#include "contracts/exit_codes.h"
#include "contracts/exit_file.h"
#include "contracts/run_layout.h"
#include "contracts/spec.h"
#include "sparse/cpu/blas.h"
#include "worker/link.h"
#include "worker/trainer.h"

namespace {

using trainsup::worker::TrainerResult;

std::atomic<bool> g_stop{false};

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Line(const std::string& text) { std::cout << text << std::endl; }

// Writes the exit file and exits; `link` (if any) gets the report first.
[[noreturn]] void Exit(const std::string& run_dir, int attempt, int rank,
                       trainsup::worker::SupervisorLink* link, const TrainerResult& r) {
  if (!r.message.empty()) (r.exit_code == 0 ? std::cout : std::cerr) << r.message << std::endl;
  if (!run_dir.empty() && rank >= 0 && attempt >= 1) {
    trainsup::ExitFile f;
    f.code = r.exit_code;
    f.reason = r.reason;
    f.message = r.message;
    f.last_step = r.last_step;
    f.time_ms = UnixMillis();
    absl::Status s = trainsup::WriteExitFile(run_dir, attempt, rank, f);
    if (!s.ok()) std::cerr << "cannot write the exit file: " << s.message() << std::endl;
  }
  if (link != nullptr) {
    trainsup::worker::v1::ExitReport report;
    report.set_code(r.exit_code);
    report.set_reason(r.reason);
    report.set_message(r.message);
    report.set_last_step(r.last_step);
    link->ReportExit(report, 2.0);
    link->Stop();
  }
  std::cout.flush();
  std::_Exit(r.exit_code);
}

TrainerResult Usage(const std::string& message) {
  TrainerResult r;
  r.exit_code = trainsup::ExitStatus(trainsup::WorkerExit::kUsage);
  r.reason = "usage";
  r.message = message;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  // SIGTERM and SIGINT are taken by one sigwait thread (below), so every
  // other thread must have them blocked, or the kernel may deliver them to
  // one that dies of them. OpenBLAS starts its thread pool when the library
  // loads, before main(): so block them and start again, the new image's
  // threads inheriting the mask (execv keeps it). OpenMP threads that spin
  // while waiting make a worker ten times slower when it shares its cores
  // (measured: 3.3 s instead of 0.3 s per step on two busy cores); libgomp
  // reads the policy when it loads, so it is set before the same restart.
  // An explicit OMP_WAIT_POLICY is respected.
  {
    sigset_t term, before;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    pthread_sigmask(SIG_BLOCK, &term, &before);
    const bool blocked_from_start =
        sigismember(&before, SIGTERM) == 1 && sigismember(&before, SIGINT) == 1;
    const bool set_wait_policy = std::getenv("OMP_WAIT_POLICY") == nullptr;
    if (set_wait_policy) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    if (set_wait_policy || !blocked_from_start) execv("/proc/self/exe", argv);
  }
  trainsup::sparse::EnsureFastBlasKernels(argc, argv);
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) Exit("", 0, -1, nullptr, Usage("unexpected argument " + a));
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      args[a.substr(2, eq - 2)] = a.substr(eq + 1);
    } else if (i + 1 < argc) {
      args[a.substr(2)] = argv[++i];
    } else {
      Exit("", 0, -1, nullptr, Usage("missing value for " + a));
    }
  }
  for (const auto& [k, v] : args) {
    if (k != "run-dir" && k != "rank" && k != "world-size" && k != "attempt" && k != "supervisor" &&
        k != "resume") {
      Exit("", 0, -1, nullptr, Usage("unknown option --" + k));
    }
  }
  trainsup::worker::TrainerOptions options;
  options.run_dir = args["run-dir"];
  int rank = -1, world = 1, attempt = 1;
  if (options.run_dir.empty()) Exit("", 0, -1, nullptr, Usage("--run-dir is required"));
  if (!absl::SimpleAtoi(args.count("rank") ? args["rank"] : "0", &rank) || rank < 0) {
    Exit("", 0, -1, nullptr, Usage("--rank: not a rank: " + args["rank"]));
  }
  if (args.count("world-size") && (!absl::SimpleAtoi(args["world-size"], &world) || world < 1)) {
    Exit("", 0, -1, nullptr, Usage("--world-size: not a size: " + args["world-size"]));
  }
  if (args.count("attempt") && (!absl::SimpleAtoi(args["attempt"], &attempt) || attempt < 1)) {
    Exit("", 0, -1, nullptr, Usage("--attempt: not an attempt number: " + args["attempt"]));
  }
  options.rank = rank;
  options.world_size = world;
  options.attempt = attempt;
  options.resume = args.count("resume") ? args["resume"] : "latest";
  int64_t resume_step = 0;
  if (options.resume != "latest" && options.resume != "none" &&
      (!absl::SimpleAtoi(options.resume, &resume_step) || resume_step < 0)) {
    Exit(options.run_dir, attempt, rank, nullptr,
         Usage("--resume: latest, none or a step number, got " + options.resume));
  }
  // The launch contract's rendezvous (DESIGN.md): rank 0 hosts the store.
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    options.master_addr = addr;
  }
  if (const char* port = std::getenv("MASTER_PORT"); port != nullptr && *port != '\0') {
    if (!absl::SimpleAtoi(port, &options.master_port) || options.master_port < 1 ||
        options.master_port > 65535) {
      Exit(options.run_dir, attempt, rank, nullptr,
           Usage(std::string("MASTER_PORT: not a port: ") + port));
    }
  }
  if (const char* b = std::getenv("TRAINSUP_MEMORY_BUDGET_MB")) {
    absl::SimpleAtoi(b, &options.memory_budget_mb_override);
  }
  absl::StatusOr<std::optional<std::vector<std::string>>> roots =
      trainsup::ParseDataRoots(std::getenv(trainsup::kDataRootsEnv));
  if (!roots.ok())
    Exit(options.run_dir, attempt, rank, nullptr, Usage(std::string(roots.status().message())));
  options.data_roots = *roots;

  const std::string spec_path = trainsup::RunLayout(options.run_dir).SpecPath();
  std::ifstream in(spec_path);
  if (!in) Exit(options.run_dir, attempt, rank, nullptr, Usage("cannot read " + spec_path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<trainsup::RunSpec> spec = trainsup::ParseRunSpec(text.str());
  if (!spec.ok())
    Exit(options.run_dir, attempt, rank, nullptr, Usage(std::string(spec.status().message())));
  if (spec->world_size != world) {
    Exit(options.run_dir, attempt, rank, nullptr,
         Usage(absl::StrCat("--world-size ", world,
                            " but the spec says world_size = ", spec->world_size)));
  }
  at::set_num_threads(static_cast<int>(spec->train.threads));

  // Signals: a sigwait thread turns SIGTERM/SIGINT into a stop request (no
  // work in a signal handler). ignore_sigterm (fault injection) drops them.
  const trainsup::TestingSpec& t = spec->testing;
  bool faults = (t.only_attempt == 0 || t.only_attempt == attempt) &&
                (t.only_rank < 0 || t.only_rank == rank);
  signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  if (faults && t.ignore_sigterm) {
    signal(SIGTERM, SIG_IGN);
    sigdelset(&set, SIGTERM);
  }
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) g_stop = true;
    }
  }).detach();
  if (faults && t.spawn_grandchild) {
    pid_t child = fork();
    if (child == 0) {
      for (;;) pause();
    }
    Line(absl::StrCat("grandchild pid ", child));
  }

  std::unique_ptr<trainsup::worker::SupervisorLink> link;
  const std::string endpoint = args["supervisor"];
  if (!endpoint.empty()) {
    trainsup::worker::LinkOptions lo;
    lo.endpoint = endpoint;
    const char* id = std::getenv("TRAINSUP_RUN_ID");
    lo.run_id = id ? id : std::filesystem::path(options.run_dir).filename().string();
    lo.rank = rank;
    lo.attempt = attempt;
    lo.world_size = world;
    const char* token = std::getenv("TRAINSUP_TOKEN");
    lo.token = token ? token : "";
    link = std::make_unique<trainsup::worker::SupervisorLink>(lo);
    link->Start();
  }
  trainsup::worker::SupervisorLink* l = link.get();
  trainsup::worker::TrainerHooks hooks;
  if (l != nullptr) {
    hooks.progress = [l](const trainsup::v1::Progress& p) {
      trainsup::v1::Progress copy = p;
      copy.set_time_ms(UnixMillis());
      l->UpdateProgress(copy);
    };
    hooks.advance = [l] { l->AdvanceProgress(); };
    hooks.event = [l](trainsup::v1::EventKind kind, int64_t step, int64_t checkpoint_step,
                      const std::string& message) {
      trainsup::worker::v1::WorkerEvent e;
      e.set_kind(kind);
      e.set_step(step);
      e.set_checkpoint_step(checkpoint_step);
      e.set_message(message);
      l->SendEvent(e);
    };
    hooks.checkpoint_failed = [l](int64_t step, int64_t last_good, const std::string& error) {
      trainsup::worker::v1::WorkerEvent e;
      e.set_kind(trainsup::v1::EVENT_KIND_CHECKPOINT);
      e.set_step(step);
      e.set_checkpoint_step(last_good);
      e.set_error(error);
      e.set_message(absl::StrCat("checkpoint step-", step, " failed (training goes on): ", error));
      l->SendEvent(e);
    };
    hooks.checkpoint_requested = [l] { return l->TakeCheckpointRequest(); };
    hooks.pause_heartbeats = [l](bool paused) { l->SetHeartbeatsPaused(paused); };
  }
  hooks.stop_requested = [l] { return g_stop.load() || (l != nullptr && l->stop_requested()); };
  hooks.log = [](const std::string& line) { Line(line); };

  TrainerResult result;
  try {
    result = trainsup::worker::Train(*spec, options, hooks);
  } catch (const std::exception& e) {
    // Not an out-of-memory error, not bad input: a real failure. Say what
    // it was, then crash like any other crash.
    std::cerr << "trainsup-worker: " << e.what() << std::endl;
    throw;
  }
  Exit(options.run_dir, attempt, rank, l, result);
}
