#include "sparse/memory.h"

#include <ATen/Context.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#if TRAINSUP_HAVE_CUDA
#include "sparse/cuda/memory.h"
#endif

namespace trainsup::sparse {
namespace {

std::atomic<int64_t> g_current{0}, g_peak{0}, g_budget{0}, g_allocations{0}, g_refused{0};
std::atomic<int64_t> g_cache_hits{0};
std::atomic<bool> g_installed{false};

constexpr int64_t kCacheMinBytes = int64_t{1} << 20;

struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
};

// Freed large blocks by size.
class BlockCache {
 public:
  // Takes a block of exactly `bytes`, or returns an empty DataPtr.
  c10::DataPtr Take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(bytes);
    if (it == blocks_.end()) return c10::DataPtr();
    c10::DataPtr p = std::move(it->second);
    blocks_.erase(it);
    cached_ -= bytes;
    return p;
  }
  // Keeps the block if there is room; returns false (and leaves it) if not.
  bool Put(c10::DataPtr& block, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes < kCacheMinBytes || cached_ + bytes > limit_) return false;
    blocks_.emplace(bytes, std::move(block));
    cached_ += bytes;
    return true;
  }
  void Drop() {
    std::multimap<int64_t, c10::DataPtr> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(blocks_);
    cached_ = 0;
  }
  void SetLimit(int64_t limit) {
    std::multimap<int64_t, c10::DataPtr> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = limit;
      if (limit_ == 0) {
        dropped.swap(blocks_);
        cached_ = 0;
      }
    }
  }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  std::mutex mu_;
  std::multimap<int64_t, c10::DataPtr> blocks_;
  int64_t cached_ = 0;
  int64_t limit_ = 0;
};

BlockCache& Cache() {
  static BlockCache* cache = new BlockCache();
  return *cache;
}

void Release(void* ctx) {
  auto* a = static_cast<Allocation*>(ctx);
  g_current.fetch_sub(a->bytes);
  Cache().Put(a->inner, a->bytes);
  delete a;
}

// LibTorch 2.3 made c10::Allocator::allocate non-const and added a pure
// virtual copy_data: this class has both allocate overloads and copy_data,
// without `override`, so it implements the interface of either version.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const { return Allocate(n); }
  c10::DataPtr allocate(size_t n) { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  c10::DataPtr Allocate(size_t n) const {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t now = g_current.fetch_add(bytes) + bytes;
    const int64_t budget = g_budget.load();
    if (budget > 0 && now > budget) {
      g_current.fetch_sub(bytes);
      g_refused.fetch_add(1);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU memory budget exceeded: tried to allocate ", bytes,
                       " bytes with ", now - bytes, " of ", budget, " bytes in use");
    }
    c10::DataPtr inner = Cache().Take(bytes);
    if (inner) {
      g_cache_hits.fetch_add(1);
    } else {
      try {
        inner = base_->allocate(n);
      } catch (...) {
        g_current.fetch_sub(bytes);
        throw;
      }
    }
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    g_allocations.fetch_add(1);
    void* data = inner.get();
    auto* ctx = new Allocation{std::move(inner), bytes};
    return c10::DataPtr(data, ctx, &Release, c10::Device(c10::DeviceType::CPU));
  }

  c10::Allocator* base_;
};

}  // namespace

void InstallCountingAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator allocator(c10::GetDefaultCPUAllocator());
    c10::SetAllocator(c10::DeviceType::CPU, &allocator, /*priority=*/100);
    g_installed = true;
  });
}

bool CountingAllocatorInstalled() { return g_installed.load(); }

MemoryStats GetMemoryStats() {
  MemoryStats s;
  s.current_bytes = g_current.load();
  s.peak_bytes = g_peak.load();
  s.budget_bytes = g_budget.load();
  s.allocations = g_allocations.load();
  s.refused = g_refused.load();
  s.cached_bytes = Cache().cached();
  s.cache_hits = g_cache_hits.load();
  return s;
}

void SetBlockCacheLimit(int64_t bytes) { Cache().SetLimit(bytes > 0 ? bytes : 0); }

void ResetPeakMemory() { g_peak.store(g_current.load()); }

void SetMemoryBudget(int64_t bytes) { g_budget.store(bytes > 0 ? bytes : 0); }

namespace {

#if !TRAINSUP_HAVE_CUDA
[[noreturn]] void NoCuda(c10::Device device) {
  TORCH_CHECK(false, "memory of ", device, ": this build has no CUDA backend (docs/building.md)");
}
#endif

void CheckDevice(c10::Device device) {
  TORCH_CHECK(device.is_cpu() || device.is_cuda(),
              "memory accounting covers the CPU and CUDA, not ", device);
}

}  // namespace

MemoryStats GetMemoryStats(c10::Device device) {
  CheckDevice(device);
  if (device.is_cpu()) return GetMemoryStats();
#if TRAINSUP_HAVE_CUDA
  const cuda::DeviceMemory m = cuda::GetDeviceMemory(device.index() < 0 ? 0 : device.index());
  MemoryStats s;
  s.current_bytes = m.allocated;
  s.peak_bytes = m.peak_allocated;
  s.cached_bytes = m.reserved - m.allocated;
  s.budget_bytes =
      m.fraction < 1.0 ? static_cast<int64_t>(m.fraction * static_cast<double>(m.total)) : 0;
  return s;
#else
  NoCuda(device);
#endif
}

void ResetPeakMemory(c10::Device device) {
  CheckDevice(device);
  if (device.is_cpu()) return ResetPeakMemory();
#if TRAINSUP_HAVE_CUDA
  cuda::ResetPeak(device.index() < 0 ? 0 : device.index());
#else
  NoCuda(device);
#endif
}

void SetMemoryBudget(c10::Device device, int64_t bytes) {
  CheckDevice(device);
  if (device.is_cpu()) return SetMemoryBudget(bytes);
#if TRAINSUP_HAVE_CUDA
  const int index = device.index() < 0 ? 0 : device.index();
  const int64_t total = cuda::GetDeviceMemory(index).total;
  TORCH_CHECK(bytes <= total, "memory budget of ", bytes, " bytes is more than ", device, " has (",
              total, " bytes)");
  cuda::SetFraction(index,
                    bytes > 0 ? static_cast<double>(bytes) / static_cast<double>(total) : 1.0);
#else
  NoCuda(device);
#endif
}

void ReleaseCachedMemory(c10::Device device) {
  CheckDevice(device);
  if (device.is_cpu()) return Cache().Drop();
#if TRAINSUP_HAVE_CUDA
  cuda::EmptyCache();
#else
  NoCuda(device);
#endif
}

bool CudaDeviceAvailable() {
#if TRAINSUP_HAVE_CUDA
  return at::globalContext().hasCUDA() && at::getNumGPUs() > 0;
#else
  return false;
#endif
}

}  // namespace trainsup::sparse
