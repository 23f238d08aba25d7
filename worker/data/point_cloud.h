// A point cloud as the readers return it, and the options every reader takes.
// Torch-free: the readers (worker/data/readers.h) build and are tested without
// LibTorch.
#ifndef TRAINSUP_WORKER_DATA_POINT_CLOUD_H_
#define TRAINSUP_WORKER_DATA_POINT_CLOUD_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainsup::worker {

// One scan or room. Point i is xyz[3i .. 3i+2] (relative to `origin`), its
// features are features[C*i .. C*i+C-1] with C = feature_channels, and its
// label is labels[i]. All coordinates and features are finite.
struct PointCloud {
  // N*3 coordinates, relative to `origin`.
  std::vector<float> xyz;
  // Absolute position of point i is origin + xyz[3i..3i+2] (in double).
  // Readers set it to the floor of the bounding-box minimum when the file
  // stores coordinates in double precision or as scaled integers (PLY double
  // properties, LAS), so georeferenced coordinates (hundreds of kilometres)
  // keep their centimetres in float; otherwise it is zero and xyz are the
  // file's values.
  std::array<double, 3> origin = {0, 0, 0};
  // N*C features: rgb in [0, 1] (PLY, S3DIS, LAS formats 2 and 3), or the
  // remission (SemanticKITTI). Empty when C is 0.
  std::vector<float> features;
  int feature_channels = 0;
  // N labels, or empty when the cloud is unlabelled. -1 marks an unlabelled
  // point; no label is below -1.
  std::vector<int32_t> labels;
  // What was read: the file, or the Annotations folder for S3DIS objects.
  std::string source;

  // Number of points.
  size_t size() const { return xyz.size() / 3; }
};

struct ReadOptions {
  // PLY: the vertex property holding the label (any integer or float type;
  // a float label must be integral). Set: it must exist. Empty: the first of
  // kDefaultPlyLabelProperties that exists, else the cloud is unlabelled.
  std::string label_property;
  // Any format: a text side file with one integer label per line, in point
  // order, that replaces whatever labels the file itself has. Its count must
  // equal the point count.
  std::string label_file;
  // SemanticKITTI: the binary .label file. Empty: the SemanticKITTI layout's
  // sibling (sequences/SS/velodyne/NNNNNN.bin → sequences/SS/labels/
  // NNNNNN.label) when it exists, else the scan is unlabelled.
  std::string kitti_label_file;
  // Fail (InvalidArgument) when the cloud comes out without labels.
  bool require_labels = false;
  // Confinement to the supervisor's data roots (contracts/data_roots.h). Set:
  // every file and folder a reader opens must, as opened (its real path read
  // back from /proc/self/fd, so every symlink on the way counts, and a link
  // swapped in after a check is caught), lie inside one of these
  // directories; otherwise the read fails with PermissionDenied naming the
  // path and where it leads. Unset: no confinement.
  std::optional<std::vector<std::string>> data_roots;
  // A file larger than this many bytes is refused (InvalidArgument naming
  // it, its size and the limit) before anything is allocated for it; 0: no
  // limit. The worker sets it from data.max_file_mb.
  uint64_t max_file_bytes = 0;
};

// Label properties tried, in order, when ReadOptions::label_property is
// empty.
inline constexpr std::array<const char*, 5> kDefaultPlyLabelProperties = {
    "label", "class", "scalar_Classification", "classification", "scalar_Label"};

// The on-disk formats the readers understand.
enum class PointCloudFormat {
  kPly,            // "ply": ascii, binary_little_endian, binary_big_endian
  kLas,            // "las": LAS 1.0-1.4, point formats 0-3, uncompressed
  kSemanticKitti,  // "semantickitti": .bin scan, optional .label
  kS3dis,          // "s3dis": a room text file or an Annotations folder
};

// File content in error messages. Reader errors quote what they found
// ("line 1: 'x' is not a number"), which helps whoever reads the rank's
// log; but a run's reason and its events are shown to every viewer, and a
// data file may be anything (a label file that is a link to a secret
// printed the secret in the run's reason). So every piece of a file's
// content (a token, a name from a header, a value of a text file, a label)
// is marked with FileContent where a message is built, ContentError makes
// the status, and ViewerMessage withholds the marked pieces.

// `content` (marker bytes 0x1E and 0x1F removed from it) between the two
// markers: only for messages passed to ContentError.
std::string FileContent(absl::string_view content);
// A status with code `code`, whose message() is `marked_message` without the
// markers (everything shown, for logs and tests) and whose viewer message
// has "<withheld>" for each marked piece.
absl::Status ContentError(absl::StatusCode code, absl::string_view marked_message);
// What viewers may see of `status`: its message with every piece of file
// content replaced by "<withheld>" ("'<withheld>' is not a number"). The
// message itself when nothing in it was marked.
std::string ViewerMessage(const absl::Status& status);

// "ply", "las", "semantickitti", "s3dis".
std::string ToString(PointCloudFormat format);
// The inverse of ToString, case-insensitive; InvalidArgument naming the
// known formats otherwise.
absl::StatusOr<PointCloudFormat> PointCloudFormatFromString(const std::string& name);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATA_POINT_CLOUD_H_
