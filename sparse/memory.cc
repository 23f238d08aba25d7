#include "sparse/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>

namespace trainsup::sparse {
namespace {

std::atomic<int64_t> g_current{0}, g_peak{0}, g_budget{0}, g_allocations{0}, g_refused{0};
std::atomic<bool> g_installed{false};

struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
};

void Release(void* ctx) {
  auto* a = static_cast<Allocation*>(ctx);
  g_current.fetch_sub(a->bytes);
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
    c10::DataPtr inner;
    try {
      inner = base_->allocate(n);
    } catch (...) {
      g_current.fetch_sub(bytes);
      throw;
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
  return s;
}

void ResetPeakMemory() { g_peak.store(g_current.load()); }

void SetMemoryBudget(int64_t bytes) { g_budget.store(bytes > 0 ? bytes : 0); }

}  // namespace trainsup::sparse
