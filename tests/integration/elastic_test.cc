// Elastic gangs under the real daemon (docs/distributed.md, "Elastic"):
//  - CPU slots and the real worker: a gang of 3 (min 2) whose slot cpu:2 an
//    operator drains mid-run goes on at 2, grows back to 3 when the slot is
//    undrained, and ends SUCCEEDED having trained exactly the uninterrupted
//    gang's batches (rank 0's data.log_samples lines), every sample once an
//    epoch, with weights as close to the uninterrupted gang of 3 as a gang
//    of 2 all the way is. The drain's latency (DrainSlot to the first step
//    at the smaller size) is printed.
//  - Fake GPUs and the test worker: GPU 2 reports uncorrectable ECC errors;
//    its rank is stopped, the slot drained (DRAINED with the reason), and
//    the gang goes on at 3 of 4; an operator drain survives a daemon
//    restart, and undrain refuses a health drain and unknown slots; a slot
//    stranded past slots.drain_stranded_after_s is drained until released.
//  - Chaos, elastic: random rank kills, drains and undrains; the run ends
//    SUCCEEDED with every sample trained once an epoch, nothing left.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

#ifdef TRAINSUP_WORKER
#include "tests/common/elastic_checks.h"
#endif

namespace trainsup::integration {
namespace {

using ::testing::HasSubstr;

// The newest attempt runs `world` ranks, all alive, and has trained past
// step `past`.
bool RunningAt(const v1::Run& r, int world, int64_t past) {
  if (r.state() != v1::RUN_STATE_RUNNING || r.attempts_size() == 0) return false;
  const v1::Attempt& a = r.attempts(r.attempts_size() - 1);
  if (a.world_size() != world || a.ranks_size() != world || a.ended_ms() != 0) return false;
  for (const v1::RankStatus& rank : a.ranks()) {
    if (!rank.alive()) return false;
  }
  return r.progress().step() > past && a.ranks(0).progress().step() > a.resumed_from_step();
}

std::vector<std::string> ResizeLines(const std::vector<v1::RunEvent>& events) {
  std::vector<std::string> out;
  for (const v1::RunEvent& e : EventsOfKind(events, v1::EVENT_KIND_RESIZE)) {
    out.push_back(e.reason());
  }
  return out;
}

#ifdef TRAINSUP_WORKER

std::string ElasticSpec(const std::string& name, int world, int min_world, int steps) {
  std::ostringstream s;
  s << "name = \"" << name << "\"\nworld_size = " << world << "\nmin_world_size = " << min_world
    << "\n[elastic]\nwait_s = 60\ngrow_after_s = 1\n"
    << "[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = 0.1\nsync_batchnorm = true\n"
    << "[data]\nformat = \"synthetic\"\nscenes = 10\nscene_size = \"small\"\nlog_samples = true\n"
    << "[train]\nbatch_size = 1\nsteps = " << steps
    << "\ncheckpoint_every_steps = 2\nkeep_checkpoints = 3\ndeterministic = true\nthreads = 1\n";
  return s.str();
}

// Rank 0's sample lines of every attempt, a later attempt's line for a
// step replacing an earlier one's.
std::map<int, std::string> SampleLines(const v1::Run& run) {
  std::map<int, std::string> lines;
  for (const v1::Attempt& a : run.attempts()) {
    if (a.ranks_size() > 0)
      trainsup::testing::AddSampleLines(ReadFileText(a.ranks(0).log_path()), &lines);
  }
  return lines;
}

std::map<std::string, at::Tensor> FinalWeights(const v1::Run& run, int step) {
  return trainsup::testing::ReadWeights(RunLayout(run.run_dir()).CheckpointsDir() + "/step-" +
                                        std::to_string(step) + "/model.safetensors");
}

TEST(Elastic, ADrainedSlotShrinksTheGangAndUndrainingItGrowsItBack) {
  constexpr int kSteps = 30;
  DaemonHarness h;
  UseRealWorker(h, 3);
  ASSERT_TRUE(h.Start());

  // The references, uninterrupted: the gang of 3, and a gang of 2 all the
  // way (min_world_size 2 with one slot drained before it starts).
  const std::string ref_id = h.Submit(ElasticSpec("ref", 3, 2, kSteps));
  v1::Run ref;
  ASSERT_TRUE(h.WaitForEnd(ref_id, Seconds(300), &ref));
  ASSERT_EQ(ref.state(), v1::RUN_STATE_SUCCEEDED) << Describe(ref) << EveryRankLog(ref);
  v1::Slot slot;
  ASSERT_TRUE(h.Drain("cpu:2", "the gang of 2", &slot).ok());
  const std::string two_id = h.Submit(ElasticSpec("two", 3, 2, kSteps));
  v1::Run two;
  ASSERT_TRUE(h.WaitForEnd(two_id, Seconds(300), &two));
  ASSERT_EQ(two.state(), v1::RUN_STATE_SUCCEEDED) << Describe(two) << EveryRankLog(two);
  ASSERT_EQ(two.attempts(0).world_size(), 2) << Describe(two);
  ASSERT_TRUE(h.Undrain("cpu:2", &slot).ok());

  // The elastic run: drained at step > 6, undrained once it trains at 2.
  const std::string id = h.Submit(ElasticSpec("elastic", 3, 2, kSteps));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return RunningAt(r, 3, 6); }, Seconds(120), &run))
      << Describe(run);
  const auto drained_at = Clock::now();
  grpc::Status s = h.Drain("cpu:2", "maintenance", &slot);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(slot.name(), "cpu:2");
  EXPECT_EQ(slot.state(), v1::SLOT_STATE_DRAINED);
  EXPECT_EQ(slot.drain_reason(), "maintenance");
  EXPECT_EQ(slot.drain_source(), "operator");
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return RunningAt(r, 2, 0); }, Seconds(120), &run))
      << Describe(run) << EveryRankLog(run);
  const double drain_latency_s = std::chrono::duration<double>(Clock::now() - drained_at).count();
  v1::Node node = GetNode(h);
  ASSERT_EQ(node.slots_size(), 3);
  EXPECT_EQ(node.slots(2).state(), v1::SLOT_STATE_DRAINED);
  EXPECT_EQ(node.slots(2).drain_reason(), "maintenance");
  EXPECT_EQ(node.slots(2).run_id(), "");
  const int64_t step_at_two = run.progress().step();
  ASSERT_TRUE(h.Undrain("cpu:2", &slot).ok());
  EXPECT_EQ(slot.state(), v1::SLOT_STATE_FREE);
  ASSERT_TRUE(h.WaitFor(
      id, [&](const v1::Run& r) { return RunningAt(r, 3, step_at_two); }, Seconds(120), &run))
      << Describe(run) << EveryRankLog(run);
  ASSERT_TRUE(h.WaitForEnd(id, Seconds(300), &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run) << EveryRankLog(run);
  EXPECT_EQ(run.restarts(), 0) << "a resize is not a restart";
  std::printf("drain to the first step at 2 ranks: %.1f s\n", drain_latency_s);

  // Every change of size is visible.
  const std::vector<std::string> resizes = ResizeLines(h.History(id));
  ASSERT_EQ(resizes.size(), 2u) << Describe(h.History(id));
  EXPECT_THAT(resizes[0], HasSubstr("world size 3 \u2192 2: slot cpu:2 drained (maintenance)"));
  EXPECT_THAT(resizes[1], HasSubstr("world size 2 \u2192 3: slot cpu:2 is free again"));
  std::vector<int> sizes;
  for (const v1::Attempt& a : run.attempts()) sizes.push_back(a.world_size());
  EXPECT_EQ(sizes, (std::vector<int>{3, 2, 3})) << Describe(run);

  // The same global batches as the uninterrupted gang, every sample once
  // an epoch (10 scenes: 8 train, 3 per step).
  const std::map<int, std::string> lines = SampleLines(run);
  EXPECT_EQ(lines, SampleLines(ref));
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps));
  for (const auto& [epoch, samples] : trainsup::testing::SamplesPerEpoch(lines)) {
    EXPECT_EQ(std::set<int>(samples.begin(), samples.end()).size(), samples.size())
        << "a sample trained twice in epoch " << epoch;
  }

  // The weights: float32 sums of a gang of 2 differ in rounding from a
  // gang of 3's, and training amplifies it. The elastic run trained at 2
  // only part of the way, so it is no further from the gang of 3 than the
  // gang of 2 all the way is (within a factor 2 for the amplification).
  const auto ref_w = FinalWeights(ref, kSteps);
  const double two_gap = trainsup::testing::WeightsGap(FinalWeights(two, kSteps), ref_w);
  const double gap = trainsup::testing::WeightsGap(FinalWeights(run, kSteps), ref_w);
  std::printf(
      "weights at step %d against the uninterrupted gang of 3: elastic %.3g, gang of 2 %.3g\n",
      kSteps, gap, two_gap);
  EXPECT_LE(gap, std::max(2 * two_gap, 1e-6));
  EXPECT_TRUE(ProcessesMentioning(RunLayout(run.run_dir()).dir()).empty());
}

