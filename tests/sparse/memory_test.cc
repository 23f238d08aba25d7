// Memory accounting by device (sparse/memory.h): the CPU overloads are the
// counting allocator; on CUDA the caching allocator's statistics, its
// memory fraction as the budget, and an out-of-memory error under a small
// fraction that a step survives by splitting its input, as the worker does.
// The CUDA tests carry the ctest label gpu and skip without a device.
// Then the counting allocator's block cache under a budget: cached blocks
// count in the budget and give way to live tensors, the oldest go first
// when the cache is full, and the training settings the worker and
// minkunet_bench share.
#include "sparse/memory.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <string>

#include "sparse/minkunet.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::ErrorMessage;
using testing::MakeRandomInput;

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(Memory, CpuOverloadsAreTheCountingAllocator) {
  InstallCountingAllocator();
  const c10::Device cpu(c10::DeviceType::CPU);
  EXPECT_EQ(GetMemoryStats(cpu).current_bytes, GetMemoryStats().current_bytes);
  SetBlockCacheLimit(64 * kMiB);
  {
    at::Tensor t = at::empty({4 * kMiB / 4}, at::kFloat);
    EXPECT_GE(GetMemoryStats(cpu).current_bytes, 4 * kMiB);
  }
  EXPECT_GE(GetMemoryStats(cpu).cached_bytes, 4 * kMiB);
  ReleaseCachedMemory(cpu);
  EXPECT_EQ(GetMemoryStats(cpu).cached_bytes, 0);
  { at::Tensor t = at::empty({4 * kMiB / 4}, at::kFloat); }
  // Releasing kept the cache's limit: the freed block is cached again.
  EXPECT_GE(GetMemoryStats(cpu).cached_bytes, 4 * kMiB);
  SetBlockCacheLimit(0);
  SetMemoryBudget(cpu, GetMemoryStats(cpu).current_bytes + kMiB);
  EXPECT_EQ(GetMemoryStats(cpu).budget_bytes, GetMemoryStats().budget_bytes);
  EXPECT_THROW(at::empty({4 * kMiB}, at::kFloat), c10::OutOfMemoryError);
  SetMemoryBudget(cpu, 0);
}

TEST(Memory, CudaOverloadsNameTheMissingBackend) {
#if TRAINSUP_HAVE_CUDA
  GTEST_SKIP() << "this build has the CUDA backend";
#else
  EXPECT_FALSE(CudaDeviceAvailable());
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  EXPECT_NE(ErrorMessage([&] {
              GetMemoryStats(cuda);
            }).find("memory of cuda:0: this build has no CUDA backend"),
            std::string::npos);
  EXPECT_NE(ErrorMessage([&] { SetMemoryBudget(cuda, kMiB); }).find("no CUDA backend"),
            std::string::npos);
#endif
}

TEST(CudaMemory, StatsComeFromTheCachingAllocator) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  ReleaseCachedMemory(cuda);
  ResetPeakMemory(cuda);
  const int64_t before = GetMemoryStats(cuda).current_bytes;
  {
    at::Tensor t = at::empty({64 * kMiB / 4}, at::TensorOptions().dtype(at::kFloat).device(cuda));
    EXPECT_GE(GetMemoryStats(cuda).current_bytes, before + 64 * kMiB);
  }
  const MemoryStats after = GetMemoryStats(cuda);
  EXPECT_LT(after.current_bytes, before + 64 * kMiB);
  EXPECT_GE(after.peak_bytes, before + 64 * kMiB);
  EXPECT_GE(after.cached_bytes, 64 * kMiB);  // the freed block stays with the allocator
  ReleaseCachedMemory(cuda);
  EXPECT_LT(GetMemoryStats(cuda).cached_bytes, 64 * kMiB);
  EXPECT_NE(ErrorMessage([&] {
              SetMemoryBudget(cuda, int64_t{1} << 60);
            }).find("is more than cuda:0 has"),
            std::string::npos);
}

