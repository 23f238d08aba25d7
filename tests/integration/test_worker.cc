// trainsup-test-worker: a torch-free stand-in for trainsup-worker that the
// supervisor's integration tests launch exactly like the real one:
//
//   trainsup-test-worker --run-dir DIR --rank R --world-size W --attempt A
//       --supervisor ENDPOINT [--resume STEP|latest|none]
//
// with TRAINSUP_TOKEN in the environment. It "trains" spec.train.steps steps
// of spec.testing.step_ms each, heartbeats through SupervisorLink, writes
// real checkpoints through the checkpoint store (rank 0 only: a gang has one
// store), obeys SIGTERM and the daemon's commands, and injects the faults of
// the spec's [testing] table.
// The run id in the Hello is TRAINSUP_RUN_ID, else the run directory's name.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"
#include "contracts/exit_codes.h"
#include "contracts/exit_file.h"
#include "contracts/run_layout.h"
#include "contracts/spec.h"
#include "nlohmann/json.hpp"
#include "worker/link/link.h"

namespace trainsup::worker {
namespace {

constexpr int kExitOk = ExitStatus(WorkerExit::kCompleted);
constexpr int kExitCrash = 1;  // not a contract code: what a crash would give
constexpr int kExitUsage = ExitStatus(WorkerExit::kUsage);
constexpr int kExitNoSpace = ExitStatus(WorkerExit::kNoSpace);
constexpr int kExitOom = ExitStatus(WorkerExit::kOom);
constexpr int kExitStopped = ExitStatus(WorkerExit::kStopped);
constexpr double kReportExitTimeoutS = 2;
constexpr char kStateFile[] = "state.json";

std::atomic<bool> g_terminate{false};

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void SleepForever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

struct Args {
  std::string run_dir;
  int rank = -1;
  int world_size = -1;
  int attempt = -1;
  std::string supervisor;
  std::string resume = "latest";
};

// Fills `args` as far as it gets (so a usage error can still be written to
// the exit file when run dir, rank and attempt are known).
absl::Status ParseArgs(int argc, char** argv, Args* args) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    std::string value;
    if (name.rfind("--", 0) != 0) return absl::InvalidArgumentError("unexpected argument " + name);
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(name + " needs a value");
    }
    if (flags.count(name)) return absl::InvalidArgumentError(name + " given twice");
    flags[name] = value;
  }
  auto take_int = [&](const std::string& name, int* out) -> absl::Status {
    auto it = flags.find(name);
    if (it == flags.end()) return absl::InvalidArgumentError(name + " is required");
    if (!absl::SimpleAtoi(it->second, out)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not an integer: '", it->second, "'"));
    }
    flags.erase(it);
    return absl::OkStatus();
  };
  auto run_dir = flags.find("--run-dir");
  if (run_dir == flags.end() || run_dir->second.empty()) {
    return absl::InvalidArgumentError("--run-dir is required");
  }
  args->run_dir = run_dir->second;
  flags.erase(run_dir);
  for (auto [name, out] : {std::pair<const char*, int*>{"--rank", &args->rank},
                           {"--attempt", &args->attempt},
                           {"--world-size", &args->world_size}}) {
    absl::Status s = take_int(name, out);
    if (!s.ok()) return s;
  }
  auto supervisor = flags.find("--supervisor");
  if (supervisor == flags.end()) {
    return absl::InvalidArgumentError("--supervisor is required (it may be empty)");
  }
  args->supervisor = supervisor->second;
  flags.erase(supervisor);
  if (auto resume = flags.find("--resume"); resume != flags.end()) {
    args->resume = resume->second;
    int64_t step = 0;
    if (args->resume != "latest" && args->resume != "none" &&
        (!absl::SimpleAtoi(args->resume, &step) || step < 0)) {
      return absl::InvalidArgumentError("--resume must be STEP, latest or none, got '" +
                                        args->resume + "'");
    }
    flags.erase(resume);
  }
  if (!flags.empty()) return absl::InvalidArgumentError("unknown flag " + flags.begin()->first);
  if (args->world_size < 1) return absl::InvalidArgumentError("--world-size must be >= 1");
  if (args->rank < 0 || args->rank >= args->world_size) {
    return absl::InvalidArgumentError("--rank must be in [0, world size)");
  }
  if (args->attempt < 1) return absl::InvalidArgumentError("--attempt must be >= 1");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class TestWorker {
 public:
  TestWorker(Args args, RunSpec spec)
      : args_(std::move(args)),
        spec_(std::move(spec)),
        // The run's one store (contracts/run_layout.h): rank 0 writes it, every
        // rank resumes from the step the supervisor names (--resume STEP).
        store_(RunLayout(args_.run_dir).CheckpointRoot(args_.rank, args_.world_size),
               ckpt::FileSystem::Default(),
               ckpt::StoreOptions{static_cast<int>(spec_.train.keep_checkpoints)}),
        link_(MakeLinkOptions()) {
    const TestingSpec& t = spec_.testing;
    faults_ = (t.only_attempt == 0 || t.only_attempt == args_.attempt) &&
              (t.only_rank == -1 || t.only_rank == args_.rank);
  }

  bool faults() const { return faults_; }

  int Run() {
    link_.Start();
    progress_.set_phase(trainsup::v1::PHASE_LOADING);
    progress_.set_total_steps(TotalSteps(spec_, 0));
    progress_.set_last_checkpoint_step(-1);
    link_.UpdateProgress(progress_);
    if (faults_ && spec_.testing.corrupt_checkpoint) CorruptNewestCheckpoint();
    if (int code = Resume(); code >= 0) return code;
    return Train();
  }

  // Writes the exit file and reports the exit on the stream; returns `code`.
  int Finish(int code, const std::string& reason, const std::string& message) {
    if (code != kExitOk) std::fprintf(stderr, "trainsup-test-worker: %s\n", message.c_str());
    ExitFile exit_file{code, reason, message, step_, UnixMillis()};
    absl::Status s = WriteExitFile(args_.run_dir, args_.attempt, args_.rank, exit_file);
    if (!s.ok()) std::fprintf(stderr, "cannot write the exit file: %s\n", s.ToString().c_str());
    trainsup::worker::v1::ExitReport report;
    report.set_code(code);
    report.set_reason(reason);
    report.set_message(message);
    report.set_last_step(step_);
    link_.ReportExit(report, kReportExitTimeoutS);
    return code;
  }

 private:
  LinkOptions MakeLinkOptions() const {
    LinkOptions o;
    o.endpoint = args_.supervisor;
    const char* run_id = std::getenv("TRAINSUP_RUN_ID");
    if (run_id != nullptr) {
      o.run_id = run_id;
    } else {
      const std::string dir = args_.run_dir.substr(0, args_.run_dir.find_last_not_of('/') + 1);
      o.run_id = dir.substr(dir.find_last_of('/') + 1);
    }
    o.rank = args_.rank;
    o.attempt = args_.attempt;
    o.world_size = args_.world_size;
    const char* token = std::getenv("TRAINSUP_TOKEN");
    o.token = token != nullptr ? token : "";
    const TestingSpec& t = spec_.testing;
    if ((t.only_attempt == 0 || t.only_attempt == args_.attempt) &&
        (t.only_rank == -1 || t.only_rank == args_.rank)) {
      o.version = t.report_version;
    }
    // As trainsup-worker: a refusal ends the worker with the usage exit.
    const std::string run_dir = args_.run_dir;
    const int attempt = args_.attempt;
    const int rank = args_.rank;
    o.on_refused = [run_dir, attempt, rank](const std::string& message) {
      const std::string text = "trainsupd refused this worker: " + message;
      std::fprintf(stderr, "trainsup-test-worker: %s\n", text.c_str());
      ExitFile exit_file{kExitUsage, "usage", text, -1, UnixMillis()};
      WriteExitFile(run_dir, attempt, rank, exit_file).IgnoreError();
      std::_Exit(kExitUsage);
    };
    return o;
  }

  void Event(trainsup::v1::EventKind kind, const std::string& message, int64_t ckpt_step = 0) {
    trainsup::worker::v1::WorkerEvent event;
    event.set_kind(kind);
    event.set_step(step_);
    event.set_checkpoint_step(ckpt_step);
    event.set_message(message);
    link_.SendEvent(event);
  }

  void Say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  // Flips one byte of the newest checkpoint's state file, so its manifest
  // no longer verifies.
  void CorruptNewestCheckpoint() {
    auto list = store_.List();
    if (!list.ok() || list->empty()) return;
    const std::string path = ckpt::JoinPath(list->back().path, kStateFile);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    if (!f.seekg(0) || !f.get(c)) return;
    f.seekp(0);
    f.put(static_cast<char>(c ^ 0x20));
    Say(absl::StrCat("corrupted ", path));
  }

  // An I/O error while choosing or loading the checkpoint: the attempt
  // fails like a crash (the supervisor retries it); nothing is quarantined
  // and the worker starts neither from scratch nor from an older step.
  int CheckpointIoError(const absl::Status& s) {
    return Finish(
        kExitCrash, ToString(CrashReason::kCheckpointIo),
        absl::StrCat("cannot resume (nothing quarantined; the attempt is retried): ", s.message()));
  }

  // Returns an exit code when the worker must end, else -1.
  int Resume() {
    if (args_.resume == "none") return -1;
    ckpt::CheckpointInfo chosen;
    if (args_.resume == "latest") {
      std::vector<ckpt::QuarantineReport> quarantined;
      auto latest = store_.ChooseLatest(&quarantined);
      for (const auto& q : quarantined) {
        const std::string msg =
            absl::StrCat("checkpoint step-", q.step, " quarantined: ", q.reason);
        Say(msg);
        Event(trainsup::v1::EVENT_KIND_LOG, msg);
      }
      if (absl::IsNotFound(latest.status())) return -1;
      if (absl::IsUnavailable(latest.status())) return CheckpointIoError(latest.status());
      if (!latest.ok()) {
        return Finish(kExitCrash, "checkpoint_error", std::string(latest.status().message()));
      }
      chosen = *latest;
    } else {
      int64_t want = 0;
      absl::SimpleAtoi(args_.resume, &want);
      auto list = store_.List();
      if (!list.ok()) return CheckpointIoError(list.status());
      bool found = false;
      for (const auto& info : *list) {
        if (info.step == want) {
          chosen = info;
          found = true;
        }
      }
      if (!found) {
        return Finish(
            kExitUsage, "usage",
            absl::StrCat("--resume ", want, ": no checkpoint step-", want, " in ", store_.root()));
      }
      // A corrupt checkpoint is moved aside, so the supervisor's next choice
      // skips it, and the attempt ends as a crash (restartable). Rank 0
      // alone moves it, as it alone writes the store; another rank leaves it
      // to rank 0 or to the supervisor's next choice, which verifies again.
      if (absl::Status s = store_.Verify(chosen); absl::IsDataLoss(s)) {
        if (args_.rank == 0) store_.Quarantine(chosen, std::string(s.message())).IgnoreError();
        const std::string msg =
            absl::StrCat("checkpoint step-", want,
                         args_.rank == 0 ? " quarantined: " : " corrupt: ", s.message());
        Say(msg);
        Event(trainsup::v1::EVENT_KIND_LOG, msg);
        return Finish(kExitCrash, ToString(CrashReason::kCheckpointCorrupt), msg);
      } else if (!s.ok()) {
        return CheckpointIoError(s);
      }
    }
    const std::string state_path = ckpt::JoinPath(chosen.path, kStateFile);
    auto text = store_.fs()->ReadSmallFile(state_path);
    if (!text.ok()) {
      absl::Status s = ckpt::CheckpointReadError(
          text.status(), absl::StrCat(state_path, ": ", text.status().message()));
      if (absl::IsUnavailable(s)) return CheckpointIoError(s);
      return Finish(kExitCrash, "checkpoint_error", std::string(s.message()));
    }
    const nlohmann::json state = nlohmann::json::parse(*text, nullptr, false);
    if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer() ||
        state["step"].get<int64_t>() != chosen.step) {
      return Finish(kExitCrash, "checkpoint_error",
                    absl::StrCat(chosen.path, ": bad ", kStateFile));
    }
    step_ = chosen.step;
    last_checkpoint_step_ = chosen.step;
    progress_.set_last_checkpoint_step(chosen.step);
    const std::string msg = absl::StrCat("resumed from step ", chosen.step);
    Say(msg);
    Event(trainsup::v1::EVENT_KIND_LOG, msg);
    return -1;
  }

  // Rank 0 writes the gang's checkpoint; any other rank writes nothing and
  // succeeds (the real worker meets rank 0 at a barrier first; these ranks
  // do not synchronise, which the supervisor's tests do not need).
  absl::Status Checkpoint() {
    if (step_ == last_checkpoint_step_ || args_.rank != 0) return absl::OkStatus();
    progress_.set_phase(trainsup::v1::PHASE_CHECKPOINTING);
    link_.UpdateProgress(progress_);
    const nlohmann::json state = {{"step", step_},
                                  {"progress_counter", link_.progress_counter()},
                                  {"rank", args_.rank},
                                  {"world_size", args_.world_size},
                                  {"attempt", args_.attempt},
                                  {"loss", Loss()}};
    auto pending = store_.Begin(step_);
    absl::Status s = pending.status();
    // testing.checkpoint_delay_ms: the write is slow, as the real worker's
    // (busy shared storage).
    if (faults_ && spec_.testing.checkpoint_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(spec_.testing.checkpoint_delay_ms));
    }
    if (s.ok()) s = (*pending)->WriteFile(kStateFile, state.dump() + "\n");
    if (s.ok()) {
      s = store_.Commit(std::move(*pending));
    } else if (pending.ok()) {
      store_.Abort(std::move(*pending));
    }
    if (!s.ok()) {
      // Reported, and left to the caller: a periodic save is tried again
      // at the next interval, a final one ends the attempt.
      const std::string error(s.message());
      progress_.set_checkpoint_failures(progress_.checkpoint_failures() + 1);
      progress_.set_last_checkpoint_error(error);
      progress_.set_phase(trainsup::v1::PHASE_TRAINING);
      link_.UpdateProgress(progress_);
      const std::string msg =
          absl::StrCat("checkpoint step-", step_, " failed (training goes on): ", error);
      Say(msg);
      trainsup::worker::v1::WorkerEvent event;
      event.set_kind(trainsup::v1::EVENT_KIND_CHECKPOINT);
      event.set_step(step_);
      event.set_checkpoint_step(last_checkpoint_step_);
      event.set_error(error);
      event.set_message(msg);
      link_.SendEvent(event);
      return s;
    }
    last_checkpoint_step_ = step_;
    progress_.set_last_checkpoint_error("");
    last_checkpoint_time_ = std::chrono::steady_clock::now();
    progress_.set_last_checkpoint_step(step_);
    progress_.set_phase(trainsup::v1::PHASE_TRAINING);
    link_.UpdateProgress(progress_);
    Say(absl::StrCat("checkpoint step-", step_));
    Event(trainsup::v1::EVENT_KIND_CHECKPOINT, absl::StrCat("checkpoint step-", step_), step_);
    return absl::OkStatus();
  }

  // For a checkpoint that must be written (`when`: at the end, before a
  // requested stop): -1 when it was, else the exit code: 74 when the file
  // system is full (ResourceExhausted: ENOSPC, EDQUOT), 1 otherwise.
  int CheckpointOrFail(const std::string& when) {
    absl::Status s = Checkpoint();
    if (s.ok()) return -1;
    if (!absl::IsResourceExhausted(s)) {
      return Finish(kExitCrash, ToString(CrashReason::kCheckpointFailed), std::string(s.message()));
    }
    return Finish(
        kExitNoSpace, ToString(WorkerExit::kNoSpace),
        absl::StrCat("no space left in ", store_.root(), " for checkpoint step-", step_, " ", when,
                     ": ", s.message(), "; the newest checkpoint kept is ",
                     last_checkpoint_step_ >= 0 ? absl::StrCat("step-", last_checkpoint_step_)
                                                : std::string("none")));
  }

  double Loss() const { return 2.0 / (1.0 + 0.1 * static_cast<double>(step_)); }

  // Injects the fault planned for `step` (about to start), if any. Returns
  // an exit code when the worker must end, else -1.
  int InjectFault(int64_t step) {
    const TestingSpec& t = spec_.testing;
    if (step == t.crash_at_step) {
      std::fprintf(stderr, "injected crash at step %lld\n", static_cast<long long>(step));
      std::abort();
    }
    if (step == t.exit_at_step) {
      return Finish(static_cast<int>(t.exit_code), "injected_exit",
                    absl::StrCat("injected exit at step ", step));
    }
    if (step == t.oom_at_step) {
      return Finish(kExitOom, "oom", absl::StrCat("injected out of memory at step ", step));
    }
    if (step == t.signal_at_step) {
      Say(absl::StrCat("raising signal ", t.signal, " at step ", step));
      // Process-directed, so a blocked SIGTERM reaches the sigwait thread.
      ::kill(::getpid(), static_cast<int>(t.signal));
    }
    if (step == t.hang_at_step) {
      Say(absl::StrCat("injected hang at step ", step));
      SleepForever();
    }
    if (step == t.freeze_at_step) {
      Say(absl::StrCat("injected freeze at step ", step));
      link_.SetHeartbeatsPaused(true);
      SleepForever();
    }
    return -1;
  }

  int Train() {
    const int64_t total = TotalSteps(spec_, 0);
    const auto step_time = std::chrono::milliseconds(spec_.testing.step_ms);
    const double samples_per_sec = static_cast<double>(spec_.train.batch_size) * 1000.0 /
                                   static_cast<double>(std::max<int64_t>(1, spec_.testing.step_ms));
    last_checkpoint_time_ = std::chrono::steady_clock::now();
    progress_.set_phase(trainsup::v1::PHASE_TRAINING);
    progress_.set_step(step_);
    link_.UpdateProgress(progress_);
    while (step_ < total) {
      if (faults_) {
        if (int code = InjectFault(step_ + 1); code >= 0) return code;
      }
      std::this_thread::sleep_for(step_time);
      ++step_;
      link_.AdvanceProgress();
      progress_.set_step(step_);
      progress_.set_loss(Loss());
      progress_.set_samples_per_sec(samples_per_sec);
      link_.UpdateProgress(progress_);
      std::printf("step %lld/%lld loss %.2f\n", static_cast<long long>(step_),
                  static_cast<long long>(total), Loss());
      std::fflush(stdout);
      if (step_ == total) break;
      if (g_terminate.load() || link_.stop_requested()) {
        if (int code = CheckpointOrFail("before stopping on request"); code >= 0) return code;
        return Finish(kExitStopped, "stopped",
                      g_terminate.load() ? "stopped by SIGTERM" : "stopped by the supervisor");
      }
      const int64_t every = spec_.train.checkpoint_every_steps;
      const double every_s = spec_.train.checkpoint_every_seconds;
      const bool requested = link_.TakeCheckpointRequest();
      const bool by_time =
          every_s > 0 && std::chrono::steady_clock::now() - last_checkpoint_time_ >=
                             std::chrono::duration<double>(every_s);
      if ((every > 0 && step_ % every == 0) || requested || by_time) {
        // A failed save has been reported; the next comes an interval later.
        Checkpoint().IgnoreError();
        last_checkpoint_time_ = std::chrono::steady_clock::now();
      }
    }
    if (int code = CheckpointOrFail("at the end of the run"); code >= 0) return code;
    return Finish(kExitOk, "completed", absl::StrCat("completed ", total, " steps"));
  }

  const Args args_;
  const RunSpec spec_;
  ckpt::CheckpointStore store_;
  SupervisorLink link_;
  bool faults_ = false;
  int64_t step_ = 0;  // completed steps
  int64_t last_checkpoint_step_ = -1;
  std::chrono::steady_clock::time_point last_checkpoint_time_;
  trainsup::v1::Progress progress_;
};

