#include "supervisor/policy/cluster_protocol.h"

#include <gtest/gtest.h>

namespace trainsup::supervisor {
namespace {

JoinRecord Node(const std::string& name, int port, std::vector<int64_t> steps) {
  JoinRecord r;
  r.node = name;
  r.run_id = "run-" + name;
  r.attempt = 2;
  r.address = name + ".example";
  r.port = port;
  r.steps = std::move(steps);
  return r;
}

TEST(JobKeys, NameAndParseEveryKeyOfTheJob) {
  const JobKeys k("scan-a");
  EXPECT_EQ(k.Generation(), "/trainsup/v1/jobs/scan-a/generation");
  EXPECT_EQ(k.Node("n1"), "/trainsup/v1/jobs/scan-a/nodes/n1");
  EXPECT_EQ(k.Join(3, "n1"), "/trainsup/v1/jobs/scan-a/rdzv/3/n1");
  EXPECT_EQ(k.Parse(k.Generation()).kind, "generation");
  EXPECT_EQ(k.Parse(k.Spec()).kind, "spec");
  EXPECT_EQ(k.Parse(k.Node("n1")).kind, "node");
  EXPECT_EQ(k.Parse(k.Node("n1")).node, "n1");
  const JobKeys::Parsed j = k.Parse(k.Join(12, "node-b"));
  EXPECT_EQ(j.kind, "join");
  EXPECT_EQ(j.generation, 12);
  EXPECT_EQ(j.node, "node-b");
  EXPECT_EQ(k.Parse("/trainsup/v1/jobs/scan-b/generation").kind, "") << "another job";
  EXPECT_EQ(k.Parse("/trainsup/v1/jobs/scan-a/rdzv/x/n").kind, "");
  EXPECT_EQ(k.Parse("/trainsup/v1/jobs/scan-a/other").kind, "");
}

TEST(JoinRecord, RoundTripsAndRefusesGarbage) {
  const JoinRecord r = Node("n1", 2900, {30, 20});
  absl::StatusOr<JoinRecord> back = DecodeJoin(EncodeJoin(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->node, "n1");
  EXPECT_EQ(back->run_id, "run-n1");
  EXPECT_EQ(back->attempt, 2);
  EXPECT_EQ(back->port, 2900);
  EXPECT_EQ(back->steps, (std::vector<int64_t>{30, 20}));
  EXPECT_FALSE(DecodeJoin("not json").ok());
  EXPECT_FALSE(DecodeJoin("[1]").ok());
  EXPECT_FALSE(DecodeJoin("{\"node\": 3}").ok());
}

TEST(GenerationRecord, RoundTripsWithItsHistory) {
  GenerationRecord g;
  g.generation = 4;
  g.action = GenerationRecord::Action::kFail;
  g.restarts = 3;
  g.delay_s = 2.5;
  g.by = "n2";
  g.reason = "because";
  g.history.push_back(AttemptEnd{10, ExitClass::kPeerLost, true, false, "rank 1 ended"});
  absl::StatusOr<GenerationRecord> back = DecodeGeneration(EncodeGeneration(g));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->generation, 4);
  EXPECT_EQ(back->action, GenerationRecord::Action::kFail);
  EXPECT_EQ(back->restarts, 3);
  EXPECT_EQ(back->delay_s, 2.5);
  EXPECT_EQ(back->by, "n2");
  ASSERT_EQ(back->history.size(), 1u);
  EXPECT_EQ(back->history[0].cls, ExitClass::kPeerLost);
  EXPECT_TRUE(back->history[0].made_progress);
  EXPECT_EQ(back->history[0].detail, "rank 1 ended");
  EXPECT_FALSE(DecodeGeneration("{\"generation\": 0}").ok());
  EXPECT_FALSE(DecodeGeneration("{\"generation\": 2, \"action\": \"explode\"}").ok());
}

// Records come from anyone who can write to etcd: a number that is not an
// integer in range is refused, never converted (a float of 1e300 to int64
// is undefined behaviour; the fuzz target cluster_records found it), and
// the encoders take any bytes.
TEST(ClusterRecords, NumbersOutOfRangeAreRefusedAndAnyBytesEncode) {
  const std::string join = R"({"node": "a", "address": "h", "port": )";
  EXPECT_TRUE(DecodeJoin(join + "29500}").ok());
  for (const char* port : {"1e30", "0", "65536", "-1", "\"29500\"", "29500.5"}) {
    absl::StatusOr<JoinRecord> r = DecodeJoin(join + port + "}");
    EXPECT_FALSE(r.ok()) << port;
    EXPECT_NE(r.status().message().find("\"port\""), absl::string_view::npos) << port;
  }
  EXPECT_FALSE(DecodeJoin(join + R"(1, "steps": [10, 1e300]})").ok());
  EXPECT_FALSE(DecodeJoin(join + R"(1, "steps": [-5]})").ok());
  EXPECT_FALSE(DecodeJoin(join + R"(1, "steps": {"a": 1}})").ok());
  EXPECT_FALSE(DecodeJoin(join + R"(1, "attempt": 3e9})").ok());
  EXPECT_FALSE(DecodeGeneration(R"({"generation": 1e300})").ok());
  EXPECT_FALSE(DecodeGeneration(R"({"generation": 18446744073709551615})").ok());
  EXPECT_FALSE(DecodeGeneration(R"({"generation": 2, "restarts": -1})").ok());
  EXPECT_FALSE(DecodeGeneration(R"({"generation": 2, "delay_s": -3})").ok());

  JoinRecord r;
  r.node = "\xff\xfe";
  r.address = "h";
  r.port = 1;
  absl::StatusOr<JoinRecord> back = DecodeJoin(EncodeJoin(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->node, "\xef\xbf\xbd\xef\xbf\xbd");  // U+FFFD twice
  GenerationRecord g;
  g.reason = "only \xff joined";
  EXPECT_TRUE(DecodeGeneration(EncodeGeneration(g)).ok());
}

// However long the exits' details and however many failures, the record
// stays far below etcd's request limit (1.5 MiB).
TEST(NextGeneration, TheRecordStaysBoundedInBytes) {
  RestartPolicy policy;
  policy.max_restarts = 1000000;
  policy.crash_loop_attempts = 0;
  GenerationRecord g;
  const std::string long_detail = std::string(9999, 'x') + "\xc3\xa9";  // ends in a 2-byte char
  for (int i = 0; i < 400; ++i) {
    AttemptEnd end;
    end.end_s = 1000 + i;
    end.made_progress = true;
    end.detail = long_detail;
    g = NextGeneration(g, end, policy, "node-a", "node node-a: " + long_detail);
  }
  const std::string encoded = EncodeGeneration(g);
  EXPECT_LT(encoded.size(), 128u * 1024) << encoded.size();
  EXPECT_EQ(g.history.size(), GenerationRecord::kMaxHistory);
  EXPECT_LE(g.history.back().detail.size(), GenerationRecord::kMaxDetailBytes);
  EXPECT_LE(g.reason.size(), GenerationRecord::kMaxReasonBytes);
  absl::StatusOr<GenerationRecord> back = DecodeGeneration(encoded);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->history.size(), GenerationRecord::kMaxHistory);
  EXPECT_EQ(back->restarts, 400);
}

TEST(NextGeneration, RestartsWithTheBackoffAndCountsOnce) {
  RestartPolicy p;
  p.initial_backoff_s = 2;
  p.jitter = 0;
  p.max_restarts = 2;
  p.crash_loop_attempts = 0;
  GenerationRecord g;  // generation 1
  // Without progress: the backoff streak is not reset between them.
  AttemptEnd crash{100, ExitClass::kCrash, false, false, "rank 1 ended: exit 3"};
  GenerationRecord two = NextGeneration(g, crash, p, "n2", "node n2: rank 1 ended: exit 3");
  EXPECT_EQ(two.generation, 2);
  EXPECT_EQ(two.action, GenerationRecord::Action::kRun);
  EXPECT_EQ(two.restarts, 1);
  EXPECT_EQ(two.delay_s, 2);
  EXPECT_EQ(two.by, "n2");
  EXPECT_EQ(two.reason.rfind("node n2: rank 1 ended: exit 3; ", 0), 0u) << two.reason;
  crash.end_s = 110;
  GenerationRecord three = NextGeneration(two, crash, p, "n1", "again");
  EXPECT_EQ(three.restarts, 2);
  EXPECT_EQ(three.delay_s, 4) << "the backoff grows over the job's failures";
  crash.end_s = 120;
  GenerationRecord four = NextGeneration(three, crash, p, "n1", "and again");
  EXPECT_EQ(four.action, GenerationRecord::Action::kFail) << four.reason;
  EXPECT_NE(four.reason.find("restart budget exhausted"), std::string::npos) << four.reason;
  EXPECT_EQ(four.restarts, 2);
}

TEST(Agree, WaitsForEveryNodeThenRanksBySortedName) {
  std::vector<JoinRecord> joined = {Node("b", 2001, {30, 20, 10})};
  absl::StatusOr<std::optional<Agreement>> none = Agree(joined, 2, "b");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  joined.push_back(Node("a", 2002, {20, 10}));
  for (const std::string self : {"a", "b"}) {
    absl::StatusOr<std::optional<Agreement>> a = Agree(joined, 2, self);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(a->has_value());
    EXPECT_EQ((*a)->nodes, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ((*a)->node_rank, self == "a" ? 0 : 1);
    EXPECT_EQ((*a)->master_addr, "a.example");
    EXPECT_EQ((*a)->master_port, 2002);
    EXPECT_EQ((*a)->resume_step, 20) << "the newest step both verified";
  }
}

TEST(Agree, NoCommonCheckpointStartsFromScratch) {
  absl::StatusOr<std::optional<Agreement>> a =
      Agree({Node("a", 1, {10}), Node("b", 2, {20})}, 2, "a");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->resume_step, -1);
}

TEST(Agree, TooManyNodesOrAStrangerIsAnError) {
  absl::StatusOr<std::optional<Agreement>> many =
      Agree({Node("a", 1, {}), Node("b", 2, {}), Node("c", 3, {})}, 2, "a");
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(many.status().message().find("3 nodes joined a job of 2 (a, b, c)"), std::string::npos)
      << many.status();
  absl::StatusOr<std::optional<Agreement>> stranger =
      Agree({Node("a", 1, {}), Node("b", 2, {})}, 2, "z");
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kInvalidArgument);
}

// The nodes agree only when they see the same owner record of the shared
// store; none anywhere means node 0 claims it.
TEST(Agree, OnlyWhenEveryNodeSeesTheSameOwnerRecord) {
  JoinRecord a = Node("a", 29500, {8, 4}), b = Node("b", 29600, {8, 4});
  auto agreed = Agree({a, b}, 2, "a");
  ASSERT_TRUE(agreed.ok() && agreed->has_value());
  EXPECT_EQ((*agreed)->sees, "");
  a.sees = b.sees = "sub-1";
  agreed = Agree({a, b}, 2, "b");
  ASSERT_TRUE(agreed.ok() && agreed->has_value());
  EXPECT_EQ((*agreed)->sees, "sub-1");
  EXPECT_EQ((*agreed)->resume_step, 8);
  b.sees = "";  // b does not see the store
  agreed = Agree({a, b}, 2, "a");
  ASSERT_TRUE(agreed.ok());
  EXPECT_FALSE(agreed->has_value());
  // The record carries it; one from an older daemon has none.
  absl::StatusOr<JoinRecord> back = DecodeJoin(EncodeJoin(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sees, "sub-1");
  back = DecodeJoin(R"({"node":"a","address":"h","port":1})");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sees, "");
}

// An elastic job's records: a closed rendezvous's members and the nodes
// left out, a generation that grows, and the resize; each round-trips, and
// a list that is not node names is refused.
TEST(GenerationRecord, ElasticFieldsRoundTripAndGarbageIsRefused) {
  GenerationRecord g;
  g.generation = 4;
  g.restarts = 2;
  const GenerationRecord closed = CloseRendezvous(g, {"c", "a"}, {"b"}, "node b left out");
  EXPECT_EQ(closed.generation, 4);
  EXPECT_EQ(closed.restarts, 2);
  EXPECT_EQ(closed.members, (std::vector<std::string>{"a", "c"})) << "sorted";
  EXPECT_EQ(closed.left_out, (std::vector<std::string>{"b"}));
  absl::StatusOr<GenerationRecord> back = DecodeGeneration(EncodeGeneration(closed));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->members, closed.members);
  EXPECT_EQ(back->left_out, closed.left_out);
  EXPECT_EQ(back->resize, "node b left out");
  EXPECT_FALSE(back->grow);

