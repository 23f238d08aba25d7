// Modules, ResNet blocks, and the gradient-checkpointing checklist: every
// boundary must pass these.
#include "sparse/nn.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "sparse/determinism.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::MakeRandomInput;

// A block with dropout that counts how often its computation runs.
class CountingBlockImpl : public CheckpointableBlock {
 public:
  CountingBlockImpl(int64_t c, std::optional<double> momentum, bool track, double dropout)
      : dropout_(dropout) {
    conv = register_module("conv", ConvLayer(c, c, ConvOptions{3, 1, 1}));
    norm = register_module("norm", BatchNormLayer(c, 1e-5, momentum, track));
  }
  SparseTensor ForwardImpl(const SparseTensor& x, const SparseTensor*) override {
    ++calls;
    SparseTensor y = Relu(norm(conv(x)));
    return y.WithFeatures(at::dropout(y.F(), dropout_, is_training()) + x.F());
  }
  ConvLayer conv{nullptr};
  BatchNormLayer norm{nullptr};
  int calls = 0;

 private:
  double dropout_;
};
TORCH_MODULE(CountingBlock);

struct Net : torch::nn::Module {
  Net(std::optional<double> momentum, bool track, double dropout) {
    b1 = register_module("b1", CountingBlock(4, momentum, track, dropout));
    b2 = register_module("b2", BasicBlock(4, 6));
    b3 = register_module("b3", BottleneckBlock(6, 2));
  }
  SparseTensor forward(const SparseTensor& x) { return b3->forward(b2->forward(b1->forward(x))); }
  CountingBlock b1{nullptr};
  BasicBlock b2{nullptr};
  BottleneckBlock b3{nullptr};
};

struct StepResult {
  at::Tensor out, grad_input;
  std::vector<at::Tensor> grads, buffers;
};

// One training step's forward and backward of a fresh, seeded Net.
StepResult Step(bool checkpointing, std::optional<double> momentum, bool track, double dropout,
                const SparseTensor& x, int backwards = 1, int* calls = nullptr) {
  torch::manual_seed(3);
  Net net(momentum, track, dropout);
  net.to(torch::kDouble);
  net.train();
  if (checkpointing) EXPECT_EQ(EnableGradientCheckpointing(net), 3);
  at::Tensor f = x.F().clone().requires_grad_(true);
  torch::manual_seed(11);  // dropout's draws
  SparseTensor y = net.forward(x.WithFeatures(f));
  at::Tensor loss = y.F().square().sum();
  for (int i = 0; i < backwards; ++i) loss.backward({}, /*retain_graph=*/i + 1 < backwards);
  StepResult r{y.F().detach(), f.grad()};
  for (const auto& p : net.parameters()) r.grads.push_back(p.grad());
  for (const auto& b : net.buffers()) r.buffers.push_back(b.clone());
  if (calls != nullptr) *calls = net.b1->calls;
  return r;
}

void ExpectSame(const StepResult& a, const StepResult& b) {
  EXPECT_TRUE(at::allclose(a.out, b.out, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(a.grad_input, b.grad_input, 1e-12, 1e-12));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(at::allclose(a.grads[i], b.grads[i], 1e-12, 1e-12)) << "parameter " << i;
  }
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    EXPECT_TRUE(at::equal(a.buffers[i], b.buffers[i])) << "buffer " << i;
  }
}

SparseTensor Input() {
  auto in = MakeRandomInput(2, 7, 0.3, 4, at::kDouble, 21);
  return SparseTensor(in.features, in.coordinates);
}

TEST(GradientCheckpointing, EnablingReportsTheBoundariesAndStrictModeErrs) {
  for (int depth : {14, 18, 34}) {
    MinkUNet net(MinkUNetPlan(depth, 3, 5));
    const int64_t n = EnableGradientCheckpointing(*net);
    const auto& l = net->config().layers;
    // Every block and the four decoder stages.
    EXPECT_EQ(n, std::accumulate(l.begin(), l.end(), int64_t{0}) + 4) << "MinkUNet" << depth;
    EXPECT_TRUE(IsGradientCheckpointing(*net));
    EXPECT_EQ(DisableGradientCheckpointing(*net), n);
    EXPECT_FALSE(IsGradientCheckpointing(*net));
  }
  ConvLayer plain(3, 3, ConvOptions{3, 1, 1});
  EXPECT_THROW(EnableGradientCheckpointing(*plain), c10::Error);
  EXPECT_EQ(EnableGradientCheckpointing(*plain, /*strict=*/false), 0);
}

TEST(GradientCheckpointing, OutputsAndGradientsEqualTheOrdinaryPath) {
  SparseTensor x = Input();
  ExpectSame(Step(false, 0.1, true, 0.0, x), Step(true, 0.1, true, 0.0, x));
}

