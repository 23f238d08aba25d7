// Autograd functions over kernel maps (convolution, transposed convolution,
// window pooling) and the public ops built on them.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "sparse/canonical_order.h"
#include "sparse/kernels_cpu.h"
#include "sparse/ops.h"

namespace trainsup::sparse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The pair lists of a saved map, oriented for the op's direction.
struct SavedPairs {
  at::Tensor in_rows, out_rows;
  std::vector<int64_t> begin;
  int64_t identity_offset;
  bool transposed;
  bool sorted;
  cpu::PairLists View() const {
    cpu::PairLists p;
    const int32_t* in = in_rows.data_ptr<int32_t>();
    const int32_t* out = out_rows.data_ptr<int32_t>();
    p.src = transposed ? out : in;
    p.dst = transposed ? in : out;
    p.begin = begin.data();
    p.volume = static_cast<int64_t>(begin.size()) - 1;
    p.identity_offset = identity_offset;
    p.sorted = sorted;
    return p;
  }
};

// Profiler scope names by kind of convolution (RecordFunction user scopes,
// e.g. minkunet_bench --profile), forward then backward. The scopes carry
// one input, the floating-point operations of the call (evaluated only
// while a profiler listens).
constexpr const char* kConvScopes[][2] = {
    {"conv 3x3x3", "conv 3x3x3 backward"},
    {"conv 1x1x1", "conv 1x1x1 backward"},
    {"conv strided", "conv strided backward"},
    {"conv transposed", "conv transposed backward"},
    {"conv other", "conv other backward"},
};

int64_t ConvScope(const KernelMap& map, bool transposed) {
  if (transposed) return 3;
  if (map.volume == 1) return 1;
  if (map.num_in != map.num_out || map.identity_offset < 0) return 2;
  return map.kernel_size == 3 ? 0 : 4;
}

void SaveMap(AutogradContext* ctx, const KernelMap& map, bool transposed) {
  ctx->saved_data["begin"] = map.begin;
  ctx->saved_data["identity"] = map.identity_offset;
  ctx->saved_data["transposed"] = transposed;
  ctx->saved_data["sorted"] = map.rows_sorted;
  ctx->saved_data["num_in"] = transposed ? map.num_out : map.num_in;
  ctx->saved_data["num_out"] = transposed ? map.num_in : map.num_out;
  ctx->saved_data["scope"] = ConvScope(map, transposed);
}

SavedPairs LoadMap(AutogradContext* ctx, const at::Tensor& in_rows, const at::Tensor& out_rows) {
  return SavedPairs{in_rows, out_rows, ctx->saved_data["begin"].toIntVector(),
                    ctx->saved_data["identity"].toInt(), ctx->saved_data["transposed"].toBool(),
                    ctx->saved_data["sorted"].toBool()};
}

SavedPairs PairsOf(const KernelMap& map, bool transposed) {
  return SavedPairs{map.in_rows, map.out_rows, map.begin, map.identity_offset, transposed,
                    map.rows_sorted};
}

