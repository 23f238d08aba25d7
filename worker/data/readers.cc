#include "worker/data/readers.h"

#include "absl/strings/str_cat.h"

namespace trainsup::worker {

absl::StatusOr<PointCloud> ReadPointCloud(const std::string& path, PointCloudFormat format,
                                          const ReadOptions& options) {
  switch (format) {
    case PointCloudFormat::kPly:
      return ReadPly(path, options);
    case PointCloudFormat::kLas:
      return ReadLas(path, options);
    case PointCloudFormat::kSemanticKitti:
      return ReadSemanticKitti(path, options);
    case PointCloudFormat::kS3dis:
      return ReadS3dis(path, options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown point cloud format ", static_cast<int>(format)));
}

absl::StatusOr<PointCloud> ReadPointCloud(const std::string& path, const std::string& format,
                                          const ReadOptions& options) {
  absl::StatusOr<PointCloudFormat> parsed = PointCloudFormatFromString(format);
  if (!parsed.ok()) return parsed.status();
  return ReadPointCloud(path, *parsed, options);
}

}  // namespace trainsup::worker
