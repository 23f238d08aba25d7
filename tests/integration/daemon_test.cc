// The real trainsupd with real worker processes (trainsup-test-worker), real
// sockets, signals and files: every exit class, hang and freeze detection,
// the kill escalation, backoff and budgets, gangs, adoption after a daemon
// crash, cancel, auth, spec validation (sd_notify, concurrent watchers,
// graceful shutdown, metrics, trainctl, GPU release, the OOM memory budget,
// socket permissions, health and reflection: daemon_ops_test.cc, the same
// program). Each test owns
// a daemon in its own temporary directory (DaemonHarness), so ctest runs
// them in parallel.
// Assertions are about behaviour, never about how fast anything happened.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"
#include "trainsup/v1/worker.grpc.pb.h"

namespace trainsup::integration {
namespace {

namespace fs = std::filesystem;
namespace wv1 = ::trainsup::worker::v1;
using ::testing::HasSubstr;
using ::testing::Not;

// --- 1. success ---------------------------------------------------------------------------

TEST(Daemon, RunSucceedsWithCheckpointsAndLog) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("ok", 12, 20, 5));
  ASSERT_FALSE(id.empty());
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  EXPECT_EQ(run.restarts(), 0);
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  const v1::Attempt& a = run.attempts(0);
  EXPECT_EQ(a.number(), 1);
  EXPECT_EQ(a.resumed_from_step(), -1);
  EXPECT_EQ(a.exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_GT(a.ended_ms(), 0);
  ASSERT_EQ(a.ranks_size(), 1);
  EXPECT_EQ(a.ranks(0).exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_EQ(a.ranks(0).exit_code(), 0);
  EXPECT_FALSE(a.ranks(0).alive());

  std::vector<int64_t> steps;
  for (const v1::Checkpoint& c : run.checkpoints()) {
    steps.push_back(c.step());
    EXPECT_TRUE(fs::exists(c.path())) << c.path();
    EXPECT_GT(c.bytes(), 0);
  }
  EXPECT_THAT(steps, ::testing::ElementsAre(5, 10, 12));

  const std::string log_path = a.ranks(0).log_path();
  EXPECT_EQ(log_path, h.state_dir() + "/runs/" + id + "/attempts/1/rank-0.log");
  const std::string log = ReadFileText(log_path);
  EXPECT_THAT(log, HasSubstr("step 1/12"));
  EXPECT_THAT(log, HasSubstr("step 12/12"));

  std::vector<v1::RunEvent> events = h.History(id);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind(), v1::EVENT_KIND_STATE);
  EXPECT_EQ(events.back().state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(EventsOfKind(events, v1::EVENT_KIND_ATTEMPT_STARTED).size(), 1u);
  EXPECT_EQ(FindEvent(events, v1::EVENT_KIND_ATTEMPT_ENDED, 1).exit_class(),
            v1::EXIT_CLASS_SUCCESS);
  EXPECT_GE(EventsOfKind(events, v1::EVENT_KIND_CHECKPOINT).size(), 2u) << Describe(events);
}

// --- 2. exit codes ------------------------------------------------------------------------

TEST(Daemon, ExitCodesAreClassifiedAndRestartedPerContract) {
  DaemonHarness h;
  h.Set("slots.cpu_slots", "4");
  ASSERT_TRUE(h.Start());
  const std::string usage = h.Submit(Spec("usage", 10, 20, 2, "exit_at_step = 2\nexit_code = 64"));
  const std::string data = h.Submit(Spec("data", 10, 20, 2, "exit_at_step = 2\nexit_code = 65"));
  const std::string oom =
      h.Submit(Spec("oom", 8, 20, 2, "exit_at_step = 3\nexit_code = 75\nonly_attempt = 1"));
  const std::string crash =
      h.Submit(Spec("crash", 8, 20, 2, "exit_at_step = 3\nexit_code = 3\nonly_attempt = 1"));
  const std::string sig =
      h.Submit(Spec("segv", 8, 20, 2, "signal_at_step = 3\nsignal = 11\nonly_attempt = 1"));
  const std::string stopped =
      h.Submit(Spec("term", 8, 20, 2, "exit_at_step = 3\nexit_code = 143\nonly_attempt = 1"));

  for (const std::string& id : {usage, data}) {
    v1::Run run;
    ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
    EXPECT_EQ(run.state(), v1::RUN_STATE_FAILED) << Describe(run);
    EXPECT_EQ(run.attempts_size(), 1) << Describe(run);
    EXPECT_EQ(run.restarts(), 0);
    EXPECT_THAT(run.reason(), HasSubstr("injected exit at step 2"));
  }
  v1::Run run = h.GetRun(usage);
  EXPECT_THAT(run.reason(), HasSubstr("exit 64"));
  ASSERT_EQ(run.attempts_size(), 1);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_USAGE);
  EXPECT_EQ(run.attempts(0).ranks(0).exit_code(), 64);
  run = h.GetRun(data);
  EXPECT_THAT(run.reason(), HasSubstr("exit 65"));
  ASSERT_EQ(run.attempts_size(), 1);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_DATA);

