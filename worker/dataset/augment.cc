#include "worker/dataset/augment.h"

#include <algorithm>
#include <utility>

#include "worker/dataset/random.h"

namespace trainsup::worker {
namespace {

// One stream per transform, so options toggle transforms independently.
enum Stream : uint64_t { kRotate = 1, kFlip, kScale, kJitter, kBrightness, kColorNoise };

}  // namespace

uint64_t AugmentSeed(uint64_t run_seed, int64_t epoch, int64_t index) {
  return MixSeed(run_seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
}

PointCloud Augment(PointCloud cloud, uint64_t seed, const AugmentOptions& options) {
  const size_t n = cloud.size();
  if (n == 0) return cloud;
  double lo[3], hi[3];
  for (int a = 0; a < 3; ++a) lo[a] = hi[a] = cloud.xyz[a];
  for (size_t i = 0; i < n; ++i) {
    for (int a = 0; a < 3; ++a) {
      lo[a] = std::min<double>(lo[a], cloud.xyz[3 * i + a]);
      hi[a] = std::max<double>(hi[a], cloud.xyz[3 * i + a]);
    }
  }
  const double centre[3] = {(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, (lo[2] + hi[2]) / 2};

  // The rotation's cosine and sine from a uniform point of the unit disk by
  // angle doubling: (u² - v², 2uv) / (u² + v²) is uniform on the circle,
  // and needs no libm.
  double cos_t = 1, sin_t = 0;
  if (options.rotate) {
    Rng rng(MixSeed(seed, kRotate));
    double u, v, r2;
    do {
      u = 2 * rng.Uniform() - 1;
      v = 2 * rng.Uniform() - 1;
      r2 = u * u + v * v;
    } while (r2 > 1 || r2 < 1e-12);
    cos_t = (u * u - v * v) / r2;
    sin_t = 2 * u * v / r2;
  }
  double flip_x = 1, flip_y = 1;
  if (options.flip) {
    Rng rng(MixSeed(seed, kFlip));
    if (rng.Bit()) flip_x = -1;
    if (rng.Bit()) flip_y = -1;
  }
  double scale = 1;
  if (options.scale_min != 1 || options.scale_max != 1) {
    Rng rng(MixSeed(seed, kScale));
    scale = rng.Uniform(options.scale_min, options.scale_max);
  }
  const bool jitter = options.jitter_sigma > 0;
  Rng jitter_rng(MixSeed(seed, kJitter));
  for (size_t i = 0; i < n; ++i) {
    float* p = cloud.xyz.data() + 3 * i;
    const double x = p[0] - centre[0], y = p[1] - centre[1], z = p[2] - centre[2];
    double q[3] = {scale * flip_x * (cos_t * x - sin_t * y),
                   scale * flip_y * (sin_t * x + cos_t * y), scale * z};
    if (jitter) {
      for (double& c : q) {
        c += std::clamp(options.jitter_sigma * jitter_rng.Normal(), -options.jitter_clip,
                        options.jitter_clip);
      }
    }
    for (int a = 0; a < 3; ++a) p[a] = static_cast<float>(q[a] + centre[a]);
  }

  if (cloud.feature_channels == 3 && (options.brightness > 0 || options.color_noise > 0)) {
    double offset = 0;
    if (options.brightness > 0) {
      Rng rng(MixSeed(seed, kBrightness));
      offset = rng.Uniform(-options.brightness, options.brightness);
    }
    Rng noise_rng(MixSeed(seed, kColorNoise));
    for (float& c : cloud.features) {
      double value = c + offset;
      if (options.color_noise > 0) value += options.color_noise * noise_rng.Normal();
      c = static_cast<float>(std::clamp(value, 0.0, 1.0));
    }
  }
  return cloud;
}

}  // namespace trainsup::worker
