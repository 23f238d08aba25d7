#include "contracts/spec.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "contracts/data_roots.h"
#include "contracts/toml_reader.h"

namespace trainsup {
namespace {

// The one field reader of the spec and the daemon config.
using TableReader = TomlFieldReader;

#define TRAINSUP_RETURN_IF_ERROR(expr) \
  do {                                 \
    absl::Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (false)

constexpr int64_t kBillion = 1000000000;

absl::Status ReadModel(const toml::table* t, ModelSpec* m) {
  TableReader r(t, "model");
  TRAINSUP_RETURN_IF_ERROR(
      r.String("arch", &m->arch, {"minkunet14", "minkunet18", "minkunet34", "minkunet50"}));
  TRAINSUP_RETURN_IF_ERROR(r.Int("in_channels", &m->in_channels, 1, 256));
  TRAINSUP_RETURN_IF_ERROR(r.Int("num_classes", &m->num_classes, 0, 1024));
  if (m->num_classes == 1) {
    return absl::InvalidArgumentError(
        "model.num_classes: must be 0 (from the data) or in [2, 1024], got 1");
  }
  TRAINSUP_RETURN_IF_ERROR(r.Double("voxel_size", &m->voxel_size, 0, 10, /*lo_open=*/true));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("gradient_checkpointing", &m->gradient_checkpointing));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("height_feature", &m->height_feature));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("sync_batchnorm", &m->sync_batchnorm));
  if (m->height_feature && m->in_channels < 2) {
    return absl::InvalidArgumentError(
        "model.in_channels: must count the height channel too (at least 2 with height_feature)");
  }
  return r.Finish();
}

// [[first, last], ...]: 1 <= first <= last <= 1e9, at most 1000 windows.
absl::Status ReadStepWindows(TableReader& r, const std::string& key, std::vector<StepWindow>* out) {
  const toml::node* node = r.Get(key);
  if (node == nullptr) return absl::OkStatus();
  const auto* array = node->as_array();
  if (array == nullptr || array->size() > 1000) {
    return r.Error(key, "must be an array of at most 1000 [first, last] step pairs");
  }
  std::vector<StepWindow> windows;
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string entry = absl::StrCat(key, "[", i, "]");
    const auto* pair = (*array)[i].as_array();
    std::optional<int64_t> first, last;
    if (pair != nullptr && pair->size() == 2) {
      first = (*pair)[0].value<int64_t>();
      last = (*pair)[1].value<int64_t>();
    }
    if (!first || !last || !(*pair)[0].is_integer() || !(*pair)[1].is_integer()) {
      return r.Error(entry, "must be a pair of integers [first, last]");
    }
    if (*first < 1 || *last < *first || *last > kBillion) {
      return r.Error(entry, absl::StrCat("must have 1 <= first <= last <= 1000000000, got [",
                                         *first, ", ", *last, "]"));
    }
    windows.push_back({*first, *last});
  }
  *out = std::move(windows);
  return absl::OkStatus();
}

absl::Status ReadData(const toml::table* t, DataSpec* d) {
  TableReader r(t, "data");
  TRAINSUP_RETURN_IF_ERROR(
      r.String("format", &d->format, {"synthetic", "ply", "las", "semantickitti", "s3dis"}));
  TRAINSUP_RETURN_IF_ERROR(r.String("path", &d->path));
  TRAINSUP_RETURN_IF_ERROR(r.String("label_file", &d->label_file));
  TRAINSUP_RETURN_IF_ERROR(r.String("label_property", &d->label_property));
  TRAINSUP_RETURN_IF_ERROR(r.Int("ignore_label", &d->ignore_label, -1, 65535));
  TRAINSUP_RETURN_IF_ERROR(r.Double("val_fraction", &d->val_fraction, 0, 0.9));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("augment", &d->augment));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("use_features", &d->use_features));
  TRAINSUP_RETURN_IF_ERROR(r.Double("tile_size", &d->tile_size, 0, 100000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("max_file_mb", &d->max_file_mb, 1, 1048576));
  TRAINSUP_RETURN_IF_ERROR(r.Int("scenes", &d->scenes, 1, 100000));
  TRAINSUP_RETURN_IF_ERROR(
      r.String("scene_size", &d->scene_size, {"small", "default", "large", "huge"}));
  TRAINSUP_RETURN_IF_ERROR(
      r.String("size_distribution", &d->size_distribution, {"uniform", "heavy_tailed"}));
  TRAINSUP_RETURN_IF_ERROR(ReadStepWindows(r, "skip_windows", &d->skip_windows));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("log_samples", &d->log_samples));
  TRAINSUP_RETURN_IF_ERROR(r.Finish());
  if (d->format != "synthetic" && d->path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: required for format \"", d->format, "\""));
  }
  if (!d->label_file.empty() && d->format != "ply") {
    return absl::InvalidArgumentError("data.label_file: only for format \"ply\"");
  }
  return absl::OkStatus();
}

