// Launching the CUDA backend's kernels: each op of kernel_bodies.h as one
// grid-stride kernel on a given stream, one thread per element. Raw device
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

cudaError_t Launch(const MapSearch& op, cudaStream_t stream);
cudaError_t Launch(const CompactPairs& op, cudaStream_t stream);
cudaError_t Launch(const InvertPairs& op, cudaStream_t stream);
cudaError_t Launch(const GatherRows<float>& op, cudaStream_t stream);
cudaError_t Launch(const GatherRows<double>& op, cudaStream_t stream);
cudaError_t Launch(const ScatterSum<float>& op, cudaStream_t stream);
cudaError_t Launch(const ScatterSum<double>& op, cudaStream_t stream);

}  // namespace trainsup::sparse::cuda

#endif  // TRAINSUP_SPARSE_CUDA_KERNELS_H_
