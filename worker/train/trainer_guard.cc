// The guard's and fp16's loss scaler's side of a step (trainer_impl.h):
// judging a step whose forward and backward ran, undoing one that is not
// applied, and the step's fault injection.
#include <torch/torch.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/train/trainer_impl.h"

namespace trainsup::worker::internal {

// The loss is the global batch's (allreduced) and accum_ the global
// gradient (the reducer's allreduce): every rank reads the same bytes, and
// runs the same norm kernel on them with the same thread count, so it gets
// the same norm. A NaN or an infinity on any rank reaches every rank's sum
// whatever the order of the additions: the finite-or-not decision cannot
// differ between ranks, and so no collective is needed for it.
bool Trainer::GuardStep(int64_t next, double loss, bool stats_finite) {
  const GuardSpec& g = spec_.guard;
  if (!g.check_finite && g.spike_factor == 0) return true;
  const GuardDecision d =
      guard_.Judge(next, loss, g.check_finite ? NormOf(accum_) : 0.0, stats_finite);
  if (d.verdict == StepVerdict::kApply) return true;
  step_applied_ = false;
  CopyBuffers(saved_buffers_, buffers_);
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& a : accum_) a.zero_();
  }
  const bool spike = d.verdict == StepVerdict::kSpike;
  (spike ? counters_.spike_steps : counters_.nonfinite_steps)++;
  const std::string line =
      absl::StrCat("step ", next, " not applied (", spike ? "loss spike" : "not finite",
                   "): ", d.seen, "; weights, optimizer state and BatchNorm statistics kept");
  Log(line);
  if (options_.rank == 0) Event(v1::EVENT_KIND_GUARD, -1, line);
  if (d.diverged) {
    TrainerResult r = Fail(WorkerExit::kDiverged, d.diverged_message);
    r.first_bad_step = d.first_bad_step;
    diverged_ = r;
  }
  return false;
}

void Trainer::ScalerSkip(int64_t next) {
  step_applied_ = false;
  CopyBuffers(saved_buffers_, buffers_);
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& a : accum_) a.zero_();
  }
  counters_.scaler_skipped_steps++;
  const LossScaler::Overflow o = scaler_.Overflowed(next);
  const std::string line = absl::StrFormat(
      "step %d skipped by the loss scaler: gradient overflow at scale %g, the scale goes to %g "
      "(not a bad step)",
      next, o.from, o.to);
  Log(line);
  if (options_.rank == 0) Event(v1::EVENT_KIND_GUARD, -1, line);
  if (o.diverged) {
    TrainerResult r =
        Fail(WorkerExit::kDiverged,
             absl::StrFormat("diverged at step %d: the loss scaler overflowed at every step since "
                             "(%s; scale %g at step %d)",
                             o.first_step, o.why, o.from, next));
    r.first_bad_step = o.first_step;
    diverged_ = r;
  }
}

StepFaults Trainer::FaultsAt(int64_t next) const {
  StepFaults f;
  if (!inject_) return f;
  f.nan_loss = spec_.testing.nan_loss_at_step == next;
  f.nan_grad = spec_.testing.nan_grad_at_step == next;
  if (spec_.testing.loss_spike_at_step == next) f.loss_scale = 100;
  return f;
}

}  // namespace trainsup::worker::internal
