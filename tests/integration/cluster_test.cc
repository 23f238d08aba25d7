// Multi-node jobs as a user runs them: one real etcd on loopback, two real
// trainsupd daemons ("node-a", "node-b") with separate state directories,
// the real trainsup-worker, one rank per node (world size 2 over Gloo), the
// same spec submitted to both daemons, checkpoints in a directory both
// nodes' data roots include (standing in for shared storage).
//
//  - The job trains and succeeds on both nodes; its final weights are byte
//    for byte those of the same run on one daemon with two ranks; while it
//    runs, GetRun on either node shows both nodes with their ranks.
//  - A rank SIGKILLed on node-b: both nodes restart from the same
//    checkpoint in generation 2, and the events on both name the cause.
//  - node-b's daemon SIGKILLed: its lease expires, node-a stops its rank;
//    node-b's daemon restarted adopts nothing stale, rejoins, the job
//    finishes.
//  - etcd stopped mid-run, then started again: training goes on, nothing is
//    restarted, the job finishes.
//  - node-b's daemon paused (SIGSTOP) past its lease, a partition: node-a
//    counts it lost and stops; resumed, node-b rejoins and the job finishes.
//  - garbage in a job's keys, written with an etcd client: the daemon notes
//    it, fails the job at its rendezvous timeout, and keeps serving.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "contracts/run_layout.h"
#include "supervisor/cluster/etcd_client.h"
#include "supervisor/policy/cluster_protocol.h"
#include "tests/common/etcd_server.h"
#include "tests/integration/cluster_test_util.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST_F(ClusterTest, TwoNodesTrainLikeOneDaemonWithTwoRanks) {
  // The same training on one daemon with two ranks.
  DaemonHarness one;
  Configure(one, "solo", shared_, 2);
  ASSERT_TRUE(one.Start());
  const std::string ref_id = one.Submit("world_size = 2\n" + ModelSpec("reference", 24, 6));
  v1::Run ref;
  ASSERT_TRUE(one.WaitForEnd(ref_id, Seconds(400), &ref));
  ASSERT_EQ(ref.state(), v1::RUN_STATE_SUCCEEDED) << Describe(ref);

  auto [ia, ib] = SubmitBoth("same-as-one", 24, 6);
  // While it runs, either node shows the whole job.
  for (DaemonHarness* h : {&a_, &b_}) {
    v1::Run live;
    EXPECT_TRUE(h->WaitFor(
        h == &a_ ? ia : ib,
        [&](const v1::Run& r) {
          const v1::ClusterStatus& c = r.cluster();
          if (c.nodes_size() != 2) return false;
          for (const v1::ClusterNode& n : c.nodes()) {
            if (n.state() != v1::RUN_STATE_RUNNING || n.ranks_size() != 1 || !n.ranks(0).alive() ||
                !n.lease_alive()) {
              return false;
            }
          }
          return true;
        },
        Seconds(120), &live))
        << live.cluster().DebugString();
    const v1::ClusterStatus& c = live.cluster();
    EXPECT_EQ(c.job(), "same-as-one");
    EXPECT_EQ(c.generation(), 1);
    EXPECT_TRUE(c.etcd_reachable());
    ASSERT_EQ(c.nodes_size(), 2);
    EXPECT_EQ(c.nodes(0).node(), "node-a");
    EXPECT_EQ(c.nodes(0).run_id(), ia);
    EXPECT_EQ(c.nodes(0).ranks(0).rank(), 0);
    EXPECT_EQ(c.nodes(1).node(), "node-b");
    EXPECT_EQ(c.nodes(1).run_id(), ib);
    EXPECT_EQ(c.nodes(1).ranks(0).rank(), 1);
  }
  v1::Run ra, rb;
  ExpectBothSucceed(ia, ib, &ra, &rb);
  EXPECT_EQ(ra.attempts_size(), 1) << Describe(ra);
  EXPECT_EQ(rb.attempts_size(), 1) << Describe(rb);
  EXPECT_EQ(Last(ra)->generation(), 1);
  // Node ranks follow the sorted names: node-a runs rank 0, node-b rank 1.
  ASSERT_EQ(Last(ra)->ranks_size(), 1);
  ASSERT_EQ(Last(rb)->ranks_size(), 1);
  EXPECT_EQ(Last(ra)->ranks(0).rank(), 0);
  EXPECT_EQ(Last(rb)->ranks(0).rank(), 1);

  const fs::path mine = NewestCheckpoint(shared_ + "/same-as-one");
  const fs::path theirs = NewestCheckpoint(RunLayout(ref.run_dir()).CheckpointsDir());
  ASSERT_FALSE(mine.empty());
  ASSERT_EQ(mine.filename(), theirs.filename());
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string x = ReadFileText(mine / file), y = ReadFileText(theirs / file);
    ASSERT_FALSE(x.empty()) << file;
    EXPECT_TRUE(x == y) << file << " differs from the one-daemon run's";
  }
  ExpectNoWorkerLeft(ra, rb);
}

