// Data-parallel steps over real c10d process groups (Gloo on loopback):
// every rank is a process of this binary (re-executed with --rank-role),
// joins the gang through the product's Gang, and runs one step through the
// trainer's ForwardBackward with the GradientReducer. The gradient two
// ranks make together equals, in float64 within 1e-10 relative, the one
// one rank makes from both ranks' scenes: with BatchNorm in eval mode, with
// sync_batchnorm in training mode, and when the ranks split their batches
// differently under different memory budgets.
#include "worker/gang/distributed.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "contracts/free_port.h"
#include "nlohmann/json.hpp"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "sparse/nn.h"
#include "sparse/runtime.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"
#include "worker/split/step.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;

constexpr int kChannels = 3;
constexpr int kClasses = 4;
constexpr int kScenes = 4;         // the global batch, unless a test says otherwise
constexpr int kDatasetScenes = 8;  // the synthetic dataset the batches are drawn from

std::string g_self;  // this binary

// --- one rank ---------------------------------------------------------------------------

struct RoleArgs {
  int rank = 0;
  int world = 1;
  int port = 0;
  std::string mode = "eval";  // eval | sync | local (training-mode BatchNorm per rank)
  bool split = false;         // a budget that makes this rank's batch split
  bool host_group = false;    // an NCCL gang's layout, Gloo in both groups
  std::string unlabelled;     // "i,j": these scenes' labels are all erased (-1)
  int scenes = kScenes;       // the global batch: scenes 0..scenes-1
  bool same_scene = false;    // every scene of the batch is a copy of scene 0
  std::string out;
};

// Erases every label of the scenes whose dataset index is in `list` ("i,j").
void Unlabel(const std::string& list, Batch* batch) {
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int64_t index = -1;
    if (!absl::SimpleAtoi(item, &index)) throw std::runtime_error("bad --unlabelled");
    for (VoxelScene& s : batch->scenes) {
      if (s.index != index) continue;
      std::fill(s.labels.begin(), s.labels.end(), -1);
      std::fill(s.labelled.begin(), s.labelled.end(), 0);
    }
  }
}

Batch ScenesOf(const std::vector<int64_t>& indices) {
  DataSpec data;
  data.format = "synthetic";
  data.scenes = kDatasetScenes;
  data.scene_size = "small";
  data.val_fraction = 0;
  ModelSpec model;
  model.voxel_size = 0.1;
  absl::StatusOr<std::unique_ptr<Dataset>> dataset = OpenDataset(data, model, 7, Split::kTrain);
  if (!dataset.ok()) throw std::runtime_error(std::string(dataset.status().message()));
  LoaderOptions lo;
  lo.voxel_size = 0.1;
  lo.augment = false;
  Batch batch;
  for (int64_t i : indices) {
    absl::StatusOr<VoxelScene> scene = PrepareScene(**dataset, i, 0, lo);
    if (!scene.ok()) throw std::runtime_error(std::string(scene.status().message()));
    batch.scenes.push_back(std::move(*scene));
  }
  batch.cursor_end = static_cast<int64_t>(indices.size());
  return batch;
}

// MinkUNet14's layout at a quarter of its widths (as trainer_test's
// equivalence test): small weights, quick float64 steps.
sparse::MinkUNetConfig QuarterMinkUNet14() {
  sparse::MinkUNetConfig plan = sparse::MinkUNetPlan(14, kChannels, kClasses);
  for (int64_t& planes : plan.planes) planes /= 4;
  plan.init_dim /= 4;
  return plan;
}

