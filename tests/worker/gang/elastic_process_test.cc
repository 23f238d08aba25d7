// Elastic gangs in the real trainsup-worker (docs/distributed.md,
// "Elastic"): the training state of a checkpoint does not depend on the
// gang's size.
//  - A run whose gang changes size at every restart (3, 2, 1, then 3 again)
//    trains the same global batches, every sample once per epoch with the
//    same augmentation (from the rank-0 log of data.log_samples), and ends
//    with the weights of an uninterrupted gang of 3 within float32's
//    reduction-order noise (closer than a one-rank run, far closer than a
//    run that trained one batch wrong).
//  - A checkpoint in the format of before elastic gangs (a gang's cursor
//    counted within each rank's shard) resumes at its own world size
//    exactly where the same checkpoint in today's format does.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/file_system.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "contracts/free_port.h"
#include "nlohmann/json.hpp"
#include "tests/common/elastic_checks.h"
#include "tests/worker/worker_process.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;
using testing::WaitStatus;

// 9 synthetic rooms: 7 train, 2 validation. BatchNorm is synchronised:
// each rank normalising only its own share would make the step depend on
// how the batch is shared (docs/distributed.md, "Elastic"). train.batch_size = 2 with
// world_size = 3: a global batch of 6, so an epoch is a batch of 6 and one
// of 1 (at W = 3, two ranks have no share of the second).
std::string Spec(int world, int min_world, int steps, const std::string& testing) {
  std::ostringstream s;
  s << "name = \"elastic\"\nworld_size = " << world << "\nmin_world_size = " << min_world
    << "\n[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = 0.1\n"
    << "sync_batchnorm = true\n"
    << "[data]\nformat = \"synthetic\"\nscenes = 9\nscene_size = \"small\"\nlog_samples = true\n"
    << "[train]\nbatch_size = 2\nsteps = " << steps
    << "\ncheckpoint_every_steps = 2\ndeterministic = true\nthreads = 1\n"
    << testing;
  return s.str();
}

