// The cluster member (supervisor/cluster/cluster.h) at the protocol's edges,
// as RunUnit is tested: on a fake loop (time moves when the test says) over
// the in-memory etcd (memory_etcd.h), two members standing for the two
// daemons of a job. The real etcd and real daemons are in
// tests/integration/cluster_test.cc.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "supervisor/cluster/cluster.h"
#include "supervisor/cluster/memory_etcd.h"
#include "tests/supervisor/fake_loop.h"

namespace trainsup::supervisor {
namespace {

// The member's etcd client, with a hook that runs once just before the next
// compare-and-swap of the generation key: what another daemon does between
// this one's read of the generation and its write.
class HookedClient final : public EtcdClient {
 public:
  explicit HookedClient(std::unique_ptr<EtcdClient> inner) : inner_(std::move(inner)) {}
  std::function<void()> before_generation_swap;
  std::function<void()> before_withdraw;  // once, before the next DeleteIfUnchanged

  std::string endpoints() const override { return inner_->endpoints(); }
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    return inner_->Put(key, value, lease);
  }
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) override {
    return inner_->Get(key);
  }
  absl::StatusOr<EtcdRange> GetPrefix(const std::string& prefix) override {
    return inner_->GetPrefix(prefix);
  }
  absl::StatusOr<EtcdSwap> PutIf(const std::string& key, int64_t expected_mod_revision,
                                 const std::string& value, int64_t lease) override {
    if (absl::EndsWith(key, "/generation") && expected_mod_revision != 0 &&
        before_generation_swap) {
      std::function<void()> hook = std::move(before_generation_swap);
      before_generation_swap = nullptr;
      hook();
    }
    return inner_->PutIf(key, expected_mod_revision, value, lease);
  }
  absl::StatusOr<bool> DeleteIfUnchanged(const std::string& key, const std::string& prefix,
                                         int64_t revision) override {
    if (before_withdraw) {
      std::function<void()> hook = std::move(before_withdraw);
      before_withdraw = nullptr;
      hook();
    }
    return inner_->DeleteIfUnchanged(key, prefix, revision);
  }
  absl::StatusOr<bool> ReplacePrefix(const std::string& prefix, const std::string& if_key,
                                     int64_t if_mod_revision, const std::string& put_key,
                                     const std::string& put_value) override {
    return inner_->ReplacePrefix(prefix, if_key, if_mod_revision, put_key, put_value);
  }
  absl::StatusOr<int64_t> Delete(const std::string& key) override { return inner_->Delete(key); }
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) override {
    return inner_->DeletePrefix(prefix);
  }
  absl::StatusOr<int64_t> GrantLease(int64_t ttl_s) override { return inner_->GrantLease(ttl_s); }
  absl::StatusOr<int64_t> KeepAlive(int64_t lease) override { return inner_->KeepAlive(lease); }
  absl::Status Revoke(int64_t lease) override { return inner_->Revoke(lease); }
  std::unique_ptr<EtcdWatch> Watch(
      const std::string& prefix, int64_t start_revision,
      std::function<void(const std::vector<EtcdEvent>&, int64_t)> on_events,
      std::function<void(const absl::Status&)> on_end) override {
    return inner_->Watch(prefix, start_revision, std::move(on_events), std::move(on_end));
  }

 private:
  std::unique_ptr<EtcdClient> inner_;
};

// One daemon of the job: its member and what the member told it.
struct Node {
  std::string name;
  HookedClient* client = nullptr;
  std::unique_ptr<ClusterMember> member;
  std::vector<std::pair<int64_t, std::string>> moved;
  std::vector<int64_t> grown;          // the moves that take a rejoining node in
  std::vector<std::string> grow_told;  // told to stop at a checkpoint to take one in
  std::vector<std::string> notes;
  std::optional<absl::StatusOr<Agreement>> joined;
  std::optional<ClusterVerdict> verdict;

  int Count(const std::string& text) const {
    int n = 0;
    for (const std::string& line : notes) n += absl::StrContains(line, text) ? 1 : 0;
    return n;
  }
};

constexpr double kLeaseTtlS = 10;
constexpr double kElasticWaitS = 5;

