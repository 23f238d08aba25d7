// Elastic multi-node jobs in the cluster member (docs/distributed.md,
// "Several machines: nodes left out and taken in"), on the fake loop over
// the in-memory etcd as in cluster_member_test.cc: a rendezvous closed short
// after wait_s, a node left out and taken in again, and the ways that can
// go wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/supervisor/cluster/cluster_member_fixture.h"

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
// slot): the gang checkpointed and stopped, and the job must go on. The
// generation moves as for taking a node in: no restart counted, no
// backoff, the rendezvous open again, and the other node's ranks (which
// stopped at the same checkpoint without asking) follow with no restart
// either.
TEST_F(ClusterMemberTest, RanksStoppedForADrainMoveTheJobOnWithNoRestartCounted) {
  auto [a, b] = RunningPair(2, 1);
  RankEnded(*a, 1, ExitClass::kStopped);
  loop_.Advance(0);
  const GenerationRecord g = Generation();
  EXPECT_EQ(g.generation, 2);
  EXPECT_EQ(g.action, GenerationRecord::Action::kRun) << g.reason;
  EXPECT_TRUE(g.grow);
  EXPECT_EQ(g.restarts, 0);
  EXPECT_EQ(g.delay_s, 0);
  EXPECT_TRUE(g.history.empty());
  EXPECT_TRUE(g.members.empty());
  EXPECT_EQ(g.reason, "node a: rank 0 stopped on request");
  ASSERT_TRUE(a->verdict.has_value());
  EXPECT_EQ(a->verdict->kind, ClusterVerdict::Kind::kRestart) << a->verdict->reason;
  EXPECT_TRUE(a->verdict->grow);
  EXPECT_EQ(a->verdict->restarts, 0);
  RankEnded(*b, 1, ExitClass::kStopped, /*stop_requested=*/false);
  loop_.Advance(2);  // past the echo grace (1 s)
  EXPECT_EQ(Generation().generation, 2) << "the echo moves nothing";
  ASSERT_TRUE(b->verdict.has_value());
  EXPECT_TRUE(b->verdict->grow);
  EXPECT_EQ(b->verdict->restarts, 0);
  // a's run waits for a usable slot; b goes on alone after the wait, and
  // says why a is left out.
  Join(*b, 29600);
  loop_.Advance(kElasticWaitS + 0.5);
  ASSERT_TRUE(b->joined && b->joined->ok());
  EXPECT_EQ((*b->joined)->nodes, (std::vector<std::string>{"b"}));
  EXPECT_EQ((*b->joined)->resize,
            "node a left out: only 1 of 2 nodes joined generation 2's rendezvous within 5 s "
            "(min_nodes 1); node a: rank 0 stopped on request");
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
  auto [pa, pb] = RunningPair(2, /*min_nodes=*/1);
  Node& a = *pa;
  Node& b = *pb;
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
