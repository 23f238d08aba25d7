#include "worker/dataset/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "contracts/data_roots.h"
#include "sparse/scene.h"
#include "worker/data/readers.h"
#include "worker/dataset/random.h"

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;

// Independent streams derived from the run seed.
constexpr uint64_t kSplitTag = 0x73706c6974ull;  // "split"
constexpr uint64_t kHeavyTag = 0x6865617679ull;  // "heavy"

// Heavy-tailed rooms: this share of the rooms is this many times larger.
constexpr double kHeavyShare = 0.1;
constexpr int64_t kHeavyFactor = 10;

// Tiling aims for kTargetTiles non-empty tiles, accepting [kMinTiles,
// kMaxTiles].
constexpr int64_t kMinTiles = 8;
constexpr int64_t kTargetTiles = 16;
constexpr int64_t kMaxTiles = 32;

// The label limit of the voxelizer's majority vote (sparse/voxel_grid.h).
constexpr int64_t kMaxLabel = 65535;

std::string Plural(int64_t n, const std::string& word) {
  return absl::StrCat(n, " ", word, n == 1 ? "" : "s");
}

// The members of `split` among n scenes, ascending.
std::vector<int64_t> SplitMembers(int64_t n, double val_fraction, uint64_t seed, Split split) {
  const std::vector<int64_t> perm = SeededPermutation(n, MixSeed(seed, kSplitTag));
  const int64_t n_val = ValidationCount(n, val_fraction);
  std::vector<int64_t> members = split == Split::kVal
                                     ? std::vector<int64_t>(perm.begin(), perm.begin() + n_val)
                                     : std::vector<int64_t>(perm.begin() + n_val, perm.end());
  std::sort(members.begin(), members.end());
  return members;
}

// Shifts the cloud so that its minimum is 0 on every axis; origin keeps the
// absolute position.
void ShiftToMinimum(PointCloud* cloud) {
  const size_t n = cloud->size();
  if (n == 0) return;
  float lo[3] = {cloud->xyz[0], cloud->xyz[1], cloud->xyz[2]};
  for (size_t i = 0; i < n; ++i) {
    for (int a = 0; a < 3; ++a) lo[a] = std::min(lo[a], cloud->xyz[3 * i + a]);
  }
  for (size_t i = 0; i < n; ++i) {
    for (int a = 0; a < 3; ++a) cloud->xyz[3 * i + a] -= lo[a];
  }
  for (int a = 0; a < 3; ++a) cloud->origin[a] += lo[a];
}

// Labels equal to ignore_label become -1; a cloud without features (or
// whose features the spec says to ignore) gets one constant channel.
void Normalize(PointCloud* cloud, int64_t ignore_label, bool use_features = true) {
  for (int32_t& l : cloud->labels) {
    if (l == ignore_label) l = -1;
  }
  if (cloud->feature_channels == 0 || !use_features) {
    cloud->feature_channels = 1;
    cloud->features.assign(cloud->size(), 1.0f);
  }
}

int64_t MaxLabel(const PointCloud& cloud) {
  int64_t max_label = -1;
  for (int32_t l : cloud.labels) max_label = std::max<int64_t>(max_label, l);
  return max_label;
}

