#include "sparse/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <mutex>

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

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const override {
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

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
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

}  // namespace trainsup::sparse
