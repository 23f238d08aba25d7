// What the multi-node tests share (cluster_test.cc, cluster_jobs_test.cc):
// the spec of a small two-node job, a node's daemon config, and a fixture
// with one real etcd on loopback and two real daemons, "node-a" and
// "node-b", one CPU slot each, whose data roots both include one
// directory standing in for shared storage.
#ifndef TRAINSUP_TESTS_INTEGRATION_CLUSTER_TEST_UTIL_H_
#define TRAINSUP_TESTS_INTEGRATION_CLUSTER_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <utility>

#include "tests/common/etcd_server.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {

inline constexpr double kLeaseS = 3;

inline std::string ModelSpec(const std::string& name, int steps, int checkpoint_every) {
  std::ostringstream s;
  s << "name = \"" << name << "\"\n"
    << "[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = 0.1\n"
    << "[data]\nformat = \"synthetic\"\nscenes = 10\nscene_size = \"small\"\n"
    << "[train]\nbatch_size = 1\nsteps = " << steps
    << "\ncheckpoint_every_steps = " << checkpoint_every
    << "\nkeep_checkpoints = 3\ndeterministic = true\nthreads = 1\n"
    << "[distributed]\ntimeout_s = 20\n";
  return s.str();
}

inline std::string ClusterSpecText(const std::string& job, const std::string& endpoint,
                                   const std::string& shared, int steps, int checkpoint_every) {
  std::ostringstream s;
  s << ModelSpec(job, steps, checkpoint_every) << "[cluster]\njob = \"" << job
    << "\"\nnodes = 2\nranks_per_node = 1\netcd_endpoints = [\"" << endpoint
    << "\"]\ncheckpoint_dir = \"" << shared << "/" << job << "\"\nlease_ttl_s = " << kLeaseS
    << "\nrendezvous_timeout_s = 120\n";
  return s.str();
}

inline void Configure(DaemonHarness& h, const std::string& node, const std::string& shared,
                      int slots) {
  UseRealWorker(h, slots);
  h.Set("daemon.data_roots", "[\"" + h.data_dir() + "\", \"" + shared + "\"]");
  h.Set("restart.max_restarts", "20");
  h.Set("restart.initial_backoff_s", "0");
  h.Set("cluster.node_name", "\"" + node + "\"");
  h.Set("cluster.advertise_addr", "\"127.0.0.1\"");
}

inline const v1::Attempt* Last(const v1::Run& r) {
  return r.attempts_size() == 0 ? nullptr : &r.attempts(r.attempts_size() - 1);
}

// The newest attempt runs with its rank alive, past `step`.
inline bool RunningPast(const v1::Run& r, int64_t step) {
  const v1::Attempt* a = Last(r);
  return r.state() == v1::RUN_STATE_RUNNING && a != nullptr && a->ended_ms() == 0 &&
         a->ranks_size() == 1 && a->ranks(0).alive() && r.progress().step() >= step;
}

inline std::string Events(DaemonHarness& h, const std::string& id) {
  std::string all;
  for (const v1::RunEvent& e : h.History(id)) all += e.reason() + "\n";
  return all;
}

// The newest checkpoint directory under `dir` (step-N with the largest N).
inline std::filesystem::path NewestCheckpoint(const std::filesystem::path& dir) {
  std::filesystem::path best;
  int64_t best_step = -1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) continue;
    const int64_t step = std::stoll(name.substr(5));
    if (step > best_step) {
      best_step = step;
      best = e.path();
    }
  }
  return best;
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Log();
    shared_ = a_.dir() + "/shared";
    std::filesystem::create_directories(shared_);
    Configure(a_, "node-a", shared_, 1);
    Configure(b_, "node-b", shared_, 1);
    ASSERT_TRUE(a_.Start());
    ASSERT_TRUE(b_.Start());
  }

  // Submits the job to both nodes; their run ids.
  std::pair<std::string, std::string> SubmitBoth(const std::string& job, int steps,
                                                 int checkpoint_every) {
    const std::string spec =
        ClusterSpecText(job, etcd_.endpoint(), shared_, steps, checkpoint_every);
    return {a_.Submit(spec), b_.Submit(spec)};
  }

  void ExpectBothSucceed(const std::string& ia, const std::string& ib, v1::Run* ra, v1::Run* rb) {
    ASSERT_TRUE(a_.WaitForEnd(ia, Seconds(400), ra));
    ASSERT_TRUE(b_.WaitForEnd(ib, Seconds(400), rb));
    ASSERT_EQ(ra->state(), v1::RUN_STATE_SUCCEEDED) << Describe(*ra);
    ASSERT_EQ(rb->state(), v1::RUN_STATE_SUCCEEDED) << Describe(*rb);
  }

  // No process names either run's directory (the workers' --run-dir).
  void ExpectNoWorkerLeft(const v1::Run& ra, const v1::Run& rb) {
    EXPECT_TRUE(Eventually(
        [&] {
          return ProcessesMentioning(ra.run_dir()).empty() &&
                 ProcessesMentioning(rb.run_dir()).empty();
        },
        Seconds(30)))
        << "workers left running";
  }

  trainsup::testing::EtcdServer etcd_;
  DaemonHarness a_, b_;
  std::string shared_;
};

inline void CancelRun(DaemonHarness& h, const std::string& id, const std::string& reason) {
  v1::CancelRunRequest req;
  req.set_run_id(id);
  req.set_reason(reason);
  v1::Run out;
  auto ctx = h.Context(h.operator_token());
  grpc::Status s = h.stub().CancelRun(ctx.get(), req, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// The job submitted as `ia` on `a` and `ib` on `b` succeeds on both in one
// attempt, generation 1.
inline void TrainsInOneAttempt(DaemonHarness& a, const std::string& ia, DaemonHarness& b,
                               const std::string& ib) {
  v1::Run ra, rb;
  ASSERT_TRUE(a.WaitForEnd(ia, Seconds(400), &ra));
  ASSERT_TRUE(b.WaitForEnd(ib, Seconds(400), &rb));
  EXPECT_EQ(ra.state(), v1::RUN_STATE_SUCCEEDED) << Describe(ra);
  EXPECT_EQ(rb.state(), v1::RUN_STATE_SUCCEEDED) << Describe(rb);
  EXPECT_EQ(ra.attempts_size(), 1) << Describe(ra);
  EXPECT_EQ(Last(rb)->generation(), 1);
}

}  // namespace trainsup::integration

#endif  // TRAINSUP_TESTS_INTEGRATION_CLUSTER_TEST_UTIL_H_