  struct Restarted {
    std::string id;
    v1::ExitClass first;
    int code;    // of the first attempt's rank, -1 for a signal
    int signal;  // of the first attempt's rank
  };
  for (const Restarted& r :
       {Restarted{oom, v1::EXIT_CLASS_OOM, 75, 0}, Restarted{crash, v1::EXIT_CLASS_CRASH, 3, 0},
        Restarted{sig, v1::EXIT_CLASS_SIGNAL, -1, 11},
        Restarted{stopped, v1::EXIT_CLASS_STOPPED, 143, 0}}) {
    SCOPED_TRACE(v1::ExitClass_Name(r.first));
    ASSERT_TRUE(h.WaitForEnd(r.id, kRunLimit, &run));
    EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
    ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
    EXPECT_EQ(run.restarts(), 1);
    EXPECT_EQ(run.attempts(0).exit_class(), r.first) << Describe(run);
    ASSERT_EQ(run.attempts(0).ranks_size(), 1);
    EXPECT_EQ(run.attempts(0).ranks(0).exit_class(), r.first);
    EXPECT_EQ(run.attempts(0).ranks(0).exit_code(), r.code);
    EXPECT_EQ(run.attempts(0).ranks(0).signal(), r.signal);
    EXPECT_EQ(run.attempts(1).resumed_from_step(), 2) << Describe(run);
    EXPECT_EQ(run.attempts(1).exit_class(), v1::EXIT_CLASS_SUCCESS);
    EXPECT_EQ(run.oom_restarts(), r.first == v1::EXIT_CLASS_OOM ? 1 : 0);
  }
}

