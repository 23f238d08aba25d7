#include "supervisor/policy/launch_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "contracts/data_roots.h"
#include "contracts/run_layout.h"

namespace trainsup::supervisor {

bool PassedThroughFromDaemon(const std::string& name) {
  for (const char* n : kPassedThrough) {
    if (name == n) return true;
  }
  if (name == "NCCL_NET" || absl::EndsWith(name, "_PLUGIN")) return false;
  for (const char* prefix : kPassedThroughPrefixes) {
    if (absl::StartsWith(name, prefix)) return true;
  }
  return false;
}

LaunchSpec BuildWorkerLaunch(const WorkerLaunch& w) {
  LaunchSpec spec;
  spec.binary = w.binary;
  spec.args = {"--run-dir",    w.run_dir,
               "--rank",       std::to_string(w.rank),
               "--world-size", std::to_string(w.world_size),
               "--attempt",    std::to_string(w.attempt),
               "--supervisor", w.supervisor_endpoint,
               "--resume",     w.resume_step >= 0 ? std::to_string(w.resume_step) : "none"};
  for (const auto& [name, value] : w.daemon_env) {
    if (PassedThroughFromDaemon(name)) spec.env[name] = value;
  }
  // The caching allocator's settings: the spec's, else the operator's (the
  // daemon's environment), else ours.
  if (!w.cuda_alloc_conf.empty()) {
    spec.env["PYTORCH_CUDA_ALLOC_CONF"] = w.cuda_alloc_conf;
  } else if (auto it = w.daemon_env.find("PYTORCH_CUDA_ALLOC_CONF"); it != w.daemon_env.end()) {
    spec.env["PYTORCH_CUDA_ALLOC_CONF"] = it->second;
  } else {
    spec.env["PYTORCH_CUDA_ALLOC_CONF"] = kDefaultCudaAllocConf;
  }
  if (spec.env.count("PATH") == 0) spec.env["PATH"] = "/usr/local/bin:/usr/bin:/bin";
  spec.env["TRAINSUP_TOKEN"] = w.token;
  spec.env["TRAINSUP_RUN_ID"] = w.run_id;
  spec.env["TRAINSUP_ATTEMPT"] = std::to_string(w.attempt);
  spec.env["CUDA_VISIBLE_DEVICES"] = w.gpu;
  spec.env["RANK"] = std::to_string(w.rank);
  const int local_rank = w.local_rank >= 0 ? w.local_rank : w.rank;
  const int local_world = w.local_world_size >= 0 ? w.local_world_size : w.world_size;
  spec.env["LOCAL_RANK"] = std::to_string(local_rank);
  spec.env["WORLD_SIZE"] = std::to_string(w.world_size);
  spec.env["MASTER_ADDR"] = w.master_addr;
  spec.env["MASTER_PORT"] = std::to_string(w.master_port);
  if (!w.node_addr.empty()) spec.env["TRAINSUP_NODE_ADDR"] = w.node_addr;
  // Always set: unset would mean "no confinement" to the worker; a root it
  // cannot be told (config validation refuses those) leaves it none.
  absl::StatusOr<std::string> roots = FormatDataRoots(w.data_roots);
  spec.env[kDataRootsEnv] = roots.ok() ? *roots : "";
  if (w.memory_budget_mb > 0) {
    spec.env["TRAINSUP_MEMORY_BUDGET_MB"] = std::to_string(w.memory_budget_mb);
  }
  if (!w.skip_windows.empty()) spec.env["TRAINSUP_SKIP_WINDOWS"] = w.skip_windows;
  if (w.lr_factor < 1) spec.env["TRAINSUP_LR_FACTOR"] = absl::StrFormat("%.17g", w.lr_factor);
  spec.working_dir = w.run_dir;
  spec.log_path = RunLayout(w.run_dir).LogPath(w.attempt, w.rank);
  if (w.command != nullptr) {
    spec.binary = w.program;
    spec.argv0 = w.program_argv0;
    spec.args.assign(w.command->argv.begin() + (w.command->argv.empty() ? 0 : 1),
                     w.command->argv.end());
    if (!w.command->cwd.empty()) spec.working_dir = w.command->cwd;
    spec.env["LOCAL_WORLD_SIZE"] = std::to_string(local_world);
    spec.env["TRAINSUP_RANK"] = std::to_string(w.rank);
    spec.env["TRAINSUP_WORLD_SIZE"] = std::to_string(w.world_size);
    spec.env["TRAINSUP_RUN_DIR"] = w.run_dir;
    spec.env["TRAINSUP_CHECKPOINT_DIR"] = RunLayout(w.run_dir).CheckpointsDir();
    spec.env["TRAINSUP_RESUME_FROM"] = w.resume_dir;
    spec.env["TRAINSUP_SUPERVISOR"] = w.supervisor_endpoint;
    spec.env["TRAINSUP_HEARTBEATS"] = w.command->heartbeats ? "1" : "0";
    spec.env["TRAINSUP_EXIT_FILE"] = RunLayout(w.run_dir).ExitFilePath(w.attempt, w.rank);
    for (const auto& [name, value] : w.command->env) spec.env[name] = value;
  }
  return spec;
}

int64_t LoweredMemoryBudgetMb(int64_t spec_budget_mb, int oom_exits, double factor) {
  if (spec_budget_mb <= 0 || oom_exits <= 0 || factor >= 1.0) return 0;
  const double mb = static_cast<double>(spec_budget_mb) * std::pow(factor, oom_exits);
  return std::max<int64_t>(1, static_cast<int64_t>(mb));
}

}  // namespace trainsup::supervisor
