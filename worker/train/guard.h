// The training guard's judgement of one step (docs/guard.md), torch-free:
// the trainer hands it the global batch's mean loss and the global
// gradient's norm, both read after the gang's allreduce, so every rank
// judges the same values and takes the same decision with no collective
// of its own. A step is applied, or not applied because a value is not
// finite, or not applied because the loss spiked above spike_factor times
// the median of the last spike_window applied steps' losses (after
// spike_warmup applied steps). max_bad_steps bad steps within the last
// bad_window steps make the attempt diverged.
#ifndef TRAINSUP_WORKER_TRAIN_GUARD_H_
#define TRAINSUP_WORKER_TRAIN_GUARD_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "contracts/spec.h"
#include "nlohmann/json.hpp"

namespace trainsup::worker {

enum class StepVerdict { kApply, kNonFinite, kSpike };

struct GuardDecision {
  StepVerdict verdict = StepVerdict::kApply;
  // Not applied: what was seen, for the log, the event and the exit file
  // ("loss nan", "gradient norm inf", "loss 41.2 is 12.3 times the median
  // 3.35 of the last 50 steps").
  std::string seen;
  // This bad step makes max_bad_steps within bad_window: the attempt ends
  // diverged; first_bad_step is the oldest bad step of the window.
  bool diverged = false;
  int64_t first_bad_step = -1;
  std::string diverged_message;
};

class StepGuard {
 public:
  explicit StepGuard(const GuardSpec& spec) : spec_(spec) {}

  // Step `step` (1-based) of the run: its global mean loss, global
  // gradient norm (NaN or infinite when any element is), and whether the
  // BatchNorm running statistics its forward moved are finite on every rank.
  GuardDecision Judge(int64_t step, double loss, double grad_norm, bool stats_finite = true);

  // The state a resumed attempt needs to judge as the uninterrupted one
  // would: the window of applied losses, the bad steps in the window.
  nlohmann::json ToJson() const;
  absl::Status FromJson(const nlohmann::json& j);

  // The median of the applied losses in the window (0 when none).
  double Median() const;
  // The oldest bad step still in the window (-1: none): a rollback would
  // go back to the newest checkpoint before it, so retention keeps that.
  int64_t oldest_bad_step() const { return bad_.empty() ? -1 : bad_.front().first; }

 private:
  GuardSpec spec_;
  std::deque<double> losses_;                        // the last spike_window applied steps
  int64_t applied_ = 0;                              // steps applied (all of the run)
  std::deque<std::pair<int64_t, std::string>> bad_;  // (step, seen) within bad_window
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_TRAIN_GUARD_H_
