// The point-cloud readers on tests/data (made by tests/data/make_malformed.py):
// every malformed file fails with its error, every valid one reads exactly.
#include "worker/data/readers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace trainsup::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string DataPath(const std::string& relative) {
  return std::string(TRAINSUP_TEST_DATA_DIR) + "/" + relative;
}

// The points of every valid file (make_malformed.py POINTS).
constexpr double kXyz[4][3] = {{0, 0, 0}, {1, 0.5, -2}, {2.25, 3, 4}, {-1, -1, 1}};
constexpr int kRgb[4][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {51, 102, 204}};
const std::vector<int32_t> kLabels = {0, 1, 2, -1};

PointCloud ReadOk(const std::string& relative, const std::string& format,
                  const ReadOptions& options = {}) {
  absl::StatusOr<PointCloud> cloud = ReadPointCloud(DataPath(relative), format, options);
  EXPECT_TRUE(cloud.ok()) << cloud.status();
  return cloud.ok() ? *std::move(cloud) : PointCloud{};
}

// Absolute coordinate a of point i.
double At(const PointCloud& cloud, size_t i, int a) {
  return cloud.origin[a] + cloud.xyz[3 * i + a];
}

void ExpectStandardPoints(const PointCloud& cloud) {
  ASSERT_EQ(cloud.size(), 4u);
  ASSERT_EQ(cloud.feature_channels, 3);
  ASSERT_EQ(cloud.features.size(), 12u);
  for (size_t i = 0; i < 4; ++i) {
    for (int a = 0; a < 3; ++a) {
      EXPECT_EQ(At(cloud, i, a), kXyz[i][a]) << "point " << i << " axis " << a;
      EXPECT_FLOAT_EQ(cloud.features[3 * i + a], kRgb[i][a] / 255.0f)
          << "point " << i << " channel " << a;
    }
  }
}

// ---------------------------------------------------------------------------
// Malformed corpus

struct MalformedCase {
  std::string format;
  std::string file;  // under malformed/<format>/
  absl::StatusCode code;
  std::string message;  // a substring of the error
  std::string label_file = "";
  std::string label_property = "";
  std::string kitti_label_file = "";
};

