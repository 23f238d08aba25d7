// The run spec: what a user submits (TOML), what trainsupd validates before
// it creates anything, and what the worker trains from. Both ends parse it
// with ParseRunSpec so they can never disagree about what a field means.
// docs/run-spec.md lists every field with its default and bounds.
#ifndef TRAINSUP_CONTRACTS_SPEC_H_
#define TRAINSUP_CONTRACTS_SPEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainsup {

struct ModelSpec {
  std::string arch = "minkunet14";  // minkunet14 | minkunet18 | minkunet34 | minkunet50
  int64_t in_channels = 3;          // 1..256
  int64_t num_classes = 0;          // 0: from the data; else 2..1024
  double voxel_size = 0.05;         // metres, (0, 10]
  bool gradient_checkpointing = false;
  // Adds the voxel's height above its scene's lowest point (metres) as one
  // more input channel (in_channels counts it): convolutions are blind to
  // absolute position, and aerial scans separate ground from the rest by it.
  bool height_feature = false;
  // world_size > 1: BatchNorm's batch statistics are allreduced over the
  // ranks (forward and backward), so every rank normalises with the global
  // batch's mean and variance (PyTorch's SyncBatchNorm). false: per rank.
  bool sync_batchnorm = false;
};

// Steps first..last (1-based, inclusive) whose batches are drawn and not
// trained on (data.skip_windows; a rollback's window, docs/guard.md).
struct StepWindow {
  int64_t first = 0;
  int64_t last = 0;
  bool operator==(const StepWindow& o) const { return first == o.first && last == o.last; }
};
// "40-59,80-99" (the worker's --skip-windows and a command's
// TRAINSUP_SKIP_WINDOWS), and back: InvalidArgument naming the bad entry.
std::string FormatStepWindows(const std::vector<StepWindow>& windows);
absl::StatusOr<std::vector<StepWindow>> ParseStepWindows(absl::string_view text);
// Whether `step` is in one of `windows`.
bool InStepWindows(const std::vector<StepWindow>& windows, int64_t step);

struct DataSpec {
  // synthetic | ply | las | semantickitti | s3dis
  std::string format = "synthetic";
  std::string path;            // file or directory; required unless synthetic
  std::string label_file;      // ply: labels from a side file (one per line)
  std::string label_property;  // ply: per-vertex property name ("" = auto)
  int64_t ignore_label = -1;   // -1..65535
  double val_fraction = 0.2;   // [0, 0.9]
  bool augment = true;
  // false: ignore the files' features (colour, remission) and give the model
  // one constant channel, e.g. when colours encode the labels.
  bool use_features = true;
  // One file is cut into square xy tiles of this side (metres); 0 = chosen
  // for about 16 tiles. [0, 100000]
  double tile_size = 0;
  // A data file larger than this is refused (exit 65 naming it) before
  // anything is allocated for it. [1, 1048576]
  int64_t max_file_mb = 4096;
  // synthetic only
  int64_t scenes = 8;                         // 1..100000
  std::string scene_size = "small";           // small | default | large | huge
  std::string size_distribution = "uniform";  // uniform | heavy_tailed
  // [[first, last], ...]: steps whose batches are skipped (drawn, not
  // trained on), as a rollback skips them; up to 1000 windows.
  std::vector<StepWindow> skip_windows;
  // Rank 0 logs every step's global batch: "samples of step N (epoch E):
  // INDEX:AUGMENT_SEED ..." (docs/distributed.md, "Elastic").
  bool log_samples = false;
};

// The training guard (the [guard] table; docs/guard.md). The worker checks
// every step's loss and global gradient; the daemon rolls a diverged
// attempt back. A command run reads only the rollback keys (the script
// checks its own steps, python/trainsup guard helpers).
struct GuardSpec {
  bool check_finite = true;  // false: no check of loss and gradient (benchmarks only)
  // A loss above spike_factor times the median of the last spike_window
  // applied steps' losses is a spike, once spike_warmup steps were applied.
  // 0: off; else [1.5, 1e6].
  double spike_factor = 6;
  int64_t spike_window = 50;  // 5..10000
  int64_t spike_warmup = 20;  // 5..1e9 (at least 5)
  // This many bad steps (non-finite or spikes) within the last bad_window
  // steps end the attempt as diverged (exit 79). 1..1e6 and 1..1e9.
  int64_t max_bad_steps = 3;
  int64_t bad_window = 100;
  // The daemon: rollbacks before a diverged run fails (0: none), the
  // window of batches a rollback skips from the first bad step, and the
  // learning rate's factor per rollback ((0, 1]).
  int64_t max_rollbacks = 3;  // 0..1000
  int64_t skip_batches = 20;  // 1..1e6
  double lr_factor_on_rollback = 1;
  // SUCCEEDED means trained (docs/guard.md): a run that completed with more
  // than this fraction of its steps skipped (windows, guard, loss scaler)
  // ends FAILED with the counts. [0, 1]; 1: never.
  double max_skipped_fraction = 0.1;
  // fp16 (train.precision): loss-scaler overflows are skipped steps, not
  // bad ones; this many in a row, or one that would halve the scale below
  // min_loss_scale, is divergence (exit 79). 1..1e6 and (0, 65536].
  int64_t max_overflow_streak = 20;
  double min_loss_scale = 1;
  // A run whose final evaluation scores below the majority-class baseline
  // ends FAILED; false: SUCCEEDED, with a warning event.
  bool fail_below_baseline = true;
};

