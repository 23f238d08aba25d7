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

}  // namespace
}  // namespace trainsup::sparse
