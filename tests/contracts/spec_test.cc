#include "contracts/spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace trainsup {
namespace {

std::string Error(const std::string& toml) {
  absl::StatusOr<RunSpec> spec = ParseRunSpec(toml);
  EXPECT_FALSE(spec.ok()) << toml;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(RunSpec, EmptyGivesDefaults) {
  absl::StatusOr<RunSpec> spec = ParseRunSpec("");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "run");
  EXPECT_EQ(spec->world_size, 1);
  EXPECT_EQ(spec->model.arch, "minkunet14");
  EXPECT_EQ(spec->data.format, "synthetic");
  EXPECT_EQ(spec->train.steps, 100);
  EXPECT_EQ(spec->train.device, "auto");
  EXPECT_EQ(spec->train.precision, "fp32");
  EXPECT_TRUE(spec->train.background_checkpoints);
  EXPECT_TRUE(spec->train.tf32);
  EXPECT_EQ(spec->train.empty_cache_every_steps, 0);
  EXPECT_EQ(spec->testing.crash_at_step, -1);
}

TEST(RunSpec, ReadsEveryTable) {
  absl::StatusOr<RunSpec> spec = ParseRunSpec(R"(
name = "room-seg_2"
priority = 5
world_size = 2
[model]
arch = "minkunet34"
in_channels = 6
num_classes = 13
voxel_size = 0.02
gradient_checkpointing = true
[data]
format = "ply"
path = "/data/b9.ply"
label_property = "label"
ignore_label = 255
val_fraction = 0.1
[optimizer]
kind = "adamw"
lr = 1e-3
weight_decay = 0.01
schedule = "cosine"
warmup_steps = 10
[train]
batch_size = 4
steps = 1000
checkpoint_every_steps = 100
checkpoint_every_seconds = 600
memory_budget_mb = 2048
deterministic = false
seed = 7
device = "cuda"
empty_cache_every_steps = 25
precision = "bf16"
background_checkpoints = false
tf32 = false
[testing]
exit_at_step = 3
exit_code = 75
step_ms = 20
only_attempt = 1
checkpoint_delay_ms = 250
[distributed]
checkpoint_timeout_s = 7200
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "room-seg_2");
  EXPECT_EQ(spec->priority, 5);
  EXPECT_EQ(spec->world_size, 2);
  EXPECT_EQ(spec->model.arch, "minkunet34");
  EXPECT_EQ(spec->model.num_classes, 13);
  EXPECT_DOUBLE_EQ(spec->model.voxel_size, 0.02);
  EXPECT_TRUE(spec->model.gradient_checkpointing);
  EXPECT_EQ(spec->data.format, "ply");
  EXPECT_EQ(spec->data.ignore_label, 255);
  EXPECT_EQ(spec->optimizer.kind, "adamw");
  EXPECT_DOUBLE_EQ(spec->optimizer.lr, 1e-3);
  EXPECT_EQ(spec->train.memory_budget_mb, 2048);
  EXPECT_FALSE(spec->train.deterministic);
  EXPECT_EQ(spec->train.device, "cuda");
  EXPECT_EQ(spec->train.empty_cache_every_steps, 25);
  EXPECT_EQ(spec->train.precision, "bf16");
  EXPECT_FALSE(spec->train.background_checkpoints);
  EXPECT_FALSE(spec->train.tf32);
  EXPECT_EQ(spec->testing.exit_code, 75);
  EXPECT_EQ(spec->testing.only_attempt, 1);
  EXPECT_EQ(spec->testing.checkpoint_delay_ms, 250);
  EXPECT_DOUBLE_EQ(spec->distributed.checkpoint_timeout_s, 7200);
}

TEST(RunSpec, ErrorsNameTheField) {
  EXPECT_EQ(Error("[train]\nbatch_size = 0\n"), "train.batch_size: must be in [1, 4096], got 0");
  EXPECT_EQ(Error("[model]\narhc = \"x\"\n"), "model.arhc: unknown key");
  EXPECT_EQ(Error("colour = 1\n"), "colour: unknown key");
  EXPECT_EQ(Error("[trian]\nsteps = 1\n"), "trian: unknown key");
  EXPECT_EQ(Error("[optimizer]\nlr = 0\n"), "optimizer.lr: must be in (0, 1e+06], got 0");
  EXPECT_EQ(Error("[optimizer]\nlr = \"fast\"\n"), "optimizer.lr: must be a number");
  EXPECT_EQ(Error("[optimizer]\nmomentum = 1.0\n"), "optimizer.momentum: must be in [0, 1), got 1");
  EXPECT_EQ(Error("world_size = 65\n"), "world_size: must be in [1, 64], got 65");
  EXPECT_EQ(Error("model = 3\n"), "model: must be a table");
  EXPECT_EQ(Error("[train]\ndeterministic = 1\n"), "train.deterministic: must be true or false");
  EXPECT_EQ(Error("name = \"a b\"\n"),
            "name: may contain only letters, digits, '.', '_' and '-'; got \"a b\"");
  EXPECT_EQ(Error("[data]\nformat = \"ply\"\n"), "data.path: required for format \"ply\"");
  EXPECT_EQ(Error("[model]\narch = \"resnet\"\n"),
            "model.arch: must be one of minkunet14, minkunet18, minkunet34, minkunet50; got "
            "\"resnet\"");
  EXPECT_EQ(Error("[optimizer]\nlr = nan\n"), "optimizer.lr: must be in (0, 1e+06], got nan");
  EXPECT_EQ(Error("[train]\ndevice = \"gpu\"\n"),
            "train.device: must be one of auto, cpu, cuda; got \"gpu\"");
  EXPECT_EQ(Error("[train]\nprecision = \"fp8\"\n"),
            "train.precision: must be one of fp32, bf16, fp16; got \"fp8\"");
  EXPECT_EQ(Error("[train]\nloss_scale_init = 0.5\n"),
            "train.loss_scale_init: must be in [1, 1.67772e+07], got 0.5");
  EXPECT_EQ(Error("[guard]\nmin_loss_scale = 0\n"),
            "guard.min_loss_scale: must be in (0, 65536], got 0");
  EXPECT_EQ(Error("[guard]\nmax_overflow_streak = 0\n"),
            "guard.max_overflow_streak: must be in [1, 1000000], got 0");
  EXPECT_EQ(Error("[train]\nbackground_checkpoints = \"yes\"\n"),
            "train.background_checkpoints: must be true or false");
  EXPECT_EQ(Error("[train]\nempty_cache_every_steps = -1\n"),
            "train.empty_cache_every_steps: must be in [0, 1000000000], got -1");
  EXPECT_EQ(Error("[distributed]\ncheckpoint_timeout_s = 0\n"),
            "distributed.checkpoint_timeout_s: must be in [1, 86400], got 0");
  EXPECT_EQ(Error("[testing]\ncheckpoint_delay_ms = 600001\n"),
            "testing.checkpoint_delay_ms: must be in [0, 600000], got 600001");
  EXPECT_NE(Error("name = \n").find("spec: not valid TOML at line 1"), std::string::npos);
}

TEST(RunSpec, DataFilesHaveASizeLimit) {
  EXPECT_EQ(ParseRunSpec("")->data.max_file_mb, 4096);
  absl::StatusOr<RunSpec> spec = ParseRunSpec("[data]\nmax_file_mb = 100\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.max_file_mb, 100);
  EXPECT_EQ(Error("[data]\nmax_file_mb = 0\n"), "data.max_file_mb: must be in [1, 1048576], got 0");
  EXPECT_EQ(Error("[data]\nmax_file_mb = 1048577\n"),
            "data.max_file_mb: must be in [1, 1048576], got 1048577");
}

// toml++ 3.3.0 reaches undefined behaviour on some non-ASCII characters
// where whitespace may stand (contracts/toml_guard.h); the spec refuses them
// before toml++ sees them, naming where they are. Inside strings and
// comments they are fine.
TEST(RunSpec, NonAsciiOutsideStringsIsRefusedWithItsPosition) {
  EXPECT_NE(Error("\xc3\xa9").find("spec: non-ASCII character U+00E9 at line 1, column 1"),
            std::string::npos)
      << Error("\xc3\xa9");
  const std::string message = Error("name = \"caf\xc3\xa9\"\n[train]\nsteps = 10 \xc3\xa9\n");
  EXPECT_NE(message.find("line 3, column 12"), std::string::npos) << message;
  const std::string continued = Error("name = \"\"\"a\\\n\xc3\xa9\"\"\"\n");
  EXPECT_NE(continued.find("line 2, column 1"), std::string::npos) << continued;
  absl::StatusOr<RunSpec> fine = ParseRunSpec(
      "# caf\xc3\xa9\nname = \"r\" # \xce\xbb\n[data]\nlabel_property = 'caf\xc3\xa9'\n");
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->data.label_property, "caf\xc3\xa9");
}

TEST(RunSpec, PathsStayInsideDataRoots) {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() / ("spec_test_" + std::to_string(getpid()));
  fs::create_directories(root / "data");
  fs::create_directories(root / "other");
  std::ofstream(root / "data" / "a.ply") << "ply\n";
  fs::create_symlink(root / "other", root / "data" / "escape");

  RunSpec spec;
  spec.data.format = "ply";
  spec.data.path = (root / "data" / "a.ply").string();
  EXPECT_TRUE(CheckSpecPaths(spec, {(root / "data").string()}).ok());

  absl::Status none = CheckSpecPaths(spec, {});
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("none configured"), absl::string_view::npos);