absl::Status ReadGuard(const toml::table* t, GuardSpec* g) {
  TableReader r(t, "guard");
  TRAINSUP_RETURN_IF_ERROR(r.Bool("check_finite", &g->check_finite));
  TRAINSUP_RETURN_IF_ERROR(r.Double("spike_factor", &g->spike_factor, 0, 1e6));
  if (g->spike_factor != 0 && g->spike_factor < 1.5) {
    return r.Error("spike_factor",
                   absl::StrCat("must be 0 (off) or in [1.5, 1000000], got ", g->spike_factor));
  }
  TRAINSUP_RETURN_IF_ERROR(r.Int("spike_window", &g->spike_window, 5, 10000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("spike_warmup", &g->spike_warmup, 5, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("max_bad_steps", &g->max_bad_steps, 1, 1000000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("bad_window", &g->bad_window, 1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("max_rollbacks", &g->max_rollbacks, 0, 1000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("skip_batches", &g->skip_batches, 1, 1000000));
  TRAINSUP_RETURN_IF_ERROR(r.Double("lr_factor_on_rollback", &g->lr_factor_on_rollback, 0, 1,
                                    /*lo_open=*/true));
  TRAINSUP_RETURN_IF_ERROR(r.Double("max_skipped_fraction", &g->max_skipped_fraction, 0, 1));
  TRAINSUP_RETURN_IF_ERROR(r.Int("max_overflow_streak", &g->max_overflow_streak, 1, 1000000));
  TRAINSUP_RETURN_IF_ERROR(
      r.Double("min_loss_scale", &g->min_loss_scale, 0, 65536, /*lo_open=*/true));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("fail_below_baseline", &g->fail_below_baseline));
  TRAINSUP_RETURN_IF_ERROR(r.Finish());
  if (g->max_bad_steps > g->bad_window) {
    return absl::InvalidArgumentError(absl::StrCat("guard.max_bad_steps: ", g->max_bad_steps,
                                                   " bad steps can never fit in ",
                                                   "guard.bad_window = ", g->bad_window));
  }
  return absl::OkStatus();
}

absl::Status ReadOptimizer(const toml::table* t, OptimizerSpec* o) {
  TableReader r(t, "optimizer");
  TRAINSUP_RETURN_IF_ERROR(r.String("kind", &o->kind, {"sgd", "adamw"}));
  TRAINSUP_RETURN_IF_ERROR(r.Double("lr", &o->lr, 0, 1e6, /*lo_open=*/true));
  TRAINSUP_RETURN_IF_ERROR(r.Double("momentum", &o->momentum, 0, 1, false, /*hi_open=*/true));
  TRAINSUP_RETURN_IF_ERROR(r.Double("weight_decay", &o->weight_decay, 0, 1));
  TRAINSUP_RETURN_IF_ERROR(
      r.String("schedule", &o->schedule, {"constant", "cosine", "poly", "step"}));
  TRAINSUP_RETURN_IF_ERROR(r.Int("warmup_steps", &o->warmup_steps, 0, kBillion));
  return r.Finish();
}

absl::Status ReadTrain(const toml::table* t, TrainSpec* s) {
  TableReader r(t, "train");
  TRAINSUP_RETURN_IF_ERROR(r.Int("batch_size", &s->batch_size, 1, 4096));
  TRAINSUP_RETURN_IF_ERROR(r.Int("steps", &s->steps, 1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("epochs", &s->epochs, 0, 1000000));
  TRAINSUP_RETURN_IF_ERROR(
      r.Int("checkpoint_every_steps", &s->checkpoint_every_steps, 0, kBillion));
  TRAINSUP_RETURN_IF_ERROR(
      r.Double("checkpoint_every_seconds", &s->checkpoint_every_seconds, 0, 1e6));
  TRAINSUP_RETURN_IF_ERROR(r.Int("keep_checkpoints", &s->keep_checkpoints, 1, 1000));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("background_checkpoints", &s->background_checkpoints));
  TRAINSUP_RETURN_IF_ERROR(r.Int("memory_budget_mb", &s->memory_budget_mb, 0, 10000000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("eval_every_steps", &s->eval_every_steps, 0, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("deterministic", &s->deterministic));
  TRAINSUP_RETURN_IF_ERROR(r.Int("seed", &s->seed, 0, INT64_MAX));
  TRAINSUP_RETURN_IF_ERROR(r.Int("threads", &s->threads, 1, 256));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("predictive_split", &s->predictive_split));
  TRAINSUP_RETURN_IF_ERROR(r.Int("min_piece_points", &s->min_piece_points, 1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.String("device", &s->device, {"auto", "cpu", "cuda"}));
  TRAINSUP_RETURN_IF_ERROR(r.String("precision", &s->precision, {"fp32", "bf16", "fp16"}));
  TRAINSUP_RETURN_IF_ERROR(r.Double("loss_scale_init", &s->loss_scale_init, 1, 16777216));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("tf32", &s->tf32));
  TRAINSUP_RETURN_IF_ERROR(
      r.Int("loss_scale_growth_interval", &s->loss_scale_growth_interval, 1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(
      r.Int("empty_cache_every_steps", &s->empty_cache_every_steps, 0, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.String("cuda_alloc_conf", &s->cuda_alloc_conf));
  if (s->cuda_alloc_conf.size() > 256 ||
      s->cuda_alloc_conf.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                           "0123456789_:,.") != std::string::npos) {
    return r.Error("cuda_alloc_conf",
                   "must be up to 256 of A-Z a-z 0-9 _ : , . (e.g. \"expandable_segments:True\")");
  }
  return r.Finish();
}

absl::Status ReadDistributed(const toml::table* t, DistributedSpec* s) {
  TableReader r(t, "distributed");
  TRAINSUP_RETURN_IF_ERROR(r.String("backend", &s->backend, {"auto", "gloo", "nccl"}));
  TRAINSUP_RETURN_IF_ERROR(r.Double("timeout_s", &s->timeout_s, 1, 3600));
  TRAINSUP_RETURN_IF_ERROR(r.Double("connect_timeout_s", &s->connect_timeout_s, 1, 3600));
  TRAINSUP_RETURN_IF_ERROR(r.Double("checkpoint_timeout_s", &s->checkpoint_timeout_s, 1, 86400));
  TRAINSUP_RETURN_IF_ERROR(r.Double("bucket_mb", &s->bucket_mb, 0.01, 1024));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("overlap_backward", &s->overlap_backward));
  TRAINSUP_RETURN_IF_ERROR(r.Double("straggler_factor", &s->straggler_factor, 0, 100));
  TRAINSUP_RETURN_IF_ERROR(r.Double("straggler_window_s", &s->straggler_window_s, 1, 86400));
  TRAINSUP_RETURN_IF_ERROR(r.Finish());
  if (s->straggler_factor != 0 && s->straggler_factor < 1.1) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed.straggler_factor: ", s->straggler_factor,
                     " flags ranks at noise level; 0 (off) or from 1.1 to 100"));
  }
  return absl::OkStatus();
}

absl::Status ReadElastic(const toml::table* t, ElasticSpec* e) {
  TableReader r(t, "elastic");
  TRAINSUP_RETURN_IF_ERROR(r.Double("wait_s", &e->wait_s, 0, 86400));
  TRAINSUP_RETURN_IF_ERROR(r.Double("grow_after_s", &e->grow_after_s, 0, 86400));
  TRAINSUP_RETURN_IF_ERROR(r.Double("max_blocked_s", &e->max_blocked_s, 0, 604800));
  return r.Finish();
}

absl::Status ReadTesting(const toml::table* t, TestingSpec* s) {
  s->present = t != nullptr;
  TableReader r(t, "testing");
  TRAINSUP_RETURN_IF_ERROR(r.Int("crash_at_step", &s->crash_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("exit_at_step", &s->exit_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("exit_code", &s->exit_code, 0, 255));
  TRAINSUP_RETURN_IF_ERROR(r.Int("signal_at_step", &s->signal_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("signal", &s->signal, 1, 64));
  TRAINSUP_RETURN_IF_ERROR(r.Int("hang_at_step", &s->hang_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("freeze_at_step", &s->freeze_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("oom_at_step", &s->oom_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("corrupt_checkpoint", &s->corrupt_checkpoint));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("ignore_sigterm", &s->ignore_sigterm));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("spawn_grandchild", &s->spawn_grandchild));
  TRAINSUP_RETURN_IF_ERROR(r.Int("step_ms", &s->step_ms, 0, 600000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("slow_step_ms", &s->slow_step_ms, 0, 600000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("checkpoint_delay_ms", &s->checkpoint_delay_ms, 0, 600000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("nan_loss_at_step", &s->nan_loss_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("nan_grad_at_step", &s->nan_grad_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Int("loss_spike_at_step", &s->loss_spike_at_step, -1, kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.String("report_version", &s->report_version));
  TRAINSUP_RETURN_IF_ERROR(r.Int("only_attempt", &s->only_attempt, 0, 1000000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("only_rank", &s->only_rank, -1, 63));
  TRAINSUP_RETURN_IF_ERROR(
      r.Int("stop_in_collective_at_step", &s->stop_in_collective_at_step, -1, kBillion));
  return r.Finish();
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

absl::Status ReadCluster(const toml::table* t, ClusterSpec* c) {
  c->present = t != nullptr;
  if (t == nullptr) return absl::OkStatus();
  TableReader r(t, "cluster");
  TRAINSUP_RETURN_IF_ERROR(r.String("job", &c->job));
  if (c->job.empty() || c->job.size() > 64 ||
      !std::all_of(c->job.begin(), c->job.end(), IsNameChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.job: required, 1 to 64 of letters, digits, '.', '_' and '-'; got \"",
                     c->job, "\""));
  }
  TRAINSUP_RETURN_IF_ERROR(r.Int("nodes", &c->nodes, 1, 64));
  TRAINSUP_RETURN_IF_ERROR(r.Int("ranks_per_node", &c->ranks_per_node, 1, 64));
  c->min_nodes = c->nodes;
  TRAINSUP_RETURN_IF_ERROR(r.Int("min_nodes", &c->min_nodes, 1, c->nodes));
  TRAINSUP_RETURN_IF_ERROR(r.StringArray("etcd_endpoints", &c->etcd_endpoints, 16));
  if (c->etcd_endpoints.empty()) {
    return absl::InvalidArgumentError("cluster.etcd_endpoints: required (host:port of etcd)");
  }
  for (const std::string& e : c->etcd_endpoints) {
    const size_t colon = e.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(e.substr(colon + 1), &port) ||
        port < 1 || port > 65535 || e.find_first_of(",/ ") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster.etcd_endpoints: not host:port: \"", e, "\""));
    }
  }
  TRAINSUP_RETURN_IF_ERROR(r.String("checkpoint_dir", &c->checkpoint_dir));
  if (c->checkpoint_dir.empty() || c->checkpoint_dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.checkpoint_dir: required, an absolute path on storage every node shares; got \"",
        c->checkpoint_dir, "\""));
  }
  TRAINSUP_RETURN_IF_ERROR(r.Double("lease_ttl_s", &c->lease_ttl_s, 2, 600));
  TRAINSUP_RETURN_IF_ERROR(r.Double("rendezvous_timeout_s", &c->rendezvous_timeout_s, 1, 86400));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("adopt_checkpoints", &c->adopt_checkpoints));
  return r.Finish();
}

// Why `name` may not be set through command.env; "" when it may.
std::string CheckEnvName(const std::string& name) {
  if (!IsEnvVarName(name)) return "not a variable name (must match [A-Za-z_][A-Za-z0-9_]*)";
  for (const char* reserved : kCommandReservedEnv) {
    if (name == reserved) return "set by trainsupd for every rank; cannot be overridden";
  }
  if (name.rfind("TRAINSUP_", 0) == 0) return "TRAINSUP_* variables are set by trainsupd";
  // The allowlist admits a program, not code injected into it.
  if (name == "LD_PRELOAD" || name == "LD_LIBRARY_PATH" || name == "LD_AUDIT") {
    return "not allowed: it would load other code into the allowed program";
  }
  return "";
}

absl::Status ReadCommand(const toml::table* t, CommandSpec* c) {
  TableReader r(t, "command");
  TRAINSUP_RETURN_IF_ERROR(r.StringArray("argv", &c->argv, 256));
  if (c->argv.empty()) return absl::InvalidArgumentError("command.argv: required");
  TRAINSUP_RETURN_IF_ERROR(r.String("cwd", &c->cwd));
  if (!c->cwd.empty() && c->cwd[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("command.cwd: must be an absolute path, got \"", c->cwd, "\""));
  }
  if (c->cwd.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("command.cwd: must not contain NUL");
  }
  TRAINSUP_RETURN_IF_ERROR(r.StringTable("env", &c->env, CheckEnvName));
  TRAINSUP_RETURN_IF_ERROR(r.Int("total_steps", &c->total_steps, 0, 1000 * kBillion));
  TRAINSUP_RETURN_IF_ERROR(r.Bool("heartbeats", &c->heartbeats));
  return r.Finish();
}

// The run's name: 1 to 64 characters, each IsNameChar.
absl::Status CheckRunName(const std::string& name) {
  if (name.empty() || name.size() > 64) {
    return absl::InvalidArgumentError("name: must be 1 to 64 characters");
  }
  for (char c : name) {
    if (!IsNameChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "name: may contain only letters, digits, '.', '_' and '-'; got \"", name, "\""));
    }
  }
  return absl::OkStatus();
}

// With a [cluster] table, world_size becomes nodes * ranks_per_node: at
// most 64, and equal to a world_size the spec gives (`world_size_given`).
absl::Status ApplyClusterWorld(bool world_size_given, RunSpec* spec) {
  if (!spec->cluster.present) return absl::OkStatus();
  const int64_t world = spec->cluster.nodes * spec->cluster.ranks_per_node;
  if (world > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster: nodes * ranks_per_node is ", world, ", more than 64 ranks"));
  }
  if (world_size_given && spec->world_size != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", spec->world_size, " but the [cluster] table makes ",
                     spec->cluster.nodes, " nodes x ", spec->cluster.ranks_per_node,
                     " ranks = ", world, "; drop world_size or make them agree"));
  }
  spec->world_size = world;
  return absl::OkStatus();
}

// With a [cluster] table, min_world_size becomes min_nodes *
// ranks_per_node, equal to a min_world_size the spec gives
// (`min_world_size_given`); an elastic job's wait_s must be below the
// rendezvous timeout.
absl::Status ApplyClusterMinWorld(bool min_world_size_given, RunSpec* spec) {
  if (!spec->cluster.present) return absl::OkStatus();
  const int64_t min_world = spec->cluster.min_nodes * spec->cluster.ranks_per_node;
  if (min_world_size_given && spec->min_world_size != min_world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_world_size: ", spec->min_world_size, " but the [cluster] table makes ",
        spec->cluster.min_nodes, " nodes x ", spec->cluster.ranks_per_node, " ranks = ", min_world,
        " (min_nodes); drop min_world_size or make them agree"));
  }
  spec->min_world_size = min_world;
  // An elastic job's rendezvous closes short after wait_s: it must come
  // before the rendezvous times out and fails the job.
  if (spec->cluster.min_nodes < spec->cluster.nodes &&
      spec->elastic.wait_s >= spec->cluster.rendezvous_timeout_s) {
    return absl::InvalidArgumentError(absl::StrCat(
        "elastic.wait_s: ", spec->elastic.wait_s, " s is not below cluster.rendezvous_timeout_s (",
        spec->cluster.rendezvous_timeout_s,
        " s): the rendezvous would fail the job before it could go on with min_nodes"));
  }
  return absl::OkStatus();
}

// The rest of a command run's spec (`command` is its [command] table): no
// table of a training run, then [command], [guard] and no unknown key.
absl::Status ReadCommandRun(const toml::table& root, const toml::table* command, TableReader& r,
                            RunSpec* spec) {
  spec->has_command = true;
  for (const char* other : {"model", "data", "optimizer", "train", "distributed", "testing"}) {
    if (root.get(other) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("command: a command run has no [", other,
                       "] table (the program itself decides what it trains); remove [", other,
                       "] or [command]"));
    }
  }
  TRAINSUP_RETURN_IF_ERROR(ReadCommand(command, &spec->command));
  absl::StatusOr<const toml::table*> guard = r.Table("guard");
  if (!guard.ok()) return guard.status();
  TRAINSUP_RETURN_IF_ERROR(ReadGuard(*guard, &spec->guard));
  return r.Finish();
}

// The rest of a training run's spec: its tables in order, then no unknown key.
absl::Status ReadTrainingRun(TableReader& r, RunSpec* spec) {
  struct Section {
    const char* key;
    std::function<absl::Status(const toml::table*)> read;
  };
  const Section sections[] = {
      {"model", [&](const toml::table* t) { return ReadModel(t, &spec->model); }},
      {"data", [&](const toml::table* t) { return ReadData(t, &spec->data); }},
      {"optimizer", [&](const toml::table* t) { return ReadOptimizer(t, &spec->optimizer); }},
      {"train", [&](const toml::table* t) { return ReadTrain(t, &spec->train); }},
      {"distributed", [&](const toml::table* t) { return ReadDistributed(t, &spec->distributed); }},
      {"testing", [&](const toml::table* t) { return ReadTesting(t, &spec->testing); }},
      {"guard", [&](const toml::table* t) { return ReadGuard(t, &spec->guard); }},
  };
  for (const Section& section : sections) {
    absl::StatusOr<const toml::table*> table = r.Table(section.key);
    if (!table.ok()) return table.status();
    // Absent tables still run their checks on the defaults.
    TRAINSUP_RETURN_IF_ERROR(section.read(*table));
  }
  return r.Finish();
}

}  // namespace

