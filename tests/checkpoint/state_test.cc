// The torch part of checkpoints: safetensors, model/optimizer/trainer state,
// strict loading, asynchronous saving, and an exact resume of a small sparse
// model trained with the engine.
#include "checkpoint/state.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>

#include "nlohmann/json.hpp"
#include "sparse/determinism.h"
#include "sparse/ops.h"
#include "sparse/quantize.h"
#include "sparse/scene.h"
#include "tests/checkpoint/fault_injection_fs.h"

namespace trainsup::ckpt {
namespace {

namespace sp = trainsup::sparse;

std::string TempDir() {
  char tmpl[] = "/tmp/trainsup_state_test.XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

// A small segmentation net on the engine: conv-BN-ReLU, a stride-2
// encoder, a transposed decoder, a skip, dropout and a linear head.
struct TinyNet : torch::nn::Module {
  explicit TinyNet(int64_t classes = 4) {
    w1 = register_parameter("enc_conv_weight", torch::randn({27, 3, 8}) * 0.2);
    bn_w = register_parameter("enc_bn_weight", torch::ones({8}));
    bn_b = register_parameter("enc_bn_bias", torch::zeros({8}));
    rm = register_buffer("enc_bn_running_mean", torch::zeros({8}));
    rv = register_buffer("enc_bn_running_var", torch::ones({8}));
    w2 = register_parameter("down_weight", torch::randn({8, 8, 8}) * 0.2);
    w3 = register_parameter("up_weight", torch::randn({8, 8, 8}) * 0.2);
    head = register_module("head",
                           torch::nn::Linear(torch::nn::LinearOptions(16, classes).bias(false)));
  }
  at::Tensor forward(const sp::SparseTensor& x) {
    sp::SparseTensor a = sp::Relu(sp::BatchNorm(sp::Conv(x, w1, {}, {3, 1, 1}), bn_w, bn_b, rm, rv,
                                                is_training(), 0.1, 1e-5));
    sp::SparseTensor d = sp::Relu(sp::Conv(a, w2, {}, {2, 2, 1}));
    sp::SparseTensor u = sp::ConvTranspose(d, w3, {}, {2, 2, 1}, &a);
    at::Tensor f = sp::Cat({a, u}).F();
    f = at::dropout(f, 0.1, is_training());
    return head->forward(f);
  }
  at::Tensor w1, bn_w, bn_b, rm, rv, w2, w3;
  torch::nn::Linear head{nullptr};
};

// One training step's batch: a small synthetic room drawn with the data RNG.
std::pair<sp::SparseTensor, at::Tensor> Batch(std::mt19937_64& data_rng) {
  sp::SceneOptions o = sp::ScenePreset("small", data_rng());
  o.num_points = 4000;
  sp::Scene s = sp::GenerateScene(o);
  at::Tensor p = at::from_blob(s.points.data(), {s.size(), 3}, at::kFloat).clone();
  at::Tensor c = at::from_blob(s.colors.data(), {s.size(), 3}, at::kFloat).clone();
  at::Tensor l = at::from_blob(s.labels.data(), {s.size()}, at::kInt).to(at::kLong);
  sp::Quantized q = sp::Quantize(p, 0.1, c, l);
  at::Tensor coords = at::cat({at::zeros({q.coordinates.size(0), 1}, at::kInt), q.coordinates}, 1);
  return {sp::SparseTensor(q.features, coords), q.labels};
}

void Train(TinyNet& net, torch::optim::Optimizer& opt, TrainerState& state,
           std::mt19937_64& data_rng, int64_t until) {
  net.train();
  while (state.step < until) {
    auto [x, labels] = Batch(data_rng);
    opt.zero_grad();
    at::Tensor loss = at::cross_entropy_loss(net.forward(x), labels);
    loss.backward();
    opt.step();
    ++state.step;
    ++state.cursor;
  }
}

std::string RngString(const std::mt19937_64& rng) {
  std::ostringstream os;
  os << rng;
  return os.str();
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const std::string& kind, TinyNet& net) {
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        net.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  }
  return std::make_unique<torch::optim::AdamW>(net.parameters(), torch::optim::AdamWOptions(1e-2));
}

std::vector<at::Tensor> OptimizerTensors(torch::optim::Optimizer& opt, TinyNet& net,
                                         const std::string& kind) {
  std::vector<at::Tensor> out;
  for (const auto& p : net.parameters()) {
    auto& st = opt.state().at(p.unsafeGetTensorImpl());
    if (kind == "sgd") {
      out.push_back(static_cast<torch::optim::SGDParamState&>(*st).momentum_buffer());
    } else {
      auto& a = static_cast<torch::optim::AdamWParamState&>(*st);
      out.push_back(a.exp_avg());
      out.push_back(a.exp_avg_sq());
      out.push_back(at::tensor(std::vector<int64_t>{a.step()}));
    }
  }
  return out;
}

TEST(ExactResume, SaveAndFreshReloadEveryFewStepsEndsBitForBitEqual) {
  sp::DeterministicGuard deterministic(true);
  for (const std::string kind : {"sgd", "adamw"}) {
    SCOPED_TRACE(kind);
    const int64_t kSteps = 9, kEvery = 3;
    // Uninterrupted.
    torch::manual_seed(1);
    TinyNet a;
    auto opt_a = MakeOptimizer(kind, a);
    TrainerState state_a;
    std::mt19937_64 rng_a(7);
    Train(a, *opt_a, state_a, rng_a, kSteps);

    // Interrupted: after each save, a fresh model, optimizer, generator and
    // data RNG with other values are loaded from the newest checkpoint.
    const std::string dir = TempDir();
    CheckpointStore store(dir + "/checkpoints");
    torch::manual_seed(1);
    auto b = std::make_unique<TinyNet>();
    auto opt_b = MakeOptimizer(kind, *b);
    TrainerState state_b;
    std::mt19937_64 rng_b(7);
    while (state_b.step < kSteps) {
      Train(*b, *opt_b, state_b, rng_b, state_b.step + kEvery);
      state_b.data_rng_state = RngString(rng_b);
      auto snap = Snapshot(*b, *opt_b, state_b);
      ASSERT_TRUE(snap.ok()) << snap.status();
      ASSERT_TRUE(WriteSnapshot(store, *snap).ok());

      torch::manual_seed(12345);
      b = std::make_unique<TinyNet>();
      opt_b = MakeOptimizer(kind, *b);
      rng_b.seed(999);
      state_b = TrainerState();
      auto latest = store.ChooseLatest(nullptr);
      ASSERT_TRUE(latest.ok()) << latest.status();
      absl::Status s = LoadState(store, *latest, *b, *opt_b, &state_b);
      ASSERT_TRUE(s.ok()) << s;
      std::istringstream(state_b.data_rng_state) >> rng_b;
    }
    EXPECT_EQ(state_b.step, kSteps);
    EXPECT_EQ(state_b.cursor, kSteps);
    auto pa = a.named_parameters(), pb = b->named_parameters();
    for (const auto& p : pa) EXPECT_TRUE(at::equal(p.value(), pb[p.key()])) << p.key();
    auto ba = a.named_buffers(), bb = b->named_buffers();
    for (const auto& p : ba) EXPECT_TRUE(at::equal(p.value(), bb[p.key()])) << p.key();
    auto oa = OptimizerTensors(*opt_a, a, kind), ob = OptimizerTensors(*opt_b, *b, kind);
    ASSERT_EQ(oa.size(), ob.size());
    for (size_t i = 0; i < oa.size(); ++i)
      EXPECT_TRUE(at::equal(oa[i], ob[i])) << "optimizer tensor " << i;
    FileSystem::Default()->DeleteTree(dir).IgnoreError();
  }
}

TEST(Safetensors, WritesTheDocumentedFormat) {
  NamedTensors tensors = {{"b", at::arange(6, at::kFloat).view({2, 3})},
                          {"a", at::tensor({7, 8}, at::kLong)}};
  std::string bytes;
  ASSERT_TRUE(WriteSafetensors(tensors, {{"k", "v"}}, [&](std::string_view d) {
                bytes.append(d);
                return absl::OkStatus();
              }).ok());
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["b"]["dtype"], "F32");
  EXPECT_EQ(header["b"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["a"]["dtype"], "I64");
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({24, 40}));
  float f[6];
  std::memcpy(f, bytes.data() + 8 + n, 24);
  EXPECT_EQ(f[5], 5.0f);
  int64_t l[2];
  std::memcpy(l, bytes.data() + 8 + n + 24, 16);
  EXPECT_EQ(l[1], 8);

