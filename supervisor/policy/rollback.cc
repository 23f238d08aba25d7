#include "supervisor/policy/rollback.h"

#include <algorithm>
#include <cmath>

namespace trainsup::supervisor {

bool DivergesAgainAfterItsWindow(int64_t prev_first, int64_t prev_last, int64_t first_bad,
                                 int64_t skip_batches) {
  return first_bad >= prev_first && first_bad <= prev_last + std::max<int64_t>(skip_batches, 1);
}

double RollbackLrFactor(double lr_factor_on_rollback, int rollbacks, int recurrences) {
  return std::max(1e-12, std::pow(lr_factor_on_rollback, rollbacks) *
                             std::pow(kRecurrenceLrFactor, recurrences));
}

}  // namespace trainsup::supervisor
