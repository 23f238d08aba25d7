// Autograd functions over kernel maps (convolution, transposed convolution,
// window pooling) and the public ops built on them. The arithmetic is the
// backend's (backend.h), chosen by the features' device; backward runs on
// the backend forward ran on.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include "sparse/backend.h"
#include "sparse/determinism.h"
#include "sparse/ops.h"

namespace trainsup::sparse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Profiler scope names by kind of convolution (RecordFunction user scopes,
// e.g. minkunet_bench --profile), forward then backward. The scopes carry
// one input, the floating-point operations of the call (evaluated only
// while a profiler listens).
constexpr const char* kConvScopes[][2] = {
    {"conv 3x3x3", "conv 3x3x3 backward"},     {"conv 1x1x1", "conv 1x1x1 backward"},
    {"conv strided", "conv strided backward"}, {"conv transposed", "conv transposed backward"},
    {"conv other", "conv other backward"},
};

int64_t ConvScope(const KernelMap& map, bool transposed) {
  if (transposed) return 3;
  if (map.volume == 1) return 1;
  if (map.num_in != map.num_out || map.identity_offset < 0) return 2;
  return map.kernel_size == 3 ? 0 : 4;
}

// A map's derived tables (KernelMap::tables) as an autograd node keeps
// them: an IValue capsule, so that the node holds them as long as it lives.
struct TablesHolder : torch::CustomClassHolder {
  explicit TablesHolder(std::shared_ptr<PairTables> t) : tables(std::move(t)) {}
  std::shared_ptr<PairTables> tables;
};

void SaveMap(AutogradContext* ctx, const KernelMap& map, bool transposed, const Backend& backend) {
  ctx->saved_data["begin"] = map.begin;
  if (map.device_begin.defined()) ctx->saved_data["device_begin"] = map.device_begin;
  ctx->saved_data["identity"] = map.identity_offset;
  ctx->saved_data["transposed"] = transposed;
  ctx->saved_data["tables"] =
      at::IValue::make_capsule(c10::make_intrusive<TablesHolder>(map.tables));
  ctx->saved_data["sorted"] = map.rows_sorted;
  ctx->saved_data["num_in"] = transposed ? map.num_out : map.num_in;
  ctx->saved_data["num_out"] = transposed ? map.num_in : map.num_out;
  // The table itself, which may be outside the registry (SetBackendTable):
  // tables are static objects, outliving every autograd node.
  ctx->saved_data["backend"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&backend));
}

const Backend& SavedBackend(AutogradContext* ctx) {
  return *reinterpret_cast<const Backend*>(
      static_cast<intptr_t>(ctx->saved_data["backend"].toInt()));
}

// What a backend's conv (`convolution`) and pooling entries get for
// half-precision tensors: as they are where it takes them, else float32
// (the convert-to-fp32 path); Back() returns a result in the features'
// type.
struct HalfPath {
  HalfPath(const Backend& backend, at::ScalarType type, bool convolution)
      : type(type), convert(IsHalf(type) && !backend.takes_half_inputs(type, convolution)) {}
  at::Tensor In(const at::Tensor& t) const { return convert ? t.to(at::kFloat) : t; }
  at::Tensor Back(const at::Tensor& t) const { return convert && t.defined() ? t.to(type) : t; }
  at::ScalarType type;
  bool convert;
};

// The pairs of a saved map, oriented as at forward. `begin` holds the
// offsets the view points into.
PairView LoadPairs(AutogradContext* ctx, const at::Tensor& in_rows, const at::Tensor& out_rows,
                   std::vector<int64_t>* begin) {
  *begin = ctx->saved_data["begin"].toIntVector();
  const bool transposed = ctx->saved_data["transposed"].toBool();
  PairView p;
  p.src = transposed ? out_rows : in_rows;
  p.dst = transposed ? in_rows : out_rows;
  p.begin = begin;
  const auto device_begin = ctx->saved_data.find("device_begin");
  if (device_begin != ctx->saved_data.end()) p.device_begin = device_begin->second.toTensor();
  p.identity_offset = ctx->saved_data["identity"].toInt();
  p.sorted = ctx->saved_data["sorted"].toBool();
  p.transposed = transposed;
  p.tables = c10::static_intrusive_pointer_cast<TablesHolder>(ctx->saved_data["tables"].toCapsule())
                 ->tables;
  return p;
}

// The sum over rows of a [rows, C] gradient, in the sums' type `type`: in
// key order where `order` (the output rows in key order; deterministic
// mode on an unsorted set) is not empty, so the bits do not depend on the
// row order.
at::Tensor SumRows(const at::Tensor& grad, const at::Tensor& order, at::ScalarType type) {
  const at::Tensor rows = order.numel() > 0 ? grad.index_select(0, order) : grad;
  return rows.sum(0, /*keepdim=*/false, type);
}

