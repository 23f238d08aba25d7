#include "worker/split/split.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "sparse/coordinates.h"

namespace trainsup::worker {
namespace {

constexpr int64_t kMaxPredictedBytes = std::numeric_limits<int64_t>::max() / 2;
// The baseline halves along x or y only, so a piece with no extent in either
// would be halved forever; it gives up at this depth.
constexpr int kBaselineMaxDepth = 48;

bool IsLabelled(const SceneView& scene, int64_t row) {
  return scene.labelled == nullptr || scene.labelled[row] != 0;
}

std::vector<int64_t> RowsOf(const Piece& piece, const SceneView& scene) {
  if (!piece.all) return piece.rows;
  std::vector<int64_t> rows(static_cast<size_t>(scene.n));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return rows;
}

Piece MakePiece(int scene_index, const SceneView& scene, std::vector<int64_t> rows, int depth) {
  Piece piece;
  piece.scene = scene_index;
  piece.all = false;
  piece.voxels = static_cast<int64_t>(rows.size());
  for (int64_t row : rows) piece.labelled += IsLabelled(scene, row) ? 1 : 0;
  piece.rows = std::move(rows);
  piece.depth = depth;
  return piece;
}

double Weight(const Group& group, int64_t batch_labelled) {
  if (batch_labelled <= 0) return 0.0;
  return static_cast<double>(GroupLabelled(group)) / static_cast<double>(batch_labelled);
}

void Drop(const Piece& piece, SplitStats* stats) {
  ++stats->dropped_pieces;
  stats->dropped_voxels += piece.voxels;
  stats->dropped_labelled += piece.labelled;
}

// Whether the piece's rows cover at least two cells of `stride`.
bool SpansTwoCells(const Piece& piece, const SceneView& scene, int32_t stride) {
  const std::vector<int64_t> rows = RowsOf(piece, scene);
  if (rows.size() < 2) return false;
  const int32_t* first = scene.xyz + 3 * rows[0];
  for (size_t i = 1; i < rows.size(); ++i) {
    const int32_t* p = scene.xyz + 3 * rows[i];
    for (int axis = 0; axis < 3; ++axis) {
      // The engine's downsampling cells (floor division).
      if (sparse::FloorDiv(p[axis], stride) != sparse::FloorDiv(first[axis], stride)) return true;
    }
  }
  return false;
}

bool Bisectable(const Piece& piece, const SceneView& scene, const SplitOptions& options) {
  if (piece.voxels < 2 || piece.voxels <= options.min_piece_voxels) return false;
  if (options.coarsest_stride <= 1) return true;
  const auto halves = BisectPiece(piece, scene);
  return SpansTwoCells(halves.first, scene, options.coarsest_stride) &&
         SpansTwoCells(halves.second, scene, options.coarsest_stride);
}

bool Splittable(const Group& group, const std::vector<SceneView>& scenes,
                const SplitOptions& options) {
  return group.size() > 1 ||
         (group.size() == 1 &&
          Bisectable(group[0], scenes[static_cast<size_t>(group[0].scene)], options));
}

// Two groups balanced by voxel count: the largest piece goes to the first,
// the next to the second, each further one (in decreasing size) to the
// lighter. Each half keeps the pieces' original order.
std::pair<Group, Group> CutGroup(Group group) {
  std::vector<size_t> order(group.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t l, size_t r) { return group[l].voxels > group[r].voxels; });
  std::vector<bool> to_first(group.size(), false);
  int64_t first_voxels = 0, second_voxels = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const bool first = k == 0 || (k > 1 && first_voxels <= second_voxels);
    to_first[order[k]] = first;
    (first ? first_voxels : second_voxels) += group[order[k]].voxels;
  }
  std::pair<Group, Group> halves;
  for (size_t i = 0; i < group.size(); ++i) {
    (to_first[i] ? halves.first : halves.second).push_back(std::move(group[i]));
  }
  return halves;
}