const std::vector<MalformedCase>& MalformedCases() {
  using absl::StatusCode;
  static const auto* cases = new std::vector<MalformedCase>{
      // PLY
      {"ply", "truncated.ply", StatusCode::kDataLoss,
       "truncated: element 'vertex' has 4 records of at least 23 bytes, but only 79"},
      {"ply", "ascii_truncated.ply", StatusCode::kDataLoss, "truncated: vertex 3 of 4 ends early"},
      {"ply", "bad_magic.ply", StatusCode::kInvalidArgument, "no 'ply' magic"},
      {"ply", "unknown_format.ply", StatusCode::kInvalidArgument,
       "unknown format 'binary_middle_endian'"},
      {"ply", "no_end_header.ply", StatusCode::kInvalidArgument, "no end_header line"},
      {"ply", "unexpected_keyword.ply", StatusCode::kInvalidArgument,
       "header line 13: unexpected 'end_headr'"},
      {"ply", "nan_coordinate.ply", StatusCode::kDataLoss,
       "non-finite coordinate y = nan at point 1"},
      {"ply", "inf_coordinate.ply", StatusCode::kDataLoss,
       "non-finite coordinate z = inf at point 2"},
      {"ply", "label_count_mismatch.ply", StatusCode::kDataLoss,
       "label count mismatch: 3 labels for 4 points", "label_count_mismatch.labels"},
      {"ply", "count_exceeds_file.ply", StatusCode::kDataLoss,
       "element 'vertex' has 1000000000 records of at least 23 bytes"},
      {"ply", "unknown_type.ply", StatusCode::kInvalidArgument,
       "unknown property type 'float16' for property 'y'"},
      {"ply", "missing_x.ply", StatusCode::kInvalidArgument, "vertex element has no 'x' property"},
      {"ply", "missing_label_property.ply", StatusCode::kInvalidArgument,
       "no label property 'semantic'", "", "semantic"},
      {"ply", "fractional_label.ply", StatusCode::kDataLoss,
       "label property 'label' = 2.5 at vertex 2 is not a 32-bit integer"},
      {"ply", "negative_label.ply", StatusCode::kDataLoss, "label -7 at point 3 is below -1"},
      {"ply", "not_a_number.ply", StatusCode::kDataLoss, "'2.2.5' is not a number"},
      {"ply", "value_out_of_range.ply", StatusCode::kDataLoss,
       "value 300 of uchar property 'red' at vertex 0 does not fit its type"},
      {"ply", "list_past_end.ply", StatusCode::kDataLoss,
       "truncated: vertex 1 of 2 runs past the end of the file"},
      {"ply", "no_vertex_element.ply", StatusCode::kInvalidArgument, "no 'vertex' element"},
      // LAS
      {"las", "truncated.las", StatusCode::kDataLoss,
       "truncated: 3 points of 34 bytes from offset 227 but the file has 319 bytes (room for 2)"},
      {"las", "bad_magic.las", StatusCode::kInvalidArgument, "no 'LASF' magic"},
      {"las", "short_header.las", StatusCode::kDataLoss, "truncated header"},
      {"las", "nan_scale.las", StatusCode::kDataLoss, "scale factor x = nan"},
      {"las", "inf_offset.las", StatusCode::kDataLoss, "coordinate offset z = inf"},
      {"las", "inf_coordinate.las", StatusCode::kDataLoss,
       "non-finite coordinate x = inf at point 1"},
      {"las", "label_count_mismatch.las", StatusCode::kDataLoss,
       "label count mismatch: 2 labels for 3 points", "label_count_mismatch.labels"},
      {"las", "count_exceeds_file.las", StatusCode::kDataLoss,
       "truncated: 4000000000 points of 34 bytes"},
      {"las", "point_format_6.las", StatusCode::kInvalidArgument,
       "point data format 6 is not supported (supported: 0-3)"},
      {"las", "compressed.laz", StatusCode::kInvalidArgument, "compressed LAZ is not supported"},
      {"las", "version_2_0.las", StatusCode::kInvalidArgument, "unsupported LAS version 2.0"},
      {"las", "record_too_short.las", StatusCode::kDataLoss,
       "point record length 20 is shorter than point format 3's 34 bytes"},
      {"las", "offset_inside_header.las", StatusCode::kDataLoss,
       "offset to point data 100 lies inside the 227-byte header"},
      {"las", "counts_disagree_v14.las", StatusCode::kDataLoss,
       "legacy point count 5 disagrees with the 64-bit point count 3"},
      {"las", "v14_short_header.las", StatusCode::kDataLoss,
       "header size 227 is below the 375 bytes of a LAS 1.4 header"},
      // SemanticKITTI
      {"semantickitti", "truncated.bin", StatusCode::kDataLoss,
       "size 40 bytes is not a multiple of 16"},
      {"semantickitti", "nan_coordinate.bin", StatusCode::kDataLoss,
       "non-finite coordinate x = nan at point 1"},
      {"semantickitti", "inf_coordinate.bin", StatusCode::kDataLoss,
       "non-finite coordinate z = -inf at point 2"},
      {"semantickitti", "nan_remission.bin", StatusCode::kDataLoss,
       "non-finite feature 0 = nan at point 1"},
      {"semantickitti", "label_count_mismatch.bin", StatusCode::kDataLoss,
       "label count mismatch: 2 labels for 3 points"},
      {"semantickitti", "truncated_label.bin", StatusCode::kDataLoss,
       "size 10 bytes is not a multiple of 4"},
      {"semantickitti", "missing_label_file.bin", StatusCode::kNotFound, "no such file", "", "",
       "missing_label_file.label"},
      // S3DIS
      {"s3dis", "truncated.txt", StatusCode::kDataLoss, "line 4: 3 values, expected 7 like line 1"},
      {"s3dis", "header_line.txt", StatusCode::kDataLoss, "line 1: 'x' is not a number"},
      {"s3dis", "nan_coordinate.txt", StatusCode::kDataLoss,
       "line 2: non-finite coordinate y = nan"},
      {"s3dis", "inf_coordinate.txt", StatusCode::kDataLoss,
       "line 4: non-finite coordinate x = inf"},
      {"s3dis", "mixed_columns.txt", StatusCode::kDataLoss,
       "line 5: 6 values, expected 7 like line 1"},
      {"s3dis", "colour_out_of_range.txt", StatusCode::kDataLoss,
       "line 1: colour 300 is outside [0, 255]"},
      {"s3dis", "fractional_label.txt", StatusCode::kDataLoss,
       "line 3: label 1.5 is not an integer"},
      {"s3dis", "label_count_mismatch.txt", StatusCode::kDataLoss,
       "label count mismatch: 5 labels for 4 points", "label_count_mismatch.labels"},
      {"s3dis", "unknown_class", StatusCode::kInvalidArgument,
       "spaceship_1.txt: unknown S3DIS class 'spaceship'"},
      {"s3dis", "bad_object_name", StatusCode::kInvalidArgument,
       "ceiling.txt: object file name is not <class>_<n>.txt"},
      {"s3dis", "no_objects", StatusCode::kInvalidArgument, "no object files"},
      {"s3dis", "object_with_label", StatusCode::kDataLoss,
       "chair_1.txt: line 1: 7 values, expected 6 (x y z r g b)"},
  };
  return *cases;
}

