// The training loop: ForwardBackward splits only on out-of-memory and then
// yields the unsplit batch's gradient, never drops a piece silently, and
// Train() completes a heavy-tailed dataset under a tight budget and beats
// the majority-class baseline on the real CGAL scans.
#include "worker/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/store.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "tests/checkpoint/fault_injection_fs.h"
#include "tests/worker/split/step_test_util.h"
#include "tests/worker/train/trainer_test_util.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"
#include "worker/split/step.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;

// Peak bytes of one unsplit, unbudgeted forward+backward over `batch`.
int64_t MeasurePeak(sparse::MinkUNetImpl& model, const Batch& batch, int channels,
                    const std::vector<at::Tensor>& params, std::vector<at::Tensor>& scratch,
                    at::ScalarType dtype) {
  int64_t peak = 0;
  absl::StatusOr<StepOutcome> r = ForwardBackward(model, batch, channels, params, scratch,
                                                  SplitOptions{}, nullptr, 0, dtype, &peak);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r.ok() ? r->stats.oom_events : -1, 0);
  return peak;
}

TEST(ForwardBackward, SplittingEquivalence) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  Batch batch = SyntheticBatch(4, 0.1);
  ASSERT_EQ(batch.scenes.size(), 4u);
  // MinkUNet14's layout at a quarter of its widths: small weights, so the
  // voxels' activations dominate the peak.
  sparse::MinkUNet model = QuarterMinkUNet14Float64();
  model->eval();  // BatchNorm on its running statistics: per-voxel, batch-independent
  ASSERT_TRUE(at::GradMode::is_enabled());
  std::vector<at::Tensor> params = model->parameters();
  std::vector<at::Tensor> before = Clones(params);
  std::vector<at::Tensor> buffers_before = Clones(model->buffers());
  std::vector<at::Tensor> a = ZerosLike(params), b = ZerosLike(params);

  // Every tensor that stays alive is allocated by now, so the peaks below
  // are comparable. Each scene fits alone; the whole batch needs more.
  int64_t base = sparse::GetMemoryStats().current_bytes;
  int64_t scene_peak = 0;
  for (size_t k = 0; k < batch.scenes.size(); ++k) {
    scene_peak = std::max(
        scene_peak, MeasurePeak(*model, OneScene(batch, k), kChannels, params, b, at::kDouble));
  }
  int64_t batch_peak = MeasurePeak(*model, batch, kChannels, params, b, at::kDouble);
  std::printf("equivalence: scenes of");
  for (const VoxelScene& scene : batch.scenes)
    std::printf(" %lld", static_cast<long long>(scene.voxels()));
  std::printf(" voxels; above the %lld bytes held: one scene at most %lld, the batch %lld\n",
              static_cast<long long>(base), static_cast<long long>(scene_peak - base),
              static_cast<long long>(batch_peak - base));
  ASSERT_GT(batch_peak - base, (scene_peak - base) * 3 / 2) << "scenes too unequal for the test";
  // Too small for two scenes together: the batch is cut down to single scenes.
  const int64_t budget = scene_peak + (batch_peak - scene_peak) / 5;

  absl::StatusOr<StepOutcome> unsplit =
      ForwardBackward(*model, batch, kChannels, params, a, SplitOptions{}, nullptr, 0, at::kDouble);
  ASSERT_TRUE(unsplit.ok()) << unsplit.status();
  EXPECT_EQ(unsplit->stats.forwards, 1);
  EXPECT_EQ(unsplit->stats.splits, 0);

  SplitOptions options;
  options.min_piece_voxels =
      1 << 30;  // whole scenes only: bisecting a scene changes its convolutions
  sparse::SetMemoryBudget(budget);
  absl::StatusOr<StepOutcome> split =
      ForwardBackward(*model, batch, kChannels, params, b, options, nullptr, budget, at::kDouble);
  sparse::SetMemoryBudget(0);
  ASSERT_TRUE(split.ok()) << split.status();
  const SplitStats& s = split->stats;
  std::printf(
      "equivalence: %zu scenes, base %lld, scene peak %lld, batch peak %lld, budget %lld; "
      "forwards %lld, splits %lld, oom events %lld, dropped %lld\n",
      batch.scenes.size(), static_cast<long long>(base), static_cast<long long>(scene_peak),
      static_cast<long long>(batch_peak), static_cast<long long>(budget),
      static_cast<long long>(s.forwards), static_cast<long long>(s.splits),
      static_cast<long long>(s.oom_events), static_cast<long long>(s.dropped_pieces));
  EXPECT_GT(s.splits, 0);
  EXPECT_GT(s.oom_events, 0);
  EXPECT_EQ(s.dropped_pieces, 0);
  EXPECT_EQ(split->labelled, unsplit->labelled);
  EXPECT_NEAR(split->loss, unsplit->loss, 1e-9 * std::abs(unsplit->loss));

  double worst = 0;
  int nonzero = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    double e = RelativeError(a[i], b[i]);
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-5) << "parameter " << i;
    nonzero += a[i].abs().max().item<double>() > 0;
  }
  std::printf("equivalence: max relative gradient error %.3g over %zu parameters\n", worst,
              params.size());
  EXPECT_GT(nonzero, static_cast<int>(params.size()) / 2);

  // No optimizer step inside: parameters, buffers and .grad untouched.
  std::vector<at::Tensor> buffers = model->buffers();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i])) << "parameter " << i;
    EXPECT_FALSE(params[i].grad().defined()) << "parameter " << i;
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_TRUE(torch::equal(buffers[i], buffers_before[i])) << "buffer " << i;
  }

  // Exactly one SGD step from identical copies: the same parameters, and
  // each moved by exactly lr * gradient (momentum's first step).
  const double lr = 0.1;
  auto step = [&](const std::vector<at::Tensor>& grads) {
    std::vector<at::Tensor> copy;
    for (const at::Tensor& p : before) copy.push_back(p.clone().set_requires_grad(true));
    for (size_t i = 0; i < copy.size(); ++i) copy[i].mutable_grad() = grads[i].clone();
    torch::optim::SGD sgd(copy, torch::optim::SGDOptions(lr).momentum(0.9));
    sgd.step();
    return copy;
  };
  std::vector<at::Tensor> pa = step(a), pb = step(b);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LT(RelativeError(pa[i], pb[i]), 1e-12) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(pa[i], before[i] - lr * a[i], 0, 1e-15)) << "parameter " << i;
  }
}

