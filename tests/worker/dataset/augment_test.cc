// Augmentation: a pure function of (cloud, seed), and each transform does
// what it claims.
#include "worker/dataset/augment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "worker/dataset/random.h"

namespace trainsup::worker {
namespace {

// 500 points in a 4 x 3 x 2 m box with rgb covering [0, 1] (the ends
// included) and labels.
PointCloud MakeCloud() {
  PointCloud c;
  c.feature_channels = 3;
  Rng rng(42);
  for (int i = 0; i < 500; ++i) {
    c.xyz.push_back(static_cast<float>(rng.Uniform(0, 4)));
    c.xyz.push_back(static_cast<float>(rng.Uniform(0, 3)));
    c.xyz.push_back(static_cast<float>(rng.Uniform(0, 2)));
    for (int k = 0; k < 3; ++k) c.features.push_back(i % 3 == 0 ? 0.0f : i % 3 == 1 ? 1.0f : 0.5f);
    c.labels.push_back(i % 4 - 1);
  }
  c.origin = {100, 200, 5};
  c.source = "test cloud";
  return c;
}

AugmentOptions Nothing() {
  AugmentOptions o;
  o.rotate = false;
  o.flip = false;
  o.scale_min = o.scale_max = 1;
  o.jitter_sigma = 0;
  o.brightness = 0;
  o.color_noise = 0;
  return o;
}

// The bounding-box centre, about which the geometric transforms act.
std::array<double, 3> Centre(const PointCloud& c) {
  std::array<double, 3> lo, hi;
  for (int a = 0; a < 3; ++a) lo[a] = hi[a] = c.xyz[a];
  for (size_t i = 0; i < c.size(); ++i) {
    for (int a = 0; a < 3; ++a) {
      lo[a] = std::min<double>(lo[a], c.xyz[3 * i + a]);
      hi[a] = std::max<double>(hi[a], c.xyz[3 * i + a]);
    }
  }
  return {(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, (lo[2] + hi[2]) / 2};
}

TEST(Augment, IsAPureFunctionOfCloudAndSeed) {
  const PointCloud c = MakeCloud();
  const PointCloud a = Augment(c, 99), b = Augment(c, 99), other = Augment(c, 100);
  EXPECT_EQ(a.xyz, b.xyz);
  EXPECT_EQ(a.features, b.features);
  EXPECT_NE(a.xyz, other.xyz);
  EXPECT_NE(a.features, other.features);
  EXPECT_NE(a.xyz, c.xyz);
  EXPECT_EQ(a.labels, c.labels);
  EXPECT_EQ(a.origin, c.origin);
  EXPECT_EQ(a.source, c.source);
  // Nothing enabled: nothing changes.
  const PointCloud same = Augment(c, 99, Nothing());
  EXPECT_EQ(same.xyz, c.xyz);
  EXPECT_EQ(same.features, c.features);
}

TEST(AugmentSeed, DependsOnRunSeedEpochAndIndex) {
  std::set<uint64_t> seeds;
  for (uint64_t run : {1u, 2u}) {
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      for (int64_t index = 0; index < 5; ++index) {
        seeds.insert(AugmentSeed(run, epoch, index));
        EXPECT_EQ(AugmentSeed(run, epoch, index), MixSeed(run, epoch, index));
      }
    }
  }
  EXPECT_EQ(seeds.size(), 30u);
  EXPECT_NE(AugmentSeed(1, 2, 3), AugmentSeed(1, 3, 2));
}

TEST(Augment, RotationKeepsHeightAndDistanceFromTheAxis) {
  const PointCloud c = MakeCloud();
  const std::array<double, 3> m = Centre(c);
  AugmentOptions o = Nothing();
  o.rotate = true;
  std::set<float> first_x;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const PointCloud r = Augment(c, seed, o);
    first_x.insert(r.xyz[0]);
    for (size_t i = 0; i < c.size(); ++i) {
      ASSERT_EQ(r.xyz[3 * i + 2], c.xyz[3 * i + 2]);
      const double before = std::hypot(c.xyz[3 * i] - m[0], c.xyz[3 * i + 1] - m[1]);
      const double after = std::hypot(r.xyz[3 * i] - m[0], r.xyz[3 * i + 1] - m[1]);
      ASSERT_NEAR(after, before, 1e-5);
    }
  }
  EXPECT_EQ(first_x.size(), 8u);  // a different angle for every seed
}

TEST(Augment, FlipsMirrorXAndYAboutTheCentre) {
  const PointCloud c = MakeCloud();
  const std::array<double, 3> m = Centre(c);
  AugmentOptions o = Nothing();
  o.flip = true;
  std::set<std::pair<bool, bool>> seen;
  for (uint64_t seed = 0; seed < 32; ++seed) {
    const PointCloud f = Augment(c, seed, o);
    const bool fx = std::abs(f.xyz[0] - c.xyz[0]) > 1e-4;
    const bool fy = std::abs(f.xyz[1] - c.xyz[1]) > 1e-4;
    seen.insert({fx, fy});
    for (size_t i = 0; i < c.size(); ++i) {
      for (int a = 0; a < 2; ++a) {
        const double want = (a == 0 ? fx : fy) ? 2 * m[a] - c.xyz[3 * i + a] : c.xyz[3 * i + a];
        ASSERT_NEAR(f.xyz[3 * i + a], want, 1e-5);
      }
      ASSERT_EQ(f.xyz[3 * i + 2], c.xyz[3 * i + 2]);
    }
  }
  EXPECT_EQ(seen.size(), 4u);  // no flip, x, y, both
}

TEST(Augment, ScalingIsOneFactorWithinItsBounds) {
  const PointCloud c = MakeCloud();
  const std::array<double, 3> m = Centre(c);
  AugmentOptions o = Nothing();
  o.scale_min = 0.9;
  o.scale_max = 1.1;
  double lo = 2, hi = 0;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    const PointCloud s = Augment(c, seed, o);
    const double factor = (s.xyz[0] - m[0]) / (c.xyz[0] - m[0]);
    ASSERT_GE(factor, 0.9 - 1e-5);
    ASSERT_LT(factor, 1.1 + 1e-5);
    lo = std::min(lo, factor);
    hi = std::max(hi, factor);
    for (size_t i = 0; i < 3 * c.size(); ++i) {
      ASSERT_NEAR(s.xyz[i] - m[i % 3], factor * (c.xyz[i] - m[i % 3]), 1e-4);
    }
  }
  EXPECT_LT(lo, 0.95);  // the range is used, not one value
  EXPECT_GT(hi, 1.05);
}

