// Requested stops (issue 42): only the exit a stop asks for answers it,
// the request is stored before it is acknowledged and holds for the ranks
// a restarted daemon adopts, and a drain told before any rank runs starts
// nothing on the drained slot.
#include "tests/supervisor/run/run_unit_fakes.h"

namespace trainsup::supervisor {
namespace {

RunSpec ElasticSpec(int world, int min_world) {
  RunSpec spec;
  spec.world_size = world;
  spec.min_world_size = min_world;
  spec.guard.skip_batches = 4;
  return spec;
}

class RunUnitStopTest : public RunUnitTest {
 protected:
  // A run as the store holds it: `state`, one rank (pid 6000) of attempt
  // `attempt` (0: no attempt) alive when stored, and a stop request of
  // `kind` asked of `attempt`.
  v1::Run Stored(const std::string& id, v1::RunState state, int attempt, v1::StopRequest::Kind kind,
                 const std::string& reason) {
    v1::Run stored;
    stored.set_run_id(id);
    stored.set_state(state);
    stored.set_world_size(1);
    stored.set_run_dir(dir_.path());
    stored.mutable_stop_request()->set_kind(kind);
    stored.mutable_stop_request()->set_reason(reason);
    stored.mutable_stop_request()->set_attempt(attempt);
    if (attempt > 0) {
      v1::Attempt* a = stored.add_attempts();
      a->set_number(attempt);
      v1::RankStatus* rs = a->add_ranks();
      rs->set_rank(0);
      rs->set_pid(6000);
      rs->set_alive(true);
    }
    return stored;
  }
  // A gang of two, running, then resized (a drain); rank 0 ends with
  // `code` and its exit file, rank 1 answers the stop with 143.
  std::unique_ptr<RunUnit> ResizedGangEnding(int code, int64_t first_bad_step = -1) {
    auto u = NewUnit(ElasticSpec(2, 1));
    std::vector<int> pids = StartAndLaunch(*u);
    Hello(*u, 0);
    Hello(*u, 1);
    u->Resize("slot cpu:1 drained (bad fan)");
    env_.Settle();
    const RunLayout layout(dir_.path());
    env_.exit_files[layout.ExitFilePath(1, 0)] =
        ExitFile{code, code == 79 ? "diverged" : "x", "seen on the way", 6, 0, first_bad_step};
    env_.exit_files[layout.ExitFilePath(1, 1)] = ExitFile{143, "stopped", "", 6, 0};
    env_.Exit(*u, 0, pids[0], true, code);
    env_.Exit(*u, 1, pids[1], true, 143);
    env_.Settle();
    return u;
  }
};

TEST_F(RunUnitStopTest, OnlyExit143AnswersAResize) {
  auto clean = ResizedGangEnding(143);
  EXPECT_EQ(clean->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(clean->run().restarts(), 0);
  ASSERT_TRUE(clean->Queued().has_value());
  EXPECT_LE(clean->Queued()->not_before_s, env_.NowS()) << "queued again at once";
}

TEST_F(RunUnitStopTest, ADivergedExitWhileResizingIsRolledBack) {
  auto u = ResizedGangEnding(79, /*first_bad_step=*/5);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(u->run().rollbacks(), 1) << "the divergence is not lost to the resize";
  ASSERT_EQ(u->run().skip_windows_size(), 1);
  EXPECT_EQ(u->run().skip_windows(0).first_step(), 5);
  const v1::Attempt* ended = nullptr;
  for (const StoreBatch& b : env_.stored) {
    for (const v1::Attempt& a : b.attempts) {
      if (a.ended_ms() != 0) ended = &a;
    }
  }
  ASSERT_NE(ended, nullptr);
  EXPECT_EQ(ended->exit_class(), v1::EXIT_CLASS_DIVERGED);
  EXPECT_FALSE(ended->stop_requested());
}

TEST_F(RunUnitStopTest, AnOutOfMemoryExitWhileResizingIsAnOutOfMemoryRestart) {
  auto u = ResizedGangEnding(75);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  EXPECT_EQ(u->run().oom_restarts(), 1);
  EXPECT_EQ(u->run().restarts(), 1);
  EXPECT_EQ(env_.Stored(v1::EVENT_KIND_RESTART).size(), 1u);
}

TEST_F(RunUnitStopTest, ACrashWhileResizingIsACountedRestart) {
  auto u = ResizedGangEnding(3);
  EXPECT_EQ(u->run().restarts(), 1);
  ASSERT_EQ(env_.Stored(v1::EVENT_KIND_RESTART).size(), 1u);
  EXPECT_THAT(env_.Stored(v1::EVENT_KIND_RESTART)[0].reason(), HasSubstr("while stopping"));
}

// The cancel is stored in the run before it is answered OK or sent to the
// ranks; the stored run holds it.
TEST_F(RunUnitStopTest, ACancelIsStoredBeforeItIsAnswered) {
  auto u = NewUnit();
  StartAndLaunch(*u);
  auto link = Hello(*u, 0);
  const size_t sent = link->sent.size();
  bool answered = false;
  u->Cancel("enough", [&](absl::Status s) { answered = s.ok(); });
  EXPECT_FALSE(answered);
  EXPECT_EQ(link->sent.size(), sent) << "nothing asked before the request is stored";
  ASSERT_FALSE(env_.pending.empty());
  ASSERT_TRUE(env_.pending.back().batch.run.has_value());
  const v1::StopRequest& stored = env_.pending.back().batch.run->stop_request();
  EXPECT_EQ(stored.kind(), v1::StopRequest::KIND_CANCEL);
  EXPECT_EQ(stored.reason(), "cancelled: enough");
  EXPECT_EQ(stored.attempt(), 1);
  env_.Settle();
  EXPECT_TRUE(answered);
  ASSERT_GT(link->sent.size(), sent);
  EXPECT_TRUE(link->sent.back().has_stop());
}

// A run stored RUNNING with a cancel asked of its attempt 2: the daemon
// that restores it cancels, whether the rank is still alive (it exits 143
// after its stop checkpoint) or died while no daemon watched.
TEST_F(RunUnitStopTest, AStoredCancelHoldsForAdoptedRanks) {
  for (bool alive : {true, false}) {
    FakeEnv env;
    if (alive) env.alive.insert(6000);
    const v1::Run stored = Stored(alive ? "live" : "dead", v1::RUN_STATE_RUNNING, 2,
                                  v1::StopRequest::KIND_CANCEL, "cancelled: enough");
    env.exit_files[RunLayout(dir_.path()).ExitFilePath(2, 0)] =
        ExitFile{143, "stopped", "stopped on request after checkpoint step-9", 9, 0};
    auto u = RunUnit::Restore(stored, RunSpec{}, 1, {{6000, 11, "t0"}}, RunLearning{}, env.env());
    env.Settle();
    if (alive) {
      ASSERT_FALSE(env.signals.empty()) << "asked again to stop";
      EXPECT_EQ(env.signals[0], std::make_pair(6000, SIGTERM));
      env.alive.erase(6000);
      u->OnProcessExit(2, 0);
      env.Settle();
    }
    EXPECT_EQ(u->run().state(), v1::RUN_STATE_CANCELLED) << stored.run_id();
    EXPECT_EQ(u->run().reason(), "cancelled: enough");
    EXPECT_EQ(u->run().restarts(), 0);
    EXPECT_FALSE(u->run().has_stop_request());
  }
}

// Cancelled (and answered) while its attempt was being prepared, then the
// daemon died: the restored run ends CANCELLED instead of starting again.
TEST_F(RunUnitStopTest, AStoredCancelOfARunWithoutRanksEndsItOnRestore) {
  const v1::Run stored =
      Stored("r-9", v1::RUN_STATE_PENDING, 0, v1::StopRequest::KIND_CANCEL, "cancelled");
  auto u = RunUnit::Restore(stored, RunSpec{}, 1, {}, RunLearning{}, env_.env());
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_CANCELLED);
  EXPECT_FALSE(u->Queued().has_value());
}

// The old daemon's shutdown asked the rank to stop; the new daemon adopts
// it, and its exit 143 sends the run back to the queue with nothing
// counted, as the shutdown meant.
TEST_F(RunUnitStopTest, AStoredShutdownStopIsNotARestart) {
  env_.alive.insert(6000);
  const v1::Run stored = Stored("r-3", v1::RUN_STATE_RUNNING, 1, v1::StopRequest::KIND_SHUTDOWN,
                                "daemon shutting down");
  auto u = RunUnit::Restore(stored, RunSpec{}, 1, {{6000, 11, "t0"}}, RunLearning{}, env_.env());
  env_.Settle();
  env_.alive.erase(6000);
  env_.exit_files[RunLayout(dir_.path()).ExitFilePath(1, 0)] = ExitFile{143, "stopped", "", 9, 0};
  const int before = env_.reschedules;
  u->OnProcessExit(1, 0);
  env_.Settle();
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_PENDING);
  EXPECT_EQ(u->run().restarts(), 0);
  EXPECT_GT(env_.reschedules, before) << "this daemon is not shutting down: it places the run";
  EXPECT_TRUE(u->Queued().has_value());
}

// A drain told while the attempt is being prepared (its resume point being
// chosen) starts nothing: the slots go back and the run queues again at
// once, to be placed on what is usable. The drain's line is the next
// attempt's resize reason only if the gang really changes size.
TEST_F(RunUnitStopTest, ADrainWhilePreparingStartsNothing) {
  auto u = NewUnit(ElasticSpec(2, 1));
  u->Start({0, 1}, {"", ""});
  ASSERT_TRUE(env_.launches.empty());
  u->Resize("slot cpu:1 drained (ECC errors)");
  env_.Settle();
  EXPECT_TRUE(env_.launches.empty()) << "no rank on the drained slot";
  EXPECT_EQ(env_.released.size(), 2u);
  EXPECT_EQ(u->run().state(), v1::RUN_STATE_RESTARTING);
  ASSERT_TRUE(u->Queued().has_value());
  EXPECT_LE(u->Queued()->not_before_s, env_.NowS());
  EXPECT_EQ(u->run().restarts(), 0);
  u->Start({0}, {""});
  env_.Settle();
  ASSERT_EQ(env_.launches.size(), 1u);
}

// A queued run holds no slot: a drain says nothing about it, and its next
// attempt's resize reason is not the drain's.
TEST_F(RunUnitStopTest, ADrainOfAQueuedRunLeavesNoFalseResizeReason) {
  auto u = NewUnit(ElasticSpec(2, 1));
  u->Resize("slot cpu:1 drained (ECC errors)");
  env_.Settle();
  EXPECT_TRUE(env_.stored.empty());
  u->Start({0, 1}, {"", ""});
  env_.Settle();
  EXPECT_EQ(env_.launches.size(), 2u);
  EXPECT_TRUE(env_.Stored(v1::EVENT_KIND_RESIZE).empty());
}

}  // namespace
}  // namespace trainsup::supervisor