int RunRole(const RoleArgs& a) {
  at::set_num_threads(1);
  sparse::InstallCountingAllocator();
  // The rank's share of the global batch, as the loader cuts it.
  const BatchShare share = RankShare(a.scenes, a.rank, a.world);
  std::vector<int64_t> mine;
  for (int64_t i = share.begin; i < share.end; ++i) mine.push_back(i);
  Batch batch = ScenesOf(mine);
  if (a.same_scene && !batch.scenes.empty()) {
    const VoxelScene first = ScenesOf({0}).scenes[0];
    for (VoxelScene& scene : batch.scenes) scene = first;
  }
  Unlabel(a.unlabelled, &batch);
  sparse::MinkUNetConfig plan = QuarterMinkUNet14();
  torch::manual_seed(3);
  sparse::MinkUNet model(plan);
  model->to(torch::kFloat64);
  if (a.mode == "eval") model->eval();
  std::vector<at::Tensor> params = model->parameters();
  std::vector<at::Tensor> accum;
  for (const at::Tensor& p : params) accum.push_back(torch::zeros_like(p));

  GangOptions go;
  go.rank = a.rank;
  go.world_size = a.world;
  go.master_port = a.port;
  go.timeout_s = 60;
  go.connect_timeout_s = 60;
  go.host_group_beside_device = a.host_group;
  absl::StatusOr<std::unique_ptr<Gang>> gang = Gang::Join(go);
  if (!gang.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank, std::string(gang.status().message()).c_str());
    return 2;
  }
  GradientReducer reducer(gang->get(), params, /*bucket_bytes=*/64 << 10);

  SplitOptions options;
  int64_t budget = 0;
  MemoryModel predictor;
  if (a.split) {
    // As ForwardBackward.SplittingEquivalence: a budget that holds one
    // scene but not two, whole scenes only (bisecting a scene changes its
    // convolutions). Peaks measured without collectives.
    options.min_piece_voxels = 1 << 30;
    int64_t scene_peak = 0, batch_peak = 0;
    for (size_t k = 0; k < batch.scenes.size(); ++k) {
      Batch one;
      one.scenes.push_back(batch.scenes[k]);
      int64_t peak = 0;
      if (!ForwardBackward(*model, one, kChannels, params, accum, SplitOptions{}, nullptr, 0,
                           at::kDouble, &peak)
               .ok())
        return 3;
      scene_peak = std::max(scene_peak, peak);
    }
    if (!ForwardBackward(*model, batch, kChannels, params, accum, SplitOptions{}, nullptr, 0,
                         at::kDouble, &batch_peak)
             .ok())
      return 3;
    budget = scene_peak + (batch_peak - scene_peak) / 5;
    // With sync_batchnorm the groups are planned (DataParallel): the memory
    // model learns the peaks just measured, each scene's and the batch's,
    // and the budget is halfway, since the planner keeps 10% in reserve
    // and the collectives' own buffers come on top of the measured peaks:
    // the plan still cuts the batch (its peak is above 0.9 of the budget),
    // and a scene fits with room to spare.
    for (int i = 0; !predictor.ready() && i < 4 * MemoryModel::kMinObservations; ++i) {
      const size_t k = static_cast<size_t>(i) % (batch.scenes.size() + 1);
      Batch work;
      if (k < batch.scenes.size()) work.scenes.push_back(batch.scenes[k]);
      const Batch& measured = k < batch.scenes.size() ? work : batch;
      int64_t peak = 0;
      if (!ForwardBackward(*model, measured, kChannels, params, accum, SplitOptions{}, nullptr, 0,
                           at::kDouble, &peak)
               .ok())
        return 3;
      int64_t voxels = 0;
      for (const VoxelScene& scene : measured.scenes) voxels += scene.voxels();
      predictor.Observe(voxels, -1, peak);
    }
    if (a.mode == "sync") budget = (scene_peak + batch_peak) / 2;
    // Those steps moved the running statistics: back to the initial ones.
    torch::manual_seed(3);
    sparse::MinkUNet fresh(plan);
    fresh->to(torch::kFloat64);
    std::vector<at::Tensor> buffers = model->buffers(), initial = fresh->buffers();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(initial[i]);
  }
  if (a.mode == "sync" && a.world > 1) {
    Gang* g = gang->get();
    sparse::SetBatchNormAllreduce(*model, [g](at::Tensor& t) { g->AllreduceSum(t, "sync bn"); });
  }

  (*gang)->TakeStats();
  at::Tensor global = at::tensor({BatchLabelled(batch)});
  (*gang)->AllreduceSum(global, "labelled");
  const CollectiveStats before = (*gang)->TakeStats();
  DataParallel parallel{&reducer, global.item<int64_t>(), a.mode == "sync" && a.world > 1,
                        gang->get()};
  reducer.BeginStep(&accum, 0);
  (*gang)->TakeStats();
  if (budget > 0) sparse::SetMemoryBudget(budget);
  absl::StatusOr<StepOutcome> r =
      ForwardBackward(*model, batch, kChannels, params, accum, options,
                      a.mode == "sync" && a.split ? &predictor : nullptr, budget, at::kDouble,
                      nullptr, 0, false, a.world > 1 ? &parallel : nullptr);
  sparse::SetMemoryBudget(0);
  if (!r.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank, std::string(r.status().message()).c_str());
    return 4;
  }
  const CollectiveStats stats = (*gang)->TakeStats();
  // The gradient, then the running statistics, as raw float64.
  std::ofstream out(a.out + ".bin", std::ios::binary);
  for (const at::Tensor& t : accum) {
    at::Tensor c = t.contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), c.numel() * 8);
  }
  for (const at::Tensor& b : model->buffers()) {
    if (b.scalar_type() != at::kDouble) continue;
    at::Tensor c = b.contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), c.numel() * 8);
  }
  nlohmann::json j = {{"splits", r->stats.splits},
                      {"forwards", r->stats.forwards},
                      {"oom_events", r->stats.oom_events},
                      {"labelled", r->labelled},
                      {"buckets", reducer.num_buckets()},
                      {"buckets_in_backward", stats.buckets_in_backward},
                      {"buckets_after_backward", stats.buckets_after_backward},
                      {"collectives", before.collectives + stats.collectives},
                      {"host_collectives", before.host_collectives + stats.host_collectives},
                      {"params", static_cast<int64_t>(params.size())}};
  std::ofstream(a.out + ".json") << j.dump() << "\n";
  return 0;
}