bool IsEnvVarName(const std::string& name) {
  const auto alpha = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  bool ok = !name.empty() && alpha(name[0]);
  for (char c : name) ok = ok && (alpha(c) || (c >= '0' && c <= '9'));
  return ok;
}

absl::StatusOr<RunSpec> ParseRunSpec(const std::string& toml_text) {
  if (toml_text.size() > (1 << 20)) {
    return absl::InvalidArgumentError("spec: larger than 1 MiB");
  }
  absl::StatusOr<toml::table> parsed = ParseTomlText(toml_text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", parsed.status().message()));
  }
  const toml::table& root = *parsed;
  RunSpec spec;
  TableReader r(&root, "");
  TRAINSUP_RETURN_IF_ERROR(r.String("name", &spec.name));
  TRAINSUP_RETURN_IF_ERROR(CheckRunName(spec.name));
  TRAINSUP_RETURN_IF_ERROR(r.Int("priority", &spec.priority, -1000, 1000));
  TRAINSUP_RETURN_IF_ERROR(r.Int("world_size", &spec.world_size, 1, 64));
  const bool world_size_given = root.get("world_size") != nullptr;
  const bool min_world_size_given = root.get("min_world_size") != nullptr;
  {
    absl::StatusOr<const toml::table*> cluster = r.Table("cluster");
    if (!cluster.ok()) return cluster.status();
    TRAINSUP_RETURN_IF_ERROR(ReadCluster(*cluster, &spec.cluster));
  }
  {
    absl::StatusOr<const toml::table*> elastic = r.Table("elastic");
    if (!elastic.ok()) return elastic.status();
    TRAINSUP_RETURN_IF_ERROR(ReadElastic(*elastic, &spec.elastic));
  }
  TRAINSUP_RETURN_IF_ERROR(ApplyClusterWorld(world_size_given, &spec));
  // The smallest gang: min_world_size, or from the [cluster] table's
  // min_nodes; default world_size (no elasticity).
  spec.min_world_size = spec.world_size;
  TRAINSUP_RETURN_IF_ERROR(r.Int("min_world_size", &spec.min_world_size, 1, spec.world_size));
  TRAINSUP_RETURN_IF_ERROR(ApplyClusterMinWorld(min_world_size_given, &spec));
  absl::StatusOr<const toml::table*> command = r.Table("command");
  if (!command.ok()) return command.status();
  if (*command != nullptr) {
    TRAINSUP_RETURN_IF_ERROR(ReadCommandRun(root, *command, r, &spec));
    return spec;
  }
  TRAINSUP_RETURN_IF_ERROR(ReadTrainingRun(r, &spec));
  return spec;
}