class ClusterMemberTest : public ::testing::Test {
 protected:
  Node& Start(const std::string& name, int64_t job_nodes = 2, int64_t min_nodes = 0) {
    auto node = std::make_unique<Node>();
    Node* n = node.get();
    n->name = name;
    auto client = std::make_shared<HookedClient>(etcd_.Client());
    n->client = client.get();
    ClusterMember::Options o;
    o.spec.present = true;
    o.spec.job = "job";
    o.spec.nodes = job_nodes;
    o.spec.etcd_endpoints = {"memory"};
    o.spec.checkpoint_dir = "/shared/ckpt";
    o.spec.lease_ttl_s = kLeaseTtlS;
    o.spec.rendezvous_timeout_s = 60;
    o.spec.min_nodes = min_nodes > 0 ? min_nodes : job_nodes;
    o.elastic_wait_s = kElasticWaitS;
    o.node = name;
    o.address = "host-" + name;
    o.run_id = "run-" + name;
    o.spec_hash = "same-spec";
    o.fresh_submission = "fresh-" + name;
    o.policy.jitter = 0;
    ClusterEvents events;
    events.moved = [n](int64_t g, const std::string& why, bool grow) {
      n->moved.emplace_back(g, why);
      if (grow) n->grown.push_back(g);
    };
    events.note = [n](LogLevel, const std::string& line) { n->notes.push_back(line); };
    events.grow = [n](int64_t, const std::string& why) { n->grow_told.push_back(why); };
    n->member =
        std::make_unique<ClusterMember>(&loop_, &loop_, client, std::move(o), std::move(events));
    nodes_.push_back(std::move(node));
    return *n;
  }
  void Join(Node& n, int port) {
    n.joined.reset();
    n.member->Join(1, {}, std::nullopt, port,
                   [&n](absl::StatusOr<Agreement> a) { n.joined = std::move(a); });
  }
  // A rank of `n` ended with `cls` in `generation`: the job's verdict.
  void RankDied(Node& n, int64_t generation, ExitClass cls) { RankEnded(n, generation, cls); }
  void RankEnded(Node& n, int64_t generation, ExitClass cls, bool stop_requested = false) {
    AttemptEnd end;
    end.end_s = static_cast<double>(loop_.WallMs()) / 1000;
    end.cls = cls;
    end.detail = cls == ExitClass::kStopped ? "rank 0 stopped on request"
                                            : "rank 0 was killed by signal 9 (SIGKILL)";
    end.stop_requested = stop_requested || cls == ExitClass::kStopped;
    n.verdict.reset();
    n.member->Verdict(generation, end, [&n](ClusterVerdict v) { n.verdict = std::move(v); });
  }
  // Two nodes, both in generation 1's rendezvous and agreed.
  std::pair<Node*, Node*> RunningPair() {
    Node& a = Start("a");
    Node& b = Start("b");
    Join(a, 29500);
    Join(b, 29600);
    loop_.Advance(0);
    EXPECT_TRUE(a.joined && a.joined->ok());
    EXPECT_TRUE(b.joined && b.joined->ok());
    return {&a, &b};
  }
  GenerationRecord Generation() {
    auto c = etcd_.Client();
    absl::StatusOr<std::optional<EtcdKeyValue>> kv = c->Get(JobKeys("job").Generation());
    EXPECT_TRUE(kv.ok() && kv->has_value());
    if (!kv.ok() || !kv->has_value()) return {};
    absl::StatusOr<GenerationRecord> g = DecodeGeneration((*kv)->value);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : GenerationRecord{};
  }
  int64_t LeaseOf(const std::string& node) {
    auto c = etcd_.Client();
    absl::StatusOr<std::optional<EtcdKeyValue>> kv = c->Get(JobKeys("job").Node(node));
    return kv.ok() && kv->has_value() ? (*kv)->lease : 0;
  }

  FakeLoop loop_;
  MemoryEtcd etcd_{&loop_};
  std::vector<std::unique_ptr<Node>> nodes_;  // members go before the store
};

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