// A worker of a version the daemon cannot serve is refused at its Hello; it
// exits 64 with the daemon's message, and the run fails once, naming both
// versions, instead of restarting into the same refusal. A patch release
// of the daemon's own minor version is served.
TEST(Daemon, AWorkerOfAVersionTheDaemonCannotServeFailsTheRunOnce) {
  DaemonHarness h;
  h.Set("slots.cpu_slots", "2");
  ASSERT_TRUE(h.Start());
  v1::Node node;
  auto ctx = h.Context(h.viewer_token());
  ASSERT_TRUE(h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node).ok());
  const std::vector<std::string> parts = absl::StrSplit(node.version(), '.');
  ASSERT_EQ(parts.size(), 3u) << node.version();
  const std::string patch_release = parts[0] + "." + parts[1] + ".99";
  const std::string other_major = std::to_string(std::stoi(parts[0]) + 1) + ".0.0";

  const std::string refused =
      h.Submit(Spec("refused", 10, 20, 2, "report_version = \"" + other_major + "\""));
  const std::string served =
      h.Submit(Spec("served", 6, 20, 2, "report_version = \"" + patch_release + "\""));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(refused, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_FAILED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_EQ(run.restarts(), 0);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_USAGE);
  EXPECT_EQ(run.attempts(0).ranks(0).exit_code(), 64);
  EXPECT_THAT(run.reason(), HasSubstr("worker version " + other_major +
                                      " cannot be served by trainsupd " + node.version()));

  ASSERT_TRUE(h.WaitForEnd(served, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  EXPECT_EQ(run.attempts_size(), 1) << Describe(run);
}

// --- 3, 4. frozen and hung workers ---------------------------------------------------------

TEST(Daemon, FrozenWorkerIsKilledAndRestarted) {
  DaemonHarness h;
  h.Set("workers.heartbeat_timeout_s", "1.5");
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(Spec("frozen", 10, 50, 2, "freeze_at_step = 4\nonly_attempt = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_FROZEN);
  EXPECT_EQ(run.attempts(0).ranks(0).exit_class(), v1::EXIT_CLASS_FROZEN);
  EXPECT_EQ(run.attempts(1).resumed_from_step(), 2);
  std::vector<v1::RunEvent> events = h.History(id);
  v1::RunEvent hang = FindEvent(events, v1::EVENT_KIND_HANG, 1);
  EXPECT_EQ(hang.exit_class(), v1::EXIT_CLASS_FROZEN) << Describe(events);
  EXPECT_EQ(hang.rank(), 0);
  EXPECT_THAT(hang.reason(), HasSubstr("no heartbeat"));
  EXPECT_EQ(FindEvent(events, v1::EVENT_KIND_RESTART, 1).exit_class(), v1::EXIT_CLASS_FROZEN);
}

TEST(Daemon, HungWorkerGetsStacksCapturedAndIsRestarted) {
  DaemonHarness h;
  h.Set("progress.fixed_timeout_s", "1.5");
  h.Set("workers.capture_stacks", "true");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("hung", 10, 50, 2, "hang_at_step = 4\nonly_attempt = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_HUNG);
  EXPECT_EQ(run.attempts(0).ranks(0).exit_class(), v1::EXIT_CLASS_HUNG);
  std::vector<v1::RunEvent> events = h.History(id);
  v1::RunEvent hang = FindEvent(events, v1::EVENT_KIND_HANG, 1);
  EXPECT_EQ(hang.exit_class(), v1::EXIT_CLASS_HUNG) << Describe(events);
  EXPECT_THAT(hang.reason(), HasSubstr("no progress"));
  // gdb when it may attach, else the /proc summary: a header either way.
  const int pid = run.attempts(0).ranks(0).pid();
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("=== stacks of pid " + std::to_string(pid) + " by "));
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("injected hang at step 4"));
}

// --- 5. SIGTERM ignored: SIGKILL of the whole group -----------------------------------------

TEST(Daemon, WorkerIgnoringSigtermIsKilledWithItsGroup) {
  DaemonHarness h;
  h.Set("progress.fixed_timeout_s", "1.5");
  h.Set("workers.term_grace_s", "2");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(
      Spec("stubborn", 10, 50, 2,
           "hang_at_step = 3\nignore_sigterm = true\nspawn_grandchild = true\nonly_attempt = 1"));
  // The grandchild announces itself in the attempt's log.
  const std::string log_path = h.state_dir() + "/runs/" + id + "/attempts/1/rank-0.log";
  int grandchild = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        const std::string log = ReadFileText(log_path);
        const size_t at = log.find("grandchild pid ");
        if (at == std::string::npos || log.find('\n', at) == std::string::npos) return false;
        grandchild = std::atoi(log.c_str() + at + strlen("grandchild pid "));
        return true;
      },
      Seconds(60)))
      << ReadFileText(log_path);
  ASSERT_GT(grandchild, 1);
  EXPECT_TRUE(ProcessAlive(grandchild)) << "the grandchild should live until the group is killed";

  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  const v1::RankStatus& rank = run.attempts(0).ranks(0);
  EXPECT_EQ(rank.exit_class(), v1::EXIT_CLASS_HUNG);
  EXPECT_EQ(rank.signal(), SIGKILL) << Describe(run);
  EXPECT_TRUE(Eventually([&] { return !ProcessAlive(grandchild); }, Seconds(10)))
      << "grandchild " << grandchild << " survived, state " << ProcessState(grandchild);
  std::vector<v1::RunEvent> events = h.History(id);
  bool sigkill_logged = false;
  for (const v1::RunEvent& e : EventsOfKind(events, v1::EVENT_KIND_LOG)) {
    if (e.attempt() == 1 && e.rank() == 0 && e.reason().find("SIGKILL") != std::string::npos) {
      sigkill_logged = true;
    }
  }
  EXPECT_TRUE(sigkill_logged) << Describe(events);
}