std::pair<Group, Group> Cut(Group group, const std::vector<SceneView>& scenes) {
  if (group.size() > 1) return CutGroup(std::move(group));
  auto halves = BisectPiece(group[0], scenes[static_cast<size_t>(group[0].scene)]);
  return {Group{std::move(halves.first)}, Group{std::move(halves.second)}};
}

Group AllScenes(const std::vector<SceneView>& scenes) {
  Group group;
  for (size_t i = 0; i < scenes.size(); ++i)
    group.push_back(WholeScene(static_cast<int>(i), scenes[i]));
  return group;
}

}  // namespace

int64_t BatchLabelled(const std::vector<SceneView>& scenes) {
  int64_t labelled = 0;
  for (size_t i = 0; i < scenes.size(); ++i)
    labelled += WholeScene(static_cast<int>(i), scenes[i]).labelled;
  return labelled;
}

Piece WholeScene(int index, const SceneView& scene) {
  Piece piece;
  piece.scene = index;
  piece.all = true;
  piece.voxels = scene.n;
  if (scene.labelled == nullptr) {
    piece.labelled = scene.n;
  } else {
    for (int64_t i = 0; i < scene.n; ++i) piece.labelled += scene.labelled[i] != 0 ? 1 : 0;
  }
  return piece;
}

int64_t GroupVoxels(const Group& group) {
  int64_t voxels = 0;
  for (const Piece& piece : group) voxels += piece.voxels;
  return voxels;
}

int64_t GroupLabelled(const Group& group) {
  int64_t labelled = 0;
  for (const Piece& piece : group) labelled += piece.labelled;
  return labelled;
}

std::pair<Piece, Piece> BisectPiece(const Piece& piece, const SceneView& scene) {
  std::vector<int64_t> rows = RowsOf(piece, scene);
  const int32_t* xyz = scene.xyz;
  std::array<int32_t, 3> lo{}, hi{};
  for (int axis = 0; axis < 3; ++axis) {
    lo[axis] = std::numeric_limits<int32_t>::max();
    hi[axis] = std::numeric_limits<int32_t>::min();
  }
  for (int64_t row : rows) {
    for (int axis = 0; axis < 3; ++axis) {
      lo[axis] = std::min(lo[axis], xyz[3 * row + axis]);
      hi[axis] = std::max(hi[axis], xyz[3 * row + axis]);
    }
  }
  int longest = 0;
  int64_t longest_extent = -1;
  for (int axis = 0; axis < 3 && !rows.empty(); ++axis) {
    const int64_t extent = int64_t{hi[axis]} - int64_t{lo[axis]};
    if (extent > longest_extent) {
      longest = axis;
      longest_extent = extent;
    }
  }
  const int a0 = longest, a1 = (longest + 1) % 3, a2 = (longest + 2) % 3;
  // A strict total order (the row breaks every tie), so the halves are
  // determined and both non-empty for n >= 2.
  auto before = [&](int64_t l, int64_t r) {
    const int32_t* p = xyz + 3 * l;
    const int32_t* q = xyz + 3 * r;
    if (p[a0] != q[a0]) return p[a0] < q[a0];
    if (p[a1] != q[a1]) return p[a1] < q[a1];
    if (p[a2] != q[a2]) return p[a2] < q[a2];
    return l < r;
  };
  const size_t half = rows.size() / 2;
  std::nth_element(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(half), rows.end(),
                   before);
  std::vector<int64_t> first(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(half));
  std::vector<int64_t> second(rows.begin() + static_cast<std::ptrdiff_t>(half), rows.end());
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  return {MakePiece(piece.scene, scene, std::move(first), piece.depth + 1),
          MakePiece(piece.scene, scene, std::move(second), piece.depth + 1)};
}

MemoryModel::MemoryModel(int capacity) : capacity_(std::max(1, capacity)) {}

void MemoryModel::Observe(int64_t voxels, int64_t pairs, int64_t peak_bytes) {
  if (voxels <= 0 || peak_bytes < 0) return;
  history_.push_back({voxels, pairs < 0 ? -1 : pairs, peak_bytes});
  while (static_cast<int>(history_.size()) > capacity_) history_.pop_front();
  Refit();
}

