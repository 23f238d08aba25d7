// trainsup-worker: one training process (docs/design.md, the worker contract).
//
//   trainsup-worker --run-dir DIR --rank R --world-size W --attempt A
//       --supervisor ENDPOINT [--resume latest|none|STEP]
//   trainsup-worker --version
//
// with TRAINSUP_TOKEN in the environment, and TRAINSUP_DATA_ROOTS when the
// data files must stay inside the supervisor's data roots. Trains from DIR/spec.toml, sends
// heartbeats to the supervisor (when ENDPOINT is not empty), checkpoints
// into DIR/checkpoints, and before any intended exit writes
// DIR/attempts/A/rank-R.exit.json. SIGTERM or a Stop command: finish the
// step, checkpoint, exit 143.
#include <signal.h>
#include <torch/torch.h>
#include <torch/version.h>
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

#include "absl/strings/str_cat.h"
#include "contracts/exit_codes.h"
#include "contracts/exit_file.h"
#include "contracts/run_layout.h"
#include "contracts/spec.h"
#include "contracts/version.h"
#include "sparse/runtime.h"
#include "worker/link/link.h"
#include "worker/link/worker_args.h"
#include "worker/train/trainer.h"

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
    f.first_bad_step = r.first_bad_step;
    f.tally = r.tally;
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
    report.set_first_bad_step(r.first_bad_step);
    if (r.tally.present()) trainsup::worker::FillTally(r.tally, report.mutable_tally());
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

// The usage exit (64) of a worker whose run directory, attempt and rank are
// known: the exit file is written.
[[noreturn]] void UsageExit(const trainsup::worker::TrainerOptions& o, const std::string& message) {
  Exit(o.run_dir, o.attempt, o.rank, nullptr, Usage(message));
}

// SIGTERM and SIGINT are taken by one sigwait thread (WatchStopSignals), so
// every other thread must have them blocked, or the kernel may deliver them
// to one that dies of them. OpenBLAS starts its thread pool when the library
// loads, before main(): so block them and start again, the new image's
// threads inheriting the mask (execv keeps it). OpenMP threads that spin
// while waiting make a worker ten times slower when it shares its cores
// (measured: 3.3 s instead of 0.3 s per step on two busy cores); libgomp
// reads the policy when it loads, so it is set before the same restart.
// An explicit OMP_WAIT_POLICY is respected.
void RestartWithStopSignalsBlocked(char** argv) {
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

// What the arguments and the launch environment say: the trainer's options
// and the supervisor link's endpoint and identity.
struct Launch {
  trainsup::worker::TrainerOptions options;
  std::string supervisor;  // "" = no link
  std::string run_id;
  std::string token;
};

// The launch, or the usage exit (with the exit file once the run directory
// is known).
Launch LaunchOrExit(int argc, char** argv) {
  absl::StatusOr<trainsup::worker::WorkerArgs> args =
      trainsup::worker::ParseWorkerArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) Exit("", 0, -1, nullptr, Usage(std::string(args.status().message())));
  Launch launch;
  trainsup::worker::TrainerOptions& options = launch.options;
  options.run_dir = args->run_dir;
  options.rank = args->rank;
  options.world_size = args->world_size;
  options.attempt = args->attempt;
  options.resume = args->resume;
  if (absl::Status s = trainsup::worker::CheckResume(args->resume); !s.ok()) {
    UsageExit(options, std::string(s.message()));
  }
  std::map<std::string, std::string> env_values;
  for (const char* name : trainsup::worker::kWorkerEnvNames) {
    if (const char* value = std::getenv(name)) env_values[name] = value;
  }
  absl::StatusOr<trainsup::worker::WorkerEnv> env = trainsup::worker::ParseWorkerEnv(env_values);
  if (!env.ok()) UsageExit(options, std::string(env.status().message()));
  options.master_addr = env->master_addr;
  options.master_port = env->master_port;
  options.node_addr = env->node_addr;
  options.gloo_ifname = env->gloo_ifname;
  options.memory_budget_mb_override = env->memory_budget_mb;
  options.skip_windows = env->skip_windows;
  options.lr_factor = env->lr_factor;
  options.data_roots = env->data_roots;
  launch.supervisor = args->supervisor;
  launch.run_id = env->run_id.value_or(std::filesystem::path(options.run_dir).filename().string());
  launch.token = env->token;
  return launch;
}

