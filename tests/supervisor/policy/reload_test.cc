// What a reload applies and what it names as needing a restart (defect 16).
#include "supervisor/policy/reload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

using ::testing::ElementsAre;

TEST(PlanReload, NothingChangedAppliesNothing) {
  const DaemonConfig c = DefaultConfig();
  ReloadPlan p = PlanReload(c, c);
  EXPECT_TRUE(p.applied.empty());
  EXPECT_TRUE(p.restart_needed.empty());
}

TEST(PlanReload, TimeoutsPolicyTokensAndRootsApply) {
  const DaemonConfig running = DefaultConfig();
  DaemonConfig next = running;
  next.workers.heartbeat_timeout_s = 42;
  next.restart.max_restarts = 7;
  next.daemon.data_roots = {"/srv/new"};
  next.testing.allow_fault_injection = true;
  next.slots.gpu_release_timeout_s = 5;
  ReloadPlan p = PlanReload(running, next);
  EXPECT_DOUBLE_EQ(p.effective.workers.heartbeat_timeout_s, 42);
  EXPECT_EQ(p.effective.restart.max_restarts, 7);
  EXPECT_EQ(p.effective.daemon.data_roots, std::vector<std::string>{"/srv/new"});
  EXPECT_TRUE(p.effective.testing.allow_fault_injection);
  EXPECT_DOUBLE_EQ(p.effective.slots.gpu_release_timeout_s, 5);
  EXPECT_TRUE(p.restart_needed.empty());
  EXPECT_EQ(p.applied.size(), 5u);
}

TEST(PlanReload, KnobsBoundAtStartUpKeepTheirValueAndAreNamed) {
  const DaemonConfig running = DefaultConfig();
  DaemonConfig next = running;
  next.daemon.tls_cert = "/etc/new.pem";
  next.daemon.socket_group = "trainsup";
  next.slots.use_gpus = !running.slots.use_gpus;
  next.testing.fake_gpu_file = "/tmp/gpus.json";
  next.slots.cpu_slots = 8;
  next.workers.stop_deadline_s = 11;
  ReloadPlan p = PlanReload(running, next);
  EXPECT_EQ(p.effective.daemon.tls_cert, running.daemon.tls_cert);
  EXPECT_EQ(p.effective.daemon.socket_group, running.daemon.socket_group);
  EXPECT_EQ(p.effective.slots.use_gpus, running.slots.use_gpus);
  EXPECT_EQ(p.effective.slots.cpu_slots, running.slots.cpu_slots);
  EXPECT_EQ(p.effective.testing.fake_gpu_file, running.testing.fake_gpu_file);
  EXPECT_DOUBLE_EQ(p.effective.workers.stop_deadline_s, 11);
  EXPECT_THAT(p.restart_needed,
              ElementsAre("daemon.socket_group", "daemon.tls_cert", "slots.cpu_slots",
                          "slots.use_gpus", "testing.fake_gpu_file"));
  EXPECT_THAT(p.applied, ElementsAre("workers.stop_deadline_s"));
}

TEST(PlanReload, AnUnknownKeyIsNeverAppliedByDefault) {
  EXPECT_FALSE(AppliedOnReload("daemon.some_future_knob"));
  EXPECT_TRUE(AppliedOnReload("workers.some_future_knob"));
  EXPECT_TRUE(AppliedOnReload("auth.tokens"));
  EXPECT_TRUE(AppliedOnReload("commands.allowed_programs"));
  EXPECT_TRUE(AppliedOnReload("commands.allowed_dirs"));
}

}  // namespace
}  // namespace trainsup::supervisor