// Mixed precision (train.precision = "bf16"): the same whole-scene split
// as above, with bfloat16 features and a float32 model. Splitting may not
// add error beyond what bf16 itself brings: the split step's gradient
// differs from the unsplit bf16 step's by no more than that step differs
// from the float32 one, measured in the same test (norms over all
// parameters). The per-scene activations are the same either way; what
// splitting changes is where the weight gradients are rounded to bf16
// (once per group instead of once per batch) and the loss weights.
TEST(ForwardBackward, SplittingEquivalenceInBf16) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  Batch batch = SyntheticBatch(4, 0.1);
  sparse::MinkUNet model = QuarterMinkUNet14Float64();
  model->to(torch::kFloat32);
  model->eval();
  std::vector<at::Tensor> params = model->parameters();
  std::vector<at::Tensor> bf = ZerosLike(params), split = ZerosLike(params),
                          fp32 = ZerosLike(params), scratch = ZerosLike(params);
  int64_t scene_peak = 0;
  for (size_t k = 0; k < batch.scenes.size(); ++k) {
    scene_peak = std::max(scene_peak, MeasurePeak(*model, OneScene(batch, k), kChannels, params,
                                                  scratch, at::kBFloat16));
  }
  const int64_t batch_peak = MeasurePeak(*model, batch, kChannels, params, scratch, at::kBFloat16);
  const int64_t budget = scene_peak + (batch_peak - scene_peak) / 5;
  auto run = [&](std::vector<at::Tensor>& into, at::ScalarType dtype, int64_t limit) {
    SplitOptions options;
    options.min_piece_voxels = 1 << 30;  // whole scenes only
    sparse::SetMemoryBudget(limit);
    absl::StatusOr<StepOutcome> r =
        ForwardBackward(*model, batch, kChannels, params, into, options, nullptr, limit, dtype);
    sparse::SetMemoryBudget(0);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : StepOutcome{};
  };
  const StepOutcome unsplit = run(bf, at::kBFloat16, 0);
  const StepOutcome pieces = run(split, at::kBFloat16, budget);
  const StepOutcome full = run(fp32, at::kFloat, 0);
  EXPECT_EQ(unsplit.stats.splits, 0);
  EXPECT_GT(pieces.stats.splits, 0);
  EXPECT_EQ(pieces.stats.dropped_pieces, 0);
  EXPECT_EQ(pieces.labelled, unsplit.labelled);
  double split_err = 0, bf16_err = 0, norm = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    split_err += (split[i] - bf[i]).pow(2).sum().item<double>();
    bf16_err += (bf[i] - fp32[i]).pow(2).sum().item<double>();
    norm += fp32[i].pow(2).sum().item<double>();
  }
  split_err = std::sqrt(split_err / norm);
  bf16_err = std::sqrt(bf16_err / norm);
  std::printf(
      "bf16 equivalence: %lld splits; relative gradient difference split vs unsplit %.3g, "
      "bf16 vs fp32 %.3g; loss %.6f split, %.6f unsplit, %.6f fp32; peaks: scene %lld, batch "
      "%lld bytes\n",
      static_cast<long long>(pieces.stats.splits), split_err, bf16_err, pieces.loss, unsplit.loss,
      full.loss, static_cast<long long>(scene_peak), static_cast<long long>(batch_peak));
  EXPECT_GT(bf16_err, 0.0);  // bf16 did run
  EXPECT_LE(split_err, bf16_err);
  EXPECT_LE(std::abs(pieces.loss - unsplit.loss), std::abs(unsplit.loss - full.loss) + 1e-6);
}

