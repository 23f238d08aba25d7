#include "sparse/cuda/steps.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "sparse/coordinates.h"
#include "sparse/determinism.h"
#include "sparse/generic/backend.h"
#include "sparse/sparse_tensor.h"

namespace trainsup::sparse::cuda {
namespace {

// Gathered operands of one group of offsets stay under this many bytes (at
// least one offset per group): large enough that a layer takes a few
// groups, small next to a GPU's memory.
constexpr int64_t kGroupBytes = int64_t{256} << 20;

// Consecutive offsets [k0, k1) whose gathered pairs fit kGroupBytes, never
// holding the identity offset (which needs no gather).
std::vector<std::pair<int64_t, int64_t>> Groups(const PairView& pairs, int64_t bytes_per_pair) {
  std::vector<std::pair<int64_t, int64_t>> groups;
  const std::vector<int64_t>& begin = *pairs.begin;
  int64_t k0 = 0;
  for (int64_t k = 0; k <= pairs.volume(); ++k) {
    const bool end = k == pairs.volume() || k == pairs.identity_offset ||
                     (k > k0 && (begin[k + 1] - begin[k0]) * bytes_per_pair > kGroupBytes);
    if (!end) continue;
    if (k > k0) groups.emplace_back(k0, k);
    k0 = k == pairs.identity_offset ? k + 1 : k;
  }
  return groups;
}

std::atomic<int64_t> g_uploads{0};

// `values` as an int64 tensor on `device`. To a GPU, from pinned memory
// without waiting: LibTorch's caching host allocator keeps the pinned
// buffer until the copy on the current stream is done. (A pageable copy
// would make the host wait for the stream.)
at::Tensor Upload(const std::vector<int64_t>& values, c10::Device device) {
  g_uploads.fetch_add(1, std::memory_order_relaxed);
  const int64_t n = static_cast<int64_t>(values.size());
  if (!device.is_cuda()) return at::tensor(values, at::kLong).to(device);
  at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(values.begin(), values.end(), host.data_ptr<int64_t>());
  return host.to(device, /*non_blocking=*/true);
}

// inverse[k, row] = the pair of offset k that has row `row` on one side:
// over the dst rows (dst_side) or the src rows, `rows` of them. Built at
// the map's first use of that side, then kept in its PairTables for every
// later call, forward and backward (no fill, no inversion, no upload).
at::Tensor Inverse(const Launcher& launcher, const PairView& pairs, bool dst_side, int64_t rows) {
  const at::Tensor& rows_of_pairs = dst_side ? pairs.dst : pairs.src;
  auto build = [&] {
    at::Tensor inverse = at::full({pairs.volume(), rows}, -1, rows_of_pairs.options());
    const at::Tensor begin = pairs.device_begin.defined()
                                 ? pairs.device_begin
                                 : Upload(*pairs.begin, rows_of_pairs.device());
    launcher.Run(
        InvertPairs{rows_of_pairs.data_ptr<int32_t>(), begin.data_ptr<int64_t>(), pairs.volume(),
                    rows_of_pairs.size(0), rows, inverse.data_ptr<int32_t>()},
        "inverting pairs");
    return inverse;
  };
  if (pairs.tables == nullptr) return build();
  std::lock_guard<std::mutex> lock(pairs.tables->mu);
  at::Tensor& kept =
      dst_side != pairs.transposed ? pairs.tables->by_out_row : pairs.tables->by_in_row;
  if (!kept.defined()) kept = build();
  TORCH_CHECK(kept.size(0) == pairs.volume() && kept.size(1) == rows,
              "kernel map's inverse table is [", kept.size(0), ", ", kept.size(1), "], expected [",
              pairs.volume(), ", ", rows, "]");
  return kept;
}

// dst = src[rows[0, n)], rows of src.size(1) values. Half rows are copied
// as 16-bit words: one op for bfloat16 and float16.
void Gather(const Launcher& launcher, const at::Tensor& src, const int32_t* rows, int64_t n,
            at::Tensor& dst) {
  if (IsHalf(src.scalar_type())) {
    launcher.Run(GatherRows<uint16_t>{static_cast<const uint16_t*>(src.const_data_ptr()),
                                      src.size(1), rows, n, static_cast<uint16_t*>(dst.data_ptr())},
                 "gather");
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "cuda_gather", [&] {
    launcher.Run(GatherRows<scalar_t>{src.data_ptr<scalar_t>(), src.size(1), rows, n,
                                      dst.data_ptr<scalar_t>()},
                 "gather");
  });
}

// out = a @ b into `out`, whose type is the sums': a's and b's own, or
// float32 for half a and b (the gather-GEMM dataflow's mixed precision).
// Half inputs on CUDA: cuBLAS's tensor cores through mm's out_dtype, exact
// products summed in float32 and written without a rounding to half. On
// the host launcher's CPU tensors ATen's mm has no out_dtype (CUDA only),
// so the inputs are widened first: the same exact products (a half times
// a half fits float32's significand), summed in float32. So are a CUDA
// build's before LibTorch 2.8, which lacks out_dtype
// (TRAINSUP_MM_OUT_DTYPE, sparse/cuda/CMakeLists.txt).
void MmInto(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == out.scalar_type()) {
    at::mm_out(out, a, b);
#ifdef TRAINSUP_MM_OUT_DTYPE
  } else if (a.is_cuda()) {
    at::mm_out(out, a, b, out.scalar_type());
#endif
  } else {
    at::mm_out(out, a.to(out.scalar_type()), b.to(out.scalar_type()));
  }
}

// A [rows, cols] buffer of the sums' type for operands like `x`.
at::Tensor SumBuffer(const at::Tensor& x, int64_t rows, int64_t cols) {
  return at::empty({rows, cols}, x.options().dtype(AccumulateType(x.scalar_type())));
}

// out[rows_out] += sum_k scatter_to(gather_from(x) @ op(W_k)) (from, to:
// src, dst; swapped for the input gradient), offsets in
// order, the identity offset skipped (the caller put it in `out` first; no
// group holds it). `out` has the sums' type (SumBuffer): x's, or float32
// for half x, whose products are written in float32 (MmInto).
// transpose_w: W_k^T (the input gradient).
void GatherGemmScatter(const Launcher& launcher, const at::Tensor& x, const at::Tensor& w,
                       bool transpose_w, const PairView& pairs, at::Tensor& out) {
  const at::Tensor& from = transpose_w ? pairs.dst : pairs.src;
  if (from.numel() == 0) return;
  const int64_t cols_in = x.size(1), cols_out = out.size(1);
  const at::Tensor inverse = Inverse(launcher, pairs, /*dst_side=*/!transpose_w, out.size(0));
  const std::vector<int64_t>& begin = *pairs.begin;
  const int64_t bytes_per_pair = cols_in * x.element_size() + cols_out * out.element_size();
  for (const auto& [k0, k1] : Groups(pairs, bytes_per_pair)) {
    const int64_t base = begin[k0], n = begin[k1] - base;
    at::Tensor a = at::empty({n, cols_in}, x.options());
    at::Tensor c = SumBuffer(x, n, cols_out);
    Gather(launcher, x, from.data_ptr<int32_t>() + base, n, a);
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t m = pairs.count(k);
      if (m == 0) continue;
      at::Tensor ck = c.narrow(0, begin[k] - base, m);
      MmInto(ck, a.narrow(0, begin[k] - base, m), transpose_w ? w[k].t() : w[k]);
    }
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "cuda_scatter", [&] {
      launcher.Run(
          ScatterSum<scalar_t>{c.data_ptr<scalar_t>(), cols_out, inverse.data_ptr<int32_t>(),
                               out.size(0), k0, k1, base, out.data_ptr<scalar_t>()},
          "scatter");
    });
  }
}