// --- 6. backoff, restart budget, crash loop -------------------------------------------------

TEST(Daemon, BackoffDoublesAndTheRestartBudgetEndsTheRun) {
  DaemonHarness h;
  h.Set("restart.initial_backoff_s", "0.2");
  h.Set("restart.multiplier", "2");
  h.Set("restart.max_restarts", "2");
  h.Set("restart.crash_loop_attempts", "100");  // the budget must decide, not the loop
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("budget", 10, 20, 2, "exit_at_step = 1\nexit_code = 3"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_FAILED) << Describe(run);
  EXPECT_THAT(run.reason(), HasSubstr("restart budget"));
  ASSERT_EQ(run.attempts_size(), 3) << Describe(run);
  EXPECT_EQ(run.restarts(), 2);
  for (const v1::Attempt& a : run.attempts()) EXPECT_EQ(a.exit_class(), v1::EXIT_CLASS_CRASH);

  std::vector<v1::RunEvent> events = h.History(id);
  std::vector<v1::RunEvent> restarts = EventsOfKind(events, v1::EVENT_KIND_RESTART);
  ASSERT_EQ(restarts.size(), 2u) << Describe(events);
  for (int k = 0; k < 2; ++k) {
    const double expected = 0.2 * (1 << k);
    EXPECT_NEAR(restarts[k].delay_s(), expected, 1e-9) << Describe(events);
    const int attempt = restarts[k].attempt();
    EXPECT_EQ(attempt, k + 1);
    const v1::RunEvent ended = FindEvent(events, v1::EVENT_KIND_ATTEMPT_ENDED, attempt);
    const v1::RunEvent next = FindEvent(events, v1::EVENT_KIND_ATTEMPT_STARTED, attempt + 1);
    ASSERT_GT(ended.seq(), 0);
    ASSERT_GT(next.seq(), 0);
    // Never early: the next attempt starts at least the delay after the end
    // (1 ms for the rounding of the two timestamps).
    EXPECT_GE(next.time_ms() - ended.time_ms(), expected * 1000 - 1) << Describe(events);
  }
}