TEST(ForwardBackward, OnlyOutOfMemorySplits) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  Batch batch = SyntheticBatch(3, 0.2);
  torch::manual_seed(3);
  sparse::MinkUNet model(sparse::MinkUNetPlan(14, kChannels, kClasses));
  std::vector<at::Tensor> params = model->parameters();
  std::vector<at::Tensor> accum = ZerosLike(params);
  // A budget the batch cannot fit in: were the error taken for an
  // out-of-memory, the batch would be split and retried.
  int64_t budget = sparse::GetMemoryStats().current_bytes + (1 << 20);
  sparse::SetMemoryBudget(budget);
  int64_t refused = sparse::GetMemoryStats().refused;
  std::string message;
  try {
    // One channel more than the model takes: the stem's TORCH_CHECK fails.
    ForwardBackward(*model, batch, kChannels + 1, params, accum, SplitOptions{}, nullptr, budget)
        .IgnoreError();
    ADD_FAILURE() << "ForwardBackward returned";
  } catch (const c10::OutOfMemoryError& e) {
    ADD_FAILURE() << "an out-of-memory error escaped: " << e.what();
  } catch (const c10::Error& e) {
    message = e.what();
  }
  sparse::SetMemoryBudget(0);
  std::printf("shape error: %s\n", message.substr(0, message.find('\n')).c_str());
  EXPECT_NE(message.find("expects 3 input channels, got 4"), std::string::npos) << message;
  // The first forward failed on the shape; nothing ran out of memory, so
  // nothing was split or retried, and no gradient arrived.
  EXPECT_EQ(sparse::GetMemoryStats().refused, refused);
  for (const at::Tensor& g : accum) EXPECT_EQ(g.abs().max().item<double>(), 0);
}

