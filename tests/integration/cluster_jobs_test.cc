// Several multi-node jobs on the same nodes, as a user runs them: one real
// etcd on loopback, two real trainsupd daemons ("node-a", "node-b") with
// one CPU slot each, the real trainsup-worker.
//
//  - Two jobs submitted to the nodes in opposite orders: each node gives its
//    one slot to a different job, and each job waits in its rendezvous for
//    the node the other holds. The job that orders later yields its slot
//    (docs/distributed.md, "Competing jobs"); both finish.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "supervisor/cluster/cluster_protocol.h"
#include "supervisor/cluster/etcd_client.h"
#include "tests/integration/cluster_test_util.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

using ::testing::HasSubstr;

// `node` has put its join record of `job`'s generation 1 in etcd.
bool Joined(trainsup::testing::EtcdServer& etcd, const std::string& job, const std::string& node) {
  auto client = supervisor::MakeEtcdClient(etcd.endpoint(), 2);
  if (!client.ok()) return false;
  const std::string key = supervisor::JobKeys(job).Join(1, node);
  return Eventually(
      [&] {
        auto kv = (*client)->Get(key);
        return kv.ok() && kv->has_value();
      },
      Seconds(60));
}

// --- competing jobs (issue 24, item 4) ---------------------------------------------------------

TEST_F(ClusterTest, TwoJobsSubmittedInOppositeOrdersBothFinish) {
  auto spec = [&](const std::string& job) {
    std::string s = ClusterSpecText(job, etcd_.endpoint(), shared_, 12, 4);
    s.replace(s.find("rendezvous_timeout_s = 120"), 26, "rendezvous_timeout_s = 60");
    return s;
  };
  // node-a gives its slot to job-x, node-b to job-y; each job then waits
  // for the slot the other holds.
  const std::string ax = a_.Submit(spec("job-x"));
  ASSERT_TRUE(Joined(etcd_, "job-x", "node-a")) << Describe(a_.GetRun(ax));
  const std::string by = b_.Submit(spec("job-y"));
  ASSERT_TRUE(Joined(etcd_, "job-y", "node-b")) << Describe(b_.GetRun(by));
  const std::string ay = a_.Submit(spec("job-y"));
  const std::string bx = b_.Submit(spec("job-x"));

  for (auto [h, id] : {std::pair{&a_, ax}, {&b_, bx}, {&a_, ay}, {&b_, by}}) {
    v1::Run r;
    ASSERT_TRUE(h->WaitForEnd(id, Seconds(400), &r));
    EXPECT_EQ(r.state(), v1::RUN_STATE_SUCCEEDED) << Describe(r);
    EXPECT_EQ(r.attempts_size(), 1) << Describe(r);
  }
  // job-x orders first: node-b's run of job-y gave its slot back to it.
  EXPECT_THAT(Events(b_, by), HasSubstr("gave its slot to job job-x")) << Events(b_, by);
  EXPECT_THAT(Events(a_, ax), ::testing::Not(HasSubstr("gave its slot"))) << Events(a_, ax);
}

}  // namespace
}  // namespace trainsup::integration