class KernelMapConvFunction : public torch::autograd::Function<KernelMapConvFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features,
                            const at::Tensor& weight, const KernelMap* map, bool transposed) {
    RECORD_USER_SCOPE_WITH_INPUTS(
        kConvScopes[ConvScope(*map, transposed)][0],
        std::vector<c10::IValue>{2.0 * static_cast<double>(map->pairs()) *
                                 static_cast<double>(weight.size(1) * weight.size(2))});
    const int64_t num_in = transposed ? map->num_out : map->num_in;
    const int64_t num_out = transposed ? map->num_in : map->num_out;
    at::Tensor f = features.contiguous();
    at::Tensor w = weight.contiguous();
    at::Tensor out = at::empty({num_out, w.size(2)}, f.options());
    const SavedPairs pairs = PairsOf(*map, transposed);
    AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_conv_forward", [&] {
      cpu::ConvForward<scalar_t>(f.data_ptr<scalar_t>(), num_in, w.size(1),
                                 w.data_ptr<scalar_t>(), w.size(2), pairs.View(),
                                 out.data_ptr<scalar_t>(), num_out);
    });
    ctx->save_for_backward({f, w, map->in_rows, map->out_rows});
    SaveMap(ctx, *map, transposed);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& f = saved[0];
    const at::Tensor& w = saved[1];
    const bool need_in = ctx->needs_input_grad(0);
    const bool need_w = ctx->needs_input_grad(1);
    RECORD_USER_SCOPE_WITH_INPUTS(
        kConvScopes[ctx->saved_data["scope"].toInt()][1],
        std::vector<c10::IValue>{2.0 * static_cast<double>(saved[2].numel()) *
                                 static_cast<double>(w.size(1) * w.size(2)) *
                                 ((need_in ? 1 : 0) + (need_w ? 1 : 0))});
    const SavedPairs pairs = LoadMap(ctx, saved[2], saved[3]);
    at::Tensor grad = grad_outputs[0].contiguous();
    at::Tensor grad_in = need_in ? at::empty_like(f) : at::Tensor();
    at::Tensor grad_w = need_w ? at::empty_like(w) : at::Tensor();
    if (need_in || need_w) {
      AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_conv_backward", [&] {
        cpu::ConvBackward<scalar_t>(
            f.data_ptr<scalar_t>(), f.size(0), w.size(1), w.data_ptr<scalar_t>(), w.size(2),
            pairs.View(), grad.data_ptr<scalar_t>(), grad.size(0),
            need_in ? grad_in.data_ptr<scalar_t>() : nullptr,
            need_w ? grad_w.data_ptr<scalar_t>() : nullptr);
      });
    }
    return {grad_in, grad_w, at::Tensor(), at::Tensor()};
  }
};

class MaxPoolFunction : public torch::autograd::Function<MaxPoolFunction> {
 public:
  // order: int64 output rows in key order (deterministic mode, unsorted
  // output set), or empty for row order.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features,
                            const KernelMap* map, const at::Tensor& order) {
    at::Tensor f = features.contiguous();
    at::Tensor out = at::empty({map->num_out, f.size(1)}, f.options());
    at::Tensor argmax = at::empty({map->num_out, f.size(1)}, f.options().dtype(at::kInt));
    const SavedPairs pairs = PairsOf(*map, false);
    AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_max_pool_forward", [&] {
      cpu::MaxPoolForward<scalar_t>(f.data_ptr<scalar_t>(), f.size(1), pairs.View(),
                                    out.data_ptr<scalar_t>(), argmax.data_ptr<int32_t>(),
                                    map->num_out);
    });
    ctx->save_for_backward({argmax, order});
    ctx->saved_data["num_in"] = f.size(0);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& argmax = saved[0];
    const at::Tensor& order = saved[1];
    at::Tensor grad = grad_outputs[0].contiguous();
    at::Tensor grad_in = at::zeros({ctx->saved_data["num_in"].toInt(), grad.size(1)},
                                   grad.options());
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "sparse_max_pool_backward", [&] {
      cpu::MaxPoolBackward<scalar_t>(grad.data_ptr<scalar_t>(), argmax.data_ptr<int32_t>(),
                                     grad.size(0), grad.size(1),
                                     order.numel() > 0 ? order.data_ptr<int64_t>() : nullptr,
                                     grad_in.data_ptr<scalar_t>());
    });
    return {grad_in, at::Tensor(), at::Tensor()};
  }
};