trainsup::RunSpec SpecOrExit(const trainsup::worker::TrainerOptions& o) {
  const std::string spec_path = trainsup::RunLayout(o.run_dir).SpecPath();
  std::ifstream in(spec_path);
  if (!in) UsageExit(o, "cannot read " + spec_path);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<trainsup::RunSpec> spec = trainsup::ParseRunSpec(text.str());
  if (!spec.ok()) UsageExit(o, std::string(spec.status().message()));
  // An elastic gang runs with min_world_size to world_size ranks.
  if (absl::Status gang = trainsup::CheckGangSize(*spec, o.world_size); !gang.ok()) {
    UsageExit(o, absl::StrCat("--world-size ", o.world_size, ": ", gang.message()));
  }
  return *spec;
}

// Signals: a sigwait thread turns SIGTERM/SIGINT into a stop request (no
// work in a signal handler). ignore_sigterm (fault injection) drops them.
void WatchStopSignals(const trainsup::RunSpec& spec, const trainsup::worker::TrainerOptions& o) {
  const trainsup::TestingSpec& t = spec.testing;
  const bool faults = (t.only_attempt == 0 || t.only_attempt == o.attempt) &&
                      (t.only_rank < 0 || t.only_rank == o.rank);
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
}

std::unique_ptr<trainsup::worker::SupervisorLink> StartLink(const Launch& launch,
                                                            const trainsup::RunSpec& spec) {
  if (launch.supervisor.empty()) return nullptr;
  const trainsup::worker::TrainerOptions o = launch.options;
  trainsup::worker::LinkOptions lo;
  lo.endpoint = launch.supervisor;
  lo.run_id = launch.run_id;
  lo.rank = o.rank;
  lo.attempt = o.attempt;
  lo.world_size = o.world_size;
  lo.token = launch.token;
  const trainsup::TestingSpec& t = spec.testing;
  if ((t.only_attempt == 0 || t.only_attempt == o.attempt) &&
      (t.only_rank < 0 || t.only_rank == o.rank)) {
    lo.version = t.report_version;
  }
  // A daemon that cannot serve this worker's version: no reconnect mends
  // that, and training on unsupervised would end in a frozen-worker kill
  // and a restart into the same refusal. The usage exit fails the run once,
  // with the daemon's message.
  lo.on_refused = [o](const std::string& message) {
    UsageExit(o, absl::StrCat("trainsupd refused this worker: ", message));
  };
  auto link = std::make_unique<trainsup::worker::SupervisorLink>(lo);
  link->Start();
  return link;
}

// The trainer's hooks over the link (null: no supervisor).
trainsup::worker::TrainerHooks HooksOver(trainsup::worker::SupervisorLink* l) {
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
  return hooks;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::cout << "trainsup-worker " << trainsup::Version() << " (LibTorch " << TORCH_VERSION << ")"
              << std::endl;
    return 0;
  }
  RestartWithStopSignalsBlocked(argv);
  trainsup::sparse::EnsureFastBlasKernels(argc, argv);
  const Launch launch = LaunchOrExit(argc, argv);
  const trainsup::worker::TrainerOptions& options = launch.options;
  const trainsup::RunSpec spec = SpecOrExit(options);
  // Which program this is, first in the rank's log: a box may hold workers
  // built against several torches (deploy/build-worker.sh).
  std::error_code ec;
  Line(absl::StrCat("trainsup-worker ", trainsup::Version(), " (LibTorch ", TORCH_VERSION, ") at ",
                    std::filesystem::read_symlink("/proc/self/exe", ec).string()));
  at::set_num_threads(static_cast<int>(spec.train.threads));
  WatchStopSignals(spec, options);
  std::unique_ptr<trainsup::worker::SupervisorLink> link = StartLink(launch, spec);
  const trainsup::worker::TrainerHooks hooks = HooksOver(link.get());
  TrainerResult result;
  try {
    result = trainsup::worker::Train(spec, options, hooks);
  } catch (const std::exception& e) {
    // Not an out-of-memory error, not bad input: a real failure. Say what
    // it was, then crash like any other crash.
    std::cerr << "trainsup-worker: " << e.what() << std::endl;
    throw;
  }
  Exit(options.run_dir, options.attempt, options.rank, link.get(), result);
}
