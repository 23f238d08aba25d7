// MinkUNet14 and MinkUNet34 (in 3, out 20) on the default synthetic scene:
// forward without gradients, and a training step (forward + backward) with
// gradient checkpointing off and on (--checkpointing off: off alone):
// median time and peak memory above the
// resting state (the model), from the counting CPU allocator: activations,
// their gradients and the parameter gradients.
// --json prints one JSON object. --device cuda runs it on cuda:0 (memory
// from the caching allocator), --backend forces a backend (sparse/backend.h).
// --profile instead breaks the forward without gradients and the training
// step (checkpointing off) down by op kind (bench/op_profile.h), medians
// over --repeats; under valgrind's callgrind (--collect-atstart=no) it
// collects the instructions of the first profiled step alone.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "sparse/backend.h"
#include "sparse/bench/bench_util.h"
#include "sparse/bench/op_profile.h"
#include "sparse/cpu/blas.h"
#include "sparse/cpu/kernels.h"
#include "sparse/cuda/steps.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "sparse/ops.h"
#include "sparse/quantize.h"
#include "sparse/scene.h"

namespace ts = trainsup::sparse;

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define TRAINSUP_CALLGRIND_TOGGLE() CALLGRIND_TOGGLE_COLLECT
#else
#define TRAINSUP_CALLGRIND_TOGGLE()
#endif