// Anyone who can write to etcd can leave garbage under a job's prefix: a
// join key whose node name is not UTF-8 (its record decodes, naming
// "ghost"), a join record that is not JSON, a node status that is none.
// node-a's run of the 3-node job notes each, counts none, fails at the
// rendezvous timeout, and the daemon keeps serving. Before the fix the
// timeout's record, with the bad name in its reason, threw on the etcd
// thread and ended the daemon.
TEST_F(ClusterTest, GarbageInTheJobsKeysIsNotedAndTheDaemonKeepsServing) {
  absl::StatusOr<std::unique_ptr<supervisor::EtcdClient>> etcd =
      supervisor::MakeEtcdClient(etcd_.endpoint(), 5);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const supervisor::JobKeys keys("garbage");
  supervisor::JoinRecord ghost;
  ghost.node = "ghost";
  ghost.address = "attacker.example";
  ghost.port = 1;
  ASSERT_TRUE((*etcd)->Put(keys.Join(1, "\xff\xfe"), supervisor::EncodeJoin(ghost)).ok());
  ASSERT_TRUE((*etcd)->Put(keys.Join(1, "node-c"), "{not json").ok());
  ASSERT_TRUE((*etcd)->Put(keys.Node("node-z"), "\xff").ok());

  std::string spec = ClusterSpecText("garbage", etcd_.endpoint(), shared_, 20, 5);
  spec.replace(spec.find("nodes = 2"), 9, "nodes = 3");
  spec.replace(spec.find("rendezvous_timeout_s = 120"), 26, "rendezvous_timeout_s = 4");
  const std::string id = a_.Submit(spec);
  v1::Run r;
  ASSERT_TRUE(a_.WaitForEnd(id, Seconds(120), &r));
  EXPECT_EQ(r.state(), v1::RUN_STATE_FAILED) << Describe(r);
  EXPECT_THAT(r.reason(), HasSubstr("only 1 of 3 nodes joined")) << Describe(r);
  const std::string events = Events(a_, id);
  EXPECT_THAT(events, HasSubstr("join record of node \"ghost\" under another name")) << events;
  EXPECT_THAT(events, HasSubstr("rdzv/1/node-c")) << events;
  EXPECT_THAT(events, HasSubstr("nodes/node-z")) << events;
  // Still serving: a new local run on node-a succeeds.
  const std::string local = a_.Submit(ModelSpec("after-garbage", 4, 2));
  v1::Run after;
  ASSERT_TRUE(a_.WaitForEnd(local, Seconds(200), &after));
  EXPECT_EQ(after.state(), v1::RUN_STATE_SUCCEEDED) << Describe(after);
}

