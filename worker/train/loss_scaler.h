// fp16's dynamic loss scaling (train.precision = "fp16"), with
// torch.amp.GradScaler's semantics: the loss is multiplied by the scale
// before backward, and the gradient divided by it after; a gradient that
// is not finite is an overflow: the step is skipped and the scale halved;
// after growth_interval finite steps in a row it doubles. Where overflows
// become divergence (docs/guard.md, "Mixed precision"): max_overflow_streak
// of them in a row, or one that would halve the scale below min_scale.
// Pure policy, no LibTorch: the trainer applies it.
#ifndef TRAINSUP_WORKER_TRAIN_LOSS_SCALER_H_
#define TRAINSUP_WORKER_TRAIN_LOSS_SCALER_H_

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace trainsup::worker {

struct LossScalerOptions {
  double init_scale = 65536;
  int64_t growth_interval = 2000;
  int64_t max_overflow_streak = 20;
  double min_scale = 1;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options)
      : options_(options), scale_(options.init_scale) {}

  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  // The first step of the overflows in a row now (-1: none): a rollback's
  // target lies before it, so retention keeps that checkpoint.
  int64_t streak_first() const { return streak_ > 0 ? streak_first_ : -1; }

  // A step whose gradient was finite (applied or not by the guard).
  // Returns true when the scale grew.
  bool Good();

  struct Overflow {
    double from = 0, to = 0;  // the scale before and after
    bool diverged = false;
    int64_t first_step = -1;  // the streak's first step
    std::string why;          // when diverged: which rule
  };
  // Step `step`'s gradient was not finite under a finite loss.
  Overflow Overflowed(int64_t step);

  // The state a checkpoint keeps (trainer.json), and back; a missing or
  // malformed field keeps the options' value.
  nlohmann::json ToJson() const;
  void FromJson(const nlohmann::json& j);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;  // finite steps since the last overflow or growth
  int64_t streak_ = 0;      // overflows in a row
  int64_t streak_first_ = -1;
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_TRAIN_LOSS_SCALER_H_