  const GenerationRecord grown = ResizeGeneration(closed, "a", "node b rejoined");
  EXPECT_EQ(grown.generation, 5);
  EXPECT_EQ(grown.action, GenerationRecord::Action::kRun);
  EXPECT_EQ(grown.restarts, 2) << "taking a node in is not a restart";
  EXPECT_EQ(grown.delay_s, 0);
  EXPECT_TRUE(grown.members.empty()) << "the next rendezvous waits for every node again";
  EXPECT_TRUE(grown.left_out.empty());
  EXPECT_TRUE(grown.grow);
  EXPECT_EQ(grown.by, "a");
  back = DecodeGeneration(EncodeGeneration(grown));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->grow);
  EXPECT_EQ(back->resize, "node b rejoined");

  // A restart after a short generation opens the rendezvous to every node.
  AttemptEnd end;
  end.cls = ExitClass::kCrash;
  const GenerationRecord next = NextGeneration(closed, end, RestartPolicy{}, "a", "crash");
  EXPECT_TRUE(next.members.empty());
  EXPECT_FALSE(next.grow);
  EXPECT_EQ(next.resize, "");

  // Records written before elastic jobs decode with none of it.
  back = DecodeGeneration(R"({"generation": 3, "action": "run"})");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->members.empty());
  EXPECT_FALSE(back->grow);
  EXPECT_EQ(DecodeGeneration(R"({"generation": 3, "members": "a"})").status().message(),
            "generation record: \"members\" is not a list");
  EXPECT_EQ(DecodeGeneration(R"({"generation": 3, "left_out": [1]})").status().message(),
            "generation record: \"left_out\" holds something not a node name");
  EXPECT_FALSE(DecodeGeneration(R"({"generation": 3, "members": [""]})").ok());
}