// Half features and weights on the gather-GEMM dataflow: the products and
// every sum in float32 (SumBuffer, MmInto), each result rounded once to the
// half type at the end.
// The bias is one more op over the sums, in place (AddBias).
at::Tensor GemmForward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                       const at::Tensor& bias, const PairView& pairs, int64_t num_out) {
  const int64_t id = pairs.identity_offset;
  at::Tensor out = SumBuffer(f, num_out, w.size(2));
  if (id >= 0) {
    MmInto(out, f, w[id]);
  } else {
    out.zero_();
  }
  GatherGemmScatter(launcher, f, w, /*transpose_w=*/false, pairs, out);
  if (bias.defined() && out.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "cuda_add_bias", [&] {
      launcher.Run(AddBias<scalar_t>{out.data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(),
                                     out.size(0), out.size(1)},
                   "bias");
    });
  }
  return out.to(f.scalar_type());
}

void GemmBackward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                  const PairView& pairs, const at::Tensor& grad_out, bool need_input,
                  bool need_weight, at::Tensor* grad_in, at::Tensor* grad_weight) {
  const int64_t id = pairs.identity_offset;
  *grad_in = at::Tensor();
  *grad_weight = at::Tensor();
  if (need_input) {
    at::Tensor sum = SumBuffer(f, f.size(0), f.size(1));
    if (id >= 0) {
      MmInto(sum, grad_out, w[id].t());
    } else {
      sum.zero_();
    }
    GatherGemmScatter(launcher, grad_out, w, /*transpose_w=*/true, pairs, sum);
    *grad_in = sum.to(f.scalar_type());
  }
  if (!need_weight) return;
  at::Tensor sum = at::zeros(w.sizes(), w.options().dtype(AccumulateType(w.scalar_type())));
  if (id >= 0) {
    at::Tensor gid = sum[id];
    MmInto(gid, f.t(), grad_out);
  }
  const std::vector<int64_t>& begin = *pairs.begin;
  const int64_t cin = f.size(1), cout = grad_out.size(1);
  for (const auto& [k0, k1] : Groups(pairs, (cin + cout) * f.element_size())) {
    const int64_t base = begin[k0], n = begin[k1] - base;
    at::Tensor a = at::empty({n, cin}, f.options());
    at::Tensor g = at::empty({n, cout}, f.options());
    Gather(launcher, f, pairs.src.data_ptr<int32_t>() + base, n, a);
    Gather(launcher, grad_out, pairs.dst.data_ptr<int32_t>() + base, n, g);
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t m = pairs.count(k);
      if (m == 0) continue;
      at::Tensor gk = sum[k];
      MmInto(gk, a.narrow(0, begin[k] - base, m).t(), g.narrow(0, begin[k] - base, m));
    }
  }
  *grad_weight = sum.to(w.scalar_type());
}

