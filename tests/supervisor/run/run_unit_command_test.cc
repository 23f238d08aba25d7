// The run unit with every effect faked, continued from run_unit_test.cc:
// launch failures, command runs (the allowlist, heartbeats or none, SIGUSR1
// before the kill) and a multi-node run.
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
  EXPECT_EQ(env_.launches[0].binary, "/bin/sh");
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

// Node rank 1 of a job of 2 nodes x 2 ranks: it joins before launching,
// starts global ranks 2 and 3 with node 0's MASTER, reports a failure to
// the job, stops its ranks when the job moves on, and takes the job's one
// decision (and restart count) instead of its own.
TEST_F(RunUnitTest, AMultiNodeRunJoinsLaunchesItsGlobalRanksAndFollowsTheJob) {
  auto calls = UseFakeCluster();
  auto u = NewUnit(ClusterRunSpec(2, 2));
  ASSERT_TRUE(u->Queued().has_value());
  EXPECT_EQ(u->Queued()->world_size, 2) << "this node's slots, not the job's";
  u->Start({0, 1}, {"", ""});
  env_.Settle();
  ASSERT_EQ(calls->joins.size(), 1u);
  EXPECT_TRUE(env_.launches.empty()) << "nothing starts before the rendezvous";
  EXPECT_FALSE(u->Queued().has_value());
  Agreement a;
  a.generation = 1;
  a.node_rank = 1;
  a.nodes = {"a", "b"};
  a.master_addr = "10.0.0.1";
  a.master_port = 29999;
  calls->join_done(a);
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const LaunchSpec& l = env_.launches[i];
    EXPECT_EQ(l.env.at("RANK"), std::to_string(2 + i));
    EXPECT_EQ(l.env.at("LOCAL_RANK"), std::to_string(i));
    EXPECT_EQ(l.env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(l.env.at("MASTER_ADDR"), "10.0.0.1");
    EXPECT_EQ(l.env.at("MASTER_PORT"), "29999");
  }
  ASSERT_EQ(u->ranks().size(), 2u);
  EXPECT_EQ(u->ranks()[0].rank, 2);
  const int pid2 = u->ranks()[0].pid, pid3 = u->ranks()[1].pid;
  env_.Exit(*u, 2, pid2, true, 3);
  env_.Settle();
  ASSERT_EQ(calls->broken.size(), 1u);
  EXPECT_EQ(calls->broken[0].first, 1);
  EXPECT_EQ(calls->broken[0].second.cls, ExitClass::kCrash);
  EXPECT_EQ(calls->broken[0].second.detail.rfind("rank 2 ended: ", 0), 0u)
      << calls->broken[0].second.detail;
  // The job moves on; rank 3 (already being stopped) ends.
  calls->events.moved(2, "node b: rank 2 ended", false);
  env_.Exit(*u, 3, pid3, false, SIGTERM);
  env_.Settle();
  ASSERT_EQ(calls->verdicts.size(), 1u);
  EXPECT_EQ(calls->verdicts[0], 1);
  EXPECT_NE(u->run().state(), v1::RUN_STATE_RESTARTING) << "waits for the job's decision";
  ClusterVerdict v;
  v.kind = ClusterVerdict::Kind::kRestart;
  v.generation = 2;
  v.restarts = 5;
  v.delay_s = 0;
  v.reason = "node b: rank 2 ended; restart";
  calls->verdict_done(v);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(u->run().restarts(), 5) << "the job's count";
  EXPECT_GT(calls->reports, 0);
  // A cancel here cancels the whole job.
  bool taken = false;
  u->Cancel("enough", [&](absl::Status s) { taken = s.ok(); });
  env_.Settle();
  EXPECT_TRUE(taken);
  ASSERT_EQ(calls->cancels.size(), 1u);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_CANCELLED);
}

}  // namespace
}  // namespace trainsup::supervisor

