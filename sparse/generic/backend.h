// The device-generic backend (sparse/backend.h): every entry is made of
// ATen tensor operations only (searchsorted over packed keys, index_select,
// mm, index_add_, index_copy_, batch_norm), so it runs unchanged on any
// device LibTorch runs on, CUDA included, with LibTorch's own kernels. It
// is the CUDA path wherever a CUDA kernel is missing or unverified, and it
// is tested on the CPU against the cpu backend.
//
// Sum orders, which decide where it matches the cpu backend bit for bit
// (tests/sparse/backend_test.cc): convolutions and window sums add one
// offset's contribution after another, in offset order with the identity
// offset first, as the cpu backend's gather-BLAS-scatter path does; each
// offset's scatter writes distinct rows, so no index_add_ call adds two
// values into one element (no atomics decide an order on CUDA). Weight
// gradients are one matrix product per offset over all its pairs, where the
// cpu backend sums fixed blocks of pairs. Max-pool gradients are added
// offset by offset (the cpu backend: by output row), which is independent
// of the row order in any mode.
#ifndef TRAINSUP_SPARSE_GENERIC_BACKEND_H_
#define TRAINSUP_SPARSE_GENERIC_BACKEND_H_

#include "sparse/backend.h"

namespace trainsup::sparse::generic {

const Backend& GenericBackend();

// The start of a kernel-map build from device keys (this backend's and the
// CUDA backend's): map->begin all zeros, and when either set is empty, no
// pairs (empty in_rows and out_rows on the keys' device) and false.
bool StartKernelMap(const KernelMapInputs& inputs, KernelMap* map);

}  // namespace trainsup::sparse::generic

#endif  // TRAINSUP_SPARSE_GENERIC_BACKEND_H_
