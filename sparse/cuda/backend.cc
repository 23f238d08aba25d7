#include "sparse/cuda/backend.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "sparse/cuda/kernels.h"
#include "sparse/cuda/steps.h"
#include "sparse/generic/backend.h"

namespace trainsup::sparse::cuda {
namespace {

// The steps' ops as kernels on LibTorch's current stream of the current
// device (the entries set it from their tensors).
class StreamLauncher final : public Launcher {
 public:
  void Run(const MapSearch& op, const char* what) const override { Check(Launch(op, S()), what); }
  void Run(const InvertPairs& op, const char* what) const override { Check(Launch(op, S()), what); }
  void Run(const GatherRows<float>& op, const char* what) const override {
    Check(Launch(op, S()), what);
  }
  void Run(const GatherRows<double>& op, const char* what) const override {
    Check(Launch(op, S()), what);
  }
  void Run(const ScatterSum<float>& op, const char* what) const override {
    Check(Launch(op, S()), what);
  }
  void Run(const ScatterSum<double>& op, const char* what) const override {
    Check(Launch(op, S()), what);
  }

 private:
  static cudaStream_t S() { return at::cuda::getCurrentCUDAStream().stream(); }
  static void Check(cudaError_t e, const char* what) {
    TORCH_CHECK(e == cudaSuccess, "CUDA backend, ", what, ": ", cudaGetErrorString(e));
  }
};

const StreamLauncher kLauncher;

bool RunsOn(c10::DeviceType type) { return type == c10::DeviceType::CUDA; }

void BuildKernelMapEntry(const KernelMapInputs& inputs, KernelMap* map) {
  const c10::cuda::CUDAGuard guard(inputs.device);
  BuildKernelMap(kLauncher, inputs, map);
}

at::Tensor ConvForwardEntry(const at::Tensor& f, const at::Tensor& w, const PairView& pairs,
                            int64_t num_out) {
  const c10::cuda::CUDAGuard guard(f.device());
  return ConvForward(kLauncher, f, w, pairs, num_out);
}

void ConvBackwardEntry(const at::Tensor& f, const at::Tensor& w, const PairView& pairs,
                       const at::Tensor& grad_out, bool need_input, bool need_weight,
                       at::Tensor* grad_in, at::Tensor* grad_weight) {
  const c10::cuda::CUDAGuard guard(f.device());
  ConvBackward(kLauncher, f, w, pairs, grad_out, need_input, need_weight, grad_in, grad_weight);
}

}  // namespace

const Backend& CudaBackend() {
  static const Backend backend = [] {
    Backend b = generic::GenericBackend();
    b.kind = BackendKind::kCuda;
    b.name = "cuda";
    b.runs_on = &RunsOn;
    b.builds_from_device_keys = true;
    b.build_kernel_map = &BuildKernelMapEntry;
    b.conv_forward = &ConvForwardEntry;
    b.conv_backward = &ConvBackwardEntry;
    return b;
  }();
  return backend;
}

}  // namespace trainsup::sparse::cuda