TEST(ForwardBackward, NoSilentDrop) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  Batch batch = SyntheticBatch(3, 0.05);
  int64_t largest = 0;
  for (const VoxelScene& s : batch.scenes) largest = std::max(largest, s.voxels());
  torch::manual_seed(3);
  sparse::MinkUNet model(sparse::MinkUNetPlan(14, kChannels, kClasses));
  std::vector<at::Tensor> params = model->parameters();
  std::vector<at::Tensor> accum = ZerosLike(params);
  // The model and the accumulators fit; no scene does, and every scene is
  // at the floor.
  int64_t budget = sparse::GetMemoryStats().current_bytes + (256 << 10);
  SplitOptions options;
  options.min_piece_voxels = largest;
  sparse::SetMemoryBudget(budget);
  absl::StatusOr<StepOutcome> r =
      ForwardBackward(*model, batch, kChannels, params, accum, options, nullptr, budget);
  sparse::SetMemoryBudget(0);
  ASSERT_TRUE(r.ok()) << r.status();
  const SplitStats& s = r->stats;
  std::printf("no silent drop: %lld forwards, %lld oom events, %lld dropped pieces (%lld voxels)\n",
              static_cast<long long>(s.forwards), static_cast<long long>(s.oom_events),
              static_cast<long long>(s.dropped_pieces), static_cast<long long>(s.dropped_voxels));
  EXPECT_EQ(s.dropped_pieces, 3);
  int64_t voxels = 0;
  for (const VoxelScene& scene : batch.scenes) voxels += scene.voxels();
  EXPECT_EQ(s.dropped_voxels, voxels);
  EXPECT_EQ(r->labelled, 0);
  ASSERT_EQ(s.drop_reasons.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    bool named = false;
    for (const std::string& why : s.drop_reasons) {
      named |= why.rfind("scene " + std::to_string(k) + ":", 0) == 0;
    }
    EXPECT_TRUE(named) << "no drop reason names scene " << k;
  }
  std::printf("no silent drop: %s\n", s.drop_reasons[0].substr(0, 160).c_str());
  for (const at::Tensor& g : accum) EXPECT_EQ(g.abs().max().item<double>(), 0);
}

TEST(TrainingDevice, FollowsTheSpecAndTheDevicesPresent) {
  const c10::Device cpu(c10::DeviceType::CPU), cuda(c10::DeviceType::CUDA, 0);
  EXPECT_EQ(*TrainingDevice("auto", false), cpu);
  EXPECT_EQ(*TrainingDevice("auto", true), cuda);
  EXPECT_EQ(*TrainingDevice("cpu", true), cpu);
  EXPECT_EQ(*TrainingDevice("cuda", true), cuda);
  absl::StatusOr<c10::Device> none = TrainingDevice("cuda", false);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no CUDA device"), std::string::npos);
  EXPECT_FALSE(TrainingDevice("tpu", true).ok());
}

TEST(Train, CudaWithoutADeviceIsAUsageError) {
  if (sparse::CudaDeviceAvailable()) GTEST_SKIP() << "this worker has a CUDA device";
  RunSpec spec = SyntheticSpec(2, 0.05, 1);
  spec.train.device = "cuda";
  Captured c;
  TrainerResult r = RunTrain(spec, "nocuda", &c);
  EXPECT_EQ(r.exit_code, 64);
  EXPECT_EQ(r.reason, "usage");
  EXPECT_NE(r.message.find("train.device: \"cuda\", but this worker has no CUDA device"),
            std::string::npos)
      << r.message;
}

// train.empty_cache_every_steps: the allocator's cached blocks go back on
// that interval, and the log says how much.
TEST(Train, EmptiesTheCacheOnItsInterval) {
  sparse::InstallCountingAllocator();
  sparse::SetBlockCacheLimit(int64_t{512} << 20);
  RunSpec spec = SyntheticSpec(2, 0.02, 3);
  spec.train.empty_cache_every_steps = 2;
  Captured c;
  TrainerResult r = RunTrain(spec, "emptycache", &c);
  sparse::SetBlockCacheLimit(0);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  std::vector<int64_t> handed;
  for (const std::string& line : c.logs) {
    const size_t at = line.find(": handed ");
    if (at == std::string::npos) continue;
    EXPECT_EQ(line.rfind("step 2: handed ", 0), 0u) << line;  // steps 2 of 3 only
    handed.push_back(std::stoll(line.substr(at + 9)));
  }
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_GT(handed[0], 0);  // a step frees blocks of at least 1 MiB
}