// The chaos test's elastic mode: random rank kills, drains and undrains
// (seeded) while a gang of 3 (min 2) trains. The run ends SUCCEEDED, every
// epoch trained each of the 8 training scenes exactly once (rank 0's
// sample logs, a later attempt's line for a step replacing an earlier
// one's), and no worker is left behind.
TEST(Elastic, ChaosOfKillsDrainsAndUndrainsEndsWithEverySampleOnceAnEpoch) {
  constexpr int kSteps = 45;
  DaemonHarness h;
  UseRealWorker(h, 3);
  h.Set("restart.initial_backoff_s", "0");
  h.Set("restart.crash_loop_attempts", "1000");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(ElasticSpec("chaos", 3, 2, kSteps));
  std::mt19937 rng(20261204);
  int kills = 0, drains = 0, undrains = 0;
  std::string drained;  // the slot drained now, "" when none
  v1::Run run;
  while (kills + drains + undrains < 9 || drains < 2 || undrains < 2) {
    // A running attempt that trained a step past the checkpoint it resumed
    // from (each action leaves the run further on).
    ASSERT_TRUE(h.WaitFor(
        id,
        [&](const v1::Run& r) {
          if (IsTerminal(r.state())) return true;
          return RunningAt(r, drained.empty() ? 3 : 2, 0) &&
                 r.progress().last_checkpoint_step() >
                     std::max<int64_t>(r.attempts(r.attempts_size() - 1).resumed_from_step(), 0);
        },
        Seconds(300), &run))
        << Describe(run) << EveryRankLog(run);
    ASSERT_FALSE(IsTerminal(run.state())) << Describe(run);
    const int attempt = run.attempts_size();
    const int action = std::uniform_int_distribution<int>(0, 2)(rng);
    v1::Slot slot;
    if (action == 0 || (action == 1 && !drained.empty()) || (action == 2 && drained.empty())) {
      const v1::Attempt& a = run.attempts(attempt - 1);
      const int rank = std::uniform_int_distribution<int>(0, a.ranks_size() - 1)(rng);
      ASSERT_EQ(kill(a.ranks(rank).pid(), SIGKILL), 0);
      ++kills;
      std::printf("chaos: rank %d of %d SIGKILLed near step %lld\n", rank, a.ranks_size(),
                  static_cast<long long>(run.progress().step()));
    } else if (action == 1) {
      drained = "cpu:" + std::to_string(std::uniform_int_distribution<int>(0, 2)(rng));
      ASSERT_TRUE(h.Drain(drained, "chaos", &slot).ok());
      ++drains;
      std::printf("chaos: %s drained near step %lld\n", drained.c_str(),
                  static_cast<long long>(run.progress().step()));
    } else {
      ASSERT_TRUE(h.Undrain(drained, &slot).ok());
      std::printf("chaos: %s undrained near step %lld\n", drained.c_str(),
                  static_cast<long long>(run.progress().step()));
      drained.clear();
      ++undrains;
    }
    ASSERT_TRUE(h.WaitFor(
        id, [&](const v1::Run& r) { return IsTerminal(r.state()) || r.attempts_size() > attempt; },
        Seconds(120), &run))
        << Describe(run);
  }
  if (!drained.empty()) {
    v1::Slot slot;
    ASSERT_TRUE(h.Undrain(drained, &slot).ok());
  }
  ASSERT_TRUE(h.WaitForEnd(id, Seconds(400), &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run) << EveryRankLog(run);
  std::printf("chaos: %d kills, %d drains, %d undrains, %d attempts\n", kills, drains, undrains,
              run.attempts_size());

  const std::map<int, std::string> lines = SampleLines(run);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps));
  const std::map<int, std::vector<int>> per_epoch = trainsup::testing::SamplesPerEpoch(lines);
  // 8 training scenes, global batch 3: 3 steps an epoch (3, 3, 2).
  ASSERT_EQ(per_epoch.size(), static_cast<size_t>(kSteps / 3));
  for (const auto& [epoch, samples] : per_epoch) {
    EXPECT_EQ(samples, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7})) << "epoch " << epoch;
  }
  EXPECT_TRUE(Eventually([&] { return ProcessesMentioning(run.run_dir()).empty(); }, Seconds(10)));
}

