// Datasets from the run spec: synthetic rooms (determinism, heavy tail),
// train/val splits, tiles of one file, directories of files, label mapping
// and the errors a user sees.
#include "worker/dataset/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace trainsup::worker {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Dataset> MustOpen(
    const DataSpec& data, const ModelSpec& model, uint64_t seed, Split split,
    const std::optional<std::vector<std::string>>& data_roots = std::nullopt) {
  absl::StatusOr<std::unique_ptr<Dataset>> d = OpenDataset(data, model, seed, split, data_roots);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

PointCloud MustGet(const Dataset& d, int64_t i) {
  absl::StatusOr<PointCloud> c = d.Get(i);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : PointCloud();
}

DataSpec Synthetic(int64_t scenes, const std::string& distribution, double val_fraction) {
  DataSpec d;
  d.format = "synthetic";
  d.scenes = scenes;
  d.scene_size = "small";
  d.size_distribution = distribution;
  d.val_fraction = val_fraction;
  return d;
}

// Every scene a Dataset returns starts at 0 on every axis.
void ExpectShiftedToMinimum(const PointCloud& c) {
  ASSERT_GT(c.size(), 0u);
  for (int a = 0; a < 3; ++a) {
    float lo = c.xyz[a];
    for (size_t i = 0; i < c.size(); ++i) lo = std::min(lo, c.xyz[3 * i + a]);
    EXPECT_EQ(lo, 0.0f) << c.source << " axis " << a;
  }
}

TEST(Split, RoundTripsThroughStrings) {
  for (Split s : {Split::kTrain, Split::kVal}) {
    absl::StatusOr<Split> back = SplitFromString(ToString(s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
  EXPECT_FALSE(SplitFromString("test").ok());
}

TEST(ValidationCount, RoundsAndKeepsBothSidesNonEmpty) {
  EXPECT_EQ(ValidationCount(10, 0.2), 2);
  EXPECT_EQ(ValidationCount(10, 0.0), 0);
  EXPECT_EQ(ValidationCount(3, 0.01), 1);  // at least one val scene
  EXPECT_EQ(ValidationCount(2, 0.9), 1);   // at least one train scene
  EXPECT_EQ(ValidationCount(1, 0.5), 0);   // one scene trains
  EXPECT_EQ(ValidationCount(0, 0.5), 0);
}

TEST(SyntheticDataset, SameSeedSameClouds) {
  const DataSpec data = Synthetic(3, "uniform", 0.0);
  auto a = MustOpen(data, ModelSpec(), 7, Split::kTrain);
  auto b = MustOpen(data, ModelSpec(), 7, Split::kTrain);
  auto other = MustOpen(data, ModelSpec(), 8, Split::kTrain);
  ASSERT_TRUE(a && b && other);
  EXPECT_EQ(a->size(), 3);
  EXPECT_EQ(a->num_classes(), 4);
  EXPECT_EQ(a->feature_channels(), 3);
  const PointCloud x = MustGet(*a, 1), y = MustGet(*b, 1), z = MustGet(*other, 1);
  EXPECT_EQ(x.xyz, y.xyz);
  EXPECT_EQ(x.features, y.features);
  EXPECT_EQ(x.labels, y.labels);
  EXPECT_EQ(x.origin, y.origin);
  EXPECT_NE(x.xyz, z.xyz);
  EXPECT_NE(x.xyz, MustGet(*a, 0).xyz);
  ExpectShiftedToMinimum(x);
  for (float f : x.features) {
    ASSERT_GE(f, 0.0f);
    ASSERT_LE(f, 1.0f);
  }
  for (int32_t l : x.labels) {
    ASSERT_GE(l, 0);
    ASSERT_LT(l, 4);
  }
}

TEST(SyntheticDataset, HeavyTailMakesAboutOneRoomInTenTenTimesLarger) {
  for (int64_t scenes : {int64_t{2}, int64_t{12}}) {
    auto d = MustOpen(Synthetic(scenes, "heavy_tailed", 0.0), ModelSpec(), 3, Split::kTrain);
    ASSERT_TRUE(d);
    ASSERT_EQ(d->size(), scenes);
    std::vector<size_t> points;
    std::vector<double> floor_side;
    for (int64_t i = 0; i < d->size(); ++i) {
      const PointCloud c = MustGet(*d, i);
      points.push_back(c.size());
      float x = 0;
      for (size_t p = 0; p < c.size(); ++p) x = std::max(x, c.xyz[3 * p]);
      floor_side.push_back(x);
    }
    const size_t small = *std::min_element(points.begin(), points.end());
    int64_t large = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i] == 10 * small) {
        ++large;
        // Floor sides grow by sqrt(10) ~ 3.16 (rooms differ a little).
        const double ratio =
            floor_side[i] / *std::min_element(floor_side.begin(), floor_side.end());
        EXPECT_GT(ratio, 2.9);
        EXPECT_LT(ratio, 3.5);
      } else {
        EXPECT_EQ(points[i], small);
      }
    }
    EXPECT_EQ(large, std::max<int64_t>(1, std::llround(0.1 * scenes))) << scenes << " rooms";
  }
  auto one = MustOpen(Synthetic(1, "heavy_tailed", 0.0), ModelSpec(), 3, Split::kTrain);
  ASSERT_TRUE(one);
  EXPECT_EQ(MustGet(*one, 0).size(), 50000u);  // a lone room is not "larger than the rest"
}

std::set<std::string> Sources(const Dataset& d) {
  std::set<std::string> s;
  for (int64_t i = 0; i < d.size(); ++i) s.insert(MustGet(d, i).source);
  return s;
}

TEST(SyntheticDataset, SplitsAreDisjointCoveringAndSeeded) {
  const DataSpec data = Synthetic(6, "uniform", 0.34);
  auto train = MustOpen(data, ModelSpec(), 5, Split::kTrain);
  auto val = MustOpen(data, ModelSpec(), 5, Split::kVal);
  ASSERT_TRUE(train && val);
  EXPECT_EQ(train->size(), 4);
  EXPECT_EQ(val->size(), 2);
  const std::set<std::string> a = Sources(*train), b = Sources(*val);
  std::set<std::string> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 6u);  // disjoint and covering
  for (int i = 0; i < 6; ++i) EXPECT_EQ(all.count("synthetic room " + std::to_string(i)), 1u);
  // The same seed splits the same way; the split is part of the name.
  auto again = MustOpen(data, ModelSpec(), 5, Split::kVal);
  EXPECT_EQ(Sources(*again), b);
  EXPECT_NE(val->name().find("val: 2 rooms"), std::string::npos) << val->name();
  // A tiny fraction still holds one room out.
  auto tiny = MustOpen(Synthetic(3, "uniform", 0.01), ModelSpec(), 5, Split::kVal);
  EXPECT_EQ(tiny->size(), 1);
  auto none = MustOpen(Synthetic(3, "uniform", 0.0), ModelSpec(), 5, Split::kVal);
  EXPECT_EQ(none->size(), 0);
}

