// The CUDA backend's steps through the host launcher (host_launcher.h),
// beyond what the cross-backend test compares: what a map build uploads,
// the measured choice of the convolutions' dataflow, how many ops
// BatchNorm takes, and which ops half convolutions take.
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "sparse/backend.h"
#include "sparse/cuda/steps.h"
#include "sparse/determinism.h"
#include "sparse/ops.h"
#include "tests/sparse/host_launcher.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::CudaSettingOnHost;
using testing::CudaStepsOnHost;
using testing::ErrorMessage;
using testing::MakeRandomInput;

// (Not "Cuda*": that name pattern is the GPU label's, CMakeLists.txt.)
// Issue 45: a map build uploads its small host tables (the offsets' shifts
// and `begin`), and the map keeps `begin` on its device; convolutions on
// it, forward and backward, upload nothing (on a GPU each upload would be
// a copy, and the old pageable ones made the host wait for the stream).
TEST(StepsOnHost, ConvolutionsUploadNothingAfterTheMapBuild) {
  BackendTableGuard table(&CudaStepsOnHost());
  auto in = MakeRandomInput(2, 9, 0.3, 4, at::kFloat, 3, 0, /*shuffle=*/false);
  at::Tensor f = in.features.clone().requires_grad_(true);
  at::Tensor w = at::randn({27, 4, 5}).requires_grad_(true);
  SparseTensor x(f, in.coordinates);
  const int64_t before = cuda::HostUploads();
  SparseTensor y = Conv(x, w, at::Tensor(), {3, 2, 1});
  const int64_t built = cuda::HostUploads();
  EXPECT_EQ(built - before, 3) << "the shifts, the packed deltas and begin";
  const std::shared_ptr<const KernelMap> map =
      x.manager()->GetKernelMap(x.set_id(), y.set_id(), 3, 1);
  ASSERT_TRUE(map->device_begin.defined());
  const at::Tensor device_begin = map->device_begin.to(at::kCPU);
  EXPECT_EQ(std::vector<int64_t>(device_begin.data_ptr<int64_t>(),
                                 device_begin.data_ptr<int64_t>() + device_begin.numel()),
            map->begin);
  SparseTensor again = Conv(x, w, at::Tensor(), {3, 2, 1});  // the cached map
  (y.F().sum() + again.F().square().sum()).backward();
  EXPECT_EQ(cuda::HostUploads(), built);
  ASSERT_TRUE(f.grad().defined());
  EXPECT_GT(f.grad().abs().sum().item<double>(), 0.0);
}

// kMeasured times both dataflows at a layer shape's first use and keeps
// the faster; deterministic mode takes gather-GEMM without timing; the
// environment's names parse, and others are refused by name.
TEST(StepsOnHost, TheMeasuredDataflowIsChosenOncePerShapeAndNamed) {
  BackendTableGuard table(&CudaSettingOnHost());
  const cuda::Dataflow previous = cuda::SetDataflow(cuda::Dataflow::kMeasured);
  auto in = MakeRandomInput(2, 9, 0.3, 6, at::kFloat, 8, 0, /*shuffle=*/false);
  const at::Tensor w = at::randn({27, 6, 7});
  const size_t before = cuda::DataflowChoices().size();
  {
    DeterministicGuard deterministic(true);
    Conv(SparseTensor(in.features, in.coordinates), w, at::Tensor(), {3, 1, 1});
  }
  EXPECT_EQ(cuda::DataflowChoices().size(), before) << "deterministic mode timed a dataflow";
  at::Tensor f = in.features.clone().requires_grad_(true);
  SparseTensor x(f, in.coordinates);
  SparseTensor y = Conv(x, w, at::Tensor(), {3, 1, 1});
  y.F().square().sum().backward();
  const std::vector<std::string> choices = cuda::DataflowChoices();
  ASSERT_EQ(choices.size(), before + 2) << "one forward and one backward shape";
  bool forward = false, backward = false;
  for (const std::string& line : choices) {
    forward |= line.rfind("forward 6->7 k27", 0) == 0;
    backward |= line.rfind("backward 6->7 k27", 0) == 0;
  }
  EXPECT_TRUE(forward && backward) << choices.back();
  Conv(x, w, at::Tensor(), {3, 1, 1});  // the same shape: no second timing
  EXPECT_EQ(cuda::DataflowChoices().size(), before + 2);
  cuda::SetDataflow(previous);
  EXPECT_EQ(cuda::DataflowFromString(nullptr), cuda::Dataflow::kMeasured);
  EXPECT_EQ(cuda::DataflowFromString("fused"), cuda::Dataflow::kFused);
  EXPECT_EQ(cuda::DataflowFromString("gemm"), cuda::Dataflow::kGatherGemm);
  EXPECT_EQ(ErrorMessage([] { cuda::DataflowFromString("tiled"); }),
            "TRAINSUP_CUDA_DATAFLOW: unknown dataflow 'tiled' (expected gemm, fused or measured)");
}

