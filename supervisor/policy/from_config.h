// The policies a run follows, built from the daemon config (trainsupd.toml)
// and the run's spec: one conversion each, called by every place that needs
// one. A copy drifts: a multi-node job once built its restart policy apart
// and ignored the spec's guard.max_rollbacks.
#ifndef TRAINSUP_SUPERVISOR_POLICY_FROM_CONFIG_H_
#define TRAINSUP_SUPERVISOR_POLICY_FROM_CONFIG_H_

#include "contracts/daemon_config.h"
#include "contracts/spec.h"
#include "supervisor/policy/progress_timeout.h"
#include "supervisor/policy/restart_policy.h"

namespace trainsup::supervisor {

// The [restart] section's backoff, budgets and crash-loop rule; max_rollbacks
// keeps RestartPolicy's default (a run's comes from its spec: RestartPolicyFor).
RestartPolicy RestartPolicyFrom(const RestartSection& restart);

// The restart policy of one run, local or multi-node: the daemon's [restart]
// section, and the spec's guard.max_rollbacks as its rollback budget.
RestartPolicy RestartPolicyFor(const DaemonConfig& config, const RunSpec& spec);

// The [progress] section's hang detection.
ProgressTimeoutConfig ProgressTimeoutFrom(const ProgressSection& progress);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_FROM_CONFIG_H_
