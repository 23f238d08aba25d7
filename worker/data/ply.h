// PLY point clouds (ScanNet, CGAL, CloudCompare, Open3D exports).
#ifndef TRAINSUP_WORKER_DATA_PLY_H_
#define TRAINSUP_WORKER_DATA_PLY_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/point_cloud.h"

namespace trainsup::worker {

// Reads the `vertex` element of a PLY file: ascii, binary_little_endian or
// binary_big_endian. Properties are selected by name:
// - x y z (required, scalar, any type; double coordinates are recentred,
//   see PointCloud::origin);
// - red green blue, when all three exist: uchar / 255, ushort / 65535,
//   float or double as stored; they become 3 feature channels;
// - the label: options.label_property or the first of
//   kDefaultPlyLabelProperties present (any integer or float type; a float
//   must hold an integer), unless options.label_file replaces it.
// Other properties (lists included) and other elements are skipped by their
// declared types; elements after `vertex` are not read at all.
//
// Errors name the file and the problem. InvalidArgument: no "ply" magic, an
// unknown format or property type, a malformed header, no vertex element,
// no x/y/z, a named label property that does not exist. DataLoss: a body
// shorter than the header's counts demand (checked against the file size
// before anything is allocated), a value that is not a number or does not
// fit its type, a non-finite coordinate or colour, a non-integral label, a
// label file whose count differs from the vertex count.
absl::StatusOr<PointCloud> ReadPly(const std::string& path, const ReadOptions& options);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATA_PLY_H_