TEST_F(ClusterTest, RankKilledOnOneNodeRestartsBothFromTheSameCheckpoint) {
  auto [ia, ib] = SubmitBoth("rank-killed", 40, 5);
  v1::Run rb;
  ASSERT_TRUE(b_.WaitFor(
      ib, [](const v1::Run& r) { return RunningPast(r, 12); }, Seconds(200), &rb));
  const int pid = Last(rb)->ranks(0).pid();
  ASSERT_GT(pid, 1);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  v1::Run ra;
  ExpectBothSucceed(ia, ib, &ra, &rb);
  ASSERT_GE(ra.attempts_size(), 2) << Describe(ra);
  ASSERT_GE(rb.attempts_size(), 2) << Describe(rb);
  // Attempt 2 of both: generation 2, from one checkpoint.
  EXPECT_EQ(ra.attempts(1).generation(), 2);
  EXPECT_EQ(rb.attempts(1).generation(), 2);
  EXPECT_GE(ra.attempts(1).resumed_from_step(), 5);
  EXPECT_EQ(ra.attempts(1).resumed_from_step(), rb.attempts(1).resumed_from_step());
  EXPECT_EQ(ra.restarts(), rb.restarts()) << "one restart of the job, counted once";
  // The cause, on both nodes.
  for (DaemonHarness* h : {&a_, &b_}) {
    EXPECT_THAT(Events(*h, h == &a_ ? ia : ib), HasSubstr("node node-b: rank 1 ended"))
        << (h == &a_ ? "node-a" : "node-b");
  }
  ExpectNoWorkerLeft(ra, rb);
}

TEST_F(ClusterTest, KilledDaemonsLeaseExpiresAndItRejoinsWhenRestarted) {
  auto [ia, ib] = SubmitBoth("daemon-killed", 40, 5);
  v1::Run ra, rb;
  ASSERT_TRUE(b_.WaitFor(
      ib, [](const v1::Run& r) { return RunningPast(r, 10); }, Seconds(200), &rb));
  const int old_worker = Last(rb)->ranks(0).pid();
  b_.Kill();
  // node-a sees the lease expire and stops its rank.
  ASSERT_TRUE(a_.WaitFor(
      ia, [](const v1::Run& r) { return r.attempts_size() >= 1 && r.attempts(0).ended_ms() > 0; },
      Seconds(60), &ra))
      << Describe(ra);
  // The killed daemon's worker lost its peer and is gone too.
  EXPECT_TRUE(Eventually([&] { return !ProcessAlive(old_worker); }, Seconds(60)));
  ASSERT_TRUE(b_.Start());
  ExpectBothSucceed(ia, ib, &ra, &rb);
  EXPECT_THAT(Events(a_, ia), HasSubstr("node node-b lost: its etcd lease expired"));
  ASSERT_GE(rb.attempts_size(), 2) << Describe(rb);
  EXPECT_GT(rb.attempts(0).ended_ms(), 0) << "the attempt of the killed daemon is over";
  EXPECT_GE(Last(ra)->generation(), 2);
  EXPECT_EQ(Last(ra)->generation(), Last(rb)->generation());
  EXPECT_EQ(Last(ra)->resumed_from_step(), Last(rb)->resumed_from_step());
  ExpectNoWorkerLeft(ra, rb);
}

TEST_F(ClusterTest, EtcdDownForAWhileChangesNothing) {
  auto [ia, ib] = SubmitBoth("etcd-down", 60, 10);
  v1::Run ra, rb;
  ASSERT_TRUE(a_.WaitFor(
      ia, [](const v1::Run& r) { return RunningPast(r, 5); }, Seconds(200), &ra));
  etcd_.Stop();
  const int64_t step_at_stop = a_.GetRun(ia).progress().step();
  // Longer than the lease: nothing may be decided meanwhile.
  ASSERT_TRUE(a_.WaitFor(
      ia,
      [&](const v1::Run& r) {
        return !r.cluster().etcd_reachable() && r.progress().step() >= step_at_stop + 8;
      },
      Seconds(120), &ra))
      << Describe(ra);
  {
    // The node's health says so too.
    v1::Node node;
    auto ctx = a_.Context(a_.operator_token());
    ASSERT_TRUE(a_.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node).ok());
    ASSERT_EQ(node.etcd_unreachable_size(), 1) << node.DebugString();
    EXPECT_THAT(node.etcd_unreachable(0), HasSubstr("etcd-down (" + ia + "): "));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(2 * kLeaseS));
  ra = a_.GetRun(ia);
  rb = b_.GetRun(ib);
  EXPECT_EQ(ra.state(), v1::RUN_STATE_RUNNING) << Describe(ra);
  EXPECT_EQ(rb.state(), v1::RUN_STATE_RUNNING) << Describe(rb);
  EXPECT_EQ(ra.attempts_size(), 1);
  ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Log();
  ExpectBothSucceed(ia, ib, &ra, &rb);
  EXPECT_EQ(ra.attempts_size(), 1) << Describe(ra);
  EXPECT_EQ(rb.attempts_size(), 1) << Describe(rb);
  EXPECT_EQ(ra.restarts(), 0);
  const std::string events = Events(a_, ia);
  EXPECT_THAT(events, HasSubstr("etcd unreachable"));
  EXPECT_THAT(events, HasSubstr("etcd reachable again"));
  ExpectNoWorkerLeft(ra, rb);
}