namespace {

using trainsup::bench::Median;
using trainsup::bench::Now;

// Waits for the device's queued work, so that timings cover it.
void Sync(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Median seconds per op kind over runs (a kind missing from a run counts
// 0 there), largest first, and the floating-point operations of the kinds
// that report them (the same in every run).
struct Breakdown {
  std::vector<std::pair<std::string, double>> rows;
  std::map<std::string, double> flops;
  double total = 0;  // median wall time of the whole
};

Breakdown Summarise(const std::vector<std::map<std::string, double>>& runs,
                    const std::map<std::string, double>& flops, const std::vector<double>& totals) {
  std::map<std::string, std::vector<double>> by_name;
  for (const auto& run : runs) {
    for (const auto& [name, t] : run) by_name[name];
  }
  for (auto& [name, v] : by_name) {
    for (const auto& run : runs) {
      auto it = run.find(name);
      v.push_back(it == run.end() ? 0.0 : it->second);
    }
  }
  Breakdown b;
  b.total = Median(totals);
  b.flops = flops;
  for (const auto& [name, v] : by_name) b.rows.emplace_back(name, Median(v));
  std::sort(b.rows.begin(), b.rows.end(),
            [](const auto& l, const auto& r) { return l.second > r.second; });
  return b;
}

void PrintBreakdown(const char* what, const Breakdown& b, std::ostringstream& js,
                    const std::string& key, bool json) {
  double attributed = 0;
  for (const auto& [name, t] : b.rows) attributed += t;
  if (!json) {
    std::printf("%s: %.3f s (median); per op kind, medians (share of the whole):\n", what, b.total);
    for (const auto& [name, t] : b.rows) {
      if (t < 0.0005) continue;
      std::printf("  %-44s %8.1f ms  %5.1f%%", name.c_str(), 1e3 * t, 100 * t / b.total);
      auto f = b.flops.find(name);
      if (f != b.flops.end())
        std::printf("  %7.1f GFLOP = %4.0f GFLOP/s", f->second * 1e-9, f->second * 1e-9 / t);
      std::printf("\n");
    }
    std::printf("  %-44s %8.1f ms  %5.1f%%\n", "(outside any op: autograd engine, glue)",
                1e3 * (b.total - attributed), 100 * (b.total - attributed) / b.total);
  }
  js << ", \"" << key << "_s\": " << b.total << ", \"" << key << "_ops\": {";
  bool first = true;
  for (const auto& [name, t] : b.rows) {
    js << (first ? "" : ", ") << "\"" << name << "\": " << t;
    first = false;
  }
  js << "}, \"" << key << "_gflop\": {";
  first = true;
  for (const auto& [name, f] : b.flops) {
    js << (first ? "" : ", ") << "\"" << name << "\": " << f * 1e-9;
    first = false;
  }
  js << "}";
}

struct Options {
  int repeats = 3;
  int threads = 2;
  bool json = false;
  bool profile = false;
  std::vector<int> depths = {14, 34};
  std::string scene_name = "default";
  int64_t cache_mib = -1;  // -1: the worker's settings (TrainingAllocatorSettings)
  int64_t budget_mib = 0;
  c10::Device device{c10::DeviceType::CPU};
  std::optional<ts::BackendKind> backend;
  // --precisions fp32,bf16,fp16: each measured in this run; the features'
  // type, with the float32 model (the worker's train.precision).
  // bf16-dot, bf16-amx and bf16-convert: bf16 with the cpu backend's
  // AVX512_BF16 tiles forced on (AMX off), its AMX tiles forced on (where
  // the CPU has them; elsewhere the line says AVX512_BF16 ran), or the bf16
  // tiles off (the convert-to-fp32 path), for an A/B; bf16 alone takes the
  // measured choice, as the worker does (cpu::Bf16Mode, cpu::SetAmxMode).
  std::vector<std::string> precisions = {"fp32"};
  at::ScalarType features = at::kFloat;  // the one being measured
  std::string precision = "fp32";        // its name
  // --tf32 on|off: LibTorch's TF32 switch (sparse::SetTf32), as the
  // worker's train.tf32; off by default here (LibTorch's default).
  bool tf32 = false;
  // --dump-scene FILE: the voxelised scene (coordinates [N, 4] int32,
  // features [N, 3], labels [N]) as a tuple for torch.load, then exit:
  // tests/gpu/spconv_minkunet.py times spconv on the same voxels.
  std::string dump_scene;
  // --checkpointing off: the training step without gradient checkpointing
  // alone (tests/gpu/bench_vs_spconv.sh, where only that one is compared).
  bool checkpointed_step = true;
};

// The JSON keys' suffix and the lines' name of the precision measured.
std::string PrecisionName(const Options& o) {
  std::string name = o.precision;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}
std::string KeyOf(int depth, const Options& o) {
  const std::string p = PrecisionName(o);
  return "minkunet" + std::to_string(depth) + (p == "fp32" ? "" : "_" + p);
}

at::ScalarType FeatureType(const std::string& precision) {
  if (precision.rfind("bf16", 0) == 0) return at::kBFloat16;
  if (precision == "fp16") return at::kHalf;
  return at::kFloat;
}

// The command line; false (after the usage line) when it is not understood.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      o->json = true;
    } else if (a == "--profile") {
      o->profile = true;
    } else if (a == "--repeats" && i + 1 < argc) {
      o->repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      o->threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--block-cache-mib" && i + 1 < argc) {
      o->cache_mib = std::atoll(argv[++i]);
    } else if (a == "--budget-mib" && i + 1 < argc) {
      o->budget_mib = std::atoll(argv[++i]);
    } else if (a == "--tf32" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "on" && v != "off") {
        std::fprintf(stderr, "minkunet_bench: --tf32 takes on or off, not '%s'\n", v.c_str());
        return false;
      }
      o->tf32 = v == "on";
    } else if (a == "--checkpointing" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "both" && v != "off") {
        std::fprintf(stderr, "minkunet_bench: --checkpointing takes both or off, not '%s'\n",
                     v.c_str());
        return false;
      }
      o->checkpointed_step = v == "both";
    } else if (a == "--dump-scene" && i + 1 < argc) {
      o->dump_scene = argv[++i];
    } else if (a == "--scene" && i + 1 < argc) {
      o->scene_name = argv[++i];
    } else if (a == "--device" && i + 1 < argc) {
      const std::string d = argv[++i];
      o->device =
          d == "cuda" ? c10::Device(c10::DeviceType::CUDA, 0) : c10::Device(c10::DeviceType::CPU);
    } else if (a == "--backend" && i + 1 < argc) {
      o->backend = ts::BackendKindFromString(argv[++i]);
    } else if (a == "--precisions" && i + 1 < argc) {
      o->precisions.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) {
        if (x != "fp32" && x != "bf16" && x != "fp16" && x != "bf16-dot" && x != "bf16-amx" &&
            x != "bf16-convert") {
          std::fprintf(stderr,
                       "minkunet_bench: unknown precision '%s' (fp32, bf16, fp16, bf16-dot, "
                       "bf16-amx, bf16-convert)\n",
                       x.c_str());
          return false;
        }
        o->precisions.push_back(x);
      }
    } else if (a == "--depths" && i + 1 < argc) {
      o->depths.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) o->depths.push_back(std::atoi(x.c_str()));
    } else {
      std::fprintf(stderr,
                   "usage: minkunet_bench [--repeats N] [--threads N] [--json] [--depths 14,34] "
                   "[--scene small|default|large|huge] [--budget-mib N] [--block-cache-mib N] "
                   "[--device cpu|cuda] [--backend cpu|generic|cuda] [--precisions "
                   "fp32,bf16,fp16,bf16-dot,bf16-amx,bf16-convert] [--tf32 on|off] "
                   "[--checkpointing both|off] "
                   "[--dump-scene FILE] [--profile]\n");
      return false;
    }
  }
  return true;
}