namespace trainsup::supervisor {
namespace {

// An elastic job of two nodes that goes on with one (min_nodes 1): a joins
// alone, and after wait_s the rendezvous closes with a (the record names
// its members and why). b's daemon then joins: it is left out of the
// running generation and told so, and a is told to stop its ranks at a
// checkpoint. Once they stopped, a moves the job on: generation 2, grow, no
// restart counted; its verdict is a grow, b's pending join ends so that
// its run reads the checkpoints again, and both agree on generation 2.
TEST_F(ClusterMemberTest, AShortRendezvousClosesAfterTheWaitAndGrowsWhenTheOtherNodeJoins) {
  Node& a = Start("a", 2, 1);
  Join(a, 29500);
  loop_.Advance(kElasticWaitS - 0.5);
  EXPECT_FALSE(a.joined.has_value()) << "still waiting for b";
  loop_.Advance(1);
  ASSERT_TRUE(a.joined.has_value());
  ASSERT_TRUE(a.joined->ok()) << a.joined->status();
  EXPECT_EQ((*a.joined)->generation, 1);
  EXPECT_EQ((*a.joined)->nodes, (std::vector<std::string>{"a"}));
  EXPECT_EQ((*a.joined)->node_rank, 0);
  EXPECT_EQ((*a.joined)->master_port, 29500);
  EXPECT_EQ((*a.joined)->resize,
            "a node left out: only 1 of 2 nodes joined generation 1's rendezvous within 5 s "
            "(min_nodes 1)");
  GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 1);
  EXPECT_EQ(g.members, (std::vector<std::string>{"a"}));
  EXPECT_EQ(g.restarts, 0);

  Node& b = Start("b", 2, 1);
  Join(b, 29600);
  loop_.Advance(0);
  EXPECT_FALSE(b.joined.has_value()) << "b is not a member of generation 1";
  EXPECT_EQ(b.Count("generation 1 runs without this node (a)"), 1);
  EXPECT_EQ(a.grow_told, (std::vector<std::string>{"node b rejoined"}));
  EXPECT_EQ(a.Count("node b joined generation 1, which runs without it"), 1);
  EXPECT_EQ(Generation().generation, 1) << "not before a's ranks stopped at a checkpoint";
  loop_.Advance(30);
  EXPECT_EQ(a.grow_told.size(), 1u) << "told once";
  EXPECT_FALSE(b.joined.has_value()) << "b outwaits the rendezvous timeout";

  // a's ranks stopped at a checkpoint: the job moves on, and a's verdict
  // is the grow.
  RankEnded(a, 1, ExitClass::kStopped);
  loop_.Advance(0);
  g = Generation();
  EXPECT_EQ(g.generation, 2);
  EXPECT_TRUE(g.grow);
  EXPECT_EQ(g.restarts, 0) << "taking a node in is not a restart";
  EXPECT_TRUE(g.members.empty());
  EXPECT_EQ(g.resize, "node b rejoined");
  EXPECT_EQ(g.by, "a");
  ASSERT_TRUE(a.verdict.has_value());
  EXPECT_EQ(a.verdict->kind, ClusterVerdict::Kind::kRestart);
  EXPECT_TRUE(a.verdict->grow);
  EXPECT_EQ(a.verdict->generation, 2);
  EXPECT_EQ(a.verdict->restarts, 0);
  EXPECT_EQ(a.grown, (std::vector<int64_t>{2}));
  ASSERT_TRUE(b.joined.has_value());
  EXPECT_EQ(b.joined->status().code(), absl::StatusCode::kAborted) << b.joined->status();

  Join(a, 29501);
  Join(b, 29601);
  loop_.Advance(0);
  for (Node* n : {&a, &b}) {
    ASSERT_TRUE(n->joined.has_value()) << n->name;
    ASSERT_TRUE(n->joined->ok()) << n->name << ": " << n->joined->status();
    EXPECT_EQ((*n->joined)->generation, 2) << n->name;
    EXPECT_EQ((*n->joined)->nodes, (std::vector<std::string>{"a", "b"})) << n->name;
    EXPECT_EQ((*n->joined)->resize, "node b rejoined") << n->name;
  }
  EXPECT_EQ((*b.joined)->node_rank, 1);
  EXPECT_EQ(Generation().generation, 2);
}

// A node's ranks stopped on request for a reason of that node (a drained
// slot): the stop was asked for, but the job must go on, so the generation
// moves as for any other end of its ranks.
TEST_F(ClusterMemberTest, RanksStoppedForADrainRestartTheJobRatherThanEndingIt) {
  auto [a, b] = RunningPair();
  RankEnded(*a, 1, ExitClass::kStopped);
  loop_.Advance(0);
  const GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 2);
  EXPECT_EQ(g.action, GenerationRecord::Action::kRun) << g.reason;
  EXPECT_FALSE(g.grow);
  ASSERT_TRUE(a->verdict.has_value());
  EXPECT_EQ(a->verdict->kind, ClusterVerdict::Kind::kRestart) << a->verdict->reason;
  EXPECT_FALSE(a->verdict->grow);
}