TEST_F(ClusterTest, PausedDaemonPastItsLeaseIsLostThenRejoins) {
  auto [ia, ib] = SubmitBoth("partition", 40, 5);
  v1::Run ra, rb;
  ASSERT_TRUE(b_.WaitFor(
      ib, [](const v1::Run& r) { return RunningPast(r, 10); }, Seconds(200), &rb));
  b_.Signal(SIGSTOP);
  ASSERT_TRUE(a_.WaitFor(
      ia, [](const v1::Run& r) { return r.attempts_size() >= 1 && r.attempts(0).ended_ms() > 0; },
      Seconds(60), &ra))
      << Describe(ra);
  b_.Signal(SIGCONT);
  ExpectBothSucceed(ia, ib, &ra, &rb);
  EXPECT_THAT(Events(a_, ia), HasSubstr("node node-b lost"));
  EXPECT_THAT(Events(b_, ib), HasSubstr("this node's etcd lease expired"));
  EXPECT_EQ(Last(ra)->generation(), Last(rb)->generation());
  ExpectNoWorkerLeft(ra, rb);
}

// --- cancel before this node's run has joined (issue 24, item 6) ----------------------------

TEST_F(ClusterTest, CancelOnANodeWhoseRunIsStillQueuedCancelsTheJob) {
  // node-a's one slot is taken by a local run, so its run of the job waits
  // for it while node-b's waits in the rendezvous.
  const std::string hog = a_.Submit(ModelSpec("hog", 100000, 1000));
  ASSERT_TRUE(a_.WaitForState(hog, v1::RUN_STATE_RUNNING, Seconds(60)));
  auto [ia, ib] = SubmitBoth("cancel-queued", 20, 5);
  ASSERT_TRUE(b_.WaitFor(
      ib, [](const v1::Run& r) { return r.cluster().generation() >= 1; }, Seconds(60)));
  v1::Run ra = a_.GetRun(ia);
  ASSERT_EQ(ra.state(), v1::RUN_STATE_PENDING) << Describe(ra);
  CancelRun(a_, ia, "wrong data");
  // Well before the 120 s rendezvous timeout.
  v1::Run rb;
  ASSERT_TRUE(b_.WaitForEnd(ib, Seconds(30), &rb)) << Describe(rb);
  EXPECT_EQ(rb.state(), v1::RUN_STATE_CANCELLED) << Describe(rb);
  EXPECT_THAT(rb.reason(), HasSubstr("cancelled on node node-a: wrong data"));
  ASSERT_TRUE(a_.WaitForEnd(ia, Seconds(10), &ra));
  EXPECT_EQ(ra.state(), v1::RUN_STATE_CANCELLED) << Describe(ra);
  EXPECT_EQ(ra.attempts_size(), 0);
  EXPECT_EQ(a_.GetRun(hog).state(), v1::RUN_STATE_RUNNING);
  CancelRun(a_, hog, "done");
}

