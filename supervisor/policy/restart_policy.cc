#include "supervisor/policy/restart_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace trainsup::supervisor {
namespace {

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

// Rule 4, the last end of `history` being no_space: *d restarts once there
// is space, with a backoff over the streak of no_space ends.
void DecideNoSpace(const RestartPolicy& policy, const std::vector<AttemptEnd>& history,
                   double jitter_unit, const std::string& detail_suffix, RestartDecision* d) {
  int streak = 0;
  for (auto it = history.rbegin(); it != history.rend() && it->cls == ExitClass::kNoSpace; ++it) {
    ++streak;
  }
  d->action = Action::kRestart;
  d->wait_for_space = true;
  d->consecutive_failures = streak;
  d->delay_s = Backoff(policy, streak, jitter_unit);
  d->reason = absl::StrCat("exit 74: no space left for checkpoints", detail_suffix,
                           "; restart once there is space, backoff ", Seconds(d->delay_s), " s");
}

// Rule 4a, the last end of `history` being diverged: *d rolls back while
// the run's diverged ends number at most max_rollbacks, else fails.
void DecideDiverged(const RestartPolicy& policy, const std::vector<AttemptEnd>& history,
                    const std::string& what, const std::string& detail_suffix, RestartDecision* d) {
  const AttemptEnd& last = history.back();
  for (const AttemptEnd& e : history) d->rollbacks += e.cls == ExitClass::kDiverged && !IsStop(e);
  if (d->rollbacks > policy.max_rollbacks) {
    d->action = Action::kFail;
    d->reason = absl::StrCat("diverged at step ", last.first_bad_step, " after ", d->rollbacks - 1,
                             " rollback", d->rollbacks - 1 == 1 ? "" : "s", " (max ",
                             policy.max_rollbacks, ")", detail_suffix);
    return;
  }
  d->action = Action::kRestart;
  d->rollback = true;
  d->delay_s = policy.initial_backoff_s;
  d->reason = absl::StrCat(what, "; rollback ", d->rollbacks, " of ", policy.max_rollbacks);
}

}  // namespace

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
    DecideNoSpace(policy, history, jitter_unit, detail_suffix, &d);
    return d;
  }
  if (last.cls == ExitClass::kDiverged) {
    DecideDiverged(policy, history, what, detail_suffix, &d);
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

}  // namespace trainsup::supervisor
