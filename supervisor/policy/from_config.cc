#include "supervisor/policy/from_config.h"

namespace trainsup::supervisor {

RestartPolicy RestartPolicyFrom(const RestartSection& r) {
  RestartPolicy p;
  p.initial_backoff_s = r.initial_backoff_s;
  p.max_backoff_s = r.max_backoff_s;
  p.multiplier = r.multiplier;
  p.jitter = r.jitter;
  p.max_restarts = static_cast<int>(r.max_restarts);
  p.restart_window_s = r.restart_window_s;
  p.max_oom_restarts = static_cast<int>(r.max_oom_restarts);
  p.crash_loop_attempts = static_cast<int>(r.crash_loop_attempts);
  return p;
}

RestartPolicy RestartPolicyFor(const DaemonConfig& config, const RunSpec& spec) {
  RestartPolicy p = RestartPolicyFrom(config.restart);
  p.max_rollbacks = static_cast<int>(spec.guard.max_rollbacks);
  return p;
}

ProgressTimeoutConfig ProgressTimeoutFrom(const ProgressSection& p) {
  ProgressTimeoutConfig c;
  c.startup_grace_s = p.startup_grace_s;
  c.safety_factor = p.safety_factor;
  c.min_timeout_s = p.min_timeout_s;
  c.max_timeout_s = p.max_timeout_s;
  c.checkpoint_allowance_s = p.checkpoint_allowance_s;
  c.fixed_timeout_s = p.fixed_timeout_s;
  return c;
}

}  // namespace trainsup::supervisor
