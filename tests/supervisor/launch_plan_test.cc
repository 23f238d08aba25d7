// A worker's argv and environment, from the attempt's facts.
#include "supervisor/launch_plan.h"

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

}  // namespace
}  // namespace trainsup::supervisor