struct OptimizerSpec {
  std::string kind = "sgd";           // sgd | adamw
  double lr = 0.05;                   // (0, 1e6]: the guard catches what blows up
  double momentum = 0.9;              // [0, 1)
  double weight_decay = 1e-4;         // [0, 1]
  std::string schedule = "constant";  // constant | cosine | poly | step
  int64_t warmup_steps = 0;           // 0..1e9
};

struct TrainSpec {
  int64_t batch_size = 2;               // 1..4096
  int64_t steps = 100;                  // 1..1e9 (when epochs = 0)
  int64_t epochs = 0;                   // 0..1e6 (0: use steps)
  int64_t checkpoint_every_steps = 50;  // 0..1e9 (0: off)
  double checkpoint_every_seconds = 0;  // 0..1e6 (0: off)
  int64_t keep_checkpoints = 3;         // 1..1000
  // Periodic checkpoints are written on a thread while training goes on
  // (docs/worker.md, "Checkpoints and exact resume"); false: between steps.
  bool background_checkpoints = true;
  int64_t memory_budget_mb = 0;  // 0 (none)..1e7
  int64_t eval_every_steps = 0;  // 0..1e9
  bool deterministic = true;
  int64_t seed = 1;     // 0..2^63-1
  int64_t threads = 2;  // 1..256
  bool predictive_split = true;
  // PYTORCH_CUDA_ALLOC_CONF for this run's workers ("" = the daemon's, else
  // expandable_segments:True): up to 256 of [A-Za-z0-9_:,.].
  std::string cuda_alloc_conf;
  int64_t min_piece_points = 500;  // 1..1e9: the splitting floor
  // auto: cuda:0 when the worker's LibTorch has CUDA and a device is visible
  // (CUDA_VISIBLE_DEVICES), else the CPU | cpu | cuda (an error without one).
  std::string device = "auto";
  int64_t empty_cache_every_steps = 0;  // 0 (off)..1e9: hand cached memory back
  // fp32 | bf16 | fp16: the features' type (docs/engine.md, "Mixed
  // precision"); weights and optimizer state stay float32. fp16 scales the
  // loss dynamically: from loss_scale_init, doubled after
  // loss_scale_growth_interval finite steps, halved on an overflow.
  std::string precision = "fp32";
  double loss_scale_init = 65536;  // [1, 16777216]
  // CUDA: float32 GEMMs and cuDNN in TF32 (inputs rounded to 10 mantissa
  // bits, float32 sums); no effect on the CPU (docs/engine.md).
  bool tf32 = true;
  int64_t loss_scale_growth_interval = 2000;  // 1..1e9
};

// How the ranks of a run with world_size > 1 talk (the [distributed]
// table; docs/distributed.md).
struct DistributedSpec {
  // auto: NCCL when the worker trains on CUDA and its LibTorch has NCCL,
  // else Gloo | gloo | nccl (an error where it is not built).
  std::string backend = "auto";
  // A collective that has not completed after this long fails the rank
  // (exit 76 naming the peer and the collective). [1, 3600]
  double timeout_s = 60;
  // Rank 0 hosts the rendezvous store; the others wait this long for it,
  // and everyone this long for the whole gang to join. [1, 3600]
  double connect_timeout_s = 120;
  // How long the other ranks wait for rank 0 to write a checkpoint (slow
  // shared storage), apart from timeout_s. [1, 86400]
  double checkpoint_timeout_s = 1800;
  // Gradients are allreduced in buckets of about this size, launched as
  // the last backward pass makes them ready. [0.01, 1024]
  double bucket_mb = 4;
  // false: every bucket is launched after backward instead of during it
  // (for comparison; docs/distributed.md shows what the overlap saves).
  bool overlap_backward = true;
  // Stragglers (docs/distributed.md): a rank whose step time outside the
  // collectives stays above straggler_factor times the median of the other
  // ranks' for straggler_window_s is reported (an event, a metric, a line
  // in trainctl describe). 0: off (the default), else [1.1, 100].
  double straggler_factor = 0;
  double straggler_window_s = 60;  // [1, 86400]
};