// Counts the ops the steps hand to the host launcher, then runs them there.
class CountingLauncher final : public cuda::Launcher {
 public:
  void OnDevice(c10::Device device, const std::function<void()>& body) const override {
    testing::TheHostLauncher().OnDevice(device, body);
  }
  void Synchronize() const override {}
#define TRAINSUP_COUNTING_RUN(Op)                                 \
  void Run(const cuda::Op& op, const char* what) const override { \
    ++runs;                                                       \
    ++by_op[typeid(op).name()];                                   \
    testing::TheHostLauncher().Run(op, what);                     \
  }
  TRAINSUP_CUDA_OPS(TRAINSUP_COUNTING_RUN)
#undef TRAINSUP_COUNTING_RUN
  // How many ops of type Op ran since the counts were last cleared.
  template <typename Op>
  int64_t Of() const {
    const auto found = by_op.find(typeid(Op).name());
    return found == by_op.end() ? 0 : found->second;
  }
  void Clear() const {
    runs = 0;
    by_op.clear();
  }
  mutable int64_t runs = 0;
  mutable std::map<std::string, int64_t> by_op;
};

CountingLauncher& Counting() {
  static CountingLauncher launcher;
  return launcher;
}
const cuda::Launcher& CountingBase() { return Counting(); }
// The CUDA steps' table with its ops counted, on the process's dataflow
// setting.
const Backend& CountingTable() {
  static const Backend table =
      cuda::StepsTable<&CountingBase>("cuda_counting_on_host", &testing::OnHost);
  return table;
}

