#include "supervisor/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "gtest/gtest.h"
#include "tests/common/http_get.h"

namespace trainsup::supervisor {
namespace {

std::unique_ptr<Metrics> NoEndpoint() {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", false);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? std::move(*metrics) : nullptr;
}

// The value of `series` (name and labels exactly as exposed, labels in
// alphabetical order) in `scrape`; nullopt when there is no such line.
std::optional<double> ValueOf(const std::string& scrape, const std::string& series) {
  std::istringstream lines(scrape);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) != 0) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(series.size() + 1), &value)) return std::nullopt;
    return value;
  }
  return std::nullopt;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Metrics, WithoutEndpointHasNoPortAndStillScrapes) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  EXPECT_EQ(metrics->port(), 0);
  const std::string scrape = metrics->Scrape();
  EXPECT_TRUE(Contains(scrape, "# TYPE trainsup_runs gauge")) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"PENDING\"}"), 0.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"CANCELLED\"}"), 0.0) << scrape;
}

TEST(Metrics, RunsByStateSetsCountsAndZeroesStatesThatEmptied) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->SetRunsByState({{"RUNNING", 3}, {"pending", 2}, {"PAUSED", 1}});
  std::string scrape = metrics->Scrape();
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"RUNNING\"}"), 3.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"PENDING\"}"), 2.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"PAUSED\"}"), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"FAILED\"}"), 0.0) << scrape;
  EXPECT_FALSE(Contains(scrape, "state=\"pending\"")) << scrape;

  metrics->SetRunsByState({{"SUCCEEDED", 5}});
  scrape = metrics->Scrape();
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"RUNNING\"}"), 0.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"PAUSED\"}"), 0.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_runs{state=\"SUCCEEDED\"}"), 5.0) << scrape;
}

TEST(Metrics, CountersCountPerLabel) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->CountRestart("oom");
  metrics->CountRestart("oom");
  metrics->CountRestart("crash");
  metrics->CountWorkerExit("hung");
  metrics->CountGpuStranded("GPU-1234");
  metrics->CountApiCall("SubmitRun", "OK");
  metrics->CountApiCall("SubmitRun", "OK");
  metrics->CountApiCall("SubmitRun", "INVALID_ARGUMENT");
  metrics->CountApiCall("SubmitRun", "3");  // the same code, as a number
  metrics->CountApiCall("GetRun", "5");
  metrics->CountApiCall("GetRun", "99");  // not a gRPC code: kept as given
  const std::string scrape = metrics->Scrape();
  EXPECT_TRUE(Contains(scrape, "# TYPE trainsup_restarts_total counter")) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_restarts_total{reason=\"oom\"}"), 2.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_restarts_total{reason=\"crash\"}"), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_exits_total{class=\"hung\"}"), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_gpu_stranded_total{gpu=\"GPU-1234\"}"), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_api_calls_total{code=\"OK\",method=\"SubmitRun\"}"), 2.0)
      << scrape;
  EXPECT_EQ(
      ValueOf(scrape, "trainsup_api_calls_total{code=\"INVALID_ARGUMENT\",method=\"SubmitRun\"}"),
      2.0)
      << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_api_calls_total{code=\"NOT_FOUND\",method=\"GetRun\"}"), 1.0)
      << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_api_calls_total{code=\"99\",method=\"GetRun\"}"), 1.0)
      << scrape;
}

Metrics::WorkerSample Sample(double scale) {
  Metrics::WorkerSample sample;
  sample.heartbeat_age_s = 1.5 * scale;
  sample.steps_per_s = 4 * scale;
  sample.samples_per_s = 32 * scale;
  sample.memory_current = 1024 * scale;
  sample.memory_peak = 2048 * scale;
  sample.memory_budget = 4096 * scale;
  sample.step = 100 * scale;
  sample.loss = 0.25 * scale;
  sample.learning_rate = 0.01 * scale;
  sample.oom_splits = 5 * scale;
  sample.oom_retries = 7 * scale;
  sample.oom_wasted_s = 0.5 * scale;
  sample.step_compute_s = 0.125 * scale;
  sample.straggler = 1;
  return sample;
}

TEST(Metrics, SetWorkerExportsEverySeriesWithRunAndRank) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->SetWorker("r1", 0, Sample(1));
  metrics->SetWorker("r1", 0, Sample(2));  // replaces, not adds
  const std::string scrape = metrics->Scrape();
  const std::string labels = "{rank=\"0\",run=\"r1\"}";
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_heartbeat_age_seconds" + labels), 3.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_step_rate" + labels), 8.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_samples_per_second" + labels), 64.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_step" + labels), 200.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_loss" + labels), 0.5) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_learning_rate" + labels), 0.02) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_oom_splits" + labels), 10.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_oom_retries" + labels), 14.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_oom_wasted_seconds" + labels), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_step_compute_seconds" + labels), 0.25) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_straggler" + labels), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_memory_bytes{kind=\"current\",rank=\"0\",run=\"r1\"}"),
            2048.0)
      << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_memory_bytes{kind=\"peak\",rank=\"0\",run=\"r1\"}"),
            4096.0)
      << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_memory_bytes{kind=\"budget\",rank=\"0\",run=\"r1\"}"),
            8192.0)
      << scrape;
}

