// The backend table (sparse/backend.h): selection (names, defaults by
// device, the override), and the cross-backend test after ggml's
// tests/test-backend-ops.cpp: every op on every backend this machine can
// run, against the cpu backend on CPU tensors, forward and gradients.
//
// Targets: cpu, generic_on_cpu, cuda_steps_on_host and cuda_fused_on_host
// (the CUDA backend's code with its kernels' element code run on the host,
// host_launcher.h, in each of its two dataflows), and (with a CUDA
// device and a CUDA LibTorch) generic_on_cuda and cuda. The CUDA targets carry the ctest
// label `gpu` and are skipped without a device.
//
// What must match bit for bit and what within float tolerance is stated
// per result (Match): integer results, selections and sums taken in the
// same order must be equal; products summed in another order (BLAS blocks
// against one matrix product, the fused AVX-512 kernels, cuBLAS, a
// different BatchNorm) within kTolerance of the result's largest entry.
#include "sparse/backend.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "sparse/cpu/kernels.h"
#include "sparse/cuda/steps.h"
#include "sparse/determinism.h"
#include "sparse/generic/backend.h"
#include "sparse/minkunet.h"
#include "sparse/ops.h"
#include "tests/sparse/host_launcher.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::CudaFusedOnHost;
using testing::CudaStepsOnHost;
using testing::ErrorMessage;
using testing::MakeRandomInput;

// ---------------------------------------------------------------------------
// Selection.

// train.tf32: LibTorch's process-wide switch, and the precision line
// names it for float32 on CUDA only (a CUDA device is only named here;
// no GPU runs this).
TEST(Backend, Tf32IsLibTorchsSwitchAndNamedForFloat32OnCuda) {
  const bool before = Tf32Enabled();
  SetTf32(true);
  EXPECT_TRUE(Tf32Enabled());
  EXPECT_TRUE(at::globalContext().allowTF32CuBLAS());
  EXPECT_TRUE(at::globalContext().allowTF32CuDNN());
  EXPECT_EQ(DescribePrecision(at::kFloat, c10::Device(c10::DeviceType::CPU)).find("TF32"),
            std::string::npos);
  // CUDA tensors default to the generic backend (backend.h).
  const std::string cuda = DescribePrecision(at::kFloat, c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_NE(cuda.find("fp32 on the generic backend (TF32 GEMMs)"), std::string::npos) << cuda;
  SetTf32(false);
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
  EXPECT_EQ(DescribePrecision(at::kFloat, c10::Device(c10::DeviceType::CUDA, 0)).find("TF32"),
            std::string::npos);
  SetTf32(before);
}

TEST(Backend, NamesRoundTrip) {
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kGeneric, BackendKind::kCuda}) {
    EXPECT_EQ(BackendKindFromString(ToString(kind)), kind);
  }
  EXPECT_NE(ErrorMessage([] {
              BackendKindFromString("opencl");
            }).find("unknown backend 'opencl' (expected cpu, generic or cuda)"),
            std::string::npos);
}

TEST(Backend, CpuAndGenericAreAlwaysBuilt) {
  const std::vector<BackendKind> built = BuiltBackends();
  ASSERT_GE(built.size(), 2u);
  EXPECT_EQ(built[0], BackendKind::kCpu);
  EXPECT_EQ(built[1], BackendKind::kGeneric);
  EXPECT_TRUE(FindBackend(BackendKind::kGeneric)->runs_on(c10::DeviceType::CUDA));
  EXPECT_TRUE(FindBackend(BackendKind::kGeneric)->runs_on(c10::DeviceType::CPU));
  EXPECT_FALSE(FindBackend(BackendKind::kCpu)->runs_on(c10::DeviceType::CUDA));
}

TEST(Backend, DefaultsAreCpuOnTheCpuAndGenericOnCuda) {
  BackendGuard none(std::nullopt);
  EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CPU)).kind, BackendKind::kCpu);
  // Choosing a table touches no device, so this holds without a GPU too.
  EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CUDA, 0)).kind, BackendKind::kGeneric);
}

TEST(Backend, OverrideAppliesWhereItsBackendRuns) {
  {
    BackendGuard generic(BackendKind::kGeneric);
    EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CPU)).kind, BackendKind::kGeneric);
    EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CUDA, 0)).kind, BackendKind::kGeneric);
  }
  {
    // The cpu backend does not run on CUDA: there the default stays.
    BackendGuard cpu(BackendKind::kCpu);
    EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CUDA, 0)).kind, BackendKind::kGeneric);
  }
  if (FindBackend(BackendKind::kCuda) != nullptr) {
    BackendGuard cuda(BackendKind::kCuda);
    EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CUDA, 0)).kind, BackendKind::kCuda);
    EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CPU)).kind, BackendKind::kCpu);
  }
}