// Issue 45: training-mode BatchNorm with its ReLU is three ops forward and
// three backward on float32 features (at::batch_norm and relu_ took more
// and a pass over the activations each); half features with float32
// parameters take the generic entry, which launches none of the steps'.
TEST(StepsOnHost, BatchNormWithReluIsThreeOpsEachWay) {
  BackendTableGuard guard(&CountingTable());
  auto in = MakeRandomInput(2, 9, 0.3, 6, at::kFloat, 5, 0, /*shuffle=*/false);
  at::Tensor f = in.features.clone().requires_grad_(true);
  at::Tensor w = at::rand({6}).add_(0.5).requires_grad_(true);
  at::Tensor b = at::randn({6}).requires_grad_(true);
  at::Tensor rm = at::zeros({6}), rv = at::ones({6});
  Counting().Clear();
  SparseTensor y = BatchNorm(SparseTensor(f, in.coordinates), w, b, rm, rv, /*training=*/true, 0.1,
                             1e-5, /*relu=*/true);
  EXPECT_EQ(Counting().runs, 3) << "forward";
  y.F().square().sum().backward();
  EXPECT_EQ(Counting().runs, 6) << "backward";
  EXPECT_TRUE(w.grad().defined() && b.grad().defined());
  EXPECT_GT(f.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(y.F().min().item<float>(), 0.0F) << "the ReLU cut nothing";
  Counting().Clear();
  BatchNorm(SparseTensor(in.features.to(at::kBFloat16), in.coordinates), w.detach(), b.detach(), rm,
            rv, /*training=*/true, 0.1, 1e-5, /*relu=*/true);
  EXPECT_EQ(Counting().runs, 0) << "bf16 features with float32 parameters";
}

// Issue 45's budget, counted on the host: once its map is warm, a
// convolution layer on the fused dataflow with its BatchNorm and ReLU is
// ten ops a step. The convolution is one forward and three backward (the
// inverse tables are the map's, built at its first use of each side and
// kept), BatchNorm three and three. (On a GPU the budget also counts
// ATen's own launches; tests/gpu/run.sh's profiler check.)
TEST(StepsOnHost, AConvolutionLayerIsTenOpsAStepOnAWarmMap) {
  BackendTableGuard guard(&CountingTable());
  const cuda::Dataflow previous = cuda::SetDataflow(cuda::Dataflow::kFused);
  auto in = MakeRandomInput(2, 9, 0.3, 6, at::kFloat, 13, 0, /*shuffle=*/false);
  at::Tensor f = in.features.clone().requires_grad_(true);
  at::Tensor w = at::randn({27, 6, 8}).requires_grad_(true);
  at::Tensor bw = at::rand({8}).add_(0.5).requires_grad_(true);
  at::Tensor bb = at::randn({8}).requires_grad_(true);
  at::Tensor rm = at::zeros({8}), rv = at::ones({8});
  SparseTensor x(f, in.coordinates);
  auto step = [&] {
    SparseTensor y = Conv(x, w, at::Tensor(), {3, 1, 1});
    SparseTensor z = BatchNorm(y, bw, bb, rm, rv, /*training=*/true, 0.1, 1e-5, /*relu=*/true);
    z.F().square().sum().backward();
  };
  Counting().Clear();
  step();  // builds the map, then an inverse table for each side
  EXPECT_EQ(Counting().Of<cuda::InvertPairs>(), 2);
  const at::Tensor first = f.grad().clone();
  f.grad().zero_();
  Counting().Clear();
  step();
  EXPECT_EQ(Counting().runs, 10);
  EXPECT_EQ(Counting().Of<cuda::InvertPairs>(), 0) << "an inverse table was rebuilt";
  EXPECT_EQ(Counting().Of<cuda::ImplicitGemmTiles<float>>(), 2);
  EXPECT_TRUE(at::equal(f.grad(), first)) << "the kept tables changed the input gradient";
  cuda::SetDataflow(cuda::Dataflow::kGatherGemm);  // the same tables serve gather-GEMM
  Counting().Clear();
  step();
  EXPECT_EQ(Counting().Of<cuda::InvertPairs>(), 0);
  EXPECT_GT(Counting().Of<cuda::ScatterSum<float>>(), 0);
  cuda::SetDataflow(previous);
}

// Counts ATen's additions (aten::add, aten::add_) run on this thread, at
// any depth, while it lives.
class AdditionCounter {
 public:
  AdditionCounter() {
    Count() = 0;
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&Start).scopes({at::RecordScope::FUNCTION}));
  }
  ~AdditionCounter() { at::removeCallback(handle_); }
  AdditionCounter(const AdditionCounter&) = delete;
  AdditionCounter& operator=(const AdditionCounter&) = delete;
  int additions() const { return Count(); }

 private:
  static int& Count() {
    static thread_local int count = 0;
    return count;
  }
  static std::unique_ptr<at::ObserverContext> Start(const at::RecordFunction& fn) {
    const std::string name = fn.name();
    if (name == "aten::add" || name == "aten::add_") ++Count();
    return nullptr;
  }
  at::CallbackHandle handle_;
};