// The allocator as the worker sets it up for a budget of --budget-mib (0:
// none): on the CPU the counting allocator with its block cache
// (--block-cache-mib overrides the cache for A/B runs), on CUDA the
// caching allocator's fraction. Returns its description.
std::string SetUpAllocator(const Options& o, ts::AllocatorSettings* allocator) {
  *allocator = ts::TrainingAllocatorSettings(o.budget_mib << 20);
  if (o.cache_mib >= 0) allocator->block_cache_bytes = o.cache_mib << 20;
  if (o.device.is_cpu()) {
    ts::ApplyAllocatorSettings(*allocator);
    return ts::ToString(*allocator);
  }
  ts::SetMemoryBudget(o.device, o.budget_mib << 20);
  return "CUDA caching allocator, " + (o.budget_mib > 0
                                           ? "budget " + std::to_string(o.budget_mib) + " MiB"
                                           : std::string("no budget"));
}

// The scene quantized at 2 cm, features and labels on the device; *coords
// gets the voxels' coordinates (batch column first), on the device too, as
// spconv's indices are in tests/gpu/spconv_minkunet.py: a fresh scene's
// figures below include making its input set from them (AddCoordinates:
// on a device-key backend, packing and sorting on the device), as
// spconv's include building its indices.
ts::Quantized Voxelise(const Options& o, at::Tensor* coords) {
  ts::Scene scene = ts::GenerateScene(ts::ScenePreset(o.scene_name, 1));
  at::Tensor points = at::from_blob(scene.points.data(), {scene.size(), 3}, at::kFloat).clone();
  at::Tensor colors = at::from_blob(scene.colors.data(), {scene.size(), 3}, at::kFloat).clone();
  at::Tensor labels = at::from_blob(scene.labels.data(), {scene.size()}, at::kInt).to(at::kLong);
  ts::Quantized q = ts::Quantize(points, 0.02, colors, labels);
  q.features = q.features.to(o.device);
  q.labels = q.labels.to(o.device);
  const int64_t n = q.coordinates.size(0);
  *coords = at::cat({at::zeros({n, 1}, at::kInt), q.coordinates}, 1).to(o.device);
  return q;
}