namespace trainsup::supervisor {
namespace {

// An elastic multi-node run (min_nodes 1 of 2): the rendezvous agreed on
// node a alone, so the attempt runs 1 rank of WORLD_SIZE 1. Told to take
// node b in, the rank is stopped gracefully (the Stop command); its end
// goes to the job as a requested stop, and the job's grow verdict queues
// the run again at once with no restart counted. A grow told before the
// ranks of its generation run is applied once they do, and a join ended
// because the job finished without this node ends the run SUCCEEDED.
TEST_F(RunUnitTest, AMultiNodeRunShortOfNodesGrowsWithoutCountingARestart) {
  auto calls = UseFakeCluster();
  auto u = NewUnit(ClusterRunSpec(2, 1, /*min_nodes=*/1));
  u->Start({0}, {""});
  env_.Settle();
  ASSERT_EQ(calls->joins.size(), 1u);
  // Told to grow before the ranks of generation 1 run: applied at launch.
  calls->events.grow(1, "node b rejoined");
  Agreement a;
  a.generation = 1;
  a.node_rank = 0;
  a.nodes = {"a"};
  a.master_addr = "10.0.0.1";
  a.master_port = 29999;
  a.resize = "node b left out: only 1 of 2 nodes joined";
  calls->join_done(a);
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 1u);
  EXPECT_EQ(env_.launches[0].env.at("WORLD_SIZE"), "1");
  EXPECT_EQ(env_.launches[0].env.at("RANK"), "0");
  const int pid = u->ranks()[0].pid;
  // No link yet: the graceful stop is SIGTERM, which the worker turns into
  // a stop at a checkpoint.
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0].second, SIGTERM);
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] = ExitFile{143, "stopped", "", 5, 0};
  env_.Exit(*u, 0, pid, true, 143);
  env_.Settle();
  ASSERT_EQ(calls->broken.size(), 1u);
  EXPECT_EQ(calls->broken[0].second.cls, ExitClass::kStopped);
  EXPECT_TRUE(calls->broken[0].second.stop_requested);
  ASSERT_EQ(calls->verdicts.size(), 1u);
  ClusterVerdict v;
  v.kind = ClusterVerdict::Kind::kRestart;
  v.generation = 2;
  v.restarts = 0;
  v.grow = true;
  v.reason = "node b rejoined";
  calls->verdict_done(v);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(u->run().restarts(), 0) << "taking a node in is not a restart";
  ASSERT_TRUE(u->Queued().has_value());
  EXPECT_LE(u->Queued()->not_before_s, env_.NowS()) << "no backoff";
  EXPECT_TRUE(env_.Stored(v1::EVENT_KIND_RESTART).empty());

  // Generation 2 with both nodes: WORLD_SIZE 2, and the change of size is
  // an event.
  u->Start({0}, {""});
  env_.Settle();
  ASSERT_EQ(calls->joins.size(), 2u);
  a.generation = 2;
  a.nodes = {"a", "b"};
  a.resize = "node b rejoined";
  calls->join_done(a);
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 2u);
  EXPECT_EQ(env_.launches[1].env.at("WORLD_SIZE"), "2");
  ASSERT_EQ(env_.Stored(v1::EVENT_KIND_RESIZE).size(), 1u);
  EXPECT_EQ(env_.Stored(v1::EVENT_KIND_RESIZE)[0].reason(),
            "world size 1 \u2192 2: node b rejoined");
  EXPECT_EQ(env_.resizes["grow"], 1);
}

TEST_F(RunUnitTest, ALeftOutNodeWhoseJobFinishedWithoutItSucceeds) {
  auto calls = UseFakeCluster();
  auto u = NewUnit(ClusterRunSpec(2, 1, /*min_nodes=*/1));
  u->Start({0}, {""});
  env_.Settle();
  ASSERT_EQ(calls->joins.size(), 1u);
  Agreement over;
  over.generation = 3;
  over.nodes = {"a"};
  over.finished = true;
  calls->join_done(over);
  env_.Settle();
  EXPECT_TRUE(env_.launches.empty());
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(u->run().reason(),
            "job j finished while this node was left out of generation 3 (a succeeded)");
}

}  // namespace
}  // namespace trainsup::supervisor
