#include "supervisor/policy/progress_timeout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace trainsup::supervisor {
namespace {

constexpr struct {
  WorkerPhase phase;
  const char* name;
} kPhaseNames[] = {
    {WorkerPhase::kLoading, "loading"},
    {WorkerPhase::kTraining, "training"},
    {WorkerPhase::kCheckpointing, "checkpointing"},
    {WorkerPhase::kEvaluating, "evaluating"},
};

constexpr struct {
  Liveness::Verdict verdict;
  const char* name;
} kVerdictNames[] = {
    {Liveness::kAlive, "alive"},
    {Liveness::kFrozen, "frozen"},
    {Liveness::kHung, "hung"},
};

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

absl::Status FieldError(absl::string_view field, double value, absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("progress timeout: ", field, " (", value, ") ", rule));
}

}  // namespace

std::string ToString(WorkerPhase phase) {
  for (const auto& e : kPhaseNames) {
    if (e.phase == phase) return e.name;
  }
  return absl::StrCat("phase(", static_cast<int>(phase), ")");
}

std::optional<WorkerPhase> WorkerPhaseFromString(absl::string_view name) {
  for (const auto& e : kPhaseNames) {
    if (name == e.name) return e.phase;
  }
  return std::nullopt;
}

std::optional<WorkerPhase> WorkerPhaseFromProto(int value) {
  if (value < static_cast<int>(WorkerPhase::kLoading) ||
      value > static_cast<int>(WorkerPhase::kEvaluating)) {
    return std::nullopt;
  }
  return static_cast<WorkerPhase>(value);
}

absl::Status Validate(const ProgressTimeoutConfig& c) {
  const struct {
    const char* field;
    double value;
  } non_negative[] = {
      {"startup_grace_s", c.startup_grace_s},
      {"safety_factor", c.safety_factor},
      {"min_timeout_s", c.min_timeout_s},
      {"max_timeout_s", c.max_timeout_s},
      {"checkpoint_allowance_s", c.checkpoint_allowance_s},
      {"fixed_timeout_s", c.fixed_timeout_s},
  };
  for (const auto& f : non_negative) {
    if (!std::isfinite(f.value) || f.value < 0) {
      return FieldError(f.field, f.value, "must be finite and >= 0");
    }
  }
  if (c.safety_factor < 1) return FieldError("safety_factor", c.safety_factor, "must be >= 1");
  if (c.min_timeout_s <= 0) return FieldError("min_timeout_s", c.min_timeout_s, "must be > 0");
  if (c.max_timeout_s < c.min_timeout_s) {
    return FieldError("max_timeout_s", c.max_timeout_s,
                      absl::StrCat("must be >= min_timeout_s (", c.min_timeout_s, ")"));
  }
  return absl::OkStatus();
}

void ObserveStep(ProgressLearning& learning, double step_duration_s) {
  if (!std::isfinite(step_duration_s) || step_duration_s < 0) return;
  learning.slowest_step_s = std::max(learning.slowest_step_s, step_duration_s);
  ++learning.steps_observed;
}

double ProgressTimeoutSeconds(const ProgressTimeoutConfig& config, const ProgressLearning& learning,
                              WorkerPhase phase, bool progressed_this_attempt) {
  double t;
  if (config.fixed_timeout_s > 0) {
    t = config.fixed_timeout_s;
  } else if (learning.steps_observed > 0) {
    t = std::clamp(config.safety_factor * learning.slowest_step_s, config.min_timeout_s,
                   config.max_timeout_s);
  } else {
    t = std::clamp(config.startup_grace_s, config.min_timeout_s, config.max_timeout_s);
  }
  if (phase == WorkerPhase::kCheckpointing || phase == WorkerPhase::kEvaluating) {
    t += config.checkpoint_allowance_s;
  }
  if (!progressed_this_attempt || phase == WorkerPhase::kLoading) {
    t = std::max(config.startup_grace_s, t);
  }
  return t;
}

std::string ToString(Liveness::Verdict verdict) {
  for (const auto& e : kVerdictNames) {
    if (e.verdict == verdict) return e.name;
  }
  return absl::StrCat("verdict(", static_cast<int>(verdict), ")");
}

std::optional<Liveness::Verdict> VerdictFromString(absl::string_view name) {
  for (const auto& e : kVerdictNames) {
    if (name == e.name) return e.verdict;
  }
  return std::nullopt;
}

Liveness CheckLiveness(double now_s, double last_heartbeat_s, double last_progress_s,
                       double heartbeat_timeout_s, double progress_timeout_s) {
  const double silent = now_s - last_heartbeat_s;
  if (silent > heartbeat_timeout_s) {
    return {Liveness::kFrozen, absl::StrCat("no heartbeat for ", Seconds(silent), " s (timeout ",
                                            Seconds(heartbeat_timeout_s), " s)")};
  }
  const double stalled = now_s - last_progress_s;
  if (stalled > progress_timeout_s) {
    return {Liveness::kHung, absl::StrCat("no progress for ", Seconds(stalled), " s (timeout ",
                                          Seconds(progress_timeout_s), " s)")};
  }
  return {Liveness::kAlive, ""};
}

}  // namespace trainsup::supervisor
