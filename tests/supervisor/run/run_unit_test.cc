// The run unit's transitions with every effect faked (unit_env.h): what it
// stores and when, what it launches, signals, publishes and schedules. No
// processes, sockets or clocks: time moves only when a test says so.
#include "tests/supervisor/run/run_unit_fakes.h"

namespace trainsup::supervisor {
namespace {

TEST_F(RunUnitTest, TheAttemptIsStoredBeforeAnyProcessStarts) {
  auto u = NewUnit();
  ASSERT_TRUE(u->Queued().has_value());
  u->Start({0}, {""});
  env_.Advance(0);  // the checkpoint choice comes back
  ASSERT_EQ(env_.pending.size(), 1u);
  EXPECT_EQ(env_.pending.front().batch.what, "attempt 1 started");
  EXPECT_TRUE(env_.launches.empty()) << "launched before the attempt was stored";
  EXPECT_FALSE(u->Queued().has_value());
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 1u);
  EXPECT_EQ(env_.launches[0].env.at("TRAINSUP_ATTEMPT"), "1");
  EXPECT_EQ(env_.watched.size(), 1u);
  EXPECT_EQ(env_.StoredStates(), std::vector<v1::RunState>{v1::RUN_STATE_STARTING});
  // Published only once stored, with the store's seq numbers.
  for (const v1::RunEvent& e : env_.published) EXPECT_GT(e.seq(), 0);
}

// Defect 7: a write that fails stops the transition; it is retried.
TEST_F(RunUnitTest, AFailedWriteHoldsTheRunUntilItIsStored) {
  auto u = NewUnit();
  env_.fail_writes = 2;
  u->Start({0}, {""});
  env_.Advance(0);
  EXPECT_TRUE(env_.Complete());
  EXPECT_EQ(env_.store_failures, std::vector<std::string>{"attempt 1 started"});
  EXPECT_TRUE(env_.launches.empty());
  env_.Advance(0.3);  // the first retry
  EXPECT_TRUE(env_.Complete());
  EXPECT_EQ(env_.store_failures.size(), 2u);
  EXPECT_TRUE(env_.launches.empty());
  env_.Advance(1);
  env_.Settle();
  EXPECT_EQ(env_.launches.size(), 1u);
}

TEST_F(RunUnitTest, HelloWithTheTokenRunsWrongTokenIsRefused) {
  auto u = NewUnit();
  StartAndLaunch(*u);
  auto link = std::make_shared<FakeLink>();
  wv1::Hello h;
  h.set_run_id(u->id());
  h.set_attempt(1);
  h.set_rank(0);
  h.set_token("wrong");
  h.set_version(std::string(Version()));
  EXPECT_EQ(u->OnHello(h, link).code(), absl::StatusCode::kUnauthenticated);
  h.set_attempt(2);
  h.set_token(u->ranks()[0].token);
  EXPECT_EQ(u->OnHello(h, link).code(), absl::StatusCode::kUnauthenticated);
  // A version the daemon cannot serve: a stranger learns nothing of it
  // (the token is checked first), the rank itself learns why.
  h.set_attempt(1);
  h.set_version("99.0.0");
  h.set_token("wrong");
  EXPECT_EQ(u->OnHello(h, link).code(), absl::StatusCode::kUnauthenticated);
  h.set_token(u->ranks()[0].token);
  const absl::Status refused = u->OnHello(h, link);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("worker version 99.0.0 cannot be served"), std::string::npos)
      << refused;
  EXPECT_TRUE(link->sent.empty()) << "no Welcome to a refused rank";
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_STARTING);
  auto good = Hello(*u, 0);
  ASSERT_FALSE(good->sent.empty());
  EXPECT_TRUE(good->sent[0].has_welcome());
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RUNNING);
}