// Calls body(T{}, In{}) with the fused ops' sum type T and input type In
// for features of `type`: float32 and float64 as they are; bfloat16 and
// float16 as their bits, summed in float32 (issue 44).
template <typename Body>
void ForFusedTypes(at::ScalarType type, const Body& body) {
  switch (type) {
    case at::kFloat:
      return body(float{}, float{});
    case at::kDouble:
      return body(double{}, double{});
    case at::kBFloat16:
      return body(float{}, BFloat16Bits{});
    case at::kHalf:
      return body(float{}, Float16Bits{});
    default:
      TORCH_CHECK(false,
                  "the CUDA backend's fused convolution takes float32, float64, bfloat16 or ",
                  "float16 features, not ", type);
  }
}

// The fused ops read the features, the weight and the output gradient
// (backward) as one type, from their raw memory.
void CheckFusedTypes(const at::Tensor& f, const at::Tensor& w) {
  TORCH_CHECK(f.scalar_type() == w.scalar_type(), "the CUDA backend's fused convolution takes ",
              "features and weight of one type, not ", f.scalar_type(), " and ", w.scalar_type());
}
void CheckFusedTypes(const at::Tensor& f, const at::Tensor& w, const at::Tensor& grad_out) {
  TORCH_CHECK(f.scalar_type() == w.scalar_type() && f.scalar_type() == grad_out.scalar_type(),
              "the CUDA backend's fused convolution takes features, weight and output gradient ",
              "of one type, not ", f.scalar_type(), ", ", w.scalar_type(), " and ",
              grad_out.scalar_type());
}

template <typename In>
const In* Data(const at::Tensor& t) {
  return static_cast<const In*>(t.const_data_ptr());
}

