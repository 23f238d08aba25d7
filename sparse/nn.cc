#include "sparse/nn.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "sparse/backend.h"

namespace trainsup::sparse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor KaimingFanOut(int64_t volume, int64_t in, int64_t out) {
  return torch::randn({volume, in, out}) * std::sqrt(2.0 / static_cast<double>(volume * out));
}

// Checkpointed blocks being recomputed on this thread (their backward runs
// the forward again): BatchNorm records no moments for BatchNormStepStats.
thread_local int recomputing_blocks = 0;

// Running statistics of every BatchNorm inside a block, restored when this
// goes out of scope (also by an exception); while it lives, deferred
// BatchNorm layers record nothing.
class BatchNormStatsGuard {
 public:
  explicit BatchNormStatsGuard(torch::nn::Module& block) {
    Save(dynamic_cast<BatchNormLayerImpl*>(&block));
    for (const auto& m : block.modules(/*include_self=*/false)) {
      Save(dynamic_cast<BatchNormLayerImpl*>(m.get()));
    }
    ++recomputing_blocks;
  }
  ~BatchNormStatsGuard() {
    --recomputing_blocks;
    at::NoGradGuard no_grad;
    for (auto& [live, copy] : saved_) live.copy_(copy);
  }
  BatchNormStatsGuard(const BatchNormStatsGuard&) = delete;
  BatchNormStatsGuard& operator=(const BatchNormStatsGuard&) = delete;

 private:
  void Save(BatchNormLayerImpl* bn) {
    if (bn == nullptr) return;
    for (at::Tensor* t : {&bn->running_mean, &bn->running_var, &bn->num_batches_tracked}) {
      if (t->defined()) saved_.emplace_back(*t, t->clone());
    }
  }

  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

// LibTorch's default generator of `device`: the CPU's, or the CUDA device's
// (whose kernels draw from it: dropout, random augmentation on the device).
at::Generator DefaultGenerator(const c10::Device& device) {
  return device.is_cpu() ? at::detail::getDefaultCPUGenerator()
                         : at::globalContext().defaultGenerator(device);
}

// Sets the default generator of `device` to `state` for a scope and puts the
// state it had back afterwards (the recomputation must not consume random
// numbers of the training loop). An undefined `state` replays nothing.
class GeneratorReplay {
 public:
  GeneratorReplay(const c10::Device& device, const at::Tensor& state) {
    if (!state.defined()) return;
    gen_ = DefaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen_->mutex());
    previous_ = gen_->get_state();
    gen_->set_state(state);
  }
  ~GeneratorReplay() {
    if (!gen_) return;
    std::lock_guard<std::mutex> lock(gen_->mutex());
    gen_->set_state(previous_);
  }

 private:
  std::optional<at::Generator> gen_;
  at::Tensor previous_;
};

