#include "worker/split/split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace trainsup::worker {
namespace {

// A scene that owns its arrays. Every third voxel is unlabelled, so labelled
// and voxel counts differ.
struct OwnedScene {
  std::vector<int32_t> xyz;
  std::vector<uint8_t> labelled;
  void Add(int32_t x, int32_t y, int32_t z) {
    xyz.insert(xyz.end(), {x, y, z});
    labelled.push_back(labelled.size() % 3 == 0 ? 0 : 1);
  }
  int64_t n() const { return static_cast<int64_t>(labelled.size()); }
  SceneView view() const { return {xyz.data(), n(), labelled.data()}; }
};

OwnedScene Grid(int nx, int ny, int nz, int x0 = 0) {
  OwnedScene scene;
  for (int x = 0; x < nx; ++x)
    for (int y = 0; y < ny; ++y)
      for (int z = 0; z < nz; ++z) scene.Add(x0 + x, y, z);
  return scene;
}

std::vector<SceneView> Views(const std::vector<OwnedScene>& scenes) {
  std::vector<SceneView> views;
  for (const OwnedScene& s : scenes) views.push_back(s.view());
  return views;
}

std::vector<int64_t> Rows(const Piece& piece) {
  if (!piece.all) return piece.rows;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < piece.voxels; ++i) rows.push_back(i);
  return rows;
}

struct Call {
  Group group;
  double weight;
  bool ok;
};

// Runs groups against a simulated memory: out of memory when the simulated
// peak exceeds the budget. Records calls and frees in order.
struct FakeTrainer {
  FakeTrainer(SimulatedMemory memory, int64_t budget) : memory(std::move(memory)), budget(budget) {}

  SimulatedMemory memory;
  int64_t budget;
  std::vector<Call> calls;
  std::vector<std::string> events;

  RunGroup Run() {
    return [this](const Group& group, double weight) {
      const bool ok = memory.Peak(group) <= budget;
      calls.push_back({group, weight, ok});
      events.push_back("run");
      return ok ? absl::OkStatus() : absl::ResourceExhaustedError("simulated out of memory");
    };
  }
  std::function<void()> Free() {
    return [this] { events.push_back("free"); };
  }
  double SuccessfulWeight() const {
    double sum = 0;
    for (const Call& c : calls) sum += c.ok ? c.weight : 0.0;
    return sum;
  }
  // How often each row of each scene was in a successful call.
  std::vector<std::vector<int>> Coverage(const std::vector<OwnedScene>& scenes) const {
    std::vector<std::vector<int>> cover;
    for (const OwnedScene& s : scenes) cover.emplace_back(static_cast<size_t>(s.n()), 0);
    for (const Call& c : calls) {
      if (!c.ok) continue;
      for (const Piece& p : c.group) {
        for (int64_t row : Rows(p)) ++cover[static_cast<size_t>(p.scene)][static_cast<size_t>(row)];
      }
    }
    return cover;
  }
};

void ExpectCoveredOnce(const std::vector<std::vector<int>>& cover,
                       std::set<int> missing_scenes = {}) {
  for (size_t s = 0; s < cover.size(); ++s) {
    const int want = missing_scenes.count(static_cast<int>(s)) ? 0 : 1;
    for (size_t r = 0; r < cover[s].size(); ++r) {
      ASSERT_EQ(cover[s][r], want) << "scene " << s << " row " << r;
    }
  }
}

int64_t Labelled(const OwnedScene& s, const std::vector<int64_t>& rows) {
  int64_t n = 0;
  for (int64_t r : rows) n += s.labelled[static_cast<size_t>(r)];
  return n;
}

// --- BisectPiece -------------------------------------------------------------

TEST(BisectPiece, SplitsAtTheMedianOfTheLongestAxis) {
  const OwnedScene scene = Grid(4, 12, 3);  // longest extent: y
  const auto [first, second] = BisectPiece(WholeScene(0, scene.view()), scene.view());
  EXPECT_EQ(first.voxels, 72);
  EXPECT_EQ(second.voxels, 72);
  EXPECT_FALSE(first.all);
  EXPECT_EQ(first.depth, 1);
  for (int64_t r : first.rows) EXPECT_LE(scene.xyz[3 * r + 1], 5);
  for (int64_t r : second.rows) EXPECT_GE(scene.xyz[3 * r + 1], 6);
  EXPECT_EQ(first.labelled, Labelled(scene, first.rows));
  EXPECT_EQ(second.labelled, Labelled(scene, second.rows));
  EXPECT_EQ(first.labelled + second.labelled, WholeScene(0, scene.view()).labelled);
}

