// The training loop of trainsup-worker: a MinkUNet from the engine on a
// dataset from the run spec, under a memory budget, with batches split
// instead of crashing when they do not fit (worker/split/split.h), checkpoints
// through the checkpoint library, and exact resume. One step's passes
// and the memory calibration are worker/split/step.h. The process around it
// (arguments, signals, the supervisor link, exit files) is worker_main.cc.
//
// The attempt ends with one of the worker contract's exit codes
// (contracts/exit_codes.h, the one list: why each is used is written there)
// in TrainerResult; any other exception
// propagates (a crash, with its message in the log). With world_size > 1
// the ranks train data-parallel (worker/gang/distributed.h, docs/distributed.md). A periodic
// checkpoint that fails ends nothing: it is reported (checkpoint_failed, the heartbeat's
// checkpoint_failures and last_checkpoint_error) and tried again at the next interval.
#ifndef TRAINSUP_WORKER_TRAIN_TRAINER_H_
#define TRAINSUP_WORKER_TRAIN_TRAINER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "contracts/exit_file.h"
#include "contracts/spec.h"
#include "trainsup/v1/supervisor.pb.h"
#include "worker/dataset/dataset.h"
#include "worker/dataset/loader.h"
#include "worker/split/split.h"

namespace trainsup::ckpt {
class FileSystem;
}

namespace trainsup::worker {

struct TrainerOptions {
  std::string run_dir;
  int rank = 0;
  int world_size = 1;
  int attempt = 1;
  // The gang's rendezvous (world_size > 1): rank 0 hosts the store there
  // (MASTER_ADDR, MASTER_PORT of the launch contract).
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // Where Gloo binds (GangOptions): TRAINSUP_NODE_ADDR, GLOO_SOCKET_IFNAME.
  std::string node_addr;
  std::string gloo_ifname;
  // "latest" (the newest verified checkpoint, or from scratch when there is
  // none), "none", or a step number that must exist and verify.
  std::string resume = "latest";
  // > 0: replaces train.memory_budget_mb (the supervisor lowers it after an
  // out-of-memory exit: TRAINSUP_MEMORY_BUDGET_MB).
  int64_t memory_budget_mb_override = 0;
  // The supervisor's data roots (TRAINSUP_DATA_ROOTS, contracts/data_roots.h):
  // every data file and folder is confined to them as it is opened. Unset:
  // no confinement.
  std::optional<std::vector<std::string>> data_roots;
  // A rollback's (TRAINSUP_SKIP_WINDOWS, TRAINSUP_LR_FACTOR; docs/guard.md):
  // steps skipped besides the spec's data.skip_windows, and the learning
  // rate's factor.
  std::vector<StepWindow> skip_windows;
  double lr_factor = 1;
  // Where checkpoints are written and read; null: the POSIX file system
  // (tests pass a fault-injecting one).
  ckpt::FileSystem* file_system = nullptr;
};

// How the loop talks to the world; every hook may be empty.
struct TrainerHooks {
  std::function<void(const ::trainsup::v1::Progress&)> progress;  // a snapshot for the heartbeats
  std::function<void()> advance;                                  // the progress counter
  // kind is a v1::EventKind (CHECKPOINT, OOM_SPLIT, LOG).
  std::function<void(::trainsup::v1::EventKind kind, int64_t step, int64_t checkpoint_step,
                     const std::string& message)>
      event;
  // A checkpoint of `step` could not be written (`error`); training goes
  // on, and `last_good` (-1: none) is still the newest checkpoint.
  std::function<void(int64_t step, int64_t last_good, const std::string& error)> checkpoint_failed;
  std::function<bool()> stop_requested;         // SIGTERM or a Stop command
  std::function<bool()> checkpoint_requested;   // CheckpointNow (consumed)
  std::function<void(bool)> pause_heartbeats;   // fault injection: freeze
  std::function<void(const std::string&)> log;  // one line for the rank's log
};

// `t` as the API's message (a heartbeat's progress, the exit report).
void FillTally(const TrainingTally& t, ::trainsup::v1::TrainingTally* out);

struct TrainerResult {
  int exit_code = 0;
  std::string reason;   // completed | stopped | usage | data | oom | ...
  std::string message;  // for people
  int64_t last_step = -1;
  int64_t first_bad_step = -1;  // diverged (79): the first bad step (docs/guard.md)
  // Final evaluation on the validation split (when there is one).
  double val_miou = -1;
  double baseline_miou = -1;  // predicting the training split's majority class
  double val_accuracy = -1;
  // Exit 0: what the run trained (rank 0's is the run's).
  TrainingTally tally;
};

// The device a run trains on, from train.device and whether this worker
// has a CUDA device (LibTorch with CUDA, a device that CUDA_VISIBLE_DEVICES
// shows): "cpu" and "auto" without CUDA give the CPU, "auto" and "cuda"
// with it cuda:0; "cuda" without it is InvalidArgument (exit 64).
absl::StatusOr<c10::Device> TrainingDevice(const std::string& device, bool cuda_available);

// Trains according to `spec`. Returns the outcome; throws only for what is
// not an out-of-memory error, a bad spec or unreadable data.
TrainerResult Train(const RunSpec& spec, const TrainerOptions& options, const TrainerHooks& hooks);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_TRAIN_TRAINER_H_
