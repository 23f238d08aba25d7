// The CUDA backend's steps through the host launcher (host_launcher.h),
// beyond what the cross-backend test compares: what a map build uploads,
// and the measured choice of the convolutions' dataflow.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "sparse/backend.h"
#include "sparse/cuda/steps.h"
#include "sparse/determinism.h"
#include "sparse/ops.h"
#include "tests/sparse/host_launcher.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::CudaSettingOnHost;
using testing::CudaStepsOnHost;
using testing::ErrorMessage;
using testing::MakeRandomInput;

// (Not "Cuda*": that name pattern is the GPU label's, CMakeLists.txt.)
// Issue 45: a map build uploads its small host tables (the offsets' shifts
// and `begin`), and the map keeps `begin` on its device; convolutions on
// it, forward and backward, upload nothing (on a GPU each upload would be
// a copy, and the old pageable ones made the host wait for the stream).
TEST(StepsOnHost, ConvolutionsUploadNothingAfterTheMapBuild) {
  BackendTableGuard table(&CudaStepsOnHost());
  auto in = MakeRandomInput(2, 9, 0.3, 4, at::kFloat, 3, 0, /*shuffle=*/false);
  at::Tensor f = in.features.clone().requires_grad_(true);
  at::Tensor w = at::randn({27, 4, 5}).requires_grad_(true);
  SparseTensor x(f, in.coordinates);
  const int64_t before = cuda::HostUploads();
  SparseTensor y = Conv(x, w, at::Tensor(), {3, 2, 1});
  const int64_t built = cuda::HostUploads();
  EXPECT_EQ(built - before, 3) << "the shifts, the packed deltas and begin";
  const std::shared_ptr<const KernelMap> map =
      x.manager()->GetKernelMap(x.set_id(), y.set_id(), 3, 1);
  ASSERT_TRUE(map->device_begin.defined());
  const at::Tensor device_begin = map->device_begin.to(at::kCPU);
  EXPECT_EQ(std::vector<int64_t>(device_begin.data_ptr<int64_t>(),
                                 device_begin.data_ptr<int64_t>() + device_begin.numel()),
            map->begin);
  SparseTensor again = Conv(x, w, at::Tensor(), {3, 2, 1});  // the cached map
  (y.F().sum() + again.F().square().sum()).backward();
  EXPECT_EQ(cuda::HostUploads(), built);
  ASSERT_TRUE(f.grad().defined());
  EXPECT_GT(f.grad().abs().sum().item<double>(), 0.0);
}

// kMeasured times both dataflows at a layer shape's first use and keeps
// the faster; deterministic mode takes gather-GEMM without timing; the
// environment's names parse, and others are refused by name.
TEST(StepsOnHost, TheMeasuredDataflowIsChosenOncePerShapeAndNamed) {
  BackendTableGuard table(&CudaSettingOnHost());
  const cuda::Dataflow previous = cuda::SetDataflow(cuda::Dataflow::kMeasured);
  auto in = MakeRandomInput(2, 9, 0.3, 6, at::kFloat, 8, 0, /*shuffle=*/false);
  const at::Tensor w = at::randn({27, 6, 7});
  const size_t before = cuda::DataflowChoices().size();
  {
    DeterministicGuard deterministic(true);
    Conv(SparseTensor(in.features, in.coordinates), w, at::Tensor(), {3, 1, 1});
  }
  EXPECT_EQ(cuda::DataflowChoices().size(), before) << "deterministic mode timed a dataflow";
  at::Tensor f = in.features.clone().requires_grad_(true);
  SparseTensor x(f, in.coordinates);
  SparseTensor y = Conv(x, w, at::Tensor(), {3, 1, 1});
  y.F().square().sum().backward();
  const std::vector<std::string> choices = cuda::DataflowChoices();
  ASSERT_EQ(choices.size(), before + 2) << "one forward and one backward shape";
  bool forward = false, backward = false;
  for (const std::string& line : choices) {
    forward |= line.rfind("forward 6->7 k27", 0) == 0;
    backward |= line.rfind("backward 6->7 k27", 0) == 0;
  }
  EXPECT_TRUE(forward && backward) << choices.back();
  Conv(x, w, at::Tensor(), {3, 1, 1});  // the same shape: no second timing
  EXPECT_EQ(cuda::DataflowChoices().size(), before + 2);
  cuda::SetDataflow(previous);
  EXPECT_EQ(cuda::DataflowFromString(nullptr), cuda::Dataflow::kMeasured);
  EXPECT_EQ(cuda::DataflowFromString("fused"), cuda::Dataflow::kFused);
  EXPECT_EQ(cuda::DataflowFromString("gemm"), cuda::Dataflow::kGatherGemm);
  EXPECT_EQ(ErrorMessage([] { cuda::DataflowFromString("tiled"); }),
            "TRAINSUP_CUDA_DATAFLOW: unknown dataflow 'tiled' (expected gemm, fused or measured)");
}

}  // namespace
}  // namespace trainsup::sparse