void MemoryModel::ObserveFailure(int64_t voxels) {
  if (voxels <= 0) return;
  if (min_failed_voxels_ == 0 || voxels < min_failed_voxels_) min_failed_voxels_ = voxels;
}

bool MemoryModel::ready() const {
  if (static_cast<int>(history_.size()) < kMinObservations) return false;
  for (const Observation& o : history_) {
    if (o.voxels != history_.front().voxels) return true;
  }
  return false;
}

void MemoryModel::Refit() {
  const double n = static_cast<double>(history_.size());
  double mv = 0, mp = 0, my = 0;
  bool all_pairs = true;
  double pair_sum = 0, pair_voxel_sum = 0;
  for (const Observation& o : history_) {
    mv += static_cast<double>(o.voxels);
    mp += static_cast<double>(std::max<int64_t>(o.pairs, 0));
    my += static_cast<double>(o.peak);
    if (o.pairs < 0) {
      all_pairs = false;
    } else {
      pair_sum += static_cast<double>(o.pairs);
      pair_voxel_sum += static_cast<double>(o.voxels);
    }
  }
  mv /= n;
  mp /= n;
  my /= n;
  pairs_per_voxel_ = pair_voxel_sum > 0 ? pair_sum / pair_voxel_sum : 0.0;
  // Centred sums keep the normal equations well conditioned at byte scale.
  double svv = 0, spp = 0, svp = 0, svy = 0, spy = 0;
  for (const Observation& o : history_) {
    const double v = static_cast<double>(o.voxels) - mv;
    const double p = static_cast<double>(std::max<int64_t>(o.pairs, 0)) - mp;
    const double y = static_cast<double>(o.peak) - my;
    svv += v * v;
    spp += p * p;
    svp += v * p;
    svy += v * y;
    spy += p * y;
  }
  use_pairs_ = false;
  b_ = 0;
  c_ = 0;
  if (all_pairs && svv > 0 && spp > 0) {
    const double det = svv * spp - svp * svp;
    if (det > 1e-9 * svv * spp) {
      const double b = (svy * spp - spy * svp) / det;
      const double c = (spy * svv - svy * svp) / det;
      if (b >= 0 && c >= 0) {
        use_pairs_ = true;
        b_ = b;
        c_ = c;
      }
    }
  }
  if (!use_pairs_) {
    b_ = svv > 0 ? std::max(0.0, svy / svv) : 0.0;
    mp = 0;
  }
  a_ = my - b_ * mv - c_ * mp;
  std::vector<double> residuals;
  residuals.reserve(history_.size());
  for (const Observation& o : history_) {
    const double fit = a_ + b_ * static_cast<double>(o.voxels) +
                       (use_pairs_ ? c_ * static_cast<double>(o.pairs) : 0.0);
    residuals.push_back(static_cast<double>(o.peak) - fit);
  }
  std::sort(residuals.begin(), residuals.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.95 * n));
  margin_ = std::max(0.0, residuals[std::max<size_t>(rank, 1) - 1]);
}

int64_t MemoryModel::Predict(int64_t voxels, int64_t pairs) const {
  if (history_.empty()) return 0;
  double value = a_ + b_ * static_cast<double>(voxels) + margin_;
  if (use_pairs_) {
    const double p =
        pairs >= 0 ? static_cast<double>(pairs) : pairs_per_voxel_ * static_cast<double>(voxels);
    value += c_ * p;
  }
  if (!(value > 0)) return 0;
  if (value >= static_cast<double>(kMaxPredictedBytes)) return kMaxPredictedBytes;
  return static_cast<int64_t>(std::ceil(value));
}

std::string MemoryModel::Serialize() const {
  std::string out =
      absl::StrCat("trainsup.worker.MemoryModel 2\ncapacity ", capacity_, "\nmin_failed ",
                   min_failed_voxels_, "\nobservations ", history_.size(), "\n");
  for (const Observation& o : history_) {
    absl::StrAppend(&out, o.voxels, " ", o.pairs, " ", o.peak, "\n");
  }
  return out;
}

