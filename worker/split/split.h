// Batch splitting under a memory budget, torch-free: which groups of which
// pieces of which scenes to run forward+backward on, in what order, with what
// gradient weight, and what to do when one runs out of memory. The trainer
// supplies the effect (a RunGroup that runs the model and turns
// c10::OutOfMemoryError into absl::ResourceExhaustedError); everything here
// is a function of data, so it is tested with a simulated memory.
//
// Nothing here catches exceptions: an exception thrown by RunGroup or
// free_memory propagates unchanged to the caller.
#ifndef TRAINSUP_WORKER_SPLIT_SPLIT_H_
#define TRAINSUP_WORKER_SPLIT_SPLIT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainsup::worker {

// One voxelized scene of a batch, borrowed from the caller: `n` rows of int32
// voxel coordinates (xyz[3*i .. 3*i+2] = x y z) and per-row label flags
// (1: the voxel has a label, 0: ignore label). `labelled` may be null: every
// voxel counts as labelled.
struct SceneView {
  const int32_t* xyz = nullptr;
  int64_t n = 0;
  const uint8_t* labelled = nullptr;
};

// A subset of one scene's rows: all of them when `all` (then `rows` is
// empty), else `rows`, ascending. `voxels` and `labelled` count the subset;
// `depth` is the number of bisections that produced it.
struct Piece {
  int scene = 0;
  bool all = true;
  std::vector<int64_t> rows;
  int64_t voxels = 0;
  int64_t labelled = 0;
  int depth = 0;
};

// A group of pieces run in one forward+backward.
using Group = std::vector<Piece>;

// The whole of scene `index`.
Piece WholeScene(int index, const SceneView& scene);
int64_t GroupVoxels(const Group& group);
int64_t GroupLabelled(const Group& group);

// Splits `piece` (of `scene`, which must be the scene it indexes) in two
// along the axis of its longest bounding-box extent (ties: x before y before
// z) at the median: the first half holds the floor(n/2) rows that come first
// when ordered by that axis, then by the two others, then by row index; the
// second holds the rest. The halves partition the piece's rows exactly, each
// ascending, and both are non-empty whenever n >= 2, including when points
// share coordinates (identical points split by row order). Children have
// depth + 1 and their own voxel and labelled counts. With n < 2 the first
// half is empty.
std::pair<Piece, Piece> BisectPiece(const Piece& piece, const SceneView& scene);

struct SplitOptions {
  // The floor: a piece of at most this many voxels is never bisected; if it
  // still runs out of memory it is dropped and reported.
  int64_t min_piece_voxels = 500;
  // The model's coarsest tensor stride (MinkUNet: 16). A piece is bisected
  // only if each half keeps at least two voxels at that stride, since
  // BatchNorm in training needs two rows per channel on every level; a
  // piece that cannot be cut so counts as at the floor. 1: no such check.
  int32_t coarsest_stride = 1;
  // More out-of-memory failures than this within one batch is a hard OOM
  // (memory that freeing does not bring back).
  int max_ooms_per_batch = 64;
  // Predictive planning keeps each group's predicted peak <= safety * budget.
  double safety = 0.9;
};

// What splitting did for one batch (or, summed by the caller, for a run).
struct SplitStats {
  int64_t forwards = 0;          // calls of RunGroup, successful or not
  int64_t splits = 0;            // groups or pieces cut in two, for any reason
  int64_t predicted_splits = 0;  // of those, cut up front because predicted not to fit
  int64_t retries = 0;           // RunGroup calls on work that had already run out of memory
  int64_t oom_events = 0;        // RunGroup calls that returned ResourceExhausted
  // Forward passes whose work was discarded. Equal to oom_events here; kept
  // apart because the trainer also counts OOMs outside the splittable region
  // (optimizer step, checkpointing), which waste no forward pass.
  int64_t wasted_forwards = 0;
  // Seconds of the RunGroup calls that ran out of memory: work thrown away.
  // Measured by the caller that runs the model (ForwardBackward); 0 here.
  double wasted_seconds = 0;
  int64_t dropped_pieces = 0;  // pieces at the floor that still did not fit
  int64_t dropped_voxels = 0;
  int64_t dropped_labelled = 0;
  std::vector<std::string> drop_reasons;  // one per dropped piece, for logs and events
  // The smallest splittable group that ran out of memory; 0 when none (for
  // MemoryModel::ObserveFailure).
  int64_t smallest_failed_voxels = 0;
};