// The fused dataflow (steps.h): ImplicitGemmTiles for the forward and the
// input gradient. Half features and weights are read as they are and
// summed in float32 (a half times a half is exact in float32), each result
// rounded once to the half type at the end, as on gather-GEMM.
// The bias is added in the op's epilogue: no launch of its own.
at::Tensor FusedForward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                        const at::Tensor& bias, const PairView& pairs, int64_t num_out) {
  CheckFusedTypes(f, w);
  const int64_t cin = w.size(1), cout = w.size(2);
  at::Tensor out = SumBuffer(f, num_out, cout);
  if (out.numel() == 0) return out.to(f.scalar_type());
  const at::Tensor inverse = Inverse(launcher, pairs, /*dst_side=*/true, num_out);
  ForFusedTypes(f.scalar_type(), [&](auto t, auto in) {
    using T = decltype(t);
    using In = decltype(in);
    launcher.Run(ImplicitGemmTiles<T, In>{Data<In>(f), cin, pairs.src.data_ptr<int32_t>(),
                                          inverse.data_ptr<int32_t>(), pairs.volume(), Data<In>(w),
                                          cin * cout, cout, 1, num_out, cout, out.data_ptr<T>(),
                                          bias.defined() ? bias.const_data_ptr<T>() : nullptr},
                 "implicit GEMM (forward)");
  });
  return out.to(f.scalar_type());
}

// Pairs per split of the fused weight gradient, and the most bytes its
// partial sums may take: both fixed, so the splits depend on the map and
// the shape alone.
constexpr int64_t kSplitPairs = 2048;
constexpr int64_t kSplitBytes = int64_t{64} << 20;

void FusedBackward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                   const PairView& pairs, const at::Tensor& grad_out, bool need_input,
                   bool need_weight, at::Tensor* grad_in, at::Tensor* grad_weight) {
  CheckFusedTypes(f, w, grad_out);
  const int64_t cin = w.size(1), cout = w.size(2), volume = pairs.volume();
  *grad_in = at::Tensor();
  *grad_weight = at::Tensor();
  if (need_input) {
    at::Tensor sum = SumBuffer(f, f.size(0), cin);
    if (sum.numel() > 0) {
      const at::Tensor inverse = Inverse(launcher, pairs, /*dst_side=*/false, f.size(0));
      ForFusedTypes(f.scalar_type(), [&](auto t, auto in) {
        using T = decltype(t);
        using In = decltype(in);
        launcher.Run(
            ImplicitGemmTiles<T, In>{Data<In>(grad_out), cout, pairs.dst.data_ptr<int32_t>(),
                                     inverse.data_ptr<int32_t>(), volume, Data<In>(w), cin * cout,
                                     1, cout, f.size(0), cin, sum.data_ptr<T>()},
            "implicit GEMM (input gradient)");
      });
    }
    *grad_in = sum.to(f.scalar_type());
  }
  if (!need_weight) return;
  const int64_t elements = w.numel();
  at::Tensor sum = SumBuffer(w, volume, cin * cout);
  if (elements > 0) {
    int64_t most = 0;
    for (int64_t k = 0; k < volume; ++k) most = std::max(most, pairs.count(k));
    const int64_t cap = std::max<int64_t>(1, kSplitBytes / (elements * sum.element_size()));
    const int64_t splits = std::clamp<int64_t>((most + kSplitPairs - 1) / kSplitPairs, 1, cap);
    const int64_t chunk = std::max<int64_t>(1, (most + splits - 1) / splits);
    const at::Tensor begin =
        pairs.device_begin.defined() ? pairs.device_begin : Upload(*pairs.begin, f.device());
    at::Tensor partial = at::empty({splits, elements}, sum.options());
    ForFusedTypes(f.scalar_type(), [&](auto t, auto in) {
      using T = decltype(t);
      using In = decltype(in);
      launcher.Run(WeightGradTiles<T, In>{Data<In>(f), cin, pairs.src.data_ptr<int32_t>(),
                                          Data<In>(grad_out), cout, pairs.dst.data_ptr<int32_t>(),
                                          begin.data_ptr<int64_t>(), volume, chunk, splits,
                                          partial.data_ptr<T>()},
                   "weight gradient (splits)");
      launcher.Run(SumSplits<T>{partial.data_ptr<T>(), splits, elements, sum.data_ptr<T>()},
                   "weight gradient (sum)");
    });
  }
  *grad_weight = sum.view(w.sizes()).to(w.scalar_type());
}

// ---- the dataflow setting and the measured choice ----

