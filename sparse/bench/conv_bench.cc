// The convolution kernels layer by layer: MinkUNet14's heaviest shapes on
// the default synthetic scene, the fused AVX-512 kernels against the
// gather-BLAS-scatter path, interleaved in one run (fused, BLAS, fused,
// ...), so the ratio is measured under the same load. Forward, then the
// backward (input and weight gradients) alone. (1x1x1 convolutions take
// the BLAS path either way, so none is listed.) Prints medians; --json
// prints one JSON object instead.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
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
    {"k3 s1 128->96", 1, 3, 128, 96}, {"k3 s1 96->96", 1, 3, 96, 96},
    {"k3 s2 32->32", 2, 3, 32, 32},   {"k3 s4 128->128", 4, 3, 128, 128},
    {"k3 s8 384->256", 8, 3, 384, 256},
};

}  // namespace

int main(int argc, char** argv) {
  ts::EnsureFastBlasKernels(argc, argv);
  int repeats = 5, threads = 2;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: conv_bench [--repeats N] [--threads N] [--json]\n");
      return 64;
    }
  }
  at::set_num_threads(threads);
  at::manual_seed(0);
  ts::cpu::SetFusedKernelsEnabled(true);
  const bool fused_available = ts::cpu::FusedKernelsEnabled();
  ts::Scene scene = ts::GenerateScene(ts::ScenePreset("default", 1));
  at::Tensor points = at::from_blob(scene.points.data(), {scene.size(), 3}, at::kFloat).clone();
  ts::Quantized q = ts::Quantize(points, 0.02);
  const int64_t n = q.coordinates.size(0);
  at::Tensor coords = at::cat({at::zeros({n, 1}, at::kInt), q.coordinates}, 1);
  auto manager = std::make_shared<ts::CoordinateManager>();
  ts::SparseTensor base(at::zeros({n, 1}), coords, 1, manager);

  std::ostringstream js;
  js << "{\"threads\": " << threads << ", \"blas_core\": \"" << ts::BlasCoreName()
     << "\", \"fused_available\": " << (fused_available ? "true" : "false") << ", \"voxels\": " << n;
  if (!json) {
    std::printf("conv_bench: %d threads (at::set_num_threads), BLAS %s kernels; default scene, %lld voxels "
                "at 2 cm; fused AVX-512 kernels %s; medians of %d, fused and BLAS interleaved\n",
                threads, ts::BlasCoreName().c_str(), static_cast<long long>(n),
                fused_available ? "available" : "NOT available on this CPU (both columns are BLAS)", repeats);
    std::printf("%-16s %9s %8s | %-26s | %-26s\n", "layer", "rows", "GFLOP", "forward fused / BLAS",
                "backward fused / BLAS");
  }
  for (const Layer& l : kLayers) {
    ts::CoordinateSetId set = base.set_id();
    for (int32_t s = 1; s < l.stride; s *= 2) set = manager->Downsample(set, 2);
    auto map = manager->GetKernelMap(set, set, l.kernel, 1);
    const int64_t rows = map->num_out;
    at::Tensor f = at::randn({rows, l.cin}).set_requires_grad(true);
    at::Tensor w = (at::randn({map->volume, l.cin, l.cout}) * 0.05).set_requires_grad(true);
    const double gflop = 2.0 * static_cast<double>(map->pairs()) * l.cin * l.cout * 1e-9;
    std::vector<double> fwd[2], bwd[2];
    at::Tensor outs[6];  // BLAS then fused: output, input gradient, weight gradient
    for (int r = 0; r <= repeats; ++r) {
      for (int mode : {1, 0}) {
        ts::cpu::SetFusedKernelsEnabled(mode == 1);
        f.mutable_grad() = at::Tensor();
        w.mutable_grad() = at::Tensor();
        const double t0 = Now();
        at::Tensor y = ts::KernelMapConv(f, w, *map, false);
        const double t1 = Now();
        y.backward(at::ones_like(y));
        const double t2 = Now();
        if (r > 0) {
          fwd[mode].push_back(t1 - t0);
          bwd[mode].push_back(t2 - t1);
        }
        outs[3 * mode] = y.detach();
        outs[3 * mode + 1] = f.grad().clone();
        outs[3 * mode + 2] = w.grad().clone();
      }
    }
    // Largest difference between the paths over output and both gradients.
    double diff = 0;
    for (int i = 0; i < 3; ++i) diff = std::max(diff, (outs[i + 3] - outs[i]).abs().max().item<double>());
    const double scale = outs[0].abs().max().item<double>();  // of the output
    const double ff = Median(fwd[1]), fb = Median(fwd[0]), bf = Median(bwd[1]), bb = Median(bwd[0]);
    const std::string key = std::string("k") + std::to_string(l.kernel) + "_s" + std::to_string(l.stride) + "_" +
                            std::to_string(l.cin) + "_" + std::to_string(l.cout);
    js << ", \"" << key << "\": {\"rows\": " << rows << ", \"gflop\": " << gflop << ", \"forward_fused_s\": " << ff
       << ", \"forward_blas_s\": " << fb << ", \"backward_fused_s\": " << bf << ", \"backward_blas_s\": " << bb
       << ", \"max_abs_diff\": " << diff << "}";
    if (!json) {
      std::printf("%-16s %9lld %8.2f | %5.1f / %5.1f ms = %4.2fx | %5.1f / %5.1f ms = %4.2fx | %3.0f vs %3.0f GFLOP/s"
                  " fwd, %3.0f vs %3.0f bwd; max |diff| (output, gradients) %.1e, output up to %.1e\n",
                  l.name, static_cast<long long>(rows), gflop, 1e3 * ff, 1e3 * fb, fb / ff, 1e3 * bf, 1e3 * bb,
                  bb / bf, gflop / ff, gflop / fb, 2 * gflop / bf, 2 * gflop / bb, diff, scale);
    }
  }
  ts::cpu::SetFusedKernelsEnabled(fused_available);
  js << "}";
  if (json) std::printf("%s\n", js.str().c_str());
  return 0;
}
