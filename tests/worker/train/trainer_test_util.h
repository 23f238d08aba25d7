// Helpers of the training loop's tests (trainer_test.cc,
// trainer_checkpoint_test.cc): run directories, what Train() told its
// hooks, a synthetic spec, and checkpoints through the fault-injecting
// file system.
#ifndef TRAINSUP_TESTS_WORKER_TRAIN_TRAINER_TEST_UTIL_H_
#define TRAINSUP_TESTS_WORKER_TRAIN_TRAINER_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/store.h"
#include "sparse/memory.h"
#include "sparse/minkunet.h"
#include "tests/checkpoint/fault_injection_fs.h"
#include "tests/worker/split/step_test_util.h"
#include "worker/train/trainer.h"

namespace trainsup::worker {

// Removes the process-wide budget and block cache however the test ends.
struct BudgetGuard {
  ~BudgetGuard() { sparse::ApplyAllocatorSettings(sparse::AllocatorSettings{}); }
};

// Bytes of the float32 parameters of the MinkUNet14 Train() builds.
inline int64_t ParameterBytes(int channels, int classes) {
  sparse::MinkUNet model(sparse::MinkUNetPlan(14, channels, classes));
  return model->NumParameters() * static_cast<int64_t>(sizeof(float));
}

// A fresh run directory under the test's temporary directory.
inline std::string RunDir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              ("trainer_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// What Train() told its hooks.
struct Captured {
  std::vector<std::string> logs;
  std::vector<std::pair<v1::EventKind, std::string>> events;
  int64_t peak = 0;
  int64_t splits = 0, retries = 0, wasted = 0, dropped = 0;
  sparse::MemoryStats after;  // the allocator's counters when Train returned
  TrainerHooks Hooks() {
    TrainerHooks h;
    h.log = [this](const std::string& line) {
      // TRAINER_TEST_VERBOSE=1 echoes the trainer's log lines.
      if (std::getenv("TRAINER_TEST_VERBOSE") != nullptr) std::printf("  | %s\n", line.c_str());
      logs.push_back(line);
    };
    h.event = [this](v1::EventKind kind, int64_t, int64_t, const std::string& message) {
      events.emplace_back(kind, message);
    };
    h.progress = [this](const v1::Progress& p) {
      peak = std::max(peak, p.memory_peak_bytes());
      splits = p.splits();
      retries = p.oom_retries();
      wasted = p.wasted_forwards();
      dropped = p.dropped_pieces();
    };
    return h;
  }
};

inline TrainerResult RunTrain(const RunSpec& spec, const std::string& name, Captured* captured) {
  TrainerOptions options;
  options.run_dir = RunDir(name);
  options.resume = "none";
  TrainerResult r = Train(spec, options, captured->Hooks());
  captured->after = sparse::GetMemoryStats();
  // Train leaves its allocator settings installed.
  sparse::ApplyAllocatorSettings(sparse::AllocatorSettings{});
  std::filesystem::remove_all(options.run_dir);
  return r;
}

inline RunSpec SyntheticSpec(int64_t scenes, double voxel_size, int64_t steps) {
  RunSpec spec;
  spec.model.arch = "minkunet14";
  spec.model.in_channels = kChannels;
  spec.model.voxel_size = voxel_size;
  spec.data.format = "synthetic";
  spec.data.scenes = scenes;
  spec.data.scene_size = "small";
  spec.data.val_fraction = 0;
  spec.train.steps = steps;
  spec.train.batch_size = 2;
  spec.train.checkpoint_every_steps = 0;
  return spec;
}

// Checkpoints through the fault-injecting file system (a full disk from a
// chosen save on). What the trainer reported, and the run directory.
struct CheckpointFaults {
  explicit CheckpointFaults(const std::string& name) : run_dir(RunDir(name)) {}
  ~CheckpointFaults() { std::filesystem::remove_all(run_dir); }

  // Trains `spec`; the disk fills up once checkpoint `full_after` is
  // committed, and gets space back after `failures_until_space` failed
  // saves (-1: never).
  TrainerResult Train(const RunSpec& spec, int64_t full_after, int failures_until_space) {
    TrainerOptions options;
    options.run_dir = run_dir;
    options.resume = "none";
    options.file_system = &disk;
    TrainerHooks hooks = captured.Hooks();
    hooks.event = [&, inner = hooks.event](v1::EventKind kind, int64_t step,
                                           int64_t checkpoint_step, const std::string& message) {
      inner(kind, step, checkpoint_step, message);
      if (kind == v1::EVENT_KIND_CHECKPOINT && checkpoint_step == full_after) disk.space_left = 0;
    };

    hooks.checkpoint_failed = [&](int64_t step, int64_t last_good, const std::string& error) {
      failed.push_back({step, last_good, error});
      if (static_cast<int>(failed.size()) == failures_until_space) disk.space_left = -1;
    };
    hooks.progress = [&, inner = hooks.progress](const v1::Progress& p) {
      inner(p);
      reports.push_back(p);
    };
    TrainerResult r = worker::Train(spec, options, hooks);
    sparse::SetMemoryBudget(0);
    return r;
  }

  bool Committed(int64_t step) const {
    return std::filesystem::exists(std::filesystem::path(run_dir) / "checkpoints" /
                                   ("step-" + std::to_string(step)));
  }

  struct Failure {
    int64_t step, last_good;
    std::string error;
  };
  std::string run_dir;
  ckpt::testing::FaultInjectionFileSystem disk;
  Captured captured;
  std::vector<Failure> failed;
  std::vector<v1::Progress> reports;
};

// The index of the first log line that starts with `prefix` (-1: none).
inline int64_t FirstLine(const std::vector<std::string>& logs, const std::string& prefix) {
  for (size_t i = 0; i < logs.size(); ++i) {
    if (logs[i].rfind(prefix, 0) == 0) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace trainsup::worker

#endif  // TRAINSUP_TESTS_WORKER_TRAIN_TRAINER_TEST_UTIL_H_
