// The CUDA backend's entries as steps over LibTorch tensors and the ops of
// kernel_bodies.h, with the ops run by a Launcher: on the GPU, CudaBackend
// (backend.cc) launches them as kernels on LibTorch's current stream; in
// the cross-backend test a host launcher runs the same ops on CPU tensors.
// Everything here but the launches is device-independent ATen code
// (allocation, at::mm, nonzero), so this file is built and tested on every
// machine; on a CUDA build it is part of trainsup_sparse_cuda.
#ifndef TRAINSUP_SPARSE_CUDA_STEPS_H_
#define TRAINSUP_SPARSE_CUDA_STEPS_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "sparse/backend.h"
#include "sparse/cuda/kernel_bodies.h"

namespace trainsup::sparse::cuda {

// Runs every element of an op (in any order, all before the next op's
// reads: on one stream, or on the host one op after another). Errors are
// thrown (c10::Error) naming `what`.
class Launcher {
 public:
  virtual ~Launcher() = default;
  // Runs `body` with `device` as the current device of its kind (the GPU
  // launcher: a CUDAGuard; on the host: nothing to set).
  virtual void OnDevice(c10::Device device, const std::function<void()>& body) const = 0;
  // Waits until every op run so far is done (timing the dataflows).
  virtual void Synchronize() const = 0;
#define TRAINSUP_LAUNCHER_RUN(Op) virtual void Run(const Op& op, const char* what) const = 0;
  TRAINSUP_CUDA_OPS(TRAINSUP_LAUNCHER_RUN)
#undef TRAINSUP_LAUNCHER_RUN
};

// The entries of Backend (sparse/backend.h), with the same contracts, on
// tensors of the device the launcher runs its ops on.
//
//   kernel maps     one search over sorted keys for all offsets (half of
//                   them for an odd kernel on one set, the rest mirrored),
//                   then a compaction by a prefix count; one host
//                   synchronisation per map (the per-offset counts), its
//                   small host tables uploaded asynchronously from pinned
//                   memory, and `begin` kept on the device with the map
//   convolutions    no host synchronisation and no upload (the inverse
//                   tables read the map's device `begin`), in one of two
//                   dataflows (Dataflow), neither with atomics:
//     gather-GEMM   gather -> a product per offset (at::mm: cuBLAS on the
//                   GPU) -> one summing op per group of offsets that adds
//                   them into each output element in offset order, the
//                   same order as the cpu backend's BLAS path
//     fused         one output-stationary op over all offsets for the
//                   forward and for the input gradient (ImplicitGemmTiles,
//                   a tiled implicit GEMM),
//                   two for the weight gradient (WeightGradTiles,
//                   SumSplits): 1 launch forward and 3 backward
//   inverse tables  (which pair of each offset reads or writes each row,
//                   both dataflows) built at a map's first use of each
//                   side, a fill and an inversion, and kept with the map
//                   (KernelMap::tables) for every later call
//   half features   (bfloat16, float16; the weight cast to them) on either
//                   dataflow, every sum in float32 and each result rounded
//                   once to the half type at the end. Gather-GEMM: 16-bit
//                   gathers, each offset's product with half inputs and a
//                   float32 result (cuBLAS's tensor cores on the GPU), the
//                   scatter's and the identity offset's sums in float32;
//                   the weight gradient likewise. Fused: the tiled ops
//                   read the half values as they are, widen them exactly
//                   to float32 in their loads and sum in float32 (SIMT, no
//                   tensor cores); one cast of each result
void BuildKernelMap(const Launcher& launcher, const KernelMapInputs& inputs, KernelMap* map);
// How many host tables the steps have uploaded to a device so far in this
// process (the map build's offsets and `begin`; a convolution on a map
// without device_begin uploads its `begin`): tests check that convolutions
// upload nothing.
int64_t HostUploads();

// Which dataflow a convolution takes. kMeasured: per layer shape (the
// direction, C_in, C_out, the kernel volume, the pair count's power of
// two and the features' type), the faster of the two, timed at the
// shape's first use (a warm-up and one timed run of each) and kept for
// the process. In deterministic mode kMeasured takes gather-GEMM, so the
// bits do not depend on a timing.
enum class Dataflow { kGatherGemm, kFused, kMeasured };
// TRAINSUP_CUDA_DATAFLOW = gemm | fused | measured; null or empty:
// measured. Another value throws c10::Error naming the choices.
Dataflow DataflowFromString(const char* value);
std::string ToString(Dataflow dataflow);
// The process's setting: TRAINSUP_CUDA_DATAFLOW at the first use, or what
// SetDataflow (benchmarks' A/B runs) set; returns the previous.
Dataflow ActiveDataflow();
Dataflow SetDataflow(Dataflow dataflow);
// SetDataflow for one scope (tests, benchmarks), restored however it ends.
class DataflowGuard {
 public:
  explicit DataflowGuard(Dataflow dataflow) : previous_(SetDataflow(dataflow)) {}
  ~DataflowGuard() { SetDataflow(previous_); }
  DataflowGuard(const DataflowGuard&) = delete;
  DataflowGuard& operator=(const DataflowGuard&) = delete;