TEST(BisectPiece, PartitionsTheRowsOfASubPiece) {
  const OwnedScene scene = Grid(9, 5, 7);
  const auto halves = BisectPiece(WholeScene(0, scene.view()), scene.view());
  const Piece& piece = halves.second;
  const auto [a, b] = BisectPiece(piece, scene.view());
  EXPECT_EQ(a.depth, 2);
  EXPECT_FALSE(a.rows.empty());
  EXPECT_FALSE(b.rows.empty());
  EXPECT_TRUE(std::is_sorted(a.rows.begin(), a.rows.end()));
  EXPECT_TRUE(std::is_sorted(b.rows.begin(), b.rows.end()));
  std::vector<int64_t> joined = a.rows;
  joined.insert(joined.end(), b.rows.begin(), b.rows.end());
  std::sort(joined.begin(), joined.end());
  EXPECT_EQ(joined, piece.rows);
  EXPECT_EQ(a.voxels + b.voxels, piece.voxels);
  EXPECT_EQ(a.labelled + b.labelled, piece.labelled);
}

TEST(BisectPiece, BreaksTiesAtTheMedianSoBothHalvesAreBalanced) {
  OwnedScene scene;
  for (int32_t x : {1, 0, 0, 1, 0, 0, 0, 1, 0, 0}) scene.Add(x, 0, 0);
  const auto [first, second] = BisectPiece(WholeScene(0, scene.view()), scene.view());
  EXPECT_EQ(first.rows, (std::vector<int64_t>{1, 2, 4, 5, 6}));
  EXPECT_EQ(second.rows, (std::vector<int64_t>{0, 3, 7, 8, 9}));
}

TEST(BisectPiece, IdenticalPointsSplitByRowOrder) {
  OwnedScene scene;
  for (int i = 0; i < 7; ++i) scene.Add(3, 3, 3);
  const auto [first, second] = BisectPiece(WholeScene(0, scene.view()), scene.view());
  EXPECT_EQ(first.rows, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(second.rows, (std::vector<int64_t>{3, 4, 5, 6}));

  OwnedScene pair;
  pair.Add(5, 5, 5);
  pair.Add(5, 5, 5);
  const auto [one, other] = BisectPiece(WholeScene(0, pair.view()), pair.view());
  EXPECT_EQ(one.rows, (std::vector<int64_t>{0}));
  EXPECT_EQ(other.rows, (std::vector<int64_t>{1}));

  OwnedScene single;
  single.Add(1, 2, 3);
  const auto [none, all] = BisectPiece(WholeScene(0, single.view()), single.view());
  EXPECT_EQ(none.voxels, 0);
  EXPECT_EQ(all.rows, (std::vector<int64_t>{0}));
}

// --- RunSplitting -------------------------------------------------------------

TEST(RunSplitting, BatchThatFitsRunsOnceWithWeightOne) {
  const std::vector<OwnedScene> scenes = {Grid(5, 5, 5), Grid(4, 4, 4)};
  FakeTrainer trainer{{0, 1, {}}, 1000};
  auto stats = RunSplitting(Views(scenes), {}, trainer.Run(), trainer.Free(), nullptr, 1000);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(trainer.calls.size(), 1u);
  EXPECT_EQ(trainer.calls[0].group.size(), 2u);
  EXPECT_TRUE(trainer.calls[0].group[0].all);
  EXPECT_DOUBLE_EQ(trainer.calls[0].weight, 1.0);
  EXPECT_EQ(stats->forwards, 1);
  EXPECT_EQ(stats->splits, 0);
  EXPECT_EQ(stats->oom_events, 0);
  EXPECT_EQ(trainer.events, (std::vector<std::string>{"run"}));
}

TEST(RunSplitting, SplitsByScenesThenBisectsAndCoversEveryVoxelOnce) {
  const std::vector<OwnedScene> scenes = {Grid(10, 10, 10), Grid(10, 6, 10), Grid(10, 4, 10)};
  FakeTrainer trainer{{0, 1, {}}, 700};
  auto stats = RunSplitting(Views(scenes), {}, trainer.Run(), trainer.Free(), nullptr, 700);
  ASSERT_TRUE(stats.ok()) << stats.status();

  // 1: all scenes (2000 voxels) fails; 2: scene 0 alone fails; 3, 4: its
  // halves; the group {1, 2} is as large as scene 0 was, so it is cut
  // without a forward pass; 5, 6: scenes 1 and 2.
  ASSERT_EQ(trainer.calls.size(), 6u);
  EXPECT_EQ(trainer.calls[0].group.size(), 3u);
  EXPECT_FALSE(trainer.calls[0].ok);
  ASSERT_EQ(trainer.calls[1].group.size(), 1u);
  EXPECT_TRUE(trainer.calls[1].group[0].all);
  EXPECT_EQ(trainer.calls[1].group[0].scene, 0);
  EXPECT_FALSE(trainer.calls[1].ok);
  for (int i : {2, 3}) {
    EXPECT_FALSE(trainer.calls[i].group[0].all);
    EXPECT_EQ(trainer.calls[i].group[0].depth, 1);
    EXPECT_EQ(trainer.calls[i].group[0].voxels, 500);
  }
  int32_t first_max_x = 0, second_min_x = 1 << 30;
  for (int64_t r : trainer.calls[2].group[0].rows)
    first_max_x = std::max(first_max_x, scenes[0].xyz[3 * r]);
  for (int64_t r : trainer.calls[3].group[0].rows)
    second_min_x = std::min(second_min_x, scenes[0].xyz[3 * r]);
  EXPECT_LT(first_max_x, second_min_x);
  EXPECT_EQ(trainer.calls[4].group[0].scene, 1);
  EXPECT_EQ(trainer.calls[5].group[0].scene, 2);

  EXPECT_NEAR(trainer.SuccessfulWeight(), 1.0, 1e-12);
  ExpectCoveredOnce(trainer.Coverage(scenes));
  EXPECT_EQ(stats->forwards, 6);
  EXPECT_EQ(stats->oom_events, 2);
  EXPECT_EQ(stats->wasted_forwards, 2);
  EXPECT_EQ(stats->splits, 3);
  EXPECT_EQ(stats->retries, 5);
  EXPECT_EQ(stats->dropped_pieces, 0);
  EXPECT_EQ(stats->predicted_splits, 0);
  EXPECT_EQ(trainer.events,
            (std::vector<std::string>{"run", "free", "run", "free", "run", "run", "run", "run"}));
}

TEST(RunSplitting, OtherErrorsReturnOnTheFirstTryWithoutSplitting) {
  const std::vector<OwnedScene> scenes = {Grid(10, 10, 10), Grid(3, 3, 3)};
  int calls = 0, frees = 0;
  auto stats = RunSplitting(
      Views(scenes), {},
      [&](const Group&, double) {
        ++calls;
        return absl::InvalidArgumentError("shape mismatch in layer 3");
      },
      [&] { ++frees; }, nullptr, 1);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stats.status().message(), "shape mismatch in layer 3");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(frees, 0);
}

