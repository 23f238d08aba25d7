// The CUDA backend's table over a host launcher, for the tests of
// sparse_backend_tests (backend_test.cc's cross-backend targets,
// steps_on_host_test.cc): its ops' element code run on the CPU.
#ifndef TRAINSUP_TESTS_SPARSE_HOST_LAUNCHER_H_
#define TRAINSUP_TESTS_SPARSE_HOST_LAUNCHER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "sparse/backend.h"
#include "sparse/cuda/steps.h"

namespace trainsup::sparse::testing {

// The CUDA backend's steps (sparse/cuda/steps.h) with their ops run on the
// host: every element of an op, one after another in a shuffled order (a
// GPU runs them in no set order; the results must not depend on it). This
// is the CUDA backend's code but for the kernel launch (kernels.cu) and
// the device: it is how its arithmetic and indexing are tested on a
// machine without a GPU, on every build.
class HostLauncher final : public cuda::Launcher {
 public:
  void OnDevice(c10::Device, const std::function<void()>& body) const override { body(); }
  void Synchronize() const override {}
#define TRAINSUP_HOST_RUN(Op) \
  void Run(const cuda::Op& op, const char*) const override { RunAll(op); }
  TRAINSUP_CUDA_OPS(TRAINSUP_HOST_RUN)
#undef TRAINSUP_HOST_RUN

 private:
  template <typename Op>
  static void RunAll(const Op& op) {
    std::vector<int64_t> order(static_cast<size_t>(op.size()));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(order.size()));
    for (int64_t i : order) op(i);
  }
};

inline const cuda::Launcher& TheHostLauncher() {
  static const HostLauncher launcher;
  return launcher;
}

inline cuda::Dataflow GatherGemm() { return cuda::Dataflow::kGatherGemm; }
inline cuda::Dataflow Fused() { return cuda::Dataflow::kFused; }
inline bool OnHost(c10::DeviceType type) { return type == c10::DeviceType::CPU; }

// CudaBackend()'s table (cuda::StepsTable) over the host launcher, its
// convolutions pinned to each dataflow (cuda_steps_on_host: gather-GEMM),
// and as CudaBackend() has it (the process's setting).
inline const Backend& CudaStepsOnHost() {
  static const Backend backend =
      cuda::StepsTable<&TheHostLauncher, &GatherGemm>("cuda_steps_on_host", &OnHost);
  return backend;
}
inline const Backend& CudaFusedOnHost() {
  static const Backend backend =
      cuda::StepsTable<&TheHostLauncher, &Fused>("cuda_fused_on_host", &OnHost);
  return backend;
}
inline const Backend& CudaSettingOnHost() {
  static const Backend backend =
      cuda::StepsTable<&TheHostLauncher>("cuda_setting_on_host", &OnHost);
  return backend;
}

}  // namespace trainsup::sparse::testing

#endif  // TRAINSUP_TESTS_SPARSE_HOST_LAUNCHER_H_
