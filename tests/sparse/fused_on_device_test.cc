// The CUDA backend's fused dataflow on a GPU against the same steps run by
// the host launcher (host_launcher.h): bit for bit. Labelled gpu (the
// name's Cuda*); it skips itself without a device.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "sparse/backend.h"
#include "sparse/cuda/steps.h"
#include "sparse/memory.h"
#include "sparse/ops.h"
#include "tests/sparse/host_launcher.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::MakeRandomInput;

// A 3x3x3 convolution 32 -> 64, a strided 2x2x2 one 64 -> 96 and its
// transpose 96 -> 64, as MinkUNet's, on `device` with the backend `table`
// (null: the cuda backend, on the process's dataflow setting), features of
// `type`; the loss is sum(y * r) for fixed r, so the output gradient is r
// exactly on every device. Returns the outputs and every gradient, on the
// CPU.
std::vector<at::Tensor> FusedLayers(c10::Device device, const Backend* table, at::ScalarType type) {
  std::optional<BackendTableGuard> guard;
  std::optional<BackendGuard> cuda;
  if (table != nullptr) {
    guard.emplace(table);
  } else {
    cuda.emplace(BackendKind::kCuda);  // CUDA's default is the generic backend
  }
  EXPECT_STREQ(BackendFor(device).name, table != nullptr ? table->name : "cuda");
  auto in = MakeRandomInput(2, 24, 0.2, 32, at::kFloat, 17, 0, /*shuffle=*/false);
  const at::ScalarType master = type == at::kDouble ? at::kDouble : at::kFloat;
  at::manual_seed(5);
  std::vector<at::Tensor> w = {at::randn({27, 32, 64}, master), at::randn({8, 64, 96}, master),
                               at::randn({8, 96, 64}, master)};
  for (at::Tensor& t : w) t = t.mul_(0.1).to(device).requires_grad_(true);
  at::Tensor f = in.features.to(type).to(device).requires_grad_(true);
  SparseTensor x(f, in.coordinates.to(device));
  SparseTensor y1 = Conv(x, w[0], at::Tensor(), {3, 1, 1});
  SparseTensor y2 = Conv(y1, w[1], at::Tensor(), {2, 2, 1});
  SparseTensor y3 = ConvTranspose(y2, w[2], at::Tensor(), {2, 2, 1});
  const at::Tensor r = at::randn(y3.F().sizes(), master).to(type).to(master).to(device);
  (y3.F().to(master) * r).sum().backward();
  std::vector<at::Tensor> out = {y1.F(), y2.F(), y3.F(), f.grad()};
  for (const at::Tensor& t : w) out.push_back(t.grad());
  for (at::Tensor& t : out) t = t.detach().cpu().contiguous();
  return out;
}

// Issue 45: the fused dataflow's ops (the tiled implicit GEMM and weight
// gradient, the map build, the inverse tables) give on a GPU, bit for bit,
// what the host launcher gives for the same operands. Their sums run in a
// fixed order with one fused multiply-add per term, IEEE on both sides,
// and nothing is built with fast math; so a difference is a race or a
// launch error (a missing barrier, a tile not run). About 5,500 rows: a
// hundred tiles per op and more. float32, float64 and both half formats.
TEST(CudaDeterminism, FusedOpsOnTheDeviceAreTheHostLaunchersBitForBit) {
  if (!CudaDeviceAvailable() || FindBackend(BackendKind::kCuda) == nullptr) {
    GTEST_SKIP() << "no CUDA device (or a build without the cuda backend)";
  }
  const cuda::DataflowGuard fused(cuda::Dataflow::kFused);
  const std::vector<std::string> names = {"y1",      "y2",      "y3",     "grad f",
                                          "grad w1", "grad w2", "grad w3"};
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(type));
    const std::vector<at::Tensor> host =
        FusedLayers(c10::Device(c10::DeviceType::CPU), &testing::CudaFusedOnHost(), type);
    const std::vector<at::Tensor> gpu =
        FusedLayers(c10::Device(c10::DeviceType::CUDA, 0), nullptr, type);
    ASSERT_EQ(host.size(), gpu.size());
    for (size_t i = 0; i < host.size(); ++i) {
      ASSERT_EQ(host[i].sizes(), gpu[i].sizes()) << names[i];
      EXPECT_TRUE(at::equal(host[i].flatten().view(at::kByte), gpu[i].flatten().view(at::kByte)))
          << names[i] << ": largest difference "
          << (host[i].to(at::kDouble) - gpu[i].to(at::kDouble)).abs().max().item<double>();
    }
  }
}

}  // namespace
}  // namespace trainsup::sparse
