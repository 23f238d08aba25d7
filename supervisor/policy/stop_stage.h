// Stopping a worker as data (after systemd's service state machine: each
// stage has its action and its timeout, and one function names the next).
//
//   kStopCommand  the Stop command on the worker's stream: checkpoint and
//                 exit 143 within stop_deadline_s
//   kSigterm      SIGTERM to the worker's process group; term_grace_s
//   kSigkill      SIGKILL to the process group; nothing after it
//
// A graceful stop of a worker with a stream starts at kStopCommand; any
// other stop at kSigterm. When a stage's time runs out the next one begins.
#ifndef TRAINSUP_SUPERVISOR_POLICY_STOP_STAGE_H_
#define TRAINSUP_SUPERVISOR_POLICY_STOP_STAGE_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace trainsup::supervisor {

enum class StopStage { kNone, kStopCommand, kSigterm, kSigkill };

// "none", "stop_command", "sigterm", "sigkill".
std::string ToString(StopStage stage);
std::optional<StopStage> StopStageFromString(absl::string_view name);

struct StopTimeouts {
  double stop_deadline_s = 30;  // kStopCommand
  double term_grace_s = 10;     // kSigterm
};

// Where a stop begins.
StopStage FirstStopStage(bool graceful, bool has_stream);

// The stage after `stage` once its time ran out; kNone after kSigkill.
StopStage NextStopStage(StopStage stage);

// How long `stage` is given before the next one; 0 for kSigkill and kNone.
double StopStageTimeout(StopStage stage, const StopTimeouts& timeouts);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_STOP_STAGE_H_