// A short generation's member whose ranks crash while they stop to take a
// node in: a restart of the job like any crash (counted), not a grow.
TEST_F(ClusterMemberTest, ACrashWhileStoppingToGrowIsARestartNotAGrow) {
  Node& a = Start("a", 2, 1);
  Join(a, 29500);
  loop_.Advance(kElasticWaitS + 0.5);
  ASSERT_TRUE(a.joined && a.joined->ok());
  Node& b = Start("b", 2, 1);
  Join(b, 29600);
  loop_.Advance(0);
  ASSERT_EQ(a.grow_told.size(), 1u);
  RankEnded(a, 1, ExitClass::kCrash, /*stop_requested=*/true);
  loop_.Advance(0);
  const GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 2);
  EXPECT_FALSE(g.grow);
  EXPECT_EQ(g.restarts, 1);
  ASSERT_TRUE(a.verdict.has_value());
  EXPECT_FALSE(a.verdict->grow);
  EXPECT_EQ(a.verdict->restarts, 1);
}

// A node left out of a generation whose members then finished the job
// (their final statuses, SUCCEEDED): nothing will take it in, and its run
// is told the job is over rather than waiting for ever.
TEST_F(ClusterMemberTest, ALeftOutNodeIsToldTheJobFinishedWithoutIt) {
  Node& a = Start("a", 2, 1);
  Join(a, 29500);
  loop_.Advance(kElasticWaitS + 0.5);
  ASSERT_TRUE(a.joined && a.joined->ok());
  v1::ClusterNode done;
  done.set_state(v1::RUN_STATE_SUCCEEDED);
  a.member->Report(done, true);
  loop_.Advance(0);
  a.member.reset();
  loop_.Advance(0);
  Node& b = Start("b", 2, 1);
  Join(b, 29600);
  loop_.Advance(0);
  ASSERT_TRUE(b.joined.has_value());
  ASSERT_TRUE(b.joined->ok()) << b.joined->status();
  EXPECT_TRUE((*b.joined)->finished);
  EXPECT_EQ((*b.joined)->nodes, (std::vector<std::string>{"a"}));
  EXPECT_EQ(Generation().generation, 1) << "nothing moved";
}

// A member of a closed generation whose fellow member's join vanished as
// it closed (a withdraw or a lost lease in the same instant): at the
// rendezvous timeout the job restarts, it does not fail.
TEST_F(ClusterMemberTest, AClosedGenerationMissingAMemberRestartsAtTheTimeout) {
  Node& a = Start("a", 3, 2);
  Node& b = Start("b", 3, 2);
  Join(a, 29500);
  Join(b, 29600);
  loop_.Advance(0);
  // b's record goes just before the close lands (whichever node closes).
  for (Node* n : {&a, &b}) {
    n->client->before_generation_swap = [&] {
      auto c = etcd_.Client();
      ASSERT_TRUE(c->Delete(JobKeys("job").Join(1, "b")).ok());
      a.client->before_generation_swap = nullptr;
      b.client->before_generation_swap = nullptr;
    };
  }
  loop_.Advance(kElasticWaitS + 0.5);
  EXPECT_EQ(Generation().members, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(a.joined.has_value());
  loop_.Advance(60);
  const GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 2);
  EXPECT_EQ(g.action, GenerationRecord::Action::kRun) << g.reason;
  EXPECT_NE(g.reason.find("member b did not join"), std::string::npos) << g.reason;
}