// A convolution over a kernel map, with its bias (`has_bias`: bias is
// [C_out] in the sums' type) added where the backend writes the sums.
// `order`: the output rows in key order where the bias gradient must sum
// in it (deterministic mode, unsorted output set), else empty.
class KernelMapConvFunction : public torch::autograd::Function<KernelMapConvFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features,
                            const at::Tensor& weight, const at::Tensor& bias, bool has_bias,
                            const at::Tensor& order, const KernelMap* map, bool transposed) {
    RECORD_USER_SCOPE_WITH_INPUTS(
        kConvScopes[ConvScope(*map, transposed)][0],
        std::vector<c10::IValue>{2.0 * static_cast<double>(map->pairs()) *
                                 static_cast<double>(weight.size(1) * weight.size(2))});
    const int64_t num_out = transposed ? map->num_in : map->num_out;
    at::Tensor f = features.contiguous();
    at::Tensor w = weight.contiguous();
    const Backend& backend = BackendFor(f.device());
    const HalfPath half(backend, f.scalar_type(), true);
    at::Tensor out = half.Back(backend.conv_forward(half.In(f), half.In(w),
                                                    has_bias ? bias.contiguous() : at::Tensor(),
                                                    PairsOf(*map, transposed), num_out));
    // Half features are kept as they are: the memory mixed precision saves.
    ctx->save_for_backward({f, w, map->in_rows, map->out_rows, order});
    SaveMap(ctx, *map, transposed, backend);
    ctx->saved_data["scope"] = ConvScope(*map, transposed);
    ctx->saved_data["bias_type"] = has_bias ? bias.scalar_type() : f.scalar_type();
    ctx->saved_data["has_bias"] = has_bias;
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
    std::vector<int64_t> begin;
    const PairView pairs = LoadPairs(ctx, saved[2], saved[3], &begin);
    at::Tensor grad = grad_outputs[0].contiguous();
    at::Tensor grad_in, grad_w;
    const HalfPath half(SavedBackend(ctx), f.scalar_type(), true);
    if (need_in || need_w) {  // not when only the bias needs its gradient
      SavedBackend(ctx).conv_backward(half.In(f), half.In(w), pairs, half.In(grad), need_in, need_w,
                                      &grad_in, &grad_w);
    }
    at::Tensor grad_bias;
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      grad_bias = SumRows(grad, saved[4], ctx->saved_data["bias_type"].toScalarType());
    }
    return {half.Back(grad_in), half.Back(grad_w), grad_bias,   at::Tensor(),
            at::Tensor(),       at::Tensor(),      at::Tensor()};
  }
};

class MaxPoolFunction : public torch::autograd::Function<MaxPoolFunction> {
 public:
  // order: int64 output rows in key order (deterministic mode, unsorted
  // output set) on the features' device, or empty for row order.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features, const KernelMap* map,
                            const at::Tensor& order) {
    at::Tensor f = features.contiguous();
    const Backend& backend = BackendFor(f.device());
    const HalfPath half(backend, f.scalar_type(), false);
    at::Tensor out, argmax;
    backend.max_pool_forward(half.In(f), PairsOf(*map, false), map->num_out, &out, &argmax);
    ctx->save_for_backward({argmax, order, map->in_rows, map->out_rows});
    SaveMap(ctx, *map, false, backend);
    ctx->saved_data["type"] = f.scalar_type();
    return half.Back(out);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& argmax = saved[0];
    const at::Tensor& order = saved[1];
    std::vector<int64_t> begin;
    const PairView pairs = LoadPairs(ctx, saved[2], saved[3], &begin);
    at::Tensor grad = grad_outputs[0].contiguous();
    const HalfPath half(SavedBackend(ctx), ctx->saved_data["type"].toScalarType(), false);
    at::Tensor grad_in = SavedBackend(ctx).max_pool_backward(
        half.In(grad), argmax, pairs, order.numel() > 0 ? order : at::Tensor(),
        ctx->saved_data["num_in"].toInt());
    return {half.Back(grad_in), at::Tensor(), at::Tensor()};
  }
};

