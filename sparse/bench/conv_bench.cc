// The convolution kernels layer by layer: MinkUNet14's heaviest shapes on
// the default synthetic scene, each fused kernel set this CPU runs
// (AVX-512, AVX2) against the gather-BLAS-scatter path, interleaved in one
// run (AVX-512, AVX2, BLAS, AVX-512, ...), so the ratios are measured
// under the same load. Forward, then the backward (input and weight
// gradients) alone. (1x1x1 convolutions take the BLAS path either way, so
// none is listed.) Prints medians; --json prints one JSON object instead.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
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

using trainsup::bench::Median;
using trainsup::bench::Now;

struct Layer {
  const char* name;
  int32_t stride;  // of the coordinate set it runs on
  int kernel;
  int64_t cin, cout;
};

// The shapes that take most of a MinkUNet14 step (decoder blocks at full
// and half resolution, the encoder's bottom, the stem's neighbours).
const Layer kLayers[] = {
    {"k3 s1 128->96", 1, 3, 128, 96},   {"k3 s1 96->96", 1, 3, 96, 96},
    {"k3 s2 32->32", 2, 3, 32, 32},     {"k3 s4 128->128", 4, 3, 128, 128},
    {"k3 s8 384->256", 8, 3, 384, 256},
};

struct Options {
  int repeats = 5, threads = 2;
  bool json = false;
  std::vector<ts::cpu::KernelSet> sets;
};

// The command line; false (after the usage line) when it is not understood.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      o->repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      o->threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json") {
      o->json = true;
    } else if (a == "--kernels" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) {
        o->sets.push_back(ts::cpu::KernelSetFromString(x, "--kernels"));
      }
    } else {
      std::fprintf(
          stderr,
          "usage: conv_bench [--repeats N] [--threads N] [--kernels avx512,avx2] [--json]\n");
      return false;
    }
  }
  return true;
}

// The fused sets to compare with BLAS: the ones asked for that this CPU
// runs, by default every one it runs.
std::vector<ts::cpu::KernelSet> FusedSets(std::vector<ts::cpu::KernelSet> sets) {
  if (sets.empty()) sets = {ts::cpu::KernelSet::kAvx512, ts::cpu::KernelSet::kAvx2};
  std::vector<ts::cpu::KernelSet> fused;
  for (ts::cpu::KernelSet k : sets) {
    if (k != ts::cpu::KernelSet::kBlas && ts::cpu::KernelSetSupported(k)) fused.push_back(k);
  }
  return fused;
}

// Per mode, the forward and backward times of each repeat after the warm-up
// and the last run's output, input gradient and weight gradient.
struct Timings {
  std::vector<std::vector<double>> fwd, bwd;
  std::vector<std::array<at::Tensor, 3>> outs;  // output, input gradient, weight gradient
};

// Runs every mode once per repeat (plus one warm-up round), interleaved.
Timings TimeModes(at::Tensor f, at::Tensor w, const ts::KernelMap& map,
                  const std::vector<ts::cpu::KernelSet>& modes, int repeats) {
  const size_t m_count = modes.size();
  Timings t{std::vector<std::vector<double>>(m_count), std::vector<std::vector<double>>(m_count),
            std::vector<std::array<at::Tensor, 3>>(m_count)};
  for (int r = 0; r <= repeats; ++r) {
    for (size_t m = 0; m < m_count; ++m) {
      ts::cpu::SetKernelSet(modes[m]);
      f.mutable_grad() = at::Tensor();
      w.mutable_grad() = at::Tensor();
      const double t0 = Now();
      at::Tensor y = ts::KernelMapConv(f, w, map, false);
      const double t1 = Now();
      y.backward(at::ones_like(y));
      const double t2 = Now();
      if (r > 0) {
        t.fwd[m].push_back(t1 - t0);
        t.bwd[m].push_back(t2 - t1);
      }
      t.outs[m] = {y.detach(), f.grad().clone(), w.grad().clone()};
    }
  }
  return t;
}

