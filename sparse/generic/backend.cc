#include "sparse/generic/backend.h"

#include <ATen/ATen.h>

#include <array>
#include <limits>
#include <utility>
#include <vector>

#include "sparse/coordinate_manager.h"
#include "sparse/coordinates.h"

namespace trainsup::sparse::generic {
namespace {

bool RunsOn(c10::DeviceType) { return true; }

// A pair list as int64 indices (what index_copy_ takes), sliced per offset.
struct Indices {
  explicit Indices(const PairView& p)
      : src(p.src.to(at::kLong)), dst(p.dst.to(at::kLong)), view(p) {}
  at::Tensor Src(int64_t k) const { return src.narrow(0, (*view.begin)[k], view.count(k)); }
  at::Tensor Dst(int64_t k) const { return dst.narrow(0, (*view.begin)[k], view.count(k)); }
  at::Tensor src, dst;
  const PairView& view;
};

void BuildKernelMapEntry(const KernelMapInputs& inputs, KernelMap* map) {
  if (!StartKernelMap(inputs, map)) return;
  const at::Tensor& in_keys = inputs.in_device->keys;
  const at::Tensor& out_keys = inputs.out_device->keys;
  const int64_t n_in = in_keys.size(0), n_out = out_keys.size(0);
  const int64_t volume = static_cast<int64_t>(inputs.offsets.size());
  const at::TensorOptions index = in_keys.options();
  // The fields of the output keys, each biased into [0, 2^kCoordinateBits).
  const int64_t mask = (int64_t{1} << kCoordinateBits) - 1;
  const std::array<at::Tensor, 3> field = DeviceKeyFields(out_keys);
  const at::Tensor& in_rows = inputs.in_device->rows;
  const at::Tensor& out_rows = inputs.out_device->rows;
  std::vector<at::Tensor> ins, outs;
  for (int64_t k = 0; k < volume; ++k) {
    // Adding the packed offset to a key is exact where no field leaves its
    // range; elsewhere nothing is added (no overflow) and `valid` is false.
    at::Tensor valid = at::ones({n_out}, index.dtype(at::kBool));
    int64_t d[3];
    for (int a = 0; a < 3; ++a) {
      d[a] = int64_t{inputs.offsets[k][a]} * inputs.step;
      const at::Tensor moved = field[a] + d[a];
      valid = valid.logical_and(moved.ge(0)).logical_and(moved.le(mask));
    }
    const int64_t delta = PackedShift(d[0], d[1], d[2]);
    const at::Tensor target = out_keys + valid.to(at::kLong) * delta;
    const at::Tensor found = at::searchsorted(in_keys, target).clamp_max(n_in - 1);
    const at::Tensor hit = valid.logical_and(in_keys.index_select(0, found).eq(target));
    const at::Tensor pos = hit.nonzero().select(1, 0);
    const at::Tensor in_pos = found.index_select(0, pos);
    ins.push_back(in_rows.defined() ? in_rows.index_select(0, in_pos) : in_pos.to(at::kInt));
    outs.push_back(out_rows.defined() ? out_rows.index_select(0, pos) : pos.to(at::kInt));
    map->begin[k + 1] = map->begin[k] + pos.size(0);
  }
  map->in_rows = at::cat(ins).to(at::kInt);
  map->out_rows = at::cat(outs).to(at::kInt);
}

at::Tensor ConvForwardEntry(const at::Tensor& f, const at::Tensor& w, const at::Tensor& bias,
                            const PairView& pairs, int64_t num_out) {
  const int64_t id = pairs.identity_offset;
  // Half inputs: each offset's product in the GEMM's own precision (float32
  // accumulation inside it), the sum over offsets in float32.
  const at::ScalarType acc = AccumulateType(f.scalar_type());
  // The identity offset maps row p to row p for every row: a plain product.
  at::Tensor out =
      id >= 0 ? at::mm(f, w[id]).to(acc) : at::zeros({num_out, w.size(2)}, f.options().dtype(acc));
  const Indices idx(pairs);
  for (int64_t k = 0; k < pairs.volume(); ++k) {
    if (k == id || pairs.count(k) == 0) continue;
    out.index_add_(0, idx.Dst(k), at::mm(f.index_select(0, idx.Src(k)), w[k]).to(acc));
  }
  if (bias.defined()) out.add_(bias);  // in the sums' type, before the rounding to half
  return out.to(f.scalar_type());
}

void ConvBackwardEntry(const at::Tensor& f, const at::Tensor& w, const PairView& pairs,
                       const at::Tensor& grad_out, bool need_input, bool need_weight,
                       at::Tensor* grad_in, at::Tensor* grad_weight) {
  const int64_t id = pairs.identity_offset;
  const Indices idx(pairs);
  *grad_in = at::Tensor();
  *grad_weight = at::Tensor();
  if (need_input) {
    const at::ScalarType acc = AccumulateType(f.scalar_type());
    at::Tensor sum =
        id >= 0 ? at::mm(grad_out, w[id].t()).to(acc) : at::zeros_like(f, f.options().dtype(acc));
    for (int64_t k = 0; k < pairs.volume(); ++k) {
      if (k == id || pairs.count(k) == 0) continue;
      sum.index_add_(0, idx.Src(k), at::mm(grad_out.index_select(0, idx.Dst(k)), w[k].t()).to(acc));
    }
    *grad_in = sum.to(f.scalar_type());
  }
  if (need_weight) {
    *grad_weight = at::empty_like(w);
    for (int64_t k = 0; k < pairs.volume(); ++k) {
      at::Tensor gk = (*grad_weight)[k];
      if (k == id) {
        at::mm_out(gk, f.t(), grad_out);
      } else {
        at::mm_out(gk, f.index_select(0, idx.Src(k)).t(), grad_out.index_select(0, idx.Dst(k)));
      }
    }
  }
}

void MaxPoolForwardEntry(const at::Tensor& f, const PairView& pairs, int64_t num_out,
                         at::Tensor* out, at::Tensor* argmax) {
  *out = at::full({num_out, f.size(1)}, -std::numeric_limits<double>::infinity(), f.options());
  *argmax = at::full({num_out, f.size(1)}, -1, f.options().dtype(at::kInt));
  const Indices idx(pairs);
  for (int64_t k = 0; k < pairs.volume(); ++k) {
    if (pairs.count(k) == 0) continue;
    const at::Tensor src = idx.Src(k), dst = idx.Dst(k);
    const at::Tensor candidate = f.index_select(0, src);
    const at::Tensor current = out->index_select(0, dst);
    const at::Tensor current_arg = argmax->index_select(0, dst);
    // The cpu backend's rule: a larger value, or the window's first one.
    const at::Tensor take = candidate.gt(current).logical_or(current_arg.lt(0));
    out->index_copy_(0, dst, at::where(take, candidate, current));
    argmax->index_copy_(
        0, dst, at::where(take, src.to(at::kInt).unsqueeze(1).expand_as(current_arg), current_arg));
  }
  out->masked_fill_(argmax->lt(0), 0);
}

// Offset by offset, each input row taking the gradient of the windows it is
// the maximum of: the order depends on the map alone, never on row order,
// so `order` is not needed.
at::Tensor MaxPoolBackwardEntry(const at::Tensor& grad_out, const at::Tensor& argmax,
                                const PairView& pairs, const at::Tensor& order, int64_t num_in) {
  (void)order;
  const at::ScalarType acc = AccumulateType(grad_out.scalar_type());
  at::Tensor grad_in = at::zeros({num_in, grad_out.size(1)}, grad_out.options().dtype(acc));
  const Indices idx(pairs);
  for (int64_t k = 0; k < pairs.volume(); ++k) {
    if (pairs.count(k) == 0) continue;
    const at::Tensor src = idx.Src(k), dst = idx.Dst(k);
    const at::Tensor miss = argmax.index_select(0, dst).ne(src.to(at::kInt).unsqueeze(1));
    grad_in.index_add_(0, src, grad_out.index_select(0, dst).masked_fill_(miss, 0).to(acc));
  }
  return grad_in.to(grad_out.scalar_type());
}

at::Tensor WindowSumForwardEntry(const at::Tensor& f, const PairView& pairs,
                                 const at::Tensor& inv_divisor, int64_t num_out) {
  const at::ScalarType acc = AccumulateType(f.scalar_type());
  at::Tensor out = at::zeros({num_out, f.size(1)}, f.options().dtype(acc));
  const Indices idx(pairs);
  for (int64_t k = 0; k < pairs.volume(); ++k) {
    if (pairs.count(k) == 0) continue;
    out.index_add_(0, idx.Dst(k), f.index_select(0, idx.Src(k)).to(acc));
  }
  return out.mul_(inv_divisor.unsqueeze(1)).to(f.scalar_type());
}

at::Tensor WindowSumBackwardEntry(const at::Tensor& grad_out, const PairView& pairs,
                                  const at::Tensor& inv_divisor, int64_t num_in) {
  const at::ScalarType acc = AccumulateType(grad_out.scalar_type());
  at::Tensor grad_in = at::zeros({num_in, grad_out.size(1)}, grad_out.options().dtype(acc));
  const at::Tensor scaled = grad_out.to(acc) * inv_divisor.unsqueeze(1);
  const Indices idx(pairs);
  for (int64_t k = 0; k < pairs.volume(); ++k) {
    if (pairs.count(k) == 0) continue;
    grad_in.index_add_(0, idx.Src(k), scaled.index_select(0, idx.Dst(k)));
  }
  return grad_in.to(grad_out.scalar_type());
}

at::Tensor BatchNormTrainingEntry(const at::Tensor& f, const at::Tensor& weight,
                                  const at::Tensor& bias, const at::Tensor& running_mean,
                                  const at::Tensor& running_var, double momentum, double eps,
                                  bool relu) {
  at::Tensor y = at::batch_norm(f, weight, bias, running_mean, running_var, /*training=*/true,
                                momentum, eps, /*cudnn_enabled=*/false);
  // batch_norm's backward reads its input, not its output.
  return relu ? y.relu_() : y;
}

}  // namespace

bool StartKernelMap(const KernelMapInputs& inputs, KernelMap* map) {
  const at::Tensor& in_keys = inputs.in_device->keys;
  map->begin.assign(inputs.offsets.size() + 1, 0);
  if (in_keys.size(0) > 0 && inputs.out_device->keys.size(0) > 0) return true;
  map->in_rows = at::empty({0}, in_keys.options().dtype(at::kInt));
  map->out_rows = at::empty({0}, in_keys.options().dtype(at::kInt));
  return false;
}

const Backend& GenericBackend() {
  static const Backend backend{BackendKind::kGeneric,
                               "generic",
                               &RunsOn,
                               /*builds_from_device_keys=*/true,
                               &BuildKernelMapEntry,
                               &ConvForwardEntry,
                               &ConvBackwardEntry,
                               &MaxPoolForwardEntry,
                               &MaxPoolBackwardEntry,
                               &WindowSumForwardEntry,
                               &WindowSumBackwardEntry,
                               &BatchNormTrainingEntry,
                               /*takes_half_inputs=*/[](at::ScalarType, bool) { return true; }};
  return backend;
}

}  // namespace trainsup::sparse::generic
