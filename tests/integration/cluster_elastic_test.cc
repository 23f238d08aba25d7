// An elastic multi-node job as a user runs it (docs/distributed.md,
// "Elastic"): one real etcd on loopback, two real trainsupd daemons
// ("node-a", "node-b", one CPU slot each), the real worker, the same spec
// with cluster.min_nodes = 1 submitted to both.
//
// node-b's daemon is SIGKILLed mid-run. node-a counts it lost when its
// lease expires, restarts the job, and after [elastic] wait_s closes the
// rendezvous without it: the job trains on at world size 1 with the same
// global batches. node-b's daemon is started again: node-a's rank
// checkpoints and stops, the job moves on (no restart counted), and both
// nodes train at world size 2 from that checkpoint to the end. The global
// batches are those of an uninterrupted gang of 2 (rank 0's sample lines),
// every sample once an epoch, and each change of size is an event.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_replace.h"
#include "tests/common/elastic_checks.h"
#include "tests/integration/cluster_test_util.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr int kSteps = 96;  // node-a alone must not finish before node-b is back
constexpr int kCheckpointEvery = 4;
constexpr double kWaitS = 3;

// The model and data of both runs: BatchNorm synchronised over the gang
// and rank 0's samples logged (docs/distributed.md, "Elastic").
std::string ElasticModel(const std::string& spec) {
  return absl::StrReplaceAll(spec, {{"[model]\n", "[model]\nsync_batchnorm = true\n"},
                                    {"[data]\n", "[data]\nlog_samples = true\n"}});
}

std::map<int, std::string> SampleLines(const v1::Run& run) {
  std::map<int, std::string> lines;
  for (const v1::Attempt& a : run.attempts()) {
    if (a.ranks_size() > 0 && a.ranks(0).rank() == 0) {
      trainsup::testing::AddSampleLines(ReadFileText(a.ranks(0).log_path()), &lines);
    }
  }
  return lines;
}

// The newest attempt is generation `generation`, running at `world` ranks,
// its rank more than `steps` steps past where it resumed.
std::function<bool(const v1::Run&)> TrainingAt(int world, int64_t generation, int steps) {
  return [=](const v1::Run& r) {
    const v1::Attempt* a = Last(r);
    return RunningPast(r, 0) && a->world_size() == world && a->generation() == generation &&
           a->ranks(0).progress().step() > a->resumed_from_step() + steps;
  };
}

// The elastic job (cluster.min_nodes = 1) submitted to both nodes; their
// run ids.
std::pair<std::string, std::string> SubmitElastic(DaemonHarness& a, DaemonHarness& b,
                                                  const std::string& endpoint,
                                                  const std::string& shared, const std::string& job,
                                                  int steps) {
  const std::string spec =
      ElasticModel(ClusterSpecText(job, endpoint, shared, steps, kCheckpointEvery)) +
      "min_nodes = 1\n[elastic]\nwait_s = " + std::to_string(kWaitS) + "\n";
  return {a.Submit(spec), b.Submit(spec)};
}

std::vector<std::string> ResizeLines(const std::vector<v1::RunEvent>& events) {
  std::vector<std::string> out;
  for (const v1::RunEvent& e : EventsOfKind(events, v1::EVENT_KIND_RESIZE)) {
    out.push_back(e.reason());
  }
  return out;
}