TEST(Train, ReportsDroppedScenesInItsEvents) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = SyntheticSpec(4, 0.05, 2);
  spec.train.min_piece_points = 1000000000;  // every scene is at the floor
  // The model and the gradient accumulators, plus at most 2 MiB: no room
  // of ~10k voxels fits, so nothing trains and no optimizer state is made.
  int64_t model_bytes = 2 * ParameterBytes(kChannels, kClasses);
  spec.train.memory_budget_mb = (model_bytes >> 20) + 2;
  Captured c;
  TrainerResult r = RunTrain(spec, "drop", &c);
  std::printf("drop run: exit %d (%s): %s\n", r.exit_code, r.reason.c_str(), r.message.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.last_step, 2);
  EXPECT_GT(c.dropped, 0);
  EXPECT_NE(r.message.find("dropped pieces " + std::to_string(c.dropped)), std::string::npos)
      << r.message;
  int drop_events = 0;
  for (const auto& [kind, message] : c.events) {
    if (kind == v1::EVENT_KIND_OOM_SPLIT && message.rfind("dropped: scene ", 0) == 0) drop_events++;
  }
  EXPECT_EQ(drop_events, c.dropped);
  int drop_logs = 0;
  for (const std::string& line : c.logs) drop_logs += line.rfind("dropped: scene ", 0) == 0;
  EXPECT_EQ(drop_logs, c.dropped);
  bool skipped = false;
  for (const std::string& line : c.logs) {
    skipped |= line.find("no labelled voxel fitted in memory") != std::string::npos;
  }
  EXPECT_TRUE(skipped);
}

// Calibration before the first step: probes through the real model make
// the memory model ready, stay within the budget, and leave parameters,
// BatchNorm statistics and accumulators as they were.
TEST(CalibrateMemory, MakesTheModelReadyAndLeavesTheModelAsItWas) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  DataSpec data;
  data.format = "synthetic";
  data.scenes = 6;
  data.scene_size = "small";
  data.val_fraction = 0;
  ModelSpec model_spec;
  model_spec.voxel_size = 0.1;
  absl::StatusOr<std::unique_ptr<Dataset>> dataset =
      OpenDataset(data, model_spec, 7, Split::kTrain);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  torch::manual_seed(3);
  sparse::MinkUNet model(sparse::MinkUNetPlan(14, kChannels, kClasses));
  model->train();
  std::vector<at::Tensor> params = model->parameters();
  std::vector<at::Tensor> accum = ZerosLike(params);
  const std::vector<at::Tensor> params_before = Clones(params);
  const std::vector<at::Tensor> buffers_before = Clones(model->buffers());
  // Room for the probes above what is held, but not for all four scenes.
  const int64_t budget = sparse::GetMemoryStats().current_bytes + (96 << 20);
  sparse::ApplyAllocatorSettings(sparse::TrainingAllocatorSettings(budget));
  LoaderOptions lo;
  lo.voxel_size = 0.1;
  SplitOptions options;
  options.coarsest_stride = sparse::kMinkUNetCoarsestStride;
  MemoryModel predictor;
  const int64_t refused = sparse::GetMemoryStats().refused;
  absl::StatusOr<CalibrationStats> stats =
      CalibrateMemory(*model, **dataset, lo, 4, kChannels, params, accum, options, &predictor,
                      budget, /*extra_bytes=*/0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::printf("calibration: %lld probes up to %lld voxels, peak %lld MiB of a %lld MiB budget\n",
              static_cast<long long>(stats->probes), static_cast<long long>(stats->largest_voxels),
              static_cast<long long>(stats->largest_peak >> 20),
              static_cast<long long>(budget >> 20));
  EXPECT_EQ(stats->oom_events, 0);
  EXPECT_EQ(sparse::GetMemoryStats().refused, refused);
  EXPECT_TRUE(predictor.ready());
  EXPECT_LE(stats->largest_peak, budget);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i], params_before[i]));
  const std::vector<at::Tensor> buffers = model->buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_TRUE(at::equal(buffers[i], buffers_before[i])) << "buffer " << i << " changed";
  }
  for (const at::Tensor& a : accum) EXPECT_EQ(a.abs().max().item<double>(), 0);
  // The extra bytes are added to what the probes measure.
  MemoryModel with_extra;
  ASSERT_TRUE(CalibrateMemory(*model, **dataset, lo, 4, kChannels, params, accum, options,
                              &with_extra, budget, 4 << 20)
                  .ok());
  EXPECT_GT(with_extra.Predict(1000), predictor.Predict(1000) + (3 << 20));
  // Without a budget nothing runs.
  MemoryModel none;
  absl::StatusOr<CalibrationStats> nothing =
      CalibrateMemory(*model, **dataset, lo, 4, kChannels, params, accum, options, &none, 0, 0);
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(nothing->probes, 0);
  EXPECT_EQ(none.observations(), 0);
}

