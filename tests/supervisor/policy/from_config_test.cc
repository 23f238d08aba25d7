// The policies built from the daemon config and a run spec: every field
// comes from where the config says, and a run's rollback budget from its
// spec whether the run is local or multi-node (one function serves both).
#include "supervisor/policy/from_config.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

TEST(RestartPolicyFor, TakesTheRestartSectionAndTheSpecsRollbackBudget) {
  DaemonConfig config;
  config.restart.initial_backoff_s = 2.5;
  config.restart.max_backoff_s = 40;
  config.restart.multiplier = 3;
  config.restart.jitter = 0.25;
  config.restart.max_restarts = 7;
  config.restart.restart_window_s = 900;
  config.restart.max_oom_restarts = 4;
  config.restart.crash_loop_attempts = 6;
  RunSpec spec;
  spec.guard.max_rollbacks = 11;
  const RestartPolicy p = RestartPolicyFor(config, spec);
  EXPECT_EQ(p.initial_backoff_s, 2.5);
  EXPECT_EQ(p.max_backoff_s, 40);
  EXPECT_EQ(p.multiplier, 3);
  EXPECT_EQ(p.jitter, 0.25);
  EXPECT_EQ(p.max_restarts, 7);
  EXPECT_EQ(p.restart_window_s, 900);
  EXPECT_EQ(p.max_oom_restarts, 4);
  EXPECT_EQ(p.crash_loop_attempts, 6);
  EXPECT_EQ(p.max_rollbacks, 11);
  EXPECT_TRUE(Validate(p).ok());
  // Without a spec, the rollback budget is RestartPolicy's own default.
  EXPECT_EQ(RestartPolicyFrom(config.restart).max_rollbacks, RestartPolicy{}.max_rollbacks);
  spec.guard.max_rollbacks = 0;
  EXPECT_EQ(RestartPolicyFor(config, spec).max_rollbacks, 0);
}

TEST(ProgressTimeoutFrom, TakesEveryFieldOfTheProgressSection) {
  ProgressSection s;
  s.startup_grace_s = 12;
  s.safety_factor = 7;
  s.min_timeout_s = 3;
  s.max_timeout_s = 99;
  s.checkpoint_allowance_s = 45;
  s.fixed_timeout_s = 8;
  const ProgressTimeoutConfig c = ProgressTimeoutFrom(s);
  EXPECT_EQ(c.startup_grace_s, 12);
  EXPECT_EQ(c.safety_factor, 7);
  EXPECT_EQ(c.min_timeout_s, 3);
  EXPECT_EQ(c.max_timeout_s, 99);
  EXPECT_EQ(c.checkpoint_allowance_s, 45);
  EXPECT_EQ(c.fixed_timeout_s, 8);
  EXPECT_TRUE(Validate(c).ok());
}

}  // namespace
}  // namespace trainsup::supervisor