#else  // the test worker

// 4 fake GPUs; the gang wants 4 and may go on with 3.
TEST(Elastic, AGpuWithUncorrectableEccErrorsIsDrainedAndTheGangGoesOnWithout) {
  DaemonHarness h;
  const std::string gpu_file = h.dir() + "/gpus.json";
  std::vector<FakeGpu> gpus;
  for (int i = 0; i < 4; ++i) gpus.push_back({"GPU-elastic-" + std::to_string(i), 10, {}});
  WriteFakeGpus(gpu_file, gpus);
  h.Set("slots.use_gpus", "true");
  h.Set("slots.gpu_release_timeout_s", "5");
  h.Set("slots.gpu_idle_memory_mb", "100");
  h.Set("testing.fake_gpu_file", "\"" + gpu_file + "\"");
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit("min_world_size = 3\n" + Spec("ecc", 600, 50, 5, "", 4) +
                                  "[elastic]\nwait_s = 60\ngrow_after_s = 1\n");
  ASSERT_FALSE(id.empty());
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return RunningAt(r, 4, 5); }, kRunLimit, &run))
      << Describe(run);

  // GPU 2 reports uncorrectable ECC errors: drained, its rank stopped, the
  // gang goes on at 3 on GPUs 0, 1 and 3.
  gpus[2].ecc_uncorrected = 3;
  WriteFakeGpus(gpu_file, gpus);
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return RunningAt(r, 3, 0); }, kRunLimit, &run))
      << Describe(run) << h.DaemonLog();
  v1::Node node = GetNode(h);
  ASSERT_EQ(node.slots_size(), 4);
  EXPECT_EQ(node.slots(2).name(), "gpu:2");
  EXPECT_EQ(node.slots(2).state(), v1::SLOT_STATE_DRAINED);
  EXPECT_EQ(node.slots(2).drain_source(), "gpu_health");
  EXPECT_THAT(node.slots(2).drain_reason(), HasSubstr("ECC"));
  ASSERT_EQ(node.gpus_size(), 4);
  EXPECT_FALSE(node.gpus(2).healthy());
  std::vector<std::string> on;
  for (const v1::RankStatus& r : run.attempts(run.attempts_size() - 1).ranks())
    on.push_back(r.gpu());
  EXPECT_EQ(on, (std::vector<std::string>{gpus[0].uuid, gpus[1].uuid, gpus[3].uuid}));

  // What an operator may and may not do.
  v1::Slot slot;
  EXPECT_EQ(h.Undrain("gpu:2", &slot).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(h.Undrain("gpu:9", &slot).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(h.Undrain("gpu:1", &slot).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(h.Drain("gpu:1", "", &slot).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(h.Drain("gpu:1", "no", &slot, h.viewer_token()).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // An operator drains GPU 3 too: 2 usable GPUs, below min_world_size, so
  // the run waits, and says why; the drain outlives a daemon restart.
  ASSERT_TRUE(h.Drain("gpu:3", "bad fan", &slot).ok());
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_RESTARTING && r.attempts_size() >= 2 &&
               r.attempts(r.attempts_size() - 1).ended_ms() > 0;
      },
      kRunLimit, &run))
      << Describe(run);
  h.Signal(SIGTERM);
  ASSERT_TRUE(h.WaitExit(Seconds(30)).has_value());
  ASSERT_TRUE(h.Start());
  node = GetNode(h);
  EXPECT_EQ(node.slots(3).state(), v1::SLOT_STATE_DRAINED);
  EXPECT_EQ(node.slots(3).drain_reason(), "bad fan");
  EXPECT_EQ(node.slots(3).drain_source(), "operator");
  EXPECT_EQ(node.slots(2).drain_source(), "gpu_health") << "found again by the new daemon";
  ASSERT_TRUE(h.WaitFor(
      id,
      [](const v1::Run& r) { return r.reason().find("waiting for 3 slots") != std::string::npos; },
      kRunLimit, &run))
      << Describe(run);
  EXPECT_NE(run.state(), v1::RUN_STATE_RUNNING) << Describe(run);
  EXPECT_THAT(run.reason(),
              HasSubstr("2 usable; gpu:2 drained (GPU 2 uncorrectable ECC errors (3)), "
                        "gpu:3 drained (bad fan)"));

  // GPU 2 recovers (a reset): offered again, with an event; the gang
  // starts at 3, and grows to 4 once GPU 3 is undrained.
  gpus[2].ecc_uncorrected = 0;
  WriteFakeGpus(gpu_file, gpus);
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return RunningAt(r, 3, 0); }, kRunLimit, &run))
      << Describe(run) << h.DaemonLog();
  ASSERT_TRUE(h.Undrain("gpu:3", &slot).ok());
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return RunningAt(r, 4, 0); }, kRunLimit, &run))
      << Describe(run) << h.DaemonLog();
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  const std::vector<v1::RunEvent> events = h.History(id);
  const std::vector<std::string> resizes = ResizeLines(events);
  ASSERT_GE(resizes.size(), 2u) << Describe(events);
  EXPECT_THAT(resizes[0], HasSubstr("world size 4 \u2192 3: slot gpu:2 drained (GPU 2 "));
  EXPECT_THAT(resizes.back(), HasSubstr("\u2192 4: slot gpu:3 is free again"));
  bool offered = false;
  for (const v1::RunEvent& e : EventsOfKind(events, v1::EVENT_KIND_GPU)) {
    offered = offered || e.reason().find("slot gpu:2 offered again: GPU 2 is healthy again") !=
                             std::string::npos;
  }
  EXPECT_TRUE(offered) << Describe(events);

  // An Xid that needs a reset: NVML reports the event once, so the drain
  // stays after the event is gone, until an operator (who reset the GPU)
  // undrains the slot.
  gpus[0].xids = {79};
  WriteFakeGpus(gpu_file, gpus);
  ASSERT_TRUE(Eventually([&] { return SlotIn(h, 0, v1::SLOT_STATE_DRAINED, &node); }, kRunLimit));
  EXPECT_EQ(node.slots(0).drain_reason(), "GPU 0 Xid 79 (needs a GPU reset)");
  gpus[0].xids.clear();
  WriteFakeGpus(gpu_file, gpus);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two GPU queries
  EXPECT_TRUE(SlotIn(h, 0, v1::SLOT_STATE_DRAINED, &node)) << "an Xid drain outlives the event";
  ASSERT_TRUE(h.Undrain("gpu:0", &slot).ok());
  EXPECT_EQ(slot.state(), v1::SLOT_STATE_FREE);
}

int Occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A health query that fails for one GPU (NVML answers an error for one
// call) drains nothing: the GPU is judged by the facts that were read.
// GetNode and the daemon's log say which query failed, the log once while
// it keeps failing, and again when it answers.
TEST(Elastic, AGpuWhoseHealthQueryFailsIsNotDrainedAndTheNodeSaysWhichQuery) {
  DaemonHarness h;
  const std::string gpu_file = h.dir() + "/gpus.json";
  UseFakeGpus(h, gpu_file, kGpuUuids, "1");
  ASSERT_TRUE(h.Start());
  const std::string error = "nvmlDeviceGetTotalEccErrors failed: Unknown Error";
  std::vector<FakeGpu> gpus = {{kGpuUuids[0], 10, {}}, {kGpuUuids[1], 10, {}}};
  gpus[1].health_error = error;
  WriteFakeGpus(gpu_file, gpus);
  v1::Node node;
  ASSERT_TRUE(Eventually(
      [&] {
        node = GetNode(h);
        return node.gpus_size() == 2 && node.gpus(1).health_error() == error;
      },
      kRunLimit))
      << node.DebugString();
  // A later query, with the same failure: its memory figure moved.
  gpus[1].used_mb = 20;
  WriteFakeGpus(gpu_file, gpus);
  ASSERT_TRUE(Eventually(
      [&] {
        node = GetNode(h);
        return node.gpus(1).memory_used_bytes() == int64_t{20} << 20;
      },
      kRunLimit))
      << node.DebugString();
  EXPECT_TRUE(node.gpus(1).healthy());
  EXPECT_EQ(node.gpus(1).health_error(), error);
  EXPECT_EQ(node.gpus(0).health_error(), "");
  EXPECT_EQ(node.slots(1).state(), v1::SLOT_STATE_FREE);
  const std::string failed = "GPU 1: a health query failed (" + error +
                             "); its health is judged by the facts that were read";
  const std::string log = h.DaemonLog();
  EXPECT_EQ(Occurrences(log, failed), 1) << log;
  // It answers again.
  gpus[1].health_error.clear();
  WriteFakeGpus(gpu_file, gpus);
  EXPECT_TRUE(Eventually(
      [&] {
        return h.DaemonLog().find("GPU 1: its health queries answer again") != std::string::npos;
      },
      kRunLimit))
      << h.DaemonLog();
  EXPECT_EQ(GetNode(h).gpus(1).health_error(), "");
}

// A slot STRANDED longer than slots.drain_stranded_after_s is drained
// (source "stranded"); the drain ends when its memory is released.
TEST(Elastic, ASlotStrandedTooLongIsDrainedUntilItsMemoryIsReleased) {
  DaemonHarness h;
  const std::string gpu_file = h.dir() + "/gpus.json";
  UseFakeGpus(h, gpu_file, kGpuUuids, "1");
  h.Set("slots.drain_stranded_after_s", "2");
  h.Set("testing.allow_fault_injection", "true");
  ASSERT_TRUE(h.Start());
  ForeignProcess stranger(h.dir() + "/stranger.log");
  const std::string id =
      h.Submit(Spec("strand", 300, 100, 2, "exit_at_step = 30\nexit_code = 3\nonly_attempt = 1"));
  v1::Run run;
  ASSERT_TRUE(h.WaitFor(
      id, [](const v1::Run& r) { return RunningAt(r, 1, 0); }, kRunLimit, &run))
      << Describe(run);
  ASSERT_EQ(run.attempts(0).ranks(0).slot(), 0);
  // GPU 0 fills up with a process outside the worker's group.
  WriteFakeGpus(gpu_file, {{kGpuUuids[0], 4096, {stranger.pid()}}, {kGpuUuids[1], 10, {}}});
  v1::Node node;
  ASSERT_TRUE(Eventually([&] { return SlotIn(h, 0, v1::SLOT_STATE_DRAINED, &node); }, kRunLimit))
      << node.DebugString();
  EXPECT_EQ(node.slots(0).drain_source(), "stranded");
  EXPECT_THAT(node.slots(0).drain_reason(), HasSubstr("stranded for more than 2 s"));
  EXPECT_THAT(node.slots(0).drain_reason(), HasSubstr(std::to_string(stranger.pid())));
  v1::Slot slot;
  EXPECT_EQ(h.Undrain("gpu:0", &slot).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // The stranger lets go: the drain ends with the stranding.
  stranger.Stop();
  WriteFakeGpus(gpu_file, {{kGpuUuids[0], 10, {}}, {kGpuUuids[1], 10, {}}});
  ASSERT_TRUE(Eventually([&] { return SlotIn(h, 0, v1::SLOT_STATE_FREE, &node); }, kRunLimit))
      << node.DebugString();
  EXPECT_EQ(node.slots(0).drain_reason(), "");
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
}

#endif

}  // namespace
}  // namespace trainsup::integration
