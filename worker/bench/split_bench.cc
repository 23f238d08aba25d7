// Splitting under a memory budget (issue 5, "Measured"): MinkUNet14 (in 3,
// out 4) trained with SGD on the heavy-tailed synthetic dataset, under a
// budget between what a batch of normal rooms and a batch with a large room
// need. The same batches run twice from the same initial weights:
//   (a) baseline: the commonly used reactive splitter (RunBaselineSplitting:
//       catch, run the scenes one at a time, halve by bounding-box midpoint
//       alternating x/y, drop halves under 500 points);
//   (b) ours: RunSplitting with the predictive MemoryModel, calibrated
//       before the first step as the worker does (CalibrateMemory: probes
//       of growing size cut from the first scenes through the real model;
//       its forward passes and any out-of-memory among them are counted in
//       (b)'s figures), then learning as it goes; --no-calibration starts it
//       empty instead (the worker before calibration).
// Per mode: steps, scenes/s, forward passes, OOM events, wasted forward
// passes, dropped pieces and voxels. The counts are deterministic; scenes/s
// is one measurement on a shared machine, so the two modes take turns step
// by step (on the same tensors, the idle mode's state parked in host memory
// outside the budget) and see the same load.
// --json prints one JSON object.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "contracts/spec.h"
#include "sparse/bench/bench_util.h"
#include "sparse/determinism.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "sparse/ops.h"
#include "sparse/runtime.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"
#include "worker/split/split.h"
#include "worker/split/step.h"
#include "worker/train/trainer.h"

namespace ts = trainsup::sparse;
namespace tw = trainsup::worker;

namespace {

using trainsup::bench::Now;

constexpr int kInChannels = 3;
constexpr int kClasses = 4;
constexpr double kMiB = 1 << 20;

// The 1-minute load average, for judging the timing on a shared machine.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

int64_t Voxels(const tw::Batch& batch) {
  int64_t v = 0;
  for (const tw::VoxelScene& s : batch.scenes) v += s.voxels();
  return v;
}

// The training state the two modes take turns on: parameters, buffers
// (BatchNorm statistics) and SGD momentum, allocated once through the
// counting allocator as the trainer's are. `sgd` must have taken a step.
std::vector<at::Tensor> LiveState(ts::MinkUNetImpl& model, torch::optim::SGD& sgd) {
  std::vector<at::Tensor> live = model.parameters();
  for (const at::Tensor& t : model.buffers()) live.push_back(t);
  for (const at::Tensor& p : model.parameters()) {
    auto& state = sgd.state().at(p.unsafeGetTensorImpl());
    live.push_back(static_cast<torch::optim::SGDParamState&>(*state).momentum_buffer());
  }
  return live;
}

// A mode's copy of the live state while the other mode trains, in plain
// host memory: outside the counting allocator, so it is not in the budget.
using HostState = std::vector<std::vector<char>>;

std::vector<char> Bytes(const at::Tensor& t) {
  const char* data = static_cast<const char*>(t.data_ptr());
  return std::vector<char>(data, data + t.nbytes());
}

HostState Save(const std::vector<at::Tensor>& live) {
  HostState host;
  for (const at::Tensor& t : live) host.push_back(Bytes(t));
  return host;
}

void Load(const HostState& host, const std::vector<at::Tensor>& live) {
  for (size_t i = 0; i < live.size(); ++i) {
    std::memcpy(live[i].data_ptr(), host[i].data(), host[i].size());
  }
}

// The features' type of the runs being measured (--precisions): the
// worker's train.precision, with the float32 model.
at::ScalarType g_features = at::kFloat;

// One optimizer step as the trainer takes it (worker/train/trainer.cc Step):
// forward+backward with splitting into `accum`, then SGD on the accumulated
// gradient. Returns false (after printing why) on a hard out-of-memory or
// another error.
bool TrainStep(ts::MinkUNetImpl& model, torch::optim::SGD& sgd, const tw::Batch& batch,
               const std::vector<at::Tensor>& params, std::vector<at::Tensor>& accum,
               tw::MemoryModel* predictor, int64_t budget, bool baseline, tw::StepOutcome* out,
               int64_t* run_peak) {
  absl::StatusOr<tw::StepOutcome> outcome =
      tw::ForwardBackward(model, batch, kInChannels, params, accum, tw::SplitOptions(), predictor,
                          budget, g_features, run_peak, 0, baseline);
  if (!outcome.ok()) {
    std::fprintf(stderr, "split_bench: %s\n", std::string(outcome.status().message()).c_str());
    return false;
  }
  *out = *outcome;
  if (outcome->labelled == 0) return true;
  try {
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i];
      p.mutable_grad() = accum[i].clone();
    }
    sgd.step();
    for (at::Tensor p : params) p.mutable_grad() = at::Tensor();
  } catch (const c10::OutOfMemoryError& e) {
    std::fprintf(stderr, "split_bench: out of memory in the optimizer step: %s\n", e.what());
    return false;
  }
  return true;
}