TEST(SyntheticDataset, RejectsBadSpecNamingTheField) {
  DataSpec data = Synthetic(2, "uniform", 0.0);
  data.scene_size = "gigantic";
  EXPECT_NE(std::string(OpenDataset(data, ModelSpec(), 1, Split::kTrain).status().message())
                .find("data.scene_size"),
            std::string::npos);
  data = Synthetic(2, "zipf", 0.0);
  EXPECT_NE(std::string(OpenDataset(data, ModelSpec(), 1, Split::kTrain).status().message())
                .find("data.size_distribution"),
            std::string::npos);
  ModelSpec model;
  model.in_channels = 1;
  EXPECT_NE(
      std::string(
          OpenDataset(Synthetic(2, "uniform", 0.0), model, 1, Split::kTrain).status().message())
          .find("model.in_channels"),
      std::string::npos);
  model = ModelSpec();
  model.num_classes = 3;
  EXPECT_NE(
      std::string(
          OpenDataset(Synthetic(2, "uniform", 0.0), model, 1, Split::kTrain).status().message())
          .find("model.num_classes"),
      std::string::npos);
  model.num_classes = 6;
  auto six = MustOpen(Synthetic(2, "uniform", 0.0), model, 1, Split::kTrain);
  EXPECT_EQ(six->num_classes(), 6);
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "trainsup_dataset_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct PlyPoint {
  double x, y, z;
  int r, g, b;
  int label;
};

// An ascii PLY with rgb (unless !rgb) and a label property.
void WritePly(const fs::path& path, const std::vector<PlyPoint>& points, bool rgb = true) {
  std::ofstream f(path);
  f << "ply\nformat ascii 1.0\nelement vertex " << points.size()
    << "\nproperty double x\nproperty double y\nproperty double z\n";
  if (rgb) f << "property uchar red\nproperty uchar green\nproperty uchar blue\n";
  f << "property int label\nend_header\n";
  f.precision(17);
  for (const PlyPoint& p : points) {
    f << p.x << " " << p.y << " " << p.z;
    if (rgb) f << " " << p.r << " " << p.g << " " << p.b;
    f << " " << p.label << "\n";
  }
}