// --profile: the forward without gradients (a fresh coordinate manager per
// run, kernel maps included), then the training step on one manager after
// a first step that built the maps, as timed below; per op kind.
void ProfileDepth(ts::MinkUNet& net, int depth, const ts::Quantized& q, const at::Tensor& coords,
                  const Options& o, std::ostringstream& js) {
  const c10::Device device = o.device;
  const std::string k = "minkunet" + std::to_string(depth);
  std::vector<std::map<std::string, double>> fwd_ops, step_ops;
  std::map<std::string, double> fwd_flops, step_flops;
  std::vector<double> fwd_t, step_t, step_fwd_t;
  net->eval();
  for (int r = 0; r <= o.repeats; ++r) {
    torch::NoGradGuard no_grad;
    trainsup::bench::OpProfile ops(device.is_cuda());
    const double t0 = Now();
    ts::SparseTensor x(q.features, coords);
    net->forward(x);
    Sync(device);
    const double t = Now() - t0;
    if (r > 0) {
      fwd_t.push_back(t);
      fwd_ops.push_back(ops.Take());
      fwd_flops = ops.TakeFlops();
    }
  }
  net->train();
  ts::DisableGradientCheckpointing(*net);
  ts::SparseTensor x(q.features, coords);
  for (int r = 0; r <= o.repeats; ++r) {
    for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
    if (r == 1) TRAINSUP_CALLGRIND_TOGGLE();
    trainsup::bench::OpProfile ops(device.is_cuda());
    const double t0 = Now();
    at::Tensor logits = net->forward(x).F();
    at::Tensor loss = at::cross_entropy_loss(logits, q.labels);
    Sync(device);
    const double t1 = Now();
    loss.backward();
    Sync(device);
    const double t = Now() - t0;
    if (r == 1) TRAINSUP_CALLGRIND_TOGGLE();
    if (r > 0) {
      step_t.push_back(t);
      step_fwd_t.push_back(t1 - t0);
      step_ops.push_back(ops.Take());
      step_flops = ops.TakeFlops();
    }
  }
  PrintBreakdown(("MinkUNet" + std::to_string(depth) + " forward without gradients").c_str(),
                 Summarise(fwd_ops, fwd_flops, fwd_t), js, k + "_forward", o.json);
  if (!o.json) {
    std::printf("MinkUNet%d training step: forward (with the loss) %.3f s of it\n", depth,
                Median(step_fwd_t));
  }
  js << ", \"" << k << "_step_forward_s\": " << Median(step_fwd_t);
  PrintBreakdown(("MinkUNet" + std::to_string(depth) + " training step").c_str(),
                 Summarise(step_ops, step_flops, step_t), js, k + "_step", o.json);
}

// Inference: a fresh coordinate manager per run, as a new scene would have.
void BenchInference(ts::MinkUNet& net, int depth, const ts::Quantized& q, const at::Tensor& coords,
                    const Options& o, std::ostringstream& js) {
  const std::string k = KeyOf(depth, o);
  net->eval();
  std::vector<double> fwd;
  const at::Tensor features = q.features.to(o.features);
  for (int r = 0; r <= o.repeats; ++r) {
    torch::NoGradGuard no_grad;
    const double t0 = Now();
    ts::SparseTensor x(features, coords);
    net->forward(x);
    Sync(o.device);
    if (r > 0) fwd.push_back(Now() - t0);
  }
  js << ", \"" << k << "_params\": " << net->NumParameters() << ", \"" << k
     << "_forward_s\": " << Median(fwd);
  if (!o.json) {
    std::printf("MinkUNet%d (%lld parameters), %s: forward without gradients %.2f s\n", depth,
                static_cast<long long>(net->NumParameters()), PrecisionName(o).c_str(),
                Median(fwd));
  }
}

// The training steps after the first, their times and peaks above the
// memory at rest; the first step's time apart.
struct StepTimes {
  std::vector<double> times, peaks;
  double first_step = 0;
};

// The first step makes the input set and builds the kernel maps on a fresh
// coordinate manager (as every new batch does); the timed ones reuse them,
// so the peak is the activations' (and gradients') alone.
StepTimes TimeTrainingSteps(ts::MinkUNet& net, const ts::Quantized& q, const at::Tensor& coords,
                            const Options& o) {
  const c10::Device device = o.device;
  StepTimes s;
  const at::Tensor features = q.features.to(o.features);
  std::optional<ts::SparseTensor> x;
  for (int r = 0; r <= o.repeats; ++r) {
    for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
    Sync(device);
    const int64_t rest = ts::GetMemoryStats(device).current_bytes;
    ts::ResetPeakMemory(device);
    const double t0 = Now();
    if (r == 0) x.emplace(features, coords);
    // The loss in float32, as the worker computes it under mixed precision.
    at::Tensor loss =
        at::cross_entropy_loss(net->forward(*x).F().to(ts::AccumulateType(o.features)), q.labels);
    loss.backward();
    Sync(device);
    const double t = Now() - t0;
    if (r == 0) s.first_step = t;
    if (r > 0) {
      s.times.push_back(t);
      s.peaks.push_back(static_cast<double>(ts::GetMemoryStats(device).peak_bytes - rest));
    }
  }
  return s;
}