std::atomic<Dataflow>& DataflowFlag() {
  static std::atomic<Dataflow> flag{DataflowFromString(std::getenv("TRAINSUP_CUDA_DATAFLOW"))};
  return flag;
}

struct Choice {
  Dataflow dataflow;
  std::string line;
};

std::mutex g_choices_mu;
std::map<std::vector<int64_t>, Choice>& Choices() {
  static std::map<std::vector<int64_t>, Choice> choices;
  return choices;
}

// Seconds of run(), on the launcher's device.
template <typename Run>
double Timed(const Launcher& launcher, const Run& run) {
  launcher.Synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  run();
  launcher.Synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The dataflow for `requested` on a layer of this shape; run(d) runs the
// convolution in dataflow d (each run's results replace the last).
template <typename Run>
Dataflow Resolve(Dataflow requested, const Launcher& launcher, bool backward, const at::Tensor& w,
                 const PairView& pairs, const Run& run) {
  if (requested != Dataflow::kMeasured) return requested;
  if (IsDeterministic()) return Dataflow::kGatherGemm;
  const int64_t total = pairs.begin->empty() ? 0 : pairs.begin->back();
  int64_t log2 = 0;
  while ((int64_t{1} << log2) < total) ++log2;
  const std::vector<int64_t> key = {
      backward ? 1 : 0, w.size(1), w.size(2),
      pairs.volume(),   log2,      static_cast<int64_t>(w.scalar_type())};
  {
    std::lock_guard<std::mutex> lock(g_choices_mu);
    const auto found = Choices().find(key);
    if (found != Choices().end()) return found->second.dataflow;
  }
  run(Dataflow::kGatherGemm);  // warm-ups: allocations, cuBLAS's handles
  run(Dataflow::kFused);
  const double gemm = Timed(launcher, [&] { run(Dataflow::kGatherGemm); });
  const double fused = Timed(launcher, [&] { run(Dataflow::kFused); });
  const Dataflow chosen = fused < gemm ? Dataflow::kFused : Dataflow::kGatherGemm;
  char line[160];
  std::snprintf(line, sizeof line,
                "%s %lld->%lld k%lld 2^%lld pairs %s: %s (fused %.3f ms, gather-GEMM %.3f ms)",
                backward ? "backward" : "forward", static_cast<long long>(key[1]),
                static_cast<long long>(key[2]), static_cast<long long>(key[3]),
                static_cast<long long>(log2), c10::toString(w.scalar_type()),
                ToString(chosen).c_str(), fused * 1e3, gemm * 1e3);
  std::lock_guard<std::mutex> lock(g_choices_mu);
  Choices().emplace(key, Choice{chosen, line});
  return chosen;
}

}  // namespace

Dataflow DataflowFromString(const char* value) {
  const std::string v = value != nullptr ? value : "";
  if (v.empty() || v == "measured") return Dataflow::kMeasured;
  if (v == "gemm") return Dataflow::kGatherGemm;
  if (v == "fused") return Dataflow::kFused;
  TORCH_CHECK(false, "TRAINSUP_CUDA_DATAFLOW: unknown dataflow '", v,
              "' (expected gemm, fused or measured)");
}

std::string ToString(Dataflow dataflow) {
  switch (dataflow) {
    case Dataflow::kGatherGemm:
      return "gather-GEMM";
    case Dataflow::kFused:
      return "fused";
    case Dataflow::kMeasured:
      break;
  }
  return "measured";
}

Dataflow ActiveDataflow() { return DataflowFlag().load(std::memory_order_relaxed); }

Dataflow SetDataflow(Dataflow dataflow) { return DataflowFlag().exchange(dataflow); }

std::vector<std::string> DataflowChoices() {
  std::lock_guard<std::mutex> lock(g_choices_mu);
  std::vector<std::string> lines;
  for (const auto& [key, choice] : Choices()) lines.push_back(choice.line);
  return lines;
}

at::Tensor ConvForward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                       const at::Tensor& bias, const PairView& pairs, int64_t num_out,
                       Dataflow dataflow) {
  at::Tensor out;
  auto run = [&](Dataflow d) {
    out = d == Dataflow::kFused ? FusedForward(launcher, f, w, bias, pairs, num_out)
                                : GemmForward(launcher, f, w, bias, pairs, num_out);
  };
  run(Resolve(dataflow, launcher, false, w, pairs, run));
  return out;
}