// Runs forward+backward on `group`, adding `weight` times the gradient of the
// group's mean loss over its labelled voxels to the parameters' gradients.
// Returns ResourceExhausted when out of memory, and must then have left no
// gradient behind (e.g. compute the group's gradients with
// torch::autograd::grad and add them only on success); any other error is a
// real failure.
using RunGroup = std::function<absl::Status(const Group& group, double weight)>;

// How peak memory grows with the work: a least-squares fit
// peak ~ a + b * voxels (+ c * pairs) over the most recent observations,
// refitted on every observation, plus a margin (the 95th-percentile
// residual by nearest rank, so the maximum while there are fewer than 20
// observations) that makes predictions conservative. `pairs` is any measure
// of kernel-map size the caller computes the same way when observing and
// predicting; negative means unknown. The pairs term is used only while
// every observation in the history has it and it is not collinear with
// voxels; an unknown `pairs` in Predict is estimated from the history's
// pairs-per-voxel ratio. Copyable; part of the checkpointed trainer state.
class MemoryModel {
 public:
  static constexpr int kDefaultCapacity = 256;
  static constexpr int kMinObservations = 8;

  explicit MemoryModel(int capacity = kDefaultCapacity);

  // Records the peak memory of a successful forward+backward over `voxels`
  // voxels. Observations with voxels <= 0 or peak_bytes < 0 are ignored.
  // The oldest observation is forgotten beyond the capacity.
  void Observe(int64_t voxels, int64_t pairs, int64_t peak_bytes);
  // At least kMinObservations observations with at least two distinct voxel
  // counts.
  bool ready() const;
  // Predicted peak bytes, margin included, never negative. Meaningful only
  // when ready().
  int64_t Predict(int64_t voxels, int64_t pairs = -1) const;
  int observations() const { return static_cast<int>(history_.size()); }
  // Records that splittable work of `voxels` voxels ran out of memory under
  // the run's budget. PlanGroups then splits anything that large up front,
  // even before the fit is ready (the first large scenes come early).
  void ObserveFailure(int64_t voxels);
  // The smallest such size seen; 0 when none.
  int64_t min_failed_voxels() const { return min_failed_voxels_; }

  // A text form holding the capacity and the observations, oldest first;
  // Deserialize(Serialize()) predicts exactly as the original.
  std::string Serialize() const;
  // InvalidArgument naming what is wrong with malformed text.
  static absl::StatusOr<MemoryModel> Deserialize(const std::string& text);

 private:
  struct Observation {
    int64_t voxels;
    int64_t pairs;
    int64_t peak;
  };
  void Refit();

  int capacity_;
  std::deque<Observation> history_;
  bool use_pairs_ = false;
  double a_ = 0, b_ = 0, c_ = 0;
  double pairs_per_voxel_ = 0;
  double margin_ = 0;
  int64_t min_failed_voxels_ = 0;
};

// The labelled voxels of `scenes`.
int64_t BatchLabelled(const std::vector<SceneView>& scenes);

// The groups to run for a batch when `model` is ready: scenes whose
// predicted peak exceeds safety * budget are bisected until predicted to fit
// or at the floor, then the pieces are packed first-fit in decreasing voxel
// order into groups predicted to fit. Each cut (a bisection, or each group
// beyond the first) adds to stats->splits and stats->predicted_splits when
// `stats` is not null. When the model is not ready: one group of every
// scene. Pieces partition the batch.
std::vector<Group> PlanGroups(const std::vector<SceneView>& scenes, const MemoryModel& model,
                              int64_t budget_bytes, const SplitOptions& options, SplitStats* stats);

// Runs one optimizer step's worth of forward+backward over the batch
// `scenes`. The first groups are PlanGroups' (with `predictor` null or not
// ready: one group of all scenes). Groups run depth-first, in order; each
// call gets weight labelled(group) / labelled(batch) (0 when the batch has no
// labelled voxel), so the accumulated gradient is the unsplit batch's.
//
// When `run` returns ResourceExhausted: free_memory is called (if set), then
// a group of several pieces is cut into two groups of pieces balanced by
// voxel count, and a single piece is bisected (BisectPiece); both halves are
// retried, first half first. Work not yet run that is at least as large (in
// voxels) as the smallest splittable group that failed in this batch is cut
// before it is run, without a forward pass. A piece at the floor that runs
// out of memory is dropped: counted in the stats with a reason, and the rest
// of the batch still runs; the caller reports it.
//
// Returns the stats; `run`'s first error other than ResourceExhausted,
// unchanged and without any retry; or ResourceExhausted (a hard OOM) when
// the batch has had more than options.max_ooms_per_batch out-of-memory
// failures. Gradients of groups that succeeded stay accumulated on error.
absl::StatusOr<SplitStats> RunSplitting(const std::vector<SceneView>& scenes,
                                        const SplitOptions& options, const RunGroup& run,
                                        const std::function<void()>& free_memory,
                                        const MemoryModel* predictor, int64_t budget_bytes);

