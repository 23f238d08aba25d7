// The seam between the device-independent engine (coordinate manager,
// autograd functions, modules) and its backends, after ggml's
// ggml-backend-impl.h: one table of entry points per backend, each backend
// in its own folder and library, chosen by the device of the tensors.
//
//   cpu      sparse/cpu/      raw-pointer CPU kernels (fused AVX-512, BLAS);
//                             always built; the reference for the others
//   generic  sparse/generic/  ATen tensor operations only, so it runs on any
//                             device LibTorch runs on; always built
//   cuda     sparse/cuda/     CUDA kernels (kernel maps, gather-GEMM-scatter);
//                             built only when the LibTorch found has CUDA
//
// Which backend runs: a table set by SetBackendTable (tests), else an
// override (SetBackendOverride, or TRAINSUP_BACKEND
// = cpu | generic | cuda, read once) wherever that backend runs; otherwise
// cpu for CPU tensors and generic for CUDA tensors. The CUDA kernels are not
// the default on CUDA tensors: they have never run on a GPU (docs/engine.md),
// and until tests/gpu/run.sh has passed on one, the generic backend (whose
// ATen operations LibTorch's CUDA kernels carry out) is the CUDA path.
//
// Internal to sparse/ and its tests; the public ops are in ops.h.
#ifndef TRAINSUP_SPARSE_BACKEND_H_
#define TRAINSUP_SPARSE_BACKEND_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sparse/coordinate_manager.h"
#include "sparse/sparse_tensor.h"

namespace trainsup::sparse {

enum class BackendKind { kCpu, kGeneric, kCuda };
std::string ToString(BackendKind kind);
// Parses "cpu", "generic", "cuda"; throws c10::Error naming the choices
// otherwise.
BackendKind BackendKindFromString(const std::string& name);

// A kernel map's pairs oriented for one op: for offset k, pairs
// [begin[k], begin[k+1]) read row src[p] and write row dst[p]. Within one
// offset every src row and every dst row occurs at most once. src and dst
// are int32 tensors on the op's device; `begin` stays on the host.
struct PairView {
  at::Tensor src, dst;
  const std::vector<int64_t>* begin = nullptr;
  // *begin on the op's device (KernelMap::device_begin), or undefined.
  at::Tensor device_begin;
  // Offset whose pairs are (p, p) for every row p in row order, or -1
  // (KernelMap::identity_offset).
  int64_t identity_offset = -1;
  // src and dst ascend within every offset (KernelMap::rows_sorted).
  bool sorted = false;
  // The map's derived tables (KernelMap::tables), and whether src is the
  // map's output side (a transposed op): a table over dst rows is
  // by_out_row when not transposed.
  std::shared_ptr<PairTables> tables;
  bool transposed = false;
  int64_t volume() const { return static_cast<int64_t>(begin->size()) - 1; }
  int64_t count(int64_t k) const { return (*begin)[k + 1] - (*begin)[k]; }
};

// The pairs of `map` as a convolution or pooling reads them: forward maps
// input rows to output rows; transposed swaps the roles.
PairView PairsOf(const KernelMap& map, bool transposed);

// What a kernel-map builder reads. `in` and `out` are the two coordinate
// sets (host data: keys in ascending order, rows, bounding boxes);
// in_device and out_device are their copies on the map's device, filled
// only for backends with builds_from_device_keys.
struct KernelMapInputs {
  const CoordinateSet* in = nullptr;
  const CoordinateSet* out = nullptr;
  const DeviceCoordinates* in_device = nullptr;
  const DeviceCoordinates* out_device = nullptr;
  bool same_set = false;  // in and out are one set (stride 1)
  int32_t kernel_size = 0;
  // KernelOffsets(kernel_size), in units of `step` = dilation * in->stride
  // (checked by the manager: no offset leaves the coordinate range).
  std::vector<std::array<int32_t, 3>> offsets;
  int64_t step = 1;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

// One backend's entry points. Every entry gets contiguous tensors on a
// device the backend runs on, checked by the engine (shapes, dtypes,
// devices) before the call: float32 and float64, and bfloat16 and float16
// where takes_half_inputs says. Results are on the same device. Each entry states what its result
// must equal; the cross-backend test (tests/sparse/backend_test.cc) holds every backend to the cpu
// one.
struct Backend {
  BackendKind kind;
  const char* name;
  bool (*runs_on)(c10::DeviceType type);

  // The kernel map's pairs (map->begin, in_rows, out_rows, on
  // inputs.device): for every offset k in KernelOffsets order and every
  // output coordinate u in key order whose input u + k * dilation *
  // in->stride exists, the pair (input row, output row). The other fields
  // of `map` are the manager's.
  bool builds_from_device_keys;
  void (*build_kernel_map)(const KernelMapInputs& inputs, KernelMap* map);

