// The CPU backend's table (sparse/backend.h): the raw-pointer kernels of
// kernels.h, kernel_map.h and batch_norm.h behind tensor entry points.
#ifndef TRAINSUP_SPARSE_CPU_BACKEND_H_
#define TRAINSUP_SPARSE_CPU_BACKEND_H_

#include "sparse/backend.h"

namespace trainsup::sparse::cpu {

// The table; every entry takes CPU tensors.
const Backend& CpuBackend();

}  // namespace trainsup::sparse::cpu

#endif  // TRAINSUP_SPARSE_CPU_BACKEND_H_