// The worker runs with the allocator settings minkunet_bench measures
// (sparse::TrainingAllocatorSettings): a block cache sized against the
// budget, counted in it, and reused from step to step.
TEST(Train, UsesTheAllocatorSettingsTheBenchmarkMeasures) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  RunSpec spec = SyntheticSpec(4, 0.1, 4);
  spec.train.memory_budget_mb = 1024;
  const int64_t budget = spec.train.memory_budget_mb << 20;
  const int64_t hits = sparse::GetMemoryStats().cache_hits;
  Captured c;
  TrainerResult r = RunTrain(spec, "allocator", &c);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(c.after.budget_bytes, budget);
  EXPECT_EQ(c.after.block_cache_limit_bytes,
            sparse::TrainingAllocatorSettings(budget).block_cache_bytes);
  EXPECT_GT(c.after.cache_hits, hits) << "the block cache was not used";
  EXPECT_LE(c.after.current_bytes + c.after.cached_bytes, budget);
  bool logged = false;
  for (const std::string& line : c.logs) {
    logged |=
        line.find(sparse::ToString(sparse::TrainingAllocatorSettings(budget))) != std::string::npos;
  }
  EXPECT_TRUE(logged) << "the settings are not in the log";
  // It calibrated its memory model before the first step (predictive
  // splitting under a budget is the default).
  bool calibrated = false;
  for (const std::string& line : c.logs) {
    const std::string ready = "; ready";
    calibrated |= line.rfind("memory model calibrated before the first step", 0) == 0 &&
                  line.size() > ready.size() &&
                  line.compare(line.size() - ready.size(), ready.size(), ready) == 0;
  }
  EXPECT_TRUE(calibrated) << "no calibration in the log";
}

TEST(Train, HeavyTailedUnderTightBudget) {
  sparse::InstallCountingAllocator();
  BudgetGuard guard;
  const double voxel = 0.1;
  const int64_t scenes = 10;
  RunSpec spec = SyntheticSpec(scenes, voxel, 12);
  spec.data.size_distribution = "heavy_tailed";
  spec.train.min_piece_points = 200;

  // Measure what one small room, two small rooms and the large room need
  // on top of the model and its accumulators.
  int64_t act_pair = 0, act_large = 0, largest = 0, smallest = 0, param_bytes = 0;
  {
    DataSpec data = spec.data;
    absl::StatusOr<std::unique_ptr<Dataset>> dataset =
        OpenDataset(data, spec.model, spec.train.seed, Split::kTrain);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    LoaderOptions lo;
    lo.voxel_size = voxel;
    lo.augment = false;
    Batch all;
    for (int64_t i = 0; i < (*dataset)->size(); ++i) {
      absl::StatusOr<VoxelScene> scene = PrepareScene(**dataset, i, 0, lo);
      ASSERT_TRUE(scene.ok()) << scene.status();
      all.scenes.push_back(std::move(*scene));
    }
    std::vector<size_t> order(all.scenes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return all.scenes[x].voxels() < all.scenes[y].voxels(); });
    smallest = all.scenes[order.front()].voxels();
    largest = all.scenes[order.back()].voxels();
    Batch pair;  // the two largest of the small rooms
    pair.scenes = {all.scenes[order[order.size() - 2]], all.scenes[order[order.size() - 3]]};
    torch::manual_seed(3);
    sparse::MinkUNet model(sparse::MinkUNetPlan(14, kChannels, kClasses));
    std::vector<at::Tensor> params = model->parameters();
    std::vector<at::Tensor> scratch = ZerosLike(params);
    param_bytes = model->NumParameters() * static_cast<int64_t>(sizeof(float));
    int64_t base = sparse::GetMemoryStats().current_bytes;
    act_pair = MeasurePeak(*model, pair, kChannels, params, scratch, at::kFloat) - base;
    act_large =
        MeasurePeak(*model, OneScene(all, order.back()), kChannels, params, scratch, at::kFloat) -
        base;
  }
  std::printf(
      "heavy-tailed: rooms of %lld..%lld voxels; parameters %lld MiB; forward+backward "
      "above the model: two small rooms %lld MiB, the large room %lld MiB\n",
      static_cast<long long>(smallest), static_cast<long long>(largest),
      static_cast<long long>(param_bytes >> 20), static_cast<long long>(act_pair >> 20),
      static_cast<long long>(act_large >> 20));
  ASSERT_GT(largest, 5 * smallest);
  ASSERT_GT(act_large, act_pair * 3 / 2) << "the large room must need far more than a pair";
  // Training holds the parameters, the accumulators and SGD's momentum;
  // between the pair's need and the large room's.
  const int64_t headroom = (act_pair + act_large) / 2;
  spec.train.memory_budget_mb = (3 * param_bytes + headroom) >> 20;

  struct Figures {
    int64_t splits, retries, wasted, dropped;
  };
  std::vector<Figures> figures;
  for (bool predictive : {true, false}) {
    spec.train.predictive_split = predictive;
    Captured c;
    TrainerResult r = RunTrain(spec, predictive ? "predictive" : "reactive", &c);
    std::printf(
        "heavy-tailed, budget %lld MiB, %s splitting: exit %d; splits %lld, out-of-memory "
        "retries %lld, wasted forwards %lld, dropped pieces %lld; peak %lld MiB\n  %s\n",
        static_cast<long long>(spec.train.memory_budget_mb), predictive ? "predictive" : "reactive",
        r.exit_code, static_cast<long long>(c.splits), static_cast<long long>(c.retries),
        static_cast<long long>(c.wasted), static_cast<long long>(c.dropped),
        static_cast<long long>(c.peak >> 20), r.message.c_str());
    EXPECT_EQ(r.exit_code, 0) << r.message;
    EXPECT_EQ(r.last_step, 12);
    EXPECT_LE(c.peak, spec.train.memory_budget_mb << 20);
    EXPECT_EQ(c.dropped, 0);
    figures.push_back({c.splits, c.retries, c.wasted, c.dropped});
  }
  EXPECT_GT(figures[1].splits, 0) << "the budget never bit";
  EXPECT_GT(figures[1].wasted, 0);
  EXPECT_LE(figures[0].wasted, figures[1].wasted);
}

