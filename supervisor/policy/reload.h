// What a SIGHUP reload applies, as a pure function of the running and the
// newly read configuration. Knobs that the daemon reads at each use (timeouts,
// restart policy, tokens, data roots, ...) are applied; the ones bound at
// start-up (the state directory, sockets, TLS, slots, the metrics endpoint)
// keep their running values and are named as needing a restart, in the log
// and in GetNode. A key this table does not know is treated as needing a
// restart: a reload never half-applies something it was not built to apply.
#ifndef TRAINSUP_SUPERVISOR_POLICY_RELOAD_H_
#define TRAINSUP_SUPERVISOR_POLICY_RELOAD_H_

#include <string>
#include <vector>

#include "contracts/daemon_config.h"

namespace trainsup::supervisor {

struct ReloadPlan {
  DaemonConfig effective;                   // what the daemon runs with now
  std::vector<std::string> applied;         // changed keys now in effect
  std::vector<std::string> restart_needed;  // changed keys kept at their running value
};

// Whether "section.key" is applied by a reload.
bool AppliedOnReload(const std::string& key);

ReloadPlan PlanReload(const DaemonConfig& running, const DaemonConfig& next);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_RELOAD_H_