// One layer: times every mode, then reports BLAS and each fused set against it.
void BenchLayer(const Layer& l, const ts::SparseTensor& base, ts::CoordinateManager& manager,
                const std::vector<ts::cpu::KernelSet>& modes, const Options& o,
                std::ostringstream& js) {
  ts::CoordinateSetId set = base.set_id();
  for (int32_t s = 1; s < l.stride; s *= 2) set = manager.Downsample(set, 2);
  auto map = manager.GetKernelMap(set, set, l.kernel, 1);
  const int64_t rows = map->num_out;
  at::Tensor f = at::randn({rows, l.cin}).set_requires_grad(true);
  at::Tensor w = (at::randn({map->volume, l.cin, l.cout}) * 0.05).set_requires_grad(true);
  const double gflop = 2.0 * static_cast<double>(map->pairs()) * l.cin * l.cout * 1e-9;
  const Timings t = TimeModes(f, w, *map, modes, o.repeats);
  const size_t b = modes.size() - 1;                             // BLAS
  const double scale = t.outs[b][0].abs().max().item<double>();  // of the output
  const double fb = Median(t.fwd[b]), bb = Median(t.bwd[b]);
  const std::string key = std::string("k") + std::to_string(l.kernel) + "_s" +
                          std::to_string(l.stride) + "_" + std::to_string(l.cin) + "_" +
                          std::to_string(l.cout);
  js << ", \"" << key << "\": {\"rows\": " << rows << ", \"gflop\": " << gflop
     << ", \"forward_blas_s\": " << fb << ", \"backward_blas_s\": " << bb;
  if (!o.json) {
    std::printf(
        "%-16s %7lld rows %6.2f GFLOP | BLAS fwd %6.1f ms (%3.0f GFLOP/s), bwd %6.1f ms (%3.0f "
        "GFLOP/s)\n",
        l.name, static_cast<long long>(rows), gflop, 1e3 * fb, gflop / fb, 1e3 * bb,
        2 * gflop / bb);
  }
  for (size_t m = 0; m < b; ++m) {
    // Largest difference from the BLAS path over output and both gradients.
    double diff = 0;
    for (int i = 0; i < 3; ++i)
      diff = std::max(diff, (t.outs[m][i] - t.outs[b][i]).abs().max().item<double>());
    const double ff = Median(t.fwd[m]), bf = Median(t.bwd[m]);
    const std::string k = ts::cpu::ToString(modes[m]);
    js << ", \"forward_" << k << "_s\": " << ff << ", \"backward_" << k << "_s\": " << bf
       << ", \"max_abs_diff_" << k << "\": " << diff;
    if (!o.json) {
      std::printf(
          "  %-7s fwd %6.1f ms = %4.2fx BLAS (%3.0f GFLOP/s), bwd %6.1f ms = %4.2fx BLAS (%3.0f "
          "GFLOP/s); "
          "max |diff| from BLAS %.1e, output up to %.1e\n",
          k.c_str(), 1e3 * ff, fb / ff, gflop / ff, 1e3 * bf, bb / bf, 2 * gflop / bf, diff, scale);
    }
  }
  js << "}";
}

}  // namespace

int main(int argc, char** argv) {
  ts::EnsureFastBlasKernels(argc, argv);
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 64;
  const std::vector<ts::cpu::KernelSet> fused = FusedSets(o.sets);
  std::vector<ts::cpu::KernelSet> modes = fused;
  modes.push_back(ts::cpu::KernelSet::kBlas);  // the baseline, last
  const ts::cpu::KernelSet initial = ts::cpu::ActiveKernelSet();
  at::set_num_threads(o.threads);
  at::manual_seed(0);
  ts::Scene scene = ts::GenerateScene(ts::ScenePreset("default", 1));
  at::Tensor points = at::from_blob(scene.points.data(), {scene.size(), 3}, at::kFloat).clone();
  ts::Quantized q = ts::Quantize(points, 0.02);
  const int64_t n = q.coordinates.size(0);
  at::Tensor coords = at::cat({at::zeros({n, 1}, at::kInt), q.coordinates}, 1);
  auto manager = std::make_shared<ts::CoordinateManager>();
  ts::SparseTensor base(at::zeros({n, 1}), coords, 1, manager);

  std::string names;
  for (ts::cpu::KernelSet k : fused) names += (names.empty() ? "" : ", ") + ts::cpu::ToString(k);
  std::ostringstream js;
  js << "{\"threads\": " << o.threads << ", \"blas_core\": \"" << ts::BlasCoreName()
     << "\", \"kernel_sets\": \"" << names << "\", \"voxels\": " << n;
  if (!o.json) {
    std::printf(
        "conv_bench: %d threads (at::set_num_threads), BLAS %s kernels; default scene, %lld voxels "
        "at 2 cm; fused kernel sets: %s; medians of %d, all sets interleaved\n",
        o.threads, ts::BlasCoreName().c_str(), static_cast<long long>(n),
        fused.empty() ? "none on this CPU" : names.c_str(), o.repeats);
  }
  for (const Layer& l : kLayers) BenchLayer(l, base, *manager, modes, o, js);
  ts::cpu::SetKernelSet(initial);
  js << "}";
  if (o.json) std::printf("%s\n", js.str().c_str());
  return 0;
}