class WindowSumFunction : public torch::autograd::Function<WindowSumFunction> {
 public:
  // inv_divisor: [num_out] on the features' device, in
  // AccumulateType(features).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& features, const KernelMap* map,
                            const at::Tensor& inv_divisor) {
    at::Tensor f = features.contiguous();
    const Backend& backend = BackendFor(f.device());
    const HalfPath half(backend, f.scalar_type(), false);
    at::Tensor out = half.Back(
        backend.window_sum_forward(half.In(f), PairsOf(*map, false), inv_divisor, map->num_out));
    ctx->save_for_backward({map->in_rows, map->out_rows, inv_divisor});
    SaveMap(ctx, *map, false, backend);
    ctx->saved_data["type"] = f.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    std::vector<int64_t> begin;
    const PairView pairs = LoadPairs(ctx, saved[0], saved[1], &begin);
    const at::Tensor& inv_divisor = saved[2];
    at::Tensor grad = grad_outputs[0].contiguous();
    const HalfPath half(SavedBackend(ctx), ctx->saved_data["type"].toScalarType(), false);
    at::Tensor grad_in = SavedBackend(ctx).window_sum_backward(half.In(grad), pairs, inv_divisor,
                                                               ctx->saved_data["num_in"].toInt());
    return {half.Back(grad_in), at::Tensor(), at::Tensor()};
  }
};

void CheckOptions(const ConvOptions& o, const char* what) {
  TORCH_CHECK(o.kernel_size >= 1, what, ": kernel_size must be >= 1, got ", o.kernel_size);
  TORCH_CHECK(o.stride >= 1, what, ": stride must be >= 1, got ", o.stride);
  TORCH_CHECK(o.dilation >= 1, what, ": dilation must be >= 1, got ", o.dilation);
}

// Also throws when no backend of this build runs on the features' device.
void CheckFeatures(const SparseTensor& x, const char* what) {
  TORCH_CHECK(x.defined(), what, ": undefined SparseTensor");
  try {
    BackendFor(x.F().device());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, what, ": ", e.what_without_backtrace());
  }
}

void CheckWeight(const at::Tensor& features, const at::Tensor& weight, const at::Tensor& bias,
                 int64_t volume, const char* what) {
  TORCH_CHECK(weight.defined() && weight.dim() == 3, what,
              ": weight must be [kernel volume, C_in, C_out], got shape ",
              weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK(weight.size(0) == volume, what, ": weight has ", weight.size(0),
              " kernel offsets but the kernel has ", volume);
  TORCH_CHECK(weight.size(1) == features.size(1), what, ": weight expects C_in = ", weight.size(1),
              " but the features have ", features.size(1), " channels");
  // Mixed precision: half features with the float32 master weights, cast
  // per call (AsFeatures).
  const bool mixed = IsHalf(features.scalar_type()) && weight.scalar_type() == at::kFloat;
  TORCH_CHECK(weight.scalar_type() == features.scalar_type() || mixed, what, ": weight dtype ",
              weight.scalar_type(), " differs from the features' ", features.scalar_type());
  TORCH_CHECK(weight.device() == features.device(), what, ": weight is on ", weight.device(),
              ", features on ", features.device());
  if (bias.defined()) {
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(2), what,
                ": bias must be [C_out = ", weight.size(2), "], got shape ", bias.sizes());
    TORCH_CHECK(bias.scalar_type() == weight.scalar_type(), what, ": bias dtype ",
                bias.scalar_type(), " differs from the weight's ", weight.scalar_type());
    TORCH_CHECK(bias.device() == features.device(), what, ": bias is on ", bias.device(),
                ", features on ", features.device());
  }
}

// A float32 master weight cast to half features' type, as the operation's
// input: autograd takes the gradient back to float32.
at::Tensor AsFeatures(const at::Tensor& t, const at::Tensor& features) {
  return t.defined() && t.scalar_type() != features.scalar_type() ? t.to(features.scalar_type())
                                                                  : t;
}

// KernelMapConvFunction over `map` with `bias` (or none, undefined) and
// the bias gradient's row order `order` (or none, undefined).
at::Tensor ApplyConv(const at::Tensor& f, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& order, const KernelMap* map, bool transposed) {
  // The bias in the sums' type (a float32 master for half features is
  // already). Autograd takes every tensor argument for an input: "none"
  // is empty.
  const at::ScalarType sums = AccumulateType(f.scalar_type());
  const at::Tensor b = !bias.defined()              ? at::empty({0}, f.options().dtype(sums))
                       : bias.scalar_type() == sums ? bias
                                                    : bias.to(sums);
  return KernelMapConvFunction::apply(
      f, AsFeatures(weight, f), b, bias.defined(),
      order.defined() ? order : at::empty({0}, f.options().dtype(at::kLong)), map, transposed);
}

// The rows of x's manager's set `out_set` in key order where a bias
// gradient must sum in it (the bias needs one, deterministic mode, an
// unsorted set), else undefined.
at::Tensor BiasGradientOrder(const SparseTensor& x, const at::Tensor& bias,
                             CoordinateSetId out_set) {
  if (!bias.defined() || !bias.requires_grad() || !at::GradMode::is_enabled() ||
      !IsDeterministic() || x.manager()->Meta(out_set).sorted) {
    return at::Tensor();
  }
  return x.manager()->OnDevice(out_set, x.F().device()).order;
}

}  // namespace