TEST_F(ClusterTest, CancelWhileEtcdIsDownEndsTheRunAndReachesTheJobWhenEtcdAnswers) {
  // node-b never joins: node-a's run waits in the rendezvous.
  const std::string spec = ClusterSpecText("cancel-etcd-down", etcd_.endpoint(), shared_, 20, 5);
  const std::string ia = a_.Submit(spec);
  ASSERT_TRUE(a_.WaitFor(
      ia, [](const v1::Run& r) { return r.cluster().generation() >= 1; }, Seconds(60)));
  etcd_.Stop();
  CancelRun(a_, ia, "not today");
  v1::Run ra;
  ASSERT_TRUE(a_.WaitForEnd(ia, Seconds(15), &ra)) << Describe(ra);
  EXPECT_EQ(ra.state(), v1::RUN_STATE_CANCELLED) << Describe(ra);
  EXPECT_THAT(ra.reason(), HasSubstr("not today"));
  // etcd back: the job's record says cancelled, and node-b's run of it ends
  // so without training.
  ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Log();
  auto client = supervisor::MakeEtcdClient(etcd_.endpoint(), 2);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string key = supervisor::JobKeys("cancel-etcd-down").Generation();
  std::string record;
  EXPECT_TRUE(Eventually(
      [&] {
        auto kv = (*client)->Get(key);
        if (!kv.ok() || !kv->has_value()) return false;
        record = (*kv)->value;
        auto g = supervisor::DecodeGeneration(record);
        return g.ok() && g->action == supervisor::GenerationRecord::Action::kCancel;
      },
      Seconds(30)))
      << record;
  EXPECT_THAT(record, HasSubstr("cancelled on node node-a: not today"));
  const std::string ib = b_.Submit(spec);
  v1::Run rb;
  ASSERT_TRUE(b_.WaitForEnd(ib, Seconds(30), &rb)) << Describe(rb);
  EXPECT_EQ(rb.state(), v1::RUN_STATE_CANCELLED) << Describe(rb);
  EXPECT_EQ(rb.attempts_size(), 0);
}

// --- duplicate participants (issue 24, item 7) ----------------------------------------------

TEST_F(ClusterTest, ASecondParticipantWithTheSameNodeNameIsRefused) {
  const std::string spec = ClusterSpecText("duplicates", etcd_.endpoint(), shared_, 20, 5);
  const std::string ia = a_.Submit(spec);
  ASSERT_TRUE(a_.WaitFor(
      ia, [](const v1::Run& r) { return r.cluster().generation() >= 1; }, Seconds(60)));
  // A second daemon calling itself node-a, with the job submitted to it
  // twice.
  DaemonHarness c;
  Configure(c, "node-a", shared_, 2);
  ASSERT_TRUE(c.Start());
  for (const std::string& id : {c.Submit(spec), c.Submit(spec)}) {
    v1::Run r;
    ASSERT_TRUE(c.WaitForEnd(id, Seconds(30), &r)) << Describe(r);
    EXPECT_EQ(r.state(), v1::RUN_STATE_FAILED) << Describe(r);
    EXPECT_THAT(r.reason(), HasSubstr("run " + ia + " is already node \"node-a\" of this job"));
    EXPECT_EQ(r.attempts_size(), 0);
  }
  // node-a's key is still the first daemon's: with node-b the job trains.
  const std::string ib = b_.Submit(spec);
  v1::Run ra, rb;
  ExpectBothSucceed(ia, ib, &ra, &rb);
  EXPECT_EQ(ra.attempts_size(), 1) << Describe(ra);
  EXPECT_EQ(Last(rb)->generation(), 1);
}

// A multi-node job whose every attempt diverges (a NaN loss at step 6 on
// every attempt, guard.max_bad_steps = 1): the job's one decision counts
// the diverged ends against the spec's guard.max_rollbacks (1 here), not
// the daemon's default of 3, and fails once it is spent.
TEST_F(ClusterTest, ADivergingJobFailsAtTheSpecsMaxRollbacks) {
  for (DaemonHarness* h : {&a_, &b_}) {
    h->Kill();
    h->Set("testing.allow_fault_injection", "true");
    ASSERT_TRUE(h->Start());
  }
  const std::string spec = ClusterSpecText("diverging", etcd_.endpoint(), shared_, 20, 4) +
                           "[guard]\nmax_bad_steps = 1\nmax_rollbacks = 1\n"
                           "[testing]\nnan_loss_at_step = 6\n";
  const std::string ia = a_.Submit(spec);
  const std::string ib = b_.Submit(spec);
  v1::Run runs[2];
  for (int n = 0; n < 2; ++n) {
    DaemonHarness& h = n == 0 ? a_ : b_;
    v1::Run& r = runs[n];
    ASSERT_TRUE(h.WaitForEnd(n == 0 ? ia : ib, Seconds(300), &r)) << Describe(r);
    EXPECT_EQ(r.state(), v1::RUN_STATE_FAILED) << Describe(r);
    EXPECT_THAT(r.reason(), HasSubstr("diverged at step 6 after 1 rollback (max 1)"));
    ASSERT_EQ(r.attempts_size(), 2) << Describe(r);
  }
  // Each attempt diverged (a node whose ranks the job's move stopped first
  // ends that attempt as the gang's, not as diverged).
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(runs[0].attempts(i).exit_class() == v1::EXIT_CLASS_DIVERGED ||
                runs[1].attempts(i).exit_class() == v1::EXIT_CLASS_DIVERGED)
        << Describe(runs[0]) << Describe(runs[1]);
  }
}