TEST(RunSplitting, ADenseSceneBelowTheFloorIsDroppedAndReported) {
  const std::vector<OwnedScene> scenes = {Grid(10, 10, 3), Grid(10, 10, 8), Grid(10, 10, 3)};
  FakeTrainer trainer{{0, 1, {1.0, 100.0, 1.0}}, 1000};
  auto stats = RunSplitting(Views(scenes), {}, trainer.Run(), trainer.Free(), nullptr, 1000);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->dropped_pieces, 2);
  EXPECT_EQ(stats->dropped_voxels, 800);
  const int64_t dense_labelled = WholeScene(1, scenes[1].view()).labelled;
  EXPECT_EQ(stats->dropped_labelled, dense_labelled);
  ASSERT_EQ(stats->drop_reasons.size(), 2u);
  EXPECT_NE(stats->drop_reasons[0].find("scene 1"), std::string::npos) << stats->drop_reasons[0];
  EXPECT_NE(stats->drop_reasons[0].find("floor"), std::string::npos) << stats->drop_reasons[0];
  // The other two scenes still ran, together.
  ASSERT_FALSE(trainer.calls.empty());
  const Call& last = trainer.calls.back();
  EXPECT_TRUE(last.ok);
  EXPECT_EQ(last.group.size(), 2u);
  ExpectCoveredOnce(trainer.Coverage(scenes), {1});
  int64_t total = 0;
  for (size_t i = 0; i < scenes.size(); ++i)
    total += WholeScene(static_cast<int>(i), scenes[i].view()).labelled;
  EXPECT_NEAR(trainer.SuccessfulWeight(), 1.0 - static_cast<double>(dense_labelled) / total, 1e-12);
  EXPECT_EQ(stats->oom_events, 4);
}

TEST(RunSplitting, RepeatedFailureBeyondTheLimitIsAHardOom) {
  const std::vector<OwnedScene> scenes = {Grid(20, 20, 20)};
  FakeTrainer trainer{{0, 1, {}}, 0};
  SplitOptions options;
  options.max_ooms_per_batch = 5;
  auto stats = RunSplitting(Views(scenes), options, trainer.Run(), trainer.Free(), nullptr, 0);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(stats.status().message()).find("hard out-of-memory"), std::string::npos);
  EXPECT_EQ(trainer.calls.size(), 6u);
}

TEST(RunSplitting, BatchWithoutLabelsGetsZeroWeights) {
  OwnedScene scene = Grid(3, 3, 3);
  std::fill(scene.labelled.begin(), scene.labelled.end(), 0);
  FakeTrainer trainer{{0, 1, {}}, 1000};
  auto stats = RunSplitting({scene.view()}, {}, trainer.Run(), trainer.Free(), nullptr, 1000);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(trainer.calls.size(), 1u);
  EXPECT_EQ(trainer.calls[0].weight, 0.0);
}