// Issue 45: a convolution's bias is added where its sums are written: in
// the fused op's epilogue (no op of its own) or, on gather-GEMM, by one op
// over the sums, and by no ATen addition either way (it was `y + b`, one
// more pass over the output, with two row permutations around it in
// deterministic mode). The bits are the sums' plus the bias, and its
// gradient is the sum of the output gradient's rows.
TEST(StepsOnHost, AConvolutionsBiasIsAddedWhereItsSumsAreWritten) {
  BackendTableGuard guard(&CountingTable());
  const cuda::Dataflow previous = cuda::SetDataflow(cuda::Dataflow::kFused);
  // 70 output columns: two tiles of 64, so a bias indexed within the tile
  // would show.
  auto in = MakeRandomInput(2, 9, 0.3, 6, at::kFloat, 17, 0, /*shuffle=*/false);
  const at::Tensor w = at::randn({27, 6, 70});
  at::Tensor b = at::randn({70}).requires_grad_(true);
  SparseTensor x(in.features, in.coordinates);
  {
    AdditionCounter adds;  // the counter sees an addition where there is one
    const at::Tensor sum = in.features + 1;
    EXPECT_GT(adds.additions(), 0);
  }
  for (cuda::Dataflow d : {cuda::Dataflow::kFused, cuda::Dataflow::kGatherGemm}) {
    SCOPED_TRACE(cuda::ToString(d));
    cuda::SetDataflow(d);
    const at::Tensor plain = Conv(x, w, at::Tensor(), {3, 1, 1}).F();  // warms the map too
    Counting().Clear();
    at::Tensor y;
    {
      AdditionCounter adds;
      y = Conv(x, w, b, {3, 1, 1}).F();
      EXPECT_EQ(adds.additions(), 0);
    }
    EXPECT_EQ(Counting().Of<cuda::AddBias<float>>(), d == cuda::Dataflow::kFused ? 0 : 1);
    if (d == cuda::Dataflow::kFused) EXPECT_EQ(Counting().runs, 1);
    EXPECT_TRUE(at::equal(y, plain + b.detach()));
    const at::Tensor g = at::randn(y.sizes());
    b.mutable_grad() = at::Tensor();
    (y * g).sum().backward();
    EXPECT_TRUE(at::equal(b.grad(), g.sum(0)));
  }
  cuda::SetDataflow(previous);
}

// Issue 44: half features reach the CUDA steps' convolutions as they are
// (before, the engine widened them to float32 around the call), on either
// dataflow. Gather-GEMM: the gathers copy 16-bit rows, the products and
// sums are float32 (the scatter's ScatterSum<float>), and no float32 copy
// of the features is gathered. Fused: the tiled ops read the 16-bit
// values and sum in float32 (Bf16GemmTiles, Bf16WeightGradTiles), and
// nothing is gathered. (Their accuracy is the cross-backend
// HalfPrecision* tests', on cuda_steps_on_host and cuda_fused_on_host.)
TEST(StepsOnHost, HalfConvolutionsReadSixteenBitValuesAndSumInFloat32) {
  BackendTableGuard guard(&CountingTable());
  auto in = MakeRandomInput(2, 9, 0.3, 6, at::kFloat, 9, 0, /*shuffle=*/false);
  for (cuda::Dataflow dataflow : {cuda::Dataflow::kGatherGemm, cuda::Dataflow::kFused}) {
    const cuda::Dataflow previous = cuda::SetDataflow(dataflow);
    const bool fused = dataflow == cuda::Dataflow::kFused;
    for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(std::string(half == at::kBFloat16 ? "bf16 " : "fp16 ") +
                   cuda::ToString(dataflow));
      const bool bf16 = half == at::kBFloat16;
      auto tiles = [&](bool weight_gradient) {
        const CountingLauncher& c = Counting();
        if (weight_gradient) {
          return bf16 ? c.Of<cuda::Bf16WeightGradTiles>() : c.Of<cuda::Fp16WeightGradTiles>();
        }
        return bf16 ? c.Of<cuda::Bf16GemmTiles>() : c.Of<cuda::Fp16GemmTiles>();
      };
      EXPECT_TRUE(CountingTable().takes_half_inputs(half, true));
      at::Tensor f = in.features.to(half).requires_grad_(true);
      at::Tensor w = at::randn({27, 6, 5}).requires_grad_(true);  // the float32 master
      Counting().Clear();
      SparseTensor y = Conv(SparseTensor(f, in.coordinates), w, at::Tensor(), {3, 1, 1});
      EXPECT_EQ(y.F().scalar_type(), half);
      EXPECT_EQ(Counting().Of<cuda::GatherRows<uint16_t>>() > 0, !fused) << "forward";
      EXPECT_EQ(Counting().Of<cuda::ScatterSum<float>>() > 0, !fused) << "forward";
      EXPECT_EQ(tiles(false), fused ? 1 : 0) << "forward";
      y.F().to(at::kFloat).square().sum().backward();
      EXPECT_EQ(f.grad().scalar_type(), half);
      EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
      EXPECT_GT(f.grad().to(at::kFloat).abs().sum().item<double>(), 0.0);
      EXPECT_GT(w.grad().abs().sum().item<double>(), 0.0);
      EXPECT_EQ(Counting().Of<cuda::GatherRows<float>>(), 0) << "widened features were gathered";
      EXPECT_EQ(Counting().Of<cuda::ImplicitGemmTiles<float>>(), 0) << "widened features";
      EXPECT_EQ(Counting().Of<cuda::GatherRows<uint16_t>>() > 3, !fused) << "backward";
      EXPECT_EQ(tiles(false), fused ? 2 : 0) << "backward";
      EXPECT_EQ(tiles(true), fused ? 1 : 0) << "backward";
    }
    cuda::SetDataflow(previous);
  }
}