// A 20 m x 10 m grid of points, 0.25 m apart, at an offset, labels 0..2
// with every seventh point labelled 9 (the ignore label of the tests).
std::vector<PlyPoint> GridPoints(double offset_x = 1000.5, double offset_y = -250.25) {
  std::vector<PlyPoint> pts;
  int k = 0;
  for (int i = 0; i < 80; ++i) {
    for (int j = 0; j < 40; ++j, ++k) {
      pts.push_back({offset_x + 0.25 * i, offset_y + 0.25 * j, 3.0 + 0.01 * (k % 13), k % 256,
                     (3 * k) % 256, 7, k % 7 == 0 ? 9 : k % 3});
    }
  }
  return pts;
}

DataSpec FileSpec(const std::string& format, const fs::path& path, double val_fraction) {
  DataSpec d;
  d.format = format;
  d.path = path.string();
  d.val_fraction = val_fraction;
  return d;
}

TEST(FileDataset, OneFileIsCutIntoTilesThatCoverItOnce) {
  TempDir dir;
  const std::vector<PlyPoint> pts = GridPoints();
  WritePly(dir.path() / "scan.ply", pts);
  DataSpec data = FileSpec("ply", dir.path() / "scan.ply", 0.2);
  data.ignore_label = 9;
  auto train = MustOpen(data, ModelSpec(), 4, Split::kTrain);
  auto val = MustOpen(data, ModelSpec(), 4, Split::kVal);
  ASSERT_TRUE(train && val);
  const int64_t tiles = train->size() + val->size();
  EXPECT_GE(tiles, 8);
  EXPECT_LE(tiles, 32);
  EXPECT_GE(val->size(), 1);
  EXPECT_EQ(val->size(), ValidationCount(tiles, 0.2));
  EXPECT_EQ(train->num_classes(), 3);  // labels 0..2; 9 is ignored
  EXPECT_EQ(val->num_classes(), 3);
  EXPECT_EQ(train->feature_channels(), 3);
  // Every point of the file is in exactly one tile of one split, at its
  // absolute position (origin + xyz), with its colour and mapped label.
  std::map<std::array<long, 2>, int> label_at;  // keyed by position in cm
  std::set<std::string> tile_names;
  for (const Dataset* d : {train.get(), val.get()}) {
    for (int64_t t = 0; t < d->size(); ++t) {
      const PointCloud c = MustGet(*d, t);
      ExpectShiftedToMinimum(c);
      EXPECT_TRUE(tile_names.insert(c.source).second) << c.source;
      for (size_t i = 0; i < c.size(); ++i) {
        const std::array<long, 2> key = {std::lround((c.origin[0] + c.xyz[3 * i]) * 100),
                                         std::lround((c.origin[1] + c.xyz[3 * i + 1]) * 100)};
        EXPECT_TRUE(label_at.emplace(key, c.labels[i]).second) << "point in two tiles";
        EXPECT_FLOAT_EQ(c.features[3 * i + 2], 7.0f / 255.0f);
      }
    }
  }
  ASSERT_EQ(label_at.size(), pts.size());
  for (const PlyPoint& p : pts) {
    const auto it = label_at.find({std::lround(p.x * 100), std::lround(p.y * 100)});
    ASSERT_NE(it, label_at.end());
    EXPECT_EQ(it->second, p.label == 9 ? -1 : p.label);
  }
}

TEST(FileDataset, ExplicitNumClassesIsCheckedAgainstTheLabels) {
  TempDir dir;
  WritePly(dir.path() / "scan.ply", GridPoints());
  const DataSpec data = FileSpec("ply", dir.path() / "scan.ply", 0.2);  // 9 is a class here
  ModelSpec model;
  model.num_classes = 5;
  const absl::Status s = OpenDataset(data, model, 1, Split::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("model.num_classes: 5"), std::string::npos) << s;
  model.num_classes = 12;
  auto d = MustOpen(data, model, 1, Split::kTrain);
  EXPECT_EQ(d->num_classes(), 12);
}

