// The readers on the real, labelled CGAL sample scans that
// deploy/fetch-sample-data.sh fetches (Debian's libcgal-demo, CC0): skipped,
// with a message, when they have not been fetched.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>

#include "worker/data/reader_util.h"
#include "worker/data/readers.h"

namespace trainsup::worker {
namespace {

std::string SamplePath(const std::string& name) {
  const char* dir = std::getenv("TRAINSUP_SAMPLE_DATA_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : TRAINSUP_SAMPLE_DATA_DIR) + "/" + name;
}

std::map<int32_t, int> Histogram(const std::vector<int32_t>& labels) {
  std::map<int32_t, int> counts;
  for (int32_t label : labels) ++counts[label];
  return counts;
}

void Print(const std::string& name, const PointCloud& cloud) {
  std::cout << std::setprecision(12) << name << ": " << cloud.size() << " points, origin "
            << cloud.origin[0] << " " << cloud.origin[1] << " " << cloud.origin[2] << ", labels";
  for (const auto& [label, count] : Histogram(cloud.labels)) {
    std::cout << " " << label << ":" << count;
  }
  std::cout << "\n";
}

// Largest extent along each axis, and that every coordinate is finite.
std::array<float, 3> Extent(const PointCloud& cloud) {
  std::array<float, 3> lo = {1e30f, 1e30f, 1e30f}, hi = {-1e30f, -1e30f, -1e30f};
  for (size_t i = 0; i < cloud.xyz.size(); ++i) {
    lo[i % 3] = std::min(lo[i % 3], cloud.xyz[i]);
    hi[i % 3] = std::max(hi[i % 3], cloud.xyz[i]);
  }
  return {hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]};
}

#define SKIP_IF_ABSENT(path)                                                 \
  if (!internal::PathExists(path))                                           \
  GTEST_SKIP() << path                                                       \
               << " is absent; run deploy/fetch-sample-data.sh to fetch it " \
                  "(or set TRAINSUP_SAMPLE_DATA_DIR)"

TEST(SampleData, UrbanLasHasGroundAndVegetation) {
  const std::string path = SamplePath("urban.las");
  SKIP_IF_ABSENT(path);
  absl::StatusOr<PointCloud> cloud = ReadPointCloud(path, "las", {});
  ASSERT_TRUE(cloud.ok()) << cloud.status();
  Print("urban.las", *cloud);
  EXPECT_EQ(cloud->size(), 13511u);
  // ASPRS classes: 1 unclassified, 2 ground, 4 medium vegetation.
  EXPECT_EQ(Histogram(cloud->labels), (std::map<int32_t, int>{{1, 29}, {2, 2441}, {4, 11041}}));
  EXPECT_EQ(cloud->feature_channels, 3);  // point format 3
  // UTM coordinates near (548875, 4176972): recentred, a ~92 × 70 × 33 m tile.
  EXPECT_EQ(cloud->origin, (std::array<double, 3>{548875, 4176972, 171}));
  const std::array<float, 3> extent = Extent(*cloud);
  EXPECT_NEAR(extent[0], 92.05, 0.01);
  EXPECT_NEAR(extent[1], 70.35, 0.01);
  EXPECT_NEAR(extent[2], 32.90, 0.01);
}

TEST(SampleData, B9TrainingPlyHasGroundVegetationRoofAndUnlabelled) {
  const std::string path = SamplePath("b9_training.ply");
  SKIP_IF_ABSENT(path);
  absl::StatusOr<PointCloud> cloud = ReadPointCloud(path, "ply", {});
  ASSERT_TRUE(cloud.ok()) << cloud.status();
  Print("b9_training.ply", *cloud);
  EXPECT_EQ(cloud->size(), 22300u);
  // The "label" property: -1 unlabelled, 0 ground, 1 vegetation, 2 roof.
  EXPECT_EQ(Histogram(cloud->labels),
            (std::map<int32_t, int>{{-1, 19853}, {0, 1567}, {1, 314}, {2, 566}}));
  EXPECT_EQ(cloud->feature_channels, 3);
  EXPECT_EQ(cloud->origin, (std::array<double, 3>{596648, 243620, 73}));
  const std::array<float, 3> extent = Extent(*cloud);
  EXPECT_NEAR(extent[0], 90.875, 0.01);
  EXPECT_NEAR(extent[1], 111.97, 0.01);
  EXPECT_NEAR(extent[2], 23.684, 0.01);
}

}  // namespace
}  // namespace trainsup::worker