void ConvBackward(const Launcher& launcher, const at::Tensor& f, const at::Tensor& w,
                  const PairView& pairs, const at::Tensor& grad_out, bool need_input,
                  bool need_weight, at::Tensor* grad_in, at::Tensor* grad_weight,
                  Dataflow dataflow) {
  auto run = [&](Dataflow d) {
    (d == Dataflow::kFused ? FusedBackward : GemmBackward)(
        launcher, f, w, pairs, grad_out, need_input, need_weight, grad_in, grad_weight);
  };
  run(Resolve(dataflow, launcher, true, w, pairs, run));
}

int64_t HostUploads() { return g_uploads.load(std::memory_order_relaxed); }

Backend StepsTableBase(const char* name, bool (*runs_on)(c10::DeviceType)) {
  Backend b = generic::GenericBackend();
  b.kind = BackendKind::kCuda;
  b.name = name;
  b.runs_on = runs_on;
  b.builds_from_device_keys = true;
  return b;
}

void BuildKernelMap(const Launcher& launcher, const KernelMapInputs& inputs, KernelMap* map) {
  if (!generic::StartKernelMap(inputs, map)) {
    map->device_begin = Upload(map->begin, inputs.device);
    return;
  }
  const at::Tensor& in_keys = inputs.in_device->keys;
  const at::Tensor& out_keys = inputs.out_device->keys;
  const int64_t n_in = in_keys.size(0), n_out = out_keys.size(0);
  const int64_t volume = static_cast<int64_t>(inputs.offsets.size());
  const at::TensorOptions index = in_keys.options();
  std::vector<int64_t> fields(3 * volume), delta(volume);
  for (int64_t k = 0; k < volume; ++k) {
    for (int a = 0; a < 3; ++a) fields[3 * k + a] = int64_t{inputs.offsets[k][a]} * inputs.step;
    delta[k] = PackedShift(fields[3 * k], fields[3 * k + 1], fields[3 * k + 2]);
  }
  const at::Tensor fields_d = Upload(fields, inputs.device);
  const at::Tensor delta_d = Upload(delta, inputs.device);
  const bool mirror = inputs.same_set && inputs.kernel_size % 2 == 1;
  const int64_t lookups = mirror ? volume / 2 + 1 : volume;
  at::Tensor match = at::full({volume, n_out}, -1, index.dtype(at::kInt));
  launcher.Run(MapSearch{in_keys.data_ptr<int64_t>(), n_in, out_keys.data_ptr<int64_t>(), n_out,
                         fields_d.data_ptr<int64_t>(), delta_d.data_ptr<int64_t>(), kCoordinateBits,
                         lookups, volume, mirror, match.data_ptr<int32_t>()},
               "kernel-map search");
  // The pairs in row-major order of `match` (offset by offset, output keys
  // ascending: the map's pair order), each at its prefix count. The counts
  // per offset are the build's one host synchronisation.
  const at::Tensor hit = match.ge(0);
  const at::Tensor position = at::cumsum(hit.view({-1}), 0, at::kInt);
  const at::Tensor counts = hit.sum(1).to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* count = counts.data_ptr<int64_t>();
  for (int64_t k = 0; k < volume; ++k) map->begin[k + 1] = map->begin[k] + count[k];
  at::Tensor in_pos = at::empty({map->begin[volume]}, index.dtype(at::kInt));
  at::Tensor pos = at::empty({map->begin[volume]}, index.dtype(at::kInt));
  launcher.Run(CompactPairs{match.data_ptr<int32_t>(), position.data_ptr<int32_t>(), n_out,
                            volume * n_out, in_pos.data_ptr<int32_t>(), pos.data_ptr<int32_t>()},
               "kernel-map compaction");
  const at::Tensor& in_rows = inputs.in_device->rows;
  const at::Tensor& out_rows = inputs.out_device->rows;
  map->in_rows = in_rows.defined() ? in_rows.index_select(0, in_pos) : in_pos;
  map->out_rows = out_rows.defined() ? out_rows.index_select(0, pos) : pos;
  map->device_begin = Upload(map->begin, inputs.device);
}

}  // namespace trainsup::sparse::cuda
