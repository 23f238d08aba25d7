// A worker's argv and environment, from the attempt's facts.
#include "supervisor/policy/launch_plan.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

WorkerLaunch Facts() {
  WorkerLaunch w;
  w.binary = "/usr/bin/trainsup-worker";
  w.run_id = "r-1";
  w.run_dir = "/state/runs/r-1";
  w.attempt = 3;
  w.rank = 1;
  w.world_size = 2;
  w.supervisor_endpoint = "unix:/state/run/trainsupd.sock";
  w.resume_step = 40;
  w.token = "t0k3n";
  w.gpu = "GPU-1";
  w.master_port = 29517;
  w.daemon_env = {
      {"PATH", "/opt/bin"}, {"HOME", "/root"}, {"SECRET", "x"}, {"LD_PRELOAD", "evil.so"}};
  return w;
}

TEST(BuildWorkerLaunch, ArgvFollowsTheWorkerContract) {
  LaunchSpec s = BuildWorkerLaunch(Facts());
  EXPECT_EQ(s.binary, "/usr/bin/trainsup-worker");
  const std::vector<std::string> argv = {"--run-dir",    "/state/runs/r-1",
                                         "--rank",       "1",
                                         "--world-size", "2",
                                         "--attempt",    "3",
                                         "--supervisor", "unix:/state/run/trainsupd.sock",
                                         "--resume",     "40"};
  EXPECT_EQ(s.args, argv);
  EXPECT_EQ(s.working_dir, "/state/runs/r-1");
  EXPECT_EQ(s.log_path, "/state/runs/r-1/attempts/3/rank-1.log");
  WorkerLaunch fresh = Facts();
  fresh.resume_step = -1;
  EXPECT_EQ(BuildWorkerLaunch(fresh).args.back(), "none");
}

