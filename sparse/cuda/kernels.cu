#include <cuda_runtime.h>

#include "sparse/cuda/kernels.h"

namespace trainsup::sparse::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops over at most this many blocks: enough to fill any GPU,
// and far below the launch limit whatever the element count.
constexpr int64_t kMaxBlocks = 65535;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

// op(i) for every element, one thread each (the op is passed by value, as
// kernel parameters are).
template <typename Op>
__global__ void ForEachElement(Op op) {
  const int64_t n = op.size();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    op(i);
  }
}

// A tiled op (kernel_bodies.h): one block per tile, grid-stride over the
// tiles, its phases separated by barriers; the offset skip is block-wide
// (__syncthreads_or, itself a barrier), so every thread takes it alike.
template <typename Op>
__global__ void __launch_bounds__(Op::kThreads) EachTile(Op op) {
  __shared__ typename Op::Shared shared;
  typename Op::Thread thread;
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t t = blockIdx.x; t < op.tiles(); t += gridDim.x) {
    op.Start(t, tid, thread);
    for (int64_t k = 0; k < op.offsets(); ++k) {
      if (!__syncthreads_or(op.Index(t, k, tid, shared) ? 1 : 0)) continue;
      const int64_t chunks = op.chunks(t);
      for (int64_t c = 0; c < chunks; ++c) {
        op.Load(t, k, c, tid, shared);
        __syncthreads();
        op.Compute(t, c, tid, shared, thread);
        __syncthreads();
      }
    }
    op.Store(t, tid, thread);
    __syncthreads();
  }
}

template <typename Op>
cudaError_t LaunchOp(const Op& op, cudaStream_t stream) {
  if constexpr (IsTiled<Op>::value) {
    const int64_t tiles = op.tiles();
    if (tiles == 0) return cudaSuccess;
    const auto blocks = static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
    EachTile<Op><<<blocks, Op::kThreads, 0, stream>>>(op);
  } else {
    const int64_t n = op.size();
    if (n == 0) return cudaSuccess;
    ForEachElement<Op><<<Blocks(n), kThreads, 0, stream>>>(op);
  }
  return cudaGetLastError();
}

}  // namespace

#define TRAINSUP_DEFINE_LAUNCH(Op) \
  cudaError_t Launch(const Op& op, cudaStream_t stream) { return LaunchOp(op, stream); }
TRAINSUP_CUDA_OPS(TRAINSUP_DEFINE_LAUNCH)
#undef TRAINSUP_DEFINE_LAUNCH

}  // namespace trainsup::sparse::cuda