TEST(Metrics, RemoveWorkerRemovesOnlyThatWorkersSeries) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->SetWorker("r1", 0, Sample(1));
  metrics->SetWorker("r1", 1, Sample(1));
  metrics->RemoveWorker("r1", 0);
  metrics->RemoveWorker("r1", 7);     // unknown rank: no-op
  metrics->RemoveWorker("other", 0);  // unknown run: no-op
  const std::string scrape = metrics->Scrape();
  EXPECT_FALSE(Contains(scrape, "rank=\"0\"")) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_step{rank=\"1\",run=\"r1\"}"), 100.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_memory_bytes{kind=\"peak\",rank=\"1\",run=\"r1\"}"),
            2048.0)
      << scrape;
}

TEST(Metrics, RemoveRunRemovesCheckpointAgeAndAllItsWorkers) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->SetWorker("r1", 0, Sample(1));
  metrics->SetWorker("r1", 1, Sample(1));
  metrics->SetWorker("r2", 0, Sample(1));
  metrics->SetCheckpointAge("r1", 42);
  metrics->SetCheckpointAge("r2", 7);
  metrics->SetRunValMiou("r1", 0.5);
  metrics->SetRunValMiou("r2", -1);  // none yet: no series
  std::string scrape = metrics->Scrape();
  EXPECT_EQ(ValueOf(scrape, "trainsup_checkpoint_age_seconds{run=\"r1\"}"), 42.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_run_val_miou{run=\"r1\"}"), 0.5) << scrape;
  EXPECT_FALSE(Contains(scrape, "trainsup_run_val_miou{run=\"r2\"}")) << scrape;

  metrics->RemoveRun("r1");
  scrape = metrics->Scrape();
  EXPECT_FALSE(Contains(scrape, "run=\"r1\"")) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_checkpoint_age_seconds{run=\"r2\"}"), 7.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_worker_step{rank=\"0\",run=\"r2\"}"), 100.0) << scrape;
  // Setting a removed worker again brings its series back.
  metrics->SetWorker("r1", 0, Sample(3));
  EXPECT_EQ(ValueOf(metrics->Scrape(), "trainsup_worker_step{rank=\"0\",run=\"r1\"}"), 300.0);
}

TEST(Metrics, SetSlotIsOneHotAndStrandedIsUnhealthy) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->SetSlot(0, "GPU-a", "BUSY");
  std::string scrape = metrics->Scrape();
  const auto state = [](const std::string& s) {
    return "trainsup_slot_state{gpu=\"GPU-a\",slot=\"0\",state=\"" + s + "\"}";
  };
  EXPECT_EQ(ValueOf(scrape, state("BUSY")), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, state("FREE")), 0.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, state("RELEASING")), 0.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, state("STRANDED")), 0.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_slot_healthy{gpu=\"GPU-a\",slot=\"0\"}"), 1.0) << scrape;

  metrics->SetSlot(0, "GPU-a", "stranded");
  scrape = metrics->Scrape();
  EXPECT_EQ(ValueOf(scrape, state("BUSY")), 0.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, state("STRANDED")), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_slot_healthy{gpu=\"GPU-a\",slot=\"0\"}"), 0.0) << scrape;

  metrics->SetSlot(0, "GPU-a", "FREE");
  EXPECT_EQ(ValueOf(metrics->Scrape(), "trainsup_slot_healthy{gpu=\"GPU-a\",slot=\"0\"}"), 1.0);
}

TEST(Metrics, SetSlotDropsSeriesOfAnOldGpuAndUnknownStates) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->SetSlot(1, "GPU-a", "WEDGED");
  std::string scrape = metrics->Scrape();
  EXPECT_EQ(ValueOf(scrape, "trainsup_slot_state{gpu=\"GPU-a\",slot=\"1\",state=\"WEDGED\"}"), 1.0)
      << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_slot_state{gpu=\"GPU-a\",slot=\"1\",state=\"FREE\"}"), 0.0)
      << scrape;

  metrics->SetSlot(1, "GPU-b", "FREE");
  scrape = metrics->Scrape();
  EXPECT_FALSE(Contains(scrape, "GPU-a")) << scrape;
  EXPECT_FALSE(Contains(scrape, "WEDGED")) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_slot_state{gpu=\"GPU-b\",slot=\"1\",state=\"FREE\"}"), 1.0)
      << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_slot_healthy{gpu=\"GPU-b\",slot=\"1\"}"), 1.0) << scrape;
}