class WindowSumFunction : public torch::autograd::Function<WindowSumFunction> {
 public:
  // inv_divisor: [num_out], same dtype as features.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features,
                            const KernelMap* map, const at::Tensor& inv_divisor) {
    at::Tensor f = features.contiguous();
    at::Tensor out = at::empty({map->num_out, f.size(1)}, f.options());
    const SavedPairs pairs = PairsOf(*map, false);
    AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_window_sum_forward", [&] {
      cpu::WindowSumForward<scalar_t>(f.data_ptr<scalar_t>(), f.size(1), pairs.View(),
                                      inv_divisor.data_ptr<scalar_t>(),
                                      out.data_ptr<scalar_t>(), map->num_out);
    });
    ctx->save_for_backward({map->in_rows, map->out_rows, inv_divisor});
    SaveMap(ctx, *map, false);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const SavedPairs pairs = LoadMap(ctx, saved[0], saved[1]);
    const at::Tensor& inv_divisor = saved[2];
    at::Tensor grad = grad_outputs[0].contiguous();
    const int64_t num_in = ctx->saved_data["num_in"].toInt();
    at::Tensor grad_in = at::empty({num_in, grad.size(1)}, grad.options());
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "sparse_window_sum_backward", [&] {
      cpu::WindowSumBackward<scalar_t>(grad.data_ptr<scalar_t>(), grad.size(1), pairs.View(),
                                       inv_divisor.data_ptr<scalar_t>(),
                                       grad_in.data_ptr<scalar_t>(), num_in);
    });
    return {grad_in, at::Tensor(), at::Tensor()};
  }
};

void CheckOptions(const ConvOptions& o, const char* what) {
  TORCH_CHECK(o.kernel_size >= 1, what, ": kernel_size must be >= 1, got ", o.kernel_size);
  TORCH_CHECK(o.stride >= 1, what, ": stride must be >= 1, got ", o.stride);
  TORCH_CHECK(o.dilation >= 1, what, ": dilation must be >= 1, got ", o.dilation);
}

void CheckCpuFeatures(const SparseTensor& x, const char* what) {
  TORCH_CHECK(x.defined(), what, ": undefined SparseTensor");
  TORCH_CHECK(x.F().device().is_cpu(), what, ": this build runs on the CPU only, features are on ",
              x.F().device());
}

void CheckWeight(const at::Tensor& features, const at::Tensor& weight, const at::Tensor& bias,
                 int64_t volume, const char* what) {
  TORCH_CHECK(weight.defined() && weight.dim() == 3, what,
              ": weight must be [kernel volume, C_in, C_out], got shape ",
              weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK(weight.size(0) == volume, what, ": weight has ", weight.size(0),
              " kernel offsets but the kernel has ", volume);
  TORCH_CHECK(weight.size(1) == features.size(1), what, ": weight expects C_in = ",
              weight.size(1), " but the features have ", features.size(1), " channels");
  TORCH_CHECK(weight.scalar_type() == features.scalar_type(), what, ": weight dtype ",
              weight.scalar_type(), " differs from the features' ", features.scalar_type());
  TORCH_CHECK(weight.device() == features.device(), what, ": weight is on ", weight.device(),
              ", features on ", features.device());
  if (bias.defined()) {
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(2), what,
                ": bias must be [C_out = ", weight.size(2), "], got shape ", bias.sizes());
    TORCH_CHECK(bias.scalar_type() == features.scalar_type(), what, ": bias dtype ",
                bias.scalar_type(), " differs from the features' ", features.scalar_type());
  }
}

// The bias gradient sums over rows: in key order under deterministic mode.
SparseTensor AddBias(const SparseTensor& y, const at::Tensor& bias) {
  if (!bias.defined()) return y;
  RECORD_USER_SCOPE("conv bias");
  return y.WithFeatures(InCanonicalOrder(y, [&](const at::Tensor& f) { return f + bias; }));
}

}  // namespace

at::Tensor KernelMapConv(const at::Tensor& features, const at::Tensor& weight,
                         const KernelMap& map, bool transposed) {
  TORCH_CHECK(features.dim() == 2 && features.size(0) == (transposed ? map.num_out : map.num_in),
              "KernelMapConv: features have shape ", features.sizes(), " but the map expects ",
              transposed ? map.num_out : map.num_in, " rows");
  CheckWeight(features, weight, at::Tensor(), map.volume, "KernelMapConv");
  return KernelMapConvFunction::apply(features, weight, &map, transposed);
}

