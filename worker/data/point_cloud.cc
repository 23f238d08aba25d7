#include "worker/data/point_cloud.h"

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace trainsup::worker {
namespace {

constexpr char kOpen = '\x1e';
constexpr char kClose = '\x1f';
constexpr char kWithheld[] = "<withheld>";
// The payload that carries the viewer message of a ContentError.
constexpr char kViewerMessageUrl[] = "type.trainsup/viewer_message";

// `marked` with the markers dropped (shown) or each marked piece replaced
// by kWithheld (viewer).
std::string Render(absl::string_view marked, bool withhold) {
  std::string out;
  out.reserve(marked.size());
  bool inside = false;
  for (char c : marked) {
    if (c == kOpen) {
      inside = true;
      if (withhold) out += kWithheld;
    } else if (c == kClose) {
      inside = false;
    } else if (!inside || !withhold) {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string FileContent(absl::string_view content) {
  std::string out(1, kOpen);
  for (char c : content) {
    if (c != kOpen && c != kClose) out += c;
  }
  out += kClose;
  return out;
}

absl::Status ContentError(absl::StatusCode code, absl::string_view marked_message) {
  absl::Status status(code, Render(marked_message, /*withhold=*/false));
  if (marked_message.find(kOpen) != absl::string_view::npos) {
    status.SetPayload(kViewerMessageUrl, absl::Cord(Render(marked_message, /*withhold=*/true)));
  }
  return status;
}

std::string ViewerMessage(const absl::Status& status) {
  if (auto viewer = status.GetPayload(kViewerMessageUrl)) {
    return std::string(*viewer);
  }
  return Render(status.message(), /*withhold=*/true);
}

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