// --- etcd over TLS (issue 24, item 2) -------------------------------------------------------

// This node speaks TLS to etcd with the test PKI's client certificate.
void UseEtcdTls(DaemonHarness& h, const trainsup::testing::TestPki& pki) {
  h.Set("cluster.etcd_ca", "\"" + pki.ca + "\"");
  h.Set("cluster.etcd_cert", "\"" + pki.client_cert + "\"");
  h.Set("cluster.etcd_key", "\"" + pki.client_key + "\"");
}

TEST(ClusterTls, TwoNodesTrainThroughAnEtcdThatRequiresClientCertificates) {
  DaemonHarness a, b;
  trainsup::testing::TestPki pki;
  ASSERT_TRUE(trainsup::testing::MakeTestPki(a.dir(), &pki).ok());
  trainsup::testing::EtcdServer etcd;
  etcd.UseTls(pki);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Log();
  const std::string shared = a.dir() + "/shared";
  fs::create_directories(shared);
  Configure(a, "node-a", shared, 1);
  Configure(b, "node-b", shared, 1);
  UseEtcdTls(a, pki);
  UseEtcdTls(b, pki);
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  const std::string spec = ClusterSpecText("over-tls", etcd.endpoint(), shared, 6, 3);
  const std::string ia = a.Submit(spec);
  TrainsInOneAttempt(a, ia, b, b.Submit(spec));
  EXPECT_THAT(Events(a, ia), ::testing::Not(HasSubstr("etcd unreachable")));
  // The same daemon without its certificate is not let in: its attempt
  // never starts and etcd is reported unreachable.
  b.Unset("cluster.etcd_cert");
  b.Unset("cluster.etcd_key");
  b.Kill();
  ASSERT_TRUE(b.Start());
  const std::string again = b.Submit(ClusterSpecText("no-cert", etcd.endpoint(), shared, 6, 3));
  v1::Run r;
  EXPECT_TRUE(b.WaitFor(
      again,
      [](const v1::Run& x) { return !x.cluster().etcd_reachable() && x.cluster().job() != ""; },
      Seconds(60), &r))
      << Describe(r);
  EXPECT_EQ(r.attempts_size(), 0) << Describe(r);
  EXPECT_FALSE(r.cluster().etcd_error().empty());
  std::cout << "without a client certificate: " << r.cluster().etcd_error() << "\n";
}

TEST(ClusterTls, AnEtcdOffLoopbackWithoutTlsIsRefusedUnlessTheConfigSaysInsecure) {
  DaemonHarness h;
  const std::string shared = h.dir() + "/shared";
  fs::create_directories(shared);
  // Two slots: the loopback run below holds one while it waits for its etcd.
  Configure(h, "node-a", shared, 2);
  ASSERT_TRUE(h.Start());
  // 192.0.2.1: TEST-NET-1, never routed.
  const std::string spec = ClusterSpecText("remote", "192.0.2.1:2379", shared, 6, 3);
  std::string id;
  grpc::Status s = h.TrySubmit(spec, h.operator_token(), &id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("\"192.0.2.1:2379\" is not a loopback address"));
  EXPECT_THAT(s.error_message(), HasSubstr("insecure_etcd = true"));
  EXPECT_TRUE(id.empty());
  // Loopback stays allowed in plain text.
  grpc::Status local =
      h.TrySubmit(ClusterSpecText("local", "127.0.0.1:1", shared, 6, 3), h.operator_token(), &id);
  EXPECT_TRUE(local.ok()) << local.error_message();

  // insecure_etcd: accepted. A restart that takes it away fails the run
  // when it joins again, with the same reason.
  h.Set("cluster.insecure_etcd", "true");
  h.Kill();
  ASSERT_TRUE(h.Start());
  std::string remote;
  grpc::Status accepted = h.TrySubmit(spec, h.operator_token(), &remote);
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  h.Unset("cluster.insecure_etcd");
  h.Kill();
  ASSERT_TRUE(h.Start());
  v1::Run r;
  ASSERT_TRUE(h.WaitForEnd(remote, Seconds(60), &r));
  EXPECT_EQ(r.state(), v1::RUN_STATE_FAILED) << Describe(r);
  EXPECT_THAT(r.reason(), HasSubstr("is not a loopback address")) << Describe(r);
}

