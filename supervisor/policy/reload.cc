#include "supervisor/policy/reload.h"

#include "absl/strings/match.h"

namespace trainsup::supervisor {
namespace {

// Sections applied as a whole.
constexpr const char* kHotSections[] = {"workers.",     "progress.", "restart.",
                                        "checkpoints.", "commands.", "auth."};
// Single keys of the other sections that are read at each use.
constexpr const char* kHotKeys[] = {
    "daemon.data_roots",           "daemon.worker_binary",     "daemon.max_watchers_per_client",
    "slots.gpu_release_timeout_s", "slots.gpu_idle_memory_mb", "testing.allow_fault_injection",
};

}  // namespace

bool AppliedOnReload(const std::string& key) {
  for (const char* section : kHotSections) {
    if (absl::StartsWith(key, section)) return true;
  }
  for (const char* hot : kHotKeys) {
    if (key == hot) return true;
  }
  return false;
}

ReloadPlan PlanReload(const DaemonConfig& running, const DaemonConfig& next) {
  ReloadPlan plan;
  // The hot sections come from `next`; the others stay as they run, with
  // their hot keys copied over.
  plan.effective = next;
  plan.effective.daemon = running.daemon;
  plan.effective.slots = running.slots;
  plan.effective.testing = running.testing;
  plan.effective.daemon.data_roots = next.daemon.data_roots;
  plan.effective.daemon.worker_binary = next.daemon.worker_binary;
  plan.effective.daemon.max_watchers_per_client = next.daemon.max_watchers_per_client;
  plan.effective.slots.gpu_release_timeout_s = next.slots.gpu_release_timeout_s;
  plan.effective.slots.gpu_idle_memory_mb = next.slots.gpu_idle_memory_mb;
  plan.effective.testing.allow_fault_injection = next.testing.allow_fault_injection;
  for (const std::string& key : ChangedKeys(running, next)) {
    (AppliedOnReload(key) ? plan.applied : plan.restart_needed).push_back(key);
  }
  return plan;
}

}  // namespace trainsup::supervisor
