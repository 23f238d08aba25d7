// S3DIS (Stanford Large-Scale 3D Indoor Spaces) rooms.
#ifndef TRAINSUP_WORKER_DATA_S3DIS_H_
#define TRAINSUP_WORKER_DATA_S3DIS_H_

#include <array>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/point_cloud.h"

namespace trainsup::worker {

// The 13 S3DIS classes; a label is an index into this list.
inline constexpr std::array<const char*, 13> kS3disClasses = {
    "ceiling", "floor", "wall", "beam",     "column", "window", "door",
    "table",   "chair", "sofa", "bookcase", "board",  "clutter"};

// The label of an S3DIS class name. "stairs", which a few rooms have, is
// clutter, as the PointNet/S3DIS preparation scripts (indoor3d_util) make
// it; any other unknown name is InvalidArgument.
absl::StatusOr<int> S3disClassIndex(const std::string& name);

// Reads an S3DIS room in either form:
// - `path` is a file: one point per line, "x y z r g b" or
//   "x y z r g b label" separated by whitespace, every line with the same
//   number of values; r g b in [0, 255] become features / 255.
// - `path` is a directory: the per-object files of its Annotations/
//   subfolder (or of `path` itself when it has none), each named
//   <class>_<n>.txt with "x y z r g b" lines, concatenated in name order and
//   labelled by their class (S3disClassIndex). Files not ending in .txt are
//   ignored.
// options.label_file, when set, replaces the labels.
//
// Errors name the file, and the line, and the problem. InvalidArgument: an
// object file whose name is not <class>_<n>.txt or whose class is unknown, a
// folder without object files. DataLoss: a token that is not a number, a
// line with the wrong number of values (a truncated last line among them),
// a colour outside [0, 255], a non-integral label or one below -1, a
// non-finite coordinate, a label file whose count differs.
absl::StatusOr<PointCloud> ReadS3dis(const std::string& path, const ReadOptions& options);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATA_S3DIS_H_
