// LibTorch's CUDA caching allocator as the worker sees it: allocated and
// peak bytes, the memory fraction that caps what it may hold, and
// returning its cached blocks. Built only with CUDA; sparse/memory.h is the
// device-independent entry point. Never run on a GPU (docs/engine.md).
#ifndef TRAINSUP_SPARSE_CUDA_MEMORY_H_
#define TRAINSUP_SPARSE_CUDA_MEMORY_H_

#include <cstdint>

namespace trainsup::sparse::cuda {

struct DeviceMemory {
  int64_t allocated = 0;       // held by live tensors
  int64_t peak_allocated = 0;  // since the last ResetPeak
  int64_t reserved = 0;        // allocated plus the allocator's cached blocks
  int64_t total = 0;           // the device's memory
  double fraction = 1.0;       // of `total` the allocator may reserve
};

DeviceMemory GetDeviceMemory(int device);
void ResetPeak(int device);
// The allocator raises c10::OutOfMemoryError for an allocation that would
// take its reserved memory past fraction * total (after freeing its cache).
void SetFraction(int device, double fraction);
// Frees the cached blocks of every device (cudaFree), as
// torch.cuda.empty_cache() does.
void EmptyCache();

}  // namespace trainsup::sparse::cuda

#endif  // TRAINSUP_SPARSE_CUDA_MEMORY_H_
