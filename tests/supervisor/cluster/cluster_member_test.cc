// The cluster member (supervisor/cluster/cluster.h) at the protocol's edges,
// as RunUnit is tested: on a fake loop (time moves when the test says) over
// the in-memory etcd (memory_etcd.h), two members standing for the two
// daemons of a job. The real etcd and real daemons are in
// tests/integration/cluster_test.cc.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tests/supervisor/cluster/cluster_member_fixture.h"

namespace trainsup::supervisor {
namespace {

TEST_F(ClusterMemberTest, TwoNodesAgreeOnOneRendezvous) {
  auto [a, b] = RunningPair();
  const Agreement& aa = **a->joined;
  const Agreement& ba = **b->joined;
  EXPECT_EQ(aa.generation, 1);
  EXPECT_EQ(aa.nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(aa.node_rank, 0);
  EXPECT_EQ(ba.node_rank, 1);
  EXPECT_EQ(ba.master_addr, "host-a");
  EXPECT_EQ(ba.master_port, 29500);
  EXPECT_EQ(aa.master_port, 29500);
}

// Both daemons read generation 1 and try to move it: etcd takes one swap,
// the other daemon re-reads, sees generation 2 and follows it. The job's
// restart is counted once, and both get the one decision.
TEST_F(ClusterMemberTest, TwoNodesDecidingAtOnceMoveTheGenerationOnce) {
  auto [a, b] = RunningPair();
  // b decides between a's read of the generation and a's swap.
  a->client->before_generation_swap = [&, b = b] { RankDied(*b, 1, ExitClass::kCrash); };
  RankDied(*a, 1, ExitClass::kCrash);
  loop_.Advance(0);

  const GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 2);
  EXPECT_EQ(g.action, GenerationRecord::Action::kRun);
  EXPECT_EQ(g.restarts, 1);
  EXPECT_EQ(g.by, "b");
  EXPECT_EQ(g.history.size(), 1u);
  for (Node* n : {a, b}) {
    ASSERT_TRUE(n->verdict) << n->name;
    EXPECT_EQ(n->verdict->kind, ClusterVerdict::Kind::kRestart) << n->name;
    EXPECT_EQ(n->verdict->generation, 2) << n->name;
    EXPECT_EQ(n->verdict->restarts, 1) << n->name;
    EXPECT_EQ(n->verdict->reason, g.reason) << n->name;
    ASSERT_EQ(n->moved.size(), 1u) << n->name;
    EXPECT_EQ(n->moved[0].first, 2) << n->name;
  }
  // The next rendezvous is generation 2's, agreed by both.
  Join(*a, 29501);
  Join(*b, 29601);
  loop_.Advance(0);
  ASSERT_TRUE(a->joined && a->joined->ok());
  EXPECT_EQ((*a->joined)->generation, 2);
  EXPECT_EQ((*a->joined)->master_port, 29501);
}

// a has put its join record of generation 1 when its lease is lost (the
// daemon paused past the TTL): the record goes with the lease. a notices at
// its next renewal, takes a new lease and joins again, and the rendezvous
// completes when b joins, well before its timeout.
TEST_F(ClusterMemberTest, ALeaseLostMidJoinIsJoinedAgainWithTheNewLease) {
  Node& a = Start("a");
  Node& b = Start("b");
  Join(a, 29500);
  loop_.Advance(0);
  const int64_t old_lease = LeaseOf("a");
  ASSERT_NE(old_lease, 0);
  etcd_.ExpireLease(old_lease);
  loop_.Advance(kLeaseTtlS / 3 + 0.1);  // a's next renewal
  EXPECT_EQ(a.Count("lease expired"), 1);
  EXPECT_NE(LeaseOf("a"), 0);
  EXPECT_NE(LeaseOf("a"), old_lease);

  Join(b, 29600);
  loop_.Advance(1);
  ASSERT_TRUE(a.joined.has_value()) << "a's join record went with its old lease";
  ASSERT_TRUE(a.joined->ok()) << a.joined->status();
  ASSERT_TRUE(b.joined && b.joined->ok());
  EXPECT_EQ((*b.joined)->nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ((*b.joined)->generation, 1);
  EXPECT_EQ(Generation().generation, 1);
}

// The watches break just as a moves the generation, so b's watch never
// carries the move. b reads the job's keys again and follows: told once,
// its own verdict is the one a wrote.
TEST_F(ClusterMemberTest, AWatchBrokenDuringAGenerationMoveIsCaughtUpByAResync) {
  auto [a, b] = RunningPair();
  a->client->before_generation_swap = [&] {
    etcd_.BreakWatches(absl::UnavailableError("stream reset"));
  };
  RankDied(*a, 1, ExitClass::kCrash);
  loop_.Advance(0);
  EXPECT_EQ(Generation().generation, 2);
  // Neither watch carried the move, a's own included: a learns its own
  // write from the same resync as b.
  EXPECT_FALSE(a->verdict.has_value());
  EXPECT_TRUE(b->moved.empty()) << "the move came through the broken watch";

  loop_.Advance(1.1);  // the retry after a lost watch
  ASSERT_TRUE(a->verdict);
  EXPECT_EQ(a->verdict->generation, 2);
  ASSERT_EQ(b->moved.size(), 1u);
  EXPECT_EQ(b->moved[0].first, 2);
  EXPECT_TRUE(b->member->etcd_reachable());
  RankDied(*b, 1, ExitClass::kPeerLost);  // its ranks' echo of a's failure
  loop_.Advance(0);
  ASSERT_TRUE(b->verdict);
  EXPECT_EQ(b->verdict->kind, ClusterVerdict::Kind::kRestart);
  EXPECT_EQ(b->verdict->generation, 2);
  loop_.Advance(5);  // the echo's grace runs out: nothing moves again
  EXPECT_EQ(Generation().generation, 2);
  EXPECT_EQ(Generation().restarts, 1);
  EXPECT_EQ(b->moved.size(), 1u);
}

// etcd goes down for longer than a lease and a rank of a dies meanwhile: no
// restart is decided and b's ranks are left alone while etcd is down; each
// node says so once. When etcd answers, a moves the generation for its
// crash (not for a lost node: the outage expired nobody), and both follow.
TEST_F(ClusterMemberTest, ARankDyingWhileEtcdIsDownRestartsTheJobOnceItAnswers) {
  auto [a, b] = RunningPair();
  etcd_.SetUnavailable(true);
  loop_.Advance(0);
  RankDied(*a, 1, ExitClass::kCrash);
  loop_.Advance(3 * kLeaseTtlS);
  EXPECT_FALSE(a->verdict.has_value());
  EXPECT_TRUE(b->moved.empty());
  for (Node* n : {a, b}) {
    EXPECT_FALSE(n->member->etcd_reachable()) << n->name;
    EXPECT_EQ(n->Count("etcd unreachable"), 1) << n->name;
  }

  etcd_.SetUnavailable(false);
  loop_.Advance(1.1);
  const GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 2);
  EXPECT_EQ(g.by, "a");
  EXPECT_EQ(g.restarts, 1);
  EXPECT_TRUE(absl::StrContains(g.reason, "node a: rank 0 was killed")) << g.reason;
  ASSERT_TRUE(a->verdict);
  EXPECT_EQ(a->verdict->kind, ClusterVerdict::Kind::kRestart);
  EXPECT_EQ(a->verdict->generation, 2);
  ASSERT_EQ(b->moved.size(), 1u);
  EXPECT_EQ(b->moved[0].first, 2);
  for (Node* n : {a, b}) {
    EXPECT_TRUE(n->member->etcd_reachable()) << n->name;
    EXPECT_EQ(n->Count("etcd reachable again"), 1) << n->name;
    EXPECT_EQ(n->Count("lost"), 0) << n->name;
  }
}

// A member destroyed (its run ended) revokes its lease off the loop and
// leaves its final status: the other node reads it, not a loss.
TEST_F(ClusterMemberTest, AnEndedMemberLeavesItsFinalStatusAndRevokesItsLease) {
  auto [a, b] = RunningPair();
  const int64_t lease = LeaseOf("b");
  ASSERT_NE(lease, 0);
  v1::ClusterNode done;
  done.set_state(v1::RUN_STATE_SUCCEEDED);
  b->member->Report(done, true);
  loop_.Advance(0);
  b->member.reset();
  loop_.Advance(0);
  auto c = etcd_.Client();
  EXPECT_EQ(c->KeepAlive(lease).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::optional<EtcdKeyValue>> key = c->Get(JobKeys("job").Node("b"));
  ASSERT_TRUE(key.ok() && key->has_value()) << "b's final status went with its lease";
  EXPECT_EQ((*key)->lease, 0);
  v1::ClusterStatus status;
  a->member->Fill(&status);
  bool seen = false;
  for (const v1::ClusterNode& n : status.nodes()) {
    if (n.node() != "b") continue;
    seen = true;
    EXPECT_EQ(n.state(), v1::RUN_STATE_SUCCEEDED);
  }
  EXPECT_TRUE(seen);
}

// Garbage in the job's keys, as anyone who can write to etcd may leave it:
// a join key whose node name is not UTF-8 (with a record that decodes), a
// join record that is not JSON, a generation key's value that is not a
// record. The member notes each, counts none, and the rendezvous still
// ends as it should: here with its timeout, which fails the job with a
// reason etcd can store.
TEST_F(ClusterMemberTest, GarbageInTheJobsKeysIsNotedAndNeverTakesTheMemberDown) {
  Node& a = Start("a", 3);
  Join(a, 29500);
  loop_.Advance(0);
  auto c = etcd_.Client();
  const JobKeys keys("job");
  JoinRecord ghost;
  ghost.node = "ghost";
  ghost.address = "attacker.example";
  ghost.port = 1;
  ASSERT_TRUE(c->Put(keys.Join(1, "\xff\xfe"), EncodeJoin(ghost)).ok());
  ASSERT_TRUE(c->Put(keys.Join(1, "b"), "{not json").ok());
  ASSERT_TRUE(c->Put(keys.prefix() + "rdzv/x/a", "{}").ok());
  loop_.Advance(0);
  EXPECT_FALSE(a.joined.has_value());

  loop_.Advance(60.5);  // the rendezvous timeout
  loop_.Advance(0);
  ASSERT_TRUE(a.joined.has_value());
  EXPECT_EQ(a.joined->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(a.joined->status().message(), "only 1 of 3 nodes joined"))
      << a.joined->status();
  const GenerationRecord g = Generation();
  EXPECT_EQ(g.action, GenerationRecord::Action::kFail);
  EXPECT_GE(a.Count("join record"), 2) << "the bad key and the bad record are each noted";

  // A generation value that is no record: noted, the last good one kept.
  ASSERT_TRUE(c->Put(keys.Generation(), "[]").ok());
  loop_.Advance(0);
  EXPECT_GE(a.Count("generation record"), 1);
  v1::ClusterStatus status;
  a.member->Fill(&status);
  EXPECT_EQ(status.generation(), g.generation);
}

// A generation record's delay comes from whoever wrote it: the verdict
// waits at most this daemon's own longest backoff.
TEST_F(ClusterMemberTest, ARecordsDelayIsClampedToTheLongestBackoff) {
  auto [a, b] = RunningPair();
  GenerationRecord g = Generation();
  g.generation = 2;
  g.restarts = 1;
  g.delay_s = 1e9;
  g.reason = "written by hand";
  auto c = etcd_.Client();
  ASSERT_TRUE(c->Put(JobKeys("job").Generation(), EncodeGeneration(g)).ok());
  RankDied(*a, 1, ExitClass::kPeerLost);
  loop_.Advance(0);
  ASSERT_TRUE(a->verdict);
  EXPECT_EQ(a->verdict->kind, ClusterVerdict::Kind::kRestart);
  EXPECT_EQ(a->verdict->delay_s, RestartPolicy{}.max_backoff_s);
}

// A compare-and-swap that hangs (etcd slow to answer it) does not hold up
// the lease's renewals: they take their own path, and the node is not
// counted lost while the call is stuck.
TEST_F(ClusterMemberTest, ASlowCallDoesNotHoldUpTheLeasesRenewal) {
  auto [a, b] = RunningPair();
  const int64_t lease = LeaseOf("a");
  loop_.defer_off_loop = true;
  RankDied(*a, 1, ExitClass::kCrash);  // its swap is deferred[0], held
  ASSERT_EQ(loop_.deferred.size(), 1u);
  for (int i = 0; i < 12; ++i) {  // 4 lease TTLs
    loop_.Advance(kLeaseTtlS / 3);
    while (loop_.deferred.size() > 1) loop_.RunDeferred(1);  // everything but the swap
    loop_.Advance(0);
  }
  EXPECT_EQ(LeaseOf("a"), lease) << "a's lease expired behind a stuck call";
  EXPECT_TRUE(b->moved.empty());
  EXPECT_EQ(a->Count("lease expired"), 0);
  loop_.RunDeferred(0);  // the swap answers at last
  loop_.defer_off_loop = false;
  loop_.Advance(0);
  EXPECT_EQ(Generation().generation, 2);
  EXPECT_EQ(Generation().reason.find("lost"), std::string::npos) << Generation().reason;
}

// An etcd call that throws (a client's bug, a decoder's) is that call's
// error, noted and retried, never an exception off the loop (it would end
// the daemon).
TEST_F(ClusterMemberTest, AnEtcdCallThatThrowsIsAnErrorAndIsRetried) {
  auto [a, b] = RunningPair();
  a->client->before_generation_swap = [] { throw std::runtime_error("bad_alloc, say"); };
  RankDied(*a, 1, ExitClass::kCrash);
  loop_.Advance(0);
  EXPECT_EQ(Generation().generation, 1);
  EXPECT_EQ(a->Count("etcd call: bad_alloc, say"), 1);
  loop_.Advance(1.1);  // the retry
  EXPECT_EQ(Generation().generation, 2);
  ASSERT_TRUE(a->verdict);
  EXPECT_EQ(a->verdict->generation, 2);
}

// --- leaving a rendezvous (a run giving its slots to another job) -------------------------------

TEST_F(ClusterMemberTest, AWithdrawnJoinLeavesTheRendezvousAndCanJoinAgain) {
  Node& a = Start("a");
  Node& b = Start("b");
  Join(a, 29500);
  loop_.Advance(0);
  std::optional<bool> out;
  a.member->Withdraw([&](bool o) { out = o; });
  loop_.Advance(0);
  ASSERT_EQ(out, std::optional<bool>(true));
  auto c = etcd_.Client();
  auto kv = c->Get(JobKeys("job").Join(1, "a"));
  ASSERT_TRUE(kv.ok());
  EXPECT_FALSE(kv->has_value()) << "a's join record is still there";
  // b joins: nobody agrees, and a's withdrawn join never answers.
  Join(b, 29600);
  loop_.Advance(2);
  EXPECT_FALSE(b.joined.has_value());
  EXPECT_FALSE(a.joined.has_value());
  // a comes back: the rendezvous completes, a's new port is the master's.
  Join(a, 29501);
  loop_.Advance(0);
  ASSERT_TRUE(a.joined && a.joined->ok());
  ASSERT_TRUE(b.joined && b.joined->ok()) << b.joined->status();
  EXPECT_EQ((*b.joined)->master_port, 29501);
  EXPECT_EQ(Generation().generation, 1);
}

// b puts its record between a's view of the rendezvous (a alone) and a's
// withdrawal: b may already have seen the rendezvous complete, so a stays
// in, and both agree.
TEST_F(ClusterMemberTest, AJoinPutMeanwhileKeepsAWithdrawingNodeIn) {
  Node& a = Start("a");
  Join(a, 29500);
  loop_.Advance(0);
  a.client->before_withdraw = [&] {
    JoinRecord r;
    r.node = "b";
    r.run_id = "run-b";
    r.attempt = 1;
    r.address = "host-b";
    r.port = 29600;
    // As b's daemon does: its node key and its join record under its lease.
    auto c = etcd_.Client();
    auto lease = c->GrantLease(30);
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE(c->Put(JobKeys("job").Node("b"), R"({"node":"b","runId":"run-b"})", *lease).ok());
    ASSERT_TRUE(c->Put(JobKeys("job").Join(1, "b"), EncodeJoin(r), *lease).ok());
  };
  std::optional<bool> out;
  a.member->Withdraw([&](bool o) { out = o; });
  loop_.Advance(0);
  ASSERT_EQ(out, std::optional<bool>(false));
  ASSERT_TRUE(a.joined && a.joined->ok()) << "a left a rendezvous b may have seen complete";
  EXPECT_EQ((*a.joined)->nodes, (std::vector<std::string>{"a", "b"}));
  auto kv = etcd_.Client()->Get(JobKeys("job").Join(1, "a"));
  ASSERT_TRUE(kv.ok());
  EXPECT_TRUE(kv->has_value());
  // Complete: nothing left to withdraw.
  out.reset();
  a.member->Withdraw([&](bool o) { out = o; });
  EXPECT_EQ(out, std::optional<bool>(false));
}

// --- job identity ----------------------------------------------------------------------------

// The job is submitted again (a new submission takes its keys) while node
// a was cut off. a finds out when it reconnects: its attempt stops, its
// verdict is the failure, and neither its restart decision nor a cancel
// touches the new submission's generation.
TEST_F(ClusterMemberTest, AMemberOfAReplacedSubmissionNeitherMovesNorCancelsTheNewOne) {
  auto [a, b] = RunningPair();
  const int64_t lease = LeaseOf("a");
  auto c = etcd_.Client();
  const JobKeys keys("job");
  auto sub = c->Get(keys.Submission());
  ASSERT_TRUE(sub.ok() && sub->has_value());
  EXPECT_EQ((*sub)->value, "fresh-a");
  auto replaced = c->ReplacePrefix(keys.prefix(), keys.Submission(), (*sub)->mod_revision,
                                   keys.Submission(), "new-sub");
  ASSERT_TRUE(replaced.ok() && *replaced);
  GenerationRecord fresh;
  fresh.reason = "the job's first generation";
  ASSERT_TRUE(c->Put(keys.Generation(), EncodeGeneration(fresh)).ok());
  b->member.reset();  // b's old run is gone
  etcd_.ExpireLease(lease);
  loop_.Advance(kLeaseTtlS / 3 + 0.1);  // a's renewal: lost, reconnects
  loop_.Advance(1);
  EXPECT_EQ(a->Count("was submitted again (submission new-sub)"), 1);
  ASSERT_FALSE(a->moved.empty());
  RankDied(*a, 1, ExitClass::kGang);
  loop_.Advance(2);
  ASSERT_TRUE(a->verdict);
  EXPECT_EQ(a->verdict->kind, ClusterVerdict::Kind::kFail);
  EXPECT_NE(a->verdict->reason.find("was submitted again"), std::string::npos);
  a->member->Cancel("too late");
  loop_.Advance(2);
  const GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 1);
  EXPECT_EQ(g.action, GenerationRecord::Action::kRun);
  EXPECT_EQ(g.reason, "the job's first generation");
}

// A join record put by anyone else than the daemon holding that node's
// key (no lease, or another lease) does not count: its address would
// become every rank's MASTER_ADDR.
TEST_F(ClusterMemberTest, AJoinRecordNotBoundToItsNodesLeaseIsIgnored) {
  Node& a = Start("b");  // node rank 1 once "a" joins: the master is a's
  Join(a, 29600);
  loop_.Advance(0);
  auto c = etcd_.Client();
  const JobKeys keys("job");
  JoinRecord forged;
  forged.node = "a";
  forged.run_id = "run-a";
  forged.attempt = 1;
  forged.address = "attacker.example";
  forged.port = 4444;
  ASSERT_TRUE(c->Put(keys.Join(1, "a"), EncodeJoin(forged)).ok());
  loop_.Advance(1);
  EXPECT_FALSE(a.joined.has_value()) << "agreed with a record nobody's lease holds";
  EXPECT_EQ(a.Count("ignored the join record of node \"a\""), 1);
  // Under a lease of its own, while node a's key is another's: ignored too.
  auto other = c->GrantLease(30);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(c->Put(keys.Node("a"), R"({"node":"a","runId":"run-a"})", 0).ok());
  ASSERT_TRUE(c->Put(keys.Join(1, "a"), EncodeJoin(forged), *other).ok());
  loop_.Advance(1);
  EXPECT_FALSE(a.joined.has_value());
  // Bad forms never decode.
  forged.address = "evil host;rm -rf";
  EXPECT_FALSE(DecodeJoin(EncodeJoin(forged)).ok());
  // The real node a joins: its own record, under its lease, counts.
  ASSERT_TRUE(c->Delete(keys.Node("a")).ok());
  Node& real = Start("a");
  Join(real, 29500);
  loop_.Advance(1);
  ASSERT_TRUE(a.joined && a.joined->ok()) << (a.joined ? a.joined->status().ToString() : "none");
  EXPECT_EQ((*a.joined)->master_addr, "host-a");
  EXPECT_EQ((*a.joined)->master_port, 29500);
}

}  // namespace
}  // namespace trainsup::supervisor