// What every scene must satisfy before it leaves a Dataset.
absl::Status CheckScene(const PointCloud& cloud, int channels, int num_classes) {
  if (cloud.size() == 0)
    return absl::InvalidArgumentError(absl::StrCat(cloud.source, ": no points"));
  if (cloud.feature_channels != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(cloud.source, ": ", Plural(cloud.feature_channels, "feature channel"),
                     ", but the dataset's other scenes have ", channels));
  }
  if (cloud.labels.size() != cloud.size()) {
    return absl::InvalidArgumentError(absl::StrCat(cloud.source, ": no labels"));
  }
  for (size_t i = 0; i < cloud.labels.size(); ++i) {
    if (cloud.labels[i] >= num_classes) {
      return ContentError(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat(cloud.source, ": label ", FileContent(absl::StrCat(cloud.labels[i])),
                       " of point ", i, " is not below model.num_classes (", num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckChannels(const ModelSpec& model, int channels, const std::string& what) {
  const int expected = channels + (model.height_feature ? 1 : 0);
  if (model.in_channels != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.in_channels: ", model.in_channels, ", but ", what, " has ",
        Plural(channels, "feature channel"), model.height_feature ? " plus the height" : ""));
  }
  return absl::OkStatus();
}

// model.num_classes when set (checked against the data's largest label),
// else the largest label plus one.
absl::StatusOr<int> NumClasses(const ModelSpec& model, int64_t max_label, const std::string& what) {
  if (max_label > kMaxLabel) {
    return ContentError(absl::StatusCode::kInvalidArgument,
                        absl::StrCat(what, ": label ", FileContent(absl::StrCat(max_label)),
                                     " is too large (at most ", kMaxLabel, ")"));
  }
  if (model.num_classes > 0) {
    if (max_label >= model.num_classes) {
      return ContentError(absl::StatusCode::kInvalidArgument,
                          absl::StrCat("model.num_classes: ", model.num_classes, ", but ", what,
                                       " has label ", FileContent(absl::StrCat(max_label))));
    }
    return static_cast<int>(model.num_classes);
  }
  if (max_label < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_classes: 0 (from the data), but ", what, " has no labelled point"));
  }
  return static_cast<int>(max_label + 1);
}

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(std::string scene_size, uint64_t seed, int64_t ignore_label,
                   std::vector<int64_t> rooms, std::vector<bool> heavy, int num_classes,
                   std::string name)
      : scene_size_(std::move(scene_size)),
        seed_(seed),
        ignore_label_(ignore_label),
        rooms_(std::move(rooms)),
        heavy_(std::move(heavy)),
        num_classes_(num_classes),
        name_(std::move(name)) {}

  int64_t size() const override { return static_cast<int64_t>(rooms_.size()); }

  absl::StatusOr<PointCloud> Get(int64_t index) const override {
    if (index < 0 || index >= size()) {
      return absl::OutOfRangeError(absl::StrCat(name_, ": no scene ", index));
    }
    const int64_t room = rooms_[index];
    sparse::SceneOptions o = sparse::ScenePreset(scene_size_, MixSeed(seed_, room));
    if (heavy_[room]) {
      const double side = std::sqrt(static_cast<double>(kHeavyFactor));
      o.size_x *= side;
      o.size_y *= side;
      o.num_points *= kHeavyFactor;
      o.boxes *= kHeavyFactor;
      o.cylinders *= kHeavyFactor;
    }
    sparse::Scene scene = sparse::GenerateScene(o);
    PointCloud cloud;
    cloud.xyz = std::move(scene.points);
    cloud.features = std::move(scene.colors);
    cloud.feature_channels = 3;
    cloud.labels = std::move(scene.labels);
    cloud.source = absl::StrCat("synthetic room ", room, heavy_[room] ? " (large)" : "");
    Normalize(&cloud, ignore_label_);
    ShiftToMinimum(&cloud);
    return cloud;
  }

  int num_classes() const override { return num_classes_; }
  int feature_channels() const override { return 3; }
  std::string name() const override { return name_; }

 private:
  const std::string scene_size_;
  const uint64_t seed_;
  const int64_t ignore_label_;
  const std::vector<int64_t> rooms_;  // room ids of this split, ascending
  const std::vector<bool> heavy_;     // per room id of the whole dataset
  const int num_classes_;
  const std::string name_;
};

// One cloud cut into tiles; scenes are this split's tiles.
struct Tile {
  int64_t tx = 0, ty = 0;
  std::vector<int64_t> points;  // ascending indices into the cloud
};

class TiledDataset final : public Dataset {
 public:
  TiledDataset(std::shared_ptr<const PointCloud> cloud, std::vector<Tile> tiles, int num_classes,
               std::string name)
      : cloud_(std::move(cloud)),
        tiles_(std::move(tiles)),
        num_classes_(num_classes),
        name_(std::move(name)) {}

  int64_t size() const override { return static_cast<int64_t>(tiles_.size()); }

  absl::StatusOr<PointCloud> Get(int64_t index) const override {
    if (index < 0 || index >= size()) {
      return absl::OutOfRangeError(absl::StrCat(name_, ": no scene ", index));
    }
    const Tile& tile = tiles_[index];
    const int c = cloud_->feature_channels;
    PointCloud out;
    out.origin = cloud_->origin;
    out.feature_channels = c;
    out.source = absl::StrCat(cloud_->source, " tile (", tile.tx, ", ", tile.ty, ")");
    out.xyz.reserve(3 * tile.points.size());
    out.features.reserve(c * tile.points.size());
    out.labels.reserve(tile.points.size());
    for (int64_t p : tile.points) {
      out.xyz.insert(out.xyz.end(), cloud_->xyz.begin() + 3 * p, cloud_->xyz.begin() + 3 * p + 3);
      out.features.insert(out.features.end(), cloud_->features.begin() + c * p,
                          cloud_->features.begin() + c * p + c);
      out.labels.push_back(cloud_->labels[p]);
    }
    ShiftToMinimum(&out);
    return out;
  }

  int num_classes() const override { return num_classes_; }
  int feature_channels() const override { return cloud_->feature_channels; }
  std::string name() const override { return name_; }

 private:
  const std::shared_ptr<const PointCloud> cloud_;
  const std::vector<Tile> tiles_;
  const int num_classes_;
  const std::string name_;
};

class FileDataset final : public Dataset {
 public:
  FileDataset(std::vector<std::string> files, PointCloudFormat format, ReadOptions options,
              int64_t ignore_label, bool use_features, int channels, int num_classes,
              std::string name)
      : files_(std::move(files)),
        format_(format),
        options_(std::move(options)),
        ignore_label_(ignore_label),
        use_features_(use_features),
        channels_(channels),
        num_classes_(num_classes),
        name_(std::move(name)) {}

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }

  absl::StatusOr<PointCloud> Get(int64_t index) const override {
    if (index < 0 || index >= size()) {
      return absl::OutOfRangeError(absl::StrCat(name_, ": no scene ", index));
    }
    absl::StatusOr<PointCloud> cloud = ReadPointCloud(files_[index], format_, options_);
    if (!cloud.ok()) return cloud.status();
    cloud->source = files_[index];
    Normalize(&*cloud, ignore_label_, use_features_);
    if (absl::Status s = CheckScene(*cloud, channels_, num_classes_); !s.ok()) return s;
    ShiftToMinimum(&*cloud);
    return cloud;
  }

  int num_classes() const override { return num_classes_; }
  int feature_channels() const override { return channels_; }
  std::string name() const override { return name_; }

 private:
  const std::vector<std::string> files_;  // this split's files, sorted
  const PointCloudFormat format_;
  const ReadOptions options_;
  const int64_t ignore_label_;
  const bool use_features_;
  const int channels_;
  const int num_classes_;
  const std::string name_;
};