// The training step's time and peak without and with gradient
// checkpointing; returns the plain step's median time and activations' peak.
std::pair<double, double> BenchTraining(ts::MinkUNet& net, int depth, const ts::Quantized& q,
                                        const at::Tensor& coords, const Options& o,
                                        std::ostringstream& js) {
  const std::string k = KeyOf(depth, o);
  net->train();
  // Parameter gradients are allocated during every step and counted in the
  // peak; they are not activations, and the same with or without
  // checkpointing.
  double grad_bytes = 0;
  for (const auto& t : net->parameters())
    grad_bytes += static_cast<double>(t.numel() * t.element_size());
  double base_time = 0, base_peak = 0;
  for (bool checkpointing : {false, true}) {
    if (checkpointing && !o.checkpointed_step) break;
    if (checkpointing) {
      ts::EnableGradientCheckpointing(*net);
    } else {
      ts::DisableGradientCheckpointing(*net);
    }
    const StepTimes s = TimeTrainingSteps(net, q, coords, o);
    const double first_step = s.first_step;
    const double t = Median(s.times), total = Median(s.peaks), peak = total - grad_bytes;
    const std::string c = k + (checkpointing ? "_checkpointed" : "_plain");
    js << ", \"" << c << "_step_s\": " << t << ", \"" << c << "_first_step_s\": " << first_step
       << ", \"" << c << "_peak_mib\": " << total / (1 << 20) << ", \"" << c
       << "_peak_activations_mib\": " << peak / (1 << 20);
    if (!checkpointing) {
      base_time = t;
      base_peak = peak;
    } else {
      js << ", \"" << k << "_checkpointing_peak_reduction\": " << 1.0 - peak / base_peak << ", \""
         << k << "_checkpointing_time_increase\": " << t / base_time - 1.0;
    }
    if (!o.json) {
      std::printf(
          "  training step (forward + backward), checkpointing %-3s: %.2f s (first, with kernel "
          "maps: "
          "%.2f s), peak %.0f MiB = %.0f MiB activations + %.0f MiB parameter gradients%s\n",
          checkpointing ? "on" : "off", t, first_step, total / (1 << 20), peak / (1 << 20),
          grad_bytes / (1 << 20),
          checkpointing
              ? ("  => peak -" + std::to_string(static_cast<int>(100 * (1 - peak / base_peak))) +
                 "%, time +" + std::to_string(static_cast<int>(100 * (t / base_time - 1))) + "%")
                    .c_str()
              : "");
    }
  }
  return {base_time, base_peak};
}

