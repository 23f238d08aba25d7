// How a worker is launched: its argv and its whole environment (docs/design.md's
// worker contract), as a pure function of the attempt's facts. Nothing is
// inherited implicitly: the daemon's own environment contributes only the
// variables named in kPassedThrough.
#ifndef TRAINSUP_SUPERVISOR_POLICY_LAUNCH_PLAN_H_
#define TRAINSUP_SUPERVISOR_POLICY_LAUNCH_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "contracts/spec.h"
#include "supervisor/policy/launch_spec.h"

namespace trainsup::supervisor {

// The daemon's variables a worker gets unchanged when the daemon has them.
inline constexpr const char* kPassedThrough[] = {
    "PATH", "HOME", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
    // Which network the collectives use, as the operator set it for the
    // daemon (a systemd Environment= line): Gloo and NCCL read them.
    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"};

// Prefixes of the daemon's variables a worker gets too: NCCL's settings
// (NCCL_DEBUG, NCCL_IB_*, ...) and PyTorch's for its NCCL process group
// (the flight recorder's TORCH_NCCL_DUMP_ON_TIMEOUT and
// TORCH_NCCL_TRACE_BUFFER_SIZE, ...), so that a hung NCCL gang leaves its
// trace in the rank's log. Never the ones that load code
// (PassedThroughFromDaemon).
inline constexpr const char* kPassedThroughPrefixes[] = {"NCCL_", "TORCH_NCCL_"};

// Whether the daemon's variable `name` reaches a worker: one of
// kPassedThrough, or of kPassedThroughPrefixes unless it names code to
// load: a name ending in _PLUGIN (NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN,
// NCCL_PROFILER_PLUGIN, NCCL_ENV_PLUGIN), or NCCL_NET (which picks a
// network plugin by name).
bool PassedThroughFromDaemon(const std::string& name);

// PYTORCH_CUDA_ALLOC_CONF when neither the spec (train.cuda_alloc_conf) nor
// the daemon's environment sets it: expandable segments, PyTorch 2.x's
// answer to the caching allocator's fragmentation under shapes that change
// every step, as a sparse network's do (docs/operations.md, "On a GPU box").
inline constexpr char kDefaultCudaAllocConf[] = "expandable_segments:True";

struct WorkerLaunch {
  std::string binary;
  std::string run_id;
  std::string run_dir;
  int attempt = 1;
  int rank = 0;
  int world_size = 1;
  // The rank among this node's ranks and how many run here: rank and
  // world_size unless the run spans nodes (spec.cluster).
  int local_rank = -1;              // -1: rank
  int local_world_size = -1;        // -1: world_size
  std::string supervisor_endpoint;  // "unix:/…/trainsupd.sock"
  int64_t resume_step = -1;         // -1: none
  std::string token;                // TRAINSUP_TOKEN
  std::string gpu;                  // CUDA_VISIBLE_DEVICES ("" on a CPU slot)
  std::string master_addr = "127.0.0.1";
  // A multi-node run's cluster.advertise_addr ("" = none): the worker binds
  // Gloo there (TRAINSUP_NODE_ADDR).
  std::string node_addr;
  int master_port = 0;
  int64_t memory_budget_mb = 0;  // > 0: TRAINSUP_MEMORY_BUDGET_MB
  // The run's rollbacks (docs/guard.md): "40-59,80-99", the steps whose
  // batches every attempt skips (TRAINSUP_SKIP_WINDOWS, set when not
  // empty), and the learning rate's factor (TRAINSUP_LR_FACTOR, set when < 1).
  std::string skip_windows;
  double lr_factor = 1;
  std::vector<std::string> data_roots;            // TRAINSUP_DATA_ROOTS, ':'-joined
  std::map<std::string, std::string> daemon_env;  // the daemon's environment
  // A command run: `program` (AllowedProgram's path for command->argv[0])
  // runs with command->argv[1..] instead of `binary` and its flags.
  const CommandSpec* command = nullptr;
  std::string program;
  // argv[0] for `program` ("" = `program`): AllowedProgram's argv0.
  std::string program_argv0;
  // The spec's train.cuda_alloc_conf ("" = the daemon's, else the default).
  std::string cuda_alloc_conf;
  std::string resume_dir;  // the chosen checkpoint's directory; "" = fresh start
};

// argv: --run-dir DIR --rank R --world-size W --attempt A --supervisor
// ENDPOINT --resume STEP|none. Environment: kPassedThrough from daemon_env
// (PATH defaults to /usr/local/bin:/usr/bin:/bin), TRAINSUP_TOKEN,
// TRAINSUP_RUN_ID, TRAINSUP_ATTEMPT, CUDA_VISIBLE_DEVICES, RANK, LOCAL_RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TRAINSUP_DATA_ROOTS (always: empty
// when no root is configured, which lets the worker read no data file) and
// TRAINSUP_MEMORY_BUDGET_MB (when lowered), TRAINSUP_SKIP_WINDOWS and
// TRAINSUP_LR_FACTOR (after a rollback). Working
// directory: the run directory; log: RunLayout's rank log.
//
// A command run (w.command set): `program` with argv[1..] as its arguments,
// in command->cwd ("" = the run directory); the environment above plus
// LOCAL_WORLD_SIZE (= WORLD_SIZE: one node), TRAINSUP_RANK,
// TRAINSUP_WORLD_SIZE, TRAINSUP_RUN_DIR, TRAINSUP_CHECKPOINT_DIR
// (RunLayout's), TRAINSUP_RESUME_FROM (resume_dir, "" on a fresh start),
// TRAINSUP_SUPERVISOR (the worker channel endpoint), TRAINSUP_HEARTBEATS
// ("1" or "0") and TRAINSUP_EXIT_FILE (RunLayout's exit file), then command->env (which
// ParseRunSpec keeps off every name set here but PATH and the passed-through ones).
LaunchSpec BuildWorkerLaunch(const WorkerLaunch& w);

// The memory budget of the next attempt after `oom_exits` OOM exits: the
// spec's budget times factor^oom_exits (at least 1 MiB), or 0 (leave the
// spec's) when there is no budget, no OOM exit yet or factor >= 1.
int64_t LoweredMemoryBudgetMb(int64_t spec_budget_mb, int oom_exits, double factor);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_LAUNCH_PLAN_H_
