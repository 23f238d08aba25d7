// Hang detection as pure functions, after the adaptive timeouts of
// nvidia-resiliency-ext's in-job restart: the progress timeout is a safety
// factor times the slowest step observed so far, with a start-up grace before
// the first progress and an allowance while checkpointing or evaluating.
// Times are seconds on a clock the caller injects.
#ifndef TRAINSUP_SUPERVISOR_POLICY_PROGRESS_TIMEOUT_H_
#define TRAINSUP_SUPERVISOR_POLICY_PROGRESS_TIMEOUT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainsup::supervisor {

// What the worker says it is doing. The values are those of trainsup.v1.Phase.
enum class WorkerPhase { kLoading = 1, kTraining = 2, kCheckpointing = 3, kEvaluating = 4 };
// "loading", "training", "checkpointing", "evaluating".
std::string ToString(WorkerPhase phase);
std::optional<WorkerPhase> WorkerPhaseFromString(absl::string_view name);
// nullopt for PHASE_UNSPECIFIED (0) and unknown values.
std::optional<WorkerPhase> WorkerPhaseFromProto(int value);

struct ProgressTimeoutConfig {
  double startup_grace_s = 300;  // tolerated before an attempt's first progress
  double safety_factor = 5;      // timeout = safety_factor * slowest step (>= 1)
  double min_timeout_s = 30;     // clamp of the learnt timeout
  double max_timeout_s = 3600;
  double checkpoint_allowance_s = 600;  // added while checkpointing or evaluating
  double fixed_timeout_s = 0;           // > 0: use this instead of learning
};

// OK, or InvalidArgument naming the first field out of range (non-finite or
// negative, safety_factor < 1, min_timeout_s <= 0, max_timeout_s <
// min_timeout_s).
absl::Status Validate(const ProgressTimeoutConfig& config);

// What has been learnt about the run's step times. Survives restarts: the
// caller persists it with the run.
struct ProgressLearning {
  double slowest_step_s = 0;
  int64_t steps_observed = 0;
};

// Records the duration of one training step (progress to progress, while
// training). Negative or non-finite durations are ignored.
void ObserveStep(ProgressLearning& learning, double step_duration_s);

// How long without progress is tolerated now. T, the steady timeout, is
// fixed_timeout_s when set; else clamp(safety_factor * slowest_step_s,
// min_timeout_s, max_timeout_s) once a step has been observed; else (nothing
// learnt yet) clamp(startup_grace_s, min_timeout_s, max_timeout_s). Then:
// checkpointing or evaluating → T + checkpoint_allowance_s; before the
// attempt's first progress, or while loading → max(startup_grace_s, that).
double ProgressTimeoutSeconds(const ProgressTimeoutConfig& config, const ProgressLearning& learning,
                              WorkerPhase phase, bool progressed_this_attempt);

struct Liveness {
  enum Verdict { kAlive, kFrozen, kHung };
  Verdict verdict = kAlive;
  std::string reason;  // empty when alive
};
// "alive", "frozen", "hung".
std::string ToString(Liveness::Verdict verdict);
std::optional<Liveness::Verdict> VerdictFromString(absl::string_view name);

// Frozen when the last heartbeat is more than heartbeat_timeout_s old
// ("no heartbeat for 42.0 s (timeout 30.0 s)"); else hung when the last
// progress is more than progress_timeout_s old ("no progress for 700.0 s
// (timeout 600.0 s)"); else alive. Frozen wins: a process that sends nothing
// cannot report progress either. Before an attempt's first progress, pass
// the attempt's start as last_progress_s.
Liveness CheckLiveness(double now_s, double last_heartbeat_s, double last_progress_s,
                       double heartbeat_timeout_s, double progress_timeout_s);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_PROGRESS_TIMEOUT_H_