  const std::string dir = TempDir();
  ASSERT_TRUE(FileSystem::Default()->WriteSmallFile(dir + "/t.safetensors", bytes).ok());
  auto back = ReadSafetensors(FileSystem::Default(), dir + "/t.safetensors");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(at::equal(back->tensors["b"], tensors[0].second));
  EXPECT_TRUE(at::equal(back->tensors["a"], tensors[1].second));
  EXPECT_EQ(back->metadata["k"], "v");
  // Damaged headers are errors naming the problem, not crashes.
  std::string lying = bytes;
  uint64_t huge = 1 << 30;
  std::memcpy(lying.data(), &huge, 8);
  ASSERT_TRUE(FileSystem::Default()->WriteSmallFile(dir + "/bad.safetensors", lying).ok());
  auto bad = ReadSafetensors(FileSystem::Default(), dir + "/bad.safetensors");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(bad.status().message()).find("header length"), std::string::npos);
  ASSERT_TRUE(FileSystem::Default()
                  ->WriteSmallFile(dir + "/short.safetensors", bytes.substr(0, bytes.size() - 4))
                  .ok());
  auto truncated = ReadSafetensors(FileSystem::Default(), dir + "/short.safetensors");
  EXPECT_NE(std::string(truncated.status().message()).find("'a'"), std::string::npos)
      << truncated.status();
  // Hostile headers: overlapping ranges, and a shape whose size overflows.
  auto hostile = [&](const std::string& json_header) {
    std::string h = json_header;
    h.append((8 - h.size() % 8) % 8, ' ');
    uint64_t len = h.size();
    std::string file(reinterpret_cast<const char*>(&len), 8);
    file += h + std::string(64, '\0');
    EXPECT_TRUE(FileSystem::Default()->WriteSmallFile(dir + "/hostile.safetensors", file).ok());
    return ReadSafetensors(FileSystem::Default(), dir + "/hostile.safetensors").status();
  };
  absl::Status overlap = hostile(R"({"a": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]},
                                    "b": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}})");
  EXPECT_NE(std::string(overlap.message()).find("overlap"), std::string::npos) << overlap;
  absl::Status overflow = hostile(
      R"({"a": {"dtype": "U8", "shape": [4611686018427387905, 4], "data_offsets": [0, 4]}})");
  EXPECT_EQ(overflow.code(), absl::StatusCode::kDataLoss) << overflow;
  FileSystem::Default()->DeleteTree(dir).IgnoreError();
}

