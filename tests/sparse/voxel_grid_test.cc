// The torch-free voxelizer against a brute-force reference, and against
// Quantize, which wraps it.
#include "sparse/voxel_grid.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "sparse/quantize.h"

namespace trainsup::sparse {
namespace {

// Random points in a small box (so voxels hold several points), with
// features and labels (some ignored).
struct RandomCloud {
  std::vector<float> points;
  std::vector<float> features;
  std::vector<int32_t> labels;
  int64_t n = 0;
  int64_t channels = 2;
};

RandomCloud MakeCloud(int64_t n, uint64_t seed, int32_t ignore_label) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> pos(-0.35f, 0.45f), feat(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> label(0, 4);
  RandomCloud c;
  c.n = n;
  for (int64_t i = 0; i < n; ++i) {
    for (int a = 0; a < 3; ++a) c.points.push_back(pos(rng));
    for (int k = 0; k < c.channels; ++k) c.features.push_back(feat(rng));
    const int32_t l = label(rng);
    c.labels.push_back(l == 4 ? ignore_label : l);
  }
  return c;
}

// What the voxelizer must compute, the slow way: a map from voxel to its
// points in point order.
struct Reference {
  std::vector<int32_t> coordinates;
  std::vector<int64_t> inverse, counts;
  std::vector<float> features;
  std::vector<int32_t> labels;
};

Reference Brute(const RandomCloud& c, double voxel_size, int32_t ignore_label) {
  std::map<std::array<int32_t, 3>, std::vector<int64_t>> voxels;
  std::vector<std::array<int32_t, 3>> key(c.n);
  for (int64_t i = 0; i < c.n; ++i) {
    for (int a = 0; a < 3; ++a) {
      key[i][a] =
          static_cast<int32_t>(std::floor(static_cast<double>(c.points[3 * i + a]) / voxel_size));
    }
    voxels[key[i]].push_back(i);
  }
  Reference r;
  std::map<std::array<int32_t, 3>, int64_t> row;
  for (const auto& [k, members] : voxels) {
    row[k] = static_cast<int64_t>(r.counts.size());
    r.coordinates.insert(r.coordinates.end(), k.begin(), k.end());
    r.counts.push_back(static_cast<int64_t>(members.size()));
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      float sum = 0;
      for (int64_t i : members) sum += c.features[i * c.channels + ch];
      r.features.push_back(sum / static_cast<float>(members.size()));
    }
    std::map<int32_t, int64_t> votes;
    for (int64_t i : members) {
      if (c.labels[i] != ignore_label) ++votes[c.labels[i]];
    }
    int32_t best = ignore_label;
    int64_t best_votes = 0;
    for (const auto& [l, v] : votes) {  // ascending labels: ties stay low
      if (v > best_votes) {
        best = l;
        best_votes = v;
      }
    }
    r.labels.push_back(best);
  }
  for (int64_t i = 0; i < c.n; ++i) r.inverse.push_back(row[key[i]]);
  return r;
}

TEST(VoxelGrid, MatchesABruteForceReference) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const RandomCloud c = MakeCloud(3000, seed, -1);
    const Reference want = Brute(c, 0.1, -1);
    const VoxelGrid grid = VoxelizePoints(c.points.data(), c.n, 0.1);
    EXPECT_EQ(grid.coordinates, want.coordinates);
    EXPECT_EQ(grid.inverse, want.inverse);
    EXPECT_EQ(grid.counts, want.counts);
    EXPECT_EQ(MeanFeatures(grid, c.features.data(), c.channels), want.features);
    EXPECT_EQ(MajorityLabels(grid, c.labels.data(), -1), want.labels);
    std::vector<int64_t> wide(c.labels.begin(), c.labels.end());
    std::vector<int64_t> wide_want(want.labels.begin(), want.labels.end());
    EXPECT_EQ(MajorityLabels(grid, wide.data(), int64_t{-1}), wide_want);
  }
}