at::Tensor GeneratorState(const c10::Device& device) {
  at::Generator gen = DefaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// What backward needs besides tensors: the block, the inputs' coordinates
// (their manager keeps the kernel maps for the recomputation) and the
// generator state at the first forward.
struct CheckpointState : torch::CustomClassHolder {
  // Owned, so the graph stays valid if the caller drops the model before
  // calling backward.
  std::shared_ptr<torch::nn::Module> owner;
  CheckpointableBlock* block = nullptr;
  std::shared_ptr<CoordinateManager> manager;
  std::vector<CoordinateSetId> input_sets;
  at::Tensor rng_state;            // the CPU generator's
  c10::Device device = c10::kCPU;  // the inputs'
  at::Tensor device_rng_state;     // the inputs' CUDA device's generator; undefined on the CPU
};

// Runs the block on features `f` (one or two inputs) over the given sets.
SparseTensor RunBlock(CheckpointableBlock* block, const std::shared_ptr<CoordinateManager>& manager,
                      const std::vector<CoordinateSetId>& sets, const std::vector<at::Tensor>& f) {
  SparseTensor x(f[0], sets[0], manager);
  if (f.size() == 1) return block->ForwardImpl(x, nullptr);
  SparseTensor skip(f[1], sets[1], manager);
  return block->ForwardImpl(x, &skip);
}

class BlockCheckpointFunction : public torch::autograd::Function<BlockCheckpointFunction> {
 public:
  // inputs: the features of x (and of the skip); params: the block's.
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                            CheckpointableBlock* block, const std::vector<SparseTensor>* meta,
                            CoordinateSetId* out_set) {
    (void)params;  // inputs of the graph; the block reads its own
    auto state = c10::make_intrusive<CheckpointState>();
    try {
      state->owner = block->shared_from_this();
    } catch (const std::bad_weak_ptr&) {
      TORCH_CHECK(false, block->name(),
                  ": a checkpointed block must be held by a shared_ptr "
                  "(a module holder or std::make_shared)");
    }
    state->block = block;
    state->manager = (*meta)[0].manager();
    for (const auto& m : *meta) state->input_sets.push_back(m.set_id());
    state->rng_state = GeneratorState(c10::kCPU);
    state->device = inputs[0].device();
    if (!state->device.is_cpu()) state->device_rng_state = GeneratorState(state->device);
    // Runs without recording (custom forwards run in no-grad mode): no
    // activation is kept.
    SparseTensor y = RunBlock(block, state->manager, state->input_sets, inputs.vec());
    *out_set = y.set_id();
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return y.F();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = ctx->saved_data["state"].toCapsule();
    auto* state = static_cast<CheckpointState*>(holder.get());
    const variable_list saved = ctx->get_saved_variables();
    CheckpointableBlock* block = state->block;
    std::vector<at::Tensor> params = block->parameters();
    const size_t n_in = saved.size();
    variable_list result(n_in + params.size() + 3);
    {
      BatchNormStatsGuard bn_stats(*block);
      GeneratorReplay replay(c10::kCPU, state->rng_state);
      GeneratorReplay device_replay(state->device, state->device_rng_state);
      at::AutoGradMode enable_grad(true);
      std::vector<at::Tensor> f;
      variable_list inputs;
      std::vector<size_t> slots;
      for (size_t i = 0; i < n_in; ++i) {
        f.push_back(saved[i].detach().requires_grad_(ctx->needs_input_grad(i)));
        if (ctx->needs_input_grad(i)) {
          inputs.push_back(f.back());
          slots.push_back(i);
        }
      }
      SparseTensor y = RunBlock(block, state->manager, state->input_sets, f);
      for (size_t i = 0; i < params.size(); ++i) {
        if (ctx->needs_input_grad(n_in + i) && params[i].requires_grad()) {
          inputs.push_back(params[i]);
          slots.push_back(n_in + i);
        }
      }
      if (!inputs.empty() && y.F().requires_grad()) {
        variable_list grads = torch::autograd::grad({y.F()}, inputs, {grad_outputs[0]},
                                                    /*retain_graph=*/false, /*create_graph=*/false,
                                                    /*allow_unused=*/true);
        for (size_t k = 0; k < grads.size(); ++k) result[slots[k]] = grads[k];
      }
    }
    return result;
  }
};

}  // namespace

ConvLayerImpl::ConvLayerImpl(int64_t in_channels, int64_t out_channels, ConvOptions options,
                             bool bias, bool transposed)
    : options_(options), transposed_(transposed) {
  const int64_t volume =
      static_cast<int64_t>(options.kernel_size) * options.kernel_size * options.kernel_size;
  weight = register_parameter("weight", KaimingFanOut(volume, in_channels, out_channels));
  if (bias) this->bias = register_parameter("bias", torch::zeros({out_channels}));
}

SparseTensor ConvLayerImpl::forward(const SparseTensor& x, const SparseTensor* target) {
  if (transposed_) return ConvTranspose(x, weight, bias, options_, target);
  return Conv(x, weight, bias, options_);
}