// --- two hosts joined by a veth pair (issue 24, item 10) ------------------------------------

// A network namespace joined to this one by a veth pair: 10.77.0.1 here,
// 10.77.0.2 there (its own loopback up, as a host's is). The one path
// between the two "hosts" is the veth pair. Removed by the destructor.
class VethHost {
 public:
  static constexpr const char* kHere = "10.77.0.1";
  static constexpr const char* kThere = "10.77.0.2";
  VethHost()
      : ns_("tsup" + std::to_string(getpid())),
        here_("tsa" + std::to_string(getpid() % 100000)),
        there_("tsb" + std::to_string(getpid() % 100000)) {
    const std::string log = "/tmp/" + ns_ + ".log";
    for (const std::string& c :
         {"ip netns add " + ns_, "ip link add " + here_ + " type veth peer name " + there_,
          "ip link set " + there_ + " netns " + ns_,
          "ip addr add " + std::string(kHere) + "/24 dev " + here_, "ip link set " + here_ + " up",
          "ip netns exec " + ns_ + " ip addr add " + kThere + "/24 dev " + there_,
          "ip netns exec " + ns_ + " ip link set " + there_ + " up",
          "ip netns exec " + ns_ + " ip link set lo up"}) {
      if (std::system(("/usr/sbin/" + c + " >>" + log + " 2>&1").c_str()) != 0) {
        std::ifstream in(log);
        std::ostringstream text;
        text << in.rdbuf();
        error_ = "\"" + c + "\" failed: " + text.str();
        break;
      }
    }
    std::remove(log.c_str());
  }
  ~VethHost() {
    (void)std::system(("/usr/sbin/ip link del " + here_ + " 2>/dev/null").c_str());
    (void)std::system(("/usr/sbin/ip netns del " + ns_ + " 2>/dev/null").c_str());
  }
  const std::string& error() const { return error_; }  // "" when it is up
  const std::string& ns() const { return ns_; }

 private:
  std::string ns_, here_, there_, error_;
};

TEST(ClusterNetns, TwoNodesTrainOverAVethPairEachOnItsAdvertisedAddress) {
  VethHost veth;
  if (!veth.error().empty()) {
    GTEST_SKIP() << "cannot make a network namespace and a veth pair here (root and "
                    "iproute2 needed): "
                 << veth.error();
  }
  trainsup::testing::EtcdServer etcd;
  etcd.ListenAlsoOn(VethHost::kHere);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Log();
  DaemonHarness a, b;
  const std::string shared = a.dir() + "/shared";
  fs::create_directories(shared);
  Configure(a, "node-a", shared, 1);
  Configure(b, "node-b", shared, 1);
  a.Set("cluster.advertise_addr", std::string("\"") + VethHost::kHere + "\"");
  b.Set("cluster.advertise_addr", std::string("\"") + VethHost::kThere + "\"");
  for (DaemonHarness* h : {&a, &b}) h->Set("cluster.insecure_etcd", "true");
  b.set_netns(veth.ns());
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  const std::string endpoint = absl::StrCat(VethHost::kHere, ":", etcd.client_port());
  const std::string spec = ClusterSpecText("over-veth", endpoint, shared, 6, 3);
  const std::string ia = a.Submit(spec);
  TrainsInOneAttempt(a, ia, b, b.Submit(spec));
}

}  // namespace
}  // namespace trainsup::integration