TEST(LoadState, AnInvalidGeneratorStateChangesNothing) {
  const std::string dir = TempDir();
  CheckpointStore store(dir + "/checkpoints");
  TinyNet net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1));
  TrainerState t;
  t.step = 1;
  auto snap = Snapshot(net, sgd, t);
  ASSERT_TRUE(snap.ok());
  snap->trainer.cpu_rng_state.assign(snap->trainer.cpu_rng_state.size(), '\0');
  ASSERT_TRUE(WriteSnapshot(store, *snap).ok());
  torch::manual_seed(77);
  TinyNet fresh;
  at::Tensor before = fresh.w1.clone();
  torch::optim::SGD fresh_sgd(fresh.parameters(), torch::optim::SGDOptions(0.1));
  absl::Status s = LoadState(store, *store.ChooseLatest(nullptr), fresh, fresh_sgd, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(at::equal(fresh.w1, before));
  FileSystem::Default()->DeleteTree(dir).IgnoreError();
}

// A NaN or an infinity in the weights or the optimizer state: the save is
// refused naming the tensor, and nothing is written (no step directory, no
// leftover).
TEST(WriteSnapshot, RefusesANonFiniteValueAndWritesNothing) {
  const std::string dir = TempDir();
  CheckpointStore store(dir + "/checkpoints");
  TinyNet net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainerState t;
  t.step = 3;
  auto snap = Snapshot(net, sgd, t);
  ASSERT_TRUE(snap.ok());
  ASSERT_TRUE(CheckFinite(*snap).ok());
  {
    torch::NoGradGuard no_grad;
    net.w1[0][1][2] = std::numeric_limits<float>::quiet_NaN();
  }
  snap = Snapshot(net, sgd, t);
  absl::Status s = WriteSnapshot(store, *snap);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("model tensor enc_conv_weight has 1 non-finite value of"),
            std::string::npos)
      << s;
  // Refused before the store was touched: not even its directory exists.
  EXPECT_FALSE(FileSystem::Default()->Exists(dir + "/checkpoints"));
  // The optimizer's state too: a momentum buffer with an infinity.
  {
    torch::NoGradGuard no_grad;
    net.w1[0][1][2] = 0.5f;
  }
  for (auto& p : net.parameters()) p.mutable_grad() = torch::ones_like(p);
  sgd.step();
  for (auto& [key, state] : sgd.state()) {
    static_cast<torch::optim::SGDParamState&>(*state).momentum_buffer().fill_(
        std::numeric_limits<float>::infinity());
    break;
  }
  snap = Snapshot(net, sgd, t);
  s = WriteSnapshot(store, *snap);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("optimizer tensor param."), std::string::npos) << s;
  EXPECT_FALSE(FileSystem::Default()->Exists(dir + "/checkpoints"));
  FileSystem::Default()->DeleteTree(dir).IgnoreError();
}