TEST(MalformedCorpus, EachFileFailsWithItsError) {
  for (const MalformedCase& c : MalformedCases()) {
    const std::string dir = DataPath("malformed/" + c.format + "/");
    SCOPED_TRACE(c.format + "/" + c.file);
    ReadOptions options;
    if (!c.label_file.empty()) options.label_file = dir + c.label_file;
    if (!c.kitti_label_file.empty()) options.kitti_label_file = dir + c.kitti_label_file;
    options.label_property = c.label_property;
    absl::StatusOr<PointCloud> cloud = ReadPointCloud(dir + c.file, c.format, options);
    ASSERT_FALSE(cloud.ok()) << "read " << cloud->size() << " points";
    EXPECT_EQ(cloud.status().code(), c.code) << cloud.status();
    EXPECT_THAT(std::string(cloud.status().message()), HasSubstr(c.message));
    // The message names the file it is about (the data file, its side file
    // or the object file in its folder).
    const std::string stem = c.file.substr(0, c.file.find('.'));
    EXPECT_THAT(std::string(cloud.status().message()), HasSubstr(dir + stem));
  }
}

TEST(MalformedCorpus, EveryFileHasACase) {
  std::set<std::string> covered;
  for (const MalformedCase& c : MalformedCases()) covered.insert(c.format + "/" + c.file);
  int files = 0;
  for (const char* format : {"ply", "las", "semantickitti", "s3dis"}) {
    for (const auto& entry : std::filesystem::directory_iterator(DataPath("malformed/") + format)) {
      const std::string name = entry.path().filename().string();
      const std::string ext = entry.path().extension().string();
      if (ext == ".labels" || ext == ".label") continue;  // side files of a case
      ++files;
      EXPECT_TRUE(covered.count(std::string(format) + "/" + name)) << format << "/" << name;
    }
  }
  EXPECT_EQ(files, static_cast<int>(MalformedCases().size()));
}

// Every prefix of every valid file, and deterministic single-byte
// corruptions of it, either read or fail with InvalidArgument / DataLoss:
// no crash, no exception, no other error.
TEST(MalformedCorpus, EveryPrefixAndByteFlipOfAValidFileIsReadOrRejected) {
  const std::string scratch = ::testing::TempDir() + "/worker_data_fuzz";
  std::filesystem::create_directories(scratch);
  int reads = 0;
  uint32_t rng = 12345;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(DataPath("valid"))) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    const std::string rel = entry.path().lexically_relative(DataPath("valid")).string();
    const std::string format = rel.substr(0, rel.find('/'));
    if (ext == ".labels" || ext == ".label" || ext == ".md") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string original((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    auto try_read = [&](const std::string& bytes, const std::string& what) {
      // A fresh name each time: truncating and rewriting one file makes ext4
      // flush it (auto_da_alloc), which is slow on a busy disk.
      const std::string copy = scratch + "/" + std::to_string(reads++) + ext;
      std::ofstream(copy, std::ios::binary) << bytes;
      absl::StatusOr<PointCloud> cloud = ReadPointCloud(copy, format, {});
      std::filesystem::remove(copy);
      if (!cloud.ok()) {
        EXPECT_TRUE(cloud.status().code() == absl::StatusCode::kInvalidArgument ||
                    cloud.status().code() == absl::StatusCode::kDataLoss)
            << rel << " " << what << ": " << cloud.status();
      } else {
        EXPECT_LE(cloud->size(), original.size()) << rel << " " << what;
      }
    };
    for (size_t n = 0; n < original.size(); ++n) {
      try_read(original.substr(0, n), "prefix " + std::to_string(n));
    }
    for (int k = 0; k < 300; ++k) {
      rng = rng * 1664525u + 1013904223u;
      std::string bytes = original;
      const size_t at = (rng >> 8) % bytes.size();
      bytes[at] = static_cast<char>(rng >> 24);
      try_read(bytes, "byte " + std::to_string(at) + " = " + std::to_string(rng >> 24));
    }
  }
  EXPECT_GT(reads, 5000);
  std::filesystem::remove_all(scratch);
}

// ---------------------------------------------------------------------------
// PLY

TEST(Ply, ReadsPackedLittleEndianRecordsSkippingOtherElements) {
  const PointCloud cloud = ReadOk("valid/ply/points_le.ply", "ply");
  ExpectStandardPoints(cloud);
  EXPECT_EQ(cloud.origin, (std::array<double, 3>{0, 0, 0}));
  EXPECT_EQ(cloud.labels, kLabels);
  EXPECT_EQ(cloud.source, DataPath("valid/ply/points_le.ply"));
}

TEST(Ply, ReadsBigEndianDoublesWithListProperties) {
  const PointCloud cloud = ReadOk("valid/ply/points_be.ply", "ply");
  ExpectStandardPoints(cloud);
  // Double coordinates are recentred on the floor of the minimum.
  EXPECT_EQ(cloud.origin, (std::array<double, 3>{-1, -1, -2}));
  EXPECT_EQ(cloud.labels, kLabels);  // from the "class" property
}

TEST(Ply, ReadsAsciiWithCrlfAndAFloatLabelProperty) {
  const PointCloud cloud = ReadOk("valid/ply/points_ascii.ply", "ply");
  ExpectStandardPoints(cloud);
  EXPECT_EQ(cloud.labels, kLabels);  // from scalar_Classification
}