TEST(Backend, GuardRestoresThePreviousOverride) {
  const std::optional<BackendKind> before = BackendOverride();
  {
    BackendGuard cpu(BackendKind::kCpu);
    EXPECT_EQ(BackendOverride(), BackendKind::kCpu);
    {
      BackendGuard generic(BackendKind::kGeneric);
      EXPECT_EQ(BackendOverride(), BackendKind::kGeneric);
    }
    EXPECT_EQ(BackendOverride(), BackendKind::kCpu);
  }
  EXPECT_EQ(BackendOverride(), before);
}

TEST(Backend, AskingForABackendNotBuiltFailsAndKeepsTheOverride) {
  if (FindBackend(BackendKind::kCuda) != nullptr) GTEST_SKIP() << "this build has the cuda backend";
  const std::optional<BackendKind> before = BackendOverride();
  EXPECT_NE(ErrorMessage([] {
              SetBackendOverride(BackendKind::kCuda);
            }).find("backend 'cuda' is not in this build (built: cpu, generic)"),
            std::string::npos);
  EXPECT_EQ(BackendOverride(), before);
}

// ---------------------------------------------------------------------------
// The cross-backend test.

TEST(Backend, ATableGoesBeforeTheOverrideWhereItRuns) {
  BackendGuard generic(BackendKind::kGeneric);
  {
    BackendTableGuard table(&CudaStepsOnHost());
    EXPECT_EQ(&BackendFor(c10::Device(c10::DeviceType::CPU)), &CudaStepsOnHost());
    EXPECT_EQ(BackendFor(c10::Device(c10::DeviceType::CUDA, 0)).kind, BackendKind::kGeneric);
  }
  EXPECT_EQ(&BackendFor(c10::Device(c10::DeviceType::CPU)), FindBackend(BackendKind::kGeneric));
}

struct Target {
  BackendKind kind;
  c10::DeviceType device;
  const char* name;
  // A table outside the registry (SetBackendTable) instead of `kind`'s.
  const Backend& (*table)() = nullptr;
  // Sums a convolution as the cpu backend's BLAS path does (offsets one
  // after another, each a GEMM); the fused dataflow's chains of fused
  // multiply-adds round differently.
  bool blas_sums = true;
};

// Names the target in test names and failure messages.
void PrintTo(const Target& t, std::ostream* os) { *os << t.name; }

const Target kTargets[] = {
    {BackendKind::kCpu, c10::DeviceType::CPU, "cpu"},
    {BackendKind::kGeneric, c10::DeviceType::CPU, "generic_on_cpu"},
    {BackendKind::kCuda, c10::DeviceType::CPU, "cuda_steps_on_host", &CudaStepsOnHost},
    {BackendKind::kCuda, c10::DeviceType::CPU, "cuda_fused_on_host", &CudaFusedOnHost, false},
    {BackendKind::kGeneric, c10::DeviceType::CUDA, "generic_on_cuda"},
    {BackendKind::kCuda, c10::DeviceType::CUDA, "cuda"},
};

// kExact: bit for bit on every target. kExactOnCpu: bit for bit on CPU
// targets that sum as the BLAS path does (Target::blas_sums), within
// tolerance on CUDA (another BLAS) and in the fused dataflow. kClose:
// within tolerance everywhere.
enum class Match { kExact, kExactOnCpu, kClose };

struct Result {
  std::string name;
  at::Tensor value;
  Match match;
};

// One op case: builds its inputs from fixed seeds on `device`, runs the op
// forward and backward, returns what to compare.
using Case = std::function<std::vector<Result>(c10::Device device)>;

constexpr double kFloatTolerance = 2e-5;
constexpr double kDoubleTolerance = 1e-11;

