// The run unit with every effect faked, continued from run_unit_test.cc:
// launch failures, command runs (the allowlist, heartbeats or none, SIGUSR1
// before the kill) and a multi-node run.
#include <filesystem>

#include "tests/supervisor/run/run_unit_fakes.h"

namespace trainsup::supervisor {
namespace {

TEST_F(RunUnitTest, ALaunchThatFailsEndsTheAttemptAsACrash) {
  env_.fail_launch = true;
  auto u = NewUnit();
  StartAndLaunch(*u);
  env_.Settle();
  ASSERT_EQ(u->ranks().size(), 1u);
  EXPECT_THAT(u->ranks()[0].status.exit_reason(), HasSubstr("cannot start /bin/trainsup-worker"));
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  ASSERT_EQ(env_.released.size(), 1u);
}

TEST_F(RunUnitTest, ACommandWithoutHeartbeatsRunsIsNeverFrozenAndSucceedsOnExitZero) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  auto u = NewCommandUnit(/*heartbeats=*/false);
  std::vector<int> pids = StartAndLaunch(*u);
  ASSERT_EQ(env_.launches.size(), 1u);
  // The file that was checked runs (its real path), under the name given.
  EXPECT_EQ(env_.launches[0].binary, std::filesystem::canonical("/bin/sh").string());
  EXPECT_EQ(env_.launches[0].argv0, "/bin/sh");
  EXPECT_EQ(env_.launches[0].args, (std::vector<std::string>{"-c", "exit 0"}));
  EXPECT_EQ(env_.launches[0].env.at("TRAINSUP_HEARTBEATS"), "0");
  EXPECT_EQ(env_.launches[0].env.at("TRAINSUP_RESUME_FROM"), "");
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RUNNING) << "no Hello is awaited";
  env_.Advance(100000);
  u->CheckLiveness();
  env_.Settle();
  EXPECT_TRUE(env_.signals.empty());
  EXPECT_TRUE(env_.Stored(v1::EVENT_KIND_HANG).empty());
  env_.Exit(*u, 0, pids[0], true, 0);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_SUCCEEDED);
}

TEST_F(RunUnitTest, ACommandOffTheAllowlistAtLaunchFailsToStart) {
  auto u = NewCommandUnit(/*heartbeats=*/false);
  env_.config_.commands.allowed_programs.clear();  // a reload took it away
  StartAndLaunch(*u);
  EXPECT_TRUE(env_.launches.empty());
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_THAT(u->ranks()[0].status.exit_reason(),
              HasSubstr("cannot start /bin/sh: command.argv[0]: no program is allowed to run"));
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
}

// After the Python stacks: SIGTERM, once, and the rank ends as frozen.
void ExpectSigtermThenFrozen(FakeEnv& env, RunUnit& u, int pid) {
  ASSERT_EQ(env.signals.size(), 1u);
  EXPECT_EQ(env.signals[0].second, SIGTERM);
  env.Exit(u, 0, pid, false, SIGTERM);
  env.Settle();
  EXPECT_EQ(u.ranks()[0].status.exit_class(), v1::EXIT_CLASS_FROZEN);
}

TEST_F(RunUnitTest, AHungCommandGetsSigusr1ThenTheUsualKill) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  env_.config_.workers.python_stack_wait_s = 2;
  auto u = NewCommandUnit(/*heartbeats=*/true);
  std::vector<int> pids = StartAndLaunch(*u);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_STARTING) << "a Hello is awaited";
  auto link = Hello(*u, 0);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RUNNING);
  // A heartbeat without a total: the spec's total_steps stands in.
  wv1::WorkerMessage m;
  m.mutable_heartbeat()->set_progress_counter(1);
  m.mutable_heartbeat()->mutable_progress()->set_step(7);
  u->OnWorkerMessage(u->attempt_number(), 0, link.get(), m);
  env_.Settle();
  EXPECT_EQ(u->run().progress().total_steps(), 500);
  EXPECT_EQ(u->run().progress().step(), 7);
  env_.Advance(6);
  u->CheckLiveness();
  env_.Settle();
  ASSERT_EQ(env_.leader_signals.size(), 1u);
  EXPECT_EQ(env_.leader_signals[0], (std::pair<int, int>{pids[0], SIGUSR1}));
  EXPECT_TRUE(env_.signals.empty()) << "SIGTERM before the Python stacks had their moment";
  env_.Advance(2);
  env_.Settle();
  ExpectSigtermThenFrozen(env_, *u, pids[0]);
}

// The wait after SIGUSR1 is for the dump itself: once the rank log holds
// the Python stacks (and stopped growing) the kill goes on, well before
// the cap; a loaded machine that runs the script late gets the whole cap.
TEST_F(RunUnitTest, AHungCommandIsKilledOnceItsPythonStacksAreInTheLog) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  env_.config_.workers.python_stack_wait_s = 30;
  auto u = NewCommandUnit(/*heartbeats=*/true);
  std::vector<int> pids = StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  const std::string log = u->ranks()[0].status.log_path();
  ASSERT_FALSE(log.empty());
  env_.files[log] = "step 1\nstep 2\n";
  env_.Advance(6);
  u->CheckLiveness();
  env_.Settle();
  ASSERT_EQ(env_.leader_signals.size(), 1u);
  env_.Advance(3);  // the script has not run yet: nothing in the log
  EXPECT_TRUE(env_.signals.empty());
  env_.files[log] += "Thread 0x00007f (most recent call first):\n  File \"train.py\", line 9";
  env_.Advance(0.06);  // it is there, but may still be growing
  EXPECT_TRUE(env_.signals.empty());
  env_.files[log] += " in stuck\n";
  env_.Advance(0.06);
  EXPECT_TRUE(env_.signals.empty()) << "it grew";
  env_.Advance(0.06);  // unchanged since the last look: dumped
  env_.Settle();
  ExpectSigtermThenFrozen(env_, *u, pids[0]);
}

TEST_F(RunUnitTest, OurWorkerGetsNoSigusr1) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  auto u = NewUnit();
  StartAndLaunch(*u);
  Hello(*u, 0);
  env_.Advance(6);
  u->CheckLiveness();
  env_.Settle();
  EXPECT_TRUE(env_.leader_signals.empty());
  ASSERT_EQ(env_.signals.size(), 1u);
}

}  // namespace
}  // namespace trainsup::supervisor
