// Quantization, collation and the synthetic scene generator.
#include "sparse/quantize.h"

#include <gtest/gtest.h>

#include <cmath>

#include "sparse/scene.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

TEST(Quantize, MergesPointsIntoSortedVoxels) {
  at::Tensor p = at::tensor({0.05, 0.05, 0.05,    // voxel (0,0,0)
                             0.09, 0.01, 0.02,    // voxel (0,0,0)
                             -0.01, 0.0, 0.0,     // voxel (-1,0,0)
                             0.25, 0.31, -0.29},  // voxel (2,3,-3)
                            at::kDouble)
                     .view({4, 3});
  at::Tensor f = at::tensor({1.0, 3.0, 10.0, 20.0}, at::kDouble).view({4, 1});
  at::Tensor l = at::tensor(std::vector<int64_t>{2, 2, 1, kDefaultIgnoreLabel}, at::kLong);
  Quantized q = Quantize(p, 0.1, f, l);
  ASSERT_EQ(q.coordinates.size(0), 3);
  EXPECT_TRUE(
      at::equal(q.coordinates, at::tensor({-1, 0, 0, 0, 0, 0, 2, 3, -3}, at::kInt).view({3, 3})));
  EXPECT_TRUE(at::equal(q.inverse, at::tensor({1, 1, 0, 2}, at::kLong)));
  EXPECT_TRUE(at::allclose(q.features, at::tensor({10.0, 2.0, 20.0}, at::kDouble).view({3, 1})));
  EXPECT_TRUE(
      at::equal(q.labels, at::tensor(std::vector<int64_t>{1, 2, kDefaultIgnoreLabel}, at::kLong)));
  EXPECT_TRUE(at::equal(q.counts, at::tensor({1, 2, 1}, at::kLong)));
}

TEST(Quantize, MajorityVoteIgnoresTheIgnoreLabelAndBreaksTiesLow) {
  at::Tensor p = at::zeros({6, 3});
  at::Tensor l = at::tensor({3, 5, 5, 3, -1, -1}, at::kLong);
  Quantized q = Quantize(p, 1.0, {}, l, -1);
  ASSERT_EQ(q.labels.size(0), 1);
  EXPECT_EQ(q.labels[0].item<int64_t>(), 3);
}

TEST(Quantize, RejectsBadInputNamingTheProblem) {
  const auto message = testing::ErrorMessage;
  at::Tensor p = at::zeros({3, 3});
  p[1][2] = std::nan("");
  EXPECT_NE(message([&] { Quantize(p, 0.1); }).find("point 1 is not finite"), std::string::npos);
  EXPECT_NE(message([&] {
              Quantize(at::zeros({3, 3}), 0.0);
            }).find("voxel_size"),
            std::string::npos);
  EXPECT_NE(message([&] { Quantize(at::zeros({3, 2}), 0.1); }).find("N x 3"), std::string::npos);
  EXPECT_NE(message([&] {
              Quantize(at::full({1, 3}, 1e6), 0.01);
            }).find("outside the representable"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Quantize(at::zeros({3, 3}), 0.1, at::zeros({2, 1}));
            }).find("features"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Quantize(at::zeros({3, 3}), 0.1, {}, at::zeros({2}, at::kLong));
            }).find("2 labels for 3 points"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Quantize(at::zeros({2, 3}), 0.1, {}, at::tensor({0, -7}, at::kLong));
            }).find("label -7 of point 1"),
            std::string::npos);
}

TEST(Collate, StacksScenesAndSplitsThemBack) {
  at::Tensor a = at::tensor({0, 0, 0, 1, 2, 3}, at::kInt).view({2, 3});
  at::Tensor b = at::tensor({-4, 5, 6}, at::kInt).view({1, 3});
  at::Tensor fa = at::randn({2, 2}), fb = at::randn({1, 2});
  Collated c = Collate({a, b}, {fa, fb}, {at::tensor({1, 2}), at::tensor({3})});
  EXPECT_EQ(c.offsets, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_TRUE(at::equal(c.coordinates,
                        at::tensor({0, 0, 0, 0, 0, 1, 2, 3, 1, -4, 5, 6}, at::kInt).view({3, 4})));
  EXPECT_TRUE(at::equal(c.labels, at::tensor({1, 2, 3})));
  auto parts = Decollate(c.features, c.coordinates, 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_TRUE(at::equal(parts[0], fa));
  EXPECT_TRUE(at::equal(parts[1], fb));
  EXPECT_THROW(Collate({a, b}, {fa}), c10::Error);
  EXPECT_THROW(Collate({a}, {fb}), c10::Error);
}

TEST(Scene, IsSeededAndLabelled) {
  SceneOptions o = ScenePreset("small", 4);
  o.num_points = 20000;
  Scene s1 = GenerateScene(o), s2 = GenerateScene(o);
  EXPECT_EQ(s1.points, s2.points);
  EXPECT_EQ(s1.labels, s2.labels);
  EXPECT_EQ(s1.size(), 20000);
  o.seed = 5;
  EXPECT_NE(GenerateScene(o).points, s1.points);
  std::vector<int64_t> per_class(kNumSceneClasses, 0);
  for (int32_t l : s1.labels) {
    ASSERT_GE(l, 0);
    ASSERT_LT(l, kNumSceneClasses);
    ++per_class[l];
  }
  for (int c = 0; c < kNumSceneClasses; ++c) EXPECT_GT(per_class[c], 0) << ToString(SceneClass(c));
  for (size_t i = 0; i < s1.points.size(); i += 3) {
    ASSERT_GE(s1.points[i + 2], -0.05f);
    ASSERT_LE(s1.points[i + 2], o.height + 0.05f);
  }
  EXPECT_THROW(ScenePreset("gigantic"), std::invalid_argument);
}

TEST(Scene, PresetsGrowFromSmallToHuge) {
  int64_t previous = 0;
  for (const char* name : {"small", "default", "large", "huge"}) {
    SceneOptions o = ScenePreset(name);
    EXPECT_GT(o.num_points, previous) << name;
    previous = o.num_points;
  }
}

}  // namespace
}  // namespace trainsup::sparse
