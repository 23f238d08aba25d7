// trainctl's output and exit codes, from hand-built API messages.
#include "supervisor/ctl/ctl_format.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace trainsup::supervisor {
namespace {

constexpr int64_t kT = 1795959901000;  // 2026-11-29T13:45:01Z

v1::Run RunningRun() {
  v1::Run run;
  run.set_run_id("run-1");
  run.set_name("kitti-unet");
  run.set_state(v1::RUN_STATE_RUNNING);
  run.set_world_size(2);
  run.set_created_ms(kT - 3'600'000);
  run.set_restarts(1);
  run.set_run_dir("/var/lib/trainsup/runs/run-1");
  v1::Progress* p = run.mutable_progress();
  p->set_step(512);
  p->set_total_steps(1000);
  p->set_loss(0.423);
  p->set_samples_per_sec(12.3);
  p->set_phase(v1::PHASE_TRAINING);
  p->set_time_ms(kT);
  return run;
}

TEST(ExitCode, MapsStatusCodes) {
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::OK), 0);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::NOT_FOUND), 3);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::UNAUTHENTICATED), 4);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::PERMISSION_DENIED), 4);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::UNAVAILABLE), 5);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::DEADLINE_EXCEEDED), 5);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::INVALID_ARGUMENT), 6);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::INTERNAL), 8);
  EXPECT_EQ(ExitCodeForStatus(grpc::StatusCode::FAILED_PRECONDITION), 8);
}

TEST(ExitCode, MapsFinalRunStates) {
  EXPECT_EQ(ExitCodeForRunState(v1::RUN_STATE_SUCCEEDED), kExitOk);
  EXPECT_EQ(ExitCodeForRunState(v1::RUN_STATE_FAILED), 1);
  EXPECT_EQ(ExitCodeForRunState(v1::RUN_STATE_CANCELLED), 7);
  EXPECT_EQ(ExitCodeForRunState(v1::RUN_STATE_RUNNING), 8);
  EXPECT_TRUE(IsFinal(v1::RUN_STATE_CANCELLED));
  EXPECT_FALSE(IsFinal(v1::RUN_STATE_RESTARTING));
}

TEST(EnumNames, DropTheirPrefix) {
  EXPECT_EQ(ToString(v1::RUN_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(ToString(v1::EXIT_CLASS_OOM), "OOM");
  EXPECT_EQ(ToString(v1::EVENT_KIND_ATTEMPT_STARTED), "ATTEMPT_STARTED");
  EXPECT_EQ(ToString(v1::PHASE_CHECKPOINTING), "CHECKPOINTING");
  EXPECT_EQ(ToString(v1::SLOT_STATE_STRANDED), "STRANDED");
  EXPECT_EQ(ToString(static_cast<v1::RunState>(42)), "42");
}

TEST(EnumNames, ParseRunStates) {
  EXPECT_EQ(*RunStateFromString("running"), v1::RUN_STATE_RUNNING);
  EXPECT_EQ(*RunStateFromString(" Cancelled "), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(*RunStateFromString("RUN_STATE_FAILED"), v1::RUN_STATE_FAILED);
  absl::StatusOr<v1::RunState> bad = RunStateFromString("runing");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("running"), absl::string_view::npos);
  EXPECT_FALSE(RunStateFromString("unspecified").ok());

  absl::StatusOr<std::vector<v1::RunState>> list = RunStatesFromString("running, failed,");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<v1::RunState>{v1::RUN_STATE_RUNNING, v1::RUN_STATE_FAILED}));
  EXPECT_TRUE(RunStatesFromString("")->empty());
  EXPECT_FALSE(RunStatesFromString("running,bogus").ok());
}