// --- the tests --------------------------------------------------------------------------

// Starts this binary again with `args` (args[0] is its path): a rank role.
pid_t SpawnSelf(std::vector<std::string> args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(g_self.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

struct RankResult {
  std::vector<double> values;  // gradient, then running statistics
  nlohmann::json stats;
};

// Runs a gang of `world` role processes; `split_ranks` get a budget that
// splits their batch; the scenes in `unlabelled` ("i,j") lose all their
// labels. Returns each rank's result.
std::vector<RankResult> RunGang(int world, const std::string& mode,
                                const std::vector<int>& split_ranks = {}, bool host_group = false,
                                const std::string& unlabelled = "", int scenes = kScenes,
                                bool same_scene = false) {
  const std::string dir = ::testing::TempDir() + "/distributed_test_" + std::to_string(getpid());
  fs::create_directories(dir);
  const int port = FreeLoopbackPort();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const bool split = std::find(split_ranks.begin(), split_ranks.end(), r) != split_ranks.end();
    std::vector<std::string> args = {
        g_self,         "--rank-role",
        "--rank",       std::to_string(r),
        "--world",      std::to_string(world),
        "--port",       std::to_string(port),
        "--mode",       mode,
        "--split",      split ? "1" : "0",
        "--host-group", host_group ? "1" : "0",
        "--unlabelled", unlabelled.empty() ? "," : unlabelled,
        "--scenes",     std::to_string(scenes),
        "--same-scene", same_scene ? "1" : "0",
        "--out",        dir + "/" + mode + std::to_string(world) + "-" + std::to_string(r)};
    pids.push_back(SpawnSelf(std::move(args)));
  }
  std::vector<RankResult> results(world);
  for (int r = 0; r < world; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << " of " << world << " (" << mode << "): status " << status;
    const std::string base = dir + "/" + mode + std::to_string(world) + "-" + std::to_string(r);
    std::ifstream bin(base + ".bin", std::ios::binary);
    std::stringstream bytes;
    bytes << bin.rdbuf();
    const std::string b = bytes.str();
    results[r].values.resize(b.size() / 8);
    std::memcpy(results[r].values.data(), b.data(), b.size());
    results[r].stats = nlohmann::json::object();
    std::ifstream js(base + ".json");
    if (js) js >> results[r].stats;
  }
  return results;
}

// max |a - b| / max |b|.
double RelativeDifference(const std::vector<double>& a, const std::vector<double>& b, size_t begin,
                          size_t end) {
  double diff = 0, scale = 0;
  for (size_t i = begin; i < end; ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

size_t GradientSize() {
  sparse::MinkUNetConfig plan = QuarterMinkUNet14();
  sparse::MinkUNet model(plan);
  size_t n = 0;
  for (const at::Tensor& p : model->parameters()) n += p.numel();
  return n;
}

// Every rank of `gang` ends with the gradient (and, `with_running_stats`,
// the BatchNorm running statistics) of one rank with the whole batch
// (`one`), within 1e-10 relative in float64.
void ExpectSameGradient(const std::vector<RankResult>& one, const std::vector<RankResult>& gang,
                        bool with_running_stats) {
  ASSERT_EQ(one.size(), 1u);
  ASSERT_GE(gang.size(), 2u);
  const int world = static_cast<int>(gang.size());
  const size_t n = GradientSize();
  ASSERT_GE(one[0].values.size(), n);
  for (const RankResult& r : gang) ASSERT_EQ(r.values.size(), one[0].values.size());
  // Every rank ends with the same, global, gradient.
  for (int r = 0; r < world; ++r) {
    const double e = RelativeDifference(gang[r].values, one[0].values, 0, n);
    std::printf(
        "rank %d of %d vs one rank with the whole batch: gradient relative difference %.3g\n", r,
        world, e);
    EXPECT_LT(e, 1e-10) << "rank " << r << " of " << world;
  }
  double norm = 0;
  for (size_t i = 0; i < n; ++i) norm = std::max(norm, std::abs(one[0].values[i]));
  EXPECT_GT(norm, 0) << "a zero gradient proves nothing";
  if (with_running_stats) {
    for (int r = 0; r < world; ++r) {
      const double e = RelativeDifference(gang[r].values, one[0].values, n, one[0].values.size());
      std::printf("rank %d of %d: running statistics relative difference %.3g\n", r, world, e);
      EXPECT_LT(e, 1e-10) << "rank " << r << " of " << world;
    }
  }
  int64_t labelled = 0;
  for (const RankResult& r : gang) labelled += r.stats.value("labelled", int64_t{-1000000});
  EXPECT_EQ(labelled, one[0].stats.value("labelled", int64_t{-2}));
}

TEST(DataParallel, TwoRanksGiveTheGradientOfOneRankWithTwiceTheBatch) {
  std::vector<RankResult> one = RunGang(1, "eval");
  std::vector<RankResult> two = RunGang(2, "eval");
  ExpectSameGradient(one, two, /*with_running_stats=*/false);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // The buckets were launched while backward was running (overlap).
    EXPECT_GT(two[r].stats.value("buckets", 0), 1);
    EXPECT_GT(two[r].stats.value("buckets_in_backward", 0), 0);
    std::printf("rank %d: %d of %d buckets launched during backward\n", r,
                two[r].stats.value("buckets_in_backward", 0), two[r].stats.value("buckets", 0));
  }
}

TEST(DataParallel, SyncBatchNormInTrainingModeMatchesOneRankWithTheWholeBatch) {
  std::vector<RankResult> one = RunGang(1, "sync");
  std::vector<RankResult> two = RunGang(2, "sync");
  ExpectSameGradient(one, two, /*with_running_stats=*/true);
  // Without the synchronisation each rank normalises with its own batch's
  // statistics, and the step is another one: the comparison can fail.
  std::vector<RankResult> local = RunGang(2, "local");
  ASSERT_EQ(local.size(), 2u);
  const double e = RelativeDifference(local[0].values, one[0].values, 0, GradientSize());
  std::printf("per-rank BatchNorm in training mode vs one rank: %.3g\n", e);
  EXPECT_GT(e, 1e-6);
}

// A rank whose batch holds no labelled voxel still issues its collectives
// in the order of a rank with labels: its gradient buckets are launched
// from the same backward hooks, between the same SyncBN allreduces. Gloo
// matches collectives by their order, so a bucket out of place would be
// summed with BatchNorm statistics (or time out).
TEST(DataParallel, SyncBatchNormWithARankWithoutLabelsMatchesOneRankWithTheWholeBatch) {
  std::string rank1_scenes;
  const BatchShare share = RankShare(kScenes, /*rank=*/1, /*world_size=*/2);
  for (int64_t i = share.begin; i < share.end; ++i) {
    absl::StrAppend(&rank1_scenes, rank1_scenes.empty() ? "" : ",", i);
  }
  std::vector<RankResult> one = RunGang(1, "sync", {}, false, rank1_scenes);
  std::vector<RankResult> two = RunGang(2, "sync", {}, false, rank1_scenes);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].stats.value("labelled", -1), 0) << "rank 1's scenes must have no label";
  EXPECT_GT(two[0].stats.value("labelled", 0), 0);
  ExpectSameGradient(one, two, /*with_running_stats=*/true);
  for (int r = 0; r < 2; ++r) {
    std::printf("rank %d: %d of %d buckets launched during backward\n", r,
                two[r].stats.value("buckets_in_backward", 0), two[r].stats.value("buckets", 0));
  }
  EXPECT_EQ(two[0].stats.value("buckets_in_backward", -1),
            two[1].stats.value("buckets_in_backward", -2));
}

