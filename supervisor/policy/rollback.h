// The rollback's pure decisions (docs/guard.md): whether a divergence came
// back right after the window the previous rollback skipped, which says
// the learning rate or the model is at fault rather than the data, and the
// learning rate the next attempt trains at.
#ifndef TRAINSUP_SUPERVISOR_POLICY_ROLLBACK_H_
#define TRAINSUP_SUPERVISOR_POLICY_ROLLBACK_H_

#include <cstdint>

namespace trainsup::supervisor {

// The learning rate's factor after a divergence that came back right after
// its window, whatever guard.lr_factor_on_rollback says: halving it, as
// the OPT-175B logbook's restarts did by hand after repeated divergence.
inline constexpr double kRecurrenceLrFactor = 0.5;

// A divergence whose first bad step is `first_bad` came back after the
// previous rollback's window [prev_first, prev_last]: it lies from that
// window's first step to `skip_batches` steps past its last. Skipping the
// batches did not help, so the batches were not the cause.
bool DivergesAgainAfterItsWindow(int64_t prev_first, int64_t prev_last, int64_t first_bad,
                                 int64_t skip_batches);

// The factor on the spec's learning rate after `rollbacks` rollbacks of
// which `recurrences` were divergences that came back after their window:
// lr_factor_on_rollback^rollbacks x kRecurrenceLrFactor^recurrences, never
// below 1e-12 (the worker refuses 0).
double RollbackLrFactor(double lr_factor_on_rollback, int rollbacks, int recurrences);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_ROLLBACK_H_