// Issue 45: the fused dataflow's tiled implicit GEMM, run as a GPU block
// runs it (host_launcher.h: each phase's threads in a shuffled order), is
// its definition in kernel_bodies.h bit for bit: per output, the offsets
// in order, the channels in order, one fused multiply-add each from 0,
// whatever the tiling. The shapes cut every tile, chunk and column tile
// short; offset 2 has no pair in the first row tile (the block skips it)
// and offset 4 none at all; an infinite weight of offset 1 reaches only
// the rows that have a pair there (a skipped row adds nothing, not 0 x
// inf). Both weight layouts: forward (W_k) and input gradient (W_k^T).
// Half inputs (issue 44) are their values widened by ATen, summed in
// float32.
template <typename T>
at::ScalarType TypeOf() {
  return std::is_same_v<T, float> ? at::kFloat : at::kDouble;
}
template <typename In>
const In* Bits(const at::Tensor& t) {
  return static_cast<const In*>(t.const_data_ptr());
}

template <typename T, typename In = T>
void CheckTilesAgainstDefinition(bool transposed, at::ScalarType in_type) {
  constexpr int64_t volume = 5, rows = 150, n_in = 120, kdim = 37, cols = 70;
  const at::ScalarType type = TypeOf<T>();
  at::manual_seed(transposed ? 11 : 7);
  const at::Tensor a_in = at::randn({n_in, kdim}, type).to(in_type);
  at::Tensor w_full =
      transposed ? at::randn({volume, cols, kdim}, type) : at::randn({volume, kdim, cols}, type);
  const int64_t w_red = transposed ? 1 : cols, w_col = transposed ? kdim : 1;
  w_full.data_ptr<T>()[1 * kdim * cols + 5 * w_red + 3 * w_col] =
      std::numeric_limits<T>::infinity();
  const at::Tensor w_in = w_full.to(in_type);
  const at::Tensor a = a_in.to(type), w = w_in.to(type);
  std::vector<int32_t> inverse(volume * rows, -1), from;
  std::mt19937 rng(3);
  for (int64_t k = 0; k < volume; ++k) {
    for (int64_t r = 0; r < rows; ++r) {
      if (k == 4 || (k == 2 && r < 64) || rng() % 3 == 0) continue;
      inverse[k * rows + r] = static_cast<int32_t>(from.size());
      from.push_back(static_cast<int32_t>(rng() % n_in));
    }
  }
  at::Tensor out = at::full({rows, cols}, 7.0, type);
  const cuda::ImplicitGemmTiles<T, In> op{
      Bits<In>(a_in), kdim,  from.data(), inverse.data(), volume, Bits<In>(w_in),
      kdim * cols,    w_red, w_col,       rows,           cols,   out.data_ptr<T>()};
  testing::TheHostLauncher().Run(op, "implicit GEMM tiles");
  int64_t infinite = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      T acc = T(0);
      for (int64_t k = 0; k < volume; ++k) {
        const int32_t p = inverse[k * rows + r];
        if (p < 0) continue;
        for (int64_t j = 0; j < kdim; ++j) {
          acc = std::fma(a.data_ptr<T>()[from[p] * kdim + j],
                         w.data_ptr<T>()[k * kdim * cols + j * w_red + c * w_col], acc);
        }
      }
      const T got = out.data_ptr<T>()[r * cols + c];
      ASSERT_EQ(std::memcmp(&got, &acc, sizeof(T)), 0)
          << "row " << r << " column " << c << ": " << got << " != " << acc;
      infinite += std::isinf(got) ? 1 : 0;
    }
  }
  EXPECT_GT(infinite, 0);
  EXPECT_LT(infinite, rows) << "every row had offset 1: the skip is untested";
}

