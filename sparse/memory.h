// Accounting of LibTorch's CPU memory: a wrapper around the CPU allocator
// that counts every tensor allocation (current and peak bytes) and can
// enforce a budget, raising the same out-of-memory error a GPU would
// (c10::OutOfMemoryError) for an allocation past it. The device overloads
// at the end answer for the CPU from it and for CUDA from LibTorch's
// caching allocator, so the worker treats both alike.
#ifndef TRAINSUP_SPARSE_MEMORY_H_
#define TRAINSUP_SPARSE_MEMORY_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace trainsup::sparse {

struct MemoryStats {
  int64_t current_bytes = 0;  // held by live tensors
  int64_t peak_bytes = 0;
  int64_t budget_bytes = 0;  // 0: none
  int64_t allocations = 0;
  int64_t refused = 0;       // allocations that raised out-of-memory
  int64_t cached_bytes = 0;  // freed large blocks kept for reuse
  int64_t cache_hits = 0;
  int64_t block_cache_limit_bytes = 0;
  int64_t evicted_bytes = 0;  // cached blocks freed to make room (limit or budget)
};

// Installs the counting allocator as LibTorch's CPU allocator (once per
// process; later calls do nothing). Memory allocated before is not counted.
void InstallCountingAllocator();
bool CountingAllocatorInstalled();
MemoryStats GetMemoryStats();
// Peak back to the current use.
void ResetPeakMemory();
// 0 removes the budget.
void SetMemoryBudget(int64_t bytes);
// Freed blocks of at least 1 MiB are kept (up to `bytes` in all) and handed
// out again for an allocation of the same size: training repeats the same
// shapes every step, and a fresh large block costs page faults and zeroing
// on every use. Cached blocks do not count as current use, but they count
// in the budget: live + cached never exceeds it. An allocation that would
// cross the budget only because of cached blocks frees the oldest of them
// first (out-of-memory is raised only when the live tensors alone would
// cross it), a block is kept only while live + cached stays within the
// budget, and when the cache is full the oldest blocks make room. 0 (the
// default) turns caching off and frees the cache.
void SetBlockCacheLimit(int64_t bytes);

// The allocator's settings for training, one code path for the worker and
// the benchmarks that measure it (minkunet_bench).
struct AllocatorSettings {
  int64_t budget_bytes = 0;       // 0: none
  int64_t block_cache_bytes = 0;  // 0: no block cache
};
// The block cache without a budget.
constexpr int64_t kDefaultBlockCacheBytes = int64_t{2} << 30;
// Under a budget the cache may hold whatever the live tensors leave of it
// (and gives it back on demand); without one, kDefaultBlockCacheBytes.
AllocatorSettings TrainingAllocatorSettings(int64_t budget_bytes);
// Installs the counting allocator (if it is not yet) and applies both.
void ApplyAllocatorSettings(const AllocatorSettings& settings);
// For logs and benchmark output, e.g. "budget 512 MiB, block cache up to
// 512 MiB (counted in the budget)".
std::string ToString(const AllocatorSettings& settings);

// The same for any device. CPU: the functions above. CUDA (builds with
// TRAINSUP_HAVE_CUDA; elsewhere they throw c10::Error): current and peak
// are the caching allocator's allocated bytes, cached_bytes what it holds
// beyond them, budget_bytes its cap; allocations, refused and cache_hits
// are 0.
MemoryStats GetMemoryStats(c10::Device device);
void ResetPeakMemory(c10::Device device);
// CUDA: the caching allocator's memory fraction becomes bytes / the
// device's memory (0: the whole device); throws c10::Error for more than
// the device has. Past it the allocator raises c10::OutOfMemoryError.
void SetMemoryBudget(c10::Device device, int64_t bytes);
// Hands cached blocks back (CPU: the block cache's, keeping its limit;
// CUDA: the caching allocator's, as torch.cuda.empty_cache()).
void ReleaseCachedMemory(c10::Device device);
// Whether this build has the CUDA backend and LibTorch sees a CUDA device
// (CUDA_VISIBLE_DEVICES decides which).
bool CudaDeviceAvailable();

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_MEMORY_H_