// Fault injection for tests and the demo (the [testing] table). -1: off.
struct TestingSpec {
  // The spec has a [testing] table. trainsupd accepts such a spec only when
  // its configuration allows fault injection (testing.allow_fault_injection).
  bool present = false;
  int64_t crash_at_step = -1;       // abort()
  int64_t exit_at_step = -1;        // exit with exit_code
  int64_t exit_code = 1;            // 0..255
  int64_t signal_at_step = -1;      // raise(signal)
  int64_t signal = 9;               // 1..64
  int64_t hang_at_step = -1;        // keep heartbeating, stop progressing
  int64_t freeze_at_step = -1;      // stop heartbeating (and progressing)
  int64_t oom_at_step = -1;         // allocate past the memory budget
  bool corrupt_checkpoint = false;  // corrupt the newest checkpoint at start
  bool ignore_sigterm = false;
  bool spawn_grandchild = false;    // leave a process in the group
  int64_t step_ms = 0;              // test worker: time per step, 0..600000
  int64_t slow_step_ms = 0;         // real worker: each step computes this much longer, 0..600000
  int64_t checkpoint_delay_ms = 0;  // real worker: each checkpoint write takes this much longer
  // world_size > 1: raise(SIGSTOP) inside the gradient allreduce of step N
  // (after its first bucket is launched).
  int64_t stop_in_collective_at_step = -1;
  // The guard's faults (docs/guard.md): step N's loss is NaN (so is its
  // gradient), or only its gradient is, or its loss is 100 times larger.
  int64_t nan_loss_at_step = -1;
  int64_t nan_grad_at_step = -1;
  int64_t loss_spike_at_step = -1;
  // The worker's Hello carries this version instead of its own (a worker
  // the daemon cannot serve); "" = its own.
  std::string report_version;
  int64_t only_attempt = 0;  // 0: faults on every attempt; N: only on attempt N
  int64_t only_rank = -1;    // -1: faults on every rank; R: only on rank R
};

// A run of the user's own program instead of our worker (the [command]
// table; docs/run-spec.md). trainsupd checks argv[0] against its
// [commands] allowlist at submit and again at every launch.
struct CommandSpec {
  // The program (a path, or a name looked up in /usr/local/bin:/usr/bin:/bin)
  // and its arguments: 1..256 non-empty strings without NUL.
  std::vector<std::string> argv;
  // Absolute; "" = the run directory. Must lie inside daemon.data_roots.
  std::string cwd;
  // Extra variables; names [A-Za-z_][A-Za-z0-9_]*, none that trainsupd sets
  // (kCommandReservedEnv, TRAINSUP_*) nor LD_PRELOAD / LD_LIBRARY_PATH.
  std::map<std::string, std::string> env;
  int64_t total_steps = 0;  // 0 (unknown)..1e12: progress total when the program reports none
  // The program speaks to the daemon (the Python client): frozen and hung
  // detection as for our worker. false: judged by its exit code only.
  bool heartbeats = false;
};

// A run whose ranks span machines (the [cluster] table; docs/distributed.md):
// the same spec is submitted to the daemon of every node, and the daemons
// coordinate through etcd. Without the table a run is local, as always.
struct ClusterSpec {
  bool present = false;
  // The job's name, shared by its nodes: its keys in etcd live under
  // /trainsup/v1/jobs/JOB/. 1..64 of [A-Za-z0-9._-]; required.
  std::string job;
  int64_t nodes = 2;           // 1..64
  int64_t ranks_per_node = 1;  // 1..64; world_size = nodes * ranks_per_node
  // The fewest nodes the job goes on with (1..nodes, default nodes: no
  // elasticity): a rendezvous still short of nodes after [elastic] wait_s
  // closes with those that joined, if at least min_nodes, and a node that
  // rejoins is taken in at a checkpoint (docs/distributed.md, "Elastic").
  // min_world_size = min_nodes * ranks_per_node.
  int64_t min_nodes = 0;
  // host:port of etcd's client API, 1..16; required.
  std::vector<std::string> etcd_endpoints;
  // Where global rank 0 writes the job's checkpoints and every node reads
  // them: a directory on storage all nodes share, inside daemon.data_roots
  // of every node. Absolute; required.
  std::string checkpoint_dir;
  // The node's etcd lease: a daemon that has not renewed it for this long
  // is declared lost by the others. [2, 600]
  double lease_ttl_s = 10;
  // How long the nodes of a generation wait for every node to join before
  // the job fails. [1, 86400]
  double rendezvous_timeout_s = 300;
  // A new submission of the job may go on from the checkpoints an earlier,
  // finished submission left in checkpoint_dir (its owner record then
  // names this one); off: it refuses them.
  bool adopt_checkpoints = false;
};