// A fresh leaf on `device` holding t's values (Tensor::to returns t itself
// when it is on `device` already).
at::Tensor Leaf(const at::Tensor& t, c10::Device device) {
  return t.to(device).clone().detach().requires_grad_();
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  if (want.numel() == 0) return 0;
  const at::Tensor w = want.to(at::kDouble);
  const double scale = w.abs().max().item<double>();
  return (got.to(at::kDouble) - w).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

class CrossBackend : public ::testing::TestWithParam<Target> {
 protected:
  void SetUp() override {
    const Target& t = GetParam();
    if (t.table == nullptr && FindBackend(t.kind) == nullptr) {
      GTEST_SKIP() << "backend " << ToString(t.kind) << " is not in this build";
    }
    if (t.device == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device (or LibTorch without CUDA)";
    }
  }

  c10::Device device() const {
    return GetParam().device == c10::DeviceType::CPU ? c10::Device(c10::DeviceType::CPU)
                                                     : c10::Device(c10::DeviceType::CUDA, 0);
  }

  // Runs `op` on the reference (cpu backend, CPU tensors) and on the target,
  // in and out of deterministic mode, and compares every result.
  void Check(const Case& op, at::ScalarType dtype) {
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(deterministic ? "deterministic" : "not deterministic");
      DeterministicGuard mode(deterministic);
      std::vector<Result> want, got;
      {
        BackendGuard cpu(BackendKind::kCpu);
        want = op(c10::Device(c10::DeviceType::CPU));
      }
      {
        const Target& t = GetParam();
        BackendGuard target(t.table != nullptr ? std::nullopt : std::optional(t.kind));
        BackendTableGuard table(t.table != nullptr ? &t.table() : nullptr);
        got = op(device());
      }
      ASSERT_EQ(got.size(), want.size());
      const bool on_cpu = GetParam().device == c10::DeviceType::CPU && GetParam().blas_sums;
      for (size_t i = 0; i < got.size(); ++i) {
        SCOPED_TRACE(want[i].name);
        const at::Tensor g = got[i].value.to(at::kCPU);
        const at::Tensor& w = want[i].value;
        ASSERT_TRUE(g.defined() && w.defined());
        ASSERT_EQ(g.sizes(), w.sizes());
        ASSERT_EQ(g.scalar_type(), w.scalar_type());
        const bool exact = want[i].match == Match::kExact ||
                           (want[i].match == Match::kExactOnCpu && on_cpu) ||
                           GetParam().kind == BackendKind::kCpu;
        if (exact) {
          EXPECT_TRUE(at::equal(g, w)) << "not bit for bit: largest difference "
                                       << (g.to(at::kDouble) - w.to(at::kDouble)).abs().max();
        } else {
          EXPECT_LE(RelativeError(g, w), dtype == at::kDouble ? kDoubleTolerance : kFloatTolerance);
        }
      }
    }
  }
};

// Whether the cpu backend's float convolutions take the fused kernels here
// (then their sums run in another order than any BLAS).
bool CpuFused(at::ScalarType dtype, bool sorted) {
  return dtype == at::kFloat && sorted && cpu::FusedKernelsEnabled();
}

struct ConvShape {
  int64_t cin, cout;
  int32_t kernel, stride, dilation;
  bool transposed;
  bool sorted;  // rows in key order (what Quantize makes), else shuffled
};

std::string Describe(const ConvShape& s) {
  return std::to_string(s.cin) + "->" + std::to_string(s.cout) + " k" + std::to_string(s.kernel) +
         " s" + std::to_string(s.stride) + " d" + std::to_string(s.dilation) +
         (s.transposed ? " transposed" : "") + (s.sorted ? " sorted" : " shuffled");
}

const ConvShape kConvShapes[] = {
    {8, 12, 3, 1, 1, false, true},  {8, 12, 3, 1, 1, false, false}, {5, 7, 3, 1, 2, false, false},
    {3, 16, 5, 1, 1, false, true},  {16, 8, 2, 2, 1, false, true},  {6, 10, 3, 2, 1, false, false},
    {12, 12, 1, 1, 1, false, true}, {16, 8, 2, 2, 1, true, true},   {7, 9, 3, 2, 1, true, false},
};

