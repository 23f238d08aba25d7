// Adaptive hang detection: the learnt timeout, its clamps, the start-up
// grace, the checkpoint allowance, and the frozen/hung verdicts.
#include "supervisor/policy/progress_timeout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace trainsup::supervisor {
namespace {

// Learnt from one step of `s` seconds.
ProgressLearning Learnt(double s) {
  ProgressLearning l;
  ObserveStep(l, s);
  return l;
}

TEST(WorkerPhase, StringAndProtoRoundTrip) {
  for (WorkerPhase p : {WorkerPhase::kLoading, WorkerPhase::kTraining, WorkerPhase::kCheckpointing,
                        WorkerPhase::kEvaluating}) {
    EXPECT_EQ(WorkerPhaseFromString(ToString(p)), p);
    EXPECT_EQ(WorkerPhaseFromProto(static_cast<int>(p)), p);
  }
  EXPECT_EQ(ToString(WorkerPhase::kCheckpointing), "checkpointing");
  EXPECT_FALSE(WorkerPhaseFromString("idle").has_value());
  EXPECT_FALSE(WorkerPhaseFromProto(0).has_value());
  EXPECT_FALSE(WorkerPhaseFromProto(5).has_value());
}

TEST(Liveness, VerdictStringRoundTrip) {
  for (Liveness::Verdict v : {Liveness::kAlive, Liveness::kFrozen, Liveness::kHung}) {
    EXPECT_EQ(VerdictFromString(ToString(v)), v);
  }
  EXPECT_FALSE(VerdictFromString("dead").has_value());
}

TEST(ProgressTimeoutConfig, ValidateNamesTheField) {
  EXPECT_TRUE(Validate(ProgressTimeoutConfig{}).ok());
  ProgressTimeoutConfig c;
  c.max_timeout_s = 10;  // below min_timeout_s
  absl::Status s = Validate(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("max_timeout_s"), std::string::npos) << s;
  c = ProgressTimeoutConfig{};
  c.safety_factor = 0.5;
  EXPECT_NE(std::string(Validate(c).message()).find("safety_factor"), std::string::npos);
  c = ProgressTimeoutConfig{};
  c.min_timeout_s = 0;
  EXPECT_NE(std::string(Validate(c).message()).find("min_timeout_s"), std::string::npos);
  c = ProgressTimeoutConfig{};
  c.checkpoint_allowance_s = -1;
  EXPECT_NE(std::string(Validate(c).message()).find("checkpoint_allowance_s"), std::string::npos);
  c = ProgressTimeoutConfig{};
  c.fixed_timeout_s = INFINITY;
  EXPECT_NE(std::string(Validate(c).message()).find("fixed_timeout_s"), std::string::npos);
}

TEST(ObserveStep, KeepsTheSlowestAndCounts) {
  ProgressLearning l;
  ObserveStep(l, 2.0);
  ObserveStep(l, 7.5);
  ObserveStep(l, 3.0);
  ObserveStep(l, -1.0);
  ObserveStep(l, NAN);
  EXPECT_DOUBLE_EQ(l.slowest_step_s, 7.5);
  EXPECT_EQ(l.steps_observed, 3);
}

TEST(ProgressTimeoutSeconds, LearntSlowestStepDrivesTheTimeout) {
  const ProgressTimeoutConfig c;  // factor 5, clamp [30, 3600]
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(20), WorkerPhase::kTraining, true), 100);
  ProgressLearning l = Learnt(20);
  ObserveStep(l, 40);
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, l, WorkerPhase::kTraining, true), 200);
}

TEST(ProgressTimeoutSeconds, ClampedToMinAndMax) {
  const ProgressTimeoutConfig c;
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(0.1), WorkerPhase::kTraining, true), 30);
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(1000), WorkerPhase::kTraining, true), 3600);
}

TEST(ProgressTimeoutSeconds, NothingLearntUsesTheGrace) {
  ProgressTimeoutConfig c;
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, {}, WorkerPhase::kTraining, true), 300);
  c.startup_grace_s = 5;  // still clamped up to min_timeout_s once progressing
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, {}, WorkerPhase::kTraining, true), 30);
}

TEST(ProgressTimeoutSeconds, GraceBeforeFirstProgress) {
  const ProgressTimeoutConfig c;
  // Fast steps learnt on an earlier attempt: the grace still applies at start-up.
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(1), WorkerPhase::kTraining, false), 300);
  // Slow steps learnt: more than the grace is needed.
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(100), WorkerPhase::kTraining, false), 500);
  // Reloading mid-attempt gets the grace too.
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(1), WorkerPhase::kLoading, true), 300);
}

TEST(ProgressTimeoutSeconds, CheckpointAndEvalAllowance) {
  const ProgressTimeoutConfig c;
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(20), WorkerPhase::kCheckpointing, true), 700);
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(20), WorkerPhase::kEvaluating, true), 700);
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(20), WorkerPhase::kCheckpointing, false), 700);
}

TEST(ProgressTimeoutSeconds, FixedOverridesLearning) {
  ProgressTimeoutConfig c;
  c.fixed_timeout_s = 120;
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(1000), WorkerPhase::kTraining, true), 120);
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, {}, WorkerPhase::kTraining, true), 120);
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(1), WorkerPhase::kCheckpointing, true), 720);
  EXPECT_DOUBLE_EQ(ProgressTimeoutSeconds(c, Learnt(1), WorkerPhase::kTraining, false), 300);
}

TEST(CheckLiveness, Alive) {
  Liveness l = CheckLiveness(/*now=*/100, /*hb=*/99, /*progress=*/50, 30, 60);
  EXPECT_EQ(l.verdict, Liveness::kAlive);
  EXPECT_EQ(l.reason, "");
  // Exactly at a timeout is still alive.
  EXPECT_EQ(CheckLiveness(100, 70, 40, 30, 60).verdict, Liveness::kAlive);
}

TEST(CheckLiveness, Frozen) {
  Liveness l = CheckLiveness(100, 58, 99, 30, 600);
  EXPECT_EQ(l.verdict, Liveness::kFrozen);
  EXPECT_EQ(l.reason, "no heartbeat for 42.0 s (timeout 30.0 s)");
}

TEST(CheckLiveness, Hung) {
  Liveness l = CheckLiveness(1000, 999, 300, 30, 600);
  EXPECT_EQ(l.verdict, Liveness::kHung);
  EXPECT_EQ(l.reason, "no progress for 700.0 s (timeout 600.0 s)");
}

TEST(CheckLiveness, FrozenTakesPrecedenceOverHung) {
  Liveness l = CheckLiveness(1000, 900, 100, 30, 600);
  EXPECT_EQ(l.verdict, Liveness::kFrozen) << l.reason;
}

}  // namespace
}  // namespace trainsup::supervisor