// The CGAL samples fetched by deploy/fetch-sample-data.sh.
std::string SamplePath(const std::string& name) {
  return (fs::path(TRAINSUP_SAMPLE_DATA_DIR) / name).string();
}

void ExpectBeatsBaseline(RunSpec spec, const std::string& name) {
  sparse::InstallCountingAllocator();
  Captured c;
  TrainerResult r = RunTrain(spec, name, &c);
  std::printf("%s: exit %d; val mIoU %.3f (accuracy %.3f) vs majority baseline mIoU %.3f\n",
              name.c_str(), r.exit_code, r.val_miou, r.val_accuracy, r.baseline_miou);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  ASSERT_GE(r.baseline_miou, 0) << "no validation split";
  EXPECT_GT(r.val_miou, r.baseline_miou + 0.1) << r.message;
}

RunSpec SampleSpec(const std::string& format, const std::string& path, int channels,
                   double tile_size, int64_t steps) {
  RunSpec spec;
  spec.model.arch = "minkunet14";
  spec.model.in_channels = channels;
  spec.model.voxel_size = 0.5;
  spec.data.format = format;
  spec.data.path = path;
  spec.data.use_features = false;
  spec.data.tile_size = tile_size;
  spec.optimizer.kind = "sgd";
  spec.optimizer.lr = 0.05;
  spec.train.batch_size = 4;
  spec.train.steps = steps;
  spec.train.checkpoint_every_steps = 0;
  return spec;
}

TEST(Train, BeatsMajorityBaselineOnRealScans) {
  const std::string urban = SamplePath("urban.las"), b9 = SamplePath("b9_training.ply");
  if (!fs::exists(urban) || !fs::exists(b9)) {
    GTEST_SKIP() << "run deploy/fetch-sample-data.sh for " << urban << " and " << b9;
  }
  RunSpec las = SampleSpec("las", urban, 2, 20, 100);
  las.model.height_feature = true;
  las.data.val_fraction = 0.25;
  ExpectBeatsBaseline(las, "urban.las");
  // Nine in ten of b9's points are unlabelled (-1): a quarter of its tiles
  // holds enough labelled ones of every class to measure on.
  RunSpec ply = SampleSpec("ply", b9, 1, 10, 80);
  ply.data.val_fraction = 0.25;
  ExpectBeatsBaseline(ply, "b9_training.ply");
}

}  // namespace
}  // namespace trainsup::worker