TEST_P(CrossBackend, KernelMapsAreEqual) {
  struct MapShape {
    int32_t kernel, stride, dilation;
    int64_t origin;
    bool sorted;
    int32_t first_batch;
  };
  // Origins at the edges of the coordinate range, where the packed-key
  // shift would leave a field; batch indices from 511 and 1000, whose keys
  // have the top bit set (negative once biased for the device,
  // kDeviceKeyBias).
  const MapShape shapes[] = {{3, 1, 1, 0, true, 0},
                             {3, 1, 1, 0, false, 0},
                             {2, 2, 1, 0, true, 0},
                             {3, 2, 1, -3, false, 0},
                             {5, 1, 2, 5, true, 0},
                             {1, 1, 1, 0, false, 0},
                             {3, 1, 1, kMinCoordinate, false, 0},
                             {3, 1, 1, kMaxCoordinate - 7, true, 0},
                             {3, 1, 1, -4, false, 1000},
                             {2, 2, 1, 0, true, 511}};
  for (const MapShape& s : shapes) {
    SCOPED_TRACE("kernel " + std::to_string(s.kernel) + " stride " + std::to_string(s.stride) +
                 " dilation " + std::to_string(s.dilation) + " origin " + std::to_string(s.origin) +
                 " batch " + std::to_string(s.first_batch));
    Check(
        [&](c10::Device device) {
          auto in = MakeRandomInput(2, 8, 0.35, 1, at::kFloat, 7, s.origin, !s.sorted);
          in.coordinates.select(1, 0).add_(s.first_batch);
          SparseTensor x(in.features.to(device), in.coordinates);
          auto& m = x.manager();
          const CoordinateSetId out = m->Downsample(x.set_id(), s.stride);
          auto map = m->GetKernelMap(x.set_id(), out, s.kernel, s.dilation, device);
          EXPECT_EQ(map->in_rows.device(), device);
          EXPECT_GT(map->pairs(), 0);
          return std::vector<Result>{
              {"in_rows", map->in_rows, Match::kExact},
              {"out_rows", map->out_rows, Match::kExact},
              {"begin", at::tensor(map->begin, at::kLong), Match::kExact},
              {"identity_offset", at::tensor({map->identity_offset}, at::kLong), Match::kExact},
              {"rows_sorted", at::tensor({static_cast<int64_t>(map->rows_sorted)}, at::kLong),
               Match::kExact}};
        },
        at::kLong);
  }
}

TEST_P(CrossBackend, ConvolutionsForwardAndGradients) {
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    for (const ConvShape& s : kConvShapes) {
      SCOPED_TRACE(Describe(s) + (dtype == at::kFloat ? " float" : " double"));
      Check(
          [&](c10::Device device) {
            // Sums of products: the forward and input gradient add the
            // offsets in one order on every backend, so on the CPU they
            // match where the cpu backend takes BLAS (deterministic mode
            // always does); weight gradients are summed in other blocks.
            const bool fused = CpuFused(dtype, s.sorted && !IsDeterministic());
            auto in = MakeRandomInput(2, 9, 0.3, s.cin, dtype, 11, 0, !s.sorted);
            at::Generator gen = at::detail::createCPUGenerator(5);
            const int64_t volume = int64_t{s.kernel} * s.kernel * s.kernel;
            const at::TensorOptions o = at::TensorOptions().dtype(dtype);
            at::Tensor w = Leaf(at::randn({volume, s.cin, s.cout}, gen, o), device);
            at::Tensor b = Leaf(at::randn({s.cout}, gen, o), device);
            at::Tensor f = Leaf(in.features, device);
            SparseTensor x(f, in.coordinates);
            const ConvOptions opt{s.kernel, s.stride, s.dilation};
            SparseTensor y;
            at::Tensor leaf = f;
            if (s.transposed) {
              SparseTensor coarse = Pool(x, PoolMode::kAverage, {s.stride, s.stride, 1});
              leaf = coarse.F().detach().requires_grad_();
              y = ConvTranspose(coarse.WithFeatures(leaf), w, b, opt);
            } else {
              y = Conv(x, w, b, opt);
            }
            at::Tensor r = at::randn(y.F().sizes(), gen, o).to(device);
            (y.F() * r).sum().backward();
            const Match sums = fused ? Match::kClose : Match::kExactOnCpu;
            return std::vector<Result>{{"output", y.F().detach(), sums},
                                       {"grad features", leaf.grad(), sums},
                                       {"grad weight", w.grad(), Match::kClose},
                                       {"grad bias", b.grad(), Match::kExactOnCpu}};
          },
          dtype);
    }
  }
}