absl::StatusOr<MemoryModel> MemoryModel::Deserialize(const std::string& text) {
  std::istringstream in(text);
  std::string magic, capacity_key, count_key;
  int version = 0;
  int64_t capacity = 0, count = 0;
  if (!(in >> magic >> version) || magic != "trainsup.worker.MemoryModel" ||
      (version != 1 && version != 2)) {
    return absl::InvalidArgumentError(
        "memory model: not a version 1 or 2 trainsup.worker.MemoryModel");
  }
  if (!(in >> capacity_key >> capacity) || capacity_key != "capacity" || capacity < 1 ||
      capacity > (1 << 20)) {
    return absl::InvalidArgumentError("memory model: bad capacity");
  }
  int64_t min_failed = 0;
  std::string min_failed_key;
  if (version >= 2 &&
      (!(in >> min_failed_key >> min_failed) || min_failed_key != "min_failed" || min_failed < 0)) {
    return absl::InvalidArgumentError("memory model: bad min_failed");
  }
  if (!(in >> count_key >> count) || count_key != "observations" || count < 0 || count > capacity) {
    return absl::InvalidArgumentError("memory model: bad observation count");
  }
  MemoryModel model(static_cast<int>(capacity));
  model.min_failed_voxels_ = min_failed;
  for (int64_t i = 0; i < count; ++i) {
    Observation o{};
    if (!(in >> o.voxels >> o.pairs >> o.peak) || o.voxels <= 0 || o.pairs < -1 || o.peak < 0) {
      return absl::InvalidArgumentError(absl::StrCat("memory model: bad observation ", i));
    }
    model.history_.push_back(o);
  }
  std::string rest;
  if (in >> rest) return absl::InvalidArgumentError("memory model: trailing data");
  if (!model.history_.empty()) model.Refit();
  return model;
}

std::vector<Group> PlanGroups(const std::vector<SceneView>& scenes, const MemoryModel& model,
                              int64_t budget_bytes, const SplitOptions& options,
                              SplitStats* stats) {
  if (scenes.empty()) return {};
  if (!model.ready() && model.min_failed_voxels() == 0) return {AllScenes(scenes)};
  const double limit = options.safety * static_cast<double>(budget_bytes);
  // What is as large as something that already ran out of memory does not
  // fit; otherwise the fit decides, once it is ready.
  auto fits = [&](int64_t voxels) {
    if (model.min_failed_voxels() > 0 && voxels >= model.min_failed_voxels()) return false;
    return !model.ready() || static_cast<double>(model.Predict(voxels)) <= limit;
  };
  int64_t cuts = 0;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < scenes.size(); ++i) {
    std::vector<Piece> todo{WholeScene(static_cast<int>(i), scenes[i])};
    while (!todo.empty()) {
      Piece piece = std::move(todo.back());
      todo.pop_back();
      if (fits(piece.voxels) || !Bisectable(piece, scenes[i], options)) {
        pieces.push_back(std::move(piece));
        continue;
      }
      auto halves = BisectPiece(piece, scenes[i]);
      ++cuts;
      todo.push_back(std::move(halves.second));
      todo.push_back(std::move(halves.first));
    }
  }
  std::vector<size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t l, size_t r) { return pieces[l].voxels > pieces[r].voxels; });
  std::vector<Group> groups;
  std::vector<int64_t> group_voxels;
  for (size_t index : order) {
    Piece& piece = pieces[index];
    size_t g = 0;
    while (g < groups.size() && !fits(group_voxels[g] + piece.voxels)) ++g;
    if (g == groups.size()) {
      groups.emplace_back();
      group_voxels.push_back(0);
    }
    group_voxels[g] += piece.voxels;
    groups[g].push_back(std::move(piece));
  }
  cuts += static_cast<int64_t>(groups.size()) - 1;
  if (stats != nullptr) {
    stats->splits += cuts;
    stats->predicted_splits += cuts;
  }
  return groups;
}

