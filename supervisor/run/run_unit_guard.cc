// The run unit's side of the training guard (docs/guard.md): a diverged
// attempt is rolled back to the newest checkpoint before its first bad step,
// and every later attempt skips a window of data from there.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "contracts/run_layout.h"
#include "contracts/spec.h"
#include "supervisor/policy/from_config.h"
#include "supervisor/policy/rollback.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {

RestartPolicy RunUnit::Policy() const { return RestartPolicyFor(cfg(), spec_); }

void RunUnit::NoteDiverged(const RankState& r, const std::optional<ExitFile>& report) {
  const int64_t reached =
      report && report->last_step >= 0 ? report->last_step : r.status.progress().step();
  const int64_t first = report && report->first_bad_step > 0 ? report->first_bad_step : reached + 1;
  if (diverged_at_ < 0 || first < diverged_at_) {
    diverged_at_ = first;
    diverged_seen_ = report ? report->message : "exit 79 without an exit file";
  }
  diverged_through_ = std::max(diverged_through_, reached + 1);
}

void RunUnit::LocateDivergence() {
  if (diverged_at_ < 0) {
    // The ranks ended while no daemon watched (adopted after a restart):
    // their exit files say where; without any, the step after rank 0's
    // last, never step 1 (which would send the run back to scratch).
    for (const RankState& r : ranks_) {
      if (r.status.exit_class() != v1::EXIT_CLASS_DIVERGED) continue;
      NoteDiverged(r, env_.launcher->ReadExitFile(
                          RunLayout(run_.run_dir()).ExitFilePath(attempt_.number(), r.rank)));
    }
    if (diverged_at_ < 0) {
      diverged_at_ = diverged_through_ = run_.progress().step() + 1;
      diverged_seen_ = "exit 79; no exit file said where";
    }
  }
}

const v1::SkipWindow* RunUnit::WindowDivergedAgainAfter() const {
  // The newest rollback's window (the spec's windows are not rollbacks).
  for (int i = run_.skip_windows_size() - 1; i >= 0; --i) {
    const v1::SkipWindow& w = run_.skip_windows(i);
    if (w.attempt() <= 0) continue;
    return DivergesAgainAfterItsWindow(w.first_step(), w.last_step(),
                                       std::max<int64_t>(diverged_at_, 1), spec_.guard.skip_batches)
               ? &w
               : nullptr;
  }
  return nullptr;
}

void RunUnit::NoteDivergenceFailed(RestartDecision& d) {
  LocateDivergence();
  if (WindowDivergedAgainAfter() == nullptr) return;
  d.reason = absl::StrCat(
      "diverges again after skipping its data: the learning rate or the model, not the data; ",
      d.reason);
}

void RunUnit::AddRollbackWindow(StoreBatch& b, const RestartDecision& d) {
  LocateDivergence();
  const v1::SkipWindow* again = WindowDivergedAgainAfter();
  const std::string why_halved =
      again == nullptr
          ? std::string()
          : absl::StrCat(" (halved: diverged again at step ", diverged_at_,
                         ", right after the window of steps ", again->first_step(), " to ",
                         again->last_step(), ": the learning rate or the model, not the data)");
  const int64_t first = std::max<int64_t>(diverged_at_, 1);
  const int64_t last = std::max(first + spec_.guard.skip_batches - 1, diverged_through_);
  v1::SkipWindow* w = run_.add_skip_windows();
  w->set_first_step(first);
  w->set_last_step(last);
  w->set_attempt(attempt_.number());
  w->set_resumed_from_step(-1);
  w->set_reason(diverged_seen_);
  w->set_lr_halved(again != nullptr);
  run_.set_rollbacks(d.rollbacks);
  env_.host->CountRollback(id());
  // A window that runs past the run's last step says so: the run's
  // remaining steps are all skipped, which guard.max_skipped_fraction
  // then judges.
  const int64_t total = run_.progress().total_steps();
  const std::string past_end =
      total > 0 && last > total
          ? absl::StrCat(", past the run's last step ", total, ": its remaining ",
                         std::max<int64_t>(total - first + 1, 0), " steps are all skipped")
          : std::string();
  const std::string line = absl::StrCat(
      "rollback ", d.rollbacks, " of ", spec_.guard.max_rollbacks,
      ": the next attempt resumes from the newest checkpoint before step ", first,
      " and skips the batches of steps ", first, " to ", last, past_end,
      LearningRateFactor() < 1 ? absl::StrCat(", learning rate x", LearningRateFactor())
                               : std::string(),
      why_halved);
  Log(LogLevel::kWarn, line);
  b.events.push_back(Event(v1::EVENT_KIND_GUARD, -1, line));
}

int64_t RunUnit::RollbackBefore() const {
  if (run_.skip_windows_size() == 0 || attempt_.number() == 0) return -1;
  const v1::SkipWindow& w = run_.skip_windows(run_.skip_windows_size() - 1);
  if (w.attempt() != attempt_.number() || attempt_.exit_class() != v1::EXIT_CLASS_DIVERGED) {
    return -1;
  }
  return w.first_step();
}

void RunUnit::NoteRollbackResume(int64_t before, int64_t resumed_step) {
  if (before < 0 || run_.skip_windows_size() == 0) return;
  run_.mutable_skip_windows(run_.skip_windows_size() - 1)->set_resumed_from_step(resumed_step);
}

std::string RunUnit::SkipWindowsText() const {
  // The rollbacks' windows: the spec's (attempt 0) the worker reads from
  // the spec itself.
  std::vector<StepWindow> windows;
  for (const v1::SkipWindow& w : run_.skip_windows()) {
    if (w.attempt() > 0) windows.push_back({w.first_step(), w.last_step()});
  }
  return FormatStepWindows(windows);
}

double RunUnit::LearningRateFactor() const {
  int halved = 0;
  for (const v1::SkipWindow& w : run_.skip_windows()) halved += w.lr_halved() ? 1 : 0;
  return RollbackLrFactor(spec_.guard.lr_factor_on_rollback, run_.rollbacks(), halved);
}

}  // namespace trainsup::supervisor
