// Several multi-node jobs on the same nodes, as a user runs them: one real
// etcd on loopback, two real trainsupd daemons ("node-a", "node-b") with
// one CPU slot each, the real trainsup-worker.
//
//  - Two jobs submitted to the nodes in opposite orders: each node gives its
//    one slot to a different job, and each job waits in its rendezvous for
//    the node the other holds. The job that orders later yields its slot
//    (docs/distributed.md, "Competing jobs"); both finish.
//  - A job cancelled, then submitted again with a corrected spec: a new
//    submission of the job, which trains from scratch and succeeds.
//  - A job that succeeded, submitted again into the same directory: refused
//    (the directory holds the earlier submission's checkpoints), not
//    "resumed" at its final step.
//  - Another job given the same checkpoint_dir: refused at submit.
//  - A node whose shared storage is not mounted (a tmpfs over it, in a mount
//    namespace of its own): it does not join, says why and tries again, and
//    the job is not pulled back to step 0; mounted again, it joins and the
//    job resumes from its checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "supervisor/cluster/etcd_client.h"
#include "supervisor/policy/cluster_protocol.h"
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

// --- job identity (issue 24, item 5) ---------------------------------------------------------

TEST_F(ClusterTest, ACancelledJobSubmittedAgainWithACorrectedSpecIsANewJob) {
  auto [ia, ib] = SubmitBoth("again", 400, 5);
  ASSERT_TRUE(a_.WaitFor(
      ia, [](const v1::Run& r) { return RunningPast(r, 2); }, Seconds(200)));
  CancelRun(a_, ia, "wrong learning rate");
  v1::Run ra, rb;
  ASSERT_TRUE(a_.WaitForEnd(ia, Seconds(60), &ra));
  ASSERT_TRUE(b_.WaitForEnd(ib, Seconds(60), &rb));
  ASSERT_EQ(rb.state(), v1::RUN_STATE_CANCELLED) << Describe(rb);

  // Corrected (fewer steps: another spec hash), in a new directory.
  std::string spec = ClusterSpecText("again", etcd_.endpoint(), shared_, 8, 4);
  spec.replace(spec.find("/again\""), 7, "/again-2\"");
  const std::string ja = a_.Submit(spec);
  const std::string jb = b_.Submit(spec);
  TrainsInOneAttempt(a_, ja, b_, jb);
  v1::Run na = a_.GetRun(ja);
  EXPECT_EQ(na.attempts(0).resumed_from_step(), -1) << Describe(na);
  EXPECT_EQ(na.progress().step(), 8);
  EXPECT_FALSE(na.cluster_submission().empty());
  EXPECT_EQ(na.cluster_submission(), b_.GetRun(jb).cluster_submission());
  EXPECT_NE(na.cluster_submission(), ra.cluster_submission());
  const std::string events = Events(a_, ja) + Events(b_, jb);
  EXPECT_THAT(events, HasSubstr("a new job in place of submission " + ra.cluster_submission() +
                                " was cancelled: cancelled on node node-a: wrong learning rate"))
      << events;
}

TEST_F(ClusterTest, ASucceededJobSubmittedAgainIsRefusedNotResumedAtItsFinalStep) {
  auto [ia, ib] = SubmitBoth("done-once", 8, 4);
  TrainsInOneAttempt(a_, ia, b_, ib);
  auto [ja, jb] = SubmitBoth("done-once", 8, 4);
  for (auto [h, id] : {std::pair{&a_, ja}, {&b_, jb}}) {
    v1::Run r;
    ASSERT_TRUE(h->WaitForEnd(id, Seconds(60), &r));
    EXPECT_EQ(r.state(), v1::RUN_STATE_FAILED) << Describe(r);
    EXPECT_THAT(r.reason(), HasSubstr("holds the checkpoints of an earlier submission"))
        << Describe(r);
    EXPECT_EQ(r.attempts_size(), 0) << Describe(r);
  }
}