struct ModeResult {
  int64_t steps = 0;
  int64_t scenes = 0;
  int64_t voxels = 0;
  double seconds = 0;
  double last_epoch_loss = 0;  // mean of the last epoch's step losses
  int64_t peak = 0;
  // (b) only: the first step (0-based) that began with the memory model
  // ready; -1 when it never was.
  int64_t ready_step = -1;
  tw::SplitStats total;
  std::vector<tw::SplitStats> per_step;
};

struct Options {
  int threads = 2;
  int64_t scenes = 20;
  int64_t epochs = 4;
  int64_t batch_size = 2;
  double voxel = 0.05;
  int64_t seed = 1;
  int64_t budget_mib = 0;
  double budget_fraction = 0.25;
  bool deterministic = true;
  bool json = false;
  bool calibrate = true;
  // --precisions fp32,bf16,fp16: the whole comparison at each, under the first
  // one's budget (its peaks set it), in this run.
  std::vector<std::string> precisions = {"fp32"};
};

// The command line; false (after the usage or the reason) when it is not
// understood.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      o->json = true;
    } else if (a == "--no-calibration") {
      o->calibrate = false;
    } else if (a == "--threads" && i + 1 < argc) {
      o->threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--scenes" && i + 1 < argc) {
      o->scenes = std::max(2LL, std::atoll(argv[++i]));
    } else if (a == "--epochs" && i + 1 < argc) {
      o->epochs = std::max(1LL, std::atoll(argv[++i]));
    } else if (a == "--batch" && i + 1 < argc) {
      o->batch_size = std::max(1LL, std::atoll(argv[++i]));
    } else if (a == "--voxel" && i + 1 < argc) {
      o->voxel = std::atof(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      o->seed = std::atoll(argv[++i]);
    } else if (a == "--budget-mib" && i + 1 < argc) {
      o->budget_mib = std::atoll(argv[++i]);
    } else if (a == "--budget-fraction" && i + 1 < argc) {
      o->budget_fraction = std::atof(argv[++i]);
    } else if (a == "--precisions" && i + 1 < argc) {
      o->precisions.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) {
        if (x != "fp32" && x != "bf16" && x != "fp16") {
          std::fprintf(stderr, "split_bench: unknown precision '%s' (fp32, bf16, fp16)\n",
                       x.c_str());
          return false;
        }
        o->precisions.push_back(x);
      }
    } else if (a == "--deterministic" && i + 1 < argc) {
      o->deterministic = std::atoi(argv[++i]) != 0;
    } else {
      std::fprintf(
          stderr,
          "usage: split_bench [--threads N] [--scenes N] [--epochs N] [--batch N] "
          "[--voxel M] [--seed N] [--budget-mib N | --budget-fraction F] "
          "[--deterministic 0|1] [--no-calibration] [--precisions fp32,bf16,fp16] [--json]\n");
      return false;
    }
  }
  if (!(o->voxel > 0) || !(o->budget_fraction > 0 && o->budget_fraction < 1)) {
    std::fprintf(stderr, "split_bench: --voxel must be > 0 and --budget-fraction in (0, 1)\n");
    return false;
  }
  return true;
}