TEST(GradientCheckpointing, DecoderStageWithASkipMatchesTheOrdinaryPath) {
  SparseTensor fine = Input();
  const CoordinateSetId coarse_id = fine.manager()->Downsample(fine.set_id(), 2);
  at::Tensor coarse_features = at::randn({fine.manager()->Set(coarse_id).size(), 5}, at::kDouble);
  auto run = [&](bool checkpointing) {
    torch::manual_seed(5);
    UpStage stage(5, 3);
    stage->to(torch::kDouble);
    stage->train();
    stage->set_gradient_checkpointing(checkpointing);
    at::Tensor c = coarse_features.clone().requires_grad_(true);
    at::Tensor s = fine.F().clone().requires_grad_(true);
    SparseTensor skip = fine.WithFeatures(s);
    SparseTensor y = stage->forward(SparseTensor(c, coarse_id, fine.manager()), &skip);
    EXPECT_EQ(y.set_id(), fine.set_id());
    EXPECT_EQ(y.channels(), 3 + fine.channels());
    y.F().square().sum().backward();
    StepResult r{y.F().detach(), c.grad()};
    r.grads = {s.grad(), stage->conv->weight.grad(), stage->norm->weight.grad()};
    r.buffers = {stage->norm->running_mean.clone(), stage->norm->num_batches_tracked.clone()};
    return r;
  };
  ExpectSame(run(false), run(true));
}

TEST(GradientCheckpointing, RecomputesOnceInBackward) {
  SparseTensor x = Input();
  int plain = 0, checkpointed = 0;
  Step(false, 0.1, true, 0.0, x, 1, &plain);
  Step(true, 0.1, true, 0.0, x, 1, &checkpointed);
  EXPECT_EQ(plain, 1);
  EXPECT_EQ(checkpointed, 2);
}

TEST(GradientCheckpointing, BatchNormStatisticsAreUpdatedOnce) {
  SparseTensor x = Input();
  for (std::optional<double> momentum :
       {std::optional<double>(0.1), std::optional<double>(1.0), std::optional<double>()}) {
    SCOPED_TRACE(momentum ? std::to_string(*momentum) : "cumulative");
    StepResult a = Step(false, momentum, true, 0.0, x), b = Step(true, momentum, true, 0.0, x);
    ExpectSame(a, b);
    // num_batches_tracked of every BatchNorm is 1 after one step.
    torch::manual_seed(3);
    Net net(momentum, true, 0.0);
    int64_t trackers = 0;
    size_t i = 0;
    for (const auto& named : net.named_buffers()) {
      if (named.key().find("num_batches_tracked") != std::string::npos) {
        EXPECT_EQ(b.buffers[i].item<int64_t>(), 1) << named.key();
        ++trackers;
      }
      ++i;
    }
    EXPECT_GT(trackers, 0);
  }
  ExpectSame(Step(false, 0.1, false, 0.0, x), Step(true, 0.1, false, 0.0, x));  // no running stats
}

TEST(GradientCheckpointing, DropoutIsReplayed) {
  SparseTensor x = Input();
  ExpectSame(Step(false, 0.1, true, 0.3, x), Step(true, 0.1, true, 0.3, x));
}

TEST(GradientCheckpointing, AccumulationAndRetainedGraphBehaveTheSame) {
  SparseTensor x = Input();
  ExpectSame(Step(false, 0.1, true, 0.2, x, 2), Step(true, 0.1, true, 0.2, x, 2));
}

TEST(GradientCheckpointing, EvaluationAndNoGradNeverRecompute) {
  SparseTensor x = Input();
  torch::manual_seed(3);
  Net net(0.1, true, 0.0);
  net.to(torch::kDouble);
  EnableGradientCheckpointing(net);
  net.eval();
  net.forward(x.WithFeatures(x.F().clone().requires_grad_(true))).F().sum().backward();
  EXPECT_EQ(net.b1->calls, 1);
  net.train();
  {
    torch::NoGradGuard no_grad;
    net.forward(x);
  }
  EXPECT_EQ(net.b1->calls, 2);
}

TEST(GradientCheckpointing, RecomputationReusesTheKernelMaps) {
  SparseTensor x = Input();
  torch::manual_seed(3);
  Net net(0.1, true, 0.0);
  net.to(torch::kDouble);
  net.train();
  EnableGradientCheckpointing(net);
  SparseTensor y = net.forward(x.WithFeatures(x.F().clone().requires_grad_(true)));
  const int64_t builds = x.manager()->stats().kernel_map_builds;
  y.F().sum().backward();
  EXPECT_EQ(x.manager()->stats().kernel_map_builds, builds);
  EXPECT_GT(x.manager()->stats().kernel_map_hits, 0);
}

