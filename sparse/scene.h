// A seeded synthetic indoor-scene generator: a room (floor, walls) with
// boxes and cylinders, points spread over the surfaces in proportion to
// their area on a jittered grid (like the even vertex density of a
// reconstructed mesh, so surfaces are covered without holes), with colours
// and per-point class labels. Tests, benchmarks and the demo share
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
  double size_x = 4.2;  // metres
  double size_y = 3.4;
  double height = 2.5;
  int32_t boxes = 3;
  int32_t cylinders = 2;
  int64_t num_points = 200000;
  double noise = 0.002;  // metres, Gaussian, along every axis
};

// Room sizes from small to very large: the floor's sides scale by 0.5
// ("small"), 1 ("default": about 200k points, 170k voxels at 2 cm), 2
// ("large") or 4 ("huge"); points, boxes and cylinders by the square.
SceneOptions ScenePreset(const std::string& name, uint64_t seed = 0);

struct Scene {
  std::vector<float> points;    // N x 3, metres, x/y on the floor, z up
  std::vector<float> colors;    // N x 3 in [0, 1]
  std::vector<int32_t> labels;  // N, SceneClass values
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

// Same options, same scene, bit for bit.
Scene GenerateScene(const SceneOptions& options);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_SCENE_H_
