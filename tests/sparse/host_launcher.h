// The CUDA backend's table over a host launcher, for the tests of
// sparse_backend_tests (backend_test.cc's cross-backend targets,
// steps_on_host_test.cc): its ops' element code run on the CPU.
#ifndef TRAINSUP_TESTS_SPARSE_HOST_LAUNCHER_H_
#define TRAINSUP_TESTS_SPARSE_HOST_LAUNCHER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
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
  static std::vector<int64_t> Shuffled(int64_t n, uint64_t seed) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    return order;
  }
  template <typename Op>
  static void RunAll(const Op& op) {
    if constexpr (cuda::IsTiled<Op>::value) {
      RunTiles(op);
    } else {
      for (int64_t i : Shuffled(op.size(), static_cast<uint64_t>(op.size()))) op(i);
    }
  }
  // A tiled op as kernel_bodies.h runs it: the tiles in a shuffled order,
  // each a block whose phases run their threads one after another (each
  // phase in a shuffled order), with the block's shared memory and each
  // thread's registers.
  template <typename Op>
  static void RunTiles(const Op& op) {
    auto shared = std::make_unique<typename Op::Shared>();
    std::vector<typename Op::Thread> threads(Op::kThreads);
    const std::vector<int64_t> tids = Shuffled(Op::kThreads, 1);
    const std::vector<int64_t> other = Shuffled(Op::kThreads, 2);
    for (int64_t t : Shuffled(op.tiles(), static_cast<uint64_t>(op.tiles()))) {
      for (int64_t tid : tids) op.Start(t, static_cast<int>(tid), threads[tid]);
      for (int64_t k = 0; k < op.offsets(); ++k) {
        bool any = false;
        for (int64_t tid : other) any |= op.Index(t, k, static_cast<int>(tid), *shared);
        if (!any) continue;
        const int64_t chunks = op.chunks(t);
        for (int64_t c = 0; c < chunks; ++c) {
          for (int64_t tid : tids) op.Load(t, k, c, static_cast<int>(tid), *shared);
          for (int64_t tid : other) op.Compute(t, c, static_cast<int>(tid), *shared, threads[tid]);
        }
      }
      for (int64_t tid : other) op.Store(t, static_cast<int>(tid), threads[tid]);
    }
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