// A small MinkUNet14 step over one scene under a budget of `budget_extra`
// bytes above the model: whenever a piece runs out of memory, the cached
// memory is handed back and the piece is cut in two at the median x, down
// to kFloor rows. Every row must end up trained on, no piece's peak past
// the budget. Returns the number of splits.
int64_t TrainSplitting(c10::Device device, int64_t budget_extra) {
  torch::manual_seed(8);
  MinkUNetConfig config = MinkUNetPlan(14, 3, 5);
  config.planes = {16, 32, 64, 64, 64, 32, 32, 32};
  config.init_dim = 16;
  MinkUNet model(config);
  model->to(device);
  auto scene = MakeRandomInput(1, 48, 0.3, 3, at::kFloat, 45);
  const int64_t n = scene.coordinates.size(0);
  if (device.is_cuda()) {
    // cuBLAS allocates its workspace (32 MiB with CUBLAS_WORKSPACE_CONFIG
    // =:4096:8) through the caching allocator at its first call in the
    // process: one unbudgeted step on a small piece makes it, and the
    // gradients, part of what the budget is measured above, as they are
    // for a worker after its first step. (Reasoned from LibTorch's code:
    // this test has never run on a GPU.)
    const at::Tensor rows = at::arange(std::min<int64_t>(n, 500), at::kLong);
    const at::Tensor c = scene.coordinates.index_select(0, rows);
    SparseTensor x(scene.features.index_select(0, rows).to(device), c);
    at::Tensor labels = c.select(1, 1).remainder(5).to(at::kLong).to(device);
    torch::nll_loss(torch::log_softmax(model->forward(x).F(), 1), labels).backward();
  }
  ReleaseCachedMemory(device);
  const int64_t budget = GetMemoryStats(device).current_bytes + budget_extra;
  SetMemoryBudget(device, budget);
  std::deque<at::Tensor> pieces = {at::arange(n, at::kLong)};
  int64_t trained = 0, splits = 0, peak = 0;
  constexpr int64_t kFloor = 200;
  while (!pieces.empty()) {
    const at::Tensor rows = pieces.front();
    pieces.pop_front();
    try {
      ResetPeakMemory(device);
      const at::Tensor c = scene.coordinates.index_select(0, rows);
      SparseTensor x(scene.features.index_select(0, rows).to(device), c);
      SparseTensor y = model->forward(x);
      at::Tensor labels = c.select(1, 1).remainder(5).to(at::kLong).to(device);
      torch::nll_loss(torch::log_softmax(y.F(), 1), labels).backward();
      peak = std::max(peak, GetMemoryStats(device).peak_bytes);
      trained += rows.size(0);
    } catch (const c10::OutOfMemoryError&) {
      ReleaseCachedMemory(device);
      EXPECT_GT(rows.size(0), kFloor) << "a piece of " << rows.size(0) << " rows does not fit";
      if (rows.size(0) <= kFloor) break;
      const at::Tensor x = scene.coordinates.index_select(0, rows).select(1, 1);
      const at::Tensor order = x.argsort();
      const int64_t half = rows.size(0) / 2;
      pieces.push_back(rows.index_select(0, order.slice(0, 0, half)));
      pieces.push_back(rows.index_select(0, order.slice(0, half)));
      ++splits;
    }
  }
  EXPECT_EQ(trained, n) << "rows left untrained";
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, budget);
  // Recovered: without the budget, the whole scene trains in one piece.
  SetMemoryBudget(device, 0);
  SparseTensor x(scene.features.to(device), scene.coordinates);
  EXPECT_EQ(model->forward(x).F().size(0), n);
  ReleaseCachedMemory(device);
  return splits;
}

TEST(Memory, OutOfMemoryUnderABudgetIsSplitAndRecoveredOnTheCpu) {
  InstallCountingAllocator();
  EXPECT_GT(TrainSplitting(c10::Device(c10::DeviceType::CPU), 24 * kMiB), 0);
}

TEST(CudaMemory, OutOfMemoryUnderASmallFractionIsSplitAndRecovered) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  EXPECT_GT(TrainSplitting(cuda, 24 * kMiB), 0);
  EXPECT_EQ(GetMemoryStats(cuda).budget_bytes, 0);  // the fraction is back to the whole device
}

// Floats for `mib` MiB.
int64_t Floats(int64_t mib) { return mib * kMiB / 4; }

// Restores the process's allocator settings (other tests share them).
class BlockCache : public ::testing::Test {
 protected:
  void SetUp() override {
    InstallCountingAllocator();
    SetMemoryBudget(0);
    SetBlockCacheLimit(0);
  }
  void TearDown() override {
    SetMemoryBudget(0);
    SetBlockCacheLimit(0);
  }
};