// --- Predictive splitting ------------------------------------------------------

MemoryModel TrainedModel(const SimulatedMemory& memory) {
  MemoryModel model;
  OwnedScene unit;
  unit.Add(0, 0, 0);
  for (int64_t v = 100; v <= 1000; v += 100) {
    Piece piece = WholeScene(0, unit.view());
    piece.voxels = v;
    model.Observe(v, -1, memory.Peak({piece}));
  }
  return model;
}

TEST(RunSplitting, PredictedOverflowIsSplitUpFrontWithoutWastedForwards) {
  const SimulatedMemory memory{1000, 10, {}};
  const MemoryModel model = TrainedModel(memory);
  ASSERT_TRUE(model.ready());
  const std::vector<OwnedScene> scenes = {Grid(15, 10, 10), Grid(10, 6, 10), Grid(10, 6, 10)};

  FakeTrainer trainer{memory, 10000};
  auto stats = RunSplitting(Views(scenes), {}, trainer.Run(), trainer.Free(), &model, 10000);
  ASSERT_TRUE(stats.ok()) << stats.status();
  // Scene 0 (1500 voxels) is bisected; the pieces 750, 750, 600, 600 each
  // need their own group under 0.9 of the budget.
  EXPECT_EQ(stats->predicted_splits, 4);
  EXPECT_EQ(stats->splits, 4);
  EXPECT_EQ(stats->wasted_forwards, 0);
  EXPECT_EQ(stats->oom_events, 0);
  EXPECT_EQ(stats->forwards, 4);
  EXPECT_NEAR(trainer.SuccessfulWeight(), 1.0, 1e-12);
  ExpectCoveredOnce(trainer.Coverage(scenes));

  FakeTrainer reactive{memory, 10000};
  auto reactive_stats =
      RunSplitting(Views(scenes), {}, reactive.Run(), reactive.Free(), nullptr, 10000);
  ASSERT_TRUE(reactive_stats.ok());
  EXPECT_GT(reactive_stats->wasted_forwards, 0);
  ExpectCoveredOnce(reactive.Coverage(scenes));
}

TEST(PlanGroups, PacksSmallScenesTogetherAndIgnoresAnUnreadyModel) {
  const SimulatedMemory memory{1000, 10, {}};
  const MemoryModel model = TrainedModel(memory);
  const std::vector<OwnedScene> scenes = {Grid(5, 5, 4), Grid(5, 5, 4), Grid(5, 5, 4)};
  SplitStats stats;
  auto groups = PlanGroups(Views(scenes), model, 10000, {}, &stats);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].size(), 3u);
  EXPECT_EQ(stats.predicted_splits, 0);

  groups = PlanGroups(Views(scenes), MemoryModel(), 1, {}, &stats);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].size(), 3u);
  EXPECT_EQ(stats.splits, 0);
}

// --- MemoryModel ---------------------------------------------------------------

TEST(MemoryModel, NotReadyBeforeEnoughDistinctObservations) {
  MemoryModel model;
  for (int i = 1; i < MemoryModel::kMinObservations; ++i) model.Observe(100 * i, -1, 1000 * i);
  EXPECT_FALSE(model.ready());
  model.Observe(5000, -1, 50000);
  EXPECT_TRUE(model.ready());

  MemoryModel same;
  for (int i = 0; i < 20; ++i) same.Observe(100, -1, 1000);
  EXPECT_FALSE(same.ready());
  same.Observe(0, -1, 10);  // ignored
  EXPECT_EQ(same.observations(), 20);
}

TEST(MemoryModel, FitsLinearDataWithVoxelsAndPairs) {
  MemoryModel model;
  for (int i = 1; i <= 30; ++i) {
    const int64_t v = 100 * i;
    const int64_t p = 7 * v + (i % 3) * 50;
    model.Observe(v, p, 5000 + 12 * v + 3 * p);
  }
  ASSERT_TRUE(model.ready());
  EXPECT_NEAR(model.Predict(5000, 40000), 5000 + 12 * 5000 + 3 * 40000, 2);
  EXPECT_NEAR(model.Predict(200, 100), 5000 + 12 * 200 + 3 * 100, 2);
}

TEST(MemoryModel, FitsVoxelsAloneWhenPairsAreUnknown) {
  MemoryModel model;
  for (int i = 1; i <= 10; ++i) model.Observe(1000 * i, -1, (1 << 20) + 64 * 1000 * i);
  ASSERT_TRUE(model.ready());
  EXPECT_NEAR(model.Predict(50000), (1 << 20) + 64 * 50000, 2);
}