 private:
  Dataflow previous_;
};
// What kMeasured has chosen so far, one line per layer shape (and type),
// e.g. "forward 32->64 k27 2^17 pairs Float: fused (fused 1.800 ms,
// gather-GEMM 4.100 ms)".
std::vector<std::string> DataflowChoices();

// bias: as Backend::conv_forward's; the fused dataflow adds it in its
// op's epilogue, gather-GEMM in one op over the sums (AddBias).
at::Tensor ConvForward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                       const at::Tensor& bias, const PairView& pairs, int64_t num_out,
                       Dataflow dataflow);
void ConvBackward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                  const PairView& pairs, const at::Tensor& grad_out, bool need_input,
                  bool need_weight, at::Tensor* grad_in, at::Tensor* grad_weight,
                  Dataflow dataflow);

// Backend::batch_norm_training with the ReLU fused (batch_norm_steps.cc):
// on float32 or float64 features whose parameters and running statistics
// share their type, BatchNorm's six ops of kernel_bodies.h (three forward,
// three backward), their sums in a fixed block order; other calls (half
// features with float32 parameters, fewer than two rows) take the generic
// entry, at::batch_norm and relu_.
at::Tensor BatchNormTraining(const Launcher& launcher, const at::Tensor& f,
                             const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& running_mean, const at::Tensor& running_var,
                             double momentum, double eps, bool relu);

// StepsTable's start: the generic backend's table with kind cuda, `name`,
// `runs_on` and builds_from_device_keys.
Backend StepsTableBase(const char* name, bool (*runs_on)(c10::DeviceType));

// The CUDA backend's table with its ops run by launcher(): the generic
// backend's entries, and the steps above for kernel maps, convolutions
// and BatchNorm, each inside launcher().OnDevice. CudaBackend() is
// StepsTable<&its launcher>; the cross-backend test builds the same table
// with a host launcher, so what it tests is this table, and pins
// dataflow() to each of the two.
template <const Launcher& (*launcher)(), Dataflow (*dataflow)() = &ActiveDataflow>
Backend StepsTable(const char* name, bool (*runs_on)(c10::DeviceType)) {
  Backend b = StepsTableBase(name, runs_on);
  // Half inputs everywhere: convolutions on either dataflow with float32
  // sums (ConvForward), the pooling entries the generic ones.
  b.takes_half_inputs = [](at::ScalarType, bool) { return true; };
  b.build_kernel_map = [](const KernelMapInputs& inputs, KernelMap* map) {
    launcher().OnDevice(inputs.device, [&] { BuildKernelMap(launcher(), inputs, map); });
  };
  b.conv_forward = [](const at::Tensor& f, const at::Tensor& w, const at::Tensor& bias,
                      const PairView& pairs, int64_t num_out) {
    at::Tensor out;
    launcher().OnDevice(
        f.device(), [&] { out = ConvForward(launcher(), f, w, bias, pairs, num_out, dataflow()); });
    return out;
  };
  b.conv_backward = [](const at::Tensor& f, const at::Tensor& w, const PairView& pairs,
                       const at::Tensor& grad_out, bool need_input, bool need_weight,
                       at::Tensor* grad_in, at::Tensor* grad_weight) {
    launcher().OnDevice(f.device(), [&] {
      ConvBackward(launcher(), f, w, pairs, grad_out, need_input, need_weight, grad_in, grad_weight,
                   dataflow());
    });
  };
  b.batch_norm_training = [](const at::Tensor& f, const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& running_mean, const at::Tensor& running_var,
                             double momentum, double eps, bool relu) {
    at::Tensor y;
    launcher().OnDevice(f.device(), [&] {
      y = BatchNormTraining(launcher(), f, weight, bias, running_mean, running_var, momentum, eps,
                            relu);
    });
    return y;
  };
  return b;
}

}  // namespace trainsup::sparse::cuda

#endif  // TRAINSUP_SPARSE_CUDA_STEPS_H_