TEST_F(ClusterTest, AFinishedJobSubmittedAgainWithAdoptCheckpointsGoesOnFromThem) {
  auto [ia, ib] = SubmitBoth("adopt", 8, 4);
  TrainsInOneAttempt(a_, ia, b_, ib);
  const std::string first = a_.GetRun(ia).cluster_submission();
  const std::string spec =
      ClusterSpecText("adopt", etcd_.endpoint(), shared_, 12, 4) + "adopt_checkpoints = true\n";
  const std::string ja = a_.Submit(spec);
  const std::string jb = b_.Submit(spec);
  TrainsInOneAttempt(a_, ja, b_, jb);
  const v1::Run ra = a_.GetRun(ja);
  EXPECT_EQ(ra.attempts(0).resumed_from_step(), 8) << Describe(ra);
  EXPECT_EQ(ra.progress().step(), 12);
  EXPECT_NE(ra.cluster_submission(), first);
  const std::string owner = ReadFileText(shared_ + "/adopt/trainsup-job.json");
  EXPECT_NE(owner.find(ra.cluster_submission()), std::string::npos) << owner;
}

TEST_F(ClusterTest, AnotherJobWithTheSameCheckpointDirIsRefusedAtSubmit) {
  auto [ia, ib] = SubmitBoth("owner-one", 8, 4);
  TrainsInOneAttempt(a_, ia, b_, ib);
  std::string spec = ClusterSpecText("owner-two", etcd_.endpoint(), shared_, 8, 4);
  spec.replace(spec.find("/owner-two\""), 11, "/owner-one\"");
  std::string id;
  const grpc::Status s = a_.TrySubmit(spec, a_.operator_token(), &id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("holds the checkpoints of job \"owner-one\""));
  EXPECT_TRUE(id.empty());
}

// node-b's daemon, started in a mount namespace with an empty tmpfs over
// the shared directory: its storage is "not mounted".
std::vector<std::string> WithoutSharedStorage(const std::string& shared) {
  return {"/usr/bin/unshare",
          "--mount",
          "--propagation",
          "private",
          "/bin/sh",
          "-c",
          "mount -t tmpfs tmpfs \"$0\" && exec \"$@\"",
          shared};
}

TEST_F(ClusterTest, ANodeThatCannotSeeTheSharedStorageWaitsForItAndTheJobKeepsItsCheckpoints) {
  auto [ia, ib] = SubmitBoth("blind", 40, 4);
  ASSERT_TRUE(b_.WaitFor(
      ib, [](const v1::Run& r) { return RunningPast(r, 9); }, Seconds(200)));
  b_.Kill();
  b_.set_launcher(WithoutSharedStorage(shared_));
  ASSERT_TRUE(b_.Start());
  // node-b says why it does not join, and tries again; node-a waits for
  // it instead of restarting the job from scratch without its checkpoints.
  EXPECT_TRUE(Eventually(
      [&] {
        return b_.DaemonLog().find("node node-b cannot see the job's checkpoints") !=
               std::string::npos;
      },
      Seconds(60)))
      << b_.DaemonLog();
  v1::Run ra = a_.GetRun(ia), rb = b_.GetRun(ib);
  EXPECT_FALSE(IsTerminal(ra.state())) << Describe(ra);
  EXPECT_FALSE(IsTerminal(rb.state())) << Describe(rb);
  for (int i = 1; i < ra.attempts_size(); ++i) {
    EXPECT_GE(ra.attempts(i).resumed_from_step(), 4) << Describe(ra);
  }
  // The storage back (the daemon started again outside the namespace): its
  // run reads the store again, joins, and the job resumes.
  b_.Kill();
  b_.set_launcher({});
  ASSERT_TRUE(b_.Start());
  ASSERT_TRUE(a_.WaitForEnd(ia, Seconds(300), &ra));
  ASSERT_TRUE(b_.WaitForEnd(ib, Seconds(60), &rb));
  EXPECT_EQ(ra.state(), v1::RUN_STATE_SUCCEEDED) << Describe(ra);
  EXPECT_EQ(rb.state(), v1::RUN_STATE_SUCCEEDED) << Describe(rb);
  ASSERT_GE(ra.attempts_size(), 2);
  for (int i = 1; i < ra.attempts_size(); ++i) {
    EXPECT_GE(ra.attempts(i).resumed_from_step(), 4) << Describe(ra);
  }
  EXPECT_GE(Last(ra)->resumed_from_step(), 8) << Describe(ra);
  EXPECT_EQ(Last(ra)->resumed_from_step(), Last(rb)->resumed_from_step());
}

}  // namespace
}  // namespace trainsup::integration