  spec.data.path = (root / "data" / ".." / "other" / "x.ply").string();
  absl::Status dotdot = CheckSpecPaths(spec, {(root / "data").string()});
  EXPECT_EQ(dotdot.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dotdot.message().find("data.path:"), absl::string_view::npos);

  spec.data.path = (root / "data" / "escape" / "x.ply").string();
  EXPECT_FALSE(CheckSpecPaths(spec, {(root / "data").string()}).ok()) << "symlink escape";

  // A root that is a prefix of the path string but not a parent directory.
  spec.data.path = (root / "data2" / "x.ply").string();
  EXPECT_FALSE(CheckSpecPaths(spec, {(root / "data").string()}).ok());

  spec.data.path = "relative/a.ply";
  EXPECT_NE(CheckSpecPaths(spec, {"/"}).message().find("absolute"), absl::string_view::npos);
  fs::remove_all(root);
}

TEST(RunSpec, ReadsACommandRun) {
  absl::StatusOr<RunSpec> spec = ParseRunSpec(
      "name = \"mine\"\nworld_size = 2\n[command]\n"
      "argv = [\"python3\", \"train.py\", \"--lr\", \"0.1\"]\ncwd = \"/data/project\"\n"
      "total_steps = 5000\nheartbeats = true\n"
      "[command.env]\nPYTHONPATH = \"/data/project/lib\"\nOMP_NUM_THREADS = \"4\"\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->has_command);
  EXPECT_EQ(spec->world_size, 2);
  EXPECT_EQ(spec->command.argv, (std::vector<std::string>{"python3", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(spec->command.cwd, "/data/project");
  EXPECT_EQ(spec->command.total_steps, 5000);
  EXPECT_TRUE(spec->command.heartbeats);
  EXPECT_EQ(spec->command.env, (std::map<std::string, std::string>{
                                   {"OMP_NUM_THREADS", "4"}, {"PYTHONPATH", "/data/project/lib"}}));

  absl::StatusOr<RunSpec> minimal = ParseRunSpec("[command]\nargv = [\"/bin/true\"]\n");
  ASSERT_TRUE(minimal.ok()) << minimal.status();
  EXPECT_TRUE(minimal->has_command);
  EXPECT_EQ(minimal->command.cwd, "");
  EXPECT_TRUE(minimal->command.env.empty());
  EXPECT_EQ(minimal->command.total_steps, 0);
  EXPECT_FALSE(minimal->command.heartbeats);
  EXPECT_FALSE(ParseRunSpec("")->has_command);
}

TEST(RunSpec, CommandErrorsNameTheField) {
  const std::string head = "[command]\nargv = [\"/bin/true\"]\n";
  EXPECT_EQ(Error("[command]\ncwd = \"/tmp\"\n"), "command.argv: required");
  EXPECT_EQ(Error("[command]\nargv = []\n"), "command.argv: must have 1 to 256 entries, got 0");
  EXPECT_EQ(Error("[command]\nargv = \"python3 train.py\"\n"),
            "command.argv: must be an array of strings");
  EXPECT_EQ(Error("[command]\nargv = [\"python3\", 3]\n"), "command.argv[1]: must be a string");
  EXPECT_EQ(Error("[command]\nargv = [\"python3\", \"\"]\n"), "command.argv[1]: must not be empty");
  EXPECT_EQ(Error("[command]\nargv = [\"a\\u0000b\"]\n"), "command.argv[0]: must not contain NUL");
  std::string many = "[command]\nargv = [";
  for (int i = 0; i < 257; ++i) many += "\"x\",";
  many += "]\n";
  EXPECT_EQ(Error(many), "command.argv: must have 1 to 256 entries, got 257");
  EXPECT_EQ(Error(head + "cwd = \"project\"\n"),
            "command.cwd: must be an absolute path, got \"project\"");
  EXPECT_EQ(Error(head + "total_steps = -1\n"),
            "command.total_steps: must be in [0, 1000000000000], got -1");
  EXPECT_EQ(Error(head + "heartbeats = \"yes\"\n"), "command.heartbeats: must be true or false");
  EXPECT_EQ(Error(head + "argc = 1\n"), "command.argc: unknown key");
  EXPECT_EQ(Error(head + "env = 3\n"), "command.env: must be a table of strings");
  EXPECT_EQ(Error(head + "[command.env]\nSEED = 3\n"), "command.env.SEED: must be a string");
  EXPECT_EQ(Error(head + "[command.env]\n\"1X\" = \"a\"\n"),
            "command.env.1X: not a variable name (must match [A-Za-z_][A-Za-z0-9_]*)");
  EXPECT_EQ(Error(head + "[command.env]\n\"A-B\" = \"a\"\n"),
            "command.env.A-B: not a variable name (must match [A-Za-z_][A-Za-z0-9_]*)");
  for (const char* reserved : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                               "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"}) {
    EXPECT_EQ(Error(head + "[command.env]\n" + reserved + " = \"1\"\n"),
              std::string("command.env.") + reserved +
                  ": set by trainsupd for every rank; cannot be overridden");
  }
  EXPECT_EQ(Error(head + "[command.env]\nTRAINSUP_TOKEN = \"x\"\n"),
            "command.env.TRAINSUP_TOKEN: TRAINSUP_* variables are set by trainsupd");
  EXPECT_EQ(Error(head + "[command.env]\nLD_PRELOAD = \"/tmp/x.so\"\n"),
            "command.env.LD_PRELOAD: not allowed: it would load other code into the allowed "
            "program");
  EXPECT_EQ(Error(head + "[command.env]\nLD_LIBRARY_PATH = \"/tmp\"\n"),
            "command.env.LD_LIBRARY_PATH: not allowed: it would load other code into the allowed "
            "program");
  EXPECT_EQ(Error(head + "[command.env]\nA = \"x\\u0000y\"\n"),
            "command.env.A: must not contain NUL");
  EXPECT_EQ(Error("command = 1\n"), "command: must be a table");
  for (const char* other : {"model", "data", "optimizer", "train", "distributed", "testing"}) {
    EXPECT_EQ(Error(head + "[" + other + "]\n"),
              std::string("command: a command run has no [") + other +
                  "] table (the program itself decides what it trains); remove [" + other +
                  "] or [command]");
  }
}

constexpr char kCluster[] =
    "[cluster]\njob = \"scan-a\"\nnodes = 2\nranks_per_node = 3\n"
    "etcd_endpoints = [\"127.0.0.1:2379\", \"etcd-2:2379\"]\n"
    "checkpoint_dir = \"/shared/ckpt/scan-a\"\nlease_ttl_s = 5\nrendezvous_timeout_s = 60\n";

TEST(RunSpec, ReadsAClusterTable) {
  absl::StatusOr<RunSpec> spec = ParseRunSpec(kCluster);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->cluster.present);
  EXPECT_EQ(spec->cluster.job, "scan-a");
  EXPECT_EQ(spec->cluster.nodes, 2);
  EXPECT_EQ(spec->cluster.ranks_per_node, 3);
  EXPECT_EQ(spec->world_size, 6) << "world_size follows nodes x ranks_per_node";
  EXPECT_EQ(spec->cluster.etcd_endpoints,
            (std::vector<std::string>{"127.0.0.1:2379", "etcd-2:2379"}));
  EXPECT_EQ(spec->cluster.checkpoint_dir, "/shared/ckpt/scan-a");
  EXPECT_EQ(spec->cluster.lease_ttl_s, 5);
  EXPECT_EQ(spec->cluster.rendezvous_timeout_s, 60);
  absl::StatusOr<RunSpec> agree = ParseRunSpec(std::string("world_size = 6\n") + kCluster);
  ASSERT_TRUE(agree.ok()) << agree.status();
  absl::StatusOr<RunSpec> local = ParseRunSpec("");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->cluster.present);
}

TEST(RunSpec, ClusterErrorsNameTheField) {
  const std::string ok_rest =
      "etcd_endpoints = [\"127.0.0.1:2379\"]\ncheckpoint_dir = \"/shared/c\"\n";
  EXPECT_EQ(Error("world_size = 4\n" + std::string(kCluster)),
            "world_size: 4 but the [cluster] table makes 2 nodes x 3 ranks = 6; drop world_size "
            "or make them agree");
  EXPECT_EQ(Error("[cluster]\nnodes = 2\n" + ok_rest),
            "cluster.job: required, 1 to 64 of letters, digits, '.', '_' and '-'; got \"\"");
  EXPECT_EQ(Error("[cluster]\njob = \"j\"\ncheckpoint_dir = \"/c\"\n"),
            "cluster.etcd_endpoints: required (host:port of etcd)");
  EXPECT_EQ(Error("[cluster]\njob = \"j\"\netcd_endpoints = [\"etcd\"]\ncheckpoint_dir = "
                  "\"/c\"\n"),
            "cluster.etcd_endpoints: not host:port: \"etcd\"");
  EXPECT_EQ(Error("[cluster]\njob = \"j\"\netcd_endpoints = [\"e:2379\"]\n"),
            "cluster.checkpoint_dir: required, an absolute path on storage every node shares; "
            "got \"\"");
  EXPECT_EQ(Error("[cluster]\njob = \"j\"\nnodes = 0\n" + ok_rest),
            "cluster.nodes: must be in [1, 64], got 0");
  EXPECT_EQ(Error("[cluster]\njob = \"j\"\nnodes = 8\nranks_per_node = 9\n" + ok_rest),
            "cluster: nodes * ranks_per_node is 72, more than 64 ranks");
  EXPECT_EQ(Error("[cluster]\njob = \"j\"\nlease_ttl_s = 1\n" + ok_rest),
            "cluster.lease_ttl_s: must be in [2, 600], got 1");
  EXPECT_EQ(Error("[cluster]\njob = \"j\"\nnode = 1\n" + ok_rest), "cluster.node: unknown key");
}

// Elastic gangs (docs/distributed.md, "Elastic"): the range of gang sizes,
// the [elastic] table, the global batch and the check the worker makes.
TEST(RunSpec, ElasticRangeAndGlobalBatch) {
  absl::StatusOr<RunSpec> fixed = ParseRunSpec("world_size = 4\n[train]\nbatch_size = 3\n");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->min_world_size, 4) << "no elasticity unless asked";
  EXPECT_EQ(GlobalBatch(*fixed), 12) << "today's specs keep their global batch";
  EXPECT_EQ(fixed->elastic.wait_s, 60);
  EXPECT_EQ(fixed->elastic.grow_after_s, 10);
  EXPECT_EQ(fixed->elastic.max_blocked_s, 0) << "waits for the drained slots for ever";
  EXPECT_EQ(ParseRunSpec("[elastic]\nmax_blocked_s = 600\n")->elastic.max_blocked_s, 600);
  EXPECT_EQ(Error("[elastic]\nmax_blocked_s = -5\n"),
            "elastic.max_blocked_s: must be in [0, 604800], got -5");
  EXPECT_TRUE(CheckGangSize(*fixed, 4).ok());
  EXPECT_EQ(CheckGangSize(*fixed, 3).message(),
            "a gang of 3 ranks, but the spec says world_size = 4");

  absl::StatusOr<RunSpec> elastic = ParseRunSpec(
      "world_size = 4\nmin_world_size = 2\n[elastic]\nwait_s = 5\ngrow_after_s = 0.5\n");
  ASSERT_TRUE(elastic.ok()) << elastic.status();
  EXPECT_EQ(elastic->min_world_size, 2);
  EXPECT_EQ(elastic->elastic.wait_s, 5);
  EXPECT_EQ(elastic->elastic.grow_after_s, 0.5);
  EXPECT_EQ(GlobalBatch(*elastic), 8);
  for (int w : {2, 3, 4}) EXPECT_TRUE(CheckGangSize(*elastic, w).ok()) << w;
  EXPECT_EQ(CheckGangSize(*elastic, 1).message(),
            "a gang of 1 ranks, but the spec allows 2 (min_world_size) to 4 (world_size)");
  EXPECT_FALSE(CheckGangSize(*elastic, 5).ok());

  EXPECT_EQ(Error("world_size = 4\nmin_world_size = 5\n"),
            "min_world_size: must be in [1, 4], got 5");
  EXPECT_EQ(Error("min_world_size = 0\n"), "min_world_size: must be in [1, 1], got 0");
  EXPECT_EQ(Error("[elastic]\nwait_s = -1\n"), "elastic.wait_s: must be in [0, 86400], got -1");
  EXPECT_EQ(Error("[elastic]\ngrow = 1\n"), "elastic.grow: unknown key");

  // Several machines: min_nodes (default nodes) makes min_world_size.
  absl::StatusOr<RunSpec> whole = ParseRunSpec(std::string(kCluster) + "min_nodes = 2\n");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->cluster.min_nodes, 2);
  EXPECT_EQ(whole->min_world_size, 6);
  absl::StatusOr<RunSpec> fewer =
      ParseRunSpec(std::string(kCluster) + "min_nodes = 1\n[elastic]\nwait_s = 30\n");
  ASSERT_TRUE(fewer.ok()) << fewer.status();
  EXPECT_EQ(fewer->cluster.min_nodes, 1);
  EXPECT_EQ(fewer->min_world_size, 3);
  EXPECT_EQ(fewer->world_size, 6);
  EXPECT_TRUE(CheckGangSize(*fewer, 3).ok());
  EXPECT_TRUE(CheckGangSize(*fewer, 6).ok());
  EXPECT_EQ(Error(std::string(kCluster) + "min_nodes = 1\n[elastic]\nwait_s = 60\n"),
            "elastic.wait_s: 60 s is not below cluster.rendezvous_timeout_s (60 s): the rendezvous "
            "would fail the job before it could go on with min_nodes");
  EXPECT_FALSE(CheckGangSize(*fewer, 2).ok());
  EXPECT_EQ(Error(std::string(kCluster) + "min_nodes = 3\n"),
            "cluster.min_nodes: must be in [1, 2], got 3");
  EXPECT_EQ(Error("min_world_size = 2\n" + std::string(kCluster)),
            "min_world_size: 2 but the [cluster] table makes 2 nodes x 3 ranks = 6 (min_nodes); "
            "drop min_world_size or make them agree");
}

