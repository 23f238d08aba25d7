#include "sparse/nn.h"

#include <torch/torch.h>

#include <cmath>

namespace trainsup::sparse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor KaimingFanOut(int64_t volume, int64_t in, int64_t out) {
  return torch::randn({volume, in, out}) * std::sqrt(2.0 / static_cast<double>(volume * out));
}

// Running statistics of every BatchNorm inside a block, restored when this
// goes out of scope (also by an exception).
class BatchNormStatsGuard {
 public:
  explicit BatchNormStatsGuard(torch::nn::Module& block) {
    Save(dynamic_cast<BatchNormLayerImpl*>(&block));
    for (const auto& m : block.modules(/*include_self=*/false)) {
      Save(dynamic_cast<BatchNormLayerImpl*>(m.get()));
    }
  }
  ~BatchNormStatsGuard() {
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

// Sets LibTorch's CPU generator to `state` for a scope and puts the state it
// had back afterwards (the recomputation must not consume random numbers of
// the training loop).
class GeneratorReplay {
 public:
  explicit GeneratorReplay(const at::Tensor& state) : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    previous_ = gen_.get_state();
    gen_.set_state(state);
  }
  ~GeneratorReplay() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(previous_);
  }

 private:
  at::Generator gen_;
  at::Tensor previous_;
};

at::Tensor GeneratorState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// What backward needs besides tensors: the block, the input's coordinates
// (their manager keeps the kernel maps for the recomputation) and the
// generator state at the first forward.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointableBlock* block = nullptr;
  std::shared_ptr<CoordinateManager> manager;
  CoordinateSetId input_set = -1;
  at::Tensor rng_state;
};