TEST(Daemon, CrashLoopWithoutProgressFailsTheRun) {
  DaemonHarness h;
  h.Set("restart.crash_loop_attempts", "3");
  h.Set("restart.max_restarts", "10");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("loop", 10, 20, 2, "crash_at_step = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_FAILED) << Describe(run);
  EXPECT_THAT(run.reason(), HasSubstr("crash loop"));
  ASSERT_EQ(run.attempts_size(), 3) << Describe(run);
  for (const v1::Attempt& a : run.attempts()) {
    EXPECT_EQ(a.exit_class(), v1::EXIT_CLASS_SIGNAL);
    EXPECT_EQ(a.ranks(0).signal(), SIGABRT);
  }
}

// --- 7. gang restart ------------------------------------------------------------------------

// A gang has one checkpoint store, written by rank 0 (issue 12): rank 1's
// death stops rank 0, and both ranks of the next attempt resume from the
// newest checkpoint of that store, named by the daemon. The restart event
// names the rank that died first.
TEST(Daemon, GangRestartsEveryRankFromTheNewestCheckpointOfItsOneStore) {
  DaemonHarness h;
  h.Set("slots.cpu_slots", "2");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec(
      "gang", 16, 100, 5, "exit_at_step = 9\nexit_code = 3\nonly_rank = 1\nonly_attempt = 1", 2));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  const v1::Attempt& first = run.attempts(0);
  ASSERT_EQ(first.ranks_size(), 2);
  EXPECT_EQ(first.exit_class(), v1::EXIT_CLASS_CRASH) << Describe(run);
  EXPECT_EQ(first.ranks(1).exit_class(), v1::EXIT_CLASS_CRASH);
  EXPECT_EQ(first.ranks(1).exit_code(), 3);
  EXPECT_EQ(first.ranks(0).exit_class(), v1::EXIT_CLASS_GANG) << Describe(run);
  EXPECT_THAT(first.exit_reason(), HasSubstr("rank 1 died first: exit 3")) << Describe(run);
  const std::vector<v1::RunEvent> events = h.History(id);
  EXPECT_THAT(FindEvent(events, v1::EVENT_KIND_RESTART, 1).reason(),
              HasSubstr("rank 1 died first: exit 3"))
      << Describe(events);

  // Rank 0 checkpointed step 5 before rank 1 died at step 9, and may have
  // checkpointed again on the gang stop's SIGTERM; the newest is chosen.
  const int64_t step = run.attempts(1).resumed_from_step();
  EXPECT_GE(step, 5) << Describe(run);
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("checkpoint step-" + std::to_string(step)));
  EXPECT_THAT(RankLog(run, 1, 1), Not(HasSubstr("checkpoint step-"))) << "only rank 0 writes";
  ASSERT_EQ(run.attempts(1).ranks_size(), 2);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(run.attempts(1).ranks(rank).exit_class(), v1::EXIT_CLASS_SUCCESS);
    EXPECT_THAT(RankLog(run, 2, rank), HasSubstr("resumed from step " + std::to_string(step)))
        << "rank " << rank;
  }
  // One store: step-N directories straight under checkpoints/, no rank-R.
  const std::string root = RunLayout(run.run_dir()).CheckpointsDir();
  EXPECT_TRUE(fs::exists(root + "/step-16")) << "rank 0's final checkpoint";
  for (const auto& e : fs::directory_iterator(root)) {
    EXPECT_EQ(e.path().filename().string().rfind("rank-", 0), std::string::npos) << e.path();
  }
}

// --- 8. daemon killed: adoption and lost workers --------------------------------------------

TEST(Daemon, RestartedDaemonAdoptsRunningWorker) {
  DaemonHarness h;
  // Workers reconnect with a backoff of up to 5 s; the adopted worker must
  // not be declared frozen before it is back.
  h.Set("workers.heartbeat_timeout_s", "8");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("adopt", 80, 100, 10));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 2;
      },
      kRunLimit, &run));
  ASSERT_EQ(run.attempts_size(), 1);
  const int pid = run.attempts(0).ranks(0).pid();
  ASSERT_GT(pid, 1);

  h.Kill();
  EXPECT_TRUE(ProcessAlive(pid)) << "the worker must survive the daemon";
  EXPECT_TRUE(fs::exists(h.state_dir() + "/trainsupd.db"));
  ASSERT_TRUE(h.Start());
  run = h.GetRun(id);
  EXPECT_EQ(run.state(), v1::RUN_STATE_RUNNING) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_EQ(run.attempts(0).ended_ms(), 0);
  ASSERT_EQ(run.attempts(0).ranks_size(), 1);
  EXPECT_EQ(run.attempts(0).ranks(0).pid(), pid);
  EXPECT_TRUE(run.attempts(0).ranks(0).alive());

  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_SUCCESS);
  std::vector<v1::RunEvent> events = h.History(id);
  EXPECT_TRUE(HasEvent(events, v1::EVENT_KIND_LOG, "adopted 1 of 1")) << Describe(events);
}