TEST(Ply, RecentresGeoreferencedDoubleCoordinates) {
  const PointCloud cloud = ReadOk("valid/ply/georeferenced.ply", "ply");
  ASSERT_EQ(cloud.size(), 4u);
  EXPECT_EQ(cloud.origin, (std::array<double, 3>{596699, 4176971, 71}));
  // 596700.25 would round to 596700.25 ± 0.03 in float; relative, it is exact.
  EXPECT_EQ(cloud.xyz[0], 1.25f);
  EXPECT_EQ(cloud.xyz[1], 1.5f);
  EXPECT_EQ(cloud.xyz[2], 2.0f);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(At(cloud, i, 0), 596700.25 + kXyz[i][0]);
    EXPECT_EQ(At(cloud, i, 1), 4176972.5 + kXyz[i][1]);
    EXPECT_EQ(At(cloud, i, 2), 73.0 + kXyz[i][2]);
    for (int c = 0; c < 3; ++c) {
      // ushort colours: / 65535.
      EXPECT_FLOAT_EQ(cloud.features[3 * i + c], kRgb[i][c] / 255.0f);
    }
  }
  // "label" is first among the default names.
  EXPECT_EQ(cloud.labels, (std::vector<int32_t>{9, 9, 9, 9}));
}

TEST(Ply, SelectsTheLabelPropertyByName) {
  ReadOptions options;
  options.label_property = "semantic";
  const PointCloud cloud = ReadOk("valid/ply/georeferenced.ply", "ply", options);
  EXPECT_EQ(cloud.labels, (std::vector<int32_t>{10, 11, 12, 10}));
}

TEST(Ply, ReadsLabelsFromASideFile) {
  const PointCloud unlabelled = ReadOk("valid/ply/side_labels.ply", "ply");
  EXPECT_EQ(unlabelled.size(), 4u);
  EXPECT_TRUE(unlabelled.labels.empty());
  EXPECT_EQ(unlabelled.feature_channels, 0);
  EXPECT_TRUE(unlabelled.features.empty());

  ReadOptions options;
  options.label_file = DataPath("valid/ply/side_labels.labels");
  EXPECT_EQ(ReadOk("valid/ply/side_labels.ply", "ply", options).labels, kLabels);
}

TEST(Ply, SideFileReplacesTheLabelProperty) {
  ReadOptions options;
  options.label_file = DataPath("valid/ply/side_labels.labels");
  EXPECT_EQ(ReadOk("valid/ply/georeferenced.ply", "ply", options).labels, kLabels);
}

TEST(Ply, RequireLabelsRejectsAnUnlabelledCloud) {
  ReadOptions options;
  options.require_labels = true;
  absl::StatusOr<PointCloud> cloud = ReadPly(DataPath("valid/ply/side_labels.ply"), options);
  ASSERT_FALSE(cloud.ok());
  EXPECT_EQ(cloud.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cloud.status().message()), HasSubstr("no labels"));
}

// ---------------------------------------------------------------------------
// LAS

// make_malformed.py LAS_POINTS with scale 0.01 and offset (1000, 2000, 50).
constexpr double kLasXyz[3][3] = {{1000, 2000, 50}, {1001.5, 2000.25, 48}, {999, 1999.99, 50.01}};

void ExpectLasPoints(const PointCloud& cloud) {
  ASSERT_EQ(cloud.size(), 3u);
  EXPECT_EQ(cloud.origin, (std::array<double, 3>{999, 1999, 48}));
  for (size_t i = 0; i < 3; ++i) {
    for (int a = 0; a < 3; ++a) EXPECT_NEAR(At(cloud, i, a), kLasXyz[i][a], 1e-5);
  }
  // Lower 5 bits of the classification byte: flags (withheld, synthetic)
  // are dropped.
  EXPECT_EQ(cloud.labels, (std::vector<int32_t>{2, 6, 5}));
}

TEST(Las, ReadsFormat3WithRgb) {
  const PointCloud cloud = ReadOk("valid/las/format3_v12.las", "las");
  ExpectLasPoints(cloud);
  ASSERT_EQ(cloud.feature_channels, 3);
  EXPECT_THAT(cloud.features, ElementsAre(1, 0, 0, 0, 1, 0, 0, 0, 32768 / 65535.0f));
}

TEST(Las, ReadsFormat2FromAVersion13Header) {
  const PointCloud cloud = ReadOk("valid/las/format2_v13.las", "las");
  ExpectLasPoints(cloud);
  EXPECT_EQ(cloud.feature_channels, 3);
  EXPECT_FLOAT_EQ(cloud.features[4], 1.0f);
}

TEST(Las, ReadsFormat1WithoutFeatures) {
  const PointCloud cloud = ReadOk("valid/las/format1_v10.las", "las");
  ExpectLasPoints(cloud);
  EXPECT_EQ(cloud.feature_channels, 0);
  EXPECT_TRUE(cloud.features.empty());
}