struct OtherNet : torch::nn::Module {
  OtherNet(bool extra, int64_t head_cols) {
    register_parameter("enc_conv_weight", torch::zeros({27, 3, 8}));
    register_parameter("enc_bn_weight", torch::zeros({8}));
    register_parameter("enc_bn_bias", torch::zeros({8}));
    register_buffer("enc_bn_running_mean", torch::zeros({8}));
    register_buffer("enc_bn_running_var", torch::zeros({8}));
    register_parameter("down_weight", torch::zeros({8, 8, 8}));
    register_parameter("up_weight", torch::zeros({8, 8, 8}));
    auto head = register_module(
        "head", torch::nn::Linear(torch::nn::LinearOptions(16, head_cols).bias(false)));
    torch::NoGradGuard no_grad;
    head->weight.zero_();
    if (extra) register_parameter("extra_weight", torch::zeros({2}));
    (void)head;
  }
};

TEST(LoadState, AMismatchNamesTheKeyAndLoadsNothing) {
  const std::string dir = TempDir();
  CheckpointStore store(dir + "/checkpoints");
  TinyNet net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainerState t;
  t.step = 3;
  auto snap = Snapshot(net, sgd, t);
  ASSERT_TRUE(snap.ok());
  ASSERT_TRUE(WriteSnapshot(store, *snap).ok());
  auto latest = store.ChooseLatest(nullptr);
  ASSERT_TRUE(latest.ok());
  struct Case {
    bool extra;
    int64_t head_cols;
    const char* key;
  };
  for (const Case& c : {Case{true, 4, "extra_weight"}, Case{false, 5, "head.weight"}}) {
    OtherNet other(c.extra, c.head_cols);
    torch::optim::SGD opt(other.parameters(), torch::optim::SGDOptions(0.1));
    TrainerState loaded;
    absl::Status s = LoadState(store, *latest, other, opt, &loaded);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(std::string(s.message()).find(c.key), std::string::npos) << s;
    // Nothing loaded half-way: every tensor is still zero.
    for (const auto& p : other.named_parameters())
      EXPECT_EQ(p.value().abs().sum().item<float>(), 0.0f) << p.key();
    EXPECT_EQ(loaded.step, 0);
  }
  torch::optim::AdamW adamw(net.parameters());
  absl::Status s = LoadState(store, *latest, net, adamw, nullptr);
  EXPECT_NE(std::string(s.message()).find("'sgd'"), std::string::npos) << s;
  FileSystem::Default()->DeleteTree(dir).IgnoreError();
}