TEST(StepsOnHost, TiledImplicitGemmIsItsDefinitionBitForBit) {
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "input gradient layout" : "forward layout");
    CheckTilesAgainstDefinition<float>(transposed, at::kFloat);
    CheckTilesAgainstDefinition<double>(transposed, at::kDouble);
    CheckTilesAgainstDefinition<float, cuda::BFloat16Bits>(transposed, at::kBFloat16);
    CheckTilesAgainstDefinition<float, cuda::Float16Bits>(transposed, at::kHalf);
  }
}

// The fused weight gradient's first op, tiled like the implicit GEMM, is
// its definition bit for bit: per weight element of each (split,
// offset), the split's pairs in order, one fused multiply-add each from
// 0. The channel counts cut both tiles short, a split's pairs run past a
// chunk of 16, offset 1 has no pairs and offset 3 fewer than one split, so
// some (split, offset) slices are written as zeros over what was there.
template <typename T, typename In = T>
void CheckWeightGradTilesAgainstDefinition(at::ScalarType in_type) {
  constexpr int64_t volume = 4, cin = 70, cout = 37, n = 90, chunk = 40;
  const at::ScalarType type = TypeOf<T>();
  at::manual_seed(5);
  const at::Tensor f_in = at::randn({n, cin}, type).to(in_type);
  const at::Tensor g_in = at::randn({n, cout}, type).to(in_type);
  const at::Tensor f = f_in.to(type), g = g_in.to(type);
  const std::vector<int64_t> counts = {100, 0, 57, 13};
  std::vector<int64_t> begin = {0};
  std::vector<int32_t> src, dst;
  std::mt19937 rng(9);
  for (int64_t count : counts) {
    for (int64_t p = 0; p < count; ++p) {
      src.push_back(static_cast<int32_t>(rng() % n));
      dst.push_back(static_cast<int32_t>(rng() % n));
    }
    begin.push_back(begin.back() + count);
  }
  const int64_t splits = 3;  // ceil(100 / 40)
  at::Tensor partial = at::full({splits, volume, cin, cout}, 7.0, type);
  const cuda::WeightGradTiles<T, In> op{
      Bits<In>(f_in), cin,   src.data(), Bits<In>(g_in),       cout, dst.data(), begin.data(),
      volume,         chunk, splits,     partial.data_ptr<T>()};
  testing::TheHostLauncher().Run(op, "weight gradient tiles");
  int64_t zero = 0;
  for (int64_t s = 0; s < splits; ++s) {
    for (int64_t k = 0; k < volume; ++k) {
      const int64_t p0 = begin[k] + s * chunk, p1 = std::min(begin[k + 1], p0 + chunk);
      for (int64_t a = 0; a < cin; ++a) {
        for (int64_t b = 0; b < cout; ++b) {
          T acc = T(0);
          for (int64_t p = p0; p < p1; ++p) {
            acc = std::fma(f.data_ptr<T>()[src[p] * cin + a], g.data_ptr<T>()[dst[p] * cout + b],
                           acc);
          }
          const T got = partial.data_ptr<T>()[((s * volume + k) * cin + a) * cout + b];
          ASSERT_EQ(std::memcmp(&got, &acc, sizeof(T)), 0)
              << "split " << s << " offset " << k << " at " << a << ", " << b;
          zero += got == T(0) ? 1 : 0;
        }
      }
    }
  }
  // Slices past their offset's pairs: offset 1's three, offset 2's last
  // (57 pairs), offset 3's last two (13).
  EXPECT_EQ(zero, 6 * cin * cout);
}

