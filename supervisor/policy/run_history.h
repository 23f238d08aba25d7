// A run's attempt history rebuilt from what the store kept, as the restart
// policy needs it after a daemon restart. Pure: a stored v1::Run in, plain
// data out.
#ifndef TRAINSUP_SUPERVISOR_POLICY_RUN_HISTORY_H_
#define TRAINSUP_SUPERVISOR_POLICY_RUN_HISTORY_H_

#include <vector>

#include "supervisor/policy/restart_policy.h"
#include "trainsup/v1/supervisor.pb.h"

namespace trainsup::supervisor {

struct RunHistory {
  std::vector<AttemptEnd> ends;  // every ended attempt, oldest first
  int oom_exits = 0;             // ends of class oom
};

// One AttemptEnd per attempt with ended_ms != 0, in the stored order:
// end_s from ended_ms, the class (crash when unknown), made_progress when
// a rank's last step passed the step the attempt resumed from, and
// stop_requested as stored (a cancel, a graceful daemon shutdown), or for
// an attempt of class cancelled. The detail is the attempt's exit reason.
RunHistory RebuildHistory(const v1::Run& stored);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_RUN_HISTORY_H_
