// When a slot may be used again, from the gathered facts.
#include "supervisor/policy/slot_release.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

GpuInfo Gpu(int64_t used_mb, std::vector<int> pids) {
  GpuInfo g;
  g.index = 0;
  g.uuid = "GPU-0";
  g.memory_total = int64_t{80} << 30;
  g.memory_used = used_mb << 20;
  g.compute_pids = std::move(pids);
  return g;
}

ReleaseFacts GpuSlot() {
  ReleaseFacts f;
  f.pgid = 500;
  f.gpu_checked = true;
  f.gpu_index = 0;
  f.idle_bytes = int64_t{100} << 20;
  return f;
}

TEST(DecideRelease, ACpuSlotIsFreeOnceTheGroupIsGone) {
  ReleaseFacts f;
  f.pgid = 500;
  EXPECT_EQ(DecideRelease(f).verdict, ReleaseDecision::kFree);
  f.our_group = {501};
  ReleaseDecision d = DecideRelease(f);
  EXPECT_EQ(d.verdict, ReleaseDecision::kWait);
  EXPECT_TRUE(d.kill_group);
  f.past_deadline = true;
  d = DecideRelease(f);
  EXPECT_EQ(d.verdict, ReleaseDecision::kStrand);
  EXPECT_EQ(d.reason, "process group 500 survives SIGKILL");
}

TEST(DecideRelease, HoldersOfTheWorkersGroupAreKilledOthersNever) {
  ReleaseFacts f = GpuSlot();
  f.our_group = {501};
  f.gpu = Gpu(4096, {501, 777});
  ReleaseDecision d = DecideRelease(f);
  EXPECT_EQ(d.verdict, ReleaseDecision::kWait);
  EXPECT_EQ(d.kill_holders, std::vector<int>{501});
}

TEST(DecideRelease, AGpuStillHeldByAStrangerStrandsAtTheDeadline) {
  ReleaseFacts f = GpuSlot();
  f.gpu = Gpu(4096, {777});
  EXPECT_EQ(DecideRelease(f).verdict, ReleaseDecision::kWait);
  f.past_deadline = true;
  ReleaseDecision d = DecideRelease(f);
  EXPECT_EQ(d.verdict, ReleaseDecision::kStrand);
  EXPECT_NE(d.reason.find("GPU memory not released"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("777"), std::string::npos) << d.reason;
  EXPECT_TRUE(d.kill_holders.empty());
}

TEST(DecideRelease, AGpuTheQueryCannotSeeIsNotReleased) {
  ReleaseFacts f = GpuSlot();
  f.query_error = "NVML_ERROR_GPU_IS_LOST";
  f.stranded = true;
  ReleaseDecision d = DecideRelease(f);
  EXPECT_EQ(d.verdict, ReleaseDecision::kStrand);
  EXPECT_NE(d.reason.find("GPU query failed: NVML_ERROR_GPU_IS_LOST"), std::string::npos);
  f.query_error.clear();
  d = DecideRelease(f);
  EXPECT_NE(d.reason.find("GPU 0 missing from the GPU query"), std::string::npos) << d.reason;
}

TEST(DecideRelease, AStrandedSlotRecoversOnceReleased) {
  ReleaseFacts f = GpuSlot();
  f.stranded = true;
  f.gpu = Gpu(10, {});
  EXPECT_EQ(DecideRelease(f).verdict, ReleaseDecision::kFree);
}

}  // namespace
}  // namespace trainsup::supervisor