std::string MakeDir(const std::string& name) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("elastic_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Runs attempt `attempt` as a gang of `world` on `dir` and returns rank 0's
// log; every rank must exit with `want_exit`.
std::string RunGang(const std::string& dir, int attempt, int world, int want_exit) {
  const int port = FreeLoopbackPort();
  const std::vector<std::pair<std::string, std::string>> env = {
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < world; ++r) {
    logs.push_back(dir + "/attempt-" + std::to_string(attempt) + "-rank-" + std::to_string(r) +
                   ".log");
    pids.push_back(testing::LaunchRank(dir, attempt, r, world, "latest", env, logs.back()));
  }
  for (int r = 0; r < world; ++r) {
    const int status = WaitStatus(pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == want_exit)
        << "attempt " << attempt << " rank " << r << " of " << world << ": status " << status
        << "\n"
        << ReadFile(logs[r]);
  }
  return ReadFile(logs[0]);
}

std::map<std::string, at::Tensor> Weights(const std::string& dir, int step) {
  return trainsup::testing::ReadWeights(
      (fs::path(dir) / "checkpoints" / ("step-" + std::to_string(step)) / "model.safetensors")
          .string());
}

TEST(Elastic, AGangThatChangesSizeAtEveryRestartTrainsTheSameBatchesAsAnUninterruptedOne) {
  constexpr int kSteps = 8;
  // The uninterrupted gangs: 3 ranks (the reference) and 1 rank (the same
  // global batches, summed in another order).
  const std::string three = MakeDir("three");
  std::ofstream(three + "/spec.toml") << Spec(3, 1, kSteps, "");
  const std::string three_log = RunGang(three, 1, 3, 0);
  const std::string one = MakeDir("one");
  std::ofstream(one + "/spec.toml") << Spec(3, 1, kSteps, "");
  RunGang(one, 1, 1, 0);

  // The elastic run: 3 ranks to step 3 (checkpoint 2), 2 to step 5
  // (checkpoint 4), 1 to step 7 (checkpoint 6), 3 to the end. Each attempt
  // trains one step past its checkpoint and exits (exit_at_step), as a
  // rank lost mid-interval would, so the next repeats it.
  const std::string elastic = MakeDir("elastic");
  const int worlds[] = {3, 2, 1, 3};
  std::map<int, std::string> lines;
  for (int attempt = 1; attempt <= 4; ++attempt) {
    const int exit_at = attempt < 4 ? 2 * attempt + 1 : -1;
    std::ofstream(elastic + "/spec.toml") << Spec(
        3, 1, kSteps,
        exit_at < 0 ? ""
                    : "[testing]\nexit_at_step = " + std::to_string(exit_at) + "\nexit_code = 3\n");
    const std::string log = RunGang(elastic, attempt, worlds[attempt - 1], exit_at < 0 ? 0 : 3);
    if (attempt > 1) {
      EXPECT_NE(log.find("resumed from step " + std::to_string(2 * attempt - 2)), std::string::npos)
          << log;
    }
    // A later attempt's line for a step replaces the earlier one's (the
    // step after a checkpoint is trained again after the restart).
    trainsup::testing::AddSampleLines(log, &lines);
  }

  // The same global batch, sample for sample and augmentation seed for
  // augmentation seed, at every step; every training sample once an epoch.
  const std::map<int, std::string> want = trainsup::testing::SampleLines(three_log);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << three_log;
  EXPECT_EQ(lines, want);
  const std::map<int, std::vector<int>> per_epoch = trainsup::testing::SamplesPerEpoch(lines);
  ASSERT_EQ(per_epoch.size(), 4u);
  for (const auto& [epoch, samples] : per_epoch) {
    EXPECT_EQ(samples, (std::vector<int>{0, 1, 2, 3, 4, 5, 6})) << "epoch " << epoch;
  }

  // The weights. A gang of another size sums the same gradient in another
  // order, so float32 rounding differs from step to step, and training
  // amplifies it (in this short, steep run a 1e-5 difference in step 2's
  // loss grows to percents by step 8). Two bounds, both measured here:
  //  - the elastic run departs from the gang of 3 at step 3, a one-rank
  //    run at step 1: the elastic run's gap must not exceed the one rank's;
  //  - a run that trains one wrong batch (the gang of 3 skipping step 5's)
  //    must be at least 10 times further away than the elastic run, so the
  //    comparison tells a batch trained wrong, twice or not at all from
  //    rounding.
  const std::string skipped = MakeDir("skipped");
  std::ofstream(skipped + "/spec.toml")
      << std::regex_replace(Spec(3, 1, kSteps, ""), std::regex("log_samples = true\n"),
                            "log_samples = true\nskip_windows = [[5, 5]]\n");
  RunGang(skipped, 1, 3, 0);
  const auto ref = Weights(three, kSteps);
  const double one_gap = trainsup::testing::WeightsGap(Weights(one, kSteps), ref);
  const double elastic_gap = trainsup::testing::WeightsGap(Weights(elastic, kSteps), ref);
  const double skipped_gap = trainsup::testing::WeightsGap(Weights(skipped, kSteps), ref, false);
  std::printf(
      "largest |w - w_ref| / (1 + |w_ref|) at step %d against the uninterrupted gang of 3: "
      "elastic %.3g, one rank %.3g, one batch skipped %.3g\n",
      kSteps, elastic_gap, one_gap, skipped_gap);
  EXPECT_LE(elastic_gap, one_gap);
  EXPECT_GE(skipped_gap, 10 * elastic_gap);
  for (const std::string& d : {three, one, elastic, skipped}) fs::remove_all(d);
}

// Rewrites checkpoint `step` of `dir` (written by a gang of `world` ranks
// of per-rank batch `batch`) in the format of before elastic gangs: the
// trainer state's cursor within each rank's shard, "extra" with every
// rank's state, and the manifest's hash of trainer.json to match.
void RewriteAsBeforeElasticGangs(const std::string& dir, int step, int world) {
  const fs::path ckpt = fs::path(dir) / "checkpoints" / ("step-" + std::to_string(step));
  nlohmann::json trainer = nlohmann::json::parse(ReadFile(ckpt / "trainer.json"));
  nlohmann::json& extra = trainer["extra"];
  ASSERT_EQ(extra["format"], "trainsup-gang-state-1") << trainer.dump();
  const int64_t cursor = trainer["cursor"].get<int64_t>();
  ASSERT_EQ(cursor % world, 0) << "a global position the old shards could hold";
  trainer["cursor"] = cursor / world;
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    nlohmann::json counters = extra["counters"];
    if (r != 0) {
      for (const char* k : {"splits", "predicted_splits", "retries", "oom_events",
                            "wasted_forwards", "dropped_pieces", "dropped_voxels"}) {
        counters[k] = 0;
      }
    }
    std::vector<int64_t> classes = extra["class_counts"].get<std::vector<int64_t>>();
    if (r != 0) std::fill(classes.begin(), classes.end(), 0);
    ranks.push_back({{"rank", r},
                     {"epoch", trainer["epoch"]},
                     {"cursor", cursor / world},
                     {"memory_model", extra["memory_model"]},
                     {"counters", counters},
                     {"last_loss", extra["last_loss"]},
                     {"guard", extra["guard"]},
                     {"class_counts", classes},
                     {"cpu_rng_state", trainer.value("cpu_rng_state", std::string())}});
  }
  trainer["extra"] = {
      {"num_classes", extra["num_classes"]}, {"world_size", world}, {"ranks", ranks}};
  const std::string text = trainer.dump();
  std::ofstream(ckpt / "trainer.json", std::ios::trunc) << text;
  nlohmann::json manifest = nlohmann::json::parse(ReadFile(ckpt / "MANIFEST.json"));
  ckpt::Hasher h;
  h.Update(text);
  bool found = false;
  for (nlohmann::json& f : manifest["files"]) {
    if (f["name"] == "trainer.json") {
      f["size"] = text.size();
      f["xxh3_128"] = h.HexDigest();
      found = true;
    }
  }
  ASSERT_TRUE(found) << manifest.dump();
  std::ofstream(ckpt / "MANIFEST.json", std::ios::trunc) << manifest.dump();
}

