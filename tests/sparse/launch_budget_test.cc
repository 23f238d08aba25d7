// Issue 45's launch budget on a GPU, counted by the profiler: a
// convolution layer with its BatchNorm and ReLU, on the cuda backend's
// fused dataflow with its map warm, launches at most 10 kernels a training
// step (forward and backward), ATen's own launches included; a
// convolution's bias launches nothing of its own. The host
// count of the steps' ops is StepsOnHost.AConvolutionLayerIsTenOpsAStepOnAWarmMap;
// this test is what only a device shows (fills, casts, copies that ATen
// would launch between them). It skips without a CUDA device, and so has
// never run on the machines it was written on.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#if __has_include(<kineto/ActivityType.h>)
#include <kineto/ActivityType.h>
#endif

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sparse/backend.h"
#include "sparse/cuda/steps.h"
#include "sparse/memory.h"
#include "sparse/ops.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::MakeRandomInput;

// Kineto's activity types of launches (libkineto::ActivityType, whose
// values are fixed: traces serialise them): copies, memsets, kernels.
// Other device-side events, such as the GPU_USER_ANNOTATION (2) that
// Kineto adds for each user scope that launched a kernel ("conv 3x3x3",
// "batch norm", ...), are not launches.
constexpr uint8_t kGpuMemcpy = 3, kGpuMemset = 4, kConcurrentKernel = 5;
#if __has_include(<kineto/ActivityType.h>)
static_assert(static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMCPY) == kGpuMemcpy);
static_assert(static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMSET) == kGpuMemset);
static_assert(static_cast<uint8_t>(libkineto::ActivityType::CONCURRENT_KERNEL) ==
              kConcurrentKernel);
#endif

// The names of the launches (kernels, memsets, copies) that Kineto
// records on the device while run() runs, the device synchronised at the
// end.
std::vector<std::string> DeviceEvents(const std::function<void()>& run) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  run();
  torch::cuda::synchronize();
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  std::vector<std::string> names;
  for (const profiler::KinetoEvent& e : result->events()) {
    const uint8_t type = e.activityType();
    const bool launch = type == kGpuMemcpy || type == kGpuMemset || type == kConcurrentKernel;
    if (e.deviceType() == c10::DeviceType::CUDA && launch) names.push_back(e.name());
  }
  return names;
}

void Print(const char* what, const std::vector<std::string>& names) {
  std::printf("%s: %zu device events\n", what, names.size());
  for (const std::string& n : names) std::printf("  %s\n", n.c_str());
}

// The layer's launches are those of a step through it less those of the
// same loss on a leaf of the layer's output shape: the loss's own kernels
// (the product, the sum, their backward) are the same in both.
// The cuda backend on its fused dataflow, float32 tensors on the GPU;
// skipped without a device.
class CudaLaunchBudget : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable() || FindBackend(BackendKind::kCuda) == nullptr) {
      GTEST_SKIP() << "no CUDA device (or a build without the cuda backend)";
    }
    backend_.emplace(BackendKind::kCuda);
    fused_.emplace(cuda::Dataflow::kFused);
  }
  const c10::Device gpu{c10::DeviceType::CUDA, 0};
  const at::TensorOptions o = at::TensorOptions().dtype(at::kFloat).device(gpu);

 private:
  std::optional<BackendGuard> backend_;
  std::optional<cuda::DataflowGuard> fused_;
};

TEST_F(CudaLaunchBudget, AConvolutionLayerIsAtMostTenLaunchesAStep) {
  auto in = MakeRandomInput(2, 24, 0.3, 16, at::kFloat, 17, 0, /*shuffle=*/false);
  at::Tensor f = in.features.to(gpu).requires_grad_(true);
  at::Tensor w = (at::randn({27, 16, 16}, o) * 0.1).requires_grad_(true);
  at::Tensor bw = at::ones({16}, o).requires_grad_(true);
  at::Tensor bb = at::zeros({16}, o).requires_grad_(true);
  at::Tensor rm = at::zeros({16}, o), rv = at::ones({16}, o);
  const at::Tensor r = at::randn({f.size(0), 16}, o);
  at::Tensor leaf = at::randn({f.size(0), 16}, o).requires_grad_(true);
  SparseTensor x(f, in.coordinates);
  // Gradients are dropped after each step, so that the next one's are
  // stolen by AccumulateGrad, not added (a launch of its own).
  auto drop = [](std::vector<at::Tensor*> ts) {
    for (at::Tensor* t : ts) t->mutable_grad().reset();
  };
  auto layer_step = [&] {
    SparseTensor y = Conv(x, w, at::Tensor(), {3, 1, 1});
    SparseTensor z = BatchNorm(y, bw, bb, rm, rv, /*training=*/true, 0.1, 1e-5, /*relu=*/true);
    (z.F() * r).sum().backward();
    drop({&f, &w, &bw, &bb});
  };
  auto loss_step = [&] {
    (leaf * r).sum().backward();
    drop({&leaf});
  };
  for (int i = 0; i < 2; ++i) {  // the map, its inverse tables, cuBLAS's handles
    layer_step();
    loss_step();
  }
  torch::cuda::synchronize();
  const std::vector<std::string> with_layer = DeviceEvents(layer_step);
  const std::vector<std::string> loss_only = DeviceEvents(loss_step);
  Print("a step through the layer", with_layer);
  Print("the loss alone", loss_only);
  ASSERT_GT(with_layer.size(), loss_only.size()) << "the profiler saw none of the layer's kernels";
  EXPECT_LE(with_layer.size() - loss_only.size(), 10u);
}

// The bias of a convolution costs no launch on the fused dataflow: it is
// added in the implicit GEMM's epilogue (StepsOnHost.
// AConvolutionsBiasIsAddedWhereItsSumsAreWritten counts the ops on the
// host; this counts what the device runs, ATen's launches included).
TEST_F(CudaLaunchBudget, AConvolutionsBiasAddsNoLaunch) {
  auto in = MakeRandomInput(2, 24, 0.3, 16, at::kFloat, 19, 0, /*shuffle=*/false);
  SparseTensor x(in.features.to(gpu), in.coordinates);
  const at::Tensor w = at::randn({1, 16, 70}, o), b = at::randn({70}, o);
  for (int i = 0; i < 2; ++i) {  // the map and its inverse table
    Conv(x, w, at::Tensor(), {1, 1, 1});
    Conv(x, w, b, {1, 1, 1});
  }
  torch::cuda::synchronize();
  const std::vector<std::string> plain = DeviceEvents([&] { Conv(x, w, at::Tensor(), {1, 1, 1}); });
  const std::vector<std::string> biased = DeviceEvents([&] { Conv(x, w, b, {1, 1, 1}); });
  Print("a 1x1x1 convolution", plain);
  Print("the same with a bias", biased);
  ASSERT_FALSE(plain.empty()) << "the profiler saw none of the convolution's kernels";
  EXPECT_EQ(biased.size(), plain.size());
}

}  // namespace
}  // namespace trainsup::sparse
