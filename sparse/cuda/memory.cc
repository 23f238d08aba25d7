#include "sparse/cuda/memory.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <map>
#include <mutex>

namespace trainsup::sparse::cuda {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

// The fraction last set per device (the allocator has no getter in every
// LibTorch version).
std::mutex g_mu;
std::map<int, double> g_fraction;

// The allocator serves a device only after LibTorch's lazy CUDA
// initialisation, which creating a tensor there performs.
void Initialise(int device) {
  (void)at::empty({1},
                  at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

}  // namespace

DeviceMemory GetDeviceMemory(int device) {
  Initialise(device);
  DeviceMemory m;
  const auto stats = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  // Index 0 of each statistic is the aggregate over the small and large pools.
  m.allocated = stats.allocated_bytes[0].current;
  m.peak_allocated = stats.allocated_bytes[0].peak;
  m.reserved = stats.reserved_bytes[0].current;
  m.total = static_cast<int64_t>(at::cuda::getDeviceProperties(device)->totalGlobalMem);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_fraction.find(device);
  m.fraction = it == g_fraction.end() ? 1.0 : it->second;
  return m;
}

void ResetPeak(int device) {
  Initialise(device);
  alloc::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

void SetFraction(int device, double fraction) {
  Initialise(device);
  alloc::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(g_mu);
  g_fraction[device] = fraction;
}

void EmptyCache() { alloc::emptyCache(); }

}  // namespace trainsup::sparse::cuda
