#include "sparse/cuda/backend.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <functional>

#include "sparse/cuda/kernels.h"
#include "sparse/cuda/steps.h"

namespace trainsup::sparse::cuda {
namespace {

// The steps' ops as kernels on LibTorch's current stream of the current
// device, which OnDevice sets from the entries' tensors.
class StreamLauncher final : public Launcher {
 public:
  void OnDevice(c10::Device device, const std::function<void()>& body) const override {
    const c10::cuda::CUDAGuard guard(device);
    body();
  }
  void Synchronize() const override {
    Check(cudaStreamSynchronize(S()), "synchronising the stream");
  }
#define TRAINSUP_STREAM_RUN(Op) \
  void Run(const Op& op, const char* what) const override { Check(Launch(op, S()), what); }
  TRAINSUP_CUDA_OPS(TRAINSUP_STREAM_RUN)
#undef TRAINSUP_STREAM_RUN

 private:
  static cudaStream_t S() { return at::cuda::getCurrentCUDAStream().stream(); }
  static void Check(cudaError_t e, const char* what) {
    TORCH_CHECK(e == cudaSuccess, "CUDA backend, ", what, ": ", cudaGetErrorString(e));
  }
};

const Launcher& TheLauncher() {
  static const StreamLauncher launcher;
  return launcher;
}

bool RunsOn(c10::DeviceType type) { return type == c10::DeviceType::CUDA; }

}  // namespace

const Backend& CudaBackend() {
  static const Backend backend = StepsTable<&TheLauncher>("cuda", &RunsOn);
  return backend;
}

}  // namespace trainsup::sparse::cuda