// The cuda backend's measured dataflow choices (sparse/cuda/steps.h), per
// layer shape, with both timings: what explains its step time. Printed
// unless `json`; added to the JSON object `js` either way.
void ReportCudaDataflows(bool json, std::ostringstream& js) {
  const std::vector<std::string> choices = ts::cuda::DataflowChoices();
  const std::string active = ts::cuda::ToString(ts::cuda::ActiveDataflow());
  js << ", \"cuda_dataflow\": \"" << active << "\", \"cuda_dataflow_choices\": [";
  for (size_t i = 0; i < choices.size(); ++i) js << (i ? ", " : "") << "\"" << choices[i] << "\"";
  js << "]";
  if (json || choices.empty()) return;
  std::printf("cuda backend, dataflow %s:\n", active.c_str());
  for (const std::string& line : choices) std::printf("  %s\n", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  ts::EnsureFastBlasKernels(argc, argv);
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 64;
  const c10::Device device = o.device;
  at::set_num_threads(o.threads);
  if (o.backend) ts::SetBackendOverride(o.backend);
  ts::AllocatorSettings allocator;
  const std::string allocator_text = SetUpAllocator(o, &allocator);
  torch::manual_seed(0);

  at::Tensor coords;
  const ts::Quantized q = Voxelise(o, &coords);
  const int64_t n = coords.size(0);
  if (!o.dump_scene.empty()) {
    const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(
        {coords.to(at::kCPU), q.features.to(at::kCPU), q.labels.to(at::kCPU)}));
    std::ofstream file(o.dump_scene, std::ios::binary);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    file.close();
    if (!file) {
      std::fprintf(stderr, "minkunet_bench: cannot write %s\n", o.dump_scene.c_str());
      return 1;
    }
    std::fprintf(stderr, "minkunet_bench: scene %s (%lld voxels) written to %s\n",
                 o.scene_name.c_str(), static_cast<long long>(n), o.dump_scene.c_str());
    return 0;
  }
  ts::SetTf32(o.tf32);

  std::ostringstream js;
  // TRAINSUP_KERNELS=avx512|avx2|blas (or TRAINSUP_FUSED=0 for blas)
  // selects the CPU backend's convolution kernels.
  const ts::Backend& b = ts::BackendFor(device);
  const std::string kernel_set = b.kind != ts::BackendKind::kCpu
                                     ? std::string(b.name)
                                     : ts::cpu::ToString(ts::cpu::ActiveKernelSet());
  const char* kernels = kernel_set.c_str();
  js << "{\"device\": \"" << device.str() << "\", \"backend\": \"" << b.name
     << "\", \"block_cache_mib\": " << (device.is_cpu() ? allocator.block_cache_bytes >> 20 : 0)
     << ", \"budget_mib\": " << o.budget_mib << ", \"allocator\": \"" << allocator_text
     << "\", \"tf32\": " << (o.tf32 ? "true" : "false") << ", \"threads\": " << o.threads
     << ", \"blas_core\": \"" << ts::BlasCoreName() << "\", \"conv_kernels\": \"" << kernels
     << "\", \"scene\": \"" << o.scene_name << "\", \"voxels\": " << n;
  if (!o.json) {
    std::printf(
        "minkunet_bench: %s, backend %s, %d threads (at::set_num_threads), convolution kernels "
        "%s, BLAS %s kernels, TF32 %s, allocator: %s; scene %s: %lld voxels at 2 cm; medians "
        "of %d\n",
        device.str().c_str(), b.name, o.threads, kernels, ts::BlasCoreName().c_str(),
        o.tf32 ? "on" : "off", allocator_text.c_str(), o.scene_name.c_str(),
        static_cast<long long>(n), o.repeats);
  }
  for (int depth : o.depths) {
    std::vector<std::pair<std::string, std::pair<double, double>>> plain;
    for (const std::string& precision : o.precisions) {
      o.features = FeatureType(precision);
      o.precision = precision;
      const bool forced = precision == "bf16-dot" || precision == "bf16-amx";
      ts::cpu::SetBf16Mode(precision == "bf16-convert" ? ts::cpu::Bf16Mode::kOff
                           : forced                    ? ts::cpu::Bf16Mode::kOn
                                                       : ts::cpu::Bf16Mode::kMeasured);
      ts::cpu::SetAmxMode(precision == "bf16-dot"   ? ts::cpu::Bf16Mode::kOff
                          : precision == "bf16-amx" ? ts::cpu::Bf16Mode::kOn
                                                    : ts::cpu::Bf16Mode::kMeasured);
      if (!o.json) {
        std::printf("precision %s: %s\n", precision.c_str(),
                    ts::DescribePrecision(o.features, device).c_str());
      }
      ts::MinkUNet net(ts::MinkUNetPlan(depth, 3, 20));
      net->to(device);
      if (o.profile) {
        ProfileDepth(net, depth, q, coords, o, js);
        continue;
      }
      BenchInference(net, depth, q, coords, o, js);
      plain.emplace_back(PrecisionName(o), BenchTraining(net, depth, q, coords, o, js));
    }
    // Each precision against the first (fp32 by default), from this run.
    for (size_t i = 1; i < plain.size(); ++i) {
      const double time = plain[i].second.first / plain[0].second.first;
      const double peak = plain[i].second.second / plain[0].second.second;
      js << ", \"minkunet" << depth << "_" << plain[i].first << "_over_" << plain[0].first
         << "_step\": " << time << ", \"minkunet" << depth << "_" << plain[i].first << "_over_"
         << plain[0].first << "_peak_activations\": " << peak;
      if (!o.json) {
        std::printf(
            "MinkUNet%d %s against %s, checkpointing off: step time %.2fx, peak "
            "activations %.2fx\n",
            depth, plain[i].first.c_str(), plain[0].first.c_str(), time, peak);
      }
    }
  }
  ReportCudaDataflows(o.json, js);
  js << "}";
  if (o.json) std::printf("%s\n", js.str().c_str());
  return 0;
}
