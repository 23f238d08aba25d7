// The counting allocator's block cache under a budget: cached blocks count
// in the budget and give way to live tensors, the oldest go first when the
// cache is full, releasing the cache keeps it on, and the training settings
// the worker and minkunet_bench share.
#include "sparse/memory.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace trainsup::sparse {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

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

TEST_F(BlockCache, ReleasingTheCacheKeepsItOn) {
  SetBlockCacheLimit(16 * kMiB);
  { at::Tensor a = at::empty({Floats(4)}, at::kFloat); }
  EXPECT_EQ(GetMemoryStats().cached_bytes, 4 * kMiB);
  ReleaseCachedBlocks();
  EXPECT_EQ(GetMemoryStats().cached_bytes, 0);
  { at::Tensor b = at::empty({Floats(4)}, at::kFloat); }
  EXPECT_EQ(GetMemoryStats().cached_bytes, 4 * kMiB) << "the cache stopped caching";
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