TEST(Las, Reads14CountAfterAVlrSkippingExtraBytes) {
  const PointCloud cloud = ReadOk("valid/las/format0_v14_extra_bytes.las", "las");
  ExpectLasPoints(cloud);
}

TEST(Las, ReadsLabelsFromASideFile) {
  ReadOptions options;
  options.label_file = DataPath("valid/las/side_labels.labels");
  EXPECT_EQ(ReadOk("valid/las/side_labels.las", "las", options).labels,
            (std::vector<int32_t>{7, 8, 9}));
}

// ---------------------------------------------------------------------------
// SemanticKITTI

TEST(SemanticKitti, ReadsScanAndLabelsFromTheDatasetLayout) {
  const PointCloud cloud =
      ReadOk("valid/semantickitti/sequences/00/velodyne/000000.bin", "semantickitti");
  EXPECT_THAT(cloud.xyz, ElementsAre(1.5, -2, 0.25, 10, 0, -1.75, -3, 4, 2));
  EXPECT_EQ(cloud.origin, (std::array<double, 3>{0, 0, 0}));
  EXPECT_EQ(cloud.feature_channels, 1);
  EXPECT_THAT(cloud.features, ElementsAre(0.5, 0, 1));
  // The instance id in the upper 16 bits is dropped.
  EXPECT_EQ(cloud.labels, (std::vector<int32_t>{40, 10, 252}));
}

TEST(SemanticKitti, NamedLabelFileAndUnlabelledScan) {
  EXPECT_TRUE(ReadOk("valid/semantickitti/unlabelled.bin", "semantickitti").labels.empty());
  ReadOptions options;
  options.kitti_label_file = DataPath("valid/semantickitti/sequences/00/labels/000000.label");
  EXPECT_EQ(ReadOk("valid/semantickitti/unlabelled.bin", "semantickitti", options).labels,
            (std::vector<int32_t>{40, 10, 252}));
}

TEST(SemanticKitti, LabelPathFollowsTheLayout) {
  EXPECT_EQ(KittiLabelPath("/d/sequences/08/velodyne/000123.bin"),
            "/d/sequences/08/labels/000123.label");
  EXPECT_EQ(KittiLabelPath("velodyne/000001.bin"), "labels/000001.label");
  EXPECT_EQ(KittiLabelPath("/d/scans/000001.bin"), "/d/scans/000001.label");
  EXPECT_EQ(KittiLabelPath("/d/not_velodyne/1.bin"), "/d/not_velodyne/1.label");
}

// ---------------------------------------------------------------------------
// S3DIS

TEST(S3dis, ReadsALabelledRoomFile) {
  const PointCloud cloud = ReadOk("valid/s3dis/room_labelled.txt", "s3dis");
  ExpectStandardPoints(cloud);
  EXPECT_EQ(cloud.labels, kLabels);
}

TEST(S3dis, ReadsAnUnlabelledRoomFileWithSideLabels) {
  const PointCloud unlabelled = ReadOk("valid/s3dis/room_unlabelled.txt", "s3dis");
  ExpectStandardPoints(unlabelled);
  EXPECT_TRUE(unlabelled.labels.empty());
  ReadOptions options;
  options.label_file = DataPath("valid/s3dis/room_unlabelled.labels");
  EXPECT_EQ(ReadOk("valid/s3dis/room_unlabelled.txt", "s3dis", options).labels, kLabels);
}

TEST(S3dis, ReadsAnnotationsLabelledByClassName) {
  // The room folder (with Annotations/ inside) and the Annotations folder
  // itself read the same; objects in name order, stairs as clutter.
  for (const char* path :
       {"valid/s3dis/Area_1/office_1", "valid/s3dis/Area_1/office_1/Annotations"}) {
    SCOPED_TRACE(path);
    const PointCloud cloud = ReadOk(path, "s3dis");
    EXPECT_THAT(cloud.xyz, ElementsAreArray({0.0f, 0.0f, 3.0f, 1.0f, 1.0f, 0.5f, 1.25f, 1.0f, 0.5f,
                                             5.0f, 5.0f, 1.0f}));
    EXPECT_EQ(cloud.labels, (std::vector<int32_t>{0, 8, 8, 12}));
    ASSERT_EQ(cloud.features.size(), 12u);
    EXPECT_FLOAT_EQ(cloud.features[0], 10 / 255.0f);
    EXPECT_FLOAT_EQ(cloud.features[11], 9 / 255.0f);
    EXPECT_EQ(cloud.source, DataPath(path));
  }
}