// The dataset and every epoch's batches, prepared once so that both modes
// train on the same ones and the timing holds no data preparation. False
// (after printing why) on an error.
bool PrepareBatches(const Options& o, std::unique_ptr<tw::Dataset>* dataset, tw::LoaderOptions* lo,
                    std::vector<tw::Batch>* batches) {
  trainsup::RunSpec spec;
  spec.data.format = "synthetic";
  spec.data.scenes = o.scenes;
  spec.data.scene_size = "small";
  spec.data.size_distribution = "heavy_tailed";
  spec.data.val_fraction = 0;
  spec.model.in_channels = kInChannels;
  spec.model.num_classes = kClasses;
  spec.model.voxel_size = o.voxel;
  spec.train.seed = o.seed;
  absl::StatusOr<std::unique_ptr<tw::Dataset>> opened = tw::OpenDataset(spec, tw::Split::kTrain);
  if (!opened.ok()) {
    std::fprintf(stderr, "split_bench: %s\n", std::string(opened.status().message()).c_str());
    return false;
  }
  *dataset = std::move(*opened);
  lo->batch_size = o.batch_size;
  lo->seed = static_cast<uint64_t>(o.seed);
  lo->voxel_size = o.voxel;
  tw::Loader loader(dataset->get(), *lo, 0, 0);
  const int64_t n = o.epochs * loader.batches_per_epoch();
  for (int64_t i = 0; i < n; ++i) {
    absl::StatusOr<tw::Batch> b = loader.Next();
    if (!b.ok()) {
      std::fprintf(stderr, "split_bench: %s\n", std::string(b.status().message()).c_str());
      return false;
    }
    batches->push_back(std::move(*b));
  }
  return true;
}

// The batches' rooms: a large room has more than three times the median
// room's voxels.
struct Rooms {
  int64_t median_room = 0, largest_room = 0;
  int normal = -1, large = -1;  // the largest normal batch, the smallest large-room batch
  int64_t large_batches = 0;
  bool HasLarge(const tw::Batch& b) const {
    for (const tw::VoxelScene& s : b.scenes) {
      if (s.voxels() > 3 * median_room) return true;
    }
    return false;
  }
};

Rooms FindRooms(const std::vector<tw::Batch>& batches) {
  Rooms rooms;
  std::vector<int64_t> sorted_rooms;
  for (const tw::Batch& b : batches) {
    for (const tw::VoxelScene& s : b.scenes) sorted_rooms.push_back(s.voxels());
  }
  std::sort(sorted_rooms.begin(), sorted_rooms.end());
  rooms.median_room = sorted_rooms[sorted_rooms.size() / 2];
  rooms.largest_room = sorted_rooms.back();
  for (size_t i = 0; i < batches.size(); ++i) {
    const int64_t v = Voxels(batches[i]);
    if (rooms.HasLarge(batches[i])) {
      ++rooms.large_batches;
      if (rooms.large < 0 || v < Voxels(batches[rooms.large])) rooms.large = static_cast<int>(i);
    } else if (rooms.normal < 0 || v > Voxels(batches[rooms.normal])) {
      rooms.normal = static_cast<int>(i);
    }
  }
  return rooms;
}

// The model, its optimizer and gradient accumulators, and the initial
// weights and buffers with zero momentum.
struct Training {
  ts::MinkUNet net{nullptr};
  std::vector<at::Tensor> params, accum;
  std::unique_ptr<torch::optim::SGD> sgd;
  HostState initial;
};