TEST(Augment, JitterIsSmallGaussianNoiseClipped) {
  const PointCloud c = MakeCloud();
  AugmentOptions o = Nothing();
  o.jitter_sigma = 0.005;
  o.jitter_clip = 0.02;
  const PointCloud j = Augment(c, 5, o);
  double sum = 0, sum2 = 0, max_abs = 0;
  for (size_t i = 0; i < j.xyz.size(); ++i) {
    const double d = static_cast<double>(j.xyz[i]) - c.xyz[i];
    sum += d;
    sum2 += d * d;
    max_abs = std::max(max_abs, std::abs(d));
  }
  const double n = static_cast<double>(j.xyz.size());
  EXPECT_LE(max_abs, 0.02 + 1e-6);
  EXPECT_GT(max_abs, 0.01);
  EXPECT_NEAR(sum / n, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.005, 0.0008);
  // A tight clip bounds every offset.
  o.jitter_clip = 0.003;
  const PointCloud clipped = Augment(c, 5, o);
  for (size_t i = 0; i < clipped.xyz.size(); ++i) {
    ASSERT_LE(std::abs(static_cast<double>(clipped.xyz[i]) - c.xyz[i]), 0.003 + 1e-6);
  }
}

TEST(Augment, ColourJitterStaysInTheUnitRange) {
  const PointCloud c = MakeCloud();
  AugmentOptions o = Nothing();
  o.brightness = 0.1;
  o.color_noise = 0.01;
  int changed = 0;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const PointCloud j = Augment(c, seed, o);
    EXPECT_EQ(j.xyz, c.xyz);
    for (size_t i = 0; i < j.features.size(); ++i) {
      ASSERT_GE(j.features[i], 0.0f);
      ASSERT_LE(j.features[i], 1.0f);
      ASSERT_LE(std::abs(j.features[i] - c.features[i]), 0.1 + 6 * 0.01);
      changed += j.features[i] != c.features[i];
    }
  }
  EXPECT_GT(changed, 0);
  // Only rgb (three channels) is colour-jittered.
  PointCloud remission = c;
  remission.feature_channels = 1;
  remission.features.resize(c.size());
  EXPECT_EQ(Augment(remission, 3, o).features, remission.features);
}

}  // namespace
}  // namespace trainsup::worker