absl::StatusOr<std::unique_ptr<Dataset>> OpenSynthetic(const DataSpec& data, const ModelSpec& model,
                                                       uint64_t seed, Split split) {
  try {
    sparse::ScenePreset(data.scene_size);
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(absl::StrCat("data.scene_size: ", e.what()));
  }
  if (data.size_distribution != "uniform" && data.size_distribution != "heavy_tailed") {
    return absl::InvalidArgumentError(absl::StrCat("data.size_distribution: '",
                                                   data.size_distribution,
                                                   "' (expected uniform or heavy_tailed)"));
  }
  if (data.scenes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.scenes: must be at least 1, got ", data.scenes));
  }
  if (absl::Status s = CheckChannels(model, 3, "synthetic data (rgb)"); !s.ok()) return s;
  absl::StatusOr<int> num_classes =
      NumClasses(model, sparse::kNumSceneClasses - 1, "synthetic data");
  if (!num_classes.ok()) return num_classes.status();

  const int64_t n = data.scenes;
  std::vector<bool> heavy(n, false);
  int64_t n_heavy = 0;
  if (data.size_distribution == "heavy_tailed" && n >= 2) {
    n_heavy = std::max<int64_t>(1, std::llround(kHeavyShare * static_cast<double>(n)));
    const std::vector<int64_t> perm = SeededPermutation(n, MixSeed(seed, kHeavyTag));
    for (int64_t i = 0; i < n_heavy; ++i) heavy[perm[i]] = true;
  }
  std::vector<int64_t> rooms = SplitMembers(n, data.val_fraction, seed, split);
  std::string name =
      absl::StrCat("synthetic: ", n, " ", data.scene_size, " rooms (", data.size_distribution);
  if (n_heavy > 0) absl::StrAppend(&name, ", ", n_heavy, " ten times larger");
  absl::StrAppend(&name, "), ", ToString(split), ": ", Plural(rooms.size(), "room"));
  return std::unique_ptr<Dataset>(new SyntheticDataset(data.scene_size, seed, data.ignore_label,
                                                       std::move(rooms), std::move(heavy),
                                                       *num_classes, std::move(name)));
}