TEST(S3dis, ClassIndex) {
  EXPECT_EQ(kS3disClasses.size(), 13u);
  EXPECT_EQ(*S3disClassIndex("ceiling"), 0);
  EXPECT_EQ(*S3disClassIndex("chair"), 8);
  EXPECT_EQ(*S3disClassIndex("clutter"), 12);
  EXPECT_EQ(*S3disClassIndex("stairs"), 12);
  EXPECT_EQ(S3disClassIndex("Chair").status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Dispatch

TEST(ReadPointCloud, DispatchesByFormatName) {
  EXPECT_EQ(ReadOk("valid/ply/points_le.ply", "PLY").size(), 4u);
  EXPECT_EQ(ReadOk("valid/las/format3_v12.las", "las").size(), 3u);
  absl::StatusOr<PointCloud> unknown =
      ReadPointCloud(DataPath("valid/ply/points_le.ply"), "xyz", {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown point cloud format 'xyz'"));
}

TEST(ReadPointCloud, WrongFormatForTheFileIsAnError) {
  absl::StatusOr<PointCloud> cloud =
      ReadPointCloud(DataPath("valid/las/format3_v12.las"), "ply", {});
  ASSERT_FALSE(cloud.ok());
  EXPECT_THAT(std::string(cloud.status().message()), HasSubstr("no 'ply' magic"));
  cloud = ReadPointCloud(DataPath("valid/ply/points_le.ply"), "las", {});
  ASSERT_FALSE(cloud.ok());
  EXPECT_THAT(std::string(cloud.status().message()), HasSubstr("no 'LASF' magic"));
}

TEST(ReadPointCloud, MissingFileIsNotFound) {
  for (const char* format : {"ply", "las", "semantickitti", "s3dis"}) {
    absl::StatusOr<PointCloud> cloud = ReadPointCloud(DataPath("no/such/file"), format, {});
    ASSERT_FALSE(cloud.ok()) << format;
    EXPECT_EQ(cloud.status().code(), absl::StatusCode::kNotFound) << format;
    EXPECT_THAT(std::string(cloud.status().message()), HasSubstr("no/such/file"));
  }
}

// Confinement: with data roots set, every file and folder a reader opens
// must lie inside them as opened, after every link.
class Confinement : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "readers_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    top_ = pattern;
    root_ = top_ + "/root";
    outside_ = top_ + "/outside";
    std::filesystem::create_directories(root_);
    std::filesystem::create_directories(outside_);
    confined_.data_roots = std::vector<std::string>{root_};
  }
  void TearDown() override { std::filesystem::remove_all(top_); }

  void ExpectOutside(const absl::StatusOr<PointCloud>& cloud, const std::string& path,
                     const std::string& leads_to) {
    ASSERT_FALSE(cloud.ok());
    EXPECT_EQ(cloud.status().code(), absl::StatusCode::kPermissionDenied) << cloud.status();
    EXPECT_THAT(
        std::string(cloud.status().message()),
        HasSubstr(path + ": leads to " + leads_to + ", outside the data roots (" + root_ + ")"));
  }

  std::string top_, root_, outside_;
  ReadOptions confined_;
};

TEST_F(Confinement, FilesInsideTheRootsAreRead) {
  std::filesystem::copy_file(DataPath("valid/ply/points_le.ply"), root_ + "/a.ply");
  std::filesystem::create_symlink("a.ply", root_ + "/b.ply");  // a link that stays inside
  absl::StatusOr<PointCloud> direct = ReadPointCloud(root_ + "/a.ply", "ply", confined_);
  ASSERT_TRUE(direct.ok()) << direct.status();
  ExpectStandardPoints(*direct);
  absl::StatusOr<PointCloud> linked = ReadPointCloud(root_ + "/b.ply", "ply", confined_);
  ASSERT_TRUE(linked.ok()) << linked.status();
  ExpectStandardPoints(*linked);
}

TEST_F(Confinement, AFileLinkedOutIsNotRead) {
  std::filesystem::copy_file(DataPath("valid/ply/points_le.ply"), outside_ + "/a.ply");
  std::filesystem::create_symlink(outside_ + "/a.ply", root_ + "/a.ply");
  ExpectOutside(ReadPointCloud(root_ + "/a.ply", "ply", confined_), root_ + "/a.ply",
                outside_ + "/a.ply");
  // A folder on the way that is a link counts the same.
  std::filesystem::create_directory_symlink(outside_, root_ + "/dir");
  ExpectOutside(ReadPointCloud(root_ + "/dir/a.ply", "ply", confined_), root_ + "/dir/a.ply",
                outside_ + "/a.ply");
  // Without roots nothing is confined; with an empty list nothing is inside.
  EXPECT_TRUE(ReadPointCloud(root_ + "/a.ply", "ply", {}).ok());
  ReadOptions nothing;
  nothing.data_roots = std::vector<std::string>{};
  absl::StatusOr<PointCloud> none =
      ReadPointCloud(DataPath("valid/ply/points_le.ply"), "ply", nothing);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kPermissionDenied) << none.status();
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("(none configured)"));
}