// A node lost mid-run with min_nodes left: the job restarts (counted), the
// rendezvous of generation 2 closes after wait_s with the node that is
// there, naming the one left out.
TEST_F(ClusterMemberTest, ANodeLostMidRunIsLeftOutOfTheNextGeneration) {
  Node& a = Start("a", 2, 1);
  Node& b = Start("b", 2, 1);
  Join(a, 29500);
  Join(b, 29600);
  loop_.Advance(0);
  ASSERT_TRUE(a.joined && a.joined->ok());
  EXPECT_EQ((*a.joined)->nodes.size(), 2u) << "both joined at once: no wait";
  etcd_.ExpireLease(LeaseOf("b"));
  b.member.reset();  // b's daemon is gone
  loop_.Advance(0);
  ASSERT_EQ(a.moved.size(), 1u);
  EXPECT_TRUE(a.grown.empty());
  RankDied(a, 1, ExitClass::kPeerLost);
  loop_.Advance(2);
  ASSERT_TRUE(a.verdict.has_value());
  EXPECT_FALSE(a.verdict->grow);
  EXPECT_EQ(a.verdict->restarts, 1);
  Join(a, 29501);
  loop_.Advance(kElasticWaitS + 0.5);
  ASSERT_TRUE(a.joined && a.joined->ok()) << (a.joined ? a.joined->status().ToString() : "");
  EXPECT_EQ((*a.joined)->generation, 2);
  EXPECT_EQ((*a.joined)->nodes, (std::vector<std::string>{"a"}));
  EXPECT_EQ((*a.joined)->resize,
            "node b left out: only 1 of 2 nodes joined generation 2's rendezvous within 5 s "
            "(min_nodes 1)");
  EXPECT_EQ(Generation().left_out, (std::vector<std::string>{"b"}));
}

// Fewer than min_nodes: the rendezvous does not close short, and the job
// fails at the rendezvous timeout as a job without elasticity does.
TEST_F(ClusterMemberTest, BelowMinNodesTheRendezvousFailsAtItsTimeout) {
  Node& a = Start("a", 3, 2);
  Join(a, 29500);
  loop_.Advance(30);
  EXPECT_FALSE(a.joined.has_value());
  EXPECT_EQ(Generation().generation, 1);
  EXPECT_TRUE(Generation().members.empty());
  loop_.Advance(31);
  ASSERT_TRUE(a.joined.has_value());
  EXPECT_EQ(a.joined->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.joined->status().message().find("only 1 of 3 nodes joined"), std::string::npos)
      << a.joined->status();
}

// A node left out waits past the rendezvous timeout without failing the
// job; when every member of the short generation is gone too, it moves the
// job on itself and goes on alone.
TEST_F(ClusterMemberTest, ALeftOutNodeOutwaitsTheTimeoutAndGoesOnWhenTheMembersAreGone) {
  Node& a = Start("a", 2, 1);
  Join(a, 29500);
  loop_.Advance(kElasticWaitS + 0.5);
  ASSERT_TRUE(a.joined && a.joined->ok());
  // a is gone before its ranks run (nothing grows it), and b comes.
  etcd_.ExpireLease(LeaseOf("a"));
  a.member.reset();
  Node& b = Start("b", 2, 1);
  Join(b, 29600);
  loop_.Advance(0);
  EXPECT_FALSE(b.joined.has_value());
  EXPECT_EQ(b.Count("generation 1 runs without this node (a)"), 1);
  loop_.Advance(60.5);  // b's rendezvous timeout: the members are gone
  EXPECT_EQ(Generation().generation, 2);
  EXPECT_EQ(Generation().action, GenerationRecord::Action::kRun);
  // Its join, with the steps it read before generation 1 ran, ends: the
  // run reads the store again and joins generation 2.
  ASSERT_TRUE(b.joined.has_value());
  EXPECT_EQ(b.joined->status().code(), absl::StatusCode::kAborted) << b.joined->status();
  Join(b, 29601);
  loop_.Advance(kElasticWaitS + 0.5);
  ASSERT_TRUE(b.joined.has_value());
  ASSERT_TRUE(b.joined->ok()) << b.joined->status();
  EXPECT_EQ((*b.joined)->generation, 2);
  EXPECT_EQ((*b.joined)->nodes, (std::vector<std::string>{"b"}));
}

}  // namespace
}  // namespace trainsup::supervisor