TEST_P(CrossBackend, PoolingForwardAndGradients) {
  struct PoolShape {
    PoolMode mode;
    int32_t kernel, stride;
    bool sorted;
  };
  // Windows of kernel 2, stride 2 are disjoint: every input is the maximum
  // of at most one window, so max-pool gradients are sums of one term.
  const PoolShape shapes[] = {
      {PoolMode::kMax, 2, 2, true},      {PoolMode::kMax, 2, 2, false},
      {PoolMode::kMax, 3, 2, false},     {PoolMode::kMax, 3, 1, true},
      {PoolMode::kAverage, 3, 2, false}, {PoolMode::kAverage, 2, 2, true},
      {PoolMode::kSum, 3, 1, false},
  };
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    for (const PoolShape& s : shapes) {
      SCOPED_TRACE(ToString(s.mode) + " k" + std::to_string(s.kernel) + " s" +
                   std::to_string(s.stride) + (s.sorted ? " sorted" : " shuffled"));
      const bool overlapping = s.kernel > s.stride;
      Check(
          [&](c10::Device device) {
            auto in = MakeRandomInput(2, 9, 0.35, 6, dtype, 17, 0, !s.sorted);
            // Ties: a few repeated values, so first-offset tie breaking counts.
            at::Tensor base = in.features.clone();
            base.slice(0, 0, base.size(0) / 3).fill_(0.5);
            at::Tensor f = Leaf(base, device);
            SparseTensor y = Pool(SparseTensor(f, in.coordinates), s.mode, {s.kernel, s.stride, 1});
            at::Generator gen = at::detail::createCPUGenerator(3);
            at::Tensor r = at::randn(y.F().sizes(), gen, at::TensorOptions().dtype(dtype));
            (y.F() * r.to(device)).sum().backward();
            // Max-pool gradients: the cpu backend adds an input's windows in
            // output-row order, the generic one in offset order.
            const Match grad =
                s.mode == PoolMode::kMax && overlapping ? Match::kClose : Match::kExact;
            return std::vector<Result>{{"output", y.F().detach(), Match::kExact},
                                       {"grad features", f.grad(), grad}};
          },
          dtype);
    }
  }
}

TEST_P(CrossBackend, GlobalPoolingForwardAndGradients) {
  for (PoolMode mode : {PoolMode::kMax, PoolMode::kAverage, PoolMode::kSum}) {
    SCOPED_TRACE(ToString(mode));
    Check(
        [&](c10::Device device) {
          auto in = MakeRandomInput(3, 7, 0.3, 5, at::kDouble, 23);
          at::Tensor f = Leaf(in.features, device);
          at::Tensor y = GlobalPool(SparseTensor(f, in.coordinates), mode);
          (y * at::arange(1, y.numel() + 1, y.options()).view(y.sizes())).sum().backward();
          // The same ATen reductions on either CPU backend; CUDA's reduce in
          // another order.
          return std::vector<Result>{{"output", y.detach(), Match::kExactOnCpu},
                                     {"grad features", f.grad(), Match::kExactOnCpu}};
        },
        at::kDouble);
  }
}

TEST_P(CrossBackend, BatchNormForwardStatisticsAndGradients) {
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    for (bool relu : {false, true}) {
      for (bool stats : {true, false}) {
        SCOPED_TRACE(std::string(relu ? "relu" : "no relu") + (stats ? " stats" : " no stats") +
                     (dtype == at::kFloat ? " float" : " double"));
        Check(
            [&](c10::Device device) {
              auto in = MakeRandomInput(2, 9, 0.4, 7, dtype, 29);
              const at::TensorOptions o = at::TensorOptions().dtype(dtype).device(device);
              at::Generator gen = at::detail::createCPUGenerator(2);
              at::Tensor f = Leaf(in.features * 3 + 1, device);
              at::Tensor w = at::randn({7}, gen, at::TensorOptions().dtype(dtype)).to(device);
              at::Tensor b = at::randn({7}, gen, at::TensorOptions().dtype(dtype)).to(device);
              w.requires_grad_();
              b.requires_grad_();
              at::Tensor rm = stats ? at::zeros({7}, o) : at::Tensor();
              at::Tensor rv = stats ? at::ones({7}, o) : at::Tensor();
              SparseTensor x(f, in.coordinates);
              SparseTensor y = BatchNorm(x, w, b, rm, rv, /*training=*/true, 0.1, 1e-5, relu);
              at::Tensor r = at::randn(y.F().sizes(), gen, at::TensorOptions().dtype(dtype));
              (y.F() * r.to(device)).sum().backward();
              std::vector<Result> out = {{"output", y.F().detach(), Match::kClose},
                                         {"grad features", f.grad(), Match::kClose},
                                         {"grad weight", w.grad(), Match::kClose},
                                         {"grad bias", b.grad(), Match::kClose}};
              if (stats) {
                out.push_back({"running mean", rm, Match::kClose});
                out.push_back({"running var", rv, Match::kClose});
                // Evaluation: one affine map with the running statistics,
                // the same ATen op on every backend.
                SparseTensor e = BatchNorm(x.WithFeatures(f.detach()), w.detach(), b.detach(), rm,
                                           rv, /*training=*/false, 0.1, 1e-5, relu);
                out.push_back({"evaluation", e.F(), Match::kClose});
              }
              return out;
            },
            dtype);
      }
    }
  }
}

