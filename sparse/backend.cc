#include "sparse/backend.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <mutex>

#include "sparse/cpu/backend.h"
#include "sparse/cpu/kernels.h"
#include "sparse/generic/backend.h"
#include "sparse/ops.h"
#if TRAINSUP_HAVE_CUDA
#include "sparse/cuda/backend.h"
#endif

namespace trainsup::sparse {
namespace {

// The registry, after ggml-backend-reg.cpp: every backend this build has,
// cpu first. Static libraries drop self-registering objects, so the list
// is spelled out here.
const std::vector<const Backend*>& Registry() {
  static const std::vector<const Backend*> backends = {
    &cpu::CpuBackend(),
    &generic::GenericBackend(),
#if TRAINSUP_HAVE_CUDA
    &cuda::CudaBackend(),
#endif
  };
  return backends;
}

std::string BuiltNames() {
  std::string names;
  for (const Backend* b : Registry()) names += (names.empty() ? "" : ", ") + std::string(b->name);
  return names;
}

// The override, read from TRAINSUP_BACKEND on first use.
struct OverrideState {
  std::mutex mu;
  bool initialised = false;
  std::optional<BackendKind> kind;
  const Backend* table = nullptr;  // SetBackendTable
};

OverrideState& Override() {
  static OverrideState* state = new OverrideState();
  return *state;
}

void CheckBuilt(BackendKind kind) {
  TORCH_CHECK(FindBackend(kind) != nullptr, "backend '", ToString(kind),
              "' is not in this build (built: ", BuiltNames(), ")");
}

// Requires state.mu.
void InitialiseOverride(OverrideState& state) {
  if (state.initialised) return;
  state.initialised = true;
  const char* env = std::getenv("TRAINSUP_BACKEND");
  if (env == nullptr || *env == '\0') return;
  const BackendKind kind = BackendKindFromString(env);
  CheckBuilt(kind);
  state.kind = kind;
}

}  // namespace

std::string ToString(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kGeneric:
      return "generic";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

BackendKind BackendKindFromString(const std::string& name) {
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "generic") return BackendKind::kGeneric;
  if (name == "cuda") return BackendKind::kCuda;
  TORCH_CHECK(false, "unknown backend '", name, "' (expected cpu, generic or cuda)");
}

PairView PairsOf(const KernelMap& map, bool transposed) {
  PairView p;
  p.src = transposed ? map.out_rows : map.in_rows;
  p.dst = transposed ? map.in_rows : map.out_rows;
  p.begin = &map.begin;
  p.device_begin = map.device_begin;
  p.identity_offset = map.identity_offset;
  p.sorted = map.rows_sorted;
  p.tables = map.tables;
  p.transposed = transposed;
  return p;
}

const Backend* FindBackend(BackendKind kind) {
  for (const Backend* b : Registry()) {
    if (b->kind == kind) return b;
  }
  return nullptr;
}

std::vector<BackendKind> BuiltBackends() {
  std::vector<BackendKind> kinds;
  for (const Backend* b : Registry()) kinds.push_back(b->kind);
  return kinds;
}

std::optional<BackendKind> BackendOverride() {
  OverrideState& state = Override();
  std::lock_guard<std::mutex> lock(state.mu);
  InitialiseOverride(state);
  return state.kind;
}

std::optional<BackendKind> SetBackendOverride(std::optional<BackendKind> kind) {
  if (kind) CheckBuilt(*kind);
  OverrideState& state = Override();
  std::lock_guard<std::mutex> lock(state.mu);
  InitialiseOverride(state);
  std::optional<BackendKind> previous = state.kind;
  state.kind = kind;
  return previous;
}

const Backend* SetBackendTable(const Backend* table) {
  OverrideState& state = Override();
  std::lock_guard<std::mutex> lock(state.mu);
  const Backend* previous = state.table;
  state.table = table;
  return previous;
}

const Backend& BackendFor(c10::Device device) {
  const Backend* table = nullptr;
  std::optional<BackendKind> forced;
  {
    OverrideState& state = Override();
    std::lock_guard<std::mutex> lock(state.mu);
    InitialiseOverride(state);
    table = state.table;
    forced = state.kind;
  }
  if (table != nullptr && table->runs_on(device.type())) return *table;
  if (forced) {
    const Backend* b = FindBackend(*forced);
    if (b->runs_on(device.type())) return *b;
  }
  // The defaults: cpu on the CPU; on CUDA the generic backend until the
  // CUDA kernels have passed the cross-backend test on a GPU (backend.h).
  const BackendKind fallback =
      device.type() == c10::DeviceType::CPU ? BackendKind::kCpu : BackendKind::kGeneric;
  const Backend* b = FindBackend(fallback);
  TORCH_CHECK(b != nullptr && b->runs_on(device.type()), "no backend of this build runs on ",
              device, " (built: ", BuiltNames(), ")");
  return *b;
}

}  // namespace trainsup::sparse

namespace trainsup::sparse {

std::string DescribePrecision(at::ScalarType features, c10::Device device) {
  const Backend& backend = BackendFor(device);
  std::string kernels = backend.name;
  if (backend.kind == BackendKind::kCpu) {
    kernels = std::string("cpu backend, ") + cpu::ToString(cpu::ActiveKernelSet()) + " kernels";
    if (features == at::kBFloat16) kernels += cpu::DescribeBf16Kernels();
  } else {
    kernels += " backend";
  }
  if (!IsHalf(features)) {
    const bool tf32 = features == at::kFloat && device.is_cuda() && Tf32Enabled();
    return std::string(features == at::kDouble ? "fp64" : "fp32") + " on the " + kernels +
           (tf32 ? " (TF32 GEMMs)" : "");
  }
  std::string line = features == at::kBFloat16 ? "bf16" : "fp16";
  line += " features, float32 weights and sums, on the ";
  line += kernels;
  line += backend.takes_half_inputs(features, true)
              ? " (half inputs, float32 accumulation)"
              : " (convert-to-fp32: half in memory, float32 arithmetic)";
  return line;
}

void SetTf32(bool on) {
  at::globalContext().setAllowTF32CuBLAS(on);
  at::globalContext().setAllowTF32CuDNN(on);
}

bool Tf32Enabled() { return at::globalContext().allowTF32CuBLAS(); }

}  // namespace trainsup::sparse