SparseTensor Conv(const SparseTensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvOptions& options) {
  CheckOptions(options, "Conv");
  CheckCpuFeatures(x, "Conv");
  const int64_t volume = static_cast<int64_t>(options.kernel_size) * options.kernel_size *
                         options.kernel_size;
  CheckWeight(x.F(), weight, bias, volume, "Conv");
  auto& manager = x.manager();
  const CoordinateSetId out_set = manager->Downsample(x.set_id(), options.stride);
  auto map = manager->GetKernelMap(x.set_id(), out_set, options.kernel_size, options.dilation);
  SparseTensor y(KernelMapConvFunction::apply(x.F(), weight, map.get(), false), out_set, manager);
  return AddBias(y, bias);
}

SparseTensor ConvTranspose(const SparseTensor& x, const at::Tensor& weight,
                           const at::Tensor& bias, const ConvOptions& options,
                           const SparseTensor* target) {
  CheckOptions(options, "ConvTranspose");
  CheckCpuFeatures(x, "ConvTranspose");
  const int64_t volume = static_cast<int64_t>(options.kernel_size) * options.kernel_size *
                         options.kernel_size;
  CheckWeight(x.F(), weight, bias, volume, "ConvTranspose");
  auto& manager = x.manager();
  CoordinateSetId fine = x.set_id();
  if (target != nullptr) {
    TORCH_CHECK(target->defined() && target->manager() == manager,
                "ConvTranspose: the target belongs to another coordinate manager");
    fine = target->set_id();
  } else if (options.stride > 1) {
    fine = manager->Set(x.set_id()).parent;
    TORCH_CHECK(fine >= 0, "ConvTranspose: no target given and the input's coordinates were "
                "not made by downsampling; pass the target coordinates");
  }
  const int32_t fine_stride = manager->Set(fine).stride;
  TORCH_CHECK(static_cast<int64_t>(fine_stride) * options.stride == x.stride(),
              "ConvTranspose: target stride ", fine_stride, " times stride ", options.stride,
              " must equal the input's tensor stride ", x.stride());
  // The transpose of the map from the fine set to the input's coarse set.
  auto map = manager->GetKernelMap(fine, x.set_id(), options.kernel_size, options.dilation);
  SparseTensor y(KernelMapConvFunction::apply(x.F(), weight, map.get(), true), fine, manager);
  return AddBias(y, bias);
}

SparseTensor Pool(const SparseTensor& x, PoolMode mode, const ConvOptions& options) {
  CheckOptions(options, "Pool");
  CheckCpuFeatures(x, "Pool");
  auto& manager = x.manager();
  const CoordinateSetId out_set = manager->Downsample(x.set_id(), options.stride);
  auto map = manager->GetKernelMap(x.set_id(), out_set, options.kernel_size, options.dilation);
  at::Tensor out;
  if (mode == PoolMode::kMax) {
    const CoordinateSet& out_coords = manager->Set(out_set);
    const at::Tensor order = IsDeterministic() && !out_coords.sorted ? out_coords.order
                                                                     : at::empty({0}, at::kLong);
    out = MaxPoolFunction::apply(x.F(), map.get(), order);
  } else {
    at::Tensor inv = at::ones({map->num_out}, x.F().options().requires_grad(false));
    if (mode == PoolMode::kAverage) {
      at::Tensor counts = at::zeros({map->num_out}, at::kLong);
      counts.index_add_(0, map->out_rows.to(at::kLong), at::ones({map->pairs()}, at::kLong));
      inv = at::where(counts > 0, 1.0 / counts.to(x.F().scalar_type()),
                      at::zeros({}, x.F().options()))
                .contiguous();
    }
    out = WindowSumFunction::apply(x.F(), map.get(), inv);
  }
  return SparseTensor(out, out_set, manager);
}

std::string ToString(PoolMode mode) {
  switch (mode) {
    case PoolMode::kMax:
      return "max";
    case PoolMode::kAverage:
      return "average";
    case PoolMode::kSum:
      return "sum";
  }
  return "unknown";
}

PoolMode PoolModeFromString(const std::string& name) {
  if (name == "max") return PoolMode::kMax;
  if (name == "average" || name == "avg") return PoolMode::kAverage;
  if (name == "sum") return PoolMode::kSum;
  TORCH_CHECK(false, "unknown pooling mode '", name, "' (expected max, average or sum)");
}

}  // namespace trainsup::sparse
