// Launching the CUDA backend's kernels: each element op of kernel_bodies.h
// as one grid-stride kernel on a given stream, one thread per element; a
// tiled op (the fused dataflow's ImplicitGemmTiles and WeightGradTiles) as
// one block of 256 threads per 64 x 64 output tile, with shared-memory
// staging of the gathered rows, SIMT fused multiply-adds (no tensor cores),
// so the measured choice (steps.h) is what keeps it off the layers where
// cuBLAS's GEMMs are faster. Raw device
// pointers, no LibTorch; sparse/cuda/backend.cc calls these with tensors'
// pointers and LibTorch's current stream (through steps.h). Each returns
// the launch's error (cudaSuccess, or the error of an invalid launch);
// errors of the kernel itself surface at the next synchronising call, as
// with any CUDA launch.
//
// THESE LAUNCHES HAVE NOT RUN ON A GPU: kernels.cu is compiled with nvcc
// by a test on a machine without one (tests/sparse/CMakeLists.txt,
// cuda_kernels_compile), and the ops' element code is run on the host by
// the cross-backend test; the launches wait for tests/gpu/run.sh.
#ifndef TRAINSUP_SPARSE_CUDA_KERNELS_H_
#define TRAINSUP_SPARSE_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include "sparse/cuda/kernel_bodies.h"

namespace trainsup::sparse::cuda {

#define TRAINSUP_DECLARE_LAUNCH(Op) cudaError_t Launch(const Op& op, cudaStream_t stream);
TRAINSUP_CUDA_OPS(TRAINSUP_DECLARE_LAUNCH)
#undef TRAINSUP_DECLARE_LAUNCH

}  // namespace trainsup::sparse::cuda

#endif  // TRAINSUP_SPARSE_CUDA_KERNELS_H_