TEST_P(CrossBackend, ConcatenationAndActivations) {
  Check(
      [&](c10::Device device) {
        auto in = MakeRandomInput(2, 7, 0.3, 4, at::kFloat, 31);
        at::Tensor a = Leaf(in.features, device);
        at::Tensor b = Leaf(in.features * 2 - 1, device);
        SparseTensor x(a, in.coordinates);
        SparseTensor y = Cat({x, x.WithFeatures(b)});
        SparseTensor z = Relu(LeakyRelu(y, 0.1));
        (z.F() * at::arange(z.F().numel(), z.F().options()).view(z.F().sizes())).sum().backward();
        return std::vector<Result>{{"output", z.F().detach(), Match::kExact},
                                   {"grad a", a.grad(), Match::kExact},
                                   {"grad b", b.grad(), Match::kExact}};
      },
      at::kFloat);
}

// ---------------------------------------------------------------------------
// Mixed precision (docs/engine.md, "Mixed precision"): half features with
// float32 master weights, on every target. Each result is compared with
// the exact result (float64, cpu backend) on the same rounded inputs: the
// features and the output gradient as rounded to the half type, the weight
// as its cast rounds it. The bound comes from the formats. A backend either
// sums in float32 and rounds once (convert-to-fp32) or rounds each
// offset's GEMM output and then the float32 sum (generic). Either way the
// error is within 2u * S, where u is the format's unit roundoff (2^-8 for
// bf16, 2^-11 for fp16) and S is the same sum over absolute values
// (|x| * |w|). Float32's own accumulation error adds at most n * 2^-24 * S,
// under 1e-5 * S for these sizes.

double UnitRoundoff(at::ScalarType t) { return std::ldexp(1.0, t == at::kBFloat16 ? -8 : -11); }

// The largest |got - want| / bound over the elements (<= 1: within it).
double WorstOverBound(const at::Tensor& got, const at::Tensor& want, const at::Tensor& bound) {
  const at::Tensor err = (got.to(at::kCPU).to(at::kDouble) - want.to(at::kDouble)).abs();
  return (err / (bound.to(at::kDouble) + 1e-30)).max().item<double>();
}

struct ConvRun {
  at::Tensor out, grad_features, grad_weight, grad_bias;
};

// A convolution of `features` by `weight` plus `bias` (float32 or float64
// leaves) and its backward with the output gradient randn, rounded to
// `grad_type`; with `absolute`, every input's absolute value (the bound's
// S).
ConvRun RunConv(const ConvShape& s, const at::Tensor& coordinates, const at::Tensor& features,
                const at::Tensor& weight, const at::Tensor& bias, at::ScalarType grad_type,
                bool absolute, c10::Device device) {
  at::Tensor f = Leaf(absolute ? features.abs() : features, device);
  at::Tensor w = Leaf(absolute ? weight.abs() : weight, device);
  at::Tensor b = Leaf(absolute ? bias.abs() : bias, device);
  SparseTensor y = Conv(SparseTensor(f, coordinates), w, b, {s.kernel, s.stride, s.dilation});
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor r = at::randn(y.F().sizes(), gen, at::kDouble).to(grad_type);
  if (absolute) r = r.abs();
  (y.F() * r.to(y.F().scalar_type()).to(device)).sum().backward();
  return {y.F().detach(), f.grad(), w.grad(), b.grad()};
}