TEST(MemoryModel, MarginCoversNoisyObservations) {
  MemoryModel model;
  std::vector<std::pair<int64_t, int64_t>> seen;
  uint32_t state = 12345;
  for (int i = 0; i < 200; ++i) {
    state = state * 1664525u + 1013904223u;
    const int64_t v = 100 + (state >> 8) % 10000;
    state = state * 1664525u + 1013904223u;
    const int64_t noise = static_cast<int64_t>((state >> 8) % 2001) - 1000;
    const int64_t peak = 20000 + 8 * v + noise;
    model.Observe(v, -1, peak);
    seen.push_back({v, peak});
  }
  int covered = 0;
  for (const auto& [v, peak] : seen) covered += model.Predict(v) >= peak ? 1 : 0;
  EXPECT_GE(covered, 190);
  EXPECT_GT(model.Predict(5000), 20000 + 8 * 5000);
}

TEST(MemoryModel, HistoryIsBoundedAndFollowsRecentData) {
  MemoryModel model(16);
  for (int i = 1; i <= 100; ++i) model.Observe(100 * i, -1, 100 * 100 * i);
  for (int i = 1; i <= 16; ++i) model.Observe(100 * i, -1, 1000 + 10 * 100 * i);
  EXPECT_EQ(model.observations(), 16);
  EXPECT_NEAR(model.Predict(10000), 1000 + 10 * 10000, 2);
}

TEST(MemoryModel, SerializeRoundTrip) {
  MemoryModel model(32);
  for (int i = 1; i <= 40; ++i) model.Observe(37 * i, i % 4 == 0 ? -1 : 5 * i, 900 + 17 * i * i);
  const std::string text = model.Serialize();
  auto back = MemoryModel::Deserialize(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), text);
  EXPECT_EQ(back->observations(), 32);
  EXPECT_EQ(back->ready(), model.ready());
  for (int64_t v : {1, 100, 1000, 123456}) {
    EXPECT_EQ(back->Predict(v), model.Predict(v));
    EXPECT_EQ(back->Predict(v, 3 * v), model.Predict(v, 3 * v));
  }
  auto empty = MemoryModel::Deserialize(MemoryModel().Serialize());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->observations(), 0);
}

TEST(MemoryModel, DeserializeRejectsMalformedText) {
  for (const std::string text :
       {"", "garbage", "trainsup.worker.MemoryModel 2\ncapacity 4\nobservations 0\n",
        "trainsup.worker.MemoryModel 1\ncapacity 0\nobservations 0\n",
        "trainsup.worker.MemoryModel 1\ncapacity 2\nobservations 3\n1 -1 1\n2 -1 2\n3 -1 3\n",
        "trainsup.worker.MemoryModel 1\ncapacity 4\nobservations 2\n1 -1 1\n",
        "trainsup.worker.MemoryModel 1\ncapacity 4\nobservations 1\n0 -1 1\n",
        "trainsup.worker.MemoryModel 1\ncapacity 4\nobservations 1\n1 -1 1\nextra\n"}) {
    auto model = MemoryModel::Deserialize(text);
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

// --- Baseline ------------------------------------------------------------------

TEST(RunBaselineSplitting, HalvesAtTheMidpointAlternatingXThenY) {
  const std::vector<OwnedScene> scenes = {Grid(40, 40, 1)};
  FakeTrainer trainer{{0, 1, {}}, 400};
  auto stats = RunBaselineSplitting(Views(scenes), trainer.Run(), trainer.Free(), 100);
  ASSERT_TRUE(stats.ok());
  ASSERT_GE(trainer.calls.size(), 3u);
  auto range = [&](const Piece& p, int axis) {
    int32_t lo = 1 << 30, hi = -1;
    for (int64_t r : Rows(p)) {
      lo = std::min(lo, scenes[0].xyz[3 * r + axis]);
      hi = std::max(hi, scenes[0].xyz[3 * r + axis]);
    }
    return std::make_pair(lo, hi);
  };
  const Piece& depth1 = trainer.calls[1].group[0];
  EXPECT_EQ(range(depth1, 0), std::make_pair(0, 19));
  EXPECT_EQ(range(depth1, 1), std::make_pair(0, 39));
  EXPECT_FALSE(trainer.calls[1].ok);
  const Piece& depth2 = trainer.calls[2].group[0];
  EXPECT_EQ(range(depth2, 0), std::make_pair(0, 19));
  EXPECT_EQ(range(depth2, 1), std::make_pair(0, 19));
  EXPECT_TRUE(trainer.calls[2].ok);
  EXPECT_EQ(stats->dropped_pieces, 0);
  EXPECT_NEAR(trainer.SuccessfulWeight(), 1.0, 1e-12);
  ExpectCoveredOnce(trainer.Coverage(scenes));
}

TEST(RunBaselineSplitting, SilentlyDropsHalvesUnderTheFloorWhereOursDropsNothing) {
  // A dense block and a sparse strip far away: the midpoint cut leaves the
  // strip (300 points) alone in a half, under the 500-point floor.
  OwnedScene scene = Grid(10, 10, 10);
  for (int x = 90; x < 100; ++x)
    for (int y = 0; y < 30; ++y) scene.Add(x, y, 0);
  const std::vector<OwnedScene> scenes = {scene};

  FakeTrainer baseline{{0, 1, {}}, 1000};
  auto stats = RunBaselineSplitting(Views(scenes), baseline.Run(), baseline.Free());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->dropped_pieces, 1);
  EXPECT_EQ(stats->dropped_voxels, 300);
  EXPECT_TRUE(stats->drop_reasons.empty());
  EXPECT_LT(baseline.SuccessfulWeight(), 1.0 - 1e-9);

  FakeTrainer ours{{0, 1, {}}, 1000};
  auto our_stats = RunSplitting(Views(scenes), {}, ours.Run(), ours.Free(), nullptr, 1000);
  ASSERT_TRUE(our_stats.ok());
  EXPECT_EQ(our_stats->dropped_voxels, 0);
  ExpectCoveredOnce(ours.Coverage(scenes));
}

TEST(SimulatedMemory, AddsFixedAndScaledPerVoxelBytes) {
  const OwnedScene a = Grid(2, 2, 2), b = Grid(3, 1, 1);
  const SimulatedMemory memory{100, 4, {1.0, 2.5}};
  EXPECT_EQ(memory.Peak({WholeScene(0, a.view()), WholeScene(1, b.view())}), 100 + 4 * 8 + 30);
  EXPECT_EQ(memory.Peak({}), 100);
}

}  // namespace
}  // namespace trainsup::worker