TEST(BuildWorkerLaunch, EnvironmentIsBuiltNotInherited) {
  LaunchSpec s = BuildWorkerLaunch(Facts());
  EXPECT_EQ(s.env.at("PATH"), "/opt/bin");
  EXPECT_EQ(s.env.at("HOME"), "/root");
  EXPECT_EQ(s.env.count("SECRET"), 0u);
  EXPECT_EQ(s.env.count("LD_PRELOAD"), 0u);
  EXPECT_EQ(s.env.at("TRAINSUP_TOKEN"), "t0k3n");
  EXPECT_EQ(s.env.at("TRAINSUP_RUN_ID"), "r-1");
  EXPECT_EQ(s.env.at("TRAINSUP_ATTEMPT"), "3");
  EXPECT_EQ(s.env.at("CUDA_VISIBLE_DEVICES"), "GPU-1");
  EXPECT_EQ(s.env.at("RANK"), "1");
  EXPECT_EQ(s.env.at("LOCAL_RANK"), "1");
  EXPECT_EQ(s.env.at("WORLD_SIZE"), "2");
  EXPECT_EQ(s.env.at("MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(s.env.at("MASTER_PORT"), "29517");
  EXPECT_EQ(s.env.at("TRAINSUP_DATA_ROOTS"), "") << "no roots: no data file may be read";
  EXPECT_EQ(s.env.count("TRAINSUP_MEMORY_BUDGET_MB"), 0u);
}

// Issue 41: NCCL's and PyTorch's NCCL settings reach the worker from the
// daemon's environment, never a variable that loads a plugin; the caching
// allocator's settings come from the spec, else the daemon, else ours.
TEST(BuildWorkerLaunch, NcclSettingsAndTheAllocatorsConf) {
  WorkerLaunch w = Facts();
  w.daemon_env = {{"NCCL_DEBUG", "INFO"},
                  {"NCCL_IB_HCA", "mlx5_0"},
                  {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"},
                  {"TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"},
                  {"NCCL_NET_PLUGIN", "/tmp/evil.so"},
                  {"NCCL_TUNER_PLUGIN", "x"},
                  {"NCCL_PROFILER_PLUGIN", "x"},
                  {"NCCL_NET", "evil"},
                  {"NCCLX", "no"},
                  {"PATH", "/opt/bin"}};
  LaunchSpec s = BuildWorkerLaunch(w);
  EXPECT_EQ(s.env.at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(s.env.at("NCCL_IB_HCA"), "mlx5_0");
  EXPECT_EQ(s.env.at("TORCH_NCCL_DUMP_ON_TIMEOUT"), "1");
  EXPECT_EQ(s.env.at("TORCH_NCCL_TRACE_BUFFER_SIZE"), "2000");
  for (const char* refused :
       {"NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_NET", "NCCLX"}) {
    EXPECT_EQ(s.env.count(refused), 0u) << refused;
  }
  EXPECT_EQ(s.env.at("PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:True");
  w.daemon_env["PYTORCH_CUDA_ALLOC_CONF"] = "garbage_collection_threshold:0.6";
  EXPECT_EQ(BuildWorkerLaunch(w).env.at("PYTORCH_CUDA_ALLOC_CONF"),
            "garbage_collection_threshold:0.6");
  w.cuda_alloc_conf = "expandable_segments:False";
  EXPECT_EQ(BuildWorkerLaunch(w).env.at("PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:False");
}

TEST(BuildWorkerLaunch, ARootTheWorkerCannotBeToldLeavesItNone) {
  WorkerLaunch w = Facts();
  w.data_roots = {"/srv/a:b"};
  EXPECT_EQ(BuildWorkerLaunch(w).env.at("TRAINSUP_DATA_ROOTS"), "");
}

TEST(BuildWorkerLaunch, DataRootsBudgetAndDefaultPath) {
  WorkerLaunch w = Facts();
  w.daemon_env.clear();
  w.data_roots = {"/srv/data", "/mnt/scans"};
  w.memory_budget_mb = 900;
  LaunchSpec s = BuildWorkerLaunch(w);
  EXPECT_EQ(s.env.at("PATH"), "/usr/local/bin:/usr/bin:/bin");
  EXPECT_EQ(s.env.at("TRAINSUP_DATA_ROOTS"), "/srv/data:/mnt/scans");
  EXPECT_EQ(s.env.at("TRAINSUP_MEMORY_BUDGET_MB"), "900");
}

TEST(LoweredMemoryBudgetMb, ShrinksPerOomExitOnlyWhenAsked) {
  EXPECT_EQ(LoweredMemoryBudgetMb(1000, 0, 0.5), 0);
  EXPECT_EQ(LoweredMemoryBudgetMb(1000, 1, 0.5), 500);
  EXPECT_EQ(LoweredMemoryBudgetMb(1000, 2, 0.5), 250);
  EXPECT_EQ(LoweredMemoryBudgetMb(1000, 3, 1.0), 0);
  EXPECT_EQ(LoweredMemoryBudgetMb(0, 3, 0.5), 0);
  EXPECT_EQ(LoweredMemoryBudgetMb(2, 10, 0.1), 1);
}

TEST(BuildWorkerLaunch, ACommandRunExecutesItsProgramWithTheTorchrunEnvironment) {
  CommandSpec command;
  command.argv = {"python3", "train.py", "--lr", "0.1"};
  command.cwd = "/data/project";
  command.env = {{"OMP_NUM_THREADS", "4"}, {"PATH", "/data/project/bin:/usr/bin"}};
  command.heartbeats = true;
  WorkerLaunch w = Facts();
  w.command = &command;
  w.program = "/usr/bin/python3";
  w.resume_dir = "/state/runs/r-1/checkpoints/step-40";
  w.data_roots = {"/data"};
  const LaunchSpec s = BuildWorkerLaunch(w);
  EXPECT_EQ(s.binary, "/usr/bin/python3");
  EXPECT_EQ(s.args, (std::vector<std::string>{"train.py", "--lr", "0.1"}));
  EXPECT_EQ(s.working_dir, "/data/project");
  EXPECT_EQ(s.log_path, "/state/runs/r-1/attempts/3/rank-1.log");
  const std::map<std::string, std::string> expected = {
      {"PATH", "/data/project/bin:/usr/bin"},
      {"HOME", "/root"},
      {"OMP_NUM_THREADS", "4"},
      // The allocator's default reaches a script too (issue 41).
      {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"},
      {"TRAINSUP_TOKEN", "t0k3n"},
      {"TRAINSUP_RUN_ID", "r-1"},
      {"TRAINSUP_ATTEMPT", "3"},
      {"CUDA_VISIBLE_DEVICES", "GPU-1"},
      {"RANK", "1"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "2"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29517"},
      {"TRAINSUP_DATA_ROOTS", "/data"},
      {"TRAINSUP_RANK", "1"},
      {"TRAINSUP_WORLD_SIZE", "2"},
      {"TRAINSUP_RUN_DIR", "/state/runs/r-1"},
      {"TRAINSUP_CHECKPOINT_DIR", "/state/runs/r-1/checkpoints"},
      {"TRAINSUP_RESUME_FROM", "/state/runs/r-1/checkpoints/step-40"},
      {"TRAINSUP_SUPERVISOR", "unix:/state/run/trainsupd.sock"},
      {"TRAINSUP_HEARTBEATS", "1"},
      {"TRAINSUP_EXIT_FILE", "/state/runs/r-1/attempts/3/rank-1.exit.json"},
  };
  EXPECT_EQ(s.env, expected);

  // A fresh start without heartbeats, in the run directory.
  command.cwd.clear();
  command.heartbeats = false;
  command.argv = {"/bin/sh"};
  w.resume_dir.clear();
  w.program = "/bin/sh";
  const LaunchSpec fresh = BuildWorkerLaunch(w);
  EXPECT_TRUE(fresh.args.empty());
  EXPECT_EQ(fresh.working_dir, "/state/runs/r-1");
  EXPECT_EQ(fresh.env.at("TRAINSUP_RESUME_FROM"), "");
  EXPECT_EQ(fresh.env.at("TRAINSUP_HEARTBEATS"), "0");
}

}  // namespace
}  // namespace trainsup::supervisor
