// A step's input set is made where the model is (issue 45). On a backend
// that builds kernel maps from device keys (the generic backend here, on
// the CPU; the cuda backend on a GPU), the coordinate manager packs,
// checks and sorts Assemble's coordinates on the model's device, and a
// MinkUNet14 training step through them (forward, loss, backward) never
// asks for a host copy of any set. On a GPU, Assemble moves the
// coordinates to the device for that; here the device is the CPU, so this
// test shows the step needs no host copy, not the move itself (which only
// a GPU run shows).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "sparse/backend.h"
#include "sparse/coordinate_manager.h"
#include "sparse/minkunet.h"
#include "tests/worker/split/step_test_util.h"
#include "worker/split/split.h"
#include "worker/split/step.h"

namespace trainsup::worker {
namespace {

TEST(StepOnDeviceKeys, TheInputSetIsMadeOnTheModelsDeviceAndNeverCopiedBack) {
  const sparse::BackendGuard backend(sparse::BackendKind::kGeneric);
  sparse::MinkUNet model = QuarterMinkUNet14Float64();
  model->train();
  const Batch batch = SyntheticBatch(2, 0.1);
  Group group;
  for (int k = 0; k < 2; ++k) {
    const VoxelScene& s = batch.scenes[k];
    group.push_back(WholeScene(
        k, SceneView{s.xyz.data(), static_cast<int64_t>(s.labels.size()), s.labelled.data()}));
  }
  GroupTensors t = Assemble(batch, group, kChannels, at::kDouble);
  const sparse::CoordinateManager& manager = *t.input.manager();
  EXPECT_EQ(manager.stats().device_inputs, 1);
  const at::Tensor logits = model->forward(t.input).features();
  torch::nll_loss(torch::log_softmax(logits, 1), t.labels, {}, at::Reduction::Mean, -1).backward();
  EXPECT_GT(manager.stats().device_downsamples, 0);
  EXPECT_EQ(manager.stats().host_copies, 0) << "a set's host fields were asked for";
  int64_t with_gradient = 0;
  for (const at::Tensor& p : model->parameters()) with_gradient += p.grad().defined() ? 1 : 0;
  EXPECT_EQ(with_gradient, static_cast<int64_t>(model->parameters().size()));
}

}  // namespace
}  // namespace trainsup::worker
