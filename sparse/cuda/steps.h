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
  virtual void Run(const MapSearch& op, const char* what) const = 0;
  virtual void Run(const CompactPairs& op, const char* what) const = 0;
  virtual void Run(const InvertPairs& op, const char* what) const = 0;
  virtual void Run(const GatherRows<float>& op, const char* what) const = 0;
  virtual void Run(const GatherRows<double>& op, const char* what) const = 0;
  virtual void Run(const ScatterSum<float>& op, const char* what) const = 0;
  virtual void Run(const ScatterSum<double>& op, const char* what) const = 0;
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
//   convolutions    no host synchronisation and no upload: the inverse
//                   tables read the map's device `begin`
//   convolutions    gather -> a product per offset (at::mm: cuBLAS on the
//                   GPU) -> one summing op per group of offsets that adds
//                   them into each output element in offset order: no
//                   atomics, the same order as the cpu backend's BLAS path
void BuildKernelMap(const Launcher& launcher, const KernelMapInputs& inputs, KernelMap* map);
// How many host tables the steps have uploaded to a device so far in this
// process (the map build's offsets and `begin`; a convolution on a map
// without device_begin uploads its `begin`): tests check that convolutions
// upload nothing.
int64_t HostUploads();
at::Tensor ConvForward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                       const PairView& pairs, int64_t num_out);
void ConvBackward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                  const PairView& pairs, const at::Tensor& grad_out, bool need_input,
                  bool need_weight, at::Tensor* grad_in, at::Tensor* grad_weight);

// StepsTable's start: the generic backend's table with kind cuda, `name`,
// `runs_on` and builds_from_device_keys.
Backend StepsTableBase(const char* name, bool (*runs_on)(c10::DeviceType));

// The CUDA backend's table with its ops run by launcher(): the generic
// backend's entries, and the steps above for kernel maps and
// convolutions, each inside launcher().OnDevice. CudaBackend() is
// StepsTable<&its launcher>; the cross-backend test builds the same table
// with a host launcher, so what it tests is this table.
template <const Launcher& (*launcher)()>
Backend StepsTable(const char* name, bool (*runs_on)(c10::DeviceType)) {
  Backend b = StepsTableBase(name, runs_on);
  // The gathers and scatters of these steps are float32 and float64: half
  // inputs take the engine's convert-to-fp32 path.
  b.takes_half_inputs = [](at::ScalarType, bool) { return false; };
  b.build_kernel_map = [](const KernelMapInputs& inputs, KernelMap* map) {
    launcher().OnDevice(inputs.device, [&] { BuildKernelMap(launcher(), inputs, map); });
  };
  b.conv_forward = [](const at::Tensor& f, const at::Tensor& w, const PairView& pairs,
                      int64_t num_out) {
    at::Tensor out;
    launcher().OnDevice(f.device(), [&] { out = ConvForward(launcher(), f, w, pairs, num_out); });
    return out;
  };
  b.conv_backward = [](const at::Tensor& f, const at::Tensor& w, const PairView& pairs,
                       const at::Tensor& grad_out, bool need_input, bool need_weight,
                       at::Tensor* grad_in, at::Tensor* grad_weight) {
    launcher().OnDevice(f.device(), [&] {
      ConvBackward(launcher(), f, w, pairs, grad_out, need_input, need_weight, grad_in,
                   grad_weight);
    });
  };
  return b;
}

}  // namespace trainsup::sparse::cuda

#endif  // TRAINSUP_SPARSE_CUDA_STEPS_H_
