// Whether a run that completed did train (docs/guard.md, "SUCCEEDED means
// trained"), as a pure function of what its rank 0 reported and the spec's
// guard: a run whose steps were mostly skipped, or whose model ends below
// the majority-class baseline, does not end as a plain success.
#ifndef TRAINSUP_SUPERVISOR_POLICY_TRAINING_OUTCOME_H_
#define TRAINSUP_SUPERVISOR_POLICY_TRAINING_OUTCOME_H_

#include <string>

#include "contracts/exit_file.h"
#include "contracts/spec.h"

namespace trainsup::supervisor {

struct TrainingVerdict {
  bool trained = true;  // false: the run ends FAILED with `reason`
  // For the final event and the run's reason: "trained 28 of 30 steps (2
  // skipped: 2 in windows, 0 by the guard, 0 by the loss scaler); val mIoU
  // 0.41 against the majority-class baseline's 0.27"; "" when nothing is known.
  std::string summary;
  std::string reason;   // why not trained; "" when trained
  std::string warning;  // below the baseline while guard.fail_below_baseline is false
};

// Rules, in order:
//  1. No tally (tally.steps < 0, a script that does not report one):
//     trained, no summary.
//  2. skipped (window + guard + scaler, unknown parts as 0) over
//     guard.max_skipped_fraction of tally.steps: not trained, "<summary>:
//     more than guard.max_skipped_fraction 0.1 of the steps skipped".
//  3. Both metrics known (>= 0) and final_metric < baseline_metric: with
//     guard.fail_below_baseline, not trained, "<summary>: the final model
//     scores below the majority-class baseline"; without, trained with a
//     warning saying so.
TrainingVerdict JudgeTraining(const TrainingTally& tally, const GuardSpec& guard);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_TRAINING_OUTCOME_H_