TEST(DataParallel, RanksThatSplitDifferentlyStillGiveTheUnsplitStep) {
  std::vector<RankResult> one = RunGang(1, "eval");
  std::vector<RankResult> two = RunGang(2, "eval", /*split_ranks=*/{1});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(one[0].stats.value("splits", -1), 0);
  EXPECT_EQ(two[0].stats.value("splits", -1), 0) << "rank 0 has no budget";
  EXPECT_GT(two[1].stats.value("splits", 0), 0) << "rank 1's budget must make it split";
  EXPECT_GT(two[1].stats.value("oom_events", 0), 0);
  ExpectSameGradient(one, two, /*with_running_stats=*/false);
}

// sync_batchnorm with splitting (issue 43): rank 0's budget plans its
// batch in two groups, rank 1's fits in one; the gang agrees on two and
// rank 1 runs an empty second group, so both make the same SyncBN and
// gradient collectives. Every scene is the same room, so each group's
// gang-wide statistics are the whole batch's and the split step must be
// the unsplit gang's in float64 (gradient and running statistics, 1e-10
// relative): what remains is the weights, the agreement, the empty group
// and where the reducer arms. With different rooms the normalisation is
// per group (ghost batch norm, docs/worker.md), so the gradient differs by
// more than rounding; that step must still complete and agree.
TEST(DataParallel, SyncBatchNormSplitsWhenOneRanksBatchDoesNotFit) {
  std::vector<RankResult> whole = RunGang(2, "sync", {}, false, "", kScenes, /*same_scene=*/true);
  std::vector<RankResult> split =
      RunGang(2, "sync", /*split_ranks=*/{0}, false, "", kScenes, /*same_scene=*/true);
  ASSERT_EQ(split.size(), 2u);
  EXPECT_GT(split[0].stats.value("splits", 0), 0) << "rank 0's budget must make it split";
  EXPECT_EQ(split[0].stats.value("oom_events", -1), 0) << "planned, not reactive";
  EXPECT_EQ(split[1].stats.value("splits", -1), 0);
  EXPECT_EQ(split[0].stats.value("forwards", 0), 2);
  EXPECT_EQ(split[1].stats.value("forwards", 0), 2) << "rank 1 runs an empty second group";
  ASSERT_EQ(whole.size(), 2u);
  const size_t n = GradientSize();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(split[r].values.size(), whole[r].values.size());
    const double g = RelativeDifference(split[r].values, whole[r].values, 0, n);
    const double b =
        RelativeDifference(split[r].values, whole[r].values, n, whole[r].values.size());
    std::printf("sync bn split vs unsplit gang, rank %d: gradient %.3g, running stats %.3g\n", r, g,
                b);
    EXPECT_LT(g, 1e-10) << "rank " << r;
    EXPECT_LT(b, 1e-10) << "rank " << r;
  }
  std::vector<RankResult> rooms = RunGang(2, "sync", {0});
  std::vector<RankResult> rooms_whole = RunGang(2, "sync");
  ASSERT_EQ(rooms.size(), 2u);
  ASSERT_EQ(rooms_whole.size(), 2u);
  EXPECT_GT(rooms[0].stats.value("splits", 0), 0);
  EXPECT_TRUE(rooms[0].values == rooms[1].values) << "the ranks must end with the same step";
  std::printf("sync bn split vs unsplit gang, different rooms: gradient %.3g (ghost batch norm)\n",
              RelativeDifference(rooms[0].values, rooms_whole[0].values, 0, n));
}