TEST_P(CrossBackend, HalfPrecisionConvolutionsWithinTheFormatsBound) {
  for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
    const double u = UnitRoundoff(half);
    for (const ConvShape& s : kConvShapes) {
      if (s.transposed) continue;  // the same function; MinkUNet's step has them
      SCOPED_TRACE(Describe(s) + (half == at::kBFloat16 ? " bf16" : " fp16"));
      auto in = MakeRandomInput(2, 9, 0.3, s.cin, at::kDouble, 11, 0, !s.sorted);
      at::Generator gen = at::detail::createCPUGenerator(5);
      const int64_t volume = int64_t{s.kernel} * s.kernel * s.kernel;
      const at::Tensor w32 = at::randn({volume, s.cin, s.cout}, gen, at::kFloat);
      // The bias stays float32: it is added to the float32 sums.
      const at::Tensor b32 = at::randn({s.cout}, gen, at::kFloat);
      const at::Tensor xh = in.features.to(half);
      ConvRun want, sums;
      {
        BackendGuard cpu(BackendKind::kCpu);
        const c10::Device host(c10::DeviceType::CPU);
        const at::Tensor x64 = xh.to(at::kDouble), w64 = w32.to(half).to(at::kDouble);
        const at::Tensor b64 = b32.to(at::kDouble);
        want = RunConv(s, in.coordinates, x64, w64, b64, half, false, host);
        sums = RunConv(s, in.coordinates, x64, w64, b64, half, true, host);
      }
      const Target& t = GetParam();
      BackendGuard target(t.table != nullptr ? std::nullopt : std::optional(t.kind));
      BackendTableGuard table(t.table != nullptr ? &t.table() : nullptr);
      const ConvRun got = RunConv(s, in.coordinates, xh, w32, b32, half, false, device());
      ASSERT_EQ(got.out.scalar_type(), half);
      ASSERT_EQ(got.grad_features.scalar_type(), half);
      ASSERT_EQ(got.grad_weight.scalar_type(), at::kFloat);  // the master's
      ASSERT_EQ(got.grad_bias.scalar_type(), at::kFloat);
      const double factor = 2 * u + 1e-5;
      const double worst[] = {
          WorstOverBound(got.out, want.out, factor * sums.out),
          WorstOverBound(got.grad_features, want.grad_features, factor * sums.grad_features),
          WorstOverBound(got.grad_weight, want.grad_weight, factor * sums.grad_weight),
          WorstOverBound(got.grad_bias, want.grad_bias, factor * sums.grad_bias)};
      std::printf(
          "%s %s: worst error over its bound: output %.3f, grad features %.3f, grad "
          "weight %.3f, grad bias %.3f\n",
          Describe(s).c_str(), half == at::kBFloat16 ? "bf16" : "fp16", worst[0], worst[1],
          worst[2], worst[3]);
      EXPECT_LE(worst[0], 1.0) << "output";
      EXPECT_LE(worst[1], 1.0) << "grad features";
      EXPECT_LE(worst[2], 1.0) << "grad weight";
      EXPECT_LE(worst[3], 1.0) << "grad bias";
    }
  }
}

// BatchNorm on half features with float32 parameters: the arithmetic is
// float32 on exact half inputs, so the output and the input gradient are
// within one rounding to the half type (u |exact|) plus float32's error
// (1e-4 of the largest entry: sums over a few hundred rows); the
// parameters' gradients and the running statistics are float32 sums,
// within 1e-4 of their largest entry.
TEST_P(CrossBackend, HalfPrecisionBatchNormWithinOneRounding) {
  for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(half == at::kBFloat16 ? "bf16" : "fp16");
    const double u = UnitRoundoff(half);
    auto in = MakeRandomInput(2, 9, 0.4, 7, at::kDouble, 29);
    const at::Tensor xh = (in.features * 3 + 1).to(half);
    at::Generator gen = at::detail::createCPUGenerator(2);
    const at::Tensor w0 = at::randn({7}, gen, at::kFloat), b0 = at::randn({7}, gen, at::kFloat);
    const at::Tensor r = at::randn({in.features.size(0), 7}, gen, at::kDouble).to(half);
    auto run = [&](at::ScalarType type, at::ScalarType params, c10::Device device) {
      at::Tensor f = Leaf(xh.to(type), device);
      at::Tensor w = Leaf(w0.to(params), device), b = Leaf(b0.to(params), device);
      const at::TensorOptions o = at::TensorOptions().dtype(params).device(device);
      at::Tensor rm = at::zeros({7}, o), rv = at::ones({7}, o);
      SparseTensor y = BatchNorm(SparseTensor(f, in.coordinates), w, b, rm, rv,
                                 /*training=*/true, 0.1, 1e-5, /*relu=*/false);
      (y.F() * r.to(type).to(device)).sum().backward();
      return std::vector<at::Tensor>{y.F().detach(), f.grad(), w.grad(), b.grad(), rm, rv};
    };
    std::vector<at::Tensor> want;
    {
      BackendGuard cpu(BackendKind::kCpu);
      want = run(at::kDouble, at::kDouble, c10::Device(c10::DeviceType::CPU));
    }
    const Target& t = GetParam();
    BackendGuard target(t.table != nullptr ? std::nullopt : std::optional(t.kind));
    BackendTableGuard table(t.table != nullptr ? &t.table() : nullptr);
    const std::vector<at::Tensor> got = run(half, at::kFloat, device());
    const char* names[] = {"output",    "grad features", "grad weight",
                           "grad bias", "running mean",  "running var"};
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(names[i]);
      const double largest = want[i].abs().max().item<double>();
      const at::Tensor bound =
          i < 2 ? u * want[i].abs() + 1e-4 * largest : at::full_like(want[i], 1e-4 * largest);
      EXPECT_EQ(got[i].scalar_type(), i < 2 ? half : at::kFloat);
      EXPECT_LE(WorstOverBound(got[i], want[i], bound), 1.0);
    }
  }
}

