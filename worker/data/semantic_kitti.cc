#include "worker/data/semantic_kitti.h"

#include <cstdint>
#include <vector>

#include "worker/data/reader_util.h"

namespace trainsup::worker {
namespace {

using internal::CorruptFile;
using internal::LoadLE;

constexpr size_t kPointBytes = 16;  // float32 x y z remission
constexpr size_t kLabelBytes = 4;   // uint32: instance << 16 | semantic class

}  // namespace

std::string KittiLabelPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::string stem = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = stem.rfind('.');
  if (dot != std::string::npos) stem.resize(dot);
  const std::string kVelodyne = "velodyne/";
  if (dir.size() >= kVelodyne.size() &&
      dir.compare(dir.size() - kVelodyne.size(), kVelodyne.size(), kVelodyne) == 0 &&
      (dir.size() == kVelodyne.size() || dir[dir.size() - kVelodyne.size() - 1] == '/')) {
    return absl::StrCat(dir.substr(0, dir.size() - kVelodyne.size()), "labels/", stem, ".label");
  }
  return absl::StrCat(dir, stem, ".label");
}

absl::StatusOr<PointCloud> ReadSemanticKitti(const std::string& path, const ReadOptions& options) {
  absl::StatusOr<std::string> data = internal::ReadWholeFile(path, options);
  if (!data.ok()) return data.status();
  if (data->size() % kPointBytes != 0) {
    return CorruptFile(path, absl::StrCat("truncated: size ", data->size(),
                                          " bytes is not a multiple of 16 (float32 x y z "
                                          "remission per point)"));
  }
  const size_t n = data->size() / kPointBytes;
  PointCloud cloud;
  cloud.source = path;
  std::vector<double> xyz(3 * n);
  cloud.feature_channels = 1;
  cloud.features.resize(n);
  const char* p = data->data();
  for (size_t i = 0; i < n; ++i, p += kPointBytes) {
    for (int a = 0; a < 3; ++a) xyz[3 * i + a] = LoadLE<float>(p + 4 * a);
    cloud.features[i] = LoadLE<float>(p + 12);
  }
  absl::Status status = internal::SetCoordinates(path, xyz, /*recenter=*/false, &cloud);
  if (!status.ok()) return status;
  status = internal::CheckFeatures(path, cloud);
  if (!status.ok()) return status;

  std::string label_path = options.kitti_label_file;
  if (label_path.empty() && options.label_file.empty()) {
    label_path = KittiLabelPath(path);
    if (!internal::PathExists(label_path)) label_path.clear();
  }
  if (!label_path.empty() && options.label_file.empty()) {
    absl::StatusOr<std::string> labels = internal::ReadWholeFile(label_path, options);
    if (!labels.ok()) return labels.status();
    if (labels->size() % kLabelBytes != 0) {
      return CorruptFile(label_path, absl::StrCat("truncated: size ", labels->size(),
                                                  " bytes is not a multiple of 4 (uint32 per "
                                                  "point)"));
    }
    if (labels->size() / kLabelBytes != n) {
      return CorruptFile(label_path,
                         absl::StrCat("label count mismatch: ", labels->size() / kLabelBytes,
                                      " labels for ", n, " points in ", path));
    }
    cloud.labels.resize(n);
    for (size_t i = 0; i < n; ++i) {
      cloud.labels[i] = static_cast<int32_t>(LoadLE<uint32_t>(labels->data() + 4 * i) & 0xFFFF);
    }
  }
  status = internal::FinishLabels(path, options, &cloud);
  if (!status.ok()) return status;
  return cloud;
}

}  // namespace trainsup::worker