  // out[num_out, C_out] = sum over offsets k of scatter_dst(gather_src(f) @ W_k),
  // weight [volume, C_in, C_out], plus `bias` where defined: [C_out] in the
  // sums' type (AccumulateType of the features: float32 for half ones),
  // added to each element's sum after every offset and before the one
  // rounding of a half result, in the op that writes the sums where the
  // backend can (no pass of its own over the output).
  at::Tensor (*conv_forward)(const at::Tensor& features, const at::Tensor& weight,
                             const at::Tensor& bias, const PairView& pairs, int64_t num_out);
  // grad_in (if need_input) = sum_k scatter_src(gather_dst(grad_out) @ W_k^T);
  // grad_weight (if need_weight)[k] = gather_src(f)^T @ gather_dst(grad_out).
  void (*conv_backward)(const at::Tensor& features, const at::Tensor& weight, const PairView& pairs,
                        const at::Tensor& grad_out, bool need_input, bool need_weight,
                        at::Tensor* grad_in, at::Tensor* grad_weight);
  // Max over each output row's window, per channel: out [num_out, C] and
  // argmax (int32 input row, -1 where the window is empty and out is 0);
  // ties go to the first offset.
  void (*max_pool_forward)(const at::Tensor& features, const PairView& pairs, int64_t num_out,
                           at::Tensor* out, at::Tensor* argmax);
  // grad_in [num_in, C]: grad_out added at the argmax rows. `order`: int64
  // output rows in key order (deterministic mode on an unsorted set) or
  // undefined; a backend whose sum order does not depend on the row order
  // may ignore it.
  at::Tensor (*max_pool_backward)(const at::Tensor& grad_out, const at::Tensor& argmax,
                                  const PairView& pairs, const at::Tensor& order, int64_t num_in);
  // out[num_out, C] = (sum over the window) * inv_divisor[row].
  at::Tensor (*window_sum_forward)(const at::Tensor& features, const PairView& pairs,
                                   const at::Tensor& inv_divisor, int64_t num_out);
  at::Tensor (*window_sum_backward)(const at::Tensor& grad_out, const PairView& pairs,
                                    const at::Tensor& inv_divisor, int64_t num_in);
  // Training-mode BatchNorm over rows, then ReLU if `relu`, differentiable
  // in features, weight and bias; running statistics (when defined) updated
  // in place as at::batch_norm does. weight and bias may be undefined.
  // Half features come with float32 weight, bias and statistics: the
  // arithmetic is float32, the result and what backward keeps of the
  // input are in the features' type.
  at::Tensor (*batch_norm_training)(const at::Tensor& features, const at::Tensor& weight,
                                    const at::Tensor& bias, const at::Tensor& running_mean,
                                    const at::Tensor& running_var, double momentum, double eps,
                                    bool relu);
  // Whether the convolution entries (`convolution`) or the pooling entries
  // take tensors of the half type `type` (bfloat16 or float16; all of one
  // type, `inv_divisor` float32), accumulating in float32. Where not, the
  // engine converts them to float32 around the call and the result back:
  // the "convert-to-fp32" path (conv.cc). The cpu backend's answer depends
  // on the CPU and its kernel set (cpu::Bf16KernelsActive).
  bool (*takes_half_inputs)(at::ScalarType type, bool convolution) = nullptr;
};

// The backend that runs ops on `device` (see the top of this file). Throws
// c10::Error when no backend of this build runs there.
const Backend& BackendFor(c10::Device device);
// The backend of that kind, or null if this build has none.
const Backend* FindBackend(BackendKind kind);
// The backends of this build, cpu first.
std::vector<BackendKind> BuiltBackends();

// The override (nullopt: none). It applies on every device its backend runs
// on; elsewhere the default stays. The first call of either function reads
// TRAINSUP_BACKEND (an unknown value throws c10::Error). Asking for a
// backend this build lacks throws c10::Error. Returns the previous setting.
std::optional<BackendKind> BackendOverride();
std::optional<BackendKind> SetBackendOverride(std::optional<BackendKind> kind);

// A table outside the registry (a test's, or an experiment's), used on
// every device it runs on before the override and the defaults; nullptr
// for none. The table must live as long as anything built with it
// (autograd nodes keep a pointer to the table that ran their forward; a
// checkpointed block's recompute chooses again). Process-wide, like the
// override. Returns the previous one.
const Backend* SetBackendTable(const Backend* table);

// Sets the override for one scope and restores the previous one after.
class BackendGuard {
 public:
  explicit BackendGuard(std::optional<BackendKind> kind) : previous_(SetBackendOverride(kind)) {}
  ~BackendGuard() { SetBackendOverride(previous_); }
  BackendGuard(const BackendGuard&) = delete;
  BackendGuard& operator=(const BackendGuard&) = delete;

 private:
  std::optional<BackendKind> previous_;
};

// SetBackendTable for one scope.
class BackendTableGuard {
 public:
  explicit BackendTableGuard(const Backend* table) : previous_(SetBackendTable(table)) {}
  ~BackendTableGuard() { SetBackendTable(previous_); }
  BackendTableGuard(const BackendTableGuard&) = delete;
  BackendTableGuard& operator=(const BackendTableGuard&) = delete;

 private:
  const Backend* previous_;
};

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_BACKEND_H_