TEST(RunSpec, ClusterCheckpointDirStaysInsideDataRoots) {
  RunSpec spec;
  spec.cluster.present = true;
  spec.cluster.checkpoint_dir = "/definitely/not/a/root/ckpt";
  absl::Status outside = CheckSpecPaths(spec, {"/tmp"});
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(outside.message().rfind("cluster.checkpoint_dir: ", 0), 0u) << outside.message();
}

TEST(RunSpec, CommandCwdStaysInsideDataRoots) {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() / ("spec_cwd_test_" + std::to_string(getpid()));
  fs::create_directories(root / "data" / "project");
  fs::create_directories(root / "other");
  RunSpec spec;
  spec.has_command = true;
  spec.command.argv = {"/bin/true"};
  EXPECT_TRUE(CheckSpecPaths(spec, {}).ok()) << "no cwd: the run directory";
  spec.command.cwd = (root / "data" / "project").string();
  EXPECT_TRUE(CheckSpecPaths(spec, {(root / "data").string()}).ok());
  spec.command.cwd = (root / "other").string();
  absl::Status outside = CheckSpecPaths(spec, {(root / "data").string()});
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(outside.message().rfind("command.cwd: ", 0), 0u) << outside.message();
  fs::remove_all(root);
}

}  // namespace
}  // namespace trainsup