int64_t GlobalBatch(const RunSpec& spec) { return spec.world_size * spec.train.batch_size; }

absl::Status CheckGangSize(const RunSpec& spec, int64_t world) {
  if (world >= spec.min_world_size && world <= spec.world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      spec.min_world_size == spec.world_size
          ? absl::StrCat("a gang of ", world,
                         " ranks, but the spec says world_size = ", spec.world_size)
          : absl::StrCat("a gang of ", world, " ranks, but the spec allows ", spec.min_world_size,
                         " (min_world_size) to ", spec.world_size, " (world_size)"));
}

std::string FormatStepWindows(const std::vector<StepWindow>& windows) {
  std::string out;
  for (const StepWindow& w : windows) {
    absl::StrAppend(&out, out.empty() ? "" : ",", w.first, "-", w.last);
  }
  return out;
}

absl::StatusOr<std::vector<StepWindow>> ParseStepWindows(absl::string_view text) {
  std::vector<StepWindow> windows;
  if (text.empty()) return windows;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    const std::vector<absl::string_view> ends = absl::StrSplit(entry, '-');
    StepWindow w;
    if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &w.first) ||
        !absl::SimpleAtoi(ends[1], &w.last) || w.first < 1 || w.last < w.first) {
      return absl::InvalidArgumentError(
          absl::StrCat("skip windows: \"", entry, "\" is not FIRST-LAST with 1 <= FIRST <= LAST"));
    }
    windows.push_back(w);
  }
  return windows;
}