TEST(Metrics, DaemonInfoKeepsOnlyTheLatestVersion) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  metrics->SetDaemonInfo("0.1.0", 1700000000);
  metrics->SetDaemonInfo("0.2.0", 1700000100);
  const std::string scrape = metrics->Scrape();
  EXPECT_FALSE(Contains(scrape, "version=\"0.1.0\"")) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_daemon_info{version=\"0.2.0\"}"), 1.0) << scrape;
  EXPECT_EQ(ValueOf(scrape, "trainsup_daemon_start_time_seconds"), 1700000100.0) << scrape;
}

TEST(Metrics, ConcurrentUpdatesRemovalsAndScrapesEndConsistent) {
  std::unique_ptr<Metrics> metrics = NoEndpoint();
  ASSERT_NE(metrics, nullptr);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&metrics, rank] {
      const std::string run = "r" + std::to_string(rank);
      for (int i = 0; i < 200; ++i) {
        metrics->SetWorker(run, rank, Sample(i));
        metrics->SetCheckpointAge(run, i);
        metrics->SetSlot(rank, "GPU-" + std::to_string(i % 2), i % 2 ? "BUSY" : "FREE");
        metrics->CountRestart("crash");
        if (i % 3 == 0) metrics->RemoveRun(run);
        if (i % 5 == 0) metrics->RemoveWorker(run, rank);
        metrics->Scrape();
      }
      metrics->SetWorker(run, rank, Sample(1));
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string scrape = metrics->Scrape();
  EXPECT_EQ(ValueOf(scrape, "trainsup_restarts_total{reason=\"crash\"}"), 800.0) << scrape;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string r = std::to_string(rank);
    EXPECT_EQ(ValueOf(scrape, "trainsup_worker_step{rank=\"" + r + "\",run=\"r" + r + "\"}"), 100.0)
        << scrape;
    // i = 198 removed the run last; i = 199 set the checkpoint age again.
    EXPECT_EQ(ValueOf(scrape, "trainsup_checkpoint_age_seconds{run=\"r" + r + "\"}"), 199.0)
        << scrape;
    // The last SetSlot was i = 199: BUSY on GPU-1, the GPU-0 series gone.
    EXPECT_EQ(
        ValueOf(scrape, "trainsup_slot_state{gpu=\"GPU-1\",slot=\"" + r + "\",state=\"BUSY\"}"),
        1.0)
        << scrape;
  }
  EXPECT_FALSE(Contains(scrape, "GPU-0")) << scrape;
}

TEST(Metrics, RejectsNonLoopbackAddressUnlessAllowed) {
  for (const char* address : {"0.0.0.0:9464", "10.1.2.3:9464", "[::]:9464", "[2001:db8::1]:80",
                              "metrics.example.com:9464"}) {
    absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(address, false);
    ASSERT_FALSE(metrics.ok()) << address;
    EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_TRUE(Contains(std::string(metrics.status().message()), address)) << metrics.status();
  }
}

TEST(Metrics, RejectsMalformedAddressEvenWhenRemoteIsAllowed) {
  for (const char* address : {"9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:80s",
                              "bad_host!:80", "[::1:80", ":9464", "[nope]:80"}) {
    absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(address, true);
    ASSERT_FALSE(metrics.ok()) << address;
    EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument) << address;
  }
}

TEST(Metrics, ServesTheScrapeOverHttpOnLoopback) {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("127.0.0.1:0", false);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const int port = (*metrics)->port();
  ASSERT_GT(port, 0);
  (*metrics)->CountRestart("oom");
  (*metrics)->SetWorker("r9", 2, Sample(1));

  const std::string response = trainsup::testing::HttpGet(port, "/metrics");
  ASSERT_EQ(response.rfind("HTTP/1.", 0), 0u) << response;
  EXPECT_TRUE(Contains(response.substr(0, response.find('\n')), " 200")) << response;
  const std::string::size_type body_start = response.find("\r\n\r\n");
  ASSERT_NE(body_start, std::string::npos) << response;
  const std::string body = response.substr(body_start + 4);
  EXPECT_EQ(ValueOf(body, "trainsup_restarts_total{reason=\"oom\"}"), 1.0) << body;
  EXPECT_EQ(ValueOf(body, "trainsup_worker_step{rank=\"2\",run=\"r9\"}"), 100.0) << body;
}

TEST(Metrics, PortInUseIsUnavailable) {
  absl::StatusOr<std::unique_ptr<Metrics>> first = Metrics::Create("127.0.0.1:0", false);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  absl::StatusOr<std::unique_ptr<Metrics>> second = Metrics::Create(address, false);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

}  // namespace
}  // namespace trainsup::supervisor