namespace trainsup {
namespace {

absl::StatusOr<RunSpec> ParseWith(const std::string& tables) {
  return ParseRunSpec("name = \"g\"\n" + tables);
}

std::string GuardError(const std::string& tables) {
  absl::StatusOr<RunSpec> s = ParseWith(tables);
  return s.ok() ? "" : std::string(s.status().message());
}

TEST(RunSpecGuard, DefaultsAndEveryKey) {
  absl::StatusOr<RunSpec> d = ParseWith("");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->guard.check_finite);
  EXPECT_EQ(d->guard.spike_factor, 6);
  EXPECT_EQ(d->guard.max_bad_steps, 3);
  EXPECT_TRUE(d->data.skip_windows.empty());
  absl::StatusOr<RunSpec> s = ParseWith(
      "[guard]\ncheck_finite = false\nspike_factor = 0\nspike_window = 10\nspike_warmup = 7\n"
      "max_bad_steps = 2\nbad_window = 9\nmax_rollbacks = 0\nskip_batches = 4\n"
      "lr_factor_on_rollback = 0.5\n[data]\nskip_windows = [[3, 5], [9, 9]]\n"
      "[testing]\nnan_loss_at_step = 2\nnan_grad_at_step = 3\nloss_spike_at_step = 4\n"
      "report_version = \"9.1.0\"\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->guard.check_finite);
  EXPECT_EQ(s->guard.spike_factor, 0);
  EXPECT_EQ(s->guard.spike_window, 10);
  EXPECT_EQ(s->guard.spike_warmup, 7);
  EXPECT_EQ(s->guard.max_bad_steps, 2);
  EXPECT_EQ(s->guard.bad_window, 9);
  EXPECT_EQ(s->guard.max_rollbacks, 0);
  EXPECT_EQ(s->guard.skip_batches, 4);
  EXPECT_EQ(s->guard.lr_factor_on_rollback, 0.5);
  EXPECT_EQ(s->data.skip_windows, (std::vector<StepWindow>{{3, 5}, {9, 9}}));
  EXPECT_EQ(s->testing.nan_loss_at_step, 2);
  EXPECT_EQ(s->testing.nan_grad_at_step, 3);
  EXPECT_EQ(s->testing.loss_spike_at_step, 4);
  EXPECT_EQ(s->testing.report_version, "9.1.0");
}

TEST(RunSpecGuard, ErrorsNameTheField) {
  EXPECT_EQ(GuardError("[guard]\nspike_factor = 1.2\n"),
            "guard.spike_factor: must be 0 (off) or in [1.5, 1000000], got 1.2");
  EXPECT_EQ(GuardError("[guard]\nmax_bad_steps = 5\nbad_window = 4\n"),
            "guard.max_bad_steps: 5 bad steps can never fit in guard.bad_window = 4");
  EXPECT_EQ(GuardError("[guard]\nlr_factor_on_rollback = 0\n"),
            "guard.lr_factor_on_rollback: must be in (0, 1], got 0");
  EXPECT_EQ(GuardError("[guard]\nspike_windw = 3\n"), "guard.spike_windw: unknown key");
  EXPECT_EQ(GuardError("[data]\nskip_windows = [[5, 3]]\n"),
            "data.skip_windows[0]: must have 1 <= first <= last <= 1000000000, got [5, 3]");
  EXPECT_EQ(GuardError("[data]\nskip_windows = [[1, 2], [3]]\n"),
            "data.skip_windows[1]: must be a pair of integers [first, last]");
  EXPECT_EQ(GuardError("[data]\nskip_windows = [[1.5, 2]]\n"),
            "data.skip_windows[0]: must be a pair of integers [first, last]");
  EXPECT_EQ(GuardError("[data]\nskip_windows = 3\n"),
            "data.skip_windows: must be an array of at most 1000 [first, last] step pairs");
}

TEST(RunSpecGuard, ACommandRunTakesTheRollbackKeys) {
  absl::StatusOr<RunSpec> s = ParseWith(
      "[command]\nargv = [\"python3\", \"train.py\"]\n[guard]\nmax_rollbacks = 2\n"
      "skip_batches = 50\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->guard.max_rollbacks, 2);
  EXPECT_EQ(s->guard.skip_batches, 50);
}

TEST(StepWindows, FormatAndParseRoundTripAndBadEntriesAreNamed) {
  const std::vector<StepWindow> w = {{40, 59}, {80, 80}};
  EXPECT_EQ(FormatStepWindows(w), "40-59,80-80");
  absl::StatusOr<std::vector<StepWindow>> back = ParseStepWindows("40-59,80-80");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, w);
  EXPECT_TRUE(ParseStepWindows("")->empty());
  for (const char* bad : {"40", "40-", "0-3", "9-3", "1-2,x", "1-2-3", "-1-2"}) {
    absl::StatusOr<std::vector<StepWindow>> p = ParseStepWindows(bad);
    EXPECT_FALSE(p.ok()) << bad;
  }
  EXPECT_EQ(ParseStepWindows("1-2,9-3").status().message(),
            "skip windows: \"9-3\" is not FIRST-LAST with 1 <= FIRST <= LAST");
  EXPECT_TRUE(InStepWindows(w, 40));
  EXPECT_TRUE(InStepWindows(w, 59));
  EXPECT_TRUE(InStepWindows(w, 80));
  EXPECT_FALSE(InStepWindows(w, 60));
  EXPECT_FALSE(InStepWindows(w, 39));
}

}  // namespace
}  // namespace trainsup