// Calibration before the first step. The model learns from every
// successful forward+backward, so without calibration the first large
// batches of a run still run out of memory: nothing seen before them
// foretells their peak. CalibrateMemoryModel measures a few probes of
// growing size through the real model first (the caller's ProbeRun), so
// the fit is ready from the first step on.

// Runs forward+backward over `group` with no lasting effect (no gradient
// kept, no statistic updated) and returns its peak bytes as the trainer
// measures them for MemoryModel::Observe (absolute, through the allocator's
// memory statistics); ResourceExhausted when out of memory, after which
// nothing of the probe is left; any other error is a real failure.
using ProbeRun = std::function<absl::StatusOr<int64_t>(const Group& group)>;

struct CalibrationOptions {
  // At most this many probes (forward passes); at least MemoryModel::
  // kMinObservations make the model ready.
  int max_probes = MemoryModel::kMinObservations;
  // The first probe's voxels; 0: max(min_piece_voxels, 1/32 of the
  // scenes' voxels). The second probe is twice as large.
  int64_t first_voxels = 0;
  // Added to every observed peak: memory live in training but not yet at
  // calibration (the optimizer's state before its first step).
  int64_t extra_bytes = 0;
};

struct CalibrationStats {
  int64_t probes = 0;          // ProbeRun calls
  int64_t oom_events = 0;      // of those, out of memory (wasted forward passes)
  int64_t largest_voxels = 0;  // the largest probe that fitted
  int64_t largest_peak = 0;    // its peak, extra_bytes included
};

// Calibrates `model` under `budget_bytes` from pieces of `scenes` (data of
// the run: the first scenes of its training split). The scenes are cut
// into units of at most the first probe's size (BisectPiece, only where
// Bisectable: never below the floor or the coarsest-stride rule), kept in
// scene order and depth-first within a scene; a probe is a prefix of the
// units, merged per scene into one piece each. Probe sizes: the first, twice
// it, then geometric up to the largest size the fit so far predicts
// (margin included) to stay within options.safety * budget with its growth
// over the prediction at 0 voxels taken 1/0.8 times larger, or all the
// scenes' voxels; a probe predicted not to fit is not run, so probes do not
// run out of memory unless the fit from the smaller ones is wrong. A probe
// that does run out calls free_memory (if set), is recorded with
// ObserveFailure when it could be split, and ends the calibration. Each
// successful probe is observed with its peak + extra_bytes. Without a budget
// nothing is run. Returns probe's first error other than ResourceExhausted,
// unchanged.
absl::StatusOr<CalibrationStats> CalibrateMemoryModel(
    const std::vector<SceneView>& scenes, const SplitOptions& options, int64_t budget_bytes,
    const CalibrationOptions& calibration, const ProbeRun& probe,
    const std::function<void()>& free_memory, MemoryModel* model);

// The commonly used reactive splitter, as a baseline for benchmarks: run the
// whole batch; on out-of-memory free memory, then run the scenes one at a
// time; a scene or piece that runs out of memory is halved at its
// bounding-box midpoint along x at even depth and y at odd depth, and a half
// with fewer than `floor_points` points is dropped (counted in the stats
// without a reason, as the original drops it silently). Weights as in
// RunSplitting. Returns `run`'s first error other than ResourceExhausted.
absl::StatusOr<SplitStats> RunBaselineSplitting(const std::vector<SceneView>& scenes,
                                                const RunGroup& run,
                                                const std::function<void()>& free_memory,
                                                int64_t floor_points = 500);

// A memory model for tests and benchmarks: a group's peak is
// fixed_bytes + sum over its pieces of bytes_per_voxel * voxels *
// scene_scale[scene] (scale 1 for scenes beyond scene_scale), so a scene can
// be made voxel-dense.
struct SimulatedMemory {
  int64_t fixed_bytes = 0;
  int64_t bytes_per_voxel = 1;
  std::vector<double> scene_scale;

  int64_t Peak(const Group& group) const;
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_SPLIT_SPLIT_H_
