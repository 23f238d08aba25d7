#include "sparse/scene.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace trainsup::sparse {
namespace {

constexpr double kPi = 3.14159265358979323846;

// One sampled surface: an axis-aligned rectangle or a cylinder's side/top.
struct Surface {
  enum Kind { kRect, kCylinderSide, kDisk } kind;
  // kRect: origin + u * (a) + v * (b); for cylinders: centre, radius, height.
  double o[3], a[3], b[3];
  double radius = 0, height = 0;
  SceneClass label;
  float color[3];
  double area = 0;
};

Surface Rect(const double o[3], const double a[3], const double b[3], SceneClass label,
             const float color[3]) {
  Surface s{};
  s.kind = Surface::kRect;
  for (int i = 0; i < 3; ++i) {
    s.o[i] = o[i];
    s.a[i] = a[i];
    s.b[i] = b[i];
    s.color[i] = color[i];
  }
  const double cx = a[1] * b[2] - a[2] * b[1], cy = a[2] * b[0] - a[0] * b[2],
               cz = a[0] * b[1] - a[1] * b[0];
  s.area = std::sqrt(cx * cx + cy * cy + cz * cz);
  s.label = label;
  return s;
}

// The room's surfaces: the floor, four walls, then opt.boxes boxes (a top
// and four sides each) and opt.cylinders cylinders (side and top), placed
// and coloured by draws from `u01` on `rng`, in this order.
std::vector<Surface> RoomSurfaces(const SceneOptions& opt, std::mt19937_64& rng,
                                  std::uniform_real_distribution<double>& u01) {
  const float floor_color[3] = {0.55f, 0.45f, 0.35f};
  const float wall_color[3] = {0.85f, 0.85f, 0.80f};
  std::vector<Surface> surfaces;
  const double X = opt.size_x, Y = opt.size_y, H = opt.height;
  {
    const double o[3] = {0, 0, 0}, a[3] = {X, 0, 0}, b[3] = {0, Y, 0};
    surfaces.push_back(Rect(o, a, b, SceneClass::kFloor, floor_color));
  }
  const double walls[4][3][3] = {{{0, 0, 0}, {X, 0, 0}, {0, 0, H}},
                                 {{0, Y, 0}, {X, 0, 0}, {0, 0, H}},
                                 {{0, 0, 0}, {0, Y, 0}, {0, 0, H}},
                                 {{X, 0, 0}, {0, Y, 0}, {0, 0, H}}};
  for (const auto& w : walls)
    surfaces.push_back(Rect(w[0], w[1], w[2], SceneClass::kWall, wall_color));
  for (int i = 0; i < opt.boxes; ++i) {
    const double sx = 0.3 + 1.2 * u01(rng), sy = 0.3 + 1.2 * u01(rng), sz = 0.3 + 1.5 * u01(rng);
    const double x0 = u01(rng) * std::max(0.0, X - sx), y0 = u01(rng) * std::max(0.0, Y - sy);
    const float color[3] = {static_cast<float>(u01(rng)), static_cast<float>(u01(rng)),
                            static_cast<float>(u01(rng))};
    const double top[3] = {x0, y0, sz}, ex[3] = {sx, 0, 0}, ey[3] = {0, sy, 0}, ez[3] = {0, 0, sz};
    surfaces.push_back(Rect(top, ex, ey, SceneClass::kBox, color));
    const double f0[3] = {x0, y0, 0}, f1[3] = {x0, y0 + sy, 0}, f2[3] = {x0 + sx, y0, 0};
    surfaces.push_back(Rect(f0, ex, ez, SceneClass::kBox, color));
    surfaces.push_back(Rect(f1, ex, ez, SceneClass::kBox, color));
    surfaces.push_back(Rect(f0, ey, ez, SceneClass::kBox, color));
    surfaces.push_back(Rect(f2, ey, ez, SceneClass::kBox, color));
  }
  for (int i = 0; i < opt.cylinders; ++i) {
    Surface s{};
    s.radius = 0.1 + 0.4 * u01(rng);
    s.height = 0.5 + 1.5 * u01(rng);
    s.o[0] = s.radius + u01(rng) * std::max(0.0, X - 2 * s.radius);
    s.o[1] = s.radius + u01(rng) * std::max(0.0, Y - 2 * s.radius);
    s.o[2] = 0;
    s.label = SceneClass::kCylinder;
    for (float& c : s.color) c = static_cast<float>(u01(rng));
    s.kind = Surface::kCylinderSide;
    s.area = 2 * kPi * s.radius * s.height;
    surfaces.push_back(s);
    s.kind = Surface::kDisk;
    s.area = kPi * s.radius * s.radius;
    surfaces.push_back(s);
  }
  return surfaces;
}

// How many of `num_points` points each surface gets: a largest-remainder
// split by area, summing to exactly num_points.
std::vector<int64_t> SplitByArea(const std::vector<Surface>& surfaces, int64_t num_points) {
  double total = 0;
  for (const auto& s : surfaces) total += s.area;
  std::vector<int64_t> counts(surfaces.size());
  int64_t assigned = 0;
  for (size_t i = 0; i < surfaces.size(); ++i) {
    counts[i] = static_cast<int64_t>(std::floor(num_points * surfaces[i].area / total));
    assigned += counts[i];
  }
  for (size_t i = 0; assigned < num_points; i = (i + 1) % surfaces.size(), ++assigned) ++counts[i];
  return counts;
}

// Appends `count` points of surface `s` to *scene: a jittered grid (draws
// from `u01`), each coordinate with Gaussian noise of `noise` and each
// colour channel with noise of 0.05 (draws from `gauss`), all on `rng`.
void SampleSurface(const Surface& s, int64_t count, double noise, std::mt19937_64& rng,
                   std::uniform_real_distribution<double>& u01,
                   std::normal_distribution<double>& gauss, Scene* scene) {
  // A jittered grid of nu x nv cells shaped like the surface.
  double la = 1, lb = 1;
  if (s.kind == Surface::kRect) {
    la = std::sqrt(s.a[0] * s.a[0] + s.a[1] * s.a[1] + s.a[2] * s.a[2]);
    lb = std::sqrt(s.b[0] * s.b[0] + s.b[1] * s.b[1] + s.b[2] * s.b[2]);
  } else if (s.kind == Surface::kCylinderSide) {
    la = 2 * kPi * s.radius;
    lb = s.height;
  }
  const int64_t nu = std::max<int64_t>(1, std::llround(std::sqrt(count * la / lb)));
  const int64_t nv = (count + nu - 1) / nu;
  for (int64_t n = 0; n < count; ++n) {
    double p[3];
    const double u = (static_cast<double>(n % nu) + u01(rng)) / nu;
    const double v = (static_cast<double>(n / nu) + u01(rng)) / nv;
    switch (s.kind) {
      case Surface::kRect:
        for (int i = 0; i < 3; ++i) p[i] = s.o[i] + u * s.a[i] + v * s.b[i];
        break;
      case Surface::kCylinderSide:
        p[0] = s.o[0] + s.radius * std::cos(2 * kPi * u);
        p[1] = s.o[1] + s.radius * std::sin(2 * kPi * u);
        p[2] = v * s.height;
        break;
      case Surface::kDisk: {
        const double r = s.radius * std::sqrt(u);
        p[0] = s.o[0] + r * std::cos(2 * kPi * v);
        p[1] = s.o[1] + r * std::sin(2 * kPi * v);
        p[2] = s.height;
        break;
      }
    }
    for (int i = 0; i < 3; ++i) {
      scene->points.push_back(static_cast<float>(p[i] + noise * gauss(rng)));
      const double c = s.color[i] + 0.05 * gauss(rng);
      scene->colors.push_back(static_cast<float>(std::clamp(c, 0.0, 1.0)));
    }
    scene->labels.push_back(static_cast<int32_t>(s.label));
  }
}

}  // namespace