void SetUpTraining(int64_t seed, Training* tr) {
  torch::manual_seed(seed);
  tr->net = ts::MinkUNet(ts::MinkUNetPlan(14, kInChannels, kClasses));
  tr->net->train();
  tr->params = tr->net->parameters();
  for (const at::Tensor& p : tr->params) tr->accum.push_back(torch::zeros_like(p));
  tr->sgd = std::make_unique<torch::optim::SGD>(
      tr->params, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  for (const at::Tensor& t : tr->net->parameters()) tr->initial.push_back(Bytes(t));
  for (const at::Tensor& t : tr->net->buffers()) tr->initial.push_back(Bytes(t));
  for (const at::Tensor& t : tr->params) tr->initial.emplace_back(t.nbytes(), 0);
}

struct Peaks {
  int64_t rest = 0, normal = 0, large = 0;
};

// Peaks without a budget, in the steady state of training (momentum
// buffers allocated by a first step), absolute: the budget counts
// everything live. False (after printing why) when the first step fails.
bool MeasurePeaks(Training& tr, const std::vector<tw::Batch>& batches, const Rooms& rooms,
                  Peaks* peaks) {
  tw::StepOutcome o;
  int64_t peak = 0;
  if (!TrainStep(*tr.net, *tr.sgd, batches[rooms.normal], tr.params, tr.accum, nullptr, 0, false,
                 &o, &peak))
    return false;
  peaks->rest = ts::GetMemoryStats().current_bytes;
  for (int which : {rooms.normal, rooms.large}) {
    peak = 0;
    tw::ForwardBackward(*tr.net, batches[which], kInChannels, tr.params, tr.accum,
                        tw::SplitOptions(), nullptr, 0, g_features, &peak)
        .IgnoreError();
    (which == rooms.normal ? peaks->normal : peaks->large) = peak;
  }
  return true;
}

void PrintSetup(const Options& o, const Training& tr, const tw::Dataset& dataset,
                const std::vector<tw::Batch>& batches, const Rooms& rooms, const Peaks& peaks,
                int64_t budget) {
  std::printf("split_bench: %d threads (at::set_num_threads), BLAS %s kernels, deterministic %s\n",
              o.threads, ts::BlasCoreName().c_str(), o.deterministic ? "on" : "off");
  std::printf(
      "MinkUNet14 (in %d, out %d, %lld parameters), SGD lr 0.05 momentum 0.9; %s at %g m "
      "voxels, batch %lld, %lld epochs = %zu steps (%lld with a large room); median room "
      "%lld voxels, largest %lld\n",
      kInChannels, kClasses, static_cast<long long>(tr.net->NumParameters()),
      dataset.name().c_str(), o.voxel, static_cast<long long>(o.batch_size),
      static_cast<long long>(o.epochs), batches.size(), static_cast<long long>(rooms.large_batches),
      static_cast<long long>(rooms.median_room), static_cast<long long>(rooms.largest_room));
  std::printf(
      "budget %.0f MiB: a normal batch needs ~%.0f MiB (the largest, %lld voxels), a "
      "large-room batch ~%.0f MiB (the smallest, %lld voxels); at rest (model, "
      "accumulators, momentum) %.0f MiB\n",
      budget / kMiB, peaks.normal / kMiB, static_cast<long long>(Voxels(batches[rooms.normal])),
      peaks.large / kMiB, static_cast<long long>(Voxels(batches[rooms.large])), peaks.rest / kMiB);
}

// Both modes' figures, (b)'s calibration, and the load around the runs.
struct Comparison {
  ModeResult results[2];
  tw::CalibrationStats calibration;
  double calibration_s = 0;
  int64_t calibration_scenes = 0;
  double load_before = 0, load_after = 0;
};

// (b)'s calibration before its first step, on its own (initial) state.
// The momentum buffers exist already, so no optimizer state is to come.
// False (after printing why) on an error.
bool Calibrate(Training& tr, const tw::Dataset& dataset, const tw::LoaderOptions& lo,
               const std::vector<at::Tensor>& live, int64_t budget, HostState* state,
               tw::MemoryModel* memory_model, Comparison* c) {
  Load(*state, live);
  const double t0 = Now();
  absl::StatusOr<tw::CalibrationStats> stats =
      tw::CalibrateMemory(*tr.net, dataset, lo, c->calibration_scenes, kInChannels, tr.params,
                          tr.accum, tw::SplitOptions(), memory_model, budget, /*extra_bytes=*/0,
                          /*height=*/0, g_features);
  c->calibration_s = Now() - t0;
  if (!stats.ok()) {
    std::fprintf(stderr, "split_bench: calibration: %s\n",
                 std::string(stats.status().message()).c_str());
    return false;
  }
  c->calibration = *stats;
  *state = Save(live);
  c->results[1].total.forwards += c->calibration.probes;
  c->results[1].total.oom_events += c->calibration.oom_events;
  c->results[1].total.wasted_forwards += c->calibration.oom_events;
  return true;
}

// A step's split figures added to the mode's totals.
void AddStats(const tw::SplitStats& s, tw::SplitStats* t) {
  t->forwards += s.forwards;
  t->splits += s.splits;
  t->predicted_splits += s.predicted_splits;
  t->retries += s.retries;
  t->oom_events += s.oom_events;
  t->wasted_forwards += s.wasted_forwards;
  t->dropped_pieces += s.dropped_pieces;
  t->dropped_voxels += s.dropped_voxels;
  t->dropped_labelled += s.dropped_labelled;
}

// The two runs from the same initial state (zero momentum is what SGD's
// first step starts from), interleaved step by step, alternating which
// mode goes first, so that both see the same phases of a shared machine.
// False (after printing why) on an error.
bool RunBoth(const Options& o, Training& tr, const tw::Dataset& dataset,
             const tw::LoaderOptions& lo, const std::vector<tw::Batch>& batches, int64_t budget,
             Comparison* c) {
  const std::vector<at::Tensor> live = LiveState(*tr.net, *tr.sgd);
  HostState state[2] = {tr.initial, tr.initial};
  tw::MemoryModel memory_model;  // (b)'s, empty at the start
  ModeResult* results = c->results;
  double loss_sum[2] = {0, 0};
  int64_t loss_steps[2] = {0, 0};
  c->load_before = LoadAverage();
  // The allocator as the worker sets it up for this budget (block cache
  // counted in it).
  ts::ApplyAllocatorSettings(ts::TrainingAllocatorSettings(budget));
  c->calibration_scenes = std::min<int64_t>(8, 2 * o.batch_size);
  if (o.calibrate && !Calibrate(tr, dataset, lo, live, budget, &state[1], &memory_model, c)) {
    return false;
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const tw::Batch& batch = batches[i];
    for (int turn = 0; turn < 2; ++turn) {
      const int mode = (turn + static_cast<int>(i)) % 2;
      const bool baseline = mode == 0;
      ModeResult& r = results[mode];
      if (!baseline && r.ready_step < 0 && memory_model.ready()) r.ready_step = r.steps;
      Load(state[mode], live);
      tw::StepOutcome so;
      const double t0 = Now();
      if (!TrainStep(*tr.net, *tr.sgd, batch, tr.params, tr.accum,
                     baseline ? nullptr : &memory_model, budget, baseline, &so, &r.peak)) {
        return false;
      }
      r.seconds += Now() - t0;
      state[mode] = Save(live);
      r.steps++;
      r.scenes += static_cast<int64_t>(batch.scenes.size());
      r.voxels += Voxels(batch);
      AddStats(so.stats, &r.total);
      r.per_step.push_back(so.stats);
      if (batch.epoch == o.epochs - 1) {
        loss_sum[mode] += so.loss;
        loss_steps[mode]++;
      }
    }
  }
  ts::SetMemoryBudget(0);
  c->load_after = LoadAverage();
  for (int mode = 0; mode < 2; ++mode) {
    ModeResult& r = results[mode];
    r.last_epoch_loss =
        loss_steps[mode] > 0 ? loss_sum[mode] / static_cast<double>(loss_steps[mode]) : 0;
  }
  return true;
}

// Wasted forward passes of both modes, overall and from the step on which
// (b)'s model was ready (ready: that step, 0-based; -1 when never).
struct Waste {
  int64_t wa = 0, wb = 0;
  int64_t ready = -1;
  int64_t wa_ready = 0, wb_ready = 0;
};

Waste CountWaste(const Comparison& c, size_t steps) {
  Waste w;
  w.wa = c.results[0].total.wasted_forwards;
  w.wb = c.results[1].total.wasted_forwards;
  w.ready = c.results[1].ready_step;
  if (w.ready >= 0) {
    for (size_t i = static_cast<size_t>(w.ready); i < steps; ++i) {
      w.wa_ready += c.results[0].per_step[i].wasted_forwards;
      w.wb_ready += c.results[1].per_step[i].wasted_forwards;
    }
  }
  return w;
}

void PrintJson(const Options& o, size_t steps, const Rooms& rooms, const Peaks& peaks,
               int64_t budget, const Comparison& c, const Waste& w) {
  const char* keys[2] = {"baseline", "ours"};
  std::ostringstream js;
  js << "{\"threads\": " << o.threads << ", \"blas_core\": \"" << ts::BlasCoreName()
     << "\", \"deterministic\": " << (o.deterministic ? "true" : "false")
     << ", \"scenes\": " << o.scenes << ", \"voxel\": " << o.voxel
     << ", \"batch\": " << o.batch_size << ", \"steps\": " << steps
     << ", \"large_batches\": " << rooms.large_batches << ", \"budget_mib\": " << budget / kMiB
     << ", \"normal_batch_mib\": " << peaks.normal / kMiB
     << ", \"large_batch_mib\": " << peaks.large / kMiB << ", \"rest_mib\": " << peaks.rest / kMiB
     << ", \"load_before\": " << c.load_before << ", \"load_after\": " << c.load_after
     << ", \"calibration\": {\"probes\": " << c.calibration.probes
     << ", \"oom_events\": " << c.calibration.oom_events
     << ", \"largest_voxels\": " << c.calibration.largest_voxels
     << ", \"largest_peak_mib\": " << c.calibration.largest_peak / kMiB
     << ", \"seconds\": " << c.calibration_s
     << ", \"scenes\": " << (o.calibrate ? c.calibration_scenes : 0) << "}";
  for (int m = 0; m < 2; ++m) {
    const ModeResult& r = c.results[m];
    const std::string k = keys[m];
    js << ", \"" << k << "\": {\"steps\": " << r.steps
       << ", \"scenes_per_s\": " << r.scenes / r.seconds << ", \"seconds\": " << r.seconds
       << ", \"forwards\": " << r.total.forwards << ", \"splits\": " << r.total.splits
       << ", \"predicted_splits\": " << r.total.predicted_splits
       << ", \"oom_events\": " << r.total.oom_events
       << ", \"wasted_forwards\": " << r.total.wasted_forwards
       << ", \"dropped_pieces\": " << r.total.dropped_pieces
       << ", \"dropped_voxels\": " << r.total.dropped_voxels
       << ", \"dropped_labelled\": " << r.total.dropped_labelled
       << ", \"peak_mib\": " << r.peak / kMiB << ", \"last_epoch_loss\": " << r.last_epoch_loss
       << "}";
  }
  js << ", \"model_ready_step\": " << (w.ready >= 0 ? w.ready + 1 : -1)
     << ", \"wasted_from_ready_baseline\": " << w.wa_ready
     << ", \"wasted_from_ready_ours\": " << w.wb_ready;
  js << ", \"wasted_ratio\": ";
  if (w.wb > 0) {
    js << static_cast<double>(w.wa) / static_cast<double>(w.wb);
  } else {
    js << "null";
  }
  js << "}";
  std::printf("%s\n", js.str().c_str());
}

// The text report's first part: (b)'s calibration and the steps that split
// or ran out of memory.
void PrintCalibrationAndSteps(const Options& o, const std::vector<tw::Batch>& batches,
                              const Rooms& rooms, const Comparison& c) {
  if (o.calibrate) {
    std::printf(
        "(b) calibrated before its first step: %lld probes cut from the first %lld scenes, up to "
        "%lld voxels (peak %.0f MiB), %lld out of memory, %.1f s (counted in (b)'s forward passes, "
        "not "
        "in its scenes/s); model ready: %s\n",
        static_cast<long long>(c.calibration.probes), static_cast<long long>(c.calibration_scenes),
        static_cast<long long>(c.calibration.largest_voxels), c.calibration.largest_peak / kMiB,
        static_cast<long long>(c.calibration.oom_events), c.calibration_s,
        c.results[1].ready_step == 0 ? "yes" : "no");
  } else {
    std::printf("(b) not calibrated (--no-calibration): the memory model starts empty\n");
  }
  std::printf("steps with splits or OOMs (forwards / OOM events / dropped voxels):\n");
  for (size_t i = 0; i < batches.size(); ++i) {
    const tw::SplitStats& a = c.results[0].per_step[i];
    const tw::SplitStats& b = c.results[1].per_step[i];
    if (a.splits + b.splits + a.oom_events + b.oom_events == 0) continue;
    std::printf("  step %2zu (%6lld voxels%s): (a) %lld / %lld / %lld   (b) %lld / %lld / %lld%s\n",
                i + 1, static_cast<long long>(Voxels(batches[i])),
                rooms.HasLarge(batches[i]) ? ", large room" : "",
                static_cast<long long>(a.forwards), static_cast<long long>(a.oom_events),
                static_cast<long long>(a.dropped_voxels), static_cast<long long>(b.forwards),
                static_cast<long long>(b.oom_events), static_cast<long long>(b.dropped_voxels),
                b.predicted_splits > 0 ? "  (predicted split)" : "");
  }
}

// The text report's second part: each mode's figures, then the comparison.
void PrintModesAndWaste(const Comparison& c, const Waste& w) {
  const char* names[2] = {"(a) baseline: reactive, midpoint halving, 500-point floor",
                          "(b) ours: predictive memory model + median bisection"};
  for (int m = 0; m < 2; ++m) {
    const ModeResult& r = c.results[m];
    std::printf("%s\n", names[m]);
    std::printf("  %lld steps, %lld scenes in %.1f s of steps = %.2f scenes/s\n",
                static_cast<long long>(r.steps), static_cast<long long>(r.scenes), r.seconds,
                r.scenes / r.seconds);
    std::printf(
        "  forward passes %lld, splits %lld (%lld predicted), OOM events %lld, wasted forward "
        "passes %lld\n",
        static_cast<long long>(r.total.forwards), static_cast<long long>(r.total.splits),
        static_cast<long long>(r.total.predicted_splits),
        static_cast<long long>(r.total.oom_events),
        static_cast<long long>(r.total.wasted_forwards));
    std::printf(
        "  dropped pieces %lld, dropped points (voxels) %lld of %lld (%lld labelled); peak %.0f "
        "MiB; last-epoch mean loss %.3f\n",
        static_cast<long long>(r.total.dropped_pieces),
        static_cast<long long>(r.total.dropped_voxels), static_cast<long long>(r.voxels),
        static_cast<long long>(r.total.dropped_labelled), r.peak / kMiB, r.last_epoch_loss);
  }
  std::printf(
      "scenes/s: one measurement on a shared machine (load average %.1f before, %.1f after), "
      "the modes' steps interleaved so both see the same load; the counts are exact\n",
      c.load_before, c.load_after);
  if (w.ready >= 0) {
    std::printf(
        "(b)'s memory model was ready from step %lld on; wasted forward passes from there: (a) "
        "%lld, "
        "(b) %lld\n",
        static_cast<long long>(w.ready + 1), static_cast<long long>(w.wa_ready),
        static_cast<long long>(w.wb_ready));
  } else {
    std::printf("(b)'s memory model never became ready (fewer than %d observations)\n",
                tw::MemoryModel::kMinObservations);
  }
  if (w.wb > 0) {
    std::printf("wasted forward passes (a)/(b): %lld / %lld = %.1fx\n",
                static_cast<long long>(w.wa), static_cast<long long>(w.wb),
                static_cast<double>(w.wa) / static_cast<double>(w.wb));
  } else {
    std::printf("wasted forward passes (a)/(b): %lld / 0 (ours wasted none)\n",
                static_cast<long long>(w.wa));
  }
}

}  // namespace