TEST(VoxelGrid, AgreesWithQuantizeOnRandomInput) {
  for (uint64_t seed : {11u, 12u}) {
    const int64_t ignore = kDefaultIgnoreLabel;
    const RandomCloud c = MakeCloud(5000, seed, ignore);
    const VoxelGrid grid = VoxelizePoints(c.points.data(), c.n, 0.07);
    std::vector<int64_t> labels(c.labels.begin(), c.labels.end());
    at::Tensor p = at::from_blob(const_cast<float*>(c.points.data()), {c.n, 3}, at::kFloat);
    at::Tensor f =
        at::from_blob(const_cast<float*>(c.features.data()), {c.n, c.channels}, at::kFloat);
    at::Tensor l = at::from_blob(labels.data(), {c.n}, at::kLong);
    const Quantized q = Quantize(p, 0.07, f, l, ignore);
    ASSERT_EQ(q.coordinates.size(0), grid.size());
    const int32_t* qc = q.coordinates.data_ptr<int32_t>();
    EXPECT_EQ(std::vector<int32_t>(qc, qc + 3 * grid.size()), grid.coordinates);
    const int64_t* qi = q.inverse.data_ptr<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(qi, qi + c.n), grid.inverse);
    const int64_t* qn = q.counts.data_ptr<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(qn, qn + grid.size()), grid.counts);
    const float* qf = q.features.data_ptr<float>();
    EXPECT_EQ(std::vector<float>(qf, qf + c.channels * grid.size()),
              MeanFeatures(grid, c.features.data(), c.channels));
    const int64_t* ql = q.labels.data_ptr<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(ql, ql + grid.size()),
              MajorityLabels(grid, labels.data(), ignore));
    // Double points land in the same voxels as their float values.
    at::Tensor pd = p.to(at::kDouble);
    EXPECT_EQ(VoxelizePoints(pd.data_ptr<double>(), c.n, 0.07).inverse, grid.inverse);
  }
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(VoxelGrid, RejectsBadInputNamingTheRow) {
  std::vector<float> p = {0, 0, 0, 1, std::numeric_limits<float>::infinity(), 0};
  EXPECT_NE(ErrorOf([&] { VoxelizePoints(p.data(), 2, 0.1); }).find("point 1 is not finite"),
            std::string::npos);
  std::vector<double> far = {0, 0, 0, 0, 0, 1e7};
  EXPECT_NE(ErrorOf([&] {
              VoxelizePoints(far.data(), 2, 0.1);
            }).find("point 1 (0, 0, 1e+07) lies outside the representable voxel range"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { VoxelizePoints(far.data(), 1, 0.0); }).find("voxel_size"),
            std::string::npos);
  std::vector<float> two = {0, 0, 0, 0, 0, 0};
  const VoxelGrid grid = VoxelizePoints(two.data(), 2, 0.1);
  std::vector<int32_t> negative = {0, -7};
  EXPECT_EQ(ErrorOf([&] { MajorityLabels(grid, negative.data(), -1); }),
            "label -7 of point 1 is negative and not the ignore label -1");
  std::vector<int32_t> big = {70000, 1};
  EXPECT_EQ(ErrorOf([&] { MajorityLabels(grid, big.data(), -1); }),
            "label 70000 is too large (labels must be at most 65535)");
}

TEST(VoxelGrid, EmptyInputGivesNoVoxels) {
  const VoxelGrid grid = VoxelizePoints(static_cast<const float*>(nullptr), 0, 0.05);
  EXPECT_EQ(grid.size(), 0);
  EXPECT_TRUE(grid.inverse.empty());
  EXPECT_TRUE(MeanFeatures(grid, static_cast<const float*>(nullptr), 3).empty());
  EXPECT_TRUE(MajorityLabels(grid, static_cast<const int32_t*>(nullptr), -1).empty());
}

}  // namespace
}  // namespace trainsup::sparse