// A whole small MinkUNet14 step (every op above in one graph, in float64):
// outputs, loss and every parameter's gradient.
TEST_P(CrossBackend, MinkUNetStep) {
  Check(
      [&](c10::Device device) {
        torch::manual_seed(4);
        MinkUNetConfig config = MinkUNetPlan(14, 3, 5);
        config.planes = {8, 8, 12, 12, 12, 8, 8, 8};
        config.init_dim = 8;
        MinkUNet model(config);
        model->to(torch::kDouble);
        model->to(device);
        auto in = MakeRandomInput(2, 12, 0.25, 3, at::kDouble, 37);
        SparseTensor y = model->forward(SparseTensor(in.features.to(device), in.coordinates));
        at::Tensor labels = at::arange(y.F().size(0), at::kLong).remainder(5).to(device);
        at::Tensor loss = torch::nll_loss(torch::log_softmax(y.F(), 1), labels);
        loss.backward();
        std::vector<Result> out = {{"logits", y.F().detach(), Match::kClose},
                                   {"loss", loss.detach(), Match::kClose}};
        for (const auto& p : model->named_parameters()) {
          out.push_back({"grad " + p.key(), p.value().grad(), Match::kClose});
        }
        return out;
      },
      at::kDouble);
}

// ---------------------------------------------------------------------------
// Deterministic mode on every backend that runs on `device`: a small
// MinkUNet14 step in float on rows in key order and on a permutation of
// them gives outputs (in key order) and gradients equal bit for bit, and
// equal again on a second run.
void ExpectDeterministicStep(c10::Device device) {
  for (BackendKind kind : BuiltBackends()) {
    if (!FindBackend(kind)->runs_on(device.type())) continue;
    SCOPED_TRACE(ToString(kind));
    BackendGuard backend(kind);
    DeterministicGuard deterministic(true);
    auto step = [&](bool shuffle) {
      torch::manual_seed(6);
      MinkUNetConfig config = MinkUNetPlan(14, 3, 5);
      config.planes = {16, 16, 24, 24, 24, 16, 16, 16};
      config.init_dim = 16;
      MinkUNet model(config);
      model->to(device);
      auto in = MakeRandomInput(2, 20, 0.2, 3, at::kFloat, 41, 0, /*shuffle=*/false);
      if (shuffle) {
        at::Generator gen = at::detail::createCPUGenerator(43);
        const at::Tensor perm = at::randperm(in.coordinates.size(0), gen, at::kLong);
        in.coordinates = in.coordinates.index_select(0, perm);
        in.features = in.features.index_select(0, perm);
      }
      SparseTensor x(in.features.to(device), in.coordinates);
      SparseTensor y = model->forward(x);
      at::Tensor labels = in.coordinates.select(1, 1).remainder(5).to(at::kLong).to(device);
      torch::nll_loss(torch::log_softmax(y.F(), 1), labels).backward();
      // Rows in key order, whatever order they came in.
      const at::Tensor order = x.manager()->CanonicalOrder(x.set_id()).to(device);
      std::vector<at::Tensor> out = {y.F().detach().index_select(0, order).cpu()};
      for (const auto& p : model->parameters()) out.push_back(p.grad().cpu());
      return out;
    };
    const std::vector<at::Tensor> sorted = step(false);
    const std::vector<at::Tensor> again = step(false);
    const std::vector<at::Tensor> shuffled = step(true);
    ASSERT_EQ(sorted.size(), shuffled.size());
    for (size_t i = 0; i < sorted.size(); ++i) {
      EXPECT_TRUE(at::equal(sorted[i], again[i])) << "result " << i << " differs between runs";
      EXPECT_TRUE(at::equal(sorted[i], shuffled[i])) << "result " << i << " depends on row order";
    }
  }
}

TEST(Determinism, StepIsBitIdenticalAcrossRunsAndRowOrdersOnTheCpu) {
  ExpectDeterministicStep(c10::Device(c10::DeviceType::CPU));
}

TEST(CudaDeterminism, StepIsBitIdenticalAcrossRunsAndRowOrders) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (or LibTorch without CUDA)";
  ExpectDeterministicStep(c10::Device(c10::DeviceType::CUDA, 0));
}

INSTANTIATE_TEST_SUITE_P(AllTargets, CrossBackend, ::testing::ValuesIn(kTargets),
                         [](const ::testing::TestParamInfo<Target>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace trainsup::sparse
