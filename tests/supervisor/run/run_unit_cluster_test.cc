// The run unit's side of a multi-node job (run_unit_cluster.cc): the
// rendezvous before launch, the job's one verdict followed, a grow told
// early or for another generation, a job that finished without this node.
#include "tests/supervisor/run/run_unit_fakes.h"

namespace trainsup::supervisor {
namespace {

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

// Launches generation `generation` of a 2 x 1 job (node rank 0) and
// returns its rank's pid.
int JoinAndLaunch(RunUnit& u, FakeCluster::Calls& calls, FakeEnv& env, int64_t generation) {
  u.Start({0}, {""});
  env.Settle();
  Agreement a;
  a.generation = generation;
  a.node_rank = 0;
  a.nodes = {"a", "b"};
  a.master_addr = "10.0.0.1";
  a.master_port = 29999;
  calls.join_done(a);
  env.Settle();
  return u.ranks().empty() ? -1 : u.ranks()[0].pid;
}

// The job's verdict is the run's: a failure ends it FAILED with the job's
// reason (no local restart decision), a cancel CANCELLED.
TEST_F(RunUnitTest, TheJobsFailAndCancelVerdictsEndTheRun) {
  for (ClusterVerdict::Kind kind : {ClusterVerdict::Kind::kFail, ClusterVerdict::Kind::kCancel}) {
    auto calls = UseFakeCluster();
    auto u = NewUnit(ClusterRunSpec(2, 1));
    const int pid = JoinAndLaunch(*u, *calls, env_, 4);
    ASSERT_GT(pid, 0);
    env_.Exit(*u, 0, pid, true, 3);
    env_.Settle();
    ASSERT_EQ(calls->verdicts.size(), 1u);
    ClusterVerdict v;
    v.kind = kind;
    v.generation = 5;
    v.restarts = 11;
    v.reason = kind == ClusterVerdict::Kind::kFail ? "restart budget exhausted" : "cancelled on b";
    calls->verdict_done(v);
    env_.Settle();
    if (kind == ClusterVerdict::Kind::kFail) {
      EXPECT_EQ(u->run().state(), v1::RUN_STATE_FAILED);
      EXPECT_THAT(u->run().reason(), HasSubstr("job generation 5: restart budget exhausted"));
    } else {
      EXPECT_EQ(u->run().state(), v1::RUN_STATE_CANCELLED);
      EXPECT_EQ(u->run().reason(), "cancelled on b");
    }
    EXPECT_TRUE(env_.Stored(v1::EVENT_KIND_RESTART).empty());
  }
}

// A grow told for a generation other than the one whose ranks then run is
// dropped: the ranks of generation 2 are not stopped for generation 1's.
TEST_F(RunUnitTest, AGrowToldForAnotherGenerationIsDropped) {
  auto calls = UseFakeCluster();
  auto u = NewUnit(ClusterRunSpec(2, 1, /*min_nodes=*/1));
  u->Start({0}, {""});
  env_.Settle();
  calls->events.grow(1, "node b rejoined");
  Agreement a;
  a.generation = 2;
  a.node_rank = 0;
  a.nodes = {"a"};
  a.master_addr = "10.0.0.1";
  a.master_port = 29999;
  calls->join_done(a);
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 1u);
  EXPECT_TRUE(env_.signals.empty()) << "generation 2's rank runs on";
  EXPECT_TRUE(u->ranks()[0].alive);
  // Told for its own generation while it runs: it stops at a checkpoint.
  calls->events.grow(2, "node b rejoined");
  env_.Settle();
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0].second, SIGTERM);
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
