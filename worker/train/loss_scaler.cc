#include "worker/train/loss_scaler.h"

#include "absl/strings/str_format.h"

namespace trainsup::worker {

bool LossScaler::Good() {
  streak_ = 0;
  streak_first_ = -1;
  if (++good_steps_ < options_.growth_interval) return false;
  good_steps_ = 0;
  scale_ *= 2;
  return true;
}

LossScaler::Overflow LossScaler::Overflowed(int64_t step) {
  Overflow o;
  o.from = scale_;
  good_steps_ = 0;
  if (streak_++ == 0) streak_first_ = step;
  o.first_step = streak_first_;
  const double halved = scale_ / 2;
  if (streak_ >= options_.max_overflow_streak) {
    o.diverged = true;
    o.why = absl::StrFormat("%d overflows in a row (guard.max_overflow_streak)", streak_);
  } else if (halved < options_.min_scale) {
    o.diverged = true;
    o.why = absl::StrFormat("the scale would fall to %g, below guard.min_loss_scale %g", halved,
                            options_.min_scale);
  }
  scale_ = halved;
  o.to = scale_;
  return o;
}

nlohmann::json LossScaler::ToJson() const {
  return {{"scale", scale_},
          {"good_steps", good_steps_},
          {"streak", streak_},
          {"streak_first", streak_first_}};
}

void LossScaler::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return;
  const double s = j.value("scale", scale_);
  if (s > 0) scale_ = s;
  good_steps_ = j.value("good_steps", good_steps_);
  streak_ = j.value("streak", streak_);
  streak_first_ = j.value("streak_first", streak_first_);
}

}  // namespace trainsup::worker