TEST(Elastic, ACheckpointFromBeforeElasticGangsResumesAtItsOwnWorldSize) {
  // A gang of 2 (global batch 4: the old shards' first batches are the
  // same samples) stopped after step 1's checkpoint.
  auto spec = [](const std::string& testing) {
    std::string s = Spec(2, 2, 3, testing);
    return std::regex_replace(s, std::regex("checkpoint_every_steps = 2"),
                              "checkpoint_every_steps = 1");
  };
  const std::string today = MakeDir("today");
  std::ofstream(today + "/spec.toml") << spec("[testing]\nexit_at_step = 2\nexit_code = 3\n");
  RunGang(today, 1, 2, 3);
  const std::string old = MakeDir("old");
  fs::copy(today, old, fs::copy_options::recursive);
  for (const fs::path& d : {fs::path(today), fs::path(old)}) {
    for (const auto& e : fs::directory_iterator(d / "checkpoints")) {
      if (e.path().filename() != "step-1") fs::remove_all(e.path());
    }
  }
  RewriteAsBeforeElasticGangs(old, 1, 2);
  for (const std::string& d : {today, old}) {
    std::ofstream(d + "/spec.toml", std::ios::trunc) << spec("");
  }
  RunGang(today, 2, 2, 0);
  const std::string log = RunGang(old, 2, 2, 0);
  EXPECT_NE(log.find("checkpoint of a gang of 2 from before elastic gangs: its position is "
                     "epoch 0, scene 4"),
            std::string::npos)
      << log;
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "trainer.json"}) {
    const std::string a = ReadFile(fs::path(today) / "checkpoints/step-3" / file);
    ASSERT_FALSE(a.empty()) << file;
    EXPECT_TRUE(a == ReadFile(fs::path(old) / "checkpoints/step-3" / file)) << file << " differs";
  }
  for (const std::string& d : {today, old}) fs::remove_all(d);
}

}  // namespace
}  // namespace trainsup::worker