// Whether `name` is an environment variable name: [A-Za-z_][A-Za-z0-9_]*
// (command.env's keys, the daemon's commands.deny_env and allow_env).
bool IsEnvVarName(const std::string& name);

// The variables trainsupd sets for a command run, which a spec's
// command.env may not set (nor any TRAINSUP_* name).
inline constexpr const char* kCommandReservedEnv[] = {
    "RANK",        "LOCAL_RANK",  "WORLD_SIZE",          "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"};

// An elastic gang (docs/distributed.md, "Elastic"): how a run whose
// min_world_size is below its world_size shrinks and grows.
struct ElasticSpec {
  // A gang that restarts with fewer than world_size slots free waits this
  // long for them, then starts with as many as are free (at least
  // min_world_size). [0, 86400] seconds.
  double wait_s = 60;
  // A gang running smaller grows back once free slots have stayed free
  // this long: a checkpoint, a graceful stop, a restart at the larger size.
  // [0, 86400] seconds.
  double grow_after_s = 10;
  // A run whose smallest gang (min_world_size, else world_size) needs more
  // slots than drains leave usable waits for an operator or a GPU to bring
  // them back, with an event and trainsup_run_blocked_seconds; past this
  // many seconds of that wait it fails. 0: it waits for ever.
  // [0, 604800] seconds (a week).
  double max_blocked_s = 0;
};

struct RunSpec {
  std::string name = "run";  // 1..64 of [A-Za-z0-9._-]
  int64_t priority = 0;      // -1000..1000, higher first
  // The ranks wanted. A gang may run with fewer, down to min_world_size
  // (default: world_size, no elasticity), training the same global
  // batches (GlobalBatch).
  int64_t world_size = 1;      // 1..64
  int64_t min_world_size = 1;  // 1..world_size
  ElasticSpec elastic;
  // A [command] table: the run executes `command`; model, data, optimizer,
  // train, distributed and testing keep their defaults and are unused.
  bool has_command = false;
  CommandSpec command;
  ModelSpec model;
  DataSpec data;
  OptimizerSpec optimizer;
  TrainSpec train;
  DistributedSpec distributed;
  TestingSpec testing;
  GuardSpec guard;
  ClusterSpec cluster;
};

// Parses and validates `toml_text`. Errors are InvalidArgument naming the
// field ("train.batch_size: must be in [1, 4096], got 0"), unknown keys and
// tables included ("model.arhc: unknown key"). A [command] table excludes
// [model], [data], [optimizer], [train], [distributed] and [testing]. Non-ASCII characters outside
// strings and comments are refused with their line and column before the
// TOML parser sees them (contracts/toml_guard.h).
absl::StatusOr<RunSpec> ParseRunSpec(const std::string& toml_text);

// The spec as a viewer token may read it: `toml_text` unchanged when it has
// no [command.env] values; otherwise the spec rewritten by toml++ (comments
// and layout lost) with every command.env value "<redacted>", under a
// comment that says so. Empty for a text that does not parse (a stored
// spec always does).
std::string RedactCommandEnv(const std::string& toml_text);

// Checks that every path in the spec (data.path, data.label_file,
// command.cwd, cluster.checkpoint_dir) resolves (after symlinks) inside one of `data_roots`.
// InvalidArgument naming the field when not, or when a path is relative. An empty `data_roots`
// allows no paths at all.
absl::Status CheckSpecPaths(const RunSpec& spec, const std::vector<std::string>& data_roots);

// The total number of optimizer steps the run takes (steps, or epochs times
// steps per epoch when that is known: `steps_per_epoch` > 0).
int64_t TotalSteps(const RunSpec& spec, int64_t steps_per_epoch);

// The samples of one optimizer step over all ranks: world_size *
// train.batch_size. train.batch_size is what each rank trains when the
// gang has all its world_size ranks (today's meaning); a smaller gang
// trains the same global batch, each rank a larger share
// (docs/distributed.md, "Elastic").
int64_t GlobalBatch(const RunSpec& spec);

// Whether a gang of `world` ranks may run `spec`: min_world_size <= world
// <= world_size. InvalidArgument naming the range otherwise.
absl::Status CheckGangSize(const RunSpec& spec, int64_t world);

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_SPEC_H_
