// A seeded synthetic indoor-scene generator: a room (floor, walls) with
// boxes and cylinders, points sampled uniformly on the surfaces, with
// colours and per-point class labels. Tests, benchmarks and the demo share
// it. Torch-free: plain vectors.
#ifndef TRAINSUP_SPARSE_SCENE_H_
#define TRAINSUP_SPARSE_SCENE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace trainsup::sparse {

// Classes of the generated points.
enum class SceneClass : int32_t { kFloor = 0, kWall = 1, kBox = 2, kCylinder = 3 };
inline constexpr int32_t kNumSceneClasses = 4;
std::string ToString(SceneClass c);

struct SceneOptions {
  uint64_t seed = 0;
  double size_x = 7.0;  // metres
  double size_y = 5.0;
  double height = 3.0;
  int32_t boxes = 8;
  int32_t cylinders = 4;
  int64_t num_points = 200000;
  double noise = 0.002;  // metres, Gaussian, along every axis
};

// Room sizes from small to very large. `scale` multiplies the floor's sides
// and the point count by the area ratio, so density stays the same.
// Names: "small" (0.5), "default" (1), "large" (2), "huge" (4).
SceneOptions ScenePreset(const std::string& name, uint64_t seed = 0);

struct Scene {
  std::vector<float> points;  // N x 3, metres, x/y on the floor, z up
  std::vector<float> colors;  // N x 3 in [0, 1]
  std::vector<int32_t> labels;  // N, SceneClass values
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

// Same options, same scene, bit for bit.
Scene GenerateScene(const SceneOptions& options);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_SCENE_H_