// Issue 42, 2, as a user found it: a cancel answered OK, then the daemon
// SIGKILLed while the worker writes its (slow) stop checkpoint. The restarted
// daemon must end the run CANCELLED, not read the worker's exit 143 as an
// unrequested stop and train it again.
TEST(Daemon, ACancelAnsweredBeforeTheDaemonWasKilledHoldsAfterItsRestart) {
  DaemonHarness h;
  h.Set("workers.heartbeat_timeout_s", "8");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("cancelkill", 400, 50, 100, "checkpoint_delay_ms = 3000"));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 2;
      },
      kRunLimit, &run));
  const int pid = run.attempts(0).ranks(0).pid();
  v1::CancelRunRequest req;
  req.set_run_id(id);
  req.set_reason("enough");
  auto ctx = h.Context(h.operator_token());
  grpc::Status s = h.stub().CancelRun(ctx.get(), req, &run);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // The worker is writing its stop checkpoint (3 s) when the daemon dies.
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return r.progress().phase() == v1::PHASE_CHECKPOINTING; },
      Seconds(20), &run))
      << Describe(run);
  h.Kill();
  EXPECT_TRUE(ProcessAlive(pid));
  ASSERT_TRUE(h.Start());
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_CANCELLED) << Describe(run);
  EXPECT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_EQ(run.restarts(), 0);
  EXPECT_THAT(run.reason(), HasSubstr("enough"));
}

TEST(Daemon, WorkerThatDiedWhileTheDaemonWasDownIsLostAndRestarted) {
  DaemonHarness h;
  h.Set("workers.heartbeat_timeout_s", "8");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("lost", 30, 100, 5));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 6;
      },
      kRunLimit, &run));
  const int pid = run.attempts(0).ranks(0).pid();
  ASSERT_GT(pid, 1);
  h.Kill();
  ASSERT_EQ(kill(-pid, SIGKILL), 0) << strerror(errno);  // the worker leads its group
  ASSERT_TRUE(Eventually([&] { return !ProcessAlive(pid); }, Seconds(10)));

  ASSERT_TRUE(h.Start());
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_LOST);
  EXPECT_EQ(run.attempts(0).ranks(0).exit_class(), v1::EXIT_CLASS_LOST);
  EXPECT_GE(run.attempts(1).resumed_from_step(), 5) << Describe(run);
}

// --- 9. cancel ----------------------------------------------------------------------------

TEST(Daemon, CancelDuringBackoffEndsTheRunWithoutAnotherAttempt) {
  DaemonHarness h;
  h.Set("restart.initial_backoff_s", "30");
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(Spec("cancelwait", 10, 20, 2, "exit_at_step = 2\nexit_code = 3\nonly_attempt = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_RESTARTING, kRunLimit, &run));
  EXPECT_GT(run.next_restart_ms(), 0);
  v1::CancelRunRequest req;
  req.set_run_id(id);
  req.set_reason("not needed");
  auto ctx = h.Context(h.operator_token());
  grpc::Status s = h.stub().CancelRun(ctx.get(), req, &run);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // Well before the 30 s backoff would have run out.
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_CANCELLED, Seconds(20), &run));
  EXPECT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_THAT(run.reason(), HasSubstr("not needed"));
  std::vector<v1::RunEvent> events = h.History(id);
  EXPECT_EQ(EventsOfKind(events, v1::EVENT_KIND_ATTEMPT_STARTED).size(), 1u) << Describe(events);
}

TEST(Daemon, CancelWhileRunningStopsTheWorkerAfterACheckpoint) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("cancelrun", 400, 50, 100));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RUNNING && r.progress().step() >= 1;
      },
      kRunLimit, &run));
  v1::CancelRunRequest req;
  req.set_run_id(id);
  auto ctx = h.Context(h.operator_token());
  grpc::Status s = h.stub().CancelRun(ctx.get(), req, &run);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_CANCELLED, kRunLimit, &run));
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  const v1::RankStatus& rank = run.attempts(0).ranks(0);
  EXPECT_EQ(rank.exit_class(), v1::EXIT_CLASS_CANCELLED) << Describe(run);
  EXPECT_EQ(rank.exit_code(), 143) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_CANCELLED);
  // It checkpointed on the way out (not a step of checkpoint_every_steps).
  ASSERT_GT(run.checkpoints_size(), 0);
  EXPECT_GE(run.checkpoints(run.checkpoints_size() - 1).step(), 1);
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("checkpoint step-"));
}