// A closed rendezvous agrees among its members alone, once all have
// joined: a node left out waits (for the generation that takes it in), and
// its record neither counts nor makes "too many nodes".
TEST(Agree, AClosedRendezvousAgreesAmongItsMembers) {
  const std::vector<std::string> members = {"a", "c"};
  absl::StatusOr<std::optional<Agreement>> waiting =
      Agree({Node("a", 1, {10}), Node("b", 2, {10})}, 3, "a", members);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_FALSE(waiting->has_value()) << "c, a member, has not joined";

  const std::vector<JoinRecord> all = {Node("c", 3, {10, 20}), Node("b", 2, {20}),
                                       Node("a", 1, {10, 20})};
  absl::StatusOr<std::optional<Agreement>> c = Agree(all, 3, "c", members);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->nodes, members);
  EXPECT_EQ((*c)->node_rank, 1);
  EXPECT_EQ((*c)->master_port, 1) << "a's";
  EXPECT_EQ((*c)->resume_step, 20) << "b's steps do not count";
  absl::StatusOr<std::optional<Agreement>> b = Agree(all, 3, "b", members);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->has_value()) << "left out: it waits";
  // Two members of a job of two, and a third record: no error once closed.
  absl::StatusOr<std::optional<Agreement>> two =
      Agree({Node("a", 1, {}), Node("b", 2, {}), Node("c", 3, {})}, 2, "a", {"a", "b"});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(two->has_value());
}

TEST(RendezvousTimeoutReason, NamesTheNodesOrWhatTheySee) {
  JoinRecord a = Node("a", 29500, {}), b = Node("b", 29600, {});
  a.sees = "sub-1";
  EXPECT_EQ(RendezvousTimeoutReason(3, {{"a", a}}, 2, 60),
            "rendezvous of generation 3: only 1 of 2 nodes joined within 60 s (a); the job fails");
  EXPECT_EQ(RendezvousTimeoutReason(3, {{"a", a}, {"b", b}}, 2, 60),
            "rendezvous of generation 3: all 2 nodes joined but do not see the same owner record "
            "(trainsup-job.json) in cluster.checkpoint_dir (a: sub-1, b: none) within 60 s; the "
            "job fails");
}

}  // namespace
}  // namespace trainsup::supervisor
