// Helpers shared by the daemon's integration tests: event filters, rank
// logs, fake GPUs, and a process outside every worker's group.
#ifndef TRAINSUP_TESTS_INTEGRATION_DAEMON_TEST_UTIL_H_
#define TRAINSUP_TESTS_INTEGRATION_DAEMON_TEST_UTIL_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "contracts/run_layout.h"
#include "tests/integration/daemon_harness.h"

namespace trainsup::integration {

// Generous: the box may be busy with other builds and tests.
inline const Seconds kRunLimit(90);

inline bool IsTerminal(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED;
}

inline std::vector<v1::RunEvent> EventsOfKind(const std::vector<v1::RunEvent>& events,
                                              v1::EventKind kind) {
  std::vector<v1::RunEvent> out;
  for (const v1::RunEvent& e : events) {
    if (e.kind() == kind) out.push_back(e);
  }
  return out;
}

inline bool HasEvent(const std::vector<v1::RunEvent>& events, v1::EventKind kind,
                     const std::string& reason_part) {
  for (const v1::RunEvent& e : events) {
    if (e.kind() == kind && e.reason().find(reason_part) != std::string::npos) return true;
  }
  return false;
}

// The event of `kind` for `attempt` (first one), or a default event.
inline v1::RunEvent FindEvent(const std::vector<v1::RunEvent>& events, v1::EventKind kind,
                              int attempt) {
  for (const v1::RunEvent& e : events) {
    if (e.kind() == kind && e.attempt() == attempt) return e;
  }
  return v1::RunEvent();
}

// A spec the daemon must refuse at submit, with INVALID_ARGUMENT whose
// message contains `message`.
struct RejectedSpec {
  std::string spec;
  std::string message;
};

// Submits every spec of `cases`, each refused as it says, then checks that
// the daemon stored nothing: no run listed, nothing under runs/.
inline void ExpectRejectedLeavingNothing(DaemonHarness& h, const std::vector<RejectedSpec>& cases) {
  for (const RejectedSpec& c : cases) {
    SCOPED_TRACE(c.spec);
    std::string id;
    grpc::Status s = h.TrySubmit(c.spec, h.operator_token(), &id);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr(c.message));
    EXPECT_TRUE(id.empty());
  }
  v1::ListRunsResponse list;
  auto ctx = h.Context(h.viewer_token());
  ASSERT_TRUE(h.stub().ListRuns(ctx.get(), v1::ListRunsRequest(), &list).ok());
  EXPECT_EQ(list.runs_size(), 0);
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(h.state_dir() + "/runs")) {
    entries.push_back(e.path().string());
  }
  EXPECT_THAT(entries, ::testing::IsEmpty());
}

inline std::string RankLog(const v1::Run& run, int attempt, int rank) {
  return ReadFileText(RunLayout(run.run_dir()).LogPath(attempt, rank));
}

// Every attempt's log of every rank, headed by attempt and rank: for a
// failure message (a frozen or hung rank's log ends with its stacks).
inline std::string EveryRankLog(const v1::Run& run) {
  std::string out;
  for (const v1::Attempt& a : run.attempts()) {
    for (const v1::RankStatus& r : a.ranks()) {
      out += "---- attempt " + std::to_string(a.number()) + " rank " + std::to_string(r.rank()) +
             " log ----\n" + RankLog(run, a.number(), r.rank());
    }
  }
  return out;
}

struct FakeGpu {
  std::string uuid;
  int64_t used_mb = 0;
  std::vector<int> compute_pids;
  // Health (docs/operations.md, "GPU health"): drains the GPU's slot.
  int64_t ecc_uncorrected = 0;
  bool lost = false;
  std::vector<int> xids;
  std::string health_error;  // a health query that failed ("" none)
};

// Writes the file of [testing] fake_gpu_file (format of OpenFakeMonitor),
// through a rename so the daemon never reads half of it.
inline void WriteFakeGpus(const std::string& path, const std::vector<FakeGpu>& gpus) {
  nlohmann::json list = nlohmann::json::array();
  for (const FakeGpu& g : gpus) {
    list.push_back({{"uuid", g.uuid},
                    {"name", "Fake GPU"},
                    {"memory_total", int64_t{80} << 30},
                    {"memory_used", g.used_mb << 20},
                    {"compute_pids", g.compute_pids},
                    {"ecc_uncorrected", g.ecc_uncorrected},
                    {"lost", g.lost},
                    {"xids", g.xids},
                    {"health_error", g.health_error}});
  }
  WriteFileText(path + ".tmp", nlohmann::json{{"gpus", list}}.dump());
  std::filesystem::rename(path + ".tmp", path);
}

// Two fake GPUs, released when a dead worker's GPU holds at most 100 MiB.
inline void UseFakeGpus(DaemonHarness& h, const std::string& path,
                        const std::vector<std::string>& uuids,
                        const std::string& release_timeout_s) {
  WriteFakeGpus(path, {{uuids[0], 10, {}}, {uuids[1], 10, {}}});
  h.Set("slots.use_gpus", "true");
  h.Set("slots.gpu_release_timeout_s", release_timeout_s);
  h.Set("slots.gpu_idle_memory_mb", "100");
  h.Set("testing.fake_gpu_file", "\"" + path + "\"");
}

inline v1::Node GetNode(DaemonHarness& h) {
  v1::Node node;
  auto ctx = h.Context(h.viewer_token());
  grpc::Status s = h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &node);
  EXPECT_TRUE(s.ok()) << "GetNode: " << s.error_message();
  return node;
}

// Whether GetNode shows slot `index` in `state`; `*node` gets the answer.
inline bool SlotIn(DaemonHarness& h, int index, v1::SlotState state, v1::Node* node) {
  *node = GetNode(h);
  return index < node->slots_size() && node->slots(index).state() == state;
}

// A process in a group of its own (so never one of a worker's): `sleep 60`.
class ForeignProcess {
 public:
  explicit ForeignProcess(const std::string& log)
      : pid_(SpawnProcess({"/bin/sleep", "60"}, TestEnvironment({}), log, log)) {}
  ~ForeignProcess() { Stop(); }
  int pid() const { return pid_; }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int pid_;
};

inline const std::vector<std::string> kGpuUuids = {"GPU-0a0a0a0a-fake-4000-8000-000000000000",
                                                   "GPU-1b1b1b1b-fake-4000-8000-000000000001"};

}  // namespace trainsup::integration

#endif  // TRAINSUP_TESTS_INTEGRATION_DAEMON_TEST_UTIL_H_