TEST(StepsOnHost, TiledWeightGradientIsItsDefinitionBitForBit) {
  CheckWeightGradTilesAgainstDefinition<float>(at::kFloat);
  CheckWeightGradTilesAgainstDefinition<double>(at::kDouble);
  CheckWeightGradTilesAgainstDefinition<float, cuda::BFloat16Bits>(at::kBFloat16);
  CheckWeightGradTilesAgainstDefinition<float, cuda::Float16Bits>(at::kHalf);
}

// The tiled ops' widening of half bits (kernel_bodies.h's Widen) is
// ATen's, for every one of the 65,536 bit patterns of each format, bit for
// bit: normals, subnormals, zeros, infinities; NaNs stay NaN (Widen keeps
// a NaN's fraction, where ATen may quiet a signalling one).
TEST(StepsOnHost, HalfBitsWidenAsATenDoesForEveryPattern) {
  const at::Tensor bits = at::arange(0, 65536, at::kInt).to(at::kShort);  // int16's wrap: the bits
  for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(half));
    const at::Tensor values = bits.view(half);
    const at::Tensor widened = values.to(at::kFloat);
    const auto* raw = static_cast<const uint16_t*>(values.const_data_ptr());
    for (int64_t i = 0; i < 65536; ++i) {
      const float got = half == at::kBFloat16 ? cuda::Widen(cuda::BFloat16Bits{raw[i]})
                                              : cuda::Widen(cuda::Float16Bits{raw[i]});
      const float want = widened.data_ptr<float>()[i];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << "pattern " << i;
        continue;
      }
      ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0)
          << "pattern " << i << ": " << got << " != " << want;
    }
  }
}

// The fused ops read their operands' memory as one type, so the steps
// refuse, by name, a weight or an output gradient of another type than the
// features (the engine never passes one: conv.cc casts the weight, and
// autograd gives the output's type; this is what keeps a caller that did
// from reading a buffer as the wrong type).
TEST(StepsOnHost, FusedConvolutionsRefuseOperandsOfAnotherType) {
  auto in = MakeRandomInput(2, 9, 0.3, 4, at::kFloat, 3, 0, /*shuffle=*/false);
  SparseTensor x(in.features, in.coordinates);
  const std::shared_ptr<const KernelMap> map =
      x.manager()->GetKernelMap(x.set_id(), x.set_id(), 3, 1, x.F().device());
  const PairView pairs = PairsOf(*map, /*transposed=*/false);
  const at::Tensor w = at::randn({27, 4, 5});
  const at::Tensor out =
      testing::CudaFusedOnHost().conv_forward(x.F(), w, at::Tensor(), pairs, map->num_out);
  at::Tensor grad_in, grad_weight;
  EXPECT_EQ(ErrorMessage([&] {
              testing::CudaFusedOnHost().conv_backward(x.F(), w, pairs, out.to(at::kDouble), true,
                                                       true, &grad_in, &grad_weight);
            }),
            "the CUDA backend's fused convolution takes features, weight and output gradient of "
            "one type, not Float, Float and Double");
  EXPECT_EQ(ErrorMessage([&] {
              testing::CudaFusedOnHost().conv_forward(x.F(), w.to(at::kDouble), at::Tensor(), pairs,
                                                      map->num_out);
            }),
            "the CUDA backend's fused convolution takes features and weight of one type, not "
            "Float and Double");
}

}  // namespace
}  // namespace trainsup::sparse