TEST(GradientCheckpointing, BatchNormStatisticsAreRestoredWhenRecomputationThrows) {
  class ThrowingBlockImpl : public CheckpointableBlock {
   public:
    ThrowingBlockImpl() { norm = register_module("norm", BatchNormLayer(4)); }
    SparseTensor ForwardImpl(const SparseTensor& x, const SparseTensor*) override {
      SparseTensor y = norm(x);
      if (++calls == 2) throw std::runtime_error("recomputation failed");
      return y;
    }
    BatchNormLayer norm{nullptr};
    int calls = 0;
  };
  auto block = std::make_shared<ThrowingBlockImpl>();
  block->to(torch::kDouble);
  block->train();
  block->set_gradient_checkpointing(true);
  SparseTensor x = Input();
  SparseTensor y = block->forward(x.WithFeatures(x.F().clone().requires_grad_(true)));
  at::Tensor mean = block->norm->running_mean.clone();
  EXPECT_THROW(y.F().sum().backward(), std::exception);
  EXPECT_TRUE(at::equal(block->norm->running_mean, mean));
  EXPECT_EQ(block->norm->num_batches_tracked.item<int64_t>(), 1);
}

TEST(Blocks, ProjectTheResidualWhenChannelsChange) {
  BasicBlock same(4, 4), wider(4, 8);
  EXPECT_TRUE(same->downsample_conv.is_empty());
  EXPECT_FALSE(wider->downsample_conv.is_empty());
  BottleneckBlock bottleneck(16, 4);  // 4 * expansion 4 = 16: no projection
  EXPECT_TRUE(bottleneck->downsample_conv.is_empty());
  BasicBlock strided(4, 4, /*stride=*/2);
  SparseTensor x = Input();
  x = x.WithFeatures(x.F().to(at::kFloat));
  SparseTensor y = strided->forward(x);
  EXPECT_EQ(y.stride(), 2);
  EXPECT_EQ(y.channels(), 4);
}

TEST(Conv, KaimingFanOutInitialisation) {
  torch::manual_seed(0);
  ConvLayer conv(64, 128, ConvOptions{3, 1, 1});
  const double std = conv->weight.std().item<double>();
  EXPECT_NEAR(std, std::sqrt(2.0 / (27 * 128)), 0.02 * std::sqrt(2.0 / (27 * 128)));
  BatchNormLayer bn(8);
  EXPECT_TRUE(at::equal(bn->weight, at::ones({8})));
  EXPECT_TRUE(at::equal(bn->bias, at::zeros({8})));
}

TEST(MemoryAccounting, CountsAndEnforcesABudget) {
  InstallCountingAllocator();
  ASSERT_TRUE(CountingAllocatorInstalled());
  const int64_t before = GetMemoryStats().current_bytes;
  {
    at::Tensor t = at::empty({1 << 20}, at::kFloat);
    EXPECT_GE(GetMemoryStats().current_bytes - before, 4 << 20);
    EXPECT_GE(GetMemoryStats().peak_bytes - before, 4 << 20);
  }
  EXPECT_EQ(GetMemoryStats().current_bytes, before);
  SetMemoryBudget(before + (1 << 20));
  const int64_t refused = GetMemoryStats().refused;  // other tests may have had some
  EXPECT_THROW(at::empty({1 << 20}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(GetMemoryStats().refused, refused + 1);
  SetMemoryBudget(0);
  at::Tensor ok = at::empty({1 << 20}, at::kFloat);
  EXPECT_EQ(ok.numel(), 1 << 20);
  // A failed allocation leaves the counters as they were.
  const int64_t current = GetMemoryStats().current_bytes;
  EXPECT_THROW(at::empty({int64_t{1} << 50}, at::kByte), c10::Error);
  EXPECT_EQ(GetMemoryStats().current_bytes, current);
  // The block cache hands a freed large block out again for the same size.
  SetBlockCacheLimit(int64_t{64} << 20);
  void* first;
  {
    at::Tensor big = at::empty({3 << 20}, at::kFloat);
    first = big.data_ptr();
  }
  EXPECT_EQ(GetMemoryStats().cached_bytes, int64_t{12} << 20);
  const int64_t hits = GetMemoryStats().cache_hits;
  {
    at::Tensor again = at::empty({3 << 20}, at::kFloat);
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(GetMemoryStats().cache_hits, hits + 1);
    EXPECT_EQ(GetMemoryStats().cached_bytes, 0);
  }
  SetBlockCacheLimit(0);
  EXPECT_EQ(GetMemoryStats().cached_bytes, 0);
}

}  // namespace
}  // namespace trainsup::sparse