// An NCCL gang's layout: the device's group and a Gloo group beside it
// for host tensors, which ProcessGroupNCCL rejects. Here Gloo stands in for
// NCCL, so the step runs with every tensor on the host: each collective
// goes to the host group, and the step is still the one-rank step (BN
// statistics and gradient buckets included). Which group a CUDA tensor
// takes is GroupFor's, below; NCCL itself is the one part no test runs.
TEST(DataParallel, AHostGroupBesideTheDeviceGroupGivesTheSameStep) {
  std::vector<RankResult> one = RunGang(1, "sync");
  std::vector<RankResult> two = RunGang(2, "sync", {}, /*host_group=*/true);
  ExpectSameGradient(one, two, /*with_running_stats=*/true);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_GT(two[r].stats.value("collectives", 0), 2);
    EXPECT_EQ(two[r].stats.value("host_collectives", -1), two[r].stats.value("collectives", 0))
        << "every tensor here is a host tensor";
  }
  // A gang of one group counts none apart.
  std::vector<RankResult> plain = RunGang(2, "eval");
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0].stats.value("host_collectives", -1), 0);
}

// The GradientReducer's hooks on the parameters must see each gradient as
// backward makes it. LibTorch 1.13 fired no leaf hook under
// torch::autograd::grad, which is why the step's backward pass writes
// .grad (loss.backward()); 2.15 fires them under both (docs/distributed.md).
TEST(LibTorchAutograd, LeafHooksFireUnderBackwardAndUnderAutogradGrad) {
  at::Tensor x = torch::ones({3}, torch::requires_grad());
  at::Tensor w = torch::full({3}, 2.0, torch::requires_grad());
  int fired = 0;
  at::Tensor seen;
  x.register_hook([&](const at::Tensor& g) {
    ++fired;
    seen = g.clone();
  });
  torch::autograd::grad({(x * w).sum()}, {x, w});
  EXPECT_EQ(fired, 1) << "under torch::autograd::grad";
  ASSERT_TRUE(seen.defined());
  EXPECT_TRUE(seen.equal(torch::full({3}, 2.0)));
  (x * w).sum().backward();
  EXPECT_EQ(fired, 2) << "under backward()";
}

