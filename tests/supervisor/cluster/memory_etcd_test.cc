#include "supervisor/cluster/memory_etcd.h"

#include <gtest/gtest.h>

#include <vector>

namespace trainsup::supervisor {
namespace {

class FakeClock final : public UnitClock {
 public:
  double NowS() override { return now_s; }
  int64_t WallMs() override { return static_cast<int64_t>(now_s * 1000); }
  uint64_t BootTicks() override { return 0; }
  uint64_t BootTicksAt(int64_t) override { return 0; }
  double now_s = 100;
};

TEST(MemoryEtcd, RevisionsAndSwap) {
  FakeClock clock;
  MemoryEtcd etcd(&clock);
  auto a = etcd.Client();
  auto b = etcd.Client();
  auto r1 = a->Put("k", "1");
  ASSERT_TRUE(r1.ok());
  auto got = b->Get("k");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->mod_revision, *r1);
  // Two writers deciding at once from the same read: one wins.
  auto sa = a->PutIf("k", *r1, "a");
  auto sb = b->PutIf("k", *r1, "b");
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_TRUE(sa->succeeded);
  EXPECT_FALSE(sb->succeeded);
  ASSERT_TRUE(sb->current.has_value());
  EXPECT_EQ(sb->current->value, "a");
  auto create = a->PutIf("new", 0, "x");
  ASSERT_TRUE(create.ok());
  EXPECT_TRUE(create->succeeded);
  EXPECT_FALSE(a->PutIf("new", 0, "y")->succeeded);
}

TEST(MemoryEtcd, LeaseExpiresOnTheClockUnlessKeptAlive) {
  FakeClock clock;
  MemoryEtcd etcd(&clock);
  auto c = etcd.Client();
  auto lease = c->GrantLease(10);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(c->Put("node", "n", *lease).ok());
  clock.now_s += 8;
  EXPECT_EQ(*c->KeepAlive(*lease), 10);
  clock.now_s += 8;  // 16 s after the grant, 8 after the keep-alive
  EXPECT_TRUE(c->Get("node")->has_value());
  clock.now_s += 3;
  EXPECT_FALSE(c->Get("node")->has_value());
  EXPECT_EQ(c->KeepAlive(*lease).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Put("x", "y", *lease).status().code(), absl::StatusCode::kNotFound);
}

// etcd restores its leases with their full TTL when it comes back, so an
// outage longer than a lease expires nobody; a lease already past its
// deadline when the outage began is gone.
TEST(MemoryEtcd, AnOutageRestoresLeasesWithTheirFullTtl) {
  FakeClock clock;
  MemoryEtcd etcd(&clock);
  auto c = etcd.Client();
  const int64_t kept = *c->GrantLease(10);
  const int64_t stale = *c->GrantLease(2);
  ASSERT_TRUE(c->Put("kept", "k", kept).ok());
  ASSERT_TRUE(c->Put("stale", "s", stale).ok());
  clock.now_s += 5;  // `stale` is past its deadline, nobody has asked yet
  etcd.SetUnavailable(true);
  clock.now_s += 30;  // three times `kept`'s TTL
  etcd.SetUnavailable(false);
  EXPECT_TRUE(c->Get("kept")->has_value());
  EXPECT_FALSE(c->Get("stale")->has_value());
  EXPECT_EQ(c->KeepAlive(stale).status().code(), absl::StatusCode::kNotFound);
  clock.now_s += 11;  // the restored TTL runs out unless kept alive
  EXPECT_FALSE(c->Get("kept")->has_value());
}

TEST(MemoryEtcd, WatchFromRevisionAndFaults) {
  FakeClock clock;
  MemoryEtcd etcd(&clock);
  auto c = etcd.Client();
  int64_t r1 = *c->Put("/job/a", "1");
  ASSERT_TRUE(c->Put("/other", "z").ok());
  int64_t lease = *c->GrantLease(5);
  ASSERT_TRUE(c->Put("/job/b", "2", lease).ok());
  std::vector<EtcdEvent> seen;
  std::vector<absl::Status> ends;
  auto w = c->Watch(
      "/job/", r1,
      [&](const std::vector<EtcdEvent>& ev, int64_t) {
        seen.insert(seen.end(), ev.begin(), ev.end());
      },
      [&](const absl::Status& why) { ends.push_back(why); });
  ASSERT_EQ(seen.size(), 2u);  // history from r1, only the prefix
  EXPECT_EQ(seen[0].kv.key, "/job/a");
  etcd.ExpireLease(lease);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(seen[2].kv.key, "/job/b");
  etcd.BreakWatches(absl::UnavailableError("cut"));
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(c->Put("/job/c", "3").ok());
  EXPECT_EQ(seen.size(), 3u);  // the broken watch hears nothing more

  etcd.Compact(etcd.revision());
  auto w2 = c->Watch(
      "/job/", r1, [](const std::vector<EtcdEvent>&, int64_t) {},
      [&](const absl::Status& why) { ends.push_back(why); });
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[1].code(), absl::StatusCode::kFailedPrecondition);

  etcd.SetUnavailable(true);
  EXPECT_EQ(c->Get("/job/a").status().code(), absl::StatusCode::kUnavailable);
  etcd.SetUnavailable(false);
  EXPECT_TRUE(c->Get("/job/a").ok());
}

TEST(MemoryEtcd, DestroyedWatchGetsNothing) {
  FakeClock clock;
  MemoryEtcd etcd(&clock);
  auto c = etcd.Client();
  int calls = 0;
  auto w = c->Watch(
      "/", 0, [&](const std::vector<EtcdEvent>&, int64_t) { ++calls; },
      [&](const absl::Status&) { ++calls; });
  ASSERT_TRUE(c->Put("/a", "1").ok());
  EXPECT_EQ(calls, 1);
  w.reset();
  ASSERT_TRUE(c->Put("/a", "2").ok());
  etcd.BreakWatches(absl::UnavailableError("cut"));
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace trainsup::supervisor