absl::StatusOr<SplitStats> RunSplitting(const std::vector<SceneView>& scenes,
                                        const SplitOptions& options, const RunGroup& run,
                                        const std::function<void()>& free_memory,
                                        const MemoryModel* predictor, int64_t budget_bytes) {
  SplitStats stats;
  if (scenes.empty()) return stats;
  const int64_t batch_labelled = BatchLabelled(scenes);
  struct Work {
    Group group;
    bool after_oom;
  };
  std::vector<Work> stack;
  {
    std::vector<Group> plan = predictor != nullptr
                                  ? PlanGroups(scenes, *predictor, budget_bytes, options, &stats)
                                  : std::vector<Group>{AllScenes(scenes)};
    for (auto it = plan.rbegin(); it != plan.rend(); ++it) stack.push_back({std::move(*it), false});
  }
  // Only failures of splittable work lower this: a piece at the floor that
  // fails says it is dense, not that everything of its size is too large.
  int64_t smallest_failed = predictor != nullptr && predictor->min_failed_voxels() > 0
                                ? predictor->min_failed_voxels()
                                : std::numeric_limits<int64_t>::max();
  auto push_halves = [&](Group group, bool after_oom) {
    ++stats.splits;
    auto halves = Cut(std::move(group), scenes);
    stack.push_back({std::move(halves.second), after_oom});
    stack.push_back({std::move(halves.first), after_oom});
  };
  while (!stack.empty()) {
    Work work = std::move(stack.back());
    stack.pop_back();
    const int64_t voxels = GroupVoxels(work.group);
    // Only asked when the answer matters: for one piece it bisects.
    if (voxels >= smallest_failed && Splittable(work.group, scenes, options)) {
      push_halves(std::move(work.group), work.after_oom);
      continue;
    }
    ++stats.forwards;
    if (work.after_oom) ++stats.retries;
    absl::Status status = run(work.group, Weight(work.group, batch_labelled));
    if (status.ok()) continue;
    if (!absl::IsResourceExhausted(status)) return status;
    ++stats.oom_events;
    ++stats.wasted_forwards;
    if (stats.oom_events > options.max_ooms_per_batch) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "hard out-of-memory: ", stats.oom_events, " out-of-memory failures in one batch (limit ",
          options.max_ooms_per_batch, ") after ", stats.splits, " splits, ", stats.dropped_pieces,
          " dropped pieces; last: ", std::string(status.message())));
    }
    if (free_memory) free_memory();
    if (Splittable(work.group, scenes, options)) {
      smallest_failed = std::min(smallest_failed, voxels);
      if (stats.smallest_failed_voxels == 0 || voxels < stats.smallest_failed_voxels) {
        stats.smallest_failed_voxels = voxels;
      }
      push_halves(std::move(work.group), true);
      continue;
    }
    for (const Piece& piece : work.group) {
      Drop(piece, &stats);
      stats.drop_reasons.push_back(absl::StrCat(
          "scene ", piece.scene, ": a piece of ", piece.voxels, " voxels (", piece.labelled,
          " labelled, depth ", piece.depth, ") does not fit in memory and cannot be cut further (",
          piece.voxels <= options.min_piece_voxels
              ? absl::StrCat("the floor is ", options.min_piece_voxels, " voxels")
              : absl::StrCat("a half would keep fewer than two voxels at stride ",
                             options.coarsest_stride),
          "): ", std::string(status.message())));
    }
  }
  return stats;
}