TEST(GroupFor, HostTensorsGoBesideNcclDeviceTensorsStay) {
  const c10::Device cpu(c10::DeviceType::CPU), cuda(c10::DeviceType::CUDA, 0);
  EXPECT_EQ(GroupFor(/*separate_host_group=*/true, cpu), GroupKind::kHost);
  EXPECT_EQ(GroupFor(true, cuda), GroupKind::kDevice);
  EXPECT_EQ(GroupFor(false, cpu), GroupKind::kDevice) << "one group: everything goes to it";
  EXPECT_EQ(GroupFor(false, cuda), GroupKind::kDevice);
}

// The "one step, different gangs": the same global batch gives the
// same step at W = 4, 3, 2 and 1, in float64, with uneven shares (7 scenes:
// 2+2+2+1, 3+2+2, 4+3), BatchNorm in eval mode and synchronised.
TEST(DataParallel, TheSameGlobalBatchGivesTheSameStepAtEveryWorldSize) {
  for (const std::string mode : {"eval", "sync"}) {
    SCOPED_TRACE(mode);
    std::vector<RankResult> one = RunGang(1, mode, {}, false, "", /*scenes=*/7);
    for (int world : {4, 3, 2}) {
      SCOPED_TRACE("world " + std::to_string(world));
      ExpectSameGradient(one, RunGang(world, mode, {}, false, "", 7),
                         /*with_running_stats=*/mode == "sync");
    }
  }
}