int main(int argc, char** argv) {
  ts::EnsureFastBlasKernels(argc, argv);
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 64;
  at::set_num_threads(o.threads);
  ts::InstallCountingAllocator();
  ts::SetDeterministic(o.deterministic);

  std::unique_ptr<tw::Dataset> dataset;
  tw::LoaderOptions lo;
  std::vector<tw::Batch> batches;
  if (!PrepareBatches(o, &dataset, &lo, &batches)) return 1;
  const Rooms rooms = FindRooms(batches);
  if (rooms.normal < 0 || rooms.large < 0) {
    std::fprintf(stderr, "split_bench: need both normal and large-room batches\n");
    return 1;
  }

  Training tr;
  SetUpTraining(o.seed, &tr);
  Peaks peaks;
  if (!MeasurePeaks(tr, batches, rooms, &peaks)) return 1;
  const int64_t budget =
      o.budget_mib > 0
          ? o.budget_mib << 20
          : peaks.normal + static_cast<int64_t>(o.budget_fraction * (peaks.large - peaks.normal));
  if (!o.json) PrintSetup(o, tr, *dataset, batches, rooms, peaks, budget);

  // Each precision from the same initial state, under the same budget.
  for (const std::string& precision : o.precisions) {
    // fp16 without a loss scaler here: the benchmark counts splits, and
    // its SGD steps take the gradient as it comes.
    g_features = precision == "bf16" ? at::kBFloat16 : precision == "fp16" ? at::kHalf : at::kFloat;
    Comparison c;
    if (!RunBoth(o, tr, *dataset, lo, batches, budget, &c)) return 1;
    const Waste w = CountWaste(c, batches.size());
    if (o.json) {
      std::printf("%s: ", precision.c_str());
      PrintJson(o, batches.size(), rooms, peaks, budget, c, w);
      continue;
    }
    std::printf("==== precision %s: %s\n", precision.c_str(),
                ts::DescribePrecision(g_features, c10::Device(c10::DeviceType::CPU)).c_str());
    PrintCalibrationAndSteps(o, batches, rooms, c);
    PrintModesAndWaste(c, w);
  }
  return 0;
}