at::Tensor KernelMapConv(const at::Tensor& features, const at::Tensor& weight, const KernelMap& map,
                         bool transposed) {
  TORCH_CHECK(features.dim() == 2 && features.size(0) == (transposed ? map.num_out : map.num_in),
              "KernelMapConv: features have shape ", features.sizes(), " but the map expects ",
              transposed ? map.num_out : map.num_in, " rows");
  TORCH_CHECK(map.in_rows.device() == features.device(), "KernelMapConv: the map is on ",
              map.in_rows.device(), ", the features on ", features.device(),
              " (GetKernelMap takes the device)");
  CheckWeight(features, weight, at::Tensor(), map.volume, "KernelMapConv");
  return ApplyConv(features, weight, at::Tensor(), at::Tensor(), &map, transposed);
}

SparseTensor Conv(const SparseTensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvOptions& options) {
  CheckOptions(options, "Conv");
  CheckFeatures(x, "Conv");
  const int64_t volume =
      static_cast<int64_t>(options.kernel_size) * options.kernel_size * options.kernel_size;
  CheckWeight(x.F(), weight, bias, volume, "Conv");
  auto& manager = x.manager();
  const CoordinateSetId out_set = manager->Downsample(x.set_id(), options.stride, x.F().device());
  auto map = manager->GetKernelMap(x.set_id(), out_set, options.kernel_size, options.dilation,
                                   x.F().device());
  return SparseTensor(
      ApplyConv(x.F(), weight, bias, BiasGradientOrder(x, bias, out_set), map.get(), false),
      out_set, manager);
}

SparseTensor ConvTranspose(const SparseTensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const ConvOptions& options, const SparseTensor* target) {
  CheckOptions(options, "ConvTranspose");
  CheckFeatures(x, "ConvTranspose");
  const int64_t volume =
      static_cast<int64_t>(options.kernel_size) * options.kernel_size * options.kernel_size;
  CheckWeight(x.F(), weight, bias, volume, "ConvTranspose");
  auto& manager = x.manager();
  CoordinateSetId fine = x.set_id();
  if (target != nullptr) {
    TORCH_CHECK(target->defined() && target->manager() == manager,
                "ConvTranspose: the target belongs to another coordinate manager");
    fine = target->set_id();
  } else if (options.stride > 1) {
    fine = manager->Meta(x.set_id()).parent;
    TORCH_CHECK(fine >= 0,
                "ConvTranspose: no target given and the input's coordinates were "
                "not made by downsampling; pass the target coordinates");
  }
  const int32_t fine_stride = manager->Meta(fine).stride;
  TORCH_CHECK(static_cast<int64_t>(fine_stride) * options.stride == x.stride(),
              "ConvTranspose: target stride ", fine_stride, " times stride ", options.stride,
              " must equal the input's tensor stride ", x.stride());
  // The transpose of the map from the fine set to the input's coarse set.
  auto map = manager->GetKernelMap(fine, x.set_id(), options.kernel_size, options.dilation,
                                   x.F().device());
  return SparseTensor(
      ApplyConv(x.F(), weight, bias, BiasGradientOrder(x, bias, fine), map.get(), true), fine,
      manager);
}

SparseTensor Pool(const SparseTensor& x, PoolMode mode, const ConvOptions& options) {
  CheckOptions(options, "Pool");
  CheckFeatures(x, "Pool");
  auto& manager = x.manager();
  const c10::Device device = x.F().device();
  const CoordinateSetId out_set = manager->Downsample(x.set_id(), options.stride, device);
  auto map =
      manager->GetKernelMap(x.set_id(), out_set, options.kernel_size, options.dilation, device);
  at::Tensor out;
  if (mode == PoolMode::kMax) {
    // Autograd takes every tensor argument for an input: "none" is empty.
    at::Tensor order = IsDeterministic() ? manager->OnDevice(out_set, device).order : at::Tensor();
    if (!order.defined()) order = at::empty({0}, x.F().options().dtype(at::kLong));
    out = MaxPoolFunction::apply(x.F(), map.get(), order);
  } else {
    const at::ScalarType acc = AccumulateType(x.F().scalar_type());
    const at::TensorOptions options_f = x.F().options().dtype(acc).requires_grad(false);
    at::Tensor inv = at::ones({map->num_out}, options_f);
    if (mode == PoolMode::kAverage) {
      at::Tensor counts = at::zeros({map->num_out}, options_f.dtype(at::kLong));
      counts.index_add_(0, map->out_rows.to(at::kLong), at::ones({map->pairs()}, counts.options()));
      inv = at::where(counts > 0, 1.0 / counts.to(acc), at::zeros({}, options_f)).contiguous();
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
