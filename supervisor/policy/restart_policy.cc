#include "supervisor/policy/restart_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "contracts/exit_codes.h"

namespace trainsup::supervisor {
namespace {

constexpr struct {
  ExitClass cls;
  const char* name;
} kExitClassNames[] = {
    {ExitClass::kSuccess, "success"},     {ExitClass::kUsage, "usage"},
    {ExitClass::kData, "data"},           {ExitClass::kOom, "oom"},
    {ExitClass::kStopped, "stopped"},     {ExitClass::kCrash, "crash"},
    {ExitClass::kSignal, "signal"},       {ExitClass::kFrozen, "frozen"},
    {ExitClass::kHung, "hung"},           {ExitClass::kGang, "gang"},
    {ExitClass::kCancelled, "cancelled"}, {ExitClass::kLost, "lost"},
    {ExitClass::kNoSpace, "no_space"},    {ExitClass::kPeerLost, "peer_lost"},
    {ExitClass::kDiverged, "diverged"},
};

constexpr struct {
  Action action;
  const char* name;
} kActionNames[] = {
    {Action::kSucceed, "succeed"},
    {Action::kFail, "fail"},
    {Action::kRestart, "restart"},
    {Action::kStop, "stop"},
};

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

// Our own stop, whatever the class says (rule 3). Success, usage and data
// carry their own outcome and are never a stop.
bool IsStop(const AttemptEnd& end) {
  switch (end.cls) {
    case ExitClass::kSuccess:
    case ExitClass::kUsage:
    case ExitClass::kData:
      return false;
    case ExitClass::kCancelled:
      return true;
    default:
      return end.stop_requested;
  }
}

// An end that would be restarted if the budgets allowed (rule 4b).
bool IsFailure(const AttemptEnd& end) {
  return end.cls != ExitClass::kSuccess && end.cls != ExitClass::kUsage &&
         end.cls != ExitClass::kData && end.cls != ExitClass::kNoSpace &&
         end.cls != ExitClass::kDiverged && !IsStop(end);
}

double Backoff(const RestartPolicy& policy, int streak, double jitter_unit) {
  const double base = std::min(policy.initial_backoff_s * std::pow(policy.multiplier, streak - 1),
                               policy.max_backoff_s);
  const double u = std::clamp(jitter_unit, 0.0, 1.0);
  return base * (1 + policy.jitter * (2 * u - 1));
}

absl::Status FieldError(absl::string_view field, double value, absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("restart policy: ", field, " (", value, ") ", rule));
}

}  // namespace

std::string ToString(ExitClass cls) {
  for (const auto& e : kExitClassNames) {
    if (e.cls == cls) return e.name;
  }
  return absl::StrCat("exit_class(", static_cast<int>(cls), ")");
}

std::optional<ExitClass> ExitClassFromString(absl::string_view name) {
  for (const auto& e : kExitClassNames) {
    if (name == e.name) return e.cls;
  }
  return std::nullopt;
}

int ToProto(ExitClass cls) { return static_cast<int>(cls); }

std::optional<ExitClass> ExitClassFromProto(int value) {
  if (value < static_cast<int>(ExitClass::kSuccess) ||
      value > static_cast<int>(ExitClass::kDiverged)) {
    return std::nullopt;
  }
  return static_cast<ExitClass>(value);
}

ExitClass ClassifyExit(bool exited, int code_or_signal) {
  if (!exited) return ExitClass::kSignal;
  const std::optional<WorkerExit> code = WorkerExitFromStatus(code_or_signal);
  if (!code) return ExitClass::kCrash;
  switch (*code) {
    case WorkerExit::kCompleted:
      return ExitClass::kSuccess;
    case WorkerExit::kUsage:
      return ExitClass::kUsage;
    case WorkerExit::kData:
      return ExitClass::kData;
    case WorkerExit::kNoSpace:
      return ExitClass::kNoSpace;
    case WorkerExit::kOom:
      return ExitClass::kOom;
    case WorkerExit::kPeerLost:
      return ExitClass::kPeerLost;
    case WorkerExit::kDiverged:
      return ExitClass::kDiverged;
    case WorkerExit::kStopped:
      return ExitClass::kStopped;
  }
  return ExitClass::kCrash;
}

std::string DescribeExit(bool exited, int code_or_signal) {
  return absl::StrCat(exited ? "exit " : "signal ", code_or_signal);
}

std::string ToString(Action action) {
  for (const auto& e : kActionNames) {
    if (e.action == action) return e.name;
  }
  return absl::StrCat("action(", static_cast<int>(action), ")");
}

std::optional<Action> ActionFromString(absl::string_view name) {
  for (const auto& e : kActionNames) {
    if (name == e.name) return e.action;
  }
  return std::nullopt;
}