// The last global batch of an epoch may hold fewer scenes than the gang
// has ranks: the ranks without a share still take part in every
// collective (gradient buckets; with synchronised BatchNorm, each layer's
// statistics, forward and backward) and add nothing.
TEST(DataParallel, RanksWithoutAShareAddNothingAndKeepTheCollectivesInStep) {
  for (const std::string mode : {"eval", "sync"}) {
    SCOPED_TRACE(mode);
    std::vector<RankResult> one = RunGang(1, mode, {}, false, "", /*scenes=*/3);
    std::vector<RankResult> four = RunGang(4, mode, {}, false, "", 3);
    ASSERT_EQ(four.size(), 4u);
    EXPECT_EQ(four[3].stats.value("labelled", -1), 0) << "rank 3 has no share of 3 scenes";
    ExpectSameGradient(one, four, /*with_running_stats=*/mode == "sync");
  }
}

TEST(RankShare, SharesAreContiguousInRankOrderAndEvenWithinOne) {
  for (int64_t count : {0, 1, 3, 7, 8, 23}) {
    for (int world : {1, 2, 3, 4, 8}) {
      int64_t next = 0, smallest = count, largest = 0;
      for (int r = 0; r < world; ++r) {
        const BatchShare s = RankShare(count, r, world);
        EXPECT_EQ(s.begin, next) << count << " over " << world << ", rank " << r;
        next = s.end;
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      EXPECT_EQ(next, count) << count << " over " << world;
      EXPECT_LE(largest - smallest, 1) << count << " over " << world;
    }
  }
  EXPECT_EQ(RankShare(7, 0, 4).size(), 2);
  EXPECT_EQ(RankShare(7, 3, 4).size(), 1);
  EXPECT_EQ(RankShare(3, 3, 4).size(), 0);
  EXPECT_EQ(RankShare(5, 4, 4).size(), 0) << "a rank outside the world";
}

// A rank that only joins a gang of two with GLOO_SOCKET_IFNAME's value
// `ifname`, writing "joined" or the error to `out`.
int JoinRole(int rank, int port, const std::string& ifname, const std::string& out) {
  at::set_num_threads(1);
  GangOptions go;
  go.rank = rank;
  go.world_size = 2;
  go.master_port = port;
  go.connect_timeout_s = 30;
  go.gloo_ifname = ifname;
  absl::StatusOr<std::unique_ptr<Gang>> gang = Gang::Join(go);
  // Gloo's full mesh may be complete on one rank while the other still
  // reads its last handshake: a rank that exited at once closed that
  // socket under its peer ("Connection closed by peer", seen in CI). A
  // barrier holds both until both are in, and shows the gang works.
  std::string result = gang.ok() ? "joined" : std::string(gang.status().message());
  if (gang.ok()) {
    try {
      (*gang)->Barrier("gloo_ifname");
    } catch (const std::exception& e) {
      result = std::string("joined, but the barrier failed: ") + e.what();
    }
  }
  std::ofstream(out) << result;
  return result == "joined" ? 0 : 3;
}

// Both ranks' JoinRole outputs.
std::vector<std::string> JoinTwo(const std::string& ifname) {
  const std::string dir = ::testing::TempDir() + "/gloo_ifname_" + std::to_string(getpid());
  fs::create_directories(dir);
  const int port = FreeLoopbackPort();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {g_self,
                                     "--join-role",
                                     std::to_string(r),
                                     std::to_string(port),
                                     ifname,
                                     dir + "/" + std::to_string(r)};
    pids.push_back(SpawnSelf(std::move(args)));
  }
  std::vector<std::string> outs;
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    std::ifstream in(dir + "/" + std::to_string(r));
    std::stringstream text;
    text << in.rdbuf();
    outs.push_back(text.str());
  }
  return outs;
}

