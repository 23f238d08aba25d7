// MinkUNet14 and MinkUNet34 (in 3, out 20) on the default synthetic scene:
// forward without gradients, and a training step (forward + backward) with
// gradient checkpointing off and on: median time and peak memory above the
// resting state (the model), from the counting CPU allocator: activations,
// their gradients and the parameter gradients.
// --json prints one JSON object.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "sparse/bench/bench_util.h"
#include "sparse/blas.h"
#include "sparse/kernels_cpu.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "sparse/quantize.h"
#include "sparse/scene.h"

namespace ts = trainsup::sparse;

namespace {

using trainsup::bench::Median;
using trainsup::bench::Now;

}  // namespace

int main(int argc, char** argv) {
  ts::EnsureFastBlasKernels(argc, argv);
  int repeats = 3;
  int threads = 2;
  bool json = false;
  std::vector<int> depths = {14, 34};
  std::string scene_name = "default";
  int64_t cache_mib = 2048;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--block-cache-mib" && i + 1 < argc) {
      cache_mib = std::atoll(argv[++i]);
    } else if (a == "--scene" && i + 1 < argc) {
      scene_name = argv[++i];
    } else if (a == "--depths" && i + 1 < argc) {
      depths.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) depths.push_back(std::atoi(x.c_str()));
    } else {
      std::fprintf(stderr, "usage: minkunet_bench [--repeats N] [--threads N] [--json] [--depths 14,34] "
                           "[--scene small|default|large|huge] [--block-cache-mib N]\n");
      return 64;
    }
  }
  at::set_num_threads(threads);
  ts::InstallCountingAllocator();
  ts::SetBlockCacheLimit(cache_mib << 20);
  torch::manual_seed(0);

  ts::Scene scene = ts::GenerateScene(ts::ScenePreset(scene_name, 1));
  at::Tensor points = at::from_blob(scene.points.data(), {scene.size(), 3}, at::kFloat).clone();
  at::Tensor colors = at::from_blob(scene.colors.data(), {scene.size(), 3}, at::kFloat).clone();
  at::Tensor labels = at::from_blob(scene.labels.data(), {scene.size()}, at::kInt).to(at::kLong);
  ts::Quantized q = ts::Quantize(points, 0.02, colors, labels);
  const int64_t n = q.coordinates.size(0);
  at::Tensor coords = at::cat({at::zeros({n, 1}, at::kInt), q.coordinates}, 1);

  std::ostringstream js;
  // TRAINSUP_KERNELS=avx512|avx2|blas (or TRAINSUP_FUSED=0 for blas) selects the convolution kernels.
  const std::string kernel_set = ts::cpu::ToString(ts::cpu::ActiveKernelSet());
  const char* kernels = kernel_set.c_str();
  js << "{\"block_cache_mib\": " << cache_mib << ", \"threads\": " << threads << ", \"blas_core\": \"" << ts::BlasCoreName()
     << "\", \"conv_kernels\": \"" << kernels << "\", \"voxels\": " << n;
  if (!json) {
    std::printf("minkunet_bench: %d threads (at::set_num_threads), convolution kernels %s, BLAS %s kernels, block cache "
                "%lld MiB; scene %s: %lld voxels at 2 cm; medians of %d\n",
                threads, kernels, ts::BlasCoreName().c_str(), static_cast<long long>(cache_mib), scene_name.c_str(),
                static_cast<long long>(n), repeats);
  }
  for (int depth : depths) {
    ts::MinkUNet net(ts::MinkUNetPlan(depth, 3, 20));
    const std::string k = "minkunet" + std::to_string(depth);
    // Inference: a fresh coordinate manager per run, as a new scene would have.
    net->eval();
    std::vector<double> fwd;
    for (int r = 0; r <= repeats; ++r) {
      torch::NoGradGuard no_grad;
      ts::SparseTensor x(q.features, coords);
      const double t0 = Now();
      net->forward(x);
      if (r > 0) fwd.push_back(Now() - t0);
    }
    js << ", \"" << k << "_params\": " << net->NumParameters() << ", \"" << k << "_forward_s\": " << Median(fwd);
    if (!json) {
      std::printf("MinkUNet%d (%lld parameters): forward without gradients %.2f s\n", depth,
                  static_cast<long long>(net->NumParameters()), Median(fwd));
    }
    net->train();
    // Parameter gradients are allocated during every step and counted in the
    // peak; they are not activations, and the same with or without
    // checkpointing.
    double grad_bytes = 0;
    for (const auto& t : net->parameters()) grad_bytes += static_cast<double>(t.numel() * t.element_size());
    double base_time = 0, base_peak = 0;
    for (bool checkpointing : {false, true}) {
      if (checkpointing) {
        ts::EnableGradientCheckpointing(*net);
      } else {
        ts::DisableGradientCheckpointing(*net);
      }
      // The first step builds the kernel maps on a fresh coordinate manager
      // (as every new batch does); the timed ones reuse them, so the peak
      // is the activations' (and gradients') alone.
      std::vector<double> times, peaks;
      double first_step = 0;
      ts::SparseTensor x(q.features, coords);
      for (int r = 0; r <= repeats; ++r) {
        for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
        const int64_t rest = ts::GetMemoryStats().current_bytes;
        ts::ResetPeakMemory();
        const double t0 = Now();
        at::Tensor loss = at::cross_entropy_loss(net->forward(x).F(), q.labels);
        loss.backward();
        const double t = Now() - t0;
        if (r == 0) first_step = t;
        if (r > 0) {
          times.push_back(t);
          peaks.push_back(static_cast<double>(ts::GetMemoryStats().peak_bytes - rest));
        }
      }
      const double t = Median(times), total = Median(peaks), peak = total - grad_bytes;
      const std::string c = k + (checkpointing ? "_checkpointed" : "_plain");
      js << ", \"" << c << "_step_s\": " << t << ", \"" << c << "_first_step_s\": " << first_step << ", \""
         << c << "_peak_mib\": " << total / (1 << 20) << ", \"" << c << "_peak_activations_mib\": " << peak / (1 << 20);
      if (!checkpointing) {
        base_time = t;
        base_peak = peak;
      } else {
        js << ", \"" << k << "_checkpointing_peak_reduction\": " << 1.0 - peak / base_peak << ", \"" << k
           << "_checkpointing_time_increase\": " << t / base_time - 1.0;
      }
      if (!json) {
        std::printf("  training step (forward + backward), checkpointing %-3s: %.2f s (first, with kernel maps: "
                    "%.2f s), peak %.0f MiB = %.0f MiB activations + %.0f MiB parameter gradients%s\n",
                    checkpointing ? "on" : "off", t, first_step, total / (1 << 20), peak / (1 << 20),
                    grad_bytes / (1 << 20),
                    checkpointing ? ("  => peak -" + std::to_string(static_cast<int>(100 * (1 - peak / base_peak))) +
                                     "%, time +" + std::to_string(static_cast<int>(100 * (t / base_time - 1))) + "%")
                                        .c_str()
                                  : "");
      }
    }
  }
  js << "}";
  if (json) std::printf("%s\n", js.str().c_str());
  return 0;
}