TEST(FileDataset, DirectoryScenesSplitAndShareNumClasses) {
  TempDir dir;
  fs::create_directories(dir.path() / "b");
  std::vector<std::string> names;
  for (int f = 0; f < 5; ++f) {
    std::vector<PlyPoint> pts;
    for (int i = 0; i < 50; ++i)
      pts.push_back({10.0 * f + i * 0.1, 5.0, 1.0 + i * 0.01, 1, 2, 3, i % 2});
    if (f == 3) pts[7].label = 6;  // the largest label, in one file only
    const fs::path p =
        (f % 2 ? dir.path() / "b" : dir.path()) / ("scan" + std::to_string(f) + ".PLY");
    WritePly(p, pts);
    names.push_back(p.string());
  }
  std::ofstream(dir.path() / "notes.txt") << "not a scan\n";
  const DataSpec data = FileSpec("ply", dir.path(), 0.4);
  auto train = MustOpen(data, ModelSpec(), 9, Split::kTrain);
  auto val = MustOpen(data, ModelSpec(), 9, Split::kVal);
  ASSERT_TRUE(train && val);
  EXPECT_EQ(train->size(), 3);
  EXPECT_EQ(val->size(), 2);
  EXPECT_EQ(train->num_classes(), 7);
  EXPECT_EQ(val->num_classes(), 7);
  std::set<std::string> seen = Sources(*train);
  for (const std::string& s : Sources(*val)) EXPECT_TRUE(seen.insert(s).second) << s;
  EXPECT_EQ(seen, std::set<std::string>(names.begin(), names.end()));
  const PointCloud c = MustGet(*train, 0);
  ExpectShiftedToMinimum(c);
  EXPECT_EQ(c.size(), 50u);
}

TEST(FileDataset, CloudsWithoutFeaturesGetOneConstantChannel) {
  TempDir dir;
  std::vector<PlyPoint> pts = GridPoints();
  WritePly(dir.path() / "plain.ply", pts, /*rgb=*/false);
  ModelSpec model;
  model.in_channels = 1;
  auto d = MustOpen(FileSpec("ply", dir.path() / "plain.ply", 0.0), model, 1, Split::kTrain);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->feature_channels(), 1);
  const PointCloud c = MustGet(*d, 0);
  EXPECT_EQ(c.features, std::vector<float>(c.size(), 1.0f));
  // The default three input channels do not match.
  const absl::Status s =
      OpenDataset(FileSpec("ply", dir.path() / "plain.ply", 0.0), ModelSpec(), 1, Split::kTrain)
          .status();
  EXPECT_NE(std::string(s.message()).find("model.in_channels: 3"), std::string::npos) << s;
}