namespace trainsup::worker {
namespace {

TEST(MemoryModel, RemembersTheSmallestFailureAcrossBatches) {
  MemoryModel model;
  EXPECT_EQ(model.min_failed_voxels(), 0);
  model.ObserveFailure(5000);
  model.ObserveFailure(8000);  // larger: changes nothing
  model.ObserveFailure(0);     // ignored
  EXPECT_EQ(model.min_failed_voxels(), 5000);
  EXPECT_FALSE(model.ready());

  // Not ready, yet a scene as large as the failure is bisected up front and
  // two small scenes still share one group.
  std::vector<OwnedScene> scenes = {Grid(20, 20, 15), Grid(5, 5, 5, 100), Grid(5, 5, 5, 200)};
  SplitOptions options;
  options.min_piece_voxels = 100;
  SplitStats stats;
  std::vector<Group> groups = PlanGroups(Views(scenes), model, 1 << 30, options, &stats);
  EXPECT_GE(stats.predicted_splits, 1);
  int64_t covered = 0;
  for (const Group& g : groups) {
    EXPECT_LT(GroupVoxels(g), 5000);
    covered += GroupVoxels(g);
  }
  EXPECT_EQ(covered, 6000 + 125 + 125);

  // The failure survives the checkpoint; version 1 text still reads.
  absl::StatusOr<MemoryModel> copy = MemoryModel::Deserialize(model.Serialize());
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->min_failed_voxels(), 5000);
  absl::StatusOr<MemoryModel> v1 =
      MemoryModel::Deserialize("trainsup.worker.MemoryModel 1\ncapacity 4\nobservations 0\n");
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->min_failed_voxels(), 0);
}

TEST(RunSplitting, ReportsTheSmallestSplittableFailure) {
  std::vector<OwnedScene> scenes = {Grid(10, 10, 10), Grid(10, 10, 10, 100)};
  SplitOptions options;
  options.min_piece_voxels = 50;
  // Anything above 1200 voxels runs out of memory.
  RunGroup run = [](const Group& g, double) {
    return GroupVoxels(g) > 1200 ? absl::ResourceExhaustedError("too big") : absl::OkStatus();
  };
  absl::StatusOr<SplitStats> stats = RunSplitting(Views(scenes), options, run, nullptr, nullptr, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->smallest_failed_voxels, 2000);
  EXPECT_EQ(stats->dropped_pieces, 0);

  // With the failure remembered, the next batch wastes no forward pass.
  MemoryModel model;
  model.ObserveFailure(stats->smallest_failed_voxels);
  absl::StatusOr<SplitStats> next =
      RunSplitting(Views(scenes), options, run, nullptr, &model, 1 << 30);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->wasted_forwards, 0);
  EXPECT_EQ(next->oom_events, 0);
}

