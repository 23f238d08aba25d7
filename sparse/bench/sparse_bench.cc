// The engine's benchmark on a synthetic indoor scene: kernel-map build rate,
// convolution forward and forward+backward throughput, a stride-2
// downsample, each against a plain LibTorch matrix product of the same
// shape measured in the same run, and with the process's kernel set
// (TRAINSUP_KERNELS, default the fastest the CPU has) against the
// gather-BLAS-scatter path, the two alternating. Prints medians over
// --repeats runs; --json prints one JSON object instead.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sparse/bench/bench_util.h"
#include "sparse/cpu/blas.h"
#include "sparse/cpu/kernels.h"
#include "sparse/ops.h"
#include "sparse/quantize.h"
#include "sparse/scene.h"

namespace ts = trainsup::sparse;

namespace {

struct Args {
  int threads = 2;
  int repeats = 5;
  bool json = false;
  std::string scene = "default";
  double voxel = 0.02;
  uint64_t seed = 1;
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "sparse_bench: %s\nusage: sparse_bench [--threads N] [--repeats N] [--json]\n"
               "                    [--scene small|default|large|huge] [--voxel METRES] "
               "[--seed N]\n",
               msg);
  std::exit(64);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    if (k == "--threads") {
      a.threads = std::atoi(value().c_str());
    } else if (k == "--repeats") {
      a.repeats = std::atoi(value().c_str());
    } else if (k == "--json") {
      a.json = true;
    } else if (k == "--scene") {
      a.scene = value();
    } else if (k == "--voxel") {
      a.voxel = std::atof(value().c_str());
    } else if (k == "--seed") {
      a.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else {
      Usage(("unknown argument " + k).c_str());
    }
  }
  if (a.threads < 1 || a.repeats < 1 || !(a.voxel > 0)) Usage("bad value");
  return a;
}

double Seconds(const std::function<void()>& fn) {
  const double t0 = trainsup::bench::Now();
  fn();
  return trainsup::bench::Now() - t0;
}

// Median of `repeats` timed runs after one warm-up run.
double Median(int repeats, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(Seconds(fn));
  return trainsup::bench::Median(t);
}

// Medians of `fn` with kernel set `a` and with `b`, alternating run by run
// (each after one warm-up run) so both see the same load; the process's
// set is put back afterwards.
std::pair<double, double> MedianAB(int repeats, ts::cpu::KernelSet a, ts::cpu::KernelSet b,
                                   const std::function<void()>& fn) {
  const ts::cpu::KernelSet initial = ts::cpu::ActiveKernelSet();
  std::vector<double> ta, tb;
  for (int i = 0; i <= repeats; ++i) {
    ts::cpu::SetKernelSet(a);
    const double da = Seconds(fn);
    ts::cpu::SetKernelSet(b);
    const double db = Seconds(fn);
    if (i > 0) {
      ta.push_back(da);
      tb.push_back(db);
    }
  }
  ts::cpu::SetKernelSet(initial);
  return {trainsup::bench::Median(ta), trainsup::bench::Median(tb)};
}