TEST_F(Confinement, SideFilesAndFoldersAreConfinedToo) {
  // A label side file.
  std::filesystem::copy_file(DataPath("valid/ply/side_labels.ply"), root_ + "/room.ply");
  std::filesystem::copy_file(DataPath("valid/ply/side_labels.labels"), outside_ + "/labels");
  std::filesystem::create_symlink(outside_ + "/labels", root_ + "/labels");
  ReadOptions side = confined_;
  side.label_file = root_ + "/labels";
  ExpectOutside(ReadPointCloud(root_ + "/room.ply", "ply", side), root_ + "/labels",
                outside_ + "/labels");
  // SemanticKITTI's labels/ sibling.
  const std::string seq = root_ + "/sequences/00";
  std::filesystem::create_directories(seq + "/velodyne");
  std::filesystem::copy_file(DataPath("valid/semantickitti/sequences/00/velodyne/000000.bin"),
                             seq + "/velodyne/000000.bin");
  std::filesystem::create_directories(outside_ + "/kitti_labels");
  std::filesystem::copy_file(DataPath("valid/semantickitti/sequences/00/labels/000000.label"),
                             outside_ + "/kitti_labels/000000.label");
  std::filesystem::create_directory_symlink(outside_ + "/kitti_labels", seq + "/labels");
  ExpectOutside(ReadPointCloud(seq + "/velodyne/000000.bin", "semantickitti", confined_),
                seq + "/labels/000000.label", outside_ + "/kitti_labels/000000.label");
  // An S3DIS room's Annotations/ folder.
  std::filesystem::create_directories(root_ + "/office_1");
  std::filesystem::copy(DataPath("valid/s3dis/Area_1/office_1/Annotations"),
                        outside_ + "/Annotations");
  std::filesystem::create_directory_symlink(outside_ + "/Annotations",
                                            root_ + "/office_1/Annotations");
  ExpectOutside(ReadPointCloud(root_ + "/office_1", "s3dis", confined_),
                root_ + "/office_1/Annotations", outside_ + "/Annotations");
  // One object file of a real Annotations/ folder.
  std::filesystem::create_directories(root_ + "/office_2/Annotations");
  std::filesystem::copy_file(outside_ + "/Annotations/ceiling_1.txt",
                             root_ + "/office_2/Annotations/ceiling_1.txt");
  std::filesystem::create_symlink(outside_ + "/Annotations/chair_2.txt",
                                  root_ + "/office_2/Annotations/chair_2.txt");
  ExpectOutside(ReadPointCloud(root_ + "/office_2", "s3dis", confined_),
                root_ + "/office_2/Annotations/chair_2.txt", outside_ + "/Annotations/chair_2.txt");
}

// Only regular files are read: a FIFO would block open(2) until a writer
// came. The wait below is a hang guard (the FIFO is then opened for
// writing to let a stuck reader go), not a timing assertion.
TEST_F(Confinement, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = root_ + "/labels";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  std::filesystem::copy_file(DataPath("valid/ply/side_labels.ply"), root_ + "/room.ply");
  for (const std::string& path : {fifo, root_ + "/room.ply"}) {
    SCOPED_TRACE(path);
    ReadOptions options = confined_;
    if (path != fifo) options.label_file = fifo;
    std::future<absl::StatusOr<PointCloud>> read =
        std::async(std::launch::async, [&] { return ReadPointCloud(path, "ply", options); });
    if (read.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << "the reader blocked on the FIFO";
      std::ofstream unblock(fifo);
    }
    absl::StatusOr<PointCloud> cloud = read.get();
    ASSERT_FALSE(cloud.ok());
    EXPECT_EQ(cloud.status().code(), absl::StatusCode::kInvalidArgument) << cloud.status();
    EXPECT_THAT(std::string(cloud.status().message()), HasSubstr(fifo + ": not a regular file"));
  }
}

