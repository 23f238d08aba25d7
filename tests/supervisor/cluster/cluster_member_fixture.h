// The cluster member's test fixture (cluster_member_test.cc,
// cluster_member_elastic_test.cc): a fake loop (time moves when the test
// says) over the in-memory etcd, each member standing for a daemon of the
// job, with an etcd client whose hooks run another daemon's step between
// this one's read and write.
#ifndef TRAINSUP_TESTS_SUPERVISOR_CLUSTER_CLUSTER_MEMBER_FIXTURE_H_
#define TRAINSUP_TESTS_SUPERVISOR_CLUSTER_CLUSTER_MEMBER_FIXTURE_H_

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "supervisor/cluster/cluster.h"
#include "supervisor/cluster/memory_etcd.h"
#include "tests/supervisor/fake_loop.h"

namespace trainsup::supervisor {

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
  // stop_requested: by default, whether cls is kStopped.
  void RankEnded(Node& n, int64_t generation, ExitClass cls,
                 std::optional<bool> stop_requested = std::nullopt) {
    AttemptEnd end;
    end.end_s = static_cast<double>(loop_.WallMs()) / 1000;
    end.cls = cls;
    end.detail = cls == ExitClass::kStopped ? "rank 0 stopped on request"
                                            : "rank 0 was killed by signal 9 (SIGKILL)";
    end.stop_requested = stop_requested.value_or(cls == ExitClass::kStopped);
    n.verdict.reset();
    n.member->Verdict(generation, end, [&n](ClusterVerdict v) { n.verdict = std::move(v); });
  }
  // Two nodes, both in generation 1's rendezvous and agreed.
  std::pair<Node*, Node*> RunningPair(int64_t job_nodes = 2, int64_t min_nodes = 0) {
    Node& a = Start("a", job_nodes, min_nodes);
    Node& b = Start("b", job_nodes, min_nodes);
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

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_TESTS_SUPERVISOR_CLUSTER_CLUSTER_MEMBER_FIXTURE_H_
