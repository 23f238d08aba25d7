// trainsup-worker's command line and launch environment (docs/design.md, the
// worker contract), parsed into plain values: no LibTorch, so the daemon's
// side of the contract (supervisor/policy/launch_plan.h, BuildWorkerLaunch)
// is tested against this parser round-trip (tests/worker/link/worker_args_test.cc).
#ifndef TRAINSUP_WORKER_LINK_WORKER_ARGS_H_
#define TRAINSUP_WORKER_LINK_WORKER_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "contracts/spec.h"

namespace trainsup::worker {

// --run-dir DIR --rank R --world-size W --attempt A --supervisor ENDPOINT
// --resume latest|none|STEP, each as "--flag value" or "--flag=value".
struct WorkerArgs {
  std::string run_dir;
  int rank = 0;
  int world_size = 1;
  int attempt = 1;
  std::string supervisor;  // "" = no supervisor link
  std::string resume = "latest";
};

// `args` without argv[0]. InvalidArgument (the worker's usage exit, 64):
// "unexpected argument X", "missing value for --X", "unknown option --X",
// "--run-dir is required", "--rank: not a rank: X",
// "--world-size: not a size: X", "--attempt: not an attempt number: X".
// --resume is checked apart (CheckResume), once the exit file can be
// written.
absl::StatusOr<WorkerArgs> ParseWorkerArgs(const std::vector<std::string>& args);

// OK for "latest", "none" or a step number >= 0; else InvalidArgument
// "--resume: latest, none or a step number, got X".
absl::Status CheckResume(const std::string& resume);

// The launch environment the worker reads, by name (absent names are
// absent from the map).
inline constexpr const char* kWorkerEnvNames[] = {
    "MASTER_ADDR",         "MASTER_PORT",        "TRAINSUP_MEMORY_BUDGET_MB",
    "TRAINSUP_DATA_ROOTS", "TRAINSUP_RUN_ID",    "TRAINSUP_TOKEN",
    "TRAINSUP_NODE_ADDR",  "GLOO_SOCKET_IFNAME", "TRAINSUP_SKIP_WINDOWS",
    "TRAINSUP_LR_FACTOR"};

struct WorkerEnv {
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int64_t memory_budget_mb = 0;  // 0: the spec's
  std::optional<std::vector<std::string>> data_roots;
  std::optional<std::string> run_id;  // unset: the run directory's name
  std::string token;
  std::string node_addr;    // TRAINSUP_NODE_ADDR: this node's advertised address
  std::string gloo_ifname;  // GLOO_SOCKET_IFNAME: the interfaces Gloo binds to
  // A rollback's (docs/guard.md): TRAINSUP_SKIP_WINDOWS "40-59,80-99", the
  // steps whose batches are skipped besides the spec's, and
  // TRAINSUP_LR_FACTOR, the learning rate's factor in (0, 1].
  std::vector<StepWindow> skip_windows;
  double lr_factor = 1;
};

// InvalidArgument "MASTER_PORT: not a port: X", or the data roots' error
// (contracts/data_roots.h). A TRAINSUP_MEMORY_BUDGET_MB that is not a
// number is ignored (the spec's budget holds). A TRAINSUP_SKIP_WINDOWS or
// TRAINSUP_LR_FACTOR that does not parse is InvalidArgument naming it: a
// rollback must never train on what it was told to skip.
absl::StatusOr<WorkerEnv> ParseWorkerEnv(const std::map<std::string, std::string>& env);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_LINK_WORKER_ARGS_H_