// Non-empty square xy tiles of `cloud`, ordered by (ty, tx), and their side.
std::vector<Tile> MakeTiles(const PointCloud& cloud, double fixed_side, double* side_out) {
  const int64_t n = static_cast<int64_t>(cloud.size());
  double lo[2] = {0, 0}, hi[2] = {0, 0};
  for (int64_t i = 0; i < n; ++i) {
    for (int a = 0; a < 2; ++a) {
      const double v = cloud.xyz[3 * i + a];
      lo[a] = i == 0 ? v : std::min(lo[a], v);
      hi[a] = i == 0 ? v : std::max(hi[a], v);
    }
  }
  const double wx = hi[0] - lo[0], wy = hi[1] - lo[1];
  const double w = std::max(wx, wy);
  auto grid = [&](double s, int64_t* nx, int64_t* ny) {
    *nx = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(wx / s)));
    *ny = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(wy / s)));
  };
  auto tile_of = [&](int64_t i, double s, int64_t nx, int64_t ny, int64_t* tx, int64_t* ty) {
    *tx = std::min(nx - 1, static_cast<int64_t>(std::floor((cloud.xyz[3 * i] - lo[0]) / s)));
    *ty = std::min(ny - 1, static_cast<int64_t>(std::floor((cloud.xyz[3 * i + 1] - lo[1]) / s)));
  };
  double side = w > 0 ? w : 1.0;
  if (fixed_side > 0) {
    side = fixed_side;
  } else if (w > 0) {
    // Sides w * 2^(-k/4), k = 0, 1, ...: exact powers of two times four
    // literal factors, so the choice does not depend on the libm. Counting
    // uses at most about a million points.
    constexpr double kQuarter[4] = {1.0, 0.84089641525371454, 0.70710678118654752,
                                    0.59460355750136054};
    constexpr int64_t kMaxCells = int64_t{1} << 22;
    const int64_t stride = std::max<int64_t>(1, n / 1000000);
    int64_t best_score = std::numeric_limits<int64_t>::max();
    for (int k = 0; k < 160; ++k) {
      const double s = std::ldexp(w * kQuarter[k % 4], -(k / 4));
      int64_t nx, ny;
      grid(s, &nx, &ny);
      if (nx * ny > kMaxCells) break;
      std::vector<uint8_t> used(nx * ny, 0);
      int64_t count = 0;
      for (int64_t i = 0; i < n; i += stride) {
        int64_t tx, ty;
        tile_of(i, s, nx, ny, &tx, &ty);
        uint8_t& u = used[ty * nx + tx];
        count += u == 0;
        u = 1;
      }
      const int64_t score = count < kMinTiles   ? 1000 + kMinTiles - count
                            : count > kMaxTiles ? 1000 + count - kMaxTiles
                                                : std::abs(count - kTargetTiles);
      if (score < best_score) {
        best_score = score;
        side = s;
      }
      if (count > 2 * kMaxTiles) break;
    }
  }
  int64_t nx, ny;
  grid(side, &nx, &ny);
  std::vector<int64_t> tile_index(nx * ny, -1);
  std::vector<Tile> tiles;
  std::vector<int64_t> cell(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t tx = 0, ty = 0;
    if (w > 0) tile_of(i, side, nx, ny, &tx, &ty);
    cell[i] = ty * nx + tx;
  }
  // Number the non-empty cells in (ty, tx) order, then fill them in point
  // order.
  std::vector<int64_t> cell_count(nx * ny, 0);
  for (int64_t c : cell) ++cell_count[c];
  for (int64_t c = 0; c < nx * ny; ++c) {
    if (cell_count[c] == 0) continue;
    tile_index[c] = static_cast<int64_t>(tiles.size());
    Tile t;
    t.tx = c % nx;
    t.ty = c / nx;
    t.points.reserve(cell_count[c]);
    tiles.push_back(std::move(t));
  }
  for (int64_t i = 0; i < n; ++i) tiles[tile_index[cell[i]]].points.push_back(i);
  *side_out = side;
  return tiles;
}