absl::Status Validate(const RestartPolicy& p) {
  const struct {
    const char* field;
    double value;
  } non_negative[] = {
      {"initial_backoff_s", p.initial_backoff_s},
      {"max_backoff_s", p.max_backoff_s},
      {"multiplier", p.multiplier},
      {"jitter", p.jitter},
      {"max_restarts", static_cast<double>(p.max_restarts)},
      {"restart_window_s", p.restart_window_s},
      {"max_oom_restarts", static_cast<double>(p.max_oom_restarts)},
      {"crash_loop_attempts", static_cast<double>(p.crash_loop_attempts)},
  };
  for (const auto& f : non_negative) {
    if (!std::isfinite(f.value) || f.value < 0) {
      return FieldError(f.field, f.value, "must be finite and >= 0");
    }
  }
  if (p.max_backoff_s < p.initial_backoff_s) {
    return FieldError("max_backoff_s", p.max_backoff_s,
                      absl::StrCat("must be >= initial_backoff_s (", p.initial_backoff_s, ")"));
  }
  if (p.multiplier < 1) return FieldError("multiplier", p.multiplier, "must be >= 1");
  if (p.jitter > 1) return FieldError("jitter", p.jitter, "must be <= 1");
  if (p.restart_window_s <= 0) {
    return FieldError("restart_window_s", p.restart_window_s, "must be > 0");
  }
  return absl::OkStatus();
}

RestartDecision DecideRestart(const RestartPolicy& policy, const std::vector<AttemptEnd>& history,
                              double jitter_unit) {
  RestartDecision d;
  if (history.empty()) {
    d.reason = "no attempt to decide on";
    return d;
  }
  const AttemptEnd& last = history.back();
  const std::string what = last.detail.empty()
                               ? ToString(last.cls)
                               : absl::StrCat(last.detail, " (", ToString(last.cls), ")");
  const std::string detail_suffix = last.detail.empty() ? "" : absl::StrCat(": ", last.detail);
  d.oom = last.cls == ExitClass::kOom;

  if (last.cls == ExitClass::kSuccess) {
    d.action = Action::kSucceed;
    d.reason = "exit 0: run complete";
    return d;
  }
  if (last.cls == ExitClass::kUsage || last.cls == ExitClass::kData) {
    d.action = Action::kFail;
    d.reason = absl::StrCat(last.cls == ExitClass::kUsage ? "exit 64: bad spec or arguments"
                                                          : "exit 65: data unreadable",
                            detail_suffix);
    return d;
  }
  if (IsStop(last)) {
    d.action = Action::kStop;
    d.reason = absl::StrCat("stopped on request: ", what);
    return d;
  }
  if (last.cls == ExitClass::kNoSpace) {
    int streak = 0;
    for (auto it = history.rbegin(); it != history.rend() && it->cls == ExitClass::kNoSpace; ++it) {
      ++streak;
    }
    d.action = Action::kRestart;
    d.wait_for_space = true;
    d.consecutive_failures = streak;
    d.delay_s = Backoff(policy, streak, jitter_unit);
    d.reason = absl::StrCat("exit 74: no space left for checkpoints", detail_suffix,
                            "; restart once there is space, backoff ", Seconds(d.delay_s), " s");
    return d;
  }
  if (last.cls == ExitClass::kDiverged) {
    for (const AttemptEnd& e : history) d.rollbacks += e.cls == ExitClass::kDiverged && !IsStop(e);
    if (d.rollbacks > policy.max_rollbacks) {
      d.action = Action::kFail;
      d.reason = absl::StrCat("diverged at step ", last.first_bad_step, " after ", d.rollbacks - 1,
                              " rollback", d.rollbacks - 1 == 1 ? "" : "s", " (max ",
                              policy.max_rollbacks, ")", detail_suffix);
      return d;
    }
    d.action = Action::kRestart;
    d.rollback = true;
    d.delay_s = policy.initial_backoff_s;
    d.reason = absl::StrCat(what, "; rollback ", d.rollbacks, " of ", policy.max_rollbacks);
    return d;
  }

  // Streaks, walking back from the newest end. An attempt that made progress
  // ends both streaks; it counts in the backoff streak but not in the crash
  // loop one (it did not fail "without progress").
  int crash_loop_streak = 0;
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (it->made_progress) break;
    if (IsFailure(*it) && it->cls != ExitClass::kOom) ++crash_loop_streak;
  }
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (IsFailure(*it)) ++d.consecutive_failures;
    if (it->made_progress) break;
  }

  if (!d.oom && policy.crash_loop_attempts > 0 && crash_loop_streak >= policy.crash_loop_attempts) {
    d.action = Action::kFail;
    d.reason = absl::StrCat("crash loop: ", crash_loop_streak,
                            " attempts failed without progress; last ", what);
    return d;
  }

  int in_window = 0;
  for (const AttemptEnd& e : history) {
    if (IsFailure(e) && (e.cls == ExitClass::kOom) == d.oom &&
        last.end_s - e.end_s < policy.restart_window_s) {
      ++in_window;
    }
  }
  const int max = d.oom ? policy.max_oom_restarts : policy.max_restarts;
  if (in_window > max) {
    d.action = Action::kFail;
    d.reason = d.oom ? absl::StrCat("OOM budget exhausted: ", in_window, " OOM exits in ",
                                    policy.restart_window_s, " s (max ", max, "); last ", what)
                     : absl::StrCat("restart budget exhausted: ", in_window, " failures in ",
                                    policy.restart_window_s, " s (max ", max, "); last ", what);
    return d;
  }

  d.action = Action::kRestart;
  d.delay_s = Backoff(policy, d.consecutive_failures, jitter_unit);
  d.reason = absl::StrCat(what, "; ", d.oom ? "OOM restart " : "restart ", in_window, " of ", max,
                          " in window, backoff ", Seconds(d.delay_s), " s");
  return d;
}

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

}  // namespace trainsup::supervisor
