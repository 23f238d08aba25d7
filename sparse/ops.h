// The engine's differentiable operations on SparseTensors (CPU backend).
//
// Conventions. A cubic kernel of size K has volume K^3 offsets (see
// KernelOffsets); weights are laid out [volume, C_in, C_out]. For an output
// coordinate u the input of offset k is u + k * dilation * input_stride.
// Strided convolution and pooling produce the input's coordinates floored to
// the grid of stride input_stride * stride (CoordinateManager::Downsample).
// Transposed convolution maps back onto a finer coordinate set with the
// transpose of the strided kernel map. Every op throws c10::Error on bad
// input (shapes, dtypes, mismatched coordinate sets) before touching data.
#ifndef TRAINSUP_SPARSE_OPS_H_
#define TRAINSUP_SPARSE_OPS_H_

#include <ATen/Tensor.h>
#include <c10/util/Optional.h>

#include <string>
#include <vector>

#include "sparse/sparse_tensor.h"

namespace trainsup::sparse {

struct ConvOptions {
  int32_t kernel_size = 3;
  int32_t stride = 1;
  int32_t dilation = 1;
};

// What runs for features of type `features` on `device`, for logs and
// benchmarks: e.g. "bf16 features, float32 weights and sums, on the cpu
// backend, avx512 kernels (convert-to-fp32: half in memory, float32
// arithmetic)". Throws c10::Error where no backend runs.
std::string DescribePrecision(at::ScalarType features, c10::Device device);

// TF32 for float32 GEMMs and cuDNN on CUDA devices (LibTorch's process-wide
// setting; off by default, and on the CPU it changes nothing). The
// worker's train.tf32.
void SetTf32(bool on);
bool Tf32Enabled();

// Sparse convolution. weight: [K^3, C_in, C_out]; bias: [C_out] or undefined.
// stride 1 keeps the coordinates; stride s > 1 downsamples.
SparseTensor Conv(const SparseTensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvOptions& options);

// Transposed sparse convolution onto `target` coordinates, a set of the same
// manager at stride x.stride() / options.stride (typically the skip
// connection's). Without a target, the set `x` was downsampled from is used.
// weight: [K^3, C_in, C_out].
SparseTensor ConvTranspose(const SparseTensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const ConvOptions& options, const SparseTensor* target = nullptr);

enum class PoolMode { kMax, kAverage, kSum };
std::string ToString(PoolMode mode);
// Parses "max", "average"/"avg", "sum"; throws c10::Error otherwise.
PoolMode PoolModeFromString(const std::string& name);

// Max or average pooling over the existing inputs of each window (empty
// sites do not count). An output with no input in its window gets 0.
SparseTensor Pool(const SparseTensor& x, PoolMode mode, const ConvOptions& options);

// Pools every batch item to one row: returns a dense [batch_size, C] tensor.
// An item without points gets zeros.
at::Tensor GlobalPool(const SparseTensor& x, PoolMode mode);

// Concatenates features of tensors on the same coordinate set (U-Net skips).
SparseTensor Cat(const std::vector<SparseTensor>& xs);

// BatchNorm over the rows of x.F(). running_mean/running_var may be
// undefined (no running statistics). In deterministic mode the statistics
// are reduced in coordinate key order. relu: ReLU on the result, fused in
// training mode (one pass, and backward recomputes the ReLU's mask from
// the input instead of keeping its output).
SparseTensor BatchNorm(const SparseTensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                       double momentum, double eps, bool relu = false);

SparseTensor Relu(const SparseTensor& x);
// ReLU overwriting x's features (they must not be needed elsewhere, e.g. the
// fresh output of BatchNorm, whose backward does not read its output).
SparseTensor ReluInPlace(const SparseTensor& x);
SparseTensor LeakyRelu(const SparseTensor& x, double negative_slope = 0.01);
SparseTensor Elu(const SparseTensor& x, double alpha = 1.0);
SparseTensor Sigmoid(const SparseTensor& x);
SparseTensor Tanh(const SparseTensor& x);

// Lower-level: the gather -> GEMM -> scatter convolution over a kernel map,
// differentiable in features and weight. Without `transposed`, rows of
// `features` are the map's input rows and the result has map.num_out rows;
// with it, the roles swap.
at::Tensor KernelMapConv(const at::Tensor& features, const at::Tensor& weight, const KernelMap& map,
                         bool transposed);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_OPS_H_