// Exit 64 with `message` on stderr, and in the exit file when run dir, rank
// and attempt are known.
int UsageError(const Args& args, bool can_write_exit_file, const std::string& message,
               bool show_usage = false) {
  std::fprintf(stderr, "trainsup-test-worker: %s\n", message.c_str());
  if (show_usage) {
    std::fprintf(stderr,
                 "usage: trainsup-test-worker --run-dir DIR --rank R --world-size W --attempt A "
                 "--supervisor ENDPOINT [--resume STEP|latest|none]\n");
  }
  if (can_write_exit_file) {
    WriteExitFile(args.run_dir, args.attempt, args.rank,
                  ExitFile{kExitUsage, "usage", message, -1, UnixMillis()})
        .IgnoreError();
  }
  return kExitUsage;
}

int Main(int argc, char** argv) {
  // What the daemon put in the environment, for the integration tests.
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "TRAINSUP_MEMORY_BUDGET_MB"}) {
    const char* value = std::getenv(name);
    std::printf("%s=%s\n", name, value != nullptr ? value : "unset");
  }
  std::fflush(stdout);
  Args args;
  if (absl::Status s = ParseArgs(argc, argv, &args); !s.ok()) {
    return UsageError(args, !args.run_dir.empty() && args.rank >= 0 && args.attempt >= 1,
                      std::string(s.message()), /*show_usage=*/true);
  }
  auto text = ReadWholeFile(args.run_dir + "/spec.toml");
  if (!text.ok()) return UsageError(args, true, std::string(text.status().message()));
  auto spec = ParseRunSpec(*text);
  if (!spec.ok())
    return UsageError(args, true, "spec.toml: " + std::string(spec.status().message()));
  if (absl::Status gang = CheckGangSize(*spec, args.world_size); !gang.ok()) {
    return UsageError(args, true,
                      absl::StrCat("--world-size ", args.world_size, ": ", gang.message()));
  }

  // Before any thread exists: the grandchild must not inherit threads, and
  // every thread must inherit the blocked signal mask.
  TestWorker worker(args, *spec);
  const TestingSpec testing = worker.faults() ? spec->testing : TestingSpec();
  ::signal(SIGPIPE, SIG_IGN);  // a closed log pipe must not kill training
  if (testing.spawn_grandchild) {
    const pid_t child = ::fork();
    if (child == 0) {
      for (;;) ::pause();
    }
    if (child > 0) {
      std::printf("grandchild pid %d\n", static_cast<int>(child));
      std::fflush(stdout);
    }
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  if (testing.ignore_sigterm) {
    ::signal(SIGTERM, SIG_IGN);
  } else {
    sigaddset(&set, SIGTERM);
  }
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    while (sigwait(&set, &sig) == 0) g_terminate.store(true);
  }).detach();
  return worker.Run();
}

}  // namespace
}  // namespace trainsup::worker

int main(int argc, char** argv) { return trainsup::worker::Main(argc, argv); }
