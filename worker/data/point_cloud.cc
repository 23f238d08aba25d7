#include "worker/data/point_cloud.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace trainsup::worker {

std::string ToString(PointCloudFormat format) {
  switch (format) {
    case PointCloudFormat::kPly:
      return "ply";
    case PointCloudFormat::kLas:
      return "las";
    case PointCloudFormat::kSemanticKitti:
      return "semantickitti";
    case PointCloudFormat::kS3dis:
      return "s3dis";
  }
  return "unknown";
}

absl::StatusOr<PointCloudFormat> PointCloudFormatFromString(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (PointCloudFormat format : {PointCloudFormat::kPly, PointCloudFormat::kLas,
                                  PointCloudFormat::kSemanticKitti, PointCloudFormat::kS3dis}) {
    if (lower == ToString(format)) return format;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown point cloud format '", name,
                                                 "' (known: ply, las, semantickitti, s3dis)"));
}

}  // namespace trainsup::worker