std::string ToString(SceneClass c) {
  switch (c) {
    case SceneClass::kFloor:
      return "floor";
    case SceneClass::kWall:
      return "wall";
    case SceneClass::kBox:
      return "box";
    case SceneClass::kCylinder:
      return "cylinder";
  }
  return "unknown";
}

SceneOptions ScenePreset(const std::string& name, uint64_t seed) {
  double scale;
  if (name == "small") {
    scale = 0.5;
  } else if (name == "default") {
    scale = 1.0;
  } else if (name == "large") {
    scale = 2.0;
  } else if (name == "huge") {
    scale = 4.0;
  } else {
    throw std::invalid_argument("unknown scene preset '" + name +
                                "' (expected small, default, large or huge)");
  }
  SceneOptions o;
  o.seed = seed;
  o.size_x *= scale;
  o.size_y *= scale;
  o.boxes = static_cast<int32_t>(std::lround(o.boxes * scale * scale));
  o.cylinders = static_cast<int32_t>(std::lround(o.cylinders * scale * scale));
  // Floor and boxes grow with the area, walls with the perimeter; keep the
  // density roughly constant by scaling with the area.
  o.num_points = static_cast<int64_t>(std::llround(o.num_points * scale * scale));
  return o;
}

Scene GenerateScene(const SceneOptions& opt) {
  if (!(opt.size_x > 0 && opt.size_y > 0 && opt.height > 0) || opt.num_points < 0 ||
      opt.boxes < 0 || opt.cylinders < 0) {
    throw std::invalid_argument("GenerateScene: sizes and counts must be positive");
  }
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const std::vector<Surface> surfaces = RoomSurfaces(opt, rng, u01);

  Scene scene;
  scene.points.reserve(3 * opt.num_points);
  scene.colors.reserve(3 * opt.num_points);
  scene.labels.reserve(opt.num_points);
  // Largest-remainder split of the points over the surfaces by area.
  const std::vector<int64_t> counts = SplitByArea(surfaces, opt.num_points);
  for (size_t si = 0; si < surfaces.size(); ++si) {
    if (counts[si] == 0) continue;
    SampleSurface(surfaces[si], counts[si], opt.noise, rng, u01, gauss, &scene);
  }
  return scene;
}

}  // namespace trainsup::sparse
