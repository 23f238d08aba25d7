// MinkUNet plans: parameter counts of the reference architectures, shapes,
// initialisation, and a training step.
#include "sparse/minkunet.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sparse/quantize.h"
#include "sparse/scene.h"

namespace trainsup::sparse {
namespace {

// Counted from MinkowskiEngine's examples/minkunet.py plans (in 3, out 20;
// convolutions without bias but the final one; BatchNorm weight and bias).
TEST(MinkUNet, ParameterCountsMatchTheReferencePlans) {
  EXPECT_EQ(MinkUNet(MinkUNetPlan(14, 3, 20))->NumParameters(), 11580852);
  EXPECT_EQ(MinkUNet(MinkUNetPlan(18, 3, 20))->NumParameters(), 21704244);
  EXPECT_EQ(MinkUNet(MinkUNetPlan(34, 3, 20))->NumParameters(), 37856052);
  EXPECT_EQ(MinkUNet(MinkUNetPlan(50, 3, 20))->NumParameters(), 31763444);
  EXPECT_THROW(MinkUNetPlan(15, 3, 20), c10::Error);
}

TEST(MinkUNet, SegmentsEveryVoxelAndTrains) {
  torch::manual_seed(0);
  SceneOptions o = ScenePreset("small", 2);
  o.num_points = 20000;
  Scene s = GenerateScene(o);
  at::Tensor p = at::from_blob(s.points.data(), {s.size(), 3}, at::kFloat).clone();
  at::Tensor c = at::from_blob(s.colors.data(), {s.size(), 3}, at::kFloat).clone();
  at::Tensor l = at::from_blob(s.labels.data(), {s.size()}, at::kInt).to(at::kLong);
  Quantized q = Quantize(p, 0.05, c, l);
  at::Tensor coords = at::cat({at::zeros({q.coordinates.size(0), 1}, at::kInt), q.coordinates}, 1);
  SparseTensor x(q.features, coords);
  MinkUNet net(MinkUNetPlan(14, 3, kNumSceneClasses));
  net->train();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  float first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    sgd.zero_grad();
    SparseTensor y = net->forward(x);
    ASSERT_EQ(y.set_id(), x.set_id());
    ASSERT_EQ(y.channels(), kNumSceneClasses);
    at::Tensor loss = at::cross_entropy_loss(y.F(), q.labels);
    loss.backward();
    sgd.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  EXPECT_LT(last, first) << "loss did not go down on one repeated batch";
  EXPECT_THROW(net->forward(x.WithFeatures(at::zeros({x.size(), 4}))), c10::Error);
}

TEST(MinkUNet, CheckpointingGivesTheSameStep) {
  SceneOptions o = ScenePreset("small", 9);
  o.num_points = 6000;
  Scene s = GenerateScene(o);
  at::Tensor p = at::from_blob(s.points.data(), {s.size(), 3}, at::kFloat).to(at::kDouble);
  at::Tensor c = at::from_blob(s.colors.data(), {s.size(), 3}, at::kFloat).to(at::kDouble);
  at::Tensor l = at::from_blob(s.labels.data(), {s.size()}, at::kInt).to(at::kLong);
  Quantized q = Quantize(p, 0.08, c, l);
  at::Tensor coords = at::cat({at::zeros({q.coordinates.size(0), 1}, at::kInt), q.coordinates}, 1);
  auto step = [&](bool checkpointing) {
    torch::manual_seed(4);
    MinkUNet net(MinkUNetPlan(14, 3, kNumSceneClasses));
    net->to(torch::kDouble);
    net->train();
    if (checkpointing) EXPECT_EQ(EnableGradientCheckpointing(*net), 12);
    SparseTensor y = net->forward(SparseTensor(q.features, coords));
    at::cross_entropy_loss(y.F(), q.labels).backward();
    std::vector<at::Tensor> out = {y.F().detach()};
    for (const auto& t : net->parameters()) out.push_back(t.grad());
    for (const auto& t : net->buffers()) out.push_back(t.clone());
    return out;
  };
  auto plain = step(false), checkpointed = step(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(at::allclose(plain[i], checkpointed[i], 1e-9, 1e-11)) << "tensor " << i;
  }
}

}  // namespace
}  // namespace trainsup::sparse