TEST_F(RunUnitTest, ACrashIsRestartedOnlyAfterItsEndIsStored) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  Hello(*u, 0);
  env_.Exit(*u, 0, pids[0], true, 3);
  // The rank's end, then the attempt's end with the decision, in order.
  ASSERT_EQ(env_.pending.size(), 1u);
  EXPECT_EQ(env_.pending.front().batch.what, "rank 0 ended");
  ASSERT_EQ(env_.released.size(), 1u);
  EXPECT_EQ(env_.released[0].second.pgid, pids[0]);
  env_.Complete();
  ASSERT_EQ(env_.pending.size(), 1u);
  const StoreBatch& end = env_.pending.front().batch;
  EXPECT_EQ(end.what, "attempt 1 ended");
  ASSERT_EQ(end.attempts.size(), 1u);
  EXPECT_EQ(end.attempts[0].exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_FALSE(end.attempts[0].stop_requested());
  ASSERT_TRUE(end.run.has_value());
  EXPECT_EQ(end.run->state(), v1::RUN_STATE_RESTARTING);
  EXPECT_FALSE(u->Queued().has_value()) << "schedulable before the end was stored";
  env_.Complete();
  ASSERT_TRUE(u->Queued().has_value());
  EXPECT_DOUBLE_EQ(u->Queued()->not_before_s, env_.NowS() + 1.0) << "backoff 1 s";
  const int before = env_.reschedules;
  env_.Advance(1.1);
  EXPECT_GT(env_.reschedules, before) << "the scheduler is asked again after the backoff";
  EXPECT_EQ(u->run().restarts(), 1);
  EXPECT_EQ(env_.Stored(v1::EVENT_KIND_RESTART).size(), 1u);
}

TEST_F(RunUnitTest, AFailingRankStopsTheGangWithSigtermThenSigkill) {
  env_.config_.workers.term_grace_s = 2;
  auto u = NewUnit(2);
  std::vector<int> pids = StartAndLaunch(*u);
  ASSERT_EQ(pids.size(), 2u);
  Hello(*u, 0);
  Hello(*u, 1);
  env_.Exit(*u, 1, pids[1], true, 1);
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0], std::make_pair(pids[0], SIGTERM));
  env_.Advance(2.1);
  ASSERT_EQ(env_.signals.size(), 2u);
  EXPECT_EQ(env_.signals[1], std::make_pair(pids[0], SIGKILL));
  env_.Exit(*u, 0, pids[0], false, SIGKILL);
  env_.Settle();
  ASSERT_EQ(u->ranks().size(), 2u);
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_GANG);
  EXPECT_THAT(u->ranks()[0].status.exit_reason(), HasSubstr("stopped because rank 1 ended"));
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
}

// Issue 12: the attempt's end names the rank that failed first in time.
// Rank 1 is declared frozen first; rank 0 then exits 3 on its own while
// rank 1 is being killed (so rank 0 is not a gang stop). In rank order rank
// 0 would be named.
TEST_F(RunUnitTest, TheRestartNamesTheRankThatFailedFirstNotTheLowest) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  env_.config_.workers.term_grace_s = 2;
  auto u = NewUnit(2);
  std::vector<int> pids = StartAndLaunch(*u);
  auto link0 = Hello(*u, 0);
  Hello(*u, 1);
  env_.Advance(4);
  wv1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_progress_counter(1);
  u->OnWorkerMessage(1, 0, link0.get(), hb);
  env_.Advance(2);
  u->CheckLiveness();
  env_.Settle();
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0], std::make_pair(pids[1], SIGTERM)) << "only rank 1 is frozen";
  env_.Exit(*u, 0, pids[0], true, 3);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_CRASH);
  env_.Exit(*u, 1, pids[1], false, SIGTERM);
  env_.Settle();
  EXPECT_EQ(u->ranks()[1].status.exit_class(), v1::EXIT_CLASS_FROZEN);
  ASSERT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  const std::vector<v1::RunEvent> restarts = env_.Stored(v1::EVENT_KIND_RESTART);
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0].exit_class(), v1::EXIT_CLASS_FROZEN);
  EXPECT_THAT(restarts[0].reason(), HasSubstr("rank 1 died first: rank 1 no heartbeat"));
  const std::vector<v1::RunEvent> ended = env_.Stored(v1::EVENT_KIND_ATTEMPT_ENDED);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0].reason(), HasSubstr("rank 1 died first"));
}

// Every attempt of a gang gets one MASTER_PORT for all its ranks, and the
// next attempt a fresh one (the old rendezvous port may still be held).
TEST_F(RunUnitTest, EachAttemptOfAGangGetsOneFreshMasterPort) {
  auto u = NewUnit(2);
  std::vector<int> pids = StartAndLaunch(*u);
  ASSERT_EQ(env_.launches.size(), 2u);
  const std::string first = env_.launches[0].env.at("MASTER_PORT");
  EXPECT_EQ(env_.launches[1].env.at("MASTER_PORT"), first);
  Hello(*u, 0);
  Hello(*u, 1);
  env_.Exit(*u, 1, pids[1], true, 3);
  env_.Exit(*u, 0, pids[0], false, SIGTERM);
  env_.Settle();
  ASSERT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  env_.Advance(1.1);
  StartAndLaunch(*u);
  ASSERT_EQ(u->attempt_number(), 2);
  ASSERT_EQ(env_.launches.size(), 4u);
  EXPECT_EQ(env_.launches[2].env.at("TRAINSUP_ATTEMPT"), "2");
  const std::string second = env_.launches[2].env.at("MASTER_PORT");
  EXPECT_NE(second, first);
  EXPECT_EQ(env_.launches[3].env.at("MASTER_PORT"), second);
}