TEST_F(ClusterTest, ElasticJobGoesOnWithoutAKilledNodeAndTakesItInWhenItRejoins) {
  // The reference: the same training on one daemon with a gang of 2.
  DaemonHarness one;
  Configure(one, "solo", shared_, 2);
  ASSERT_TRUE(one.Start());
  const std::string ref_id = one.Submit(
      "world_size = 2\n" + ElasticModel(ModelSpec("reference", kSteps, kCheckpointEvery)));
  v1::Run ref;
  ASSERT_TRUE(one.WaitForEnd(ref_id, Seconds(400), &ref));
  ASSERT_EQ(ref.state(), v1::RUN_STATE_SUCCEEDED) << Describe(ref);

  const auto [ia, ib] = SubmitElastic(a_, b_, etcd_.endpoint(), shared_, "elastic", kSteps);
  v1::Run ra, rb;
  ASSERT_TRUE(b_.WaitFor(ib, TrainingAt(2, 1, 8), Seconds(200), &rb)) << Describe(rb);
  b_.Kill();
  const auto killed = Clock::now();

  // node-a goes on alone: generation 2, world size 1, node-b shown as left
  // out.
  ASSERT_TRUE(a_.WaitFor(ia, TrainingAt(1, 2, 2), Seconds(120), &ra))
      << Describe(ra) << Events(a_, ia);
  const double shrink_s = Since(killed);
  bool shown = false;
  for (const v1::ClusterNode& n : ra.cluster().nodes()) {
    if (n.node() != "node-b") continue;
    shown = true;
    EXPECT_FALSE(n.lease_alive());
    EXPECT_THAT(n.reason(), HasSubstr("left out of generation 2"));
  }
  EXPECT_TRUE(shown) << ra.cluster().DebugString();
  const int64_t step_at_one = ra.progress().step();

  // node-b's daemon comes back: the job grows back at a checkpoint.
  const auto restarted = Clock::now();
  ASSERT_TRUE(b_.Start());
  const double start_s = Since(restarted);
  ASSERT_TRUE(a_.WaitFor(ia, TrainingAt(2, 3, 0), Seconds(120), &ra))
      << Describe(ra) << Events(a_, ia);
  const double grow_s = Since(restarted);
  std::printf(
      "node-b killed to training at world size 1 (lease %.0f s + wait_s %.0f s): %.1f s; "
      "node-b's daemon started (%.1f s of it until it served) to training at world size 2: "
      "%.1f s\n",
      kLeaseS, kWaitS, shrink_s, start_s, grow_s);
  ExpectBothSucceed(ia, ib, &ra, &rb);
  std::vector<int> sizes;
  for (const v1::Attempt& a : ra.attempts()) sizes.push_back(a.world_size());
  EXPECT_EQ(sizes, (std::vector<int>{2, 1, 2})) << Describe(ra);
  EXPECT_EQ(ra.restarts(), 1) << "the lost node's restart; taking it in again is none";
  ASSERT_EQ(ra.attempts_size(), 3);
  EXPECT_EQ(ra.attempts(2).generation(), 3);
  EXPECT_THAT(ra.attempts(1).exit_reason(), HasSubstr("resizing the gang: node node-b rejoined"));
  // Nothing trained at world size 1 is lost: the grown gang resumes from
  // the checkpoint node-a's rank stopped at.
  EXPECT_GE(ra.attempts(2).resumed_from_step(), step_at_one);
  EXPECT_EQ(Last(rb)->generation(), 3);
  EXPECT_EQ(Last(rb)->resumed_from_step(), ra.attempts(2).resumed_from_step());
  EXPECT_EQ(Last(rb)->world_size(), 2);

  const std::vector<std::string> resizes = ResizeLines(a_.History(ia));
  ASSERT_EQ(resizes.size(), 2u) << Events(a_, ia);
  EXPECT_THAT(resizes[0], HasSubstr("world size 2 \u2192 1: node node-b left out: only 1 of 2 "
                                    "nodes joined generation 2's rendezvous within 3 s "
                                    "(min_nodes 1)"));
  EXPECT_THAT(resizes[1], HasSubstr("world size 1 \u2192 2: node node-b rejoined"));
  EXPECT_THAT(Events(a_, ia), HasSubstr("node node-b lost: its etcd lease expired"));

  // The same global batches as the uninterrupted gang, every sample once
  // an epoch.
  const std::map<int, std::string> lines = SampleLines(ra);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(lines, SampleLines(ref));
  for (const auto& [epoch, samples] : trainsup::testing::SamplesPerEpoch(lines)) {
    EXPECT_EQ(std::set<int>(samples.begin(), samples.end()).size(), samples.size())
        << "a sample trained twice in epoch " << epoch;
  }
  ExpectNoWorkerLeft(ra, rb);
}