// --- 10. auth -------------------------------------------------------------------------------

TEST(Daemon, TokensAndRolesAreEnforced) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("authrun", 400, 50, 100));
  ASSERT_FALSE(id.empty());

  v1::Node node;
  {
    auto ctx = h.Context("");
    EXPECT_EQ(h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    auto ctx = h.Context("not-a-token");
    EXPECT_EQ(h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    std::string ignored;
    EXPECT_EQ(h.TrySubmit(Spec("nope", 5, 10, 2), "", &ignored).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(h.TrySubmit(Spec("nope", 5, 10, 2), h.viewer_token(), &ignored).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::CancelRunRequest req;
    req.set_run_id(id);
    v1::Run out;
    auto ctx = h.Context(h.viewer_token());
    EXPECT_EQ(h.stub().CancelRun(ctx.get(), req, &out).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::GetRunRequest req;
    req.set_run_id(id);
    v1::Run out;
    auto ctx = h.Context(h.viewer_token());
    grpc::Status s = h.stub().GetRun(ctx.get(), req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(out.run_id(), id);
  }
  {
    v1::ListRunsResponse out;
    auto ctx = h.Context(h.viewer_token());
    grpc::Status s = h.stub().ListRuns(ctx.get(), v1::ListRunsRequest(), &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(out.runs_size(), 1);  // the viewer's submit left nothing
    EXPECT_EQ(out.runs(0).run_id(), id);
  }
  {
    auto ctx = h.Context(h.viewer_token());
    grpc::Status s = h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(node.slots_size(), 2);
  }

  // A stranger on the worker channel, claiming the live rank.
  v1::Run run;
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_RUNNING, kRunLimit, &run));
  {
    auto channel =
        grpc::CreateChannel("unix:" + h.socket_path(), grpc::InsecureChannelCredentials());
    auto stub = wv1::WorkerChannel::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto stream = stub->Connect(&ctx);
    wv1::WorkerMessage hello;
    hello.mutable_hello()->set_run_id(id);
    hello.mutable_hello()->set_rank(0);
    hello.mutable_hello()->set_attempt(1);
    hello.mutable_hello()->set_pid(getpid());
    hello.mutable_hello()->set_world_size(1);
    hello.mutable_hello()->set_token(std::string(64, '0'));
    EXPECT_TRUE(stream->Write(hello));
    wv1::SupervisorCommand command;
    EXPECT_FALSE(stream->Read(&command)) << command.DebugString();
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  // The real worker was not disturbed.
  run = h.GetRun(id);
  EXPECT_EQ(run.state(), v1::RUN_STATE_RUNNING) << Describe(run);
  EXPECT_EQ(run.attempts_size(), 1);
  {
    v1::CancelRunRequest req;
    req.set_run_id(id);
    v1::Run out;
    auto ctx = h.Context(h.operator_token());
    grpc::Status s = h.stub().CancelRun(ctx.get(), req, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_TRUE(h.WaitForState(id, v1::RUN_STATE_CANCELLED, kRunLimit));
}

// --- 11. malformed specs ------------------------------------------------------------------

TEST(Daemon, MalformedSpecsAreRejectedNamingTheFieldAndLeaveNothing) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  ExpectRejectedLeavingNothing(
      h, {
             {"name = \"x\"\n[model]\narhc = \"minkunet14\"\n", "model.arhc"},
             {"name = \"x\"\n[train]\nbatch_size = 0\n", "train.batch_size"},
             {"name = \"x\"\n[data]\nformat = \"ply\"\npath = \"/etc/hostname\"\n", "data.path"},
             {"name = \"x\"\nworld_size = 8\n", "world_size"},
             {"name = [oops\n", ""},
         });
}

}  // namespace
}  // namespace trainsup::integration