TEST(FileDataset, ErrorsNameTheFileOrTheField) {
  TempDir dir;
  const absl::Status missing =
      OpenDataset(FileSpec("ply", dir.path() / "nope.ply", 0.2), ModelSpec(), 1, Split::kTrain)
          .status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.message()).find("nope.ply"), std::string::npos);

  const absl::Status empty =
      OpenDataset(FileSpec("las", dir.path(), 0.2), ModelSpec(), 1, Split::kTrain).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(empty.message()).find("no .las files"), std::string::npos) << empty;

  EXPECT_NE(std::string(OpenDataset(FileSpec("xyz", dir.path(), 0.2), ModelSpec(), 1, Split::kTrain)
                            .status()
                            .message())
                .find("data.format"),
            std::string::npos);

  WritePly(dir.path() / "good.ply", GridPoints());
  std::ofstream(dir.path() / "bad.ply") << "ply\nformat ascii 1.0\nelement vertex 3\n"
                                           "property float x\nproperty float y\n"
                                           "property float z\nproperty int label\nend_header\n"
                                           "0 0 0 1\n";
  const absl::Status bad =
      OpenDataset(FileSpec("ply", dir.path(), 0.2), ModelSpec(), 1, Split::kTrain).status();
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.message()).find("bad.ply"), std::string::npos) << bad;

  DataSpec with_side_file = FileSpec("ply", dir.path(), 0.2);
  with_side_file.label_file = (dir.path() / "labels.txt").string();
  EXPECT_NE(
      std::string(OpenDataset(with_side_file, ModelSpec(), 1, Split::kTrain).status().message())
          .find("data.label_file"),
      std::string::npos);

  auto good =
      MustOpen(FileSpec("ply", dir.path() / "good.ply", 0.2), ModelSpec(), 1, Split::kTrain);
  ASSERT_TRUE(good);
  EXPECT_EQ(good->Get(-1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(good->Get(good->size()).status().code(), absl::StatusCode::kOutOfRange);
}

// With data roots, the spec's paths are re-checked when the dataset opens,
// and every file it reads, then or later, is confined as it is opened.
TEST(FileDataset, DataRootsConfineEveryFile) {
  TempDir dir;
  const fs::path root = dir.path() / "root", outside = dir.path() / "outside";
  fs::create_directories(root / "scenes");
  fs::create_directories(outside);
  WritePly(root / "scenes" / "a.ply", GridPoints());
  WritePly(outside / "b.ply", GridPoints(0, 0));
  const std::vector<std::string> roots = {root.string()};

  const absl::Status escaped =
      OpenDataset(FileSpec("ply", outside / "b.ply", 0.0), ModelSpec(), 1, Split::kTrain, roots)
          .status();
  EXPECT_EQ(escaped.code(), absl::StatusCode::kPermissionDenied) << escaped;
  EXPECT_NE(
      std::string(escaped.message())
          .find("data.path: " + (outside / "b.ply").string() + " resolves outside the data roots"),
      std::string::npos)
      << escaped;

  fs::create_symlink(outside / "b.ply", root / "scenes" / "b.ply");
  const absl::Status linked =
      OpenDataset(FileSpec("ply", root / "scenes", 0.0), ModelSpec(), 1, Split::kTrain, roots)
          .status();
  EXPECT_EQ(linked.code(), absl::StatusCode::kPermissionDenied) << linked;
  EXPECT_NE(std::string(linked.message()).find((root / "scenes" / "b.ply").string() + ": leads to"),
            std::string::npos)
      << linked;

  // Opened while the link pointed inside; Get re-checks when it reads.
  fs::remove(root / "scenes" / "b.ply");
  WritePly(root / "scenes" / "b.ply", GridPoints(0, 0));
  ModelSpec model;
  model.num_classes = 10;  // no scan of every file at open
  auto dataset = MustOpen(FileSpec("ply", root / "scenes", 0.0), model, 1, Split::kTrain, roots);
  ASSERT_TRUE(dataset);
  ASSERT_EQ(dataset->size(), 2);
  EXPECT_TRUE(dataset->Get(1).ok());
  fs::remove(root / "scenes" / "b.ply");
  fs::create_symlink(outside / "b.ply", root / "scenes" / "b.ply");
  EXPECT_EQ(dataset->Get(1).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(dataset->Get(0).ok());
}

// The real CGAL samples, when deploy/fetch-sample-data.sh has fetched them.
TEST(FileDataset, SampleFilesAreTiled) {
  const fs::path samples = TRAINSUP_SAMPLE_DATA_DIR;
  for (const auto& [file, format] :
       {std::pair<std::string, std::string>{"b9_training.ply", "ply"}, {"urban.las", "las"}}) {
    const fs::path path = samples / file;
    if (!fs::exists(path)) GTEST_SKIP() << path << " is absent (deploy/fetch-sample-data.sh)";
    ModelSpec model;
    model.in_channels = format == "las" ? 1 : 3;
    auto train = OpenDataset(FileSpec(format, path, 0.2), model, 1, Split::kTrain);
    if (!train.ok() && format == "las") {
      model.in_channels = 3;  // LAS point formats 2 and 3 carry rgb
      train = OpenDataset(FileSpec(format, path, 0.2), model, 1, Split::kTrain);
    }
    ASSERT_TRUE(train.ok()) << train.status();
    auto val = MustOpen(FileSpec(format, path, 0.2), model, 1, Split::kVal);
    ASSERT_TRUE(val);
    const int64_t tiles = (*train)->size() + val->size();
    EXPECT_GE(tiles, 8) << (*train)->name();
    EXPECT_LE(tiles, 32) << (*train)->name();
    EXPECT_GE(val->size(), 1);
    EXPECT_GE((*train)->num_classes(), 2);
    size_t points = 0;
    for (const Dataset* d : {train->get(), val.get()}) {
      for (int64_t t = 0; t < d->size(); ++t) {
        const PointCloud c = MustGet(*d, t);
        ExpectShiftedToMinimum(c);
        points += c.size();
        for (int32_t l : c.labels) ASSERT_LT(l, d->num_classes());
      }
    }
    EXPECT_EQ(points, file == "urban.las" ? 13511u : 22300u);
  }
}

}  // namespace
}  // namespace trainsup::worker