// A slot drained on node-b mid-run (an operator here; a GPU's health
// takes the same path): node-b's rank stops at a checkpoint, which the
// whole gang agrees on, and moves the job on with no restart counted.
// node-b's run waits for a usable slot, so after wait_s node-a goes on
// alone. The undrain gives node-b its slot back: it joins, node-a's rank
// checkpoints and stops, and both train at world size 2 to the end.
TEST_F(ClusterTest, ElasticJobGoesOnWithoutANodeWhoseSlotIsDrainedAndTakesItInOnUndrain) {
  constexpr int kDrainSteps = 64;
  const auto [ia, ib] = SubmitElastic(a_, b_, etcd_.endpoint(), shared_, "drained", kDrainSteps);
  v1::Run ra, rb;
  ASSERT_TRUE(b_.WaitFor(ib, TrainingAt(2, 1, 8), Seconds(200), &rb)) << Describe(rb);
  v1::Slot slot;
  ASSERT_TRUE(b_.Drain("cpu:0", "bad fan", &slot).ok());
  const auto drained = Clock::now();

  // node-b waits for a usable slot and says why; node-a goes on alone.
  ASSERT_TRUE(b_.WaitFor(
      ib,
      [](const v1::Run& r) {
        return r.reason().find("waiting for 1 slot: 0 usable; cpu:0 drained (bad fan)") !=
               std::string::npos;
      },
      Seconds(60), &rb))
      << Describe(rb) << Events(b_, ib);
  ASSERT_TRUE(a_.WaitFor(ia, TrainingAt(1, 2, 2), Seconds(120), &ra))
      << Describe(ra) << Events(a_, ia);
  const double shrink_s = Since(drained);
  const int64_t step_at_one = ra.progress().step();
  EXPECT_EQ(ra.restarts(), 0) << "a drain is no failure of the job; " << Describe(ra);

  // The undrain: the job grows back at a checkpoint.
  ASSERT_TRUE(b_.Undrain("cpu:0", &slot).ok());
  const auto undrained = Clock::now();
  ASSERT_TRUE(a_.WaitFor(ia, TrainingAt(2, 3, 0), Seconds(120), &ra))
      << Describe(ra) << Events(a_, ia);
  std::printf(
      "node-b's slot drained to node-a training at world size 1 (wait_s %.0f s): %.1f s; "
      "undrained to training at world size 2: %.1f s\n",
      kWaitS, shrink_s, Since(undrained));
  ExpectBothSucceed(ia, ib, &ra, &rb);
  std::vector<int> sizes;
  for (const v1::Attempt& a : ra.attempts()) sizes.push_back(a.world_size());
  EXPECT_EQ(sizes, (std::vector<int>{2, 1, 2})) << Describe(ra);
  EXPECT_EQ(ra.restarts(), 0) << Describe(ra);
  EXPECT_EQ(rb.restarts(), 0) << Describe(rb);
  ASSERT_EQ(rb.attempts_size(), 2) << Describe(rb);
  EXPECT_THAT(rb.attempts(0).exit_reason(),
              HasSubstr("resizing the gang: slot cpu:0 drained (bad fan)"));
  EXPECT_EQ(rb.attempts(1).generation(), 3);
  EXPECT_GE(ra.attempts(2).resumed_from_step(), step_at_one);
  EXPECT_EQ(rb.attempts(1).resumed_from_step(), ra.attempts(2).resumed_from_step());
  EXPECT_THAT(Events(a_, ia), HasSubstr("node node-b: slot cpu:0 drained (bad fan)"));
  const std::vector<std::string> resizes = ResizeLines(a_.History(ia));
  ASSERT_EQ(resizes.size(), 2u) << Events(a_, ia);
  EXPECT_THAT(resizes[0], HasSubstr("world size 2 \u2192 1: node node-b left out"));
  EXPECT_THAT(resizes[0], HasSubstr("; node node-b: slot cpu:0 drained (bad fan)"));
  EXPECT_THAT(resizes[1], HasSubstr("world size 1 \u2192 2: node node-b rejoined"));

  // Every step trained once, every sample once an epoch.
  const std::map<int, std::string> lines = SampleLines(ra);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kDrainSteps));
  for (const auto& [epoch, samples] : trainsup::testing::SamplesPerEpoch(lines)) {
    EXPECT_EQ(std::set<int>(samples.begin(), samples.end()).size(), samples.size())
        << "a sample trained twice in epoch " << epoch;
  }
  ExpectNoWorkerLeft(ra, rb);
}

}  // namespace
}  // namespace trainsup::integration