// For s3dis: a folder that is one room (has Annotations/, or is one).
bool IsS3disRoom(const fs::path& dir) {
  std::error_code ec;
  return dir.filename() == "Annotations" || fs::is_directory(dir / "Annotations", ec);
}

// The scenes below `dir` for `format`, sorted.
absl::StatusOr<std::vector<std::string>> ListScenes(const fs::path& dir, PointCloudFormat format) {
  std::string extension;
  switch (format) {
    case PointCloudFormat::kPly:
      extension = ".ply";
      break;
    case PointCloudFormat::kLas:
      extension = ".las";
      break;
    case PointCloudFormat::kSemanticKitti:
      extension = ".bin";
      break;
    case PointCloudFormat::kS3dis:
      extension = ".txt";
      break;
  }
  std::vector<std::string> files, rooms;
  std::error_code ec, entry_ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (format == PointCloudFormat::kS3dis && it->is_directory(entry_ec)) {
      if (p.filename() == "Annotations") {
        it.disable_recursion_pending();
      } else if (IsS3disRoom(p)) {
        rooms.push_back(p.string());
      }
      continue;
    }
    if (it->is_regular_file(entry_ec) &&
        absl::AsciiStrToLower(p.extension().string()) == extension) {
      files.push_back(p.string());
    }
  }
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("data.path: cannot list ", dir.string(), ": ", ec.message()));
  }
  if (format == PointCloudFormat::kS3dis && !rooms.empty()) files = std::move(rooms);
  if (files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: no ", format == PointCloudFormat::kS3dis ? "rooms or " : "",
                     extension, " files under ", dir.string()));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// PermissionDenied naming the first of data.path and data.label_file (when
// set) that resolves outside `data_roots`.
absl::Status CheckInsideRoots(const DataSpec& data, const std::vector<std::string>& data_roots) {
  const std::pair<const char*, const std::string*> fields[] = {
      {"data.path", &data.path}, {"data.label_file", &data.label_file}};
  for (const auto& [field, value] : fields) {
    if (value->empty() || PathInsideRoots(*value, data_roots)) continue;
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": ", *value, " resolves outside the data roots (",
        data_roots.empty() ? std::string("none configured") : absl::StrJoin(data_roots, ", "),
        ")"));
  }
  return absl::OkStatus();
}

// The dataset of the one file (or s3dis room) at data.path: read once and
// cut into tiles, whose members of `split` it serves.
absl::StatusOr<std::unique_ptr<Dataset>> OpenSingleFile(const DataSpec& data,
                                                        const ModelSpec& model, uint64_t seed,
                                                        Split split, PointCloudFormat format,
                                                        const ReadOptions& options) {
  absl::StatusOr<PointCloud> read = ReadPointCloud(data.path, format, options);
  if (!read.ok()) return read.status();
  read->source = data.path;
  Normalize(&*read, data.ignore_label, data.use_features);
  if (read->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(data.path, ": no points"));
  }
  if (absl::Status s = CheckChannels(model, read->feature_channels, data.path); !s.ok()) {
    return s;
  }
  absl::StatusOr<int> num_classes = NumClasses(model, MaxLabel(*read), data.path);
  if (!num_classes.ok()) return num_classes.status();
  double side = 0;
  std::vector<Tile> all = MakeTiles(*read, data.tile_size, &side);
  const int64_t n = static_cast<int64_t>(all.size());
  std::vector<Tile> tiles;
  for (int64_t t : SplitMembers(n, data.val_fraction, seed, split)) {
    tiles.push_back(std::move(all[t]));
  }
  std::string name =
      absl::StrCat(ToString(format), " file ", data.path, ": ", n, " tiles of ", side, " m, ",
                   ToString(split), ": ", Plural(tiles.size(), "tile"));
  return std::unique_ptr<Dataset>(
      new TiledDataset(std::make_shared<const PointCloud>(std::move(*read)), std::move(tiles),
                       *num_classes, std::move(name)));
}