TEST_F(RunUnitTest, CancelAsksTheWorkerToStopThenEndsCancelled) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  absl::Status answer = absl::UnknownError("not called");
  u->Cancel("by test", [&](absl::Status s) { answer = s; });
  // The request is stored before it is answered or acted on (issue 42, 2).
  EXPECT_EQ(answer.code(), absl::StatusCode::kUnknown);
  env_.Settle();
  EXPECT_TRUE(answer.ok());
  ASSERT_GE(link->sent.size(), 2u);
  EXPECT_TRUE(link->sent.back().has_stop());
  EXPECT_TRUE(env_.signals.empty()) << "a graceful stop starts with the Stop command";
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] = ExitFile{143, "stopped", "", 5, 0};
  env_.Exit(*u, 0, pids[0], true, 143);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(u->run().reason(), "cancelled: by test");
  EXPECT_EQ(env_.finished, std::vector<std::string>{"r-1"});
  const StoreBatch* ended = nullptr;
  for (const StoreBatch& b : env_.stored) {
    if (!b.attempts.empty() && b.attempts[0].ended_ms() != 0) ended = &b;
  }
  ASSERT_NE(ended, nullptr);
  EXPECT_TRUE(ended->attempts[0].stop_requested());
}

TEST_F(RunUnitTest, GracefulShutdownStoresARequestedStopAndGoesBackToPending) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  env_.shutting_down_ = true;
  u->Shutdown();
  env_.Settle();  // the request is stored first
  EXPECT_TRUE(link->sent.back().has_stop());
  env_.Exit(*u, 0, pids[0], true, 143);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_PENDING);
  bool stored_stop = false;
  for (const StoreBatch& b : env_.stored) {
    for (const v1::Attempt& a : b.attempts) stored_stop = stored_stop || a.stop_requested();
  }
  EXPECT_TRUE(stored_stop) << "defect 15: the stop must be stored with the attempt";
}

// Elastic gangs (docs/distributed.md, "Elastic"): a resize is a graceful
// stop of the whole gang, queued again at once without counting a
// restart; the next attempt, at the size the slots allow, says why.
TEST_F(RunUnitTest, AResizeStopsTheGangGracefullyAndTheNextAttemptSaysWhy) {
  RunSpec spec;
  spec.world_size = 3;
  spec.min_world_size = 2;
  spec.elastic.wait_s = 30;
  auto u = NewUnit(spec);
  std::vector<int> pids = StartAndLaunch(*u);
  std::vector<std::shared_ptr<FakeLink>> links;
  for (int r = 0; r < 3; ++r) links.push_back(Hello(*u, r));
  env_.Settle();
  ASSERT_EQ(u->run().state(), v1::RUN_STATE_RUNNING);
  EXPECT_EQ(u->running_world_size(), 3);
  u->Resize("slot cpu:2 drained (maintenance)");
  env_.Settle();  // the request is stored first
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(links[r]->sent.empty());
    EXPECT_TRUE(links[r]->sent.back().has_stop()) << "rank " << r;
  }
  EXPECT_TRUE(env_.signals.empty()) << "a graceful stop starts with the Stop command";
  for (int r = 0; r < 3; ++r) {
    env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, r)] = ExitFile{143, "stopped", "", 5, 0};
    env_.Exit(*u, r, pids[r], true, 143);
  }
  env_.Settle();
  ASSERT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(u->run().restarts(), 0) << "a resize is not a restart";
  std::optional<QueuedRun> q = u->Queued();
  ASSERT_TRUE(q.has_value());
  EXPECT_LE(q->not_before_s, env_.NowS()) << "no backoff";
  EXPECT_EQ(q->world_size, 3);
  EXPECT_EQ(q->min_world_size, 2);
  EXPECT_DOUBLE_EQ(q->shrink_at_s, env_.NowS() + 30);

  u->Start({0, 1}, {"", ""});
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 5u);
  for (size_t i = 3; i < 5; ++i) EXPECT_EQ(env_.launches[i].env.at("WORLD_SIZE"), "2");
  std::vector<std::string> resizes;
  int32_t stored_world = 0;
  for (const StoreBatch& b : env_.stored) {
    for (const v1::RunEvent& e : b.events) {
      if (e.kind() == v1::EVENT_KIND_RESIZE) resizes.push_back(e.reason());
    }
    for (const v1::Attempt& a : b.attempts) {
      if (a.number() == 2) stored_world = a.world_size();
    }
  }
  EXPECT_EQ(resizes,
            std::vector<std::string>{"world size 3 \u2192 2: slot cpu:2 drained (maintenance)"});
  EXPECT_EQ(stored_world, 2);
  EXPECT_EQ(env_.resizes["shrink"], 1);
}

