#include "sparse/cpu/backend.h"

#include <ATen/ATen.h>

#include "sparse/cpu/batch_norm.h"
#include "sparse/cpu/kernel_map.h"
#include "sparse/cpu/kernels.h"

namespace trainsup::sparse::cpu {
namespace {

bool RunsOn(c10::DeviceType type) { return type == c10::DeviceType::CPU; }

PairLists View(const PairView& p) {
  PairLists lists;
  lists.src = p.src.data_ptr<int32_t>();
  lists.dst = p.dst.data_ptr<int32_t>();
  lists.begin = p.begin->data();
  lists.volume = p.volume();
  lists.identity_offset = p.identity_offset;
  lists.sorted = p.sorted;
  return lists;
}

template <typename T>
T* DataOrNull(at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// bfloat16 convolutions, taken where the CPU has the bf16 kernels
// (TakesHalfInputs): on them for sorted pairs, else converted to float32
// here and back.
const uint16_t* Bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}
uint16_t* MutableBits(at::Tensor& t) {
  return t.defined() ? reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()) : nullptr;
}
at::Tensor ToBf16(const at::Tensor& t) { return t.defined() ? t.to(at::kBFloat16) : t; }

bool TakesHalfInputs(at::ScalarType type, bool convolution) {
  return convolution && type == at::kBFloat16 && Bf16KernelsActive();
}

// The bias is added where the kernels finish each row range: the bf16
// tiles add it to the float32 sums before rounding; the float kernels'
// sums are final in their own type, so it is added to them in place.
at::Tensor ConvForwardEntry(const at::Tensor& f, const at::Tensor& w, const at::Tensor& bias,
                            const PairView& pairs, int64_t num_out) {
  if (f.scalar_type() == at::kBFloat16) {
    if (!pairs.sorted)
      return ToBf16(ConvForwardEntry(f.to(at::kFloat), w.to(at::kFloat), bias, pairs, num_out));
    at::Tensor out = at::empty({num_out, w.size(2)}, f.options());
    ConvForwardBf16(Bits(f), w.size(1), Bits(w), w.size(2), View(pairs), MutableBits(out), num_out,
                    bias.defined() ? bias.data_ptr<float>() : nullptr);
    return out;
  }
  at::Tensor out = at::empty({num_out, w.size(2)}, f.options());
  AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_conv_forward", [&] {
    ConvForward<scalar_t>(f.data_ptr<scalar_t>(), f.size(0), w.size(1), w.data_ptr<scalar_t>(),
                          w.size(2), View(pairs), out.data_ptr<scalar_t>(), num_out);
  });
  if (bias.defined()) out.add_(bias);
  return out;
}

void ConvBackwardEntry(const at::Tensor& f, const at::Tensor& w, const PairView& pairs,
                       const at::Tensor& grad_out, bool need_input, bool need_weight,
                       at::Tensor* grad_in, at::Tensor* grad_weight) {
  if (f.scalar_type() == at::kBFloat16 && !pairs.sorted) {
    ConvBackwardEntry(f.to(at::kFloat), w.to(at::kFloat), pairs, grad_out.to(at::kFloat),
                      need_input, need_weight, grad_in, grad_weight);
    *grad_in = ToBf16(*grad_in);
    *grad_weight = ToBf16(*grad_weight);
    return;
  }
  *grad_in = need_input ? at::empty_like(f) : at::Tensor();
  *grad_weight = need_weight ? at::empty_like(w) : at::Tensor();
  if (!need_input && !need_weight) return;
  if (f.scalar_type() == at::kBFloat16) {
    ConvBackwardBf16(Bits(f), f.size(0), w.size(1), Bits(w), w.size(2), View(pairs), Bits(grad_out),
                     MutableBits(*grad_in), MutableBits(*grad_weight));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_conv_backward", [&] {
    ConvBackward<scalar_t>(f.data_ptr<scalar_t>(), f.size(0), w.size(1), w.data_ptr<scalar_t>(),
                           w.size(2), View(pairs), grad_out.data_ptr<scalar_t>(), grad_out.size(0),
                           DataOrNull<scalar_t>(*grad_in), DataOrNull<scalar_t>(*grad_weight));
  });
}

void MaxPoolForwardEntry(const at::Tensor& f, const PairView& pairs, int64_t num_out,
                         at::Tensor* out, at::Tensor* argmax) {
  *out = at::empty({num_out, f.size(1)}, f.options());
  *argmax = at::empty({num_out, f.size(1)}, f.options().dtype(at::kInt));
  AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_max_pool_forward", [&] {
    MaxPoolForward<scalar_t>(f.data_ptr<scalar_t>(), f.size(1), View(pairs),
                             out->data_ptr<scalar_t>(), argmax->data_ptr<int32_t>(), num_out);
  });
}

at::Tensor MaxPoolBackwardEntry(const at::Tensor& grad_out, const at::Tensor& argmax,
                                const PairView& pairs, const at::Tensor& order, int64_t num_in) {
  (void)pairs;
  at::Tensor grad_in = at::zeros({num_in, grad_out.size(1)}, grad_out.options());
  AT_DISPATCH_FLOATING_TYPES(grad_out.scalar_type(), "sparse_max_pool_backward", [&] {
    MaxPoolBackward<scalar_t>(grad_out.data_ptr<scalar_t>(), argmax.data_ptr<int32_t>(),
                              grad_out.size(0), grad_out.size(1),
                              order.defined() ? order.data_ptr<int64_t>() : nullptr,
                              grad_in.data_ptr<scalar_t>());
  });
  return grad_in;
}

at::Tensor WindowSumForwardEntry(const at::Tensor& f, const PairView& pairs,
                                 const at::Tensor& inv_divisor, int64_t num_out) {
  at::Tensor out = at::empty({num_out, f.size(1)}, f.options());
  AT_DISPATCH_FLOATING_TYPES(f.scalar_type(), "sparse_window_sum_forward", [&] {
    WindowSumForward<scalar_t>(f.data_ptr<scalar_t>(), f.size(1), View(pairs),
                               inv_divisor.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), num_out);
  });
  return out;
}

at::Tensor WindowSumBackwardEntry(const at::Tensor& grad_out, const PairView& pairs,
                                  const at::Tensor& inv_divisor, int64_t num_in) {
  at::Tensor grad_in = at::empty({num_in, grad_out.size(1)}, grad_out.options());
  AT_DISPATCH_FLOATING_TYPES(grad_out.scalar_type(), "sparse_window_sum_backward", [&] {
    WindowSumBackward<scalar_t>(grad_out.data_ptr<scalar_t>(), grad_out.size(1), View(pairs),
                                inv_divisor.data_ptr<scalar_t>(), grad_in.data_ptr<scalar_t>(),
                                num_in);
  });
  return grad_in;
}

}  // namespace

const Backend& CpuBackend() {
  static const Backend backend{BackendKind::kCpu,
                               "cpu",
                               &RunsOn,
                               /*builds_from_device_keys=*/false,
                               &BuildKernelMap,
                               &ConvForwardEntry,
                               &ConvBackwardEntry,
                               &MaxPoolForwardEntry,
                               &MaxPoolBackwardEntry,
                               &WindowSumForwardEntry,
                               &WindowSumBackwardEntry,
                               &BatchNormTrainingRows,
                               &TakesHalfInputs};
  return backend;
}

}  // namespace trainsup::sparse::cpu
