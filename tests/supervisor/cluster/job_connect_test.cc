// The job identity's decisions, pure: when a new run replaces a finished
// submission (FinishedAndTakenPart), and whether a node may join with the
// shared store as it reads it (CheckSharedStore).
#include "supervisor/cluster/job_connect.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <string>

#include "trainsup/v1/supervisor.pb.h"

namespace trainsup::supervisor {
namespace {

const JobKeys kKeys("job");

EtcdKeyValue NodeKey(const std::string& node, const std::string& run_id, v1::RunState state,
                     int64_t lease) {
  v1::ClusterNode n;
  n.set_node(node);
  n.set_run_id(run_id);
  n.set_state(state);
  EtcdKeyValue kv;
  kv.key = kKeys.Node(node);
  (void)google::protobuf::util::MessageToJsonString(n, &kv.value);
  kv.lease = lease;
  return kv;
}

EtcdKeyValue Generation(GenerationRecord::Action action, const std::string& reason) {
  GenerationRecord g;
  g.generation = 4;
  g.action = action;
  g.reason = reason;
  EtcdKeyValue kv;
  kv.key = kKeys.Generation();
  kv.value = EncodeGeneration(g);
  return kv;
}

std::optional<std::string> Finished(const std::vector<EtcdKeyValue>& kvs,
                                    const std::string& node = "a",
                                    const std::string& run = "run-a2") {
  EtcdRange r;
  r.kvs = kvs;
  absl::StatusOr<std::optional<std::string>> f = FinishedAndTakenPart(r, kKeys, node, run);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : std::nullopt;
}

TEST(FinishedAndTakenPart, AFinishedJobThisNodeTookPartInIsReplaced) {
  const auto failed = Generation(GenerationRecord::Action::kFail, "restart budget spent");
  const auto a_old = NodeKey("a", "run-a1", v1::RUN_STATE_FAILED, 0);
  const auto b_old = NodeKey("b", "run-b1", v1::RUN_STATE_FAILED, 0);
  EXPECT_EQ(Finished({failed, a_old, b_old}), "failed: restart budget spent");
  EXPECT_EQ(Finished({Generation(GenerationRecord::Action::kCancel, "wrong data"), a_old}),
            "was cancelled: wrong data");
  // Every node's final status SUCCEEDED.
  const auto run = Generation(GenerationRecord::Action::kRun, "");
  EXPECT_EQ(Finished({run, NodeKey("a", "run-a1", v1::RUN_STATE_SUCCEEDED, 0),
                      NodeKey("b", "run-b1", v1::RUN_STATE_SUCCEEDED, 0)}),
            "succeeded");
}

TEST(FinishedAndTakenPart, ALiveJobOrANodeThatTookNoPartJoinsIt) {
  const auto run = Generation(GenerationRecord::Action::kRun, "");
  // Still running on b.
  EXPECT_EQ(Finished({run, NodeKey("a", "run-a1", v1::RUN_STATE_SUCCEEDED, 0),
                      NodeKey("b", "run-b1", v1::RUN_STATE_RUNNING, 7)}),
            std::nullopt);
  // Cancelled, but this node (c) had no run in it: the late part of it.
  const auto cancelled = Generation(GenerationRecord::Action::kCancel, "wrong data");
  EXPECT_EQ(Finished({cancelled, NodeKey("a", "run-a1", v1::RUN_STATE_CANCELLED, 0)}, "c"),
            std::nullopt);
  // This node's key holds this very run (a restarted daemon).
  EXPECT_EQ(Finished({cancelled, NodeKey("a", "run-a2", v1::RUN_STATE_CANCELLED, 0)}),
            std::nullopt);
  EXPECT_EQ(Finished({}), std::nullopt);
}

TEST(FinishedAndTakenPart, ARunOfTheFinishedJobStillStoppingIsWaitedFor) {
  EtcdRange r;
  r.kvs = {Generation(GenerationRecord::Action::kFail, "x"),
           NodeKey("a", "run-a1", v1::RUN_STATE_FAILED, 0),
           NodeKey("b", "run-b1", v1::RUN_STATE_RUNNING, 9)};
  absl::StatusOr<std::optional<std::string>> f = FinishedAndTakenPart(r, kKeys, "a", "run-a2");
  ASSERT_EQ(f.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(f.status().message().find("its run on node b is still stopping"), std::string::npos)
      << f.status();
}

TEST(CheckSharedStore, AnotherJobsOrAnEarlierSubmissionsStoreIsRefused) {
  ClusterSpec spec;
  spec.job = "job";
  spec.checkpoint_dir = "/shared/job";
  const std::map<std::string, JoinRecord> none;
  EXPECT_TRUE(CheckSharedStore(std::nullopt, spec, "a", "s2", none).ok());
  EXPECT_TRUE(CheckSharedStore(ckpt::StoreOwner{"job", "s2"}, spec, "a", "s2", none).ok());
  absl::Status other = CheckSharedStore(ckpt::StoreOwner{"other", "s9"}, spec, "a", "s2", none);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("holds the checkpoints of job \"other\""), std::string::npos);
  absl::Status earlier = CheckSharedStore(ckpt::StoreOwner{"job", "s1"}, spec, "a", "s2", none);
  EXPECT_EQ(earlier.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(earlier.message().find("an earlier submission (s1)"), std::string::npos);
}

TEST(CheckSharedStore, ANodeThatFindsNoRecordWhereAnotherDoesIsToldToReadAgain) {
  ClusterSpec spec;
  spec.job = "job";
  spec.checkpoint_dir = "/shared/job";
  JoinRecord b;
  b.node = "b";
  b.sees = "s2";
  absl::Status blind = CheckSharedStore(std::nullopt, spec, "a", "s2", {{"b", b}});
  EXPECT_EQ(blind.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(blind.message().find("node a cannot see the job's checkpoints: node b finds"),
            std::string::npos)
      << blind;
  // What another node sees of another submission is not this one's record.
  b.sees = "s1";
  EXPECT_TRUE(CheckSharedStore(std::nullopt, spec, "a", "s2", {{"b", b}}).ok());
}

}  // namespace
}  // namespace trainsup::supervisor