BatchNormLayerImpl::BatchNormLayerImpl(int64_t channels, double eps, std::optional<double> momentum,
                                       bool track_running_stats)
    : eps_(eps), momentum_(momentum) {
  weight = register_parameter("weight", torch::ones({channels}));
  bias = register_parameter("bias", torch::zeros({channels}));
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", torch::zeros({channels}));
    running_var = register_buffer("running_var", torch::ones({channels}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  }
}

SparseTensor BatchNormLayerImpl::forward(const SparseTensor& x, bool relu) {
  const bool tracking = running_mean.defined();
  // Half features go with a float32 module (mixed precision: the
  // statistics and the affine in float32).
  const bool mixed = IsHalf(x.F().scalar_type()) && weight.scalar_type() == at::kFloat;
  if (x.F().scalar_type() != weight.scalar_type() && !mixed) {
    TORCH_CHECK(false, "BatchNorm: features are ", x.F().scalar_type(), " but the module is ",
                weight.scalar_type(), " (convert the module with ->to())");
  }
  if (is_training() && tracking && deferred_ != nullptr && recomputing_blocks == 0) {
    return ForwardDeferred(x, relu);
  }
  double factor = 0.0;
  if (is_training() && tracking) {
    {
      at::NoGradGuard no_grad;
      num_batches_tracked.add_(1);
    }
    factor =
        momentum_ ? *momentum_ : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  at::Tensor w = weight, b = bias;
  if (is_training() && allreduce_ != nullptr) {
    return x.WithFeatures(SyncBatchNormTraining(x.F(), w, b, running_mean, running_var, factor,
                                                eps_, relu, allreduce_.get()));
  }
  return BatchNorm(x, w, b, running_mean, running_var, is_training() || !tracking, factor, eps_,
                   relu);
}

SparseTensor BatchNormLayerImpl::ForwardDeferred(const SparseTensor& x, bool relu) {
  // Momentum 1 into scratch buffers: they receive this batch's mean and
  // unbiased variance from the same kernels (and, with an allreduce, the
  // same collectives) as a direct update would use.
  at::Tensor mean = at::zeros_like(running_mean);
  at::Tensor var = at::ones_like(running_var);
  double rows = static_cast<double>(x.size());
  SparseTensor y = allreduce_ != nullptr
                       ? x.WithFeatures(SyncBatchNormTraining(x.F(), weight, bias, mean, var, 1.0,
                                                              eps_, relu, allreduce_.get(), &rows))
                       : BatchNorm(x, weight, bias, mean, var, /*training=*/true, 1.0, eps_, relu);
  if (rows > 0) {
    at::NoGradGuard no_grad;
    deferred_->piece.Add(rows, mean.to(at::kDouble),
                         var.to(at::kDouble) * (rows > 1 ? rows - 1 : 0.0));
  }
  return y;
}

void BatchNormLayerImpl::Moments::Add(double n, const at::Tensor& piece_mean,
                                      const at::Tensor& piece_m2) {
  if (n <= 0) return;
  at::NoGradGuard no_grad;
  if (rows == 0) {
    rows = n;
    mean = piece_mean.clone();
    m2 = piece_m2.clone();
    return;
  }
  const double total = rows + n;
  at::Tensor delta = piece_mean - mean;
  mean = mean + delta * (n / total);
  m2 = m2 + piece_m2 + delta * delta * (rows * n / total);
  rows = total;
}

void BatchNormLayerImpl::ApplyStep(const Moments& step) {
  if (step.rows <= 0 || !running_mean.defined()) return;
  at::NoGradGuard no_grad;
  num_batches_tracked.add_(1);
  const double factor =
      momentum_ ? *momentum_ : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  at::Tensor var = step.rows > 1 ? step.m2 / (step.rows - 1) : at::zeros_like(step.m2);
  running_mean.mul_(1 - factor).add_(step.mean.to(running_mean.scalar_type()), factor);
  running_var.mul_(1 - factor).add_(var.to(running_var.scalar_type()), factor);
}

BatchNormStepStats::BatchNormStepStats(torch::nn::Module& model) {
  for (const auto& m : model.modules(/*include_self=*/true)) {
    auto* bn = dynamic_cast<BatchNormLayerImpl*>(m.get());
    if (bn == nullptr || !bn->running_mean.defined()) continue;
    auto deferred = std::make_shared<BatchNormLayerImpl::Deferred>();
    bn->SetDeferred(deferred);
    layers_.emplace_back(bn, std::move(deferred));
  }
}

BatchNormStepStats::~BatchNormStepStats() {
  for (auto& [bn, deferred] : layers_) bn->SetDeferred(nullptr);
}

void BatchNormStepStats::BeginPiece() {
  for (auto& [bn, deferred] : layers_) deferred->piece = {};
}

void BatchNormStepStats::CommitPiece() {
  for (auto& [bn, deferred] : layers_) {
    deferred->step.Add(deferred->piece);
    deferred->piece = {};
  }
}

void BatchNormStepStats::ApplyStep() {
  for (auto& [bn, deferred] : layers_) {
    bn->ApplyStep(deferred->step);
    deferred->step = {};
  }
}

namespace {

// Forward saves the input, the global mean and inverse standard deviation
// (float64) and the global row count; backward allreduces the two sums the
// input gradient needs over the whole batch.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor running_mean, at::Tensor running_var,
                            double momentum, double eps, int64_t allreduce_address,
                            int64_t rows_address) {
    const auto* allreduce = reinterpret_cast<const StatsAllreduce*>(allreduce_address);
    const int64_t c = x.size(1);
    at::Tensor packed = at::cat({x.sum(0, false, at::kDouble), (x.to(at::kDouble) * x).sum(0),
                                 at::full({1}, static_cast<double>(x.size(0)), at::kDouble)});
    (*allreduce)(packed);
    const double n = packed[2 * c].item<double>();
    if (rows_address != 0) *reinterpret_cast<double*>(rows_address) = n;
    at::Tensor mean = packed.narrow(0, 0, c) / std::max(n, 1.0);
    at::Tensor var = (packed.narrow(0, c, c) / std::max(n, 1.0) - mean * mean).clamp_min(0);
    at::Tensor invstd = (var + eps).rsqrt();
    if (running_mean.defined() && n > 0) {
      at::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      const double unbiased = n > 1 ? n / (n - 1) : 1.0;
      running_var.mul_(1 - momentum).add_((var * unbiased).to(running_var.scalar_type()), momentum);
    }
    at::Tensor xhat = (x.to(at::kDouble) - mean) * invstd;
    at::Tensor y = xhat;
    if (weight.defined()) y = y * weight.to(at::kDouble);
    if (bias.defined()) y = y + bias.to(at::kDouble);
    ctx->save_for_backward({x, weight, mean, invstd});
    ctx->saved_data["n"] = n;
    ctx->saved_data["allreduce"] = allreduce_address;
    ctx->saved_data["has_bias"] = bias.defined();
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* allreduce =
        reinterpret_cast<const StatsAllreduce*>(ctx->saved_data["allreduce"].toInt());
    const double n = ctx->saved_data["n"].toDouble();
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const int64_t c = x.size(1);
    at::Tensor dy = grads[0].to(at::kDouble);
    at::Tensor xhat = (x.to(at::kDouble) - mean) * invstd;
    at::Tensor local_dy = dy.sum(0);
    at::Tensor local_dy_xhat = (dy * xhat).sum(0);
    at::Tensor packed = at::cat({local_dy, local_dy_xhat});
    (*allreduce)(packed);
    at::Tensor sum_dy = packed.narrow(0, 0, c);
    at::Tensor sum_dy_xhat = packed.narrow(0, c, c);
    at::Tensor scale = weight.defined() ? weight.to(at::kDouble) * invstd : invstd;
    at::Tensor dx = scale / std::max(n, 1.0) * (n * dy - sum_dy - xhat * sum_dy_xhat);
    at::Tensor dw = weight.defined() ? local_dy_xhat.to(weight.scalar_type()) : at::Tensor();
    // The parameters' type: float32 masters under mixed precision.
    at::Tensor db = ctx->saved_data["has_bias"].toBool()
                        ? local_dy.to(AccumulateType(x.scalar_type()))
                        : at::Tensor();
    return {dx.to(x.scalar_type()), dw,           db,           at::Tensor(), at::Tensor(),
            at::Tensor(),           at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor SyncBatchNormTraining(const at::Tensor& features, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& running_mean,
                                 const at::Tensor& running_var, double momentum, double eps,
                                 bool relu, const StatsAllreduce* allreduce, double* rows) {
  TORCH_CHECK(allreduce != nullptr && *allreduce, "SyncBatchNormTraining: no allreduce");
  at::Tensor y =
      SyncBatchNormFunction::apply(features, weight, bias, running_mean, running_var, momentum, eps,
                                   static_cast<int64_t>(reinterpret_cast<intptr_t>(allreduce)),
                                   static_cast<int64_t>(reinterpret_cast<intptr_t>(rows)));
  return relu ? at::relu(y) : y;
}

int64_t SetBatchNormAllreduce(torch::nn::Module& model, const StatsAllreduce& allreduce) {
  int64_t n = 0;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* bn = dynamic_cast<BatchNormLayerImpl*>(m.get())) {
      bn->SetStatsAllreduce(allreduce);
      ++n;
    }
  }
  return n;
}

SparseTensor CheckpointableBlock::forward(const SparseTensor& x, const SparseTensor* skip) {
  if (!checkpointing_ || !is_training() || !at::GradMode::is_enabled()) return ForwardImpl(x, skip);
  std::vector<SparseTensor> meta = {x};
  std::vector<at::Tensor> features = {x.F()};
  if (skip != nullptr) {
    TORCH_CHECK(skip->manager() == x.manager(), name(),
                ": the skip belongs to another coordinate manager");
    meta.push_back(*skip);
    features.push_back(skip->F());
  }
  std::vector<at::Tensor> params = parameters();
  CoordinateSetId out_set = -1;
  at::Tensor out = BlockCheckpointFunction::apply(at::TensorList(features), at::TensorList(params),
                                                  this, &meta, &out_set);
  return SparseTensor(out, out_set, x.manager());
}

UpStageImpl::UpStageImpl(int64_t in_channels, int64_t out_channels, double bn_momentum) {
  conv = register_module("conv",
                         ConvLayer(in_channels, out_channels, ConvOptions{2, 2, 1}, false, true));
  norm = register_module("norm", BatchNormLayer(out_channels, 1e-5, bn_momentum));
}

SparseTensor UpStageImpl::ForwardImpl(const SparseTensor& x, const SparseTensor* skip) {
  TORCH_CHECK(skip != nullptr, "UpStage needs the skip connection's tensor");
  SparseTensor up = norm(conv(x, skip), /*relu=*/true);
  return Cat({up, *skip});
}

void ResidualBlock::InitProjection(int64_t in_channels, int64_t out_channels, int32_t stride,
                                   double bn_momentum) {
  if (stride == 1 && in_channels == out_channels) return;
  downsample_conv = register_module(
      "downsample_conv", ConvLayer(in_channels, out_channels, ConvOptions{1, stride, 1}));
  downsample_norm =
      register_module("downsample_norm", BatchNormLayer(out_channels, 1e-5, bn_momentum));
}

SparseTensor ResidualBlock::AddResidual(const SparseTensor& body, const SparseTensor& x) {
  SparseTensor residual = downsample_conv ? downsample_norm(downsample_conv(x)) : x;
  CheckSameCoordinates(body, residual, "residual block");
  // The sum is fresh and addition keeps no inputs for backward: ReLU in place.
  return body.WithFeatures((body.F() + residual.F()).relu_());
}

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t planes, int32_t stride,
                               int32_t dilation, double bn_momentum) {
  conv1 =
      register_module("conv1", ConvLayer(in_channels, planes, ConvOptions{3, stride, dilation}));
  norm1 = register_module("norm1", BatchNormLayer(planes, 1e-5, bn_momentum));
  conv2 = register_module("conv2", ConvLayer(planes, planes, ConvOptions{3, 1, dilation}));
  norm2 = register_module("norm2", BatchNormLayer(planes, 1e-5, bn_momentum));
  InitProjection(in_channels, planes * kExpansion, stride, bn_momentum);
}

SparseTensor BasicBlockImpl::ForwardImpl(const SparseTensor& x, const SparseTensor* skip) {
  TORCH_CHECK(skip == nullptr, "BasicBlock takes one input");
  SparseTensor out = norm1(conv1(x), /*relu=*/true);
  return AddResidual(norm2(conv2(out)), x);
}

BottleneckBlockImpl::BottleneckBlockImpl(int64_t in_channels, int64_t planes, int32_t stride,
                                         int32_t dilation, double bn_momentum) {
  conv1 = register_module("conv1", ConvLayer(in_channels, planes, ConvOptions{1, 1, 1}));
  norm1 = register_module("norm1", BatchNormLayer(planes, 1e-5, bn_momentum));
  conv2 = register_module("conv2", ConvLayer(planes, planes, ConvOptions{3, stride, dilation}));
  norm2 = register_module("norm2", BatchNormLayer(planes, 1e-5, bn_momentum));
  conv3 = register_module("conv3", ConvLayer(planes, planes * kExpansion, ConvOptions{1, 1, 1}));
  norm3 = register_module("norm3", BatchNormLayer(planes * kExpansion, 1e-5, bn_momentum));
  InitProjection(in_channels, planes * kExpansion, stride, bn_momentum);
}

SparseTensor BottleneckBlockImpl::ForwardImpl(const SparseTensor& x, const SparseTensor* skip) {
  TORCH_CHECK(skip == nullptr, "BottleneckBlock takes one input");
  SparseTensor out = norm1(conv1(x), /*relu=*/true);
  out = norm2(conv2(out), /*relu=*/true);
  return AddResidual(norm3(conv3(out)), x);
}

namespace {

// Every module below `model` and `model` itself (modules() can only
// include the top-level module when it is held by a shared_ptr).
template <typename Fn>
void ForEachModule(const torch::nn::Module& model, Fn fn) {
  fn(const_cast<torch::nn::Module*>(&model));
  for (const auto& m : model.modules(/*include_self=*/false)) fn(m.get());
}

int64_t SwitchCheckpointing(torch::nn::Module& model, bool on) {
  int64_t n = 0;
  ForEachModule(model, [&](torch::nn::Module* m) {
    if (auto* block = dynamic_cast<CheckpointableBlock*>(m)) {
      block->set_gradient_checkpointing(on);
      ++n;
    }
  });
  return n;
}

}  // namespace

int64_t EnableGradientCheckpointing(torch::nn::Module& model, bool strict) {
  const int64_t n = SwitchCheckpointing(model, true);
  TORCH_CHECK(n > 0 || !strict, "EnableGradientCheckpointing: model '", model.name(),
              "' has no checkpoint boundary (no CheckpointableBlock); pass strict=false to allow");
  return n;
}

int64_t DisableGradientCheckpointing(torch::nn::Module& model) {
  return SwitchCheckpointing(model, false);
}

bool IsGradientCheckpointing(const torch::nn::Module& model) {
  bool on = false;
  ForEachModule(model, [&](torch::nn::Module* m) {
    if (auto* block = dynamic_cast<CheckpointableBlock*>(m))
      on = on || block->gradient_checkpointing();
  });
  return on;
}

}  // namespace trainsup::sparse