TEST(ChooseGlooDevice, InterfacesFirstThenLoopbackThenTheAdvertisedAddress) {
  using Kind = GlooDeviceChoice::Kind;
  GlooDeviceChoice c = ChooseGlooDevice("10.0.0.1", "10.0.0.2", " eth1, eth2 ");
  EXPECT_EQ(c.kind, Kind::kInterfaces);
  EXPECT_EQ(c.names, (std::vector<std::string>{"eth1", "eth2"}));
  c = ChooseGlooDevice("127.0.0.1", "10.0.0.2", "");
  EXPECT_EQ(c.kind, Kind::kAddress);
  EXPECT_EQ(c.names, (std::vector<std::string>{"127.0.0.1"}));
  c = ChooseGlooDevice("10.0.0.1", "10.0.0.2", "");
  EXPECT_EQ(c.kind, Kind::kAddress);
  EXPECT_EQ(c.names, (std::vector<std::string>{"10.0.0.2"}));
  c = ChooseGlooDevice("10.0.0.1", "", "");
  EXPECT_EQ(c.kind, Kind::kHostName);
  EXPECT_TRUE(c.names.empty());
}

TEST(Gang, GlooSocketIfnameIsHonoured) {
  // The loopback interface by name: the gang forms over it.
  for (const std::string& out : JoinTwo("lo")) EXPECT_EQ(out, "joined");
  // An interface this host does not have: both ranks fail, naming it,
  // instead of binding somewhere else.
  for (const std::string& out : JoinTwo("trainsup-none0")) {
    EXPECT_NE(out.find("GLOO_SOCKET_IFNAME: cannot bind Gloo to interface \"trainsup-none0\""),
              std::string::npos)
        << out;
  }
}

}  // namespace
}  // namespace trainsup::worker

int main(int argc, char** argv) {
  trainsup::sparse::EnsureFastBlasKernels(argc, argv);
  trainsup::worker::g_self = std::filesystem::canonical("/proc/self/exe").string();
  if (argc == 6 && std::string(argv[1]) == "--join-role") {
    return trainsup::worker::JoinRole(std::atoi(argv[2]), std::atoi(argv[3]), argv[4], argv[5]);
  }
  if (argc > 1 && std::string(argv[1]) == "--rank-role") {
    trainsup::worker::RoleArgs a;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--rank") a.rank = std::atoi(v.c_str());
      if (k == "--world") a.world = std::atoi(v.c_str());
      if (k == "--port") a.port = std::atoi(v.c_str());
      if (k == "--mode") a.mode = v;
      if (k == "--split") a.split = v == "1";
      if (k == "--host-group") a.host_group = v == "1";
      if (k == "--unlabelled") a.unlabelled = v;
      if (k == "--scenes") a.scenes = std::atoi(v.c_str());
      if (k == "--same-scene") a.same_scene = v == "1";
      if (k == "--out") a.out = v;
    }
    try {
      return trainsup::worker::RunRole(a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", a.rank, e.what());
      return 5;
    }
  }
  at::set_num_threads(1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
