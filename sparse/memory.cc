#include "sparse/memory.h"

#include <ATen/Context.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <string>

#if TRAINSUP_HAVE_CUDA
#include "sparse/cuda/memory.h"
#endif

namespace trainsup::sparse {
namespace {

std::atomic<int64_t> g_current{0}, g_peak{0}, g_budget{0}, g_allocations{0}, g_refused{0};
std::atomic<int64_t> g_cache_hits{0}, g_evicted{0};
std::atomic<bool> g_installed{false};

constexpr int64_t kCacheMinBytes = int64_t{1} << 20;

struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
};

// Freed large blocks by size, oldest first.
class BlockCache {
 public:
  // Takes a block of exactly `bytes`, or returns an empty DataPtr.
  c10::DataPtr Take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_size_.find(bytes);
    if (it == by_size_.end()) return c10::DataPtr();
    c10::DataPtr p = std::move(it->second->block);
    blocks_.erase(it->second);
    by_size_.erase(it);
    cached_ -= bytes;
    return p;
  }
  // Keeps the block if the cache can hold it within its limit and `room`
  // (the budget left by live tensors; negative: no budget), freeing the
  // oldest blocks as needed; returns false (and leaves it) if not.
  bool Put(c10::DataPtr& block, int64_t bytes, int64_t room) {
    std::list<Entry> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t cap = room < 0 ? limit_ : std::min(limit_, room);
    if (bytes < kCacheMinBytes || bytes > cap) return false;
    while (cached_ + bytes > cap) DropOldest(&dropped);
    blocks_.push_back({bytes, std::move(block)});
    by_size_.emplace(bytes, std::prev(blocks_.end()));
    cached_ += bytes;
    return true;
  }
  // Frees the oldest blocks until at least `bytes` are freed or none is left.
  void Evict(int64_t bytes) {
    std::list<Entry> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t freed = 0; freed < bytes && !blocks_.empty();) freed += DropOldest(&dropped);
  }
  void SetLimit(int64_t limit) {
    std::list<Entry> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = limit;
    while (cached_ > limit_) DropOldest(&dropped);
  }
  void Release() {
    std::list<Entry> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    while (!blocks_.empty()) DropOldest(&dropped);
  }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  int64_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

 private:
  struct Entry {
    int64_t bytes;
    c10::DataPtr block;
  };
  // Moves the oldest block to `dropped` (freed when the caller's list goes,
  // after the lock is released); returns its size.
  int64_t DropOldest(std::list<Entry>* dropped) {
    const int64_t bytes = blocks_.front().bytes;
    auto range = by_size_.equal_range(bytes);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == blocks_.begin()) {
        by_size_.erase(it);
        break;
      }
    }
    dropped->splice(dropped->end(), blocks_, blocks_.begin());
    cached_ -= bytes;
    g_evicted.fetch_add(bytes);
    return bytes;
  }

  std::mutex mu_;
  std::list<Entry> blocks_;  // oldest first
  std::multimap<int64_t, std::list<Entry>::iterator> by_size_;
  int64_t cached_ = 0;
  int64_t limit_ = 0;
};

BlockCache& Cache() {
  static BlockCache* cache = new BlockCache();
  return *cache;
}

// Every block starts with a header holding its Allocation*, and tensors get
// the bytes after it: the data pointer is then its own deleter context, as
// LibTorch's raw_allocate requires (some ATen kernels allocate raw). The
// header keeps the base allocator's 64-byte alignment.
constexpr int64_t kHeaderBytes = 64;

void Release(void* data) {
  Allocation* a = nullptr;
  std::memcpy(&a, static_cast<char*>(data) - kHeaderBytes, sizeof(a));
  const int64_t now = g_current.fetch_sub(a->bytes) - a->bytes;
  const int64_t budget = g_budget.load();
  Cache().Put(a->inner, a->bytes, budget > 0 ? std::max<int64_t>(0, budget - now) : -1);
  delete a;
}

// The interface of LibTorch 2.3 and later (allocate non-const, a pure
// virtual copy_data); 1.13's const allocate overload is gone with 1.13.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Release; }

 private:
  c10::DataPtr Allocate(size_t n) const {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t now = g_current.fetch_add(bytes) + bytes;
    const int64_t budget = g_budget.load();
    if (budget > 0 && now > budget) {
      g_current.fetch_sub(bytes);
      g_refused.fetch_add(1);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU memory budget exceeded: tried to allocate ",
                       bytes, " bytes with ", now - bytes, " of ", budget, " bytes in use");
    }
    c10::DataPtr inner = Cache().Take(bytes);
    if (inner) {
      g_cache_hits.fetch_add(1);
    } else {
      // Cached blocks count in the budget: make room by freeing the oldest.
      if (budget > 0) {
        const int64_t over = now + Cache().cached() - budget;
        if (over > 0) Cache().Evict(over);
      }
      try {
        inner = base_->allocate(n + kHeaderBytes);
      } catch (...) {
        g_current.fetch_sub(bytes);
        throw;
      }
    }
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    g_allocations.fetch_add(1);
    char* base = static_cast<char*>(inner.get());
    auto* a = new Allocation{std::move(inner), bytes};
    std::memcpy(base, &a, sizeof(a));
    void* data = base + kHeaderBytes;
    return c10::DataPtr(data, data, &Release, c10::Device(c10::DeviceType::CPU));
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
  s.block_cache_limit_bytes = Cache().limit();
  s.evicted_bytes = g_evicted.load();
  return s;
}

void SetBlockCacheLimit(int64_t bytes) { Cache().SetLimit(bytes > 0 ? bytes : 0); }

AllocatorSettings TrainingAllocatorSettings(int64_t budget_bytes) {
  AllocatorSettings s;
  s.budget_bytes = budget_bytes > 0 ? budget_bytes : 0;
  s.block_cache_bytes = s.budget_bytes > 0 ? s.budget_bytes : kDefaultBlockCacheBytes;
  return s;
}

void ApplyAllocatorSettings(const AllocatorSettings& settings) {
  InstallCountingAllocator();
  SetMemoryBudget(settings.budget_bytes);
  SetBlockCacheLimit(settings.block_cache_bytes);
}

std::string ToString(const AllocatorSettings& settings) {
  const int64_t mib = int64_t{1} << 20;
  std::string out = settings.budget_bytes > 0
                        ? "budget " + std::to_string(settings.budget_bytes / mib) + " MiB"
                        : std::string("no budget");
  if (settings.block_cache_bytes <= 0) return out + ", no block cache";
  out += ", block cache up to " + std::to_string(settings.block_cache_bytes / mib) + " MiB";
  if (settings.budget_bytes > 0) out += " (counted in the budget)";
  return out;
}

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
  if (device.is_cpu()) return Cache().Release();
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