// BatchNorm in training needs two rows per channel on the coarsest level:
// a piece whose halves would each sit in one coarsest cell is not cut.
TEST(RunSplitting, KeepsTwoVoxelsOnTheCoarsestLevel) {
  // 32 x 16 x 2 voxels: two cells of stride 16 along x, one along y and z.
  const std::vector<OwnedScene> scenes = {Grid(32, 16, 2)};
  RunGroup run = [](const Group& g, double) {
    return GroupVoxels(g) > 300 ? absl::ResourceExhaustedError("too big") : absl::OkStatus();
  };
  SplitOptions options;
  options.min_piece_voxels = 10;
  options.coarsest_stride = 16;
  // Cut at the median of x: each half is one cell of stride 16, so the
  // scene is at the floor and, not fitting, dropped rather than cut.
  absl::StatusOr<SplitStats> stats = RunSplitting(Views(scenes), options, run, nullptr, nullptr, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->splits, 0);
  EXPECT_EQ(stats->dropped_pieces, 1);
  // Without the rule it is cut down to pieces that fit.
  options.coarsest_stride = 1;
  stats = RunSplitting(Views(scenes), options, run, nullptr, nullptr, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->splits, 0);
  EXPECT_EQ(stats->dropped_pieces, 0);
  // A scene of four cells along x (512 voxels) cuts once into halves of
  // two cells each, and no further: at 200 voxels neither half fits.
  const std::vector<OwnedScene> wide = {Grid(64, 8, 1)};
  RunGroup run200 = [](const Group& g, double) {
    return GroupVoxels(g) > 200 ? absl::ResourceExhaustedError("too big") : absl::OkStatus();
  };
  options.coarsest_stride = 16;
  stats = RunSplitting(Views(wide), options, run200, nullptr, nullptr, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->splits, 1);
  EXPECT_EQ(stats->dropped_pieces, 2);
}

// --- CalibrateMemoryModel ---------------------------------------------------

// A probe against a simulated memory: out of memory past the budget.
// Records every probe group.
struct FakeProbe {
  SimulatedMemory memory;
  int64_t budget;
  std::vector<Group> groups;
  ProbeRun Run() {
    return [this](const Group& group) -> absl::StatusOr<int64_t> {
      groups.push_back(group);
      const int64_t peak = memory.Peak(group);
      if (peak > budget) return absl::ResourceExhaustedError("simulated out of memory");
      return peak;
    };
  }
};

// Options with a floor of 50 voxels, so the probes' units (1/32 of the
// scenes' voxels) can be cut finely.
SplitOptions FineOptions() {
  SplitOptions options;
  options.min_piece_voxels = 50;
  return options;
}

// Four rooms of 800 voxels and one of 3000: all of them need 2 * 6,200 +
// 1,000 bytes, far beyond the budget of 6,000.
std::vector<OwnedScene> CalibrationScenes() {
  return {Grid(10, 10, 8), Grid(10, 10, 8, 20), Grid(10, 10, 8, 40), Grid(10, 10, 8, 60),
          Grid(30, 10, 10, 80)};
}

TEST(CalibrateMemoryModel, MakesTheModelReadyWithoutRunningOutOfMemory) {
  const std::vector<OwnedScene> scenes = CalibrationScenes();
  const SimulatedMemory memory{1000, 2, {}};
  FakeProbe probe{memory, 6000, {}};
  MemoryModel model;
  auto stats =
      CalibrateMemoryModel(Views(scenes), FineOptions(), 6000, {}, probe.Run(), nullptr, &model);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->oom_events, 0);
  EXPECT_EQ(stats->probes, MemoryModel::kMinObservations);
  EXPECT_TRUE(model.ready());
  EXPECT_EQ(model.observations(), MemoryModel::kMinObservations);
  // Probes grow, stay within 0.9 of the budget with their growth over the
  // fixed 1000 bytes taken 1/0.8 larger, and each piece is one scene's
  // (distinct scenes within a probe).
  int64_t last = 0;
  for (const Group& g : probe.groups) {
    EXPECT_GT(GroupVoxels(g), last);
    last = GroupVoxels(g);
    EXPECT_LE(1000 + (memory.Peak(g) - 1000) / 0.8, 0.9 * 6000 + 1e-9);
    std::set<int> seen;
    for (const Piece& p : g) EXPECT_TRUE(seen.insert(p.scene).second) << "scene twice in a probe";
  }
  EXPECT_EQ(stats->largest_voxels, last);
  // The largest probe comes close to what the probes may use, and the fit
  // extrapolates to the large room: 1000 + 2 * 3000.
  EXPECT_GT(memory.Peak(probe.groups.back()), 0.6 * 0.9 * 6000);
  EXPECT_NEAR(static_cast<double>(model.Predict(3000)), 7000.0, 70.0);
}