TEST(Format, DurationsTimestampsBytes) {
  EXPECT_EQ(FormatDuration(-5), "0s");
  EXPECT_EQ(FormatDuration(45'900), "45s");
  EXPECT_EQ(FormatDuration(192'000), "3m12s");
  EXPECT_EQ(FormatDuration((2 * 3600 + 5 * 60) * 1000), "2h05m");
  EXPECT_EQ(FormatDuration((3 * 86400 + 4 * 3600) * 1000LL), "3d04h");
  EXPECT_EQ(FormatTimestamp(kT + 999), "2026-11-29T13:45:01Z");
  EXPECT_EQ(FormatTimestamp(0), "-");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3LL << 30), "3.0 GiB");
}

TEST(Eta, FromStepRateBetweenReports) {
  v1::Progress before, now;
  before.set_step(100);
  before.set_time_ms(kT);
  now.set_step(200);
  now.set_total_steps(1000);
  now.set_time_ms(kT + 50'000);   // 0.5 s per step
  now.set_samples_per_sec(1000);  // ignored: the step rate wins
  EXPECT_EQ(EstimateEtaMs(now, &before, 2), 400'000);
}

TEST(Eta, FromSamplesPerSecondWithoutAnEarlierReport) {
  v1::Progress now;
  now.set_step(400);
  now.set_total_steps(1000);
  now.set_samples_per_sec(12);
  EXPECT_EQ(EstimateEtaMs(now, nullptr, 4), 200'000);  // 600 steps * 4 / 12 per s
  v1::Progress resumed = now;
  resumed.set_step(900);  // not earlier: falls back to samples/s
  EXPECT_EQ(EstimateEtaMs(now, &resumed, 4), 200'000);
}

TEST(Eta, UnknownWithoutTotalOrRate) {
  v1::Progress now;
  now.set_step(10);
  now.set_samples_per_sec(5);
  EXPECT_EQ(EstimateEtaMs(now, nullptr, 2), std::nullopt);  // no total
  now.set_total_steps(100);
  EXPECT_EQ(EstimateEtaMs(now, nullptr, 0), std::nullopt);  // batch size unknown
  now.set_step(100);
  EXPECT_EQ(EstimateEtaMs(now, nullptr, 0), 0);  // done
}

TEST(ProgressLine, RunningRun) {
  EXPECT_EQ(FormatProgressLine(RunningRun(), 192'000, kT),
            "[#####.....] 512/1000 51% loss 0.423 12.3 samples/s ETA 3m12s restarts 1");
}

TEST(ProgressLine, StateCountdownPhaseAndStaleness) {
  v1::Run run = RunningRun();
  run.set_state(v1::RUN_STATE_RESTARTING);
  run.set_next_restart_ms(kT + 2'000);
  EXPECT_EQ(FormatProgressLine(run, std::nullopt, kT),
            "[#####.....] 512/1000 51% loss 0.423 12.3 samples/s restarts 1 RESTARTING in 2s");

  run = RunningRun();
  run.mutable_progress()->set_phase(v1::PHASE_CHECKPOINTING);
  const std::string line = FormatProgressLine(run, std::nullopt, kT + 65'000);
  EXPECT_NE(line.find(" checkpointing"), std::string::npos) << line;
  EXPECT_NE(line.find("last report 1m05s ago"), std::string::npos) << line;
  EXPECT_EQ(FormatProgressLine(run, std::nullopt, kT + 10'000).find("last report"),
            std::string::npos);
}

TEST(ProgressLine, WithoutTotalAndPastTotal) {
  v1::Run run;
  run.set_state(v1::RUN_STATE_STARTING);
  EXPECT_EQ(FormatProgressLine(run, std::nullopt, kT), "step 0 restarts 0 STARTING");
  run = RunningRun();
  run.mutable_progress()->set_step(1200);
  EXPECT_EQ(FormatProgressLine(run, std::nullopt, kT).substr(0, 27), "[##########] 1200/1000 100%");
}

// A run that ended: its last progress report (every heartbeat_interval) was
// at step 97 of 100, and the last checkpoint at `checkpoint_step`.
v1::Run EndedRun(v1::RunState state, int64_t checkpoint_step) {
  v1::Run run = RunningRun();
  run.set_state(state);
  run.set_ended_ms(kT);
  v1::Progress* p = run.mutable_progress();
  p->set_step(97);
  p->set_total_steps(100);
  p->set_last_checkpoint_step(checkpoint_step);
  return run;
}

TEST(ReachedStep, FinishedRunsShowTheirFinalStepNotTheLastReport) {
  // Exit 0 means every step ran; the final checkpoint says the same.
  EXPECT_EQ(ReachedStep(EndedRun(v1::RUN_STATE_SUCCEEDED, 100)), 100);
  EXPECT_EQ(ReachedStep(EndedRun(v1::RUN_STATE_SUCCEEDED, 0)), 100);
  // A cancelled run stops after a checkpoint newer than the last report.
  EXPECT_EQ(ReachedStep(EndedRun(v1::RUN_STATE_CANCELLED, 98)), 98);
  EXPECT_EQ(ReachedStep(EndedRun(v1::RUN_STATE_FAILED, 90)), 97);
  EXPECT_EQ(ReachedStep(RunningRun()), 512);
  v1::Run unknown_total = EndedRun(v1::RUN_STATE_SUCCEEDED, 99);
  unknown_total.mutable_progress()->set_total_steps(0);
  EXPECT_EQ(ReachedStep(unknown_total), 99);
}

TEST(RunsTable, FinishedRunShowsItsFinalStep) {
  v1::Run done = EndedRun(v1::RUN_STATE_SUCCEEDED, 100);
  const std::string table = FormatRunsTable({done}, kT);
  EXPECT_NE(table.find("SUCCEEDED  100/100 "), std::string::npos) << table;
  EXPECT_EQ(table.find("97/100"), std::string::npos) << table;
}

TEST(Describe, FinishedRunShowsItsFinalStep) {
  const std::string text = FormatRunDescription(EndedRun(v1::RUN_STATE_SUCCEEDED, 100), kT);
  EXPECT_NE(text.find("step 100/100 (100%)"), std::string::npos) << text;
}

TEST(ProgressLine, FinishedRunShowsItsFinalStepAndNoEta) {
  EXPECT_EQ(FormatProgressLine(EndedRun(v1::RUN_STATE_SUCCEEDED, 100), 3'000, kT),
            "[##########] 100/100 100% loss 0.423 12.3 samples/s restarts 1 SUCCEEDED");
}

// On a terminal the line must fit in one row: one that wraps cannot be
// cleared with "\r" and leaves its first rows behind at every redraw.
TEST(ProgressLine, FitsTheWidthShrinkingTheBarFirst) {
  const v1::Run run = RunningRun();
  const std::string full = FormatProgressLine(run, 192'000, kT);
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, 200), full);
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, static_cast<int>(full.size()) + 1), full);
  for (int width = 1; width <= static_cast<int>(full.size()); ++width) {
    const std::string line = FormatProgressLine(run, 192'000, kT, width);
    EXPECT_LE(static_cast<int>(line.size()), width - 1) << width << ": " << line;
  }
  // Four columns fewer: the bar gives them up, the figures stay.
  const int narrower = static_cast<int>(full.size()) + 1 - 4;
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, narrower),
            "[###...] 512/1000 51% loss 0.423 12.3 samples/s ETA 3m12s restarts 1");
  // Too narrow for even a small bar: no bar, then the least useful fields
  // go (samples/s, loss, restarts, ETA), then the text is cut.
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, 60),
            "512/1000 51% loss 0.423 12.3 samples/s ETA 3m12s restarts 1");
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, 50),
            "512/1000 51% loss 0.423 ETA 3m12s restarts 1");
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, 40), "512/1000 51% ETA 3m12s restarts 1");
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, 21), "512/1000 51%");
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, 6), "512/1");
  // The state stays while the figures around it go.
  v1::Run restarting = RunningRun();
  restarting.set_state(v1::RUN_STATE_RESTARTING);
  restarting.set_next_restart_ms(kT + 2'000);
  EXPECT_EQ(FormatProgressLine(restarting, std::nullopt, kT, 42),
            "512/1000 51% restarts 1 RESTARTING in 2s");
  EXPECT_EQ(FormatProgressLine(restarting, std::nullopt, kT, 40), "512/1000 51% RESTARTING in 2s");
  EXPECT_EQ(FormatProgressLine(run, 192'000, kT, 0), full);  // 0: no limit
}

TEST(EventLine, Restart) {
  v1::RunEvent e;
  e.set_time_ms(kT);
  e.set_run_id("run-1");
  e.set_kind(v1::EVENT_KIND_RESTART);
  e.set_attempt(2);
  e.set_rank(-1);
  e.set_exit_class(v1::EXIT_CLASS_CRASH);
  e.set_reason("exit 1");
  e.set_delay_s(2);
  EXPECT_EQ(FormatEventLine(e),
            "2026-11-29T13:45:01Z run-1 attempt 2 RESTART exit 1 (crash); backoff 2.0 s");
}

TEST(EventLine, StateProgressWorkerExitCheckpoint) {
  v1::RunEvent e;
  e.set_time_ms(kT);
  e.set_run_id("run-1");
  e.set_kind(v1::EVENT_KIND_STATE);
  e.set_state(v1::RUN_STATE_FAILED);
  e.set_reason("crash loop");
  EXPECT_EQ(FormatEventLine(e), "2026-11-29T13:45:01Z run-1 STATE FAILED: crash loop");

  v1::RunEvent p;
  p.set_time_ms(kT);
  p.set_run_id("run-1");
  p.set_attempt(1);
  p.set_kind(v1::EVENT_KIND_PROGRESS);
  *p.mutable_progress() = RunningRun().progress();
  EXPECT_EQ(
      FormatEventLine(p),
      "2026-11-29T13:45:01Z run-1 attempt 1 PROGRESS step 512/1000 loss 0.423 12.3 samples/s");

  v1::RunEvent w;
  w.set_time_ms(kT);
  w.set_run_id("run-1");
  w.set_attempt(3);
  w.set_kind(v1::EVENT_KIND_WORKER_EXIT);
  w.set_rank(1);
  w.set_exit_class(v1::EXIT_CLASS_OOM);
  w.set_reason("exit 75");
  EXPECT_EQ(FormatEventLine(w),
            "2026-11-29T13:45:01Z run-1 attempt 3 WORKER_EXIT rank 1 exit 75 (oom)");

  v1::RunEvent c;
  c.set_time_ms(kT);
  c.set_run_id("run-1");
  c.set_attempt(3);
  c.set_kind(v1::EVENT_KIND_CHECKPOINT);
  c.set_checkpoint_step(500);
  EXPECT_EQ(FormatEventLine(c), "2026-11-29T13:45:01Z run-1 attempt 3 CHECKPOINT step 500");
  EXPECT_TRUE(IsNotable(c));
  EXPECT_FALSE(IsNotable(p));
}

TEST(ApplyEvent, TracksStateProgressAndRestarts) {
  v1::Run run = RunningRun();
  v1::RunEvent restart;
  restart.set_kind(v1::EVENT_KIND_RESTART);
  restart.set_exit_class(v1::EXIT_CLASS_OOM);
  restart.set_time_ms(kT);
  restart.set_delay_s(4);
  ApplyEvent(restart, &run);
  EXPECT_EQ(run.restarts(), 2);
  EXPECT_EQ(run.oom_restarts(), 1);
  EXPECT_EQ(run.next_restart_ms(), kT + 4'000);

  v1::RunEvent progress;
  progress.set_kind(v1::EVENT_KIND_PROGRESS);
  progress.mutable_progress()->set_step(600);
  ApplyEvent(progress, &run);
  EXPECT_EQ(run.progress().step(), 600);

  v1::RunEvent done;
  done.set_kind(v1::EVENT_KIND_STATE);
  done.set_state(v1::RUN_STATE_SUCCEEDED);
  done.set_time_ms(kT + 9'000);
  ApplyEvent(done, &run);
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(run.ended_ms(), kT + 9'000);
}

TEST(RunsTable, AlignedColumns) {
  v1::Run other;
  other.set_run_id("run-10");
  other.set_state(v1::RUN_STATE_PENDING);
  other.set_created_ms(kT - 45'000);
  const std::string table = FormatRunsTable({RunningRun(), other}, kT);
  EXPECT_EQ(table,
            "ID      NAME        STATE    STEP/TOTAL  RESTARTS  AGE\n"
            "run-1   kitti-unet  RUNNING  512/1000    1         1h00m\n"
            "run-10  -           PENDING  0/?         0         45s\n");
}

TEST(Describe, AttemptsRanksCheckpoints) {
  v1::Run run = RunningRun();
  run.set_reason("attempt 2 running");
  run.mutable_progress()->set_time_ms(kT - 5'000);  // older than rank 0's heartbeat
  v1::Attempt* a1 = run.add_attempts();
  a1->set_number(1);
  a1->set_started_ms(kT - 600'000);
  a1->set_ended_ms(kT - 300'000);
  a1->set_resumed_from_step(-1);
  a1->set_exit_class(v1::EXIT_CLASS_OOM);
  a1->set_exit_reason("rank 1 exit 75");
  v1::Attempt* a2 = run.add_attempts();
  a2->set_number(2);
  a2->set_started_ms(kT - 290'000);
  a2->set_resumed_from_step(500);
  a2->set_resumed_from("/r/checkpoints/step-500");
  v1::RankStatus* r = a2->add_ranks();
  r->set_rank(0);
  r->set_pid(4242);
  r->set_slot(1);
  r->set_gpu("1");
  r->set_alive(true);
  r->set_last_heartbeat_ms(kT - 2'000);
  r->set_log_path("/r/attempts/2/rank-0.log");
  v1::Checkpoint* c = run.add_checkpoints();
  c->set_step(500);
  c->set_path("/r/checkpoints/step-500");
  c->set_bytes(3LL << 20);

  const std::string text = FormatRunDescription(run, kT);
  for (const char* want :
       {"State:          RUNNING\n", "Reason:         attempt 2 running\n", "#1", "from scratch",
        "exit OOM: rank 1 exit 75", "resumed from step 500 (/r/checkpoints/step-500)", "4242",
        "/r/attempts/2/rank-0.log", "alive", "Last heartbeat: 2s ago\n", "3.0 MiB",
        "Restarts:       1 (0 after OOM)\n", "step 512/1000 (51%)"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in\n" << text;
  }
}

// A straggler (distributed.straggler_factor) is a line naming its rank and
// slot under the attempt's table; the others have none.
TEST(Describe, AStragglerIsNamedWithItsSlot) {
  v1::Run run = RunningRun();
  v1::Attempt* a = run.add_attempts();
  a->set_number(1);
  a->set_started_ms(kT - 60'000);
  for (int i = 0; i < 3; ++i) {
    v1::RankStatus* r = a->add_ranks();
    r->set_rank(i);
    r->set_slot(10 + i);
    r->set_alive(true);
    r->set_window_compute_seconds(i == 1 ? 0.42 : 0.1);
    if (i == 1) r->set_straggler_ratio(4.2);
  }
  const std::string text = FormatRunDescription(run, kT);
  EXPECT_NE(text.find("rank 1 (slot 11): straggler: step compute 0.42 s, 4.2 times the other "
                      "ranks' median"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("rank 0 (slot 10): straggler"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 2 (slot 12): straggler"), std::string::npos) << text;
}

TEST(Describe, ACommandRunShowsItsArgvAndHeartbeatMode) {
  v1::Run run = RunningRun();
  EXPECT_EQ(FormatRunDescription(run, kT).find("Command:"), std::string::npos);
  run.set_spec_toml(
      "[command]\nargv = [\"python3\", \"train.py\", \"--note\", \"it's here\"]\n"
      "heartbeats = true\n");
  std::string text = FormatRunDescription(run, kT);
  EXPECT_NE(text.find("Command:        python3 train.py --note 'it'\\''s here'\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Heartbeats:     yes (frozen and hung detection)\n"), std::string::npos)
      << text;
  run.set_spec_toml("[command]\nargv = [\"/bin/sh\", \"-c\", \"exit 0\"]\n");
  text = FormatRunDescription(run, kT);
  EXPECT_NE(text.find("Command:        /bin/sh -c 'exit 0'\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Heartbeats:     no (judged by exit code)\n"), std::string::npos) << text;
}

TEST(Describe, AMultiNodeRunShowsTheWholeJob) {
  v1::Run run = RunningRun();
  EXPECT_EQ(FormatRunDescription(run, kT).find("Job "), std::string::npos) << "a local run";
  v1::ClusterStatus* c = run.mutable_cluster();
  c->set_job("scan-a");
  c->set_nodes_expected(2);
  c->set_ranks_per_node(1);
  c->set_generation(3);
  c->set_restarts(2);
  c->set_this_node("node-a");
  c->set_etcd_endpoints("127.0.0.1:2379");
  c->set_etcd_reachable(false);
  c->set_etcd_error("connection refused");
  c->set_last_reason("node node-b lost: its etcd lease expired");
  v1::ClusterNode* a = c->add_nodes();
  a->set_node("node-a");
  a->set_node_rank(0);
  a->set_run_id("r-a");
  a->set_state(v1::RUN_STATE_RUNNING);
  a->set_generation(3);
  a->set_lease_alive(true);
  v1::RankStatus* rank = a->add_ranks();
  rank->set_rank(0);
  rank->set_alive(true);
  rank->mutable_progress()->set_step(42);
  v1::ClusterNode* b = c->add_nodes();
  b->set_node("node-b");
  b->set_node_rank(-1);
  b->set_lease_alive(false);
  const std::string text = FormatRunDescription(run, kT);
  EXPECT_NE(text.find("Job scan-a (2 nodes x 1 ranks), generation 3, 2 restarts of the job; this "
                      "node: node-a\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("etcd 127.0.0.1:2379: UNREACHABLE (connection refused)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("last change: node node-b lost"), std::string::npos) << text;
  EXPECT_NE(text.find("node-a  0          r-a"), std::string::npos) << text;
  EXPECT_NE(text.find("0:alive@42"), std::string::npos) << text;
  EXPECT_NE(text.find("node-b  -"), std::string::npos) << text;
  EXPECT_EQ(text.find("submission"), std::string::npos) << "none joined yet";
  run.set_cluster_submission("5f0c1a2b9d3e4f60");
  EXPECT_NE(FormatRunDescription(run, kT).find("  submission 5f0c1a2b9d3e4f60\n"),
            std::string::npos);
}

TEST(Describe, ValidationOnlyOnceEvaluated) {
  v1::Run run = RunningRun();
  EXPECT_EQ(FormatRunDescription(run, kT).find("Validation:"), std::string::npos);
  run.mutable_progress()->set_val_miou(0.4916);
  run.mutable_progress()->set_baseline_miou(0.2635);
  run.mutable_progress()->set_accuracy(0.9);
  const std::string text = FormatRunDescription(run, kT);
  EXPECT_NE(text.find("Validation:     mIoU 0.492 (majority-class baseline 0.264), last step "
                      "accuracy 0.900\n"),
            std::string::npos)
      << text;
}

// Issue 46: what the run trained, on its own line.
TEST(Describe, WhatTheRunTrained) {
  v1::Run run = RunningRun();
  EXPECT_EQ(FormatRunDescription(run, kT).find("Trained:"), std::string::npos);
  v1::TrainingTally* t = run.mutable_progress()->mutable_tally();
  t->set_steps(30);
  t->set_applied(4);
  t->set_skipped_window(20);
  t->set_skipped_guard(6);
  t->set_final_metric(0.0065);
  t->set_baseline_metric(0.27);
  const std::string text = FormatRunDescription(run, kT);
  EXPECT_NE(text.find("Trained:        4 of 30 steps applied; skipped: 20 in windows, 6 by the "
                      "guard, 0 by the loss scaler; val mIoU 0.0065 vs baseline 0.27\n"),
            std::string::npos)
      << text;
}

// Only a clean success is exit 0 for `trainctl watch` and `submit --watch`.
TEST(ExitCodes, OnlySucceededIsZero) {
  EXPECT_EQ(ExitCodeForRunState(v1::RUN_STATE_SUCCEEDED), 0);
  for (v1::RunState s : {v1::RUN_STATE_FAILED, v1::RUN_STATE_CANCELLED, v1::RUN_STATE_PENDING,
                         v1::RUN_STATE_RUNNING}) {
    EXPECT_NE(ExitCodeForRunState(s), 0) << v1::RunState_Name(s);
  }
}

TEST(Node, GpusAndSlots) {
  v1::Node node;
  node.set_hostname("box1");
  node.set_nvml(true);
  v1::Gpu* g = node.add_gpus();
  g->set_index(0);
  g->set_name("H200");
  g->set_memory_total_bytes(140LL << 30);
  g->set_healthy(false);
  g->set_reason("memory not released");
  v1::Gpu* other = node.add_gpus();
  other->set_index(1);
  other->set_healthy(true);
  other->set_health_error("nvmlDeviceGetTotalEccErrors failed: Unknown Error");
  v1::Slot* s = node.add_slots();
  s->set_gpu(true);
  s->set_gpu_index(0);
  s->set_state(v1::SLOT_STATE_STRANDED);
  const std::string text = FormatNode(node);
  for (const char* want : {"Host:           box1\n", "H200", "0 B / 140.0 GiB",
                           "unhealthy: memory not released", "gpu 0", "STRANDED",
                           "healthy (not read: nvmlDeviceGetTotalEccErrors failed: Unknown "
                           "Error)"}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in\n" << text;
  }
}

TEST(Json, ProtoFieldNamesAndDefaults) {
  v1::Run run = RunningRun();
  run.set_restarts(0);
  absl::StatusOr<std::string> json = ToJson(run);
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"run_id\": \"run-1\""), std::string::npos) << *json;
  EXPECT_NE(json->find("\"state\": \"RUN_STATE_RUNNING\""), std::string::npos) << *json;
  EXPECT_NE(json->find("\"restarts\": 0"), std::string::npos) << *json;
  EXPECT_NE(json->find("\"total_steps\": \"1000\""), std::string::npos) << *json;
  EXPECT_NE(json->back(), '\n');

  v1::RunEvent e;
  e.set_run_id("run-1");
  absl::StatusOr<std::string> line = ToJson(e, false);
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(line->find('\n'), std::string::npos);
  EXPECT_NE(line->find("\"run_id\":\"run-1\""), std::string::npos) << *line;
}

TEST(LogPath, LatestAttemptRankPathAndErrors) {
  v1::Run run = RunningRun();
  EXPECT_EQ(LatestAttempt(run), 0);
  EXPECT_EQ(LogPath(run, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  run.add_attempts()->set_number(1);
  v1::Attempt* a2 = run.add_attempts();
  a2->set_number(2);
  v1::RankStatus* r = a2->add_ranks();
  r->set_rank(1);
  r->set_log_path("/logs/elsewhere.log");
  EXPECT_EQ(LatestAttempt(run), 2);
  EXPECT_EQ(*LogPath(run, 0, 0), "/var/lib/trainsup/runs/run-1/attempts/2/rank-0.log");
  EXPECT_EQ(*LogPath(run, 1, 1), "/var/lib/trainsup/runs/run-1/attempts/1/rank-1.log");
  EXPECT_EQ(*LogPath(run, 2, 1), "/logs/elsewhere.log");
  EXPECT_EQ(LogPath(run, 3, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LogPath(run, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainsup::supervisor