namespace {

constexpr double kProbeHeadroom = 0.8;

// Pieces of at most `unit` voxels covering `scenes`, scene by scene and
// depth-first within a scene (first half first); a piece that is not
// Bisectable stays whole.
std::vector<Piece> CalibrationUnits(const std::vector<SceneView>& scenes,
                                    const SplitOptions& options, int64_t unit) {
  std::vector<Piece> units;
  for (size_t i = 0; i < scenes.size(); ++i) {
    if (scenes[i].n == 0) continue;
    std::vector<Piece> todo{WholeScene(static_cast<int>(i), scenes[i])};
    while (!todo.empty()) {
      Piece piece = std::move(todo.back());
      todo.pop_back();
      if (piece.voxels <= unit || !Bisectable(piece, scenes[i], options)) {
        units.push_back(std::move(piece));
        continue;
      }
      auto halves = BisectPiece(piece, scenes[i]);
      todo.push_back(std::move(halves.second));
      todo.push_back(std::move(halves.first));
    }
  }
  return units;
}

// The first `count` units merged per scene: one piece per scene, its rows
// the union (ascending), the whole scene when it is all of it.
Group MergeUnits(const std::vector<Piece>& units, size_t count,
                 const std::vector<SceneView>& scenes) {
  Group group;
  for (size_t u = 0; u < count;) {
    const int scene = units[u].scene;
    const SceneView& view = scenes[static_cast<size_t>(scene)];
    std::vector<int64_t> rows;
    for (; u < count && units[u].scene == scene; ++u) {
      const std::vector<int64_t> r = RowsOf(units[u], view);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    std::sort(rows.begin(), rows.end());
    if (static_cast<int64_t>(rows.size()) == view.n) {
      group.push_back(WholeScene(scene, view));
    } else {
      group.push_back(MakePiece(scene, view, std::move(rows), 1));
    }
  }
  return group;
}

}  // namespace

absl::StatusOr<CalibrationStats> CalibrateMemoryModel(
    const std::vector<SceneView>& scenes, const SplitOptions& options, int64_t budget_bytes,
    const CalibrationOptions& calibration, const ProbeRun& probe,
    const std::function<void()>& free_memory, MemoryModel* model) {
  CalibrationStats stats;
  if (budget_bytes <= 0 || model == nullptr || calibration.max_probes <= 0) return stats;
  int64_t total = 0;
  for (const SceneView& s : scenes) total += s.n;
  if (total == 0) return stats;
  const int64_t first = std::min(
      total, calibration.first_voxels > 0 ? calibration.first_voxels
                                          : std::max(options.min_piece_voxels, (total + 31) / 32));
  const std::vector<Piece> units = CalibrationUnits(scenes, options, first);
  std::vector<int64_t> prefix(units.size() + 1, 0);  // voxels of the first u units
  for (size_t u = 0; u < units.size(); ++u) prefix[u + 1] = prefix[u] + units[u].voxels;
  // A probe is run only if planning would run it (predicted peak within
  // safety * budget) with the growth of the prediction over its value at 0
  // voxels taken a quarter larger: the fit it extrapolates is rough while
  // it has few observations, and the part at 0 voxels (model, optimizer
  // state, parameter gradients) is what the probes measure best.
  const double limit = options.safety * static_cast<double>(budget_bytes);
  auto fits = [&](int64_t voxels) {
    const double base = static_cast<double>(model->Predict(0) + calibration.extra_bytes);
    const double growth = static_cast<double>(model->Predict(voxels) - model->Predict(0));
    return base + growth / kProbeHeadroom <= limit;
  };
  size_t done = 0;  // units in the largest probe so far
  for (int k = 0; k < calibration.max_probes && done < units.size(); ++k) {
    int64_t target = first;
    if (k == 1) {
      target = 2 * first;
    } else if (k >= 2) {
      // The largest size predicted to fit (binary search over prefixes),
      // then geometric steps from the last probe to it.
      size_t lo = done, hi = units.size();
      while (lo < hi) {
        const size_t mid = (lo + hi + 1) / 2;
        if (fits(prefix[mid])) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      if (lo <= done) break;  // nothing larger is predicted to fit
      const double last = static_cast<double>(prefix[done]);
      const double top = static_cast<double>(prefix[lo]);
      const int left = calibration.max_probes - k;
      target = static_cast<int64_t>(std::ceil(last * std::pow(top / last, 1.0 / left)));
    }
    // The longest prefix within the target, at least one unit more.
    size_t count = static_cast<size_t>(std::upper_bound(prefix.begin(), prefix.end(), target) -
                                       prefix.begin()) -
                   1;
    count = std::clamp(count, done + 1, units.size());
    const Group group = MergeUnits(units, count, scenes);
    const int64_t voxels = GroupVoxels(group);
    if (k >= 2 && !fits(voxels)) break;
    ++stats.probes;
    absl::StatusOr<int64_t> peak = probe(group);
    if (!peak.ok()) {
      if (!absl::IsResourceExhausted(peak.status())) return peak.status();
      ++stats.oom_events;
      if (free_memory) free_memory();
      if (Splittable(group, scenes, options)) model->ObserveFailure(voxels);
      break;
    }
    model->Observe(voxels, -1, *peak + calibration.extra_bytes);
    stats.largest_voxels = voxels;
    stats.largest_peak = *peak + calibration.extra_bytes;
    done = count;
  }
  return stats;
}

absl::StatusOr<SplitStats> RunBaselineSplitting(const std::vector<SceneView>& scenes,
                                                const RunGroup& run,
                                                const std::function<void()>& free_memory,
                                                int64_t floor_points) {
  SplitStats stats;
  if (scenes.empty()) return stats;
  const int64_t batch_labelled = BatchLabelled(scenes);
  struct Work {
    Group group;
    bool after_oom;
  };
  std::vector<Work> stack{{AllScenes(scenes), false}};
  while (!stack.empty()) {
    Work work = std::move(stack.back());
    stack.pop_back();
    ++stats.forwards;
    if (work.after_oom) ++stats.retries;
    absl::Status status = run(work.group, Weight(work.group, batch_labelled));
    if (status.ok()) continue;
    if (!absl::IsResourceExhausted(status)) return status;
    ++stats.oom_events;
    ++stats.wasted_forwards;
    if (free_memory) free_memory();
    ++stats.splits;
    if (work.group.size() > 1) {
      for (auto it = work.group.rbegin(); it != work.group.rend(); ++it) {
        stack.push_back({Group{std::move(*it)}, true});
      }
      continue;
    }
    const Piece& piece = work.group[0];
    if (piece.depth >= kBaselineMaxDepth) {
      Drop(piece, &stats);
      continue;
    }
    const SceneView& scene = scenes[static_cast<size_t>(piece.scene)];
    const int axis = piece.depth % 2;
    const std::vector<int64_t> rows = RowsOf(piece, scene);
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (int64_t row : rows) {
      lo = std::min<int64_t>(lo, scene.xyz[3 * row + axis]);
      hi = std::max<int64_t>(hi, scene.xyz[3 * row + axis]);
    }
    std::vector<int64_t> low_rows, high_rows;
    for (int64_t row : rows) {
      (2 * int64_t{scene.xyz[3 * row + axis]} <= lo + hi ? low_rows : high_rows).push_back(row);
    }
    Piece halves[2] = {MakePiece(piece.scene, scene, std::move(low_rows), piece.depth + 1),
                       MakePiece(piece.scene, scene, std::move(high_rows), piece.depth + 1)};
    for (int h = 1; h >= 0; --h) {
      if (halves[h].voxels == 0) continue;
      if (halves[h].voxels < floor_points) {
        Drop(halves[h], &stats);
        continue;
      }
      stack.push_back({Group{std::move(halves[h])}, true});
    }
  }
  return stats;
}

int64_t SimulatedMemory::Peak(const Group& group) const {
  double bytes = static_cast<double>(fixed_bytes);
  for (const Piece& piece : group) {
    const size_t s = static_cast<size_t>(piece.scene);
    const double scale = s < scene_scale.size() ? scene_scale[s] : 1.0;
    bytes += static_cast<double>(bytes_per_voxel) * static_cast<double>(piece.voxels) * scale;
  }
  return static_cast<int64_t>(std::llround(bytes));
}

}  // namespace trainsup::worker
