// Training metrics in /metrics, read back through a real Prometheus (issue
// 43): the real trainsupd runs the real trainsup-worker under a memory
// budget that makes every step run out of memory and split; Debian's
// prometheus (/usr/bin/prometheus, installed by deploy/bootstrap.sh)
// scrapes the daemon every second; every query of the Grafana dashboard's
// "Learning" row (deploy/grafana/trainsup-dashboard.json) is then asked of
// that Prometheus over the run's time and must return the run's figures:
// loss, learning rate, validation mIoU, splits, out-of-memory retries and
// the seconds they wasted, and steps by outcome.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

namespace fs = std::filesystem;

constexpr char kPrometheus[] = "/usr/bin/prometheus";

double NowS() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// A real Prometheus on a free loopback port, scraping 127.0.0.1:`target`
// every second, its data under `dir`; killed with the test.
class PrometheusServer {
 public:
  ::testing::AssertionResult Start(const std::string& dir, int target) {
    fs::create_directories(dir + "/data");
    const std::string config = dir + "/prometheus.yml";
    std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          << "scrape_configs:\n  - job_name: trainsupd\n    static_configs:\n"
                          << "      - targets: ['127.0.0.1:" << target << "']\n";
    port_ = FreeLoopbackPort();
    pid_ = SpawnProcess(
        {kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + dir + "/data",
         "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--log.level=warn"},
        TestEnvironment({}), dir + "/prometheus.log", dir + "/prometheus.log");
    if (pid_ <= 0) return ::testing::AssertionFailure() << "could not start " << kPrometheus;
    if (!Eventually([&] { return HttpGet(port_, "/-/ready").find(" 200 ") != std::string::npos; },
                    Seconds(60), std::chrono::milliseconds(200))) {
      return ::testing::AssertionFailure() << "prometheus did not get ready: " << dir;
    }
    return ::testing::AssertionSuccess();
  }
  ~PrometheusServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // /api/v1/query_range of `expr` from `start_s` to now, step 1 s: the
  // "result" array (one entry a series, its "values" [[t, "v"], ...]), or
  // null on any error.
  nlohmann::json QueryRange(const std::string& expr, double start_s) const {
    const std::string path = "/api/v1/query_range?query=" + UrlEncode(expr) +
                             "&start=" + std::to_string(start_s) +
                             "&end=" + std::to_string(NowS()) + "&step=1";
    const std::string response = HttpGet(port_, path);
    const size_t body = response.find("\r\n\r\n");
    if (body == std::string::npos) return nullptr;
    nlohmann::json j = nlohmann::json::parse(response.substr(body + 4), nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return nullptr;
    return j["data"]["result"];
  }

 private:
  int port_ = 0;
  int pid_ = -1;
};

// The real worker on the synthetic rooms at a fine voxel size, batch 4, no
// checkpoints: `extra` lines go into [train].
std::string LearningSpec(const std::string& name, int steps, const std::string& extra) {
  std::ostringstream s;
  s << "name = \"" << name << "\"\nworld_size = 1\n"
    << "[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = 0.05\n"
    << "[data]\nformat = \"synthetic\"\nscenes = 12\nscene_size = \"small\"\nval_fraction = 0.25\n"
    << "[train]\nbatch_size = 4\nsteps = " << steps << "\ncheckpoint_every_steps = 0\nthreads = 1\n"
    << extra << "\n[optimizer]\nlr = 0.05\n[guard]\nfail_below_baseline = false\n";
  return s.str();
}

// The queries of the dashboard's "Learning" row, by panel title.
std::map<std::string, std::vector<std::string>> LearningQueries() {
  std::ifstream in(TRAINSUP_DASHBOARD);
  nlohmann::json d = nlohmann::json::parse(in, nullptr, false);
  std::map<std::string, std::vector<std::string>> out;
  if (d.is_discarded()) return out;
  bool in_row = false;
  for (const nlohmann::json& p : d["panels"]) {
    if (p.value("type", "") == "row") {
      in_row = p.value("title", "") == "Learning";
      continue;
    }
    if (!in_row) continue;
    for (const nlohmann::json& t : p["targets"]) out[p["title"]].push_back(t["expr"]);
  }
  return out;
}

std::string Substitute(std::string expr, const std::string& run) {
  for (const auto& [var, value] :
       {std::pair<std::string, std::string>{"$instance", ".*"}, {"$run", run}}) {
    for (size_t at = expr.find(var); at != std::string::npos; at = expr.find(var, at)) {
      expr.replace(at, var.size(), value);
      at += value.size();
    }
  }
  return expr;
}

// The largest value of any series in a query_range result; -inf for none.
double MaxOf(const nlohmann::json& result) {
  double best = -INFINITY;
  if (!result.is_array()) return best;
  for (const nlohmann::json& series : result) {
    for (const nlohmann::json& v : series["values"]) {
      best = std::max(best, std::stod(v[1].get<std::string>()));
    }
  }
  return best;
}

TEST(TrainingMetrics, ARealPrometheusChartsTheDashboardsLearningRow) {
  ASSERT_TRUE(fs::exists(kPrometheus)) << kPrometheus << " is missing: deploy/bootstrap.sh "
                                       << "installs Debian's prometheus package";
  DaemonHarness h;
  UseRealWorker(h, 1);
  const int metrics_port = FreeLoopbackPort();
  h.Set("daemon.metrics_address", "\"127.0.0.1:" + std::to_string(metrics_port) + "\"");
  ASSERT_TRUE(h.Start());
  PrometheusServer prometheus;
  ASSERT_TRUE(prometheus.Start(h.dir() + "/prometheus", metrics_port));
  const double start_s = NowS() - 5;

  // A probe without a budget: what stays between steps, and the peak.
  const std::string probe = h.Submit(LearningSpec("probe", 2, ""));
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(probe, Seconds(300), &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  int64_t peak = 0, kept = 0;
  for (const v1::Attempt& a : run.attempts()) {
    for (const v1::RankStatus& r : a.ranks()) {
      peak = std::max(peak, r.progress().memory_peak_bytes());
      kept = std::max(kept, r.progress().memory_current_bytes());
    }
  }
  peak = std::max(peak, run.progress().memory_peak_bytes());
  ASSERT_GT(kept, 0);
  ASSERT_GT(peak, kept);
  // Halfway between: every whole batch runs out of memory and splits
  // (reactively: predictive_split off), and no piece needs dropping.
  const int64_t budget_mb = (kept + (peak - kept) / 2) >> 20;
  std::printf("probe: %lld MiB kept between steps, peak %lld MiB: budget %lld MiB\n",
              static_cast<long long>(kept >> 20), static_cast<long long>(peak >> 20),
              static_cast<long long>(budget_mb));
  const std::string id =
      h.Submit(LearningSpec("learning", 12,
                            "memory_budget_mb = " + std::to_string(budget_mb) +
                                "\npredictive_split = false\neval_every_steps = 4"));
  ASSERT_TRUE(h.WaitForEnd(id, Seconds(400), &run));
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  const v1::Progress& p = run.progress();
  std::printf("the run: %lld splits, %lld out-of-memory retries, %.3f s wasted, val mIoU %.3f\n",
              static_cast<long long>(p.splits()), static_cast<long long>(p.oom_retries()),
              p.oom_wasted_seconds(), p.val_miou());
  ASSERT_GT(p.oom_retries(), 0) << "the budget must make the steps run out of memory";

  const std::map<std::string, std::vector<std::string>> queries = LearningQueries();
  ASSERT_EQ(queries.size(), 6u) << "the dashboard's Learning row has six panels";
  // Scrapes are a second apart, and the worker's series go with it: each
  // query must have seen them while it ran.
  std::map<std::string, double> seen;
  ASSERT_TRUE(Eventually(
      [&] {
        for (const auto& [title, exprs] : queries) {
          double best = -INFINITY;
          for (const std::string& e : exprs) {
            best = std::max(best, MaxOf(prometheus.QueryRange(Substitute(e, id), start_s)));
          }
          seen[title] = best;
        }
        return seen["Seconds lost to out-of-memory errors"] > 0;
      },
      Seconds(30), std::chrono::milliseconds(500)));
  for (const auto& [title, value] : seen) std::printf("  %s: max %g\n", title.c_str(), value);
  EXPECT_GT(seen["Loss"], 0);
  EXPECT_TRUE(std::isfinite(seen["Loss"]));
  EXPECT_GT(seen["Learning rate"], 0);
  EXPECT_LE(seen["Learning rate"], 0.05);
  EXPECT_GE(seen["Validation mIoU"], 0);
  EXPECT_LE(seen["Validation mIoU"], 1);
  EXPECT_GT(seen["Out-of-memory splits and retries"], 0);
  EXPECT_GT(seen["Seconds lost to out-of-memory errors"], 0);
  EXPECT_GE(seen["Steps by outcome"], 1);
  // The probe ran without a budget: none of its series shows a retry.
  EXPECT_EQ(
      MaxOf(prometheus.QueryRange("trainsup_worker_oom_retries{run=\"" + probe + "\"}", start_s)),
      0);
}

}  // namespace
}  // namespace trainsup::integration
