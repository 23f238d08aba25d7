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

TEST(GpuHealthProblem, AHealthyGpuHasNone) {
  EXPECT_EQ(GpuHealthProblem(Gpu(0, {})), "");
  GpuInfo g = Gpu(4096, {501});
  g.xids = {13, 31, 43};  // the application's faults: its worker fails, the GPU is fine
  EXPECT_EQ(GpuHealthProblem(g), "");
  // A health query that failed says nothing about the GPU by itself.
  g.health_error = "nvmlDeviceGetTotalEccErrors failed: Unknown Error";
  EXPECT_EQ(GpuHealthProblem(g), "");
}

TEST(GpuHealthProblem, NamesEachFact) {
  GpuInfo lost = Gpu(0, {});
  lost.lost = true;
  EXPECT_EQ(GpuHealthProblem(lost), "lost (fell off the bus)");
  GpuInfo ecc = Gpu(0, {});
  ecc.ecc_uncorrected = 3;
  EXPECT_EQ(GpuHealthProblem(ecc), "uncorrectable ECC errors (3)");
  GpuInfo pages = Gpu(0, {});
  pages.retired_pages_pending = true;
  EXPECT_EQ(GpuHealthProblem(pages), "page retirement pending");
  GpuInfo xid = Gpu(0, {});
  xid.xids = {13, 79};
  EXPECT_EQ(GpuHealthProblem(xid), "Xid 79 (needs a GPU reset)");
}

TEST(GpuHealthProblem, OnlyXidsThatNeedAResetCount) {
  for (int xid : {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}) {
    GpuInfo g = Gpu(0, {});
    g.xids = {xid};
    EXPECT_EQ(GpuHealthProblem(g), "Xid " + std::to_string(xid) + " (needs a GPU reset)");
  }
  for (int xid : {13, 31, 43, 45, 68}) {
    GpuInfo g = Gpu(0, {});
    g.xids = {xid};
    EXPECT_EQ(GpuHealthProblem(g), "") << "Xid " << xid;
  }
}

TEST(GpuHealthProblem, SeveralProblemsNameTheFirstInAFixedOrder) {
  GpuInfo g = Gpu(0, {});
  g.xids = {13, 94, 79};
  EXPECT_EQ(GpuHealthProblem(g), "Xid 94 (needs a GPU reset)");
  g.retired_pages_pending = true;
  EXPECT_EQ(GpuHealthProblem(g), "page retirement pending");
  g.ecc_uncorrected = 2;
  EXPECT_EQ(GpuHealthProblem(g), "uncorrectable ECC errors (2)");
  g.lost = true;
  EXPECT_EQ(GpuHealthProblem(g), "lost (fell off the bus)");
}

}  // namespace
}  // namespace trainsup::supervisor