class Report {
 public:
  void Add(const std::string& key, double v, const char* fmt = "%.4g") {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    items_.emplace_back(key, buf);
  }
  void AddString(const std::string& key, const std::string& v) {
    items_.emplace_back(key, "\"" + v + "\"");
  }
  std::string Json() const {
    std::ostringstream os;
    os << "{";
    for (size_t i = 0; i < items_.size(); ++i) {
      os << (i ? ", " : "") << "\"" << items_[i].first << "\": " << items_[i].second;
    }
    os << "}";
    return os.str();
  }

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// printf when the output is text, nothing under --json.
template <typename... V>
void Say(const Args& args, const char* fmt, V... v) {
  if (!args.json) std::printf(fmt, v...);
}

// The threads, BLAS and kernel set this run uses.
void ReportSetup(const Args& args, ts::cpu::KernelSet kernels, Report& r) {
  r.Add("threads", args.threads, "%.0f");
  r.AddString("blas_core", ts::BlasCoreName());
  r.AddString("blas_library", ts::BlasLibraryPath());
  r.Add("blas_threads", ts::BlasThreads(), "%.0f");
  r.AddString("kernel_set", ts::cpu::ToString(kernels));
  Say(args,
      "trainsup sparse_bench: %d threads (at::set_num_threads), convolution kernels %s, BLAS %s "
      "kernels (%s, %d threads)\n",
      args.threads, ts::cpu::ToString(kernels).c_str(), ts::BlasCoreName().c_str(),
      ts::BlasLibraryPath().c_str(), ts::BlasThreads());
}

// Scene and quantization; returns the voxels' coordinates (batch column first).
at::Tensor BenchQuantize(const Args& args, Report& r) {
  ts::Scene scene = ts::GenerateScene(ts::ScenePreset(args.scene, args.seed));
  at::Tensor points = at::from_blob(scene.points.data(), {scene.size(), 3}, at::kFloat).clone();
  at::Tensor colors = at::from_blob(scene.colors.data(), {scene.size(), 3}, at::kFloat).clone();
  ts::Quantized q;
  const double t_quant =
      Median(args.repeats, [&] { q = ts::Quantize(points, args.voxel, colors); });
  const int64_t n = q.coordinates.size(0);
  at::Tensor coords = at::cat({at::zeros({n, 1}, at::kInt), q.coordinates}, 1);
  r.AddString("scene", args.scene);
  r.Add("points", static_cast<double>(scene.size()), "%.0f");
  r.Add("voxel_size_m", args.voxel);
  r.Add("voxels", static_cast<double>(n), "%.0f");
  r.Add("quantize_ms", t_quant * 1e3);
  Say(args, "scene %s: %lld points -> %lld voxels at %.3g m (quantize %.1f ms)\n",
      args.scene.c_str(), static_cast<long long>(scene.size()), static_cast<long long>(n),
      args.voxel, t_quant * 1e3);
  return coords;
}

// Kernel map: coordinate hash build, then the 3x3x3 map, each on a fresh manager.
void BenchKernelMap(const Args& args, const at::Tensor& coords, Report& r) {
  const int64_t n = coords.size(0);
  std::vector<double> t_hash, t_map;
  int64_t pairs = 0;
  for (int i = 0; i <= args.repeats; ++i) {
    auto manager = std::make_shared<ts::CoordinateManager>();
    ts::CoordinateSetId id = -1;
    const double th = Seconds([&] { id = manager->AddCoordinates(coords, 1); });
    std::shared_ptr<const ts::KernelMap> map;
    const double tm = Seconds([&] { map = manager->GetKernelMap(id, id, 3, 1); });
    pairs = map->pairs();
    if (i > 0) {
      t_hash.push_back(th);
      t_map.push_back(tm);
    }
  }
  const double hash_s = trainsup::bench::Median(t_hash), map_s = trainsup::bench::Median(t_map);
  r.Add("hash_build_ms", hash_s * 1e3);
  r.Add("kernel_map_ms", map_s * 1e3);
  r.Add("kernel_map_mvoxels_per_s", n / map_s / 1e6);
  r.Add("kernel_map_with_hash_mvoxels_per_s", n / (map_s + hash_s) / 1e6);
  r.Add("pairs_3x3x3", static_cast<double>(pairs), "%.0f");
  Say(args,
      "kernel map 3x3x3: %.2f ms = %.2f M voxels/s (hash build %.2f ms; both: %.2f M voxels/s), "
      "%lld pairs (%.2f per voxel)\n",
      map_s * 1e3, n / map_s / 1e6, hash_s * 1e3, n / (map_s + hash_s) / 1e6,
      static_cast<long long>(pairs), static_cast<double>(pairs) / n);
}

struct ConvCase {
  const char* name;
  int64_t cin, cout;
  int kernel, stride;
};

// One convolution: forward and forward+backward with `kernels` against the
// BLAS path, and two matrix-product baselines of the same shape.
void BenchConv(const Args& args, const ConvCase& c, const ts::SparseTensor& base,
               ts::CoordinateManager& manager, ts::cpu::KernelSet kernels, Report& r) {
  const int64_t n = base.C().size(0);
  at::Tensor f = at::randn({n, c.cin});
  at::Tensor w = at::randn({static_cast<int64_t>(c.kernel) * c.kernel * c.kernel, c.cin, c.cout}) /
                 std::sqrt(static_cast<double>(c.cin * c.kernel * c.kernel * c.kernel));
  ts::ConvOptions opt;
  opt.kernel_size = c.kernel;
  opt.stride = c.stride;
  ts::SparseTensor x = base.WithFeatures(f);
  const ts::CoordinateSetId out_set = manager.Downsample(base.set_id(), c.stride);
  const int64_t case_pairs = manager.GetKernelMap(base.set_id(), out_set, c.kernel, 1)->pairs();
  const double flops = 2.0 * case_pairs * c.cin * c.cout;
  const auto [t_fwd, t_fwd_blas] = MedianAB(args.repeats, kernels, ts::cpu::KernelSet::kBlas, [&] {
    at::NoGradGuard no_grad;
    ts::Conv(x, w, at::Tensor(), opt);
  });
  at::Tensor fg = f.clone().requires_grad_(true);
  at::Tensor wg = w.clone().requires_grad_(true);
  ts::SparseTensor xg = base.WithFeatures(fg);
  at::Tensor grad_out = at::randn({manager.Set(out_set).size(), c.cout});
  const auto [t_fb, t_fb_blas] = MedianAB(args.repeats, kernels, ts::cpu::KernelSet::kBlas, [&] {
    fg.mutable_grad() = at::Tensor();
    wg.mutable_grad() = at::Tensor();
    ts::Conv(xg, wg, at::Tensor(), opt).F().backward(grad_out);
  });
  // Baseline: one LibTorch matrix product of the same total shape.
  at::Tensor a = at::randn({case_pairs, c.cin});
  at::Tensor b = at::randn({c.cin, c.cout});
  at::Tensor out = at::empty({case_pairs, c.cout});
  const double t_mm = Median(args.repeats, [&] { at::mm_out(out, a, b); });
  const double mm_gflops = flops / t_mm / 1e9;
  // Second baseline: the BLAS rate at the engine's chunk shape (1024 rows,
  // cache-resident): the best the per-offset GEMMs could reach.
  at::Tensor ca = at::randn({1024, c.cin}), cc = at::empty({1024, c.cout});
  const double t_chunk = Median(args.repeats, [&] {
    for (int i = 0; i < 200; ++i) at::mm_out(cc, ca, b);
  });
  const double chunk_gflops = 200 * 2.0 * 1024 * c.cin * c.cout / t_chunk / 1e9;
  const std::string k = c.name;
  r.Add(k + "_pairs", static_cast<double>(case_pairs), "%.0f");
  r.Add(k + "_gflop", flops / 1e9);
  r.Add(k + "_fwd_ms", t_fwd * 1e3);
  r.Add(k + "_fwd_gflops", flops / t_fwd / 1e9);
  r.Add(k + "_fwdbwd_ms", t_fb * 1e3);
  r.Add(k + "_fwdbwd_gflops", 3 * flops / t_fb / 1e9);
  r.Add(k + "_matmul_gflops", mm_gflops);
  r.Add(k + "_fwd_vs_matmul", flops / t_fwd / 1e9 / mm_gflops);
  r.Add(k + "_fwdbwd_vs_matmul", 3 * flops / t_fb / 1e9 / mm_gflops);
  r.Add(k + "_chunk_matmul_gflops", chunk_gflops);
  r.Add(k + "_fwdbwd_vs_chunk_matmul", 3 * flops / t_fb / 1e9 / chunk_gflops);
  r.Add(k + "_blas_fwd_ms", t_fwd_blas * 1e3);
  r.Add(k + "_blas_fwdbwd_ms", t_fb_blas * 1e3);
  r.Add(k + "_fwd_speedup_vs_blas", t_fwd_blas / t_fwd);
  r.Add(k + "_fwdbwd_speedup_vs_blas", t_fb_blas / t_fb);
  Say(args,
      "%-13s %9lld pairs %6.2f GFLOP | fwd %7.1f ms %6.1f GFLOP/s | fwd+bwd %7.1f ms %6.1f "
      "GFLOP/s | matmul [%lld x %lld]x[%lld x %lld] %6.1f GFLOP/s | fwd %.2fx, fwd+bwd %.2fx "
      "of matmul | fwd+bwd %.2fx of the %.1f GFLOP/s chunk-shape matmul\n",
      c.name, static_cast<long long>(case_pairs), flops / 1e9, t_fwd * 1e3, flops / t_fwd / 1e9,
      t_fb * 1e3, 3 * flops / t_fb / 1e9, static_cast<long long>(case_pairs),
      static_cast<long long>(c.cin), static_cast<long long>(c.cin), static_cast<long long>(c.cout),
      mm_gflops, flops / t_fwd / 1e9 / mm_gflops, 3 * flops / t_fb / 1e9 / mm_gflops,
      3 * flops / t_fb / 1e9 / chunk_gflops, chunk_gflops);
  Say(args,
      "%-13s BLAS path in the same run: fwd %7.1f ms, fwd+bwd %7.1f ms => %s %.2fx, %.2fx "
      "faster\n",
      "", t_fwd_blas * 1e3, t_fb_blas * 1e3, ts::cpu::ToString(kernels).c_str(), t_fwd_blas / t_fwd,
      t_fb_blas / t_fb);
}

}  // namespace

int main(int argc, char** argv) {
  ts::EnsureFastBlasKernels(argc, argv);
  const Args args = Parse(argc, argv);
  at::set_num_threads(args.threads);
  at::manual_seed(args.seed);
  Report r;
  const ts::cpu::KernelSet kernels = ts::cpu::ActiveKernelSet();
  ReportSetup(args, kernels, r);
  const at::Tensor coords = BenchQuantize(args, r);
  BenchKernelMap(args, coords, r);

  const int64_t n = coords.size(0);
  auto manager = std::make_shared<ts::CoordinateManager>();
  ts::SparseTensor base(at::zeros({n, 1}), coords, 1, manager);
  const ConvCase cases[] = {{"conv3_s1_c32", 32, 32, 3, 1},
                            {"conv3_s1_c64", 64, 64, 3, 1},
                            {"conv2_s2_c64", 64, 64, 2, 2}};
  for (const ConvCase& c : cases) BenchConv(args, c, base, *manager, kernels, r);
  if (args.json) std::printf("%s\n", r.Json().c_str());
  return 0;
}