// The dataset of the scene files under the directory `path` (data.path),
// whose members of `split` it serves, read at each use.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDirectory(const DataSpec& data, const ModelSpec& model,
                                                       uint64_t seed, Split split,
                                                       const fs::path& path,
                                                       PointCloudFormat format,
                                                       const ReadOptions& options) {
  if (!data.label_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.label_file: applies to a single file, but data.path ", data.path, " is a directory"));
  }
  absl::StatusOr<std::vector<std::string>> files = ListScenes(path, format);
  if (!files.ok()) return files.status();
  // The feature channels from the first file; every file when the classes
  // come from the data (which also finds unreadable files before training).
  int channels = -1;
  int64_t max_label = -1;
  const size_t scan = model.num_classes > 0 ? 1 : files->size();
  for (size_t i = 0; i < scan; ++i) {
    const std::string& file = (*files)[i];
    absl::StatusOr<PointCloud> read = ReadPointCloud(file, format, options);
    if (!read.ok()) return read.status();
    Normalize(&*read, data.ignore_label, data.use_features);
    if (channels < 0) {
      channels = read->feature_channels;
    } else if (read->feature_channels != channels) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", Plural(read->feature_channels, "feature channel"), ", but ",
                       (*files)[0], " has ", channels));
    }
    max_label = std::max(max_label, MaxLabel(*read));
  }
  if (absl::Status s = CheckChannels(model, channels, (*files)[0]); !s.ok()) return s;
  absl::StatusOr<int> num_classes = NumClasses(model, max_label, data.path);
  if (!num_classes.ok()) return num_classes.status();
  const int64_t n = static_cast<int64_t>(files->size());
  std::vector<std::string> members;
  for (int64_t f : SplitMembers(n, data.val_fraction, seed, split)) {
    members.push_back((*files)[f]);
  }
  std::string name =
      absl::StrCat(ToString(format), " directory ", data.path, ": ", Plural(n, "scene"), ", ",
                   ToString(split), ": ", Plural(members.size(), "scene"));
  return std::unique_ptr<Dataset>(new FileDataset(std::move(members), format, options,
                                                  data.ignore_label, data.use_features, channels,
                                                  *num_classes, std::move(name)));
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenFiles(
    const DataSpec& data, const ModelSpec& model, uint64_t seed, Split split,
    const std::optional<std::vector<std::string>>& data_roots) {
  absl::StatusOr<PointCloudFormat> format = PointCloudFormatFromString(data.format);
  if (!format.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.format: ", format.status().message(), " (or synthetic)"));
  }
  if (data.path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data.path: required for format ", data.format));
  }
  // At every attempt, before anything is looked at: the spec was checked
  // at submit, but links may have changed since.
  if (data_roots.has_value()) {
    if (absl::Status s = CheckInsideRoots(data, *data_roots); !s.ok()) return s;
  }
  const fs::path path(data.path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat("data.path: ", data.path, " does not exist"));
  }
  ReadOptions options;
  options.label_property = data.label_property;
  options.label_file = data.label_file;
  options.require_labels = true;
  options.data_roots = data_roots;
  options.max_file_bytes = static_cast<uint64_t>(data.max_file_mb) << 20;

  const bool single =
      fs::is_regular_file(status) || (*format == PointCloudFormat::kS3dis && IsS3disRoom(path));
  if (single) return OpenSingleFile(data, model, seed, split, *format, options);
  return OpenDirectory(data, model, seed, split, path, *format, options);
}

}  // namespace

std::string ToString(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kVal:
      return "val";
  }
  return "unknown";
}

absl::StatusOr<Split> SplitFromString(const std::string& name) {
  if (name == "train") return Split::kTrain;
  if (name == "val") return Split::kVal;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown split '", name, "' (expected train or val)"));
}

int64_t ValidationCount(int64_t n, double val_fraction) {
  if (n <= 1 || !(val_fraction > 0)) return 0;
  const int64_t rounded = std::llround(static_cast<double>(n) * val_fraction);
  return std::clamp<int64_t>(rounded, 1, n - 1);
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const DataSpec& data, const ModelSpec& model, uint64_t seed, Split split,
    const std::optional<std::vector<std::string>>& data_roots) {
  if (!(data.val_fraction >= 0 && data.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.val_fraction: must be in [0, 1), got ", data.val_fraction));
  }
  if (data.format == "synthetic") return OpenSynthetic(data, model, seed, split);
  return OpenFiles(data, model, seed, split, data_roots);
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const RunSpec& spec, Split split, const std::optional<std::vector<std::string>>& data_roots) {
  return OpenDataset(spec.data, spec.model, static_cast<uint64_t>(spec.train.seed), split,
                     data_roots);
}

}  // namespace trainsup::worker