TEST(CalibrateMemoryModel, ThenTheFirstLargeBatchIsSplitUpFront) {
  const std::vector<OwnedScene> scenes = CalibrationScenes();
  const SimulatedMemory memory{1000, 2, {}};
  const int64_t budget = 6000;
  FakeProbe probe{memory, budget, {}};
  MemoryModel model;
  ASSERT_TRUE(
      CalibrateMemoryModel(Views(scenes), FineOptions(), budget, {}, probe.Run(), nullptr, &model)
          .ok());
  // The first batch: a small room and the large one (7,600 bytes).
  const std::vector<OwnedScene> batch = {Grid(10, 10, 8), Grid(30, 10, 10, 80)};
  FakeTrainer trainer{memory, budget};
  auto stats =
      RunSplitting(Views(batch), FineOptions(), trainer.Run(), trainer.Free(), &model, budget);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->oom_events, 0);
  EXPECT_GT(stats->predicted_splits, 0);
  ExpectCoveredOnce(trainer.Coverage(batch));
  // Without calibration the same batch wastes forward passes.
  MemoryModel empty;
  FakeTrainer uncalibrated{memory, budget};
  auto reactive = RunSplitting(Views(batch), FineOptions(), uncalibrated.Run(), uncalibrated.Free(),
                               &empty, budget);
  ASSERT_TRUE(reactive.ok());
  EXPECT_GT(reactive->oom_events, 0);
}

TEST(CalibrateMemoryModel, AddsTheExtraBytesToEveryObservation) {
  const std::vector<OwnedScene> scenes = CalibrationScenes();
  const SimulatedMemory memory{1000, 2, {}};
  FakeProbe a{memory, 60000, {}}, b{memory, 60000, {}};
  MemoryModel plain, extra;
  CalibrationOptions with_extra;
  with_extra.extra_bytes = 500;
  ASSERT_TRUE(
      CalibrateMemoryModel(Views(scenes), FineOptions(), 60000, {}, a.Run(), nullptr, &plain).ok());
  ASSERT_TRUE(CalibrateMemoryModel(Views(scenes), FineOptions(), 60000, with_extra, b.Run(),
                                   nullptr, &extra)
                  .ok());
  ASSERT_EQ(a.groups.size(), b.groups.size());
  EXPECT_NEAR(static_cast<double>(extra.Predict(2000) - plain.Predict(2000)), 500.0, 2.0);
}

TEST(CalibrateMemoryModel, AFirstProbeThatDoesNotFitEndsItAndIsRemembered) {
  const std::vector<OwnedScene> scenes = CalibrationScenes();
  const SimulatedMemory memory{1000, 2, {}};
  FakeProbe probe{memory, 1100, {}};  // not even the first probe fits
  MemoryModel model;
  int frees = 0;
  auto stats = CalibrateMemoryModel(
      Views(scenes), FineOptions(), 1100, {}, probe.Run(), [&] { ++frees; }, &model);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->probes, 1);
  EXPECT_EQ(stats->oom_events, 1);
  EXPECT_EQ(frees, 1);
  EXPECT_FALSE(model.ready());
  EXPECT_EQ(model.min_failed_voxels(), GroupVoxels(probe.groups[0]));
}

TEST(CalibrateMemoryModel, OtherErrorsReturnAndNoBudgetRunsNothing) {
  const std::vector<OwnedScene> scenes = CalibrationScenes();
  MemoryModel model;
  ProbeRun failing = [](const Group&) -> absl::StatusOr<int64_t> {
    return absl::InternalError("a shape error");
  };
  auto stats =
      CalibrateMemoryModel(Views(scenes), FineOptions(), 6000, {}, failing, nullptr, &model);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInternal);
  int calls = 0;
  ProbeRun counting = [&](const Group&) -> absl::StatusOr<int64_t> { return ++calls; };
  auto none = CalibrateMemoryModel(Views(scenes), FineOptions(), 0, {}, counting, nullptr, &model);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->probes, 0);
  EXPECT_EQ(calls, 0);
}

TEST(CalibrateMemoryModel, ProbePiecesKeepTwoCellsAtTheCoarsestStride) {
  const std::vector<OwnedScene> scenes = {Grid(64, 16, 4)};
  SplitOptions options;
  options.min_piece_voxels = 10;
  options.coarsest_stride = 16;
  FakeProbe probe{{1000, 2, {}}, 1000000, {}};
  MemoryModel model;
  CalibrationOptions calibration;
  calibration.first_voxels = 50;  // asks for pieces finer than the rule allows
  ASSERT_TRUE(CalibrateMemoryModel(Views(scenes), options, 1000000, calibration, probe.Run(),
                                   nullptr, &model)
                  .ok());
  ASSERT_FALSE(probe.groups.empty());
  // 64 x 16 cut into halves of two cells of 16 along x at most: 512 voxels.
  EXPECT_GE(GroupVoxels(probe.groups[0]), 512);
  for (const Group& g : probe.groups) {
    for (const Piece& p : g) {
      std::set<int32_t> cells;
      for (int64_t row : Rows(p)) cells.insert(scenes[0].xyz[3 * row] / 16);
      EXPECT_GE(cells.size(), 2u);
    }
  }
}

}  // namespace
}  // namespace trainsup::worker
