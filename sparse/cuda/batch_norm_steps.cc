// Training-mode BatchNorm with the ReLU fused, as the CUDA backend's
// entry (steps.h): three ops forward (block moments, their combination
// with the running statistics' update, the affine map with the ReLU) and
// three backward (block gradient sums, their combination into the
// parameters' gradients, the input gradient), where at::batch_norm and a
// separate relu_ take a launch and a pass over the activations more each
// way. Device-independent like steps.cc: the ops run through a Launcher.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

#include "sparse/backend.h"
#include "sparse/cuda/steps.h"
#include "sparse/generic/backend.h"

namespace trainsup::sparse::cuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct BnArgs {
  const Launcher* launcher;
  at::Tensor running_mean, running_var;  // both undefined, or both updated in place
  double momentum, eps;
  bool relu;
};

class StepsBatchNorm : public torch::autograd::Function<StepsBatchNorm> {
 public:
  // The running statistics and the launcher come in a struct by pointer:
  // autograd takes every tensor argument for an input.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const BnArgs* args) {
    const at::Tensor x = input.contiguous();
    const int64_t rows = x.size(0), cols = x.size(1);
    const at::Tensor w = weight.contiguous(), b = bias.contiguous();
    const at::TensorOptions o = x.options();
    at::Tensor mean = at::empty({BnBlocks(rows), cols}, o), m2 = at::empty_like(mean);
    at::Tensor stats = at::empty({4, cols}, o);
    at::Tensor y = at::empty_like(x);
    const bool running = args->running_mean.defined();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cuda_batch_norm_forward", [&] {
      const Launcher& l = *args->launcher;
      l.Run(BnBlockMoments<scalar_t>{x.data_ptr<scalar_t>(), rows, cols, mean.data_ptr<scalar_t>(),
                                     m2.data_ptr<scalar_t>()},
            "batch norm moments");
      l.Run(BnCombine<scalar_t>{mean.data_ptr<scalar_t>(), m2.data_ptr<scalar_t>(), rows, cols,
                                w.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), args->eps,
                                args->momentum,
                                running ? args->running_mean.data_ptr<scalar_t>() : nullptr,
                                running ? args->running_var.data_ptr<scalar_t>() : nullptr,
                                stats.data_ptr<scalar_t>()},
            "batch norm statistics");
      l.Run(BnApply<scalar_t>{x.data_ptr<scalar_t>(), stats.data_ptr<scalar_t>(), rows, cols,
                              args->relu, y.data_ptr<scalar_t>()},
            "batch norm apply");
    });
    ctx->save_for_backward({x, w, stats});
    ctx->saved_data["relu"] = args->relu;
    // Launchers are process-lived singletons (a function's static):
    // backward finds this one by its address.
    ctx->saved_data["launcher"] = reinterpret_cast<int64_t>(args->launcher);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    RECORD_USER_SCOPE("batch norm backward");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& stats = saved[2];
    const bool relu = ctx->saved_data["relu"].toBool();
    const auto& l = *reinterpret_cast<const Launcher*>(ctx->saved_data["launcher"].toInt());
    const at::Tensor dy = grad_outputs[0].contiguous();
    const int64_t rows = x.size(0), cols = x.size(1);
    const at::TensorOptions o = x.options();
    at::Tensor sum_g = at::empty({BnBlocks(rows), cols}, o), sum_gx = at::empty_like(sum_g);
    at::Tensor coef = at::empty({3, cols}, o);
    at::Tensor grad_w = at::empty({cols}, o), grad_b = at::empty({cols}, o);
    at::Tensor dx = at::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cuda_batch_norm_backward", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* gp = dy.data_ptr<scalar_t>();
      const scalar_t* sp = stats.data_ptr<scalar_t>();
      l.Run(BnBlockGradSums<scalar_t>{xp, gp, sp, rows, cols, relu, sum_g.data_ptr<scalar_t>(),
                                      sum_gx.data_ptr<scalar_t>()},
            "batch norm gradient sums");
      l.Run(BnGradCombine<scalar_t>{sum_g.data_ptr<scalar_t>(), sum_gx.data_ptr<scalar_t>(), sp,
                                    w.data_ptr<scalar_t>(), rows, cols, coef.data_ptr<scalar_t>(),
                                    grad_w.data_ptr<scalar_t>(), grad_b.data_ptr<scalar_t>()},
            "batch norm parameter gradients");
      l.Run(BnInputGrad<scalar_t>{xp, gp, sp, coef.data_ptr<scalar_t>(), rows, cols, relu,
                                  dx.data_ptr<scalar_t>()},
            "batch norm input gradient");
    });
    return {dx, grad_w, grad_b, at::Tensor()};
  }
};

// Whether the fused ops take this call: float32 or float64 features with
// at least two rows, and weight, bias and running statistics (where
// defined) of the same type on the same device, the statistics contiguous
// (written in place). Their shapes, and that both statistics or neither
// are given, BatchNorm (functional.cc) has checked.
bool Fusable(const at::Tensor& f, const at::Tensor& weight, const at::Tensor& bias,
             const at::Tensor& running_mean, const at::Tensor& running_var) {
  if (f.dim() != 2 || f.size(0) < 2 || f.size(1) == 0) return false;
  if (f.scalar_type() != at::kFloat && f.scalar_type() != at::kDouble) return false;
  for (const at::Tensor* t : {&weight, &bias, &running_mean, &running_var}) {
    if (t->defined() && (t->scalar_type() != f.scalar_type() || t->device() != f.device())) {
      return false;
    }
  }
  return !running_mean.defined() || (running_mean.is_contiguous() && running_var.is_contiguous());
}

}  // namespace

at::Tensor BatchNormTraining(const Launcher& launcher, const at::Tensor& f,
                             const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& running_mean, const at::Tensor& running_var,
                             double momentum, double eps, bool relu) {
  if (!Fusable(f, weight, bias, running_mean, running_var)) {
    return generic::GenericBackend().batch_norm_training(f, weight, bias, running_mean, running_var,
                                                         momentum, eps, relu);
  }
  // Without affine parameters: weight 1 and bias 0 that need no gradient.
  const int64_t c = f.size(1);
  const at::TensorOptions params = f.options().requires_grad(false);
  const at::Tensor w = weight.defined() ? weight : at::ones({c}, params);
  const at::Tensor b = bias.defined() ? bias : at::zeros({c}, params);
  const BnArgs args{&launcher, running_mean, running_var, momentum, eps, relu};
  return StepsBatchNorm::apply(f, w, b, &args);
}

}  // namespace trainsup::sparse::cuda
