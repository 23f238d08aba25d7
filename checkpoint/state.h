// Training state in a checkpoint: the model's parameters and buffers
// (model.safetensors), the optimizer's state (optimizer.safetensors: SGD
// momentum buffers, AdamW moments and step counts, every group's learning
// rate) and the trainer's (trainer.json: step, epoch, data cursor, RNG
// states). Saving is split in two: Snapshot() copies to host memory on the
// training thread; writing happens elsewhere (AsyncCheckpointer).
// LibTorch part of checkpoint/.
#ifndef TRAINSUP_CHECKPOINT_STATE_H_
#define TRAINSUP_CHECKPOINT_STATE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace trainsup::ckpt {

inline constexpr char kModelFile[] = "model.safetensors";
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kTrainerFile[] = "trainer.json";

struct TrainerState {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t cursor = 0;             // position in the epoch's data order
  std::string cpu_rng_state;      // LibTorch's default CPU generator (bytes)
  std::string data_rng_state;     // the data pipeline's RNG, opaque bytes
  std::string extra_json = "{}";  // anything else the trainer keeps (a JSON object)
};

// Everything a checkpoint holds, as host copies owned by the snapshot.
struct StateSnapshot {
  int64_t step = 0;
  NamedTensors model;
  NamedTensors optimizer;
  std::map<std::string, std::string> optimizer_metadata;
  TrainerState trainer;
  uint64_t bytes() const;
};

// Copies the state to host memory; the training loop may go on changing
// the originals. The copies are malloc'd, outside LibTorch's CPU allocator,
// so a training memory budget (sparse/memory.h counts that allocator) does
// not see them: on a GPU they are not device memory, and on the CPU they
// are not the step's. With copy = false, CPU tensors are shared instead (for a
// synchronous save that finishes before training goes on). Supports
// torch::optim::SGD and torch::optim::AdamW; anything else gives
// InvalidArgument. Fills trainer.cpu_rng_state from LibTorch's generator.
absl::StatusOr<StateSnapshot> Snapshot(const torch::nn::Module& model,
                                       const torch::optim::Optimizer& optimizer,
                                       TrainerState trainer, bool copy = true);

// Synchronous save: writes the live state (no copy) as checkpoint
// trainer.step.
absl::Status SaveState(CheckpointStore& store, const torch::nn::Module& model,
                       const torch::optim::Optimizer& optimizer, TrainerState trainer);

// FailedPrecondition naming the first tensor of the snapshot (weights,
// then optimizer state) that holds a NaN or an infinity, and how many.
absl::Status CheckFinite(const StateSnapshot& snapshot);

// Writes and commits a snapshot as checkpoint `snapshot.step`; a snapshot
// with a non-finite value is refused (CheckFinite) before anything is
// written.
absl::Status WriteSnapshot(CheckpointStore& store, const StateSnapshot& snapshot);

// Lower-case hex of `bytes`, and back (false for text that is not hex of
// whole bytes): how trainer.json holds generator states.
std::string ToHex(const std::string& bytes);
bool FromHex(const std::string& hex, std::string* out);

// LibTorch's default CPU generator's state as bytes, and setting it from
// such bytes: FailedPrecondition naming the problem, and nothing changed,
// when LibTorch would reject them (a wrong size, an all-zero state). For
// states LoadState does not restore (e.g. the ranks of a gang but rank 0).
std::string CpuGeneratorState();
absl::Status SetCpuGeneratorState(const std::string& bytes);

// Loads a committed (verified) checkpoint into `model`, `optimizer` and
// `trainer`, and restores LibTorch's CPU generator. Everything is read and
// checked against the model and optimizer first (every key present, no
// extra key, shapes and dtypes equal): on error nothing has been changed,
// and the message names the offending key. A file that cannot be read for
// a reason other than its content is Unavailable (CheckpointReadError): an
// I/O error, not a verdict on the checkpoint.
absl::Status LoadState(CheckpointStore& store, const CheckpointInfo& checkpoint,
                       torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                       TrainerState* trainer);

// A write AsyncCheckpointer finished: the checkpoint's step, how it went,
// and the seconds it took on the writer thread.
struct WriteResult {
  int64_t step = -1;
  absl::Status status;
  double seconds = 0;
};

// Writes snapshots on a background thread, one at a time: the worker's
// background checkpoints (docs/checkpoints.md). A finished write's result
// is kept until it is taken (Save, Poll or Wait), so none is lost; a write
// that fails has committed nothing (WriteSnapshot).
class AsyncCheckpointer {
 public:
  // `before_write`, if set, runs on the writer thread before each write
  // (fault injection: slow storage).
  explicit AsyncCheckpointer(CheckpointStore* store, std::function<void()> before_write = {});
  ~AsyncCheckpointer();  // waits for the write in flight
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Waits for the write in flight, if any, then hands `snapshot` to the
  // writer. Returns the result that was waiting to be taken, if any.
  std::optional<WriteResult> Save(StateSnapshot snapshot);
  // The finished write's result, if one waits to be taken; never blocks.
  std::optional<WriteResult> Poll();
  // Waits for the write in flight, if any, then as Poll.
  std::optional<WriteResult> Wait();
  bool in_flight() const;

 private:
  void Run();

  CheckpointStore* store_;
  std::function<void()> before_write_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;
  bool stop_ = false;
  std::unique_ptr<StateSnapshot> next_;
  std::optional<WriteResult> finished_;
  std::thread thread_;
};

}  // namespace trainsup::ckpt

#endif  // TRAINSUP_CHECKPOINT_STATE_H_