class BlockCheckpointFunction : public torch::autograd::Function<BlockCheckpointFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features, at::TensorList params,
                            CheckpointableBlock* block, const SparseTensor* input,
                            CoordinateSetId* out_set) {
    (void)params;  // inputs of the graph; the block reads its own
    auto state = c10::make_intrusive<CheckpointState>();
    state->block = block;
    state->manager = input->manager();
    state->input_set = input->set_id();
    state->rng_state = GeneratorState();
    // Runs without recording (custom forwards run in no-grad mode): no
    // activation is kept.
    SparseTensor y = block->ForwardImpl(input->WithFeatures(features));
    *out_set = y.set_id();
    ctx->save_for_backward({features});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return y.F();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = ctx->saved_data["state"].toCapsule();
    auto* state = static_cast<CheckpointState*>(holder.get());
    const at::Tensor features = ctx->get_saved_variables()[0];
    CheckpointableBlock* block = state->block;
    std::vector<at::Tensor> params = block->parameters();
    const bool need_input = ctx->needs_input_grad(0);
    variable_list result(params.size() + 4);
    {
      BatchNormStatsGuard bn_stats(*block);
      GeneratorReplay replay(state->rng_state);
      at::AutoGradMode enable_grad(true);
      at::Tensor x = features.detach().requires_grad_(need_input);
      SparseTensor y = block->ForwardImpl(SparseTensor(x, state->input_set, state->manager));
      variable_list inputs;
      std::vector<size_t> slots;
      if (need_input) {
        inputs.push_back(x);
        slots.push_back(0);
      }
      for (size_t i = 0; i < params.size(); ++i) {
        if (ctx->needs_input_grad(1 + i) && params[i].requires_grad()) {
          inputs.push_back(params[i]);
          slots.push_back(1 + i);
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

ConvLayerImpl::ConvLayerImpl(int64_t in_channels, int64_t out_channels, ConvOptions options, bool bias,
                   bool transposed)
    : options_(options), transposed_(transposed) {
  const int64_t volume = static_cast<int64_t>(options.kernel_size) * options.kernel_size *
                         options.kernel_size;
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

SparseTensor BatchNormLayerImpl::forward(const SparseTensor& x) {
  const bool tracking = running_mean.defined();
  double factor = 0.0;
  if (is_training() && tracking) {
    {
      at::NoGradGuard no_grad;
      num_batches_tracked.add_(1);
    }
    factor = momentum_ ? *momentum_ : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  at::Tensor w = weight, b = bias;
  if (x.F().scalar_type() != w.scalar_type()) {
    TORCH_CHECK(false, "BatchNorm: features are ", x.F().scalar_type(), " but the module is ",
                w.scalar_type(), " (convert the module with ->to())");
  }
  return BatchNorm(x, w, b, running_mean, running_var, is_training() || !tracking, factor, eps_);
}

SparseTensor CheckpointableBlock::forward(const SparseTensor& x) {
  if (!checkpointing_ || !is_training() || !at::GradMode::is_enabled()) return ForwardImpl(x);
  std::vector<at::Tensor> params = parameters();
  CoordinateSetId out_set = -1;
  at::Tensor out = BlockCheckpointFunction::apply(x.F(), at::TensorList(params), this, &x, &out_set);
  return SparseTensor(out, out_set, x.manager());
}

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t planes, int32_t stride,
                               int32_t dilation, double bn_momentum) {
  conv1 = register_module("conv1", ConvLayer(in_channels, planes, ConvOptions{3, stride, dilation}));
  norm1 = register_module("norm1", BatchNormLayer(planes, 1e-5, bn_momentum));
  conv2 = register_module("conv2", ConvLayer(planes, planes, ConvOptions{3, 1, dilation}));
  norm2 = register_module("norm2", BatchNormLayer(planes, 1e-5, bn_momentum));
  if (stride != 1 || in_channels != planes * kExpansion) {
    downsample_conv = register_module(
        "downsample_conv", ConvLayer(in_channels, planes * kExpansion, ConvOptions{1, stride, 1}));
    downsample_norm = register_module("downsample_norm", BatchNormLayer(planes * kExpansion, 1e-5, bn_momentum));
  }
}

SparseTensor BasicBlockImpl::ForwardImpl(const SparseTensor& x) {
  SparseTensor out = ReluInPlace(norm1(conv1(x)));
  out = norm2(conv2(out));
  SparseTensor residual = downsample_conv ? downsample_norm(downsample_conv(x)) : x;
  CheckSameCoordinates(out, residual, "BasicBlock residual");
  // The sum is fresh and addition keeps no inputs for backward: ReLU in place.
  return out.WithFeatures((out.F() + residual.F()).relu_());
}

BottleneckBlockImpl::BottleneckBlockImpl(int64_t in_channels, int64_t planes, int32_t stride,
                                         int32_t dilation, double bn_momentum) {
  conv1 = register_module("conv1", ConvLayer(in_channels, planes, ConvOptions{1, 1, 1}));
  norm1 = register_module("norm1", BatchNormLayer(planes, 1e-5, bn_momentum));
  conv2 = register_module("conv2", ConvLayer(planes, planes, ConvOptions{3, stride, dilation}));
  norm2 = register_module("norm2", BatchNormLayer(planes, 1e-5, bn_momentum));
  conv3 = register_module("conv3", ConvLayer(planes, planes * kExpansion, ConvOptions{1, 1, 1}));
  norm3 = register_module("norm3", BatchNormLayer(planes * kExpansion, 1e-5, bn_momentum));
  if (stride != 1 || in_channels != planes * kExpansion) {
    downsample_conv = register_module(
        "downsample_conv", ConvLayer(in_channels, planes * kExpansion, ConvOptions{1, stride, 1}));
    downsample_norm = register_module("downsample_norm", BatchNormLayer(planes * kExpansion, 1e-5, bn_momentum));
  }
}

SparseTensor BottleneckBlockImpl::ForwardImpl(const SparseTensor& x) {
  SparseTensor out = ReluInPlace(norm1(conv1(x)));
  out = ReluInPlace(norm2(conv2(out)));
  out = norm3(conv3(out));
  SparseTensor residual = downsample_conv ? downsample_norm(downsample_conv(x)) : x;
  CheckSameCoordinates(out, residual, "BottleneckBlock residual");
  return out.WithFeatures((out.F() + residual.F()).relu_());
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

int64_t DisableGradientCheckpointing(torch::nn::Module& model) { return SwitchCheckpointing(model, false); }

bool IsGradientCheckpointing(const torch::nn::Module& model) {
  bool on = false;
  ForEachModule(model, [&](torch::nn::Module* m) {
    if (auto* block = dynamic_cast<CheckpointableBlock*>(m)) on = on || block->gradient_checkpointing();
  });
  return on;
}

}  // namespace trainsup::sparse