// LibTorch's raw_allocate (used by some ATen kernels, e.g. the dense
// convolutions of the reference tests) needs the data pointer to be the
// deleter's context; the counting allocator's first version failed its
// internal assert as soon as it was installed.
TEST_F(BlockCache, RawAllocationsWorkAndAreCounted) {
  c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::CPU);
  const int64_t before = GetMemoryStats().current_bytes;
  void* p = allocator->raw_allocate(3 * kMiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(GetMemoryStats().current_bytes, before + 3 * kMiB);
  static_cast<char*>(p)[3 * kMiB - 1] = 1;
  allocator->raw_deallocate(p);
  EXPECT_EQ(GetMemoryStats().current_bytes, before);
}

TEST_F(BlockCache, CachedBlocksCountInTheBudgetAndGiveWayToLiveTensors) {
  const int64_t rest = GetMemoryStats().current_bytes;
  SetMemoryBudget(rest + 40 * kMiB);
  SetBlockCacheLimit(64 * kMiB);  // larger than the budget leaves: the budget bounds it
  { at::Tensor a = at::empty({Floats(24)}, at::kFloat); }
  EXPECT_EQ(GetMemoryStats().cached_bytes, 24 * kMiB);
  // 30 MiB live fits the budget only once the cached 24 MiB are let go.
  at::Tensor b = at::empty({Floats(30)}, at::kFloat);
  MemoryStats s = GetMemoryStats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_LE(s.current_bytes + s.cached_bytes, rest + 40 * kMiB);
  EXPECT_GE(s.evicted_bytes, 24 * kMiB);
  // Freed, it is kept only while live + cached stay within the budget.
  at::Tensor c = at::empty({Floats(8)}, at::kFloat);
  b = at::Tensor();  // 30 MiB back with 8 live: 38 <= 40, kept
  s = GetMemoryStats();
  EXPECT_EQ(s.cached_bytes, 30 * kMiB);
  EXPECT_LE(s.current_bytes + s.cached_bytes, rest + 40 * kMiB);
  at::Tensor d = at::empty({Floats(6)}, at::kFloat);  // evicts: 8 + 6 + 30 > 40
  c = at::Tensor();
  s = GetMemoryStats();
  EXPECT_LE(s.current_bytes + s.cached_bytes, rest + 40 * kMiB);
  // What does not fit live is still refused, with the cache emptied first.
  const int64_t refused = s.refused;
  EXPECT_THROW(at::empty({Floats(36)}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(GetMemoryStats().refused, refused + 1);
}

TEST_F(BlockCache, TheOldestBlocksGoFirstWhenTheCacheIsFull) {
  SetBlockCacheLimit(10 * kMiB);
  {
    at::Tensor a = at::empty({Floats(4)}, at::kFloat);
    at::Tensor b = at::empty({Floats(5)}, at::kFloat);
    a = at::Tensor();  // cached first
    b = at::Tensor();  // cached second: 9 MiB
  }
  EXPECT_EQ(GetMemoryStats().cached_bytes, 9 * kMiB);
  // A third block needs room: the 4 MiB one (the oldest) goes, the 5 MiB one stays.
  { at::Tensor c = at::empty({Floats(3)}, at::kFloat); }
  EXPECT_EQ(GetMemoryStats().cached_bytes, 8 * kMiB);
  const int64_t hits = GetMemoryStats().cache_hits;
  at::Tensor again = at::empty({Floats(5)}, at::kFloat);
  EXPECT_EQ(GetMemoryStats().cache_hits, hits + 1);
  at::Tensor fresh = at::empty({Floats(4)}, at::kFloat);
  EXPECT_EQ(GetMemoryStats().cache_hits, hits + 1) << "the evicted 4 MiB block was reused";
}

TEST_F(BlockCache, TrainingSettingsSizeTheCacheAgainstTheBudget) {
  const AllocatorSettings none = TrainingAllocatorSettings(0);
  EXPECT_EQ(none.budget_bytes, 0);
  EXPECT_EQ(none.block_cache_bytes, kDefaultBlockCacheBytes);
  const AllocatorSettings budget = TrainingAllocatorSettings(300 * kMiB);
  EXPECT_EQ(budget.budget_bytes, 300 * kMiB);
  // Whatever the live tensors leave of the budget, and never more.
  EXPECT_EQ(budget.block_cache_bytes, 300 * kMiB);
  ApplyAllocatorSettings(budget);
  EXPECT_EQ(GetMemoryStats().budget_bytes, 300 * kMiB);
  EXPECT_EQ(GetMemoryStats().block_cache_limit_bytes, 300 * kMiB);
  EXPECT_NE(ToString(budget).find("block cache"), std::string::npos);
}

}  // namespace
}  // namespace trainsup::sparse
