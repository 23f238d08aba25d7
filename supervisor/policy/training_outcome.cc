#include "supervisor/policy/training_outcome.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainsup::supervisor {

TrainingVerdict JudgeTraining(const TrainingTally& t, const GuardSpec& guard) {
  TrainingVerdict v;
  if (!t.present()) return v;
  const int64_t window = std::max<int64_t>(t.skipped_window, 0);
  const int64_t by_guard = std::max<int64_t>(t.skipped_guard, 0);
  const int64_t scaler = std::max<int64_t>(t.skipped_scaler, 0);
  const int64_t skipped = window + by_guard + scaler;
  v.summary = absl::StrCat("trained ", std::max<int64_t>(t.applied, 0), " of ", t.steps, " steps (",
                           skipped, " skipped: ", window, " in windows, ", by_guard,
                           " by the guard, ", scaler, " by the loss scaler)");
  const bool metrics = t.final_metric >= 0 && t.baseline_metric >= 0;
  if (metrics) {
    absl::StrAppend(&v.summary, absl::StrFormat("; val mIoU %.4g against the majority-class "
                                                "baseline's %.4g",
                                                t.final_metric, t.baseline_metric));
  }
  if (t.steps > 0 &&
      static_cast<double>(skipped) > guard.max_skipped_fraction * static_cast<double>(t.steps)) {
    v.trained = false;
    v.reason =
        absl::StrCat(v.summary, ": more than guard.max_skipped_fraction ",
                     absl::StrFormat("%g", guard.max_skipped_fraction), " of the steps skipped");
    return v;
  }
  if (metrics && t.final_metric < t.baseline_metric) {
    const std::string below = absl::StrCat(v.summary,
                                           ": the final model scores below the majority-class "
                                           "baseline");
    if (guard.fail_below_baseline) {
      v.trained = false;
      v.reason = absl::StrCat(below, " (guard.fail_below_baseline)");
    } else {
      v.warning = absl::StrCat(below, " (SUCCEEDED: guard.fail_below_baseline is false)");
    }
  }
  return v;
}

}  // namespace trainsup::supervisor