TEST(AsyncCheckpointer, WritesInTheBackgroundAndKeepsEachResultUntilTaken) {
  const std::string dir = TempDir();
  testing::FaultInjectionFileSystem fs;
  CheckpointStore store(dir + "/checkpoints", &fs);
  TinyNet net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1));
  AsyncCheckpointer saver(&store);
  TrainerState t;
  t.step = 10;
  EXPECT_FALSE(saver.Save(*Snapshot(net, sgd, t)).has_value());  // nothing before it
  std::optional<WriteResult> first = saver.Wait();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->step, 10);
  EXPECT_TRUE(first->status.ok()) << first->status;
  EXPECT_GT(first->seconds, 0.0);
  EXPECT_TRUE(store.Verify({10, dir + "/checkpoints/step-10"}).ok());
  EXPECT_FALSE(saver.Wait().has_value());  // taken once
  // A full disk: the write fails, is reported, and commits nothing.
  fs.space_left = 100;
  t.step = 20;
  EXPECT_FALSE(saver.Save(*Snapshot(net, sgd, t)).has_value());
  t.step = 30;
  // The next save waits for the one in flight and hands back its result.
  std::optional<WriteResult> second = saver.Save(*Snapshot(net, sgd, t));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->step, 20);
  EXPECT_EQ(second->status.code(), absl::StatusCode::kResourceExhausted) << second->status;
  std::optional<WriteResult> third = saver.Wait();
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->step, 30);
  EXPECT_FALSE(third->status.ok());
  fs.space_left = -1;
  auto latest = store.ChooseLatest(nullptr);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 10);
  auto listed = store.List();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 1u);
  FileSystem::Default()->DeleteTree(dir).IgnoreError();
}

// Poll never blocks: while the write is held up (the before_write hook,
// slow storage) it has nothing, and the training thread goes on; the
// snapshot is a copy, so changing the weights meanwhile does not reach
// the checkpoint.
TEST(AsyncCheckpointer, PollDoesNotWaitAndTheSnapshotIsACopy) {
  const std::string dir = TempDir();
  CheckpointStore store(dir + "/checkpoints");
  TinyNet net;
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1));
  std::mutex gate;
  gate.lock();
  AsyncCheckpointer saver(&store, [&] { std::lock_guard<std::mutex> hold(gate); });
  TrainerState t;
  t.step = 5;
  absl::StatusOr<StateSnapshot> snapshot = Snapshot(net, sgd, t);
  ASSERT_TRUE(snapshot.ok());
  // The copies are not LibTorch's CPU allocator's (a training memory
  // budget counts that one).
  for (const auto& [name, tensor] : snapshot->model) {
    EXPECT_EQ(tensor.storage().allocator(), nullptr) << name;
  }
  const at::Tensor before = net.w1.detach().clone();
  EXPECT_FALSE(saver.Save(std::move(*snapshot)).has_value());
  EXPECT_TRUE(saver.in_flight());
  EXPECT_FALSE(saver.Poll().has_value());
  {
    torch::NoGradGuard no_grad;
    net.w1.add_(1.0);
  }
  gate.unlock();
  std::optional<WriteResult> done = saver.Wait();
  ASSERT_TRUE(done.has_value());
  ASSERT_TRUE(done->status.ok()) << done->status;
  EXPECT_FALSE(saver.in_flight());
  TinyNet fresh;
  torch::optim::SGD fresh_sgd(fresh.parameters(), torch::optim::SGDOptions(0.1));
  TrainerState loaded;
  ASSERT_TRUE(LoadState(store, {5, dir + "/checkpoints/step-5"}, fresh, fresh_sgd, &loaded).ok());
  EXPECT_TRUE(torch::equal(fresh.w1, before));
  FileSystem::Default()->DeleteTree(dir).IgnoreError();
}

}  // namespace
}  // namespace trainsup::ckpt