bool InStepWindows(const std::vector<StepWindow>& windows, int64_t step) {
  return std::any_of(windows.begin(), windows.end(),
                     [step](const StepWindow& w) { return step >= w.first && step <= w.last; });
}

absl::Status CheckSpecPaths(const RunSpec& spec, const std::vector<std::string>& data_roots) {
  namespace fs = std::filesystem;
  const std::pair<const char*, const std::string*> paths[] = {
      {"data.path", &spec.data.path},
      {"data.label_file", &spec.data.label_file},
      {"command.cwd", &spec.command.cwd},
      {"cluster.checkpoint_dir", &spec.cluster.checkpoint_dir}};
  for (const auto& [field, path] : paths) {
    if (path->empty()) continue;
    fs::path p(*path);
    if (!p.is_absolute()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be an absolute path, got \"", *path, "\""));
    }
    std::error_code ec;
    (void)fs::weakly_canonical(p, ec);  // only whether it resolves
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": cannot resolve \"", *path, "\": ", ec.message()));
    }
    if (!PathInsideRoots(*path, data_roots)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": \"", *path, "\" is outside the configured data roots (",
          data_roots.empty() ? std::string("none configured") : absl::StrJoin(data_roots, ", "),
          ")"));
    }
  }
  return absl::OkStatus();
}

int64_t TotalSteps(const RunSpec& spec, int64_t steps_per_epoch) {
  if (spec.train.epochs > 0 && steps_per_epoch > 0) return spec.train.epochs * steps_per_epoch;
  return spec.train.steps;
}

std::string RedactCommandEnv(const std::string& toml_text) {
  absl::StatusOr<toml::table> root = ParseTomlText(toml_text);
  if (!root.ok()) return "";
  toml::table* command = (*root)["command"].as_table();
  toml::table* env = command != nullptr ? (*command)["env"].as_table() : nullptr;
  if (env == nullptr || env->empty()) return toml_text;
  std::vector<std::string> keys;
  for (auto&& [key, value] : *env) keys.emplace_back(key.str());
  for (const std::string& key : keys) env->insert_or_assign(key, "<redacted>");
  std::ostringstream out;
  out << "# command.env values redacted for viewer tokens\n" << toml::toml_formatter(*root) << "\n";
  return out.str();
}

}  // namespace trainsup