// A file above options.max_file_bytes is refused before its buffer is
// allocated: a sparse 1 TiB file, which could never be allocated, fails
// with the limit's error, not with bad_alloc.
TEST_F(Confinement, FilesAboveTheSizeLimitAreRefusedBeforeAllocating) {
  const std::string huge = root_ + "/huge.ply";
  std::ofstream(huge) << "ply\n";
  std::filesystem::resize_file(huge, uint64_t{1} << 40);
  ReadOptions options;
  options.max_file_bytes = uint64_t{4096} << 20;
  for (const char* format : {"ply", "las", "semantickitti", "s3dis"}) {
    absl::StatusOr<PointCloud> cloud = ReadPointCloud(huge, format, options);
    ASSERT_FALSE(cloud.ok()) << format;
    EXPECT_EQ(cloud.status().code(), absl::StatusCode::kInvalidArgument) << cloud.status();
    EXPECT_THAT(std::string(cloud.status().message()),
                HasSubstr(huge + ": 1048576 MiB (1099511627776 bytes) is more than "
                                 "data.max_file_mb (4096 MiB)"));
  }
  // At the limit is fine; one byte over is not.
  std::filesystem::copy_file(DataPath("valid/ply/points_le.ply"), root_ + "/a.ply");
  const uint64_t size = std::filesystem::file_size(root_ + "/a.ply");
  options.max_file_bytes = size;
  EXPECT_TRUE(ReadPointCloud(root_ + "/a.ply", "ply", options).ok());
  options.max_file_bytes = size - 1;
  EXPECT_EQ(ReadPointCloud(root_ + "/a.ply", "ply", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// What viewers see of a reader error: where and what, but nothing the file
// says. The message itself (the rank's log, these tests) keeps it all.
TEST(ViewerMessage, WithholdsEveryPieceOfTheFile) {
  struct Case {
    std::string format, file;
    std::string content;  // quoted in the message, withheld from viewers
    std::string viewer;   // part of the viewer message
    std::string label_file = "";
  };
  const Case cases[] = {
      {"ply", "not_a_number.ply", "2.2.5", "'<withheld>' is not a number (property '<withheld>'"},
      {"ply", "unknown_format.ply", "binary_middle_endian", "unknown format '<withheld>'"},
      {"ply", "unexpected_keyword.ply", "end_headr", "header line 13: unexpected '<withheld>'"},
      {"ply", "unknown_type.ply", "float16", "unknown property type '<withheld>' for property"},
      {"ply", "negative_label.ply", "-7", "label <withheld> at point 3 is below -1"},
      {"ply", "value_out_of_range.ply", "300", "value <withheld> of uchar property '<withheld>'"},
      {"s3dis", "header_line.txt", "'x'", "line 1: '<withheld>' is not a number"},
      {"s3dis", "colour_out_of_range.txt", "300", "line 1: colour <withheld> is outside [0, 255]"},
      {"s3dis", "fractional_label.txt", "1.5", "line 3: label <withheld> is not an integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.format + "/" + c.file);
    const std::string path = DataPath("malformed/" + c.format + "/" + c.file);
    absl::StatusOr<PointCloud> cloud = ReadPointCloud(path, c.format, {});
    ASSERT_FALSE(cloud.ok());
    EXPECT_THAT(std::string(cloud.status().message()), HasSubstr(c.content));
    const std::string viewer = ViewerMessage(cloud.status());
    EXPECT_THAT(viewer, HasSubstr(path + ": "));
    EXPECT_THAT(viewer, HasSubstr(c.viewer));
    EXPECT_EQ(viewer.find(c.content), std::string::npos) << viewer;
  }
  // A label side file that is not labels at all.
  const std::string dir = DataPath("valid/ply/");
  std::string pattern = (std::filesystem::temp_directory_path() / "readers_test.XXXXXX").string();
  ASSERT_NE(mkdtemp(pattern.data()), nullptr);
  std::ofstream(pattern + "/labels") << "hunter2\n";
  ReadOptions options;
  options.label_file = pattern + "/labels";
  absl::StatusOr<PointCloud> cloud = ReadPointCloud(dir + "side_labels.ply", "ply", options);
  std::filesystem::remove_all(pattern);
  ASSERT_FALSE(cloud.ok());
  EXPECT_THAT(std::string(cloud.status().message()), HasSubstr("line 1: 'hunter2' is not a label"));
  EXPECT_THAT(ViewerMessage(cloud.status()), HasSubstr("line 1: '<withheld>' is not a label"));
  EXPECT_EQ(ViewerMessage(cloud.status()).find("hunter2"), std::string::npos);
  // Nothing quoted: the viewer sees the message as it is.
  absl::StatusOr<PointCloud> truncated =
      ReadPointCloud(DataPath("malformed/las/truncated.las"), "las", {});
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(ViewerMessage(truncated.status()), truncated.status().message());
}

TEST(ViewerMessage, MarkersInTheFileCannotUnwithholdIt) {
  const std::string marked = "a " + FileContent("x\x1fy\x1ez") + " b";
  const absl::Status s = ContentError(absl::StatusCode::kDataLoss, marked);
  EXPECT_EQ(s.message(), "a xyz b");
  EXPECT_EQ(ViewerMessage(s), "a <withheld> b");
  EXPECT_EQ(ViewerMessage(absl::DataLossError("plain")), "plain");
}

TEST(PointCloudFormat, StringRoundTrip) {
  for (PointCloudFormat format : {PointCloudFormat::kPly, PointCloudFormat::kLas,
                                  PointCloudFormat::kSemanticKitti, PointCloudFormat::kS3dis}) {
    absl::StatusOr<PointCloudFormat> parsed = PointCloudFormatFromString(ToString(format));
    ASSERT_TRUE(parsed.ok()) << ToString(format);
    EXPECT_EQ(*parsed, format);
  }
  EXPECT_EQ(ToString(PointCloudFormat::kSemanticKitti), "semantickitti");
  EXPECT_FALSE(PointCloudFormatFromString("laz").ok());
}

}  // namespace
}  // namespace trainsup::worker