TEST_F(RunUnitTest, NoHeartbeatIsFrozenAndKilled) {
  env_.config_.workers.heartbeat_timeout_s = 5;
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  Hello(*u, 0);
  env_.Advance(4);
  u->CheckLiveness();
  EXPECT_TRUE(env_.signals.empty());
  env_.Advance(2);
  u->CheckLiveness();
  env_.Settle();
  ASSERT_EQ(env_.signals.size(), 1u);
  EXPECT_EQ(env_.signals[0].second, SIGTERM);
  ASSERT_EQ(env_.Stored(v1::EVENT_KIND_HANG).size(), 1u);
  EXPECT_THAT(env_.Stored(v1::EVENT_KIND_HANG)[0].reason(), HasSubstr("no heartbeat"));
  env_.Exit(*u, 0, pids[0], false, SIGTERM);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_FROZEN);
}

TEST_F(RunUnitTest, ExitZeroWithoutHelloIsACrashNotASuccess) {
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  env_.Exit(*u, 0, pids[0], true, 0);
  env_.Settle();
  EXPECT_EQ(u->ranks()[0].status.exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
}

TEST_F(RunUnitTest, NoSpaceWaitsForSpaceWithoutTheBudget) {
  env_.config_.restart.max_restarts = 0;
  auto u = NewUnit();
  std::vector<int> pids = StartAndLaunch(*u);
  Hello(*u, 0);
  env_.free_bytes = int64_t{10} << 20;
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] =
      ExitFile{74, "no_space", "no space left on device", 7, 0};
  env_.Exit(*u, 0, pids[0], true, 74);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING) << u->run().reason();
  EXPECT_TRUE(u->waiting_for_space());
  env_.Advance(1.1);
  env_.Settle();
  EXPECT_GE(env_.space_checks, 1);
  EXPECT_FALSE(u->Queued().has_value());
  int waits = 0;
  for (const v1::RunEvent& e : env_.Stored(v1::EVENT_KIND_LOG)) {
    waits += e.reason().find("waiting for disk space") != std::string::npos;
  }
  EXPECT_EQ(waits, 1);
  env_.free_bytes = int64_t{10} << 30;
  env_.Advance(10);
  env_.Settle();
  EXPECT_FALSE(u->waiting_for_space());
  EXPECT_TRUE(u->Queued().has_value());
}

TEST_F(RunUnitTest, RestoreAdoptsLiveWorkersAndClassifiesDeadOnes) {
  env_.alive.insert(5000);
  v1::Run stored;
  stored.set_run_id("r-2");
  stored.set_state(v1::RUN_STATE_RUNNING);
  stored.set_world_size(2);
  stored.set_run_dir(dir_.path());
  v1::Attempt* a = stored.add_attempts();
  a->set_number(3);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankStatus* rs = a->add_ranks();
    rs->set_rank(rank);
    rs->set_pid(5000 + rank);
    rs->set_alive(true);
    rs->set_slot(rank);
  }
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(3, 1)] = ExitFile{1, "crash", "boom", 2, 0};
  std::vector<RankPrivate> privs = {{5000, 11, "t0"}, {5001, 12, "t1"}};
  auto u = RunUnit::Restore(stored, RunSpec{}, 1, privs, RunLearning{}, env_.env());
  ASSERT_EQ(u->ranks().size(), 2u);
  EXPECT_TRUE(env_.watched.count(5000));
  EXPECT_FALSE(env_.watched.at(5000)) << "an adopted worker is not our child";
  env_.Settle();
  // Rank 1 died while no daemon watched: classified from its exit file,
  // which stops rank 0 (gang).
  EXPECT_FALSE(u->ranks()[1].alive);
  EXPECT_EQ(u->ranks()[1].status.exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_THAT(u->ranks()[1].status.exit_reason(), HasSubstr("boom"));
  ASSERT_FALSE(env_.signals.empty());
  EXPECT_EQ(env_.signals[0], std::make_pair(5000, SIGTERM));
}

}  // namespace
}  // namespace trainsup::supervisor
