// The CUDA backend's table (sparse/backend.h). Built only when the LibTorch
// found has CUDA (TRAINSUP_HAVE_CUDA).
//
// The steps of steps.h with their ops launched as kernels on LibTorch's
// current stream (kernels.h); everything else the generic backend's entries.
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
