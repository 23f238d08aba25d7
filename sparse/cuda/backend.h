// The CUDA backend's table (sparse/backend.h). Built only when the LibTorch
// found has CUDA (TRAINSUP_HAVE_CUDA).
//
//   kernel maps     one search kernel over sorted keys for all offsets
//                   (half of them for an odd kernel on one set, the rest
//                   mirrored), then a compaction with LibTorch's nonzero
//   convolutions    gather kernel -> cuBLAS product per offset (at::mm) ->
//                   one summing kernel per group of offsets that adds them
//                   into each output element in offset order: no atomics,
//                   the same order as the cpu backend's BLAS path
//   everything else the generic backend's entries
//
// It has never run on a GPU (docs/engine.md); until tests/gpu/run.sh has
// passed on one, it runs only when asked for (TRAINSUP_BACKEND=cuda).
#ifndef TRAINSUP_SPARSE_CUDA_BACKEND_H_
#define TRAINSUP_SPARSE_CUDA_BACKEND_H_

#include "sparse/backend.h"

namespace trainsup::sparse::cuda {

// The table; every entry takes CUDA tensors.
const Backend& CudaBackend();

}  // namespace trainsup::sparse::cuda

#endif  // TRAINSUP_SPARSE_CUDA_BACKEND_H_
